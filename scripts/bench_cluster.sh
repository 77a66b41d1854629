#!/usr/bin/env bash
# Cluster benchmark: decode tok/s of `--local` against two workers on
# loopback and two workers in network namespaces linked by veth pairs with
# emulated LAN latency and bandwidth (tc netem, or tbf plus a userspace
# delay line where the kernel has no netem). Results: docs/benchmarks.md
# (## Cluster).
#
#   bash scripts/bench_cluster.sh
#
# 1. Builds `worker`, `coordinator` and `udp-delay` (release).
# 2. Once: writes the random-weight real-width OLMoE of
#    scripts/make_bench_model.py ($LAYERS layers, hidden 2048, 64 experts of
#    1024, top-8, bf16) into $BENCH/olmoe-w (shared with
#    scripts/bench_expert_store.sh) and a cluster key.
# 3. Network namespaces (needs root and iproute2; NETNS=0 skips them):
#    cb-c (coordinator), cb-w1 and cb-w2 (one worker each), linked by veth
#    pairs 10.231.1.0/30 and 10.231.2.0/30. Every veth end gets
#    `tc qdisc netem delay ${DELAY_MS}ms rate ${RATE}`, so a round trip
#    crosses two delays (2 × 0.1 ms = 0.2 ms by default) and each direction
#    is capped at $RATE. A kernel without netem (CONFIG_NET_SCH_NETEM unset,
#    as on the project's VMs) gets `tbf rate $RATE` on every veth end for
#    the rate, and the delay from `udp-delay relay` (tests/src/bin): each
#    worker listens on its namespace's own loopback and a relay on its veth
#    address forwards every datagram $DELAY_MS ms after it arrived, both
#    ways; the table says which emulation ran. Nothing is routed out of these
#    namespaces; they are deleted on exit. The UDP round trip over the same
#    path (veth, qdiscs, a relay with the same delay where one is used) is
#    measured with `udp-delay ping` against an echo server in cb-w1 (median
#    of 200).
# 4. Starts two workers on 127.0.0.1 and two in the namespaces (HF
#    directory, experts memory-mapped, page cache warm; every core, as a
#    worker runs by default: on one box a worker that finishes its share
#    early leaves the cores to the other), and keeps them up for every run.
# 5. Rounds: each round runs `generate` on a fixed 64-token prompt for
#    $MAX_TOKENS tokens (eos ignored, greedy) once per configuration —
#    local (--threads $THREADS), loopback, lan (coordinator --threads
#    $THREADS) — interleaved so slow spells of the machine hit all alike.
#    Before and after each round `corecheck` compares 2 threads with 1 (the
#    second core of this VM sometimes vanishes); medians use the rounds whose
#    compute ratio was at least $MIN_RATIO before and after, when at least
#    two did. $RUNS rounds (at least 3).
# 6. Per decode token: frame bytes and round trips from the coordinator's
#    --json stats, and (lan) bytes on the coordinator's veth ends (IP, UDP
#    and QUIC included), each from (run of $MAX_TOKENS) − (run of 1 token),
#    divided by ($MAX_TOKENS − 1). The bound of the lan run is
#    local ms/token + round trips × measured UDP RTT + (bytes out + bytes
#    in) / rate.
# 7. Prints a markdown table; raw JSON lines go to $BENCH/cluster-<time>/
#    (each run's speeds, bytes, ids, the engine's phase timers and, per
#    worker, its requests, average round trip and own handling time).
#
# 8. With BATCH=N (N >= 2): also N prompts stepped together
#    (`generate --batch-file`) over loopback and lan, with and without
#    --pipeline (two halves of each step at once, so one half's attention
#    overlaps the other's round trips), each round; prints tok/s of all
#    sequences per configuration and whether the ids matched.
#
# Environment (defaults): CHARM_BENCH_DIR (/work/charm-bench), LAYERS (4),
# RUNS (3), MAX_TOKENS (32), THREADS (2), DELAY_MS (0.1), RATE (1gbit),
# RATE_BYTES_PER_S (125000000, must match RATE), MIN_RATIO (1.6), NETNS (1),
# WORKER_THREADS (unset: every core; e.g. 1 gives each worker one compute thread),
# BENCH_PY (/work/bench-venv/bin/python: a Python with numpy).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="${CHARM_BENCH_DIR:-/work/charm-bench}"
LAYERS="${LAYERS:-4}"
RUNS="${RUNS:-3}"
MAX_TOKENS="${MAX_TOKENS:-32}"
THREADS="${THREADS:-2}"
DELAY_MS="${DELAY_MS:-0.1}"
RATE="${RATE:-1gbit}"
RATE_BYTES_PER_S="${RATE_BYTES_PER_S:-125000000}"
MIN_RATIO="${MIN_RATIO:-1.6}"
NETNS="${NETNS:-1}"
BENCH_PY="${BENCH_PY:-/work/bench-venv/bin/python}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="$TARGET/release"
MODEL="$BENCH/olmoe-w"
KEY="$BENCH/cluster.key"
OUT="$BENCH/cluster-$(date +%Y%m%d-%H%M%S)"
[ "$RUNS" -ge 3 ] || { echo "error: RUNS must be at least 3 (medians of 3 or more)" >&2; exit 1; }
if [ "$NETNS" = 1 ]; then
    for tool in ip tc; do
        command -v "$tool" >/dev/null 2>&1 || {
            echo "error: $tool not found; install iproute2 (Debian), or run with NETNS=0" >&2
            exit 1
        }
    done
fi
[ "$MAX_TOKENS" -ge 2 ] || { echo "error: MAX_TOKENS must be at least 2" >&2; exit 1; }
mkdir -p "$BENCH" "$OUT"

echo "== building (release)" >&2
(cd "$ROOT" && cargo build --release -p charm-worker -p charm-coordinator --bins -p charm-tests --bin udp-delay >&2)

if [ ! -d "$MODEL" ]; then
    echo "== writing the bench model ($LAYERS layers) to $MODEL" >&2
    "$BENCH_PY" "$ROOT/scripts/make_bench_model.py" "$MODEL" --layers "$LAYERS" >&2
fi
if [ ! -f "$KEY" ]; then
    "$BIN/coordinator" keygen --out "$KEY"
fi

CHECK="$BENCH/corecheck"
if [ ! -x "$CHECK" ] || [ "$ROOT/scripts/lib/corecheck.c" -nt "$CHECK" ]; then
    # Prints: mem_GBs_1T mem_GBs_2T mem_ratio compute_ratio
    cc -O2 -pthread -o "$CHECK" "$ROOT/scripts/lib/corecheck.c"
fi

PIDS=()
NS=(cb-c cb-w1 cb-w2)
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$NETNS" = 1 ]; then
        for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    fi
}
trap cleanup EXIT

# start_worker VAR LOG CMD...: starts a worker (CMD is the command prefix),
# waits for its address and stores it in VAR.
start_worker() {
    local var="$1" log="$2"; shift 2
    "$@" --model "$MODEL" --cluster-key-file "$KEY" --no-mdns >"$log.out" 2>"$log" &
    PIDS+=($!)
    wait_for "$log" '^listening on '
    printf -v "$var" '%s' "$(sed -n 's/^listening on //p' "$log.out" | head -1)"
}

# start_bg LOG PATTERN CMD...: starts a helper and waits for PATTERN on its stdout.
start_bg() {
    local log="$1" pattern="$2"; shift 2
    "$@" >"$log.out" 2>"$log" &
    PIDS+=($!)
    wait_for "$log" "$pattern"
}

wait_for() {
    for _ in $(seq 1 600); do
        grep -q "$2" "$1.out" 2>/dev/null && return
        sleep 0.1
    done
    echo "error: $(basename "$1") did not start: $(cat "$1")" >&2
    exit 1
}

echo "== starting workers" >&2
start_worker W1 "$OUT/w1.log" "$BIN/worker" --listen 127.0.0.1:0 ${WORKER_THREADS:+--threads "$WORKER_THREADS"}
start_worker W2 "$OUT/w2.log" "$BIN/worker" --listen 127.0.0.1:0 ${WORKER_THREADS:+--threads "$WORKER_THREADS"}
LOOP_WORKERS="$W1,$W2"

RTT_MS=""
NETEM=1
if [ "$NETNS" = 1 ]; then
    echo "== network namespaces: netem delay ${DELAY_MS} ms per direction, rate $RATE" >&2
    for n in "${NS[@]}"; do ip netns del "$n" 2>/dev/null || true; ip netns add "$n"; ip -n "$n" link set lo up; done
    for i in 1 2; do
        ip link add "cb-c$i" netns cb-c type veth peer name "cb-w$i" netns "cb-w$i"
        ip -n cb-c addr add "10.231.$i.1/30" dev "cb-c$i"
        ip -n "cb-w$i" addr add "10.231.$i.2/30" dev "cb-w$i"
        ip -n cb-c link set "cb-c$i" up
        ip -n "cb-w$i" link set "cb-w$i" up
        for end in "cb-c cb-c$i" "cb-w$i cb-w$i"; do
            set -- $end
            if ! tc -n "$1" qdisc add dev "$2" root netem delay "${DELAY_MS}ms" rate "$RATE" 2>/dev/null; then
                # No netem in this kernel: the rate limit alone (token bucket).
                tc -n "$1" qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 10ms
                NETEM=0
            fi
        done
    done
    # serve NS NAME PORT: sets LISTEN (where a service of namespace NS on
    # PORT listens) and ADDR (where peers reach it). Without netem the
    # service listens on the namespace's loopback and a delay line on the
    # veth address.
    serve() {
        local ns="$1" name="$2" port="$3" i="${1#cb-w}"
        ADDR="10.231.$i.2:$port"
        LISTEN="$ADDR"
        if [ "$NETEM" = 0 ]; then
            LISTEN="127.0.0.1:$port"
            start_bg "$OUT/$name-relay.log" '^relaying ' ip netns exec "$ns" "$BIN/udp-delay" relay \
                --listen "$ADDR" --to "$LISTEN" --delay-ms "$DELAY_MS"
        fi
    }
    [ "$NETEM" = 1 ] || echo "   netem is not available in this kernel: rate limited with tbf, delayed by udp-delay relays" >&2
    serve cb-w1 echo 7500
    start_bg "$OUT/echo.log" '^echoing ' ip netns exec cb-w1 "$BIN/udp-delay" echo --listen "$LISTEN"
    RTT_MS=$(ip netns exec cb-c "$BIN/udp-delay" ping --to "$ADDR" --count 200 | awk '{print $3}')
    echo "   UDP round trip median ${RTT_MS} ms" >&2
    for i in 1 2; do
        serve "cb-w$i" "w$i" 7411
        start_worker LW "$OUT/l$i.log" ip netns exec "cb-w$i" "$BIN/worker" --listen "$LISTEN" ${WORKER_THREADS:+--threads "$WORKER_THREADS"}
        LAN_WORKERS="${LAN_WORKERS:+$LAN_WORKERS,}$ADDR"
    done
fi

PROMPT=$(seq -s, 1000 1063)
veth_bytes() {
    local t=0
    for i in 1 2; do
        for d in tx rx; do
            t=$((t + $(ip netns exec cb-c cat "/sys/class/net/cb-c$i/statistics/${d}_bytes")))
        done
    done
    echo "$t"
}

# run CONFIG TOKENS ROUND: appends one JSON line to $OUT/runs.jsonl
run() {
    local cfg="$1" n="$2" round="$3" before=0 after=0 json
    local gen=(generate --prompt-ids "$PROMPT" --max-tokens "$n" --ignore-eos --json)
    case "$cfg" in
        local) json=$("$BIN/coordinator" --local --model "$MODEL" --threads "$THREADS" "${gen[@]}" 2>>"$OUT/coordinator.log") ;;
        loopback) json=$("$BIN/coordinator" --model "$MODEL" --cluster-key-file "$KEY" --workers "$LOOP_WORKERS" \
                         --min-workers 2 --threads "$THREADS" "${gen[@]}" 2>>"$OUT/coordinator.log") ;;
        lan)
            before=$(veth_bytes)
            json=$(ip netns exec cb-c "$BIN/coordinator" --model "$MODEL" --cluster-key-file "$KEY" --workers "$LAN_WORKERS" \
                   --min-workers 2 --threads "$THREADS" "${gen[@]}" 2>>"$OUT/coordinator.log")
            after=$(veth_bytes) ;;
    esac
    python3 - "$cfg" "$n" "$round" "$((after - before))" "$json" >>"$OUT/runs.jsonl" <<'EOF'
import json, sys
cfg, n, rnd, wire, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
s = out["stats"]
print(json.dumps({"config": cfg, "tokens": n, "round": rnd, "decode_tok_s": s["decode_tok_s"],
                  "prefill_tok_s": s["prefill_tok_s"], "sent": s["network_bytes_sent"],
                  "received": s["network_bytes_received"], "round_trips": s["round_trips"],
                  "wire_bytes": wire, "ids": out["ids"], "workers": len(s["workers"]),
                  "profile": s.get("profile"),
                  "per_worker": [{k: w.get(k) for k in ("address", "requests", "rtt_ms", "compute_ms")}
                                 for w in s["workers"]]}))
EOF
}

# run_batch CONFIG PIPELINE ROUND: BATCH prompts at once; one JSON line to $OUT/batch.jsonl
run_batch() {
    local cfg="$1" pipe="$2" round="$3" json flags=()
    [ "$pipe" = 1 ] && flags=(--pipeline)
    local gen=(generate --batch-file "$OUT/batch.txt" --batch-ids --max-tokens "$MAX_TOKENS" --ignore-eos --json)
    case "$cfg" in
        loopback) json=$("$BIN/coordinator" --model "$MODEL" --cluster-key-file "$KEY" --workers "$LOOP_WORKERS" \
                         --min-workers 2 --threads "$THREADS" "${flags[@]}" "${gen[@]}" 2>>"$OUT/coordinator.log") ;;
        lan) json=$(ip netns exec cb-c "$BIN/coordinator" --model "$MODEL" --cluster-key-file "$KEY" --workers "$LAN_WORKERS" \
                    --min-workers 2 --threads "$THREADS" "${flags[@]}" "${gen[@]}" 2>>"$OUT/coordinator.log") ;;
    esac
    python3 - "$cfg" "$pipe" "$round" "$json" >>"$OUT/batch.jsonl" <<'EOF'
import hashlib, json, sys
cfg, pipe, rnd, out = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), json.loads(sys.argv[4])
s = out["stats"]
print(json.dumps({"config": cfg, "pipeline": pipe, "round": rnd, "tok_s": s["tok_s"], "round_trips": s["round_trips"],
                  "ids": hashlib.sha256(json.dumps(out["sequences"]).encode()).hexdigest()}))
EOF
}

CONFIGS=(local loopback)
[ "$NETNS" = 1 ] && CONFIGS+=(lan)
echo "== warm-up and 1-token runs" >&2
for cfg in "${CONFIGS[@]}"; do run "$cfg" "$MAX_TOKENS" 0; run "$cfg" 1 0; done
: >"$OUT/checks.txt"
for r in $(seq 1 "$RUNS"); do
    pre=$("$CHECK")
    for cfg in "${CONFIGS[@]}"; do
        echo "== round $r: $cfg" >&2
        run "$cfg" "$MAX_TOKENS" "$r"
    done
    post=$("$CHECK")
    echo "$r $pre $post" >>"$OUT/checks.txt"
done
uname -a >"$OUT/machine.txt"; lscpu | grep -E 'Model name|^CPU\(s\)' >>"$OUT/machine.txt"

python3 - "$OUT" "$MAX_TOKENS" "$MIN_RATIO" "$LAYERS" "${RTT_MS:-}" "$RATE_BYTES_PER_S" "$DELAY_MS" "$RATE" "$NETEM" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys
out, n, min_ratio, layers = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rtt = float(sys.argv[5]) if sys.argv[5] else None
rate, delay, rate_name, netem = float(sys.argv[6]), sys.argv[7], sys.argv[8], sys.argv[9] == "1"
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
checks = {}
for line in open(f"{out}/checks.txt"):
    f = line.split()
    checks[int(f[0])] = (float(f[4]), float(f[8]))  # compute ratio before, after
passing = [r for r, (a, b) in checks.items() if a >= min_ratio and b >= min_ratio]
use = passing if len(passing) >= 2 else list(checks)
def med(cfg, key, rounds):
    return statistics.median(x[key] for x in runs if x["config"] == cfg and x["tokens"] == n and x["round"] in rounds)
def one(cfg, key, tokens):
    return next(x[key] for x in runs if x["config"] == cfg and x["tokens"] == tokens and x["round"] == 0)
ids = {tuple(x["ids"]) for x in runs if x["tokens"] == n}
cfgs = [c for c in ("local", "loopback", "lan") if any(x["config"] == c for x in runs)]
local = med("local", "decode_tok_s", use)
print(f"rounds used: {sorted(use)} of {sorted(checks)} (compute ratio >= {min_ratio} before and after: {sorted(passing)})")
print(f"ids identical in all {sum(x['tokens'] == n for x in runs)} runs of {n} tokens: {len(ids) == 1}")
print()
print("| configuration | decode tok/s (median) | ms/token | vs local | frame bytes out/in per decode token | round trips per decode token | wire bytes per decode token |")
print("|---|---|---|---|---|---|---|")
per = {}
for c in cfgs:
    tok_s = med(c, "decode_tok_s", use)
    row = [c, f"{tok_s:.2f}", f"{1e3 / tok_s:.1f}", f"{tok_s / local:.3f}"]
    if c == "local":
        row += ["–", "–", "–"]
    else:
        d = lambda k: (one(c, k, n) - one(c, k, 1)) / (n - 1)
        per[c] = (d("sent"), d("received"), d("round_trips"), d("wire_bytes"))
        row += [f"{per[c][0]:.0f} / {per[c][1]:.0f}", f"{per[c][2]:.2f}", f"{per[c][3]:.0f}" if c == "lan" else "–"]
    print("| " + " | ".join(row) + " |")
print()
for c in cfgs:
    vals = [f"{x['decode_tok_s']:.2f}" for x in sorted(runs, key=lambda x: x["round"]) if x["config"] == c and x["tokens"] == n and x["round"] > 0]
    print(f"- {c}: decode tok/s per round {', '.join(vals)}")
for r in sorted(checks):
    print(f"- round {r}: compute ratio 2T/1T before {checks[r][0]:.2f}, after {checks[r][1]:.2f}")
if "lan" in per and rtt is not None:
    sent, recv, trips, wire = per["lan"]
    bound = 1e3 / local + trips * rtt + (sent + recv) / rate * 1e3
    wire_bound = 1e3 / local + trips * rtt + wire / rate * 1e3
    lan = 1e3 / med("lan", "decode_tok_s", use)
    print()
    link = f"netem {delay} ms each way, {rate_name}" if netem else f"no netem in this kernel: tbf {rate_name} and udp-delay relays, {delay} ms each way"
    print(f"lan ({link}; UDP round trip median {rtt} ms): {lan:.1f} ms/token")
    print(f"bound = local {1e3 / local:.1f} ms + {trips:.2f} round trips × {rtt} ms + {sent + recv:.0f} frame bytes / rate = {bound:.1f} ms/token "
          f"(with wire bytes: {wire_bound:.1f}); measured / bound = {lan / bound:.3f}")
EOF
if [ "${BATCH:-0}" -ge 2 ]; then
    python3 -c "import random; r = random.Random(1); [print(','.join(str(r.randrange(50000)) for _ in range(32))) for _ in range($BATCH)]" >"$OUT/batch.txt"
    BCONFIGS=(loopback)
    [ "$NETNS" = 1 ] && BCONFIGS+=(lan)
    for r in $(seq 0 "$RUNS"); do   # round 0: warm-up
        for cfg in "${BCONFIGS[@]}"; do
            for pipe in 0 1; do
                echo "== batch of $BATCH, round $r: $cfg, pipeline $pipe" >&2
                run_batch "$cfg" "$pipe" "$r"
            done
        done
    done
    python3 - "$OUT/batch.jsonl" "$BATCH" <<'EOF' | tee -a "$OUT/table.md"
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print()
print(f"{sys.argv[2]} prompts stepped together: tok/s of all sequences (median of rounds 1..), ids identical in every run: {len({r['ids'] for r in runs}) == 1}")
print()
print("| configuration | one step | --pipeline | pipeline / one step |")
print("|---|---|---|---|")
for cfg in dict.fromkeys(r["config"] for r in runs):
    med = lambda p: statistics.median(r["tok_s"] for r in runs if r["config"] == cfg and r["pipeline"] == p and r["round"] > 0)
    ratio = statistics.median(a["tok_s"] / b["tok_s"] for a in runs for b in runs
                              if a["config"] == b["config"] == cfg and a["round"] == b["round"] > 0 and a["pipeline"] and not b["pipeline"])
    print(f"| {cfg} | {med(False):.2f} | {med(True):.2f} | {ratio:.2f} × |")
EOF
fi
echo "raw runs: $OUT/runs.jsonl" >&2
