//! Qwen2-MoE (`Qwen2MoeForCausalLM`).
//!
//! Differs from its siblings (transformers `models/qwen2_moe/modeling_qwen2_moe.py`):
//! - q, k and v projections carry biases (o does not); no QK-norm.
//! - A shared expert runs on every token beside the routed ones, scaled by
//!   a sigmoid gate:
//!   `shared_expert_output = F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output`.
//! - Router: softmax, top-k, renormalized only when `norm_topk_prob`.
//! - `mlp_only_layers` / `decoder_sparse_step` as in Qwen3-MoE.

use crate::config::{ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a Qwen2-MoE `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::Qwen2Moe)?;
    c.qkv_bias = raw.bool_opt(&["qkv_bias"])?.unwrap_or(true);
    c.num_experts = raw.usize(&["num_experts", "num_local_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.norm_topk_prob = raw.bool_opt(&["norm_topk_prob"])?.unwrap_or(false);
    c.moe_intermediate_size = raw.usize(&["moe_intermediate_size"])?;
    c.shared_expert_intermediate_size = raw.usize_opt(&["shared_expert_intermediate_size"])?.filter(|&n| n > 0);
    c.moe_layers = raw.qwen_moe_layers(c.num_layers, c.num_experts)?;
    c.sliding_window = raw.qwen_sliding_windows(c.num_layers)?;
    Ok(c)
}
