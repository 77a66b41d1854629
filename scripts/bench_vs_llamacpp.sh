#!/usr/bin/env bash
# charm against llama.cpp on the very same GGUF files, on this machine.
#
#   bash scripts/bench_vs_llamacpp.sh          # results: docs/benchmarks.md
#
# 1. Builds `coordinator` (release) and the kernel micro-benchmark.
# 2. Once, outside the repository: a venv $LLAMA_VENV with the PyPI package
#    llama-cpp-python (which compiles llama.cpp for this CPU with
#    GGML_NATIVE=ON; AMX off, see docs/TEST-MATERIAL notes) and its source
#    in $LLAMA_SRC (for llama.cpp's converter, convert_hf_to_gguf.py).
# 3. Once: the bench model $BENCH/$FAMILY-w (scripts/make_bench_model.py,
#    $LAYERS layers, random weights; FAMILY=olmoe: OLMoE-1B-7B widths,
#    hidden 2048, 16 heads, 64 experts of 1024, top-8, vocabulary 50304,
#    given the OLMo tokenizer; FAMILY=qwen3next: Qwen3-Next-80B-A3B widths,
#    three gated DeltaNet layers and one gated attention layer, 512 experts
#    of 512, top-10, a shared expert, vocabulary 151936, given the Qwen3
#    tokenizer; FAMILY=glm4moelite: GLM-4.7-Flash widths, MLA with 20
#    heads, one dense and three MoE layers of 64 experts of 1536, top-4, a
#    shared expert, vocabulary 154880, given the Qwen3 tokenizer's
#    vocabulary; FAMILY=gptoss: gpt-oss-20b widths, hidden 2880, 64 query
#    and 8 KV heads of 64 with sinks, sliding window 128 on alternate
#    layers, 32 experts of 2880, top-4, in the release's MXFP4 blocks,
#    vocabulary 201088, given the gpt-oss tokenizer), converted by
#    llama.cpp's converter to Q8_0, and to the other types by llama.cpp's
#    quantizer (llama_model_quantize) from a BF16 conversion. For gpt-oss
#    the types are what the converter makes of the MXFP4 checkpoint:
#    `mxfp4` is `--outtype q8_0` (experts kept as MXFP4, the other
#    matrices Q8_0, vectors and the router F32: the layout, and size, of the
#    common gpt-oss-20b MXFP4 GGUF downloads), `mxfp4_bf16` is `--outtype
#    bf16` (experts MXFP4, the other matrices in the release's bf16).
# 4. For each of $RUNS rounds and each type: charm (`generate --ignore-eos`)
#    then llama.cpp (scripts/bench_llamacpp.py), alternating, on the same
#    $PROMPT random prompt ids, $GEN decoded tokens, $THREADS threads;
#    charm with an f16 KV cache ($KV), the cache type llama.cpp uses by
#    default, so both engines read the same cache bytes per token.
#    `corecheck` (scripts/lib/corecheck.c) measures memory read bandwidth
#    with 1 and 2 threads before each round (and whether the second core is
#    there: this VM's sometimes vanishes), on a 512 MiB buffer; `replay`
#    (scripts/lib/replay.c) reads exactly a decoded token's bytes of each
#    GGUF (its dense tensors, one embedding row, top-k random experts of
#    each expert tensor per layer) from the file's layout in memory, 64
#    tokens, $THREADS threads: the rate those bytes can be read at with the
#    caches in play. Both read with two loops, a plain one and the same
#    with a software prefetch 2 KiB ahead (as charm's kernels ask), and
#    take the faster: a bound a decode loop should not beat (the plain loop
#    alone read slower than charm's decode on this VM at times).
# 5. Prints medians per engine and type, the median of the per-round ratios
#    charm / llama.cpp, whether both engines produced the same ids, and the
#    decode roofline: bytes of weights one decoded token reads (every dense
#    tensor, one embedding row, top-k / experts of each expert tensor, from
#    the GGUF's tensor table) divided by the 2-thread read bandwidth, and
#    divided by the replay's rate (the roofline with the caches: on a CPU
#    whose last-level cache holds a good part of those bytes between tokens
#    the first exceeds 100 %).
#    Raw JSON lines and the table go to $BENCH/vs-llamacpp-$FAMILY-w-<time>/.
#
# Before every round and every engine run the script waits while a build
# runs on the machine (`pgrep -x rustc`, `pgrep cargo`: another engineer's
# build or tests would share the two cores). A round whose 2-thread /
# 1-thread compute check, before or after it, is below $MIN_RATIO (the
# second core gone), or that found a build running between its runs, is
# discarded ($OUT/discarded.jsonl) and run again, up to 2 x $RUNS rounds
# in all. The charm binary is copied into $OUT first, so a rebuild during
# the rounds cannot change what later rounds run.
# (The 2-thread / 1-thread memory ratio is recorded, not used: on the AMD
# EPYC VM one thread alone reads 23-28 GB/s of the two threads' 33-51.)
#
# Environment (defaults): CHARM_BENCH_DIR (/work/charm-bench), FAMILY (olmoe), LAYERS (4),
# RUNS (5), PROMPT (512), GEN (128; PROMPT + GEN within the model's context),
# THREADS (2), TYPES ("q8_0 q4_0"; gptoss:
# "mxfp4"), KV (f16), MIN_RATIO (1.6),
# LLAMA_VENV (/work/llama-venv), LLAMA_SRC (/work/llama-src), BENCH_PY
# (/work/bench-venv/bin/python: numpy, for make_bench_model.py), CONVERT_PY
# (/work/venv/bin/python: torch, transformers, safetensors, numpy, for
# llama.cpp's converter).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="${CHARM_BENCH_DIR:-/work/charm-bench}"
FAMILY="${FAMILY:-olmoe}"
LAYERS="${LAYERS:-4}"
RUNS="${RUNS:-5}"
PROMPT="${PROMPT:-512}"
GEN="${GEN:-128}"
THREADS="${THREADS:-2}"
if [ "$FAMILY" = gptoss ]; then TYPES="${TYPES:-mxfp4}"; else TYPES="${TYPES:-q8_0 q4_0}"; fi
KV="${KV:-f16}"
MIN_RATIO="${MIN_RATIO:-1.6}"
LLAMA_VENV="${LLAMA_VENV:-/work/llama-venv}"
LLAMA_SRC="${LLAMA_SRC:-/work/llama-src}"
LLAMA_VERSION=0.3.36
BENCH_PY="${BENCH_PY:-/work/bench-venv/bin/python}"
CONVERT_PY="${CONVERT_PY:-/work/venv/bin/python}"
mkdir -p "$BENCH"

# shellcheck source=lib/wait_idle.sh
source "$ROOT/scripts/lib/wait_idle.sh"

echo "== building charm (release)" >&2
(cd "$ROOT" && cargo build --release -q -p charm-coordinator && cargo build --release -q -p charm-common --example bench_kernels)
TARGET="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
CHARM="$TARGET/release/coordinator"

if [ ! -x "$LLAMA_VENV/bin/python" ] || ! "$LLAMA_VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "== building llama.cpp $LLAMA_VERSION into $LLAMA_VENV (about 10 minutes on 2 cores)" >&2
  python3 -m venv "$LLAMA_VENV"
  AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$AMX' -DCMAKE_CXX_FLAGS='$AMX'" \
    "$LLAMA_VENV/bin/pip" install -q --no-cache-dir "llama-cpp-python==$LLAMA_VERSION"
fi
CONVERTER="$LLAMA_SRC/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
if [ ! -f "$CONVERTER/convert_hf_to_gguf.py" ]; then
  mkdir -p "$LLAMA_SRC"
  "$LLAMA_VENV/bin/pip" download -q --no-deps "llama-cpp-python==$LLAMA_VERSION" -d "$LLAMA_SRC"
  tar xzf "$LLAMA_SRC/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$LLAMA_SRC"
fi

# ---- the bench model and its GGUF files --------------------------------------
case "$FAMILY" in
  olmoe) TOKFILES="olmo/tokenizer.json" CONVERT_FLAGS="" ;;
  # No multi-token-prediction block in the bench model.
  qwen3next) TOKFILES="qwen3/tokenizer.json qwen3/tokenizer_config.json" CONVERT_FLAGS="--no-mtp" ;;
  # No GLM tokenizer is reachable offline: the Qwen3 one, written as a plain
  # byte-level BPE vocabulary (the converter's GLM vocabulary wants GLM's
  # special tokens).
  glm4moelite) TOKFILES="qwen3/tokenizer.json qwen3/tokenizer_config.json" CONVERT_FLAGS="" \
    VOCAB_PATCH="from conversion.glm import Glm4MoeLiteModel as M; M.set_vocab = lambda self: self._set_vocab_gpt2()" ;;
  # The gpt-oss tokenizer (o200k_harmony) from the test material, its
  # vocabulary and merges written as they are, but its pre-tokenizer named
  # `gpt-2` instead of the converter's `gpt-4o`, which charm's GGUF
  # tokenizer does not accept yet (coordinator/src/gguf_text.rs). Prompts
  # are ids and the output ids are compared as ids, so neither engine
  # tokenizes and the name changes nothing timed.
  gptoss) TOKFILES="gptoss/tokenizer.json gptoss/tokenizer_config.json gptoss/chat_template.jinja" CONVERT_FLAGS="" \
    VOCAB_PATCH="from conversion.gpt_oss import GptOssModel as M; M.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'" ;;
  *) echo "FAMILY must be olmoe, qwen3next, glm4moelite or gptoss" >&2; exit 2 ;;
esac
NAME="$FAMILY-w"
MODEL="$BENCH/$NAME"
if [ ! -f "$MODEL/config.json" ]; then
  "$BENCH_PY" "$ROOT/scripts/make_bench_model.py" "$MODEL" --family "$FAMILY" --layers "$LAYERS"
fi
# Both engines must be able to decode every token asked for: charm stops a
# sequence at the model's context (its decode rate would read 0).
CONTEXT="$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("text_config", c)["max_position_embeddings"])' "$MODEL/config.json")"
if [ $((PROMPT + GEN)) -gt "$CONTEXT" ]; then
  echo "PROMPT ($PROMPT) + GEN ($GEN) exceeds the model's context of $CONTEXT tokens" >&2
  exit 2
fi
TOKDIR="$BENCH/$NAME-tok"
if [ ! -f "$TOKDIR/tokenizer.json" ]; then
  bash "$ROOT/scripts/fetch_test_material.sh" >/dev/null
  mkdir -p "$TOKDIR"
  for f in "$MODEL"/*; do ln -sf "$f" "$TOKDIR/"; done
  for f in $TOKFILES; do cp "$ROOT/tests/material/$f" "$TOKDIR/"; done
fi
convert() { # outtype out
  (cd "$CONVERTER" && PYTHONPATH=gguf-py:. "$CONVERT_PY" -c \
    "import convert_hf_to_gguf as c; ${VOCAB_PATCH:-pass}; c.main()" "$TOKDIR" \
    --outtype "$1" $CONVERT_FLAGS --outfile "$2.partial" >"$BENCH/convert-$NAME-$1.log" 2>&1) && mv "$2.partial" "$2"
}
for ty in $TYPES; do
  G="$BENCH/$NAME.$ty.gguf"
  [ -f "$G" ] && continue
  echo "== $G" >&2
  case "$ty" in
    q8_0) convert q8_0 "$G" ;;
    # An MXFP4 checkpoint (gpt-oss): the converter keeps the experts' blocks.
    mxfp4) convert q8_0 "$G" ;;
    mxfp4_bf16) convert bf16 "$G" ;;
    *)
      [ -f "$BENCH/$NAME.bf16.gguf" ] || convert bf16 "$BENCH/$NAME.bf16.gguf"
      "$LLAMA_VENV/bin/python" - "$BENCH/$NAME.bf16.gguf" "$G" "$ty" "$THREADS" <<'EOF'
import sys, llama_cpp
src, dst, ty, threads = sys.argv[1], sys.argv[2], sys.argv[3].upper(), int(sys.argv[4])
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ty}")
params.nthread = threads
rc = llama_cpp.llama_model_quantize(src.encode(), (dst + ".partial").encode(), params)
if rc != 0:
    sys.exit(f"llama_model_quantize failed ({rc})")
import os
os.rename(dst + ".partial", dst)
EOF
      ;;
  esac
done

# ---- bandwidth / core check ---------------------------------------------------
CHECK="$BENCH/corecheck"
if [ ! -x "$CHECK" ] || [ "$ROOT/scripts/lib/corecheck.c" -nt "$CHECK" ]; then
  cc -O2 -pthread -o "$CHECK" "$ROOT/scripts/lib/corecheck.c"
fi
REPLAY="$BENCH/replay"
if [ ! -x "$REPLAY" ] || [ "$ROOT/scripts/lib/replay.c" -nt "$REPLAY" ]; then
  cc -O2 -pthread -o "$REPLAY" "$ROOT/scripts/lib/replay.c"
fi
# Each GGUF's per-token reads, from its tensor table: the spans `replay`
# reads (.ranges) and their total with the tensor types (.sizes.json, for
# the table): every dense tensor, one embedding row, used / experts of each
# expert tensor.
for ty in $TYPES; do
  PYTHONPATH="$CONVERTER/gguf-py" "$CONVERT_PY" - "$BENCH/$NAME.$ty.gguf" "$ty" "$BENCH/$NAME.$ty.sizes.json" \
    >"$BENCH/$NAME.$ty.ranges" <<'EOF'
import json, re, sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
val = lambda k: int(r.fields[f"{arch}.{k}"].parts[-1][0])
experts, used = val("expert_count"), val("expert_used_count")
print("used", used)
total, types = 0.0, {}
for t in r.tensors:
    off, n = int(t.data_offset), int(t.n_bytes)
    if "_exps" in t.name:
        print("experts", int(re.match(r"blk\.(\d+)\.", t.name).group(1)), off, n, experts)
        total += n * used / experts
    elif t.name == "token_embd.weight":
        print("rows", off, n, int(t.shape[-1]))
        total += n / int(t.shape[-1])
    else:
        print("dense", off, n)
        total += n
    types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
with open(sys.argv[3], "w") as f:
    print(json.dumps({"type": sys.argv[2], "bytes_per_token": total, "tensor_types": types}), file=f)
EOF
done

OUT="$BENCH/vs-llamacpp-$NAME-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
RAW="$OUT/runs.jsonl"
# The binary just built, kept with the results: a build by someone else
# during the rounds cannot change what later rounds run.
cp "$CHARM" "$OUT/coordinator"
CHARM="$OUT/coordinator"
(cd "$ROOT" && git rev-parse --short HEAD && git status --short) >"$OUT/commit.txt" 2>/dev/null || true
IDS="$(python3 -c "import random; r = random.Random(0); print(','.join(str(r.randrange(50000)) for _ in range($PROMPT)))")"
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512_vnni\).*/Flags: ... avx512_vnni .../' >"$OUT/machine.txt" || true

echo "== kernels (one thread, cache-resident)" >&2
"$TARGET/release/examples/bench_kernels" | tee "$OUT/kernels.txt" >&2

kept=0
round=0
while [ "$kept" -lt "$RUNS" ] && [ "$round" -lt $((2 * RUNS)) ]; do
  round=$((round + 1))
  ROUND="$OUT/round.jsonl"
  : >"$ROUND"
  wait_idle
  set -- $("$CHECK")
  before="{\"mem_gbs_1t\":$1,\"mem_gbs_2t\":$2,\"mem_ratio\":$3,\"compute_ratio\":$4}"
  ratio_before=$4
  echo "== round $round: memory $1 / $2 GB/s (1T / 2T), 2T/1T compute x$4" >&2
  built=0
  for ty in $TYPES; do
    G="$BENCH/$NAME.$ty.gguf"
    set -- $("$REPLAY" "$G" 64 "$THREADS" <"$BENCH/$NAME.$ty.ranges")
    echo "{\"round\":$round,\"type\":\"$ty\",\"replay\":{\"gbs\":$1,\"tok_s\":$2,\"bytes_per_token\":$3,\"plain_gbs\":$5,\"prefetch_gbs\":$6}}" >>"$ROUND"
    echo "   $ty replay of a token's bytes: $1 GB/s, $2 tok/s (plain loop $5, prefetching $6 GB/s)" >&2
    building && built=1
    wait_idle
    c="$("$CHARM" --model "$G" --local --threads "$THREADS" --kv-cache "$KV" generate --prompt-ids "$IDS" \
      --max-tokens "$GEN" --ignore-eos --json)"
    building && built=1
    wait_idle
    l="$("$LLAMA_VENV/bin/python" "$ROOT/scripts/bench_llamacpp.py" "$G" --threads "$THREADS" \
      --prompt-ids "$IDS" --max-tokens "$GEN")"
    building && built=1
    python3 - "$round" "$ty" "$c" "$l" >>"$ROUND" <<'EOF'
import json, sys
r, ty, c, l = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
s = c["stats"]
# The cache holds every prompt and generated token but the last.
cached = s["prompt_tokens"] + s["generated_tokens"] - 1
print(json.dumps({"round": r, "type": ty, "engine": "charm", "prefill_tok_s": s["prefill_tok_s"],
                  "decode_tok_s": s["decode_tok_s"], "profile": s.get("profile"), "ids": c["ids"],
                  "kv_bytes_per_token": s["kv_cache_bytes"] / cached}))
print(json.dumps({"round": r, "type": ty, "engine": "llama.cpp", "prefill_tok_s": l["prefill_tok_s"],
                  "decode_tok_s": l["decode_tok_s"], "ids": l["ids"],
                  "kv_bytes_per_token": l.get("kv_bytes_per_token")}))
EOF
    tail -2 "$ROUND" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    t, e, p, r = d["type"], d["engine"], d["prefill_tok_s"], d["decode_tok_s"]
    print(f"   {t} {e:<9} prefill {p:7.1f} tok/s  decode {r:6.1f} tok/s", file=sys.stderr)'
  done
  set -- $("$CHECK")
  after="{\"mem_gbs_1t\":$1,\"mem_gbs_2t\":$2,\"mem_ratio\":$3,\"compute_ratio\":$4}"
  echo "   after round $round: memory $1 / $2 GB/s (1T / 2T), 2T/1T compute x$4" >&2
  echo "{\"round\":$round,\"check\":$before,\"check_after\":$after,\"build_seen\":$built}" >>"$ROUND"
  if [ "$built" -eq 0 ] && python3 -c "import sys; sys.exit(not min($ratio_before, $4) >= $MIN_RATIO)"; then
    cat "$ROUND" >>"$RAW"
    kept=$((kept + 1))
  else
    echo "   round $round discarded (compute x$ratio_before / x$4 before / after, build seen: $built)" >&2
    cat "$ROUND" >>"$OUT/discarded.jsonl"
  fi
  rm -f "$ROUND"
done
[ "$kept" -gt 0 ] || { echo "no round kept (see $OUT/discarded.jsonl)" >&2; exit 1; }

# ---- bytes per decoded token (written with the ranges above) --------------
for ty in $TYPES; do cat "$BENCH/$NAME.$ty.sizes.json" >>"$RAW"; done

python3 - "$RAW" "$THREADS" "$PROMPT" "$GEN" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys
raw, threads, prompt, gen = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [json.loads(l) for l in open(raw)]
checks = [r["check"] for r in rows if "check" in r]
after = [r["check_after"] for r in rows if "check_after" in r]
bw = statistics.median(c["mem_gbs_2t"] for c in checks)
runs = [r for r in rows if "engine" in r]
replays = [r for r in rows if "replay" in r]
sizes = {r["type"]: r for r in rows if "bytes_per_token" in r}
med = statistics.median
print(f"{prompt}-token prompt, {gen} decoded tokens, {threads} threads; medians of {len(checks)} alternating rounds.")
print(f"Memory read bandwidth (2 threads, median): {bw:.1f} GB/s; 2T/1T compute ratios before / after each round: "
      + ", ".join(f"{c['compute_ratio']:.2f} / {a['compute_ratio']:.2f}" for c, a in zip(checks, after))
      + "; 2T/1T memory: " + ", ".join(f"{c['mem_ratio']:.2f}" for c in checks) + "\n")
def replay_roof(ty):
    return med(r["replay"]["tok_s"] for r in replays if r["type"] == ty) if replays else float("nan")
print("| type | engine | prefill tok/s | decode tok/s | decode, % of roofline | decode, % of replay roofline | KV bytes / token |")
print("|---|---|---|---|---|---|---|")
for ty in dict.fromkeys(r["type"] for r in runs):
    roof = bw * 1e9 / sizes[ty]["bytes_per_token"]
    for eng in ("charm", "llama.cpp"):
        rs = [r for r in runs if r["type"] == ty and r["engine"] == eng]
        p, d = med(r["prefill_tok_s"] for r in rs), med(r["decode_tok_s"] for r in rs)
        kv = rs[-1].get("kv_bytes_per_token")
        kv = f"{kv:.0f}" if kv else "?"
        print(f"| {ty} | {eng} | {p:.1f} | {d:.1f} | {100 * d / roof:.0f} % | {100 * d / replay_roof(ty):.0f} % | {kv} |")
print()
print("| type | bytes / decoded token | roofline tok/s | replay GB/s | replay roofline tok/s | charm / llama.cpp prefill | charm / llama.cpp decode | same ids |")
print("|---|---|---|---|---|---|---|---|")
for ty in dict.fromkeys(r["type"] for r in runs):
    roof = bw * 1e9 / sizes[ty]["bytes_per_token"]
    pairs = {}
    for r in runs:
        if r["type"] == ty:
            pairs.setdefault(r["round"], {})[r["engine"]] = r
    pr = [p["charm"]["prefill_tok_s"] / p["llama.cpp"]["prefill_tok_s"] for p in pairs.values()]
    dr = [p["charm"]["decode_tok_s"] / p["llama.cpp"]["decode_tok_s"] for p in pairs.values()]
    same = sum(p["charm"]["ids"] == p["llama.cpp"]["ids"] for p in pairs.values())
    rg = med(r["replay"]["gbs"] for r in replays if r["type"] == ty) if replays else float("nan")
    print(f"| {ty} | {sizes[ty]['bytes_per_token'] / 1e6:.1f} MB | {roof:.1f} | {rg:.1f} | {replay_roof(ty):.1f} | "
          f"{med(pr):.2f}x ({min(pr):.2f}-{max(pr):.2f}) | {med(dr):.2f}x ({min(dr):.2f}-{max(dr):.2f}) | "
          f"{same}/{len(pairs)} |")
print()
# Each round's decode against the replay of the same round (memory moves
# between rounds on a shared VM; the medians above mix rounds).
for ty in dict.fromkeys(r["type"] for r in runs):
    roofs = {r["round"]: r["replay"]["tok_s"] for r in replays if r["type"] == ty}
    for eng in ("charm", "llama.cpp"):
        fr = [100 * r["decode_tok_s"] / roofs[r["round"]] for r in runs
              if r["type"] == ty and r["engine"] == eng and r["round"] in roofs]
        if fr:
            print(f"- {ty} {eng} decode per round, % of that round's replay roofline: "
                  + ", ".join(f"{f:.0f}" for f in fr) + f" (median {med(fr):.0f} %)")
for ty, s in sizes.items():
    print(f"- {ty} tensor types: " + ", ".join(f"{k} x{v}" for k, v in sorted(s["tensor_types"].items())))
charm = [r for r in runs if r["engine"] == "charm" and r.get("profile")]
for ty in dict.fromkeys(r["type"] for r in charm):
    # Nested parts (attention_parts) flattened as attention_parts.qkv_ms, ...
    flat = lambda p: {f"{k}.{j}" if isinstance(v, dict) else k: w
                      for k, v in p.items() for j, w in (v.items() if isinstance(v, dict) else [(None, v)])}
    prof = [flat(r["profile"]) for r in charm if r["type"] == ty]
    keys = prof[0].keys()
    print(f"- charm {ty} time per phase (median ms, prefill + decode): "
          + ", ".join(f"{k.removesuffix('_ms')} {med(p[k] for p in prof):.0f}" for k in keys))
EOF
echo "raw runs: $RAW" >&2
