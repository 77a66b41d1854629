//! Multi-head latent attention, the mixer of DeepSeek-V2/V3 (R1, Kimi K2)
//! and GLM-4.7-Flash (transformers `DeepseekV3Attention`,
//! `Glm4MoeLiteAttention`).
//!
//! ```python
//! q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))   # or self.q_proj(hidden_states)
//! q_pass, q_rot = torch.split(q_states, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
//! compressed_kv = self.kv_a_proj_with_mqa(hidden_states)
//! kv_nope, k_rot = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
//! kv_nope = self.kv_a_layernorm(kv_nope)
//! q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)   # or apply_rotary_pos_emb
//! kv_nope, k_rot = cache.update(kv_nope, k_rot, self.layer_idx)
//! key_states, value_states = self.expand_kv(kv_nope, k_rot)                # kv_b_proj per head
//! ```
//!
//! The cache holds only the latent and the rope key, `kv_lora_rank +
//! qk_rope_head_dim` values per position, shared by every head. Attention
//! runs in the absorbed form, the same for prefill and decode (so chunked
//! and token-by-token prefill give the same bits): each head's key
//! up-projection `W_UK` is folded into its query (`q_abs = W_UKᵀ q_nope`),
//! the score is `[q_abs | q_rot] · [latent | k_rot]`, the probabilities
//! weight the cached latents, and the value up-projection `W_UV` runs once
//! on that weighted sum. Mathematically this is `expand_kv` followed by
//! attention; the sums are taken in another order.

use std::time::Instant;

use charm_common::kernels::{rms_norm, rms_norm_rows, softmax};
use charm_common::{LoadError, MlaHeads, Weight, WeightSource};
use rayon::prelude::*;

use crate::attention::{deinterleave_heads, AttentionTimes, HEADS_PER_TASK};
use crate::config::{MlaShape, ModelConfig, Yarn};
use crate::dsa_indexer::{Indexer, Selection};
use crate::kv_cache::LatentKv;
use crate::rope::Rope;

/// The eps of `q_a_layernorm` and `kv_a_layernorm`: transformers builds
/// them as `DeepseekV3RMSNorm(rank)`, whose default eps is 1e-6 whatever
/// `rms_norm_eps` says.
const LATENT_NORM_EPS: f32 = 1e-6;

/// How queries are projected.
enum Queries {
    /// `q_proj`, `heads × qk_head_dim` rows.
    Plain(Weight),
    /// `q_a_proj`, `q_a_layernorm`, `q_b_proj`.
    LowRank(Box<(Weight, Vec<f32>, Weight)>),
}

/// One latent attention layer's weights.
pub struct Mla {
    queries: Queries,
    /// `kv_a_proj_with_mqa`: `kv_lora_rank + qk_rope_head_dim` rows.
    kv_a: Weight,
    kv_a_norm: Vec<f32>,
    /// Per head, `W_UKᵀ`: `kv_lora_rank × qk_nope_head_dim` (GGUF's
    /// `attn_k_b` as stored; else from `kv_b_proj`, in f32).
    uk_t: Vec<Weight>,
    /// Per head, `W_UV`: `v_head_dim × kv_lora_rank` (GGUF's `attn_v_b` as
    /// stored; else from `kv_b_proj`, in f32).
    uv: Vec<Weight>,
    o_proj: Weight,
    shape: MlaShape,
    heads: usize,
    interleaved: bool,
    /// `qk_head_dim ** -0.5`, times YaRN's `mscale²` when configured.
    scale: f32,
    /// DeepSeek Sparse Attention: this layer's indexer (`None` on layers
    /// without one, and on GLM-5's layers that share an earlier selection).
    indexer: Option<Indexer>,
}

/// Per head `W_UKᵀ` (`r × nope`) and `W_UV` (`v × r`) from `kv_b_proj`, as
/// f32 (the key part transposed).
fn split_kv_b(
    files: &dyn WeightSource,
    p: &str,
    heads: usize,
    (r, nope, v): (usize, usize, usize),
) -> Result<MlaHeads, LoadError> {
    // kv_nope = self.kv_b_proj(kv_nope).view(..., -1, qk_nope_head_dim + v_head_dim): per head [k_nope | value] rows.
    let kv_b = files
        .matrix(&format!("{p}.kv_b_proj.weight"), heads * (nope + v), r)?
        .data()
        .to_f32_vec();
    let (mut uk_t, mut uv) = (Vec::with_capacity(heads), Vec::with_capacity(heads));
    for head in kv_b.chunks_exact((nope + v) * r) {
        let (k, val) = head.split_at(nope * r);
        let mut t = vec![0.0f32; r * nope];
        for (i, row) in k.chunks_exact(r).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                t[c * nope + i] = x;
            }
        }
        uk_t.push(Weight::from_f32(r, nope, t));
        uv.push(Weight::from_f32(v, r, val.to_vec()));
    }
    Ok((uk_t, uv))
}

impl Mla {
    /// Loads `model.layers.{layer}.self_attn.*`.
    pub fn load(files: &dyn WeightSource, cfg: &ModelConfig, shape: MlaShape, layer: usize) -> Result<Self, LoadError> {
        let p = format!("model.layers.{layer}.self_attn");
        let (h, heads, r) = (cfg.hidden_size, cfg.num_heads, shape.kv_lora_rank);
        let (nope, v) = (shape.qk_nope_head_dim, shape.v_head_dim);
        let q_rows = heads * shape.qk_head_dim();
        let queries = match shape.q_lora_rank {
            None => Queries::Plain(files.matrix(&format!("{p}.q_proj.weight"), q_rows, h)?),
            Some(q) => Queries::LowRank(Box::new((
                files.matrix(&format!("{p}.q_a_proj.weight"), q, h)?,
                files.vector(&format!("{p}.q_a_layernorm.weight"), q)?,
                files.matrix(&format!("{p}.q_b_proj.weight"), q_rows, q)?,
            ))),
        };
        let (uk_t, uv) = match files.mla_heads(layer, heads, (r, nope, v))? {
            // GGUF's attn_k_b / attn_v_b: already per head, in their type.
            Some(split) => split,
            None => split_kv_b(files, &p, heads, (r, nope, v))?,
        };
        // self.scaling = yarn_apply_mscale(config.rope_parameters, self.qk_head_dim ** (-0.5))
        let mut scale = (shape.qk_head_dim() as f64).powf(-0.5);
        if let Some(y) = &cfg.rope_yarn {
            if y.mscale_all_dim != 0.0 {
                let m = Yarn::get_mscale(y.factor, y.mscale_all_dim);
                scale = scale * m * m;
            }
        }
        Ok(Mla {
            queries,
            kv_a: files.matrix(&format!("{p}.kv_a_proj_with_mqa.weight"), r + shape.qk_rope_head_dim, h)?,
            kv_a_norm: files.vector(&format!("{p}.kv_a_layernorm.weight"), r)?,
            uk_t,
            uv,
            o_proj: files.matrix(&format!("{p}.o_proj.weight"), h, heads * v)?,
            shape,
            heads,
            interleaved: cfg.rope_interleave,
            scale: scale as f32,
            indexer: match &cfg.dsa {
                Some(d) if !d.shared[layer] => Some(Indexer::load(files, cfg, d, layer)?),
                _ => None,
            },
        })
    }

    /// Latent attention over `n` normed rows at `positions` (consecutive,
    /// following what `cache` holds): appends their latents and rope keys
    /// to `cache` and writes the `o_proj` output (`n × hidden`) to `out`.
    /// Times its parts as attention does (`qkv_ms`: projections, norm,
    /// RoPE, absorbed queries and the cache append; `heads_ms`: scores,
    /// softmax, weighted latents and `W_UV`; `o_proj_ms`). With sparse
    /// attention each row attends to the keys its layer's indexer picks, or
    /// to `shared` (an earlier layer's picks for the same rows).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_timed(
        &self,
        xs: &[f32],
        positions: &[usize],
        rope: &Rope,
        cache: &mut LatentKv,
        shared: Option<&Selection>,
        out: &mut [f32],
        times: &mut AttentionTimes,
    ) {
        let one = std::iter::once(0..positions.len()).collect::<Vec<_>>();
        self.forward_many_timed(xs, &one, positions, rope, &mut [(cache, shared)], out, times)
    }

    /// Latent attention over the rows of several sequences at once: `xs`
    /// holds every sequence's normed rows, `seqs[i]` the rows of sequence
    /// `i`, `caches[i]` its cache with the picks it may share, `positions`
    /// each row's position. The query, latent, absorbed-query, `W_UV` and
    /// output products run once over all the rows (their weights are read
    /// once for the step); the cache, the indexer and the heads run per
    /// sequence. Each row's bits are the ones it gets alone.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_many_timed(
        &self,
        xs: &[f32],
        seqs: &[std::ops::Range<usize>],
        positions: &[usize],
        rope: &Rope,
        caches: &mut [(&mut LatentKv, Option<&Selection>)],
        out: &mut [f32],
        times: &mut AttentionTimes,
    ) {
        debug_assert_eq!(seqs.len(), caches.len(), "one cache per sequence");
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let n = positions.len();
        let s = self.shape;
        let (heads, r, nope, vd) = (self.heads, s.kv_lora_rank, s.qk_nope_head_dim, s.v_head_dim);
        let (qk, w) = (s.qk_head_dim(), s.cache_width());

        let mut q = vec![0.0f32; n * heads * qk];
        // The normed query latent (`q_resid`), which the indexer reads.
        let mut qa = Vec::new();
        match &self.queries {
            Queries::Plain(wq) => wq.matmul(xs, n, &mut q),
            Queries::LowRank(b) => {
                let (a, norm, wb) = &**b;
                qa = vec![0.0f32; n * a.rows()];
                a.matmul(xs, n, &mut qa);
                rms_norm_rows(&mut qa, norm, LATENT_NORM_EPS);
                wb.matmul(&qa, n, &mut q);
            }
        }
        let mut ckv = vec![0.0f32; n * w];
        self.kv_a.matmul(xs, n, &mut ckv);

        // Per row: each head's [q_abs | q_rot] (w wide), and the row's
        // [latent | k_rot] for the cache.
        let mut qq = vec![0.0f32; n * heads * w];
        for (t, &pos) in positions.iter().enumerate() {
            let row = &mut ckv[t * w..(t + 1) * w];
            rms_norm(&mut row[..r], &self.kv_a_norm, LATENT_NORM_EPS);
            self.rotate(&mut row[r..], rope, pos);
            for hd in 0..heads {
                let dst = &mut qq[(t * heads + hd) * w..(t * heads + hd + 1) * w];
                dst[r..].copy_from_slice(&q[(t * heads + hd) * qk + nope..(t * heads + hd + 1) * qk]);
                self.rotate(&mut dst[r..], rope, pos);
            }
        }
        // q_abs = W_UKᵀ q_nope, per head over every row.
        for hd in 0..heads {
            let q_nope: Vec<f32> = (0..n)
                .flat_map(|t| q[(t * heads + hd) * qk..(t * heads + hd) * qk + nope].iter().copied())
                .collect();
            let mut abs = vec![0.0f32; n * r];
            self.uk_t[hd].matmul(&q_nope, n, &mut abs);
            for t in 0..n {
                qq[(t * heads + hd) * w..(t * heads + hd) * w + r].copy_from_slice(&abs[t * r..(t + 1) * r]);
            }
        }
        let h = xs.len() / n.max(1);
        let qa_w = qa.len() / n.max(1);
        for (rows, (cache, _)) in seqs.iter().zip(caches.iter_mut()) {
            debug_assert_eq!(cache.len(), positions[rows.start], "positions must continue the cache");
            for row in ckv[rows.start * w..rows.end * w].chunks_exact(w) {
                cache.push(row);
            }
            // This layer's picks are kept in its cache (a later layer may
            // share them); a sharing layer reads the earlier layer's where
            // they are.
            if let Some(ix) = &self.indexer {
                let picks = ix.select(
                    &xs[rows.start * h..rows.end * h],
                    &qa[rows.start * qa_w..rows.end * qa_w],
                    &positions[rows.clone()],
                    rope,
                    cache,
                );
                cache.set_selection(picks);
            }
        }
        times.qkv_ms += ms(started);
        let started = Instant::now();

        // softmax(scale * [q_abs | q_rot] · [latent | k_rot]) over the cache,
        // the weighted latents, sequence by sequence. One task per row and
        // group of HEADS_PER_TASK heads: the group's queries are scored in
        // one pass over the latent rows they share (`dots_many`: each
        // score the bits of a one-query pass), each head's softmax, then
        // the group's weighted latents in one more pass (`weighted_many`:
        // each the bits of a one-head sum). The rope columns of `ctx` stay
        // zero: nothing reads them.
        let mut ctx = vec![0.0f32; n * heads * w];
        for (rows, (cache, shared)) in seqs.iter().zip(caches.iter()) {
            let cache_ref: &LatentKv = cache;
            let first = positions[rows.start];
            let selection: Option<&Selection> = match &self.indexer {
                Some(_) => Some(cache_ref.selection()),
                None => *shared,
            };
            let qq = &qq[rows.start * heads * w..rows.end * heads * w];
            let tasks: Vec<(usize, usize, &mut [f32])> = ctx[rows.start * heads * w..rows.end * heads * w]
                .chunks_mut(heads * w)
                .enumerate()
                .flat_map(|(t, c)| {
                    c.chunks_mut(HEADS_PER_TASK * w)
                        .enumerate()
                        .map(move |(g, o)| (t, g * HEADS_PER_TASK, o))
                })
                .collect();
            tasks.into_par_iter().for_each(|(t, h0, o)| {
                let keys = first + t + 1;
                let qs: Vec<&[f32]> = o
                    .chunks_exact(w)
                    .enumerate()
                    .map(|(k, _)| &qq[(t * heads + h0 + k) * w..(t * heads + h0 + k + 1) * w])
                    .collect();
                let mut all = vec![0.0f32; keys * qs.len()];
                cache_ref.rows(0, keys).dots_many(w, &qs, &mut all);
                let probs: Vec<Vec<f32>> = (0..qs.len())
                    .map(|k| {
                        let mut scores: Vec<f32> = (0..keys).map(|j| all[j * qs.len() + k] * self.scale).collect();
                        // Keys the indexer did not pick weigh nothing (transformers
                        // adds finfo.min, whose exp is 0 as -inf's is).
                        if let Some(Some(keep)) = selection.map(|s| &s[t]) {
                            let mut kept = vec![f32::NEG_INFINITY; keys];
                            for &j in keep {
                                kept[j as usize] = scores[j as usize];
                            }
                            scores = kept;
                        }
                        softmax(&mut scores);
                        scores
                    })
                    .collect();
                // The group's weighted latents in one pass over the cache,
                // the latent columns only (`W_UV` reads no more).
                let weights: Vec<&[f32]> = probs.iter().map(|p| &p[..]).collect();
                let mut outs: Vec<&mut [f32]> = o.chunks_exact_mut(w).map(|o| &mut o[..r]).collect();
                cache_ref.rows(0, keys).weighted_many(w, &weights, &mut outs);
            });
        }
        // attn_output per head = W_UV · (weighted latents).
        let mut attn = vec![0.0f32; n * heads * vd];
        for hd in 0..heads {
            let lat: Vec<f32> = (0..n)
                .flat_map(|t| ctx[(t * heads + hd) * w..(t * heads + hd) * w + r].iter().copied())
                .collect();
            let mut o = vec![0.0f32; n * vd];
            self.uv[hd].matmul(&lat, n, &mut o);
            for t in 0..n {
                attn[(t * heads + hd) * vd..(t * heads + hd + 1) * vd].copy_from_slice(&o[t * vd..(t + 1) * vd]);
            }
        }
        times.heads_ms += ms(started);
        let started = Instant::now();
        self.o_proj.matmul(&attn, n, out);
        times.o_proj_ms += ms(started);
    }

    /// RoPE on one rope slice, its interleaved pairs first made halves
    /// (`torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin])` of the even
    /// and odd elements is `rotate_half` RoPE on the halves).
    fn rotate(&self, x: &mut [f32], rope: &Rope, pos: usize) {
        if self.interleaved {
            deinterleave_heads(x, x.len());
        }
        rope.apply(x, pos);
    }
}
