#!/usr/bin/env bash
# Read-ahead that measures its payoff, against --no-prefetch, on the bf16
# olmoe-w container (docs/benchmarks.md, "Read-ahead that measures its
# payoff").
#
#   bash scripts/bench_prefetch.sh      # ROUNDS=3 TOKENS=96 PCTS="25 50"
#
# Needs root (drops the page cache before every run), the release
# `coordinator`, and the bench model $BENCH/olmoe-w
# (scripts/make_bench_model.py $BENCH/olmoe-w --family olmoe --layers 4),
# which it converts once to $BENCH/olmoe-w.bf16. Each run: a fresh
# --state-dir, O_DIRECT, 2 threads, the bench prompt (64 ids), TOKENS
# tokens; configurations alternate within each round. Prints one line per
# run: round, budget, mode, decode tok/s, MiB read and read-ahead's account.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="${CHARM_BENCH_DIR:-/work/charm-bench}"
ROUNDS="${ROUNDS:-3}"
TOKENS="${TOKENS:-96}"
PCTS="${PCTS:-25 50}"
BIN="$ROOT/target/release/coordinator"
(cd "$ROOT" && cargo build --release -q -p charm-coordinator --bin coordinator)
C="$BENCH/olmoe-w.bf16"
[ -d "$C" ] || "$BIN" --model "$BENCH/olmoe-w" convert --out "$C" --quant bf16
SIZE=$(stat -c %s "$C/experts.bin")
PROMPT="$(python3 -c "print(','.join(str((i * 7919 + 13) % 50000 + 100) for i in range(64)))")"
for round in $(seq "$ROUNDS"); do
  for pct in $PCTS; do
    gb=$(python3 -c "print($SIZE * $pct / 100 / 2**30)")
    for mode in read-ahead no-prefetch; do
      flags=()
      [ "$mode" = no-prefetch ] && flags=(--no-prefetch)
      st=$(mktemp -d)
      sync
      echo 3 > /proc/sys/vm/drop_caches
      out=$("$BIN" --local --model "$C" --threads 2 --expert-cache-gb "$gb" --direct-io "${flags[@]}" \
        --state-dir "$st" generate --prompt-ids "$PROMPT" --max-tokens "$TOKENS" --ignore-eos --json 2>/dev/null)
      rm -rf "$st"
      python3 - "$round" "$pct" "$mode" "$out" <<'PY'
import json, sys
rnd, pct, mode, out = sys.argv[1:5]
s = json.loads(out)["stats"]
print(rnd, f"{pct}%", mode, round(s["decode_tok_s"], 3), "MiB read", round(s["expert_bytes_read"] / 2**20),
      "issued", s["prefetch_issued"], "hits", s["prefetch_hits"], "wasted", s["prefetch_wasted"],
      "harm", s["prefetch_harm"], "stand-downs", s["prefetch_stand_downs"], "paused", s["prefetch_paused_steps"])
PY
    done
  done
done
