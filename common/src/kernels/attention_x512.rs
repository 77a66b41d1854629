//! Decode attention's two products over cached rows in explicit AVX-512:
//! scores against many keys (`dots`) and the weighted sum of the values
//! (`add_weighted`), for f32 and f16 caches.
//!
//! Each performs the portable body's operations in its order, so the bits
//! are those of every other build (tests in `kernels.rs` compare them):
//! - a key's score keeps the [`super::LANES`] lane sums of `dot_with` in two
//!   16-wide registers (lane `i` of the pair is lane `i` of the array), with
//!   the same fused multiply-add, and reduces them in `reduce`'s pairing;
//! - a weighted sum keeps up to 128 output columns in eight registers
//!   while every row passes (one pass over a 128-wide head: each row is read
//!   front to back, which the hardware prefetchers follow; AVX2's sixteen
//!   registers need two 64-column passes, each reading half of every row),
//!   adding `weights[j] * row_j` to each element in order of `j` (one
//!   fused multiply-add each).

use std::arch::x86_64::*;

use super::{tail, LANES};
use crate::prefetch;

/// `super::reduce` over lanes `0..16` (`lo`) and `16..32` (`hi`): the same
/// pairs added in the same order as the portable and AVX2 builds.
#[inline(always)]
pub(super) unsafe fn reduce(lo: __m512, hi: __m512) -> f32 {
    // t[i] = acc[i] + acc[i + 16] for i < 16.
    let t = _mm512_add_ps(lo, hi);
    // v[i] = (acc[i] + acc[i + 16]) + (acc[i + 8] + acc[i + 24]) for i < 8.
    let t_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t)));
    let v = _mm256_add_ps(_mm512_castps512_ps256(t), t_hi);
    // h = [v0 + v4, v1 + v5, v2 + v6, v3 + v7]
    let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    // p0 = h0 + h1, p2 = h2 + h3
    let p = _mm_add_ps(h, _mm_shuffle_ps::<0b10_11_00_01>(h, h));
    _mm_cvtss_f32(_mm_add_ss(p, _mm_movehl_ps(p, p)))
}

/// `reduce` of `N ≤ 16` sums at once, each sum `s` given as `t[s]` =
/// `lo + hi` (its lanes `i` and `i + 16` added, `reduce`'s first level):
/// the same pairs added in the same order, level by level, with the sums
/// sharing registers (two, then four sums a register, then all of them),
/// so a level costs two shuffles and an add per register instead of a
/// chain of extracts and adds per sum. `N` a constant: the loops unroll.
#[inline(always)]
pub(super) unsafe fn reduce_tree<const N: usize>(t: [__m512; N]) -> [f32; N] {
    const { assert!(N >= 1 && N <= 16) };
    // SAFETY: AVX-512F is enabled by every caller.
    unsafe {
        // Lanes 0..8 / 8..16 of a[k]: t[i] + t[i + 8] of sums 2k / 2k + 1
        // (a sum past the last repeats it; its result is not read).
        let na = N.div_ceil(2);
        let mut a = [_mm512_setzero_ps(); 8];
        for (k, a) in a.iter_mut().enumerate().take(na) {
            let (x, y) = (t[2 * k], t[(2 * k + 1).min(N - 1)]);
            *a = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(x, y), _mm512_shuffle_f32x4::<0xEE>(x, y));
        }
        // 128-bit lane q of b[m]: a[i] + a[i + 4] (i < 4) of sum 4m + q.
        let nb = na.div_ceil(2);
        let mut b = [_mm512_setzero_ps(); 4];
        for (m, b) in b.iter_mut().enumerate().take(nb) {
            let (x, y) = (a[2 * m], a[(2 * m + 1).min(na - 1)]);
            *b = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y));
        }
        // Within each 128-bit lane: [x0 + x1, x2 + x3, y0 + y1, y2 + y3].
        let pairs =
            |x: __m512, y: __m512| _mm512_add_ps(_mm512_shuffle_ps::<0x88>(x, y), _mm512_shuffle_ps::<0xDD>(x, y));
        // Lane q of c0: [h0 + h1, h2 + h3] of sums q and 4 + q; of c1: of
        // 8 + q and 12 + q.
        let c0 = pairs(b[0], b[1.min(nb - 1)]);
        let c1 = if nb > 2 { pairs(b[2], b[3.min(nb - 1)]) } else { c0 };
        // Element e of lane q: (h0 + h1) + (h2 + h3) of sum 4e + q.
        let d = pairs(c0, c1);
        let mut v = [0.0f32; 16];
        _mm512_storeu_ps(v.as_mut_ptr(), d);
        std::array::from_fn(|s| v[4 * (s % 4) + s / 4])
    }
}

/// `out[r] = row_r · x` with `load16(r, i)` widening row `r`'s elements
/// `i..i + 16` and `row_tail(r)` its elements past the last full chunk;
/// `base` is row 0's first element (`size` bytes each), for prefetching.
/// Rows of one to four whole chunks (attention's heads of 32 to 128
/// columns, plus any tail) go eight at a time ([`dots8`]); wider rows, and
/// the last few, one at a time (scoring two to eight wide rows together,
/// interleaving their reads, measured slower in `bench_attention`).
#[inline(always)]
unsafe fn dots<T>(
    out: &mut [f32],
    x: &[f32],
    base: *const T,
    load16: impl Fn(usize, usize) -> __m512,
    row_tail: impl Fn(usize) -> f32,
) {
    let n = x.len();
    let size = std::mem::size_of::<T>();
    let pf = prefetch::distance();
    let full = n / LANES * LANES;
    // SAFETY: every load covers elements below `full` of `x` and (through
    // the caller's closure) of rows below `out.len()`.
    unsafe {
        let done = match full / LANES {
            1 => dots8::<1, T>(out, x, (base, n, pf), &load16, &row_tail),
            2 => dots8::<2, T>(out, x, (base, n, pf), &load16, &row_tail),
            3 => dots8::<3, T>(out, x, (base, n, pf), &load16, &row_tail),
            4 => dots8::<4, T>(out, x, (base, n, pf), &load16, &row_tail),
            _ => 0,
        };
        for (r, o) in out.iter_mut().enumerate().skip(done) {
            let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let mut i = 0;
            while i < full {
                prefetch::ahead_span(base.wrapping_add(r * n + i), LANES * size, pf);
                lo = _mm512_fmadd_ps(load16(r, i), _mm512_loadu_ps(x.as_ptr().add(i)), lo);
                hi = _mm512_fmadd_ps(load16(r, i + 16), _mm512_loadu_ps(x.as_ptr().add(i + 16)), hi);
                i += LANES;
            }
            *o = reduce(lo, hi) + row_tail(r);
        }
    }
}

/// [`dots`] for rows of `CH` whole chunks (and a tail), eight rows at a
/// time: the query in registers, each row read front to back, the eight
/// scores reduced as one tree. Returns the rows done (a multiple of 8).
#[inline(always)]
unsafe fn dots8<const CH: usize, T>(
    out: &mut [f32],
    x: &[f32],
    (base, n, pf): (*const T, usize, usize),
    load16: &impl Fn(usize, usize) -> __m512,
    row_tail: &impl Fn(usize) -> f32,
) -> usize {
    let size = std::mem::size_of::<T>();
    let full = CH * LANES;
    let mut r = 0;
    // SAFETY: as `dots`: every load covers elements below `full`.
    unsafe {
        let mut q = [[_mm512_setzero_ps(); 2]; CH];
        for (c, q) in q.iter_mut().enumerate() {
            q[0] = _mm512_loadu_ps(x.as_ptr().add(LANES * c));
            q[1] = _mm512_loadu_ps(x.as_ptr().add(LANES * c + 16));
        }
        while r + 8 <= out.len() {
            let mut lo = [_mm512_setzero_ps(); 8];
            let mut hi = [_mm512_setzero_ps(); 8];
            for k in 0..8 {
                for (c, q) in q.iter().enumerate() {
                    let i = LANES * c;
                    prefetch::ahead_span(base.wrapping_add((r + k) * n + i), LANES * size, pf);
                    lo[k] = _mm512_fmadd_ps(load16(r + k, i), q[0], lo[k]);
                    hi[k] = _mm512_fmadd_ps(load16(r + k, i + 16), q[1], hi[k]);
                }
            }
            let t: [__m512; 8] = std::array::from_fn(|k| _mm512_add_ps(lo[k], hi[k]));
            for (k, v) in reduce_tree(t).into_iter().enumerate() {
                // (An empty tail is 0.0, still added.)
                out[r + k] = v + if full == n { 0.0 } else { row_tail(r + k) };
            }
            r += 8;
        }
    }
    r
}

/// [`super::dots_f32`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dots_f32(rows: &[f32], x: &[f32], out: &mut [f32]) {
    let n = x.len();
    assert_eq!(rows.len(), out.len() * n, "rows do not match the outputs");
    // SAFETY: AVX-512F is enabled; row `r` is `rows[r * n..(r + 1) * n]`.
    unsafe {
        dots(
            out,
            x,
            rows.as_ptr(),
            |r, i| _mm512_loadu_ps(rows.as_ptr().add(r * n + i)),
            |r| tail(&rows[r * n..(r + 1) * n], x, |v| v),
        )
    }
}

/// [`super::dots_f16`]: keys widened exactly (`vcvtph2ps`, as F16C and
/// `f16_to_f32` do).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dots_f16(rows: &[u16], x: &[f32], out: &mut [f32]) {
    let n = x.len();
    assert_eq!(rows.len(), out.len() * n, "rows do not match the outputs");
    // SAFETY: AVX-512F is enabled; row `r` is `rows[r * n..(r + 1) * n]`.
    unsafe {
        dots(
            out,
            x,
            rows.as_ptr(),
            |r, i| _mm512_cvtph_ps(_mm256_loadu_si256(rows.as_ptr().add(r * n + i) as *const __m256i)),
            |r| tail(&rows[r * n..(r + 1) * n], x, crate::dtype::f16_to_f32),
        )
    }
}

/// One pass over columns `c..c + 16 K` of `H` outputs: `outs[h] (+)= Σ_j
/// weights[h][j] · row_j` over `keys` rows, each element in order of `j`
/// (one fused multiply-add a row), from zero when `zero`, else from the
/// outputs' values. `load16(j, i)` widens row `j`'s columns `i..i + 16`;
/// `prefetch(j)` runs before row `j` is read. `H` and `K` are constants
/// so the `H × K` sums stay in registers (with a run-time count of
/// vectors the loops were not unrolled and every sum went through the
/// stack on each multiply-add).
#[inline(always)]
unsafe fn weighted_pass<const H: usize, const K: usize>(
    outs: &mut [&mut [f32]],
    weights: &[&[f32]],
    (c, keys, zero): (usize, usize, bool),
    prefetch: impl Fn(usize),
    load16: impl Fn(usize, usize) -> __m512,
) {
    // SAFETY: the caller's closure reads columns below `c + 16 K` of rows
    // below `keys`; every output holds `c + 16 K` columns and every weight
    // row `keys` weights.
    unsafe {
        // (Loops over the constants `H` and `K` only: a loop bounded by a
        // slice's length is not unrolled, and the sums go to the stack.)
        debug_assert!(outs.len() == H && weights.len() == H);
        let mut acc = [[_mm512_setzero_ps(); K]; H];
        if !zero {
            for (h, acc) in acc.iter_mut().enumerate() {
                let o = outs.get_unchecked(h).as_ptr();
                for (b, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(o.add(c + 16 * b));
                }
            }
        }
        let w: [*const f32; H] = std::array::from_fn(|h| weights.get_unchecked(h).as_ptr());
        for j in 0..keys {
            prefetch(j);
            let mut v = [_mm512_setzero_ps(); K];
            for (b, v) in v.iter_mut().enumerate() {
                *v = load16(j, c + 16 * b);
            }
            for (acc, w) in acc.iter_mut().zip(w) {
                let p = _mm512_set1_ps(*w.add(j));
                for (a, v) in acc.iter_mut().zip(v) {
                    *a = _mm512_fmadd_ps(p, v, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let o = outs.get_unchecked_mut(h).as_mut_ptr();
            for (b, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.add(c + 16 * b), *a);
            }
        }
    }
}

/// [`weighted_pass`] over the whole 16-column vectors of `H` outputs (`n`
/// columns, `full` of them in whole vectors), `MAX` vectors a pass and the
/// rest in one shorter pass.
#[inline(always)]
unsafe fn weighted_passes<const H: usize, const MAX: usize>(
    outs: &mut [&mut [f32]],
    weights: &[&[f32]],
    (full, keys, zero): (usize, usize, bool),
    prefetch: impl Fn(usize, usize, usize) + Copy,
    load16: impl Fn(usize, usize) -> __m512 + Copy,
) {
    // The rest after the full passes is under `MAX` vectors: at most 7 below.
    const { assert!(MAX >= 1 && MAX <= 8) };
    let mut c = 0;
    // SAFETY: forwarded; every pass ends at or before `full`.
    unsafe {
        while c + 16 * MAX <= full {
            weighted_pass::<H, MAX>(outs, weights, (c, keys, zero), |j| prefetch(j, c, MAX), load16);
            c += 16 * MAX;
        }
        let shape = (c, keys, zero);
        let pf = |k: usize| move |j| prefetch(j, c, k);
        match (full - c) / 16 {
            0 => {}
            1 => weighted_pass::<H, 1>(outs, weights, shape, pf(1), load16),
            2 => weighted_pass::<H, 2>(outs, weights, shape, pf(2), load16),
            3 => weighted_pass::<H, 3>(outs, weights, shape, pf(3), load16),
            4 => weighted_pass::<H, 4>(outs, weights, shape, pf(4), load16),
            5 => weighted_pass::<H, 5>(outs, weights, shape, pf(5), load16),
            6 => weighted_pass::<H, 6>(outs, weights, shape, pf(6), load16),
            _ => weighted_pass::<H, 7>(outs, weights, shape, pf(7), load16),
        }
    }
}

/// `out += Σ_j weights[j] row_j`, up to 128 columns in registers per pass;
/// `load16(j, i)` widens row `j`'s columns `i..i + 16`, `at(j, i)` one
/// column past the last 16; `rows` is row 0's first element.
#[inline(always)]
unsafe fn weighted<T>(
    out: &mut [f32],
    weights: &[f32],
    rows: *const T,
    load16: impl Fn(usize, usize) -> __m512 + Copy,
    at: impl Fn(usize, usize) -> f32,
) {
    let n = out.len();
    let full = n / 16 * 16;
    let size = std::mem::size_of::<T>();
    let pf = prefetch::distance();
    let mut outs = [&mut *out];
    // SAFETY: every load and store covers 16 columns below `full` of `out`
    // and (through the caller's closure) of each row.
    unsafe {
        weighted_passes::<1, 8>(
            &mut outs,
            &[weights],
            (full, weights.len(), false),
            |j, c, k| prefetch::ahead_span(rows.wrapping_add(j * n + c), 16 * k * size, pf),
            load16,
        );
    }
    for (i, o) in out.iter_mut().enumerate().skip(full) {
        for (j, &p) in weights.iter().enumerate() {
            *o = p.mul_add(at(j, i), *o);
        }
    }
}

/// [`super::add_weighted_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn add_weighted_rows(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    let n = out.len();
    assert_eq!(rows.len(), weights.len() * n, "rows do not match the weights");
    // SAFETY: AVX-512F is enabled; row `j` is `rows[j * n..(j + 1) * n]`.
    unsafe {
        weighted(
            out,
            weights,
            rows.as_ptr(),
            |j, i| _mm512_loadu_ps(rows.as_ptr().add(j * n + i)),
            |j, i| rows[j * n + i],
        )
    }
}

/// [`super::add_weighted_rows_f16`]: rows widened exactly.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn add_weighted_rows_f16(out: &mut [f32], weights: &[f32], rows: &[u16]) {
    let n = out.len();
    assert_eq!(rows.len(), weights.len() * n, "rows do not match the weights");
    // SAFETY: AVX-512F is enabled; row `j` is `rows[j * n..(j + 1) * n]`.
    unsafe {
        weighted(
            out,
            weights,
            rows.as_ptr(),
            |j, i| _mm512_cvtph_ps(_mm256_loadu_si256(rows.as_ptr().add(j * n + i) as *const __m256i)),
            |j, i| crate::dtype::f16_to_f32(rows[j * n + i]),
        )
    }
}

/// `outs[h][i] = Σ_j weights[h][j] · row_j[i]` for `H` heads (every out
/// `n` long, row `j` starting at `j * stride`), 64 columns per pass: each
/// row's columns are loaded once (`load16(j, i)` widens row `j`'s
/// columns `i..i + 16`) for every head; each element is summed in order
/// of `j`, one fused multiply-add a row, from zero when `zero` (the bits
/// of `weighted` on a zeroed output), else continuing the outputs' sums
/// (`weighted` on them). `at(j, i)` is one column past the last 16.
#[inline(always)]
unsafe fn weighted_heads<const H: usize>(
    outs: &mut [&mut [f32]],
    weights: &[&[f32]],
    zero: bool,
    base: *const u8,
    row_bytes: usize,
    load16: impl Fn(usize, usize) -> __m512 + Copy,
    at: impl Fn(usize, usize) -> f32,
) {
    let n = outs[0].len();
    let keys = weights[0].len();
    let full = n / 16 * 16;
    let pf = prefetch::distance();
    // SAFETY: every load covers 16 columns below `full` of a row (through
    // the caller's closure) and every store 16 of an output.
    unsafe {
        weighted_passes::<H, 4>(
            outs,
            weights,
            (full, keys, zero),
            |j, _, _| prefetch::ahead_span(base.wrapping_add(j * row_bytes), row_bytes, pf),
            load16,
        );
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

/// [`weighted_heads`] for one to four heads.
#[inline(always)]
unsafe fn weighted_some(
    outs: &mut [&mut [f32]],
    weights: &[&[f32]],
    zero: bool,
    base: *const u8,
    row_bytes: usize,
    load16: impl Fn(usize, usize) -> __m512 + Copy,
    at: impl Fn(usize, usize) -> f32,
) {
    // SAFETY: forwarded.
    unsafe {
        match outs.len() {
            1 => weighted_heads::<1>(outs, weights, zero, base, row_bytes, load16, at),
            2 => weighted_heads::<2>(outs, weights, zero, base, row_bytes, load16, at),
            3 => weighted_heads::<3>(outs, weights, zero, base, row_bytes, load16, at),
            _ => weighted_heads::<4>(outs, weights, zero, base, row_bytes, load16, at),
        }
    }
}

/// [`super::weighted_rows_many`] (`zero`) or
/// [`super::add_weighted_rows_many`] for up to four heads.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn weighted_rows_many(rows: &[f32], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]], zero: bool) {
    debug_assert!(outs.len() <= 4);
    // SAFETY: AVX-512F is enabled; the caller checked that every row
    // `j < weights[h].len()` lies in `rows` with `outs[h].len() <= stride`.
    unsafe {
        weighted_some(
            outs,
            weights,
            zero,
            rows.as_ptr() as *const u8,
            4 * stride,
            |j, i| _mm512_loadu_ps(rows.as_ptr().add(j * stride + i)),
            |j, i| *rows.get_unchecked(j * stride + i),
        )
    }
}

/// [`super::weighted_rows_many_f16`] (`zero`) or
/// [`super::add_weighted_rows_many_f16`] for up to four heads: rows
/// widened exactly.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn weighted_rows_many_f16(
    rows: &[u16],
    stride: usize,
    weights: &[&[f32]],
    outs: &mut [&mut [f32]],
    zero: bool,
) {
    debug_assert!(outs.len() <= 4);
    // SAFETY: as `weighted_rows_many`.
    unsafe {
        weighted_some(
            outs,
            weights,
            zero,
            rows.as_ptr() as *const u8,
            2 * stride,
            |j, i| _mm512_cvtph_ps(_mm256_loadu_si256(rows.as_ptr().add(j * stride + i) as *const __m256i)),
            |j, i| crate::dtype::f16_to_f32(*rows.get_unchecked(j * stride + i)),
        )
    }
}
