//! Prefill's float-row products in explicit AVX-512: a tile of weight rows
//! (F32, BF16 or F16) against many f32 activation rows, register-blocked.
//!
//! [`super::dot_with`] defines each product: 32 lane sums (lane `i` holds
//! the columns `i mod 32` of the whole chunks, in order), one fused
//! multiply-add per element, then `reduce` and the in-order tail. Here a block of
//! [`ROWS`] weight rows meets [`ACTS`] activation rows at once: each pair
//! keeps its 32 lanes in two 16-wide registers (24 accumulators), each
//! weight vector is widened once for the four activation rows and each
//! activation vector loaded once for the three weight rows, so the
//! multiply-adds, not the loads, bound the loop (the one-row-by-three
//! AVX2 loop reloads every activation vector per weight row and waits on
//! L2). Every pair takes the one-row dot's operations in its order, so
//! the bits are those of every build (tests in `kernels.rs`).

use std::arch::x86_64::*;

use super::attention_x512::{reduce, reduce_tree};
use super::{tail, LANES};
use crate::prefetch;

/// Weight rows per register block.
const ROWS: usize = 3;

/// Activation rows per register block.
const ACTS: usize = 4;

/// `out[r * T + t] = row_r · xs[t]` over the whole chunks (no tail) for
/// `R` rows and `T` activation rows; `load16(r, i)` widens row `r`'s
/// elements `i..i + 16`.
#[inline(always)]
unsafe fn block<const R: usize, const T: usize>(
    full: usize,
    xs: [&[f32]; T],
    load16: impl Fn(usize, usize) -> __m512,
) -> [[f32; T]; R] {
    let mut acc = [[[_mm512_setzero_ps(); 2]; T]; R];
    let mut i = 0;
    // SAFETY: every load covers elements below `full` of each `xs[t]` and
    // (through the caller's closure) of each row.
    unsafe {
        while i < full {
            for h in 0..2 {
                // (Plain loops, not `array::from_fn`: a closure does not
                // inherit the caller's target features, and its intrinsics
                // would become calls.)
                let mut x = [_mm512_setzero_ps(); T];
                for (xv, xt) in x.iter_mut().zip(xs) {
                    *xv = _mm512_loadu_ps(xt.as_ptr().add(i + 16 * h));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let w = load16(r, i + 16 * h);
                    for (a, xv) in acc.iter_mut().zip(x) {
                        a[h] = _mm512_fmadd_ps(w, xv, a[h]);
                    }
                }
            }
            i += LANES;
        }
        let mut sums = [[0.0f32; T]; R];
        if R == ROWS && T == ACTS {
            // SAFETY: `R` and `T` are the full block's (checked just above),
            // so the arrays have these types.
            let full = reduce_block(&*(acc.as_ptr() as *const [[[__m512; 2]; ACTS]; ROWS]));
            sums.as_mut_ptr().cast::<[[f32; ACTS]; ROWS]>().write(full);
            return sums;
        }
        for (s, a) in sums.iter_mut().zip(&acc) {
            for (s, a) in s.iter_mut().zip(a) {
                *s = reduce(a[0], a[1]);
            }
        }
        sums
    }
}

/// `reduce` of a full block's twelve pairs of lane sums at once
/// ([`super::attention_x512::reduce_tree`]): at 128 wide (attention's
/// heads) a block has only 96 multiply-adds, and the twelve one-by-one
/// reductions took about as long.
#[inline(always)]
unsafe fn reduce_block(acc: &[[[__m512; 2]; ACTS]; ROWS]) -> [[f32; ACTS]; ROWS] {
    // SAFETY: AVX-512F is enabled by every caller.
    unsafe {
        // t[s] = acc[i] + acc[i + 16] of sum s = 4 r + t.
        let t: [__m512; 12] = std::array::from_fn(|s| _mm512_add_ps(acc[s / 4][s % 4][0], acc[s / 4][s % 4][1]));
        let v = reduce_tree(t);
        std::array::from_fn(|r| std::array::from_fn(|t| v[4 * r + t]))
    }
}

/// The tile: `out[r * xs.len() + t] = rows[r] · xs[t]` for the `out.len() /
/// xs.len()` rows of `rows` (row-major, `cols` wide), in blocks of
/// [`ROWS`] × [`ACTS`] and smaller blocks at the edges. `row_tail(r, x)` is
/// row `r`'s tail against `x`. `next` is where the rows after the tile
/// begin and `tile_bytes` the tile's size: while the tile's blocks run,
/// the same number of bytes from `next` is asked for into L2, a share per
/// activation block, spread over its blocks of rows (a prefill's matrices are read from memory once, and
/// the next tile's first pass would otherwise wait on it; a prefetch never
/// faults, wherever `next` points).
#[inline(always)]
unsafe fn tile(
    cols: usize,
    xs: &[&[f32]],
    out: &mut [f32],
    (next, tile_bytes): (*const u8, usize),
    load16: impl Fn(usize, usize) -> __m512 + Copy,
    row_tail: impl Fn(usize, &[f32]) -> f32 + Copy,
) {
    let n = xs.len();
    let nrows = out.len() / n.max(1);
    let full = cols / LANES * LANES;
    let share = tile_bytes.div_ceil(n.div_ceil(ACTS).max(1)).next_multiple_of(64);
    let mut t0 = 0;
    while t0 < n {
        let tn = (n - t0).min(ACTS);
        let from = (t0 / ACTS * share).min(tile_bytes);
        let len = share.min(tile_bytes - from);
        // The block's share a slice per block of rows.
        let pf = prefetch::Slices::new(next.wrapping_add(from), len, nrows.div_ceil(ROWS));
        let mut r0 = 0;
        while r0 < nrows {
            let rn = (nrows - r0).min(ROWS);
            pf.to_l2(r0 / ROWS);
            let at = move |r: usize, i: usize| load16(r0 + r, i);
            // SAFETY: the caller's closure reads rows below `nrows` and
            // columns below `full`; every `xs[t]` holds `cols` elements.
            macro_rules! run {
                ($r:literal, $t:literal) => {{
                    let x: [&[f32]; $t] = std::array::from_fn(|t| xs[t0 + t]);
                    let v = unsafe { block::<$r, $t>(full, x, at) };
                    for (r, v) in v.iter().enumerate() {
                        for (t, v) in v.iter().enumerate() {
                            // (An empty tail is 0.0, still added.)
                            let tail = if full == cols { 0.0 } else { row_tail(r0 + r, x[t]) };
                            out[(r0 + r) * n + t0 + t] = v + tail;
                        }
                    }
                }};
            }
            match (rn, tn) {
                (3, 4) => run!(3, 4),
                (3, 3) => run!(3, 3),
                (3, 2) => run!(3, 2),
                (3, 1) => run!(3, 1),
                (2, 4) => run!(2, 4),
                (2, 3) => run!(2, 3),
                (2, 2) => run!(2, 2),
                (2, 1) => run!(2, 1),
                (1, 4) => run!(1, 4),
                (1, 3) => run!(1, 3),
                (1, 2) => run!(1, 2),
                _ => run!(1, 1),
            }
            r0 += rn;
        }
        t0 += tn;
    }
}

/// The address just past `rows` and their size in bytes, for [`tile`]'s
/// prefetch of the rows that follow them; nothing to fetch unless `ahead`
/// (a KV cache's keys: what follows them is not read next).
fn beyond<T>(rows: &[T], ahead: bool) -> (*const u8, usize) {
    let bytes = if ahead { std::mem::size_of_val(rows) } else { 0 };
    ((rows.as_ptr() as *const u8).wrapping_add(bytes), bytes)
}

/// [`super::dots_tile_f32`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dots_tile_f32(rows: &[f32], cols: usize, xs: &[&[f32]], out: &mut [f32], ahead: bool) {
    // SAFETY: AVX-512F is enabled; row `r` is `rows[r * cols..(r + 1) * cols]`.
    unsafe {
        tile(
            cols,
            xs,
            out,
            beyond(rows, ahead),
            |r, i| _mm512_loadu_ps(rows.as_ptr().add(r * cols + i)),
            |r, x| tail(&rows[r * cols..(r + 1) * cols], x, |v| v),
        )
    }
}

/// [`super::dots_tile_bf16`]: a bf16 is the top half of its f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dots_tile_bf16(rows: &[u16], cols: usize, xs: &[&[f32]], out: &mut [f32], ahead: bool) {
    // SAFETY: AVX-512F/BW are enabled; row `r` is `rows[r * cols..(r + 1) * cols]`.
    unsafe {
        tile(
            cols,
            xs,
            out,
            beyond(rows, ahead),
            |r, i| {
                let h = _mm256_loadu_si256(rows.as_ptr().add(r * cols + i) as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            },
            |r, x| tail(&rows[r * cols..(r + 1) * cols], x, crate::dtype::bf16_to_f32),
        )
    }
}

/// [`super::dots_tile_f16`]: halves widened exactly (`vcvtph2ps`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dots_tile_f16(rows: &[u16], cols: usize, xs: &[&[f32]], out: &mut [f32], ahead: bool) {
    // SAFETY: AVX-512F is enabled; row `r` is `rows[r * cols..(r + 1) * cols]`.
    unsafe {
        tile(
            cols,
            xs,
            out,
            beyond(rows, ahead),
            |r, i| _mm512_cvtph_ps(_mm256_loadu_si256(rows.as_ptr().add(r * cols + i) as *const __m256i)),
            |r, x| tail(&rows[r * cols..(r + 1) * cols], x, crate::dtype::f16_to_f32),
        )
    }
}
