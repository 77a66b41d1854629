//! The scalar definition of the integer sums: each 32-element block's
//! weight codes spelled out one by one ([`codes`]), multiplied by the
//! activation codes in `i32`.

use super::super::types::{GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4, QK};
use super::{Raw, Sums};

/// The portable path.
pub(crate) struct Scalar;

impl Sums for Scalar {
    #[inline(always)]
    unsafe fn raw(ty: GgmlType, chunk: &[u8], q: &[i8], nblocks: usize) -> Raw {
        let mut raw = Raw::default();
        for b in 0..nblocks {
            let c = codes(ty, chunk, b);
            let qb = &q[b * QK..(b + 1) * QK];
            let mut lo = 0i32;
            let mut hi = 0i32;
            for i in 0..16 {
                lo += c[i] as i32 * qb[i] as i32;
                hi += c[i + 16] as i32 * qb[i + 16] as i32;
            }
            raw.lo[b] = lo;
            raw.hi[b] = hi;
        }
        raw
    }
}

/// The 32 weight codes of block `b` of a chunk: up to eight blocks of a
/// 32-element type, or the 8 sub-blocks of one K-quant super-block. The
/// codes are unsigned (0..=63) except Q8_0's, which are its signed bytes,
/// MXFP4's, `kvalues_mxfp4[nibble]` (-12..=12), and IQ4_NL's and IQ4_XS's,
/// `kvalues_iq4nl[nibble]` (-127..=113).
pub(crate) fn codes(ty: GgmlType, chunk: &[u8], b: usize) -> [i16; QK] {
    let mut c = [0i16; QK];
    let nib = |qs: &[u8], c: &mut [i16; QK]| {
        for j in 0..16 {
            c[j] = (qs[j] & 0x0f) as i16;
            c[j + 16] = (qs[j] >> 4) as i16;
        }
    };
    let high5 = |qh: &[u8], c: &mut [i16; QK]| {
        let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        for (j, v) in c.iter_mut().enumerate() {
            *v |= (((qh >> j) & 1) << 4) as i16;
        }
    };
    match ty {
        GgmlType::Q8_0 => {
            let p = &chunk[34 * b..];
            for (v, &x) in c.iter_mut().zip(&p[2..34]) {
                *v = x as i8 as i16;
            }
        }
        GgmlType::Q4_0 => nib(&chunk[18 * b + 2..], &mut c),
        GgmlType::MXFP4 => {
            // sumi += kvalues_mxfp4[x[ib].qs[j] & 0xf] * y[ib].qs[j] + kvalues_mxfp4[x[ib].qs[j] >> 4] * y[ib].qs[j + QK_MXFP4/2]
            nib(&chunk[17 * b + 1..], &mut c);
            for v in &mut c {
                *v = KVALUES_MXFP4[*v as usize] as i16;
            }
        }
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            // sumi1 += q8[j] * kvalues_iq4nl[q4[j] & 0xf]; sumi2 += q8[j + 16] * kvalues_iq4nl[q4[j] >> 4]
            let at = if ty == GgmlType::IQ4_NL { 18 * b + 2 } else { 8 + 16 * b };
            nib(&chunk[at..], &mut c);
            for v in &mut c {
                *v = KVALUES_IQ4NL[*v as usize] as i16;
            }
        }
        GgmlType::Q4_1 => nib(&chunk[20 * b + 4..], &mut c),
        GgmlType::Q5_0 => {
            let p = &chunk[22 * b..];
            nib(&p[6..], &mut c);
            high5(&p[2..6], &mut c);
        }
        GgmlType::Q5_1 => {
            let p = &chunk[24 * b..];
            nib(&p[8..], &mut c);
            high5(&p[4..8], &mut c);
        }
        GgmlType::Q2_K | GgmlType::Q3_K => {
            // Bits 2j..2j + 2 of qs[32n + l] for block b = 4n + j; Q3_K's
            // third bit is bit b of hmask[l].
            let qs = if ty == GgmlType::Q2_K { 16 } else { 32 };
            for (l, v) in c.iter_mut().enumerate() {
                *v = ((chunk[qs + 32 * (b / 4) + l] >> (2 * (b % 4))) & 3) as i16;
                if ty == GgmlType::Q3_K {
                    *v |= (((chunk[l] >> b) & 1) << 2) as i16;
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Sub-block 2i: low nibbles of qs[32i..32i + 32]; 2i + 1: high.
            let qs_at = if ty == GgmlType::Q4_K { 16 } else { 48 };
            let qs = &chunk[qs_at + 32 * (b / 2)..qs_at + 32 * (b / 2) + 32];
            for (l, v) in c.iter_mut().enumerate() {
                *v = if b.is_multiple_of(2) { qs[l] & 0x0f } else { qs[l] >> 4 } as i16;
                if ty == GgmlType::Q5_K {
                    // Bit 4 of sub-block b's element l: bit b of qh[l].
                    *v |= (((chunk[16 + l] >> b) & 1) << 4) as i16;
                }
            }
        }
        GgmlType::Q6_K => {
            // Half h = b / 4, k = b % 4: low 4 bits from ql[64h + l + 32 (k & 1)]
            // (low nibble for k < 2), high 2 bits (qh[32h + l] >> 2k) & 3.
            let (h, k) = (b / 4, b % 4);
            for (l, v) in c.iter_mut().enumerate() {
                let ql = chunk[64 * h + l + 32 * (k & 1)];
                let low = if k < 2 { ql & 0x0f } else { ql >> 4 };
                let high = (chunk[128 + 32 * h + l] >> (2 * k)) & 3;
                *v = (low | (high << 4)) as i16;
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no codes"),
    }
    c
}
