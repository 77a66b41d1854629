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
    for fixture in only or FAMILIES:
        for outtype in ("f32", "q8_0"):
            out = OUT / f"{fixture}-{outtype}.gguf"
            sys.argv = ["convert_hf_to_gguf.py", str(FIX / fixture), "--outtype", outtype,
                        "--outfile", str(out)]
            conv.main()
            print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
