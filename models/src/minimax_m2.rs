//! MiniMax-M2 (`MiniMaxM2ForCausalLM`).
//!
//! Differs from its siblings (transformers `models/minimax_m2/modeling_minimax_m2.py`):
//! - QK-norm over the whole projection, before the split into heads:
//!   `query_states = self.q_norm(self.q_proj(hidden_states))` (`[heads * head_dim]`).
//! - Partial RoPE: released configs give `rotary_dim`
//!   (`kwargs.setdefault("partial_rotary_factor", rotary_dim / self.head_dim)`).
//! - Mixtral's tensor names (`block_sparse_moe`, experts `w1` / `w3` / `w2`),
//!   with the selection bias on the block:
//!   `block_sparse_moe.e_score_correction_bias`.
//! - Sigmoid router without groups or scaling, always renormalized:
//!   `top_k_weights /= top_k_weights.sum(dim=-1, keepdim=True)` (charm's
//!   group router with one group, adding its 1e-20 to a sum near 1).
//!   Every layer is MoE; no shared expert.

use crate::config::{GroupRouting, ModelConfig, QkNorm, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a MiniMax-M2 `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::MiniMaxM2)?;
    c.qk_norm = QkNorm::Full;
    c.rotary_dim = match raw.usize_opt(&["rotary_dim"])? {
        Some(d) => d,
        None => crate::glm4_moe::partial_rotary_dim(raw, c.head_dim, 1.0)?,
    };
    c.num_experts = raw.usize(&["num_local_experts", "num_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.moe_intermediate_size = raw.usize(&["intermediate_size"])?;
    c.norm_topk_prob = true;
    c.moe_layers = vec![c.num_experts > 0; c.num_layers];
    c.group_routing = Some(GroupRouting {
        groups: 1,
        topk_groups: 1,
        scale: 1.0,
        bias: true,
    });
    if let Some(f) = raw.str_opt(&["scoring_func"]) {
        if f != "sigmoid" {
            return Err(raw.err(format!("scoring_func {f:?} is not supported (sigmoid)")));
        }
    }
    Ok(c)
}
