//! MiMo-V2-Flash (`MiMoV2FlashForCausalLM`, Xiaomi).
//!
//! Differs from its siblings (transformers `models/mimo_v2_flash/modeling_mimo_v2_flash.py`):
//! - Layers are sliding-window or full attention by `layer_types` (default:
//!   `"full_attention" if (i == 0 or not ((i + 1) % 6)) else "sliding_attention"`);
//!   sliding layers have twice the KV heads
//!   (`num_key_value_heads * 2 if is_swa else num_key_value_heads`), their
//!   own rope theta (`rope_parameters["sliding_attention"]`) and learned
//!   sinks (`self.sinks = nn.Parameter(...) if is_swa else None`).
//! - Query/key heads are `head_dim` wide, value heads `v_head_dim`, and
//!   every value is scaled:
//!   `value_states = self.v_proj(hidden_states)... * self.v_scale`
//!   (`attention_value_scale`); `o_proj` reads `heads * v_head_dim`.
//! - Partial rotary: `dim = int(head_dim * partial_rotary_factor)` (default 0.334).
//! - The DeepSeek-V3 router (sigmoid scores, `e_score_correction_bias` for
//!   selection, `n_group` / `topk_group`, `routed_scaling_factor`) with no
//!   shared expert; layers are dense or sparse by `mlp_layer_types`
//!   (default: the first dense); experts stored fused as Qwen3.5's.

use serde_json::Value;

use crate::config::{GroupRouting, ModelConfig, RawConfig, SwaShape};
use crate::error::ModelError;
use crate::family::Family;

/// `partial_rotary_factor`'s default.
const DEFAULT_PARTIAL_ROTARY: f64 = 0.334;

/// Parses a MiMo-V2-Flash `config.json`.
pub fn parse(raw: &RawConfig) -> Result<ModelConfig, ModelError> {
    let mut c = raw.base(Family::MiMoV2Flash)?;
    let n = c.num_layers;
    c.qkv_bias = raw.bool_opt(&["attention_bias"])?.unwrap_or(false);
    // Released configs spell the window as sliding_window_size (the
    // transformers config adds one: `self.sliding_window = kwargs["sliding_window_size"] + 1`).
    let window = match raw.usize_opt(&["sliding_window"])? {
        Some(w) => w,
        None => raw.usize_opt(&["sliding_window_size"])?.map_or(129, |w| w + 1),
    };
    let sliding: Vec<bool> = match raw.lookup(&["layer_types"]).and_then(Value::as_array) {
        Some(types) => {
            if types.len() != n {
                return Err(raw.err(format!("layer_types has {} entries for {n} layers", types.len())));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(raw.err(format!(
                        "layer_types entry {t} is neither \"sliding_attention\" nor \"full_attention\""
                    ))),
                })
                .collect::<Result<_, _>>()?
        }
        None => (0..n).map(|i| !(i == 0 || (i + 1) % 6 == 0)).collect(),
    };
    c.sliding_window = sliding.iter().map(|&s| s.then_some(window)).collect();
    c.attn_sinks = sliding.clone();
    c.v_head_dim = Some(raw.usize(&["v_head_dim"])?);
    c.value_scale = Some(raw.f64_opt(&["attention_value_scale"])?.unwrap_or(0.707) as f32);
    let (full_theta, full_dim) = rope_of(raw, "full_attention", 5_000_000.0, c.head_dim)?;
    let (swa_theta, swa_dim) = rope_of(raw, "sliding_attention", 10_000.0, c.head_dim)?;
    if full_dim != swa_dim {
        return Err(raw.err(format!(
            "the full and sliding layers' rotary dimensions differ ({full_dim} and {swa_dim}); charm needs them equal"
        )));
    }
    c.rope_theta = full_theta;
    c.rotary_dim = full_dim;
    c.swa = Some(SwaShape {
        kv_heads: c.num_kv_heads * 2,
        rope_theta: swa_theta,
    });
    c.num_experts = raw.usize(&["n_routed_experts", "num_local_experts"])?;
    c.top_k = raw.usize(&["num_experts_per_tok"])?;
    c.moe_intermediate_size = raw.usize(&["moe_intermediate_size"])?;
    c.norm_topk_prob = raw.bool_opt(&["norm_topk_prob"])?.unwrap_or(true);
    c.group_routing = Some(GroupRouting {
        groups: raw.usize_opt(&["n_group"])?.unwrap_or(1),
        topk_groups: raw.usize_opt(&["topk_group"])?.unwrap_or(1),
        scale: raw.f64_opt(&["routed_scaling_factor"])?.unwrap_or(1.0) as f32,
        bias: true,
    });
    c.moe_layers = match raw.lookup(&["mlp_layer_types"]).and_then(Value::as_array) {
        Some(types) => {
            if types.len() != n {
                return Err(raw.err(format!("mlp_layer_types has {} entries for {n} layers", types.len())));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sparse") => Ok(true),
                    Some("dense") => Ok(false),
                    _ => Err(raw.err(format!("mlp_layer_types entry {t} is neither \"sparse\" nor \"dense\""))),
                })
                .collect::<Result<_, _>>()?
        }
        None => (0..n).map(|i| i > 0).collect(),
    };
    Ok(c)
}

/// Rope theta and rotary dimension of one layer type's
/// `rope_parameters[kind]` (default rope only).
fn rope_of(raw: &RawConfig, kind: &str, default_theta: f64, head_dim: usize) -> Result<(f32, usize), ModelError> {
    let key = |k: &str| format!("rope_parameters.{kind}.{k}");
    if let Some(t) = raw.str_opt(&[&key("rope_type")]) {
        if t != "default" {
            return Err(raw.err(format!(
                "rope_parameters.{kind}.rope_type {t:?} is not supported (default)"
            )));
        }
    }
    let theta = raw.f64_opt(&[&key("rope_theta")])?.unwrap_or(default_theta);
    let factor = raw
        .f64_opt(&[&key("partial_rotary_factor")])?
        .unwrap_or(DEFAULT_PARTIAL_ROTARY);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(raw.err(format!(
            "rope_parameters.{kind}.partial_rotary_factor {factor} must be in (0, 1]"
        )));
    }
    // dim = int(head_dim * partial_rotary_factor)
    Ok((theta as f32, (head_dim as f64 * factor) as usize))
}
