"""Convert the DeepSeek-lineage fixtures to GGUF with llama.cpp's own
converter (`convert_hf_to_gguf.py`), unchanged but for the vocabulary.

Run by hand (the outputs are committed; CI needs no Python), with the
llama.cpp source of the llama-cpp-python 0.3.36 sdist (see
make_gguf_hybrid_fixtures.py for how to get it) and the venv of
make_fixtures.py (torch, transformers, safetensors, numpy):

    /work/venv/bin/python scripts/make_gguf_lineage_fixtures.py \\
        /work/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp

Writes into tests/fixtures/gguf/, with `--outtype f32` and `--outtype q8_0` (the fixtures have no MTP
layers, and `--no-mtp` is refused for `deepseek2`):

  deepseekv3-{f32,q8_0}.gguf      arch `deepseek2` (q_lora_rank, YaRN)
  deepseekv3-noq-{f32,q8_0}.gguf  arch `deepseek2` (plain q_proj)
  glm4moelite-{f32,q8_0}.gguf     arch `deepseek2` (GLM-4.7-Flash)
  glm4moe-{f32,q8_0}.gguf         arch `glm4moe`
  minimax-m2-{f32,q8_0}.gguf      arch `minimax-m2`
  deepseekv32-{f32,q8_0}.gguf     arch `deepseek32` (the sparse-attention indexer)
  glmmoedsa-{f32,q8_0}.gguf       arch `glm-dsa` (indexer types: two layers share a selection)

Also `deepseekv3-kvb-f32.gguf`: deepseekv3-f32.gguf rewritten into the layout of
files from before the converter split `kv_b_proj` (one `attn_kv_b` tensor, the
Hugging Face matrix as it is; `attention.key_length` / `value_length` the per-head
sizes and no `*_mla` keys), every other tensor and key unchanged.

The converter splits `kv_b_proj` into `attn_k_b` / `attn_v_b` and writes
YaRN's `mscale_all_dim` as a log multiplier; charm undoes both at load
(docs/gguf.md). F32 must give the Hugging Face directory's logits bit for
bit; Q8_0 is measured. The fixtures have no tokenizer, so the converters'
`set_vocab` is replaced by one that writes `{arch}.vocab_size` only.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "gguf"
FAMILIES = ("deepseekv3", "deepseekv3-noq", "glm4moelite", "glm4moe", "minimax-m2", "deepseekv32", "glmmoedsa")


def main():
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.argv[0]} LLAMA_CPP_DIR (holding convert_hf_to_gguf.py) [FIXTURE ...]")
    llama = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(llama))
    import convert_hf_to_gguf as conv  # noqa: E402 (imports llama.cpp's gguf-py)
    from conversion.base import TextModel  # noqa: E402
    from conversion.deepseek import DeepseekV2Model, DeepseekV32Model  # noqa: E402
    from conversion.glm import Glm4MoeLiteModel, Glm4MoeModel, GlmMoeDsaModel  # noqa: E402
    from conversion.minimax import MiniMaxM2Model  # noqa: E402

    def set_vocab(self):
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    for cls in (TextModel, DeepseekV2Model, Glm4MoeModel, Glm4MoeLiteModel, MiniMaxM2Model, DeepseekV32Model,
                GlmMoeDsaModel):
        cls.set_vocab = set_vocab
    OUT.mkdir(parents=True, exist_ok=True)
    only = sys.argv[2:]
    for fixture in [f for f in only if f != "deepseekv3-kvb"] if only else FAMILIES:
        for outtype in ("f32", "q8_0"):
            out = OUT / f"{fixture}-{outtype}.gguf"
            sys.argv = ["convert_hf_to_gguf.py", str(FIX / fixture), "--outtype", outtype,
                        "--outfile", str(out)]
            conv.main()
            print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")
    if not only or "deepseekv3-kvb" in only:
        old_kv_b_layout()


def old_kv_b_layout():
    """deepseekv3-kvb-f32.gguf from deepseekv3-f32.gguf and the fixture's kv_b_proj."""
    import json

    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from safetensors.numpy import load_file

    src = GGUFReader(OUT / "deepseekv3-f32.gguf")
    hf = load_file(FIX / "deepseekv3" / "model.safetensors")
    cfg = json.loads((FIX / "deepseekv3" / "config.json").read_text())
    arch = "deepseek2"
    sizes = {f"{arch}.attention.key_length": cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"],
             f"{arch}.attention.value_length": cfg["v_head_dim"]}
    dst = OUT / "deepseekv3-kvb-f32.gguf"
    w = GGUFWriter(dst, arch)
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture" or field.name.endswith("_mla"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = sizes.get(field.name, field.contents())
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in src.tensors:
        if t.name.endswith(".attn_v_b.weight"):
            continue
        if t.name.endswith(".attn_k_b.weight"):
            layer = int(t.name.split(".")[1])
            kv_b = np.ascontiguousarray(hf[f"model.layers.{layer}.self_attn.kv_b_proj.weight"], dtype=np.float32)
            w.add_tensor(f"blk.{layer}.attn_kv_b.weight", kv_b)
            continue
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst.relative_to(ROOT)}: {dst.stat().st_size} bytes")


if __name__ == "__main__":
    main()
