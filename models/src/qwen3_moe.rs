//! Qwen3-MoE (`Qwen3MoeForCausalLM`).
//!
//! Differs from its siblings (transformers `models/qwen3_moe/modeling_qwen3_moe.py`):
//! - Per-head QK-norm: `q_norm` / `k_norm` are `[head_dim]`, applied to each
//!   head after the split and before RoPE:
//!   `query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape))`.
//! - `head_dim` is its own key and may differ from `hidden / heads`.
//! - Router: softmax, top-k, renormalized when `norm_topk_prob`.
//! - `mlp_only_layers` and `decoder_sparse_step` make some layers dense MLPs
//!   of width `intermediate_size`; experts are `moe_intermediate_size` wide.

use crate::config::{ModelConfig, QkNorm, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a Qwen3-MoE `config.json` (hub or transformers 5 spelling).
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::Qwen3Moe)?;
    c.qk_norm = QkNorm::PerHead;
    c.qkv_bias = raw.bool_opt(&["attention_bias"])?.unwrap_or(false);
    c.num_experts = raw.usize(&["num_experts", "num_local_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.norm_topk_prob = raw.bool_opt(&["norm_topk_prob"])?.unwrap_or(false);
    c.moe_intermediate_size = raw.usize(&["moe_intermediate_size"])?;
    c.moe_layers = raw.qwen_moe_layers(c.num_layers, c.num_experts)?;
    c.sliding_window = raw.qwen_sliding_windows(c.num_layers)?;
    Ok(c)
}
