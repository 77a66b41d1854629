#!/usr/bin/env python3
"""Load test of a charm server: N concurrent streaming chat clients for a
bounded time. Python standard library only.

Every request must either complete (HTTP 200, a finish_reason, usage, then
`data: [DONE]`) with exactly the text that prompt gets when sent alone
(greedy decoding, so any mixing of tokens between requests shows), or be
refused with 429 and a Retry-After. Anything else is an error. The server's
own counters (/metrics) must agree with what the clients saw, so no request
is lost on either side. Exits 1 on any error.

Usage:
  python3 scripts/load_test.py --url http://127.0.0.1:8000 [--clients 16]
      [--duration 30] [--max-tokens 32] [--prompts 4] [--api-key KEY]
      [--no-retry-wait] [--json]
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

PATH = "/v1/chat/completions"


def headers(key):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    return h


def prompt_text(i):
    return f"Load test prompt number {i}: tell me about flock number {i * 7 + 3}."


def stream_chat(url, key, model, text, max_tokens, timeout):
    """One streamed chat. Returns a dict with outcome 'ok', 'rejected' or 'error'."""
    u = urllib.parse.urlparse(url)
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", PATH, json.dumps(body), headers(key))
        resp = conn.getresponse()
        if resp.status == 429:
            retry = resp.getheader("Retry-After")
            resp.read()
            if retry is None:
                return {"outcome": "error", "why": "429 without Retry-After"}
            return {"outcome": "rejected", "retry_after": float(retry)}
        if resp.status != 200:
            return {"outcome": "error", "why": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        pieces, finish, usage, done, first = [], None, None, False, None
        for raw in resp:
            line = raw.decode("utf-8").rstrip("\n")
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                continue
            if done:
                return {"outcome": "error", "why": "data after [DONE]"}
            chunk = json.loads(data)
            if "error" in chunk:
                return {"outcome": "error", "why": f"stream error {chunk['error']}"}
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                piece = c["delta"].get("content")
                if piece:
                    if first is None:
                        first = time.monotonic()
                    pieces.append(piece)
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
        end = time.monotonic()
        if not done or finish is None or usage is None:
            return {"outcome": "error", "why": f"incomplete stream (done={done}, finish={finish}, usage={usage})"}
        return {
            "outcome": "ok",
            "text": "".join(pieces),
            "tokens": usage["completion_tokens"],
            "ttft": (first or end) - t0,
            "latency": end - t0,
        }
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        return {"outcome": "error", "why": f"{type(e).__name__}: {e}"}
    finally:
        conn.close()


def scrape(url, key):
    """The chat route's answers by status code, from /metrics."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/metrics", headers=headers(key))
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"error: GET /metrics answered {resp.status}")
    out = {}
    prefix = 'charm_http_requests_total{route="' + PATH + '",code="'
    for line in text.splitlines():
        if line.startswith(prefix):
            code = line[len(prefix) : line.index('"', len(prefix))]
            out[code] = int(float(line.rsplit(" ", 1)[1]))
    return out


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds to keep starting requests")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=4, help="distinct prompts (each checked against its solo answer)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take")
    ap.add_argument("--no-retry-wait", action="store_true", help="retry at once after a 429 instead of waiting Retry-After")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = ap.parse_args()

    # Each prompt's answer alone, one at a time.
    solo = []
    for i in range(a.prompts):
        r = stream_chat(a.url, a.api_key, a.model, prompt_text(i), a.max_tokens, a.timeout)
        if r["outcome"] != "ok":
            raise SystemExit(f"error: solo request {i}: {r}")
        solo.append(r["text"])

    before = scrape(a.url, a.api_key)
    results, lock = [], threading.Lock()
    deadline = time.monotonic() + a.duration

    def client(n):
        k = n
        while time.monotonic() < deadline:
            p = k % a.prompts
            k += 1
            r = stream_chat(a.url, a.api_key, a.model, prompt_text(p), a.max_tokens, a.timeout)
            r["prompt"] = p
            if r["outcome"] == "ok" and r["text"] != solo[p]:
                r = {"outcome": "error", "why": f"mixed: prompt {p} got {r['text']!r}, alone {solo[p]!r}", "prompt": p}
            with lock:
                results.append(r)
            if r["outcome"] == "rejected" and not a.no_retry_wait:
                time.sleep(min(r["retry_after"], max(0.0, deadline - time.monotonic())))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    after = scrape(a.url, a.api_key)

    ok = [r for r in results if r["outcome"] == "ok"]
    rejected = [r for r in results if r["outcome"] == "rejected"]
    errors = [r for r in results if r["outcome"] == "error"]
    server_ok = after.get("200", 0) - before.get("200", 0)
    server_429 = after.get("429", 0) - before.get("429", 0)
    lost = []
    if server_ok != len(ok):
        lost.append(f"server answered 200 {server_ok} times, clients completed {len(ok)}")
    if server_429 != len(rejected):
        lost.append(f"server answered 429 {server_429} times, clients saw {len(rejected)}")
    tokens = sum(r["tokens"] for r in ok)
    summary = {
        "clients": a.clients,
        "duration_s": round(wall, 2),
        "max_tokens": a.max_tokens,
        "requests": len(results),
        "completed": len(ok),
        "rejected_429": len(rejected),
        "errors": len(errors),
        "requests_per_s": round(len(ok) / wall, 2),
        "completion_tokens_per_s": round(tokens / wall, 1),
        "ttft_ms_p50": round(1e3 * pct([r["ttft"] for r in ok], 50), 1),
        "ttft_ms_p95": round(1e3 * pct([r["ttft"] for r in ok], 95), 1),
        "latency_ms_p50": round(1e3 * pct([r["latency"] for r in ok], 50), 1),
        "latency_ms_p95": round(1e3 * pct([r["latency"] for r in ok], 95), 1),
        "latency_ms_max": round(1e3 * max([r["latency"] for r in ok], default=float("nan")), 1),
        "mean_tokens": round(statistics.mean([r["tokens"] for r in ok]), 1) if ok else 0,
        "lost": lost,
    }
    if a.json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            print(f"{k:>24}: {v}")
    for r in errors[:10]:
        print(f"error: {r['why']}", file=sys.stderr)
    if errors or lost or not ok:
        print(f"FAIL: {len(errors)} errors, lost: {lost}, completed {len(ok)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
