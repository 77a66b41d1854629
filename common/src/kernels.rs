//! Scalar f32 math on activations: the one place for each formula.
//!
//! Dot products use 32 (float rows) or 16 (quantized rows)
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
//! order of every operation is fixed by the source, so all builds give the
//! same bits on every CPU (`*_on` runs a chosen build; tests compare them).
//! The float dots and weighted sums fuse each multiply with its add
//! (`f32::mul_add`, one rounding; `vfmadd` on x86, which the AVX2 set here
//! requires, `fmla` on NEON): half the vector operations of a separate
//! multiply and add, which bound the prefill tiles. Rust never fuses on
//! its own, so the quantized dots, which multiply and add separately,
//! keep their bits. The float dots and
//! attention's weighted value sums (`dots_f32` / `dots_f16`,
//! `add_weighted_rows` / `_f16`) have explicit AVX2 lanes (`float_x86`)
//! that perform the portable body's operations in its order; attention's
//! four also have AVX-512 bodies (`attention_x512`: a 128-wide head's
//! values in one pass) with the same bits, and the weighted sums of
//! several heads over the same rows (prefill's blocks of queries, a KV
//! head's query heads) explicit AVX2 passes (`weighted_heads_x86`: each
//! row widened once for up to four heads). Prefill's float-row products
//! (`dots_tile_*`: a tile of weight rows against many activation rows)
//! run register-blocked on AVX-512 (`float_tile_x512`: three rows by four
//! activation rows per block), each pair with the one-row dot's bits;
//! charm's INT8 / INT4 rows likewise (`int_x86`: one-row dots, and tiles
//! of two rows by four activation rows on AVX-512, one by two on AVX2, for
//! groups of whole 16-column chunks). The gated delta rule of
//! DeltaNet layers (`delta_rule`) has a reference and a column-blocked
//! fast path with its bits. SiLU, sigmoid and the softmaxes take `e^x`
//! from [`exp`] (`f32` IEEE operations only, within 1.2 ulp), not
//! the C library, whose `expf` differs between glibc's CPU variants and
//! macOS: an expert's activation has the same bits on every worker.

use crate::dtype::{bf16_to_f32, f16_to_f32};
use crate::isa::Isa;
use crate::quant::unpack_int4;

#[cfg(target_arch = "x86_64")]
mod attention_x512;
#[cfg(target_arch = "x86_64")]
mod float_tile_x512;
#[cfg(target_arch = "x86_64")]
mod int_x86;
#[cfg(target_arch = "x86_64")]
mod weighted_heads_x86;

/// Lanes of the float dots: four 8-wide (or two 16-wide, or eight 4-wide)
/// vectors of independent sums, enough to hide the add latency on every
/// build (with 8 lanes an AVX2 build had one dependency chain and ran
/// slower than the SSE2 one).
const LANES: usize = 32;

/// Sums the lanes in a fixed pairwise order.
#[inline(always)]
fn reduce(acc: [f32; LANES]) -> f32 {
    let mut a = [0.0f32; 8];
    for (i, v) in a.iter_mut().enumerate() {
        *v = (acc[i] + acc[i + 16]) + (acc[i + 8] + acc[i + 24]);
    }
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// Generic dot product over a weight row converted element-wise by `cvt`:
/// `LANES` lane sums over the full chunks, then [`finish`].
#[inline(always)]
fn dot_with<T: Copy>(w: &[T], x: &[f32], cvt: impl Fn(T) -> f32) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0.0f32; LANES];
    for (a, b) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] = cvt(a[i]).mul_add(b[i], acc[i]);
        }
    }
    finish(acc, w, x, cvt)
}

/// The lane sums reduced, plus the columns past the last full chunk summed
/// in order: the end of every float dot, whichever build formed the lanes.
#[inline(always)]
fn finish<T: Copy>(acc: [f32; LANES], w: &[T], x: &[f32], cvt: impl Fn(T) -> f32) -> f32 {
    reduce(acc) + tail(w, x, cvt)
}

/// The columns past the last full chunk, summed in order.
#[inline(always)]
fn tail<T: Copy>(w: &[T], x: &[f32], cvt: impl Fn(T) -> f32) -> f32 {
    let full = w.len() / LANES * LANES;
    let mut tail = 0.0f32;
    for (a, b) in w[full..].iter().zip(&x[full..]) {
        tail = cvt(*a).mul_add(*b, tail);
    }
    tail
}

/// The float dots' lane sums in explicit AVX2 (the compiler's own
/// vectorization of [`dot_with`] depends on the lane count and the target
/// in ways that cost up to 4x): four 8-wide registers, lane `i` of the
/// array being element `i mod 32` of every chunk, as in [`dot_with`], with
/// the same fused multiply-add, so the bits are the portable build's.
#[cfg(target_arch = "x86_64")]
mod float_x86 {
    use std::arch::x86_64::*;

    use super::{tail, LANES};
    use crate::dtype::{bf16_to_f32, f16_to_f32};

    /// [`super::reduce`] in registers: lane `i` of register `r` is lane
    /// `8r + i` of the array, and every add pairs the same two values in
    /// the same order.
    #[inline(always)]
    unsafe fn reduce(a: [__m256; 4]) -> f32 {
        // a[i] = (acc[i] + acc[i + 16]) + (acc[i + 8] + acc[i + 24])
        let v = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
        // h = [a0 + a4, a1 + a5, a2 + a6, a3 + a7]
        let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        // p0 = h0 + h1, p2 = h2 + h3 (the odd lanes hold the same sums swapped)
        let p = _mm_add_ps(h, _mm_shuffle_ps(h, h, 0b10_11_00_01));
        _mm_cvtss_f32(_mm_add_ss(p, _mm_movehl_ps(p, p)))
    }

    /// The chunk loop of every float dot: `load8(i)` widens the row's
    /// elements `i..i + 8`; `row` is the row's first element (`size` bytes
    /// each), for [`crate::prefetch`].
    #[inline(always)]
    unsafe fn lane_sums<T>(n: usize, x: &[f32], row: *const T, load8: impl Fn(usize) -> __m256) -> f32 {
        let size = std::mem::size_of::<T>();
        let pf = crate::prefetch::distance();
        let mut a = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: `x` and the row behind `load8` hold `n` elements.
        unsafe {
            while i + LANES <= n {
                crate::prefetch::ahead_span(row.wrapping_add(i), LANES * size, pf);
                for (j, aj) in a.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x.as_ptr().add(i + 8 * j));
                    *aj = _mm256_fmadd_ps(load8(i + 8 * j), xv, *aj);
                }
                i += LANES;
            }
            reduce(a)
        }
    }

    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
        f32_row(w, x)
    }

    /// [`super::dots_f32`]: one dispatch for many rows.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn dots_f32(rows: &[f32], x: &[f32], out: &mut [f32]) {
        for (o, r) in out.iter_mut().zip(rows.chunks_exact(x.len())) {
            *o = f32_row(r, x);
        }
    }

    #[inline(always)]
    fn f32_row(w: &[f32], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        // SAFETY: the callers enable AVX2; loads stay within `w` and `x`.
        let sum = unsafe { lane_sums(w.len(), x, w.as_ptr(), |i| _mm256_loadu_ps(w.as_ptr().add(i))) };
        sum + tail(w, x, |v| v)
    }

    /// [`super::dots_f16`]: one dispatch for many rows.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn dots_f16(rows: &[u16], x: &[f32], out: &mut [f32]) {
        for (o, r) in out.iter_mut().zip(rows.chunks_exact(x.len())) {
            *o = dot_f16(r, x);
        }
    }

    /// Rows a weighted sum takes per block (see [`weighted_rows`]).
    const BLOCK_ROWS: usize = 32;

    /// `out += Σ_j weights[j] row_j` with the output held in registers:
    /// blocks of up to 64 columns stay in eight registers while the rows
    /// pass (`load8(j, i)`: row `j`'s columns `i..i + 8`); columns past
    /// the last 8 go through `at(j, i)`. Each element takes the same
    /// fused multiply-add, in order of `j`, as the portable body.
    /// Rows go by in blocks of [`BLOCK_ROWS`]: a row wider than 64 columns
    /// is met once per column block while its block is still in L1, and
    /// the first column block asks for the whole of a later row
    /// ([`crate::prefetch::distance`] bytes on), so memory sees one stream
    /// read front to back rather than parts of every row in turn. `rows` is
    /// row 0's first element (`size` bytes each).
    #[inline(always)]
    unsafe fn weighted_rows<T>(
        out: &mut [f32],
        weights: &[f32],
        rows: *const T,
        load8: impl Fn(usize, usize) -> __m256,
        at: impl Fn(usize, usize) -> f32,
    ) {
        let n = out.len();
        let full = n / 8 * 8;
        let size = std::mem::size_of::<T>();
        let pf = crate::prefetch::distance();
        let mut r0 = 0;
        // SAFETY: every load and store covers 8 columns below `full` of
        // `out` and (through the caller's closures) of each row.
        unsafe {
            while r0 < weights.len() {
                let r1 = (r0 + BLOCK_ROWS).min(weights.len());
                let mut c = 0;
                while c < full {
                    let k = ((full - c) / 8).min(8);
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for (b, a) in acc.iter_mut().enumerate().take(k) {
                        *a = _mm256_loadu_ps(out.as_ptr().add(c + 8 * b));
                    }
                    for (j, &p) in weights.iter().enumerate().take(r1).skip(r0) {
                        if c == 0 {
                            crate::prefetch::ahead_span(rows.wrapping_add(j * n), n * size, pf);
                        }
                        let pv = _mm256_set1_ps(p);
                        for (b, a) in acc.iter_mut().enumerate().take(k) {
                            *a = _mm256_fmadd_ps(pv, load8(j, c + 8 * b), *a);
                        }
                    }
                    for (b, a) in acc.iter().enumerate().take(k) {
                        _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * b), *a);
                    }
                    c += 8 * k;
                }
                r0 = r1;
            }
        }
        for (i, o) in out.iter_mut().enumerate().skip(full) {
            for (j, &p) in weights.iter().enumerate() {
                *o = p.mul_add(at(j, i), *o);
            }
        }
    }

    /// [`super::add_weighted_rows`] with the output in registers.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn add_weighted_rows(out: &mut [f32], weights: &[f32], rows: &[f32]) {
        let n = out.len();
        assert_eq!(rows.len(), weights.len() * n, "rows do not match the weights");
        // SAFETY: AVX2 is enabled; row `j` is `rows[j * n..(j + 1) * n]`.
        unsafe {
            weighted_rows(
                out,
                weights,
                rows.as_ptr(),
                |j, i| _mm256_loadu_ps(rows.as_ptr().add(j * n + i)),
                |j, i| rows[j * n + i],
            )
        }
    }

    /// [`super::add_weighted_rows_f16`]: [`add_weighted_rows`] on rows
    /// widened exactly by F16C.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn add_weighted_rows_f16(out: &mut [f32], weights: &[f32], rows: &[u16]) {
        let n = out.len();
        assert_eq!(rows.len(), weights.len() * n, "rows do not match the weights");
        // SAFETY: AVX2 and F16C are enabled; row `j` is `rows[j * n..(j + 1) * n]`.
        unsafe {
            weighted_rows(
                out,
                weights,
                rows.as_ptr(),
                |j, i| _mm256_cvtph_ps(_mm_loadu_si128(rows.as_ptr().add(j * n + i) as *const __m128i)),
                |j, i| f16_to_f32(rows[j * n + i]),
            )
        }
    }

    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        // SAFETY: as above; a bf16 is the top half of its f32.
        let acc = unsafe {
            lane_sums(w.len(), x, w.as_ptr(), |i| {
                let h = _mm_loadu_si128(w.as_ptr().add(i) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            })
        };
        acc + tail(w, x, bf16_to_f32)
    }

    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len());
        // SAFETY: as above; F16C widens exactly, as `f16_to_f32` does.
        let acc = unsafe {
            lane_sums(w.len(), x, w.as_ptr(), |i| {
                _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i) as *const __m128i))
            })
        };
        acc + tail(w, x, f16_to_f32)
    }

    /// [`lane_sums`] for three activation rows at once: each 8 elements
    /// of the row are widened once and met by all three (twelve
    /// accumulators, the widened elements, one activation load: within
    /// AVX2's sixteen registers); every row's lanes take the one-row loop's
    /// operations in its order.
    #[inline(always)]
    unsafe fn lane_sums3<T>(n: usize, xs: [&[f32]; 3], row: *const T, load8: impl Fn(usize) -> __m256) -> [f32; 3] {
        // SAFETY: forwarded.
        let a = unsafe { lanes3(n, xs, row, load8) };
        // SAFETY: register arithmetic (the callers enable AVX2).
        unsafe { [reduce(a[0]), reduce(a[1]), reduce(a[2])] }
    }

    /// [`lane_sums3`]'s lane sums before their reduction.
    #[inline(always)]
    unsafe fn lanes3<T>(n: usize, xs: [&[f32]; 3], row: *const T, load8: impl Fn(usize) -> __m256) -> [[__m256; 4]; 3] {
        let size = std::mem::size_of::<T>();
        let pf = crate::prefetch::distance();
        let mut a = [[_mm256_setzero_ps(); 4]; 3];
        let mut i = 0;
        // SAFETY: every `xs[t]` and the row behind `load8` hold `n` elements.
        unsafe {
            while i + LANES <= n {
                crate::prefetch::ahead_span(row.wrapping_add(i), LANES * size, pf);
                for j in 0..4 {
                    let w = load8(i + 8 * j);
                    for (x, a) in xs.iter().zip(a.iter_mut()) {
                        let xv = _mm256_loadu_ps(x.as_ptr().add(i + 8 * j));
                        a[j] = _mm256_fmadd_ps(w, xv, a[j]);
                    }
                }
                i += LANES;
            }
            a
        }
    }

    /// [`reduce`] of eight dots at once, from each one's first step
    /// `(a0 + a2) + (a1 + a3)`: lane `i` of the result is dot `i`'s sum,
    /// the same values added in the same pairs as [`reduce`] adds them
    /// (`h = lo + hi`, then `(h0 + h1) + (h2 + h3)`).
    #[inline(always)]
    unsafe fn reduce8(v: [__m256; 8]) -> __m256 {
        // [lo(a) + hi(a) | lo(b) + hi(b)]: two dots' `h` in one register.
        let h = |a: __m256, b: __m256| {
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        };
        // Per 128-bit half, `hadd` gives [a0 + a1, a2 + a3, b0 + b1, b2 + b3].
        let p0 = _mm256_hadd_ps(h(v[0], v[1]), h(v[2], v[3]));
        let p1 = _mm256_hadd_ps(h(v[4], v[5]), h(v[6], v[7]));
        // [d0, d2, d4, d6 | d1, d3, d5, d7], then in order.
        let r = _mm256_hadd_ps(p0, p1);
        _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Attention's scores query-major for the first `xs.len() / 3 * 3`
    /// queries (returned): `out[t * stride + r]` is row `r` (of
    /// `rows.len() / cols`) dotted with query `t`, the one-row dot's bits.
    /// Three queries meet each row ([`lanes3`]); eight rows' dots are
    /// reduced together ([`reduce8`]) and stored as one vector of a
    /// query's row of scores.
    #[inline(always)]
    unsafe fn scores3<T: Copy>(
        rows: &[T],
        cols: usize,
        xs: &[&[f32]],
        (out, stride): (&mut [f32], usize),
        load8: impl Fn(*const T, usize) -> __m256,
        cvt: impl Fn(T) -> f32 + Copy,
    ) -> usize {
        let n = xs.len();
        let nrows = rows.len() / cols.max(1);
        assert!(xs.iter().all(|x| x.len() == cols));
        assert!(
            n == 0 || (n - 1) * stride + nrows <= out.len(),
            "scores out of the output"
        );
        let mut t = 0;
        while t + 3 <= n {
            let x3 = [xs[t], xs[t + 1], xs[t + 2]];
            let mut r0 = 0;
            while r0 < nrows {
                let k = (nrows - r0).min(8);
                // SAFETY: register arithmetic and loads inside each row and
                // query (AVX2 enabled by the callers).
                unsafe {
                    let mut v = [[_mm256_setzero_ps(); 8]; 3];
                    let mut tails = [[0.0f32; 8]; 3];
                    for i in 0..k {
                        let w = &rows[(r0 + i) * cols..(r0 + i + 1) * cols];
                        let a = lanes3(cols, x3, w.as_ptr(), |c| load8(w.as_ptr(), c));
                        for q in 0..3 {
                            let [a0, a1, a2, a3] = a[q];
                            v[q][i] = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
                            tails[q][i] = tail(w, x3[q], cvt);
                        }
                    }
                    for q in 0..3 {
                        let sums = _mm256_add_ps(reduce8(v[q]), _mm256_loadu_ps(tails[q].as_ptr()));
                        let o = &mut out[(t + q) * stride + r0..(t + q) * stride + r0 + k];
                        if k == 8 {
                            _mm256_storeu_ps(o.as_mut_ptr(), sums);
                        } else {
                            let mut all = [0.0f32; 8];
                            _mm256_storeu_ps(all.as_mut_ptr(), sums);
                            o.copy_from_slice(&all[..k]);
                        }
                    }
                }
                r0 += k;
            }
            t += 3;
        }
        t
    }

    /// [`scores3`] over f32 rows.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn scores3_f32(rows: &[f32], cols: usize, xs: &[&[f32]], out: (&mut [f32], usize)) -> usize {
        // SAFETY: AVX2 is enabled; `scores3` reads 8 elements at `i < cols` of a row.
        unsafe {
            let load8 = |w: *const f32, i| _mm256_loadu_ps(w.add(i));
            match cols {
                // The usual head widths as constants: each key's loop unrolled.
                128 => scores3(rows, 128, xs, out, load8, |v| v),
                64 => scores3(rows, 64, xs, out, load8, |v| v),
                _ => scores3(rows, cols, xs, out, load8, |v| v),
            }
        }
    }

    /// [`scores3`] over f16 rows.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn scores3_f16(rows: &[u16], cols: usize, xs: &[&[f32]], out: (&mut [f32], usize)) -> usize {
        // SAFETY: as above; F16C widens exactly.
        unsafe {
            let load8 = |w: *const u16, i| _mm256_cvtph_ps(_mm_loadu_si128(w.add(i) as *const __m128i));
            match cols {
                128 => scores3(rows, 128, xs, out, load8, f16_to_f32),
                64 => scores3(rows, 64, xs, out, load8, f16_to_f32),
                _ => scores3(rows, cols, xs, out, load8, f16_to_f32),
            }
        }
    }

    /// The three-row part of a float tile (`float_tile!`) in one call:
    /// each run of three activation rows meets every weight row in turn
    /// ([`lane_sums3`]), `out[r * n + t]` for weight row `r` and activation
    /// row `t` of `n`, each the one-row dot's bits; returns how many
    /// activation rows it took (a multiple of three). Prefill attention's
    /// scores are such tiles of 128-wide keys, where a call and a dispatch
    /// per key and three queries cost as much as the products.
    #[inline(always)]
    unsafe fn tile3<T: Copy>(
        rows: &[T],
        cols: usize,
        xs: &[&[f32]],
        out: &mut [f32],
        load8: impl Fn(*const T, usize) -> __m256,
        cvt: impl Fn(T) -> f32 + Copy,
    ) -> usize {
        let n = xs.len();
        let nrows = out.len() / n;
        assert!(rows.len() >= nrows * cols && xs.iter().all(|x| x.len() == cols));
        let mut t = 0;
        while t + 3 <= n {
            let x3 = [xs[t], xs[t + 1], xs[t + 2]];
            for r in 0..nrows {
                let w = &rows[r * cols..(r + 1) * cols];
                // SAFETY: `w` and every `x3[k]` hold `cols` elements.
                let acc = unsafe { lane_sums3(cols, x3, w.as_ptr(), |i| load8(w.as_ptr(), i)) };
                for (k, (a, x)) in acc.iter().zip(x3).enumerate() {
                    out[r * n + t + k] = a + tail(w, x, cvt);
                }
            }
            t += 3;
        }
        t
    }

    /// [`tile3`] of f32 rows.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn tile3_f32(rows: &[f32], cols: usize, xs: &[&[f32]], out: &mut [f32]) -> usize {
        // SAFETY: AVX2 is enabled; `tile3` reads 8 elements at `i < cols` of a row.
        unsafe { tile3(rows, cols, xs, out, |w, i| _mm256_loadu_ps(w.add(i)), |v| v) }
    }

    /// [`tile3`] of bf16 rows.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn tile3_bf16(rows: &[u16], cols: usize, xs: &[&[f32]], out: &mut [f32]) -> usize {
        // SAFETY: as above; a bf16 is the top half of its f32.
        unsafe {
            tile3(
                rows,
                cols,
                xs,
                out,
                |w, i| {
                    let h = _mm_loadu_si128(w.add(i) as *const __m128i);
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                },
                bf16_to_f32,
            )
        }
    }

    /// [`tile3`] of f16 rows.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(super) fn tile3_f16(rows: &[u16], cols: usize, xs: &[&[f32]], out: &mut [f32]) -> usize {
        // SAFETY: as above; F16C widens exactly.
        unsafe {
            tile3(
                rows,
                cols,
                xs,
                out,
                |w, i| _mm256_cvtph_ps(_mm_loadu_si128(w.add(i) as *const __m128i)),
                f16_to_f32,
            )
        }
    }
}

/// Whether `isa` takes the explicit AVX2 + F16C + FMA kernels of [`float_x86`]
/// here (both x86 sets include them; the CPU must run `isa`).
#[cfg(target_arch = "x86_64")]
#[inline]
fn float_x86_runs(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && isa.runs()
}

/// Whether `isa` takes attention's explicit AVX-512 kernels
/// ([`attention_x512`]) here.
#[cfg(target_arch = "x86_64")]
#[inline]
fn attention_x512_runs(isa: Isa) -> bool {
    isa == Isa::Avx512Vnni && isa.runs()
}

/// Defines `$name(args)` on [`Isa::active`] and `$name_on(isa, args)`:
/// the explicit AVX2 lanes of [`float_x86`] on x86-64 CPUs that have them,
/// else the portable body.
macro_rules! float_dot {
    ($(#[$doc:meta])* $name:ident, $name_on:ident, $body:ident, $t:ty) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(w: &[$t], x: &[f32]) -> f32 {
            $name_on(Isa::active(), w, x)
        }

        #[doc = concat!("[`", stringify!($name), "`] on a chosen instruction set (the portable build when this CPU lacks it).")]
        #[inline]
        pub fn $name_on(isa: Isa, w: &[$t], x: &[f32]) -> f32 {
            #[cfg(target_arch = "x86_64")]
            if float_x86_runs(isa) {
                // SAFETY: the CPU runs AVX2, F16C and FMA (part of both sets).
                return unsafe { float_x86::$name(w, x) };
            }
            let _ = isa;
            $body(w, x)
        }
    };
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
                #[target_feature(enable = "avx2,f16c,fma")]
                fn avx2($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,f16c,fma,avx512f,avx512bw,avx512vl")]
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

// After the macros, which it uses.
mod delta_rule;
pub use delta_rule::{delta_rule, delta_rule_on, delta_rule_ref, DeltaInputs};
mod exp;
pub use exp::exp;

float_dot!(
    /// `Σ w[i] x[i]` for an f32 weight row.
    dot_f32, dot_f32_on, dot_f32_body, f32
);
/// `out[j] = dot_f32(rows[j], x)` for the `out.len()` rows of `rows`
/// (row-major, `x.len()` wide): attention's scores against a head's cached
/// keys. The bits of [`dot_f32`] per row, with one dispatch for all.
pub fn dots_f32(rows: &[f32], x: &[f32], out: &mut [f32]) {
    dots_f32_on(Isa::active(), rows, x, out)
}

/// [`dots_f32`] on a chosen instruction set (the portable build when this
/// CPU lacks it).
pub fn dots_f32_on(isa: Isa, rows: &[f32], x: &[f32], out: &mut [f32]) {
    assert_eq!(rows.len(), out.len() * x.len(), "rows do not match the outputs");
    #[cfg(target_arch = "x86_64")]
    if attention_x512_runs(isa) {
        // SAFETY: the CPU runs AVX-512 (F, BW, VL), F16C and FMA.
        return unsafe { attention_x512::dots_f32(rows, x, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if float_x86_runs(isa) {
        // SAFETY: the CPU runs AVX2, F16C and FMA (part of both sets).
        return unsafe { float_x86::dots_f32(rows, x, out) };
    }
    let _ = isa;
    for (o, r) in out.iter_mut().zip(rows.chunks_exact(x.len())) {
        *o = dot_f32_body(r, x);
    }
}

/// `out += Σ_j weights[j] rows[j]` in order of `j` (`rows`: row-major,
/// `out.len()` wide): attention's weighted sum of a head's cached values.
/// Each element sums in the same order on every build.
pub fn add_weighted_rows(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    add_weighted_rows_on(Isa::active(), out, weights, rows)
}

/// [`add_weighted_rows`] on a chosen instruction set (the portable build
/// when this CPU lacks it).
pub fn add_weighted_rows_on(isa: Isa, out: &mut [f32], weights: &[f32], rows: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if attention_x512_runs(isa) {
        // SAFETY: the CPU runs AVX-512 (F, BW, VL), F16C and FMA.
        return unsafe { attention_x512::add_weighted_rows(out, weights, rows) };
    }
    #[cfg(target_arch = "x86_64")]
    if float_x86_runs(isa) {
        // SAFETY: the CPU runs AVX2, F16C and FMA (part of both sets).
        return unsafe { float_x86::add_weighted_rows(out, weights, rows) };
    }
    let _ = isa;
    add_weighted_with(out, weights, rows, |v| v)
}

/// The portable weighted row sum over rows converted element-wise by `cvt`.
#[inline(always)]
fn add_weighted_with<T: Copy>(out: &mut [f32], weights: &[f32], rows: &[T], cvt: impl Fn(T) -> f32) {
    assert_eq!(rows.len(), weights.len() * out.len(), "rows do not match the weights");
    for (&p, r) in weights.iter().zip(rows.chunks_exact(out.len())) {
        for (o, &v) in out.iter_mut().zip(r) {
            *o = p.mul_add(cvt(v), *o);
        }
    }
}

/// `outs[h][i] = Σ_j weights[h][j] · rows[j * stride + i]` for every
/// `i < outs[h].len()` (the same for every head, at most `stride`), in
/// order of `j`: several heads' weighted sums of the same cached rows
/// (query heads sharing a KV head; MLA's heads over the latents, whose
/// sums need only the latent columns) in one pass over them. Each output
/// gets the bits [`add_weighted_rows`] gives it from zero.
///
/// # Panics
/// If the heads' weights or outputs differ in length, an output is wider
/// than `stride`, or the rows hold fewer than the weights name.
pub fn weighted_rows_many(rows: &[f32], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
    weighted_rows_many_on(Isa::active(), rows, stride, weights, outs)
}

/// [`weighted_rows_many`] on a chosen instruction set.
pub fn weighted_rows_many_on(isa: Isa, rows: &[f32], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
    many_on(isa, rows, stride, weights, outs, true)
}

/// [`weighted_rows_many`] continuing the sums already in `outs`
/// (`outs[h][i] += Σ_j …`, in order of `j`): each output gets the bits
/// [`add_weighted_rows`] gives it from its values, so a sum over many
/// rows may run in blocks of rows (zeroed outputs, then each block in
/// turn) with the bits of one pass.
///
/// # Panics
/// As [`weighted_rows_many`].
pub fn add_weighted_rows_many(rows: &[f32], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
    add_weighted_rows_many_on(Isa::active(), rows, stride, weights, outs)
}

/// [`add_weighted_rows_many`] on a chosen instruction set.
pub fn add_weighted_rows_many_on(isa: Isa, rows: &[f32], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
    many_on(isa, rows, stride, weights, outs, false)
}

/// [`weighted_rows_many_on`] (`zero`) or [`add_weighted_rows_many_on`].
fn many_on(isa: Isa, rows: &[f32], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]], zero: bool) {
    check_many(rows.len(), stride, weights, outs);
    #[cfg(target_arch = "x86_64")]
    if attention_x512_runs(isa) {
        for (w, o) in weights.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: the CPU runs AVX-512 (F, BW, VL), F16C and FMA; the
            // shapes were checked.
            unsafe { attention_x512::weighted_rows_many(rows, stride, w, o, zero) };
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if float_x86_runs(isa) && outs.len() > 1 {
        for (w, o) in weights.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: the CPU runs AVX2, F16C and FMA; the shapes were checked.
            unsafe { weighted_heads_x86::weighted_rows_many(rows, stride, w, o, zero) };
        }
        return;
    }
    let keys = weights.first().map_or(0, |w| w.len());
    one_head_at_a_time(weights, outs, stride, zero, |w, sum| {
        add_weighted_rows_on(isa, sum, w, &rows[..keys * stride])
    });
}

/// [`weighted_rows_many`] over f16 rows (an f16 KV cache).
pub fn weighted_rows_many_f16(rows: &[u16], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
    weighted_rows_many_f16_on(Isa::active(), rows, stride, weights, outs)
}

/// [`weighted_rows_many_f16`] on a chosen instruction set.
pub fn weighted_rows_many_f16_on(isa: Isa, rows: &[u16], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
    many_f16_on(isa, rows, stride, weights, outs, true)
}

/// [`add_weighted_rows_many`] over f16 rows (an f16 KV cache).
pub fn add_weighted_rows_many_f16(rows: &[u16], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]]) {
    add_weighted_rows_many_f16_on(Isa::active(), rows, stride, weights, outs)
}

/// [`add_weighted_rows_many_f16`] on a chosen instruction set.
pub fn add_weighted_rows_many_f16_on(
    isa: Isa,
    rows: &[u16],
    stride: usize,
    weights: &[&[f32]],
    outs: &mut [&mut [f32]],
) {
    many_f16_on(isa, rows, stride, weights, outs, false)
}

/// [`weighted_rows_many_f16_on`] (`zero`) or [`add_weighted_rows_many_f16_on`].
fn many_f16_on(isa: Isa, rows: &[u16], stride: usize, weights: &[&[f32]], outs: &mut [&mut [f32]], zero: bool) {
    check_many(rows.len(), stride, weights, outs);
    #[cfg(target_arch = "x86_64")]
    if attention_x512_runs(isa) {
        for (w, o) in weights.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: as in `many_on`.
            unsafe { attention_x512::weighted_rows_many_f16(rows, stride, w, o, zero) };
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if float_x86_runs(isa) && outs.len() > 1 {
        for (w, o) in weights.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: the CPU runs AVX2, F16C and FMA; the shapes were checked.
            unsafe { weighted_heads_x86::weighted_rows_many_f16(rows, stride, w, o, zero) };
        }
        return;
    }
    let keys = weights.first().map_or(0, |w| w.len());
    one_head_at_a_time(weights, outs, stride, zero, |w, sum| {
        add_weighted_rows_f16_on(isa, sum, w, &rows[..keys * stride])
    });
}

/// The shapes [`weighted_rows_many`] takes.
fn check_many(rows: usize, stride: usize, weights: &[&[f32]], outs: &[&mut [f32]]) {
    assert_eq!(weights.len(), outs.len(), "one output per head");
    let keys = weights.first().map_or(0, |w| w.len());
    let cols = outs.first().map_or(0, |o| o.len());
    assert!(
        weights.iter().all(|w| w.len() == keys),
        "every head weighs the same rows"
    );
    assert!(outs.iter().all(|o| o.len() == cols), "every output has the same width");
    assert!(cols <= stride && keys * stride <= rows, "rows do not match the weights");
}

/// [`weighted_rows_many`] (`zero`) or [`add_weighted_rows_many`] one head
/// at a time through the one-head sum (`sum(weights, row-wide output)`,
/// zeroed first when `zero`): into each output where it is as wide as the
/// rows, else into a buffer that starts with the output's columns and
/// whose first columns are kept (each column's sum is its own).
fn one_head_at_a_time(
    weights: &[&[f32]],
    outs: &mut [&mut [f32]],
    stride: usize,
    zero: bool,
    sum: impl Fn(&[f32], &mut [f32]),
) {
    let mut full = Vec::new();
    for (w, o) in weights.iter().zip(outs.iter_mut()) {
        if zero {
            o.fill(0.0);
        }
        if o.len() == stride {
            sum(w, o);
            continue;
        }
        full.clear();
        full.resize(stride, 0.0);
        full[..o.len()].copy_from_slice(o);
        sum(w, &mut full);
        o.copy_from_slice(&full[..o.len()]);
    }
}

/// `out[j] = dot_f16(rows[j], x)`: [`dots_f32`] over an f16 KV cache's
/// keys, with the bits of [`dot_f16`] per row.
pub fn dots_f16(rows: &[u16], x: &[f32], out: &mut [f32]) {
    dots_f16_on(Isa::active(), rows, x, out)
}

/// [`dots_f16`] on a chosen instruction set (the portable build when this
/// CPU lacks it).
pub fn dots_f16_on(isa: Isa, rows: &[u16], x: &[f32], out: &mut [f32]) {
    assert_eq!(rows.len(), out.len() * x.len(), "rows do not match the outputs");
    #[cfg(target_arch = "x86_64")]
    if attention_x512_runs(isa) {
        // SAFETY: the CPU runs AVX-512 (F, BW, VL), F16C and FMA.
        return unsafe { attention_x512::dots_f16(rows, x, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if float_x86_runs(isa) {
        // SAFETY: the CPU runs AVX2, F16C and FMA (part of both sets).
        return unsafe { float_x86::dots_f16(rows, x, out) };
    }
    let _ = isa;
    for (o, r) in out.iter_mut().zip(rows.chunks_exact(x.len())) {
        *o = dot_f16_body(r, x);
    }
}

/// [`add_weighted_rows`] over f16 rows (an f16 KV cache's values): each
/// element widened exactly, then multiplied and added in order of `j`.
pub fn add_weighted_rows_f16(out: &mut [f32], weights: &[f32], rows: &[u16]) {
    add_weighted_rows_f16_on(Isa::active(), out, weights, rows)
}

/// [`add_weighted_rows_f16`] on a chosen instruction set (the portable
/// build when this CPU lacks it).
pub fn add_weighted_rows_f16_on(isa: Isa, out: &mut [f32], weights: &[f32], rows: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if attention_x512_runs(isa) {
        // SAFETY: the CPU runs AVX-512 (F, BW, VL), F16C and FMA.
        return unsafe { attention_x512::add_weighted_rows_f16(out, weights, rows) };
    }
    #[cfg(target_arch = "x86_64")]
    if float_x86_runs(isa) {
        // SAFETY: the CPU runs AVX2, F16C and FMA (part of both sets).
        return unsafe { float_x86::add_weighted_rows_f16(out, weights, rows) };
    }
    let _ = isa;
    add_weighted_with(out, weights, rows, f16_to_f32)
}

float_dot!(
    /// `Σ w[i] x[i]` for a bf16 weight row, accumulated in f32.
    dot_bf16, dot_bf16_on, dot_bf16_body, u16
);

/// Defines `$name(w, xs)` (on [`Isa::active`]) and `$name_on(isa, w, xs)`:
/// one float row against three activation rows, each result the bits of
/// the one-row `$one_on` (prefill's products: the row is widened once
/// for three rows on AVX2 / AVX-512 CPUs; elsewhere three one-row dots).
macro_rules! float_dot3 {
    ($(#[$doc:meta])* $name:ident, $name_on:ident, $tile3:ident, $one_on:ident, $t:ty) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(w: &[$t], xs: [&[f32]; 3]) -> [f32; 3] {
            $name_on(Isa::active(), w, xs)
        }

        #[doc = concat!("[`", stringify!($name), "`] on a chosen instruction set.")]
        #[inline]
        pub fn $name_on(isa: Isa, w: &[$t], xs: [&[f32]; 3]) -> [f32; 3] {
            #[cfg(target_arch = "x86_64")]
            if float_x86_runs(isa) {
                // A tile of one row: the AVX2 three-row loop.
                let mut out = [0.0f32; 3];
                // SAFETY: the CPU runs AVX2, F16C and FMA (part of both sets).
                unsafe { float_x86::$tile3(w, w.len(), &xs, &mut out) };
                return out;
            }
            xs.map(|x| $one_on(isa, w, x))
        }
    };
}

float_dot3!(
    /// [`dot_f32`] of one row with three activation rows.
    dot3_f32, dot3_f32_on, tile3_f32, dot_f32_on, f32
);
float_dot3!(
    /// [`dot_bf16`] of one row with three activation rows.
    dot3_bf16, dot3_bf16_on, tile3_bf16, dot_bf16_on, u16
);
float_dot3!(
    /// [`dot_f16`] of one row with three activation rows.
    dot3_f16, dot3_f16_on, tile3_f16, dot_f16_on, u16
);
float_dot!(
    /// `Σ w[i] x[i]` for an f16 weight row, accumulated in f32.
    dot_f16, dot_f16_on, dot_f16_body, u16
);

/// Defines `$name(rows, cols, xs, out)` (on [`Isa::active`]) and
/// `$name_on(isa, …)`: a tile of float weight rows (row-major, `cols`
/// wide) against many activation rows, `out[r * xs.len() + t]` the bits of
/// the one-row `$one_on(rows[r], xs[t])` (prefill's products). AVX-512
/// CPUs run the register-blocked [`float_tile_x512`] from four activation
/// rows on; fewer rows, and AVX2 CPUs, take three activation rows at a
/// time against every weight row (AVX2: `float_x86::$tile3`, the whole
/// loop in one call; elsewhere `$three_on`), then one-row dots.
macro_rules! float_tile {
    ($(#[$doc:meta])* $name:ident, $name_on:ident, $x512:ident, $ahead:expr, $tile3:ident, $three_on:ident, $one_on:ident, $t:ty) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(rows: &[$t], cols: usize, xs: &[&[f32]], out: &mut [f32]) {
            $name_on(Isa::active(), rows, cols, xs, out)
        }

        #[doc = concat!("[`", stringify!($name), "`] on a chosen instruction set.")]
        pub fn $name_on(isa: Isa, rows: &[$t], cols: usize, xs: &[&[f32]], out: &mut [f32]) {
            let n = xs.len();
            assert!(xs.iter().all(|x| x.len() == cols), "activation rows are not {cols} wide");
            assert_eq!(rows.len() * n, out.len() * cols, "rows do not match the outputs");
            if n == 0 {
                return;
            }
            // Under a register block's four activation rows the product
            // is a memory stream (decode's experts meet one row), which
            // the one-row dots' software prefetch serves better.
            #[cfg(target_arch = "x86_64")]
            if attention_x512_runs(isa) && n >= 4 {
                // SAFETY: the CPU runs AVX-512 (F, BW, VL), F16C and FMA.
                return unsafe { float_tile_x512::$x512(rows, cols, xs, out, $ahead) };
            }
            // Three activation rows (in L1) meet every row of the tile in turn.
            let nrows = out.len() / n;
            let row = |r: usize| &rows[r * cols..(r + 1) * cols];
            let mut t = 0;
            #[cfg(target_arch = "x86_64")]
            if float_x86_runs(isa) {
                // SAFETY: the CPU runs AVX2, F16C and FMA.
                t = unsafe { float_x86::$tile3(rows, cols, xs, out) };
            }
            while t + 3 <= n {
                for r in 0..nrows {
                    let v = $three_on(isa, row(r), [xs[t], xs[t + 1], xs[t + 2]]);
                    out[r * n + t..r * n + t + 3].copy_from_slice(&v);
                }
                t += 3;
            }
            for (t, x) in xs.iter().enumerate().skip(t) {
                for r in 0..nrows {
                    out[r * n + t] = $one_on(isa, row(r), x);
                }
            }
        }
    };
}

float_tile!(
    /// [`dot_f32`] of a tile of rows with many activation rows.
    dots_tile_f32, dots_tile_f32_on, dots_tile_f32, true, tile3_f32, dot3_f32_on, dot_f32_on, f32
);
float_tile!(
    /// [`dot_bf16`] of a tile of rows with many activation rows.
    dots_tile_bf16, dots_tile_bf16_on, dots_tile_bf16, true, tile3_bf16, dot3_bf16_on, dot_bf16_on, u16
);
float_tile!(
    /// [`dot_f16`] of a tile of rows with many activation rows.
    dots_tile_f16, dots_tile_f16_on, dots_tile_f16, true, tile3_f16, dot3_f16_on, dot_f16_on, u16
);
float_tile!(
    /// [`dots_tile_f32`] for attention's scores against cached keys: the
    /// same bits, without asking for the bytes after the keys (a weight
    /// matrix's next tile is read next; a KV cache's neighbour is not).
    scores_tile_f32, scores_tile_f32_on, dots_tile_f32, false, tile3_f32, dot3_f32_on, dot_f32_on, f32
);
float_tile!(
    /// [`dots_tile_f16`] for attention's scores against an f16 cache's
    /// keys, as [`scores_tile_f32`].
    scores_tile_f16, scores_tile_f16_on, dots_tile_f16, false, tile3_f16, dot3_f16_on, dot_f16_on, u16
);

thread_local! {
    /// The key-major scores [`scores_by_query_f32`] turns query-major
    /// where the key-major tile runs (taken while in use).
    static KEY_MAJOR: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Defines `$name(rows, cols, xs, out, stride)` (on [`Isa::active`]) and
/// `$name_on(isa, …)`: attention's scores of a block of cached rows
/// (`cols` wide) against many queries, query-major: `out[t * stride + r]`
/// the bits of the one-row `$one_on(rows[r], xs[t])`, so each query's
/// scores lie in one row for its softmax. AVX2 CPUs run the whole block
/// in `float_x86::$scores3` (three queries a row, eight rows' dots reduced
/// together) and the one or two queries past the last three with
/// `$dots_on` (one call a query, as decode scores its keys); elsewhere the
/// key-major score tile `$tile_on`, then each query's row.
macro_rules! scores_by_query {
    ($(#[$doc:meta])* $name:ident, $name_on:ident, $tile_on:ident, $scores3:ident, $dots_on:ident, $one_on:ident, $t:ty) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(rows: &[$t], cols: usize, xs: &[&[f32]], out: &mut [f32], stride: usize) {
            $name_on(Isa::active(), rows, cols, xs, out, stride)
        }

        #[doc = concat!("[`", stringify!($name), "`] on a chosen instruction set.")]
        pub fn $name_on(isa: Isa, rows: &[$t], cols: usize, xs: &[&[f32]], out: &mut [f32], stride: usize) {
            assert!(cols > 0 && rows.len() % cols == 0, "rows are not {cols} wide");
            assert!(xs.iter().all(|x| x.len() == cols), "queries are not {cols} wide");
            let (n, nrows) = (xs.len(), rows.len() / cols);
            assert!(
                nrows <= stride && (n == 0 || (n - 1) * stride + nrows <= out.len()),
                "scores out of the output"
            );
            if n == 0 || nrows == 0 {
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if float_x86_runs(isa) && !attention_x512_runs(isa) {
                // SAFETY: the CPU runs AVX2, F16C and FMA; shapes checked.
                let t = unsafe { float_x86::$scores3(rows, cols, xs, (&mut *out, stride)) };
                for (t, x) in xs.iter().enumerate().skip(t) {
                    $dots_on(isa, rows, x, &mut out[t * stride..t * stride + nrows]);
                }
                return;
            }
            let mut km = KEY_MAJOR.take();
            km.clear();
            km.resize(nrows * n, 0.0);
            $tile_on(isa, rows, cols, xs, &mut km);
            for (r, s) in km.chunks_exact(n).enumerate() {
                for (t, &v) in s.iter().enumerate() {
                    out[t * stride + r] = v;
                }
            }
            KEY_MAJOR.set(km);
        }
    };
}

scores_by_query!(
    /// [`scores_tile_f32`] query-major, for attention's softmax.
    scores_by_query_f32, scores_by_query_f32_on, scores_tile_f32_on, scores3_f32, dots_f32_on, dot_f32_on, f32
);
scores_by_query!(
    /// [`scores_tile_f16`] query-major, over an f16 cache's keys.
    scores_by_query_f16, scores_by_query_f16_on, scores_tile_f16_on, scores3_f16, dots_f16_on, dot_f16_on, u16
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
    /// [`dot_int8`] as the compiler builds its portable body.
    dot_int8_compiled, dot_int8_compiled_on, dot_int8_portable, (q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32
);
multiversion!(
    /// [`dot_int4`] as the compiler builds its portable body.
    dot_int4_compiled, dot_int4_compiled_on, dot_int4_portable, (packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32
);

/// Which explicit x86 INT8 / INT4 body ([`int_x86`]) runs products of
/// `group` on `isa`: groups of whole 16-column chunks (no scalar tail), on
/// an AVX-512 or AVX2 CPU.
#[cfg(target_arch = "x86_64")]
fn int_x86_body(isa: Isa, group: usize) -> Option<Isa> {
    let whole = group > 0 && group.is_multiple_of(QLANES);
    (whole && matches!(isa, Isa::Avx512Vnni | Isa::Avx2) && isa.runs()).then_some(isa)
}

/// Fast INT8 dot product, the same value as [`dot_int8_ref`] up to
/// rounding: per group, `QLANES` lane sums of `q x` (columns past the
/// last full `QLANES` chunk of the group go to a scalar tail), each lane
/// sum scaled into its own running total (no per-group horizontal sum),
/// then one fixed-order reduction ([`dot_int8_portable`] is the
/// definition; AVX-512 and AVX2 CPUs run its operations from `int_x86`).
#[inline]
pub fn dot_int8(q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    dot_int8_on(Isa::active(), q, scales, group, x)
}

/// [`dot_int8`] on a chosen instruction set.
pub fn dot_int8_on(isa: Isa, q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match int_x86_body(isa, group) {
        // SAFETY: the CPU runs AVX-512 (F, BW, VL), AVX2, F16C and FMA.
        Some(Isa::Avx512Vnni) => return finish_q(unsafe { int_x86::dot_int8_x512(q, scales, group, x) }, 0.0),
        // SAFETY: the CPU runs AVX2, F16C and FMA.
        Some(_) => return finish_q(unsafe { int_x86::dot_int8_avx2(q, scales, group, x) }, 0.0),
        None => {}
    }
    dot_int8_compiled_on(isa, q, scales, group, x)
}

/// Fast INT4 dot product: as [`dot_int8`], unpacking `QLANES` nibbles
/// (`QLANES / 2` bytes) at a time.
#[inline]
pub fn dot_int4(packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    dot_int4_on(Isa::active(), packed, scales, group, x)
}

/// [`dot_int4`] on a chosen instruction set.
pub fn dot_int4_on(isa: Isa, packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match int_x86_body(isa, group) {
        // SAFETY: the CPU runs AVX-512 (F, BW, VL), AVX2, F16C and FMA.
        Some(Isa::Avx512Vnni) => return finish_q(unsafe { int_x86::dot_int4_x512(packed, scales, group, x) }, 0.0),
        // SAFETY: the CPU runs AVX2, F16C and FMA.
        Some(_) => return finish_q(unsafe { int_x86::dot_int4_avx2(packed, scales, group, x) }, 0.0),
        None => {}
    }
    dot_int4_compiled_on(isa, packed, scales, group, x)
}

/// [`dot_int8`] of a tile of rows (`q: rows × cols`, `scales: rows × cols /
/// group`) with many activation rows: `out[r * xs.len() + t]` the bits of
/// `dot_int8(row r, xs[t])` (prefill's products). AVX-512 and AVX2 CPUs
/// run register-blocked tiles (`int_x86`: two rows by four activation
/// rows, or one by two, each weight chunk widened once for the block's
/// activation rows); elsewhere one-row dots.
#[inline]
pub fn dots_tile_int8(q: &[i8], scales: &[f32], group: usize, cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    dots_tile_int8_on(Isa::active(), (q, scales, group), cols, xs, out)
}

/// [`dots_tile_int8`] on a chosen instruction set.
pub fn dots_tile_int8_on(
    isa: Isa,
    (q, scales, group): (&[i8], &[f32], usize),
    cols: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    let n = check_int_tile(cols, xs, out, (q.len(), scales.len(), group));
    if n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let rows = (q, scales, group);
        let finish = |l| finish_q(l, 0.0);
        match int_x86_body(isa, group) {
            // SAFETY: the CPU runs AVX-512 (F, BW, VL), AVX2, F16C and FMA;
            // the sizes were checked.
            Some(Isa::Avx512Vnni) => return unsafe { int_x86::dots_tile_int8_x512(rows, cols, xs, out, finish) },
            // SAFETY: the CPU runs AVX2, F16C and FMA; the sizes were checked.
            Some(_) => return unsafe { int_x86::dots_tile_int8_avx2(rows, cols, xs, out, finish) },
            None => {}
        }
    }
    let gpr = cols / group;
    for (r, o) in out.chunks_exact_mut(n).enumerate() {
        let (qr, sr) = (&q[r * cols..(r + 1) * cols], &scales[r * gpr..(r + 1) * gpr]);
        for (o, x) in o.iter_mut().zip(xs) {
            *o = dot_int8_on(isa, qr, sr, group, x);
        }
    }
}

/// [`dot_int4`] of a tile of rows (`packed: rows × cols / 2` bytes), as
/// [`dots_tile_int8`].
#[inline]
pub fn dots_tile_int4(packed: &[u8], scales: &[f32], group: usize, cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    dots_tile_int4_on(Isa::active(), (packed, scales, group), cols, xs, out)
}

/// [`dots_tile_int4`] on a chosen instruction set.
pub fn dots_tile_int4_on(
    isa: Isa,
    (packed, scales, group): (&[u8], &[f32], usize),
    cols: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    let n = check_int_tile(cols, xs, out, (2 * packed.len(), scales.len(), group));
    if n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let rows = (packed, scales, group);
        let finish = |l| finish_q(l, 0.0);
        match int_x86_body(isa, group) {
            // SAFETY: as in `dots_tile_int8_on`.
            Some(Isa::Avx512Vnni) => return unsafe { int_x86::dots_tile_int4_x512(rows, cols, xs, out, finish) },
            // SAFETY: as in `dots_tile_int8_on`.
            Some(_) => return unsafe { int_x86::dots_tile_int4_avx2(rows, cols, xs, out, finish) },
            None => {}
        }
    }
    let gpr = cols / group;
    for (r, o) in out.chunks_exact_mut(n).enumerate() {
        let (pr, sr) = (
            &packed[r * cols / 2..(r + 1) * cols / 2],
            &scales[r * gpr..(r + 1) * gpr],
        );
        for (o, x) in o.iter_mut().zip(xs) {
            *o = dot_int4_on(isa, pr, sr, group, x);
        }
    }
}

/// Checks a tile's sizes (`values` elements, `scales` group scales of
/// `group` columns) and returns its number of activation rows.
///
/// # Panics
/// If the shapes do not match.
fn check_int_tile(cols: usize, xs: &[&[f32]], out: &[f32], (values, scales, group): (usize, usize, usize)) -> usize {
    let n = xs.len();
    assert!(
        xs.iter().all(|x| x.len() == cols),
        "activation rows are not {cols} wide"
    );
    assert!(
        group > 0 && cols.is_multiple_of(group),
        "group {group} does not divide {cols} columns"
    );
    let rows = out.len() / n.max(1);
    assert!(
        out.len() == rows * n && values == rows * cols && scales == rows * (cols / group),
        "rows do not match the outputs"
    );
    n
}

/// The end of every INT8 / INT4 product: the lane totals summed in index
/// order, then the scalar tails' total.
#[inline(always)]
fn finish_q(total: [f32; QLANES], tail_total: f32) -> f32 {
    reduce_q(total) + tail_total
}

/// The body of [`dot_int8`], for whatever target features the caller has.
#[inline(always)]
pub(crate) fn dot_int8_portable(q: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(q.len(), x.len());
    debug_assert_eq!(q.len(), scales.len() * group);
    let mut total = [0.0f32; QLANES];
    let mut tail_total = 0.0f32;
    let pf = crate::prefetch::distance();
    for ((qg, xg), &scale) in q.chunks_exact(group).zip(x.chunks_exact(group)).zip(scales) {
        crate::prefetch::ahead_span(qg.as_ptr(), qg.len(), pf);
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
    finish_q(total, tail_total)
}

/// The body of [`dot_int4`], for whatever target features the caller has.
#[inline(always)]
pub(crate) fn dot_int4_portable(packed: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(packed.len() * 2, x.len());
    debug_assert_eq!(x.len(), scales.len() * group);
    let mut total = [0.0f32; QLANES];
    let mut tail_total = 0.0f32;
    let pf = crate::prefetch::distance();
    for ((pg, xg), &scale) in packed.chunks_exact(group / 2).zip(x.chunks_exact(group)).zip(scales) {
        crate::prefetch::ahead_span(pg.as_ptr(), pg.len(), pf);
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
    finish_q(total, tail_total)
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

multiversion!(
    /// Numerically stable softmax in place, compiled for the active
    /// instruction set (the exponentials a vector at a time; the sum in
    /// index order on every path, so the same bits).
    softmax, softmax_on, softmax_portable, (x: &mut [f32]) -> ()
);

#[inline(always)]
fn softmax_portable(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // The exponentials in one loop (it vectorizes), then their sum in
    // order.
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    let sum = x.iter().fold(0.0f32, |s, v| s + v);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `g[i] = f(g[i], u[i])` for every pair (an FFN's gating: `act(gate) *
/// up`), the loop compiled for the active instruction set so that an
/// elementwise `f` of IEEE operations, such as [`silu`]'s, runs a vector
/// of pairs at a time. Each lane computes what `f` computes, so the bits
/// are `f`'s on every path.
///
/// # Panics
/// If the slices differ in length.
pub fn zip_apply<F: Fn(f32, f32) -> f32 + Copy>(g: &mut [f32], u: &[f32], f: F) {
    zip_apply_on(Isa::active(), g, u, f)
}

/// [`zip_apply`] compiled for `isa` (the portable build when this CPU lacks
/// it).
pub fn zip_apply_on<F: Fn(f32, f32) -> f32 + Copy>(isa: Isa, g: &mut [f32], u: &[f32], f: F) {
    assert_eq!(g.len(), u.len(), "one up value per gate value");
    #[inline(always)]
    fn body<F: Fn(f32, f32) -> f32>(g: &mut [f32], u: &[f32], f: F) {
        for (gv, &uv) in g.iter_mut().zip(u) {
            *gv = f(*gv, uv);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,f16c,fma")]
        fn avx2<F: Fn(f32, f32) -> f32>(g: &mut [f32], u: &[f32], f: F) {
            body(g, u, f)
        }
        #[target_feature(enable = "avx2,f16c,fma,avx512f,avx512bw,avx512vl")]
        fn avx512<F: Fn(f32, f32) -> f32>(g: &mut [f32], u: &[f32], f: F) {
            body(g, u, f)
        }
        if isa.runs() {
            match isa {
                // SAFETY: the CPU runs AVX-512 (checked above).
                Isa::Avx512Vnni => return unsafe { avx512(g, u, f) },
                // SAFETY: the CPU runs AVX2 (checked above).
                Isa::Avx2 => return unsafe { avx2(g, u, f) },
                _ => {}
            }
        }
    }
    let _ = isa;
    body(g, u, f)
}

/// SiLU: `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// Logistic sigmoid.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
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

    /// INT8 / INT4 tiles and one-row dots on every instruction set give the
    /// portable body's bits (`Isa::Scalar`), for groups of whole 16-column
    /// chunks (the AVX-512 bodies: 16, 32, 48 with INT4's half-register
    /// step, 64, a whole row) and others (the compiled body's tails), at
    /// every edge of the tile's two-row by four-activation-row blocks.
    #[test]
    fn int_tiles_and_dots_give_the_portable_bits() {
        for (cols, group) in [
            (64, 16),
            (96, 32),
            (96, 48),
            (256, 64),
            (128, 128),
            (60, 6),
            (30, 30),
            (64, 32),
        ] {
            for (rows, n) in [(1, 1), (2, 4), (3, 5), (5, 9), (4, 3), (7, 2)] {
                let gpr = cols / group;
                let mut state = (cols * 31 + group * 7 + rows * 5 + n) as u64;
                let mut next = move || {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 33) as u32
                };
                let q: Vec<i8> = (0..rows * cols).map(|_| (next() % 255) as i8).collect();
                let packed: Vec<u8> = (0..rows * cols / 2).map(|_| next() as u8).collect();
                let scales: Vec<f32> = (0..rows * gpr).map(|_| (next() % 1000) as f32 / 7000.0).collect();
                let xs: Vec<Vec<f32>> = (0..n)
                    .map(|t| {
                        (0..cols)
                            .map(|_| ((next() % 2001) as f32 / 1000.0 - 1.0) * 10f32.powi(t as i32 % 3 - 1))
                            .collect()
                    })
                    .collect();
                let xs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
                let mut want8 = vec![0u32; rows * n];
                let mut want4 = vec![0u32; rows * n];
                for r in 0..rows {
                    let sr = &scales[r * gpr..(r + 1) * gpr];
                    for (t, x) in xs.iter().enumerate() {
                        let q8 = &q[r * cols..(r + 1) * cols];
                        want8[r * n + t] = dot_int8_on(Isa::Scalar, q8, sr, group, x).to_bits();
                        let p4 = &packed[r * cols / 2..(r + 1) * cols / 2];
                        want4[r * n + t] = dot_int4_on(Isa::Scalar, p4, sr, group, x).to_bits();
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for &isa in Isa::available() {
                    let what = format!("{isa:?} {rows}x{cols}/g{group} n={n}");
                    let mut out = vec![0.0; rows * n];
                    dots_tile_int8_on(isa, (&q, &scales, group), cols, &xs, &mut out);
                    assert_eq!(bits(&out), want8, "int8 tile {what}");
                    dots_tile_int4_on(isa, (&packed, &scales, group), cols, &xs, &mut out);
                    assert_eq!(bits(&out), want4, "int4 tile {what}");
                    for r in 0..rows {
                        let sr = &scales[r * gpr..(r + 1) * gpr];
                        let q8 = &q[r * cols..(r + 1) * cols];
                        let p4 = &packed[r * cols / 2..(r + 1) * cols / 2];
                        for (t, x) in xs.iter().enumerate() {
                            assert_eq!(
                                dot_int8_on(isa, q8, sr, group, x).to_bits(),
                                want8[r * n + t],
                                "int8 {what}"
                            );
                            assert_eq!(
                                dot_int4_on(isa, p4, sr, group, x).to_bits(),
                                want4[r * n + t],
                                "int4 {what}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn three_row_float_dots_give_each_row_dot_bits() {
        for n in [1usize, 7, 31, 32, 64, 100, 2048, 2053] {
            let xs: Vec<Vec<f32>> = (0..3)
                .map(|t| {
                    (0..n)
                        .map(|i| ((i * 7919 + 31 * t) % 1013) as f32 / 1013.0 - 0.5)
                        .map(|v| v * 10f32.powi(t as i32 - 1))
                        .collect()
                })
                .collect();
            let xs = [&xs[0][..], &xs[1][..], &xs[2][..]];
            let w: Vec<f32> = (0..n)
                .map(|i| ((i * 104729 % 997) as f32 / 997.0 - 0.5) * 0.1)
                .collect();
            let w16: Vec<u16> = w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let wb: Vec<u16> = w.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
            for &isa in Isa::available() {
                let bits = |v: [f32; 3]| v.map(f32::to_bits);
                assert_eq!(
                    bits(dot3_f32_on(isa, &w, xs)),
                    bits(xs.map(|x| dot_f32_on(isa, &w, x))),
                    "f32 {isa:?} n={n}"
                );
                assert_eq!(
                    bits(dot3_f16_on(isa, &w16, xs)),
                    bits(xs.map(|x| dot_f16_on(isa, &w16, x))),
                    "f16 {isa:?} n={n}"
                );
                assert_eq!(
                    bits(dot3_bf16_on(isa, &wb, xs)),
                    bits(xs.map(|x| dot_bf16_on(isa, &wb, x))),
                    "bf16 {isa:?} n={n}"
                );
            }
        }
    }

    #[test]
    fn float_tiles_give_each_pair_the_scalar_dot_bits() {
        // Tiles of 1..7 rows against 1..9 activation rows: whole 3 x 4
        // register blocks and every smaller edge block, widths with and
        // without a tail.
        for cols in [1usize, 31, 32, 96, 100, 2053] {
            for (nrows, n) in [(1usize, 1usize), (3, 4), (7, 9), (5, 2), (2, 6)] {
                let xs: Vec<Vec<f32>> = (0..n)
                    .map(|t| {
                        (0..cols)
                            .map(|i| ((i * 7919 + 31 * t) % 1013) as f32 / 1013.0 - 0.5)
                            .map(|v| v * 10f32.powi(t as i32 % 3 - 1))
                            .collect()
                    })
                    .collect();
                let xs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
                let w: Vec<f32> = (0..nrows * cols)
                    .map(|i| ((i * 104729 % 997) as f32 / 997.0 - 0.5) * 0.1)
                    .collect();
                let w16: Vec<u16> = w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                let wb: Vec<u16> = w.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                // The definition: the portable one-row dot of every pair.
                let want = |one: &dyn Fn(usize, &[f32]) -> f32| {
                    let mut o = vec![0.0f32; nrows * n];
                    for r in 0..nrows {
                        for (t, x) in xs.iter().enumerate() {
                            o[r * n + t] = one(r, x);
                        }
                    }
                    bits(&o)
                };
                let f32_want = want(&|r, x| dot_f32_on(Isa::Scalar, &w[r * cols..(r + 1) * cols], x));
                let f16_want = want(&|r, x| dot_f16_on(Isa::Scalar, &w16[r * cols..(r + 1) * cols], x));
                let bf16_want = want(&|r, x| dot_bf16_on(Isa::Scalar, &wb[r * cols..(r + 1) * cols], x));
                for &isa in Isa::available() {
                    let mut o = vec![f32::NAN; nrows * n];
                    dots_tile_f32_on(isa, &w, cols, &xs, &mut o);
                    assert_eq!(bits(&o), f32_want, "f32 {isa:?} {nrows}x{n}x{cols}");
                    dots_tile_f16_on(isa, &w16, cols, &xs, &mut o);
                    assert_eq!(bits(&o), f16_want, "f16 {isa:?} {nrows}x{n}x{cols}");
                    dots_tile_bf16_on(isa, &wb, cols, &xs, &mut o);
                    assert_eq!(bits(&o), bf16_want, "bf16 {isa:?} {nrows}x{n}x{cols}");
                    // Attention's scores: the same tiles without the read-ahead.
                    scores_tile_f32_on(isa, &w, cols, &xs, &mut o);
                    assert_eq!(bits(&o), f32_want, "f32 scores {isa:?} {nrows}x{n}x{cols}");
                    scores_tile_f16_on(isa, &w16, cols, &xs, &mut o);
                    assert_eq!(bits(&o), f16_want, "f16 scores {isa:?} {nrows}x{n}x{cols}");
                }
            }
        }
    }

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
    fn attention_kernels_give_the_same_bits_on_every_instruction_set() {
        for (rows, width) in [
            (1usize, 8usize),
            (3, 7),
            (5, 64),
            (4, 72),
            (17, 128),
            (9, 131),
            (3, 203),
            (70, 136),
            (33, 256),
            (12, 64),
            (8, 96),
            (16, 32),
            (11, 100),
        ] {
            let x: Vec<f32> = (0..width)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0)
                .collect();
            let m: Vec<f32> = (0..rows * width)
                .map(|i| ((i * 104729 % 997) as f32 / 997.0 - 0.5) * 4.0)
                .collect();
            let m16: Vec<u16> = m.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let widened: Vec<f32> = m16.iter().map(|&v| f16_to_f32(v)).collect();
            let p: Vec<f32> = (0..rows).map(|j| 1.0 / (j as f32 + 1.5)).collect();
            // The reference: the f32 kernels on the exactly widened rows.
            let mut want_dots = vec![0.0; rows];
            dots_f32_on(Isa::Scalar, &widened, &x, &mut want_dots);
            let mut want_sum = vec![0.25; width];
            add_weighted_rows_on(Isa::Scalar, &mut want_sum, &p, &widened);
            for &isa in Isa::available() {
                let mut dots = vec![0.0; rows];
                dots_f16_on(isa, &m16, &x, &mut dots);
                let mut dots32 = vec![0.0; rows];
                dots_f32_on(isa, &widened, &x, &mut dots32);
                let mut sum = vec![0.25; width];
                add_weighted_rows_f16_on(isa, &mut sum, &p, &m16);
                let mut sum32 = vec![0.25; width];
                add_weighted_rows_on(isa, &mut sum32, &p, &widened);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&dots), bits(&want_dots), "dots {isa:?} {rows}x{width}");
                assert_eq!(bits(&dots32), bits(&want_dots), "f32 dots {isa:?} {rows}x{width}");
                assert_eq!(bits(&sum), bits(&want_sum), "weighted rows {isa:?} {rows}x{width}");
                assert_eq!(
                    bits(&sum32),
                    bits(&want_sum),
                    "f32 weighted rows {isa:?} {rows}x{width}"
                );
            }
        }
    }

    #[test]
    fn many_heads_weighted_sums_give_each_head_the_one_head_bits() {
        // (keys, stride, columns): MLA's 576-wide latent rows of which the
        // sums need 512; whole heads of 64 and 128; widths past the last 16.
        for (keys, stride, cols) in [
            (37, 576, 512),
            (9, 128, 128),
            (1, 64, 64),
            (0, 64, 64),
            (13, 40, 35),
            (5, 21, 7),
        ] {
            let m: Vec<f32> = (0..keys * stride)
                .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 3.0)
                .collect();
            let m16: Vec<u16> = m.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let widened: Vec<f32> = m16.iter().map(|&v| f16_to_f32(v)).collect();
            for heads in 1..=6 {
                let ps: Vec<Vec<f32>> = (0..heads)
                    .map(|h| (0..keys).map(|j| 1.0 / (j as f32 + 1.5 + h as f32)).collect())
                    .collect();
                let weights: Vec<&[f32]> = ps.iter().map(|p| &p[..]).collect();
                // Each head alone: the scalar one-head sum from zero over the full rows.
                let want = |rows: &[f32]| -> Vec<Vec<u32>> {
                    ps.iter()
                        .map(|p| {
                            let mut full = vec![0.0; stride];
                            add_weighted_rows_on(Isa::Scalar, &mut full, p, rows);
                            full[..cols].iter().map(|v| v.to_bits()).collect()
                        })
                        .collect()
                };
                let (want32, want16) = (want(&m), want(&widened));
                for &isa in Isa::available() {
                    let mut bufs = vec![vec![7.0f32; cols]; heads];
                    let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                    weighted_rows_many_on(isa, &m, stride, &weights, &mut outs);
                    let got: Vec<Vec<u32>> = bufs.iter().map(|b| b.iter().map(|v| v.to_bits()).collect()).collect();
                    assert_eq!(got, want32, "f32 {isa:?} {heads} heads {keys}x{stride}[..{cols}]");
                    let mut bufs = vec![vec![7.0f32; cols]; heads];
                    let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                    weighted_rows_many_f16_on(isa, &m16, stride, &weights, &mut outs);
                    let got: Vec<Vec<u32>> = bufs.iter().map(|b| b.iter().map(|v| v.to_bits()).collect()).collect();
                    assert_eq!(got, want16, "f16 {isa:?} {heads} heads {keys}x{stride}[..{cols}]");
                    // In blocks of rows (the first from zero, the rest
                    // continuing the sums): the one pass's bits.
                    for block in [1usize, 4, 96] {
                        let mut b32 = vec![vec![7.0f32; cols]; heads];
                        let mut b16 = vec![vec![7.0f32; cols]; heads];
                        for b in 0..keys.div_ceil(block).max(1) {
                            let (x0, x1) = (b * block, ((b + 1) * block).min(keys));
                            let w: Vec<&[f32]> = ps.iter().map(|p| &p[x0..x1]).collect();
                            let mut o32: Vec<&mut [f32]> = b32.iter_mut().map(|b| &mut b[..]).collect();
                            let mut o16: Vec<&mut [f32]> = b16.iter_mut().map(|b| &mut b[..]).collect();
                            let (r32, r16) = (&m[x0 * stride..], &m16[x0 * stride..]);
                            if b == 0 {
                                weighted_rows_many_on(isa, r32, stride, &w, &mut o32);
                                weighted_rows_many_f16_on(isa, r16, stride, &w, &mut o16);
                            } else {
                                add_weighted_rows_many_on(isa, r32, stride, &w, &mut o32);
                                add_weighted_rows_many_f16_on(isa, r16, stride, &w, &mut o16);
                            }
                        }
                        let got: Vec<Vec<u32>> = b32.iter().map(|b| b.iter().map(|v| v.to_bits()).collect()).collect();
                        assert_eq!(
                            got, want32,
                            "f32 {isa:?} blocks of {block}, {heads} heads {keys}x{stride}"
                        );
                        let got: Vec<Vec<u32>> = b16.iter().map(|b| b.iter().map(|v| v.to_bits()).collect()).collect();
                        assert_eq!(
                            got, want16,
                            "f16 {isa:?} blocks of {block}, {heads} heads {keys}x{stride}"
                        );
                    }
                    // Continuing sums already there: the one-head sum from them.
                    let start: Vec<Vec<f32>> = (0..heads)
                        .map(|h| (0..cols).map(|i| (i as f32 - 3.0) * 0.125 + h as f32).collect())
                        .collect();
                    let want_on = |rows: &[f32]| -> Vec<Vec<u32>> {
                        ps.iter()
                            .zip(&start)
                            .map(|(p, s)| {
                                let mut full = vec![0.0; stride];
                                full[..cols].copy_from_slice(s);
                                add_weighted_rows_on(Isa::Scalar, &mut full, p, rows);
                                full[..cols].iter().map(|v| v.to_bits()).collect()
                            })
                            .collect()
                    };
                    let mut bufs = start.clone();
                    let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                    add_weighted_rows_many_on(isa, &m, stride, &weights, &mut outs);
                    let got: Vec<Vec<u32>> = bufs.iter().map(|b| b.iter().map(|v| v.to_bits()).collect()).collect();
                    assert_eq!(got, want_on(&m), "f32 {isa:?} continued, {heads} heads {keys}x{stride}");
                    let mut bufs = start.clone();
                    let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                    add_weighted_rows_many_f16_on(isa, &m16, stride, &weights, &mut outs);
                    let got: Vec<Vec<u32>> = bufs.iter().map(|b| b.iter().map(|v| v.to_bits()).collect()).collect();
                    assert_eq!(
                        got,
                        want_on(&widened),
                        "f16 {isa:?} continued, {heads} heads {keys}x{stride}"
                    );
                }
            }
        }
    }

    #[test]
    fn scores_by_query_give_each_pair_the_scalar_dot_bits() {
        // Blocks of 1..48 keys (whole and partial groups of eight), 1..16
        // queries (whole and partial triples), widths with and without a
        // tail (64 and 128: the unrolled head widths), rows `stride` apart
        // with a gap that must stay untouched.
        for cols in [1usize, 31, 32, 64, 100, 128] {
            for nrows in [1usize, 7, 8, 9, 17, 48] {
                for n in [1usize, 2, 3, 4, 7, 16] {
                    let xs: Vec<Vec<f32>> = (0..n)
                        .map(|t| {
                            (0..cols)
                                .map(|i| ((i * 7919 + 31 * t) % 1013) as f32 / 1013.0 - 0.5)
                                .map(|v| if t == 1 { 0.0 } else { v * 10f32.powi(t as i32 % 3 - 1) })
                                .collect()
                        })
                        .collect();
                    let xs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
                    let w: Vec<f32> = (0..nrows * cols)
                        .map(|i| ((i * 104729 % 997) as f32 / 997.0 - 0.5) * 0.1)
                        .collect();
                    let w16: Vec<u16> = w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                    let stride = nrows + 5;
                    let want = |one: &dyn Fn(usize, &[f32]) -> f32| {
                        let mut o = vec![f32::NAN; n * stride];
                        for (t, x) in xs.iter().enumerate() {
                            for r in 0..nrows {
                                o[t * stride + r] = one(r, x);
                            }
                        }
                        o.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    };
                    let f32_want = want(&|r, x| dot_f32_on(Isa::Scalar, &w[r * cols..(r + 1) * cols], x));
                    let f16_want = want(&|r, x| dot_f16_on(Isa::Scalar, &w16[r * cols..(r + 1) * cols], x));
                    for &isa in Isa::available() {
                        let mut o = vec![f32::NAN; n * stride];
                        scores_by_query_f32_on(isa, &w, cols, &xs, &mut o, stride);
                        let got: Vec<u32> = o.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, f32_want, "f32 {isa:?} {nrows} keys, {n} queries, {cols} wide");
                        let mut o = vec![f32::NAN; n * stride];
                        scores_by_query_f16_on(isa, &w16, cols, &xs, &mut o, stride);
                        let got: Vec<u32> = o.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, f16_want, "f16 {isa:?} {nrows} keys, {n} queries, {cols} wide");
                    }
                }
            }
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
    fn zip_apply_gives_the_elementwise_bits_on_every_path() {
        // Extremes (NaN, infinities, overflowing and subnormal exponentials,
        // signed zeros) and a sweep, at lengths that leave vector tails.
        let mut gate = vec![
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-40,
            88.9,
            89.5,
            -103.9,
            -150.0,
            f32::MAX,
            f32::MIN,
        ];
        gate.extend((0..1000).map(|i| (i as f32 - 500.0) * 0.173));
        let up: Vec<f32> = (0..gate.len()).map(|i| ((i * 37) % 101) as f32 * 0.11 - 5.0).collect();
        let silu_mul = |g: f32, u: f32| silu(g) * u;
        for len in [0, 1, 7, 16, 31, gate.len()] {
            let want: Vec<u32> = gate[..len]
                .iter()
                .zip(&up)
                .map(|(&g, &u)| silu_mul(g, u).to_bits())
                .collect();
            for &isa in Isa::available() {
                let mut g = gate[..len].to_vec();
                zip_apply_on(isa, &mut g, &up[..len], silu_mul);
                let got: Vec<u32> = g.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{isa:?}, {len} pairs");
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_is_stable() {
        let mut x = vec![1000.0, 1001.0, 999.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[0] && x[0] > x[2]);
    }

    #[test]
    fn softmax_gives_the_same_bits_on_every_path() {
        let row: Vec<f32> = (0..517).map(|i| ((i * 7919) % 1000) as f32 * 0.037 - 20.0).collect();
        let mut want = row.clone();
        softmax_on(Isa::Scalar, &mut want);
        for &isa in Isa::available() {
            let mut got = row.clone();
            softmax_on(isa, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{isa:?}");
        }
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
