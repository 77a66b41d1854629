//! The sigmoid router with a selection-only bias and group-limited top-k:
//! DeepSeek-V3 / R1 / Kimi K2, GLM-4.5…4.7 and GLM-5, MiniMax-M2
//! (transformers `DeepseekV3TopkRouter`, `Glm4MoeTopkRouter`,
//! `MiniMaxM2` gate), computed in f32.
//!
//! ```python
//! scores = router_logits.sigmoid()
//! scores_for_choice = scores + self.e_score_correction_bias
//! group_scores = scores_for_choice.view(-1, self.num_group, E // self.num_group).topk(2, dim=-1)[0].sum(dim=-1)
//! group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
//! scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
//! topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
//! topk_weights = scores.gather(1, topk_indices)
//! if self.norm_topk_prob:
//!     denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20
//!     topk_weights /= denominator
//! topk_weights = topk_weights * self.routed_scaling_factor
//! ```
//!
//! The bias only chooses; the weights are the unbiased scores. One group
//! (`n_group` 1, MiniMax-M2) is plain top-k over the biased scores. Ties
//! go to the lower index, as everywhere in charm's top-k.

use charm_common::kernels::{sigmoid, top_k};

/// A sigmoid group router's settings (its weight lives in the
/// [`crate::router::Router`]; `ModelConfig::validate` checks the groups).
#[derive(Clone, Debug, PartialEq)]
pub struct SigmoidGroup {
    /// `e_score_correction_bias`, per expert (zeros when the model has none).
    pub bias: Vec<f32>,
    /// `n_group`: experts are split into this many equal groups.
    pub groups: usize,
    /// `topk_group`: only the best this many groups may be chosen from.
    pub topk_groups: usize,
    /// `norm_topk_prob`.
    pub renormalize: bool,
    /// `routed_scaling_factor` (1.0 when the family has none).
    pub scale: f32,
}

impl SigmoidGroup {
    /// One row's choice from its router logits: `(expert, weight)` in rank
    /// order (best biased score first).
    pub fn choose(&self, logits: &[f32], top: usize) -> Vec<(u32, f32)> {
        let scores: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
        let mut choice: Vec<f32> = scores.iter().zip(&self.bias).map(|(s, b)| s + b).collect();
        if self.groups > 1 {
            let per = choice.len() / self.groups;
            let group_scores: Vec<f32> = choice
                .chunks_exact(per)
                .map(|g| {
                    let best = top_k(g, 2);
                    g[best[0]] + g[best[1]]
                })
                .collect();
            let keep = top_k(&group_scores, self.topk_groups);
            for (g, chunk) in choice.chunks_exact_mut(per).enumerate() {
                if !keep.contains(&g) {
                    chunk.fill(f32::NEG_INFINITY);
                }
            }
        }
        let idx = top_k(&choice, top);
        let mut w: Vec<f32> = idx.iter().map(|&i| scores[i]).collect();
        if self.renormalize {
            let denom = w.iter().sum::<f32>() + 1e-20;
            w.iter_mut().for_each(|v| *v /= denom);
        }
        w.iter_mut().for_each(|v| *v *= self.scale);
        idx.into_iter().map(|i| i as u32).zip(w).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logit(p: f32) -> f32 {
        (p / (1.0 - p)).ln()
    }

    #[test]
    fn groups_limit_the_choice_and_the_bias_only_chooses() {
        // Two groups of 3. Group 0's best two sum highest once biased;
        // expert 4 alone has the best score but its group loses.
        let logits: Vec<f32> = [0.6, 0.55, 0.1, 0.2, 0.9, 0.1].map(logit).to_vec();
        let r = SigmoidGroup {
            bias: vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            groups: 2,
            topk_groups: 1,
            renormalize: false,
            scale: 2.0,
        };
        let c = r.choose(&logits, 2);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((c[0].1 - 1.2).abs() < 1e-6 && (c[1].1 - 1.1).abs() < 1e-6);
        // A bias on expert 5 lifts group 1 (0.9 + 0.1 + 0.5) and picks 5 second;
        // its weight stays its unbiased score.
        let r = SigmoidGroup {
            bias: vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.5],
            renormalize: true,
            scale: 1.0,
            ..r
        };
        let c = r.choose(&logits, 2);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4, 5]);
        assert!((c[0].1 - 0.9).abs() < 1e-6 && (c[1].1 - 0.1).abs() < 1e-6);
    }
}
