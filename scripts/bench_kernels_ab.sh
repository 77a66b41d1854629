#!/usr/bin/env bash
# A kernel change measured against another commit inside one process:
# `charm-common` from both commits, each built into a small shared library
# (scripts/lib/kernel_ab_shim.rs), loaded side by side by one Python
# process pinned to one core, which alternates the two builds' products of
# the same random GGML rows (and their packed copy) with the same
# activation rows, pair after pair, and checks that both give the same
# bits. Prints per type and N each build's median G multiply-adds/s and the
# median of the per-pair ratios (HEAD / BASE) with its quartiles. Runs of
# separate processes on these VMs move by up to a third minutes apart;
# pairs a few milliseconds apart do not.
#
#   bash scripts/bench_kernels_ab.sh [BASE [HEAD]]     # defaults: HEAD~1, HEAD
#
# Environment (defaults): TYPES (Q6_K), NS ("1 4 64 512": activation rows
# per product; 1 is decode's matrix-vector path), ROWS (4096), COLS (2048),
# PAIRS (41), CORE (0), AB_DIR (/work/charm-ab: worktrees, builds).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/lib/wait_idle.sh"
BASE="${1:-HEAD~1}"
HEAD="${2:-HEAD}"
TYPES="${TYPES:-Q6_K}"
NS="${NS:-1 4 64 512}"
ROWS="${ROWS:-4096}"
COLS="${COLS:-2048}"
PAIRS="${PAIRS:-41}"
CORE="${CORE:-0}"
AB_DIR="${AB_DIR:-/work/charm-ab}"
mkdir -p "$AB_DIR"

build() { # label commit
  local tree="$AB_DIR/$1" shim="$AB_DIR/$1-shim" sha
  sha="$(git -C "$ROOT" rev-parse "$2")"
  if [ ! -d "$tree" ]; then
    git -C "$ROOT" worktree add -q --detach "$tree" "$sha"
  else
    git -C "$tree" checkout -q --detach "$sha"
  fi
  mkdir -p "$shim/src"
  cat >"$shim/Cargo.toml" <<TOML
[package]
name = "kernel-ab-$1"
version = "0.0.0"
edition = "2021"
publish = false

[lib]
crate-type = ["cdylib"]
path = "$ROOT/scripts/lib/kernel_ab_shim.rs"

[dependencies]
charm-common = { path = "$tree/common" }

[profile.release]
debug = "line-tables-only"

[workspace]
TOML
  # The commit's own dependency versions.
  cp "$tree/Cargo.lock" "$shim/Cargo.lock"
  echo "== building $1: $(git -C "$tree" log -1 --format='%h %s' | cut -c1-70)" >&2
  (cd "$shim" && CARGO_TARGET_DIR="$AB_DIR/target" cargo build --release -q)
  cp "$AB_DIR/target/release/libkernel_ab_$1.so" "$AB_DIR/$1.so"
}
build base "$BASE"
build head "$HEAD"
lscpu | grep -E "Model name" >&2
grep -qw avx512_vnni /proc/cpuinfo && echo "ISA: AVX-512 VNNI" >&2 || echo "ISA: AVX2 (no AVX-512 VNNI)" >&2

wait_idle
RAYON_NUM_THREADS=1 taskset -c "$CORE" python3 - "$AB_DIR" "$TYPES" "$NS" "$ROWS" "$COLS" "$PAIRS" <<'EOF'
import ctypes, statistics, sys

ab, types, ns, rows, cols, pairs = sys.argv[1:]
rows, cols, pairs = int(rows), int(cols), int(pairs)
libs = {}
for label in ("base", "head"):
    lib = ctypes.CDLL(f"{ab}/{label}.so")
    lib.ab_new.restype = ctypes.c_void_p
    lib.ab_new.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t]
    lib.ab_run.restype = ctypes.c_double
    lib.ab_run.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]
    lib.ab_free.argtypes = [ctypes.c_void_p]
    libs[label] = lib


def quartiles(v):
    q = statistics.quantiles(v, n=4)
    return q[0], statistics.median(v), q[2]


print(f"rows {rows} cols {cols}, one thread, {pairs} alternating pairs in one process; G multiply-adds/s")
print("| type | N | base | head | head / base (p25–p75) |")
print("|---|---|---|---|---|")
for ty in types.split(","):
    for n in map(int, ns.split()):
        cases = {k: lib.ab_new(ty.strip().encode(), rows, cols, n) for k, lib in libs.items()}
        if not all(cases.values()):
            sys.exit(f"{ty}: not a GGML type with {cols}-element rows")
        reps = max(1, min(50, 200_000_000 // (rows * cols * n)))
        times = {"base": [], "head": []}
        bits = set()
        for p in range(pairs + 1):
            for k in (["base", "head"] if p % 2 == 0 else ["head", "base"]):
                h = ctypes.c_uint64()
                t = libs[k].ab_run(cases[k], reps, ctypes.byref(h))
                bits.add(h.value)
                if p > 0:  # the first pair warms both
                    times[k].append(t)
        if len(bits) != 1:
            sys.exit(f"{ty} N={n}: the two builds' products differ in their bits")
        g = lambda s: rows * cols * n / s / 1e9
        lo, mid, hi = quartiles([b / h for b, h in zip(times["base"], times["head"])])
        print(f"| {ty} | {n} | {g(statistics.median(times['base'])):.1f} | "
              f"{g(statistics.median(times['head'])):.1f} | **{mid:.3f} ×** ({lo:.3f}–{hi:.3f}) |")
        for k, lib in libs.items():
            lib.ab_free(cases[k])
EOF
