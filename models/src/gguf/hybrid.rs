//! GGUF hybrids (`qwen3next`, `qwen35moe`): the converter changes more (`convert_hf_to_gguf.py`,
//! `Qwen3NextModel` and `_LinearAttentionVReorderBase`), and each change is
//! undone here so that the model computes what its Hugging Face directory
//! computes:
//! - every RMSNorm weight but the DeltaNet's gated one has its `+ 1`
//!   folded in, so the config leaves [`ModelConfig::zero_centred_norms`]
//!   off;
//! - `A_log` is stored as `ssm_a = -exp(A_log)`: read back as the `A_log`
//!   whose `-exp` is `ssm_a` ([`a_log_from_ssm_a`]);
//! - Qwen3-Next's grouped `in_proj_qkvz` is stored split as `attn_qkv`
//!   (`[q | k | v]`) and `attn_gate` (`z`), so the model runs the
//!   `Separate` projection layout; its `in_proj_ba` stays grouped
//!   (`ssm_ba`) and `in_proj_b` / `in_proj_a` are its rows picked out;
//! - Qwen3.5 stores V heads "tiled" (`[G0_v0, G1_v0, …, G0_v1, …]`)
//!   instead of grouped by key head when there are more value than key
//!   heads, in the v rows of `attn_qkv`, the rows of `attn_gate`,
//!   `ssm_beta`, `ssm_alpha`, the entries of `ssm_a`, `ssm_dt.bias`, the v
//!   channels of `ssm_conv1d` and the columns of `ssm_out`: all put back in
//!   grouped order at load (rows and whole blocks are moved, never
//!   re-quantized; `ssm_out` columns of a block type whose block spans more
//!   than one value head are dequantized to f32 to be moved).
//!

use charm_common::gguf::{GgmlType, GgufFile, MetaValue};
use charm_common::weight::{Buf, WeightData};
use charm_common::{LoadError, Weight};

use super::{bad, bad_tensor, missing};
use crate::config::MixerKind;
use crate::error::ModelError;
use crate::gated_delta_net::{DeltaNetShape, ProjectionLayout};

/// A hybrid's mixer per layer (`attention.recurrent_layers`, else every
/// `full_attention_interval`-th layer is attention) and its DeltaNet shape
/// from the `ssm.*` keys the converter writes: `group_count` = key heads,
/// `time_step_rank` = value heads, `state_size` = key head dim,
/// `inner_size` = value heads × value head dim, `conv_kernel`.
pub(super) fn hybrid_layers(
    f: &GgufFile,
    arch: &str,
    layers: usize,
) -> Result<(Vec<MixerKind>, DeltaNetShape), ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let req = |k: &str| -> Result<usize, ModelError> {
        f.meta(&key(k))
            .and_then(MetaValue::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| bad(f, format!("missing or non-integer metadata {}", key(k))))
    };
    let v_heads = req("ssm.time_step_rank")?;
    let inner = req("ssm.inner_size")?;
    if v_heads == 0 || !inner.is_multiple_of(v_heads) {
        return Err(bad(
            f,
            format!(
                "{} ({inner}) must be a multiple of {} ({v_heads})",
                key("ssm.inner_size"),
                key("ssm.time_step_rank")
            ),
        ));
    }
    let shape = DeltaNetShape {
        k_heads: req("ssm.group_count")?,
        v_heads,
        k_head_dim: req("ssm.state_size")?,
        v_head_dim: inner / v_heads,
        conv_kernel: req("ssm.conv_kernel")?,
        // The converter splits Qwen3-Next's grouped in_proj_qkvz into
        // attn_qkv and attn_gate: both families read as separate projections.
        layout: ProjectionLayout::Separate,
    };
    shape.validate().map_err(|reason| bad(f, reason))?;
    let mixers = match f.meta(&key("attention.recurrent_layers")).and_then(MetaValue::as_array) {
        Some(list) => {
            if list.len() < layers {
                return Err(bad(
                    f,
                    format!(
                        "{} has {} entries for {layers} layers",
                        key("attention.recurrent_layers"),
                        list.len()
                    ),
                ));
            }
            list[..layers]
                .iter()
                .map(|v| match v.as_bool() {
                    Some(true) => Ok(MixerKind::GatedDeltaNet),
                    Some(false) => Ok(MixerKind::Attention),
                    None => Err(bad(
                        f,
                        format!("{} holds a non-bool", key("attention.recurrent_layers")),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        None => {
            let interval = f
                .meta(&key("full_attention_interval"))
                .and_then(MetaValue::as_u64)
                .unwrap_or(4) as usize;
            if interval == 0 {
                return Err(bad(f, format!("{} must be at least 1", key("full_attention_interval"))));
            }
            (0..layers)
                .map(|i| {
                    if (i + 1) % interval != 0 {
                        MixerKind::GatedDeltaNet
                    } else {
                        MixerKind::Attention
                    }
                })
                .collect()
        }
    };
    Ok((mixers, shape))
}

/// Where Qwen3.5's converter put grouped value head `h` (of `k_heads` key
/// heads, `r` value heads each): grouped `h = g * r + j` is tiled `j * k_heads + g`.
pub(super) fn tiled(h: usize, k_heads: usize, r: usize) -> usize {
    (h % r) * k_heads + h / r
}

/// For each of `units` grouped units of `width` elements, the tiled unit's
/// elements: the stored index of every element in Hugging Face order.
pub(super) fn untile(units: usize, width: usize, k_heads: usize, r: usize) -> Vec<usize> {
    (0..units * width)
        .map(|i| tiled(i / width, k_heads, r) * width + i % width)
        .collect()
}

/// The `A_log` whose `-exp` (as the DeltaNet computes it,
/// `-A_log.exp()`) is `ssm_a`: `ln(-ssm_a)`, moved by a few ulps where
/// that finds an exact inverse (the converter's `-torch.exp(A_log)` may
/// round differently from `f32::exp`). `None` unless `ssm_a <= 0`.
pub(super) fn a_log_from_ssm_a(a: f32) -> Option<f32> {
    if a.is_nan() || a > 0.0 {
        return None;
    }
    let y = (-a).ln();
    if !y.is_finite() || -y.exp() == a {
        return Some(y);
    }
    let mut best = y;
    let (mut up, mut down) = (y, y);
    for _ in 0..8 {
        up = up.next_up();
        down = down.next_down();
        for c in [up, down] {
            if -c.exp() == a {
                return Some(c);
            }
            if (-c.exp() - a).abs() < (-best.exp() - a).abs() {
                best = c;
            }
        }
    }
    Some(best)
}

/// The stored matrix `g` (`src_rows` × `cols`) with rows `pick` (stored
/// row of each output row) and value-head column units `units` (stored
/// unit of each output unit, `cols / units.len()` wide) moved. Rows and
/// whole blocks move as stored; columns of a block type whose block
/// spans more than one unit are moved dequantized to f32.
pub(super) fn rearranged(
    file: &GgufFile,
    g: &str,
    src_rows: usize,
    cols: usize,
    pick: Option<&[usize]>,
    units: Option<&[usize]>,
) -> Result<Weight, LoadError> {
    // Checks the name, dims and type as a plain read would.
    let stored = file.weight(g, src_rows, cols)?;
    let t = file.tensor(g).ok_or_else(|| missing(file, g.to_string()))?;
    let ty = t.ty;
    let row_bytes = ty
        .row_bytes(cols)
        .ok_or_else(|| bad_tensor(file, g, format!("{cols} columns are not whole {ty:?} blocks")))?;
    let bytes = file.tensor_bytes(t);
    let identity: Vec<usize>;
    let pick = match pick {
        Some(p) => p,
        None => {
            identity = (0..src_rows).collect();
            &identity
        }
    };
    if let Some(&bad) = pick.iter().find(|&&r| r >= src_rows) {
        return Err(bad_tensor(file, g, format!("row {bad} of {src_rows}")));
    }
    let rows = pick.len();
    let unit_cols = match units {
        Some(u) if !u.is_empty() && cols.is_multiple_of(u.len()) => Some(cols / u.len()),
        Some(_) => {
            return Err(bad_tensor(
                file,
                g,
                format!("{cols} columns do not split into value heads"),
            ))
        }
        None => None,
    };
    let block_aligned = unit_cols.is_none_or(|w| w.is_multiple_of(ty.block_elems()));
    if !block_aligned {
        // Dequantized, then moved as f32 (exact values, f32 products).
        let all = stored.data().to_f32_vec();
        let (w, units) = (unit_cols.unwrap_or(cols), units.unwrap_or(&[]));
        let mut out = Vec::with_capacity(rows * cols);
        for &r in pick {
            let row = &all[r * cols..(r + 1) * cols];
            for &u in units {
                out.extend_from_slice(&row[u * w..(u + 1) * w]);
            }
        }
        return Ok(Weight::from_f32(rows, cols, out));
    }
    // Byte runs: whole rows, or whole blocks of each unit.
    let (unit_bytes, units) = match (unit_cols, units) {
        (Some(w), Some(u)) => (w / ty.block_elems() * ty.block_bytes(), u),
        _ => (row_bytes, &[0usize][..]),
    };
    let mut out = Vec::with_capacity(rows * row_bytes);
    for &r in pick {
        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
        for &u in units {
            out.extend_from_slice(&row[u * unit_bytes..(u + 1) * unit_bytes]);
        }
    }
    let le16 = |b: &[u8]| {
        b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect::<Vec<_>>()
    };
    let data = match ty {
        GgmlType::F32 => {
            let v = out
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            WeightData::F32(Buf::owned(v))
        }
        GgmlType::F16 => WeightData::F16(Buf::owned(le16(&out))),
        GgmlType::BF16 => WeightData::BF16(Buf::owned(le16(&out))),
        ty => WeightData::Gguf {
            ty,
            data: Buf::owned(out),
        },
    };
    Weight::try_new(rows, cols, data).map_err(|e| bad_tensor(file, g, e.to_string()))
}

/// For columns stored as value-head units `units` (the stored unit of each
/// model unit) in blocks of `block` elements that span a unit: the stored
/// column of each model column, so inputs move instead of blocks. `None`
/// when whole blocks can move (or the columns do not split into units).
pub(super) fn input_order(units: &[usize], cols: usize, block: usize) -> Option<Vec<usize>> {
    if units.is_empty() || !cols.is_multiple_of(units.len()) {
        return None;
    }
    let width = cols / units.len();
    if width.is_multiple_of(block) {
        return None;
    }
    Some(units.iter().flat_map(|&u| u * width..(u + 1) * width).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_value_heads_go_back_to_grouped_order() {
        // 2 key heads, 3 value heads each: grouped [G0v0 G0v1 G0v2 G1v0 G1v1 G1v2]
        // was stored tiled [G0v0 G1v0 G0v1 G1v1 G0v2 G1v2].
        let stored = ["G0v0", "G1v0", "G0v1", "G1v1", "G0v2", "G1v2"];
        let grouped: Vec<&str> = untile(6, 1, 2, 3).into_iter().map(|i| stored[i]).collect();
        assert_eq!(grouped, ["G0v0", "G0v1", "G0v2", "G1v0", "G1v1", "G1v2"]);
        // Units of width 2 move whole.
        assert_eq!(untile(2, 2, 1, 2), vec![0, 1, 2, 3]);
        assert_eq!(untile(4, 2, 2, 2), vec![0, 1, 4, 5, 2, 3, 6, 7]);
    }

    #[test]
    fn a_log_is_recovered_from_ssm_a() {
        for a_log in [-3.0f32, -0.5, 0.0, 0.1, 0.75, 1.0, 2.5, 2.772_588_7] {
            let a = -a_log.exp();
            let back = a_log_from_ssm_a(a).unwrap();
            assert_eq!((-back.exp()).to_bits(), a.to_bits(), "A_log {a_log}");
        }
        assert_eq!(a_log_from_ssm_a(-0.0), Some(f32::NEG_INFINITY));
        assert_eq!(a_log_from_ssm_a(0.5), None);
        assert_eq!(a_log_from_ssm_a(f32::NAN), None);
    }

    /// A GGUF v3 file of one `[rows, cols]` tensor `w` of type `ty` (id).
    fn one_tensor(ty: u32, rows: u64, cols: u64, data: &[u8]) -> GgufFile {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'w');
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&cols.to_le_bytes());
        b.extend_from_slice(&rows.to_le_bytes());
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend_from_slice(data);
        GgufFile::from_bytes("w.gguf", b).unwrap()
    }

    /// Rows and value-head column units move as whole blocks where a unit
    /// is whole blocks (Q8_0, F16), and dequantized where a block spans
    /// several units (Q4_K): either way the values of the stored matrix,
    /// rearranged.
    #[test]
    fn rearranged_moves_rows_and_column_units() {
        let (rows, cols) = (3usize, 512usize);
        let pick = [2usize, 0];
        let units = [3usize, 1, 0, 2];
        let seeded = |n: usize| (0..n).map(|i| (i * 7919 % 251) as u8).collect::<Vec<u8>>();
        let mut q4k = seeded(rows * 2 * 144);
        for blk in q4k.chunks_exact_mut(144) {
            blk[..4].copy_from_slice(&[0x00, 0x2c, 0x00, 0x28]); // d, dmin: finite f16
        }
        let mut q8 = seeded(rows * 16 * 34);
        for blk in q8.chunks_exact_mut(34) {
            blk[..2].copy_from_slice(&[0x00, 0x2c]);
        }
        let f16: Vec<u8> = (0..rows * cols)
            .flat_map(|i| ((i % 1000) as u16 + 0x3000).to_le_bytes())
            .collect();
        for (ty, data, blocks_move) in [(12u32, q4k, false), (8, q8, true), (1, f16, true)] {
            let f = one_tensor(ty, rows as u64, cols as u64, &data);
            let all = f.weight("w", rows, cols).unwrap().data().to_f32_vec();
            let w = rearranged(&f, "w", rows, cols, Some(&pick), Some(&units)).unwrap();
            assert_eq!((w.rows(), w.cols()), (2, cols));
            let unit = cols / units.len();
            let want: Vec<f32> = pick
                .iter()
                .flat_map(|&r| {
                    units
                        .iter()
                        .flat_map(move |&u| (0..unit).map(move |c| r * cols + u * unit + c))
                })
                .map(|i| all[i])
                .collect();
            let got = w.data().to_f32_vec();
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "type {ty}"
            );
            assert_eq!(matches!(w.data(), WeightData::F32(_)), !blocks_move, "type {ty}");
        }
        // A K-quant whose blocks span units keeps its blocks; its inputs
        // move instead, and the products are the moved matrix's.
        let mut q4k = seeded(rows * 2 * 144);
        for blk in q4k.chunks_exact_mut(144) {
            blk[..4].copy_from_slice(&[0x00, 0x2c, 0x00, 0x28]);
        }
        let f = one_tensor(12, rows as u64, cols as u64, &q4k);
        let stored = f.weight("w", rows, cols).unwrap().data().to_f32_vec();
        let moved = rearranged(&f, "w", rows, cols, None, Some(&units))
            .unwrap()
            .data()
            .to_f32_vec();
        let order = input_order(&units, cols, 256).expect("blocks span units");
        assert_eq!(input_order(&units, cols, 32), None, "Q8_0 blocks move whole");
        let x: Vec<f64> = (0..cols).map(|i| ((i * 37 % 101) as f64 - 50.0) / 17.0).collect();
        let mut x_stored = vec![0.0f64; cols];
        for (c, &o) in order.iter().enumerate() {
            x_stored[o] = x[c];
        }
        for r in 0..rows {
            let a: f64 = (0..cols).map(|c| moved[r * cols + c] as f64 * x[c]).sum();
            let b: f64 = (0..cols).map(|c| stored[r * cols + c] as f64 * x_stored[c]).sum();
            assert!((a - b).abs() <= 1e-9 * a.abs().max(1.0), "row {r}: {a} vs {b}");
        }

        let f = one_tensor(8, 1, 32, &[0u8; 34]);
        let e = match rearranged(&f, "w", 1, 32, Some(&[1]), None) {
            Ok(_) => panic!("row 1 of a 1-row tensor was read"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("tensor w") && e.contains("row 1 of 1"), "{e}");
    }
}
