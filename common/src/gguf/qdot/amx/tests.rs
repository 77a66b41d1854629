use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::gguf::dot::tests::{acts, random_row};
use crate::gguf::qdot::{dot_on, Q8Acts};
use crate::gguf::types::QK;
use crate::Isa;

/// Whether AMX runs here; if not, says why the tests below assert nothing
/// and, in CI's strict mode (`CHARM_CI=1`), fails where the CPU reports
/// AMX-INT8 but the tiles could not be used (permission refused).
fn amx_here(test: &str) -> bool {
    if crate::isa::amx_runs() {
        return true;
    }
    if crate::isa::amx_reported() {
        assert!(
            std::env::var("CHARM_CI").map_or(true, |v| v != "1"),
            "CHARM_CI=1: this CPU reports AMX-INT8 but the tile state was refused, so {test} is untested"
        );
    }
    eprintln!("no AMX-INT8 here: {test} not exercised");
    false
}

/// Every type [`product`] takes.
fn amx_types() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL.into_iter().filter(|&t| takes(t, t.block_elems()))
}

/// `product` of `rows` rows of `ty` against `n` activation rows, each output
/// against the scalar reference's bits.
fn check(ty: GgmlType, data: &[u8], cols: usize, xs: &[Q8Acts], what: &str) {
    let rb = ty.row_bytes(cols).unwrap();
    let rows = data.len() / rb;
    let refs: Vec<&Q8Acts> = xs.iter().collect();
    let acts = AmxActs::new(&refs);
    let mut tile = WeightTile::default();
    let n = xs.len();
    // Outputs past each row's `n` stay untouched (a stride of n + 3).
    let stride = n + 3;
    for r0 in (0..rows).step_by(ROWS) {
        let r1 = (r0 + ROWS).min(rows);
        tile.decode(ty, &data[r0 * rb..r1 * rb], cols);
        let mut out = vec![f32::from_bits(0x7fc0_1234); (r1 - r0) * stride];
        product(&tile, &acts, &mut out, stride, &[]);
        for r in r0..r1 {
            for (t, x) in xs.iter().enumerate() {
                let want = dot_on(Isa::Scalar, ty, &data[r * rb..(r + 1) * rb], x);
                let got = out[(r - r0) * stride + t];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} x{cols} {what}: row {r}, act {t}: {got} vs {want}"
                );
            }
            for v in &out[(r - r0) * stride + n..(r - r0 + 1) * stride] {
                assert_eq!(
                    v.to_bits(),
                    0x7fc0_1234,
                    "{ty} x{cols} {what}: wrote past row {r}'s outputs"
                );
            }
        }
    }
}

#[test]
fn amx_products_give_the_row_dot_bits() {
    if !amx_here("the AMX products") {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    for ty in amx_types() {
        let be = ty.block_elems();
        // One block, a partial chunk, whole chunks and tails, a wide row.
        let widths: Vec<usize> = if be == 32 {
            vec![32, 192, 256, 2880, 2048 + 96]
        } else {
            vec![256, 512, 2048]
        };
        for cols in widths {
            for (rows, n) in [(1, 1), (3, 5), (16, 16), (17, 33), (40, 70)] {
                let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
                let xs: Vec<Q8Acts> = (0..n).map(|_| Q8Acts::new(&acts(&mut rng, cols))).collect();
                check(ty, &data, cols, &xs, &format!("{rows} rows × {n}"));
            }
        }
    }
}

#[test]
fn amx_products_of_extreme_codes_stay_exact() {
    // Every byte of the weights 0xff or 0x00 (the largest and smallest
    // codes, scales and mins of every type; f16 scales of NaN and 0 are
    // avoided), against activations of ±127 codes and all-zero blocks.
    if !amx_here("extreme AMX products") {
        return;
    }
    for ty in amx_types() {
        let cols = 4 * ty.block_elems().max(64);
        let mut data = Vec::new();
        for fill in [0xffu8, 0x00, 0x77, 0x88] {
            let mut row = vec![fill; ty.row_bytes(cols).unwrap()];
            // A finite scale (1.0) wherever an f16 sits, as random rows do.
            fix_scales(ty, &mut row);
            data.extend(row);
        }
        let pm: Vec<f32> = (0..cols).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let neg: Vec<f32> = pm.iter().map(|v| -v).collect();
        let zero = vec![0.0f32; cols];
        let xs = [&pm, &neg, &zero, &pm].map(|x| Q8Acts::new(x));
        check(ty, &data, cols, &xs, "extremes");
    }
}

/// Sets every f16 field of `row` (scales, mins) to 1.0 and MXFP4's
/// exponents to 127.
fn fix_scales(ty: GgmlType, row: &mut [u8]) {
    let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
    let bs = ty.block_bytes();
    let at: &[usize] = match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    for blk in row.chunks_exact_mut(bs) {
        if ty == GgmlType::MXFP4 {
            blk[0] = 127;
        }
        for &i in at {
            blk[i..i + 2].copy_from_slice(&one);
        }
    }
}

#[test]
fn rows_of_a_non_finite_activation_block_are_nan() {
    if !amx_here("non-finite AMX products") {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for ty in amx_types() {
        let cols = ty.block_elems().max(256);
        let data = random_row(&mut rng, ty, cols);
        let mut x = acts(&mut rng, cols);
        x[37] = f32::INFINITY;
        check(
            ty,
            &data,
            cols,
            &[Q8Acts::new(&x), Q8Acts::new(&acts(&mut rng, cols))],
            "an infinity",
        );
    }
}

#[test]
fn the_tile_decode_holds_the_reference_codes() {
    // Decoding needs no AMX: codes less the term's offset, per block.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in amx_types() {
        let cols = 2 * ty.block_elems().max(256);
        let data: Vec<u8> = (0..5).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
        let mut tile = WeightTile::default();
        tile.decode(ty, &data, cols);
        let off = match ty {
            GgmlType::Q4_0 => 8,
            GgmlType::Q5_0 => 16,
            GgmlType::Q3_K => 4,
            GgmlType::Q6_K => 32,
            _ => 0,
        };
        let rb = ty.row_bytes(cols).unwrap();
        let chunk_bytes = if ty.block_elems() == QK_K {
            ty.block_bytes()
        } else {
            8 * ty.block_bytes()
        };
        for r in 0..5 {
            let row = &data[r * rb..(r + 1) * rb];
            let mut b0 = 0;
            for chunk in row.chunks(chunk_bytes) {
                let k = if ty.block_elems() == QK_K {
                    8
                } else {
                    chunk.len() / ty.block_bytes()
                };
                for b in 0..k {
                    let want = super::super::reference::codes(ty, chunk, b).map(|c| c - off);
                    let got = &line_bytes(&tile.codes)[r * cols + QK * (b0 + b)..][..QK];
                    let got: Vec<i16> = got.iter().map(|&c| c as i16).collect();
                    assert_eq!(got, want, "{ty} row {r} block {}", b0 + b);
                }
                b0 += k;
            }
        }
    }
}

#[test]
fn takes_whole_blocks_of_quantized_types_only() {
    assert!(takes(GgmlType::Q4_0, 2880));
    assert!(!takes(GgmlType::Q4_K, 2880));
    assert!(takes(GgmlType::Q6_K, 512));
    assert!(!takes(GgmlType::BF16, 512));
    assert!(!takes(GgmlType::Q8_0, 0));
}
