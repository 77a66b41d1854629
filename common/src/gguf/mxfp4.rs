//! MXFP4 tensors as Hugging Face checkpoints store them (gpt-oss's
//! `*_blocks` / `*_scales` pairs), converted to GGML MXFP4 blocks
//! ([`super::types::BlockMxfp4`]) without changing a code or an exponent.
//!
//! # The two layouts
//!
//! The hub stores a weight `[..., rows, cols]` as `X_blocks`, u8 of shape
//! `[..., rows, cols / 32, 16]`, and `X_scales`, u8 of shape
//! `[..., rows, cols / 32]`. In one 32-element group, byte `j` holds
//! element `2j` in its low nibble and element `2j + 1` in its high nibble;
//! a nibble indexes the FP4 E2M1 values
//! `[+0, +0.5, +1, +1.5, +2, +3, +4, +6, -0, -0.5, ..., -6]` and the
//! element is `E2M1[nibble] * 2^(scale - 127)` (transformers'
//! `convert_moe_packed_tensors`: `sub[:, 0::2] = lut[blk & 0x0F]`,
//! `sub[:, 1::2] = lut[blk >> 4]`, `torch.ldexp(sub, scales - 127)`).
//!
//! A GGML block holds the same group as `e` then `qs[16]`, element `i < 16`
//! in the low nibble of `qs[i]` and element `i + 16` in its high nibble,
//! with the value `kvalues_mxfp4[nibble] * 2^(e - 128)`. `kvalues_mxfp4`
//! is E2M1 doubled and the scale is halved, so the same nibble and the
//! same exponent byte (`e = scale`) give the same value; only the order of
//! the nibbles changes (llama.cpp's `convert_hf_to_gguf.py` does the same
//! for gpt-oss). The one difference in value: nibble 8 is E2M1's -0 and
//! ggml's integer 0, so it reads back as +0.
//!
//! Leading dims (experts) flatten into rows: expert `x` of a
//! `[n_experts, rows, cols]` tensor is rows `x * rows..(x + 1) * rows`.
//! gpt-oss interleaves the rows of `gate_up_proj`: even rows are the gate
//! projection, odd rows the up projection ([`blocks_from_hub_rows`] picks
//! them).

use thiserror::Error;

use super::types::{BlockMxfp4, QK};

/// Hub bytes per 32-element group (two codes a byte).
const GROUP_BYTES: usize = QK / 2;
/// Bytes per GGML MXFP4 block.
const BLOCK_BYTES: usize = size_of::<BlockMxfp4>();

/// A hub MXFP4 tensor could not be converted.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum HubMxfp4Error {
    /// The row length is not a whole number of 32-element groups.
    #[error("MXFP4 rows of {cols} elements are not whole groups of 32")]
    Cols { cols: usize },
    /// `what` (`"blocks"` or `"scales"`) holds `got` bytes, but `rows` rows
    /// of `cols` elements take `expected` (`None` when that size overflows
    /// `usize`).
    #[error(
        "MXFP4 {what} hold {got} bytes, but {rows} rows of {cols} elements take {}",
        expected.map_or("more than memory holds".to_string(), |e| format!("{e}"))
    )]
    Length {
        what: &'static str,
        rows: usize,
        cols: usize,
        expected: Option<usize>,
        got: usize,
    },
    /// A picked row index is not below the tensor's row count.
    #[error("row {row} picked from an MXFP4 tensor of {rows} rows")]
    RowOutOfRange { row: usize, rows: usize },
}

/// A hub MXFP4 tensor of `rows` rows of `cols` elements (`blocks`: its
/// `X_blocks` bytes, `scales`: its `X_scales` bytes, leading dims
/// flattened into `rows`) as GGML MXFP4 rows, back to back:
/// `rows * cols / 32 * 17` bytes, the values of the hub tensor (see the
/// module docs).
///
/// An error when `cols` is not a multiple of 32 or the byte counts do not
/// match the shape.
pub fn blocks_from_hub(blocks: &[u8], scales: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>, HubMxfp4Error> {
    blocks_from_hub_rows(blocks, scales, rows, cols, 0..rows)
}

/// The rows `pick` names (in its order, repeats allowed) of a hub MXFP4
/// tensor of `rows` rows of `cols` elements, as GGML MXFP4 rows back to
/// back: what [`blocks_from_hub`] gives for those rows. gpt-oss's gate
/// projection of expert `x` of `gate_up_proj` (`2 * inter` rows per
/// expert) is `pick = (0..inter).map(|i| x * 2 * inter + 2 * i)`, its up
/// projection the same plus one.
///
/// An error when `cols` is not a multiple of 32, the byte counts do not
/// match the shape, or a picked row is not below `rows`.
pub fn blocks_from_hub_rows(
    blocks: &[u8],
    scales: &[u8],
    rows: usize,
    cols: usize,
    pick: impl IntoIterator<Item = usize>,
) -> Result<Vec<u8>, HubMxfp4Error> {
    if !cols.is_multiple_of(QK) {
        return Err(HubMxfp4Error::Cols { cols });
    }
    let groups = cols / QK;
    let n_groups = rows.checked_mul(groups);
    let check = |what, expected: Option<usize>, got| {
        if expected == Some(got) {
            Ok(())
        } else {
            Err(HubMxfp4Error::Length {
                what,
                rows,
                cols,
                expected,
                got,
            })
        }
    };
    check("scales", n_groups, scales.len())?;
    check(
        "blocks",
        n_groups.and_then(|n| n.checked_mul(GROUP_BYTES)),
        blocks.len(),
    )?;
    // Both lengths match: `rows * groups` groups fit in memory, and so do
    // `rows * groups * 17` bytes (at most 17/16 of `blocks`, which exists).
    let row_bytes = groups * BLOCK_BYTES;
    let pick = pick.into_iter();
    let mut out = Vec::with_capacity(pick.size_hint().0.min(rows) * row_bytes);
    for r in pick {
        if r >= rows {
            return Err(HubMxfp4Error::RowOutOfRange { row: r, rows });
        }
        let first = r * groups;
        let codes = blocks[first * GROUP_BYTES..(first + groups) * GROUP_BYTES].chunks_exact(GROUP_BYTES);
        for (&scale, group) in scales[first..first + groups].iter().zip(codes) {
            out.push(scale);
            out.extend_from_slice(&ggml_order(group.try_into().expect("16 bytes a group")));
        }
    }
    Ok(out)
}

/// One group's codes in GGML's order: hub byte `j` holds elements `2j`
/// (low nibble) and `2j + 1` (high); GGML byte `i` holds elements `i`
/// (low) and `i + 16` (high).
#[inline]
fn ggml_order(hub: &[u8; GROUP_BYTES]) -> [u8; GROUP_BYTES] {
    let code = |k: usize| (hub[k / 2] >> (4 * (k % 2))) & 0x0f;
    std::array::from_fn(|i| code(i) | (code(i + 16) << 4))
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::gguf::{dequantize, GgmlType};

    /// FP4 E2M1, as transformers' `FP4_VALUES`.
    const E2M1: [f64; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];

    /// The hub tensor's values by the hub's formula, element by element
    /// (in f64, where every value is exact, then rounded once to f32).
    fn hub_values(blocks: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
        let groups = cols / 32;
        let mut v = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                let g = r * groups + c / 32;
                let byte = blocks[16 * g + (c % 32) / 2];
                let nibble = if c % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                let x = E2M1[nibble as usize] * 2f64.powi(scales[g] as i32 - 127);
                v.push(x as f32);
            }
        }
        v
    }

    fn random_tensor(rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
        let blocks = (0..rows * cols / 2).map(|_| rng.gen()).collect();
        let scales = (0..rows * cols / 32).map(|_| rng.gen()).collect();
        (blocks, scales)
    }

    /// Equal values, and equal bits but for the sign of zero (E2M1's -0 is
    /// ggml's +0).
    fn assert_same_values(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(g == w, "{what} element {i}: {g} vs {w}");
            if *w != 0.0 {
                assert_eq!(g.to_bits(), w.to_bits(), "{what} element {i}");
            }
        }
    }

    #[test]
    fn converted_blocks_dequantize_to_the_hub_values() {
        // Every exponent byte (0..=255, subnormal and infinite results
        // included) and every nibble, over several shapes.
        let mut rng = ChaCha8Rng::seed_from_u64(39);
        for (rows, cols) in [(1, 32), (3, 64), (7, 2880 / 9), (16, 256)] {
            let (blocks, scales) = random_tensor(&mut rng, rows, cols);
            let ggml = blocks_from_hub(&blocks, &scales, rows, cols).unwrap();
            assert_eq!(ggml.len(), rows * cols / 32 * 17);
            let got = dequantize(GgmlType::MXFP4, &ggml, rows * cols).unwrap();
            assert_same_values(
                &got,
                &hub_values(&blocks, &scales, rows, cols),
                &format!("{rows}x{cols}"),
            );
        }
    }

    #[test]
    fn one_group_moves_nibbles_as_ggml_orders_them() {
        // Hub element k has code k % 16: byte j = (2j % 16) | ((2j + 1) % 16) << 4.
        let blocks: Vec<u8> = (0..16)
            .map(|j| ((2 * j % 16) | (((2 * j + 1) % 16) << 4)) as u8)
            .collect();
        let ggml = blocks_from_hub(&blocks, &[131], 1, 32).unwrap();
        assert_eq!(ggml[0], 131, "the exponent byte is kept");
        for i in 0..16 {
            // GGML byte i: element i (low), element i + 16 (high); both have code i.
            assert_eq!(ggml[1 + i], (i as u8) | ((i as u8) << 4), "byte {i}");
        }
    }

    #[test]
    fn picked_rows_are_the_rows_of_the_whole_conversion() {
        // Two experts of gpt-oss's gate_up_proj: 2 * inter interleaved rows each.
        let mut rng = ChaCha8Rng::seed_from_u64(40);
        let (experts, inter, cols) = (2, 3, 96);
        let rows = experts * 2 * inter;
        let (blocks, scales) = random_tensor(&mut rng, rows, cols);
        let all = blocks_from_hub(&blocks, &scales, rows, cols).unwrap();
        let rb = cols / 32 * 17;
        for x in 0..experts {
            for (part, parity) in [("gate", 0), ("up", 1)] {
                let pick = (0..inter).map(|i| x * 2 * inter + 2 * i + parity);
                let got = blocks_from_hub_rows(&blocks, &scales, rows, cols, pick.clone()).unwrap();
                let want: Vec<u8> = pick.flat_map(|r| all[r * rb..(r + 1) * rb].to_vec()).collect();
                assert_eq!(got, want, "expert {x} {part}");
            }
        }
        // Repeats and any order.
        let got = blocks_from_hub_rows(&blocks, &scales, rows, cols, [5, 0, 5]).unwrap();
        assert_eq!(got, [&all[5 * rb..6 * rb], &all[..rb], &all[5 * rb..6 * rb]].concat());
        assert!(blocks_from_hub_rows(&blocks, &scales, rows, cols, [])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn bad_shapes_are_errors() {
        let (blocks, scales) = (vec![0u8; 64], vec![0u8; 4]);
        assert_eq!(blocks_from_hub(&blocks, &scales, 2, 64), Ok(vec![0u8; 4 * 17]));
        assert_eq!(
            blocks_from_hub(&blocks, &scales, 2, 48),
            Err(HubMxfp4Error::Cols { cols: 48 })
        );
        assert_eq!(
            blocks_from_hub(&blocks[1..], &scales, 2, 64),
            Err(HubMxfp4Error::Length {
                what: "blocks",
                rows: 2,
                cols: 64,
                expected: Some(64),
                got: 63
            })
        );
        assert_eq!(
            blocks_from_hub(&blocks, &scales[..3], 2, 64),
            Err(HubMxfp4Error::Length {
                what: "scales",
                rows: 2,
                cols: 64,
                expected: Some(4),
                got: 3
            })
        );
        assert!(matches!(
            blocks_from_hub(&blocks, &scales, usize::MAX, 64),
            Err(HubMxfp4Error::Length { expected: None, .. })
        ));
        assert!(matches!(
            blocks_from_hub(&blocks, &scales, usize::MAX / 2 + 1, 32),
            Err(HubMxfp4Error::Length { what: "scales", .. })
        ));
        assert_eq!(
            blocks_from_hub_rows(&blocks, &scales, 2, 64, [1, 2]),
            Err(HubMxfp4Error::RowOutOfRange { row: 2, rows: 2 })
        );
        assert_eq!(blocks_from_hub(&[], &[], 0, 64), Ok(vec![]));
        assert_eq!(blocks_from_hub(&[], &[], 5, 0), Ok(vec![]));
        let e = blocks_from_hub(&blocks, &scales, usize::MAX, 64).unwrap_err();
        assert!(e.to_string().contains("more than memory holds"), "{e}");
    }
}
