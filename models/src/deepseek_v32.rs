//! DeepSeek-V3.2 (`DeepseekV32ForCausalLM`) and GLM-5.x
//! (`GlmMoeDsaForCausalLM`): DeepSeek-V3's latent attention and MoE with
//! DeepSeek Sparse Attention ([`crate::dsa_indexer`]).
//!
//! Differs from [`crate::deepseek_v3`] (transformers
//! `models/deepseek_v32/modeling_deepseek_v32.py`,
//! `models/glm_moe_dsa/modeling_glm_moe_dsa.py`):
//! - Each latent attention layer has an indexer that scores every earlier
//!   key and keeps the `index_topk` best:
//!   `attention_mask = attention_mask.masked_fill(index_mask, torch.finfo(hidden_states.dtype).min)`.
//! - Queries always go through `q_a_proj` / `q_b_proj` (the indexer reads
//!   `q_resid`); RoPE on the attention's rope slice is always interleaved.
//! - The indexer's own RoPE: halves for DeepSeek-V3.2, interleaved pairs
//!   for GLM-5 (`apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)`).
//! - GLM-5: `self.indexer = None if self.skip_topk else XIndexer(config, layer_idx)`:
//!   `"shared"` layers of `indexer_types` reuse the previous indexer's
//!   selection (`index_topk_pattern`, or `index_topk_freq` /
//!   `index_skip_topk_offset`, when `indexer_types` is absent).
//! - Dense or sparse MLP per layer from `mlp_layer_types` (else the first
//!   `first_k_dense_replace`, default 3, are dense).
//! - Multi-token-prediction layers are not loaded.

use crate::config::{Dsa, ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::family::Family;

/// Parses a DeepSeek-V3.2 or GLM-5 `config.json`.
pub fn parse(raw: &RawConfig, family: Family) -> Result<ModelConfig, ModelError> {
    let glm = family == Family::GlmMoeDsa;
    let mut c = crate::deepseek_v3::mla_base(raw, family)?;
    c.rope_interleave = true;
    crate::deepseek_v3::deepseek_moe(raw, &mut c, 3)?;
    crate::glm4_moe_lite::mlp_layer_types(raw, &mut c)?;
    let shared = if glm {
        indexer_types(raw, c.num_layers)?
    } else {
        vec![false; c.num_layers]
    };
    c.dsa = Some(Dsa {
        heads: raw.usize_opt(&["index_n_heads"])?.unwrap_or(if glm { 32 } else { 64 }),
        head_dim: raw.usize_opt(&["index_head_dim"])?.unwrap_or(128),
        topk: raw.usize_opt(&["index_topk"])?.unwrap_or(2048),
        shared,
        rope_interleave: glm,
    });
    Ok(c)
}

/// GLM-5's per-layer indexer modes: `true` for `"shared"`.
fn indexer_types(raw: &RawConfig, layers: usize) -> Result<Vec<bool>, ModelError> {
    let mode = |s: &str| match s {
        "full" | "F" => Ok(false),
        "shared" | "S" => Ok(true),
        other => Err(raw.err(format!("indexer type {other:?} is neither \"full\" nor \"shared\""))),
    };
    if let Some(list) = raw.lookup(&["indexer_types"]).and_then(serde_json::Value::as_array) {
        return list.iter().map(|v| mode(v.as_str().unwrap_or(""))).collect();
    }
    match raw.lookup(&["index_topk_pattern"]) {
        Some(serde_json::Value::String(p)) => return p.chars().map(|ch| mode(&ch.to_string())).collect(),
        Some(serde_json::Value::Array(list)) => return list.iter().map(|v| mode(v.as_str().unwrap_or(""))).collect(),
        _ => {}
    }
    // "full" if (max(i - offset + 1, 0) % freq) == 0 else "shared"
    let freq = raw.usize_opt(&["index_topk_freq"])?.unwrap_or(1).max(1);
    let offset = raw.usize_opt(&["index_skip_topk_offset"])?.unwrap_or(2);
    Ok((0..layers)
        .map(|i| (i + 1).saturating_sub(offset) % freq != 0)
        .collect())
}
