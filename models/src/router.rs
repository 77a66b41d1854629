//! The MoE router: expert logits, then a scoring kind — softmax over the
//! experts, top-k, optional renormalization (OLMoE, Qwen, Mixtral), or the
//! sigmoid group router of the DeepSeek lineage
//! ([`crate::group_router`]) — and the batch-union that groups a step's
//! rows by expert.

use charm_common::kernels::{softmax, top_k};
use charm_common::Weight;
use charm_proto::{ExpertBatch, ExpertGroup};

use crate::group_router::SigmoidGroup;

/// One layer's router.
pub struct Router {
    /// `[num_experts, hidden]`
    pub weight: Weight,
    /// `[num_experts]`, added to the logits (gpt-oss's `router.bias`).
    pub bias: Option<Vec<f32>>,
    pub top_k: usize,
    pub scoring: Scoring,
}

/// How a router turns expert logits into a choice.
#[derive(Clone, Debug, PartialEq)]
pub enum Scoring {
    /// Softmax over every expert, top-k, renormalized when `norm_topk_prob`.
    Softmax { renormalize: bool },
    /// Sigmoid scores, selection-only bias, group-limited top-k, scaled.
    SigmoidGroup(SigmoidGroup),
    /// Top-k of the logits, then a softmax over those k (gpt-oss).
    TopKSoftmax,
}

/// The experts one row chose, with their gate weights, in router rank order.
pub type Choice = Vec<(u32, f32)>;

impl Router {
    /// Routes `n` rows.
    pub fn route(&self, xs: &[f32], n: usize) -> Vec<Choice> {
        let e = self.weight.rows();
        let mut logits = vec![0.0; n * e];
        self.weight.matmul(xs, n, &mut logits);
        if let Some(b) = &self.bias {
            crate::ffn::add_rows(&mut logits, b);
        }
        logits
            .chunks_exact_mut(e)
            .map(|row| match &self.scoring {
                Scoring::Softmax { renormalize } => softmax_top_k(row, self.top_k, *renormalize),
                Scoring::SigmoidGroup(g) => g.choose(row, self.top_k),
                Scoring::TopKSoftmax => top_k_softmax(row, self.top_k),
            })
            .collect()
    }
}

/// `routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)`
/// `routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)`
/// `if self.norm_topk_prob: routing_weights /= routing_weights.sum(dim=-1, keepdim=True)`
fn softmax_top_k(probs: &mut [f32], k: usize, renormalize: bool) -> Choice {
    softmax(probs);
    let idx = top_k(probs, k);
    let mut w: Vec<f32> = idx.iter().map(|&i| probs[i]).collect();
    if renormalize {
        let s: f32 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= s);
    }
    idx.into_iter().map(|i| i as u32).zip(w).collect()
}

/// `router_top_value, router_indices = torch.topk(router_logits, self.top_k, dim=-1)`
/// `router_top_value = torch.nn.functional.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)`
fn top_k_softmax(logits: &[f32], k: usize) -> Choice {
    let idx = top_k(logits, k);
    let mut w: Vec<f32> = idx.iter().map(|&i| logits[i]).collect();
    softmax(&mut w);
    idx.into_iter().map(|i| i as u32).zip(w).collect()
}

/// Groups rows by expert: every unique expert once, sorted by id, with the
/// rows that chose it (ascending) and their weights.
pub fn batch_union(layer: u16, hidden: usize, rows: Vec<f32>, choices: &[Choice]) -> ExpertBatch {
    let mut groups: Vec<ExpertGroup> = Vec::new();
    let mut pairs: Vec<(u32, u32, f32)> = choices
        .iter()
        .enumerate()
        .flat_map(|(r, c)| c.iter().map(move |&(e, w)| (e, r as u32, w)))
        .collect();
    pairs.sort_by_key(|&(e, r, _)| (e, r));
    for (e, r, w) in pairs {
        match groups.last_mut() {
            Some(g) if g.expert == e => {
                g.rows.push(r);
                g.weights.push(w);
            }
            _ => groups.push(ExpertGroup {
                expert: e,
                rows: vec![r],
                weights: vec![w],
            }),
        }
    }
    ExpertBatch {
        layer,
        hidden: hidden as u32,
        rows,
        groups,
        next: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_has_each_expert_once_sorted() {
        let choices = vec![
            vec![(3, 0.6), (1, 0.4)],
            vec![(1, 0.7), (2, 0.3)],
            vec![(3, 0.5), (2, 0.5)],
        ];
        let b = batch_union(0, 1, vec![0.0, 1.0, 2.0], &choices);
        assert_eq!(b.validate(), Ok(()));
        let experts: Vec<u32> = b.groups.iter().map(|g| g.expert).collect();
        assert_eq!(experts, vec![1, 2, 3]);
        assert_eq!(b.groups[0].rows, vec![0, 1]);
        assert_eq!(b.groups[0].weights, vec![0.4, 0.7]);
        assert_eq!(b.groups[2].rows, vec![0, 2]);
    }

    #[test]
    fn renormalized_weights_sum_to_one() {
        let w = Weight::from_f32(4, 2, vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5, -1.0, 0.0]);
        let r = Router {
            weight: w,
            bias: None,
            top_k: 2,
            scoring: Scoring::Softmax { renormalize: true },
        };
        let c = r.route(&[2.0, 1.0], 1);
        assert_eq!(c[0][0].0, 0);
        assert!((c[0].iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
        let r = Router {
            scoring: Scoring::Softmax { renormalize: false },
            ..r
        };
        assert!(r.route(&[2.0, 1.0], 1)[0].iter().map(|x| x.1).sum::<f32>() < 1.0);
    }

    #[test]
    fn biased_top_k_softmaxes_only_the_chosen_logits() {
        // Logits [2, 1, 1, -2] plus bias [0, 0, 0.5, 0] = [2, 1, 1.5, -2].
        let w = Weight::from_f32(4, 2, vec![1.0, 0.0, 0.0, 1.0, 0.0, 1.0, -1.0, 0.0]);
        let r = Router {
            weight: w,
            bias: Some(vec![0.0, 0.0, 0.5, 0.0]),
            top_k: 2,
            scoring: Scoring::TopKSoftmax,
        };
        let c = &r.route(&[2.0, 1.0], 1)[0];
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 2]);
        let e = (-0.5f32).exp();
        assert!((c[0].1 - 1.0 / (1.0 + e)).abs() < 1e-6 && (c[1].1 - e / (1.0 + e)).abs() < 1e-6);
    }
}
