//! IQ4_XS rows packed at load: each super-block's nibbles in the
//! chunk-transposed order of [`super`] (lane `b` of a step = four nibble
//! pairs of sub-block `b`), still two per byte, so prefill meets a packed
//! row with no arranging and decode needs no horizontal fold; the kernels
//! look the nibbles up in `kvalues_iq4nl` as MXFP4's are looked up in
//! theirs. The same bits as [`crate::gguf::qdot::dot`] (its IQ4_XS term),
//! in the GGUF's 136 bytes per super-block:
//!
//! | bytes | content |
//! |---|---|
//! | `0..128` | four steps `j` of nibble bytes: byte `32j + 4b + k` is byte `4j + k` of sub-block `b`'s sixteen (its elements `4j + k`, low nibble, and `16 + 4j + k`, high nibble) |
//! | `128..130` | the f16 `d` |
//! | `130..132`, `132..136` | `scales_h` and `scales_l`, as stored |

use super::super::super::types::iq4_xs_scale;

/// Bytes of one packed (and one GGUF) IQ4_XS super-block.
pub const BLOCK: usize = 136;

/// One super-block (`src`: its GGUF bytes) in the packed layout.
///
/// # Panics
/// If `src` or `dst` is shorter than [`BLOCK`].
pub fn pack_block(src: &[u8], dst: &mut [u8]) {
    // Sub-block b's sixteen bytes are qs[16b..16b + 16], from byte 8.
    super::transpose_lanes(&src[8..BLOCK], 16, 4, &mut dst[..128], false);
    dst[128..136].copy_from_slice(&src[..8]);
}

/// A packed super-block's eight signed sub-block scales `ls - 32` (the
/// reference of [`scales`]).
pub fn scales_scalar(block: &[u8]) -> [i32; 8] {
    std::array::from_fn(|b| iq4_xs_scale([block[130], block[131]], &block[132..136], b))
}

/// A packed super-block's signed sub-block scales (eight i32 lanes) and
/// `d` (in every lane): lane `b`'s `ls` is bits `4b..4b + 4` of the
/// little-endian `scales_l` word with bits `2b..2b + 2` of `scales_h`
/// above them (two variable shifts of broadcast words).
///
/// # Safety
/// The CPU must run AVX2 and F16C; `p` must point at a packed super-block.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn scales(p: *const u8) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's pointer covers the super-block's last 8 bytes.
    unsafe {
        let h = (p.add(130) as *const u16).read_unaligned() as i32;
        let l = (p.add(132) as *const u32).read_unaligned() as i32;
        let low = _mm256_srlv_epi32(_mm256_set1_epi32(l), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
        let high = _mm256_srlv_epi32(_mm256_set1_epi32(h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        let ls = _mm256_or_si256(
            _mm256_and_si256(low, _mm256_set1_epi32(15)),
            _mm256_slli_epi32::<4>(_mm256_and_si256(high, _mm256_set1_epi32(3))),
        );
        let d = _mm256_cvtph_ps(_mm_set1_epi16((p.add(128) as *const i16).read_unaligned()));
        (_mm256_sub_epi32(ls, _mm256_set1_epi32(32)), d)
    }
}

/// A packed super-block's `d · (ls - 32)` in lane `b` ([`scales`]' two
/// parts multiplied: exact, an f16 times a 6-bit integer), the factor of
/// its term ([`crate::gguf::qdot::dot`]'s IQ4_XS row).
///
/// # Safety
/// As [`scales`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn scaled_d(p: *const u8) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: forwarded.
    unsafe {
        let (sc, d) = scales(p);
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc))
    }
}
