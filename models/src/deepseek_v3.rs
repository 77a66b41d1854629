//! DeepSeek-V3 (`DeepseekV3ForCausalLM`: DeepSeek V3, R1, V3.1, and Kimi K2,
//! whose configs name the same architecture; and the text model of Kimi
//! K2.5's vision-language wrapper `KimiK25ForConditionalGeneration`, whose
//! `config.json` holds it under `text_config` and whose checkpoint names it
//! `language_model.*` — image input is not supported).
//!
//! Differs from its siblings (transformers `models/deepseek_v3/modeling_deepseek_v3.py`):
//! - Every layer's mixer is multi-head latent attention ([`crate::mla`]),
//!   with queries through `q_a_proj` / `q_b_proj` when `q_lora_rank` is
//!   set, RoPE on the `qk_rope_head_dim` slice in interleaved pairs
//!   (`rope_interleave`, default true), YaRN when configured.
//! - `if layer_idx >= config.first_k_dense_replace: self.mlp = DeepseekV3MoE(config) else: DeepseekV3MLP(config)`.
//! - The router is sigmoid with a selection-only `e_score_correction_bias`,
//!   group-limited top-k (`n_group`, `topk_group`), renormalized and
//!   scaled by `routed_scaling_factor` ([`crate::group_router`]).
//! - Shared experts are ungated: `hidden_states + self.shared_experts(residuals)`,
//!   `intermediate_size = moe_intermediate_size * n_shared_experts`.
//! - Multi-token-prediction layers (`num_nextn_predict_layers`, stored
//!   after the last decoder layer) are not loaded; they stay in the file
//!   for speculative decoding later.

use crate::config::{GroupRouting, MixerKind, MlaShape, ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a DeepSeek-V3 `config.json` (text model or Kimi K2.5's wrapper).
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let text = raw.text_config();
    let raw = text.as_ref().unwrap_or(raw);
    let mut c = mla_base(raw, Family::DeepseekV3)?;
    c.rope_interleave = raw.bool_opt(&["rope_interleave"])?.unwrap_or(true);
    deepseek_moe(raw, &mut c, 3)?;
    c.vision_ignored = text.is_some();
    Ok(c)
}

/// What the MLA families share: the latent attention shape (with
/// `head_dim` taken as the rope dimension, as transformers' configs do)
/// and every layer an MLA layer.
pub(crate) fn mla_base(raw: &RawConfig, family: Family) -> Result<ModelConfig, ModelError> {
    if raw.bool_opt(&["attention_bias"])?.unwrap_or(false) {
        return Err(raw.err("attention_bias = true is not supported for latent attention".into()));
    }
    let mut c = raw.base(family)?;
    let shape = MlaShape {
        q_lora_rank: raw.usize_opt(&["q_lora_rank"])?,
        kv_lora_rank: raw.usize(&["kv_lora_rank"])?,
        qk_nope_head_dim: raw.usize(&["qk_nope_head_dim"])?,
        qk_rope_head_dim: raw.usize(&["qk_rope_head_dim"])?,
        v_head_dim: raw.usize(&["v_head_dim"])?,
    };
    // self.head_dim = self.qk_rope_head_dim
    c.head_dim = shape.qk_rope_head_dim;
    c.rotary_dim = shape.qk_rope_head_dim;
    c.num_kv_heads = c.num_heads;
    c.mla = Some(shape);
    c.mixers = vec![MixerKind::Mla; c.num_layers];
    Ok(c)
}

/// The DeepSeek MoE: routed experts from `first_k_dense_replace` on
/// (`default_dense` when absent), the sigmoid group router, ungated
/// shared experts.
pub(crate) fn deepseek_moe(raw: &RawConfig, c: &mut ModelConfig, default_dense: usize) -> Result<(), ModelError> {
    c.num_experts = raw.usize(&["n_routed_experts", "num_local_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.moe_intermediate_size = raw.usize(&["moe_intermediate_size"])?;
    c.norm_topk_prob = raw.bool_opt(&["norm_topk_prob"])?.unwrap_or(true);
    let dense = raw.usize_opt(&["first_k_dense_replace"])?.unwrap_or(default_dense);
    c.moe_layers = (0..c.num_layers).map(|l| l >= dense && c.num_experts > 0).collect();
    let shared = raw.usize_opt(&["n_shared_experts"])?.unwrap_or(0);
    c.shared_expert_intermediate_size = (shared > 0).then_some(c.moe_intermediate_size * shared);
    c.shared_expert_gated = false;
    c.group_routing = Some(GroupRouting {
        groups: raw.usize_opt(&["n_group"])?.unwrap_or(1),
        topk_groups: raw.usize_opt(&["topk_group"])?.unwrap_or(1),
        scale: raw.f64_opt(&["routed_scaling_factor"])?.unwrap_or(1.0) as f32,
        bias: true,
    });
    if let Some(f) = raw.str_opt(&["scoring_func"]) {
        if f != "sigmoid" {
            return Err(raw.err(format!("scoring_func {f:?} is not supported (sigmoid)")));
        }
    }
    Ok(())
}
