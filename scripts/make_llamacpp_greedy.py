#!/usr/bin/env python3
"""Record llama.cpp's own greedy output on GGUF fixtures made by its
converter: the square-head hybrids (`qwen3next-sq-*.gguf`,
`qwen35moe-sq-*.gguf`, from scripts/make_gguf_hybrid_fixtures.py; llama.cpp
0.3.36 refuses DeltaNet heads whose key and value widths differ) and the
DeepSeek lineage (`deepseekv3-*`, `glm4moe-*`, `minimax-m2-*`, and with
sparse attention `deepseekv32-*`, `glmmoedsa-*`, from
scripts/make_gguf_lineage_fixtures.py), F32 and Q8_0, and gpt-oss
(`gptoss-f32.gguf`, and `gptoss-mxfp4.gguf` with the hub's MXFP4 experts,
from scripts/make_gguf_gptoss_fixtures.py), and MiMo-V2-Flash
(`mimo-{f32,q8_0}.gguf`, from scripts/make_gguf_mimo_fixtures.py): the
second reference for their GGUF semantics (tests/tests/gguf_parity.rs measures charm against it).

llama.cpp runs gpt-oss with two constants of its own: the experts' GLU
clamp at 7 (it ignores the fixtures' `gpt-oss.swiglu_clamp_exp` of 1) and a
YaRN correction range truncated to whole dims; the test runs charm with the
same two for the comparison.

Run by hand (the output is committed; CI needs no llama.cpp):

    PYTHONPATH=$LLAMA_SRC/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py \\
        /work/llama-venv/bin/python scripts/make_llamacpp_greedy.py

with the venv that `scripts/bench_vs_llamacpp.sh` builds (`llama-cpp-python`
0.3.36 compiled for this CPU, numpy) and llama.cpp's `gguf-py` from the same
sdist on the path.

The fixtures (scripts/make_gguf_hybrid_fixtures.py) carry no tokenizer, and
llama.cpp refuses a file without one, so each is copied to a temporary file
with a made-up byte-level vocabulary added (`tokenizer.ggml.*` keys only:
every tensor and every other key is the fixture's own). Prompts are token
ids, so the vocabulary's strings never matter.

For each file, PROMPTS seeded prompts of random ids (lengths 8..40) are
prefilled in one batch and GEN tokens decoded greedily (argmax of the
logits llama.cpp returns, as `bench_llamacpp.py` does), with an f32 KV cache
(so the one attention layer's keys are not rounded to f16: the comparison
is of the file's semantics, not of a cache type). Recorded per step: the
chosen id, its logit and the runner-up's logit (the margin tells a test
which steps a last-bit difference could flip).

Writes tests/fixtures/gguf/llamacpp-greedy.json; with file names as arguments,
records just those into the existing one.
"""

import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import llama_cpp
from llama_cpp import Llama
from gguf import GGUFReader, GGUFWriter, GGUFValueType

ROOT = Path(__file__).resolve().parent.parent
GGUF_DIR = ROOT / "tests" / "fixtures" / "gguf"
FILES = [f"{f}-sq-{t}.gguf" for f in ("qwen3next", "qwen35moe") for t in ("f32", "q8_0")] + [
    # Not deepseekv3-noq: llama.cpp 0.3.36 requires `deepseek2.attention.q_lora_rank`,
    # which its converter writes only when there is one. Not glm4moelite: its
    # converter writes `leading_dense_block_count` 0 over a dense first layer,
    # and llama.cpp then looks for `blk.0.ffn_gate_inp.weight`.
    f"{f}-{t}.gguf" for f in ("deepseekv3", "glm4moe", "minimax-m2", "deepseekv32", "glmmoedsa")
    for t in ("f32", "q8_0")
] + ["gptoss-f32.gguf", "gptoss-mxfp4.gguf", "mimo-f32.gguf", "mimo-q8_0.gguf"]
PROMPTS = 8
GEN = 24


def byte_chars():
    """GPT-2's printable stand-ins for the 256 bytes (llama.cpp looks up the newline's)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def with_vocab(src, dst):
    """Copy of `src` with a `vocab_size`-token byte-level vocabulary added."""
    r = GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    vocab = int(r.fields[f"{arch}.vocab_size"].parts[-1][0])
    w = GGUFWriter(dst, arch)
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    tokens = byte_chars() + [f"<t{i}>" for i in range(256, vocab)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens[:vocab])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["a b"])  # llama.cpp wants at least one
    w.add_add_bos_token(False)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return vocab


def greedy(path, prompt, gen):
    llm = Llama(
        model_path=str(path),
        n_ctx=len(prompt) + gen + 8,
        n_batch=len(prompt),
        n_ubatch=len(prompt),
        n_threads=2,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        verbose=False,
    )
    n_vocab = llm.n_vocab()
    llm.eval(prompt)
    steps = []
    for _ in range(gen):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()
        order = np.argsort(-logits, kind="stable")
        tok = int(order[0])
        steps.append({"id": tok, "logit": float(logits[tok]), "runner_up": float(logits[order[1]])})
        llm.eval([tok])
    llm.close()
    return steps


def main():
    # Named files are (re)recorded into the existing output; none: every file, afresh.
    names = sys.argv[1:] or FILES
    dst = GGUF_DIR / "llamacpp-greedy.json"
    out = {"llama_cpp_python": llama_cpp.__version__, "kv_cache": "f32", "files": {}}
    if sys.argv[1:]:
        out = json.loads(dst.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            copy = Path(tmp) / name
            vocab = with_vocab(str(GGUF_DIR / name), str(copy))
            rng = random.Random(name)
            runs = []
            for _ in range(PROMPTS):
                prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(8, 41))]
                runs.append({"prompt_ids": prompt, "steps": greedy(copy, prompt, GEN)})
            out["files"][name] = runs
            print(f"{name}: {len(runs)} prompts x {GEN} tokens", file=sys.stderr)
    dst.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {dst.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
