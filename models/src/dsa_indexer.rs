//! DeepSeek Sparse Attention's indexer (transformers `DeepseekV32Indexer`,
//! `GlmMoeDsaIndexer`): a few small heads score every earlier key, and the
//! latent attention of its layer ([`crate::mla`]) keeps the `index_topk`
//! best.
//!
//! ```python
//! q = self.wq_b(q_resid).view(batch_size, seq_len, self.n_heads, self.head_dim)
//! k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
//! q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)   # the first qk_rope_head_dim dims
//! k = cache.update_indexer(k, self.layer_idx)
//! scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale
//! scores = F.relu(scores)
//! weights = self.weights_proj(hidden_states).float() * (self.n_heads**-0.5)
//! index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
//! return index_scores.topk(topk, dim=-1).indices
//! ```
//!
//! The keys (`index_head_dim` values per position) are cached beside the
//! layer's latents. A query at position `p` with at most `index_topk` earlier
//! keys (itself included) keeps them all; otherwise the `index_topk` of
//! highest score (ties to the earlier position: the fixtures keep a margin
//! at the boundary, where transformers' `topk` order is unspecified).

use charm_common::{LoadError, Weight, WeightSource};

use crate::config::{Dsa, ModelConfig};
use crate::kv_cache::LatentKv;
use crate::rope::Rope;

/// `nn.LayerNorm(self.head_dim, eps=1e-6)`.
const K_NORM_EPS: f32 = 1e-6;

/// Which keys each row of a step attends to: `None` for every earlier key,
/// else the kept positions in ascending order.
pub type Selection = Vec<Option<Vec<u32>>>;

/// One layer's indexer.
pub struct Indexer {
    /// `wq_b`: `heads × head_dim` rows over the query latent.
    wq_b: Weight,
    /// `wk`: `head_dim` rows over the hidden state.
    wk: Weight,
    k_norm_weight: Vec<f32>,
    k_norm_bias: Vec<f32>,
    /// `weights_proj`: one weight per head.
    weights_proj: Weight,
    heads: usize,
    head_dim: usize,
    /// Leading dims of each head that RoPE rotates (`qk_rope_head_dim`).
    rope_dim: usize,
    topk: usize,
    interleaved: bool,
}

impl Indexer {
    /// Loads `model.layers.{layer}.self_attn.indexer.*`.
    pub fn load(files: &dyn WeightSource, cfg: &ModelConfig, dsa: &Dsa, layer: usize) -> Result<Self, LoadError> {
        let p = format!("model.layers.{layer}.self_attn.indexer");
        let mla = cfg.mla.expect("validated: DSA layers are latent attention layers");
        let q_lora = mla.q_lora_rank.expect("validated: DSA needs q_lora_rank");
        let (h, heads, d) = (cfg.hidden_size, dsa.heads, dsa.head_dim);
        Ok(Indexer {
            wq_b: files.matrix(&format!("{p}.wq_b.weight"), heads * d, q_lora)?,
            wk: files.matrix(&format!("{p}.wk.weight"), d, h)?,
            k_norm_weight: files.vector(&format!("{p}.k_norm.weight"), d)?,
            k_norm_bias: files.vector(&format!("{p}.k_norm.bias"), d)?,
            weights_proj: files.matrix(&format!("{p}.weights_proj.weight"), heads, h)?,
            heads,
            head_dim: d,
            rope_dim: mla.qk_rope_head_dim,
            topk: dsa.topk,
            interleaved: dsa.rope_interleave,
        })
    }

    /// For `n` rows (`xs`: normed hidden states, `q_resid`: the normed query
    /// latents) at `positions`, which `cache` already holds: appends their
    /// index keys to `cache` and picks each row's keys.
    pub fn select(
        &self,
        xs: &[f32],
        q_resid: &[f32],
        positions: &[usize],
        rope: &Rope,
        cache: &mut LatentKv,
    ) -> Selection {
        let n = positions.len();
        let (heads, d) = (self.heads, self.head_dim);
        let mut q = vec![0.0f32; n * heads * d];
        self.wq_b.matmul(q_resid, n, &mut q);
        let mut k = vec![0.0f32; n * d];
        self.wk.matmul(xs, n, &mut k);
        let mut w = vec![0.0f32; n * heads];
        self.weights_proj.matmul(xs, n, &mut w);
        for (t, &pos) in positions.iter().enumerate() {
            let row = &mut k[t * d..(t + 1) * d];
            layer_norm(row, &self.k_norm_weight, &self.k_norm_bias, K_NORM_EPS);
            self.rotate(row, rope, pos);
            for hd in 0..heads {
                self.rotate(&mut q[(t * heads + hd) * d..(t * heads + hd + 1) * d], rope, pos);
            }
        }
        for row in k.chunks_exact(d) {
            cache.push_index(row);
        }
        let scale = (d as f32).powf(-0.5);
        let head_scale = (heads as f32).powf(-0.5);
        positions
            .iter()
            .enumerate()
            .map(|(t, &pos)| {
                if pos < self.topk {
                    return None;
                }
                let keys = cache.index_rows(0, pos + 1);
                let mut score = vec![0.0f32; pos + 1];
                let mut dots = vec![0.0f32; pos + 1];
                for hd in 0..heads {
                    keys.dots(&q[(t * heads + hd) * d..(t * heads + hd + 1) * d], &mut dots);
                    let wh = w[t * heads + hd] * head_scale;
                    for (s, &x) in score.iter_mut().zip(&dots) {
                        *s += wh * (x * scale).max(0.0);
                    }
                }
                let mut order: Vec<u32> = (0..=pos as u32).collect();
                order.sort_by(|&a, &b| score[b as usize].total_cmp(&score[a as usize]).then(a.cmp(&b)));
                order.truncate(self.topk);
                order.sort_unstable();
                Some(order)
            })
            .collect()
    }

    /// RoPE on the first `rope_dim` values of one head, interleaved pairs
    /// first made halves for GLM-5.
    fn rotate(&self, x: &mut [f32], rope: &Rope, pos: usize) {
        let x = &mut x[..self.rope_dim];
        if self.interleaved {
            crate::attention::deinterleave_heads(x, x.len());
        }
        rope.apply(x, pos);
    }
}

/// `nn.LayerNorm`: `(x - mean) / sqrt(var + eps) * w + b`, biased variance.
fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, &w), &b) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * w + b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut x = [1.0f32, 2.0, 3.0, 6.0];
        layer_norm(&mut x, &[1.0; 4], &[0.5; 4], 0.0);
        let mean: f32 = x.iter().sum::<f32>() / 4.0;
        assert!((mean - 0.5).abs() < 1e-6);
        let var: f32 = x.iter().map(|v| (v - 0.5) * (v - 0.5)).sum::<f32>() / 4.0;
        assert!((var - 1.0).abs() < 1e-5);
    }
}
