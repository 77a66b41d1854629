//! Mixtral (`MixtralForCausalLM`, Mistral AI): Llama attention without
//! QK-norm, every layer MoE.
//!
//! Differs from its siblings (transformers `models/mixtral/modeling_mixtral.py`):
//! - Router and experts live under `block_sparse_moe`, experts as `w1`
//!   (gate), `w3` (up), `w2` (down).
//! - Always renormalizes the top-k weights:
//!   `routing_weights /= routing_weights.sum(dim=-1, keepdim=True)`.
//! - An optional `sliding_window` applies to every layer.

use crate::config::{ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::family::{Family, MoeNames};

/// Mixtral's router / expert tensor names.
pub const MOE_NAMES: MoeNames = MoeNames {
    block: "block_sparse_moe",
    router: "gate",
    proj: ["w1", "w3", "w2"],
    router_bias: "e_score_correction_bias",
};

/// Parses a Mixtral `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::Mixtral)?;
    c.num_experts = raw.usize(&["num_local_experts", "num_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.norm_topk_prob = true;
    c.moe_intermediate_size = raw.usize(&["intermediate_size"])?;
    c.sliding_window = match raw.lookup(&["layer_types"]) {
        Some(_) => raw.qwen_sliding_windows(c.num_layers)?,
        None => vec![raw.usize_opt(&["sliding_window"])?.filter(|&w| w > 0); c.num_layers],
    };
    Ok(c)
}
