//! GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`): GLM's MoE with DeepSeek's
//! latent attention.
//!
//! Differs from [`crate::deepseek_v3`] (transformers
//! `models/glm4_moe_lite/modeling_glm4_moe_lite.py`, whose attention and
//! router are DeepSeek-V3's line for line):
//! - Dense or sparse MLP per layer from `mlp_layer_types`:
//!   `self.mlp = Glm4MoeLiteMoE(config) if config.mlp_layer_types[layer_idx] == "sparse" else Glm4MoeLiteMLP(config)`
//!   (absent: dense before `first_k_dense_replace`, default 1).

use crate::config::{ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a GLM-4.7-Flash `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = crate::deepseek_v3::mla_base(raw, Family::Glm4MoeLite)?;
    c.rope_interleave = raw.bool_opt(&["rope_interleave"])?.unwrap_or(true);
    crate::deepseek_v3::deepseek_moe(raw, &mut c, 1)?;
    mlp_layer_types(raw, &mut c)?;
    Ok(c)
}

/// Dense or sparse MLP per layer from `mlp_layer_types`, when given (else
/// what `first_k_dense_replace` set).
pub(crate) fn mlp_layer_types(raw: &RawConfig, c: &mut ModelConfig) -> Result<(), ModelError> {
    if let Some(types) = raw.lookup(&["mlp_layer_types"]).and_then(serde_json::Value::as_array) {
        if types.len() != c.num_layers {
            return Err(raw.err(format!(
                "mlp_layer_types has {} entries for {} layers",
                types.len(),
                c.num_layers
            )));
        }
        c.moe_layers = types
            .iter()
            .map(|t| match t.as_str() {
                Some("sparse") => Ok(c.num_experts > 0),
                Some("dense") => Ok(false),
                _ => Err(raw.err(format!("mlp_layer_types entry {t} is neither \"dense\" nor \"sparse\""))),
            })
            .collect::<Result<_, _>>()?;
    }
    Ok(())
}
