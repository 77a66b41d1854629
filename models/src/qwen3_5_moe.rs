//! Qwen3.5 / Qwen3.6 MoE (`Qwen3_5MoeForCausalLM`, text model
//! `qwen3_5_moe_text`; and the hub's vision-language wrapper
//! `Qwen3_5MoeForConditionalGeneration`, whose language model is run on its
//! own — image input is not supported).
//!
//! The hybrid layout of [`crate::qwen3_next`], with these differences
//! (transformers `models/qwen3_5_moe/modeling_qwen3_5_moe.py`):
//! - DeltaNet projections are separate: `in_proj_qkv` (`[q | k | v]`),
//!   `in_proj_z`, `in_proj_b`, `in_proj_a`.
//! - The router always renormalizes its top-k:
//!   `router_top_value /= router_top_value.sum(dim=-1, keepdim=True)`;
//!   every layer is MoE.
//! - RoPE is multimodal (`mrope_section`), which for text alone — the same
//!   position on every axis — is plain RoPE over the rotary dimensions.
//! - The wrapper's `config.json` holds the text model's keys under
//!   `text_config`, and its checkpoint names tensors
//!   `model.language_model.*` (read as `model.*`, see
//!   [`charm_common::TensorFiles`]); `model.visual.*` is ignored.

use crate::config::{ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::family::Family;
use crate::gated_delta_net::ProjectionLayout;

/// Parses a Qwen3.5 MoE `config.json` (text model or wrapper).
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let text = raw.text_config();
    let raw = text.as_ref().unwrap_or(raw);
    let mut c = crate::qwen3_next::hybrid(raw, Family::Qwen35Moe, ProjectionLayout::Separate)?;
    c.norm_topk_prob = true;
    c.vision_ignored = text.is_some();
    c.moe_layers = vec![c.num_experts > 0; c.num_layers];
    Ok(c)
}
