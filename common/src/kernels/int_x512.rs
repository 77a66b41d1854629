//! charm's INT8 / INT4 products in explicit AVX-512: one weight row against
//! one activation row (decode), and a tile of weight rows against many
//! activation rows (prefill), for groups that are whole 16-column chunks
//! (charm writes groups of 32 or 64).
//!
//! [`super::dot_int8_portable`] and [`super::dot_int4_portable`] define each
//! product: per group, 16 lane sums of `q · x` (lane `i` the columns
//! `i mod 16`, a multiply then an add, in column order), each scaled into
//! its lane's running total (`total += acc · scale`), then the lanes summed
//! in index order. A 512-bit register is exactly those 16 lanes, so the
//! operations here are the portable body's, lane for lane, in its order:
//! the same bits (tests in `kernels.rs`). What the compiler could not find
//! in the portable body: INT4's nibbles spread to their columns with two
//! byte unpacks per 32 columns, and in the tile each weight chunk widened
//! once for four activation rows and each activation chunk loaded once for
//! two weight rows.

use std::arch::x86_64::*;

use crate::prefetch;

/// Weight rows per register block of the tile.
const ROWS: usize = 2;

/// Activation rows per register block of the tile.
const ACTS: usize = 4;

/// Columns of one lane vector.
const W: usize = 16;

/// Sixteen INT8 values at `p`, widened to f32.
#[inline(always)]
unsafe fn int8x16(p: *const i8) -> __m512 {
    // SAFETY: the caller's pointer covers 16 bytes.
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
}

/// The 32 INT4 values of the 16 bytes at `p` (column `2i` the low nibble
/// of byte `i`, `q = nibble - 8`), widened to f32: columns `0..16` and
/// `16..32`.
#[inline(always)]
unsafe fn int4x32(p: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller's pointer covers 16 bytes.
    unsafe {
        let v = _mm_loadu_si128(p as *const __m128i);
        let low4 = _mm_set1_epi8(0x0f);
        let eight = _mm_set1_epi8(8);
        let lo = _mm_sub_epi8(_mm_and_si128(v, low4), eight);
        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(v), low4), eight);
        (
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(lo, hi))),
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(lo, hi))),
        )
    }
}

/// The 16 INT4 values of the 8 bytes at `p`, widened to f32.
#[inline(always)]
unsafe fn int4x16(p: *const u8) -> __m512 {
    // SAFETY: the caller's pointer covers 8 bytes.
    unsafe {
        let v = _mm_loadl_epi64(p as *const __m128i);
        let low4 = _mm_set1_epi8(0x0f);
        let eight = _mm_set1_epi8(8);
        let lo = _mm_sub_epi8(_mm_and_si128(v, low4), eight);
        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(v), low4), eight);
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(lo, hi)))
    }
}

/// A register's lanes.
#[inline(always)]
fn lanes(v: __m512) -> [f32; W] {
    let mut out = [0.0f32; W];
    // SAFETY: `out` holds 16 floats; AVX-512F is the caller's target.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// [`super::dot_int8`]'s lanes: `q: cols`, `scales: cols / group`, `group`
/// a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dot_int8_lanes(q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> [f32; W] {
    debug_assert!(group.is_multiple_of(W) && q.len() == x.len() && q.len() == scales.len() * group);
    let (qp, xp) = (q.as_ptr(), x.as_ptr());
    let pf = prefetch::distance();
    // SAFETY: each group reads its `group` values and floats, below the
    // rows' lengths.
    unsafe {
        let mut total = _mm512_setzero_ps();
        for (g, &scale) in scales.iter().enumerate() {
            let (qg, xg) = (qp.add(g * group), xp.add(g * group));
            prefetch::ahead_span(qg, group, pf);
            let mut acc = _mm512_setzero_ps();
            for i in (0..group).step_by(W) {
                acc = _mm512_add_ps(acc, _mm512_mul_ps(int8x16(qg.add(i)), _mm512_loadu_ps(xg.add(i))));
            }
            total = _mm512_add_ps(total, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
        }
        lanes(total)
    }
}

/// [`super::dot_int4`]'s lanes: `packed: cols / 2` bytes, `group` a
/// multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dot_int4_lanes(packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> [f32; W] {
    debug_assert!(group.is_multiple_of(W) && 2 * packed.len() == x.len() && x.len() == scales.len() * group);
    let (pp, xp) = (packed.as_ptr(), x.as_ptr());
    let pf = prefetch::distance();
    // SAFETY: each group reads its `group / 2` bytes and `group` floats,
    // below the rows' lengths.
    unsafe {
        let mut total = _mm512_setzero_ps();
        for (g, &scale) in scales.iter().enumerate() {
            let p = pp.add(g * group / 2);
            let xg = xp.add(g * group);
            prefetch::ahead_span(p, group / 2, pf);
            let mut acc = _mm512_setzero_ps();
            let mut i = 0;
            while i + 2 * W <= group {
                let (a, b) = int4x32(p.add(i / 2));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(a, _mm512_loadu_ps(xg.add(i))));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(b, _mm512_loadu_ps(xg.add(i + W))));
                i += 2 * W;
            }
            if i < group {
                let a = int4x16(p.add(i / 2));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(a, _mm512_loadu_ps(xg.add(i))));
            }
            total = _mm512_add_ps(total, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
        }
        lanes(total)
    }
}

/// `R` weight rows against `T` activation rows: each pair's 16 lane
/// totals. `widen(r, c)` is row `r`'s column chunk `c` (16 values) as f32;
/// `scale(r, g)` its group `g`'s scale.
#[inline(always)]
unsafe fn block<const R: usize, const T: usize>(
    (group, groups): (usize, usize),
    xs: [&[f32]; T],
    widen: impl Fn(usize, usize) -> __m512,
    scale: impl Fn(usize, usize) -> f32,
) -> [[[f32; W]; T]; R] {
    let mut total = [[_mm512_setzero_ps(); T]; R];
    // SAFETY: chunks below `groups * group / 16` of every row (the caller's
    // closure) and of every `xs[t]`.
    unsafe {
        for g in 0..groups {
            let mut acc = [[_mm512_setzero_ps(); T]; R];
            for c in g * group / W..(g + 1) * group / W {
                // (Plain loops, not `array::from_fn`: a closure does not
                // inherit the caller's target features.)
                let mut x = [_mm512_setzero_ps(); T];
                for (xv, xt) in x.iter_mut().zip(xs) {
                    *xv = _mm512_loadu_ps(xt.as_ptr().add(W * c));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let w = widen(r, c);
                    for (a, xv) in acc.iter_mut().zip(x) {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(w, xv));
                    }
                }
            }
            for (r, (total, acc)) in total.iter_mut().zip(acc).enumerate() {
                let s = _mm512_set1_ps(scale(r, g));
                for (t, a) in total.iter_mut().zip(acc) {
                    *t = _mm512_add_ps(*t, _mm512_mul_ps(a, s));
                }
            }
        }
        let mut out = [[[0.0f32; W]; T]; R];
        for (o, t) in out.iter_mut().zip(&total) {
            for (o, t) in o.iter_mut().zip(t) {
                *o = lanes(*t);
            }
        }
        out
    }
}

/// The tile: `finish(lanes)` of every pair of the `out.len() / xs.len()`
/// rows and `xs` into `out[r * xs.len() + t]`, in blocks of [`ROWS`] ×
/// [`ACTS`] and smaller blocks at the edges.
#[inline(always)]
unsafe fn tile(
    (group, groups): (usize, usize),
    xs: &[&[f32]],
    out: &mut [f32],
    widen: impl Fn(usize, usize) -> __m512 + Copy,
    scale: impl Fn(usize, usize) -> f32 + Copy,
    finish: impl Fn([f32; W]) -> f32,
) {
    let n = xs.len();
    let nrows = out.len() / n.max(1);
    let mut t0 = 0;
    while t0 < n {
        let tn = (n - t0).min(ACTS);
        let mut r0 = 0;
        while r0 < nrows {
            let rn = (nrows - r0).min(ROWS);
            let w = move |r: usize, c: usize| widen(r0 + r, c);
            let s = move |r: usize, g: usize| scale(r0 + r, g);
            // SAFETY: the caller's closures read rows below `nrows`; every
            // `xs[t]` holds the rows' columns.
            macro_rules! run {
                ($r:literal, $t:literal) => {{
                    let x: [&[f32]; $t] = std::array::from_fn(|t| xs[t0 + t]);
                    let v = unsafe { block::<$r, $t>((group, groups), x, w, s) };
                    for (r, v) in v.iter().enumerate() {
                        for (t, v) in v.iter().enumerate() {
                            out[(r0 + r) * n + t0 + t] = finish(*v);
                        }
                    }
                }};
            }
            match (rn, tn) {
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

/// [`super::dots_tile_int8`] for a `group` that is a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dots_tile_int8(
    (q, scales, group): (&[i8], &[f32], usize),
    cols: usize,
    xs: &[&[f32]],
    out: &mut [f32],
    finish: impl Fn([f32; W]) -> f32,
) {
    let groups = cols / group;
    // SAFETY: row `r` is `q[r * cols..(r + 1) * cols]` with scales
    // `scales[r * groups..(r + 1) * groups]` (the caller checked the sizes).
    unsafe {
        tile(
            (group, groups),
            xs,
            out,
            |r, c| int8x16(q.as_ptr().add(r * cols + W * c)),
            |r, g| *scales.get_unchecked(r * groups + g),
            finish,
        )
    }
}

/// [`super::dots_tile_int4`] for a `group` that is a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c,fma")]
pub(super) fn dots_tile_int4(
    (packed, scales, group): (&[u8], &[f32], usize),
    cols: usize,
    xs: &[&[f32]],
    out: &mut [f32],
    finish: impl Fn([f32; W]) -> f32,
) {
    let groups = cols / group;
    // SAFETY: row `r` is `packed[r * cols / 2..(r + 1) * cols / 2]` with
    // scales as INT8's (the caller checked the sizes).
    unsafe {
        tile(
            (group, groups),
            xs,
            out,
            |r, c| int4x16(packed.as_ptr().add(r * cols / 2 + W / 2 * c)),
            |r, g| *scales.get_unchecked(r * groups + g),
            finish,
        )
    }
}
