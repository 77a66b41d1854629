//! Q6_K rows packed for decode: each super-block's codes in the
//! chunk-transposed order of [`super`] (lane `b` of a step = four codes of
//! sub-block `b`), so a matrix-vector product needs no horizontal fold and
//! leaves each sub-block's two half sums, `lo` and `hi`, in lane `b` of two
//! accumulators. The same bits as [`crate::gguf::qdot::dot`] (its `Q6_K`
//! term, in its order), in the GGUF's 210 bytes per super-block:
//!
//! | bytes | content |
//! |---|---|
//! | `0..128` | four steps `r` of nibble bytes: byte `32r + 4b + k` holds the low 4 bits of element `4r + k` of sub-block `b` (its low nibble) and of element `16 + 4r + k` (high nibble) |
//! | `128..192` | two registers `h` of top bits: byte `128 + 32h + 4b + k`, bits `2m..2m + 2`, are bits 4–5 of element `16h + 4m + k` of sub-block `b` |
//! | `192..200`, `200..208` | the i8 scales of the sub-blocks' first halves, then of their second halves |
//! | `208..210` | the f16 super-block scale `d` |
//!
//! The activations need [`Q8Acts::arrange`]'s transposed codes and its
//! `off6` (`32 s16` of each half, in the same two groups of eight).

#[cfg(target_arch = "x86_64")]
use super::Q8Acts;
#[cfg(target_arch = "x86_64")]
use crate::gguf::types::QK_K;

/// Bytes of one packed (and one GGUF) Q6_K super-block.
pub const BLOCK: usize = 210;

/// One super-block (`src`: its GGUF bytes) in the packed layout.
///
/// # Panics
/// If `src` or `dst` is shorter than [`BLOCK`].
pub fn pack_block(src: &[u8], dst: &mut [u8]) {
    let (src, dst): (&[u8; BLOCK], &mut [u8; BLOCK]) = (
        src[..BLOCK].try_into().expect("a whole super-block"),
        (&mut dst[..BLOCK]).try_into().expect("a whole super-block"),
    );
    for b in 0..8 {
        let c = sub_block_codes(src, b);
        for i in 0..16 {
            let (r, k) = (i / 4, i % 4);
            let at = 32 * r + 4 * b + k;
            dst[at] = (c[i] & 0x0f) | ((c[16 + i] & 0x0f) << 4);
        }
        // Byte `128 + 32h + 4b + k`: bits 4–5 of element `16h + 4m + k`
        // at bits `2m`, m = 0..4.
        for h in 0..2 {
            for k in 0..4 {
                dst[128 + 32 * h + 4 * b + k] =
                    (0..4).fold(0u8, |v, m| v | (((c[16 * h + 4 * m + k] >> 4) & 3) << (2 * m)));
            }
        }
        dst[192 + b] = src[192 + 2 * b];
        dst[200 + b] = src[193 + 2 * b];
    }
    dst[208..210].copy_from_slice(&src[208..210]);
}

/// The 32 six-bit codes of sub-block `b` of a GGUF Q6_K super-block, as
/// the scalar reference's `codes` spells them (half `h = b / 4`, `k = b % 4`: the low 4 bits
/// from `ql[64h + l + 32 (k & 1)]`, its high nibble for `k >= 2`, bits 4–5
/// from `(qh[32h + l] >> 2k) & 3`), with fixed offsets the compiler
/// vectorizes: what loading a Q6_K file spends its packing on.
fn sub_block_codes(src: &[u8; BLOCK], b: usize) -> [u8; 32] {
    let (h, k) = (b / 4, b % 4);
    let ql: &[u8; 32] = src[64 * h + 32 * (k & 1)..][..32].try_into().expect("32 low-bit bytes");
    let qh: &[u8; 32] = src[128 + 32 * h..][..32].try_into().expect("32 high-bit bytes");
    let (lo_shift, hi_shift) = (4 * (k >> 1), 2 * k);
    std::array::from_fn(|l| ((ql[l] >> lo_shift) & 0x0f) | (((qh[l] >> hi_shift) & 3) << 4))
}

/// The `off6` entries [`Q8Acts::arrange`] adds: per chunk of eight blocks,
/// `32 s16[2b]` for each block `b`, then `32 s16[2b + 1]`.
pub fn half_offsets(s16: &[i32], out: &mut Vec<i32>) {
    out.clear();
    for c in s16.chunks_exact(16) {
        out.extend((0..8).map(|b| 32 * c[2 * b]));
        out.extend((0..8).map(|b| 32 * c[2 * b + 1]));
    }
}

/// `out[i]` = packed row `i` (`rb` bytes each) times the arranged
/// activations, on AVX-512 VNNI (`vpdpbusd`) or AVX2 (`vpmaddubsw`).
///
/// # Safety
/// The CPU must run the instruction set (AVX2 and F16C; with `VNNI`, also
/// AVX-512 F/BW/VL/VNNI); `acts` must be arranged and `rows` hold
/// `out.len()` packed rows of `acts.len()` elements.
#[cfg(target_arch = "x86_64")]
pub unsafe fn dot_rows<const VNNI: bool>(rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe {
        if VNNI {
            rows_vnni(rows, rb, acts, out)
        } else {
            rows_avx2(rows, rb, acts, out)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_vnni(rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { rows_body::<true>(rows, rb, acts, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn rows_avx2(rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { rows_body::<false>(rows, rb, acts, out) }
}

/// The loop: per super-block, the four nibble steps split and joined with
/// their top bits (moved to bits 4–5 by one 16-bit shift and a mask), eight
/// multiply-accumulates into the `lo` and `hi` lanes, then
/// `(d · dx) · f32(sc₀ (lo − 32 s₀) + sc₁ (hi − 32 s₁))` per lane, as
/// `combine` forms it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_body<const VNNI: bool>(rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    use super::x86::madd;
    use std::arch::x86_64::*;
    let supers = acts.len() / QK_K;
    let low4 = _mm256_set1_epi8(0x0f);
    let top = _mm256_set1_epi8(0x30);
    let pf = crate::prefetch::distance();
    // SAFETY: each row holds `supers` packed super-blocks (the caller's
    // promise); the arranged activations hold 256 transposed codes, eight
    // scales and sixteen offsets per super-block.
    unsafe {
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
            let mut acc = _mm256_setzero_ps();
            for c in 0..supers {
                let p = row.as_ptr().add(c * BLOCK);
                crate::prefetch::ahead_span(p, BLOCK, pf);
                let w = |at: usize| _mm256_loadu_si256(p.add(at) as *const __m256i);
                let q0 = acts.qt.as_ptr().add(c * QK_K) as *const u8;
                let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                let (h0, h1) = (w(128), w(160));
                let mut lo = _mm256_setzero_si256();
                let mut hi = _mm256_setzero_si256();
                let step = |r: usize| {
                    let v = w(32 * r);
                    let cl = _mm256_or_si256(_mm256_and_si256(v, low4), at4(h0, r, top));
                    let ch = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), at4(h1, r, top));
                    (cl, ch)
                };
                if VNNI {
                    for r in 0..4 {
                        let (cl, ch) = step(r);
                        lo = madd::<VNNI, false>(lo, cl, q(r));
                        hi = madd::<VNNI, false>(hi, ch, q(4 + r));
                    }
                } else {
                    // Two steps' `vpmaddubsw` pairs summed in 16 bits before
                    // one widening multiply: a pair is at most 2 · 63 · 127
                    // = 16002 in magnitude, two of them 32004 < 2^15, so
                    // the sums stay exact (and so the bits).
                    for r in (0..4).step_by(2) {
                        let (cl0, ch0) = step(r);
                        let (cl1, ch1) = step(r + 1);
                        let ones = _mm256_set1_epi16(1);
                        let pl = _mm256_add_epi16(_mm256_maddubs_epi16(cl0, q(r)), _mm256_maddubs_epi16(cl1, q(r + 1)));
                        let ph =
                            _mm256_add_epi16(_mm256_maddubs_epi16(ch0, q(4 + r)), _mm256_maddubs_epi16(ch1, q(5 + r)));
                        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(pl, ones));
                        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(ph, ones));
                    }
                }
                let off = acts.off6.as_ptr().add(16 * c);
                let s0 = _mm256_loadu_si256(off as *const __m256i);
                let s1 = _mm256_loadu_si256(off.add(8) as *const __m256i);
                let sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(192) as *const __m128i));
                let sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(200) as *const __m128i));
                let i = _mm256_add_epi32(
                    _mm256_mullo_epi32(sc0, _mm256_sub_epi32(lo, s0)),
                    _mm256_mullo_epi32(sc1, _mm256_sub_epi32(hi, s1)),
                );
                let d = _mm256_cvtph_ps(_mm_set1_epi16((p.add(208) as *const i16).read_unaligned()));
                let dx = _mm256_loadu_ps(acts.d.as_ptr().add(8 * c));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(i)));
            }
            *o = crate::gguf::qdot::x86::lane_sums([acc])[0];
        }
    }
}

/// Bits `2m..2m + 2` of each byte of `v` at bits 4–5 (`top` = 0x30 in
/// every byte): one 16-bit shift, whose bits crossing a byte are masked off.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn at4(
    v: std::arch::x86_64::__m256i,
    m: usize,
    top: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let s = match m {
        0 => _mm256_slli_epi16(v, 4),
        1 => _mm256_slli_epi16(v, 2),
        2 => v,
        _ => _mm256_srli_epi16(v, 2),
    };
    _mm256_and_si256(s, top)
}
