//! x86-64 integer sums: 32 weight codes decoded into one 256-bit register
//! of unsigned bytes, multiplied by the 32 activation codes either with
//! `vpmaddubsw` + `vpmaddwd` (AVX2) or with one `vpdpbusd` (AVX-512 VNNI),
//! giving eight i32 lanes of four products each; four blocks' lanes are
//! then folded with `vphaddd` into per-half sums. Q8_0's signed codes go
//! through `vpsignb` on AVX2 (|w| times q·sign(w)) and through an offset of
//! 128 on VNNI (Σ (w + 128) q − 128 Σ q), exact either way. MXFP4's
//! nibbles become their signed values (`kvalues_mxfp4`, -12..=12) by one
//! `vpshufb` table lookup and go through `vpsignb` on both; so do IQ4_NL's
//! and IQ4_XS's (`kvalues_iq4nl`, -127..=113: a `vpmaddubsw` pair is at
//! most 2 · 127 · 127 = 32258, inside i16).
//!
//! The f32 terms of a whole chunk of eight blocks are formed in one 256-bit
//! register, lane `b` for block `b`, with the same operations in the same
//! order as [`super::combine`] (which the last, partial chunk of a row
//! still goes through), so the lanes hold the reference's bits.

use std::arch::x86_64::*;

use super::super::types::{iq4_xs_scale, q3_k_scale, scale_min_k4, GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4, QK, QK_K};
use super::{combine, Q8Acts, Raw};

/// [`super::dot`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2; `row` must hold `acts.len()` elements of `ty`.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_avx2(ty: GgmlType, row: &[u8], acts: &Q8Acts) -> f32 {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => rows_dot::<false, 1>(t, row, [acts])[0]) }
}

/// [`super::dot_rows`] compiled for AVX2 (`rb` bytes per row).
///
/// # Safety
/// As [`dot_avx2`], for every row.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_rows_avx2(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe {
        each_type!(ty, t => {
            for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
                *o = rows_dot::<false, 1>(t, row, [acts])[0];
            }
        })
    }
}

/// [`super::dot_rows`] compiled for AVX-512 VNNI.
///
/// # Safety
/// As [`dot_avx512vnni`], for every row.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_rows_avx512vnni(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe {
        each_type!(ty, t => {
            for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
                *o = rows_dot::<true, 1>(t, row, [acts])[0];
            }
        })
    }
}

/// [`super::dot4`] compiled for AVX2.
///
/// # Safety
/// As [`dot_avx2`], for each of the four activation rows.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot4_avx2(ty: GgmlType, row: &[u8], acts: [&Q8Acts; 4]) -> [f32; 4] {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => rows_dot::<false, 4>(t, row, acts)) }
}

/// [`super::dot4`] compiled for AVX-512 VNNI.
///
/// # Safety
/// As [`dot_avx512vnni`], for each of the four activation rows.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_avx512vnni(ty: GgmlType, row: &[u8], acts: [&Q8Acts; 4]) -> [f32; 4] {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => rows_dot::<true, 4>(t, row, acts)) }
}

/// [`super::dot`] compiled for AVX-512 VNNI.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and VNNI; as [`dot_avx2`] otherwise.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_avx512vnni(ty: GgmlType, row: &[u8], acts: &Q8Acts) -> f32 {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => rows_dot::<true, 1>(t, row, [acts])[0]) }
}

/// Eight i32 lanes, lane `i` the sum of `codes[4i..4i + 4] * q[4i..4i + 4]`
/// (`codes` unsigned, at most 63, or 128 for a Q8_0 magnitude on AVX2, or,
/// on VNNI, 255).
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

/// 32 nibble codes from 16 bytes: elements 0..16 the low nibbles, 16..32
/// the high. The bytes go to both halves of the register; the upper half
/// is shifted right by 4 within 64-bit lanes (a byte's high nibble comes
/// down, its neighbour's bits land above it and are masked off).
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer covers 16 bytes.
    let x = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i)) };
    let shifted = _mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0f))
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

/// The weight codes of a chunk's `nblocks` blocks, one register per block:
/// unsigned codes, except MXFP4's signed values and Q8_0's signed bytes
/// (AVX2) or bytes offset by 128 (VNNI, so they are unsigned too). Decoded
/// once per chunk and multiplied by every activation row the chunk meets.
#[inline(always)]
unsafe fn decode<const VNNI: bool>(ty: GgmlType, chunk: &[u8], nblocks: usize) -> [__m256i; 8] {
    let mut v = [_mm256_setzero_si256(); 8];
    let c = chunk.as_ptr();
    let low4 = _mm256_set1_epi8(0x0f);
    // SAFETY (every load below): `chunk` holds `nblocks` blocks of `ty`, so
    // each block's fields are in bounds at the offsets of its layout.
    unsafe {
        match ty {
            GgmlType::Q8_0 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    let w = load32(c.add(34 * b + 2));
                    *vb = if VNNI {
                        _mm256_xor_si256(w, _mm256_set1_epi8(-128))
                    } else {
                        w
                    };
                }
            }
            GgmlType::Q4_0 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    *vb = nibbles16(c.add(18 * b + 2));
                }
            }
            GgmlType::Q4_1 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    *vb = nibbles16(c.add(20 * b + 4));
                }
            }
            GgmlType::MXFP4 => {
                // kvalues_mxfp4 in both 128-bit halves: `vpshufb` looks each
                // nibble (below 16, so never zeroed) up in its own half.
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i));
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    *vb = _mm256_shuffle_epi8(table, nibbles16(c.add(17 * b + 1)));
                }
            }
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
                // kvalues_iq4nl as MXFP4's table; IQ4_XS's sub-block `b`
                // at bytes 8 + 16b of its super-block.
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
                let (bs, at) = if ty == GgmlType::IQ4_NL { (18, 2) } else { (16, 8) };
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    *vb = _mm256_shuffle_epi8(table, nibbles16(c.add(bs * b + at)));
                }
            }
            GgmlType::Q5_0 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    let p = c.add(22 * b);
                    *vb = _mm256_or_si256(nibbles16(p.add(6)), high_bits32(p.add(2)));
                }
            }
            GgmlType::Q5_1 => {
                for (b, vb) in v.iter_mut().enumerate().take(nblocks) {
                    let p = c.add(24 * b);
                    *vb = _mm256_or_si256(nibbles16(p.add(8)), high_bits32(p.add(4)));
                }
            }
            GgmlType::Q2_K | GgmlType::Q3_K => {
                // Block b = 4n + j: bits 2j..2j + 2 of qs[32n..32n + 32]
                // (one 16-bit shift, bits from the neighbouring byte masked
                // off); Q3_K's third bit is bit b of each hmask byte.
                let k3 = ty == GgmlType::Q3_K;
                let qs = c.add(if k3 { 32 } else { 16 });
                let hm = if k3 { load32(c) } else { _mm256_setzero_si256() };
                let (three, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
                for n in 0..2 {
                    let x = load32(qs.add(32 * n));
                    for j in 0..4 {
                        let b = 4 * n + j;
                        let low = _mm256_and_si256(_mm256_srl_epi16(x, _mm_cvtsi32_si128(2 * j as i32)), three);
                        v[b] = if k3 {
                            let high = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(b as i32)), one);
                            _mm256_or_si256(low, _mm256_slli_epi16::<2>(high))
                        } else {
                            low
                        };
                    }
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
                    v[2 * i] = lo;
                    v[2 * i + 1] = hi;
                }
            }
            GgmlType::Q6_K => {
                // Bits 2k, 2k + 1 of each `qh` byte are the top bits of
                // register k's codes: moved straight to bits 4-5 by one
                // 16-bit shift (bits that cross into the neighbouring
                // byte land outside 4-5) and masked.
                let top = _mm256_set1_epi8(0x30);
                for h in 0..2 {
                    let ql0 = load32(c.add(64 * h));
                    let ql1 = load32(c.add(64 * h + 32));
                    let qh = load32(c.add(128 + 32 * h));
                    let high = [
                        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), top),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), top),
                        _mm256_and_si256(qh, top),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), top),
                    ];
                    v[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low4), high[0]);
                    v[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), high[1]);
                    v[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4), high[2]);
                    v[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4), high[3]);
                }
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no integer sums"),
        }
    }
    v
}

/// The integer half sums of one activation row against a chunk's decoded
/// codes, as `(lo, hi)` registers, lane `b` for block `b` (VNNI's Q8_0
/// sums still carry the +128 offset).
#[inline(always)]
unsafe fn sums<const VNNI: bool>(ty: GgmlType, codes: &[__m256i; 8], q: &[i8], nblocks: usize) -> (__m256i, __m256i) {
    let mut v = [_mm256_setzero_si256(); 8];
    // SAFETY: `q` holds 32 activation codes per block of the chunk.
    unsafe {
        for b in 0..nblocks {
            let x = load32(q.as_ptr().add(b * QK) as *const u8);
            let c = codes[b];
            // Signed codes: |w| times q·sign(w) (q is never -128).
            let signed = matches!(ty, GgmlType::MXFP4 | GgmlType::IQ4_NL | GgmlType::IQ4_XS);
            v[b] = if signed || (ty == GgmlType::Q8_0 && !VNNI) {
                mul::<VNNI>(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c))
            } else {
                mul::<VNNI>(c, x)
            };
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

/// Eight MXFP4 scales `2^(e - 128)` from exponent bytes `stride` bytes
/// apart: [`super::super::types::e8m0_to_f32_half`]'s bits, lane by lane
/// (`(e - 1) << 23` for `e >= 2`, else the subnormal `0x00200000 << e`).
#[inline(always)]
unsafe fn e8m0x8(p: *const u8, stride: usize) -> __m256 {
    // SAFETY: the caller's pointer covers eight blocks of `stride` bytes.
    unsafe {
        let e = |b: usize| *p.add(b * stride) as i32;
        e8m0_lanes(_mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7)))
    }
}

/// `2^(e - 128)` of eight exponent bytes `e` (i32 lanes, 0..=255):
/// [`super::super::types::e8m0_to_f32_half`]'s bits, lane by lane.
#[inline(always)]
pub(crate) unsafe fn e8m0_lanes(e: __m256i) -> __m256 {
    let one = _mm256_set1_epi32(1);
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, one));
    let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(e, one)))
}

/// A full chunk's weight scales, lane `b` for block `b`, shared by every
/// activation row: `d` (most types; Q4_K's and Q5_K's `d · sc`, IQ4_XS's
/// `d · (ls - 32)`), `m` (Q4_1 / Q5_1; Q4_K's and Q5_K's `dmin · mn`), and
/// the integer scales of the two 16-element groups, `sc₀` in `sc` and
/// `sc₁` in `mn` (Q2_K, Q3_K, Q6_K), with Q2_K's mins `mn₀`, `mn₁` in `mn2`.
struct Scales {
    d: __m256,
    m: __m256,
    sc: __m256i,
    mn: __m256i,
    mn2: (__m256i, __m256i),
}

#[inline(always)]
unsafe fn scales(ty: GgmlType, chunk: &[u8]) -> Scales {
    let c = chunk.as_ptr();
    let zero_f = _mm256_setzero_ps();
    let zero_i = _mm256_setzero_si256();
    let only_d = |d| Scales {
        d,
        m: zero_f,
        sc: zero_i,
        mn: zero_i,
        mn2: (zero_i, zero_i),
    };
    let ints = |v: [i32; 8]| _mm256_loadu_si256(v.as_ptr() as *const __m256i);
    // SAFETY: `chunk` holds eight blocks (or one super-block) of `ty`.
    unsafe {
        match ty {
            GgmlType::Q8_0 => only_d(f16x8(c, 34)),
            GgmlType::Q4_0 => only_d(f16x8(c, 18)),
            GgmlType::Q5_0 => only_d(f16x8(c, 22)),
            GgmlType::MXFP4 => only_d(e8m0x8(c, 17)),
            GgmlType::IQ4_NL => only_d(f16x8(c, 18)),
            GgmlType::IQ4_XS => only_d(_mm256_mul_ps(
                f16x1(c),
                _mm256_cvtepi32_ps(ints(std::array::from_fn(|b| {
                    iq4_xs_scale([chunk[2], chunk[3]], &chunk[4..8], b)
                }))),
            )),
            GgmlType::Q2_K => {
                let g = |i: usize| chunk[i] as i32;
                Scales {
                    d: f16x1(c.add(80)),
                    m: f16x1(c.add(82)),
                    sc: ints(std::array::from_fn(|b| g(2 * b) & 15)),
                    mn: ints(std::array::from_fn(|b| g(2 * b + 1) & 15)),
                    mn2: (
                        ints(std::array::from_fn(|b| g(2 * b) >> 4)),
                        ints(std::array::from_fn(|b| g(2 * b + 1) >> 4)),
                    ),
                }
            }
            GgmlType::Q3_K => {
                let sc = |g: usize| q3_k_scale(&chunk[96..108], g);
                Scales {
                    sc: ints(std::array::from_fn(|b| sc(2 * b))),
                    mn: ints(std::array::from_fn(|b| sc(2 * b + 1))),
                    ..only_d(f16x1(c.add(108)))
                }
            }
            GgmlType::Q4_1 => Scales {
                m: f16x8(c.add(2), 20),
                ..only_d(f16x8(c, 20))
            },
            GgmlType::Q5_1 => Scales {
                m: f16x8(c.add(2), 24),
                ..only_d(f16x8(c, 24))
            },
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let scales: &[u8; 12] = chunk[4..16].try_into().expect("12 scale bytes");
                let (mut sc, mut mn) = ([0i32; 8], [0i32; 8]);
                for j in 0..8 {
                    let (a, b) = scale_min_k4(scales, j);
                    (sc[j], mn[j]) = (a as i32, b as i32);
                }
                Scales {
                    m: _mm256_mul_ps(f16x1(c.add(2)), _mm256_cvtepi32_ps(ints(mn))),
                    ..only_d(_mm256_mul_ps(f16x1(c), _mm256_cvtepi32_ps(ints(sc))))
                }
            }
            GgmlType::Q6_K => {
                let bytes = _mm_loadu_si128(c.add(192) as *const __m128i);
                let split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                let eo = _mm_shuffle_epi8(bytes, split);
                Scales {
                    sc: _mm256_cvtepi8_epi32(eo),
                    mn: _mm256_cvtepi8_epi32(_mm_srli_si128(eo, 8)),
                    ..only_d(f16x1(c.add(208)))
                }
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no integer terms"),
        }
    }
}

/// One f16 field at `p`, widened and broadcast. F16C, not the portable
/// conversion: that one multiplies a subnormal f32 to rescale subnormal
/// halves (K-quant super-block scales of small weights often are), and
/// subnormal operands cost x86 a microcode assist each.
#[inline(always)]
unsafe fn f16x1(p: *const u8) -> __m256 {
    // SAFETY: the caller's pointer covers 2 bytes.
    unsafe {
        let h = (p as *const u16).read_unaligned();
        _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32))))
    }
}

/// The f32 terms of a full chunk (eight blocks) for one activation row,
/// lane `b` for block `b`: [`super::combine`]'s operations, in its order.
#[inline(always)]
unsafe fn terms(ty: GgmlType, w: &Scales, lo: __m256i, hi: __m256i, s: (__m256i, __m256i), dx: __m256) -> __m256 {
    let f32s = _mm256_cvtepi32_ps;
    // SAFETY: register arithmetic only.
    unsafe {
        let raw = _mm256_add_epi32(lo, hi);
        let total = _mm256_add_epi32(s.0, s.1);
        match ty {
            GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::MXFP4
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS => {
                // raw - off * total with off = 0, 8 or 16: the product as
                // a shift (the same wrapping i32 result, without
                // `vpmulld`'s two uops and ten-cycle latency).
                let i = match ty {
                    GgmlType::Q8_0 | GgmlType::MXFP4 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => raw,
                    GgmlType::Q4_0 => _mm256_sub_epi32(raw, _mm256_slli_epi32::<3>(total)),
                    _ => _mm256_sub_epi32(raw, _mm256_slli_epi32::<4>(total)),
                };
                _mm256_mul_ps(_mm256_mul_ps(w.d, dx), f32s(i))
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => _mm256_add_ps(
                _mm256_mul_ps(_mm256_mul_ps(w.d, dx), f32s(raw)),
                _mm256_mul_ps(_mm256_mul_ps(w.m, dx), f32s(total)),
            ),
            GgmlType::Q4_K | GgmlType::Q5_K => _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(w.d, dx), f32s(raw)),
                _mm256_mul_ps(w.m, _mm256_mul_ps(dx, f32s(total))),
            ),
            GgmlType::Q2_K => {
                let i = _mm256_add_epi32(_mm256_mullo_epi32(w.sc, lo), _mm256_mullo_epi32(w.mn, hi));
                let m = _mm256_add_epi32(_mm256_mullo_epi32(w.mn2.0, s.0), _mm256_mullo_epi32(w.mn2.1, s.1));
                _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(w.d, dx), f32s(i)),
                    _mm256_mul_ps(_mm256_mul_ps(w.m, dx), f32s(m)),
                )
            }
            GgmlType::Q3_K => {
                // sc₀ (lo - 4 Σq₀) + sc₁ (hi - 4 Σq₁), the 4 as a shift.
                let i = _mm256_add_epi32(
                    _mm256_mullo_epi32(w.sc, _mm256_sub_epi32(lo, _mm256_slli_epi32::<2>(s.0))),
                    _mm256_mullo_epi32(w.mn, _mm256_sub_epi32(hi, _mm256_slli_epi32::<2>(s.1))),
                );
                _mm256_mul_ps(_mm256_mul_ps(w.d, dx), f32s(i))
            }
            GgmlType::Q6_K => {
                // sc₀ (lo - 32 Σq₀) + sc₁ (hi - 32 Σq₁), the 32 as a shift.
                let i = _mm256_add_epi32(
                    _mm256_mullo_epi32(w.sc, _mm256_sub_epi32(lo, _mm256_slli_epi32::<5>(s.0))),
                    _mm256_mullo_epi32(w.mn, _mm256_sub_epi32(hi, _mm256_slli_epi32::<5>(s.1))),
                );
                _mm256_mul_ps(_mm256_mul_ps(w.d, dx), f32s(i))
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no integer terms"),
        }
    }
}

/// The row loop for `N` activation rows at once: each chunk's codes and
/// scales are decoded once; full chunks form their terms in registers, a
/// partial last chunk goes through [`combine`]; then the reference's lane
/// reduction. Every result is the bits a single-row call gives.
#[inline(always)]
unsafe fn rows_dot<const VNNI: bool, const N: usize>(ty: GgmlType, row: &[u8], acts: [&Q8Acts; N]) -> [f32; N] {
    let super_blocks = ty.block_elems() == QK_K;
    let chunk_bytes = if super_blocks {
        ty.block_bytes()
    } else {
        8 * ty.block_bytes()
    };
    let offset = VNNI && ty == GgmlType::Q8_0;
    let pf = crate::prefetch::distance();
    // SAFETY: `row` holds `acts[n].len()` elements of `ty` (the caller's
    // promise), so every chunk's activations and sums are in bounds.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        let mut b0 = 0;
        for chunk in row.chunks(chunk_bytes) {
            crate::prefetch::ahead_span(chunk.as_ptr(), chunk.len(), pf);
            let k = if super_blocks {
                8
            } else {
                chunk.len() / ty.block_bytes()
            };
            if k == 8 {
                let codes = decode::<VNNI>(ty, chunk, k);
                let w = scales(ty, chunk);
                for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                    let (mut lo, mut hi) = sums::<VNNI>(ty, &codes, &a.qs[b0 * QK..(b0 + 8) * QK], 8);
                    let s = half_sums(a.s16.as_ptr().add(2 * b0));
                    if offset {
                        lo = _mm256_sub_epi32(lo, _mm256_slli_epi32(s.0, 7));
                        hi = _mm256_sub_epi32(hi, _mm256_slli_epi32(s.1, 7));
                    }
                    let dx = _mm256_loadu_ps(a.d.as_ptr().add(b0));
                    *acc = _mm256_add_ps(*acc, terms(ty, &w, lo, hi, s, dx));
                }
            } else {
                // The last chunk of a row that is not a multiple of 256.
                partial::<VNNI, N>(ty, chunk, b0, acts, &mut acc);
            }
            b0 += k;
        }
        lane_sums(acc)
    }
}

/// Adds the terms of a partial chunk (`chunk`: fewer than eight blocks of
/// a 32-element type, the row's blocks `b0..`) to the lanes of each
/// accumulator through [`combine`], block `b` of the chunk to lane `b`:
/// the last chunk of a row that is not whole chunks, here and in
/// [`super::tiled`]'s chunk-transposed rows, whose whole chunks leave
/// their terms in the same lanes first.
///
/// # Safety
/// The CPU must run the instruction set (AVX2, with `VNNI` AVX-512 VNNI);
/// each activation row must hold `b0 + chunk.len() / bytes` blocks.
#[inline(always)]
pub(crate) unsafe fn partial<const VNNI: bool, const N: usize>(
    ty: GgmlType,
    chunk: &[u8],
    b0: usize,
    acts: [&Q8Acts; N],
    acc: &mut [__m256; N],
) {
    let k = chunk.len() / ty.block_bytes();
    debug_assert!(k < 8 && ty.block_elems() == QK);
    let offset = VNNI && ty == GgmlType::Q8_0;
    // SAFETY: `chunk` holds `k` blocks and every activation row the
    // blocks `b0..b0 + k` (the caller's promise).
    unsafe {
        let codes = decode::<VNNI>(ty, chunk, k);
        for (a, acc) in acts.iter().zip(acc.iter_mut()) {
            let (lo, hi) = sums::<VNNI>(ty, &codes, &a.qs[b0 * QK..(b0 + k) * QK], k);
            let s16 = &a.s16[2 * b0..2 * (b0 + k)];
            let mut raw = Raw::default();
            _mm256_storeu_si256(raw.lo.as_mut_ptr() as *mut __m256i, lo);
            _mm256_storeu_si256(raw.hi.as_mut_ptr() as *mut __m256i, hi);
            if offset {
                for b in 0..k {
                    raw.lo[b] -= 128 * s16[2 * b];
                    raw.hi[b] -= 128 * s16[2 * b + 1];
                }
            }
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *acc);
            combine(ty, chunk, k, &raw, &a.d[b0..b0 + k], s16, &mut lanes);
            *acc = _mm256_loadu_ps(lanes.as_ptr());
        }
    }
}

/// The reference's lane reduction of each accumulator (a loop, not
/// `array::map`: a closure called from a generic function would not be
/// compiled with this function's target features, and every intrinsic in
/// it would become a call).
#[inline(always)]
pub(crate) unsafe fn lane_sums<const N: usize>(acc: [__m256; N]) -> [f32; N] {
    let mut out = [0.0f32; N];
    for (o, v) in out.iter_mut().zip(acc) {
        // ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), in registers.
        // SAFETY: AVX is enabled wherever the kernels inline this.
        unsafe {
            // t = [l0 + l4, l1 + l5, l2 + l6, l3 + l7]
            let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            // u0 = t0 + t1, u2 = t2 + t3 (addition is commutative, bit for bit)
            let u = _mm_add_ps(t, _mm_shuffle_ps::<0b10_11_00_01>(t, t));
            *o = _mm_cvtss_f32(_mm_add_ss(u, _mm_movehl_ps(u, u)));
        }
    }
    out
}
