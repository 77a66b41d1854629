"""Convert the gated-DeltaNet hybrid fixtures to GGUF with llama.cpp's own
converter (`convert_hf_to_gguf.py`), unchanged but for the vocabulary.

Run by hand (the outputs are committed; CI needs no Python):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /work/llama-sdist
    #   (pip then tries to build cmake for the metadata; the sdist is already
    #    in its unpack directory and can be taken from there)
    tar xzf llama_cpp_python-0.3.36.tar.gz -C /work/llama-sdist
    /work/venv/bin/python scripts/make_gguf_hybrid_fixtures.py \
        /work/llama-sdist/llama_cpp_python-0.3.36/vendor/llama.cpp

(the venv of make_fixtures.py: torch, transformers, safetensors, numpy; the
converter imports its own vendored `gguf-py`).

Writes into tests/fixtures/gguf/:

  qwen3next-{f32,q8_0}.gguf  arch `qwen3next`, from tests/fixtures/qwen3next
  qwen35moe-{f32,q8_0}.gguf  arch `qwen35moe`, from tests/fixtures/qwen35moe
  qwen3next-sq-{f32,q8_0}.gguf, qwen35moe-sq-{f32,q8_0}.gguf
                             the same families with square DeltaNet heads
                             (linear key head dim = value head dim = 32),
                             built by make_fixtures.py's makers into a
                             temporary directory (not committed) and
                             converted: llama.cpp 0.3.36 loads
                             only square heads (every released checkpoint
                             has 128 / 128), so these are the files that
                             scripts/make_llamacpp_greedy.py runs llama.cpp
                             on

with `--outtype f32` / `--outtype q8_0` and `--no-mtp` (the fixtures have
no MTP block). F32 must give the Hugging Face directory's logits bit for
bit; Q8_0 (2-D weights whose rows are whole 32-element blocks, the rest F32,
as the converter decides) is measured. The
fixtures have no tokenizer, so the converter's `set_vocab` is replaced by
one that writes `{arch}.vocab_size` only; every tensor and every other
metadata key is the converter's own (its reorderings included: see
docs/gguf.md).
"""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "gguf"

FIXTURES = [
    (fixture, f"{fixture}-{outtype}.gguf", outtype)
    for fixture in ("qwen3next", "qwen35moe")
    for outtype in ("f32", "q8_0")
]


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} LLAMA_CPP_DIR (holding convert_hf_to_gguf.py)")
    llama = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(llama))
    import convert_hf_to_gguf as conv  # noqa: E402 (imports llama.cpp's gguf-py)
    from conversion.base import TextModel  # noqa: E402

    def set_vocab(self):
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    TextModel.set_vocab = set_vocab
    OUT.mkdir(parents=True, exist_ok=True)
    for fixture, name, outtype in FIXTURES:
        out = OUT / name
        sys.argv = ["convert_hf_to_gguf.py", str(FIX / fixture), "--outtype", outtype, "--no-mtp", "--outfile", str(out)]
        conv.main()
        print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")

    # Square-head variants, made on the spot (make_fixtures.py writes into its FIXTURES).
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_fixtures as mf  # noqa: E402 (torch, transformers)

    sizes = {**mf.HYBRID_SIZES, "linear_key_head_dim": 32, "linear_value_head_dim": 32}
    with tempfile.TemporaryDirectory() as tmp:
        mf.FIXTURES = Path(tmp)
        for family, maker in (("qwen3next", mf.make_qwen3next), ("qwen35moe", mf.make_qwen35moe)):
            name = f"{family}-sq"
            maker(name, sizes)
            for outtype in ("f32", "q8_0"):
                out = OUT / f"{name}-{outtype}.gguf"
                sys.argv = ["convert_hf_to_gguf.py", str(Path(tmp) / name), "--outtype", outtype, "--no-mtp",
                            "--outfile", str(out)]
                conv.main()
                print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
