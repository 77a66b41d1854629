//! OLMoE (`OlmoeForCausalLM`, allenai): a Llama-style decoder whose every
//! layer is MoE.
//!
//! Differs from its siblings in two places (transformers
//! `models/olmoe/modeling_olmoe.py`):
//! - QK-norm over the *whole* projection: `q_norm` is `[heads * head_dim]`,
//!   `k_norm` is `[kv_heads * head_dim]`, applied before the heads are split
//!   and before RoPE: `query_states = self.q_norm(self.q_proj(hidden_states))`.
//! - Router: softmax over all experts, top-k, and no renormalization unless
//!   `norm_topk_prob` says so (OLMoE-1B-7B ships `false`).
//! - Optional `clip_qkv` clamps q, k, v after the norms.

use crate::config::{ModelConfig, QkNorm, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses an OLMoE `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::Olmoe)?;
    c.qk_norm = QkNorm::Full;
    c.qkv_bias = raw.bool_opt(&["attention_bias"])?.unwrap_or(false);
    c.clip_qkv = raw.f64_opt(&["clip_qkv"])?.map(|v| v as f32);
    c.num_experts = raw.usize(&["num_experts", "num_local_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.norm_topk_prob = raw.bool_opt(&["norm_topk_prob"])?.unwrap_or(false);
    c.moe_intermediate_size = raw.usize(&["intermediate_size"])?;
    Ok(c)
}
