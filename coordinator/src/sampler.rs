//! Picking the next token from logits: the request's logit bias and
//! repetition penalties first, then greedy at temperature 0, otherwise
//! temperature / top-k / top-p / min-p sampling from a seeded ChaCha stream,
//! so a `--seed` reproduces a run exactly on any machine.
//!
//! The adjustments, in the order applied (each reads the model's logits
//! for the token so far and depends only on this sequence's own ids):
//! - `logit_bias` (OpenAI): a constant added to a token's logit.
//! - `repetition_penalty` (transformers' `RepetitionPenaltyLogitsProcessor`,
//!   over the prompt and the generated ids):
//!   `score = torch.where(score < 0, score * penalty, score / penalty)`.
//! - `frequency_penalty` / `presence_penalty` (OpenAI, over the generated
//!   ids): `logit -= count * frequency_penalty + (count > 0) * presence_penalty`.

use std::collections::{HashMap, HashSet};

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
    /// Keep candidates at least this fraction as likely as the most likely
    /// one; 0 = off.
    pub min_p: f32,
    /// transformers' repetition penalty over prompt and output; 1 = off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time it was generated.
    pub frequency_penalty: f32,
    /// Added to the logits of these token ids.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the sampling stream.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

/// The most a presence or frequency penalty may be, either way (OpenAI's range).
pub const MAX_PENALTY: f32 = 2.0;
/// The most a logit bias may be, either way (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

impl SamplingParams {
    /// Checks ranges; the message names the setting at fault.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min-p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(format!(
                "repetition-penalty must be > 0 (1 = off), got {}",
                self.repetition_penalty
            ));
        }
        for (name, v) in [
            ("presence-penalty", self.presence_penalty),
            ("frequency-penalty", self.frequency_penalty),
        ] {
            if !(-MAX_PENALTY..=MAX_PENALTY).contains(&v) {
                return Err(format!("{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {v}"));
            }
        }
        if let Some((id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(b))
        {
            return Err(format!(
                "logit bias of token {id} must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {b}"
            ));
        }
        Ok(())
    }

    /// Whether any adjustment of the logits is asked for.
    fn adjusts(&self) -> bool {
        !self.logit_bias.is_empty() || self.penalizes()
    }

    /// Whether a penalty needs the ids seen so far.
    fn penalizes(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// The ids the penalties look at (kept only when a penalty is on).
#[derive(Default)]
struct Seen {
    /// Prompt ids (the repetition penalty's input besides the output).
    prompt: HashSet<u32>,
    /// Generated ids and how often each came.
    generated: HashMap<u32, u32>,
}

/// A sampler with its own random stream.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    seen: Option<Seen>,
    /// The adjusted logits (reused across tokens).
    scratch: Vec<f32>,
}

impl Sampler {
    /// A sampler seeded from `params.seed`, for a sequence whose prompt
    /// was `prompt` (read only by the repetition penalty).
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        let seen = params.penalizes().then(|| Seen {
            prompt: if params.repetition_penalty != 1.0 {
                prompt.iter().copied().collect()
            } else {
                HashSet::new()
            },
            generated: HashMap::new(),
        });
        Sampler {
            params,
            rng,
            seen,
            scratch: Vec::new(),
        }
    }

    /// The next token (remembered for the penalties).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let id = if self.params.adjusts() {
            let mut adjusted = std::mem::take(&mut self.scratch);
            adjusted.clear();
            adjusted.extend_from_slice(logits);
            self.adjust(&mut adjusted);
            let id = self.pick(&adjusted);
            self.scratch = adjusted;
            id
        } else {
            self.pick(logits)
        };
        if let Some(seen) = self.seen.as_mut() {
            *seen.generated.entry(id).or_insert(0) += 1;
        }
        id
    }

    /// Remembers a token that was written without being sampled (for the
    /// penalties, as if it had been).
    pub fn note(&mut self, id: u32) {
        if let Some(seen) = self.seen.as_mut() {
            *seen.generated.entry(id).or_insert(0) += 1;
        }
    }

    /// Applies the logit bias and the penalties (the module's list, in order).
    fn adjust(&self, logits: &mut [f32]) {
        let p = &self.params;
        for &(id, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        let Some(seen) = &self.seen else { return };
        if p.repetition_penalty != 1.0 {
            let repeated = seen
                .prompt
                .iter()
                .chain(seen.generated.keys().filter(|id| !seen.prompt.contains(id)));
            for &id in repeated {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l < 0.0 {
                        *l * p.repetition_penalty
                    } else {
                        *l / p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &count) in &seen.generated {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
    }

    /// Greedy, or a draw from the truncated, tempered distribution.
    fn pick(&mut self, logits: &[f32]) -> u32 {
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
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            for (n, q) in probs.iter().enumerate() {
                mass += q;
                if mass >= p.top_p {
                    keep = n + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = p.min_p * probs[0];
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        idx.truncate(keep);
        probs.truncate(keep);
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
        let mut s = Sampler::new(SamplingParams::default(), &[]);
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
            let mut s = Sampler::new(p.clone(), &[]);
            (0..64).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        assert_eq!(draw(&p), draw(&p));
        assert_ne!(draw(&p), draw(&SamplingParams { seed: 8, ..p.clone() }));
    }

    #[test]
    fn top_k_and_top_p_restrict_candidates() {
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 5.0,
                top_k: 2,
                seed: 1,
                ..Default::default()
            },
            &[],
        );
        for _ in 0..200 {
            assert!([1, 5].contains(&s.sample(&logits())));
        }
        // At temperature 1 token 1 alone holds < 0.4 of the mass; top_p 0.3 keeps only it.
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 1.0,
                top_p: 0.3,
                seed: 1,
                ..Default::default()
            },
            &[],
        );
        for _ in 0..200 {
            assert_eq!(s.sample(&logits()), 1);
        }
    }

    #[test]
    fn min_p_keeps_only_tokens_near_the_most_likely() {
        // At temperature 1: p(1) = 0.368, p(5) = 0.333, p(2) = 0.223, the
        // rest < 0.05. min_p 0.5 keeps what has >= 0.184: 1, 5 and 2;
        // min_p 0.8 (>= 0.295) keeps 1 and 5.
        let draws = |min_p: f32| {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature: 1.0,
                    min_p,
                    seed: 3,
                    ..Default::default()
                },
                &[],
            );
            (0..2000).map(|_| s.sample(&logits())).collect::<HashSet<u32>>()
        };
        assert_eq!(draws(0.5), HashSet::from([1, 2, 5]));
        assert_eq!(draws(0.8), HashSet::from([1, 5]));
        assert_eq!(draws(1.0), HashSet::from([1]));
        assert_eq!(draws(0.0).len(), 6);
    }

    #[test]
    fn logit_bias_moves_the_greedy_pick() {
        let greedy = |bias: Vec<(u32, f32)>| {
            let p = SamplingParams {
                logit_bias: bias,
                ..Default::default()
            };
            Sampler::new(p, &[]).sample(&logits())
        };
        assert_eq!(greedy(vec![]), 1);
        assert_eq!(greedy(vec![(3, 4.5)]), 3);
        assert_eq!(greedy(vec![(1, -100.0)]), 5);
        // An id past the vocabulary changes nothing.
        assert_eq!(greedy(vec![(1000, 100.0)]), 1);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        // Token 1 (3.0) is in the prompt: 1.5 < 2.9 of token 5.
        let mut s = Sampler::new(p.clone(), &[1, 1, 3]);
        assert_eq!(s.sample(&logits()), 5);
        // Now 5 was generated too: 1.45 < 1.5 of token 1, and 2.5 of token 2 wins.
        assert_eq!(s.sample(&logits()), 2);
        let mut adjusted = logits();
        s.adjust(&mut adjusted);
        assert_eq!(adjusted, vec![1.0, 1.5, 2.5 / 2.0, -2.0, 0.0, 2.9 / 2.0]);
    }

    #[test]
    fn presence_and_frequency_penalties_count_generated_ids_only() {
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        // The prompt does not count.
        let mut s = Sampler::new(p, &[1, 5]);
        assert_eq!(s.sample(&logits()), 1);
        // 1 now at 3.0 - 0.75 = 2.25: token 5 (2.9) wins, then 2 (2.5),
        // then 1 and 5 again by their counts.
        assert_eq!(s.sample(&logits()), 5);
        assert_eq!(s.sample(&logits()), 2);
        let mut adjusted = logits();
        s.adjust(&mut adjusted);
        assert_eq!(adjusted, vec![1.0, 2.25, 2.5 - 0.75, -1.0, 0.0, 2.9 - 0.75]);
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
        for bad in [
            SamplingParams {
                min_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            SamplingParams {
                presence_penalty: 2.5,
                ..Default::default()
            },
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..Default::default()
            },
            SamplingParams {
                logit_bias: vec![(7, 101.0)],
                ..Default::default()
            },
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.contains("must be"), "{e}");
        }
    }
}
