//! GGUF files of the DeepSeek lineage: `deepseek2` (DeepSeek-V3 / R1 / Kimi K2, and
//! GLM-4.7-Flash, which the converter writes as `deepseek2` too), `glm4moe`
//! (GLM-4.5 / 4.6 / 4.7) and `minimax-m2`. The converter splits MLA's
//! `kv_b_proj` into `attn_k_b` (each head's key part, transposed) and
//! `attn_v_b`, which latent attention takes per head as stored
//! ([`charm_common::WeightSource::mla_heads`]: a decode step reads their quantized bytes);
//! [`super::GgufModel`] joins them back into `kv_b_proj` as f32 for whoever
//! asks for that tensor by name. It
//! writes YaRN's `mscale_all_dim` as `rope.scaling.yarn_log_multiplier =
//! 0.1 · mscale_all_dim` and no `mscale`: every released config has
//! `mscale == mscale_all_dim`, whose attention factor is 1, and a file that
//! says otherwise through `yarn_attn_factor` is followed. DeepSeek-V2's
//! softmax routing (no selection bias) is refused.
//!
//! Sparse attention: `deepseek32` (DeepSeek-V3.2) and `glm-dsa` (GLM-5.x)
//! are `deepseek2` plus the indexer (`blk.N.indexer.{attn_q_b, attn_k,
//! k_norm, proj}`, `attention.indexer.{head_count, key_length, top_k}`) and,
//! for `glm-dsa`, `attention.indexer.types` (true where a layer runs its
//! own indexer). A `glm-dsa` file without the types follows llama.cpp: GLM-5
//! and 5.1 (context below 1M) run an indexer on every layer, GLM-5.2 on the
//! first two and every fourth from layer 2.

use charm_common::gguf::{GgufFile, MetaValue};

use super::bad;
use crate::config::{Dsa, GroupRouting, MixerKind, MlaShape, ModelConfig, QkNorm};
use crate::error::ModelError;
use crate::family::Family;

/// The DeepSeek lineage's parts of the config: MLA's shape (`deepseek2`),
/// partial rotary and QK-norm (`glm4moe`, `minimax-m2`), and the sigmoid
/// router with its selection bias (`exp_probs_b`), group limit and scale,
/// with ungated shared experts.
pub(super) fn lineage(f: &GgufFile, arch: &str, c: &mut ModelConfig) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let opt_u = |k: &str| f.meta(&key(k)).and_then(MetaValue::as_u64).map(|v| v as usize);
    let req_u = |k: &str| opt_u(k).ok_or_else(|| bad(f, format!("missing or non-integer metadata {}", key(k))));
    let rope = opt_u("rope.dimension_count");
    let has = |t: &str| f.tensor(t).is_some();
    match c.family {
        Family::DeepseekV3 | Family::DeepseekV32 | Family::GlmMoeDsa => {
            let rope = rope.ok_or_else(|| bad(f, format!("missing metadata {}", key("rope.dimension_count"))))?;
            // MQA-converted files give the per-head sizes as `*_mla`;
            // older ones as the plain lengths.
            let qk = opt_u("attention.key_length_mla").map_or_else(|| req_u("attention.key_length"), Ok)?;
            let v = opt_u("attention.value_length_mla").map_or_else(|| req_u("attention.value_length"), Ok)?;
            if qk <= rope {
                return Err(bad(
                    f,
                    format!("key length {qk} leaves nothing beside the {rope} rotary dims"),
                ));
            }
            c.mla = Some(MlaShape {
                q_lora_rank: opt_u("attention.q_lora_rank").filter(|&r| r > 0),
                kv_lora_rank: req_u("attention.kv_lora_rank")?,
                qk_nope_head_dim: qk - rope,
                qk_rope_head_dim: rope,
                v_head_dim: v,
            });
            c.head_dim = rope;
            c.rotary_dim = rope;
            c.num_kv_heads = c.num_heads;
            c.mixers = vec![MixerKind::Mla; c.num_layers];
            // llama.cpp's `deepseek2` rotates adjacent pairs.
            c.rope_interleave = true;
            c.qk_norm = QkNorm::None;
        }
        Family::Glm4Moe => {
            c.rotary_dim = rope.unwrap_or(c.head_dim / 2);
            if has("blk.0.attn_q_norm.weight") {
                c.qk_norm = QkNorm::PerHead;
            }
        }
        _ => {
            c.rotary_dim = rope.unwrap_or(c.head_dim);
            c.qk_norm = QkNorm::Full;
        }
    }
    // expert_gating_func: 1 softmax, 2 sigmoid.
    let gating = opt_u("expert_gating_func");
    let biased = (0..c.num_layers).any(|l| has(&format!("blk.{l}.exp_probs_b.bias")));
    if gating.is_some_and(|g| g != 2) || (gating.is_none() && !biased && c.num_experts > 0) {
        return Err(bad(
            f,
            format!("{arch} routing other than sigmoid with a selection bias (DeepSeek-V2's softmax) is not supported"),
        ));
    }
    let minimax = c.family == Family::MiniMaxM2;
    c.group_routing = Some(GroupRouting {
        groups: if minimax {
            1
        } else {
            opt_u("expert_group_count").unwrap_or(1).max(1)
        },
        topk_groups: if minimax {
            1
        } else {
            opt_u("expert_group_used_count").unwrap_or(1).max(1)
        },
        scale: if minimax {
            1.0
        } else {
            f.meta(&key("expert_weights_scale"))
                .and_then(MetaValue::as_f64)
                .unwrap_or(1.0) as f32
        },
        bias: biased,
    });
    // MiniMax-M2 always renormalizes; the others as written (the converter
    // writes `expert_weights_norm` only when true for `deepseek2`).
    c.norm_topk_prob = minimax
        || f.meta(&key("expert_weights_norm"))
            .and_then(MetaValue::as_bool)
            .unwrap_or(false);
    let shared = opt_u("expert_shared_count").unwrap_or(0);
    c.shared_expert_intermediate_size = (shared > 0).then_some(c.moe_intermediate_size * shared);
    c.shared_expert_gated = false;
    Ok(())
}

/// DeepSeek Sparse Attention's indexer from `attention.indexer.*`.
pub(super) fn sparse_attention(f: &GgufFile, arch: &str, c: &ModelConfig) -> Result<Dsa, ModelError> {
    let key = |k: &str| format!("{arch}.attention.indexer.{k}");
    let req_u = |k: &str| {
        f.meta(&key(k))
            .and_then(MetaValue::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| bad(f, format!("missing or non-integer metadata {}", key(k))))
    };
    let glm = c.family == Family::GlmMoeDsa;
    let n = c.num_layers;
    let shared = match f.meta(&key("types")).map(MetaValue::as_array) {
        None if !glm => vec![false; n],
        // llama.cpp's defaults: GLM-5 / 5.1 full everywhere, GLM-5.2 (1M context) the first two and every fourth from 2.
        None if c.max_position_embeddings < 1 << 20 => vec![false; n],
        None => (0..n).map(|l| l >= 2 && (l - 2) % 4 != 0).collect(),
        Some(Some(types)) if types.len() == n => types
            .iter()
            .map(|t| t.as_bool().map(|full| !full))
            .collect::<Option<Vec<bool>>>()
            .ok_or_else(|| bad(f, format!("{} holds other values than booleans", key("types"))))?,
        Some(_) => {
            return Err(bad(
                f,
                format!("{} is not an array of {n} booleans (one per layer)", key("types")),
            ))
        }
    };
    Ok(Dsa {
        heads: req_u("head_count")?,
        head_dim: req_u("key_length")?,
        topk: req_u("top_k")?,
        shared,
        rope_interleave: glm,
    })
}
