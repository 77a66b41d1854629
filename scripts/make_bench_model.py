#!/usr/bin/env python3
"""Write a random-weight, real-width MoE checkpoint for benchmarks.

    python3 scripts/make_bench_model.py OUT_DIR [--family olmoe|qwen3next|glm4moelite|gptoss] [--layers 4] [--seed 0]
                                        [--expert-width N]

OUT_DIR becomes a Hugging Face directory with real widths but only
`--layers` decoder layers, weights in bfloat16 (gpt-oss's experts in
MXFP4, as released) spread over one shard per layer plus one for the
embeddings and LM head (`model.safetensors.index.json` maps them). There is
no tokenizer: drive it with `generate --prompt-ids`, or copy one in.

- `olmoe` (default): `OlmoeForCausalLM` with OLMoE-1B-7B's widths (hidden
  2048, 16 heads of 128, 64 experts of intermediate 1024, top-8, vocabulary
  50304). At 4 layers about 3.0 GiB of experts and 0.4 GiB dense.
  `--expert-width` sets another expert intermediate size (1408, as
  GLM-4.5-Air's and DeepSeek-V2-Lite's experts: rows llama.cpp's
  quantizer cannot give a K-quant, so its Q4_K_M holds their down
  projections as Q5_0).
- `qwen3next`: `Qwen3NextForCausalLM` with Qwen3-Next-80B-A3B's widths
  (hidden 2048; gated DeltaNet layers with 16 key / 32 value heads of 128
  and a width-4 conv; every fourth layer gated full attention, 16 heads of
  256, 2 KV heads, partial rotary 0.25; 512 experts of intermediate 512,
  top-10, a shared expert of 512 with its sigmoid gate; vocabulary 151936,
  the Qwen3 tokenizer's). At 4 layers (three DeltaNet, one attention) about
  12.0 GiB of experts and 1.6 GiB dense. Zero-centred norms (`(1 + w)`)
  are stored as 0, `A_log` as log(U(1, 16)) as transformers initialises it,
  `dt_bias` as 1.
- `glm4moelite`: `Glm4MoeLiteForCausalLM` with GLM-4.7-Flash's widths
  (hidden 2048; MLA with 20 heads, q_lora_rank 768, kv_lora_rank 512,
  qk_nope 192 + qk_rope 64, v_head_dim 256; layer 0 a dense MLP of 10240,
  the others 64 experts of 1536, top-4, sigmoid router with a selection
  bias (stored as 0), routed_scaling_factor 1.8, one shared expert of
  1536; vocabulary 154880). At 4 layers (one dense, three MoE) about 3.4
  GiB of experts and 1.6 GiB dense.
- `gptoss`: `GptOssForCausalLM` with gpt-oss-20b's widths and config.json
  (hidden 2880; 64 query heads and 8 KV heads of 64, q/k/v/o biases, one
  learned sink per head; layers alternate a 128-token sliding window and
  full attention; YaRN over rope_theta 150000, factor 32 from 4096, beta
  32 / 1, not truncated; 32 experts of intermediate 2880, top-4, a router
  with a bias, the clamped GLU at swiglu_limit 7.0; vocabulary 201088) and
  its release's layout: the experts fused per layer as MXFP4
  (`mlp.experts.gate_up_proj_blocks` `[E, 2I, H/32, 16]` uint8 and
  `gate_up_proj_scales` `[E, 2I, H/32]` uint8 E8M0, gate and up rows
  alternating; `down_proj_blocks` / `_scales` `[E, H, I/32, 16]` /
  `[E, H, I/32]`) beside bf16 biases `gate_up_proj_bias` `[E, 2I]` and
  `down_proj_bias` `[E, H]`, everything else bf16, and the release's
  `quantization_config` (`quant_method: mxfp4`). At 4 layers about 1.6
  GiB of experts and 2.4 GiB dense (the embedding and the LM head are
  2.2 GiB of it).

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
round-to-nearest-even. gpt-oss's MXFP4 experts are the same normal draws
quantized as MXFP4 is (per 32 values a power-of-two scale 2^ceil(log2(amax
/ 6)), each value to the nearest FP4 E2M1 code, ties to the smaller
magnitude: scripts/make_fixtures.py `mxfp4_quantize`); its biases (q/k/v/o,
router, experts) have std 0.02 (`initializer_range`) and its sinks std 1
(a sink is a logit beside the scores, which have std about 1).

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

# Qwen3-Next-80B-A3B (config.json of the released checkpoint).
QN = {
    "vocab": 151936,
    "heads": 16,
    "kv_heads": 2,
    "head_dim": 256,
    "experts": 512,
    "top_k": 10,
    "moe_inter": 512,
    "shared_inter": 512,
    "k_heads": 16,
    "v_heads": 32,
    "k_dim": 128,
    "v_dim": 128,
    "conv": 4,
    "interval": 4,
}

# GLM-4.7-Flash (transformers' Glm4MoeLiteConfig defaults, which are the release's).
GL = {
    "vocab": 154880,
    "heads": 20,
    "q_lora": 768,
    "kv_lora": 512,
    "nope": 192,
    "rope": 64,
    "v_dim": 256,
    "dense_inter": 10240,
    "experts": 64,
    "top_k": 4,
    "moe_inter": 1536,
}

# gpt-oss-20b (config.json of the released checkpoint).
GO = {
    "hidden": 2880,
    "vocab": 201088,
    "heads": 64,
    "kv_heads": 8,
    "head_dim": 64,
    "experts": 32,
    "top_k": 4,
    "inter": 2880,
    "window": 128,
}

# FP4 E2M1's magnitudes (codes 0-7; bit 3 is the sign) and the midpoints between them.
FP4_MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)

# Elements drawn at a time: bounds memory (64 MiB of float32).
CHUNK_ELEMS = 16 << 20


def olmoe_config(layers):
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


def olmoe_shard_plan(layers):
    """[(file name, [(tensor name, shape, kind, std)])]; kind is 'ones', 'zeros', 'normal' or 'log_uniform_1_16'
    (bfloat16), or 'mxfp4_blocks' / 'mxfp4_scales' (uint8)."""
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


def head_shard(vocab, norm_kind, hidden=HIDDEN):
    """The embedding, final norm (`norm_kind`: 'ones', or 'zeros' for zero-centred norms) and LM head."""
    return [
        ("model.embed_tokens.weight", [vocab, hidden], "normal", 1.0),
        ("model.norm.weight", [hidden], norm_kind, 0.0),
        ("lm_head.weight", [vocab, hidden], "normal", hidden**-0.5),
    ]


def swiglu(prefix, inter):
    """`{prefix}{gate,up,down}_proj.weight` of one SwiGLU FFN of intermediate width `inter`."""
    return [
        (prefix + "gate_proj.weight", [inter, HIDDEN], "normal", HIDDEN**-0.5),
        (prefix + "up_proj.weight", [inter, HIDDEN], "normal", HIDDEN**-0.5),
        (prefix + "down_proj.weight", [HIDDEN, inter], "normal", inter**-0.5),
    ]


def qwen3next_config(layers):
    c = QN
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "decoder_sparse_step": 1,
        "full_attention_interval": c["interval"],
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 5120,
        "linear_conv_kernel_dim": c["conv"],
        "linear_key_head_dim": c["k_dim"],
        "linear_num_key_heads": c["k_heads"],
        "linear_num_value_heads": c["v_heads"],
        "linear_value_head_dim": c["v_dim"],
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "moe_intermediate_size": c["moe_inter"],
        "norm_topk_prob": True,
        "num_attention_heads": c["heads"],
        "num_experts": c["experts"],
        "num_experts_per_tok": c["top_k"],
        "num_hidden_layers": layers,
        "num_key_value_heads": c["kv_heads"],
        "output_router_logits": False,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 10000000.0,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": c["shared_inter"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": c["vocab"],
    }


def qwen3next_shard_plan(layers):
    """As olmoe_shard_plan, for the Qwen3-Next shape (layer i is full attention when (i + 1) % 4 == 0)."""
    c = QN
    total = layers + 1
    name = lambda i: f"model-{i + 1:05d}-of-{total:05d}.safetensors"
    shards = [(name(0), head_shard(c["vocab"], "zeros"))]
    kd, vd = c["k_heads"] * c["k_dim"], c["v_heads"] * c["v_dim"]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t = [
            (p + "input_layernorm.weight", [HIDDEN], "zeros", 0.0),
            (p + "post_attention_layernorm.weight", [HIDDEN], "zeros", 0.0),
        ]
        if (layer + 1) % c["interval"] == 0:
            q_dim, kv_dim = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
            t += [
                (p + "self_attn.q_proj.weight", [2 * q_dim, HIDDEN], "normal", HIDDEN**-0.5),
                (p + "self_attn.k_proj.weight", [kv_dim, HIDDEN], "normal", HIDDEN**-0.5),
                (p + "self_attn.v_proj.weight", [kv_dim, HIDDEN], "normal", HIDDEN**-0.5),
                (p + "self_attn.o_proj.weight", [HIDDEN, q_dim], "normal", q_dim**-0.5),
                (p + "self_attn.q_norm.weight", [c["head_dim"]], "zeros", 0.0),
                (p + "self_attn.k_norm.weight", [c["head_dim"]], "zeros", 0.0),
            ]
        else:
            a = p + "linear_attn."
            t += [
                (a + "in_proj_qkvz.weight", [2 * kd + 2 * vd, HIDDEN], "normal", HIDDEN**-0.5),
                (a + "in_proj_ba.weight", [2 * c["v_heads"], HIDDEN], "normal", HIDDEN**-0.5),
                (a + "conv1d.weight", [2 * kd + vd, 1, c["conv"]], "normal", c["conv"] ** -0.5),
                (a + "dt_bias", [c["v_heads"]], "ones", 0.0),
                (a + "A_log", [c["v_heads"]], "log_uniform_1_16", 0.0),
                (a + "norm.weight", [c["v_dim"]], "ones", 0.0),
                (a + "out_proj.weight", [HIDDEN, vd], "normal", vd**-0.5),
            ]
        t.append((p + "mlp.gate.weight", [c["experts"], HIDDEN], "normal", HIDDEN**-0.5))
        for e in range(c["experts"]):
            t += swiglu(f"{p}mlp.experts.{e}.", c["moe_inter"])
        t += swiglu(p + "mlp.shared_expert.", c["shared_inter"])
        t.append((p + "mlp.shared_expert_gate.weight", [1, HIDDEN], "normal", HIDDEN**-0.5))
        shards.append((name(layer + 1), t))
    return shards


def glm4moelite_config(layers):
    c = GL
    return {
        "architectures": ["Glm4MoeLiteForCausalLM"],
        "model_type": "glm4_moe_lite",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": c["dense_inter"],
        "kv_lora_rank": c["kv_lora"],
        "max_position_embeddings": 202752,
        "moe_intermediate_size": c["moe_inter"],
        "n_group": 1,
        "n_routed_experts": c["experts"],
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": c["heads"],
        "num_experts_per_tok": c["top_k"],
        "num_hidden_layers": layers,
        "num_key_value_heads": c["heads"],
        "q_lora_rank": c["q_lora"],
        "qk_nope_head_dim": c["nope"],
        "qk_rope_head_dim": c["rope"],
        "rms_norm_eps": 1e-5,
        "rope_interleave": True,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "routed_scaling_factor": 1.8,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "v_head_dim": c["v_dim"],
        "vocab_size": c["vocab"],
    }


def glm4moelite_shard_plan(layers):
    """As olmoe_shard_plan, for the GLM-4.7-Flash shape (layer 0 dense, the others MoE)."""
    c = GL
    total = layers + 1
    name = lambda i: f"model-{i + 1:05d}-of-{total:05d}.safetensors"
    shards = [(name(0), head_shard(c["vocab"], "ones"))]
    qk = c["nope"] + c["rope"]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        t = [
            (p + "input_layernorm.weight", [HIDDEN], "ones", 0.0),
            (p + "post_attention_layernorm.weight", [HIDDEN], "ones", 0.0),
            (a + "q_a_proj.weight", [c["q_lora"], HIDDEN], "normal", HIDDEN**-0.5),
            (a + "q_a_layernorm.weight", [c["q_lora"]], "ones", 0.0),
            (a + "q_b_proj.weight", [c["heads"] * qk, c["q_lora"]], "normal", c["q_lora"] ** -0.5),
            (a + "kv_a_proj_with_mqa.weight", [c["kv_lora"] + c["rope"], HIDDEN], "normal", HIDDEN**-0.5),
            (a + "kv_a_layernorm.weight", [c["kv_lora"]], "ones", 0.0),
            (a + "kv_b_proj.weight", [c["heads"] * (c["nope"] + c["v_dim"]), c["kv_lora"]], "normal",
             c["kv_lora"] ** -0.5),
            (a + "o_proj.weight", [HIDDEN, c["heads"] * c["v_dim"]], "normal", (c["heads"] * c["v_dim"]) ** -0.5),
        ]
        if layer == 0:
            t += swiglu(p + "mlp.", c["dense_inter"])
        else:
            t += [
                (p + "mlp.gate.weight", [c["experts"], HIDDEN], "normal", HIDDEN**-0.5),
                (p + "mlp.gate.e_score_correction_bias", [c["experts"]], "zeros", 0.0),
            ]
            for e in range(c["experts"]):
                t += swiglu(f"{p}mlp.experts.{e}.", c["moe_inter"])
            t += swiglu(p + "mlp.shared_experts.", c["moe_inter"])
        shards.append((name(layer + 1), t))
    return shards


def gptoss_config(layers):
    c = GO
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": 200002,
        "pad_token_id": 199999,
        "experts_per_token": c["top_k"],
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "hidden_size": c["hidden"],
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": c["inter"],
        # layer_types[i] = "sliding_attention" if bool((i + 1) % 2) else "full_attention"
        "layer_types": ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)],
        "max_position_embeddings": 131072,
        "num_attention_heads": c["heads"],
        "num_experts_per_tok": c["top_k"],
        "num_hidden_layers": layers,
        "num_key_value_heads": c["kv_heads"],
        "num_local_experts": c["experts"],
        "output_router_logits": False,
        "quantization_config": {
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": c["window"],
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": c["vocab"],
    }


def gptoss_shard_plan(layers):
    """As olmoe_shard_plan, for the gpt-oss-20b shape with its experts in the release's MXFP4 layout."""
    c = GO
    h, e, inter = c["hidden"], c["experts"], c["inter"]
    total = layers + 1
    name = lambda i: f"model-{i + 1:05d}-of-{total:05d}.safetensors"
    shards = [(name(0), head_shard(c["vocab"], "ones", h))]
    q_dim, kv_dim = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    for layer in range(layers):
        p = f"model.layers.{layer}."
        a, x = p + "self_attn.", p + "mlp.experts."
        shards.append((name(layer + 1), [
            (p + "input_layernorm.weight", [h], "ones", 0.0),
            (p + "post_attention_layernorm.weight", [h], "ones", 0.0),
            (a + "q_proj.weight", [q_dim, h], "normal", h**-0.5),
            (a + "q_proj.bias", [q_dim], "normal", 0.02),
            (a + "k_proj.weight", [kv_dim, h], "normal", h**-0.5),
            (a + "k_proj.bias", [kv_dim], "normal", 0.02),
            (a + "v_proj.weight", [kv_dim, h], "normal", h**-0.5),
            (a + "v_proj.bias", [kv_dim], "normal", 0.02),
            (a + "o_proj.weight", [h, q_dim], "normal", q_dim**-0.5),
            (a + "o_proj.bias", [h], "normal", 0.02),
            (a + "sinks", [c["heads"]], "normal", 1.0),
            (p + "mlp.router.weight", [e, h], "normal", h**-0.5),
            (p + "mlp.router.bias", [e], "normal", 0.02),
            # Blocks before their scales: the scales are kept from quantizing the blocks.
            (x + "gate_up_proj_blocks", [e, 2 * inter, h // 32, 16], "mxfp4_blocks", h**-0.5),
            (x + "gate_up_proj_scales", [e, 2 * inter, h // 32], "mxfp4_scales", 0.0),
            (x + "gate_up_proj_bias", [e, 2 * inter], "normal", 0.02),
            (x + "down_proj_blocks", [e, h, inter // 32, 16], "mxfp4_blocks", inter**-0.5),
            (x + "down_proj_scales", [e, h, inter // 32], "mxfp4_scales", 0.0),
            (x + "down_proj_bias", [e, h], "normal", 0.02),
        ]))
    return shards


FAMILIES = {
    "olmoe": ("OlmoeForCausalLM", olmoe_config, olmoe_shard_plan),
    "glm4moelite": ("Glm4MoeLiteForCausalLM", glm4moelite_config, glm4moelite_shard_plan),
    "qwen3next": ("Qwen3NextForCausalLM", qwen3next_config, qwen3next_shard_plan),
    "gptoss": ("GptOssForCausalLM", gptoss_config, gptoss_shard_plan),
}


def to_bf16(x):
    """float32 array -> uint16 bfloat16 bits, round to nearest even (no NaNs here)."""
    bits = x.view(np.uint32)
    rounding = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return ((bits + rounding) >> np.uint32(16)).astype("<u2")


def mxfp4_quantize(w):
    """MXFP4 of `w` (rows x cols float32, cols a multiple of 32) in the hub layout: blocks (rows,
    cols/32, 16) uint8 (byte j: element 2j in the low nibble, 2j + 1 in the high one) and scales
    (rows, cols/32) uint8 (E8M0: value = FP4 x 2^(scale - 127))."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    amax = np.maximum(np.abs(g).max(axis=-1), np.float32(1e-30))
    exp = np.clip(np.ceil(np.log2(amax / np.float32(6.0))), -127, 127)
    scaled = g * np.exp2(-exp)[..., None].astype(np.float32)
    # The nearest magnitude, ties to the smaller one; the sign bit on nonzero codes only.
    code = np.searchsorted(FP4_MIDPOINTS, np.abs(scaled), side="left").astype(np.uint8)
    code |= ((scaled < 0) & (code > 0)).astype(np.uint8) << np.uint8(3)
    blocks = code[..., 0::2] | (code[..., 1::2] << np.uint8(4))
    return blocks, (exp + 127).astype(np.uint8)


def mxfp4_chunks(name, shape, std, seed, scales_out):
    """The MXFP4 blocks of `shape` [E, rows, cols/32, 16] drawn as normal(0, std) values, expert by
    expert in pieces of rows; the matching scales are appended to `scales_out`."""
    e, rows, groups, _ = shape
    cols = groups * 32
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    step = max(1, CHUNK_ELEMS // cols)
    for _ in range(e):
        for r in range(0, rows, step):
            k = min(step, rows - r)
            x = rng.standard_normal(k * cols, dtype=np.float32)
            x *= np.float32(std)
            blocks, scales = mxfp4_quantize(x.reshape(k, cols))
            scales_out.append(scales.tobytes())
            yield blocks.tobytes()


def tensor_bytes(shape, kind):
    return int(np.prod(shape)) * (1 if kind.startswith("mxfp4") else 2)


def tensor_chunks(name, shape, kind, std, seed, pending):
    """The bytes of one tensor (bfloat16, or MXFP4 blocks / scales as uint8), in pieces of at most
    CHUNK_ELEMS elements. `pending` holds the scales of MXFP4 blocks already written, by the scales'
    tensor name."""
    n = int(np.prod(shape))
    if kind == "mxfp4_blocks":
        yield from mxfp4_chunks(name, shape, std, seed, pending.setdefault(name.replace("_blocks", "_scales"), []))
        return
    if kind == "mxfp4_scales":
        yield from pending.pop(name)
        return
    if kind in ("ones", "zeros"):
        yield to_bf16(np.full(n, 1.0 if kind == "ones" else 0.0, dtype=np.float32)).tobytes()
        return
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if kind == "log_uniform_1_16":
        yield to_bf16(np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)).tobytes()
        return
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
    for name, shape, kind, _ in tensors:
        size = tensor_bytes(shape, kind)
        dtype = "U8" if kind.startswith("mxfp4") else "BF16"
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        pending = {}
        for name, shape, kind, std in tensors:
            for piece in tensor_chunks(name, shape, kind, std, seed, pending):
                f.write(piece)
        assert not pending, f"MXFP4 scales without their tensor: {sorted(pending)}"
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (must not exist)")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="olmoe", help="shape (default olmoe)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--expert-width", type=int, help="olmoe only: the experts' intermediate size (default 1024)")
    args = ap.parse_args()
    if args.layers < 1:
        sys.exit("--layers must be at least 1")
    if args.expert_width is not None:
        if args.family != "olmoe" or args.expert_width < 32 or args.expert_width % 32:
            sys.exit("--expert-width takes an olmoe model and a positive multiple of 32")
        global INTERMEDIATE
        INTERMEDIATE = args.expert_width
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        sys.exit(f"{out}: already exists; remove it or choose another OUT_DIR")
    partial = out + ".partial"
    if os.path.exists(partial):
        shutil.rmtree(partial)
    os.makedirs(partial)

    arch, config, shard_plan = FAMILIES[args.family]
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
    print(f"{out}: {arch}, {args.layers} layers, {total / 2**30:.2f} GiB", file=sys.stderr)


if __name__ == "__main__":
    main()
