//! Q2_K and Q3_K rows packed at load: each super-block's 2-bit codes in the
//! chunk-transposed order of [`super`] (lane `b` of a step = four codes of
//! sub-block `b`), four to a byte, so a product needs no horizontal fold
//! and leaves each sub-block's two half sums, `lo` and `hi`, in lane `b` of
//! two accumulators (as Q6_K's packing, [`super::q6k`]: both types keep a
//! scale per 16-element half). The same bits as
//! [`crate::gguf::qdot::dot`] (its Q2_K / Q3_K terms), in the GGUF's 84 /
//! 110 bytes per super-block:
//!
//! | Q2_K bytes | Q3_K bytes | content |
//! |---|---|---|
//! | `0..64` | `0..64` | two registers `r` of code bytes: bits `2s..2s + 2` of byte `32r + 4b + k` are the low two bits of element `16r + 4s + k` of sub-block `b` (step `j = 4r + s`: register 0 the first halves, 1 the second) |
//! | — | `64..96` | bit `j` of byte `64 + 4b + k`: the third bit of element `4j + k` of sub-block `b` |
//! | `64..80` | `96..108` | the scales as stored (Q2_K: scale and min nibbles of group `g`, 16 elements; Q3_K: twelve bytes of 6-bit scales) |
//! | `80..84` | `108..110` | the f16 `d` (and Q2_K's `dmin`) |
//!
//! The activations need [`super::Q8Acts::arrange`]'s transposed codes and
//! its `off6` (`32 s16` of each half: Q3_K's `4 s` is `off6 >> 3`, Q2_K's
//! `Σ mn s` is `(Σ mn off6) >> 5`, both exact).

use crate::gguf::types::GgmlType;

/// Bytes of one packed (and one GGUF) Q2_K super-block.
pub const Q2_BLOCK: usize = 84;
/// Bytes of one packed (and one GGUF) Q3_K super-block.
pub const Q3_BLOCK: usize = 110;

/// The low two bits of element `e` (0..32) of sub-block `b` of a GGUF
/// Q2_K / Q3_K super-block (`qs`: its 64 code bytes): bits `2(b % 4)` of
/// `qs[32 (b / 4) + e]`.
fn low2(qs: &[u8], b: usize, e: usize) -> u8 {
    (qs[32 * (b / 4) + e] >> (2 * (b % 4))) & 3
}

/// One super-block of `ty` (Q2_K or Q3_K; `src`: its GGUF bytes) in the
/// packed layout.
///
/// # Panics
/// If `src` or `dst` is shorter than a block of `ty`.
pub fn pack_block(ty: GgmlType, src: &[u8], dst: &mut [u8]) {
    let k3 = ty == GgmlType::Q3_K;
    let qs = if k3 { &src[32..96] } else { &src[16..80] };
    dst[..64].fill(0);
    if k3 {
        dst[64..96].fill(0);
    }
    for b in 0..8 {
        // Q3_K's third bits: bit b of hmask[e] for element e.
        for (e, &hm) in src[..32].iter().enumerate() {
            let (r, s, k) = (e / 16, (e % 16) / 4, e % 4);
            dst[32 * r + 4 * b + k] |= low2(qs, b, e) << (2 * s);
            if k3 {
                dst[64 + 4 * b + k] |= ((hm >> b) & 1) << (e / 4);
            }
        }
    }
    if k3 {
        dst[96..110].copy_from_slice(&src[96..110]);
    } else {
        dst[64..80].copy_from_slice(&src[..16]);
        dst[80..84].copy_from_slice(&src[80..84]);
    }
}

/// A packed super-block's half scales `sc₀`, `sc₁` (Q3_K: less 32) and
/// Q2_K's mins `mn₀`, `mn₁`, lane `b` for sub-block `b` (the reference of
/// [`scales`]).
pub fn scales_scalar(ty: GgmlType, block: &[u8]) -> [[i32; 8]; 4] {
    std::array::from_fn(|v| {
        // v: sc₀, sc₁, mn₀, mn₁; group g = 2b + half.
        std::array::from_fn(|b| {
            let g = 2 * b + v % 2;
            match (ty, v / 2) {
                (GgmlType::Q3_K, 0) => crate::gguf::types::q3_k_scale(&block[96..108], g),
                (GgmlType::Q3_K, _) => 0,
                (_, 0) => (block[64 + g] & 15) as i32,
                _ => (block[64 + g] >> 4) as i32,
            }
        })
    })
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::*;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::Q8Acts;
    use crate::gguf::types::{GgmlType, QK_K};

    /// A packed super-block's half scales and mins (as [`super::scales_scalar`],
    /// eight i32 lanes each) and `d`, `dmin` in every lane. Q2_K: the
    /// sixteen scale bytes split into even and odd groups, nibbles apart;
    /// Q3_K: the low nibbles of bytes `0..8` then their high nibbles, the
    /// top two bits of group `g` from bits `2 (g / 4)` of byte `8 + g % 4`
    /// (one variable shift of the broadcast word), less 32, then split.
    ///
    /// # Safety
    /// The CPU must run AVX2 and F16C; `p` must point at a packed super-block
    /// of `ty`.
    #[inline(always)]
    pub unsafe fn scales(ty: GgmlType, p: *const u8) -> ([__m256i; 4], __m256, __m256) {
        // SAFETY: every read lies inside the super-block (the caller's
        // pointer).
        unsafe {
            let split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
            let f16 = |at: usize| _mm256_cvtph_ps(_mm_set1_epi16((p.add(at) as *const i16).read_unaligned()));
            let low4 = _mm_set1_epi8(0x0f);
            if ty == GgmlType::Q3_K {
                let x = _mm_loadl_epi64(p.add(96) as *const __m128i);
                let low = _mm_unpacklo_epi64(_mm_and_si128(x, low4), _mm_and_si128(_mm_srli_epi16::<4>(x), low4));
                let w = (p.add(104) as *const u32).read_unaligned() as i32;
                let top = _mm_and_si128(
                    _mm_srlv_epi32(_mm_set1_epi32(w), _mm_setr_epi32(0, 2, 4, 6)),
                    _mm_set1_epi8(3),
                );
                let sc = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16::<4>(top)), _mm_set1_epi8(32));
                let eo = _mm_shuffle_epi8(sc, split);
                let zero = _mm256_setzero_si256();
                return (
                    [
                        _mm256_cvtepi8_epi32(eo),
                        _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(eo)),
                        zero,
                        zero,
                    ],
                    f16(108),
                    _mm256_setzero_ps(),
                );
            }
            let eo = _mm_shuffle_epi8(_mm_loadu_si128(p.add(64) as *const __m128i), split);
            let (sc, mn) = (_mm_and_si128(eo, low4), _mm_and_si128(_mm_srli_epi16::<4>(eo), low4));
            (
                [
                    _mm256_cvtepu8_epi32(sc),
                    _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(sc)),
                    _mm256_cvtepu8_epi32(mn),
                    _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(mn)),
                ],
                f16(80),
                f16(82),
            )
        }
    }

    /// Steps `j` and `4 + j` (`j < 4`) of a packed super-block's codes:
    /// the two bits at `2j` of each register, Q3_K's third bits at bit 2.
    #[inline(always)]
    pub unsafe fn pair(ty: GgmlType, p: *const u8, j: usize) -> (__m256i, __m256i) {
        // SAFETY: the caller's pointer covers the super-block.
        unsafe {
            let three = _mm256_set1_epi8(3);
            let count = _mm_cvtsi32_si128(2 * j as i32);
            let r0 = _mm256_loadu_si256(p as *const __m256i);
            let r1 = _mm256_loadu_si256(p.add(32) as *const __m256i);
            let mut lo = _mm256_and_si256(_mm256_srl_epi16(r0, count), three);
            let mut hi = _mm256_and_si256(_mm256_srl_epi16(r1, count), three);
            if ty == GgmlType::Q3_K {
                let h = _mm256_loadu_si256(p.add(64) as *const __m256i);
                let one = _mm256_set1_epi8(1);
                let bit = |s: usize| {
                    let b = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(s as i32)), one);
                    _mm256_slli_epi16::<2>(b)
                };
                lo = _mm256_or_si256(lo, bit(j));
                hi = _mm256_or_si256(hi, bit(4 + j));
            }
            (lo, hi)
        }
    }

    /// The term of one chunk `c` from its half sums `lo`, `hi` (lane `b`):
    /// Q3_K `(d · dx) · f32(sc₀ (lo − 4 s₀) + sc₁ (hi − 4 s₁))`, Q2_K
    /// `(d · dx) · f32(sc₀ lo + sc₁ hi) − (dmin · dx) · f32(mn₀ s₀ + mn₁ s₁)`,
    /// as `combine` forms them, `4 s` and `Σ mn s` from `off6` (`32 s`).
    #[inline(always)]
    pub unsafe fn term(
        ty: GgmlType,
        c: usize,
        (s, d, dmin): ([__m256i; 4], __m256, __m256),
        a: &Q8Acts,
        lo: __m256i,
        hi: __m256i,
    ) -> __m256 {
        // SAFETY: arranged activations hold sixteen offsets and eight
        // scales per chunk; `c` is in range (the caller's promise).
        unsafe {
            let off = a.off6.as_ptr().add(16 * c);
            let o0 = _mm256_loadu_si256(off as *const __m256i);
            let o1 = _mm256_loadu_si256(off.add(8) as *const __m256i);
            let dx = _mm256_loadu_ps(a.d.as_ptr().add(8 * c));
            let mul = _mm256_mullo_epi32;
            if ty == GgmlType::Q3_K {
                let i = _mm256_add_epi32(
                    mul(s[0], _mm256_sub_epi32(lo, _mm256_srai_epi32::<3>(o0))),
                    mul(s[1], _mm256_sub_epi32(hi, _mm256_srai_epi32::<3>(o1))),
                );
                return _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(i));
            }
            let i = _mm256_add_epi32(mul(s[0], lo), mul(s[1], hi));
            let m = _mm256_srai_epi32::<5>(_mm256_add_epi32(mul(s[2], o0), mul(s[3], o1)));
            _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(i)),
                _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(m)),
            )
        }
    }

    /// `out[i]` = packed row `i` (`rb` bytes each) times the arranged
    /// activations, on AVX-512 VNNI or AVX2.
    ///
    /// # Safety
    /// The CPU must run the instruction set; `acts` must be arranged and
    /// `rows` hold `out.len()` packed rows of `ty` of `acts.len()` elements.
    pub unsafe fn dot_rows<const VNNI: bool>(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe {
            if VNNI {
                rows_vnni(ty, rows, rb, acts, out)
            } else {
                rows_avx2(ty, rows, rb, acts, out)
            }
        }
    }

    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn rows_vnni(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe { each_type!(ty, t => rows_body::<true>(t, rows, rb, acts, out)) }
    }

    #[target_feature(enable = "avx2,f16c")]
    unsafe fn rows_avx2(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe { each_type!(ty, t => rows_body::<false>(t, rows, rb, acts, out)) }
    }

    /// The decode loop: per super-block, the eight steps' codes against the
    /// activation steps into the `lo` (steps 0..4) and `hi` (4..8) lanes,
    /// then [`term`]. On AVX2 a chunk's four `vpmaddubsw` pairs per half
    /// are summed in 16 bits before one widening (a pair is at most
    /// 2 · 7 · 127 = 1778, four 7112 < 2^15: exact).
    #[inline(always)]
    unsafe fn rows_body<const VNNI: bool>(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
        use super::super::x86::madd;
        let supers = acts.len() / QK_K;
        let bs = ty.block_bytes();
        let pf = crate::prefetch::distance();
        let ones = _mm256_set1_epi16(1);
        // SAFETY: each row holds `supers` packed super-blocks (the
        // caller's promise); the arranged activations hold 256 transposed
        // codes, eight scales and sixteen offsets per super-block.
        unsafe {
            for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
                let mut acc = _mm256_setzero_ps();
                for c in 0..supers {
                    let p = row.as_ptr().add(c * bs);
                    crate::prefetch::ahead_span(p, bs, pf);
                    let q0 = acts.qt.as_ptr().add(c * QK_K) as *const u8;
                    let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                    let mut lo = _mm256_setzero_si256();
                    let mut hi = _mm256_setzero_si256();
                    for j in 0..4 {
                        let (cl, ch) = pair(ty, p, j);
                        if VNNI {
                            lo = madd::<true, false>(lo, cl, q(j));
                            hi = madd::<true, false>(hi, ch, q(4 + j));
                        } else {
                            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(cl, q(j)));
                            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(ch, q(4 + j)));
                        }
                    }
                    if !VNNI {
                        lo = _mm256_madd_epi16(lo, ones);
                        hi = _mm256_madd_epi16(hi, ones);
                    }
                    acc = _mm256_add_ps(acc, term(ty, c, scales(ty, p), acts, lo, hi));
                }
                *o = crate::gguf::qdot::x86::lane_sums([acc])[0];
            }
        }
    }
}
