//! GGUF files of gpt-oss (`gpt-oss`), as llama.cpp's converter writes them
//! (`conversion/gpt_oss.py`) and llama.cpp reads them
//! (`src/models/openai-moe.cpp`).
//!
//! The converter splits the fused experts: `gate_up_proj` (gate and up in
//! alternate columns) becomes `ffn_gate_exps` / `ffn_up_exps` and its bias
//! `ffn_{gate,up}_exps.bias` (`[E, I]`, one row per expert), `down_proj` is
//! transposed into `ffn_down_exps`; hub MXFP4 blocks stay MXFP4. The router
//! is `ffn_gate_inp.{weight,bias}`, the sinks `attn_sinks.weight`, `o_proj`'s
//! bias `attn_output.bias`: [`super::GgufModel`] maps the Hugging Face names
//! onto these. The config keys:
//! - `attention.sliding_window`, and which layers slide from
//!   `attention.sliding_window_pattern` (one bool per layer, or a period
//!   `n`: layer `l` slides when `l % n < n - 1`), else llama.cpp's default
//!   for `gpt-oss`, period 2 (even layers slide, as transformers'
//!   `"sliding_attention" if bool((i + 1) % 2)`);
//! - the clamped GLU: llama.cpp hard-codes `alpha = 1.702f` and
//!   `limit = 7.0f` (`LLM_FFN_SWIGLU_OAI_MOE`); the limit is read from
//!   `swiglu_clamp_exp` (a value or one per layer, the key llama.cpp's
//!   converters write for an expert GLU's clamp) when a file has it;
//! - the router takes the top-k biased logits and softmaxes those
//!   (`LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`), every layer has
//!   sinks, and attention, router and experts have biases.
//!
//! YaRN comes from `rope.scaling.*` like every GGUF, with its correction
//! range not truncated, as gpt-oss is defined (`GptOssConfig` and every
//! released config: `"truncate": false`; the converter does not record it).
//! llama.cpp truncates it for every model (`ggml_rope_yarn_corr_dims`:
//! `floorf` / `ceilf`) and clamps at 7 whatever the file says: on these two
//! points charm computes what transformers computes, not what llama.cpp
//! does (tests/tests/gguf_parity.rs measures charm against both).

use charm_common::gguf::{GgufFile, MetaValue};

use super::bad;
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::ffn::GluAct;
use crate::gpt_oss::{DEFAULT_ALPHA, DEFAULT_LIMIT};

/// llama.cpp's sliding-window period for `gpt-oss` when the file names none
/// (`load_swa_pattern(ml, 2)`).
const DEFAULT_SWA_PERIOD: u64 = 2;

/// gpt-oss's parts of the config: sliding windows, sinks, biases, the
/// router's softmax over the top k and the clamped GLU.
pub(super) fn gpt_oss(f: &GgufFile, arch: &str, c: &mut ModelConfig) -> Result<(), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let n = c.num_layers;
    let window = f
        .meta(&key("attention.sliding_window"))
        .and_then(MetaValue::as_u64)
        .filter(|&w| w > 0)
        .ok_or_else(|| {
            bad(
                f,
                format!("missing or zero metadata {}", key("attention.sliding_window")),
            )
        })? as usize;
    c.sliding_window = sliding_layers(f, &key("attention.sliding_window_pattern"), n, Some(DEFAULT_SWA_PERIOD))?
        .into_iter()
        .map(|swa| swa.then_some(window))
        .collect();
    c.attn_sinks = vec![true; n];
    c.o_proj_bias = true;
    c.router_bias = true;
    c.router_softmax_after_topk = true;
    c.norm_topk_prob = false;
    c.expert_bias = true;
    // GptOssConfig's YaRN: "truncate": false (the converter does not
    // record it; llama.cpp truncates for every model).
    if let Some(y) = c.rope_yarn.as_mut() {
        y.truncate = false;
    }
    c.expert_act = GluAct::Clamped {
        alpha: DEFAULT_ALPHA as f32,
        limit: clamp_limit(f, &key("swiglu_clamp_exp"), n)?,
    };
    Ok(())
}

/// Which of `n` layers slide, from `pattern_key` (llama.cpp's
/// `load_swa_pattern`: an array of bools, or of integers where non-zero
/// slides, as the `mimo2` converter writes it; else a period), or the
/// architecture's default period when the file names none (`None`: the key
/// is required).
pub(super) fn sliding_layers(
    f: &GgufFile,
    pattern_key: &str,
    n: usize,
    default_period: Option<u64>,
) -> Result<Vec<bool>, ModelError> {
    match f.meta(pattern_key) {
        None => default_period
            .map(|p| swa_period(p, n))
            .ok_or_else(|| bad(f, format!("missing metadata {pattern_key}"))),
        Some(MetaValue::Array(list)) => {
            if list.len() < n {
                return Err(bad(
                    f,
                    format!("{pattern_key} has {} entries for {n} layers", list.len()),
                ));
            }
            list[..n]
                .iter()
                .map(|v| {
                    v.as_bool()
                        .or_else(|| v.as_u64().map(|i| i != 0))
                        .ok_or_else(|| bad(f, format!("{pattern_key} holds neither bools nor integers")))
                })
                .collect()
        }
        Some(v) => match v.as_u64() {
            Some(period) => Ok(swa_period(period, n)),
            None => Err(bad(
                f,
                format!("{pattern_key} is neither a period nor one bool per layer"),
            )),
        },
    }
}

/// llama.cpp's `set_swa_pattern(n_pattern)`:
/// `is_swa = n_pattern == 0 || (il % n_pattern < (n_pattern - 1))`.
fn swa_period(period: u64, n: usize) -> Vec<bool> {
    (0..n as u64)
        .map(|il| period == 0 || il % period < period - 1)
        .collect()
}

/// The experts' GLU clamp from `limit_key` (one value, or one per layer, all
/// equal: charm has one activation per model), else llama.cpp's constant.
fn clamp_limit(f: &GgufFile, limit_key: &str, n: usize) -> Result<f32, ModelError> {
    let values: Vec<f64> = match f.meta(limit_key) {
        None => return Ok(DEFAULT_LIMIT as f32),
        Some(MetaValue::Array(list)) => list
            .iter()
            .map(MetaValue::as_f64)
            .collect::<Option<Vec<f64>>>()
            .filter(|v| v.len() >= n && n > 0)
            .ok_or_else(|| bad(f, format!("{limit_key} is not one number per layer ({n})")))?[..n]
            .to_vec(),
        Some(v) => vec![v
            .as_f64()
            .ok_or_else(|| bad(f, format!("{limit_key} is not a number")))?],
    };
    let limit = values[0];
    if values.iter().any(|&v| v != limit) {
        return Err(bad(
            f,
            format!("{limit_key} differs between layers ({values:?}); one limit per model is supported"),
        ));
    }
    if !(limit > 0.0 && limit.is_finite()) {
        return Err(bad(f, format!("{limit_key} {limit} must be a positive number")));
    }
    Ok(limit as f32)
}

#[cfg(test)]
mod tests {
    use super::swa_period;

    #[test]
    fn the_swa_period_follows_llama_cpp() {
        assert_eq!(swa_period(2, 4), [true, false, true, false]);
        assert_eq!(swa_period(3, 4), [true, true, false, true]);
        assert_eq!(swa_period(1, 2), [false, false]);
        assert_eq!(swa_period(0, 2), [true, true]);
    }
}
