#!/usr/bin/env bash
# Serving: charm's `coordinator serve` against llama.cpp's `llama-server` on
# the very same GGUF, on this machine, alternating.
#
#   bash scripts/bench_serve.sh          # results: docs/benchmarks.md
#
# 1. Builds `coordinator` (release).
# 2. Once, outside the repository: llama.cpp's `llama-server` and
#    `llama-quantize`, built with cmake (PyPI's, into $LLAMA_SRC/cmake-venv,
#    where the machine has none) from the llama.cpp vendored in the
#    PyPI sdist of llama-cpp-python $LLAMA_VERSION (GGML_NATIVE=ON, AMX off
#    as in bench_vs_llamacpp.sh), into $LLAMA_BUILD.
# 3. Once: the bench model $BENCH/olmoe-w (scripts/make_bench_model.py, 4
#    layers of OLMoE-1B-7B widths, random weights, the OLMo tokenizer),
#    converted by llama.cpp's converter to BF16 and quantized to $TYPE by
#    llama-quantize.
# 4. $RUNS rounds; in each, charm then llama-server (each started fresh,
#    $THREADS threads, an f16 KV cache, 4 slots / --max-batch 4), each
#    measured by scripts/bench_serve.py: one client, then $CLIENTS at once
#    ($GEN tokens each, ignore_eos), then a $LONG-token prompt cold, again,
#    and extended by 20 tokens.
# 5. Prints the medians per engine and the median per-round ratios.
#    Raw JSON lines go to $BENCH/serve-<time>/runs.jsonl.
#
# Environment (defaults): CHARM_BENCH_DIR (/work/charm-bench), RUNS (5),
# CLIENTS (4), GEN (64), LONG (400), THREADS (2), TYPE (q4_0),
# LLAMA_SRC (/work/llama-src), LLAMA_BUILD (/work/llama-build),
# PY (/work/venv/bin/python: numpy, torch, transformers, safetensors, for
# make_bench_model.py and llama.cpp's converter).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/wait_idle.sh
source "$ROOT/scripts/lib/wait_idle.sh"
BENCH="${CHARM_BENCH_DIR:-/work/charm-bench}"
RUNS="${RUNS:-5}"
CLIENTS="${CLIENTS:-4}"
GEN="${GEN:-64}"
LONG="${LONG:-400}"
THREADS="${THREADS:-2}"
TYPE="${TYPE:-q4_0}"
LLAMA_VERSION=0.3.36
LLAMA_SRC="${LLAMA_SRC:-/work/llama-src}"
LLAMA_BUILD="${LLAMA_BUILD:-/work/llama-build}"
PY="${PY:-/work/venv/bin/python}"
mkdir -p "$BENCH"

echo "== building charm (release)" >&2
(cd "$ROOT" && cargo build --release -q -p charm-coordinator)
TARGET="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
CHARM="$TARGET/release/coordinator"

LLAMA_CPP="$LLAMA_SRC/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
if [ ! -f "$LLAMA_CPP/CMakeLists.txt" ]; then
  mkdir -p "$LLAMA_SRC"
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$LLAMA_SRC"
  tar xzf "$LLAMA_SRC/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$LLAMA_SRC"
fi
if [ ! -x "$LLAMA_BUILD/bin/llama-server" ] || [ ! -x "$LLAMA_BUILD/bin/llama-quantize" ]; then
  echo "== building llama-server (about 10 minutes on 2 cores)" >&2
  if ! command -v cmake >/dev/null 2>&1; then
    # Some machine kinds have no cmake; PyPI's `cmake` package carries one.
    [ -x "$LLAMA_SRC/cmake-venv/bin/cmake" ] || {
      python3 -m venv "$LLAMA_SRC/cmake-venv"
      "$LLAMA_SRC/cmake-venv/bin/pip" install -q cmake
    }
    export PATH="$LLAMA_SRC/cmake-venv/bin:$PATH"
  fi
  AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S "$LLAMA_CPP" -B "$LLAMA_BUILD" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$AMX" -DCMAKE_CXX_FLAGS="$AMX" >/dev/null
  cmake --build "$LLAMA_BUILD" --target llama-server llama-quantize -j"$(nproc)" >/dev/null
fi
LLAMA_SERVER="$LLAMA_BUILD/bin/llama-server"

MODEL="$BENCH/olmoe-w"
[ -f "$MODEL/config.json" ] || "$PY" "$ROOT/scripts/make_bench_model.py" "$MODEL" --family olmoe --layers 4
TOKDIR="$BENCH/olmoe-w-tok"
if [ ! -f "$TOKDIR/tokenizer.json" ]; then
  bash "$ROOT/scripts/fetch_test_material.sh" >/dev/null
  mkdir -p "$TOKDIR"
  for f in "$MODEL"/*; do ln -sf "$f" "$TOKDIR/"; done
  cp "$ROOT/tests/material/olmo/tokenizer.json" "$TOKDIR/"
fi
BF16="$BENCH/olmoe-w.bf16.gguf"
if [ ! -f "$BF16" ]; then
  (cd "$LLAMA_CPP" && PYTHONPATH=gguf-py:. "$PY" convert_hf_to_gguf.py "$TOKDIR" --outtype bf16 \
    --outfile "$BF16.partial" >"$BENCH/convert-olmoe-w-bf16.log" 2>&1) && mv "$BF16.partial" "$BF16"
fi
GGUF="$BENCH/olmoe-w.$TYPE.gguf"
if [ ! -f "$GGUF" ]; then
  "$LLAMA_BUILD/bin/llama-quantize" "$BF16" "$GGUF.partial" "$(echo "$TYPE" | tr a-z A-Z)" "$THREADS" \
    >"$BENCH/quantize-olmoe-w-$TYPE.log" 2>&1
  mv "$GGUF.partial" "$GGUF"
fi

OUT="$BENCH/serve-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
RAW="$OUT/runs.jsonl"
lscpu | grep -E "Model name|^CPU\(s\)" >"$OUT/machine.txt" || true
cat "$OUT/machine.txt" >&2
# The binary measured, and the commit it was built from: a build in the
# repository while this runs (a test run rebuilds the binaries) must not
# swap it mid-run.
(cd "$ROOT" && git rev-parse --short HEAD && git status --short) >"$OUT/commit.txt" 2>/dev/null || true
cp "$CHARM" "$OUT/coordinator"
CHARM="$OUT/coordinator"

PORT=18431
PID=""
stop() {
  if [ -n "$PID" ]; then
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  PID=""
}
trap stop EXIT
wait_up() { # url log
  for _ in $(seq 1 600); do
    if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
    kill -0 "$PID" 2>/dev/null || { cat "$2" >&2; echo "the server exited" >&2; exit 1; }
    sleep 0.1
  done
  echo "the server did not come up" >&2; exit 1
}
measure() { # engine round
  local url="http://127.0.0.1:$PORT"
  # No server is timed beside a build.
  wait_idle
  case "$1" in
    charm)
      "$CHARM" --local --model "$GGUF" --threads "$THREADS" --kv-cache f16 \
        serve --port "$PORT" --max-batch "$CLIENTS" >"$OUT/charm.log" 2>&1 &
      ;;
    llama)
      "$LLAMA_SERVER" -m "$GGUF" -t "$THREADS" -tb "$THREADS" -np "$CLIENTS" -c $((CLIENTS * 2048)) \
        --host 127.0.0.1 --port "$PORT" >"$OUT/llama.log" 2>&1 &
      ;;
  esac
  PID=$!
  wait_up "$url" "$OUT/$1.log"
  local r
  r="$(python3 "$ROOT/scripts/bench_serve.py" --url "$url" --clients "$CLIENTS" --gen "$GEN" --long "$LONG" --seed "$2")"
  stop
  echo "{\"engine\":\"$1\",\"round\":$2,\"result\":$r}" >>"$RAW"
  echo "$1 round $2: $r" >&2
}
for round in $(seq 1 "$RUNS"); do
  measure charm "$round"
  measure llama "$round"
done

python3 - "$RAW" "$CLIENTS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
clients = sys.argv[2]
keys = [("single tok/s", lambda r: r["single"]["tok_s"]),
        (f"{clients} clients aggregate tok/s", lambda r: r["concurrent"]["aggregate_tok_s"]),
        ("aggregate / own single", lambda r: r["concurrent"]["aggregate_tok_s"] / r["single"]["tok_s"]),
        ("TTFT p50 ms", lambda r: r["concurrent"]["ttft_p50_ms"]),
        ("TTFT worst ms", lambda r: r["concurrent"]["ttft_worst_ms"]),
        ("long prompt cold TTFT ms", lambda r: r["long"]["cold_ttft_ms"]),
        ("sent again TTFT ms", lambda r: r["long"]["repeated_ttft_ms"]),
        ("extended by 20 TTFT ms", lambda r: r["long"]["extended_ttft_ms"]),
        ("again / cold", lambda r: r["long"]["repeated_ttft_ms"] / r["long"]["cold_ttft_ms"]),
        ("extended / cold", lambda r: r["long"]["extended_ttft_ms"] / r["long"]["cold_ttft_ms"])]
by = {e: {r["round"]: r["result"] for r in rows if r["engine"] == e} for e in ("charm", "llama")}
rounds = sorted(set(by["charm"]) & set(by["llama"]))
print(f"| | charm | llama-server | charm / llama-server |")
print("|---|---|---|---|")
for name, f in keys:
    c = statistics.median(f(by["charm"][i]) for i in rounds)
    l = statistics.median(f(by["llama"][i]) for i in rounds)
    ratio = statistics.median(f(by["charm"][i]) / f(by["llama"][i]) for i in rounds)
    print(f"| {name} | {c:.3g} | {l:.3g} | {ratio:.2f}x |")
print(f"\n({len(rounds)} rounds, medians; ratios are medians of per-round ratios)")
EOF
