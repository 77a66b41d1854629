//! Llama (`LlamaForCausalLM`): the dense decoder every family here extends.
//! No routed experts: every layer runs a dense SwiGLU MLP on the
//! coordinator, so a dense model is simply a model whose expert service is
//! never called.
//!
//! Follows transformers `models/llama/modeling_llama.py`: RMS norm, GQA
//! attention without QK-norm, rotate-half RoPE, SwiGLU MLP
//! (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`). `attention_bias` /
//! `mlp_bias` checkpoints (biases on every projection, including `o_proj`)
//! and non-default RoPE scaling other than linear are refused by name.

use crate::config::{ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a Llama `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::Llama)?;
    for key in ["attention_bias", "mlp_bias"] {
        if raw.bool_opt(&[key])?.unwrap_or(false) {
            return Err(raw.err(format!("{key}: true is not supported for Llama models")));
        }
    }
    c.moe_layers = vec![false; c.num_layers];
    if c.intermediate_size == 0 {
        return Err(raw.err("missing key intermediate_size".into()));
    }
    Ok(c)
}
