//! A tile of up to 16 weight rows decoded for the AMX product: each row's
//! codes as signed bytes in their natural order (block `b`'s 32 codes at
//! `32b..32b + 32`: what one row of an AMX `A` tile reads), and per block
//! the factors of [`super::super::combine`]'s term, widened once.
//!
//! The codes are [`super::super::reference::codes`] less the offset the
//! term subtracts (`8` for Q4_0, `16` for Q5_0, `4` for Q3_K, `32` for
//! Q6_K), so the tile's integer sum of a block is the term's integer
//! `lo + hi − off·S` (or, per half, `lo − off·s₀`) itself, exactly.

use super::super::super::types::{e8m0_to_f32_half, f16_le, iq4_xs_scale, q3_k_scale, scale_min_k4, GgmlType, QK};
use super::{line_bytes_mut, zeroed_lines, Line, ROWS};

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
    pub(super) codes: Vec<Line>,
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
        // Rows past the tile's keep what they hold: their sums are never
        // read (the terms run over the tile's rows only).
        if self.codes.len() != ROWS * cols / 64 {
            zeroed_lines(&mut self.codes, ROWS * cols);
        }
        let all = line_bytes_mut(&mut self.codes);
        // Every factor of the tile's rows is written below.
        for v in [&mut self.wd, &mut self.wm] {
            v.resize(ROWS * nb, 0.0);
        }
        for v in [&mut self.sc, &mut self.mn] {
            v.resize(2 * ROWS * nb, 0);
        }
        for (r, row) in rows.chunks_exact(rb).enumerate() {
            let codes = &mut all[r * cols..(r + 1) * cols];
            let at = r * nb;
            let (wd, wm) = (&mut self.wd[at..at + nb], &mut self.wm[at..at + nb]);
            let (sc, mn) = (&mut self.sc[2 * at..2 * (at + nb)], &mut self.mn[2 * at..2 * (at + nb)]);
            factors(ty, row, wd, wm, sc, mn);
            #[cfg(target_arch = "x86_64")]
            if crate::Isa::Avx512Vnni.runs() {
                // SAFETY: AVX-512 (F, BW, VL) runs here; `codes` holds the row's
                // `cols` codes and `row` its bytes.
                unsafe { x86::codes(ty, row, codes) };
                continue;
            }
            codes_scalar(ty, row, codes);
        }
    }
}

/// The per-block factors of one row of `ty` (one loop per type: with the
/// type tested per block, the branch took most of the decode).
fn factors(ty: GgmlType, row: &[u8], wd: &mut [f32], wm: &mut [f32], sc: &mut [i32], mn: &mut [i32]) {
    let blocks = row.chunks_exact(ty.block_bytes());
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL => {
            for (p, d) in blocks.zip(wd.iter_mut()) {
                *d = f16_le([p[0], p[1]]);
            }
        }
        GgmlType::MXFP4 => {
            for (p, d) in blocks.zip(wd.iter_mut()) {
                *d = e8m0_to_f32_half(p[0]);
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            for (p, (d, m)) in blocks.zip(wd.iter_mut().zip(wm.iter_mut())) {
                (*d, *m) = (f16_le([p[0], p[1]]), f16_le([p[2], p[3]]));
            }
        }
        GgmlType::IQ4_XS => {
            for (p, wd) in blocks.zip(wd.chunks_exact_mut(8)) {
                let d = f16_le([p[0], p[1]]);
                for (b, v) in wd.iter_mut().enumerate() {
                    // Exact: an f16 times a 6-bit integer.
                    *v = d * iq4_xs_scale([p[2], p[3]], &p[4..8], b) as f32;
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            for (p, (wd, wm)) in blocks.zip(wd.chunks_exact_mut(8).zip(wm.chunks_exact_mut(8))) {
                let (d, dmin) = (f16_le([p[0], p[1]]), f16_le([p[2], p[3]]));
                let scales: &[u8; 12] = p[4..16].try_into().expect("12 scale bytes");
                for b in 0..8 {
                    let (s6, m6) = scale_min_k4(scales, b);
                    // Exact: an f16 times a 6-bit integer.
                    (wd[b], wm[b]) = (d * s6 as f32, dmin * m6 as f32);
                }
            }
        }
        GgmlType::Q6_K => {
            for (p, (wd, sc)) in blocks.zip(wd.chunks_exact_mut(8).zip(sc.chunks_exact_mut(16))) {
                wd.fill(f16_le([p[208], p[209]]));
                for (g, v) in sc.iter_mut().enumerate() {
                    *v = p[192 + g] as i8 as i32;
                }
            }
        }
        GgmlType::Q2_K => {
            let it = wd.chunks_exact_mut(8).zip(wm.chunks_exact_mut(8));
            for (p, ((wd, wm), (sc, mn))) in blocks.zip(it.zip(sc.chunks_exact_mut(16).zip(mn.chunks_exact_mut(16)))) {
                wd.fill(f16_le([p[80], p[81]]));
                wm.fill(f16_le([p[82], p[83]]));
                for g in 0..16 {
                    (sc[g], mn[g]) = ((p[g] & 15) as i32, (p[g] >> 4) as i32);
                }
            }
        }
        GgmlType::Q3_K => {
            for (p, (wd, sc)) in blocks.zip(wd.chunks_exact_mut(8).zip(sc.chunks_exact_mut(16))) {
                wd.fill(f16_le([p[108], p[109]]));
                for (g, v) in sc.iter_mut().enumerate() {
                    *v = q3_k_scale(&p[96..108], g);
                }
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no codes"),
    }
}

/// The codes of one row of `ty`, less the term's offset (the reference
/// of the vector decode: [`super::super::reference::codes`] spelled out).
fn codes_scalar(ty: GgmlType, row: &[u8], codes: &mut [i8]) {
    let bs = ty.block_bytes();
    for (s, p) in row.chunks_exact(bs).enumerate() {
        let out = &mut codes[s * ty.block_elems()..(s + 1) * ty.block_elems()];
        for b in 0..ty.block_elems() / QK {
            let c = &mut out[QK * b..QK * (b + 1)];
            for (v, x) in c.iter_mut().zip(super::super::reference::codes(ty, p, b)) {
                *v = (x - offset(ty)) as i8;
            }
        }
    }
}

/// What the term subtracts from each code (see the module docs).
pub(super) fn offset(ty: GgmlType) -> i16 {
    match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q3_K => 4,
        GgmlType::Q6_K => 32,
        _ => 0,
    }
}

/// The vector decode: every block's 32 codes in one AVX2 register.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::super::super::types::{GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4, QK};

    /// A 16-entry byte table in both halves of a register.
    #[inline(always)]
    unsafe fn table(t: [i8; 16]) -> __m256i {
        // SAFETY: `t` holds 16 bytes.
        let x = unsafe { _mm_loadu_si128(t.as_ptr().cast()) };
        _mm256_set_m128i(x, x)
    }

    /// The 16 bytes at `p` as 32 nibbles: the low ones, then the high ones.
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: the caller's `p` holds 16 bytes.
        let x = unsafe { _mm_loadu_si128(p.cast()) };
        let m = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m))
    }

    /// Bytes of `x` shifted right by `n` (within each byte), masked to `m`.
    #[inline(always)]
    unsafe fn bits(x: __m256i, n: u32, m: i8) -> __m256i {
        _mm256_and_si256(_mm256_srl_epi16(x, _mm_cvtsi32_si128(n as i32)), _mm256_set1_epi8(m))
    }

    /// `codes_scalar`'s codes.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL run here; `row` holds whole blocks of `ty` and
    /// `codes` their elements.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn codes(ty: GgmlType, row: &[u8], codes: &mut [i8]) {
        let bs = ty.block_bytes();
        let n = row.len() / bs;
        assert!(codes.len() >= n * ty.block_elems(), "codes for every element");
        let (p0, c0) = (row.as_ptr(), codes.as_mut_ptr());
        let store = |i: usize, v: __m256i| {
            // SAFETY: `i` is a block of the row, `codes` holds its 32 codes.
            unsafe { _mm256_storeu_si256(c0.add(QK * i).cast(), v) }
        };
        let lut = |t: [i8; 16]| unsafe { table(t) };
        let four: [i8; 16] = std::array::from_fn(|i| i as i8 - 8);
        let plain: [i8; 16] = std::array::from_fn(|i| i as i8);
        // SAFETY (every block below): `p` starts a whole block of `ty` in
        // `row`, and every read stays inside it.
        unsafe {
            match ty {
                GgmlType::Q8_0 => {
                    for i in 0..n {
                        store(i, _mm256_loadu_si256(p0.add(bs * i + 2).cast()));
                    }
                }
                GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 | GgmlType::Q4_1 => {
                    let (t, at) = match ty {
                        GgmlType::Q4_0 => (lut(four), 2),
                        GgmlType::IQ4_NL => (lut(KVALUES_IQ4NL), 2),
                        GgmlType::MXFP4 => (lut(KVALUES_MXFP4), 1),
                        _ => (lut(plain), 4),
                    };
                    for i in 0..n {
                        store(i, _mm256_shuffle_epi8(t, nibbles(p0.add(bs * i + at))));
                    }
                }
                GgmlType::Q5_0 | GgmlType::Q5_1 => {
                    let (at, qh, off) = if ty == GgmlType::Q5_0 { (6, 2, 16) } else { (8, 4, 0) };
                    for i in 0..n {
                        let p = p0.add(bs * i);
                        let v = nibbles(p.add(at));
                        let m = (p.add(qh) as *const u32).read_unaligned().to_le();
                        let v = _mm256_mask_add_epi8(v, m, v, _mm256_set1_epi8(16));
                        store(i, _mm256_sub_epi8(v, _mm256_set1_epi8(off)));
                    }
                }
                GgmlType::IQ4_XS => {
                    let t = lut(KVALUES_IQ4NL);
                    for i in 0..n {
                        for b in 0..8 {
                            store(8 * i + b, _mm256_shuffle_epi8(t, nibbles(p0.add(bs * i + 8 + 16 * b))));
                        }
                    }
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    let qs = if ty == GgmlType::Q4_K { 16 } else { 48 };
                    for i in 0..n {
                        let p = p0.add(bs * i);
                        let qh = _mm256_loadu_si256(p.add(16).cast());
                        for j in 0..4 {
                            let x = _mm256_loadu_si256(p.add(qs + 32 * j).cast());
                            for (h, v) in [bits(x, 0, 0x0f), bits(x, 4, 0x0f)].into_iter().enumerate() {
                                let b = 2 * j + h;
                                let v = if ty == GgmlType::Q5_K {
                                    let m = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << b) as i8));
                                    _mm256_mask_add_epi8(v, m, v, _mm256_set1_epi8(16))
                                } else {
                                    v
                                };
                                store(8 * i + b, v);
                            }
                        }
                    }
                }
                GgmlType::Q6_K => {
                    for i in 0..n {
                        let p = p0.add(bs * i);
                        for b in 0..8 {
                            let (h, k) = (b / 4, b % 4);
                            let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (k & 1)).cast());
                            let low = bits(ql, if k < 2 { 0 } else { 4 }, 0x0f);
                            let qh = _mm256_loadu_si256(p.add(128 + 32 * h).cast());
                            let high = _mm256_slli_epi16(bits(qh, 2 * k as u32, 3), 4);
                            store(
                                8 * i + b,
                                _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32)),
                            );
                        }
                    }
                }
                GgmlType::Q2_K | GgmlType::Q3_K => {
                    let q3 = ty == GgmlType::Q3_K;
                    let qs = if q3 { 32 } else { 16 };
                    for i in 0..n {
                        let p = p0.add(bs * i);
                        let hm = _mm256_loadu_si256(p.cast());
                        for b in 0..8 {
                            let x = _mm256_loadu_si256(p.add(qs + 32 * (b / 4)).cast());
                            let v = bits(x, 2 * (b % 4) as u32, 3);
                            let v = if q3 {
                                let m = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((1u8 << b) as i8));
                                _mm256_sub_epi8(_mm256_mask_add_epi8(v, m, v, _mm256_set1_epi8(4)), _mm256_set1_epi8(4))
                            } else {
                                v
                            };
                            store(8 * i + b, v);
                        }
                    }
                }
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no codes"),
            }
        }
    }
}
