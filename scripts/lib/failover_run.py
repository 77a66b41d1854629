#!/usr/bin/env python3
"""Helper of scripts/bench_failover.sh (stdlib only).

  failover_run.py run --bin DIR --model DIR --key FILE --fault none|kill|stop
                      --at N --max-tokens N --stop-s S --log-dir DIR [--label L]
      Starts three workers on 127.0.0.1 (port 0, --no-mdns, --threads 1),
      then `coordinator ... generate` (no --json: it writes and flushes
      `ID ` per token for a model without a tokenizer) and timestamps every
      chunk it writes to stdout. Once N ids have been read, worker 1 of 0..2
      gets SIGKILL (kill) or SIGSTOP and, S seconds later, SIGCONT (stop);
      `none` sends nothing. Prints one JSON line: the ids, the inter-token
      gaps' median before the signal, the largest gap after it, stall added
      = that largest gap - the median, total added = (time from the signal
      to the last id) - (ids after the signal x the median), and the
      coordinator's warnings.

  failover_run.py table FILE.jsonl REFERENCE_JSON
      Medians per build x fault, and the id checks (every run's ids equal
      to its build's undisturbed runs, to the other build's, and to the
      fixture's reference greedy ids where they overlap).
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

VICTIM = 1


def start_worker(bin_dir, model, key, i, log_dir, label):
    log = open(os.path.join(log_dir, f"{label}-worker{i}.log"), "wb")
    p = subprocess.Popen(
        [
            os.path.join(bin_dir, "worker"),
            "--model", model,
            "--cluster-key-file", key,
            "--listen", "127.0.0.1:0",
            "--no-mdns",
            "--threads", "1",
            "--state-dir", os.path.join(log_dir, f"state-{label}-w{i}"),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
    )
    line = p.stdout.readline().decode(errors="replace").strip()
    if not line.startswith("listening on "):
        p.kill()
        raise SystemExit(f"worker {i} did not start: {line!r} (log: {log.name})")
    addr = line[len("listening on "):].strip()
    if not addr.startswith("127.0.0.1:"):
        p.kill()
        raise SystemExit(f"worker {i} listens on {addr}, not on 127.0.0.1")
    # Keep its stdout drained.
    threading.Thread(target=lambda: p.stdout.read(), daemon=True).start()
    return p, addr


def run(a):
    label = a.label or f"{a.fault}-{int(time.time() * 1000)}"
    workers = []
    coord = None
    cont_timer = None
    try:
        for i in range(3):
            workers.append(start_worker(a.bin, a.model, a.key, i, a.log_dir, label))
        addrs = ",".join(addr for _, addr in workers)
        clog_path = os.path.join(a.log_dir, f"{label}-coordinator.log")
        clog = open(clog_path, "wb")
        prompt = ",".join(str(x) for x in a.prompt_ids)
        cmd = [
            os.path.join(a.bin, "coordinator"),
            "--model", a.model,
            "--cluster-key-file", a.key,
            "--workers", addrs,
            "--min-workers", "3",
            "--no-mdns",
            "--threads", "1",
            "--state-dir", os.path.join(a.log_dir, f"state-{label}-c"),
        ]
        if a.worker_timeout_ms:
            cmd += ["--worker-timeout-ms", str(a.worker_timeout_ms)]
        cmd += ["generate", "--prompt-ids", prompt, "--max-tokens", str(a.max_tokens), "--ignore-eos"]
        t0 = time.monotonic()
        coord = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=clog)
        fd = coord.stdout.fileno()
        ids, stamps = [], []
        buf = b""
        t_signal = None
        at_count = None
        victim = workers[VICTIM][0]
        deadline = t0 + a.deadline_s
        while True:
            chunk = os.read(fd, 65536)
            now = time.monotonic()
            if not chunk:
                break
            buf += chunk
            *done, buf = buf.split(b" ")
            for tok in done:
                tok = tok.strip()
                if tok:
                    ids.append(int(tok))
                    stamps.append(now)
            if t_signal is None and len(ids) >= a.at and a.fault != "none":
                if a.fault == "kill":
                    victim.send_signal(signal.SIGKILL)
                else:
                    victim.send_signal(signal.SIGSTOP)
                    cont_timer = threading.Timer(a.stop_s, lambda: victim.send_signal(signal.SIGCONT))
                    cont_timer.start()
                t_signal = time.monotonic()
                at_count = len(ids)
            if t_signal is None and a.fault == "none" and len(ids) >= a.at:
                t_signal = now
                at_count = len(ids)
            if now > deadline:
                coord.kill()
                break
        if buf.strip():
            ids.append(int(buf.strip()))
            stamps.append(time.monotonic())
        rc = coord.wait()
        t_end = time.monotonic()
        clog.close()
        log = open(clog_path, errors="replace").read()
        # ANSI colours off, one line per warning.
        log = re.sub(r"\x1b\[[0-9;]*m", "", log)
        warn_lines = [l for l in log.splitlines() if " WARN " in l or " ERROR " in l or "error" in l.lower()]
        gaps = [(stamps[i + 1] - stamps[i]) * 1e3 for i in range(len(stamps) - 1)]
        out = {
            "label": label,
            "build": a.build,
            "round": a.round,
            "fault": a.fault,
            "max_tokens": a.max_tokens,
            "at": a.at,
            "stop_s": a.stop_s,
            "rc": rc,
            "n_ids": len(ids),
            "ids": ids,
            "wall_s": round(t_end - t0, 3),
            "signal_at_ids": at_count,
            "rustc_running": a.rustc,
            "loadavg": open("/proc/loadavg").read().split()[:3],
            "coordinator_warnings": len(warn_lines),
            "late_warnings": sum("is late" in l for l in warn_lines),
            "hedging_warnings": sum("hedging" in l for l in warn_lines),
            "resend_warnings": sum("re-sending" in l for l in warn_lines),
            "warnings_head": [l[-240:] for l in warn_lines[:6]],
        }
        if at_count is not None and at_count >= 12 and len(gaps) > at_count:
            # gaps[i] is the time between ids i and i+1 (0-based); skip the
            # first 10 (warm-up).
            before = gaps[10 : at_count - 1]
            after = gaps[at_count - 1 :]
            med = statistics.median(before)
            worst = max(after)
            worst_i = after.index(worst) + at_count
            out.update(
                {
                    "median_gap_ms": round(med, 3),
                    "max_gap_after_ms": round(worst, 1),
                    "max_gap_after_id": worst_i,
                    "stall_ms": round(worst - med, 1),
                    "total_added_ms": round((stamps[-1] - stamps[at_count - 1]) * 1e3 - len(after) * med, 1),
                    "gaps_over_50ms": [round(g, 1) for g in after if g > 50][:10],
                }
            )
        print(json.dumps(out), flush=True)
    finally:
        if cont_timer is not None:
            cont_timer.cancel()
        if coord is not None and coord.poll() is None:
            coord.kill()
            coord.wait()
        for p, _ in workers:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.kill()
            p.wait()


def table(path, reference):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    ref = json.load(open(reference))["greedy_ids"]
    builds = []
    for r in rows:
        if r["build"] not in builds:
            builds.append(r["build"])
    faults = ["none", "kill", "stop"]
    problems = []
    base = {}
    for b in builds:
        none = [r["ids"] for r in rows if r["build"] == b and r["fault"] == "none" and r["rc"] == 0]
        if none:
            base[b] = none[0]
    for r in rows:
        tag = f"{r['build']} {r['fault']} round {r['round']}"
        if r["rc"] != 0:
            problems.append(f"{tag}: coordinator exit status {r['rc']}")
        if r["n_ids"] != r["max_tokens"]:
            problems.append(f"{tag}: {r['n_ids']} ids, not {r['max_tokens']}")
        if r["build"] in base and r["ids"] != base[r["build"]]:
            problems.append(f"{tag}: ids differ from the undisturbed run")
        n = min(len(ref), len(r["ids"]))
        if r["ids"][:n] != ref[:n]:
            problems.append(f"{tag}: first {n} ids differ from reference.json")
    if len(base) == 2 and len(set(tuple(v) for v in base.values())) != 1:
        problems.append("the two builds' undisturbed ids differ")

    print("| build | fault | stall added, median (ms) | min–max (ms) | total added, median (ms) | median gap (ms) | hedge warnings (runs with one) | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for b in builds:
        for f in faults:
            rs = [r for r in rows if r["build"] == b and r["fault"] == f and "stall_ms" in r]
            if not rs:
                continue
            st = [r["stall_ms"] for r in rs]
            tot = [r["total_added_ms"] for r in rs]
            gap = [r["median_gap_ms"] for r in rs]
            hedged = sum(1 for r in rs if r["late_warnings"] or r["hedging_warnings"])
            name = {"none": "none (noise floor)", "kill": "SIGKILL", "stop": f"SIGSTOP, SIGCONT after {rs[0]['stop_s']:g} s"}[f]
            print(
                f"| {b} | {name} | **{statistics.median(st):.0f}** | {min(st):.0f}–{max(st):.0f} | "
                f"{statistics.median(tot):.0f} | {statistics.median(gap):.2f} | {hedged}/{len(rs)} | {len(rs)} |"
            )
    print()
    total = len(rows)
    if problems:
        print(f"id / exit checks: {len(problems)} problem(s) in {total} runs:")
        for p in problems:
            print(f"  - {p}")
    else:
        print(
            f"id checks: all {total} runs exited 0 with {rows[0]['max_tokens']} ids identical to their build's "
            f"undisturbed run, to the other build's, and (first {min(len(ref), rows[0]['max_tokens'])}) to reference.json"
        )
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--key", required=True)
    r.add_argument("--fault", choices=["none", "kill", "stop"], required=True)
    r.add_argument("--at", type=int, default=100)
    r.add_argument("--max-tokens", type=int, default=400)
    r.add_argument("--stop-s", type=float, default=3.0)
    r.add_argument("--worker-timeout-ms", type=int, default=0)
    r.add_argument("--deadline-s", type=float, default=120.0)
    r.add_argument("--prompt-ids", type=lambda s: [int(x) for x in s.split(",")], required=True)
    r.add_argument("--log-dir", required=True)
    r.add_argument("--label", default="")
    r.add_argument("--build", default="")
    r.add_argument("--round", type=int, default=0)
    r.add_argument("--rustc", type=int, default=-1)
    t = sub.add_parser("table")
    t.add_argument("jsonl")
    t.add_argument("reference")
    a = ap.parse_args()
    if a.cmd == "run":
        if a.at < 12 or a.at >= a.max_tokens:
            raise SystemExit("--at must be at least 12 and below --max-tokens")
        run(a)
    else:
        sys.exit(table(a.jsonl, a.reference))


if __name__ == "__main__":
    main()
