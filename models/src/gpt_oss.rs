//! gpt-oss (`GptOssForCausalLM`, OpenAI).
//!
//! Differs from its siblings (transformers `models/gpt_oss/modeling_gpt_oss.py`):
//! - Layers alternate sliding-window and full attention by `layer_types`
//!   (`"sliding_attention"` keeps the last `sliding_window` keys, 128 in the
//!   released models); q/k/v and `o_proj` carry biases (`attention_bias`).
//! - Every attention layer has a learned sink logit per head, an extra
//!   softmax entry that is dropped after the softmax:
//!   `combined_logits = torch.cat([attn_weights, sinks], dim=-1)` …
//!   `scores = probs[..., :-1]  # we drop the sink here`.
//! - YaRN rope (`truncate: false` in released configs).
//! - The router adds a bias, takes the top-k logits and softmaxes those k:
//!   `router_logits = F.linear(hidden_states, self.weight, self.bias)`,
//!   `router_top_value, router_indices = torch.topk(router_logits, self.top_k, dim=-1)`,
//!   `router_top_value = torch.nn.functional.softmax(router_top_value, dim=1)`.
//! - Experts are stored fused (`mlp.experts.gate_up_proj` `[E, H, 2I]` with
//!   gate and up in alternate columns, `down_proj` `[E, I, H]`, biases
//!   beside them, or as MXFP4 `*_blocks` / `*_scales`); the weight reader
//!   shows them per expert ([`charm_common::TensorFiles`]). Their GLU is
//!   clamped, with `(up + 1)` and `swiglu_alpha` (1.702) ([`GluAct::Clamped`]).

use crate::config::{ModelConfig, RawConfig, Yarn};
use crate::error::ModelError;
use crate::family::Family;
use crate::ffn::GluAct;

/// `swiglu_alpha`'s default (the sigmoid gain of the clamped GLU).
pub const DEFAULT_ALPHA: f64 = 1.702;
/// `swiglu_limit`'s default.
pub const DEFAULT_LIMIT: f64 = 7.0;

/// Parses a gpt-oss `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::GptOss)?;
    // GptOssConfig's defaults: default_theta = 150000.0, rms_norm_eps 1e-5,
    // and YaRN (factor 32 over 4096, beta 32 / 1, truncate false) when the
    // config names no rope parameters at all.
    if raw.lookup(&["rope_parameters.rope_theta", "rope_theta"]).is_none() {
        c.rope_theta = 150000.0;
    }
    if raw.lookup(&["rms_norm_eps"]).is_none() {
        c.rms_norm_eps = 1e-5;
    }
    if raw.lookup(&["rope_parameters.rope_type", "rope_scaling"]).is_none() {
        c.rope_yarn = Some(Yarn {
            factor: 32.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: Yarn::get_mscale(32.0, 1.0),
            mscale_all_dim: 0.0,
            truncate: false,
        });
    }
    let bias = raw.bool_opt(&["attention_bias"])?.unwrap_or(true);
    c.qkv_bias = bias;
    c.o_proj_bias = bias;
    c.attn_sinks = vec![true; c.num_layers];
    c.sliding_window = match raw.lookup(&["layer_types"]) {
        Some(_) => raw.qwen_sliding_windows(c.num_layers)?,
        // "sliding_attention" if bool((i + 1) % 2) else "full_attention"
        None => {
            let w = raw.usize_opt(&["sliding_window"])?.filter(|&w| w > 0);
            (0..c.num_layers)
                .map(|i| if (i + 1) % 2 == 1 { w } else { None })
                .collect()
        }
    };
    c.num_experts = raw.usize(&["num_local_experts", "num_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok", "experts_per_token"])?;
    c.moe_intermediate_size = raw.usize(&["intermediate_size"])?;
    c.router_bias = true;
    c.router_softmax_after_topk = true;
    c.expert_bias = true;
    let limit = raw.f64_opt(&["swiglu_limit"])?.unwrap_or(DEFAULT_LIMIT);
    if !(limit > 0.0 && limit.is_finite()) {
        return Err(raw.err(format!("swiglu_limit {limit} must be a positive number")));
    }
    let alpha = raw.f64_opt(&["swiglu_alpha"])?.unwrap_or(DEFAULT_ALPHA);
    c.expert_act = GluAct::Clamped {
        alpha: alpha as f32,
        limit: limit as f32,
    };
    Ok(c)
}
