#!/usr/bin/env python3
"""Serving benchmark client: drives one OpenAI-compatible server (charm's
`coordinator serve` or llama.cpp's `llama-server`) through
`POST /v1/completions` with token-id prompts, streaming, and prints one JSON
object. Python standard library only.

    python3 scripts/bench_serve.py --url http://127.0.0.1:PORT [--clients 4]
        [--gen 64] [--prompt 32] [--long 400] [--extend 20] [--seed 0]

Measures, in this order:
- `single`: one client, `--gen` tokens after a `--prompt`-token prompt:
  decode tok/s (tokens after the first over the time after the first) and
  end-to-end tok/s.
- `concurrent`: `--clients` clients at once, each its own prompt, `--gen`
  tokens each: aggregate tok/s (every generated token over the wall time
  from the first request sent to the last token received), TTFT of each
  client (p50, p99, worst).
- `long`: a fresh `--long`-token prompt (cold TTFT), the same prompt again
  (repeated TTFT), then it extended by `--extend` tokens (extended TTFT);
  TTFT is the time to the first streamed token, one token generated.

Every request sets `ignore_eos` so each generates exactly its tokens (both
servers accept it). Prompt ids are drawn from `random.Random(seed)` below
50000, so both servers get the same prompts.
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def stream_completion(url, ids, gen):
    """Streams one completion; returns (ttft_s, last_token_s, tokens), the
    times from sending the request. `tokens` is the final usage's count."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": ids, "max_tokens": gen, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"HTTP {resp.status}: {resp.read()[:400]!r}")
    first = last = None
    tokens = None
    buf = b""
    done = False
    while not done:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            frame, buf = buf.split(b"\n\n", 1)
            for line in frame.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    done = True
                    break
                v = json.loads(data)
                if v.get("choices"):
                    now = time.perf_counter() - t0
                    first = now if first is None else first
                    last = now
                if v.get("usage"):
                    tokens = v["usage"]["completion_tokens"]
    conn.close()
    if first is None:
        sys.exit("no token streamed")
    if tokens != gen:
        sys.exit(f"asked for {gen} tokens, usage says {tokens}")
    return first, last, tokens


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--long", type=int, default=400)
    ap.add_argument("--extend", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ids = lambda n: [rng.randrange(50000) for _ in range(n)]
    out = {}

    # Warm-up (first-touch of the weights), not measured.
    stream_completion(a.url, ids(a.prompt), 4)

    ttft, last, n = stream_completion(a.url, ids(a.prompt), a.gen)
    out["single"] = {"tokens": n, "ttft_ms": ttft * 1e3,
                     "decode_tok_s": (n - 1) / (last - ttft) if n > 1 and last > ttft else 0.0,
                     "tok_s": n / last}

    prompts = [ids(a.prompt) for _ in range(a.clients)]
    results = [None] * a.clients

    def client(i):
        results[i] = stream_completion(a.url, prompts[i], a.gen)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[2] for r in results)
    ttfts = [r[0] * 1e3 for r in results]
    out["concurrent"] = {"clients": a.clients, "tokens": tokens, "wall_s": wall,
                         "aggregate_tok_s": tokens / wall,
                         "ttft_p50_ms": statistics.median(ttfts), "ttft_p99_ms": pct(ttfts, 99),
                         "ttft_worst_ms": max(ttfts)}

    long = ids(a.long)
    cold = stream_completion(a.url, long, 1)[0]
    again = stream_completion(a.url, long, 1)[0]
    extended = stream_completion(a.url, long + ids(a.extend), 1)[0]
    out["long"] = {"prompt": a.long, "extend": a.extend, "cold_ttft_ms": cold * 1e3,
                   "repeated_ttft_ms": again * 1e3, "extended_ttft_ms": extended * 1e3}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
