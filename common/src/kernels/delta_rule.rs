//! The gated delta rule of one value head over a run of tokens: the
//! recurrence of gated DeltaNet layers (transformers
//! `torch_recurrent_gated_delta_rule`, Qwen3-Next and Qwen3.5).
//!
//! ```python
//! last_recurrent_state = last_recurrent_state * g_t
//! kv_mem = (last_recurrent_state * k_t.unsqueeze(-1)).sum(dim=-2)
//! delta = (v_t - kv_mem) * beta_t
//! last_recurrent_state = last_recurrent_state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
//! core_attn_out[:, :, i] = (last_recurrent_state * q_t.unsqueeze(-1)).sum(dim=-2)
//! ```
//!
//! The state is `dk × dv` (row `i` per key dimension). Every column `j`
//! of it evolves on its own: its decay, its `kv_mem[j]`, `delta[j]` and
//! output `o[j]` read only column `j` (and the token's `k`, `q`, `v[j]`).
//! [`delta_rule_ref`] runs the rule as written, row by row; the fast path
//! ([`delta_rule`]) takes a block of 32 columns through every token while
//! the block stays in the first-level cache and its sums in registers.
//! Each element sees the same operations in the same order (sums over `i`
//! ascending, a separate multiply and add), so both give the same bits on
//! every instruction set.

use crate::isa::Isa;

/// Columns the fast path carries through every token at once: two 16-wide
/// or four 8-wide vectors, 16 KiB of a 128-row state.
const BLOCK: usize = 32;

/// One token's inputs to the rule, per head.
#[derive(Clone, Copy, Debug)]
pub struct DeltaInputs<'a> {
    /// Queries, `n × dk` (already L2-normalised and scaled).
    pub q: &'a [f32],
    /// Keys, `n × dk` (L2-normalised).
    pub k: &'a [f32],
    /// Values, `n × dv`.
    pub v: &'a [f32],
    /// `g_t.exp()` per token.
    pub decay: &'a [f32],
    /// `beta_t` per token.
    pub beta: &'a [f32],
}

impl DeltaInputs<'_> {
    /// Checks the lengths against a `dk × dv` state; returns `n`.
    fn check(&self, state: &[f32], dv: usize, out: &[f32]) -> usize {
        let n = self.decay.len();
        assert!(dv > 0 && state.len().is_multiple_of(dv), "state is not dk x dv");
        let dk = state.len() / dv;
        assert_eq!(self.beta.len(), n, "beta per token");
        assert_eq!(self.q.len(), n * dk, "q is n x dk");
        assert_eq!(self.k.len(), n * dk, "k is n x dk");
        assert_eq!(self.v.len(), n * dv, "v is n x dv");
        assert_eq!(out.len(), n * dv, "out is n x dv");
        n
    }
}

/// The rule as transformers writes it, two passes over the state per
/// token: advances `state` (`dk × dv`) over the tokens of `x` and writes
/// each token's output (`n × dv`).
pub fn delta_rule_ref(state: &mut [f32], dv: usize, x: DeltaInputs, out: &mut [f32]) {
    let n = x.check(state, dv, out);
    let dk = state.len() / dv;
    let mut kv_mem = vec![0.0f32; dv];
    for t in 0..n {
        let (q, k) = (&x.q[t * dk..(t + 1) * dk], &x.k[t * dk..(t + 1) * dk]);
        let v = &x.v[t * dv..(t + 1) * dv];
        kv_mem.fill(0.0);
        for (row, &ki) in state.chunks_exact_mut(dv).zip(k) {
            for (m, sij) in kv_mem.iter_mut().zip(row.iter_mut()) {
                *sij *= x.decay[t];
                *m += *sij * ki;
            }
        }
        for (m, &vj) in kv_mem.iter_mut().zip(v) {
            *m = (vj - *m) * x.beta[t];
        }
        let ot = &mut out[t * dv..(t + 1) * dv];
        ot.fill(0.0);
        for ((row, &ki), &qi) in state.chunks_exact_mut(dv).zip(k).zip(q) {
            for ((sij, &dj), oj) in row.iter_mut().zip(kv_mem.iter()).zip(ot.iter_mut()) {
                *sij += ki * dj;
                *oj += *sij * qi;
            }
        }
    }
}

/// Columns `j0..j0 + W` of the state through every token.
#[inline(always)]
fn columns<const W: usize>(state: &mut [f32], dv: usize, j0: usize, x: &DeltaInputs, out: &mut [f32]) {
    let dk = state.len() / dv;
    for t in 0..x.decay.len() {
        let (q, k) = (&x.q[t * dk..(t + 1) * dk], &x.k[t * dk..(t + 1) * dk]);
        let (decay, beta) = (x.decay[t], x.beta[t]);
        let mut acc = [0.0f32; W];
        for (i, &ki) in k.iter().enumerate() {
            let s: &mut [f32; W] = (&mut state[i * dv + j0..i * dv + j0 + W]).try_into().unwrap();
            for w in 0..W {
                s[w] *= decay;
                acc[w] += s[w] * ki;
            }
        }
        let v: &[f32; W] = x.v[t * dv + j0..t * dv + j0 + W].try_into().unwrap();
        let mut delta = [0.0f32; W];
        for w in 0..W {
            delta[w] = (v[w] - acc[w]) * beta;
        }
        let mut o = [0.0f32; W];
        for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
            let s: &mut [f32; W] = (&mut state[i * dv + j0..i * dv + j0 + W]).try_into().unwrap();
            for w in 0..W {
                s[w] += ki * delta[w];
                o[w] += s[w] * qi;
            }
        }
        out[t * dv + j0..t * dv + j0 + W].copy_from_slice(&o);
    }
}

/// The portable body of [`delta_rule`]: whole blocks of [`BLOCK`] columns,
/// then the rest one column at a time.
#[inline(always)]
fn delta_rule_body(state: &mut [f32], dv: usize, x: DeltaInputs, out: &mut [f32]) {
    x.check(state, dv, out);
    let full = dv / BLOCK * BLOCK;
    for j0 in (0..full).step_by(BLOCK) {
        columns::<BLOCK>(state, dv, j0, &x, out);
    }
    for j0 in full..dv {
        columns::<1>(state, dv, j0, &x, out);
    }
}

multiversion!(
    /// [`delta_rule_ref`]'s result bit for bit, a block of columns at a
    /// time through every token (see the module docs).
    delta_rule, delta_rule_on, delta_rule_body,
    (state: &mut [f32], dv: usize, x: DeltaInputs, out: &mut [f32]) -> ()
);

#[cfg(test)]
mod tests {
    use super::*;

    fn random(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * scale
            })
            .collect()
    }

    #[test]
    fn every_build_gives_the_reference_bits() {
        // dv 128 (whole blocks), 40 (a block and a tail), 7 (tail only).
        for (dk, dv, n) in [(128, 128, 5), (16, 40, 9), (8, 7, 3), (4, 32, 1)] {
            let (q, k, v) = (random(n * dk, 1, 0.5), random(n * dk, 2, 0.5), random(n * dv, 3, 4.0));
            let decay: Vec<f32> = random(n, 4, 0.5).iter().map(|g| (g - 0.3).exp()).collect();
            let beta: Vec<f32> = random(n, 5, 1.0).iter().map(|b| b + 0.5).collect();
            let x = DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                decay: &decay,
                beta: &beta,
            };
            let start = random(dk * dv, 6, 2.0);
            let (mut want_state, mut want) = (start.clone(), vec![0.0; n * dv]);
            delta_rule_ref(&mut want_state, dv, x, &mut want);
            for &isa in Isa::available() {
                let (mut state, mut got) = (start.clone(), vec![f32::NAN; n * dv]);
                delta_rule_on(isa, &mut state, dv, x, &mut got);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{isa:?} output, dk {dk} dv {dv}");
                assert_eq!(bits(&state), bits(&want_state), "{isa:?} state, dk {dk} dv {dv}");
            }
        }
    }

    #[test]
    fn tokens_one_at_a_time_give_the_bits_of_one_run() {
        let (dk, dv, n) = (16, 48, 6);
        let (q, k, v) = (random(n * dk, 7, 0.5), random(n * dk, 8, 0.5), random(n * dv, 9, 2.0));
        let (decay, beta) = (vec![0.9f32; n], vec![0.7f32; n]);
        let all = DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            decay: &decay,
            beta: &beta,
        };
        let (mut s1, mut o1) = (vec![0.0; dk * dv], vec![0.0; n * dv]);
        delta_rule(&mut s1, dv, all, &mut o1);
        let (mut s2, mut o2) = (vec![0.0; dk * dv], vec![0.0; n * dv]);
        for t in 0..n {
            let one = DeltaInputs {
                q: &q[t * dk..(t + 1) * dk],
                k: &k[t * dk..(t + 1) * dk],
                v: &v[t * dv..(t + 1) * dv],
                decay: &decay[t..t + 1],
                beta: &beta[t..t + 1],
            };
            delta_rule(&mut s2, dv, one, &mut o2[t * dv..(t + 1) * dv]);
        }
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
    }
}
