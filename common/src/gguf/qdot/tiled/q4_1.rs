//! Q4_1 and Q5_1 rows (a scale `d` and a min `m` per 32-element block,
//! `x = d · q + m`) arranged for prefill.
//!
//! A block's term is `(d · dx) · f32(Σ q·x) + (m · dx) · f32(S)`
//! ([`super::super::combine`]), `S` the activation block's code total.
//! llama.cpp's quantizer writes Q5_1 where a row is too narrow for a Q5_K
//! (a Q5_K_M file's 1,408-wide experts); Q4_1 files are older. Neither is
//! packed for decode, which folds them as stored; a prefill arranges each
//! row per product ([`arrange`]): the codes `q` (0..15, or 0..31 with the
//! fifth bits) unpacked and chunk-transposed as Q4_0's are, `d` and `m`
//! widened per block (`d` and `dmin` of the [`ArrangedRow`]), and the
//! blocks past the last whole chunk in a tail of their own: the `k`
//! scales `d`, the `k` mins `m` (f16), then eight steps of `4k` code bytes.
//! The chunk loops form the term in `whole_term`, the tail in
//! `tail_lanes` (`x86.rs`).

use super::super::super::types::{f16_le, GgmlType, QK};
use super::{transpose_lanes, ArrangedRow, CHUNK};
use crate::Isa;

/// Tail bytes per block: `d`, `m` and 32 code bytes.
pub(super) const TAIL_BLOCK: usize = 36;

/// Where a block's fifth bits (Q5_1) and nibble pairs start.
fn layout(ty: GgmlType) -> (Option<usize>, usize) {
    if ty == GgmlType::Q5_1 {
        (Some(4), 8)
    } else {
        (None, 4)
    }
}

/// A block's 32 codes in element order (`i < 16`: the low nibble of byte
/// `i`, `16 + i` its high nibble, each with its fifth bit for Q5_1).
fn block_codes(isa: Isa, ty: GgmlType, block: &[u8], out: &mut [u8]) {
    let (qh, qs) = layout(ty);
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && isa.runs() {
        // SAFETY: the CPU runs AVX2; `block` holds the type's block and
        // `out` 32 bytes.
        return unsafe {
            super::x86::five_bit_codes(
                block.as_ptr().add(qs),
                qh.map(|h| block.as_ptr().add(h)),
                0,
                out.as_mut_ptr(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    let bits = qh.map_or(0, |h| {
        u32::from_le_bytes([block[h], block[h + 1], block[h + 2], block[h + 3]])
    });
    let nibbles: &[u8; 16] = block[qs..qs + 16].try_into().expect("16 bytes of nibble pairs");
    for i in 0..16 {
        let (lo, hi) = crate::gguf::dequant::codes5(nibbles, bits, i);
        (out[i], out[16 + i]) = (lo as u8, hi as u8);
    }
}

/// Lays out `row` (Q4_1 or Q5_1) for `dot_many_arranged` (the caller
/// checked the type, the width and the instruction set).
pub(super) fn arrange(isa: Isa, ty: GgmlType, row: &[u8], out: &mut ArrangedRow) {
    let bs = ty.block_bytes();
    let blocks = row.len() / bs;
    let chunks = blocks * QK / CHUNK;
    out.ty = Some(ty);
    out.isa = Some(isa);
    out.cols = blocks * QK;
    out.codes.resize(chunks * CHUNK, 0);
    out.d.resize(chunks * 8, 0.0);
    out.dmin.resize(chunks * 8, 0.0);
    out.k_scales.clear();
    out.k_scales.resize(chunks * 16, 0);
    let mut natural = [0u8; CHUNK];
    for (c, chunk) in row[..chunks * 8 * bs].chunks_exact(8 * bs).enumerate() {
        for (b, block) in chunk.chunks_exact(bs).enumerate() {
            out.d[8 * c + b] = f16_le([block[0], block[1]]);
            out.dmin[8 * c + b] = f16_le([block[2], block[3]]);
            block_codes(isa, ty, block, &mut natural[QK * b..QK * (b + 1)]);
        }
        let dst = &mut out.codes[c * CHUNK..(c + 1) * CHUNK];
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && isa.runs() {
            // SAFETY: AVX2 runs; eight 32-byte blocks in, 256 bytes out.
            unsafe { super::x86::transpose32(natural.as_ptr(), QK, dst.as_mut_ptr(), false) };
            continue;
        }
        transpose_lanes(&natural, QK, QK / 4, dst, false);
    }
    let tail = &row[chunks * 8 * bs..];
    let k = tail.len() / bs;
    out.tail.clear();
    out.tail.resize(k * TAIL_BLOCK, 0);
    for (b, block) in tail.chunks_exact(bs).enumerate() {
        out.tail[2 * b..2 * b + 2].copy_from_slice(&block[..2]);
        out.tail[2 * k + 2 * b..2 * k + 2 * b + 2].copy_from_slice(&block[2..4]);
        block_codes(isa, ty, block, &mut natural[QK * b..QK * (b + 1)]);
    }
    transpose_lanes(&natural[..k * QK], QK, QK / 4, &mut out.tail[4 * k..], false);
}
