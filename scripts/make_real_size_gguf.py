#!/usr/bin/env python3
"""Write a random-weight MoE at a real model's full shape straight to GGUF.

    python3 scripts/make_real_size_gguf.py OUT.gguf [--type q4_0|q8_0] [--layers 48] [--seed 0]

The shape is Qwen3-30B-A3B's (`qwen3moe` as llama.cpp's converter writes
it): hidden 2048, 32 query and 4 KV heads of 128 with q/k norms, 48
layers of 128 experts of 768, top-8, the real Qwen3 tokenizer
(`tests/material/qwen3`, vocabulary padded to 151 936 as the converter
pads it). Every matrix is GGML `--type` (Q4_0: about 17.2 GB at 48
layers; Q8_0: about 32.4 GB); norms are 1.0 and routers F32. `--layers`
writes fewer layers of the same width (a smoke test: 2 layers of Q4_0
are about 1.3 GB).

No torch and no bf16 checkpoint: the blocks are drawn directly (random
codes, a scale per block chosen so each matrix's values have std about
1/sqrt(fan_in), the embedding std about 1; routers N(0, 1/hidden)) and
written tensor by tensor with the `gguf` package's streaming writer, so
memory stays around one expert tensor (~115 MB) whatever the size. Needs
numpy and gguf (`/work/gguf-venv`: `pip install gguf==0.19.0 numpy`).

The disk it needs is printed before anything is written; the script
refuses to start when the free space is short, and writes OUT.partial,
renamed when complete.
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

ROOT = Path(__file__).resolve().parent.parent
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, TOP_K, EXPERT_FFN = 128, 8, 768
VOCAB = 151936
# Standard deviation of a code drawn uniformly from the symmetric range:
# Q4_0's nibble - 8 in -7..7, Q8_0's byte in -127..127.
CODE_STD = {T.Q4_0: 4.32, T.Q8_0: 73.6}


def blocks(rng, qtype, rows, cols, std):
    """`rows` rows of `cols` random `qtype` codes whose values have mean 0
    and about `std`: a row's bytes (uint8, shape (rows, row bytes)). The
    codes are symmetric (Q4_0's nibble 0 and Q8_0's -128 never drawn): a
    mean off zero would give every matrix a common direction, and the
    residual stream of 48 such layers collapses onto it (every token
    routed alike, one token repeated)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    b = np.empty((n, size), dtype=np.uint8)
    if qtype == T.Q4_0:
        lo = rng.integers(1, 16, size=(n, size - 2), dtype=np.uint8)
        hi = rng.integers(1, 16, size=(n, size - 2), dtype=np.uint8)
        b[:, 2:] = lo | (hi << 4)
    else:
        b[:, 2:] = rng.integers(-127, 128, size=(n, size - 2), dtype=np.int8).view(np.uint8)
    d = np.full(n, std / CODE_STD[qtype], dtype=np.float16)
    b[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    return b.reshape(rows, -1)


def tokenizer(w):
    """The Qwen3 tokenizer as llama.cpp's converter records it (byte-level
    BPE, `qwen2` pre-tokenizer, added tokens as control or user-defined,
    ids up to the vocabulary size padded as unused)."""
    tj = json.loads((ROOT / "tests/material/qwen3/tokenizer.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    added = {t["id"]: t for t in tj["added_tokens"]}
    for i, t in added.items():
        vocab[t["content"]] = i
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(VOCAB):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = vocab["<|im_end|>"]
    w.add_eos_token_id(eos)
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)


def plan(layers, qtype):
    """(name, numpy byte shape or float shape, raw type, fan_in / std) per
    tensor, in file order."""
    q = lambda rows, cols, std: ("q", rows, cols, std)
    out = [("token_embd.weight", q(VOCAB, HIDDEN, 1.0))]
    for l in range(layers):
        p = f"blk.{l}."
        out += [
            (p + "attn_norm.weight", ("ones", HIDDEN)),
            (p + "attn_q.weight", q(HEADS * HEAD_DIM, HIDDEN, HIDDEN**-0.5)),
            (p + "attn_k.weight", q(KV_HEADS * HEAD_DIM, HIDDEN, HIDDEN**-0.5)),
            (p + "attn_v.weight", q(KV_HEADS * HEAD_DIM, HIDDEN, HIDDEN**-0.5)),
            (p + "attn_output.weight", q(HIDDEN, HEADS * HEAD_DIM, (HEADS * HEAD_DIM) ** -0.5)),
            (p + "attn_q_norm.weight", ("ones", HEAD_DIM)),
            (p + "attn_k_norm.weight", ("ones", HEAD_DIM)),
            (p + "ffn_norm.weight", ("ones", HIDDEN)),
            (p + "ffn_gate_inp.weight", ("router", EXPERTS, HIDDEN)),
            (p + "ffn_gate_exps.weight", ("qe", EXPERT_FFN, HIDDEN, HIDDEN**-0.5)),
            (p + "ffn_up_exps.weight", ("qe", EXPERT_FFN, HIDDEN, HIDDEN**-0.5)),
            (p + "ffn_down_exps.weight", ("qe", HIDDEN, EXPERT_FFN, EXPERT_FFN**-0.5)),
        ]
    out += [("output_norm.weight", ("ones", HIDDEN)), ("output.weight", q(VOCAB, HIDDEN, HIDDEN**-0.5))]
    return out


def nbytes(spec, qtype):
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    kind = spec[0]
    if kind == "ones":
        return 4 * spec[1]
    if kind == "router":
        return 4 * spec[1] * spec[2]
    rows, cols = spec[1], spec[2]
    n = rows * cols // block * size
    return n * EXPERTS if kind == "qe" else n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output .gguf (must not exist)")
    ap.add_argument("--type", choices=["q4_0", "q8_0"], default="q4_0")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = Path(a.out)
    if out.exists():
        sys.exit(f"{out} exists; not overwriting it")
    qtype = T.Q4_0 if a.type == "q4_0" else T.Q8_0
    tensors = plan(a.layers, qtype)
    total = sum(nbytes(spec, qtype) for _, spec in tensors)
    free = shutil.disk_usage(out.parent.resolve()).free
    print(f"{out}: {a.layers} layers, {a.type}, {total / 1e9:.1f} GB of tensors; {free / 1e9:.1f} GB free")
    if total + (1 << 30) > free:
        sys.exit(f"not enough disk: {total / 1e9:.1f} GB needed (plus 1 GB slack), {free / 1e9:.1f} GB free")

    partial = out.with_name(out.name + ".partial")
    w = gguf.GGUFWriter(str(partial), "qwen3moe")
    w.add_name(f"qwen3moe-30b-a3b-shaped-{a.layers}l-random")
    w.add_block_count(a.layers)
    w.add_context_length(40960)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(6144)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if qtype == T.Q4_0 else gguf.LlamaFileType.MOSTLY_Q8_0)
    tokenizer(w)

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    for name, spec in tensors:
        kind = spec[0]
        if kind == "ones":
            w.add_tensor_info(name, [spec[1]], np.dtype(np.float32), 4 * spec[1])
        elif kind == "router":
            w.add_tensor_info(name, [spec[1], spec[2]], np.dtype(np.float32), 4 * spec[1] * spec[2])
        elif kind == "qe":
            shape = [EXPERTS, spec[1], spec[2] // block * size]
            w.add_tensor_info(name, shape, np.dtype(np.uint8), nbytes(spec, qtype), raw_dtype=qtype)
        else:
            shape = [spec[1], spec[2] // block * size]
            w.add_tensor_info(name, shape, np.dtype(np.uint8), nbytes(spec, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    written = 0
    for i, (name, spec) in enumerate(tensors):
        rng = np.random.default_rng([a.seed, i])
        kind = spec[0]
        if kind == "ones":
            data = np.ones(spec[1], dtype=np.float32)
        elif kind == "router":
            data = (rng.standard_normal((spec[1], spec[2]), dtype=np.float32) * HIDDEN**-0.5).astype(np.float32)
        elif kind == "qe":
            data = np.stack([blocks(rng, qtype, spec[1], spec[2], spec[3]) for _ in range(EXPERTS)])
        else:
            data = blocks(rng, qtype, spec[1], spec[2], spec[3])
        w.write_tensor_data(data)
        written += data.nbytes
        print(f"\r{written / 1e9:6.2f} / {total / 1e9:.2f} GB", end="", file=sys.stderr, flush=True)
    w.close()
    print(file=sys.stderr)
    os.rename(partial, out)
    print(f"wrote {out} ({out.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
