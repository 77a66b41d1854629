use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::gguf::dot::tests::random_row;
use crate::gguf::qdot::dot_on;

/// The 32-element types the transposed products take, whole chunks or not.
const BLOCK_TYPES: [GgmlType; 7] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::MXFP4,
    GgmlType::IQ4_NL,
];

#[test]
fn arranged_products_equal_the_row_dot_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut ran = false;
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        if !isa.runs() {
            continue;
        }
        let super_block_types = [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_XS,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q5_K,
        ];
        for ty in BLOCK_TYPES.into_iter().chain(super_block_types) {
            for case in 0..12 {
                // Whole chunks, and for the 32-element types as many as
                // seven blocks past them.
                let tail = if ty.block_elems() == QK {
                    QK * (case as usize % 8)
                } else {
                    0
                };
                let cols = CHUNK * rng.gen_range(1..=8) + tail;
                let mut row = random_row(&mut rng, ty, cols);
                if ty == GgmlType::Q6_K && case % 3 == 0 {
                    // Every code 63 with scales 127, -127 and -128: the AVX2
                    // 16-bit sums' and scaled sums' largest magnitudes.
                    for sb in row.chunks_exact_mut(q6k::BLOCK) {
                        sb[..192].fill(0xff);
                        for (i, s) in sb[192..208].iter_mut().enumerate() {
                            *s = [127, 0x81, 0x80][i % 3];
                        }
                    }
                }
                if ty == GgmlType::IQ4_XS && case % 3 == 0 {
                    // Every nibble 0 (level -127) with every scale 63 - 32 =
                    // 31 or 0 - 32: the largest products and scales.
                    for sb in row.chunks_exact_mut(iq4xs::BLOCK) {
                        sb[2..4].fill(if case % 2 == 0 { 0xff } else { 0 });
                        sb[4..8].fill(if case % 2 == 0 { 0xff } else { 0 });
                        sb[8..].fill(0);
                    }
                }
                if ty == GgmlType::Q5_K && case % 3 == 0 {
                    // Every code 31 with every scale and min 63: the AVX2
                    // pairs' largest sums.
                    for sb in row.chunks_exact_mut(ty.block_bytes()) {
                        sb[4..].fill(0xff);
                    }
                }
                if matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K) && case % 3 == 0 {
                    // Every code at its largest (3, and Q3_K's third bit
                    // set: 7) with the largest scales and mins.
                    for sb in row.chunks_exact_mut(ty.block_bytes()) {
                        let codes = if ty == GgmlType::Q2_K { 16..80 } else { 0..108 };
                        sb[codes].fill(0xff);
                    }
                }
                let mut acts: Vec<Q8Acts> = (0..4)
                    .map(|n| {
                        let x: Vec<f32> = (0..cols)
                            .map(|i| match (case + n) % 4 {
                                // Extreme codes: ±127 everywhere, and
                                // all +127 (the unsigned codes' largest
                                // 16-bit pair sums).
                                0 => {
                                    if i % 3 == 0 {
                                        -1.0
                                    } else {
                                        1.0
                                    }
                                }
                                1 if case % 2 == 0 => 1.0,
                                _ => rng.gen_range(-1.0f32..1.0) * 10f32.powi(n - 2),
                            })
                            .collect();
                        Q8Acts::new(&x)
                    })
                    .collect();
                for a in &mut acts {
                    a.arrange();
                }
                let mut arranged = ArrangedRow::default();
                arrange_row_on(isa, ty, &row, &mut arranged);
                let mut got = [0.0f32; 4];
                let quad = [&acts[0], &acts[1], &acts[2], &acts[3]];
                dot_many_arranged(&arranged, &ArrangedActs::new(&quad), &mut got);
                // The same row packed, where the active set packs it.
                if isa == Isa::active() && packable_on(isa, ty, cols) {
                    let mut from_packed = [0.0f32; 4];
                    let packed = pack_rows(ty, &row, 1, cols);
                    dot_many_packed(ty, &packed, &ArrangedActs::new(&quad), &mut from_packed);
                    assert_eq!(from_packed.map(f32::to_bits), got.map(f32::to_bits), "{ty} packed");
                }
                for (n, a) in acts.iter().enumerate() {
                    let want = dot_on(Isa::Scalar, ty, &row, a);
                    assert_eq!(got[n].to_bits(), want.to_bits(), "{isa:?} {ty} cols {cols} act {n}");
                }
                // One to thirteen rows per call (eights on VNNI, quads,
                // then the rest), in another order: the same bits per row,
                // arranged and packed.
                let packed = (isa == Isa::active() && packable_on(isa, ty, cols)).then(|| pack_rows(ty, &row, 1, cols));
                // A second row for the pair products, and its bits per activation row.
                let row2 = random_row(&mut rng, ty, cols);
                let packed2 = packed.as_ref().map(|_| pack_rows(ty, &row2, 1, cols));
                let want2: Vec<u32> = acts
                    .iter()
                    .map(|a| dot_on(Isa::Scalar, ty, &row2, a).to_bits())
                    .collect();
                for len in 1..=13 {
                    let idx: Vec<usize> = (0..len).map(|k| (3 * k + 1) % 4).collect();
                    let many: Vec<&Q8Acts> = idx.iter().map(|&i| &acts[i]).collect();
                    let mut out = vec![0.0f32; len];
                    dot_many_arranged(&arranged, &ArrangedActs::new(&many), &mut out);
                    for (o, &i) in out.iter().zip(&idx) {
                        assert_eq!(o.to_bits(), got[i].to_bits(), "{len} rows");
                    }
                    if let (Some(packed), Some(packed2)) = (&packed, &packed2) {
                        dot_many_packed(ty, packed, &ArrangedActs::new(&many), &mut out);
                        for (o, &i) in out.iter().zip(&idx) {
                            assert_eq!(o.to_bits(), got[i].to_bits(), "{ty} packed, {len} rows");
                        }
                        // Two rows at once (one pass where `pairs_pay`):
                        // each row's bits.
                        let (mut oa, mut ob) = (vec![0.0f32; len], vec![0.0f32; len]);
                        dot_pair_packed(ty, (packed, packed2), &ArrangedActs::new(&many), &mut oa, &mut ob);
                        for ((a, b), &i) in oa.iter().zip(&ob).zip(&idx) {
                            assert_eq!(a.to_bits(), got[i].to_bits(), "{ty} pair, first row, {len} rows");
                            assert_eq!(b.to_bits(), want2[i], "{ty} pair, second row, {len} rows");
                        }
                        // Both rows in one call, outputs `len + 3` apart:
                        // each row's bits, the gaps untouched, `before`
                        // once a row, in order.
                        let both: Vec<u8> = packed.iter().chain(packed2.iter()).copied().collect();
                        let stride = len + 3;
                        let mut tile = vec![-7.0f32; 2 * stride];
                        let mut seen = Vec::new();
                        let acts = ArrangedActs::new(&many);
                        let before = &mut |i| seen.push(i);
                        dot_many_packed_rows(
                            ty,
                            &both,
                            &acts,
                            TileOut {
                                out: &mut tile,
                                stride,
                                before,
                            },
                        );
                        assert_eq!(seen, [0, 1], "{ty} tile, {len} rows");
                        for (k, &i) in idx.iter().enumerate() {
                            assert_eq!(tile[k].to_bits(), got[i].to_bits(), "{ty} tile, first row, {len} rows");
                            assert_eq!(
                                tile[stride + k].to_bits(),
                                want2[i],
                                "{ty} tile, second row, {len} rows"
                            );
                        }
                        assert!(tile[len..stride]
                            .iter()
                            .chain(&tile[stride + len..])
                            .all(|&v| v == -7.0));
                    }
                }
                ran = true;
            }
        }
    }
    if !ran {
        eprintln!("no AVX2 here: arranged products not exercised");
    }
}

#[test]
fn extreme_weight_codes_stay_exact() {
    // Q8_0 codes of -128 and 127 (the AVX2 sign trick's edge) against
    // ±127 activations.
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        if !isa.runs() {
            continue;
        }
        let mut row = Vec::new();
        for b in 0..8 {
            row.extend(half::f16::from_f32(0.5).to_bits().to_le_bytes());
            row.extend((0..32).map(|i| if (i + b) % 2 == 0 { 0x80u8 } else { 0x7f }));
        }
        let x: Vec<f32> = (0..CHUNK).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let mut a = Q8Acts::new(&x);
        a.arrange();
        let mut arranged = ArrangedRow::default();
        arrange_row_on(isa, GgmlType::Q8_0, &row, &mut arranged);
        let mut got = [0.0f32; 4];
        dot_many_arranged(&arranged, &ArrangedActs::new(&[&a, &a, &a, &a]), &mut got);
        let want = dot_on(Isa::Scalar, GgmlType::Q8_0, &row, &a);
        assert_eq!(got.map(f32::to_bits), [want.to_bits(); 4], "{isa:?}");
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn vector_arrangement_equals_the_scalar_one() {
    if !Isa::Avx2.runs() {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4, GgmlType::IQ4_NL] {
        for offset in [false, true] {
            let cols = CHUNK * 3;
            let row = random_row(&mut rng, ty, cols);
            let (mut want_c, mut want_d) = (vec![0u8; cols], vec![0.0f32; cols / QK]);
            arrange_scalar(ty, &row, offset, &mut want_c, &mut want_d);
            let (mut got_c, mut got_d) = (vec![0u8; cols], vec![0.0f32; cols / QK]);
            // SAFETY: AVX2 (and F16C with it on every CPU charm runs) is present.
            unsafe { x86::arrange(ty, &row, offset, &mut got_c, &mut got_d) };
            assert_eq!(got_c, want_c, "{ty} offset {offset}");
            assert_eq!(
                got_d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want_d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
    // Activations of whole chunks, and with three blocks past them (a
    // chunk of three lanes: step `j` holds bytes `4j..4j + 4` of each).
    for cols in [2 * CHUNK, 2 * CHUNK + 3 * QK] {
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut a = Q8Acts::new(&x);
        a.arrange();
        let src: Vec<u8> = a.qs.iter().map(|&q| q as u8).collect();
        let mut want = src.clone();
        transpose_scalar(&src, &mut want);
        for b in 0..(cols - 2 * CHUNK) / QK {
            for j in 0..8 {
                for x in 0..4 {
                    want[2 * CHUNK + 12 * j + 4 * b + x] = src[2 * CHUNK + QK * b + 4 * j + x];
                }
            }
        }
        assert_eq!(a.qt.iter().map(|&q| q as u8).collect::<Vec<_>>(), want);
        assert_eq!(a.tot.len(), cols / QK);
    }
}

#[test]
fn packed_rows_give_the_row_dot_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    // Only the active instruction set multiplies packed rows (the layout
    // is chosen at load); the AVX2 layout is checked through `pack_rows_on`.
    let isa = Isa::active();
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4, GgmlType::IQ4_NL] {
        for &chunks in &[1usize, 3, 8] {
            let cols = CHUNK * chunks;
            if !usable_on(isa, ty, cols) {
                return;
            }
            let rows = 5;
            let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
            let packed = pack_rows(ty, &data, rows, cols);
            assert_eq!(packed.len(), data.len());
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let mut a = Q8Acts::new(&x);
            a.arrange();
            let mut got = vec![0.0f32; rows];
            dot_rows_packed(ty, &packed, &a, &mut got);
            let rb = data.len() / rows;
            for (r, g) in got.iter().enumerate() {
                let want = dot_on(Isa::Scalar, ty, &data[r * rb..(r + 1) * rb], &a);
                assert_eq!(g.to_bits(), want.to_bits(), "{ty} {cols} row {r}");
            }
            if isa == Isa::Avx512Vnni {
                // The AVX2 layout differs only by Q8_0's offset (MXFP4's
                // table is offset in the kernel, not in the layout).
                let avx2 = pack_rows_on(Isa::Avx2, ty, &data, rows, cols);
                let flipped: Vec<u8> = avx2
                    .chunks_exact(8 * ty.block_bytes())
                    .flat_map(|c| {
                        let n = c.len() - 16;
                        let f = if ty == GgmlType::Q8_0 { 0x80 } else { 0 };
                        c[..n].iter().map(move |v| v ^ f).chain(c[n..].iter().copied())
                    })
                    .collect();
                assert_eq!(flipped, packed);
            }
        }
    }
}

#[test]
fn q4_0_rows_with_the_largest_nibbles_stay_exact() {
    // Every nibble 15 or 0 against ±127 activations, on every instruction
    // set here, packed (decode) and arranged (prefill): VNNI multiplies the
    // high nibbles as 16 times their value and divides the sums once, and
    // AVX2 sums a chunk's eight `vpmaddubsw` pairs in 16 bits (30480 at
    // most, reached by the all-15 row against all +127), so both kernels'
    // partial sums are at their largest here.
    let cols = 2 * CHUNK;
    let mut data = Vec::new();
    for r in 0..4u8 {
        for b in 0..cols / 32 {
            data.extend(half::f16::from_f32(0.25 + b as f32).to_bits().to_le_bytes());
            data.extend((0..16u8).map(|i| match (r + i % 3) % 4 {
                0 => 0xff,
                1 => 0xf0,
                2 => 0x0f,
                _ => 0x00,
            }));
        }
    }
    // A row of nothing but 15s.
    for b in 0..cols / 32 {
        data.extend(half::f16::from_f32(0.5 + b as f32).to_bits().to_le_bytes());
        data.extend([0xffu8; 16]);
    }
    let rows = 5;
    let rb = data.len() / rows;
    let mut ran = 0;
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        if !packable_on(isa, GgmlType::Q4_0, cols) {
            continue;
        }
        ran += 1;
        let packed = pack_rows_on(isa, GgmlType::Q4_0, &data, rows, cols);
        for x in [
            (0..cols).map(|_| 1.0f32).collect::<Vec<_>>(),
            (0..cols).map(|_| -1.0f32).collect(),
            (0..cols).map(|i| if i % 2 == 0 { -1.0 } else { 1.0 }).collect(),
        ] {
            let mut a = Q8Acts::new(&x);
            a.arrange();
            let mut got = vec![0.0f32; rows];
            dot_rows_packed_on(isa, GgmlType::Q4_0, &packed, &a, &mut got);
            for (r, g) in got.iter().enumerate() {
                let row = &data[r * rb..(r + 1) * rb];
                let want = dot_on(Isa::Scalar, GgmlType::Q4_0, row, &a);
                assert_eq!(g.to_bits(), want.to_bits(), "{isa:?} packed row {r}");
                let mut arranged = ArrangedRow::default();
                arrange_row_on(isa, GgmlType::Q4_0, row, &mut arranged);
                let mut many = [0.0f32; 5];
                dot_many_arranged(&arranged, &ArrangedActs::new(&[&a; 5]), &mut many);
                for m in many {
                    assert_eq!(m.to_bits(), want.to_bits(), "{isa:?} arranged row {r}");
                }
            }
        }
    }
    if cfg!(target_arch = "x86_64") && Isa::Avx2.runs() {
        assert!(ran > 0, "no packed Q4_0 kernel ran on an AVX2 CPU");
    }
}

#[test]
fn vector_packing_equals_the_scalar_one() {
    if !Isa::Avx2.runs() {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4, GgmlType::IQ4_NL] {
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            if !isa.runs() {
                continue;
            }
            for cols in [3 * CHUNK, 2880, CHUNK + QK] {
                let rows = 70;
                let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
                let mut want = vec![0u8; data.len()];
                pack_scalar(
                    ty,
                    &data,
                    cols,
                    isa == Isa::Avx512Vnni && ty == GgmlType::Q8_0,
                    &mut want,
                );
                assert!(pack_rows_on(isa, ty, &data, rows, cols) == want, "{ty} {isa:?} {cols}");
            }
        }
    }
}

#[test]
fn requantizing_drops_the_arrangement() {
    let mut a = Q8Acts::new(&[0.5; CHUNK]);
    a.arrange();
    assert!(a.arranged());
    a.quantize(&[0.25; CHUNK]);
    assert!(!a.arranged());
}

#[test]
fn usable_rows_are_whole_blocks_or_super_blocks() {
    let x86 = matches!(Isa::active(), Isa::Avx2 | Isa::Avx512Vnni);
    assert_eq!(usable(GgmlType::Q5_K, 4096), x86);
    // Q4_1 and Q5_1: arranged for prefill, folded as stored in decode.
    for ty in [GgmlType::Q4_1, GgmlType::Q5_1] {
        assert_eq!(usable(ty, 1408), x86, "{ty}");
        assert!(!packable(ty, 1408), "{ty}");
    }
    assert!(!usable(GgmlType::F16, 4096));
    assert_eq!(usable(GgmlType::Q4_K, 4096), usable(GgmlType::Q8_0, 4096));
    assert_eq!(usable(GgmlType::IQ4_XS, 4096), x86);
    assert_eq!(packable(GgmlType::IQ4_XS, 4096), x86);
    // Q5_0: arranged as Q8_0 for prefill, folded as stored in decode.
    assert_eq!(usable(GgmlType::Q5_0, 1408), x86);
    assert!(!packable(GgmlType::Q5_0, 1408));
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::MXFP4, GgmlType::IQ4_NL] {
        // Blocks past the last whole chunk (gpt-oss's 2880 = 11 chunks
        // and two blocks), or fewer blocks than a chunk (MLA's per-head
        // `attn_k_b`, 192 columns): a tail alone.
        assert_eq!(usable(ty, 32 * 9), x86, "{ty}");
        assert_eq!(usable(ty, 2880), x86, "{ty}");
        assert_eq!(packable(ty, 2880), x86, "{ty}");
        assert_eq!(usable(ty, 32 * 6), x86, "{ty}");
        assert_eq!(packable(ty, 32), x86, "{ty}");
        assert!(!usable(ty, 40), "{ty}");
        assert!(!usable(ty, 0), "{ty}");
        assert_eq!(usable(ty, 2048), x86, "{ty}");
    }
}

/// `rows` random rows of `ty` × `cols`; row 0 holds the largest codes
/// (Q8_0: -128 and 127; Q4_0: nibbles 15 and 0; MXFP4: ±12, and its
/// exponents at the ends of their range).
fn rows_with_extremes(rng: &mut ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data: Vec<u8> = (0..rows).flat_map(|_| random_row(rng, ty, cols)).collect();
    let rb = ty.row_bytes(cols).unwrap();
    for (b, blk) in data[..rb].chunks_exact_mut(ty.block_bytes()).enumerate() {
        match ty {
            GgmlType::Q8_0 => {
                for (i, v) in blk[2..].iter_mut().enumerate() {
                    *v = if (i + b) % 3 == 0 { 0x80 } else { 0x7f };
                }
            }
            GgmlType::Q4_0 => blk[2..].fill(if b % 2 == 0 { 0xff } else { 0xf0 }),
            // Levels -127 (nibble 0) and 113 (nibble 15).
            GgmlType::IQ4_NL => blk[2..].fill(if b % 2 == 0 { 0x00 } else { 0xf0 }),
            // Codes 31 and 0 (every fifth bit and nibble set, or none).
            GgmlType::Q5_0 => blk[2..].fill(if b % 2 == 0 { 0xff } else { 0x00 }),
            // Codes 15 / 31 and 0, the scale and min kept.
            GgmlType::Q4_1 | GgmlType::Q5_1 => blk[4..].fill(if b % 2 == 0 { 0xff } else { 0x00 }),
            _ => {
                blk[0] = [0, 1, 2, 127, 128, 254, 255][b % 7];
                blk[1..].fill(if b % 3 == 0 { 0xff } else { 0x77 });
            }
        }
    }
    data
}

#[test]
fn partial_chunks_give_the_row_dot_bits_on_every_instruction_set() {
    // Rows of 32-element types that are not whole chunks: the chunks run
    // through the transposed kernels, the last blocks through the
    // per-block code into the same lanes; every path must give `dot`'s
    // bits (the scalar reference's, and the folding kernel's on the same
    // instruction set), packed (decode and prefill) and arranged.
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    let mut ran = false;
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        if !isa.runs() {
            continue;
        }
        ran = true;
        for ty in BLOCK_TYPES {
            // gpt-oss's width, 32 k for k not a multiple of 8, whole chunks.
            for cols in [
                2880,
                32,
                32 * 6,
                32 * 7,
                32 * 9,
                32 * 13,
                32 * 30,
                32 * 67,
                CHUNK,
                3 * CHUNK,
            ] {
                let rows = 4;
                let data = rows_with_extremes(&mut rng, ty, rows, cols);
                let rb = data.len() / rows;
                let xs: Vec<Vec<f32>> = (0..9)
                    .map(|n| {
                        (0..cols)
                            .map(|i| match n % 3 {
                                // ±127 codes everywhere: all +127 (the
                                // largest 16-bit pair sums of unsigned
                                // codes: MXFP4's levels + 12 on AVX2),
                                // all -127, then mixed.
                                0 if n == 0 => 1.0,
                                0 if n == 3 => -1.0,
                                0 => {
                                    if (i + n) % 3 == 0 {
                                        -1.0
                                    } else {
                                        1.0
                                    }
                                }
                                _ => rng.gen_range(-1.0f32..1.0) * 10f32.powi(n as i32 % 5 - 2),
                            })
                            .collect()
                    })
                    .collect();
                let mut acts: Vec<Q8Acts> = xs.iter().map(|x| Q8Acts::new(x)).collect();
                let want: Vec<Vec<u32>> = (0..rows)
                    .map(|r| {
                        let row = &data[r * rb..(r + 1) * rb];
                        acts.iter()
                            .map(|a| {
                                let v = dot_on(Isa::Scalar, ty, row, a).to_bits();
                                assert_eq!(dot_on(isa, ty, row, a).to_bits(), v, "{isa:?} {ty} {cols} fold");
                                v
                            })
                            .collect()
                    })
                    .collect();
                for a in &mut acts {
                    a.arrange();
                }
                // Q5_0 is arranged (as Q8_0), never packed.
                let packs = packable_on(isa, ty, cols);
                let packed = if packs {
                    pack_rows_on(isa, ty, &data, rows, cols)
                } else {
                    data.clone()
                };
                assert_eq!(packed.len(), data.len());
                for (t, a) in acts.iter().enumerate().filter(|_| packs) {
                    let mut got = vec![0.0f32; rows];
                    dot_rows_packed_on(isa, ty, &packed, a, &mut got);
                    for r in 0..rows {
                        assert_eq!(
                            got[r].to_bits(),
                            want[r][t],
                            "{isa:?} {ty} {cols} packed row {r} act {t}"
                        );
                    }
                }
                let mut arranged = ArrangedRow::default();
                for n in [1, 2, 3, 4, 5, 8, 9] {
                    let many: Vec<&Q8Acts> = acts.iter().take(n).collect();
                    let batch = ArrangedActs::new(&many);
                    for r in 0..rows {
                        let mut got = vec![0.0f32; n];
                        if packs {
                            dot_many_packed_on(isa, ty, &packed[r * rb..(r + 1) * rb], &batch, &mut got);
                            let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                            assert_eq!(bits, want[r][..n], "{isa:?} {ty} {cols} many packed row {r}, {n} acts");
                        }
                        if packs && isa == Isa::active() && r + 1 < rows {
                            // Rows `r` and `r + 1` in one pass (their tails
                            // after the chunks).
                            let row = |r: usize| &packed[r * rb..(r + 1) * rb];
                            let (mut oa, mut ob) = (vec![0.0f32; n], vec![0.0f32; n]);
                            dot_pair_packed(ty, (row(r), row(r + 1)), &batch, &mut oa, &mut ob);
                            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                            assert_eq!(
                                bits(&oa),
                                want[r][..n],
                                "{isa:?} {ty} {cols} pair, first row {r}, {n} acts"
                            );
                            assert_eq!(
                                bits(&ob),
                                want[r + 1][..n],
                                "{isa:?} {ty} {cols} pair, second row, {n} acts"
                            );
                        }
                        arrange_row_on(isa, ty, &data[r * rb..(r + 1) * rb], &mut arranged);
                        dot_many_arranged(&arranged, &batch, &mut got);
                        let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(bits, want[r][..n], "{isa:?} {ty} {cols} arranged row {r}, {n} acts");
                    }
                }
            }
        }
    }
    if !ran {
        eprintln!("no AVX2 here: partial chunks not exercised");
    }
}

#[test]
fn packed_q6_k_rows_give_the_row_dot_bits_on_every_instruction_set() {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    let ty = GgmlType::Q6_K;
    let mut ran = false;
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        if !packable_on(isa, ty, CHUNK) {
            continue;
        }
        ran = true;
        // Cases 0 and 1 are the extremes (row 0's codes against activation
        // codes of +127 with some -127, then all +127: the 16-bit pair sums
        // at their largest, Q5_K's four pairs per widening 31496).
        for (case, &chunks) in [1usize, 1, 3, 8].iter().enumerate() {
            let cols = CHUNK * chunks;
            let rows = 6;
            let mut data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
            // Row 0: every code 63 (the largest) with scales 127, -127 and
            // -128.
            for sb in data[..ty.row_bytes(cols).unwrap()].chunks_exact_mut(q6k::BLOCK) {
                sb[..192].fill(0xff);
                for (i, s) in sb[192..208].iter_mut().enumerate() {
                    *s = [127, 0x81, 0x80][i % 3];
                }
            }
            let x: Vec<f32> = (0..cols)
                .map(|i| match case {
                    // ±127 codes everywhere (the sums' largest magnitudes).
                    0 => {
                        if i % 5 == 0 {
                            -1.0
                        } else {
                            1.0
                        }
                    }
                    _ => rng.gen_range(-1.0f32..1.0),
                })
                .collect();
            let mut a = Q8Acts::new(&x);
            a.arrange();
            let packed = pack_rows_on(isa, ty, &data, rows, cols);
            assert_eq!(packed.len(), data.len());
            let mut got = vec![0.0f32; rows];
            dot_rows_packed_on(isa, ty, &packed, &a, &mut got);
            let rb = data.len() / rows;
            for (r, g) in got.iter().enumerate() {
                let want = dot_on(Isa::Scalar, ty, &data[r * rb..(r + 1) * rb], &a);
                assert_eq!(g.to_bits(), want.to_bits(), "{isa:?} {cols} row {r}: {g} vs {want}");
            }
        }
    }
    assert_eq!(ran, Isa::Avx2.runs());
}

#[test]
fn the_q6_k_layout_holds_every_code_once() {
    // Unpack the packed bytes as the module docs describe them and compare
    // with the GGUF codes.
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    for _ in 0..16 {
        let src = random_row(&mut rng, GgmlType::Q6_K, CHUNK);
        let mut p = vec![0u8; q6k::BLOCK];
        q6k::pack_block(&src, &mut p);
        for b in 0..8 {
            let want = crate::gguf::qdot::reference::codes(GgmlType::Q6_K, &src, b);
            for (e, &w) in want.iter().enumerate() {
                let (half, i) = (e / 16, e % 16);
                let (r, k) = (i / 4, i % 4);
                let nib = p[32 * r + 4 * b + k] >> (4 * half) & 0x0f;
                let (m, h) = ((e % 16) / 4, e / 16);
                let top = p[128 + 32 * h + 4 * b + k] >> (2 * m) & 3;
                assert_eq!((nib | top << 4) as i16, w, "sub-block {b} element {e}");
            }
            assert_eq!(p[192 + b], src[192 + 2 * b]);
            assert_eq!(p[200 + b], src[193 + 2 * b]);
        }
        assert_eq!(p[208..210], src[208..210]);
    }
}

#[test]
fn q6_k_whole_chunks_pack_and_have_an_arranged_prefill() {
    let x86 = matches!(Isa::active(), Isa::Avx2 | Isa::Avx512Vnni);
    assert_eq!(packable(GgmlType::Q6_K, 2048), x86);
    assert_eq!(usable(GgmlType::Q6_K, 2048), x86);
    assert!(!usable(GgmlType::Q6_K, 2048 + 32));
    assert_eq!(packable(GgmlType::Q4_K, 2048), x86);
    assert_eq!(packable(GgmlType::Q5_K, 2048), x86);
    assert!(!packable(GgmlType::Q6_K, 0));
    assert_eq!(packable(GgmlType::Q4_0, 2048), usable(GgmlType::Q4_0, 2048));
}

#[test]
fn packed_super_block_rows_give_the_row_dot_bits_on_every_instruction_set() {
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::IQ4_XS,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
    ] {
        packed_super_block_rows_give_the_row_dot_bits(ty);
    }
}

fn packed_super_block_rows_give_the_row_dot_bits(ty: GgmlType) {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut ran = false;
    for isa in [Isa::Avx2, Isa::Avx512Vnni] {
        if !packable_on(isa, ty, CHUNK) {
            continue;
        }
        ran = true;
        for (case, &chunks) in [1usize, 3, 8].iter().enumerate() {
            let cols = CHUNK * chunks;
            let rows = 6;
            let mut data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
            // Row 0: Q4_K every nibble 15 with every 6-bit scale and min 63
            // (the 16-bit sums' and the scale decode's largest values);
            // IQ4_XS every nibble 0 (level -127) with every scale 63.
            for sb in data[..ty.row_bytes(cols).unwrap()].chunks_exact_mut(ty.block_bytes()) {
                match ty {
                    GgmlType::Q4_K | GgmlType::Q5_K => sb[4..].fill(0xff),
                    GgmlType::IQ4_XS => {
                        sb[2..8].fill(0xff);
                        sb[8..].fill(0);
                    }
                    // Every code, scale and min at its largest.
                    GgmlType::Q2_K => sb[..80].fill(0xff),
                    _ => sb[..108].fill(0xff),
                }
            }
            let x: Vec<f32> = (0..cols)
                .map(|i| match case {
                    0 => {
                        if i % 5 == 0 {
                            -1.0
                        } else {
                            1.0
                        }
                    }
                    1 => 1.0,
                    _ => rng.gen_range(-1.0f32..1.0),
                })
                .collect();
            let mut a = Q8Acts::new(&x);
            a.arrange();
            let packed = pack_rows_on(isa, ty, &data, rows, cols);
            assert_eq!(packed.len(), data.len());
            let mut got = vec![0.0f32; rows];
            dot_rows_packed_on(isa, ty, &packed, &a, &mut got);
            let rb = data.len() / rows;
            for (r, g) in got.iter().enumerate() {
                let want = dot_on(Isa::Scalar, ty, &data[r * rb..(r + 1) * rb], &a);
                assert_eq!(g.to_bits(), want.to_bits(), "{isa:?} {cols} row {r}: {g} vs {want}");
            }
        }
    }
    assert_eq!(ran, Isa::Avx2.runs());
}

#[test]
fn the_q2_k_and_q3_k_layouts_hold_every_code_and_scale_once() {
    let mut rng = ChaCha8Rng::seed_from_u64(20);
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
        for _ in 0..8 {
            let src = random_row(&mut rng, ty, CHUNK);
            let mut p = vec![0u8; ty.block_bytes()];
            q23k::pack_block(ty, &src, &mut p);
            for b in 0..8 {
                let want = crate::gguf::qdot::reference::codes(ty, &src, b);
                for (e, &w) in want.iter().enumerate() {
                    let (r, s, k) = (e / 16, (e % 16) / 4, e % 4);
                    let mut code = (p[32 * r + 4 * b + k] >> (2 * s)) & 3;
                    if ty == GgmlType::Q3_K {
                        code |= ((p[64 + 4 * b + k] >> (e / 4)) & 1) << 2;
                    }
                    assert_eq!(code as i16, w, "{ty} sub-block {b} element {e}");
                }
            }
            let scales = q23k::scales_scalar(ty, &p);
            for g in 0..16 {
                let (h, b) = (g % 2, g / 2);
                if ty == GgmlType::Q3_K {
                    assert_eq!(scales[h][b], crate::gguf::types::q3_k_scale(&src[96..108], g));
                } else {
                    assert_eq!(
                        (scales[h][b], scales[2 + h][b]),
                        ((src[g] & 15) as i32, (src[g] >> 4) as i32)
                    );
                }
            }
            #[cfg(target_arch = "x86_64")]
            if Isa::Avx2.runs() {
                // The register decode against the scalar one, and d / dmin.
                let (v, d, dmin) = unsafe { q23k::scales(ty, p.as_ptr()) };
                let lanes = |v: std::arch::x86_64::__m256i| unsafe { std::mem::transmute::<_, [i32; 8]>(v) };
                let flanes = |v: std::arch::x86_64::__m256| unsafe { std::mem::transmute::<_, [f32; 8]>(v) };
                assert_eq!(v.map(lanes), scales, "{ty}");
                let h = |i: usize| crate::gguf::types::f16_le([src[i], src[i + 1]]);
                if ty == GgmlType::Q3_K {
                    assert_eq!(flanes(d), [h(108); 8]);
                } else {
                    assert_eq!((flanes(d), flanes(dmin)), ([h(80); 8], [h(82); 8]));
                }
            }
        }
    }
}

#[test]
fn the_q5_k_layout_holds_every_code_once() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for _ in 0..8 {
        let src = random_row(&mut rng, GgmlType::Q5_K, CHUNK);
        let mut p = vec![0u8; q5k::BLOCK];
        q5k::pack_block(&src, &mut p);
        for b in 0..8 {
            let want = crate::gguf::qdot::reference::codes(GgmlType::Q5_K, &src, b);
            for (e, &w) in want.iter().enumerate() {
                let (half, i) = (e / 16, e % 16);
                let (j, k) = (i / 4, i % 4);
                let low = p[32 * j + 4 * b + k] >> (4 * half) & 0x0f;
                let high = (p[128 + 4 * b + k] >> (e / 4)) & 1;
                assert_eq!((low | (high << 4)) as i16, w, "sub-block {b} element {e}");
            }
        }
        // From byte 32 on it reads as a packed Q4_K block's scales.
        assert_eq!(p[160..172], src[4..16]);
        assert_eq!(p[172..176], src[0..4]);
    }
}

#[test]
fn the_iq4_xs_layout_holds_every_code_and_scale_once() {
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    for _ in 0..8 {
        let src = random_row(&mut rng, GgmlType::IQ4_XS, CHUNK);
        let mut p = vec![0u8; iq4xs::BLOCK];
        iq4xs::pack_block(&src, &mut p);
        for b in 0..8 {
            // The nibbles the reference looks up, in lane `b` of each step.
            for e in 0..32 {
                let (half, i) = (e / 16, e % 16);
                let (j, k) = (i / 4, i % 4);
                let nib = p[32 * j + 4 * b + k] >> (4 * half) & 0x0f;
                assert_eq!(
                    nib,
                    src[8 + 16 * b + i] >> (4 * half) & 0x0f,
                    "sub-block {b} element {e}"
                );
            }
        }
        let sc = iq4xs::scales_scalar(&p);
        for (b, &s) in sc.iter().enumerate() {
            assert_eq!(s, crate::gguf::types::iq4_xs_scale([src[2], src[3]], &src[4..8], b));
        }
        assert_eq!(p[128..136], src[0..8]);
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx2.runs() {
            // The register decode against the scalar one, and d.
            let (vs, d) = unsafe { iq4xs::scales(p.as_ptr()) };
            let lanes = unsafe { std::mem::transmute::<std::arch::x86_64::__m256i, [i32; 8]>(vs) };
            let flanes = unsafe { std::mem::transmute::<std::arch::x86_64::__m256, [f32; 8]>(d) };
            assert_eq!(lanes, sc);
            assert_eq!(flanes, [crate::gguf::types::f16_le([src[0], src[1]]); 8]);
        }
    }
}

#[test]
fn the_q4_k_layout_holds_every_code_and_scale_once() {
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    for _ in 0..8 {
        let src = random_row(&mut rng, GgmlType::Q4_K, CHUNK);
        let mut p = vec![0u8; q4k::BLOCK];
        q4k::pack_block(&src, &mut p);
        for b in 0..8 {
            let want = crate::gguf::qdot::reference::codes(GgmlType::Q4_K, &src, b);
            for (e, &w) in want.iter().enumerate() {
                let (half, i) = (e / 16, e % 16);
                let (j, k) = (i / 4, i % 4);
                let nib = p[32 * j + 4 * b + k] >> (4 * half) & 0x0f;
                assert_eq!(nib as i16, w, "sub-block {b} element {e}");
            }
        }
        let s: &[u8; 12] = src[4..16].try_into().unwrap();
        let (sc, mn) = q4k::scales_scalar(&p);
        for b in 0..8 {
            let (x, m) = crate::gguf::types::scale_min_k4(s, b);
            assert_eq!((sc[b], mn[b]), (x as i32, m as i32));
        }
        assert_eq!(p[140..144], src[0..4]);
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx2.runs() {
            // The register decode against the scalar one, and d / dmin.
            let (vs, vm, d, dmin) = unsafe { q4k::scales(p.as_ptr()) };
            let lanes = |v: std::arch::x86_64::__m256i| unsafe { std::mem::transmute::<_, [i32; 8]>(v) };
            let flanes = |v: std::arch::x86_64::__m256| unsafe { std::mem::transmute::<_, [f32; 8]>(v) };
            assert_eq!((lanes(vs), lanes(vm)), (sc, mn));
            let h = |i: usize| crate::gguf::types::f16_le([src[i], src[i + 1]]);
            assert_eq!(flanes(d), [h(0); 8]);
            assert_eq!(flanes(dmin), [h(2); 8]);
        }
    }
}

#[test]
fn scales_formed_ahead_give_the_row_dot_bits() {
    if !Isa::Avx2.runs() {
        eprintln!("skipped: the packed rows whose scales are formed ahead are AVX2's layout");
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::IQ4_XS] {
        for (case, &chunks) in [1usize, 3, 8].iter().enumerate() {
            let cols = CHUNK * chunks;
            let rows = 3;
            let mut data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
            // Row 0: every code, 6-bit scale and min at its largest (IQ4_XS:
            // every nibble 0, level -127, with every scale 63).
            for sb in data[..ty.row_bytes(cols).unwrap()].chunks_exact_mut(ty.block_bytes()) {
                if ty == GgmlType::IQ4_XS {
                    sb[2..8].fill(0xff);
                    sb[8..].fill(0);
                } else {
                    sb[4..].fill(0xff);
                }
            }
            let rb = data.len() / rows;
            // The factors decoded as the vector loops decode them equal the
            // scalar reference's, bit for bit.
            let packed = pack_rows_on(Isa::Avx2, ty, &data, rows, cols);
            let per = scales_per_chunk(ty) * chunks;
            for r in 0..rows {
                let row = &packed[r * rb..(r + 1) * rb];
                let (mut got, mut want) = (vec![0.0f32; per], vec![0.0f32; per]);
                scales_ahead(ty, row, &mut got);
                scales_ahead_scalar(ty, row, &mut want);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{ty} row {r}"
                );
            }
            assert!(scales_ahead_pay_on(Isa::Avx2, ty, cols), "{ty} {cols}");
            // One to nine activation rows (a pass of four, the rest), the
            // first case's codes at ±127.
            let acts: Vec<Q8Acts> = (0..9)
                .map(|t| {
                    let x: Vec<f32> = (0..cols)
                        .map(|i| match case {
                            0 if t % 2 == 0 => 1.0,
                            0 => {
                                if i % 5 == 0 {
                                    -1.0
                                } else {
                                    1.0
                                }
                            }
                            _ => rng.gen_range(-1.0f32..1.0),
                        })
                        .collect();
                    let mut a = Q8Acts::new(&x);
                    a.arrange();
                    a
                })
                .collect();
            let refs: Vec<&Q8Acts> = acts.iter().collect();
            for n in 1..=refs.len() {
                let batch = ArrangedActs::new(&refs[..n]);
                let mut all_scales = vec![0.0f32; rows * per];
                for r in 0..rows {
                    let row = &packed[r * rb..(r + 1) * rb];
                    let scales = &mut all_scales[r * per..(r + 1) * per];
                    scales_ahead(ty, row, scales);
                    let mut got = vec![0.0f32; n];
                    dot_many_packed_ahead_on(Isa::Avx2, ty, row, scales, &batch, &mut got);
                    for (t, g) in got.iter().enumerate() {
                        let want = dot_on(Isa::Scalar, ty, &data[r * rb..(r + 1) * rb], &acts[t]);
                        assert_eq!(g.to_bits(), want.to_bits(), "{ty} {cols} row {r}, {n} rows, row {t}");
                    }
                }
                // Every row in one call, outputs `n + 1` apart: the same
                // bits, the gaps untouched, `before` once a row.
                let stride = n + 1;
                let mut tile = vec![-7.0f32; rows * stride];
                let mut seen = Vec::new();
                let (out, before) = (&mut tile[..], &mut |i| seen.push(i));
                let to = TileOut { out, stride, before };
                dot_many_packed_ahead_rows_on(Isa::Avx2, ty, &packed, &all_scales, &batch, to);
                assert_eq!(seen, (0..rows).collect::<Vec<_>>());
                for r in 0..rows {
                    for t in 0..n {
                        let want = dot_on(Isa::Scalar, ty, &data[r * rb..(r + 1) * rb], &acts[t]);
                        assert_eq!(
                            tile[r * stride + t].to_bits(),
                            want.to_bits(),
                            "{ty} tile row {r}, {n} rows"
                        );
                    }
                    assert_eq!(tile[r * stride + n], -7.0, "{ty} gap after row {r}");
                }
            }
        }
    }
}
