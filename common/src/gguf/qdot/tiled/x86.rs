//! x86 kernels of [`super`]: arranging, packing and the chunk loops (AVX2
//! and AVX-512 VNNI).

use std::arch::x86_64::*;

use super::super::super::types::KVALUES_IQ4NL;
use super::{chunk_bytes, head, ArrangedRow, GgmlType, Q8Acts, CHUNK, KVALUES_MXFP4, QK};
use crate::gguf::qdot::x86::e8m0_lanes;

/// Dwords `j` of four 128-bit rows per 128-bit half: `out[j]` lane `b`
/// (of 4) is dword `j` of row `b`.
#[inline(always)]
unsafe fn transpose4(v: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// Blocks `b` and `b + 4`'s 16 bytes at `off` as one register.
#[inline(always)]
unsafe fn pair(src: *const u8, stride: usize, b: usize, off: usize) -> __m256i {
    // SAFETY: the caller's pointer covers eight blocks of `stride` bytes.
    unsafe {
        let lo = _mm_loadu_si128(src.add(b * stride + off) as *const __m128i);
        let hi = _mm_loadu_si128(src.add((b + 4) * stride + off) as *const __m128i);
        _mm256_set_m128i(hi, lo)
    }
}

/// A Q4_0 or MXFP4 chunk's packed code bytes transposed (`src` at its
/// first block, whose 16 code bytes start at `off`): step `j` holds bytes
/// `4j..4j + 4` of each block's 16, lane `b` for block `b`.
#[inline(always)]
unsafe fn q4_steps(src: *const u8, bs: usize, off: usize) -> [__m256i; 4] {
    // SAFETY: the caller's pointer covers a chunk of eight blocks.
    unsafe {
        transpose4([
            pair(src, bs, 0, off),
            pair(src, bs, 1, off),
            pair(src, bs, 2, off),
            pair(src, bs, 3, off),
        ])
    }
}

/// `kvalues_mxfp4` in both 128-bit halves (`vpshufb` looks a nibble up in
/// its own half), each value offset by 128 when `flip` (VNNI's unsigned
/// operand: `v ^ 0x80 = v + 128` for a signed byte).
#[inline(always)]
unsafe fn mx_table(flip: bool) -> __m256i {
    // SAFETY: the table is 16 bytes.
    unsafe {
        let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i));
        _mm256_xor_si256(t, _mm256_set1_epi8(if flip { -128 } else { 0 }))
    }
}

/// `kvalues_iq4nl` in both 128-bit halves, offset by 128 when `flip` (as
/// [`mx_table`]).
#[inline(always)]
unsafe fn iq4_table(flip: bool) -> __m256i {
    // SAFETY: the table is 16 bytes.
    unsafe {
        let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
        _mm256_xor_si256(t, _mm256_set1_epi8(if flip { -128 } else { 0 }))
    }
}

/// Eight MXFP4 exponent bytes at `p` (a packed chunk's), widened to their
/// scales `2^(e - 128)`.
#[inline(always)]
unsafe fn e8m0_8(p: *const u8) -> __m256 {
    // SAFETY: the caller's pointer covers 8 bytes.
    unsafe { e8m0_lanes(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
}

/// The chunk transposition of eight 32-byte code blocks `stride` bytes
/// apart (`src` at the first code), into 256 bytes at `dst`, each byte
/// xor 0x80 when `flip`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose32(src: *const u8, stride: usize, dst: *mut u8, flip: bool) {
    // SAFETY: the caller's pointers cover eight blocks and 256 bytes.
    unsafe {
        let x = _mm256_set1_epi8(if flip { -128 } else { 0 });
        for h in 0..2 {
            let v = [
                pair(src, stride, 0, 16 * h),
                pair(src, stride, 1, 16 * h),
                pair(src, stride, 2, 16 * h),
                pair(src, stride, 3, 16 * h),
            ];
            let o = transpose4(v);
            for (j, o) in o.into_iter().enumerate() {
                _mm256_storeu_si256(dst.add(32 * (4 * h + j)) as *mut __m256i, _mm256_xor_si256(o, x));
            }
        }
    }
}

/// One block's 32 codes in element order at `out` (element `i < 16` the
/// low nibble of byte `i` of `qs`, `16 + i` its high nibble), each with
/// its fifth bit from the 32 bits at `qh` when there are some (bit `e` of
/// their little-endian word at bit 4 of code `e`), less `minus`: the
/// nibbles split into two halves, and the fifth bits found by replicating
/// byte `i / 8` of `qh` into code `i` and testing bit `i mod 8`.
///
/// # Safety
/// AVX2; `qs` readable for 16 bytes, `qh` (if any) for 4, `out` writable
/// for 32.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn five_bit_codes(qs: *const u8, qh: Option<*const u8>, minus: i8, out: *mut u8) {
    // SAFETY: the caller's promise.
    unsafe {
        let v = _mm_loadu_si128(qs as *const __m128i);
        let low4 = _mm_set1_epi8(0x0f);
        let mut codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
        if let Some(qh) = qh {
            let bytes = _mm256_set1_epi32((qh as *const i32).read_unaligned());
            let spread = _mm256_shuffle_epi8(
                bytes,
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                ),
            );
            let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
            codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        }
        _mm256_storeu_si256(out as *mut __m256i, _mm256_sub_epi8(codes, _mm256_set1_epi8(minus)));
    }
}

/// [`super::arrange_row_on`]'s layout of whole chunks: codes (Q4_0
/// unpacked, MXFP4's and IQ4_NL's looked up, Q8_0's, MXFP4's and IQ4_NL's
/// flipped by 128 when `offset`) and widened scales.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn arrange(ty: GgmlType, row: &[u8], offset: bool, codes: &mut [u8], d: &mut [f32]) {
    let bs = ty.block_bytes();
    let low4 = _mm256_set1_epi8(0x0f);
    // SAFETY: `row` holds `codes.len() / 256` chunks of eight blocks of
    // `ty`; `codes` one byte per element and `d` one float per block.
    unsafe {
        for c in 0..codes.len() / CHUNK {
            let src = row.as_ptr().add(c * 8 * bs);
            let dst = codes.as_mut_ptr().add(c * CHUNK);
            let scales = if ty == GgmlType::MXFP4 {
                let e = |b: usize| *src.add(b * bs) as i32;
                e8m0_lanes(_mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7)))
            } else {
                let h = |b: usize| (src.add(b * bs) as *const i16).read_unaligned();
                _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)))
            };
            _mm256_storeu_ps(d.as_mut_ptr().add(8 * c), scales);
            if matches!(ty, GgmlType::MXFP4 | GgmlType::IQ4_NL) {
                let (table, at) = if ty == GgmlType::MXFP4 {
                    (mx_table(offset), 1)
                } else {
                    (iq4_table(offset), 2)
                };
                for (j, o) in q4_steps(src, bs, at).into_iter().enumerate() {
                    let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(o, low4));
                    let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(o, 4), low4));
                    _mm256_storeu_si256(dst.add(32 * j) as *mut __m256i, lo);
                    _mm256_storeu_si256(dst.add(32 * (4 + j)) as *mut __m256i, hi);
                }
            } else if ty == GgmlType::Q4_0 {
                for (j, o) in q4_steps(src, bs, 2).into_iter().enumerate() {
                    let lo = _mm256_and_si256(o, low4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(o, 4), low4);
                    _mm256_storeu_si256(dst.add(32 * j) as *mut __m256i, lo);
                    _mm256_storeu_si256(dst.add(32 * (4 + j)) as *mut __m256i, hi);
                }
            } else {
                transpose32(src.add(2), bs, dst, offset);
            }
        }
    }
}

/// One chunk of [`super::pack_rows_on`]'s layout.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_chunk(ty: GgmlType, src: &[u8], dst: &mut [u8], flip: bool) {
    let (bs, h) = (ty.block_bytes(), head(ty));
    let codes = 8 * (bs - h);
    // SAFETY: `src` and `dst` hold one chunk (eight blocks) of `ty`.
    unsafe {
        let s = src.as_ptr();
        let d = dst.as_mut_ptr();
        for b in 0..8 {
            std::ptr::copy_nonoverlapping(s.add(b * bs), d.add(codes + h * b), h);
        }
        if matches!(ty, GgmlType::Q4_0 | GgmlType::MXFP4 | GgmlType::IQ4_NL) {
            for (j, o) in q4_steps(s, bs, h).into_iter().enumerate() {
                _mm256_storeu_si256(d.add(32 * j) as *mut __m256i, o);
            }
        } else {
            transpose32(s.add(2), bs, d, flip);
        }
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn packed_vnni(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    let tail = rb > acts.len() / CHUNK * chunk_bytes(ty);
    // SAFETY (all): forwarded.
    unsafe {
        match (
            matches!(ty, GgmlType::MXFP4 | GgmlType::IQ4_XS | GgmlType::IQ4_NL),
            tail,
        ) {
            (true, true) => each_type!(ty, t => packed::<true, false, true, true>(t, rows, rb, acts, out)),
            (true, false) => each_type!(ty, t => packed::<true, false, true, false>(t, rows, rb, acts, out)),
            (false, true) => each_type!(ty, t => packed::<true, false, false, true>(t, rows, rb, acts, out)),
            (false, false) => each_type!(ty, t => packed::<true, false, false, false>(t, rows, rb, acts, out)),
        }
    }
}

#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn packed_avx2<const SIGNED: bool>(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    acts: &Q8Acts,
    out: &mut [f32],
) {
    let tail = rb > acts.len() / CHUNK * chunk_bytes(ty);
    // SAFETY (all): forwarded.
    unsafe {
        match (
            matches!(ty, GgmlType::MXFP4 | GgmlType::IQ4_XS | GgmlType::IQ4_NL),
            tail,
        ) {
            (true, true) => each_type!(ty, t => packed::<false, SIGNED, true, true>(t, rows, rb, acts, out)),
            (true, false) => each_type!(ty, t => packed::<false, SIGNED, true, false>(t, rows, rb, acts, out)),
            (false, true) => each_type!(ty, t => packed::<false, SIGNED, false, true>(t, rows, rb, acts, out)),
            (false, false) => each_type!(ty, t => packed::<false, SIGNED, false, false>(t, rows, rb, acts, out)),
        }
    }
}

/// The packed rows' loop: per chunk, the codes' steps (Q4_0's and Q4_K's
/// nibbles split as they are loaded, MXFP4's looked up) against the
/// activation steps, then the same term as `body` (Q4_K's from its packed
/// scales, [`k_term`]); then the blocks past the last whole chunk
/// ([`tail_lanes`], into the same lanes). `MX`: nibbles looked up in a
/// table (MXFP4's, or IQ4_XS's with its sub-block scales in the term as
/// Q4_K's); `TAIL`: rows with
/// blocks past their whole chunks (instances of their own, so the other
/// rows' loops carry no branch or call for them: 2–4 % in cache).
#[inline(always)]
unsafe fn packed<const VNNI: bool, const SIGNED: bool, const MX: bool, const TAIL: bool>(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    acts: &Q8Acts,
    out: &mut [f32],
) {
    let q4 = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_K);
    let k4 = ty == GgmlType::Q4_K;
    let mx = MX;
    let xs = ty == GgmlType::IQ4_XS;
    // IQ4's levels reach ±127: pairs widened every step on AVX2.
    let iq = matches!(ty, GgmlType::IQ4_XS | GgmlType::IQ4_NL);
    let count = _mm_cvtsi32_si128(if q4 { 3 } else { 7 });
    let low4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    // AVX2 multiplies MXFP4 levels plus [`MX_BIAS`], unsigned as Q4_0's nibbles
    // (less the bias times `S` after the chunk's steps).
    let mx_biased = !VNNI && !iq;
    let table = if iq {
        iq4_table(VNNI)
    } else if mx_biased {
        _mm256_add_epi8(mx_table(false), _mm256_set1_epi8(MX_BIAS as i8))
    } else {
        mx_table(VNNI)
    };
    let chunks = acts.len() / CHUNK;
    let cb = chunk_bytes(ty);
    let codes = cb - 8 * head(ty);
    let whole = chunks * cb;
    let pf = crate::prefetch::distance();
    // SAFETY: each row holds `chunks` chunks of `cb` bytes (the caller
    // checked the sizes); the activations hold `chunks` chunks of codes
    // and eight totals and scales per chunk.
    unsafe {
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
            let mut acc = _mm256_setzero_ps();
            for c in 0..chunks {
                let p = row.as_ptr().add(c * cb);
                crate::prefetch::ahead_span(p, cb, pf);
                let q0 = acts.qt.as_ptr().add(c * CHUNK) as *const u8;
                let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                let w = |j: usize| _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
                let mut s0 = _mm256_setzero_si256();
                let mut s1 = _mm256_setzero_si256();
                if mx {
                    for j in 0..4 {
                        let v = w(j);
                        let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, low4));
                        let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
                        if VNNI {
                            // Offset by 128 (the table's), less 128 S below.
                            s0 = madd::<true, false>(s0, lo, q(j));
                            s1 = madd::<true, false>(s1, hi, q(4 + j));
                        } else if mx_biased {
                            // Levels + 12 (0..=24) by the codes: a pair is
                            // at most 2 · 24 · 127 = 6096 in magnitude, a
                            // lane of `s0` or `s1` sums four (24384 < 2^15).
                            s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo, q(j)));
                            s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi, q(4 + j)));
                        } else {
                            // IQ4's levels (up to ±127): |w| times
                            // q·sign(w), each step's pairs (up to 2 · 127 ·
                            // 127) widened.
                            let pl = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(q(j), lo));
                            let ph = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(q(4 + j), hi));
                            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(pl, ones));
                            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(ph, ones));
                        }
                    }
                    if mx_biased {
                        // Widened, less the offset's 12 S.
                        let tot = _mm256_loadu_si256(acts.tot.as_ptr().add(8 * c) as *const __m256i);
                        s0 = less_mx_bias(
                            _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones)),
                            tot,
                        );
                        s1 = _mm256_setzero_si256();
                    }
                } else if q4 && VNNI {
                    // The high nibbles multiplied in place (16 times their
                    // value: no shift per step; VNNI's 32-bit sums cannot
                    // saturate) and the sum divided by 16 once, exactly.
                    for j in 0..4 {
                        let v = w(j);
                        s0 = madd::<VNNI, false>(s0, _mm256_and_si256(v, low4), q(j));
                        s1 = madd::<VNNI, false>(s1, _mm256_andnot_si256(low4, v), q(4 + j));
                    }
                    s1 = _mm256_srai_epi32::<4>(s1);
                } else if q4 {
                    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for j in 0..4 {
                        let v = w(j);
                        let lo = _mm256_and_si256(v, low4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(lo, q(j)));
                        b = _mm256_add_epi16(b, _mm256_maddubs_epi16(hi, q(4 + j)));
                    }
                    s0 = widen_q4(a, b);
                } else {
                    for j in (0..8).step_by(2) {
                        s0 = madd::<VNNI, SIGNED>(s0, w(j), q(j));
                        s1 = madd::<VNNI, SIGNED>(s1, w(j + 1), q(j + 1));
                    }
                }
                let mut i = _mm256_add_epi32(s0, s1);
                let tot = _mm256_loadu_si256(acts.tot.as_ptr().add(8 * c) as *const __m256i);
                let dx = _mm256_loadu_ps(acts.d.as_ptr().add(8 * c));
                if k4 {
                    let (sc, mn, d, dmin) = super::q4k::scales(p);
                    acc = _mm256_add_ps(acc, k_term(sc, mn, d, dmin, dx, i, tot));
                    continue;
                }
                if !SIGNED {
                    i = _mm256_sub_epi32(i, _mm256_sll_epi32(tot, count));
                }
                if xs {
                    let ds = super::iq4xs::scaled_d(p);
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(ds, dx), _mm256_cvtepi32_ps(i)));
                    continue;
                }
                let dw = if ty == GgmlType::MXFP4 {
                    e8m0_8(p.add(codes))
                } else {
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(codes) as *const __m128i))
                };
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i)));
            }
            if TAIL {
                let tail = &row[whole..];
                acc = if VNNI {
                    tail_vnni::<1>(ty, tail, 8 * chunks, [acts], [acc])[0]
                } else {
                    tail_avx2::<1>(ty, tail, 8 * chunks, [acts], [acc])[0]
                };
            }
            *o = crate::gguf::qdot::x86::lane_sums([acc])[0];
        }
    }
}

/// What AVX2 adds to MXFP4's levels (`-12..=12`) to multiply them as
/// unsigned bytes (`0..=24`), as Q4_0's nibbles: a pair of products is then
/// at most 2 · 24 · 127 = 6096 in magnitude, so a 16-bit lane sums four.
const MX_BIAS: i32 = 12;

/// Block sums `i` of MXFP4's biased levels less the bias times the
/// activation blocks' code totals `tot`: the sums of the levels themselves.
#[inline(always)]
unsafe fn less_mx_bias(i: __m256i, tot: __m256i) -> __m256i {
    // SAFETY: register arithmetic only (the caller's target runs AVX2).
    unsafe { _mm256_sub_epi32(i, _mm256_mullo_epi32(tot, _mm256_set1_epi32(MX_BIAS))) }
}

/// AVX2 Q4_0: the eight steps' `vpmaddubsw` pairs of a chunk, summed in
/// 16 bits in two halves `a` and `b`, widened to each lane's 32-bit sum
/// with one `vpmaddwd`. Exact: a pair is at most 2 · 15 · 127 = 3810 in
/// magnitude (nibbles by activation codes, which stay within ±127), so
/// eight of them, 30480, fit an i16; the integer sums are the same
/// whatever the order, so the bits are those of [`madd`] step by step.
/// Saves seven of the eight widening multiplies per chunk.
#[inline(always)]
unsafe fn widen_q4(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: register arithmetic only (the caller's target runs AVX2).
    unsafe { _mm256_madd_epi16(_mm256_add_epi16(a, b), _mm256_set1_epi16(1)) }
}

/// `acc + Σ` of four-product groups, lane `i` over bytes `4i..4i + 4`
/// (`SIGNED`, AVX2: signed `w` as `|w|` times `q·sign(w)`).
#[inline(always)]
pub(super) unsafe fn madd<const VNNI: bool, const SIGNED: bool>(acc: __m256i, w: __m256i, q: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(acc, w, q)
    } else {
        let (w, q) = if SIGNED {
            // |w| times q·sign(w): unsigned by signed, exact.
            (_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w))
        } else {
            (w, q)
        };
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), _mm256_set1_epi16(1)))
    }
}

/// One weight row's chunk `c` as the VNNI chunk loop takes it: eight
/// steps of codes (lane `b` = block `b`, Q4_0's nibbles unpacked) and the
/// eight block scales widened.
type Chunk = ([__m256i; 8], __m256);

/// A weight row as the chunk loops read it: whole chunks (VNNI, whose
/// sixteen extra registers hold them across four activation rows), or
/// steps `j` and `4 + j` at a time and the scales (AVX2, whose sixteen
/// registers do not: a chunk held across four rows would spill).
trait Row: Copy {
    /// Chunk `c`'s steps `j` and `4 + j` (`j < 4`).
    unsafe fn pair(self, c: usize, j: usize) -> (__m256i, __m256i);
    /// Chunk `c`'s eight block scales, widened.
    unsafe fn scales(self, c: usize) -> __m256;
    /// Q4_K chunk `c`'s sub-block scales and mins, and `dmin` in every lane;
    /// Q6_K's scales of the first and of the second halves.
    unsafe fn k_scales(self, c: usize) -> (__m256i, __m256i, __m256);
    /// Q4_K / Q5_K chunk `c`'s `d · sc` and `dmin · mn` ([`k_products`]).
    #[inline(always)]
    unsafe fn k_products(self, c: usize) -> (__m256, __m256) {
        // SAFETY: forwarded (the caller's chunk index is in range).
        unsafe {
            let (sc, mn, dmin) = self.k_scales(c);
            k_products(sc, mn, self.scales(c), dmin)
        }
    }
    /// Q2_K / Q3_K chunk `c`'s half scales and mins, `d` and `dmin`
    /// ([`super::q23k::scales`]); zeros for the other types.
    #[inline(always)]
    unsafe fn half_scales(self, _c: usize) -> ([__m256i; 4], __m256, __m256) {
        let z = _mm256_setzero_si256();
        ([z; 4], _mm256_setzero_ps(), _mm256_setzero_ps())
    }
    /// Chunk `c` whole.
    #[inline(always)]
    unsafe fn chunk(self, c: usize) -> Chunk {
        let mut w = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            // SAFETY: forwarded (the caller's chunk index is in range).
            (w[j], w[4 + j]) = unsafe { self.pair(c, j) };
        }
        // SAFETY: as above.
        (w, unsafe { self.scales(c) })
    }
}

/// An arranged row ([`super::arrange_row_on`]).
#[derive(Clone, Copy)]
struct Arranged<'a>(&'a ArrangedRow);

impl Row for Arranged<'_> {
    #[inline(always)]
    unsafe fn pair(self, c: usize, j: usize) -> (__m256i, __m256i) {
        // SAFETY: the caller's `c` is below the row's chunk count; codes
        // hold 256 bytes per chunk.
        unsafe {
            let w0 = self.0.codes.as_ptr().add(c * CHUNK + 32 * j);
            (
                _mm256_loadu_si256(w0 as *const __m256i),
                _mm256_loadu_si256(w0.add(128) as *const __m256i),
            )
        }
    }

    #[inline(always)]
    unsafe fn scales(self, c: usize) -> __m256 {
        // SAFETY: `d` holds eight floats per chunk.
        unsafe { _mm256_loadu_ps(self.0.d.as_ptr().add(8 * c)) }
    }

    #[inline(always)]
    unsafe fn k_scales(self, c: usize) -> (__m256i, __m256i, __m256) {
        // SAFETY: a Q4_K row holds sixteen scales and mins and eight
        // `dmin` lanes per chunk.
        unsafe {
            let k = self.0.k_scales.as_ptr().add(16 * c);
            (
                _mm256_loadu_si256(k as *const __m256i),
                _mm256_loadu_si256(k.add(8) as *const __m256i),
                _mm256_loadu_ps(self.0.dmin.as_ptr().add(8 * c)),
            )
        }
    }
}

/// A row of a packed copy ([`super::pack_rows_on`]'s layout, chunks of
/// `cb` bytes from `p`): Q4_0's step `j` of nibble pairs split into the
/// low (step `j`) and high (`4 + j`) codes, as [`super::arrange_row_on`]
/// lays them out; the chunk's eight f16 scales after its codes. Q6_K
/// ([`super::q6k`]'s layout): step `j`'s nibbles joined with their top
/// bits give the first halves' codes (step `j`) and the second halves'
/// (`4 + j`); the super-block's `d` in every lane and the halves' scales.
#[derive(Clone, Copy)]
struct Packed {
    ty: GgmlType,
    p: *const u8,
    cb: usize,
}

/// A packed row whose nibbles name levels of a table (a type of its own,
/// so that the other types' loops carry no branch for it), `KIND` one of
/// [`LUT_MXFP4`], [`LUT_IQ4_NL`], [`LUT_IQ4_XS`]: Q4_0's nibble steps
/// looked up in [`mx_table`] or [`iq4_table`] (the signed levels, or with
/// `flip` (VNNI) the levels offset by 128), then per chunk MXFP4's eight
/// exponent bytes, IQ4_NL's eight f16 scales, or IQ4_XS's `d` and 6-bit
/// sub-block scales ([`super::iq4xs`]).
#[derive(Clone, Copy)]
struct PackedLut<const KIND: u8> {
    p: *const u8,
    flip: bool,
}

const LUT_MXFP4: u8 = 0;
const LUT_IQ4_NL: u8 = 1;
const LUT_IQ4_XS: u8 = 2;

impl<const KIND: u8> PackedLut<KIND> {
    /// Bytes of a packed chunk: 128 of nibbles, then 8 exponents (MXFP4),
    /// 16 bytes of f16 scales (IQ4_NL) or 8 of `d` and scales (IQ4_XS).
    const CHUNK: usize = if KIND == LUT_IQ4_NL { 144 } else { 136 };
}

impl<const KIND: u8> Row for PackedLut<KIND> {
    #[inline(always)]
    unsafe fn pair(self, c: usize, j: usize) -> (__m256i, __m256i) {
        // SAFETY: the caller's `c` is below the row's chunk count.
        unsafe {
            let low4 = _mm256_set1_epi8(0x0f);
            let table = if KIND == LUT_MXFP4 {
                mx_table(self.flip)
            } else {
                iq4_table(self.flip)
            };
            let v = _mm256_loadu_si256(self.p.add(c * Self::CHUNK + 32 * j) as *const __m256i);
            (
                _mm256_shuffle_epi8(table, _mm256_and_si256(v, low4)),
                _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4)),
            )
        }
    }

    #[inline(always)]
    unsafe fn scales(self, c: usize) -> __m256 {
        // SAFETY: as above.
        unsafe {
            let p = self.p.add(c * Self::CHUNK);
            match KIND {
                LUT_MXFP4 => e8m0_8(p.add(128)),
                LUT_IQ4_NL => _mm256_cvtph_ps(_mm_loadu_si128(p.add(128) as *const __m128i)),
                _ => super::iq4xs::scaled_d(p),
            }
        }
    }

    #[inline(always)]
    unsafe fn k_scales(self, _c: usize) -> (__m256i, __m256i, __m256) {
        // IQ4_XS's sub-block scales are in its `scales` (`d · (ls - 32)`).
        (_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_ps())
    }
}

impl Row for Packed {
    #[inline(always)]
    unsafe fn half_scales(self, c: usize) -> ([__m256i; 4], __m256, __m256) {
        // SAFETY: the caller's `c` is below the row's chunk count.
        unsafe { super::q23k::scales(self.ty, self.p.add(c * self.cb)) }
    }

    #[inline(always)]
    unsafe fn pair(self, c: usize, j: usize) -> (__m256i, __m256i) {
        // SAFETY: the caller's `c` is below the row's chunk count.
        unsafe {
            let p = self.p.add(c * self.cb);
            if matches!(self.ty, GgmlType::Q2_K | GgmlType::Q3_K) {
                return super::q23k::pair(self.ty, p, j);
            }
            if self.ty == GgmlType::Q5_K {
                // Q4_K's nibbles with bit `s` of the fifth-bit register at
                // bit 4 for step `s`.
                let low4 = _mm256_set1_epi8(0x0f);
                let sixteen = _mm256_set1_epi8(0x10);
                let v = _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
                let h = _mm256_loadu_si256(p.add(128) as *const __m256i);
                let bit = |s: i32| {
                    // Bit s to bit 4: left by 4 − s or right by s − 4.
                    let moved = if s <= 4 {
                        _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - s))
                    } else {
                        _mm256_srl_epi16(h, _mm_cvtsi32_si128(s - 4))
                    };
                    _mm256_and_si256(moved, sixteen)
                };
                return (
                    _mm256_or_si256(_mm256_and_si256(v, low4), bit(j as i32)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), bit(4 + j as i32)),
                );
            }
            if self.ty == GgmlType::Q6_K {
                let low4 = _mm256_set1_epi8(0x0f);
                let top = _mm256_set1_epi8(0x30);
                let v = _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
                let h0 = _mm256_loadu_si256(p.add(128) as *const __m256i);
                let h1 = _mm256_loadu_si256(p.add(160) as *const __m256i);
                (
                    _mm256_or_si256(_mm256_and_si256(v, low4), super::q6k::at4(h0, j, top)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                        super::q6k::at4(h1, j, top),
                    ),
                )
            } else if matches!(self.ty, GgmlType::Q4_0 | GgmlType::Q4_K) {
                let low4 = _mm256_set1_epi8(0x0f);
                let v = _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
                (
                    _mm256_and_si256(v, low4),
                    _mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                )
            } else {
                (
                    _mm256_loadu_si256(p.add(32 * j) as *const __m256i),
                    _mm256_loadu_si256(p.add(32 * (4 + j)) as *const __m256i),
                )
            }
        }
    }

    #[inline(always)]
    unsafe fn scales(self, c: usize) -> __m256 {
        // SAFETY: as above; the scales are the chunk's last 16 bytes (Q6_K:
        // `d` its last two).
        unsafe {
            let p = self.p.add(c * self.cb + self.cb);
            match self.ty {
                // Q3_K's `d` is its last two bytes, Q2_K's the two before `dmin`.
                GgmlType::Q6_K | GgmlType::Q3_K => {
                    _mm256_cvtph_ps(_mm_set1_epi16((p.sub(2) as *const i16).read_unaligned()))
                }
                // Q4_K's `d`: bytes 140..142 of its 144.
                GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K => {
                    _mm256_cvtph_ps(_mm_set1_epi16((p.sub(4) as *const i16).read_unaligned()))
                }
                _ => _mm256_cvtph_ps(_mm_loadu_si128(p.sub(16) as *const __m128i)),
            }
        }
    }

    #[inline(always)]
    unsafe fn k_scales(self, c: usize) -> (__m256i, __m256i, __m256) {
        // SAFETY: as above; a Q6_K super-block's scales of the first
        // halves are its bytes 192..200, of the second halves 200..208.
        unsafe {
            let p = self.p.add(c * self.cb);
            if matches!(self.ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                // From byte 32 a packed Q5_K block reads as a Q4_K one.
                let at = if self.ty == GgmlType::Q5_K { 32 } else { 0 };
                let (sc, mn, _, dmin) = super::q4k::scales(p.add(at));
                return (sc, mn, dmin);
            }
            (
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(192) as *const __m128i)),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(200) as *const __m128i)),
                _mm256_setzero_ps(),
            )
        }
    }
}

/// [`super::super::combine`]'s Q4_K term on eight sub-blocks' lanes:
/// `((d · sc) * dx) * f32(i) - (dmin · mn) * (dx * f32(S))`, from the
/// super-block's scales and mins (`Row::k_scales`, read once per chunk).
/// Inlined into the loops, `d · sc` and `dmin · mn` are formed once per
/// weight chunk and `dx * f32(S)` once per activation chunk (the compiler
/// shares them across the rows that use them), so a term is three
/// multiplies, a conversion and a subtraction.
#[inline(always)]
unsafe fn k_term(sc: __m256i, mn: __m256i, dw: __m256, dmin: __m256, dx: __m256, i: __m256i, tot: __m256i) -> __m256 {
    // SAFETY: register arithmetic only (the caller's target runs AVX2).
    unsafe { k_term_of(k_products(sc, mn, dw, dmin), dx, i, tot) }
}

/// A Q4_K / Q5_K chunk's `d · sc` and `dmin · mn` per lane (exact: an f16
/// times a 6-bit integer fits an f32's significand).
#[inline(always)]
unsafe fn k_products(sc: __m256i, mn: __m256i, dw: __m256, dmin: __m256) -> (__m256, __m256) {
    // SAFETY: register arithmetic only (the caller's target runs AVX2).
    unsafe {
        (
            _mm256_mul_ps(dw, _mm256_cvtepi32_ps(sc)),
            _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)),
        )
    }
}

/// [`k_term`] from the chunk's [`k_products`] `(ds, dm)`.
#[inline(always)]
unsafe fn k_term_of((ds, dm): (__m256, __m256), dx: __m256, i: __m256i, tot: __m256i) -> __m256 {
    // SAFETY: register arithmetic only (the caller's target runs AVX2).
    unsafe {
        let xs = _mm256_mul_ps(dx, _mm256_cvtepi32_ps(tot));
        _mm256_sub_ps(
            _mm256_mul_ps(_mm256_mul_ps(ds, dx), _mm256_cvtepi32_ps(i)),
            _mm256_mul_ps(dm, xs),
        )
    }
}

/// [`super::super::combine`]'s Q4_1 / Q5_1 term on eight blocks' lanes:
/// `(d * dx) * f32(i) + (m * dx) * f32(S)`, `S` the activation blocks'
/// code totals.
#[inline(always)]
unsafe fn min_term(d: __m256, m: __m256, dx: __m256, i: __m256i, tot: __m256i) -> __m256 {
    // SAFETY: register arithmetic only (the caller's target runs AVX2).
    unsafe {
        _mm256_add_ps(
            _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(i)),
            _mm256_mul_ps(_mm256_mul_ps(m, dx), _mm256_cvtepi32_ps(tot)),
        )
    }
}

/// [`super::super::combine`]'s Q6_K term on eight sub-blocks' lanes, from
/// the half sums `lo`, `hi`, the activations' `off6` (`32 s` per half) and
/// the chunk's `d` and half scales (read once per chunk):
/// `(d * dx) * f32(sc₀ (lo − 32 s₀) + sc₁ (hi − 32 s₁))`.
#[inline(always)]
unsafe fn q6_k_term(
    c: usize,
    (d, sc0, sc1): (__m256, __m256i, __m256i),
    a: &Q8Acts,
    lo: __m256i,
    hi: __m256i,
) -> __m256 {
    // SAFETY: the caller's chunk index is in range; arranged activations
    // hold sixteen offsets and eight scales per chunk.
    unsafe {
        let off = a.off6.as_ptr().add(16 * c);
        let s0 = _mm256_loadu_si256(off as *const __m256i);
        let s1 = _mm256_loadu_si256(off.add(8) as *const __m256i);
        let i = _mm256_add_epi32(
            _mm256_mullo_epi32(sc0, _mm256_sub_epi32(lo, s0)),
            _mm256_mullo_epi32(sc1, _mm256_sub_epi32(hi, s1)),
        );
        let dx = _mm256_loadu_ps(a.d.as_ptr().add(8 * c));
        _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(i))
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn many_vnni(ty: GgmlType, row: &ArrangedRow, tail: &[u8], acts: &[&Q8Acts], out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => many::<true>(t, row.codes.len() / CHUNK, Arranged(row), tail, acts, out)) }
}

#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn many_avx2(ty: GgmlType, row: &ArrangedRow, tail: &[u8], acts: &[&Q8Acts], out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => many::<false>(t, row.codes.len() / CHUNK, Arranged(row), tail, acts, out)) }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn many_packed_vnni(ty: GgmlType, rows: &[u8], rb: usize, acts: &[&Q8Acts], out: OutRows<'_>) {
    // SAFETY: forwarded.
    unsafe { many_packed::<true>(ty, rows, rb, acts, out) }
}

#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn many_packed_avx2(ty: GgmlType, rows: &[u8], rb: usize, acts: &[&Q8Acts], out: OutRows<'_>) {
    // SAFETY: forwarded.
    unsafe { many_packed::<false>(ty, rows, rb, acts, out) }
}

/// Where a product of several weight rows puts row `i`'s outputs
/// (`out[i * stride..][..n]`, `n` the activation rows), and what runs
/// before each row ([`super::TileOut`]; none for a single row): the rows'
/// loop inside the instruction set's function, so a tile pays one
/// dispatch, not one a row.
pub(in crate::gguf::qdot) struct OutRows<'a> {
    pub out: &'a mut [f32],
    pub stride: usize,
    pub before: Option<&'a mut dyn FnMut(usize)>,
}

impl<'a> OutRows<'a> {
    /// One row's outputs, nothing run before it.
    pub fn one(out: &'a mut [f32]) -> Self {
        OutRows {
            out,
            stride: 0,
            before: None,
        }
    }

    /// A tile's outputs ([`super::TileOut`]).
    pub fn of(tile: super::TileOut<'a>) -> Self {
        OutRows {
            out: tile.out,
            stride: tile.stride,
            before: Some(tile.before),
        }
    }

    /// Row `i`'s `n` outputs, after its `before`.
    #[inline(always)]
    fn row(&mut self, i: usize, n: usize) -> &mut [f32] {
        if let Some(before) = self.before.as_mut() {
            before(i);
        }
        &mut self.out[i * self.stride..i * self.stride + n]
    }
}

/// Packed rows (each `rb` bytes) against the activation rows: the
/// table-looked-up types through their [`PackedLut`] (offset by 128 on
/// VNNI), the others through [`Packed`].
#[inline(always)]
unsafe fn many_packed<const VNNI: bool>(ty: GgmlType, rows: &[u8], rb: usize, acts: &[&Q8Acts], mut out: OutRows<'_>) {
    let cb = chunk_bytes(ty);
    let chunks = rb / cb;
    let (n, flip) = (acts.len(), VNNI);
    // Each row: its whole chunks of `cb` bytes, then fewer than eight blocks.
    macro_rules! each_row {
        ($t:expr, $row:expr) => {
            for i in 0..rows.len() / rb {
                let r = &rows[i * rb..(i + 1) * rb];
                // SAFETY: forwarded; `r` holds `chunks` whole chunks, then
                // its tail.
                unsafe {
                    many::<VNNI>(
                        $t,
                        chunks,
                        $row(r.as_ptr()),
                        &r[chunks * cb..],
                        acts,
                        out.row(i, n),
                    )
                }
            }
        };
    }
    match ty {
        GgmlType::MXFP4 => each_row!(GgmlType::MXFP4, |p| lut::<LUT_MXFP4>(p, flip)),
        GgmlType::IQ4_XS => each_row!(GgmlType::IQ4_XS, |p| lut::<LUT_IQ4_XS>(p, flip)),
        GgmlType::IQ4_NL => each_row!(GgmlType::IQ4_NL, |p| lut::<LUT_IQ4_NL>(p, flip)),
        _ => each_type!(ty, t => each_row!(t, |p| Packed { ty: t, p, cb })),
    }
}

/// A packed Q4_K, Q5_K or IQ4_XS row with its chunks' scale factors
/// formed ahead ([`super::scales_ahead`]: per chunk Q4_K's and Q5_K's eight
/// `d · sc`, then eight `dmin · mn` ([`k_products`]), or IQ4_XS's eight `d
/// · (ls - 32)` (its `scales`)): the codes from the packed row, the factors
/// loaded instead of decoded from the 6-bit scales for every pass of
/// activation rows.
#[derive(Clone, Copy)]
struct Ahead<R, const IQ4: bool> {
    row: R,
    scales: *const f32,
}

impl<R: Row, const IQ4: bool> Row for Ahead<R, IQ4> {
    #[inline(always)]
    unsafe fn pair(self, c: usize, j: usize) -> (__m256i, __m256i) {
        // SAFETY: forwarded.
        unsafe { self.row.pair(c, j) }
    }

    #[inline(always)]
    unsafe fn scales(self, c: usize) -> __m256 {
        // SAFETY: forwarded, or the factors hold eight floats per chunk.
        unsafe {
            if IQ4 {
                _mm256_loadu_ps(self.scales.add(8 * c))
            } else {
                self.row.scales(c)
            }
        }
    }

    #[inline(always)]
    unsafe fn k_scales(self, c: usize) -> (__m256i, __m256i, __m256) {
        // SAFETY: forwarded.
        unsafe { self.row.k_scales(c) }
    }

    #[inline(always)]
    unsafe fn k_products(self, c: usize) -> (__m256, __m256) {
        // SAFETY: the factors hold sixteen floats per chunk of the row.
        unsafe {
            let p = self.scales.add(16 * c);
            (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        }
    }
}

/// [`super::scales_ahead`] with the loops' own decoding of the scales.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn scales_ahead_avx2(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    let (p, cb) = (row.as_ptr(), chunk_bytes(ty));
    let chunks = row.len() / cb;
    // SAFETY: `row` holds whole chunks and `out` the type's floats for each
    // (the caller's sizes).
    unsafe {
        if ty == GgmlType::IQ4_XS {
            let r = lut::<LUT_IQ4_XS>(p, false);
            for (c, o) in out.chunks_exact_mut(8).enumerate().take(chunks) {
                _mm256_storeu_ps(o.as_mut_ptr(), r.scales(c));
            }
            return;
        }
        let r = Packed { ty, p, cb };
        for (c, o) in out.chunks_exact_mut(16).enumerate().take(chunks) {
            let (ds, dm) = r.k_products(c);
            _mm256_storeu_ps(o.as_mut_ptr(), ds);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), dm);
        }
    }
}

/// [`many_packed_avx2`] of packed Q4_K, Q5_K or IQ4_XS rows whose chunks'
/// scale factors are formed ahead ([`super::scales_ahead`]: `per` floats
/// a row in `scales`).
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn many_packed_ahead_avx2(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    (scales, per): (&[f32], usize),
    acts: &[&Q8Acts],
    mut out: OutRows<'_>,
) {
    let cb = chunk_bytes(ty);
    let chunks = rb / cb;
    let n = acts.len();
    // SAFETY (all): forwarded; each row holds `chunks` whole chunks and its
    // `per` floats of `scales` the type's factors for each (the caller
    // checked both).
    for i in 0..rows.len() / rb {
        let (p, scales) = (rows[i * rb..].as_ptr(), scales[i * per..].as_ptr());
        let out = out.row(i, n);
        match ty {
            GgmlType::Q4_K => {
                // The type a constant in the row, as in its loop.
                let r = Ahead::<_, false> {
                    row: Packed {
                        ty: GgmlType::Q4_K,
                        p,
                        cb,
                    },
                    scales,
                };
                unsafe { many::<false>(GgmlType::Q4_K, chunks, r, &[], acts, out) }
            }
            GgmlType::Q5_K => {
                let r = Ahead::<_, false> {
                    row: Packed {
                        ty: GgmlType::Q5_K,
                        p,
                        cb,
                    },
                    scales,
                };
                unsafe { many::<false>(GgmlType::Q5_K, chunks, r, &[], acts, out) }
            }
            GgmlType::IQ4_XS => {
                let r = Ahead::<_, true> {
                    row: lut::<LUT_IQ4_XS>(p, false),
                    scales,
                };
                unsafe { many::<false>(GgmlType::IQ4_XS, chunks, r, &[], acts, out) }
            }
            _ => unreachable!("scales formed ahead for Q4_K, Q5_K and IQ4_XS only"),
        }
    }
}

/// Decode of packed rows of `ty` through the prefill loop with one
/// activation row (Q5_K: a packed [`Packed`] row per call), with the
/// next row's bytes prefetched.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_by_body_vnni(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => rows_by_body::<true>(t, rows, rb, acts, out)) }
}

/// [`rows_by_body_vnni`] for AVX2.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn rows_by_body_avx2(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => rows_by_body::<false>(t, rows, rb, acts, out)) }
}

#[inline(always)]
unsafe fn rows_by_body<const VNNI: bool>(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    let cb = chunk_bytes(ty);
    let chunks = rb / cb;
    let pf = crate::prefetch::distance();
    // SAFETY: each row holds `chunks` packed chunks (the caller checked
    // the sizes); the activations are arranged for the width.
    unsafe {
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
            let p = row.as_ptr();
            crate::prefetch::ahead_span(p, rb, pf);
            *o = dot::<VNNI, false, 1>(ty, (chunks, Packed { ty, p, cb }, &[]), [acts])[0];
        }
    }
}

/// Eights (VNNI) and quads of activation rows, then the one to three left; `tail` the row's
/// blocks past its `chunks` whole chunks ([`super::pack_tail`]'s layout).
#[inline(always)]
unsafe fn many<const VNNI: bool>(
    ty: GgmlType,
    chunks: usize,
    row: impl Row,
    tail: &[u8],
    acts: &[&Q8Acts],
    out: &mut [f32],
) {
    if !tail.is_empty() {
        // SAFETY: forwarded.
        return unsafe { many_rows::<VNNI, true>(ty, (chunks, row, tail), acts, out) };
    }
    // SAFETY: forwarded.
    unsafe { many_rows::<VNNI, false>(ty, (chunks, row, tail), acts, out) }
}

/// [`many`] for rows with (`TAIL`) or without blocks past their whole
/// chunks: instances of their own, so the whole-chunk loops carry no
/// branch or call for a tail.
#[inline(always)]
unsafe fn many_rows<const VNNI: bool, const TAIL: bool>(
    ty: GgmlType,
    r: (usize, impl Row, &[u8]),
    acts: &[&Q8Acts],
    out: &mut [f32],
) {
    let n = acts.len();
    let mut t = 0;
    // SAFETY (every call): forwarded; `t + N <= n` indexes `acts` and `out`.
    unsafe {
        // Eight rows share each decoded chunk on VNNI (32 registers), but
        // for Q2_K, whose half scales and eight accumulators spill there.
        while VNNI && ty != GgmlType::Q2_K && t + 8 <= n {
            let a = |i: usize| acts[t + i];
            let v = dot::<VNNI, TAIL, 8>(ty, r, [a(0), a(1), a(2), a(3), a(4), a(5), a(6), a(7)]);
            out[t..t + 8].copy_from_slice(&v);
            t += 8;
        }
        while t + 4 <= n {
            let v = dot::<VNNI, TAIL, 4>(ty, r, [acts[t], acts[t + 1], acts[t + 2], acts[t + 3]]);
            out[t..t + 4].copy_from_slice(&v);
            t += 4;
        }
        match n - t {
            1 => out[t..].copy_from_slice(&dot::<VNNI, TAIL, 1>(ty, r, [acts[t]])),
            2 => out[t..].copy_from_slice(&dot::<VNNI, TAIL, 2>(ty, r, [acts[t], acts[t + 1]])),
            3 => out[t..].copy_from_slice(&dot::<VNNI, TAIL, 3>(ty, r, [acts[t], acts[t + 1], acts[t + 2]])),
            _ => {}
        }
    }
}

/// The chunk loop of `ty` for `N` activation rows, then the tail's blocks
/// ([`tail_lanes`]) into the same lanes, then the lane sums.
#[inline(always)]
unsafe fn dot<const VNNI: bool, const TAIL: bool, const N: usize>(
    ty: GgmlType,
    (chunks, row, tail): (usize, impl Row, &[u8]),
    acts: [&Q8Acts; N],
) -> [f32; N] {
    // SAFETY (all): forwarded; the tail holds the row's blocks from
    // `8 * chunks` on.
    unsafe {
        let mut acc = if VNNI {
            body::<N>(ty, chunks, row, acts)
        } else if matches!(ty, GgmlType::Q8_0 | GgmlType::IQ4_XS | GgmlType::IQ4_NL) {
            body_avx2::<true, N>(ty, chunks, row, acts)
        } else {
            body_avx2::<false, N>(ty, chunks, row, acts)
        };
        if TAIL {
            acc = if VNNI {
                tail_vnni::<N>(ty, tail, 8 * chunks, acts, acc)
            } else {
                tail_avx2::<N>(ty, tail, 8 * chunks, acts, acc)
            };
        }
        crate::gguf::qdot::x86::lane_sums(acc)
    }
}

/// A row's tail ([`super::pack_tail`]'s layout, `k = tail.len() / block
/// bytes` blocks from block `b0` on) into lanes `0..k` of the
/// accumulators: out of line, the lanes in and out by value (the
/// whole-chunk loops keep their registers; a row has at most one tail).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
unsafe fn tail_vnni<const N: usize>(
    ty: GgmlType,
    tail: &[u8],
    b0: usize,
    acts: [&Q8Acts; N],
    acc: [__m256; N],
) -> [__m256; N] {
    // SAFETY: forwarded.
    unsafe { tail_lanes::<true, N>(ty, tail, b0, acts, acc) }
}

/// [`tail_vnni`] for AVX2.
#[target_feature(enable = "avx2,f16c")]
#[inline(never)]
unsafe fn tail_avx2<const N: usize>(
    ty: GgmlType,
    tail: &[u8],
    b0: usize,
    acts: [&Q8Acts; N],
    acc: [__m256; N],
) -> [__m256; N] {
    // SAFETY: forwarded.
    unsafe { tail_lanes::<false, N>(ty, tail, b0, acts, acc) }
}

/// The chunk term of a tail of `k < 8` blocks (Q8_0, Q4_0, MXFP4, IQ4_NL): the
/// weight and activation steps (`4k` bytes each) loaded masked into lanes
/// `0..k`, the same integer sums and offsets as the chunk loops, the same
/// `(dw * dx) * f32(i)` term, added into lanes `0..k` only (the other
/// lanes keep their bits), which is what [`super::super::combine`] does
/// for a row's partial last chunk.
#[inline(always)]
unsafe fn tail_lanes<const VNNI: bool, const N: usize>(
    ty: GgmlType,
    tail: &[u8],
    b0: usize,
    acts: [&Q8Acts; N],
    mut acc: [__m256; N],
) -> [__m256; N] {
    // Q4_1 / Q5_1: their arranged tail ([`super::q4_1`]): the `k` scales,
    // the `k` mins, then eight steps of unsigned code bytes.
    let min_type = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let (h, k) = if min_type {
        (4, tail.len() / super::q4_1::TAIL_BLOCK)
    } else {
        (head(ty), tail.len() / ty.block_bytes())
    };
    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    let low4 = _mm256_set1_epi8(0x0f);
    let mx = ty == GgmlType::MXFP4;
    // Q8_0, MXFP4 and IQ4_NL on VNNI carry +128 (packed / looked up), Q4_0 its 8.
    let shift = match ty {
        GgmlType::Q4_0 => Some(3),
        GgmlType::Q4_1 | GgmlType::Q5_1 => None,
        _ if VNNI => Some(7),
        _ => None,
    };
    // SAFETY: `tail` holds `k` blocks in the tail layout: `h * k` scale
    // bytes, then `4k` bytes per step; the 16-byte scale read stays in it
    // (at least 16 code bytes per block follow the scales). The
    // activations are arranged for the row's width: their tail's steps
    // from `32 * b0` in `qt`, and `tot`, `d` from `b0`, `k` entries each,
    // read masked.
    unsafe {
        let p = tail.as_ptr();
        let step = |base: *const u8, j: usize| _mm256_maskload_epi32(base.add(4 * k * j) as *const i32, mask);
        let mut w = [_mm256_setzero_si256(); 8];
        if ty == GgmlType::Q8_0 || min_type {
            for (j, w) in w.iter_mut().enumerate() {
                *w = step(p.add(h * k), j);
            }
        } else {
            let table = if ty == GgmlType::IQ4_NL {
                iq4_table(VNNI)
            } else {
                mx_table(VNNI)
            };
            for j in 0..4 {
                let v = step(p.add(h * k), j);
                let (lo, hi) = (
                    _mm256_and_si256(v, low4),
                    _mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                );
                (w[j], w[4 + j]) = if ty != GgmlType::Q4_0 {
                    (_mm256_shuffle_epi8(table, lo), _mm256_shuffle_epi8(table, hi))
                } else {
                    (lo, hi)
                };
            }
        }
        let dw = if mx {
            e8m0_8(p)
        } else {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        };
        for (a, acc) in acts.iter().zip(acc.iter_mut()) {
            let q0 = a.qt.as_ptr().add(QK * b0) as *const u8;
            let mut s = _mm256_setzero_si256();
            for (j, &w) in w.iter().enumerate() {
                s = if ty == GgmlType::Q4_0 || min_type || VNNI {
                    madd::<VNNI, false>(s, w, step(q0, j))
                } else {
                    madd::<VNNI, true>(s, w, step(q0, j))
                };
            }
            if let Some(shift) = shift {
                let tot = _mm256_maskload_epi32(a.tot.as_ptr().add(b0), mask);
                s = _mm256_sub_epi32(s, _mm256_sll_epi32(tot, _mm_cvtsi32_si128(shift)));
            }
            let dx = _mm256_maskload_ps(a.d.as_ptr().add(b0), mask);
            let term = if min_type {
                let m = _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * k) as *const __m128i));
                let tot = _mm256_maskload_epi32(a.tot.as_ptr().add(b0), mask);
                min_term(dw, m, dx, s, tot)
            } else {
                _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(s))
            };
            let sum = _mm256_add_ps(*acc, term);
            *acc = _mm256_blendv_ps(*acc, sum, _mm256_castsi256_ps(mask));
        }
        acc
    }
}

/// AVX2's chunk loop, step pair by step pair across the activation rows
/// (one accumulator per row): Q8_0 and IQ4 (`SIGNED`) as `|w|` times the
/// activation codes with `w`'s signs, widened per step; the unsigned codes
/// (Q4_0's, the K-quants' and Q4_1's / Q5_1's, and MXFP4's levels plus 12)
/// with their `vpmaddubsw` pairs summed in 16 bits, widened once per chunk
/// or per two steps, less the offset times the block totals (8 for Q4_0,
/// 12 for MXFP4; the K-quants and Q4_1 / Q5_1 with their own terms). Then
/// [`super::super::combine`]'s term per lane, as `body`.
#[inline(always)]
unsafe fn body_avx2<const SIGNED: bool, const N: usize>(
    ty: GgmlType,
    chunks: usize,
    row: impl Row,
    acts: [&Q8Acts; N],
) -> [__m256; N] {
    let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K);
    let min_type = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let mx = ty == GgmlType::MXFP4;
    // Unsigned codes' 16-bit pair sums are widened once per chunk (nibbles:
    // a lane sums eight pairs of at most 2 · 15 · 127, 30480 < 2^15) or
    // once per two steps (four pairs: Q5_K's and Q5_1's 5-bit codes, at
    // most 4 · 2 · 31 · 127 = 31496; MXFP4's levels offset by 12 into
    // 0..=24, 4 · 2 · 24 · 127 = 24384); the signed codes' every step.
    let per_half = matches!(ty, GgmlType::Q5_K | GgmlType::Q5_1 | GgmlType::MXFP4);
    let bias = _mm256_set1_epi8(MX_BIAS as i8);
    let ones = _mm256_set1_epi16(1);
    let count = _mm_cvtsi32_si128(3);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY: as `body`.
    unsafe {
        if matches!(ty, GgmlType::Q6_K | GgmlType::Q2_K | GgmlType::Q3_K) {
            return body_avx2_halves(ty, chunks, row, acts);
        }
        for c in 0..chunks {
            // 32-bit sums, and the 16-bit ones not yet widened.
            let mut s = [_mm256_setzero_si256(); N];
            let mut t = [_mm256_setzero_si256(); N];
            for j in 0..4 {
                let (w0, w1) = row.pair(c, j);
                let (u0, u1) = if SIGNED {
                    (_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(w1, w1))
                } else if mx {
                    (_mm256_add_epi8(w0, bias), _mm256_add_epi8(w1, bias))
                } else {
                    (w0, w1)
                };
                for ((a, s), t) in acts.iter().zip(s.iter_mut()).zip(t.iter_mut()) {
                    let q = a.qt.as_ptr().add(c * CHUNK + 32 * j);
                    let x0 = _mm256_loadu_si256(q as *const __m256i);
                    let x1 = _mm256_loadu_si256(q.add(128) as *const __m256i);
                    if SIGNED {
                        let (x0, x1) = (_mm256_sign_epi8(x0, w0), _mm256_sign_epi8(x1, w1));
                        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, x0), ones);
                        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, x1), ones);
                        *s = _mm256_add_epi32(*s, _mm256_add_epi32(p0, p1));
                    } else {
                        let p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1));
                        *t = _mm256_add_epi16(*t, p);
                    }
                }
                if per_half && j % 2 == 1 {
                    for (s, t) in s.iter_mut().zip(t.iter_mut()) {
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(*t, ones));
                        *t = _mm256_setzero_si256();
                    }
                }
            }
            let z = _mm256_setzero_ps();
            let (dw, dmin) = if min_type {
                (row.scales(c), row.k_scales(c).2)
            } else if k_quant {
                (z, z)
            } else {
                (row.scales(c), z)
            };
            let kp = if k_quant { row.k_products(c) } else { (z, z) };
            for (((a, acc), s), t) in acts.iter().zip(acc.iter_mut()).zip(s).zip(t) {
                let dx = _mm256_loadu_ps(a.d.as_ptr().add(8 * c));
                let i = if SIGNED || per_half {
                    s
                } else {
                    _mm256_madd_epi16(t, ones)
                };
                let tot = || _mm256_loadu_si256(a.tot.as_ptr().add(8 * c) as *const __m256i);
                if min_type {
                    *acc = _mm256_add_ps(*acc, min_term(dw, dmin, dx, i, tot()));
                    continue;
                }
                if k_quant {
                    *acc = _mm256_add_ps(*acc, k_term_of(kp, dx, i, tot()));
                    continue;
                }
                let i = if SIGNED {
                    i
                } else if mx {
                    less_mx_bias(i, tot())
                } else {
                    _mm256_sub_epi32(i, _mm256_sll_epi32(tot(), count))
                };
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i)));
            }
        }
        acc
    }
}

/// AVX2's loop of the types with a scale per half (Q6_K, Q2_K, Q3_K): per
/// activation row, the first halves' sums `lo` and the second halves'
/// `hi`, `vpmaddubsw` pairs added in 16 bits before each widening, then
/// [`q6_k_term`] or [`super::q23k::term`]. Q6_K widens every two steps (a
/// pair is at most 2 · 63 · 127 = 16002 in magnitude, two 32004 < 2^15:
/// exact); Q2_K and Q3_K once per chunk (codes of at most 7: four pairs
/// are at most 4 · 2 · 7 · 127 = 7112).
#[inline(always)]
unsafe fn body_avx2_halves<const N: usize>(
    ty: GgmlType,
    chunks: usize,
    row: impl Row,
    acts: [&Q8Acts; N],
) -> [__m256; N] {
    let k23 = matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY: as `body`.
    unsafe {
        for c in 0..chunks {
            let mut lo = [_mm256_setzero_si256(); N];
            let mut hi = [_mm256_setzero_si256(); N];
            for j in (0..4).step_by(2) {
                let (a0, b0) = row.pair(c, j);
                let (a1, b1) = row.pair(c, j + 1);
                for ((a, lo), hi) in acts.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
                    let q = a.qt.as_ptr().add(c * CHUNK + 32 * j);
                    let x = |k: usize| _mm256_loadu_si256(q.add(32 * k) as *const __m256i);
                    let pl = _mm256_add_epi16(_mm256_maddubs_epi16(a0, x(0)), _mm256_maddubs_epi16(a1, x(1)));
                    let ph = _mm256_add_epi16(_mm256_maddubs_epi16(b0, x(4)), _mm256_maddubs_epi16(b1, x(5)));
                    if k23 {
                        // Widened once per chunk, below.
                        *lo = _mm256_add_epi16(*lo, pl);
                        *hi = _mm256_add_epi16(*hi, ph);
                    } else {
                        *lo = _mm256_add_epi32(*lo, _mm256_madd_epi16(pl, ones));
                        *hi = _mm256_add_epi32(*hi, _mm256_madd_epi16(ph, ones));
                    }
                }
            }
            if k23 {
                for (lo, hi) in lo.iter_mut().zip(hi.iter_mut()) {
                    *lo = _mm256_madd_epi16(*lo, ones);
                    *hi = _mm256_madd_epi16(*hi, ones);
                }
                let hs = row.half_scales(c);
                for (((a, acc), lo), hi) in acts.iter().zip(acc.iter_mut()).zip(lo).zip(hi) {
                    *acc = _mm256_add_ps(*acc, super::q23k::term(ty, c, hs, a, lo, hi));
                }
                continue;
            }
            let (sc0, sc1, _) = row.k_scales(c);
            let ks = (row.scales(c), sc0, sc1);
            for (((a, acc), lo), hi) in acts.iter().zip(acc.iter_mut()).zip(lo).zip(hi) {
                *acc = _mm256_add_ps(*acc, q6_k_term(c, ks, a, lo, hi));
            }
        }
        acc
    }
}

/// The VNNI chunk loop: block `b`'s integer sum in lane `b`, less the
/// activation total times the type's offset (Q4_0's 8; Q8_0's and MXFP4's
/// codes carry +128; Q4_K's sub-block mins in its own term), then
/// [`super::super::combine`]'s term per lane.
#[inline(always)]
unsafe fn body<const N: usize>(ty: GgmlType, chunks: usize, row: impl Row, acts: [&Q8Acts; N]) -> [__m256; N] {
    let shift = if ty == GgmlType::Q4_0 { 3 } else { 7 };
    let count = _mm_cvtsi32_si128(shift);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY: `row` holds `chunks` chunks, and the activations' `qt`,
    // `tot`, `d` as many (the caller checked the widths: codes and `qt`
    // one byte per element, the others one entry per block).
    unsafe {
        for c in 0..chunks {
            let (w, dw) = row.chunk(c);
            let (sc, mn, dmin) = if matches!(
                ty,
                GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q4_1 | GgmlType::Q5_1
            ) {
                row.k_scales(c)
            } else {
                (_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_ps())
            };
            let k23 = matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K);
            let hs = if k23 {
                row.half_scales(c)
            } else {
                ([_mm256_setzero_si256(); 4], _mm256_setzero_ps(), _mm256_setzero_ps())
            };
            for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                let q0 = a.qt.as_ptr().add(c * CHUNK) as *const u8;
                let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                let mut s0 = _mm256_setzero_si256();
                let mut s1 = _mm256_setzero_si256();
                if ty == GgmlType::Q6_K || k23 {
                    // The halves apart: steps 0..4 and 4..8.
                    for j in 0..4 {
                        s0 = madd::<true, false>(s0, w[j], q(j));
                        s1 = madd::<true, false>(s1, w[4 + j], q(4 + j));
                    }
                    let t = if k23 {
                        super::q23k::term(ty, c, hs, a, s0, s1)
                    } else {
                        q6_k_term(c, (dw, sc, mn), a, s0, s1)
                    };
                    *acc = _mm256_add_ps(*acc, t);
                    continue;
                }
                for j in (0..8).step_by(2) {
                    s0 = madd::<true, false>(s0, w[j], q(j));
                    s1 = madd::<true, false>(s1, w[j + 1], q(j + 1));
                }
                let i = _mm256_add_epi32(s0, s1);
                *acc = _mm256_add_ps(*acc, whole_term(ty, (dw, sc, mn, dmin), a, c, i, Some(count)));
            }
        }
        acc
    }
}

/// [`super::super::combine`]'s term on the eight lanes of activation row
/// `a`'s chunk `c`, for the types whose blocks end in one integer sum `i`
/// (not Q6_K's, Q2_K's or Q3_K's halves): less the activation totals
/// shifted by `count` (Q4_0's 8; the +128 of Q8_0's and the table types'
/// codes on VNNI), or Q4_K's and Q5_K's scale and min term; `(dw, sc, mn,
/// dmin)` the weight chunk's scales (IQ4_XS's `dw` is `d · (ls - 32)`).
#[inline(always)]
unsafe fn whole_term(
    ty: GgmlType,
    (dw, sc, mn, dmin): (__m256, __m256i, __m256i, __m256),
    a: &Q8Acts,
    c: usize,
    i: __m256i,
    count: Option<__m128i>,
) -> __m256 {
    // SAFETY: the caller's chunk index is in range; arranged activations
    // hold eight totals and eight scales per chunk.
    unsafe {
        let tot = || _mm256_loadu_si256(a.tot.as_ptr().add(8 * c) as *const __m256i);
        let dx = _mm256_loadu_ps(a.d.as_ptr().add(8 * c));
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
            return k_term(sc, mn, dw, dmin, dx, i, tot());
        }
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            // Unsigned codes, no offset; `dmin` holds the blocks' mins.
            return min_term(dw, dmin, dx, i, tot());
        }
        let i = match count {
            Some(count) => _mm256_sub_epi32(i, _mm256_sll_epi32(tot(), count)),
            None => i,
        };
        _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i))
    }
}

/// [`body_pair`] for Q6_K: each row's two half sums kept apart (steps
/// `0..4` and `4..8`, each half with its own scale), then [`q6_k_term`],
/// as [`body`] forms it.
#[inline(always)]
unsafe fn body_pair_halves<const N: usize>(
    chunks: usize,
    (ra, rb): (impl Row, impl Row),
    acts: [&Q8Acts; N],
) -> ([__m256; N], [__m256; N]) {
    let mut acc_a = [_mm256_setzero_ps(); N];
    let mut acc_b = [_mm256_setzero_ps(); N];
    // SAFETY: as in `body_pair`; arranged activations also hold sixteen
    // half offsets per chunk.
    unsafe {
        for c in 0..chunks {
            let z = _mm256_setzero_si256();
            let (mut sa, mut sb) = ([[z; 2]; N], [[z; 2]; N]);
            for j in 0..4 {
                let (a0, a4) = ra.pair(c, j);
                let (b0, b4) = rb.pair(c, j);
                for r in 0..N {
                    let q = acts[r].qt.as_ptr().add(c * CHUNK) as *const u8;
                    let x = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                    let y = _mm256_loadu_si256(q.add(32 * (4 + j)) as *const __m256i);
                    sa[r][0] = madd::<true, false>(sa[r][0], a0, x);
                    sa[r][1] = madd::<true, false>(sa[r][1], a4, y);
                    sb[r][0] = madd::<true, false>(sb[r][0], b0, x);
                    sb[r][1] = madd::<true, false>(sb[r][1], b4, y);
                }
            }
            let (sc, mn, _) = ra.k_scales(c);
            let ka = (ra.scales(c), sc, mn);
            let (sc, mn, _) = rb.k_scales(c);
            let kb = (rb.scales(c), sc, mn);
            for r in 0..N {
                acc_a[r] = _mm256_add_ps(acc_a[r], q6_k_term(c, ka, acts[r], sa[r][0], sa[r][1]));
                acc_b[r] = _mm256_add_ps(acc_b[r], q6_k_term(c, kb, acts[r], sb[r][0], sb[r][1]));
            }
        }
    }
    (acc_a, acc_b)
}

/// Two packed rows of `ty` (whole chunks, a type [`super::pairs_pay_on`]
/// takes) against the activation rows, four at a time, into `oa` and `ob`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn pair_packed_vnni(
    ty: GgmlType,
    (a, b): (&[u8], &[u8]),
    acts: &[&Q8Acts],
    oa: &mut [f32],
    ob: &mut [f32],
) {
    let cb = chunk_bytes(ty);
    let chunks = a.len() / cb;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // The whole chunks, and each row's blocks past them if any
    // ([`super::pack_tail`]).
    let span = (chunks, (&a[chunks * cb..], &b[chunks * cb..]));
    // SAFETY (all): forwarded; both rows hold `chunks` whole chunks, then
    // their tails.
    unsafe {
        match ty {
            GgmlType::MXFP4 => pair_rows(GgmlType::MXFP4, span, lut_pair::<LUT_MXFP4>(pa, pb), acts, (oa, ob)),
            GgmlType::IQ4_XS => pair_rows(GgmlType::IQ4_XS, span, lut_pair::<LUT_IQ4_XS>(pa, pb), acts, (oa, ob)),
            GgmlType::IQ4_NL => pair_rows(GgmlType::IQ4_NL, span, lut_pair::<LUT_IQ4_NL>(pa, pb), acts, (oa, ob)),
            _ => each_type!(ty, t => pair_rows(
                t,
                span,
                (Packed { ty: t, p: pa, cb }, Packed { ty: t, p: pb, cb }),
                acts,
                (oa, ob),
            )),
        }
    }
}

/// A packed row of a table type at `p` (`flip`: its levels offset by 128).
fn lut<const KIND: u8>(p: *const u8, flip: bool) -> PackedLut<KIND> {
    PackedLut { p, flip }
}

/// Two packed rows of a table type, looked up offset by 128 (VNNI).
fn lut_pair<const KIND: u8>(pa: *const u8, pb: *const u8) -> (PackedLut<KIND>, PackedLut<KIND>) {
    (lut(pa, true), lut(pb, true))
}

/// Octets of activation rows, then a quad, then the one to three left, for
/// a pair of rows (eight rows share each decoded weight step); each row's
/// tail, if any, into its lanes after the chunks ([`tail_vnni`]), as the
/// one-row loop adds it.
#[inline(always)]
unsafe fn pair_rows<R: Row>(
    ty: GgmlType,
    (chunks, (tail_a, tail_b)): (usize, (&[u8], &[u8])),
    rows: (R, R),
    acts: &[&Q8Acts],
    out: (&mut [f32], &mut [f32]),
) {
    let (oa, ob) = out;
    let mut t = 0;
    macro_rules! run {
        ($n:literal) => {{
            let a: [&Q8Acts; $n] = std::array::from_fn(|k| acts[t + k]);
            // SAFETY: forwarded; `t + $n` rows are left.
            let (mut x, mut y) = unsafe { body_pair::<$n>(ty, chunks, rows, a) };
            if !tail_a.is_empty() {
                // SAFETY: forwarded; each tail holds the row's blocks from
                // `8 * chunks` on.
                unsafe {
                    x = tail_vnni::<$n>(ty, tail_a, 8 * chunks, a, x);
                    y = tail_vnni::<$n>(ty, tail_b, 8 * chunks, a, y);
                }
            }
            // SAFETY: register arithmetic on this target.
            let (x, y) = unsafe {
                (
                    crate::gguf::qdot::x86::lane_sums(x),
                    crate::gguf::qdot::x86::lane_sums(y),
                )
            };
            oa[t..t + $n].copy_from_slice(&x);
            ob[t..t + $n].copy_from_slice(&y);
        }};
    }
    // Q6_K keeps two half sums per weight row and activation row: eight
    // activation rows would hold 32 integer accumulators for the pair.
    let octets = ty != GgmlType::Q6_K;
    while octets && t + 8 <= acts.len() {
        run!(8);
        t += 8;
    }
    while t + 4 <= acts.len() {
        run!(4);
        t += 4;
    }
    match acts.len() - t {
        1 => run!(1),
        2 => run!(2),
        3 => run!(3),
        _ => {}
    }
}

/// The VNNI chunk loop for two weight rows at once: each activation step
/// is loaded once and multiplied into both rows' sums (one activation load
/// per two `vpdpbusd` instead of one: a row against eight activation rows
/// reloads every activation byte per weight row, and its loads, not its
/// multiplies, bounded it), then [`whole_term`] per row and lane. Integer
/// sums are exact in any order, so each row's lanes are [`body`]'s bits.
#[inline(always)]
unsafe fn body_pair<const N: usize>(
    ty: GgmlType,
    chunks: usize,
    (ra, rb): (impl Row, impl Row),
    acts: [&Q8Acts; N],
) -> ([__m256; N], [__m256; N]) {
    if ty == GgmlType::Q6_K {
        // SAFETY: forwarded.
        return unsafe { body_pair_halves::<N>(chunks, (ra, rb), acts) };
    }
    let mut acc_a = [_mm256_setzero_ps(); N];
    let mut acc_b = [_mm256_setzero_ps(); N];
    let scaled = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K);
    // Sums of codes offset by 128 (Q4_0's by 8) start at the activation
    // totals' offset, once for both rows; Q4_K's and Q5_K's unsigned
    // nibbles take theirs in `k_term`.
    let offset = !matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K);
    // SAFETY: both rows hold `chunks` chunks and the activations' `qt`,
    // `tot`, `toff`, `d` as many (the caller checked the widths).
    unsafe {
        for c in 0..chunks {
            let start: [__m256i; N] = std::array::from_fn(|r| {
                if !offset {
                    return _mm256_setzero_si256();
                }
                let t = _mm256_loadu_si256(acts[r].toff.as_ptr().add(8 * c) as *const __m256i);
                if ty == GgmlType::Q4_0 {
                    _mm256_srai_epi32::<4>(t)
                } else {
                    t
                }
            });
            let mut sa = start;
            let mut sb = start;
            for j in 0..4 {
                let (a0, a4) = ra.pair(c, j);
                let (b0, b4) = rb.pair(c, j);
                for r in 0..N {
                    let q = acts[r].qt.as_ptr().add(c * CHUNK) as *const u8;
                    let x = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                    let y = _mm256_loadu_si256(q.add(32 * (4 + j)) as *const __m256i);
                    sa[r] = madd::<true, false>(madd::<true, false>(sa[r], a0, x), a4, y);
                    sb[r] = madd::<true, false>(madd::<true, false>(sb[r], b0, x), b4, y);
                }
            }
            let none = (_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_ps());
            let (sc, mn, dmin) = if scaled { ra.k_scales(c) } else { none };
            let ka = (ra.scales(c), sc, mn, dmin);
            let (sc, mn, dmin) = if scaled { rb.k_scales(c) } else { none };
            let kb = (rb.scales(c), sc, mn, dmin);
            for r in 0..N {
                acc_a[r] = _mm256_add_ps(acc_a[r], whole_term(ty, ka, acts[r], c, sa[r], None));
                acc_b[r] = _mm256_add_ps(acc_b[r], whole_term(ty, kb, acts[r], c, sb[r], None));
            }
        }
    }
    (acc_a, acc_b)
}
