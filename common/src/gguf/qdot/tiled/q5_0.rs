//! Q5_0 rows arranged as the Q8_0 rows they equal.
//!
//! A Q5_0 block holds `d` and 32 five-bit codes `q` (`x = d · (q − 16)`);
//! its term is `(d · dx) · f32(Σ q·x − 16 S)` ([`super::super::combine`]).
//! A Q8_0 block of the same `d` and the codes `q − 16` (−16..15) has the
//! term `(d · dx) · f32(Σ (q − 16)·x)`: the same integer, exactly, so the
//! same bits. Llama.cpp's quantizer writes Q5_0 where a row is too narrow
//! for its K-quant (a Q4_K_M file's matrices of 1,408 or 2,880 columns), so
//! a prefill meets such rows next to Q4_K ones; [`super::arrange_row_on`]
//! gives them the Q8_0 products through this conversion. (A packed decode
//! copy would take the Q8_0 size, 34 bytes a block instead of 22, so decode
//! keeps folding the rows as stored.)

use super::super::super::types::GgmlType;
use crate::Isa;

/// Bytes of a Q5_0 block: `d`, 32 fifth bits, 16 bytes of nibble pairs.
const BLOCK: usize = 22;

/// Bytes of a Q8_0 block: `d`, 32 codes.
const Q8_BLOCK: usize = 34;

/// `row`'s blocks as Q8_0 blocks (`out` cleared first): the same `d`, the
/// codes `q − 16`. Element `i < 16` of a block is the low nibble of byte
/// `i` of its nibble pairs, `16 + i` the high one, each with bit `i` (or
/// `16 + i`) of its fifth bits, as `reference::codes` reads them. AVX2
/// CPUs convert a block in registers ([`x86::block`]), the same bytes.
pub(crate) fn as_q8_0(isa: Isa, row: &[u8], out: &mut Vec<u8>) {
    debug_assert_eq!(GgmlType::Q5_0.block_bytes(), BLOCK);
    debug_assert_eq!(GgmlType::Q8_0.block_bytes(), Q8_BLOCK);
    let blocks = row.len() / BLOCK;
    out.clear();
    out.resize(blocks * Q8_BLOCK, 0);
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && isa.runs() {
        for (b, o) in row.chunks_exact(BLOCK).zip(out.chunks_exact_mut(Q8_BLOCK)) {
            o[..2].copy_from_slice(&b[..2]);
            // SAFETY: the CPU runs AVX2; `b` holds a block (22 bytes) and
            // `o` 32 code bytes after the scale.
            unsafe { x86::block(b.as_ptr(), o[2..].as_mut_ptr()) };
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    for (b, o) in row.chunks_exact(BLOCK).zip(out.chunks_exact_mut(Q8_BLOCK)) {
        o[..2].copy_from_slice(&b[..2]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let code = |i: usize, nibble: u8| ((nibble | ((((qh >> i) & 1) as u8) << 4)) as i8 - 16) as u8;
        for i in 0..16 {
            o[2 + i] = code(i, b[6 + i] & 0x0f);
            o[18 + i] = code(16 + i, b[6 + i] >> 4);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// One block's 32 codes `q − 16` at `out`: the nibbles split (low
    /// nibbles the first 16 bytes, high the last 16), each byte's fifth
    /// bit found by replicating qh byte `i / 8` into byte `i` and testing
    /// bit `i mod 8`.
    ///
    /// # Safety
    /// AVX2; `block` readable for 22 bytes, `out` writable for 32.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn block(block: *const u8, out: *mut u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let qs = _mm_loadu_si128(block.add(6) as *const __m128i);
            let low4 = _mm_set1_epi8(0x0f);
            let nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low4), _mm_and_si128(qs, low4));
            let qh = _mm256_set1_epi32((block.add(2) as *const i32).read_unaligned());
            let spread = _mm256_shuffle_epi8(
                qh,
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                ),
            );
            let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
            let codes = _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
            _mm256_storeu_si256(out as *mut __m256i, _mm256_sub_epi8(codes, _mm256_set1_epi8(16)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::dequant::dequantize;

    #[test]
    fn the_q8_0_blocks_hold_the_same_values() {
        // Every code 0..31 at every position, and two scales.
        let mut row = Vec::new();
        for b in 0..64u32 {
            let mut block = [0u8; BLOCK];
            block[..2].copy_from_slice(&(0x3c00u16 + b as u16).to_le_bytes());
            let code = |i: u32| (i * 7 + b) % 32;
            let qh: u32 = (0..32).map(|i| ((code(i) >> 4) & 1) << i).sum();
            block[2..6].copy_from_slice(&qh.to_le_bytes());
            for i in 0..16 {
                block[6 + i as usize] = (code(i) & 0x0f) as u8 | (((code(16 + i) & 0x0f) as u8) << 4);
            }
            row.extend_from_slice(&block);
        }
        let cols = 64 * 32;
        let want = dequantize(GgmlType::Q5_0, &row, cols).expect("a Q5_0 row");
        for &isa in Isa::available() {
            let mut q8 = vec![7; 3];
            as_q8_0(isa, &row, &mut q8);
            assert_eq!(q8.len(), 64 * Q8_BLOCK);
            let got = dequantize(GgmlType::Q8_0, &q8, cols).expect("a Q8_0 row");
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{isa:?}");
        }
    }
}
