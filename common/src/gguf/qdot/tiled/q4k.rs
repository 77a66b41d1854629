//! Q4_K rows packed at load: each super-block's nibbles in the
//! chunk-transposed order of [`super`] (lane `b` of a step = four codes of
//! sub-block `b`), still two per byte, so prefill meets a packed row with
//! no arranging and decode needs no horizontal fold. The same bits as
//! [`crate::gguf::qdot::dot`] (its Q4_K term), in the GGUF's 144 bytes per
//! super-block:
//!
//! | bytes | content |
//! |---|---|
//! | `0..128` | four steps `j` of nibble bytes: byte `32j + 4b + k` holds the code of element `4j + k` of sub-block `b` (low nibble) and of element `16 + 4j + k` (high nibble) |
//! | `128..140` | the twelve bytes of 6-bit scales and mins, as stored |
//! | `140..142`, `142..144` | the f16 `d` and `dmin` |
//!
//! The scales come last so that one 16-byte load holds them with `d` and
//! `dmin` ([`scales`]).

use super::super::super::types::scale_min_k4;

/// Bytes of one packed (and one GGUF) Q4_K super-block.
pub const BLOCK: usize = 144;

/// One super-block (`src`: its GGUF bytes) in the packed layout.
///
/// # Panics
/// If `src` or `dst` is shorter than [`BLOCK`].
pub fn pack_block(src: &[u8], dst: &mut [u8]) {
    nibble_steps(src[16..BLOCK].try_into().expect("128 nibble bytes"), &mut dst[..128]);
    dst[128..140].copy_from_slice(&src[4..16]);
    dst[140..144].copy_from_slice(&src[0..4]);
}

/// A super-block's 256 four-bit codes (`qs`, as Q4_K and Q5_K store them:
/// sub-block `2g` the low nibbles of `qs[32g..32g + 32]`, `2g + 1` their
/// high nibbles) in the four packed steps: byte `32j + 4b + k` holds
/// element `4j + k` of sub-block `b` (low nibble) and element `16 + 4j + k`
/// (high nibble). Fixed offsets the compiler vectorizes: what loading a
/// K-quant file spends its packing on.
///
/// # Panics
/// If `dst` is shorter than 128 bytes.
pub(super) fn nibble_steps(qs: &[u8; 128], dst: &mut [u8]) {
    let dst: &mut [u8; 128] = (&mut dst[..128]).try_into().expect("four steps");
    for b in 0..8 {
        let q: &[u8; 32] = qs[32 * (b / 2)..][..32].try_into().expect("32 nibble bytes");
        let shift = 4 * (b % 2);
        for j in 0..4 {
            for k in 0..4 {
                let (lo, hi) = (q[4 * j + k] >> shift & 0x0f, q[16 + 4 * j + k] >> shift & 0x0f);
                dst[32 * j + 4 * b + k] = lo | (hi << 4);
            }
        }
    }
}

/// A packed super-block's eight sub-block scales and mins (the reference of
/// [`scales`]).
pub fn scales_scalar(block: &[u8]) -> ([i32; 8], [i32; 8]) {
    let s: &[u8; 12] = block[128..140].try_into().expect("twelve scale bytes");
    let (mut sc, mut mn) = ([0; 8], [0; 8]);
    for b in 0..8 {
        let (x, m) = scale_min_k4(s, b);
        (sc[b], mn[b]) = (x as i32, m as i32);
    }
    (sc, mn)
}

/// A packed super-block's scales and mins (eight i32 lanes each) and `d`,
/// `dmin` (in every lane), from one 16-byte load at `p + 128`:
/// `sc[b] = q[b] & 63`, `mn[b] = q[b + 4] & 63` for `b < 4`, and for
/// `b >= 4` the low / high nibble of `q[b + 4]` with the top two bits of
/// `q[b - 4]` / `q[b]` above them (`scale_min_k4`).
///
/// # Safety
/// The CPU must run AVX2 and F16C; `p` must point at a packed super-block.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn scales(
    p: *const u8,
) -> (
    std::arch::x86_64::__m256i,
    std::arch::x86_64::__m256i,
    std::arch::x86_64::__m256,
    std::arch::x86_64::__m256,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's pointer covers the super-block's last 16 bytes.
    unsafe {
        let x = _mm_loadu_si128(p.add(128) as *const __m128i);
        let low6 = _mm_and_si128(x, _mm_set1_epi8(0x3f));
        // Bits 6-7 of every byte at 4-5 (masked first: nothing crosses a byte).
        let top2 = _mm_srli_epi16::<2>(_mm_and_si128(x, _mm_set1_epi8(0xc0u8 as i8)));
        let lo4 = _mm_and_si128(x, _mm_set1_epi8(0x0f));
        let hi4 = _mm_and_si128(_mm_srli_epi16::<4>(x), _mm_set1_epi8(0x0f));
        let pick = |v: __m128i, at: [i8; 8]| {
            let z = -1i8;
            let m = _mm_setr_epi8(
                at[0], at[1], at[2], at[3], at[4], at[5], at[6], at[7], z, z, z, z, z, z, z, z,
            );
            _mm_shuffle_epi8(v, m)
        };
        let z = -1i8;
        let sc = _mm_or_si128(
            _mm_or_si128(
                pick(low6, [0, 1, 2, 3, z, z, z, z]),
                pick(lo4, [z, z, z, z, 8, 9, 10, 11]),
            ),
            pick(top2, [z, z, z, z, 0, 1, 2, 3]),
        );
        let mn = _mm_or_si128(
            _mm_or_si128(
                pick(low6, [4, 5, 6, 7, z, z, z, z]),
                pick(hi4, [z, z, z, z, 8, 9, 10, 11]),
            ),
            pick(top2, [z, z, z, z, 4, 5, 6, 7]),
        );
        let h = |at: usize| _mm256_cvtph_ps(_mm_set1_epi16((p.add(at) as *const i16).read_unaligned()));
        (_mm256_cvtepu8_epi32(sc), _mm256_cvtepu8_epi32(mn), h(140), h(142))
    }
}
