//! Generation with per-token log-probabilities (`logprobs` /
//! `top_logprobs` of the OpenAI API).
//!
//! [`Engine::generate`] hands its callback only the sampled id, not the
//! logits it sampled from, so a request that asks for log-probabilities
//! runs this loop instead: the same steps as `Engine::generate` (chunked
//! prefill with [`Engine::forward_timed`], the same [`Sampler`] fed the
//! same logits, the same stopping rules), which therefore yields the same
//! ids — `tests/api.rs` checks that a request gives the same text with and
//! without `logprobs`. Each session starts empty (the server keeps no
//! prefix cache between requests), so there is no prefix reuse to mirror.

use std::time::Instant;

use charm_models::ModelError;

use crate::engine::{Engine, FinishReason, GenStats, GenerateParams, Generation, PhaseTimes};
use crate::sampler::Sampler;

/// The log-probability of the chosen token and of the most likely ones.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// `log softmax(logits)[chosen]`.
    pub logprob: f32,
    /// The `top` most likely ids with their log-probabilities, most likely
    /// first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Log-probabilities of `chosen` and of the `top` most likely ids under
/// the model's distribution (`log_softmax(logits)`, before temperature).
pub fn logprobs(logits: &[f32], chosen: u32, top: usize) -> TokenLogprobs {
    let max = logits
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| ((x - max) as f64).exp())
        .sum();
    let log_z = max as f64 + sum.ln();
    let lp = |i: usize| (logits[i] as f64 - log_z) as f32;
    let mut best: Vec<usize> = Vec::with_capacity(top + 1);
    if top > 0 {
        for i in 0..logits.len() {
            if logits[i].is_nan() {
                continue;
            }
            let pos = best.iter().position(|&b| logits[i] > logits[b]).unwrap_or(best.len());
            if pos < top {
                best.insert(pos, i);
                best.truncate(top);
            }
        }
    }
    TokenLogprobs {
        logprob: lp(chosen as usize),
        top: best.into_iter().map(|i| (i as u32, lp(i))).collect(),
    }
}

/// [`Engine::generate`] from an empty session, also handing `on_token` the
/// log-probabilities of each sampled id (with the `top` most likely).
/// `on_token` may return `false` to stop early.
pub fn generate_with_logprobs(
    engine: &Engine,
    prompt: &[u32],
    params: &GenerateParams,
    top: usize,
    mut on_token: impl FnMut(u32, TokenLogprobs) -> bool,
) -> Result<Generation, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::BadInput("the prompt is empty".into()));
    }
    params.sampling.validate().map_err(ModelError::BadInput)?;
    let cfg = engine.config();
    let service = engine.expert_service();
    let t0 = Instant::now();
    let before = service.stats();
    let mut cache = engine.model.new_cache();
    let mut prof = PhaseTimes::default();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(engine.prefill_chunk.max(1)) {
        logits = engine.forward_timed(chunk, &mut cache, false, &mut prof)?;
    }
    let prefill_s = t0.elapsed().as_secs_f64();

    let mut sampler = Sampler::new(params.sampling.clone());
    let mut ids = Vec::new();
    let mut finish = FinishReason::Length;
    let mut ttft_ms = 0.0;
    let t_decode = Instant::now();
    while ids.len() < params.max_tokens {
        let t = Instant::now();
        let next = sampler.sample(&logits);
        prof.sample_ms += t.elapsed().as_secs_f64() * 1e3;
        if ids.is_empty() {
            ttft_ms = t0.elapsed().as_secs_f64() * 1e3;
        }
        ids.push(next);
        let keep_going = on_token(next, logprobs(&logits, next, top));
        if (!params.ignore_eos && cfg.eos_token_ids.contains(&next)) || !keep_going {
            finish = FinishReason::Stop;
            break;
        }
        if ids.len() == params.max_tokens || cache.len() >= cfg.max_position_embeddings {
            break;
        }
        logits = engine.forward_timed(&[next], &mut cache, false, &mut prof)?;
    }
    let decode_s = t_decode.elapsed().as_secs_f64();
    service.end_request();
    let experts = service.stats().since(&before);
    let stats = GenStats {
        prompt_tokens: prompt.len(),
        generated_tokens: ids.len(),
        ttft_ms,
        prefill_tok_s: rate(prompt.len(), prefill_s),
        decode_tok_s: rate(ids.len().saturating_sub(1), decode_s),
        cached_prompt_tokens: 0,
        prefetch_accuracy: experts.prefetch_accuracy(),
        experts,
        profile: prof,
    };
    Ok(Generation {
        ids,
        finish_reason: finish,
        stats,
    })
}

fn rate(n: usize, secs: f64) -> f64 {
    if n == 0 || secs <= 0.0 {
        0.0
    } else {
        n as f64 / secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_log_softmax_with_ordered_top() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let log_z = logits.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        let lp = logprobs(&logits, 2, 3);
        assert!((lp.logprob as f64 - (2.0 - log_z)).abs() < 1e-6, "{lp:?}");
        // The two 3.0s (lower id first), then the 2.0.
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        assert!((lp.top[0].1 as f64 - (3.0 - log_z)).abs() < 1e-6);
        assert_eq!(lp.top[0].1, lp.top[1].1);
        assert_eq!(lp.top[2].1, lp.logprob);
        assert!(logprobs(&logits, 0, 0).top.is_empty());
    }
}
