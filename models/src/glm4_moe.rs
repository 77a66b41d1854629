//! GLM-4.5 / 4.6 / 4.7 and 4.5-Air (`Glm4MoeForCausalLM`).
//!
//! Differs from its siblings (transformers `models/glm4_moe/modeling_glm4_moe.py`):
//! - q, k and v projections carry biases when `attention_bias` (o does not).
//! - Optional per-head QK-norm before RoPE: `if self.use_qk_norm: query_states = self.q_norm(query_states)`.
//! - RoPE on the first `head_dim * partial_rotary_factor` dimensions of each
//!   head (`kwargs.setdefault("partial_rotary_factor", 0.5)`), halves layout.
//! - The DeepSeek MoE ([`crate::deepseek_v3`]): dense layers before
//!   `first_k_dense_replace` (default 1), the sigmoid group router, ungated
//!   shared experts. Multi-token-prediction layers are not loaded.

use crate::config::{ModelConfig, QkNorm, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a GLM-4.5-style MoE `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::Glm4Moe)?;
    c.qkv_bias = raw.bool_opt(&["attention_bias"])?.unwrap_or(false);
    if raw.bool_opt(&["use_qk_norm"])?.unwrap_or(false) {
        c.qk_norm = QkNorm::PerHead;
    }
    c.rotary_dim = partial_rotary_dim(raw, c.head_dim, 0.5)?;
    crate::deepseek_v3::deepseek_moe(raw, &mut c, 1)?;
    Ok(c)
}

/// `dim = int(head_dim * partial_rotary_factor)`, the factor from
/// `rope_parameters` / the top level (or `default`).
pub(crate) fn partial_rotary_dim(raw: &RawConfig, head_dim: usize, default: f64) -> Result<usize, ModelError> {
    let factor = raw
        .f64_opt(&["rope_parameters.partial_rotary_factor", "partial_rotary_factor"])?
        .unwrap_or(default);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(raw.err(format!("partial_rotary_factor {factor} must be in (0, 1]")));
    }
    Ok((head_dim as f64 * factor) as usize)
}
