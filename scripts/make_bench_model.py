#!/usr/bin/env python3
"""Write a random-weight, real-width OLMoE checkpoint for benchmarks.

    python3 scripts/make_bench_model.py OUT_DIR [--layers 4] [--seed 0]

OUT_DIR becomes a Hugging Face directory for `OlmoeForCausalLM` with
OLMoE-1B-7B's widths (hidden 2048, 16 heads of 128, 64 experts of
intermediate 1024, top-8, vocabulary 50304) but only `--layers` decoder
layers, weights in bfloat16 spread over one shard per layer plus one for the
embeddings and LM head (`model.safetensors.index.json` maps them). At 4
layers that is about 3.0 GiB of experts and 0.4 GiB of dense weights. There
is no tokenizer: drive it with `generate --prompt-ids`.

Only numpy is needed (no torch, no transformers): the safetensors files are
written by hand (8-byte little-endian header length, JSON header, raw data)
tensor by tensor, so memory stays around a few hundred MiB whatever the size.
Set up once, outside the repository:

    python3 -m venv /work/bench-venv && /work/bench-venv/bin/pip install numpy safetensors

(`safetensors` is not imported; it is handy for inspecting the result.)

Weights are deterministic for a given `--seed` (each tensor draws from its
own stream keyed by the seed and the tensor's name). Projections have
std 1/sqrt(fan_in) so activations stay O(1) through the layers; embeddings
have std 1; the router has std 1/sqrt(hidden), so router logits have std
about 1 and tokens spread over many experts instead of collapsing onto a few;
every norm weight is 1.0. float32 draws are rounded to bfloat16 with
round-to-nearest-even.

The directory is written as OUT_DIR.partial and renamed when complete, so an
existing OUT_DIR is always whole; the script refuses to overwrite one.
"""

import argparse
import json
import os
import shutil
import struct
import sys
import zlib

import numpy as np

VOCAB = 50304
HIDDEN = 2048
HEADS = 16
KV_HEADS = 16
HEAD_DIM = 128
EXPERTS = 64
TOP_K = 8
INTERMEDIATE = 1024

# Elements drawn at a time: bounds memory (64 MiB of float32).
CHUNK_ELEMS = 16 << 20


def config(layers):
    return {
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "clip_qkv": None,
        "eos_token_id": 50279,
        "pad_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "head_dim": HEAD_DIM,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": 4096,
        "norm_topk_prob": False,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": layers,
        "output_router_logits": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "router_aux_loss_coef": 0.01,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
    }


def shard_plan(layers):
    """[(file name, [(tensor name, shape, kind, std)])]; kind is 'ones' or 'normal'."""
    total = layers + 1
    name = lambda i: f"model-{i + 1:05d}-of-{total:05d}.safetensors"
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shards = [
        (
            name(0),
            [
                ("model.embed_tokens.weight", [VOCAB, HIDDEN], "normal", 1.0),
                ("model.norm.weight", [HIDDEN], "ones", 0.0),
                ("lm_head.weight", [VOCAB, HIDDEN], "normal", HIDDEN**-0.5),
            ],
        )
    ]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t = [
            (p + "input_layernorm.weight", [HIDDEN], "ones", 0.0),
            (p + "post_attention_layernorm.weight", [HIDDEN], "ones", 0.0),
            (p + "self_attn.q_proj.weight", [q_dim, HIDDEN], "normal", HIDDEN**-0.5),
            (p + "self_attn.k_proj.weight", [kv_dim, HIDDEN], "normal", HIDDEN**-0.5),
            (p + "self_attn.v_proj.weight", [kv_dim, HIDDEN], "normal", HIDDEN**-0.5),
            (p + "self_attn.o_proj.weight", [HIDDEN, q_dim], "normal", q_dim**-0.5),
            (p + "self_attn.q_norm.weight", [q_dim], "ones", 0.0),
            (p + "self_attn.k_norm.weight", [kv_dim], "ones", 0.0),
            (p + "mlp.gate.weight", [EXPERTS, HIDDEN], "normal", HIDDEN**-0.5),
        ]
        for e in range(EXPERTS):
            q = f"{p}mlp.experts.{e}."
            t += [
                (q + "gate_proj.weight", [INTERMEDIATE, HIDDEN], "normal", HIDDEN**-0.5),
                (q + "up_proj.weight", [INTERMEDIATE, HIDDEN], "normal", HIDDEN**-0.5),
                (q + "down_proj.weight", [HIDDEN, INTERMEDIATE], "normal", INTERMEDIATE**-0.5),
            ]
        shards.append((name(layer + 1), t))
    return shards


def to_bf16(x):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (no NaNs here)."""
    bits = x.view(np.uint32)
    rounding = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((bits + rounding) >> np.uint32(16)).astype("<u2")


def tensor_chunks(name, shape, kind, std, seed):
    """bfloat16 bytes of one tensor, in pieces of at most CHUNK_ELEMS elements."""
    n = int(np.prod(shape))
    if kind == "ones":
        yield to_bf16(np.ones(n, dtype=np.float32)).tobytes()
        return
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    left = n
    while left:
        k = min(left, CHUNK_ELEMS)
        x = rng.standard_normal(k, dtype=np.float32)
        x *= np.float32(std)
        yield to_bf16(x).tobytes()
        left -= k


def write_shard(path, tensors, seed):
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _, _ in tensors:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, kind, std in tensors:
            for piece in tensor_chunks(name, shape, kind, std, seed):
                f.write(piece)
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (must not exist)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    args = ap.parse_args()
    if args.layers < 1:
        sys.exit("--layers must be at least 1")
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        sys.exit(f"{out}: already exists; remove it or choose another OUT_DIR")
    partial = out + ".partial"
    if os.path.exists(partial):
        shutil.rmtree(partial)
    os.makedirs(partial)

    weight_map, total = {}, 0
    for fname, tensors in shard_plan(args.layers):
        total += write_shard(os.path.join(partial, fname), tensors, args.seed)
        for name, *_ in tensors:
            weight_map[name] = fname
        print(f"wrote {fname} ({total / 2**30:.2f} GiB so far)", file=sys.stderr)
    with open(os.path.join(partial, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(partial, "config.json"), "w") as f:
        json.dump(config(args.layers), f, indent=2)
    os.rename(partial, out)
    print(f"{out}: OlmoeForCausalLM, {args.layers} layers, {total / 2**30:.2f} GiB bf16", file=sys.stderr)


if __name__ == "__main__":
    main()
