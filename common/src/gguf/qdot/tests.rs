use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::reference::codes;
use super::*;
use crate::gguf::dequantize_into;
use crate::gguf::dot::tests::{acts, random_row};
use crate::gguf::types::{KVALUES_IQ4NL, KVALUES_MXFP4};

/// Every quantized type.
fn quantized() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL.into_iter().filter(|t| t.is_quantized())
}

fn dequantized(ty: GgmlType, row: &[u8], cols: usize) -> Vec<f32> {
    let mut w = vec![0.0f32; cols];
    dequantize_into(ty, row, &mut w);
    w
}

/// Random widths: a few blocks (partial chunks), or up to 8192 columns.
fn random_cols(rng: &mut ChaCha8Rng, ty: GgmlType, case: usize) -> usize {
    let max_blocks = if case.is_multiple_of(3) {
        11
    } else {
        8192 / ty.block_elems()
    };
    ty.block_elems() * rng.gen_range(1..=max_blocks)
}

#[test]
fn codes_spell_out_the_dequantized_values() {
    // The codes the integer paths multiply, put back through each type's
    // scales, give the reference dequantization bit for bit.
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for ty in quantized() {
        for _ in 0..20 {
            let cols = ty.block_elems() * rng.gen_range(1..=4);
            let row = random_row(&mut rng, ty, cols);
            let want = dequantized(ty, &row, cols);
            let chunk_bytes = if ty.block_elems() == QK_K {
                ty.block_bytes()
            } else {
                8 * ty.block_bytes()
            };
            let mut got = Vec::new();
            for chunk in row.chunks(chunk_bytes) {
                let k = if ty.block_elems() == QK_K {
                    8
                } else {
                    chunk.len() / ty.block_bytes()
                };
                for b in 0..k {
                    let c = codes(ty, chunk, b);
                    got.extend(c.iter().enumerate().map(|(i, &c)| value(ty, chunk, b, i, c)));
                }
            }
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{ty} element {i}: {g} vs {w}");
            }
        }
    }
}

/// Element `i` of block `b` from its code, with the dequantization's
/// arithmetic (see `dequant.rs`).
fn value(ty: GgmlType, chunk: &[u8], b: usize, i: usize, c: i16) -> f32 {
    let f16 = |at: usize| f16_le([chunk[at], chunk[at + 1]]);
    match ty {
        GgmlType::Q8_0 => c as f32 * f16(34 * b),
        GgmlType::MXFP4 => c as f32 * crate::gguf::types::e8m0_to_f32_half(chunk[17 * b]),
        GgmlType::Q4_0 => f16(18 * b) * (c - 8) as f32,
        GgmlType::Q5_0 => f16(22 * b) * (c - 16) as f32,
        GgmlType::Q4_1 => f16(20 * b) * c as f32 + f16(20 * b + 2),
        GgmlType::Q5_1 => f16(24 * b) * c as f32 + f16(24 * b + 2),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (sc, m) = scale_min_k4(chunk[4..16].try_into().unwrap(), b);
            (f16(0) * sc as f32) * c as f32 - f16(2) * m as f32
        }
        GgmlType::Q6_K => {
            let sc = chunk[192 + (32 * b + i) / 16] as i8;
            (f16(208) * sc as f32) * (c - 32) as f32
        }
        GgmlType::IQ4_NL => f16(18 * b) * c as f32,
        GgmlType::Q2_K => {
            let g = chunk[(32 * b + i) / 16];
            (f16(80) * (g & 15) as f32) * c as f32 - f16(82) * (g >> 4) as f32
        }
        GgmlType::Q3_K => {
            let sc = crate::gguf::types::q3_k_scale(&chunk[96..108], (32 * b + i) / 16);
            (f16(108) * sc as f32) * (c - 4) as f32
        }
        GgmlType::IQ4_XS => {
            let sc = crate::gguf::types::iq4_xs_scale([chunk[2], chunk[3]], &chunk[4..8], b);
            (f16(0) * sc as f32) * c as f32
        }
        _ => unreachable!(),
    }
}

#[test]
fn every_instruction_set_gives_the_reference_bits() {
    let isas = Isa::available();
    println!("instruction sets here: {isas:?}");
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for ty in quantized() {
        for case in 0..40 {
            let cols = random_cols(&mut rng, ty, case);
            let mut x = acts(&mut rng, cols);
            if case % 5 == 1 {
                // Extreme activations: one huge value per block, the rest tiny.
                for (i, v) in x.iter_mut().enumerate() {
                    *v = if i % 32 == 7 { 1e4 } else { *v * 1e-3 };
                }
            }
            let a = Q8Acts::new(&x);
            for _ in 0..3 {
                let row = random_row(&mut rng, ty, cols);
                let want = dot_on(Isa::Scalar, ty, &row, &a);
                for &isa in isas {
                    let got = dot_on(isa, ty, &row, &a);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty} x{cols} on {isa:?}: {got} vs {want}"
                    );
                }
                assert_eq!(dot(ty, &row, &a).to_bits(), want.to_bits());
                // Four activation rows at once: each the bits of its own dot.
                let others: Vec<Q8Acts> = (0..3).map(|_| Q8Acts::new(&acts(&mut rng, cols))).collect();
                let four = [&others[0], &a, &others[1], &others[2]];
                for &isa in isas {
                    let got = dot4_on(isa, ty, &row, four);
                    for (g, one) in got.iter().zip(four) {
                        let want = dot_on(Isa::Scalar, ty, &row, one);
                        assert_eq!(g.to_bits(), want.to_bits(), "dot4 {ty} x{cols} on {isa:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn extreme_codes_stay_exact() {
    // Q8_0 bytes of -128 and 127 against activation codes of ±127 are the
    // largest products any path forms; one block, so the result is exactly
    // `(d * dx) * Σ w q`.
    for pattern in 0..4u32 {
        let w: Vec<i8> = (0..32)
            .map(|i| match pattern {
                0 => -128,
                1 => 127,
                2 => {
                    if i % 2 == 0 {
                        -128
                    } else {
                        127
                    }
                }
                _ => {
                    if i < 16 {
                        -128
                    } else {
                        127
                    }
                }
            })
            .collect();
        let mut row = half::f16::from_f32(1.0).to_bits().to_le_bytes().to_vec();
        row.extend(w.iter().map(|&v| v as u8));
        let x: Vec<f32> = (0..32)
            .map(|i| if (i + pattern) % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let a = Q8Acts::new(&x);
        let isum: i32 = w.iter().zip(&a.qs).map(|(&w, &q)| w as i32 * q as i32).sum();
        let want = (1.0f32 * a.d[0]) * isum as f32;
        for &isa in Isa::available() {
            let got = dot_on(isa, GgmlType::Q8_0, &row, &a);
            assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} pattern {pattern}");
        }
    }
}

#[test]
fn iq4_extreme_codes_stay_exact() {
    // Levels of -127 (nibble 0) and 113 (nibble 15) against activation
    // codes of ±127 (the largest `vpmaddubsw` pairs these types form); one
    // 32-element block or one IQ4_XS sub-block holds them, the others zero,
    // so the result is exactly `(d * dx) * (s Σ k q)`.
    for pattern in 0..4usize {
        let nib = |i: usize| -> u8 {
            match pattern {
                0 => 0,
                1 => 15,
                2 => (i % 2 * 15) as u8,
                _ => (i / 8 % 2 * 15) as u8,
            }
        };
        let qs: Vec<u8> = (0..16).map(|j| nib(j) | (nib(j + 16) << 4)).collect();
        let k: Vec<i32> = (0..32).map(|i| KVALUES_IQ4NL[nib(i) as usize] as i32).collect();
        let x: Vec<f32> = (0..256)
            .map(|i| if (i + pattern) % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
        // IQ4_NL: one block.
        let mut row = one.to_vec();
        row.extend(&qs);
        let a = Q8Acts::new(&x[..32]);
        let isum: i32 = k.iter().zip(&a.qs).map(|(&w, &q)| w * q as i32).sum();
        let want = (1.0f32 * a.d[0]) * isum as f32;
        for &isa in Isa::available() {
            let got = dot_on(isa, GgmlType::IQ4_NL, &row, &a);
            assert_eq!(got.to_bits(), want.to_bits(), "IQ4_NL {isa:?} pattern {pattern}");
        }
        // IQ4_XS: sub-block 3 with ls = 63 (scale 31), the others zero
        // scales (ls = 32) and zero codes' level 1.
        let mut row = one.to_vec();
        let ls = |b: usize| if b == 3 { 63u16 } else { 32 };
        let h: u16 = (0..8).map(|b| (ls(b) >> 4) << (2 * b)).sum();
        row.extend(h.to_le_bytes());
        row.extend((0..4).map(|i| (ls(2 * i) & 15) as u8 | (((ls(2 * i + 1) & 15) as u8) << 4)));
        for b in 0..8 {
            if b == 3 {
                row.extend(&qs);
            } else {
                row.extend([0x88u8; 16]);
            }
        }
        let a = Q8Acts::new(&x);
        let isum: i32 = k.iter().zip(&a.qs[96..128]).map(|(&w, &q)| w * q as i32).sum();
        let want = (1.0f32 * a.d[3]) * (31 * isum) as f32;
        for &isa in Isa::available() {
            let got = dot_on(isa, GgmlType::IQ4_XS, &row, &a);
            assert_eq!(got.to_bits(), want.to_bits(), "IQ4_XS {isa:?} pattern {pattern}");
        }
    }
}

#[test]
fn mxfp4_extreme_codes_stay_exact() {
    // Codes of ±12 against activation codes of ±127, scale 2^0 (e = 128):
    // one block, so the result is exactly `(1 * dx) * Σ k q`.
    for pattern in 0..4usize {
        let mut row = vec![128u8];
        row.extend((0..16).map(|j| match pattern {
            0 => 0x77u8,              // +12, +12
            1 => 0xff,                // -12, -12
            2 => 0xf7,                // +12 low, -12 high
            _ => [0x7f, 0xf7][j % 2], // alternating
        }));
        let x: Vec<f32> = (0..32)
            .map(|i| if (i + pattern) % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let a = Q8Acts::new(&x);
        let k = |i: usize| {
            let byte = row[1 + i % 16];
            KVALUES_MXFP4[(if i < 16 { byte & 0x0f } else { byte >> 4 }) as usize] as i32
        };
        let isum: i32 = (0..32).map(|i| k(i) * a.qs[i] as i32).sum();
        let want = (1.0f32 * a.d[0]) * isum as f32;
        for &isa in Isa::available() {
            let got = dot_on(isa, GgmlType::MXFP4, &row, &a);
            assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} pattern {pattern}");
        }
    }
}

#[test]
fn mxfp4_every_exponent_follows_ggml() {
    // Every exponent byte (0..=255: subnormal scales, and every lane of the
    // vector scale decoding) in rows of one chunk of 8 blocks (the vector
    // terms) or 11 (a partial chunk too) with neighbouring exponents, the
    // activations scaled by 2^(128 - e) (within ±120) so that every block's
    // term counts in the sum; the result is ggml's per-block
    // `GGML_E8M0_TO_FP32_HALF(e) * d_y * sumi`, added to lane `b % 8`.
    let mut rng = ChaCha8Rng::seed_from_u64(39);
    for (r, e0) in (0..256usize).step_by(4).enumerate() {
        let nb = if r % 3 == 0 { 11 } else { 8 };
        let mut row = Vec::with_capacity(17 * nb);
        let mut x = Vec::with_capacity(32 * nb);
        for b in 0..nb {
            let e = (e0 + b).min(255) as u8;
            row.push(e);
            row.extend((0..16).map(|_| rng.gen::<u8>()));
            let scale = 2f32.powi((128 - e as i32).clamp(-120, 120));
            x.extend((0..32).map(|_| rng.gen_range(-1.0f32..1.0) * scale));
        }
        let a = Q8Acts::new(&x);
        let mut acc = [0.0f32; 8];
        for b in 0..nb {
            let p = &row[17 * b..17 * (b + 1)];
            let sumi: i32 = (0..16)
                .map(|j| {
                    let (lo, hi) = (p[1 + j] & 0x0f, p[1 + j] >> 4);
                    KVALUES_MXFP4[lo as usize] as i32 * a.qs[32 * b + j] as i32
                        + KVALUES_MXFP4[hi as usize] as i32 * a.qs[32 * b + j + 16] as i32
                })
                .sum();
            acc[b % 8] += crate::gguf::types::e8m0_to_f32_half(p[0]) * a.d[b] * sumi as f32;
        }
        let want = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        assert!(want.is_finite() && want != 0.0, "exponents from {e0}: {want}");
        for &isa in Isa::available() {
            let got = dot_on(isa, GgmlType::MXFP4, &row, &a);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{isa:?} exponents from {e0}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn the_reference_is_the_product_of_the_dequantized_values() {
    // Against f64 products of the dequantized weights and the dequantized
    // activations, only the f32 scaling and lane sums round.
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for ty in quantized() {
        let mut worst = 0.0f64;
        for case in 0..30 {
            let cols = random_cols(&mut rng, ty, case);
            let x = acts(&mut rng, cols);
            let a = Q8Acts::new(&x);
            let xq = a.dequantized();
            let row = random_row(&mut rng, ty, cols);
            let w = dequantized(ty, &row, cols);
            let exact: f64 = w.iter().zip(&xq).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = w.iter().zip(&xq).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = dot_on(Isa::Scalar, ty, &row, &a) as f64;
            let err = (got - exact).abs() / mag.max(1e-30);
            worst = worst.max(err);
            assert!(
                (got - exact).abs() <= 1e-5 * mag + 1e-6,
                "{ty} x{cols}: {got} vs {exact}"
            );
        }
        println!("{ty}: worst rounding {worst:.2e} of the magnitude");
    }
}

#[test]
fn activation_rounding_is_bounded() {
    // Against the f32 activations: each activation moves by at most half
    // its block's step, so the product moves by at most Σ |w| d / 2.
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    for ty in quantized() {
        for case in 0..20 {
            let cols = random_cols(&mut rng, ty, case);
            let x = acts(&mut rng, cols);
            let a = Q8Acts::new(&x);
            let row = random_row(&mut rng, ty, cols);
            let w = dequantized(ty, &row, cols);
            let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let bound: f64 = w
                .chunks_exact(32)
                .zip(&a.d)
                .map(|(wb, &d)| wb.iter().map(|v| v.abs() as f64).sum::<f64>() * d as f64 / 2.0)
                .sum();
            let mag: f64 = w.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = dot(ty, &row, &a) as f64;
            assert!(
                (got - exact).abs() <= bound * 1.001 + 1e-5 * mag + 1e-6,
                "{ty} x{cols}: {got} vs {exact} (bound {bound})"
            );
        }
    }
}

#[test]
fn non_finite_activations_give_nan() {
    let ty = GgmlType::Q8_0;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let row = random_row(&mut rng, ty, 64);
    let mut x = acts(&mut rng, 64);
    x[40] = f32::NAN;
    let a = Q8Acts::new(&x);
    for &isa in Isa::available() {
        assert!(dot_on(isa, ty, &row, &a).is_nan(), "{isa:?}");
    }
}

#[test]
fn q5_0_rows_as_q8_0_keep_their_values_and_product_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for case in 0..30 {
        let cols = random_cols(&mut rng, GgmlType::Q5_0, case);
        let row = random_row(&mut rng, GgmlType::Q5_0, cols);
        let q8 = crate::gguf::q5_0_as_q8_0(&row);
        assert_eq!(Some(q8.len()), GgmlType::Q8_0.row_bytes(cols));
        let (a, b) = (
            dequantized(GgmlType::Q5_0, &row, cols),
            dequantized(GgmlType::Q8_0, &q8, cols),
        );
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "x{cols} values"
        );
        let x = Q8Acts::new(&acts(&mut rng, cols));
        let want = dot_on(Isa::Scalar, GgmlType::Q5_0, &row, &x);
        for &isa in Isa::available() {
            let got = dot_on(isa, GgmlType::Q8_0, &q8, &x);
            assert_eq!(got.to_bits(), want.to_bits(), "x{cols} on {isa:?}: {got} vs {want}");
        }
    }
}

/// The `sdot` path runs wherever the CPU has `dotprod` (qemu-user's default
/// AArch64 CPU does, which is where CI tests NEON); CI's strict mode
/// (`CHARM_CI=1`) fails rather than leave it untested.
#[cfg(target_arch = "aarch64")]
#[test]
fn sdot_path_is_tested_where_the_cpu_has_it() {
    if !Isa::NeonDot.runs() {
        assert!(
            std::env::var("CHARM_CI").map_or(true, |v| v != "1"),
            "CHARM_CI=1: this CPU has no dotprod, so the sdot path is untested"
        );
        eprintln!("no dotprod on this CPU: the sdot path is not exercised");
    }
}
