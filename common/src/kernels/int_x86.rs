//! charm's INT8 / INT4 products in explicit AVX-512 and AVX2: one weight
//! row against one activation row (decode), and a tile of weight rows
//! against many activation rows (prefill), for groups that are whole
//! 16-column chunks (charm writes groups of 32 or 64, or one per row).
//!
//! [`super::dot_int8_portable`] and [`super::dot_int4_portable`] define each
//! product: per group, 16 lane sums of `q · x` (lane `i` the columns
//! `i mod 16`, a multiply then an add, in column order), each scaled into
//! its lane's running total (`total += acc · scale`), then the lanes summed
//! in index order. One 512-bit register, or two 256-bit ones on AVX2
//! ([`Lanes`]), is exactly those 16 lanes, so the operations here are the
//! portable body's, lane for lane, in its order: the same bits (tests in
//! `kernels.rs`). What the compiler could not find in the portable body:
//! INT4's nibbles spread to their columns with two byte unpacks per 32
//! columns, and in the tile each weight chunk widened once for every
//! activation row of a block and each activation chunk loaded once for
//! its weight rows (AVX-512: two rows by four activation rows; AVX2, with
//! half the registers: one by two).

use std::arch::x86_64::*;

use crate::prefetch;

/// Columns of one lane vector.
const W: usize = 16;

/// Sixteen f32 lanes in registers.
trait Lanes: Copy {
    /// Weight rows by activation rows of the tile's register blocks.
    const BLOCK: (usize, usize);
    unsafe fn zero() -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// Sixteen floats at `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// Sixteen signed bytes, widened.
    unsafe fn from_i8(v: __m128i) -> Self;
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    /// The lanes in order.
    unsafe fn lanes(self) -> [f32; W];
}

impl Lanes for __m512 {
    const BLOCK: (usize, usize) = (2, 4);

    #[inline(always)]
    unsafe fn zero() -> Self {
        _mm512_setzero_ps()
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        _mm512_set1_ps(v)
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's pointer covers 16 floats.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn from_i8(v: __m128i) -> Self {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
    }

    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        _mm512_add_ps(self, o)
    }

    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        _mm512_mul_ps(self, o)
    }

    #[inline(always)]
    unsafe fn lanes(self) -> [f32; W] {
        let mut out = [0.0f32; W];
        // SAFETY: `out` holds 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), self) };
        out
    }
}

/// Two 256-bit registers: lanes `0..8` and `8..16`.
#[derive(Clone, Copy)]
struct Ymm2(__m256, __m256);

impl Lanes for Ymm2 {
    const BLOCK: (usize, usize) = (1, 2);

    #[inline(always)]
    unsafe fn zero() -> Self {
        Ymm2(_mm256_setzero_ps(), _mm256_setzero_ps())
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Ymm2(_mm256_set1_ps(v), _mm256_set1_ps(v))
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's pointer covers 16 floats.
        unsafe { Ymm2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }

    #[inline(always)]
    unsafe fn from_i8(v: __m128i) -> Self {
        Ymm2(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
        )
    }

    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        Ymm2(_mm256_add_ps(self.0, o.0), _mm256_add_ps(self.1, o.1))
    }

    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        Ymm2(_mm256_mul_ps(self.0, o.0), _mm256_mul_ps(self.1, o.1))
    }

    #[inline(always)]
    unsafe fn lanes(self) -> [f32; W] {
        let mut out = [0.0f32; W];
        // SAFETY: `out` holds 16 floats.
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), self.0);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), self.1);
        }
        out
    }
}

/// Sixteen INT8 values at `p`, widened to f32.
#[inline(always)]
unsafe fn int8x16<L: Lanes>(p: *const i8) -> L {
    // SAFETY: the caller's pointer covers 16 bytes.
    unsafe { L::from_i8(_mm_loadu_si128(p as *const __m128i)) }
}

/// The signed INT4 values (`nibble - 8`) of the bytes in `v`, low nibbles
/// and high nibbles apart.
#[inline(always)]
unsafe fn nibbles(v: __m128i) -> (__m128i, __m128i) {
    let low4 = _mm_set1_epi8(0x0f);
    let eight = _mm_set1_epi8(8);
    (
        _mm_sub_epi8(_mm_and_si128(v, low4), eight),
        _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(v), low4), eight),
    )
}

/// The 32 INT4 values of the 16 bytes at `p` (column `2i` the low nibble
/// of byte `i`), widened to f32: columns `0..16` and `16..32`.
#[inline(always)]
unsafe fn int4x32<L: Lanes>(p: *const u8) -> (L, L) {
    // SAFETY: the caller's pointer covers 16 bytes.
    unsafe {
        let (lo, hi) = nibbles(_mm_loadu_si128(p as *const __m128i));
        (
            L::from_i8(_mm_unpacklo_epi8(lo, hi)),
            L::from_i8(_mm_unpackhi_epi8(lo, hi)),
        )
    }
}

/// The 16 INT4 values of the 8 bytes at `p`, widened to f32.
#[inline(always)]
unsafe fn int4x16<L: Lanes>(p: *const u8) -> L {
    // SAFETY: the caller's pointer covers 8 bytes.
    unsafe {
        let (lo, hi) = nibbles(_mm_loadl_epi64(p as *const __m128i));
        L::from_i8(_mm_unpacklo_epi8(lo, hi))
    }
}

/// One row against one activation row: `chunk(g, acc)` adds group `g`'s
/// products into its lanes; the groups' weights (`group_bytes` each from
/// `base`) are prefetched a cache line at a time (a hint: never a bit).
#[inline(always)]
unsafe fn row<L: Lanes>(
    scales: &[f32],
    (base, group_bytes): (*const u8, usize),
    chunk: impl Fn(usize, L) -> L,
) -> [f32; W] {
    let pf = prefetch::distance();
    let mut line = 0;
    // SAFETY: register arithmetic; the caller's closure reads its group.
    unsafe {
        let mut total = L::zero();
        for (g, &scale) in scales.iter().enumerate() {
            // Every line the group reaches into, once (INT4's groups of 32
            // are a quarter of a line).
            while line < (g + 1) * group_bytes {
                prefetch::ahead(base.wrapping_add(line), pf);
                line += 64;
            }
            let acc = chunk(g, L::zero());
            total = total.add(acc.mul(L::splat(scale)));
        }
        total.lanes()
    }
}

/// [`super::dot_int8`]'s lanes: `q: cols`, `scales: cols / group`, `group`
/// a multiple of 16.
#[inline(always)]
unsafe fn dot_int8<L: Lanes>(q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> [f32; W] {
    debug_assert!(group.is_multiple_of(W) && q.len() == x.len() && q.len() == scales.len() * group);
    let (qp, xp) = (q.as_ptr(), x.as_ptr());
    // SAFETY: group `g` reads its `group` values and floats, below the
    // rows' lengths.
    unsafe {
        row::<L>(scales, (qp as *const u8, group), |g, mut acc| {
            let (qg, xg) = (qp.add(g * group), xp.add(g * group));
            for i in (0..group).step_by(W) {
                acc = acc.add(int8x16::<L>(qg.add(i)).mul(L::load(xg.add(i))));
            }
            acc
        })
    }
}

/// [`super::dot_int4`]'s lanes: `packed: cols / 2` bytes, `group` a
/// multiple of 16.
#[inline(always)]
unsafe fn dot_int4<L: Lanes>(packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> [f32; W] {
    debug_assert!(group.is_multiple_of(W) && 2 * packed.len() == x.len() && x.len() == scales.len() * group);
    let (pp, xp) = (packed.as_ptr(), x.as_ptr());
    // SAFETY: group `g` reads its `group / 2` bytes and `group` floats,
    // below the rows' lengths.
    unsafe {
        row::<L>(scales, (pp, group / 2), |g, mut acc| {
            let (p, xg) = (pp.add(g * group / 2), xp.add(g * group));
            let mut i = 0;
            while i + 2 * W <= group {
                let (a, b) = int4x32::<L>(p.add(i / 2));
                acc = acc.add(a.mul(L::load(xg.add(i))));
                acc = acc.add(b.mul(L::load(xg.add(i + W))));
                i += 2 * W;
            }
            if i < group {
                acc = acc.add(int4x16::<L>(p.add(i / 2)).mul(L::load(xg.add(i))));
            }
            acc
        })
    }
}

/// `R` weight rows against `T` activation rows: each pair's 16 lane
/// totals. `widen(r, c)` is row `r`'s column chunk `c` (16 values) as f32;
/// `scale(r, g)` its group `g`'s scale.
#[inline(always)]
unsafe fn block<L: Lanes, const R: usize, const T: usize>(
    (group, groups): (usize, usize),
    xs: [&[f32]; T],
    widen: impl Fn(usize, usize) -> L,
    scale: impl Fn(usize, usize) -> f32,
) -> [[[f32; W]; T]; R] {
    // SAFETY: chunks below `groups * group / 16` of every row (the caller's
    // closure) and of every `xs[t]`.
    unsafe {
        let mut total = [[L::zero(); T]; R];
        for g in 0..groups {
            let mut acc = [[L::zero(); T]; R];
            for c in g * group / W..(g + 1) * group / W {
                // (Plain loops, not `array::from_fn`: a closure does not
                // inherit the caller's target features.)
                let mut x = [L::zero(); T];
                for (xv, xt) in x.iter_mut().zip(xs) {
                    *xv = L::load(xt.as_ptr().add(W * c));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let w = widen(r, c);
                    for (a, xv) in acc.iter_mut().zip(x) {
                        *a = a.add(w.mul(xv));
                    }
                }
            }
            for (r, (total, acc)) in total.iter_mut().zip(acc).enumerate() {
                let s = L::splat(scale(r, g));
                for (t, a) in total.iter_mut().zip(acc) {
                    *t = t.add(a.mul(s));
                }
            }
        }
        let mut out = [[[0.0f32; W]; T]; R];
        for (o, t) in out.iter_mut().zip(&total) {
            for (o, t) in o.iter_mut().zip(t) {
                *o = t.lanes();
            }
        }
        out
    }
}

/// The tile: `finish(lanes)` of every pair of the `out.len() / xs.len()`
/// rows and `xs` into `out[r * xs.len() + t]`, in blocks of
/// [`Lanes::BLOCK`] and smaller blocks at the edges. `widen(r, c)` is row
/// `r`'s column chunk `c` as f32; row `r`'s scales are `scales[r * groups..
/// (r + 1) * groups]` (the caller checked the sizes).
#[inline(always)]
unsafe fn tile<L: Lanes>(
    (scales, group, cols): (&[f32], usize, usize),
    xs: &[&[f32]],
    out: &mut [f32],
    widen: impl Fn(usize, usize) -> L + Copy,
    finish: impl Fn([f32; W]) -> f32,
) {
    let groups = cols / group;
    // SAFETY: row `r < out.len() / xs.len()` has `groups` scales.
    let scale = |r: usize, g: usize| unsafe { *scales.get_unchecked(r * groups + g) };
    let (rows, acts) = L::BLOCK;
    let n = xs.len();
    let nrows = out.len() / n.max(1);
    let mut t0 = 0;
    while t0 < n {
        let tn = (n - t0).min(acts);
        let mut r0 = 0;
        while r0 < nrows {
            let rn = (nrows - r0).min(rows);
            let w = move |r: usize, c: usize| widen(r0 + r, c);
            let s = move |r: usize, g: usize| scale(r0 + r, g);
            // SAFETY: the caller's closures read rows below `nrows`; every
            // `xs[t]` holds the rows' columns.
            macro_rules! run {
                ($r:literal, $t:literal) => {{
                    let x: [&[f32]; $t] = std::array::from_fn(|t| xs[t0 + t]);
                    let v = unsafe { block::<L, $r, $t>((group, groups), x, w, s) };
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

/// The entry points of one instruction set: `$features` enabled, `$lanes`
/// its [`Lanes`].
macro_rules! entries {
    ($features:literal, $lanes:ty, $dot8:ident, $dot4:ident, $tile8:ident, $tile4:ident) => {
        /// [`super::dot_int8`]'s lanes (`group` a multiple of 16).
        #[target_feature(enable = $features)]
        pub(super) fn $dot8(q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> [f32; W] {
            // SAFETY: the features are enabled; the sizes are the dot's.
            unsafe { dot_int8::<$lanes>(q, scales, group, x) }
        }

        /// [`super::dot_int4`]'s lanes (`group` a multiple of 16).
        #[target_feature(enable = $features)]
        pub(super) fn $dot4(packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> [f32; W] {
            // SAFETY: as above.
            unsafe { dot_int4::<$lanes>(packed, scales, group, x) }
        }

        /// [`super::dots_tile_int8`] (`group` a multiple of 16).
        #[target_feature(enable = $features)]
        pub(super) fn $tile8(
            (q, scales, group): (&[i8], &[f32], usize),
            cols: usize,
            xs: &[&[f32]],
            out: &mut [f32],
            finish: impl Fn([f32; W]) -> f32,
        ) {
            // SAFETY: as above; the caller checked the tile's sizes (row
            // `r` is `q[r * cols..(r + 1) * cols]`).
            unsafe {
                let widen = |r: usize, c: usize| int8x16::<$lanes>(q.as_ptr().add(r * cols + W * c));
                tile::<$lanes>((scales, group, cols), xs, out, widen, finish)
            }
        }

        /// [`super::dots_tile_int4`] (`group` a multiple of 16).
        #[target_feature(enable = $features)]
        pub(super) fn $tile4(
            (packed, scales, group): (&[u8], &[f32], usize),
            cols: usize,
            xs: &[&[f32]],
            out: &mut [f32],
            finish: impl Fn([f32; W]) -> f32,
        ) {
            // SAFETY: as above (row `r` is `packed[r * cols / 2..(r + 1) *
            // cols / 2]`).
            unsafe {
                let widen = |r: usize, c: usize| int4x16::<$lanes>(packed.as_ptr().add(r * cols / 2 + W / 2 * c));
                tile::<$lanes>((scales, group, cols), xs, out, widen, finish)
            }
        }
    };
}

entries!(
    "avx512f,avx512bw,avx512vl,avx2,f16c,fma",
    __m512,
    dot_int8_x512,
    dot_int4_x512,
    dots_tile_int8_x512,
    dots_tile_int4_x512
);
entries!(
    "avx2,f16c,fma",
    Ymm2,
    dot_int8_avx2,
    dot_int4_avx2,
    dots_tile_int8_avx2,
    dots_tile_int4_avx2
);
