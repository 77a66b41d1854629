//! Qwen3-Next (`Qwen3NextForCausalLM`), and the hybrid layout it shares with
//! Qwen3.5 ([`crate::qwen3_5_moe`]).
//!
//! Differs from its siblings (transformers `models/qwen3_next/modeling_qwen3_next.py`):
//! - Layers alternate token mixers by `layer_types` (or, absent, every
//!   `full_attention_interval`-th layer is full attention):
//!   `"linear_attention" if bool((i + 1) % interval_pattern) else "full_attention"`.
//!   Linear layers are gated DeltaNet ([`crate::gated_delta_net`]) with
//!   grouped `in_proj_qkvz` / `in_proj_ba` projections.
//! - Full attention is gated: `q_proj` gives `[q | gate]` per head and
//!   `attn_output = attn_output * torch.sigmoid(gate)`; per-head QK-norm;
//!   RoPE on the first `head_dim * partial_rotary_factor` dimensions
//!   (`kwargs.setdefault("partial_rotary_factor", 0.25)`).
//! - Every RMSNorm but DeltaNet's gated one is zero-centred:
//!   `output = output * (1.0 + self.weight.float())`.
//! - MoE as Qwen2-MoE: softmax top-k (renormalized when `norm_topk_prob`,
//!   default true), a shared expert behind a sigmoid gate;
//!   `mlp_only_layers` / `decoder_sparse_step` as in Qwen3-MoE.

use crate::config::{MixerKind, ModelConfig, QkNorm, RawConfig};
use crate::error::ModelError;
use crate::family::Family;
use crate::gated_delta_net::{DeltaNetShape, ProjectionLayout};

/// Parses a Qwen3-Next `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = hybrid(raw, Family::Qwen3Next, ProjectionLayout::Grouped)?;
    c.norm_topk_prob = raw.bool_opt(&["norm_topk_prob"])?.unwrap_or(true);
    c.moe_layers = raw.qwen_moe_layers(c.num_layers, c.num_experts)?;
    Ok(c)
}

/// What Qwen3-Next and Qwen3.5 share: mixers by layer type, the DeltaNet
/// shape, gated partial-rotary attention with per-head QK-norm,
/// zero-centred norms, and a routed MoE with a gated shared expert.
pub(crate) fn hybrid(raw: &RawConfig, family: Family, layout: ProjectionLayout) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(family)?;
    if raw.bool_opt(&["attention_bias"])?.unwrap_or(false) {
        return Err(raw.err("attention_bias = true is not supported for this family".into()));
    }
    c.qk_norm = QkNorm::PerHead;
    c.attn_output_gate = true;
    c.zero_centred_norms = true;
    let factor = raw
        .f64_opt(&["rope_parameters.partial_rotary_factor", "partial_rotary_factor"])?
        .unwrap_or(0.25);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(raw.err(format!("partial_rotary_factor {factor} must be in (0, 1]")));
    }
    // dim = int(head_dim * partial_rotary_factor)
    c.rotary_dim = (c.head_dim as f64 * factor) as usize;
    c.num_experts = raw.usize(&["num_experts", "num_local_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.moe_intermediate_size = raw.usize(&["moe_intermediate_size"])?;
    c.shared_expert_intermediate_size = raw.usize_opt(&["shared_expert_intermediate_size"])?.filter(|&n| n > 0);
    c.mixers = mixers(raw, c.num_layers)?;
    c.delta_net = Some(DeltaNetShape {
        k_heads: raw.usize(&["linear_num_key_heads"])?,
        v_heads: raw.usize(&["linear_num_value_heads"])?,
        k_head_dim: raw.usize(&["linear_key_head_dim"])?,
        v_head_dim: raw.usize(&["linear_value_head_dim"])?,
        conv_kernel: raw.usize(&["linear_conv_kernel_dim"])?,
        layout,
    });
    Ok(c)
}

/// Each layer's mixer from `layer_types`, or from `full_attention_interval`
/// (default 4) when the list is absent.
fn mixers(raw: &RawConfig, num_layers: usize) -> Result<Vec<MixerKind>, ModelError> {
    if let Some(types) = raw.lookup(&["layer_types"]).and_then(serde_json::Value::as_array) {
        if types.len() != num_layers {
            return Err(raw.err(format!(
                "layer_types has {} entries for {num_layers} layers",
                types.len()
            )));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("linear_attention") => Ok(MixerKind::GatedDeltaNet),
                Some("full_attention") => Ok(MixerKind::Attention),
                _ => Err(raw.err(format!(
                    "layer_types entry {t} is neither \"linear_attention\" nor \"full_attention\""
                ))),
            })
            .collect();
    }
    let interval = raw.usize_opt(&["full_attention_interval"])?.unwrap_or(4);
    if interval == 0 {
        return Err(raw.err("full_attention_interval must be at least 1".into()));
    }
    Ok((0..num_layers)
        .map(|i| {
            if (i + 1) % interval != 0 {
                MixerKind::GatedDeltaNet
            } else {
                MixerKind::Attention
            }
        })
        .collect())
}
