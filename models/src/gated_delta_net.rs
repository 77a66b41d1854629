//! Gated DeltaNet, the linear-attention mixer of Qwen3-Next and Qwen3.5
//! (transformers `Qwen3NextGatedDeltaNet`, `Qwen3_5MoeGatedDeltaNet`): a
//! causal depthwise conv over `[q | k | v]`, then the gated delta rule on a
//! per-head `k_head_dim × v_head_dim` state instead of a KV cache.
//!
//! The recurrence runs token by token in one fixed order (transformers'
//! chunked form is only its own speed-up of the same rule), so a prompt
//! prefilled at once, in chunks, or token by token gives the same bits.

use charm_common::kernels::{delta_rule, rms_norm, sigmoid, silu, DeltaInputs};
use charm_common::{LoadError, Weight, WeightSource};
use rayon::prelude::*;

use std::time::Instant;

use crate::attention::AttentionTimes;
use crate::recurrent_state::RecurrentState;

/// The shape of a model's gated DeltaNet layers (`linear_*` config keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// `linear_num_key_heads`.
    pub k_heads: usize,
    /// `linear_num_value_heads` (a multiple of `k_heads`).
    pub v_heads: usize,
    /// `linear_key_head_dim`.
    pub k_head_dim: usize,
    /// `linear_value_head_dim`.
    pub v_head_dim: usize,
    /// `linear_conv_kernel_dim`.
    pub conv_kernel: usize,
    /// How the input projections are laid out.
    pub layout: ProjectionLayout,
}

/// How a family lays out a DeltaNet layer's input projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectionLayout {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, each grouped per key
    /// head: `[q | k | v (r heads) | z (r heads)]` and `[b (r) | a (r)]` for
    /// every key head, `r = v_heads / k_heads`.
    Grouped,
    /// Qwen3.5: `in_proj_qkv` (`[q | k | v]`), `in_proj_z`, `in_proj_b`,
    /// `in_proj_a`.
    Separate,
}

impl DeltaNetShape {
    /// `key_dim = head_k_dim * num_k_heads`.
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.k_head_dim
    }

    /// `value_dim = head_v_dim * num_v_heads`.
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.v_head_dim
    }

    /// Channels of the conv: `key_dim * 2 + value_dim`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Checks the heads fit together; the message names the keys.
    pub fn validate(&self) -> Result<(), String> {
        let s = self;
        if s.k_heads == 0 || s.v_heads == 0 || s.k_head_dim == 0 || s.v_head_dim == 0 || s.conv_kernel == 0 {
            return Err("linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim must be positive".into());
        }
        if !s.v_heads.is_multiple_of(s.k_heads) {
            return Err(format!(
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                s.v_heads, s.k_heads
            ));
        }
        Ok(())
    }
}

/// The input projections, boxed: `Grouped` as two, `Separate` as four.
enum Projections {
    Grouped(Box<[Weight; 2]>),
    Separate(Box<[Weight; 4]>),
}

/// One gated DeltaNet layer's weights.
pub struct GatedDeltaNet {
    proj: Projections,
    /// Depthwise conv weights, `conv_dim × kernel` (`conv1d.weight[:, 0, :]`).
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    /// `-A_log.exp()`, per value head.
    neg_a: Vec<f32>,
    /// The gated RMSNorm's weight, `[v_head_dim]`.
    norm: Vec<f32>,
    out_proj: Weight,
    /// When `out_proj` keeps a source's column order: the stored column of
    /// each of the rule's output columns ([`WeightSource::matrix_in_stored_order`]).
    out_order: Option<Vec<usize>>,
    shape: DeltaNetShape,
    eps: f32,
}

/// One token's projections in the order the rule reads them.
struct Projected {
    /// `[q | k | v]`, the conv's input (`conv_dim`).
    qkv: Vec<f32>,
    /// Output gate, `value_dim`.
    z: Vec<f32>,
    /// `beta` logits and `a` (decay) inputs, per value head.
    b: Vec<f32>,
    a: Vec<f32>,
}

impl GatedDeltaNet {
    /// Loads `model.layers.{layer}.linear_attn.*`.
    pub fn load(
        files: &dyn WeightSource,
        shape: DeltaNetShape,
        hidden: usize,
        eps: f32,
        layer: usize,
    ) -> Result<Self, LoadError> {
        let p = format!("model.layers.{layer}.linear_attn");
        let (kd, vd, vh) = (shape.key_dim(), shape.value_dim(), shape.v_heads);
        let proj = match shape.layout {
            ProjectionLayout::Grouped => Projections::Grouped(Box::new([
                files.matrix(&format!("{p}.in_proj_qkvz.weight"), 2 * kd + 2 * vd, hidden)?,
                files.matrix(&format!("{p}.in_proj_ba.weight"), 2 * vh, hidden)?,
            ])),
            ProjectionLayout::Separate => Projections::Separate(Box::new([
                files.matrix(&format!("{p}.in_proj_qkv.weight"), 2 * kd + vd, hidden)?,
                files.matrix(&format!("{p}.in_proj_z.weight"), vd, hidden)?,
                files.matrix(&format!("{p}.in_proj_b.weight"), vh, hidden)?,
                files.matrix(&format!("{p}.in_proj_a.weight"), vh, hidden)?,
            ])),
        };
        // self.A_log = nn.Parameter(torch.log(A)); g = -self.A_log.float().exp() * ...
        let a_log = files.vector(&format!("{p}.A_log"), vh)?;
        let (out_proj, out_order) = files.matrix_in_stored_order(&format!("{p}.out_proj.weight"), hidden, vd)?;
        Ok(GatedDeltaNet {
            proj,
            conv: files.array(&format!("{p}.conv1d.weight"), &[shape.conv_dim(), 1, shape.conv_kernel])?,
            dt_bias: files.vector(&format!("{p}.dt_bias"), vh)?,
            neg_a: a_log.iter().map(|x| -x.exp()).collect(),
            norm: files.vector(&format!("{p}.norm.weight"), shape.v_head_dim)?,
            out_proj,
            out_order,
            shape,
            eps,
        })
    }

    /// The layer's state before the first position.
    pub fn new_state(&self) -> RecurrentState {
        let s = &self.shape;
        RecurrentState::new(s.conv_dim(), s.conv_kernel, s.v_heads, s.k_head_dim, s.v_head_dim)
    }

    /// The input projections of `n` rows, one [`Projected`] per row.
    fn project(&self, xs: &[f32], n: usize) -> Vec<Projected> {
        let s = &self.shape;
        let (kd, vd, vh) = (s.key_dim(), s.value_dim(), s.v_heads);
        match &self.proj {
            Projections::Separate(w) => {
                let [qkv, z, b, a] = &**w;
                let (mut q, mut zz, mut bb, mut aa) = (
                    vec![0.0; n * (2 * kd + vd)],
                    vec![0.0; n * vd],
                    vec![0.0; n * vh],
                    vec![0.0; n * vh],
                );
                Weight::matmul_many(&[qkv, z, b, a], xs, n, &mut [&mut q, &mut zz, &mut bb, &mut aa]);
                (0..n)
                    .map(|t| Projected {
                        qkv: q[t * (2 * kd + vd)..(t + 1) * (2 * kd + vd)].to_vec(),
                        z: zz[t * vd..(t + 1) * vd].to_vec(),
                        b: bb[t * vh..(t + 1) * vh].to_vec(),
                        a: aa[t * vh..(t + 1) * vh].to_vec(),
                    })
                    .collect()
            }
            Projections::Grouped(w) => {
                let [qkvz, ba] = &**w;
                let (w1, w2) = (2 * kd + 2 * vd, 2 * vh);
                let (mut m1, mut m2) = (vec![0.0; n * w1], vec![0.0; n * w2]);
                Weight::matmul_many(&[qkvz, ba], xs, n, &mut [&mut m1, &mut m2]);
                (0..n)
                    .map(|t| ungroup(&m1[t * w1..(t + 1) * w1], &m2[t * w2..(t + 1) * w2], s))
                    .collect()
            }
        }
    }

    /// The layer over `n` normed rows that follow what `state` has seen;
    /// advances `state` and writes the `out_proj` output (`n × hidden`).
    pub fn forward(&self, xs: &[f32], n: usize, state: &mut RecurrentState, out: &mut [f32]) {
        self.forward_timed(xs, n, state, out, &mut AttentionTimes::default())
    }

    /// [`GatedDeltaNet::forward`], adding its parts' times to `times`: the
    /// input projections as `qkv_ms`, conv, rule and gated norm as
    /// `heads_ms`, `out_proj` as `o_proj_ms`.
    pub fn forward_timed(
        &self,
        xs: &[f32],
        n: usize,
        state: &mut RecurrentState,
        out: &mut [f32],
        times: &mut AttentionTimes,
    ) {
        let one = std::iter::once(0..n).collect::<Vec<_>>();
        self.forward_many_timed(xs, &one, &mut [state], out, times)
    }

    /// The layer over the rows of several sequences at once: `xs` holds
    /// every sequence's normed rows, `seqs[i]` the rows of sequence `i`
    /// (whose state is `states[i]`). The input and output projections run
    /// once over all the rows (their weights are read once for the step);
    /// the conv, the delta rule and the gated norm run per sequence. Each
    /// row's bits are the ones it gets alone.
    pub fn forward_many_timed(
        &self,
        xs: &[f32],
        seqs: &[std::ops::Range<usize>],
        states: &mut [&mut RecurrentState],
        out: &mut [f32],
        times: &mut AttentionTimes,
    ) {
        debug_assert_eq!(seqs.len(), states.len(), "one state per sequence");
        let vd = self.shape.value_dim();
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let n: usize = seqs.iter().map(|r| r.len()).sum();
        let rows = self.project(xs, n);
        times.qkv_ms += ms(started);
        let started = Instant::now();
        let mut core = vec![0.0f32; n * vd];
        for (r, state) in seqs.iter().zip(states.iter_mut()) {
            self.recurrent_core(&rows[r.clone()], state, &mut core[r.start * vd..r.end * vd]);
        }
        times.heads_ms += ms(started);
        let started = Instant::now();
        if let Some(order) = &self.out_order {
            let mut stored = vec![0.0f32; core.len()];
            for (src, dst) in core.chunks_exact(vd).zip(stored.chunks_exact_mut(vd)) {
                for (&x, &c) in src.iter().zip(order) {
                    dst[c] = x;
                }
            }
            core = stored;
        }
        self.out_proj.matmul(&core, n, out);
        times.o_proj_ms += ms(started);
    }

    /// One sequence's projected rows through the conv, the delta rule and
    /// the gated norm, advancing `state`; the result (`rows × value_dim`)
    /// into `core`.
    fn recurrent_core(&self, rows: &[Projected], state: &mut RecurrentState, core: &mut [f32]) {
        let s = self.shape;
        let (kd, vd, dk, dv) = (s.key_dim(), s.value_dim(), s.k_head_dim, s.v_head_dim);
        let ratio = s.v_heads / s.k_heads;
        let n = rows.len();
        let (conv_hist, conv_dim, rec) = state.parts();
        let hist = s.conv_kernel - 1;

        // mixed_qkv = F.silu(self.conv1d(mixed_qkv)[:, :, :seq_len]), one
        // position at a time through the conv history.
        let mut mixed: Vec<Vec<f32>> = Vec::with_capacity(n);
        for p in rows {
            let mut y = vec![0.0f32; conv_dim];
            for (c, yc) in y.iter_mut().enumerate() {
                let w = &self.conv[c * s.conv_kernel..(c + 1) * s.conv_kernel];
                let mut acc = 0.0f32;
                for (j, wj) in w[..hist].iter().enumerate() {
                    acc += wj * conv_hist[j * conv_dim + c];
                }
                acc += w[hist] * p.qkv[c];
                *yc = silu(acc);
            }
            if hist > 0 {
                conv_hist.copy_within(conv_dim.., 0);
                conv_hist[(hist - 1) * conv_dim..].copy_from_slice(&p.qkv);
            }
            mixed.push(y);
        }

        // query = l2norm(query) * scale; key = l2norm(key); per key head.
        let scale = 1.0 / (dk as f32).sqrt();
        let qk: Vec<(Vec<f32>, Vec<f32>)> = mixed
            .iter()
            .map(|m| {
                let (mut q, mut k) = (m[..kd].to_vec(), m[kd..2 * kd].to_vec());
                q.chunks_exact_mut(dk).for_each(|h| {
                    l2norm(h);
                    h.iter_mut().for_each(|x| *x *= scale);
                });
                k.chunks_exact_mut(dk).for_each(l2norm);
                (q, k)
            })
            .collect();

        // The delta rule, every value head on its own state, positions in
        // order (`kernels::delta_rule`, which quotes the rule's lines).
        let mut per_head: Vec<Vec<f32>> = rec
            .par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(h, st)| {
                let kh = h / ratio;
                let (mut q, mut k, mut v) = (
                    Vec::with_capacity(n * dk),
                    Vec::with_capacity(n * dk),
                    Vec::with_capacity(n * dv),
                );
                let (mut decay, mut beta) = (Vec::with_capacity(n), Vec::with_capacity(n));
                for t in 0..n {
                    q.extend_from_slice(&qk[t].0[kh * dk..(kh + 1) * dk]);
                    k.extend_from_slice(&qk[t].1[kh * dk..(kh + 1) * dk]);
                    v.extend_from_slice(&mixed[t][2 * kd + h * dv..2 * kd + (h + 1) * dv]);
                    // beta = b.sigmoid(); g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
                    beta.push(sigmoid(rows[t].b[h]));
                    decay.push((self.neg_a[h] * softplus(rows[t].a[h] + self.dt_bias[h])).exp());
                }
                let mut o = vec![0.0f32; n * dv];
                let x = DeltaInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    decay: &decay,
                    beta: &beta,
                };
                delta_rule(st, dv, x, &mut o);
                o
            })
            .collect();
        for _ in 0..n {
            state.advance();
        }

        // core_attn_out = self.norm(core_attn_out, z): RMSNorm per head, times silu(z).
        for (h, o) in per_head.iter_mut().enumerate() {
            for t in 0..n {
                let row = &mut o[t * dv..(t + 1) * dv];
                rms_norm(row, &self.norm, self.eps);
                let z = &rows[t].z[h * dv..(h + 1) * dv];
                for (x, &zj) in row.iter_mut().zip(z) {
                    *x *= silu(zj);
                }
                core[t * vd + h * dv..t * vd + (h + 1) * dv].copy_from_slice(row);
            }
        }
    }
}

/// Qwen3-Next's `fix_query_key_value_ordering`: one token's grouped
/// `in_proj_qkvz` and `in_proj_ba` outputs in the rule's order.
fn ungroup(qkvz: &[f32], ba: &[f32], s: &DeltaNetShape) -> Projected {
    let (dk, dv, r) = (s.k_head_dim, s.v_head_dim, s.v_heads / s.k_heads);
    let group = 2 * dk + 2 * r * dv;
    let (mut q, mut k, mut v, mut z) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut b, mut a) = (Vec::new(), Vec::new());
    for (g, ba_g) in qkvz.chunks_exact(group).zip(ba.chunks_exact(2 * r)) {
        q.extend_from_slice(&g[..dk]);
        k.extend_from_slice(&g[dk..2 * dk]);
        v.extend_from_slice(&g[2 * dk..2 * dk + r * dv]);
        z.extend_from_slice(&g[2 * dk + r * dv..]);
        b.extend_from_slice(&ba_g[..r]);
        a.extend_from_slice(&ba_g[r..]);
    }
    q.extend_from_slice(&k);
    q.extend_from_slice(&v);
    Projected { qkv: q, z, b, a }
}

/// `x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)`
fn l2norm(x: &mut [f32]) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (sum + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `F.softplus` (beta 1, threshold 20): `x` above 20, else `log1p(exp(x))`.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_projections_come_out_in_the_rules_order() {
        // Two key heads, two value heads each, dims 1: per group
        // [q, k, v0, v1, z0, z1] and [b0, b1, a0, a1].
        let s = DeltaNetShape {
            k_heads: 2,
            v_heads: 4,
            k_head_dim: 1,
            v_head_dim: 1,
            conv_kernel: 2,
            layout: ProjectionLayout::Grouped,
        };
        let qkvz = [1., 2., 3., 4., 5., 6., 11., 12., 13., 14., 15., 16.];
        let ba = [7., 8., 9., 10., 17., 18., 19., 20.];
        let p = ungroup(&qkvz, &ba, &s);
        assert_eq!(p.qkv, vec![1., 11., 2., 12., 3., 4., 13., 14.]);
        assert_eq!(p.z, vec![5., 6., 15., 16.]);
        assert_eq!(p.b, vec![7., 8., 17., 18.]);
        assert_eq!(p.a, vec![9., 10., 19., 20.]);
    }

    #[test]
    fn softplus_matches_its_definition_and_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((softplus(-3.0) - (1.0 + (-3.0f32).exp()).ln()).abs() < 1e-7);
    }
}
