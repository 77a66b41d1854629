#!/usr/bin/env python3
"""One llama.cpp run on a GGUF file, as scripts/bench_vs_llamacpp.sh times it.

    PY scripts/bench_llamacpp.py MODEL.gguf --threads 2 --prompt-ids 1,2,3 --max-tokens 128

PY is a Python with the `llama-cpp-python` package (llama.cpp compiled for
this CPU; bench_vs_llamacpp.sh builds it). Prefills the prompt ids in one
batch, then decodes `--max-tokens` tokens greedily (argmax of the logits,
end-of-sequence ignored, as `coordinator generate --ignore-eos` does), and
prints one JSON line: prompt and generated token counts, prefill and decode
tokens per second from llama.cpp's own timers (`llama_perf_context`, which
leave out Python's overhead), the generated ids, the seconds `Llama()`
took to load, the process's peak resident memory, and the KV cache's bytes
per token as llama.cpp's own log reports the cache it allocated (K and V
sizes over its cell count; MiB with two decimals, so within about 0.1 %;
summed over the caches it logs, as for a model with sliding-window layers,
whose layers llama.cpp splits into a full and a sliding-window cache).

`--no-repack` turns off llama.cpp's CPU weight repacking (its "extra
buffer types", `use_extra_bufts = false`): repacked Q4_0 weights are copied
into anonymous memory, so a file larger than a memory limit cannot load
with it on (docs/benchmarks.md, real size).
"""

import argparse
import ctypes
import json
import re
import resource
import sys
import time

import numpy as np
import llama_cpp
from llama_cpp import Llama


LOG = []


@llama_cpp.llama_log_callback
def KEEP_LOG(level, text, user_data):
    """llama.cpp's log lines, kept (module level: llama.cpp still logs while freeing the model)."""
    LOG.append(text.decode(errors="replace"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--no-repack", action="store_true", help="read the weights from the mapping as stored")
    args = ap.parse_args()
    if args.no_repack:
        # Llama() takes its model parameters from this function.
        default = llama_cpp.llama_model_default_params

        def no_repack():
            p = default()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_model_default_params = no_repack
        llama_cpp.llama.llama_cpp.llama_model_default_params = no_repack

    llama_cpp.llama_log_set(KEEP_LOG, ctypes.c_void_p(0))
    prompt = [int(t) for t in args.prompt_ids.split(",") if t]
    n_ctx = len(prompt) + args.max_tokens + 8
    load_start = time.monotonic()
    llm = Llama(
        model_path=args.model,
        n_ctx=n_ctx,
        n_batch=max(len(prompt), 1),
        n_ubatch=max(len(prompt), 1),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        use_mmap=True,
        verbose=False,
    )
    load_s = time.monotonic() - load_start
    ctx = llm.ctx
    llama_cpp.llama_perf_context_reset(ctx)
    llm.eval(prompt)
    n_vocab = llm.n_vocab()
    ids = []
    for _ in range(args.max_tokens):
        # The last evaluated position's logits, straight from llama.cpp.
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        tok = int(np.argmax(logits))
        ids.append(tok)
        if len(ids) == args.max_tokens:
            break
        llm.eval([tok])
    perf = llama_cpp.llama_perf_context(ctx)
    # "llama_kv_cache: size =  X MiB (  N cells,  L layers, 1/1 seqs), K (f16): A MiB, V (f16): B MiB",
    # once per cache (twice for sliding-window models: the full and the sliding layers).
    kv = re.findall(r"\(\s*(\d+) cells.*K \(\w+\):\s*([\d.]+) MiB, V \(\w+\):\s*([\d.]+) MiB", "".join(LOG))
    kv_per_token = sum((float(k) + float(v)) * 2**20 / int(n) for n, k, v in kv) if kv else None
    out = {
        "engine": "llama.cpp",
        "version": llama_cpp.__version__,
        "prompt_tokens": perf.n_p_eval,
        "generated_tokens": len(ids),
        "prefill_tok_s": perf.n_p_eval / (perf.t_p_eval_ms / 1e3) if perf.t_p_eval_ms > 0 else 0.0,
        "decode_tok_s": perf.n_eval / (perf.t_eval_ms / 1e3) if perf.t_eval_ms > 0 else 0.0,
        "decoded_steps": perf.n_eval,
        "ids": ids,
        "kv_bytes_per_token": kv_per_token,
        "load_s": load_s,
        # ru_maxrss is in KiB on Linux.
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
