"""Convert the MiMo-V2-Flash GGUF fixture to GGUF with llama.cpp's own
converter (`convert_hf_to_gguf.py`, `conversion/mimo.py`), unchanged but
for the vocabulary.

Run by hand (the outputs are committed; CI needs no Python), with the
llama.cpp source of the llama-cpp-python 0.3.36 sdist (as
scripts/bench_vs_llamacpp.sh unpacks it into $LLAMA_SRC) and the venv of
make_fixtures.py (torch, transformers, safetensors, numpy):

    /work/venv/bin/python scripts/make_gguf_mimo_fixtures.py \\
        /work/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp

Writes into tests/fixtures/gguf/ (arch `mimo2`):

  mimo-f32.gguf    tests/fixtures/mimo-gguf, `--outtype f32 --no-mtp`
  mimo-q8_0.gguf   tests/fixtures/mimo-gguf, `--outtype q8_0 --no-mtp`

The converter reads the hub's own config spelling (the one released
checkpoints ship with their custom code), not transformers': per-layer
`hybrid_layer_pattern` (1 = sliding), `swa_num_key_value_heads`,
`swa_head_dim`, `swa_num_attention_heads`, `swa_v_head_dim`,
`topk_method`, `rope_theta` / `swa_rope_theta` / `partial_rotary_factor`
and `layernorm_epsilon`. So the fixture is copied to a temporary
directory with its transformers config rewritten in that spelling (the
same model: sliding layers with twice the KV heads, their own rope theta,
the window as transformers applies it). What the file then says, and what
charm reads (models/src/gguf/mimo.rs): `attention.head_count_kv` one per
layer, `attention.sliding_window` and `attention.sliding_window_pattern`,
`rope.freq_base` / `rope.freq_base_swa`, `rope.dimension_count`,
`attention.key_length` / `value_length`, `attention.value_scale`, the
expert groups; `attention_sink_bias` becomes `attn_sinks.weight` (sliding
layers only), the router bias `exp_probs_b.bias`. It records no routed
scaling factor (llama.cpp applies none), which is why the converted
fixture (`mimo-gguf`) has 1.0.

The fixture has no tokenizer, so the converter's `set_vocab` is replaced
by one that writes `mimo2.vocab_size` only.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "gguf"
SOURCE = FIX / "mimo-gguf"
# (outtype, output)
FILES = (("f32", "mimo-f32.gguf"), ("q8_0", "mimo-q8_0.gguf"))


def hub_config(cfg):
    """The transformers config of the fixture in the hub's spelling."""
    sliding = [1 if t == "sliding_attention" else 0 for t in cfg["layer_types"]]
    rope = cfg["rope_parameters"]
    full, swa = rope["full_attention"], rope["sliding_attention"]
    if full["partial_rotary_factor"] != swa["partial_rotary_factor"]:
        sys.exit("the hub spelling has one partial_rotary_factor")
    # Without `model_type` transformers' AutoConfig cannot load it, and the
    # converter reads config.json as written (as for a checkpoint that
    # needs remote code); with it, transformers 5 would fold the rope keys
    # back into `rope_parameters`, which the converter does not read.
    drop = ("layer_types", "rope_parameters", "mlp_layer_types", "model_type")
    hub = {k: v for k, v in cfg.items() if k not in drop}
    hub.update(
        hybrid_layer_pattern=sliding,
        swa_num_key_value_heads=2 * cfg["num_key_value_heads"],
        swa_head_dim=cfg["head_dim"],
        swa_num_attention_heads=cfg["num_attention_heads"],
        swa_v_head_dim=cfg["v_head_dim"],
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        rope_theta=full["rope_theta"],
        swa_rope_theta=swa["rope_theta"],
        partial_rotary_factor=full["partial_rotary_factor"],
        layernorm_epsilon=cfg["rms_norm_eps"],
    )
    return hub


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} LLAMA_CPP_DIR (holding convert_hf_to_gguf.py)")
    llama = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(llama))
    import convert_hf_to_gguf as conv  # noqa: E402 (imports llama.cpp's gguf-py)
    from conversion.mimo import MimoV2Model  # noqa: E402

    def set_vocab(self):
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    MimoV2Model.set_vocab = set_vocab
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "mimo-hub"
        src.mkdir()
        for f in ("model.safetensors", "generation_config.json"):
            shutil.copy(SOURCE / f, src / f)
        cfg = json.loads((SOURCE / "config.json").read_text())
        (src / "config.json").write_text(json.dumps(hub_config(cfg), indent=1) + "\n")
        for outtype, name in FILES:
            out = OUT / name
            sys.argv = ["convert_hf_to_gguf.py", str(src), "--outtype", outtype, "--no-mtp", "--outfile", str(out)]
            conv.main()
            print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
