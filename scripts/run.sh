#!/usr/bin/env bash
# One command from a fresh checkout to a running engine: checks the
# prerequisites, fetches the real Qwen3 tokenizer the built-in fixture model
# uses (once), builds the release binaries, and runs the main job:
# `coordinator --local` on the built-in tiny Qwen3-MoE fixture, first a
# one-shot chat-templated answer, then (on a terminal) an interactive chat.
#
# The built-in model is a tiny *random-weight* Qwen3-MoE (2 layers, 4
# experts) with the real Qwen3 tokenizer and chat template: it exercises the
# whole engine, but its answers are not language. Point MODEL at any
# Hugging Face MoE directory (OLMoE, Qwen3-MoE, Mixtral, Qwen2-MoE) to run a
# real one.
#
# Usage: bash scripts/run.sh   [MODEL=dir] [PROMPT="..."]
set -euo pipefail
cd "$(dirname "$0")/.."

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "error: $1 not found; $2" >&2; exit 1; }
}
need cargo "install Rust from https://rustup.rs"

MODEL="${MODEL:-tests/fixtures/qwen3moe-chat}"
PROMPT="${PROMPT:-What is the capital of France?}"

if [ "$MODEL" = "tests/fixtures/qwen3moe-chat" ] && [ ! -f "$MODEL/tokenizer.json" ]; then
    need npm "install Node.js and npm (Debian: apt-get install nodejs npm)"
    need python3 "install Python 3 with pip (Debian: apt-get install python3-pip)"
    bash scripts/fetch_test_material.sh
fi

cargo build --release --bin coordinator --bin worker
BIN=target/release/coordinator

echo "== coordinator --local --model $MODEL generate --chat --prompt \"$PROMPT\""
"$BIN" --local --model "$MODEL" generate --chat --prompt "$PROMPT" --max-tokens 32

if [ -t 0 ]; then
    echo "== interactive chat (Ctrl-D to quit)"
    "$BIN" --local --model "$MODEL" chat --max-tokens 64
fi
