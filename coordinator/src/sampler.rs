//! Picking the next token from logits: greedy at temperature 0, otherwise
//! temperature / top-k / top-p sampling from a seeded ChaCha stream, so a
//! `--seed` reproduces a run exactly on any machine.

use charm_common::kernels::{argmax, softmax};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass to keep; 1.0 = off.
    pub top_p: f32,
    /// Candidates to keep; 0 = off.
    pub top_k: usize,
    /// Seed of the sampling stream.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the message names the flag at fault.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

/// A sampler with its own random stream.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Sampler { params, rng }
    }

    /// The next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature == 0.0 {
            return argmax(logits) as u32;
        }
        // Candidates sorted by logit, highest first (ties: lower id first).
        let mut idx: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        if idx.is_empty() {
            return 0;
        }
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            idx.truncate(p.top_k);
        }
        let mut probs: Vec<f32> = idx.iter().map(|&i| logits[i] / p.temperature).collect();
        softmax(&mut probs);
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            let mut keep = probs.len();
            for (n, q) in probs.iter().enumerate() {
                mass += q;
                if mass >= p.top_p {
                    keep = n + 1;
                    break;
                }
            }
            idx.truncate(keep);
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut u = self.rng.gen::<f32>() * total;
        for (i, q) in idx.iter().zip(&probs) {
            if u < *q {
                return *i as u32;
            }
            u -= q;
        }
        *idx.last().unwrap_or(&0) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.5, -1.0, 0.0, 2.9]
    }

    #[test]
    fn temperature_zero_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&logits()), 1);
    }

    #[test]
    fn same_seed_same_draws_other_seed_differs() {
        let p = SamplingParams {
            temperature: 1.5,
            seed: 7,
            ..Default::default()
        };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..64).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        assert_eq!(draw(&p), draw(&p));
        assert_ne!(draw(&p), draw(&SamplingParams { seed: 8, ..p.clone() }));
    }

    #[test]
    fn top_k_and_top_p_restrict_candidates() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 2,
            seed: 1,
            ..Default::default()
        });
        for _ in 0..200 {
            assert!([1, 5].contains(&s.sample(&logits())));
        }
        // At temperature 1 token 1 alone holds < 0.4 of the mass; top_p 0.3 keeps only it.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.3,
            seed: 1,
            ..Default::default()
        });
        for _ in 0..200 {
            assert_eq!(s.sample(&logits()), 1);
        }
    }

    #[test]
    fn bad_params_are_refused() {
        assert!(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_p: 1.5,
            ..Default::default()
        }
        .validate()
        .is_err());
    }
}
