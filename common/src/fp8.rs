//! Block-scaled FP8 weights as DeepSeek-V3 / R1 / Kimi K2 and GLM release
//! them: `F8_E4M3` codes with an f32 `weight_scale_inv` per block of
//! `block[0] × block[1]` elements (128 × 128 in every released checkpoint;
//! partial blocks at the edges), `w = f32(q) · scale_inv`.
//!
//! charm runs such a matrix as its bf16 dequantization, the weights
//! transformers' `Fp8Dequantize` gives a bf16 model (what it does on a CPU):
//!
//! ```python
//! quantized_fp32 = quantized.to(torch.float32)
//! return (q * s).to(output_dtype).reshape(original_shape)
//! ```
//!
//! one f32 product per element (exact codes, one rounding), then bf16
//! round-to-nearest-even. It costs two bytes per weight in memory where the
//! checkpoint has one; containers re-quantize the experts (`convert`).

use half::bf16;

/// The value of an `F8_E4M3` (`float8_e4m3fn`) byte: sign, 4 exponent bits
/// (bias 7), 3 mantissa bits; no infinities, `S.1111.111` is NaN. Exact in
/// f32.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let (e, m) = ((b >> 3) & 0x0f, (b & 0x07) as f32);
    let v = match (e, b & 0x07) {
        (0x0f, 0x07) => f32::NAN,
        // Subnormal: m/8 · 2^-6.
        (0, _) => m * (1.0 / 512.0),
        _ => (1.0 + m / 8.0) * f32::from_bits(((e as u32 + 127 - 7) & 0xff) << 23),
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// The shape of the scale grid of a `rows × cols` matrix in blocks of
/// `block`: `[ceil(rows / block[0]), ceil(cols / block[1])]`.
pub fn scale_grid(rows: usize, cols: usize, block: [usize; 2]) -> [usize; 2] {
    [rows.div_ceil(block[0].max(1)), cols.div_ceil(block[1].max(1))]
}

/// `codes` (`rows × cols` bytes, row-major) times their block scales
/// (`scales`, row-major over [`scale_grid`]), as bf16 bits.
///
/// # Panics
/// If `codes` or `scales` does not have the sizes the shape implies.
pub fn dequantize_bf16(codes: &[u8], rows: usize, cols: usize, scales: &[f32], block: [usize; 2]) -> Vec<u16> {
    let [_, grid_cols] = scale_grid(rows, cols, block);
    assert_eq!(codes.len(), rows * cols, "FP8 codes of a {rows} x {cols} matrix");
    assert_eq!(
        scales.len(),
        scale_grid(rows, cols, block).iter().product::<usize>(),
        "scales of a {rows} x {cols} matrix in {block:?} blocks"
    );
    let lut: Vec<f32> = (0..=255u8).map(e4m3_to_f32).collect();
    let mut out = Vec::with_capacity(rows * cols);
    for (r, row) in codes.chunks_exact(cols.max(1)).enumerate() {
        let s = &scales[r / block[0] * grid_cols..];
        for (c, &q) in row.iter().enumerate() {
            out.push(bf16::from_f32(lut[q as usize] * s[c / block[1]]).to_bits());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_decodes_every_code_like_its_definition() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // the largest
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // the smallest subnormal
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // the smallest normal
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        // Every finite code against sign · 2^(e-7) · (1 + m/8), in f64.
        for b in 0..=255u8 {
            let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
            if e == 15 && b & 7 == 7 {
                continue;
            }
            let mag = if e == 0 {
                m / 8.0 * 2f64.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            let want = if b & 0x80 != 0 { -mag } else { mag };
            assert_eq!(e4m3_to_f32(b) as f64, want, "code {b:#04x}");
        }
    }

    #[test]
    fn blocks_take_their_own_scale_and_edges_are_partial() {
        // 3 x 5 in 2 x 2 blocks: a 2 x 3 grid, the last row and column partial.
        let (rows, cols, block) = (3, 5, [2, 2]);
        assert_eq!(scale_grid(rows, cols, block), [2, 3]);
        let codes = vec![0x38u8; rows * cols]; // 1.0 everywhere
        let scales = [1.0, 2.0, 3.0, 4.0, 5.0, 0.1];
        let w = dequantize_bf16(&codes, rows, cols, &scales, block);
        let want = |r: usize, c: usize| bf16::from_f32(scales[r / 2 * 3 + c / 2]).to_bits();
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(w[r * cols + c], want(r, c), "({r}, {c})");
            }
        }
        // One f32 product, then bf16 round-to-nearest-even.
        let w = dequantize_bf16(&[0x3f], 1, 1, &[1.0 / 3.0], [128, 128]);
        assert_eq!(w[0], bf16::from_f32(e4m3_to_f32(0x3f) * (1.0f32 / 3.0)).to_bits());
    }
}
