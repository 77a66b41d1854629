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
/// `16 + i`) of its fifth bits, as `reference::codes` reads them: AVX2
/// CPUs convert a block in registers (`x86::five_bit_codes`), others take
/// [`crate::gguf::dequant::q5_0_as_q8_0`] (the same bytes).
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
            unsafe { super::x86::five_bit_codes(b.as_ptr().add(6), Some(b.as_ptr().add(2)), 16, o[2..].as_mut_ptr()) };
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    *out = crate::gguf::dequant::q5_0_as_q8_0(row);
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
