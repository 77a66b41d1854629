//! x86-64 integer sums: 32 weight codes decoded into one 256-bit register
//! of unsigned bytes, multiplied by the 32 activation codes either with
//! `vpmaddubsw` + `vpmaddwd` (AVX2) or with one `vpdpbusd` (AVX-512 VNNI),
//! giving eight i32 lanes of four products each; four blocks' lanes are
//! then folded with `vphaddd` into per-half sums. Q8_0's signed codes go
//! through `vpsignb` on AVX2 (|w| times q·sign(w)) and through an offset of
//! 128 on VNNI (Σ (w + 128) q − 128 Σ q), exact either way.
//!
//! The f32 terms of a whole chunk of eight blocks are formed in one 256-bit
//! register, lane `b` for block `b`, with the same operations in the same
//! order as [`super::combine`] (which the last, partial chunk of a row
//! still goes through), so the lanes hold the reference's bits.

use std::arch::x86_64::*;

use super::super::types::{f16_le, scale_min_k4, GgmlType, QK, QK_K};
use super::{combine, Q8Acts, Raw};

/// [`super::dot`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2; `row` must hold `acts.len()` elements of `ty`.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_avx2(ty: GgmlType, row: &[u8], acts: &Q8Acts) -> f32 {
    // SAFETY: forwarded.
    unsafe { row_dot::<false>(ty, row, acts) }
}

/// [`super::dot`] compiled for AVX-512 VNNI.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and VNNI; as [`dot_avx2`] otherwise.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_avx512vnni(ty: GgmlType, row: &[u8], acts: &Q8Acts) -> f32 {
    // SAFETY: forwarded.
    unsafe { row_dot::<true>(ty, row, acts) }
}

/// Eight i32 lanes, lane `i` the sum of `codes[4i..4i + 4] * q[4i..4i + 4]`
/// (`codes` unsigned, at most 63 or, on VNNI, 255).
#[inline(always)]
unsafe fn mul<const VNNI: bool>(codes: __m256i, q: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, q)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(codes, q), _mm256_set1_epi16(1))
    }
}

/// Half sums of four blocks' lanes: `[b0 lo, b1 lo, b2 lo, b3 lo, b0 hi, b1 hi, b2 hi, b3 hi]`.
#[inline(always)]
unsafe fn halves4(v: &[__m256i]) -> __m256i {
    let a = _mm256_hadd_epi32(v[0], v[1]);
    let b = _mm256_hadd_epi32(v[2], v[3]);
    _mm256_hadd_epi32(a, b)
}

#[inline(always)]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer covers 32 bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// 32 nibble codes from 16 bytes: elements 0..16 the low nibbles, 16..32 the high.
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer covers 16 bytes.
    let x = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0f);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m))
}

/// `0x10` in byte `i` where bit `i` of the little-endian u32 at `p` is set.
#[inline(always)]
unsafe fn high_bits32(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer covers 4 bytes.
    let bits = unsafe { (p as *const u32).read_unaligned() };
    let v = _mm256_set1_epi32(bits as i32);
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bytes = _mm256_shuffle_epi8(v, spread);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The integer half sums of a chunk's `nblocks` blocks (see
/// [`super::Sums::raw`]), as `(lo, hi)` registers, lane `b` for block `b`
/// (VNNI's Q8_0 sums still carry the +128 offset).
#[inline(always)]
unsafe fn sums<const VNNI: bool>(ty: GgmlType, chunk: &[u8], q: &[i8], nblocks: usize) -> (__m256i, __m256i) {
    let mut v = [_mm256_setzero_si256(); 8];
    let c = chunk.as_ptr();
    let qp = |b: usize| -> __m256i {
        // SAFETY: `q` holds 32 codes per block of the chunk.
        unsafe { load32(q.as_ptr().add(b * QK) as *const u8) }
    };
    let low4 = _mm256_set1_epi8(0x0f);
    // SAFETY (every load below): `chunk` holds `nblocks` blocks of `ty`, so
    // each block's fields are in bounds at the offsets of its layout.
    unsafe {
        match ty {
            GgmlType::Q8_0 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    let w = load32(c.add(34 * b + 2));
                    let x = qp(b);
                    *vb = if VNNI {
                        mul::<true>(_mm256_xor_si256(w, _mm256_set1_epi8(-128)), x)
                    } else {
                        mul::<false>(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
                    };
                }
            }
            GgmlType::Q4_0 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    *vb = mul::<VNNI>(nibbles16(c.add(18 * b + 2)), qp(b));
                }
            }
            GgmlType::Q4_1 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    *vb = mul::<VNNI>(nibbles16(c.add(20 * b + 4)), qp(b));
                }
            }
            GgmlType::Q5_0 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    let p = c.add(22 * b);
                    let codes = _mm256_or_si256(nibbles16(p.add(6)), high_bits32(p.add(2)));
                    *vb = mul::<VNNI>(codes, qp(b));
                }
            }
            GgmlType::Q5_1 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    let p = c.add(24 * b);
                    let codes = _mm256_or_si256(nibbles16(p.add(8)), high_bits32(p.add(4)));
                    *vb = mul::<VNNI>(codes, qp(b));
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let k5 = ty == GgmlType::Q5_K;
                let qs = c.add(if k5 { 48 } else { 16 });
                let qh = if k5 { load32(c.add(16)) } else { _mm256_setzero_si256() };
                let one = _mm256_set1_epi8(1);
                for i in 0..4 {
                    let x = load32(qs.add(32 * i));
                    let mut lo = _mm256_and_si256(x, low4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low4);
                    if k5 {
                        let bit = |j: i32| {
                            let s = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j));
                            _mm256_slli_epi16(_mm256_and_si256(s, one), 4)
                        };
                        lo = _mm256_or_si256(lo, bit(2 * i as i32));
                        hi = _mm256_or_si256(hi, bit(2 * i as i32 + 1));
                    }
                    v[2 * i] = mul::<VNNI>(lo, qp(2 * i));
                    v[2 * i + 1] = mul::<VNNI>(hi, qp(2 * i + 1));
                }
            }
            GgmlType::Q6_K => {
                let three = _mm256_set1_epi8(3);
                for h in 0..2 {
                    let ql0 = load32(c.add(64 * h));
                    let ql1 = load32(c.add(64 * h + 32));
                    let qh = load32(c.add(128 + 32 * h));
                    let high = |s: i32| {
                        let x = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                        _mm256_slli_epi16(_mm256_and_si256(x, three), 4)
                    };
                    let codes = [
                        _mm256_or_si256(_mm256_and_si256(ql0, low4), high(0)),
                        _mm256_or_si256(_mm256_and_si256(ql1, low4), high(2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), high(4)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), high(6)),
                    ];
                    for (k, cd) in codes.into_iter().enumerate() {
                        v[4 * h + k] = mul::<VNNI>(cd, qp(4 * h + k));
                    }
                }
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no integer sums"),
        }
        let h0 = halves4(&v[0..4]);
        let h1 = halves4(&v[4..8]);
        (
            _mm256_permute2x128_si256(h0, h1, 0x20),
            _mm256_permute2x128_si256(h0, h1, 0x31),
        )
    }
}

/// The activation half sums of eight blocks from `s16` (interleaved
/// `lo, hi` per block), as `(lo, hi)` registers.
#[inline(always)]
unsafe fn half_sums(s16: *const i32) -> (__m256i, __m256i) {
    // SAFETY: the caller's pointer covers 16 sums.
    unsafe {
        let idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        let a = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(s16 as *const __m256i), idx);
        let b = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(s16.add(8) as *const __m256i), idx);
        (
            _mm256_permute2x128_si256(a, b, 0x20),
            _mm256_permute2x128_si256(a, b, 0x31),
        )
    }
}

/// Eight f16 fields `stride` bytes apart, widened.
#[inline(always)]
unsafe fn f16x8(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: the caller's pointer covers eight blocks of `stride` bytes.
    unsafe {
        let h = |b: usize| (p.add(b * stride) as *const i16).read_unaligned();
        _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)))
    }
}

/// The f32 terms of a full chunk (eight blocks), lane `b` for block `b`:
/// [`super::combine`]'s operations, in its order.
#[inline(always)]
unsafe fn terms(ty: GgmlType, chunk: &[u8], lo: __m256i, hi: __m256i, s: (__m256i, __m256i), dx: __m256) -> __m256 {
    let c = chunk.as_ptr();
    let f32s = _mm256_cvtepi32_ps;
    // SAFETY: `chunk` holds eight blocks (or one super-block) of `ty`.
    unsafe {
        let raw = _mm256_add_epi32(lo, hi);
        let total = _mm256_add_epi32(s.0, s.1);
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => {
                let (bs, off) = match ty {
                    GgmlType::Q8_0 => (34, 0),
                    GgmlType::Q4_0 => (18, 8),
                    _ => (22, 16),
                };
                let i = _mm256_sub_epi32(raw, _mm256_mullo_epi32(total, _mm256_set1_epi32(off)));
                _mm256_mul_ps(_mm256_mul_ps(f16x8(c, bs), dx), f32s(i))
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                let bs = if ty == GgmlType::Q4_1 { 20 } else { 24 };
                let (d, m) = (f16x8(c, bs), f16x8(c.add(2), bs));
                _mm256_add_ps(
                    _mm256_mul_ps(_mm256_mul_ps(d, dx), f32s(raw)),
                    _mm256_mul_ps(_mm256_mul_ps(m, dx), f32s(total)),
                )
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let d = _mm256_set1_ps(f16_le([chunk[0], chunk[1]]));
                let dmin = _mm256_set1_ps(f16_le([chunk[2], chunk[3]]));
                let scales: &[u8; 12] = chunk[4..16].try_into().expect("12 scale bytes");
                let (mut sc, mut mn) = ([0i32; 8], [0i32; 8]);
                for j in 0..8 {
                    let (a, b) = scale_min_k4(scales, j);
                    (sc[j], mn[j]) = (a as i32, b as i32);
                }
                let i = _mm256_mullo_epi32(_mm256_loadu_si256(sc.as_ptr() as *const __m256i), raw);
                let m = _mm256_mullo_epi32(_mm256_loadu_si256(mn.as_ptr() as *const __m256i), total);
                _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(d, dx), f32s(i)),
                    _mm256_mul_ps(_mm256_mul_ps(dmin, dx), f32s(m)),
                )
            }
            GgmlType::Q6_K => {
                let d = _mm256_set1_ps(f16_le([chunk[208], chunk[209]]));
                let bytes = _mm_loadu_si128(c.add(192) as *const __m128i);
                let split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                let eo = _mm_shuffle_epi8(bytes, split);
                let sc0 = _mm256_cvtepi8_epi32(eo);
                let sc1 = _mm256_cvtepi8_epi32(_mm_srli_si128(eo, 8));
                let t = _mm256_set1_epi32(32);
                let i = _mm256_add_epi32(
                    _mm256_mullo_epi32(sc0, _mm256_sub_epi32(lo, _mm256_mullo_epi32(t, s.0))),
                    _mm256_mullo_epi32(sc1, _mm256_sub_epi32(hi, _mm256_mullo_epi32(t, s.1))),
                );
                _mm256_mul_ps(_mm256_mul_ps(d, dx), f32s(i))
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no integer terms"),
        }
    }
}

/// The row loop: full chunks in registers, a partial last chunk through
/// [`combine`], then the reference's lane reduction.
#[inline(always)]
unsafe fn row_dot<const VNNI: bool>(ty: GgmlType, row: &[u8], acts: &Q8Acts) -> f32 {
    let super_blocks = ty.block_elems() == QK_K;
    let chunk_bytes = if super_blocks {
        ty.block_bytes()
    } else {
        8 * ty.block_bytes()
    };
    let offset = VNNI && ty == GgmlType::Q8_0;
    // SAFETY: `row` holds `acts.len()` elements of `ty` (the caller's
    // promise), so every chunk's activations and sums are in bounds.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut lanes = [0.0f32; 8];
        let mut b0 = 0;
        for chunk in row.chunks(chunk_bytes) {
            let k = if super_blocks {
                8
            } else {
                chunk.len() / ty.block_bytes()
            };
            let q = &acts.qs[b0 * QK..(b0 + k) * QK];
            let (mut lo, mut hi) = sums::<VNNI>(ty, chunk, q, k);
            if k == 8 {
                let s = half_sums(acts.s16.as_ptr().add(2 * b0));
                if offset {
                    lo = _mm256_sub_epi32(lo, _mm256_slli_epi32(s.0, 7));
                    hi = _mm256_sub_epi32(hi, _mm256_slli_epi32(s.1, 7));
                }
                let dx = _mm256_loadu_ps(acts.d.as_ptr().add(b0));
                acc = _mm256_add_ps(acc, terms(ty, chunk, lo, hi, s, dx));
            } else {
                // The last chunk of a row that is not a multiple of 256.
                let s16 = &acts.s16[2 * b0..2 * (b0 + k)];
                let mut raw = Raw::default();
                _mm256_storeu_si256(raw.lo.as_mut_ptr() as *mut __m256i, lo);
                _mm256_storeu_si256(raw.hi.as_mut_ptr() as *mut __m256i, hi);
                if offset {
                    for b in 0..k {
                        raw.lo[b] -= 128 * s16[2 * b];
                        raw.hi[b] -= 128 * s16[2 * b + 1];
                    }
                }
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
                combine(ty, chunk, k, &raw, &acts.d[b0..b0 + k], s16, &mut lanes);
                acc = _mm256_loadu_ps(lanes.as_ptr());
            }
            b0 += k;
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
    }
}
