#!/usr/bin/env bash
# Real-size benchmark: a Qwen3-30B-A3B-shaped MoE larger than the memory the
# engines may use, charm against llama.cpp inside the same memory limit, and
# the same model pooled over three workers. Results: docs/benchmarks.md
# (## Real size).
#
#   bash scripts/bench_scale.sh                      # both phases, 48 layers
#   PHASES=stream LAYERS=24 bash scripts/bench_scale.sh
#
# Needs root (memory cgroups, dropping the page cache), a Python with numpy
# and gguf ($GGUF_PY) to write the model, and one with llama-cpp-python
# ($LLAMA_PY, as scripts/bench_vs_llamacpp.sh builds it).
#
# Disk: the GGUF (17.2 GB at 48 layers, Q4_0) and charm's container of it
# (16.1 GB) for the stream phase; the pooled phase needs the container and
# its three partial copies (16.3 GB more). When the disk cannot hold all
# four, run PHASES=stream, delete the GGUF, then PHASES=pooled: the pooled
# phase refuses to split when the free space is short, and says so.
#
# 1. Builds `coordinator` and `worker` (release) and copies them to the
#    run's folder, so a rebuild during the run changes nothing; every timed
#    run waits while a build (cargo, rustc) shares the cores.
# 2. Once: writes the model with scripts/make_real_size_gguf.py (random
#    zero-mean codes, the real Qwen3 tokenizer) and converts it to a
#    container (`coordinator convert`).
# 3. Measures the O_DIRECT read rate of the container's experts.bin
#    (scripts/lib/scale_run.py diskrate: 2 GiB of expert-record-sized reads
#    at random offsets, 4 in flight): the disk bound of a run is its expert
#    bytes read at that rate.
# 4. stream phase, $RUNS rounds, each configuration once per round in the
#    same order, every run cold (page cache dropped) with a fresh routing
#    history unless named otherwise, a 64-token prompt and $MAX_TOKENS
#    greedy tokens (eos ignored), $THREADS threads; inside a
#    $LIMIT_GB GiB memory cgroup:
#      charm-stream-dio        container, default expert cache (the room
#                              under the limit less the dense part), O_DIRECT
#      charm-stream-pagecache  the same, reads through the page cache
#      charm-stream-noprefetch O_DIRECT, no read-ahead
#      charm-stream-learned    O_DIRECT, after a warm-up conversation (another
#                              prompt, same limit) whose routing history it
#                              keeps: learned pins
#      charm-gguf-mapped       the GGUF file, memory-mapped
#      llama-norepack          llama.cpp with its weight repacking off (the
#                              weights read from the mapping)
#      llama                   llama.cpp as it runs by default (repacked
#                              Q4_0 weights in anonymous memory), first
#                              round only, at most $LLAMA_TIMEOUT s
#    and without a limit:
#      charm-local-cold        container, default cache, O_DIRECT
#      charm-local-warm        the same prompt again in the same process
#                              (`generate --repeat 2`): every expert it needs
#                              already cached
# 5. pooled phase: splits the container into three partial copies by the
#    placement plan (`coordinator split --ram-gb X,X,X`, each machine's RAM a
#    third of the experts plus 2 %), then $RUNS rounds of
#      charm-pooled-cold       three workers on 127.0.0.1 (each its part, an
#                              expert cache holding all of it), the
#                              coordinator with --no-local-experts; workers
#                              started fresh each round after the page cache
#                              was dropped: the first run
#      charm-pooled-warm       the same prompt again, the same coordinator
#                              process (`generate --repeat 2`): what the
#                              workers read is in their RAM
#      charm-onebox-cold/warm  --local with one worker's budget, O_DIRECT
#      charm-local-cold/warm   as in the stream phase (no limit), after the
#                              workers stopped
# 6. Prints the markdown table (medians over rounds; decode and prefill
#    ratios per round), the workers' peak RSS, frame bytes on the wire per
#    token and the id checks. Raw JSON lines: $BENCH/scale-<time>/runs.jsonl.
#
# Environment (defaults): CHARM_BENCH_DIR (/work/charm-bench), LAYERS (48),
# PHASES ("stream pooled"), RUNS (3), LIMIT_GB (8), MAX_TOKENS (32),
# THREADS (2), LLAMA_TIMEOUT (300), GGUF_PY (/work/gguf-venv/bin/python),
# LLAMA_PY (/work/llama-venv/bin/python), WORKER_THREADS (unset: each worker
# computes on every core; 1 gives each one compute thread).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="${CHARM_BENCH_DIR:-/work/charm-bench}"
LAYERS="${LAYERS:-48}"
PHASES="${PHASES:-stream pooled}"
RUNS="${RUNS:-3}"
LIMIT_GB="${LIMIT_GB:-8}"
MAX_TOKENS="${MAX_TOKENS:-32}"
THREADS="${THREADS:-2}"
LLAMA_TIMEOUT="${LLAMA_TIMEOUT:-300}"
GGUF_PY="${GGUF_PY:-/work/gguf-venv/bin/python}"
LLAMA_PY="${LLAMA_PY:-/work/llama-venv/bin/python}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
HELP="$ROOT/scripts/lib/scale_run.py"

NAME="qwen3moe-rs"
[ "$LAYERS" = 48 ] || NAME="qwen3moe-rs-${LAYERS}l"
GGUF="$BENCH/$NAME.q4_0.gguf"
CONT="$BENCH/$NAME.q4_0"
PARTS="$BENCH/$NAME.q4_0.parts3"
OUT="$BENCH/scale-$(date +%Y%m%d-%H%M%S)"
RUNS_FILE="$OUT/runs.jsonl"

[ "$(id -u)" = 0 ] || { echo "error: run as root (memory cgroups and dropping the page cache need it)" >&2; exit 1; }
[ "$RUNS" -ge 3 ] || { echo "error: RUNS must be at least 3 (medians of 3 or more)" >&2; exit 1; }
[ "$MAX_TOKENS" -ge 2 ] || { echo "error: MAX_TOKENS must be at least 2" >&2; exit 1; }
mkdir -p "$BENCH" "$OUT"
git -C "$ROOT" rev-parse --short HEAD >"$OUT/commit.txt"

echo "== building (release)" >&2
(cd "$ROOT" && cargo build --release -p charm-worker -p charm-coordinator --bins >&2)
mkdir -p "$OUT/bin"
cp "$TARGET/release/coordinator" "$TARGET/release/worker" "$OUT/bin/"
BIN="$OUT/bin"

free_gb() { df -B1 --output=avail "$1" | tail -1 | awk '{printf "%.1f", $1 / 1e9}'; }

# shellcheck source=lib/wait_idle.sh
source "$ROOT/scripts/lib/wait_idle.sh"

if [[ " $PHASES " == *" stream "* ]] && [ ! -f "$GGUF" ]; then
    echo "== writing $GGUF ($LAYERS layers)" >&2
    "$GGUF_PY" "$ROOT/scripts/make_real_size_gguf.py" "$GGUF" --layers "$LAYERS" >&2
fi
if [ ! -f "$CONT/manifest.json" ]; then
    [ -f "$GGUF" ] || { echo "error: neither $CONT nor $GGUF exists: run with PHASES=stream first" >&2; exit 1; }
    echo "== converting to $CONT" >&2
    "$BIN/coordinator" --model "$GGUF" convert --out "$CONT" >&2
fi

# Expert record size and the experts' bytes, from the manifest.
read -r RECORD EXPERT_BYTES < <(python3 -c "
import json, statistics, sys
m = json.load(open(sys.argv[1]))
print(int(statistics.median(r['len'] for r in m['records'])), sum(r['len'] for r in m['records']))" "$CONT/manifest.json")

echo "== O_DIRECT read rate of $CONT/experts.bin" >&2
wait_idle
python3 "$HELP" diskrate "$CONT/experts.bin" --gib 2 --block-bytes "$RECORD" --depth 4 >"$OUT/diskrate.json"
DISK_RATE=$(python3 -c "import json; print(json.load(open('$OUT/diskrate.json'))['bytes_per_s'])")
echo "   $(python3 -c "print(f'{$DISK_RATE / 1e9:.2f}')") GB/s" >&2

ids() { python3 -c "import random; r = random.Random($1); print(','.join(str(r.randrange(50000)) for _ in range(64)))"; }
PROMPT=$(ids 0)
WARM=$(ids 1)
GEN=(generate --max-tokens "$MAX_TOKENS" --ignore-eos --json)

# run LABEL ROUND [--limit-gb G] [--cold] [--timeout S] [--watch-pid P]... -- CMD...
run() {
    local label="$1" round="$2"; shift 2
    wait_idle
    python3 "$HELP" run --label "$label" --round "$round" --out "$RUNS_FILE" "$@"
}
fresh_state() { local d="$OUT/state-$1"; rm -rf "$d"; mkdir -p "$d"; echo "$d"; }
C=("$BIN/coordinator" --threads "$THREADS")

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

if [[ " $PHASES " == *" stream "* ]]; then
    [ -f "$GGUF" ] || { echo "error: $GGUF is missing (the stream phase runs it)" >&2; exit 1; }
    "$LLAMA_PY" -c "import llama_cpp" 2>/dev/null || { echo "error: $LLAMA_PY has no llama_cpp (scripts/bench_vs_llamacpp.sh builds it)" >&2; exit 1; }
    for r in $(seq 1 "$RUNS"); do
        echo "== stream round $r of $RUNS (limit $LIMIT_GB GiB)" >&2
        L=(--limit-gb "$LIMIT_GB" --cold)
        run charm-stream-dio "$r" "${L[@]}" -- "${C[@]}" --model "$CONT" --local --direct-io \
            --state-dir "$(fresh_state dio)" "${GEN[@]}" --prompt-ids "$PROMPT"
        run charm-stream-pagecache "$r" "${L[@]}" -- "${C[@]}" --model "$CONT" --local \
            --state-dir "$(fresh_state pc)" "${GEN[@]}" --prompt-ids "$PROMPT"
        run charm-stream-noprefetch "$r" "${L[@]}" -- "${C[@]}" --model "$CONT" --local --direct-io --no-prefetch \
            --state-dir "$(fresh_state np)" "${GEN[@]}" --prompt-ids "$PROMPT"
        LEARNED="$(fresh_state learned)"
        run warmup-learned "$r" "${L[@]}" -- "${C[@]}" --model "$CONT" --local --direct-io \
            --state-dir "$LEARNED" "${GEN[@]}" --prompt-ids "$WARM"
        run charm-stream-learned "$r" "${L[@]}" -- "${C[@]}" --model "$CONT" --local --direct-io \
            --state-dir "$LEARNED" "${GEN[@]}" --prompt-ids "$PROMPT"
        run charm-gguf-mapped "$r" "${L[@]}" -- "${C[@]}" --model "$GGUF" --local "${GEN[@]}" --prompt-ids "$PROMPT"
        run llama-norepack "$r" "${L[@]}" -- "$LLAMA_PY" "$ROOT/scripts/bench_llamacpp.py" "$GGUF" \
            --threads "$THREADS" --prompt-ids "$PROMPT" --max-tokens "$MAX_TOKENS" --no-repack
        if [ "$r" = 1 ]; then
            run llama "$r" "${L[@]}" --timeout "$LLAMA_TIMEOUT" -- "$LLAMA_PY" "$ROOT/scripts/bench_llamacpp.py" "$GGUF" \
                --threads "$THREADS" --prompt-ids "$PROMPT" --max-tokens "$MAX_TOKENS"
        fi
        run charm-local "$r" --cold --repeat-labels cold,warm -- "${C[@]}" --model "$CONT" --local --direct-io \
            --state-dir "$(fresh_state local)" "${GEN[@]}" --repeat 2 --prompt-ids "$PROMPT"
    done
fi

if [[ " $PHASES " == *" pooled "* ]]; then
    PART_GB=$(python3 -c "print(f'{$EXPERT_BYTES / 3 * 1.02 / 2**30:.2f}')")
    if [ ! -f "$PARTS/part-2/manifest.json" ]; then
        need=$(python3 -c "print(f'{$EXPERT_BYTES * 1.05 / 1e9:.1f}')")
        if python3 -c "import sys; sys.exit(0 if $(free_gb "$BENCH") > $need else 1)"; then
            echo "== splitting $CONT into three parts (RAM $PART_GB GiB each)" >&2
            "${C[@]}" --model "$CONT" split --out "$PARTS" --ram-gb "$PART_GB,$PART_GB,$PART_GB" >&2
        else
            echo "error: the three parts need about $need GB and $(free_gb "$BENCH") GB are free: delete $GGUF (the stream phase's) and run PHASES=pooled" >&2
            exit 1
        fi
    fi
    KEY="$OUT/cluster.key"
    "${C[@]}" keygen --out "$KEY" >&2
    # Rounds numbered on from the stream phase's, so per-round ratios pair
    # runs of the same phase.
    for r in $(seq $((RUNS + 1)) $((2 * RUNS))); do
        echo "== pooled round $((r - RUNS)) of $RUNS" >&2
        sync; echo 3 >/proc/sys/vm/drop_caches
        PIDS=()
        ADDRS=""
        for i in 0 1 2; do
            port=$((7471 + i))
            state="$(fresh_state "w$i")"
            rm -f "$OUT/w$i.out"
            "$BIN/worker" --model "$PARTS/part-$i" --cluster-key-file "$KEY" --listen "127.0.0.1:$port" --no-mdns \
                --expert-cache-gb "$PART_GB" --direct-io --state-dir "$state" ${WORKER_THREADS:+--threads "$WORKER_THREADS"} \
                >"$OUT/w$i.out" 2>"$OUT/w$i.log" &
            PIDS+=($!)
            ADDRS="${ADDRS:+$ADDRS,}127.0.0.1:$port"
        done
        for i in 0 1 2; do
            for _ in $(seq 1 600); do grep -q '^listening on ' "$OUT/w$i.out" 2>/dev/null && break; sleep 0.1; done
            grep -q '^listening on ' "$OUT/w$i.out" || { echo "error: worker $i did not start: $(cat "$OUT/w$i.log")" >&2; exit 1; }
        done
        W=(--model "$CONT" --workers "$ADDRS" --no-mdns --cluster-key-file "$KEY" --no-local-experts --min-workers 3)
        WATCH=()
        for p in "${PIDS[@]}"; do WATCH+=(--watch-pid "$p"); done
        run charm-pooled "$r" "${WATCH[@]}" --repeat-labels cold,warm -- "${C[@]}" "${W[@]}" "${GEN[@]}" \
            --repeat 2 --prompt-ids "$PROMPT"
        cleanup
        PIDS=()
        run charm-onebox "$r" --cold --repeat-labels cold,warm -- "${C[@]}" --model "$CONT" --local --direct-io \
            --expert-cache-gb "$PART_GB" --state-dir "$(fresh_state onebox)" "${GEN[@]}" --repeat 2 --prompt-ids "$PROMPT"
        run charm-local "$r" --cold --repeat-labels cold,warm -- "${C[@]}" --model "$CONT" --local --direct-io \
            --state-dir "$(fresh_state local)" "${GEN[@]}" --repeat 2 --prompt-ids "$PROMPT"
    done
fi

echo "== results ($OUT)" >&2
python3 "$HELP" table "$RUNS_FILE" --disk-rate "$DISK_RATE" \
    --ratio charm-stream-dio llama-norepack --ratio charm-stream-dio charm-gguf-mapped \
    --ratio charm-pooled-warm charm-local-warm --ratio charm-pooled-cold charm-local-cold \
    --ratio charm-onebox-warm charm-local-warm | tee "$OUT/table.md"
