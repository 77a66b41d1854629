#!/usr/bin/env bash
# Makes (once) a Python virtual environment with the official `openai` and
# `anthropic` SDKs for the API tests, and prints its python's path.
#
#   target/sdk-venv/bin/python      (gitignored with target/)
#
# Needs python3 with venv and pip, and the PyPI registry. Idempotent and
# quiet: a venv that already imports both SDKs is reused as it is.
# Usage: bash scripts/sdk_venv.sh   (from any directory)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/sdk-venv
PY="$VENV/bin/python"
if [[ -x "$PY" ]] && "$PY" -c "import openai, anthropic" >/dev/null 2>&1; then
    echo "$PWD/$PY"
    exit 0
fi
command -v python3 >/dev/null 2>&1 || { echo "error: python3 not found (Debian: apt-get install python3 python3-venv)" >&2; exit 1; }
rm -rf "$VENV"
mkdir -p target
python3 -m venv "$VENV" >&2
"$PY" -m pip install --quiet --disable-pip-version-check "openai>=1.40,<3" "anthropic>=0.34,<1" >&2
"$PY" -c "import openai, anthropic" >&2
echo "$PWD/$PY"
