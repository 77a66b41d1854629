//! A tile of up to 16 weight rows decoded for the AMX product: each row's
//! codes as signed bytes in their natural order (block `b`'s 32 codes at
//! `32b..32b + 32`: what one row of an AMX `A` tile reads), and per block
//! the factors of [`super::super::combine`]'s term, widened once.
//!
//! The codes are [`super::super::reference::codes`] less the offset the
//! term subtracts (`8` for Q4_0, `16` for Q5_0, `4` for Q3_K, `32` for
//! Q6_K), so the tile's integer sum of a block is the term's integer
//! `lo + hi − off·S` (or, per half, `lo − off·s₀`) itself, exactly.

use super::super::super::types::{
    e8m0_to_f32_half, f16_le, iq4_xs_scale, q3_k_scale, scale_min_k4, GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4, QK, QK_K,
};
use super::ROWS;

/// Decoded weight rows (reused between tiles: decoding allocates only when
/// a tile is wider than any before).
#[derive(Clone, Debug, Default)]
pub struct WeightTile {
    pub(super) ty: Option<GgmlType>,
    /// Rows decoded (the rest of the 16 are zero codes).
    pub(super) rows: usize,
    /// Elements per row.
    pub(super) cols: usize,
    /// `ROWS × cols` signed codes, row-major.
    pub(super) codes: Vec<i8>,
    /// Per row and block (`r · blocks + b`): the factor multiplied by the
    /// activation scale (`d`, `d·sc`, `d·(ls − 32)`, `2^(e−128)`).
    pub(super) wd: Vec<f32>,
    /// Per row and block: Q4_1 / Q5_1 `m`, Q4_K / Q5_K `dmin·mn`, Q2_K `dmin`.
    pub(super) wm: Vec<f32>,
    /// Per row and half block (`r · 2 blocks + 2b + h`): the integer scale
    /// of Q2_K, Q3_K and Q6_K halves.
    pub(super) sc: Vec<i32>,
    /// Per row and half block: Q2_K's integer mins.
    pub(super) mn: Vec<i32>,
}

impl WeightTile {
    /// Decodes `rows` (whole rows of `ty`, `cols` elements each, at most
    /// [`ROWS`] of them) into this tile.
    ///
    /// # Panics
    /// If `ty` is not one [`super::usable`] takes, or the shapes do not match.
    pub fn decode(&mut self, ty: GgmlType, rows: &[u8], cols: usize) {
        let rb = ty.row_bytes(cols).expect("a quantized row");
        assert!(rb > 0 && rows.len().is_multiple_of(rb), "whole rows of {ty}");
        let n = rows.len() / rb;
        assert!(n <= ROWS, "at most {ROWS} rows a tile");
        let nb = cols / QK;
        self.ty = Some(ty);
        self.rows = n;
        self.cols = cols;
        self.codes.clear();
        self.codes.resize(ROWS * cols, 0);
        for v in [&mut self.wd, &mut self.wm] {
            v.clear();
            v.resize(ROWS * nb, 0.0);
        }
        for v in [&mut self.sc, &mut self.mn] {
            v.clear();
            v.resize(2 * ROWS * nb, 0);
        }
        for (r, row) in rows.chunks_exact(rb).enumerate() {
            let codes = &mut self.codes[r * cols..(r + 1) * cols];
            let at = r * nb;
            let (wd, wm) = (&mut self.wd[at..at + nb], &mut self.wm[at..at + nb]);
            let (sc, mn) = (&mut self.sc[2 * at..2 * (at + nb)], &mut self.mn[2 * at..2 * (at + nb)]);
            decode_row(ty, row, codes, wd, wm, sc, mn);
        }
    }
}

/// The low nibbles of `qs` (16 bytes) then their high nibbles, through `f`.
#[inline(always)]
fn nibbles(qs: &[u8], out: &mut [i8], f: impl Fn(u8) -> i8) {
    for j in 0..16 {
        out[j] = f(qs[j] & 0x0f);
        out[j + 16] = f(qs[j] >> 4);
    }
}

/// Q5_0's and Q5_1's fifth bits (`qh`, little-endian) into the codes.
#[inline(always)]
fn fifth_bits(qh: &[u8], out: &mut [i8], off: i8) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, v) in out.iter_mut().enumerate() {
        *v = (*v + off) | ((((qh >> j) & 1) << 4) as i8);
        *v -= off;
    }
}

/// One row of `ty`: codes, and the factors of each block.
fn decode_row(
    ty: GgmlType,
    row: &[u8],
    codes: &mut [i8],
    wd: &mut [f32],
    wm: &mut [f32],
    sc: &mut [i32],
    mn: &mut [i32],
) {
    let bs = ty.block_bytes();
    match ty {
        GgmlType::Q8_0 => {
            for ((p, c), d) in row.chunks_exact(bs).zip(codes.chunks_exact_mut(QK)).zip(wd.iter_mut()) {
                *d = f16_le([p[0], p[1]]);
                for (v, &x) in c.iter_mut().zip(&p[2..2 + QK]) {
                    *v = x as i8;
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::IQ4_NL => {
            for ((p, c), d) in row.chunks_exact(bs).zip(codes.chunks_exact_mut(QK)).zip(wd.iter_mut()) {
                *d = f16_le([p[0], p[1]]);
                if ty == GgmlType::Q4_0 {
                    nibbles(&p[2..18], c, |x| x as i8 - 8);
                } else {
                    nibbles(&p[2..18], c, |x| KVALUES_IQ4NL[x as usize]);
                }
            }
        }
        GgmlType::MXFP4 => {
            for ((p, c), d) in row.chunks_exact(bs).zip(codes.chunks_exact_mut(QK)).zip(wd.iter_mut()) {
                *d = e8m0_to_f32_half(p[0]);
                nibbles(&p[1..17], c, |x| KVALUES_MXFP4[x as usize]);
            }
        }
        GgmlType::Q5_0 => {
            for ((p, c), d) in row.chunks_exact(bs).zip(codes.chunks_exact_mut(QK)).zip(wd.iter_mut()) {
                *d = f16_le([p[0], p[1]]);
                nibbles(&p[6..22], c, |x| x as i8 - 16);
                fifth_bits(&p[2..6], c, 16);
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let five = ty == GgmlType::Q5_1;
            let it = row
                .chunks_exact(bs)
                .zip(codes.chunks_exact_mut(QK))
                .zip(wd.iter_mut().zip(wm.iter_mut()));
            for ((p, c), (d, m)) in it {
                (*d, *m) = (f16_le([p[0], p[1]]), f16_le([p[2], p[3]]));
                if five {
                    nibbles(&p[8..24], c, |x| x as i8);
                    fifth_bits(&p[4..8], c, 0);
                } else {
                    nibbles(&p[4..20], c, |x| x as i8);
                }
            }
        }
        GgmlType::IQ4_XS => {
            for (s, p) in row.chunks_exact(bs).enumerate() {
                let d = f16_le([p[0], p[1]]);
                for b in 0..8 {
                    // Exact: an f16 times a 6-bit integer.
                    wd[8 * s + b] = d * iq4_xs_scale([p[2], p[3]], &p[4..8], b) as f32;
                    let c = &mut codes[QK_K * s + QK * b..QK_K * s + QK * (b + 1)];
                    nibbles(&p[8 + 16 * b..24 + 16 * b], c, |x| KVALUES_IQ4NL[x as usize]);
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let qs_at = if ty == GgmlType::Q4_K { 16 } else { 48 };
            for (s, p) in row.chunks_exact(bs).enumerate() {
                let (d, dmin) = (f16_le([p[0], p[1]]), f16_le([p[2], p[3]]));
                let scales: &[u8; 12] = p[4..16].try_into().expect("12 scale bytes");
                for b in 0..8 {
                    let (s6, m6) = scale_min_k4(scales, b);
                    // Exact: an f16 times a 6-bit integer.
                    (wd[8 * s + b], wm[8 * s + b]) = (d * s6 as f32, dmin * m6 as f32);
                    let qs = &p[qs_at + 32 * (b / 2)..qs_at + 32 * (b / 2) + 32];
                    let c = &mut codes[QK_K * s + QK * b..QK_K * s + QK * (b + 1)];
                    let shift = 4 * (b % 2);
                    for (l, v) in c.iter_mut().enumerate() {
                        *v = ((qs[l] >> shift) & 0x0f) as i8;
                        if ty == GgmlType::Q5_K {
                            *v |= (((p[16 + l] >> b) & 1) << 4) as i8;
                        }
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (s, p) in row.chunks_exact(bs).enumerate() {
                let d = f16_le([p[208], p[209]]);
                for b in 0..8 {
                    wd[8 * s + b] = d;
                    let (h, k) = (b / 4, b % 4);
                    sc[16 * s + 2 * b] = p[192 + 2 * b] as i8 as i32;
                    sc[16 * s + 2 * b + 1] = p[193 + 2 * b] as i8 as i32;
                    let c = &mut codes[QK_K * s + QK * b..QK_K * s + QK * (b + 1)];
                    for (l, v) in c.iter_mut().enumerate() {
                        let ql = p[64 * h + l + 32 * (k & 1)];
                        let low = if k < 2 { ql & 0x0f } else { ql >> 4 };
                        let high = (p[128 + 32 * h + l] >> (2 * k)) & 3;
                        *v = (low | (high << 4)) as i8 - 32;
                    }
                }
            }
        }
        GgmlType::Q2_K | GgmlType::Q3_K => {
            let q2 = ty == GgmlType::Q2_K;
            for (s, p) in row.chunks_exact(bs).enumerate() {
                let qs = if q2 { 16 } else { 32 };
                for b in 0..8 {
                    for h in 0..2 {
                        let g = 2 * b + h;
                        if q2 {
                            (sc[16 * s + g], mn[16 * s + g]) = ((p[g] & 15) as i32, (p[g] >> 4) as i32);
                        } else {
                            sc[16 * s + g] = q3_k_scale(&p[96..108], g);
                        }
                    }
                    if q2 {
                        (wd[8 * s + b], wm[8 * s + b]) = (f16_le([p[80], p[81]]), f16_le([p[82], p[83]]));
                    } else {
                        wd[8 * s + b] = f16_le([p[108], p[109]]);
                    }
                    let c = &mut codes[QK_K * s + QK * b..QK_K * s + QK * (b + 1)];
                    for (l, v) in c.iter_mut().enumerate() {
                        let low = (p[qs + 32 * (b / 4) + l] >> (2 * (b % 4))) & 3;
                        *v = if q2 {
                            low as i8
                        } else {
                            (low | (((p[l] >> b) & 1) << 2)) as i8 - 4
                        };
                    }
                }
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no codes"),
    }
}
