"""Write small GGUF model files from the committed Hugging Face fixtures.

Run by hand (in the venv of make_fixtures.py, plus `pip install gguf`):

    /path/to/venv/bin/python scripts/make_gguf_models.py

It reads tests/fixtures/{olmoe,qwen3moe,mixtral}/ (safetensors + config.json)
and writes tests/fixtures/gguf-models/*.gguf the way llama.cpp's converter
lays them out: llama.cpp tensor names, stacked expert tensors
`blk.N.ffn_{gate,up,down}_exps`, metadata under the llama.cpp architecture
name, and for the `llama` architecture (Mixtral) the q/k rows permuted per
head as `convert_hf_to_gguf.py` does. No tokenizer is written (the fixtures
have none; `{arch}.vocab_size` gives the vocabulary size).

  olmoe-f32.gguf     F32 weights: must give the same tokens as the HF dir
  mixtral-bf16.gguf  BF16 (the fixture's own precision) as arch `llama`
  olmoe-q8_0.gguf    Q8_0 2-D weights (norms, routers F32): measured
  qwen3moe-q8_0.gguf Q8_0, with a dense MLP layer and per-head QK-norm
"""

import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import quantize
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "gguf-models"


def load_dir(d):
    tensors = {}
    for f in sorted(d.glob("*.safetensors")):
        try:
            tensors.update(load_file(f))
        except TypeError:
            pass
    if not tensors or any(t.dtype == np.uint16 for t in tensors.values()):
        # bf16 (numpy has none): read with torch and upcast exactly.
        import torch
        from safetensors.torch import load_file as load_torch

        tensors = {}
        for f in sorted(d.glob("*.safetensors")):
            tensors.update({k: v.to(torch.float32).numpy() for k, v in load_torch(f).items()})
    cfg = json.loads((d / "config.json").read_text())
    return cfg, {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}


def permute(w, n_head):
    # convert_hf_to_gguf.py LlamaModel.permute: interleave each head's rotary halves.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def cfg_get(cfg, *keys, default=None):
    for k in keys:
        v = cfg
        for part in k.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None:
            return v
    return default


def write(name, arch, cfg, t, qtype):
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    w = GGUFWriter(str(path), arch)
    L = cfg["num_hidden_layers"]
    H = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or H // heads
    E = cfg_get(cfg, "num_experts", "num_local_experts")
    w.add_uint32(f"{arch}.block_count", L)
    w.add_uint32(f"{arch}.context_length", cfg.get("max_position_embeddings", 512))
    w.add_uint32(f"{arch}.embedding_length", H)
    w.add_uint32(f"{arch}.attention.head_count", heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", kv)
    w.add_uint32(f"{arch}.attention.key_length", head_dim)
    w.add_uint32(f"{arch}.attention.value_length", head_dim)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_float32(f"{arch}.rope.freq_base", float(cfg_get(cfg, "rope_parameters.rope_theta", "rope_theta", default=10000.0)))
    w.add_uint32(f"{arch}.vocab_size", cfg["vocab_size"])
    w.add_uint32(f"{arch}.expert_count", E)
    w.add_uint32(f"{arch}.expert_used_count", cfg["num_experts_per_tok"])
    moe_ff = cfg.get("moe_intermediate_size")
    w.add_uint32(f"{arch}.feed_forward_length", cfg["intermediate_size"])
    if moe_ff:
        w.add_uint32(f"{arch}.expert_feed_forward_length", moe_ff)
    if "norm_topk_prob" in cfg:
        w.add_bool(f"{arch}.expert_weights_norm", bool(cfg["norm_topk_prob"]))
    w.add_uint32("tokenizer.ggml.bos_token_id", cfg.get("bos_token_id", 1))
    w.add_uint32("tokenizer.ggml.eos_token_id", cfg.get("eos_token_id", 2))

    def put(gname, arr, quantize_it=True):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        # Rows that are not whole Q8_0 blocks stay F32, as llama.cpp's converter does.
        if qtype == "f32" or arr.ndim == 1 or not quantize_it or (qtype == "q8_0" and arr.shape[-1] % 32):
            w.add_tensor(gname, arr)
        elif qtype == "bf16":
            w.add_tensor(gname, quantize(arr, Q.BF16), raw_dtype=Q.BF16)
        else:
            w.add_tensor(gname, quantize(arr, Q.Q8_0), raw_dtype=Q.Q8_0)

    llama = arch == "llama"
    moe_block = "block_sparse_moe" if llama else "mlp"
    proj = ["w1", "w3", "w2"] if llama else ["gate_proj", "up_proj", "down_proj"]
    put("token_embd.weight", t["model.embed_tokens.weight"])
    put("output_norm.weight", t["model.norm.weight"])
    if "lm_head.weight" in t:
        put("output.weight", t["lm_head.weight"])
    for l in range(L):
        p = f"model.layers.{l}"
        put(f"blk.{l}.attn_norm.weight", t[f"{p}.input_layernorm.weight"])
        put(f"blk.{l}.ffn_norm.weight", t[f"{p}.post_attention_layernorm.weight"])
        q = t[f"{p}.self_attn.q_proj.weight"]
        k = t[f"{p}.self_attn.k_proj.weight"]
        if llama:
            q, k = permute(q, heads), permute(k, kv)
        put(f"blk.{l}.attn_q.weight", q)
        put(f"blk.{l}.attn_k.weight", k)
        put(f"blk.{l}.attn_v.weight", t[f"{p}.self_attn.v_proj.weight"])
        put(f"blk.{l}.attn_output.weight", t[f"{p}.self_attn.o_proj.weight"])
        for n in ("q_norm", "k_norm"):
            if f"{p}.self_attn.{n}.weight" in t:
                put(f"blk.{l}.attn_{n}.weight", t[f"{p}.self_attn.{n}.weight"])
        router = f"{p}.{moe_block}.gate.weight"
        if router in t:
            put(f"blk.{l}.ffn_gate_inp.weight", t[router], quantize_it=False)
            for g, hf in zip(("gate", "up", "down"), proj):
                stacked = np.stack([t[f"{p}.{moe_block}.experts.{e}.{hf}.weight"] for e in range(E)])
                put(f"blk.{l}.ffn_{g}_exps.weight", stacked)
        else:
            for g, hf in zip(("gate", "up", "down"), ("gate_proj", "up_proj", "down_proj")):
                put(f"blk.{l}.ffn_{g}.weight", t[f"{p}.mlp.{hf}.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")


def main():
    cfg, t = load_dir(FIX / "olmoe")
    write("olmoe-f32.gguf", "olmoe", cfg, t, "f32")
    write("olmoe-q8_0.gguf", "olmoe", cfg, t, "q8_0")
    cfg, t = load_dir(FIX / "mixtral")
    write("mixtral-bf16.gguf", "llama", cfg, t, "bf16")
    cfg, t = load_dir(FIX / "qwen3moe")
    write("qwen3moe-q8_0.gguf", "qwen3moe", cfg, t, "q8_0")


if __name__ == "__main__":
    main()
