//! Attention's weighted value sums of several heads over the same cached
//! rows in explicit AVX2: prefill's block of queries (or a KV head's group
//! of query heads) meets each cached row once, widened once for all of
//! them, where one head at a time widened every row again per head (an
//! f16 row's `vcvtph2ps` beside every fused multiply-add, half the rate of
//! the multiply-adds alone on Zen 3).
//!
//! ```text
//! # transformers, eager attention: attn_output = torch.matmul(attn_weights, value_states)
//! ```
//!
//! Each output element is the same chain as [`super::add_weighted_rows`]'s:
//! one fused multiply-add per row, in order of the rows, from zero or from
//! the output's value; only which elements share a pass changes, so every
//! head gets the one-head bits (tests in `kernels.rs` compare them).

use std::arch::x86_64::*;

use crate::prefetch;

/// One pass over columns `c..c + 8 K` of `H` outputs: `outs[h] (+)= Σ_j
/// weights[h][j] · row_j` over `keys` rows, each element in order of `j`,
/// from zero when `zero`, else from the outputs' values. `load8(j, i)`
/// widens row `j`'s columns `i..i + 8`; `prefetch(j)` runs before row `j`
/// is read. `H` and `K` are constants so the `H × K` sums stay in
/// registers.
#[inline(always)]
unsafe fn pass<const H: usize, const K: usize>(
    outs: &mut [&mut [f32]],
    weights: &[&[f32]],
    (c, keys, zero): (usize, usize, bool),
    prefetch: impl Fn(usize),
    load8: impl Fn(usize, usize) -> __m256,
) {
    // SAFETY: the caller's closure reads columns below `c + 8 K` of rows
    // below `keys`; every output holds `c + 8 K` columns and every weight
    // row `keys` weights.
    unsafe {
        debug_assert!(outs.len() == H && weights.len() == H);
        let mut acc = [[_mm256_setzero_ps(); K]; H];
        if !zero {
            for (h, acc) in acc.iter_mut().enumerate() {
                let o = outs.get_unchecked(h).as_ptr();
                for (b, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_loadu_ps(o.add(c + 8 * b));
                }
            }
        }
        let w: [*const f32; H] = std::array::from_fn(|h| weights.get_unchecked(h).as_ptr());
        for j in 0..keys {
            prefetch(j);
            let v: [__m256; K] = std::array::from_fn(|b| load8(j, c + 8 * b));
            for (acc, w) in acc.iter_mut().zip(w) {
                let p = _mm256_broadcast_ss(&*w.add(j));
                for (a, v) in acc.iter_mut().zip(v) {
                    *a = _mm256_fmadd_ps(p, v, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let o = outs.get_unchecked_mut(h).as_mut_ptr();
            for (b, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(c + 8 * b), *a);
            }
        }
    }
}

/// [`pass`] over the whole 8-column vectors of `H` outputs (`full`
/// columns), `MAX` vectors a pass (`H × MAX` sums: at most 8 of AVX2's 16
/// registers) and the rest in one shorter pass; then the columns past
/// `full` one element at a time (`at(j, i)`), in the same order.
#[inline(always)]
unsafe fn heads<const H: usize, const MAX: usize>(
    outs: &mut [&mut [f32]],
    weights: &[&[f32]],
    zero: bool,
    (base, row_bytes): (*const u8, usize),
    load8: impl Fn(usize, usize) -> __m256 + Copy,
    at: impl Fn(usize, usize) -> f32,
) {
    const { assert!(MAX >= 1 && MAX <= 8 && H * MAX <= 8) };
    let n = outs[0].len();
    let keys = weights[0].len();
    let full = n / 8 * 8;
    let pf = prefetch::distance();
    // The first pass asks for each row's lines ahead of it, as the
    // one-output `weighted_rows` does; the later passes find them in L1 (a
    // block of rows is a few KiB). Asked again in every pass, the
    // prefetches and their loop took ~14 % of this loop's samples in a
    // 4,000-token prefill.
    let ahead = |c: usize| {
        move |j: usize| {
            if c == 0 {
                prefetch::ahead_span(base.wrapping_add(j * row_bytes), row_bytes, pf)
            }
        }
    };
    let mut c = 0;
    // SAFETY: every pass ends at or before `full`, inside every output and
    // (through the caller's closure) every row.
    unsafe {
        while c + 8 * MAX <= full {
            pass::<H, MAX>(outs, weights, (c, keys, zero), ahead(c), load8);
            c += 8 * MAX;
        }
        let shape = (c, keys, zero);
        // The rest is under `MAX` vectors (at most 7).
        match (full - c) / 8 {
            0 => {}
            1 => pass::<H, 1>(outs, weights, shape, ahead(c), load8),
            2 => pass::<H, 2>(outs, weights, shape, ahead(c), load8),
            3 => pass::<H, 3>(outs, weights, shape, ahead(c), load8),
            4 => pass::<H, 4>(outs, weights, shape, ahead(c), load8),
            5 => pass::<H, 5>(outs, weights, shape, ahead(c), load8),
            6 => pass::<H, 6>(outs, weights, shape, ahead(c), load8),
            _ => pass::<H, 7>(outs, weights, shape, ahead(c), load8),
        }
    }
    for (w, o) in weights.iter().zip(outs.iter_mut()) {
        for (i, o) in o.iter_mut().enumerate().skip(full) {
            if zero {
                *o = 0.0;
            }
            for (j, &p) in w.iter().enumerate() {
                *o = p.mul_add(at(j, i), *o);
            }
        }
    }
}

/// [`heads`] for one to four heads.
#[inline(always)]
unsafe fn some(
    outs: &mut [&mut [f32]],
    weights: &[&[f32]],
    zero: bool,
    rows: (*const u8, usize),
    load8: impl Fn(usize, usize) -> __m256 + Copy,
    at: impl Fn(usize, usize) -> f32,
) {
    // SAFETY: forwarded.
    unsafe {
        match outs.len() {
            1 => heads::<1, 8>(outs, weights, zero, rows, load8, at),
            2 => heads::<2, 4>(outs, weights, zero, rows, load8, at),
            3 => heads::<3, 2>(outs, weights, zero, rows, load8, at),
            _ => heads::<4, 2>(outs, weights, zero, rows, load8, at),
        }
    }
}

/// [`super::weighted_rows_many`] (`zero`) or
/// [`super::add_weighted_rows_many`] for one to four heads.
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) fn weighted_rows_many(rows: &[f32], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]], zero: bool) {
    debug_assert!((1..=4).contains(&outs.len()));
    // SAFETY: AVX2 is enabled; the caller checked that every row
    // `j < weights[h].len()` lies in `rows` with `outs[h].len() <= stride`.
    unsafe {
        some(
            outs,
            weights,
            zero,
            (rows.as_ptr() as *const u8, 4 * stride),
            |j, i| _mm256_loadu_ps(rows.as_ptr().add(j * stride + i)),
            |j, i| *rows.get_unchecked(j * stride + i),
        )
    }
}

/// [`super::weighted_rows_many_f16`] (`zero`) or
/// [`super::add_weighted_rows_many_f16`] for one to four heads: rows
/// widened exactly by F16C.
#[target_feature(enable = "avx2,f16c,fma")]
pub(super) fn weighted_rows_many_f16(
    rows: &[u16],
    stride: usize,
    weights: &[&[f32]],
    outs: &mut [&mut [f32]],
    zero: bool,
) {
    debug_assert!((1..=4).contains(&outs.len()));
    // SAFETY: as `weighted_rows_many`.
    unsafe {
        some(
            outs,
            weights,
            zero,
            (rows.as_ptr() as *const u8, 2 * stride),
            |j, i| _mm256_cvtph_ps(_mm_loadu_si128(rows.as_ptr().add(j * stride + i) as *const __m128i)),
            |j, i| crate::dtype::f16_to_f32(*rows.get_unchecked(j * stride + i)),
        )
    }
}
