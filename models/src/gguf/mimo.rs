//! GGUF files of MiMo-V2-Flash (`mimo2`), as llama.cpp's converter writes
//! them (`conversion/mimo.py`) and llama.cpp reads them
//! (`src/models/mimo2.cpp`).
//!
//! The converter keeps q/k/v/o as they are (NeoX rotary halves, no row
//! permutation), stores `attention_sink_bias` as `attn_sinks.weight` (on the
//! sliding layers only, where the checkpoint has it) and the router's
//! `e_score_correction_bias` as `exp_probs_b.bias`. The config keys:
//! - `attention.head_count_kv`, one per layer: the full layers' count and
//!   the sliding layers' (twice it in every release);
//! - `attention.sliding_window` and `attention.sliding_window_pattern` (one
//!   integer per layer, non-zero where a layer slides);
//! - `rope.freq_base` (full layers), `rope.freq_base_swa` (sliding layers;
//!   llama.cpp takes `freq_base` when it is absent), `rope.dimension_count`
//!   (`int(head_dim * partial_rotary_factor)`);
//! - `attention.key_length` (query and key heads), `attention.value_length`
//!   (value heads), `attention.value_scale` (every value scaled; none when
//!   absent, as llama.cpp);
//! - the router: llama.cpp hard-codes MiMo's sigmoid scores and the
//!   renormalized top k (`build_moe_ffn(..., true, ...,
//!   LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)`), reads the groups from
//!   `expert_group_count` / `expert_group_used_count` and a scale from
//!   `expert_weights_scale`, which the converter does not write (so none).

use charm_common::gguf::{GgufFile, MetaValue};

use super::bad;
use super::gpt_oss::sliding_layers;
use crate::config::{GroupRouting, ModelConfig, SwaShape};
use crate::error::ModelError;

/// MiMo-V2-Flash's parts of the config: per-kind KV heads and rope, sliding
/// windows, sinks, value heads and their scale, the sigmoid router.
pub(super) fn mimo(f: &GgufFile, arch: &str, c: &mut ModelConfig) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let opt_u = |k: &str| f.meta(&key(k)).and_then(MetaValue::as_u64).map(|v| v as usize);
    let req_u = |k: &str| opt_u(k).ok_or_else(|| bad(f, format!("missing or non-integer metadata {}", key(k))));
    let opt_f = |k: &str| f.meta(&key(k)).and_then(MetaValue::as_f64);
    let n = c.num_layers;

    let window = req_u("attention.sliding_window")?;
    if window == 0 {
        return Err(bad(f, format!("{} is zero", key("attention.sliding_window"))));
    }
    let sliding = sliding_layers(f, &key("attention.sliding_window_pattern"), n, None)?;
    let kv = kv_heads(f, &key("attention.head_count_kv"), &sliding)?;
    let full_kv = kv.full.or(kv.sliding).unwrap_or(c.num_heads);
    c.num_kv_heads = full_kv;
    c.swa = Some(SwaShape {
        kv_heads: kv.sliding.unwrap_or(full_kv),
        rope_theta: opt_f("rope.freq_base_swa").map_or(c.rope_theta, |t| t as f32),
    });
    c.sliding_window = sliding.iter().map(|&s| s.then_some(window)).collect();
    c.attn_sinks = (0..n)
        .map(|l| f.tensor(&format!("blk.{l}.attn_sinks.weight")).is_some())
        .collect();
    c.rotary_dim = req_u("rope.dimension_count")?;
    c.v_head_dim = Some(req_u("attention.value_length")?);
    c.value_scale = opt_f("attention.value_scale").map(|s| s as f32);

    if let Some(g) = opt_u("expert_gating_func").filter(|&g| g != 2) {
        return Err(bad(
            f,
            format!("{} is {g}; MiMo's router is sigmoid (2)", key("expert_gating_func")),
        ));
    }
    c.group_routing = Some(GroupRouting {
        groups: opt_u("expert_group_count").unwrap_or(1).max(1),
        topk_groups: opt_u("expert_group_used_count").unwrap_or(1).max(1),
        scale: opt_f("expert_weights_scale").filter(|&s| s != 0.0).unwrap_or(1.0) as f32,
        bias: (0..n).any(|l| f.tensor(&format!("blk.{l}.exp_probs_b.bias")).is_some()),
    });
    c.norm_topk_prob = f
        .meta(&key("expert_weights_norm"))
        .and_then(MetaValue::as_bool)
        .unwrap_or(true);
    Ok(())
}

/// The KV head counts of the full and the sliding layers (`None`: the model
/// has no layer of that kind).
struct KvHeads {
    full: Option<usize>,
    sliding: Option<usize>,
}

/// `head_count_kv` as one count per layer (or one for all), each kind of
/// layer with one count.
fn kv_heads(f: &GgufFile, key: &str, sliding: &[bool]) -> Result<KvHeads, ModelError> {
    let n = sliding.len();
    let per_layer: Vec<usize> = match f.meta(key) {
        None => return Err(bad(f, format!("missing metadata {key}"))),
        Some(MetaValue::Array(list)) => {
            let counts: Option<Vec<usize>> = list.iter().map(|v| v.as_u64().map(|c| c as usize)).collect();
            match counts {
                Some(c) if c.len() >= n => c[..n].to_vec(),
                _ => return Err(bad(f, format!("{key} is not one integer per layer ({n})"))),
            }
        }
        Some(v) => vec![v.as_u64().ok_or_else(|| bad(f, format!("{key} is not an integer")))? as usize; n],
    };
    let of_kind = |swa: bool| -> Result<Option<usize>, ModelError> {
        let mut counts = per_layer
            .iter()
            .zip(sliding)
            .filter(|(_, &s)| s == swa)
            .map(|(&c, _)| c);
        let Some(first) = counts.next() else { return Ok(None) };
        if first == 0 || counts.any(|c| c != first) {
            let kind = if swa { "sliding" } else { "full" };
            return Err(bad(
                f,
                format!("{key} {per_layer:?}: the {kind} layers need one non-zero count"),
            ));
        }
        Ok(Some(first))
    };
    Ok(KvHeads {
        full: of_kind(false)?,
        sliding: of_kind(true)?,
    })
}
