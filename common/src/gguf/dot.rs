//! Dot products of one GGML row with f32 activations.
//!
//! [`dot_ref`] is the definition: every element dequantized exactly as
//! [`super::dequantize`] does, times `x`, summed in f32 in column order.
//! [`dot`] is what charm computes with ([`crate::Weight::row_dot`]): each
//! block is dequantized with the same reference arithmetic (so the weights
//! are bit for bit the reference's), then multiplied into 16 lane sums
//! (`acc[i] += w[16k + i] * x[16k + i]`), reduced once in a fixed pairwise
//! order. Activations are never quantized.
//!
//! The fast path has no fused multiply-add and a fixed order of operations:
//! the portable build and the AVX2 build (explicit 256-bit lane sums,
//! picked at run time on x86-64) give the same bits, on every CPU and
//! thread. It differs from [`dot_ref`] only by rounding; tests hold both to
//! [`dot_tolerance`] of float64 products.

use super::dequant::{dequantize_into, Block};
use super::types::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0,
    BlockQ5_1, BlockQ6K, BlockQ8_0, GgmlType, QK_K,
};

/// Reference dot product of a row of `ty` (`row`: its bytes, `x.len()`
/// elements) with `x`: `Σ dequantize(row)[i] * x[i]` in f32, in order.
///
/// # Panics
/// If `row` does not hold exactly `x.len()` elements of `ty`.
pub fn dot_ref(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    assert_eq!(
        ty.row_bytes(x.len()),
        Some(row.len()),
        "{ty} row does not match {} activations",
        x.len()
    );
    let mut w = [0.0f32; QK_K];
    let mut total = 0.0f32;
    let step = if ty.is_quantized() { ty.block_elems() } else { QK_K };
    let step_bytes = ty.row_bytes(step).unwrap_or(0);
    for (xb, rb) in x.chunks(step).zip(row.chunks(step_bytes)) {
        let w = &mut w[..xb.len()];
        dequantize_into(ty, rb, w);
        for (a, b) in w.iter().zip(xb) {
            total += a * b;
        }
    }
    total
}

/// The tolerance of [`dot`] and [`dot_ref`] against the exact product of
/// the dequantized row with `x`, relative to [`dot_magnitude`]: a result
/// `f` for the exact `e` passes when
/// `|f - e| <= dot_tolerance(ty) * dot_magnitude(ty, row, x) + 1e-6`.
///
/// Every type has the same value today: both paths multiply the exactly
/// dequantized weights and only the f32 summation rounds (at most a few
/// hundred additions per lane for rows of thousands of columns). A fast
/// path that factors block scales out of the sums (as ggml's do) would
/// round more and needs its own entry here.
pub fn dot_tolerance(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-5,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => 1e-5,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 1e-5,
        GgmlType::IQ4_NL | GgmlType::IQ4_XS | GgmlType::MXFP4 => 1e-5,
    }
}

/// The size of the terms a dot product of `row` with `x` adds, which
/// [`dot_tolerance`] is relative to: `Σ |w_i x_i|` in f64, `w` the
/// dequantized row.
///
/// # Panics
/// If `row` does not hold exactly `x.len()` elements of `ty`.
pub fn dot_magnitude(ty: GgmlType, row: &[u8], x: &[f32]) -> f64 {
    assert_eq!(
        ty.row_bytes(x.len()),
        Some(row.len()),
        "{ty} row does not match {} activations",
        x.len()
    );
    let mut w = vec![0.0f32; x.len()];
    dequantize_into(ty, row, &mut w);
    w.iter().zip(x).map(|(&w, &x)| (w as f64 * x as f64).abs()).sum()
}

/// Fast dot product of a row of `ty` with `x` (see the module docs).
///
/// # Panics
/// If `row` does not hold exactly `x.len()` elements of `ty`.
#[inline]
pub fn dot(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    assert_eq!(
        ty.row_bytes(x.len()),
        Some(row.len()),
        "{ty} row does not match {} activations",
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { dot_avx2(ty, row, x) };
    }
    dot_portable(ty, row, x)
}

/// [`dot`] compiled for AVX2, with explicit 256-bit lane sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn dot_avx2(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    by_type::<true>(ty, row, x)
}

/// The body of [`dot`], portable.
pub(crate) fn dot_portable(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    by_type::<false>(ty, row, x)
}

/// Lanes of the fast path: two vectors of 8 f32 (AVX2) or four of 4,
/// enough independent sums to hide the add latency without spilling.
const LANES: usize = 16;

/// Sums the lanes in a fixed pairwise order.
#[inline(always)]
fn reduce(a: [f32; LANES]) -> f32 {
    let mut h = [0.0f32; 8];
    for i in 0..8 {
        h[i] = a[i] + a[i + 8];
    }
    ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]))
}

/// `acc[i] += w[16k + i] * x[16k + i]` for every `k`, in order of `k`
/// (`w.len() == x.len()`, a multiple of [`LANES`]): one product rounded,
/// then one sum rounded, per element, on every path.
#[inline(always)]
fn add_lanes<const AVX2: bool>(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    debug_assert!(w.len() == x.len() && w.len().is_multiple_of(LANES));
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2 = true` is only instantiated under `dot_avx2`,
        // which runs only where the CPU has AVX2.
        unsafe { add_lanes_avx2(acc, w, x) };
        return;
    }
    for (a, b) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += a[i] * b[i];
        }
    }
}

/// [`add_lanes`] with 256-bit vectors: lanes 0..8 and 8..16 in two registers.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn add_lanes_avx2(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    use std::arch::x86_64::{_mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_storeu_ps};
    // SAFETY: every pointer below addresses 8 f32 inside `acc`, or inside
    // one LANES-long chunk of `w` / `x`; unaligned loads and stores.
    unsafe {
        let mut a0 = _mm256_loadu_ps(acc.as_ptr());
        let mut a1 = _mm256_loadu_ps(acc.as_ptr().add(8));
        for (wc, xc) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
            let (wp, xp) = (wc.as_ptr(), xc.as_ptr());
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(wp), _mm256_loadu_ps(xp)));
            a1 = _mm256_add_ps(
                a1,
                _mm256_mul_ps(_mm256_loadu_ps(wp.add(8)), _mm256_loadu_ps(xp.add(8))),
            );
        }
        _mm256_storeu_ps(acc.as_mut_ptr(), a0);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), a1);
    }
}

/// The fast dot for `ty`, with the lane sums of `AVX2` or the portable ones.
#[inline(always)]
fn by_type<const AVX2: bool>(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => floats::<AVX2>(ty, row, x),
        GgmlType::Q4_0 => blocks::<AVX2, BlockQ4_0>(row, x),
        GgmlType::Q4_1 => blocks::<AVX2, BlockQ4_1>(row, x),
        GgmlType::Q5_0 => blocks::<AVX2, BlockQ5_0>(row, x),
        GgmlType::Q5_1 => blocks::<AVX2, BlockQ5_1>(row, x),
        GgmlType::Q8_0 => blocks::<AVX2, BlockQ8_0>(row, x),
        GgmlType::Q2_K => blocks::<AVX2, BlockQ2K>(row, x),
        GgmlType::Q3_K => blocks::<AVX2, BlockQ3K>(row, x),
        GgmlType::Q4_K => blocks::<AVX2, BlockQ4K>(row, x),
        GgmlType::Q5_K => blocks::<AVX2, BlockQ5K>(row, x),
        GgmlType::Q6_K => blocks::<AVX2, BlockQ6K>(row, x),
        GgmlType::IQ4_NL => blocks::<AVX2, BlockIq4Nl>(row, x),
        GgmlType::IQ4_XS => blocks::<AVX2, BlockIq4Xs>(row, x),
        GgmlType::MXFP4 => blocks::<AVX2, BlockMxfp4>(row, x),
    }
}

/// A quantized row: each block dequantized with the reference arithmetic
/// (so the weights are exactly [`super::dequantize`]'s), then added into
/// the lanes.
#[inline(always)]
fn blocks<const AVX2: bool, B: Block>(row: &[u8], x: &[f32]) -> f32 {
    let bs: &[B] = bytemuck::cast_slice(row);
    let mut w = [0.0f32; QK_K];
    let w = &mut w[..B::N];
    let mut acc = [0.0f32; LANES];
    for (b, xb) in bs.iter().zip(x.chunks_exact(B::N)) {
        b.dequant(w);
        add_lanes::<AVX2>(&mut acc, w, xb);
    }
    reduce(acc)
}

/// A float row, converted [`QK_K`] elements at a time; the columns past
/// the last multiple of [`LANES`] go to one scalar sum added at the end.
#[inline(always)]
fn floats<const AVX2: bool>(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let size = ty.block_bytes();
    let mut w = [0.0f32; QK_K];
    let mut acc = [0.0f32; LANES];
    let mut tail = 0.0f32;
    for (rb, xb) in row.chunks(QK_K * size).zip(x.chunks(QK_K)) {
        let w = &mut w[..xb.len()];
        dequantize_into(ty, rb, w);
        let n = xb.len() - xb.len() % LANES;
        add_lanes::<AVX2>(&mut acc, &w[..n], &xb[..n]);
        for (a, b) in w[n..].iter().zip(&xb[n..]) {
            tail += a * b;
        }
    }
    reduce(acc) + tail
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// `n` random but valid blocks of `ty`: random bytes with finite f16
    /// scales (small, occasionally zero, negative or subnormal); MXFP4
    /// exponents around 1 (2^-10 to 2^2), occasionally tiny or subnormal.
    pub(crate) fn random_row(rng: &mut ChaCha8Rng, ty: GgmlType, cols: usize) -> Vec<u8> {
        let n = ty.row_bytes(cols).expect("whole blocks");
        let mut row: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        let f16_at: &[usize] = match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::MXFP4 => &[],
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
        };
        for b in row.chunks_exact_mut(ty.block_bytes()) {
            for &at in f16_at {
                let v = match rng.gen_range(0..20) {
                    0 => 0.0,
                    1 => 3e-6, // subnormal in f16
                    _ => rng.gen_range(-0.05f32..0.05),
                };
                b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        match ty {
            GgmlType::MXFP4 => {
                for b in row.chunks_exact_mut(ty.block_bytes()) {
                    b[0] = match rng.gen_range(0..20) {
                        0 => rng.gen_range(0..2), // subnormal scale
                        1 => rng.gen_range(2..100),
                        _ => rng.gen_range(118..=130),
                    };
                }
            }
            GgmlType::F32 => {
                for b in row.chunks_exact_mut(4) {
                    b.copy_from_slice(&rng.gen_range(-1.0f32..1.0).to_le_bytes());
                }
            }
            GgmlType::F16 | GgmlType::BF16 => {
                for b in row.chunks_exact_mut(2) {
                    let v = rng.gen_range(-1.0f32..1.0);
                    let bits = if ty == GgmlType::F16 {
                        half::f16::from_f32(v).to_bits()
                    } else {
                        half::bf16::from_f32(v).to_bits()
                    };
                    b.copy_from_slice(&bits.to_le_bytes());
                }
            }
            _ => {}
        }
        row
    }

    pub(crate) fn acts(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    fn within(ty: GgmlType, got: f32, want: f64, magnitude: f64) -> bool {
        (got as f64 - want).abs() <= dot_tolerance(ty) as f64 * magnitude + 1e-6
    }

    #[test]
    fn reference_dot_is_the_sum_of_dequantized_products() {
        // Two Q8_0 blocks, d = 0.5 and 0.25, codes 1..=32 and -(1..=32).
        let mut row = Vec::new();
        for (d, sign) in [(0.5f32, 1i8), (0.25, -1)] {
            row.extend(half::f16::from_f32(d).to_bits().to_le_bytes());
            row.extend((1..=32).map(|q: i8| (q * sign) as u8));
        }
        let x = vec![1.0f32; 64];
        let sum: f32 = (1..=32).map(|q| q as f32 * 0.5).sum::<f32>() - (1..=32).map(|q| q as f32 * 0.25).sum::<f32>();
        assert_eq!(dot_ref(GgmlType::Q8_0, &row, &x), sum);
        assert_eq!(dot(GgmlType::Q8_0, &row, &x), sum);
    }

    #[test]
    fn fast_dots_match_the_reference_on_every_path() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for ty in GgmlType::ALL {
            let mut worst = 0.0f64;
            for case in 0..60 {
                // Few blocks now and then, else up to 8192 columns (any width for floats).
                let max_blocks = if case % 4 == 0 { 3 } else { 8192 / ty.block_elems() };
                let cols = ty.block_elems() * rng.gen_range(1..=max_blocks);
                let rows = rng.gen_range(1..=4);
                let x = acts(&mut rng, cols);
                for _ in 0..rows {
                    let row = random_row(&mut rng, ty, cols);
                    let w = {
                        let mut w = vec![0.0f32; cols];
                        dequantize_into(ty, &row, &mut w);
                        w
                    };
                    let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag = dot_magnitude(ty, &row, &x);
                    let (fast, reference) = (dot(ty, &row, &x), dot_ref(ty, &row, &x));
                    assert!(
                        within(ty, fast, reference as f64, mag),
                        "{ty} x{cols}: fast {fast} reference {reference} (magnitude {mag})"
                    );
                    assert!(within(ty, fast, exact, mag), "{ty} x{cols}: fast {fast} exact {exact}");
                    assert!(
                        within(ty, reference, exact, mag),
                        "{ty} x{cols}: reference {reference} exact {exact}"
                    );
                    worst = worst.max((fast as f64 - exact).abs() / mag.max(1e-30));
                    // Portable and AVX2 builds: the same bits.
                    let portable = dot_portable(ty, &row, &x);
                    assert_eq!(portable.to_bits(), fast.to_bits(), "{ty} x{cols}");
                    #[cfg(target_arch = "x86_64")]
                    if std::arch::is_x86_feature_detected!("avx2") {
                        // SAFETY: AVX2 is present, checked just above.
                        let avx2 = unsafe { dot_avx2(ty, &row, &x) };
                        assert_eq!(avx2.to_bits(), portable.to_bits(), "{ty} x{cols}");
                    }
                }
            }
            println!("{ty}: worst error {worst:.2e} of the magnitude");
            assert!(worst < dot_tolerance(ty) as f64);
        }
    }
}
