//! Causal self-attention with GQA, optional QK-norm, q/k/v biases, RoPE
//! (full or partial), an optional sliding window and an optional per-head
//! output gate (Qwen3-Next, Qwen3.5); keys and values go through the
//! layer's [`LayerKv`] so decode cost grows only with context length.

use charm_common::kernels::{exp, rms_norm, rms_norm_rows, sigmoid, softmax};
use charm_common::{LoadError, Weight, WeightSource};
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

use crate::config::{ModelConfig, QkNorm};
use crate::ffn::add_rows;
use crate::kv_cache::LayerKv;
use crate::rope::Rope;

/// Where one or more mixer calls spent their time, in milliseconds
/// (added to by [`Attention::forward_timed`] and
/// [`crate::gated_delta_net::GatedDeltaNet::forward_timed`], whose input
/// projections count as `qkv_ms`, conv, delta rule and gated norm as
/// `heads_ms`, `out_proj` as `o_proj_ms`; the names are part of the
/// `generate --json` profile).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct AttentionTimes {
    /// q/k/v products, biases, QK-norm, RoPE and appending to the cache.
    pub qkv_ms: f64,
    /// Per head: scores against the cached keys, softmax, the weighted sum
    /// of the cached values.
    pub heads_ms: f64,
    /// The output projection.
    pub o_proj_ms: f64,
}

impl AttentionTimes {
    /// Adds `other`'s times to these.
    pub fn add(&mut self, other: &AttentionTimes) {
        self.qkv_ms += other.qkv_ms;
        self.heads_ms += other.heads_ms;
        self.o_proj_ms += other.o_proj_ms;
    }
}

/// One attention layer's weights and shape.
pub struct Attention {
    q_proj: Weight,
    k_proj: Weight,
    v_proj: Weight,
    o_proj: Weight,
    /// `[q_dim]`, `[kv_dim]`, `[kv_dim]` when the family has biases.
    qkv_bias: Option<[Vec<f32>; 3]>,
    /// `[hidden]`, `o_proj`'s bias when the family has one.
    o_bias: Option<Vec<f32>>,
    /// `[heads]`: each head's learned sink logit, when the layer has them.
    sinks: Option<Vec<f32>>,
    /// `[q_dim]`/`[kv_dim]` (full) or `[head_dim]` (per head).
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    qk_norm_kind: QkNorm,
    clip_qkv: Option<f32>,
    /// `q_proj` yields `[q | gate]` per head; the output is gated by `sigmoid(gate)`.
    output_gate: bool,
    window: Option<usize>,
    qk_rows_interleaved: bool,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Width of a value head (`head_dim` unless the family says otherwise).
    v_head_dim: usize,
    /// A factor on every value (MiMo-V2-Flash's `attention_value_scale`).
    value_scale: Option<f32>,
    eps: f32,
}

impl Attention {
    /// Loads `model.layers.{layer}.self_attn.*`.
    pub fn load(files: &dyn WeightSource, cfg: &ModelConfig, layer: usize) -> Result<Self, LoadError> {
        let p = format!("model.layers.{layer}.self_attn");
        let kv_heads = cfg.kv_heads(layer);
        let (h, q, kv) = (cfg.hidden_size, cfg.q_dim(), kv_heads * cfg.head_dim);
        let (vd, o_cols) = (kv_heads * cfg.v_head_dim(), cfg.num_heads * cfg.v_head_dim());
        let qkv_bias = if cfg.qkv_bias {
            Some([
                files.vector(&format!("{p}.q_proj.bias"), q)?,
                files.vector(&format!("{p}.k_proj.bias"), kv)?,
                files.vector(&format!("{p}.v_proj.bias"), vd)?,
            ])
        } else {
            None
        };
        let norm = |name: &str, len| crate::config::norm_weight(files, cfg, &format!("{p}.{name}.weight"), len);
        let qk_norm = match cfg.qk_norm {
            QkNorm::None => None,
            QkNorm::Full => Some((norm("q_norm", q)?, norm("k_norm", kv)?)),
            QkNorm::PerHead => Some((norm("q_norm", cfg.head_dim)?, norm("k_norm", cfg.head_dim)?)),
        };
        let q_rows = if cfg.attn_output_gate { 2 * q } else { q };
        Ok(Attention {
            q_proj: files.matrix(&format!("{p}.q_proj.weight"), q_rows, h)?,
            k_proj: files.matrix(&format!("{p}.k_proj.weight"), kv, h)?,
            v_proj: files.matrix(&format!("{p}.v_proj.weight"), vd, h)?,
            o_proj: files.matrix(&format!("{p}.o_proj.weight"), h, o_cols)?,
            qkv_bias,
            o_bias: if cfg.o_proj_bias {
                Some(files.vector(&format!("{p}.o_proj.bias"), h)?)
            } else {
                None
            },
            sinks: if cfg.attn_sinks[layer] {
                // gpt-oss's `self_attn.sinks`; MiMo-V2-Flash checkpoints say `attention_sink_bias`.
                let name = match cfg.family {
                    crate::Family::MiMoV2Flash => "attention_sink_bias",
                    _ => "sinks",
                };
                Some(files.vector(&format!("{p}.{name}"), cfg.num_heads)?)
            } else {
                None
            },
            qk_norm,
            qk_norm_kind: cfg.qk_norm,
            clip_qkv: cfg.clip_qkv,
            output_gate: cfg.attn_output_gate,
            window: cfg.sliding_window[layer],
            qk_rows_interleaved: cfg.qk_rows_interleaved,
            heads: cfg.num_heads,
            kv_heads,
            head_dim: cfg.head_dim,
            v_head_dim: cfg.v_head_dim(),
            value_scale: cfg.value_scale,
            eps: cfg.rms_norm_eps,
        })
    }

    /// Attention over `n` normed rows at `positions` (consecutive, following
    /// what `kv` holds). Appends their keys/values to `kv` and writes the
    /// `o_proj` output (`n × hidden`) to `out`.
    pub fn forward(&self, xs: &[f32], positions: &[usize], rope: &Rope, kv: &mut LayerKv, out: &mut [f32]) {
        self.forward_timed(xs, positions, rope, kv, out, &mut AttentionTimes::default())
    }

    /// [`Attention::forward`], adding the time of its three parts to `times`.
    pub fn forward_timed(
        &self,
        xs: &[f32],
        positions: &[usize],
        rope: &Rope,
        kv: &mut LayerKv,
        out: &mut [f32],
        times: &mut AttentionTimes,
    ) {
        let one = std::iter::once(0..positions.len()).collect::<Vec<_>>();
        self.forward_many_timed(xs, &one, positions, rope, &mut [kv], out, times)
    }

    /// Attention over the rows of several sequences at once: `xs` holds
    /// every sequence's normed rows, `seqs[i]` the rows of sequence `i`
    /// (whose cache is `kvs[i]`), `positions` each row's position. The
    /// projections run once over all the rows (their weights are read once
    /// for the step); RoPE, the cache and the heads run per sequence. Each
    /// row's bits are the ones it gets alone: every product is
    /// row-independent.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_many_timed(
        &self,
        xs: &[f32],
        seqs: &[std::ops::Range<usize>],
        positions: &[usize],
        rope: &Rope,
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
        times: &mut AttentionTimes,
    ) {
        debug_assert_eq!(seqs.len(), kvs.len(), "one cache per sequence");
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let n = positions.len();
        let (qd, cd) = (self.heads * self.head_dim, self.heads * self.v_head_dim);
        let (mut q, k, v, gate) = self.project(xs, n);
        for (rows, kv) in seqs.iter().zip(kvs.iter_mut()) {
            self.rope_and_cache(&mut q, &k, &v, rows.clone(), positions, rope, kv);
        }
        times.qkv_ms += ms(started);
        let started = Instant::now();
        let mut ctx = vec![0.0; n * cd];
        for (rows, kv) in seqs.iter().zip(kvs.iter()) {
            let first = positions[rows.start];
            self.heads_into(
                &q[rows.start * qd..rows.end * qd],
                first,
                kv,
                &mut ctx[rows.start * cd..rows.end * cd],
            );
        }
        // attn_output = attn_output * torch.sigmoid(gate)
        if let Some(gate) = &gate {
            for (c, g) in ctx.iter_mut().zip(gate) {
                *c *= sigmoid(*g);
            }
        }
        times.heads_ms += ms(started);
        let started = Instant::now();
        self.o_proj.matmul(&ctx, n, out);
        if let Some(b) = &self.o_bias {
            add_rows(out, b);
        }
        times.o_proj_ms += ms(started);
    }

    /// q (RoPE not yet applied), k and v of `n` rows, and the output gate
    /// when the family has one: the products, biases, QK-norm and clipping,
    /// all row by row.
    fn project(&self, xs: &[f32], n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
        let (qd, kvd, hd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim);
        let mut q = vec![0.0; n * qd * if self.output_gate { 2 } else { 1 }];
        let mut k = vec![0.0; n * kvd];
        let mut v = vec![0.0; n * self.kv_heads * self.v_head_dim];
        Weight::matmul_many(
            &[&self.q_proj, &self.k_proj, &self.v_proj],
            xs,
            n,
            &mut [&mut q, &mut k, &mut v],
        );
        // query_states, gate = torch.chunk(self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
        let gate = self.output_gate.then(|| split_gate(&mut q, hd));
        if let Some([bq, bk, bv]) = &self.qkv_bias {
            add_rows(&mut q, bq);
            add_rows(&mut k, bk);
            add_rows(&mut v, bv);
        }
        if self.qk_rows_interleaved {
            deinterleave_heads(&mut q, hd);
            deinterleave_heads(&mut k, hd);
        }
        if let Some((nq, nk)) = &self.qk_norm {
            // Full: self.q_norm(self.q_proj(x)); per head: q_norm(q.view(..., head_dim)).
            match self.qk_norm_kind {
                QkNorm::Full => {
                    rms_norm_rows(&mut q, nq, self.eps);
                    rms_norm_rows(&mut k, nk, self.eps);
                }
                QkNorm::PerHead => {
                    q.chunks_exact_mut(hd).for_each(|h| rms_norm(h, nq, self.eps));
                    k.chunks_exact_mut(hd).for_each(|h| rms_norm(h, nk, self.eps));
                }
                QkNorm::None => {}
            }
        }
        if let Some(c) = self.clip_qkv {
            for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *x = x.clamp(-c, c);
            }
        }
        if let Some(scale) = self.value_scale {
            // value_states = self.v_proj(hidden_states).view(v_hidden_shape).transpose(1, 2) * self.v_scale
            v.iter_mut().for_each(|x| *x *= scale);
        }
        (q, k, v, gate)
    }

    /// RoPE on one sequence's `rows` of `q` and `k`, and their keys and
    /// values appended to its cache.
    #[allow(clippy::too_many_arguments)]
    fn rope_and_cache(
        &self,
        q: &mut [f32],
        k: &[f32],
        v: &[f32],
        rows: std::ops::Range<usize>,
        positions: &[usize],
        rope: &Rope,
        kv: &mut LayerKv,
    ) {
        let (qd, kvd, vd) = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.kv_heads * self.v_head_dim,
        );
        debug_assert_eq!(kv.len(), positions[rows.start], "positions must continue the cache");
        kv.begin_step();
        let mut kr = vec![0.0; kvd];
        for t in rows {
            rope.apply(&mut q[t * qd..(t + 1) * qd], positions[t]);
            kr.copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
            rope.apply(&mut kr, positions[t]);
            kv.push(&kr, &v[t * vd..(t + 1) * vd]);
        }
    }

    /// softmax(q k^T / sqrt(head_dim)) v for one sequence's roped queries
    /// `q` (rows from position `first`). One task per run of up to
    /// [`HEADS_PER_TASK`] query heads that share a KV head, and (layers
    /// without a window) per block of up to [`TOKENS_PER_TASK`] rows: the
    /// block's queries are scored against the keys the last row sees, in
    /// runs of [`KEYS_PER_BLOCK`] keys (`dots_by_query`: each score the bits
    /// of a one-query pass; an earlier row's scores past its own position
    /// are dropped), each query's softmax over its own keys, then the
    /// weighted values of the keys every row sees, run by run
    /// (`weighted_many` from zero, then `add_weighted_many` continuing)
    /// and each later row's further keys added in order (`add_weighted`):
    /// every sum runs over its keys in order from zero, as one query alone
    /// takes it, so the bits do not depend on the blocks. Each run of keys
    /// and values comes from memory once for the whole block of rows: in
    /// a long prefill the cache leaves L2 and attention waited on it.
    fn heads_into(&self, q: &[f32], first: usize, kv: &LayerKv, ctx: &mut [f32]) {
        let (qd, hd, vd) = (self.heads * self.head_dim, self.head_dim, self.v_head_dim);
        let scale = 1.0 / (hd as f32).sqrt();
        let group = self.heads / self.kv_heads;
        let run = group.clamp(1, HEADS_PER_TASK);
        // A window starts each row's keys elsewhere: rows one at a time.
        let block = if self.window.is_some() { 1 } else { TOKENS_PER_TASK };
        // Each row's runs of heads (runs never straddle two KV heads' groups).
        let rows: Vec<Vec<(usize, &mut [f32])>> = ctx
            .chunks_mut(self.heads * vd)
            .map(|c| {
                let mut runs = Vec::new();
                let mut rest = c;
                let mut h = 0;
                while h < self.heads {
                    let k = run.min(group - h % group);
                    let (this, tail) = std::mem::take(&mut rest).split_at_mut(k * vd);
                    runs.push((h, this));
                    rest = tail;
                    h += k;
                }
                runs
            })
            .collect();
        // Tasks: (first row of the block, first head of the run, the run's
        // outputs in each row of the block).
        let mut tasks: Vec<(usize, usize, Vec<&mut [f32]>)> = Vec::new();
        let mut rows = rows.into_iter().enumerate();
        while let Some((t0, runs)) = rows.next() {
            let mut these: Vec<(usize, Vec<&mut [f32]>)> = runs.into_iter().map(|(h, o)| (h, vec![o])).collect();
            for _ in 1..block {
                let Some((_, runs)) = rows.next() else { break };
                for ((_, outs), (_, o)) in these.iter_mut().zip(runs) {
                    outs.push(o);
                }
            }
            tasks.extend(these.into_iter().map(|(h, outs)| (t0, h, outs)));
        }
        tasks.into_par_iter().for_each(|(t0, h0, mut outs)| {
            let nt = outs.len();
            let k = outs[0].len() / vd;
            let pos = |i: usize| first + t0 + i;
            let start = match self.window {
                Some(w) => (pos(0) + 1).saturating_sub(w),
                None => 0,
            };
            // Keys row `i` of the block sees: `start..=pos(i)`.
            let seen = |i: usize| pos(i) + 1 - start;
            let keys = seen(nt - 1);
            let qs: Vec<&[f32]> = (0..nt)
                .flat_map(|i| (h0..h0 + k).map(move |h| (t0 + i, h)))
                .map(|(t, h)| &q[t * qd + h * hd..t * qd + (h + 1) * hd])
                .collect();
            let m = qs.len();
            // Query `j` = row `j / k`, head `h0 + j % k`: its scores in row
            // `j` of `probs` (rows a whole number of lines, never a
            // multiple of 4 KiB apart), scaled, then its softmax over the
            // keys it sees.
            let line = keys.next_multiple_of(16);
            let stride = if line % 1024 == 0 { line + 16 } else { line };
            let mut probs = vec![0.0f32; m * stride];
            // Keys in blocks that stay in L1 while every query meets them.
            let mut from = 0;
            while from < keys {
                let to = (from + KEYS_PER_BLOCK).min(keys);
                kv.keys(h0 / group, start + from, start + to)
                    .dots_by_query(hd, &qs, &mut probs[from..], stride);
                from = to;
            }
            let mut probs: Vec<&mut [f32]> = probs.chunks_exact_mut(stride).collect();
            for (j, p) in probs.iter_mut().enumerate() {
                let scores = &mut p[..seen(j / k)];
                for s in scores.iter_mut() {
                    *s *= scale;
                }
                match &self.sinks {
                    // combined_logits = torch.cat([attn_weights, sinks], dim=-1)
                    // probs = F.softmax(combined_logits, dim=-1); scores = probs[..., :-1]
                    Some(sinks) => softmax_with_sink(scores, sinks[h0 + j % k]),
                    None => softmax(scores),
                }
            }
            // The keys every row sees, their values in blocks (each
            // block's rows read once for every query, the sums continued
            // in order from block to block).
            let shared = seen(0);
            let mut outs: Vec<&mut [f32]> = outs.iter_mut().flat_map(|o| o.chunks_exact_mut(vd)).collect();
            let mut x0 = 0;
            while x0 < shared {
                let x1 = (x0 + KEYS_PER_BLOCK).min(shared);
                let weights: Vec<&[f32]> = probs.iter().map(|p| &p[x0..x1]).collect();
                let rows = kv.values(h0 / group, start + x0, start + x1);
                if x0 == 0 {
                    rows.weighted_many(vd, &weights, &mut outs);
                } else {
                    rows.add_weighted_many(vd, &weights, &mut outs);
                }
                x0 = x1;
            }
            // Each later row's further keys, continuing its sums in order.
            for (j, o) in outs.iter_mut().enumerate() {
                let n = seen(j / k);
                if n > shared {
                    kv.values(h0 / group, start + shared, start + n)
                        .add_weighted(&probs[j][shared..n], o);
                }
            }
        });
    }
}

/// Query heads per attention task: one register block of the score tile
/// (`charm_common::kernels::scores_tile_*`).
pub(crate) const HEADS_PER_TASK: usize = 4;

/// Rows of a prefill per attention task (layers without a window): each
/// key and value comes from memory once for all of them (with four rows a
/// task, a 3,000-token prefill read every head's cache from L3 once per
/// four rows, and its heads ran at ~12 G multiply-adds/s a thread).
pub(crate) const TOKENS_PER_TASK: usize = 16;

/// Cached rows per block of a task's scores and weighted values: a
/// block's keys (12 KB of f16 at 128 wide) stay in L1 while every query
/// of the task meets them. A multiple of the score tile's three rows.
const KEYS_PER_BLOCK: usize = 48;

/// Softmax over `scores` and one more logit, `sink`, whose probability is
/// then dropped: the scores sum to less than one. The max is taken over
/// both, as transformers subtracts it
/// (`combined_logits - combined_logits.max(dim=-1, keepdim=True).values`).
pub fn softmax_with_sink(scores: &mut [f32], sink: f32) {
    let max = scores.iter().copied().fold(sink, f32::max);
    for s in scores.iter_mut() {
        *s = exp(*s - max);
    }
    // The sink's term first, then the scores' in order.
    let sum = scores.iter().fold(exp(sink - max), |a, s| a + s);
    let inv = 1.0 / sum;
    for s in scores.iter_mut() {
        *s *= inv;
    }
}

/// Splits `q_proj`'s `[q | gate]`-per-head output in place: `q` keeps the
/// queries (`heads × head_dim` per row); the gates are returned in the same
/// layout.
fn split_gate(q: &mut Vec<f32>, head_dim: usize) -> Vec<f32> {
    let mut queries = Vec::with_capacity(q.len() / 2);
    let mut gates = Vec::with_capacity(q.len() / 2);
    for pair in q.chunks_exact(2 * head_dim) {
        queries.extend_from_slice(&pair[..head_dim]);
        gates.extend_from_slice(&pair[head_dim..]);
    }
    *q = queries;
    gates
}

/// Reorders every `head_dim`-wide head from interleaved rotary pairs
/// `(x0, y0, x1, y1, ...)` to halves `(x0, x1, ..., y0, y1, ...)`.
pub(crate) fn deinterleave_heads(xs: &mut [f32], head_dim: usize) {
    let half = head_dim / 2;
    let mut tmp = vec![0.0; head_dim];
    for head in xs.chunks_exact_mut(head_dim) {
        for i in 0..half {
            tmp[i] = head[2 * i];
            tmp[half + i] = head[2 * i + 1];
        }
        head.copy_from_slice(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::{deinterleave_heads, split_gate};

    #[test]
    fn gated_queries_split_per_head() {
        // Two heads of 2: [q0 q0 g0 g0 | q1 q1 g1 g1] per row, two rows.
        let mut q = vec![1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15., 16.];
        let g = split_gate(&mut q, 2);
        assert_eq!(q, vec![1., 2., 5., 6., 9., 10., 13., 14.]);
        assert_eq!(g, vec![3., 4., 7., 8., 11., 12., 15., 16.]);
    }

    #[test]
    fn interleaved_pairs_become_halves() {
        let mut x = vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0, 3.0, 13.0, 5.0, 15.0, 6.0, 16.0];
        deinterleave_heads(&mut x[..8], 8);
        deinterleave_heads(&mut x[8..], 4);
        assert_eq!(
            x,
            vec![0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0, 5.0, 6.0, 15.0, 16.0]
        );
    }
}
