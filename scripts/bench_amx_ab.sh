#!/usr/bin/env bash
# charm's prefill with AMX tiles against the same binary with them off
# (`CHARM_ISA=avx512vnni`), on the GGUF files scripts/bench_vs_llamacpp.sh
# made, alternating per file and round: the same prompt ids, the same
# threads and KV cache type as that script. Prints each run, then per file
# the median prefill of both and the median of the per-round ratios, and
# whether both produced the same ids (they must: AMX changes no bit).
# Needs a CPU with AMX-INT8 (it says so and stops elsewhere).
#
#   bash scripts/bench_amx_ab.sh
#
# Environment (defaults): CHARM_BENCH_DIR (/work/charm-bench), FAMILY
# (olmoe), TYPES ("q8_0 q4_0 q4_k_m q6_k iq4_xs"), RUNS (3), PROMPT (512),
# GEN (16), THREADS (2), KV (f16).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="${CHARM_BENCH_DIR:-/work/charm-bench}"
FAMILY="${FAMILY:-olmoe}"
TYPES="${TYPES:-q8_0 q4_0 q4_k_m q6_k iq4_xs}"
RUNS="${RUNS:-3}"
PROMPT="${PROMPT:-512}"
GEN="${GEN:-16}"
THREADS="${THREADS:-2}"
KV="${KV:-f16}"
grep -qw amx_int8 /proc/cpuinfo || { echo "no AMX-INT8 on this CPU: nothing to compare"; exit 0; }
source "$ROOT/scripts/lib/wait_idle.sh"
(cd "$ROOT" && cargo build --release -q -p charm-coordinator)
TARGET="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
CHARM="$(mktemp -d)/coordinator"
cp "$TARGET/release/coordinator" "$CHARM"
IDS="$(python3 -c "import random; r = random.Random(0); print(','.join(str(r.randrange(50000)) for _ in range($PROMPT)))")"
RAW="$(mktemp)"
for round in $(seq 1 "$RUNS"); do
  for ty in $TYPES; do
    G="$BENCH/$FAMILY-w.$ty.gguf"
    [ -f "$G" ] || { echo "$G missing: run scripts/bench_vs_llamacpp.sh with TYPES=\"$TYPES\" first" >&2; exit 2; }
    for isa in amx avx512vnni; do
      wait_idle
      c="$(CHARM_ISA=$isa "$CHARM" --model "$G" --local --threads "$THREADS" --kv-cache "$KV" generate \
        --prompt-ids "$IDS" --max-tokens "$GEN" --ignore-eos --json)"
      python3 - "$round" "$ty" "$isa" "$c" >>"$RAW" <<'PY'
import json, sys
c = json.loads(sys.argv[4])
print(json.dumps({"round": int(sys.argv[1]), "type": sys.argv[2], "isa": sys.argv[3],
                  "prefill_tok_s": c["stats"]["prefill_tok_s"], "ids": c["ids"]}))
PY
      tail -1 "$RAW" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
print("   round %d %-7s %-10s prefill %7.1f tok/s" % (d["round"], d["type"], d["isa"], d["prefill_tok_s"]))'
    done
  done
done
python3 - "$RAW" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
types = list(dict.fromkeys(r["type"] for r in rows))
print("| file | AMX prefill | VNNI prefill | AMX / VNNI (per round) | same ids |")
print("|---|---|---|---|---|")
for t in types:
    by = {(r["round"], r["isa"]): r for r in rows if r["type"] == t}
    rounds = sorted({k[0] for k in by})
    a = [by[(k, "amx")]["prefill_tok_s"] for k in rounds]
    v = [by[(k, "avx512vnni")]["prefill_tok_s"] for k in rounds]
    ratio = statistics.median(x / y for x, y in zip(a, v))
    same = all(by[(k, "amx")]["ids"] == by[(k, "avx512vnni")]["ids"] for k in rounds)
    print(f"| {t} | {statistics.median(a):.1f} | {statistics.median(v):.1f} | {ratio:.2f} × | {'yes' if same else 'NO'} |")
PY
