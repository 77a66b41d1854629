//! Generation with per-token log-probabilities (`logprobs` /
//! `top_logprobs` of the OpenAI API): [`Engine::generate_observed`] hands
//! each sampled id with the logits it was sampled from, and
//! [`logprobs`] turns those into the API's numbers. The ids are exactly
//! those of [`Engine::generate`] (same loop) — `tests/api.rs` checks that a
//! request gives the same text with and without `logprobs`.

use charm_models::ModelError;

use crate::engine::{Engine, GenerateParams, Generation};

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
    let mut session = engine.session();
    engine.generate_observed(&mut session, prompt, params, |id, logits| {
        on_token(id, logprobs(logits, id, top))
    })
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
