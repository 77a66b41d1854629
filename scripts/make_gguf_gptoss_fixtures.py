"""Convert the gpt-oss fixtures to GGUF with llama.cpp's own converter
(`convert_hf_to_gguf.py`, `conversion/gpt_oss.py`), unchanged but for the
vocabulary and one clamp key.

Run by hand (the outputs are committed; CI needs no Python), with the
llama.cpp source of the llama-cpp-python 0.3.36 sdist (as
scripts/bench_vs_llamacpp.sh unpacks it into $LLAMA_SRC: `pip download
--no-deps llama-cpp-python==0.3.36`, then `tar xzf`) and the venv of
make_fixtures.py (torch, transformers, safetensors, numpy):

    /work/venv/bin/python scripts/make_gguf_gptoss_fixtures.py \\
        /work/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp

Writes into tests/fixtures/gguf/ (arch `gpt-oss`):

  gptoss-f32.gguf    tests/fixtures/gptoss, `--outtype f32`
  gptoss-q8_0.gguf   tests/fixtures/gptoss, `--outtype q8_0`
  gptoss-mxfp4.gguf  tests/fixtures/gptoss-mxfp4, `--outtype f32`: the
                     converter keeps the hub's MXFP4 expert blocks as GGML
                     MXFP4 (`repack_mxfp4`: scale byte, then the 16 code
                     bytes in ggml's nibble order) and writes every other
                     tensor in f32.

What the converter does to gpt-oss (undone or followed by charm at load:
models/src/gguf/gpt_oss.rs): the fused `gate_up_proj` `[E, H, 2I]` (gate
and up in alternate columns) becomes `ffn_gate_exps` / `ffn_up_exps` `[E, I, H]` and
its bias `ffn_{gate,up}_exps.bias` `[E, I]`; `down_proj` `[E, I, H]` is
transposed into `ffn_down_exps` `[E, H, I]`; `self_attn.sinks` becomes
`attn_sinks.weight`; `post_attention_layernorm` is `post_attention_norm`.
It writes `attention.sliding_window` but no layer pattern (llama.cpp's
`gpt-oss` slides on even layers) and no GLU constants: llama.cpp
hard-codes alpha 1.702 and limit 7.0 (`llama-graph.cpp`,
`LLM_FFN_SWIGLU_OAI_MOE`). The fixtures clamp at `swiglu_limit` 1.0 (so
the clamp acts at their scale), so each file gets the limit as
`gpt-oss.swiglu_clamp_exp` (one per layer), the key llama.cpp's other
converters write for an expert GLU's clamp (DeepSeek-V4:
`add_swiglu_clamp_exp([hparams["swiglu_limit"]] * self.block_count)`);
charm reads it, llama.cpp's `gpt-oss` ignores it. YaRN's `truncate: false`
is not recorded either: charm applies it to every `gpt-oss` file, llama.cpp
truncates.

The fixtures have no tokenizer, so the converter's `set_vocab` is replaced
by one that writes `gpt-oss.vocab_size` only.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "gguf"
# (fixture, outtype, output)
FILES = (
    ("gptoss", "f32", "gptoss-f32.gguf"),
    ("gptoss", "q8_0", "gptoss-q8_0.gguf"),
    ("gptoss-mxfp4", "f32", "gptoss-mxfp4.gguf"),
)


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} LLAMA_CPP_DIR (holding convert_hf_to_gguf.py)")
    llama = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(llama))
    import convert_hf_to_gguf as conv  # noqa: E402 (imports llama.cpp's gguf-py)
    from conversion.gpt_oss import GptOssModel  # noqa: E402

    def set_vocab(self):
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    params = GptOssModel.set_gguf_parameters

    def set_gguf_parameters(self):
        params(self)
        self.gguf_writer.add_swiglu_clamp_exp([float(self.hparams["swiglu_limit"])] * self.block_count)

    GptOssModel.set_vocab = set_vocab
    GptOssModel.set_gguf_parameters = set_gguf_parameters
    OUT.mkdir(parents=True, exist_ok=True)
    for fixture, outtype, name in FILES:
        out = OUT / name
        sys.argv = ["convert_hf_to_gguf.py", str(FIX / fixture), "--outtype", outtype, "--outfile", str(out)]
        conv.main()
        print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
