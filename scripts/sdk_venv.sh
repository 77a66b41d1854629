#!/usr/bin/env bash
# Makes (once) a Python virtual environment with the official `openai` and
# `anthropic` SDKs, the OpenAI Agents SDK and `jsonschema` for the API
# tests, at pinned versions, and prints its python's path.
#
#   target/sdk-venv/bin/python      (gitignored with target/)
#
# Needs python3 with venv and pip, and the PyPI registry. Idempotent and
# quiet: a venv that already has the pinned versions is reused as it is.
# Usage: bash scripts/sdk_venv.sh   (from any directory)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/sdk-venv
PY="$VENV/bin/python"
PINS=(openai==3.63.0 anthropic==2.17.0 openai-agents==0.24.0 jsonschema==4.26.0)
CHECK='import importlib.metadata as m, sys
want = dict(p.split("==") for p in sys.argv[1:])
sys.exit(any(m.version(k) != v for k, v in want.items()))'
if [[ -x "$PY" ]] && "$PY" -c "$CHECK" "${PINS[@]}" >/dev/null 2>&1; then
    echo "$PWD/$PY"
    exit 0
fi
command -v python3 >/dev/null 2>&1 || { echo "error: python3 not found (Debian: apt-get install python3 python3-venv)" >&2; exit 1; }
rm -rf "$VENV"
mkdir -p target
python3 -m venv "$VENV" >&2
"$PY" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" >&2
"$PY" -c "$CHECK" "${PINS[@]}" >&2
"$PY" -c "import openai, anthropic, agents, jsonschema" >&2
echo "$PWD/$PY"
