#!/usr/bin/env bash
# Failover benchmark: the stall that SIGKILL or SIGSTOP of one of three
# workers adds to a greedy decode, for two builds side by side ("before"
# and "after", by default c0675c5 — failover only after --worker-timeout-ms
# — and HEAD — hedged re-sends, 4 s QUIC idle timeout). Results:
# docs/benchmarks.md (## Failover).
#
#   RUNS=5 bash scripts/bench_failover.sh
#
# 1. Builds `worker` and `coordinator` (release) of each revision in its
#    own git worktree ($BEFORE_TREE, $AFTER_TREE; added detached when
#    missing, never committed to, never changed when present at another
#    commit) with one shared target dir ($BENCH/failover-target), and copies
#    the binaries to $BENCH/failover-bin/<sha>/. A revision already copied
#    there is not rebuilt.
# 2. Model: each tree's own committed fixture, tests/fixtures/olmoe (2
#    layers, 8 experts, top-2, no tokenizer); prompt: its reference.json's
#    prompt_ids. One cluster key per build (`coordinator keygen`).
# 3. Rounds ($RUNS, at least 3): each round runs, for each build, an
#    undisturbed run, a SIGKILL run and a SIGSTOP run (scripts/lib/
#    failover_run.py run): three fresh workers on 127.0.0.1 (port 0,
#    --no-mdns, --threads 1), then `coordinator --workers A,B,C
#    --min-workers 3 --threads 1 generate --prompt-ids ... --max-tokens
#    $MAX_TOKENS --ignore-eos` without --json, which writes and flushes `ID `
#    per token; the helper timestamps every chunk of its stdout. After $AT
#    ids, worker 1 gets SIGKILL, or SIGSTOP and SIGCONT $STOP_S s later.
#    Before each round the script waits up to $IDLE_WAIT_S s for no `rustc`
#    to run (other builds on this machine); the count seen is recorded.
# 4. Stall added = the largest inter-token gap after the signal − the
#    median gap of ids 11..$AT (before it). Total added = time from the
#    signal to the last id − (ids after the signal × that median). The
#    undisturbed run measures the same at the same id (noise floor).
# 5. Checks: every run exits 0 with $MAX_TOKENS ids, identical to its
#    build's undisturbed run, to the other build's, and (where they overlap)
#    to reference.json's greedy_ids.
# 6. Prints the machine (CPU model, AVX-512 or AVX2) and a markdown table:
#    build × fault → median, min–max; raw JSON lines (ids, gaps, the
#    coordinator's warnings) and every process's log go to
#    $BENCH/failover-<time>/.
#
# Environment (defaults): CHARM_BENCH_DIR (/work/charm-bench), RUNS (5),
# BEFORE_REV (c0675c5), AFTER_REV (HEAD), BEFORE_TREE (/work/charm-before),
# AFTER_TREE (/work/charm-after), MAX_TOKENS (400), AT (100), STOP_S (3),
# WORKER_TIMEOUT_MS (unset: each build's default, 10000), IDLE_WAIT_S (180).
# Loopback only: nothing listens on or connects to another address.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="${CHARM_BENCH_DIR:-/work/charm-bench}"
RUNS="${RUNS:-5}"
BEFORE_REV="${BEFORE_REV:-c0675c5}"
AFTER_REV="${AFTER_REV:-HEAD}"
BEFORE_TREE="${BEFORE_TREE:-/work/charm-before}"
AFTER_TREE="${AFTER_TREE:-/work/charm-after}"
MAX_TOKENS="${MAX_TOKENS:-400}"
AT="${AT:-100}"
STOP_S="${STOP_S:-3}"
WORKER_TIMEOUT_MS="${WORKER_TIMEOUT_MS:-0}"
IDLE_WAIT_S="${IDLE_WAIT_S:-180}"
TARGET="$BENCH/failover-target"
HELPER="$ROOT/scripts/lib/failover_run.py"
OUT="$BENCH/failover-$(date +%Y%m%d-%H%M%S)"
[ "$RUNS" -ge 3 ] || { echo "error: RUNS must be at least 3 (medians of 3 or more)" >&2; exit 1; }
[ "$AT" -ge 12 ] && [ "$AT" -lt "$MAX_TOKENS" ] || { echo "error: AT must be at least 12 and below MAX_TOKENS" >&2; exit 1; }
command -v python3 >/dev/null || { echo "error: python3 not found" >&2; exit 1; }
mkdir -p "$BENCH" "$OUT"

# $1 name, $2 rev, $3 tree → prints the directory of that revision's binaries.
build() {
    local name="$1" rev="$2" tree="$3" sha bin
    sha="$(git -C "$ROOT" rev-parse --verify "$rev^{commit}")"
    bin="$BENCH/failover-bin/$sha"
    if [ -x "$bin/worker" ] && [ -x "$bin/coordinator" ]; then
        echo "$name: $sha, binaries already in $bin" >&2
        echo "$bin"
        return
    fi
    if [ -e "$tree" ]; then
        local head
        head="$(git -C "$tree" rev-parse HEAD 2>/dev/null || true)"
        [ "$head" = "$sha" ] || {
            echo "error: $tree exists at ${head:-no commit}, not at $sha ($name = $rev); remove it or set ${name^^}_TREE" >&2
            exit 1
        }
    else
        git -C "$ROOT" worktree add --detach "$tree" "$sha" >&2
    fi
    echo "$name: building $sha in $tree (target dir $TARGET)" >&2
    (cd "$tree" && cargo build --release -p charm-worker -p charm-coordinator --target-dir "$TARGET" >&2)
    mkdir -p "$bin"
    cp "$TARGET/release/worker" "$TARGET/release/coordinator" "$bin/"
    echo "$bin"
}

BEFORE_SHA="$(git -C "$ROOT" rev-parse --verify "$BEFORE_REV^{commit}")"
AFTER_SHA="$(git -C "$ROOT" rev-parse --verify "$AFTER_REV^{commit}")"
BEFORE_BIN="$(build before "$BEFORE_REV" "$BEFORE_TREE")"
AFTER_BIN="$(build after "$AFTER_REV" "$AFTER_TREE")"

declare -A BIN=([before]="$BEFORE_BIN" [after]="$AFTER_BIN")
declare -A MODEL=([before]="$BEFORE_TREE/tests/fixtures/olmoe" [after]="$AFTER_TREE/tests/fixtures/olmoe")
declare -A KEY
for b in before after; do
    [ -f "${MODEL[$b]}/config.json" ] || { echo "error: no fixture at ${MODEL[$b]}" >&2; exit 1; }
    KEY[$b]="$OUT/$b.key"
    "${BIN[$b]}/coordinator" keygen --out "${KEY[$b]}" 2>/dev/null
done
PROMPT="$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' \
    "${MODEL[after]}/reference.json")"

CPU="$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*:[[:space:]]*//')"
if grep -qw avx512f /proc/cpuinfo; then SIMD="AVX-512"; elif grep -qw avx2 /proc/cpuinfo; then SIMD="AVX2"; else SIMD="neither AVX2 nor AVX-512"; fi
echo "machine: $CPU, $(nproc) CPUs, $SIMD" | tee "$OUT/machine.txt"
echo "before: $BEFORE_REV = $BEFORE_SHA; after: $AFTER_REV = $AFTER_SHA" | tee -a "$OUT/machine.txt"
echo "raw results: $OUT/runs.jsonl" >&2

wait_idle() {
    local t=0
    while [ "$(pgrep -c rustc || true)" != 0 ] && [ "$t" -lt "$IDLE_WAIT_S" ]; do
        sleep 5
        t=$((t + 5))
    done
    pgrep -c rustc || true
}

for round in $(seq 1 "$RUNS"); do
    rustc_n="$(wait_idle)"
    for b in before after; do
        for fault in none kill stop; do
            line="$(python3 "$HELPER" run --bin "${BIN[$b]}" --model "${MODEL[$b]}" --key "${KEY[$b]}" \
                --fault "$fault" --at "$AT" --max-tokens "$MAX_TOKENS" --stop-s "$STOP_S" \
                --worker-timeout-ms "$WORKER_TIMEOUT_MS" --prompt-ids "$PROMPT" --log-dir "$OUT" \
                --label "$b-$fault-r$round" --build "$b" --round "$round" --rustc "$rustc_n")"
            echo "$line" >>"$OUT/runs.jsonl"
            python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("round %d %-6s %-4s stall %8.1f ms, total added %8.1f ms, median gap %.2f ms, warnings %d (late %d, hedging %d, re-sending %d), rustc %s" % (d["round"], d["build"], d["fault"], d.get("stall_ms", float("nan")), d.get("total_added_ms", float("nan")), d.get("median_gap_ms", float("nan")), d["coordinator_warnings"], d["late_warnings"], d["hedging_warnings"], d["resend_warnings"], d["rustc_running"]))' "$line" >&2
        done
    done
done

echo
cat "$OUT/machine.txt"
echo "$RUNS rounds, $MAX_TOKENS greedy tokens each (eos ignored), signal after $AT ids to worker 1 of 3, SIGCONT $STOP_S s after SIGSTOP"
echo
python3 "$HELPER" table "$OUT/runs.jsonl" "${MODEL[after]}/reference.json" | tee "$OUT/table.md"
