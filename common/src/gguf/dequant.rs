//! Scalar reference dequantization of GGML blocks to f32.
//!
//! The result equals the `gguf` Python package's `gguf.quants.dequantize`
//! (0.19.0) bit for bit for every block whose f16 scales are finite: each
//! element is computed with the same binary32 operations in the same order
//! (`gguf/quants.py` works in numpy float32 and never fuses a multiply and
//! an add; Rust does not either). Per type, with `q` the integer code as
//! f32 and `d`, `m`, `dmin` the f16 fields widened to f32:
//!
//! | type | value |
//! |---|---|
//! | Q4_0, Q5_0, Q8_0 | `d * q` (one product) |
//! | Q4_1, Q5_1 | `(d * q) + m` |
//! | Q2_K | `(d * sc) * q - (dmin * m)`, `sc`, `m` the 4-bit scale and min of the 16-element group |
//! | Q3_K | `(d * (sc - 32)) * q`, `sc` the 6-bit scale of the 16-element group, `q` in -4..=3 |
//! | Q4_K, Q5_K | `(d * sc) * q - (dmin * m)`, `sc`, `m` the 6-bit sub-block scale and min |
//! | Q6_K | `(d * sc) * q`, `sc` the i8 scale of the 16-element group |
//! | IQ4_NL | `d * k`, `k` = `kvalues_iq4nl[nibble]` |
//! | IQ4_XS | `(d * (ls - 32)) * k`, `ls` the 6-bit sub-block scale, `k` as IQ4_NL |
//! | MXFP4 | `k * d`, `k` = `kvalues_mxfp4[nibble]`, `d` = `2^(e - 128)` (exact) |
//! | F16 | exact widening, NaN payloads kept as numpy keeps them |
//! | BF16 | `bits << 16` (exact) |
//! | F32 | the stored bits |
//!
//! MXFP4 has no f16 field: its scale is a power of two and its codes
//! small integers, so every value is exact (or infinite, for the largest
//! codes under exponent bytes of 253 and above, as in ggml and the `gguf`
//! package), for every block.
//!
//! Blocks with NaN or infinite scales dequantize to NaN or infinities as
//! numpy's do, but the payload bits of a NaN produced by arithmetic are not
//! promised to match (IEEE leaves them open).

use super::types::{
    e8m0_to_f32_half, f16_bits_to_f32, f16_le, iq4_xs_scale, q3_k_scale, scale_min_k4, BlockIq4Nl, BlockIq4Xs,
    BlockMxfp4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4, QK, QK_K,
};
use super::GgufError;

/// `n` elements of type `ty` stored in `bytes`, dequantized to f32 (the
/// scalar reference). An error when `n` is not a whole number of blocks or
/// `bytes` does not hold exactly `n` elements.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, GgufError> {
    let expected = ty.row_bytes(n);
    if expected != Some(bytes.len()) {
        return Err(GgufError::DataLength {
            ty,
            n,
            expected,
            got: bytes.len(),
        });
    }
    let mut out = vec![0.0; n];
    dequantize_into(ty, bytes, &mut out);
    Ok(out)
}

/// Dequantizes whole blocks of `bytes` into `out` (`out.len()` elements;
/// the caller has checked that `bytes` holds exactly that many). Inlined
/// so that the fast dot path compiles it for its target features.
#[inline(always)]
pub(crate) fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(ty.row_bytes(out.len()), Some(bytes.len()));
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        GgmlType::Q4_0 => blocks::<BlockQ4_0>(bytes, out),
        GgmlType::Q4_1 => blocks::<BlockQ4_1>(bytes, out),
        GgmlType::Q5_0 => blocks::<BlockQ5_0>(bytes, out),
        GgmlType::Q5_1 => blocks::<BlockQ5_1>(bytes, out),
        GgmlType::Q8_0 => blocks::<BlockQ8_0>(bytes, out),
        GgmlType::Q2_K => blocks::<BlockQ2K>(bytes, out),
        GgmlType::Q3_K => blocks::<BlockQ3K>(bytes, out),
        GgmlType::Q4_K => blocks::<BlockQ4K>(bytes, out),
        GgmlType::Q5_K => blocks::<BlockQ5K>(bytes, out),
        GgmlType::Q6_K => blocks::<BlockQ6K>(bytes, out),
        GgmlType::IQ4_NL => blocks::<BlockIq4Nl>(bytes, out),
        GgmlType::IQ4_XS => blocks::<BlockIq4Xs>(bytes, out),
        GgmlType::MXFP4 => blocks::<BlockMxfp4>(bytes, out),
    }
}

/// A block type and its reference dequantization.
pub(crate) trait Block: bytemuck::Pod {
    /// Elements per block.
    const N: usize;
    /// Writes the block's `N` values into `out` (`out.len() == N`).
    fn dequant(&self, out: &mut [f32]);
}

macro_rules! block_impl {
    ($($b:ty => $n:expr, $f:ident;)*) => {
        $(impl Block for $b {
            const N: usize = $n;
            #[inline(always)]
            fn dequant(&self, out: &mut [f32]) {
                $f(self, out.try_into().expect("one block of outputs"));
            }
        })*
    };
}

block_impl! {
    BlockQ4_0 => QK, q4_0;
    BlockQ4_1 => QK, q4_1;
    BlockQ5_0 => QK, q5_0;
    BlockQ5_1 => QK, q5_1;
    BlockQ8_0 => QK, q8_0;
    BlockQ2K => QK_K, q2_k;
    BlockQ3K => QK_K, q3_k;
    BlockQ4K => QK_K, q4_k;
    BlockQ5K => QK_K, q5_k;
    BlockQ6K => QK_K, q6_k;
    BlockIq4Nl => QK, iq4_nl;
    BlockIq4Xs => QK_K, iq4_xs;
    BlockMxfp4 => QK, mxfp4;
}

/// Dequantizes every block of `bytes` into its `B::N` outputs.
#[inline(always)]
fn blocks<B: Block>(bytes: &[u8], out: &mut [f32]) {
    let bs: &[B] = bytemuck::cast_slice(bytes);
    for (b, o) in bs.iter().zip(out.chunks_exact_mut(B::N)) {
        b.dequant(o);
    }
}

// Each block function writes the 16 low-nibble elements and the 16
// high-nibble ones in one loop, so the compiler vectorizes it.

#[inline(always)]
fn q4_0(b: &BlockQ4_0, out: &mut [f32; QK]) {
    // d * ((qs & 0x0F).astype(int8) - 8).astype(float32)
    let d = f16_le(b.d);
    let (lo, hi) = out.split_at_mut(16);
    for j in 0..16 {
        lo[j] = d * ((b.qs[j] & 0x0f) as i32 - 8) as f32;
        hi[j] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
    }
}

#[inline(always)]
fn q4_1(b: &BlockQ4_1, out: &mut [f32; QK]) {
    // (d * qs) + m
    let (d, m) = (f16_le(b.d), f16_le(b.m));
    let (lo, hi) = out.split_at_mut(16);
    for j in 0..16 {
        lo[j] = d * (b.qs[j] & 0x0f) as i32 as f32 + m;
        hi[j] = d * (b.qs[j] >> 4) as i32 as f32 + m;
    }
}

/// The 5-bit codes of elements `j` and `j + 16` of a Q5_0 / Q5_1 block:
/// the nibbles, with bit 4 from bit `j` / `j + 16` of `qh`.
#[inline(always)]
pub(crate) fn codes5(qs: &[u8; 16], qh: u32, j: usize) -> (i32, i32) {
    let v = qs[j] as u32;
    let lo = (v & 0x0f) | (((qh >> j) & 1) << 4);
    let hi = (v >> 4) | (((qh >> (j + 16)) & 1) << 4);
    (lo as i32, hi as i32)
}

/// Q5_0 blocks (`src`, whole blocks) as Q8_0 blocks of the same values:
/// the same `d`, each code `q - 16` as a signed byte. Exact, and the
/// integer products agree too: Q5_0's term `(d * dx) * f32(lo + hi - 16 S)`
/// is Q8_0's `(d * dx) * f32(Σ (q - 16) x)` (`qdot`'s definition), so a
/// product of the Q8_0 rows has the Q5_0 rows' bits and takes the packed
/// Q8_0 kernels, which Q5_0 has none of.
pub fn q5_0_as_q8_0(src: &[u8]) -> Vec<u8> {
    let blocks: &[BlockQ5_0] =
        bytemuck::cast_slice(&src[..src.len() / std::mem::size_of::<BlockQ5_0>() * std::mem::size_of::<BlockQ5_0>()]);
    let mut out = Vec::with_capacity(blocks.len() * GgmlType::Q8_0.block_bytes());
    for b in blocks {
        let qh = u32::from_le_bytes(b.qh);
        let mut codes = [0u8; QK];
        for j in 0..16 {
            let (l, h) = codes5(&b.qs, qh, j);
            codes[j] = (l - 16) as i8 as u8;
            codes[j + 16] = (h - 16) as i8 as u8;
        }
        out.extend_from_slice(&b.d);
        out.extend_from_slice(&codes);
    }
    out
}

#[inline(always)]
fn q5_0(b: &BlockQ5_0, out: &mut [f32; QK]) {
    // d * ((ql | (qh << 4)).astype(int8) - 16).astype(float32)
    let d = f16_le(b.d);
    let qh = u32::from_le_bytes(b.qh);
    let (lo, hi) = out.split_at_mut(16);
    for j in 0..16 {
        let (l, h) = codes5(&b.qs, qh, j);
        lo[j] = d * (l - 16) as f32;
        hi[j] = d * (h - 16) as f32;
    }
}

#[inline(always)]
fn q5_1(b: &BlockQ5_1, out: &mut [f32; QK]) {
    // (d * qs) + m
    let (d, m) = (f16_le(b.d), f16_le(b.m));
    let qh = u32::from_le_bytes(b.qh);
    let (lo, hi) = out.split_at_mut(16);
    for j in 0..16 {
        let (l, h) = codes5(&b.qs, qh, j);
        lo[j] = d * l as f32 + m;
        hi[j] = d * h as f32 + m;
    }
}

#[inline(always)]
fn q8_0(b: &BlockQ8_0, out: &mut [f32; QK]) {
    // x * d
    let d = f16_le(b.d);
    for (o, &q) in out.iter_mut().zip(&b.qs) {
        *o = q as i8 as f32 * d;
    }
}

/// The two-bit code of element `e` (0..256) of a Q2_K / Q3_K block:
/// bits `2j..2j + 2` of `qs[32 (e / 128) + e % 32]`, `j = (e / 32) % 4`.
#[inline(always)]
fn low2(qs: &[u8; 64], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3
}

#[inline(always)]
fn q2_k(b: &BlockQ2K, out: &mut [f32; QK_K]) {
    // dl = d * (scales & 0xF); ml = dmin * (scales >> 4); dl * qs - ml
    let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
    for (g, o) in out.chunks_exact_mut(16).enumerate() {
        let (dl, ml) = (d * (b.scales[g] & 0x0f) as f32, dmin * (b.scales[g] >> 4) as f32);
        for (l, o) in o.iter_mut().enumerate() {
            *o = dl * low2(&b.qs, 16 * g + l) as f32 - ml;
        }
    }
}

#[inline(always)]
fn q3_k(b: &BlockQ3K, out: &mut [f32; QK_K]) {
    // dl = d * (scales - 32); q = ql - ((hmask bit ^ 1) << 2); dl * q
    let d = f16_le(b.d);
    for (g, o) in out.chunks_exact_mut(16).enumerate() {
        let dl = d * q3_k_scale(&b.scales, g) as f32;
        for (l, o) in o.iter_mut().enumerate() {
            let e = 16 * g + l;
            let high = (b.hmask[e % 32] >> (e / 32)) & 1;
            *o = dl * (low2(&b.qs, e) as i32 - 4 * (1 - high as i32)) as f32;
        }
    }
}

/// `(d * sc, dmin * m)` of K-quant sub-block `j` (f32 products).
#[inline(always)]
fn k_scale_min(d: f32, dmin: f32, scales: &[u8; 12], j: usize) -> (f32, f32) {
    let (sc, m) = scale_min_k4(scales, j);
    (d * sc as f32, dmin * m as f32)
}

#[inline(always)]
fn q4_k(b: &BlockQ4K, out: &mut [f32; QK_K]) {
    // d = d * sc; dm = dmin * m; d * qs - dm
    let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
    // Sub-blocks 2i (low nibbles) and 2i + 1 (high nibbles) share qs[32i..32i + 32].
    for (i, (o, qs)) in out.chunks_exact_mut(64).zip(b.qs.chunks_exact(32)).enumerate() {
        let (d0, m0) = k_scale_min(d, dmin, &b.scales, 2 * i);
        let (d1, m1) = k_scale_min(d, dmin, &b.scales, 2 * i + 1);
        let (lo, hi) = o.split_at_mut(32);
        for l in 0..32 {
            lo[l] = d0 * (qs[l] & 0x0f) as f32 - m0;
            hi[l] = d1 * (qs[l] >> 4) as f32 - m1;
        }
    }
}

#[inline(always)]
fn q5_k(b: &BlockQ5K, out: &mut [f32; QK_K]) {
    // d * (ql | (qh << 4)) - dm; bit 4 of sub-block j's element l is bit j of qh[l]
    let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
    for (i, (o, qs)) in out.chunks_exact_mut(64).zip(b.qs.chunks_exact(32)).enumerate() {
        let (d0, m0) = k_scale_min(d, dmin, &b.scales, 2 * i);
        let (d1, m1) = k_scale_min(d, dmin, &b.scales, 2 * i + 1);
        let (lo, hi) = o.split_at_mut(32);
        for l in 0..32 {
            let h = b.qh[l] >> (2 * i);
            lo[l] = d0 * ((qs[l] & 0x0f) | ((h & 1) << 4)) as f32 - m0;
            hi[l] = d1 * ((qs[l] >> 4) | (((h >> 1) & 1) << 4)) as f32 - m1;
        }
    }
}

#[inline(always)]
fn q6_k(b: &BlockQ6K, out: &mut [f32; QK_K]) {
    // d = d * scales; d * ((ql | (qh << 4)).astype(int8) - 32).astype(float32)
    let d = f16_le(b.d);
    // Per half h of 128 and l < 32 (as ggml's dequantize_row_q6_K):
    // y[l], y[l+32], y[l+64], y[l+96] from ql[l], ql[l+32] (low, high nibbles) and qh[l]
    // (bits 0-1, 2-3, 4-5, 6-7); element i has scale i / 16. Each l-half of 16 keeps its scales.
    for (h, o) in out.chunks_exact_mut(128).enumerate() {
        let (ql, qh) = (&b.ql[64 * h..64 * h + 64], &b.qh[32 * h..32 * h + 32]);
        for half in 0..2 {
            let sc = |k: usize| d * b.scales[8 * h + 2 * k + half] as i8 as f32;
            let (s0, s1, s2, s3) = (sc(0), sc(1), sc(2), sc(3));
            for l in 16 * half..16 * half + 16 {
                let (a, c, q) = (ql[l], ql[l + 32], qh[l]);
                o[l] = s0 * (((a & 0x0f) | ((q & 3) << 4)) as i32 - 32) as f32;
                o[l + 32] = s1 * (((c & 0x0f) | (((q >> 2) & 3) << 4)) as i32 - 32) as f32;
                o[l + 64] = s2 * (((a >> 4) | (((q >> 4) & 3) << 4)) as i32 - 32) as f32;
                o[l + 96] = s3 * (((c >> 4) | (((q >> 6) & 3) << 4)) as i32 - 32) as f32;
            }
        }
    }
}

/// IQ4_NL's levels of the 16 low and the 16 high nibbles of `qs`, times
/// `d`, into `out` (32 elements): `d * k`.
#[inline(always)]
fn iq4_levels(d: f32, qs: &[u8], out: &mut [f32]) {
    let (lo, hi) = out.split_at_mut(16);
    for j in 0..16 {
        lo[j] = d * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as f32;
        hi[j] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
    }
}

#[inline(always)]
fn iq4_nl(b: &BlockIq4Nl, out: &mut [f32; QK]) {
    // qs = np.take_along_axis(kvalues, qs, axis=-1).astype(np.float32); d * qs
    iq4_levels(f16_le(b.d), &b.qs, out);
}

#[inline(always)]
fn iq4_xs(b: &BlockIq4Xs, out: &mut [f32; QK_K]) {
    // dl = (d * scales.astype(np.float32)); dl * qs, scales = ls - 32
    let d = f16_le(b.d);
    for (ib, (o, qs)) in out.chunks_exact_mut(QK).zip(b.qs.chunks_exact(16)).enumerate() {
        let dl = d * iq4_xs_scale(b.scales_h, &b.scales_l, ib) as f32;
        iq4_levels(dl, qs, o);
    }
}

#[inline(always)]
fn mxfp4(b: &BlockMxfp4, out: &mut [f32; QK]) {
    // const float d = GGML_E8M0_TO_FP32_HALF(x[i].e);
    // y[i*qk + j + 0] = x0*d; y[i*qk + j + qk/2] = x1*d;  (x0, x1 = kvalues_mxfp4[low, high nibble])
    let d = e8m0_to_f32_half(b.e[0]);
    let (lo, hi) = out.split_at_mut(16);
    for j in 0..16 {
        lo[j] = KVALUES_MXFP4[(b.qs[j] & 0x0f) as usize] as f32 * d;
        hi[j] = KVALUES_MXFP4[(b.qs[j] >> 4) as usize] as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn iq4_blocks_follow_the_definition() {
        // IQ4_NL: byte j = j | (15 - j) << 4: every level once in each half.
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16(0.5));
        for j in 0..16 {
            b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let v = dequantize(GgmlType::IQ4_NL, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], 0.5 * KVALUES_IQ4NL[j] as f32);
            assert_eq!(v[16 + j], 0.5 * KVALUES_IQ4NL[15 - j] as f32);
        }
        assert_eq!((v[0], v[15]), (-63.5, 56.5));
        // IQ4_XS: sub-block scales ls = 0, 9, 18, ..., 63 (ls - 32 from -32
        // to 31), each split into scales_l's nibble and scales_h's two bits.
        let ls: [u16; 8] = [0, 9, 18, 27, 36, 45, 54, 63];
        let mut b = vec![0u8; 136];
        b[..2].copy_from_slice(&f16(0.25));
        let mut h = 0u16;
        for (i, &l) in ls.iter().enumerate() {
            h |= (l >> 4) << (2 * i);
            b[4 + i / 2] |= ((l & 0x0f) as u8) << (4 * (i % 2));
        }
        b[2..4].copy_from_slice(&h.to_le_bytes());
        for (j, q) in b[8..].iter_mut().enumerate() {
            *q = (j % 16) as u8 | (((j / 16) % 16) as u8) << 4;
        }
        let v = dequantize(GgmlType::IQ4_XS, &b, 256).unwrap();
        for (ib, &l) in ls.iter().enumerate() {
            let dl = 0.25 * (l as i32 - 32) as f32;
            for j in 0..16 {
                assert_eq!(v[32 * ib + j], dl * KVALUES_IQ4NL[j] as f32, "sub-block {ib}");
                assert_eq!(v[32 * ib + 16 + j], dl * KVALUES_IQ4NL[ib] as f32, "sub-block {ib}");
            }
            assert_eq!(iq4_xs_scale([b[2], b[3]], &b[4..8], ib), l as i32 - 32);
        }
    }

    #[test]
    fn legacy_blocks_follow_the_definition() {
        // Q4_0: byte j = (j % 16) | (15 - j % 16) << 4.
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16(0.5));
        for j in 0..16 {
            b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let v = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
        for j in 0..16 {
            assert_eq!(v[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(v[16 + j], (7.0 - j as f32) * 0.5);
        }
        // Q5_1 with qh = element parity: q = nibble | (j & 1) << 4.
        let mut b = vec![0u8; 24];
        b[..2].copy_from_slice(&f16(0.25));
        b[2..4].copy_from_slice(&f16(-1.0));
        b[4..8].copy_from_slice(&0xaaaa_aaaau32.to_le_bytes());
        for j in 0..16 {
            b[8 + j] = (j as u8) | ((j as u8) << 4);
        }
        let v = dequantize(GgmlType::Q5_1, &b, 32).unwrap();
        for (j, &v) in v.iter().enumerate() {
            let q = (j % 16) as u32 | ((j as u32 & 1) << 4);
            assert_eq!(v, q as f32 * 0.25 - 1.0, "element {j}");
        }
        // Q8_0: -128 is read as -128.
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16(2.0));
        b[2] = 0x80;
        b[3] = 127;
        let v = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        assert_eq!((v[0], v[1], v[2]), (-256.0, 254.0, 0.0));
    }

    #[test]
    fn mxfp4_blocks_follow_the_definition() {
        // Byte j holds code j in its low nibble and code 15 - j in its high
        // one, so the block spells every code in both halves.
        let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for e in [0u8, 1, 2, 100, 127, 128, 129, 200, 252, 253, 254, 255] {
            let mut b = vec![e];
            b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
            let v = dequantize(GgmlType::MXFP4, &b, 32).unwrap();
            // value = E2M1(code) * 2^(e - 127), computed in f64 (exact) and rounded once.
            let want = |code: usize| {
                let m = e2m1[code & 7] * if code & 8 != 0 { -1.0 } else { 1.0 };
                (m * 2f64.powi(e as i32 - 127)) as f32
            };
            for j in 0..16 {
                for (i, code) in [(j, j), (16 + j, 15 - j)] {
                    let (got, w) = (v[i], want(code));
                    assert!(got == w, "e {e} element {i}: {got} vs {w}");
                    // Code 8 (E2M1's -0) is ggml's integer 0: +0, never -0.
                    if code == 8 || code == 0 {
                        assert_eq!(got.to_bits(), 0, "e {e} element {i}");
                    } else {
                        assert_eq!(got.to_bits(), w.to_bits(), "e {e} element {i}");
                    }
                }
            }
        }
        // A few values spelled out.
        let mut b = vec![128u8];
        b.extend([0x97, 0x8f, 0x21].iter().chain(&[0u8; 13]));
        let v = dequantize(GgmlType::MXFP4, &b, 32).unwrap();
        assert_eq!(
            (v[0], v[16]),
            (12.0, -1.0),
            "e = 128 is a scale of 1 on the doubled codes"
        );
        assert_eq!((v[1], v[17]), (-12.0, 0.0));
        assert_eq!((v[2], v[18]), (1.0, 2.0));
        b[0] = 0;
        let v = dequantize(GgmlType::MXFP4, &b, 32).unwrap();
        assert_eq!(v[0], 12.0 * 2f32.powi(-128), "subnormal scale");
        assert_eq!(v[2].to_bits(), 0x0020_0000, "2^-128, a subnormal");
        b[0] = 1;
        let v = dequantize(GgmlType::MXFP4, &b, 32).unwrap();
        assert_eq!(v[2].to_bits(), 0x0040_0000, "2^-127, a subnormal");
        b[0] = 254;
        let v = dequantize(GgmlType::MXFP4, &b, 32).unwrap();
        assert_eq!((v[0], v[1], v[2]), (f32::INFINITY, f32::NEG_INFINITY, 2f32.powi(126)));
        assert!(matches!(
            dequantize(GgmlType::MXFP4, &b[..16], 32),
            Err(GgufError::DataLength {
                expected: Some(17),
                got: 16,
                ..
            })
        ));
    }

    #[test]
    fn q6_k_follows_ggml_loops() {
        // With d = 1 and every scale 1, element values are the codes - 32.
        // dequantize_row_q6_K: for each half, l in 0..32:
        // y[l] <- ql[l] & 0xF | (qh[l] & 3) << 4, y[l+32] <- ql[l+32] & 0xF | ((qh[l] >> 2) & 3) << 4,
        // y[l+64] <- ql[l] >> 4 | ((qh[l] >> 4) & 3) << 4, y[l+96] <- ql[l+32] >> 4 | ((qh[l] >> 6) & 3) << 4.
        let mut b = vec![0u8; 210];
        for (i, v) in b[..128].iter_mut().enumerate() {
            *v = (i * 37 % 256) as u8;
        }
        for (i, v) in b[128..192].iter_mut().enumerate() {
            *v = (i * 101 % 256) as u8;
        }
        b[192..208].fill(1);
        b[208..].copy_from_slice(&f16(1.0));
        let y = dequantize(GgmlType::Q6_K, &b, 256).unwrap();
        let code = |v: f32| (v + 32.0) as u8;
        for h in 0..2 {
            let (ql, qh) = (&b[64 * h..], &b[128 + 32 * h..]);
            for l in 0..32 {
                let y = &y[128 * h..];
                assert_eq!(code(y[l]), (ql[l] & 0xf) | ((qh[l] & 3) << 4));
                assert_eq!(code(y[l + 32]), (ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4));
                assert_eq!(code(y[l + 64]), (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                assert_eq!(code(y[l + 96]), (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
        // Scale i / 16 applies to element i.
        for g in 0..16 {
            let mut b = b.clone();
            b[192 + g] = (-2i8) as u8;
            let z = dequantize(GgmlType::Q6_K, &b, 256).unwrap();
            for i in 0..256 {
                let want = if i / 16 == g { -2.0 * y[i] } else { y[i] };
                assert_eq!(z[i], want, "scale {g} element {i}");
            }
        }
    }

    #[test]
    fn q2_k_and_q3_k_follow_ggml_loops() {
        // dequantize_row_q2_K / _q3_K spelled out as ggml writes them (the
        // Q3_K scales through its kmask shuffle of four u32 words), on
        // patterned blocks; every value is an exact small multiple of 2^-3.
        let mut q2 = vec![0u8; 84];
        for (i, v) in q2.iter_mut().enumerate().take(80) {
            *v = (i * 53 % 256) as u8;
        }
        q2[80..82].copy_from_slice(&f16(0.5));
        q2[82..84].copy_from_slice(&f16(0.125));
        let y = dequantize(GgmlType::Q2_K, &q2, 256).unwrap();
        let (mut want, mut is) = (Vec::new(), 0);
        for n in 0..2 {
            let q = &q2[16 + 32 * n..];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = q2[is];
                    is += 1;
                    let (dl, ml) = (0.5 * (sc & 0xf) as f32, 0.125 * (sc >> 4) as f32);
                    for l in 0..16 {
                        want.push(dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml);
                    }
                }
            }
        }
        assert_eq!(y, want);

        let mut q3 = vec![0u8; 110];
        for (i, v) in q3.iter_mut().enumerate().take(108) {
            *v = (i * 71 % 256) as u8;
        }
        q3[108..].copy_from_slice(&f16(0.25));
        let y = dequantize(GgmlType::Q3_K, &q3, 256).unwrap();
        let mut aux = [0u32; 4];
        for (w, c) in aux.iter_mut().zip(q3[96..108].chunks(4)) {
            *w = u32::from_le_bytes(c.try_into().unwrap());
        }
        let (k1, k2, tmp) = (0x0303_0303u32, 0x0f0f_0f0fu32, aux[2]);
        aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
        aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
        aux[0] = (aux[0] & k2) | ((tmp & k1) << 4);
        aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
        let scales: Vec<i8> = aux.iter().flat_map(|w| w.to_le_bytes()).map(|b| b as i8).collect();
        let (mut want, mut is, mut m) = (Vec::new(), 0, 1u8);
        for n in 0..2 {
            let q = &q3[32 + 32 * n..];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = 0.25 * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for l in 0..16 {
                        let low = ((q[l + 16 * half] >> shift) & 3) as i32;
                        let off = if q3[l + 16 * half] & m != 0 { 0 } else { 4 };
                        want.push(dl * (low - off) as f32);
                    }
                }
                m <<= 1;
            }
        }
        assert_eq!(y, want);
        for (g, &sc) in scales.iter().enumerate() {
            assert_eq!(q3_k_scale(&q3[96..108], g), sc as i32 - 32, "group {g}");
        }
    }

    #[test]
    fn lengths_are_checked() {
        assert!(matches!(
            dequantize(GgmlType::Q4_K, &[0; 144], 255),
            Err(GgufError::DataLength { expected: None, .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q4_K, &[0; 143], 256),
            Err(GgufError::DataLength {
                expected: Some(144),
                got: 143,
                ..
            })
        ));
        assert_eq!(dequantize(GgmlType::F32, &[], 0).unwrap(), Vec::<f32>::new());
        assert_eq!(dequantize(GgmlType::BF16, &[0x80, 0x3f], 1).unwrap(), vec![1.0f32]);
    }
}
