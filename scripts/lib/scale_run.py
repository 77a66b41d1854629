#!/usr/bin/env python3
"""Helper of scripts/bench_scale.sh (stdlib only; needs root for the memory
cgroup and for dropping the page cache).

  scale_run.py run --label L --round R --out FILE.jsonl [--limit-gb G] [--cold]
                   [--timeout S] [--watch-pid PID ...] -- CMD ...
      Runs CMD once and appends one JSON line to FILE.jsonl: the label and
      round, the exit status, wall seconds, whether the memory limit killed
      it or the timeout stopped it, the memory group's peak usage, the
      resident memory (VmRSS / VmHWM) of every --watch-pid after the run
      (workers), and the last line CMD printed on stdout parsed as JSON
      (`coordinator generate --json`, `bench_llamacpp.py`). With
      --repeat-labels cold,warm, CMD's JSON lines (`generate --repeat 2`)
      become one record each, labelled L-cold and L-warm.
      --cold: sync and drop the page cache first. --limit-gb: CMD runs in a
      fresh memory cgroup limited to G GiB (cgroup v1 `memory.limit_in_bytes`
      where /sys/fs/cgroup/memory exists, else v2 `memory.max`), removed
      afterwards; its page cache counts against the limit, as it does for
      any process in such a group.

  scale_run.py diskrate PATH [--gib G] [--block-bytes B] [--depth N]
      The O_DIRECT read rate of PATH (a container's experts.bin): G GiB of
      B-byte reads at random B-aligned offsets, N reads in flight (threads),
      the page cache bypassed. Prints one JSON line with bytes per second.

  scale_run.py table FILE.jsonl --disk-rate B_PER_S [--gb-per-s-1gbe 0.125]
      Medians per configuration over the rounds, per-round ratios, the disk
      bound, wire bytes per token and the id checks, as a markdown table.
"""

import argparse
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


class Group:
    """A fresh memory cgroup with a limit, removed on close."""

    def __init__(self, limit_bytes: int):
        name = f"charm-scale-{os.getpid()}-{time.monotonic_ns()}"
        if (V1 / "memory.limit_in_bytes").exists():
            self.v1 = True
            self.dir = V1 / name
            self.dir.mkdir()
            (self.dir / "memory.limit_in_bytes").write_text(str(limit_bytes))
        else:
            self.v1 = False
            ctl = V2 / "cgroup.subtree_control"
            if "memory" not in ctl.read_text():
                ctl.write_text("+memory")
            self.dir = V2 / name
            self.dir.mkdir()
            (self.dir / "memory.max").write_text(str(limit_bytes))

    def enter(self):
        """Moves the calling process into the group (a child's preexec)."""
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self):
        f = self.dir / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak")
        try:
            return int(f.read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self):
        f = self.dir / ("memory.oom_control" if self.v1 else "memory.events")
        try:
            for line in f.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (OSError, ValueError):
            pass
        return None

    def close(self):
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def rss(pid: int):
    """VmRSS and VmHWM of `pid`, in bytes (None when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) * 1024
    return out


def cmd_run(a):
    if a.cold:
        drop_caches()
    group = Group(int(a.limit_gb * 2**30)) if a.limit_gb else None
    start = time.monotonic()
    timed_out = False
    try:
        p = subprocess.Popen(
            a.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=group.enter if group else None,
        )
        try:
            out, err = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            p.kill()
            out, err = p.communicate()
        wall = time.monotonic() - start
        oom = group.oom_kills() if group else None
        peak = group.peak() if group else None
    finally:
        if group:
            group.close()
    results = []
    for line in out.splitlines():
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    # `generate --repeat N`: one record per run, labelled LABEL-SUFFIX.
    suffixes = a.repeat_labels.split(",") if a.repeat_labels else [None]
    if len(results) > len(suffixes):
        results = results[-len(suffixes):]
    for i, suffix in enumerate(suffixes):
        result = results[i] if i < len(results) else None
        label = f"{a.label}-{suffix}" if suffix else a.label
        record(a, label, p, wall, oom, group, timed_out, peak, result, err)
    return 0


def record(a, label, p, wall, oom, group, timed_out, peak, result, err):
    rec = {
        "label": label,
        "round": a.round,
        "rc": p.returncode,
        "wall_s": wall,
        "limit_bytes": int(a.limit_gb * 2**30) if a.limit_gb else None,
        "cold": a.cold,
        "killed_by_limit": bool(oom) or (group is not None and p.returncode == -9 and not timed_out),
        "timed_out": timed_out,
        "cgroup_peak_bytes": peak,
        "workers": [rss(pid) for pid in a.watch_pid],
        "result": result,
        "stderr_tail": err[-2000:],
    }
    with open(a.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    r = result or {}
    s = r.get("stats", r)
    state = "killed by the limit" if rec["killed_by_limit"] else "timed out" if timed_out else f"rc {p.returncode}"
    print(
        f"  {label:<24} round {a.round}: {state}, {wall:6.1f} s, "
        f"prefill {s.get('prefill_tok_s') or 0:6.2f} tok/s, decode {s.get('decode_tok_s') or 0:6.2f} tok/s",
        file=sys.stderr,
    )


def cmd_diskrate(a):
    size = os.path.getsize(a.path)
    block = (a.block_bytes + 4095) // 4096 * 4096
    reads = max(1, int(a.gib * 2**30) // block)
    rng = random.Random(0)
    offsets = [rng.randrange(0, max(1, (size - block) // block)) * block for _ in range(reads)]
    fd = os.open(a.path, os.O_RDONLY | os.O_DIRECT)
    lock = threading.Lock()
    done = [0]

    def worker():
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
        while True:
            with lock:
                if not offsets:
                    return
                off = offsets.pop()
            n = os.preadv(fd, [buf], off)
            with lock:
                done[0] += n

    start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(a.depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.monotonic() - start
    os.close(fd)
    print(json.dumps({"bytes": done[0], "seconds": secs, "bytes_per_s": done[0] / secs, "block": block, "depth": a.depth}))
    return 0


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec="{:.2f}", none="—"):
    return none if x is None else spec.format(x)


def run_seconds(s):
    """Seconds of prefill and decode of a generate: TTFT plus the decode steps."""
    if not s.get("decode_tok_s"):
        return None
    return s["ttft_ms"] / 1e3 + (s["generated_tokens"] - 1) / s["decode_tok_s"]


def cmd_table(a):
    recs = [json.loads(l) for l in open(a.file) if l.strip()]
    labels = []
    for r in recs:
        if r["label"] not in labels and not r["label"].startswith("warmup"):
            labels.append(r["label"])
    by = {l: [r for r in recs if r["label"] == l] for l in labels}
    ok = lambda r: r["rc"] == 0 and r["result"] is not None  # noqa: E731

    print(
        "| configuration | runs | prefill tok/s | decode tok/s | TTFT s | load s | expert GB read | hit rate "
        "| prefetch accuracy | disk bound share: prefill / decode / whole | peak RSS GiB | group peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for l in labels:
        rs = by[l]
        good = [r for r in rs if ok(r)]
        if not good:
            why = "killed by the memory limit" if any(r["killed_by_limit"] for r in rs) else (
                "timed out" if any(r["timed_out"] for r in rs) else f"failed (rc {rs[0]['rc']})"
            )
            wall = med([r["wall_s"] for r in rs])
            print(f"| {l} | {len(rs)} | {why} after {wall:.0f} s | | | | | | | | | {fmt(med([r['cgroup_peak_bytes'] and r['cgroup_peak_bytes'] / 2**30 for r in rs]))} |")
            continue
        st = [r["result"].get("stats", r["result"]) for r in good]
        hit = med(
            [
                s["expert_hits"] / (s["expert_hits"] + s["expert_misses"])
                if "expert_hits" in s and (s.get("cache_bytes") or s.get("expert_bytes_read"))
                else None
                for s in st
            ]
        )
        acc = med([s["prefetch_accuracy"] if s.get("predicted_total") else None for s in st])
        gb = med([s.get("expert_bytes_read") and s["expert_bytes_read"] / 1e9 for s in st])
        pre_gb = med([s.get("prefill_expert_bytes_read") and s["prefill_expert_bytes_read"] / 1e9 for s in st])
        ttft = med([s.get("ttft_ms") and s["ttft_ms"] / 1e3 for s in st])
        if ttft is None:
            ttft = med([s["prompt_tokens"] / s["prefill_tok_s"] for s in st if s.get("prefill_tok_s")])

        def share(s, part):
            """Time the disk needs for the part's reads over the time the part took."""
            total, pre = s.get("expert_bytes_read"), s.get("prefill_expert_bytes_read")
            if not total or (pre is None and part != "whole") or not s.get("decode_tok_s"):
                return None
            dec_s = (s["generated_tokens"] - 1) / s["decode_tok_s"]
            bytes_, secs = {
                "prefill": (pre or 0, s["ttft_ms"] / 1e3),
                "decode": (total - (pre or 0), dec_s),
                "whole": (total, s["ttft_ms"] / 1e3 + dec_s),
            }[part]
            return bytes_ / a.disk_rate / secs if secs > 0 else None

        shares = " / ".join(fmt(med([share(s, p) for s in st]), "{:.0%}") for p in ("prefill", "decode", "whole"))
        print(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                l,
                len(good) if len(good) == len(rs) else f"{len(good)} of {len(rs)}",
                fmt(med([s.get("prefill_tok_s") for s in st])),
                fmt(med([s.get("decode_tok_s") for s in st])),
                fmt(ttft),
                fmt(med([r["result"].get("load_s") for r in good]), "{:.1f}"),
                "—" if hit is None else fmt(gb) if pre_gb is None else f"{fmt(gb)} ({fmt(pre_gb)} in prefill)",
                fmt(hit, "{:.1%}"),
                fmt(acc, "{:.1%}"),
                "—" if shares == "— / — / —" else shares,
                fmt(med([r["result"].get("peak_rss_bytes") and r["result"]["peak_rss_bytes"] / 2**30 for r in good])),
                fmt(med([r["cgroup_peak_bytes"] and r["cgroup_peak_bytes"] / 2**30 for r in good])),
            )
        )

    # Workers' memory and the wire, where workers ran.
    for l in labels:
        good = [r for r in by[l] if ok(r) and r["workers"]]
        if not good:
            continue
        hwm = [max(w["VmHWM"] for w in r["workers"] if w) / 2**30 for r in good if any(r["workers"])]
        st = [r["result"]["stats"] for r in good]
        rows = [s["prompt_tokens"] + s["generated_tokens"] for s in st]
        wire = med([(s["network_bytes_sent"] + s["network_bytes_received"]) / n for s, n in zip(st, rows)])
        print(
            f"\n{l}: largest worker peak RSS {fmt(med(hwm))} GiB; frame bytes over the wire "
            f"{fmt(wire and wire / 1e3, '{:.1f}')} kB per token row (both ways), "
            f"{fmt(wire and wire / (a.gb_per_s_1gbe * 1e9) * 1e3, '{:.2f}')} ms per token at 1 GbE"
        )

    # Per-round ratios of decode (and prefill) between configurations run in the same round.
    def ratio(num, den, key):
        vals = []
        for r in sorted({x["round"] for x in recs}):
            n = [x for x in by.get(num, []) if x["round"] == r and ok(x)]
            d = [x for x in by.get(den, []) if x["round"] == r and ok(x)]
            if n and d:
                nv = n[0]["result"].get("stats", n[0]["result"]).get(key)
                dv = d[0]["result"].get("stats", d[0]["result"]).get(key)
                if nv and dv:
                    vals.append(nv / dv)
        return vals

    print()
    for num, den in a.ratio:
        for key in ("decode_tok_s", "prefill_tok_s"):
            vals = ratio(num, den, key)
            if vals:
                print(f"- {num} / {den}, {key}: median {med(vals):.2f} × (rounds: {', '.join(f'{v:.2f}' for v in vals)})")

    # The one rule at real size: every charm configuration's greedy ids alike.
    charm = [
        (r["label"], r["round"], r["result"]["ids"])
        for r in recs
        if ok(r) and "stats" in r["result"] and not r["label"].startswith("warmup")
    ]
    if charm:
        ref = charm[0][2]
        differ = [(l, n) for l, n, ids in charm if ids != ref]
        print(
            f"- ids: {len(charm) - len(differ)} of {len(charm)} charm runs gave the first run's {len(ref)} ids"
            + (f"; differing: {differ}" if differ else "")
        )
        for r in recs:
            if ok(r) and "stats" not in r["result"]:
                ids = r["result"]["ids"]
                same = next((i for i, (x, y) in enumerate(zip(ids, ref)) if x != y), min(len(ids), len(ref)))
                print(f"- {r['label']} round {r['round']}: first {same} ids as charm's")
                break
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="sub", required=True)
    r = sub.add_parser("run")
    r.add_argument("--label", required=True)
    r.add_argument("--round", type=int, default=0)
    r.add_argument("--out", required=True)
    r.add_argument("--limit-gb", type=float, default=0)
    r.add_argument("--cold", action="store_true")
    r.add_argument("--timeout", type=float, default=None)
    r.add_argument("--watch-pid", type=int, action="append", default=[])
    r.add_argument("--repeat-labels", help="CMD prints one JSON line per run (generate --repeat): their label suffixes")
    r.add_argument("command", nargs=argparse.REMAINDER)
    d = sub.add_parser("diskrate")
    d.add_argument("path")
    d.add_argument("--gib", type=float, default=2.0)
    d.add_argument("--block-bytes", type=int, default=4 << 20)
    d.add_argument("--depth", type=int, default=4)
    t = sub.add_parser("table")
    t.add_argument("file")
    t.add_argument("--disk-rate", type=float, required=True, help="O_DIRECT bytes per second")
    t.add_argument("--gb-per-s-1gbe", type=float, default=0.125)
    t.add_argument("--ratio", nargs=2, action="append", default=[], metavar=("NUM", "DEN"))
    a = ap.parse_args()
    if a.sub == "run":
        if a.command[:1] == ["--"]:
            a.command = a.command[1:]
        if not a.command:
            ap.error("run needs a command after --")
        return cmd_run(a)
    if a.sub == "diskrate":
        return cmd_diskrate(a)
    return cmd_table(a)


if __name__ == "__main__":
    sys.exit(main())
