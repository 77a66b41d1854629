//! Random GGML rows for the kernel benchmarks: bytes from a xorshift
//! stream, with the scales each type keeps set to small finite values (so
//! no product is NaN or infinite and the float work is the real one).

use charm_common::gguf::GgmlType;

/// A xorshift64 stream (fixed seed: every run multiplies the same data).
pub fn xorshift() -> impl FnMut() -> u64 {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// `rows` rows of `ty` with `rb` bytes each, drawn from `next`.
pub fn ggml_rows(ty: GgmlType, rows: usize, rb: usize, next: &mut impl FnMut() -> u64) -> Vec<u8> {
    let mut data: Vec<u8> = (0..rows * rb).map(|_| next() as u8).collect();
    // Small finite f16 scales where each type keeps them.
    let f16_at: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::MXFP4 => &[],
        _ => &[0, 2],
    };
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        if ty == GgmlType::MXFP4 {
            // Exponents 2^-8..2^-1: normal floats.
            b[0] = 120 + b[0] % 8;
        }
        for &at in f16_at {
            // K-quant super-block scales of small weights are f16 subnormals.
            let d: u16 = if ty.block_elems() == 256 { 0x01b4 } else { 0x2000 };
            b[at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    data
}
