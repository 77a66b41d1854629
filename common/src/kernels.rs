//! Scalar f32 math on activations: the one place for each formula.
//!
//! Dot products use eight (float rows) or sixteen (quantized rows)
//! independent accumulators combined in a fixed order, so the compiler
//! vectorizes them and the result is the same on every call for the same
//! inputs (placement never changes bits).
//!
//! Quantized rows ([`crate::quant`]) have a scalar reference
//! (`dot_int8_ref`, `dot_int4_ref`) that defines the product and a fast
//! path (`dot_int8`, `dot_int4`) that sums in another fixed order.
//!
//! Every fast dot is one portable source compiled three times: for the
//! baseline target, for AVX2 and for AVX-512 (picked at run time from
//! [`Isa::active`]; on AArch64 the baseline build is already NEON). The
//! order of every operation is fixed by the source and Rust never fuses a
//! multiply and an add, so all builds give the same bits on every CPU
//! (`*_on` runs a chosen build; tests compare them).

use crate::dtype::{bf16_to_f32, f16_to_f32};
use crate::isa::Isa;
use crate::quant::unpack_int4;

const LANES: usize = 8;

#[inline(always)]
fn reduce(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// Generic dot product over a weight row converted element-wise by `cvt`.
#[inline(always)]
fn dot_with<T: Copy>(w: &[T], x: &[f32], cvt: impl Fn(T) -> f32) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0.0f32; LANES];
    let wc = w.chunks_exact(LANES);
    let xc = x.chunks_exact(LANES);
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for i in 0..LANES {
            acc[i] += cvt(a[i]) * b[i];
        }
    }
    let mut tail = 0.0f32;
    for (a, b) in wr.iter().zip(xr) {
        tail += cvt(*a) * b;
    }
    reduce(acc) + tail
}

/// Defines `$name(args)` (on [`Isa::active`]) and `$name_on(isa, args)`,
/// both running the `#[inline(always)]` portable body `$body` compiled for
/// the chosen instruction set.
macro_rules! multiversion {
    ($(#[$doc:meta])* $name:ident, $name_on:ident, $body:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $(#[$doc])*
        #[inline]
        pub fn $name($($arg: $ty),*) -> $ret {
            $name_on(Isa::active(), $($arg),*)
        }

        #[doc = concat!("[`", stringify!($name), "`] compiled for `isa` (the portable build when this CPU lacks it).")]
        #[inline]
        pub fn $name_on(isa: Isa, $($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,f16c")]
                fn avx2($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
                fn avx512($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                if isa != Isa::Scalar && isa.runs() {
                    match isa {
                        // SAFETY: the CPU runs AVX-512 (checked above).
                        Isa::Avx512Vnni => return unsafe { avx512($($arg),*) },
                        // SAFETY: the CPU runs AVX2 (checked above).
                        Isa::Avx2 => return unsafe { avx2($($arg),*) },
                        _ => {}
                    }
                }
            }
            let _ = isa;
            $body($($arg),*)
        }
    };
}

multiversion!(
    /// `Σ w[i] x[i]` for an f32 weight row.
    dot_f32, dot_f32_on, dot_f32_body, (w: &[f32], x: &[f32]) -> f32
);
multiversion!(
    /// `Σ w[i] x[i]` for a bf16 weight row, accumulated in f32.
    dot_bf16, dot_bf16_on, dot_bf16_body, (w: &[u16], x: &[f32]) -> f32
);
multiversion!(
    /// `Σ w[i] x[i]` for an f16 weight row, accumulated in f32.
    dot_f16, dot_f16_on, dot_f16_body, (w: &[u16], x: &[f32]) -> f32
);

#[inline(always)]
fn dot_f32_body(w: &[f32], x: &[f32]) -> f32 {
    dot_with(w, x, |v| v)
}

#[inline(always)]
fn dot_bf16_body(w: &[u16], x: &[f32]) -> f32 {
    dot_with(w, x, bf16_to_f32)
}

#[inline(always)]
fn dot_f16_body(w: &[u16], x: &[f32]) -> f32 {
    dot_with(w, x, f16_to_f32)
}

/// Reference INT8 dot product (the definition; see [`crate::quant`]): for
/// each `group`-wide group in order, `s = Σ q[i] x[i]` in f32 in column
/// order, then `total += s * scale`. `q: cols`, `scales: cols / group`.
pub fn dot_int8_ref(q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(q.len(), x.len());
    debug_assert_eq!(q.len(), scales.len() * group);
    let mut total = 0.0f32;
    for ((qg, xg), &scale) in q.chunks_exact(group).zip(x.chunks_exact(group)).zip(scales) {
        let mut s = 0.0f32;
        for (&a, &b) in qg.iter().zip(xg) {
            s += a as f32 * b;
        }
        total += s * scale;
    }
    total
}

/// Reference INT4 dot product, as [`dot_int8_ref`] with the values unpacked
/// from nibbles (`packed: cols / 2` bytes, column `2i` in the low nibble of
/// byte `i`, `q = nibble - 8`).
pub fn dot_int4_ref(packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(packed.len() * 2, x.len());
    debug_assert_eq!(x.len(), scales.len() * group);
    let mut total = 0.0f32;
    for ((pg, xg), &scale) in packed.chunks_exact(group / 2).zip(x.chunks_exact(group)).zip(scales) {
        let mut s = 0.0f32;
        for (&b, xp) in pg.iter().zip(xg.chunks_exact(2)) {
            let (lo, hi) = unpack_int4(b);
            s += lo as f32 * xp[0];
            s += hi as f32 * xp[1];
        }
        total += s * scale;
    }
    total
}

/// Lanes of the quantized fast paths: two f32 vectors of 8 (or four of 4),
/// enough independent sums to hide the add latency without spilling.
const QLANES: usize = 16;

/// Sums the lanes in index order.
#[inline(always)]
fn reduce_q(acc: [f32; QLANES]) -> f32 {
    acc.iter().sum()
}

multiversion!(
    /// Fast INT8 dot product, the same value as [`dot_int8_ref`] up to
    /// rounding: per group, `QLANES` lane sums of `q x` (columns past the
    /// last full `QLANES` chunk of the group go to a scalar tail), each lane
    /// sum scaled into its own running total (no per-group horizontal sum),
    /// then one fixed-order reduction.
    dot_int8, dot_int8_on, dot_int8_portable, (q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32
);
multiversion!(
    /// Fast INT4 dot product: as [`dot_int8`], unpacking `QLANES` nibbles
    /// (`QLANES / 2` bytes) at a time.
    dot_int4, dot_int4_on, dot_int4_portable, (packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32
);

/// The body of [`dot_int8`], for whatever target features the caller has.
#[inline(always)]
pub(crate) fn dot_int8_portable(q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(q.len(), x.len());
    debug_assert_eq!(q.len(), scales.len() * group);
    let mut total = [0.0f32; QLANES];
    let mut tail_total = 0.0f32;
    for ((qg, xg), &scale) in q.chunks_exact(group).zip(x.chunks_exact(group)).zip(scales) {
        let mut acc = [0.0f32; QLANES];
        let qc = qg.chunks_exact(QLANES);
        let xc = xg.chunks_exact(QLANES);
        let (qr, xr) = (qc.remainder(), xc.remainder());
        for (a, b) in qc.zip(xc) {
            for i in 0..QLANES {
                acc[i] += a[i] as f32 * b[i];
            }
        }
        for i in 0..QLANES {
            total[i] += acc[i] * scale;
        }
        if !qr.is_empty() {
            let mut tail = 0.0f32;
            for (&a, &b) in qr.iter().zip(xr) {
                tail += a as f32 * b;
            }
            tail_total += tail * scale;
        }
    }
    reduce_q(total) + tail_total
}

/// The body of [`dot_int4`], for whatever target features the caller has.
#[inline(always)]
pub(crate) fn dot_int4_portable(packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(packed.len() * 2, x.len());
    debug_assert_eq!(x.len(), scales.len() * group);
    let mut total = [0.0f32; QLANES];
    let mut tail_total = 0.0f32;
    for ((pg, xg), &scale) in packed.chunks_exact(group / 2).zip(x.chunks_exact(group)).zip(scales) {
        let mut acc = [0.0f32; QLANES];
        let pc = pg.chunks_exact(QLANES / 2);
        let xc = xg.chunks_exact(QLANES);
        let (pr, xr) = (pc.remainder(), xc.remainder());
        for (p, b) in pc.zip(xc) {
            // Unpack 16 nibbles: column 2i is the low nibble of byte i.
            let mut w = [0.0f32; QLANES];
            for i in 0..QLANES / 2 {
                w[2 * i] = ((p[i] & 0x0f) as i32 - 8) as f32;
                w[2 * i + 1] = ((p[i] >> 4) as i32 - 8) as f32;
            }
            for i in 0..QLANES {
                acc[i] += w[i] * b[i];
            }
        }
        for i in 0..QLANES {
            total[i] += acc[i] * scale;
        }
        if !pr.is_empty() {
            let mut tail = 0.0f32;
            for (&p, b) in pr.iter().zip(xr.chunks_exact(2)) {
                let (lo, hi) = unpack_int4(p);
                tail += lo as f32 * b[0];
                tail += hi as f32 * b[1];
            }
            tail_total += tail * scale;
        }
    }
    reduce_q(total) + tail_total
}

/// RMS norm in place: `x * rsqrt(mean(x²) + eps) * weight`.
///
/// `hidden = hidden * torch.rsqrt(variance + eps); weight * hidden`
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), weight.len());
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean_sq + eps).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v = w * (*v * scale);
    }
}

/// RMS norm of every `weight.len()`-wide row of `xs`.
pub fn rms_norm_rows(xs: &mut [f32], weight: &[f32], eps: f32) {
    for row in xs.chunks_exact_mut(weight.len()) {
        rms_norm(row, weight, eps);
    }
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SiLU: `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Index of the largest value; the first one on ties (as `torch.argmax`).
/// NaN never wins.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// The `k` largest values' indices, largest first; ties go to the lower
/// index.
pub fn top_k(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_dots_give_the_same_bits_on_every_instruction_set() {
        for n in [1usize, 7, 8, 31, 64, 1000, 2048, 2053] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0)
                .collect();
            let w: Vec<f32> = (0..n)
                .map(|i| ((i * 104729 % 997) as f32 / 997.0 - 0.5) * 0.1)
                .collect();
            let w16: Vec<u16> = w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let wb: Vec<u16> = w.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
            let want = (
                dot_f32_on(Isa::Scalar, &w, &x),
                dot_f16_on(Isa::Scalar, &w16, &x),
                dot_bf16_on(Isa::Scalar, &wb, &x),
            );
            for &isa in Isa::available() {
                assert_eq!(dot_f32_on(isa, &w, &x).to_bits(), want.0.to_bits(), "f32 {isa:?} n={n}");
                assert_eq!(
                    dot_f16_on(isa, &w16, &x).to_bits(),
                    want.1.to_bits(),
                    "f16 {isa:?} n={n}"
                );
                assert_eq!(
                    dot_bf16_on(isa, &wb, &x).to_bits(),
                    want.2.to_bits(),
                    "bf16 {isa:?} n={n}"
                );
            }
            let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            assert!((want.0 as f64 - exact).abs() < 1e-4, "{} vs {exact}", want.0);
        }
    }

    #[test]
    fn dots_match_naive_sums() {
        let x: Vec<f32> = (0..19).map(|i| i as f32 * 0.25 - 1.0).collect();
        let w: Vec<f32> = (0..19).map(|i| (i % 5) as f32 - 2.0).collect();
        let naive: f64 = w.iter().zip(&x).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
        assert!((dot_f32(&w, &x) as f64 - naive).abs() < 1e-5);
        let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        assert_eq!(dot_bf16(&wb, &x), dot_f32(&w, &x));
        let wh: Vec<u16> = w.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
        assert_eq!(dot_f16(&wh, &x), dot_f32(&w, &x));
    }

    #[test]
    fn softmax_sums_to_one_and_is_stable() {
        let mut x = vec![1000.0, 1001.0, 999.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[0] && x[0] > x[2]);
    }

    #[test]
    fn rms_norm_unit_weight_gives_unit_rms() {
        let mut x = vec![3.0, -4.0, 12.0, 0.0];
        rms_norm(&mut x, &[1.0; 4], 0.0);
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn argmax_and_top_k_break_ties_low() {
        let x = [1.0, 3.0, 3.0, f32::NAN, 2.0];
        assert_eq!(argmax(&x), 1);
        assert_eq!(top_k(&[1.0, 3.0, 3.0, 2.0], 3), vec![1, 2, 3]);
    }
}
