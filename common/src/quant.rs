//! Quantized weight formats: symmetric INT8 and INT4 with f32 group scales.
//!
//! These are on-disk formats (the container stores exactly these bytes and
//! a reader maps them in place), so the layout below is normative.
//!
//! # Common to both
//!
//! A matrix `[rows, cols]` is row-major, like every charm weight (a Hugging
//! Face `Linear.weight`: `out_features × in_features`). Each row is cut into
//! `cols / group` groups of `group` consecutive columns; group `g` of row
//! `r` covers columns `g * group .. (g + 1) * group` and has one scale.
//! `group == cols` means one scale per output row. `group` must be at least
//! 1 and divide `cols`.
//!
//! - **scales**: `rows * (cols / group)` IEEE 754 binary32 values,
//!   little-endian, row-major: the scale of row `r`, group `g` is element
//!   `r * (cols / group) + g`.
//! - **value** of element `(r, c)`: `w' = (q as f32) * scale[r, c / group]`,
//!   one f32 multiplication. A scale of 0 makes the whole group 0.
//!
//! # INT8 { group }
//!
//! - **values**: `rows * cols` bytes, one two's-complement `i8` per element,
//!   row-major: element `(r, c)` is byte `r * cols + c`. The quantizer
//!   writes `-127..=127`; a reader accepts `-128` as `-128`.
//!
//! # INT4 { group }
//!
//! - `cols` and `group` must be even (charm offers `group` 32 or 64), so
//!   every row and every group starts at a byte boundary.
//! - **values**: `rows * cols / 2` bytes. Row `r` starts at byte
//!   `r * cols / 2`; element `(r, c)` lives in byte `r * cols / 2 + c / 2`,
//!   in the low nibble (bits 0..=3) when `c` is even and the high nibble
//!   (bits 4..=7) when `c` is odd. A nibble `n` in `0..=15` holds
//!   `q = n - 8`, so `q` is in `-8..=7`.
//!
//! # Quantizer (what charm writes)
//!
//! All arithmetic is IEEE 754 binary32 with round-to-nearest-even, per
//! group: `amax = max |w|`; `scale = amax / 127` (INT8) or `amax / 7`
//! (INT4), one f32 division. If `scale == 0` (an all-zero group, or an
//! `amax` so small that the division underflows) every `q` is 0. Otherwise
//! `q = clamp(round_half_away_from_zero(w / scale), -127, 127)` for INT8
//! and `clamp(..., -8, 7)` for INT4, where `w / scale` is one f32 division.
//! Hence `|w - w'| <= scale / 2` up to f32 rounding of the division and the
//! product. Non-finite weights are refused ([`QuantError::NonFinite`]).
//!
//! # Dot products
//!
//! [`crate::kernels::dot_int8_ref`] / [`crate::kernels::dot_int4_ref`]
//! define the product: for each group in order, `s = Σ q * x` in f32 in
//! column order, then `total += s * scale`. The fast paths
//! ([`crate::kernels::dot_int8`] / [`crate::kernels::dot_int4`], used by
//! [`crate::Weight`]) add in a different but fixed order and are what charm
//! computes with: plain Rust with no fused multiply-add (also compiled for
//! AVX2 and picked at run time; vector width never changes the order), so
//! the same bits on every call, thread and CPU. Tests hold them to the
//! reference within `1e-5 * Σ |q * scale * x| + 1e-6`.

use std::fmt;

use thiserror::Error;

use crate::dtype::DType;
use crate::gguf::GgmlType;

/// A shape or buffer that a quantized format cannot hold. Quantized weights
/// come from files, so every such case is an error, never a panic.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum QuantError {
    /// The group size is 0.
    #[error("quantization group must be at least 1")]
    ZeroGroup,
    /// `group` does not divide the number of columns.
    #[error("quantization group {group} does not divide {cols} columns")]
    GroupNotDividing { cols: usize, group: usize },
    /// INT4 with an odd number of columns (rows must start at a byte).
    #[error("int4 needs an even number of columns, got {cols}")]
    OddCols { cols: usize },
    /// INT4 with an odd group size (groups must start at a byte).
    #[error("int4 needs an even quantization group, got {group}")]
    OddGroup { group: usize },
    /// `rows * cols` (or a byte count derived from it) overflows `usize`.
    #[error("{rows} x {cols} weight is too large to address")]
    TooLarge { rows: usize, cols: usize },
    /// A buffer holds the wrong number of elements for the shape: `what` is
    /// `"weights"`, `"scales"`, `"int8 values"`, `"int4 bytes"` or
    /// `"elements"`.
    #[error("{what}: expected {expected}, got {got}")]
    LenMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A weight to quantize is NaN or infinite.
    #[error("weight at row {row}, column {col} is not finite ({value})")]
    NonFinite { row: usize, col: usize, value: f32 },
    /// A conversion to a format charm reads but does not write (GGUF blocks).
    #[error("charm does not quantize to {format}; it only reads that format")]
    NoQuantizer { format: WeightFormat },
}

/// How a weight's elements are stored: a plain dtype or a quantized format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    BF16,
    F16,
    /// Symmetric int8, one f32 scale per `group` columns.
    Int8 {
        group: usize,
    },
    /// Symmetric int4 (two per byte), one f32 scale per `group` columns.
    Int4 {
        group: usize,
    },
    /// GGML blocks as stored in a GGUF file ([`crate::gguf`]): rows of
    /// whole blocks of this type, used in place.
    Gguf(GgmlType),
}

impl WeightFormat {
    /// The plain dtype, or `None` for a quantized format.
    pub fn dtype(self) -> Option<DType> {
        match self {
            WeightFormat::F32 => Some(DType::F32),
            WeightFormat::BF16 => Some(DType::BF16),
            WeightFormat::F16 => Some(DType::F16),
            WeightFormat::Int8 { .. } | WeightFormat::Int4 { .. } | WeightFormat::Gguf(_) => None,
        }
    }

    /// The kind without its group: `F32`, `BF16`, `F16`, `INT8`, `INT4`,
    /// or a GGUF block type's name (`Q4_K`).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "F32",
            WeightFormat::BF16 => "BF16",
            WeightFormat::F16 => "F16",
            WeightFormat::Int8 { .. } => "INT8",
            WeightFormat::Int4 { .. } => "INT4",
            WeightFormat::Gguf(ty) => ty.name(),
        }
    }

    /// Whether this is a quantized format.
    pub fn is_quantized(self) -> bool {
        self.dtype().is_none()
    }

    /// Bytes a `[rows, cols]` matrix takes in this format (scales and
    /// values), or why the shape does not fit it.
    pub fn storage(self, rows: usize, cols: usize) -> Result<QuantBytes, QuantError> {
        match self {
            WeightFormat::Int8 { group } => int8_bytes(rows, cols, group),
            WeightFormat::Int4 { group } => int4_bytes(rows, cols, group),
            WeightFormat::Gguf(ty) => Ok(QuantBytes {
                scale_bytes: 0,
                value_bytes: gguf_bytes(ty, rows, cols)?,
            }),
            plain => {
                let size = plain.dtype().map_or(4, DType::size);
                let value_bytes = elements(rows, cols)?
                    .checked_mul(size)
                    .ok_or(QuantError::TooLarge { rows, cols })?;
                Ok(QuantBytes {
                    scale_bytes: 0,
                    value_bytes,
                })
            }
        }
    }
}

impl From<DType> for WeightFormat {
    fn from(d: DType) -> Self {
        match d {
            DType::F32 => WeightFormat::F32,
            DType::BF16 => WeightFormat::BF16,
            DType::F16 => WeightFormat::F16,
        }
    }
}

impl fmt::Display for WeightFormat {
    /// `F32`, `BF16`, `F16`, `INT8/g32`, `INT4/g64`, `Q4_K` (GGUF blocks).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightFormat::Int8 { group } | WeightFormat::Int4 { group } => {
                write!(f, "{}/g{group}", self.name())
            }
            _ => f.write_str(self.name()),
        }
    }
}

/// Bytes of a quantized matrix, for laying it out in a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantBytes {
    /// Bytes of f32 scales (`4 * rows * (cols / group)`; 0 for plain dtypes).
    pub scale_bytes: usize,
    /// Bytes of values (`rows * cols` for INT8, `rows * cols / 2` for INT4).
    pub value_bytes: usize,
}

impl QuantBytes {
    /// Number of f32 scales.
    pub fn scale_count(self) -> usize {
        self.scale_bytes / 4
    }

    /// Scales and values together. Never overflows: the constructors check.
    pub fn total(self) -> usize {
        self.scale_bytes + self.value_bytes
    }
}

fn elements(rows: usize, cols: usize) -> Result<usize, QuantError> {
    rows.checked_mul(cols).ok_or(QuantError::TooLarge { rows, cols })
}

/// Checks the shape and returns `(scale count, element count)`.
fn groups(rows: usize, cols: usize, group: usize) -> Result<(usize, usize), QuantError> {
    if group == 0 {
        return Err(QuantError::ZeroGroup);
    }
    if !cols.is_multiple_of(group) {
        return Err(QuantError::GroupNotDividing { cols, group });
    }
    let n = elements(rows, cols)?;
    let scales = rows * (cols / group);
    // Every size derived below stays addressable.
    scales
        .checked_mul(4)
        .and_then(|b| b.checked_add(n))
        .ok_or(QuantError::TooLarge { rows, cols })?;
    Ok((scales, n))
}

fn check_int4_shape(cols: usize, group: usize) -> Result<(), QuantError> {
    if group == 0 {
        return Err(QuantError::ZeroGroup);
    }
    if !cols.is_multiple_of(2) {
        return Err(QuantError::OddCols { cols });
    }
    if !cols.is_multiple_of(group) {
        return Err(QuantError::GroupNotDividing { cols, group });
    }
    if !group.is_multiple_of(2) {
        return Err(QuantError::OddGroup { group });
    }
    Ok(())
}

/// Bytes of a `[rows, cols]` matrix of GGML `ty` blocks (scales inside).
pub fn gguf_bytes(ty: GgmlType, rows: usize, cols: usize) -> Result<usize, QuantError> {
    let row = ty.row_bytes(cols).ok_or(if cols.is_multiple_of(ty.block_elems()) {
        QuantError::TooLarge { rows, cols }
    } else {
        QuantError::GroupNotDividing {
            cols,
            group: ty.block_elems(),
        }
    })?;
    elements(rows, cols)?;
    row.checked_mul(rows).ok_or(QuantError::TooLarge { rows, cols })
}

/// Bytes of an INT8 `[rows, cols]` matrix with `group` columns per scale.
pub fn int8_bytes(rows: usize, cols: usize, group: usize) -> Result<QuantBytes, QuantError> {
    let (scales, n) = groups(rows, cols, group)?;
    Ok(QuantBytes {
        scale_bytes: scales * 4,
        value_bytes: n,
    })
}

/// Bytes of an INT4 `[rows, cols]` matrix with `group` columns per scale.
pub fn int4_bytes(rows: usize, cols: usize, group: usize) -> Result<QuantBytes, QuantError> {
    check_int4_shape(cols, group)?;
    let (scales, n) = groups(rows, cols, group)?;
    Ok(QuantBytes {
        scale_bytes: scales * 4,
        value_bytes: n / 2,
    })
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected != got {
        return Err(QuantError::LenMismatch { what, expected, got });
    }
    Ok(())
}

/// Checks the sizes of INT8 buffers for a `[rows, cols]` matrix.
pub fn check_int8_buffers(
    rows: usize,
    cols: usize,
    group: usize,
    scales: usize,
    values: usize,
) -> Result<(), QuantError> {
    let b = int8_bytes(rows, cols, group)?;
    check_len("scales", b.scale_count(), scales)?;
    check_len("int8 values", b.value_bytes, values)
}

/// Checks the sizes of INT4 buffers (`bytes` packed bytes) for a
/// `[rows, cols]` matrix.
pub fn check_int4_buffers(
    rows: usize,
    cols: usize,
    group: usize,
    scales: usize,
    bytes: usize,
) -> Result<(), QuantError> {
    let b = int4_bytes(rows, cols, group)?;
    check_len("scales", b.scale_count(), scales)?;
    check_len("int4 bytes", b.value_bytes, bytes)
}

fn check_weights(w: &[f32], rows: usize, cols: usize) -> Result<(), QuantError> {
    check_len("weights", rows * cols, w.len())?;
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite {
            row: i / cols,
            col: i % cols,
            value: w[i],
        });
    }
    Ok(())
}

/// The scale of one group: `max |w| / qmax`.
#[inline]
fn group_scale(g: &[f32], qmax: f32) -> f32 {
    g.iter().fold(0.0f32, |m, v| m.max(v.abs())) / qmax
}

/// `clamp(round_half_away_from_zero(w / scale), lo, hi)`, or 0 when
/// `scale == 0`.
#[inline]
fn quantize_one(w: f32, scale: f32, lo: f32, hi: f32) -> i8 {
    if scale == 0.0 {
        0
    } else {
        (w / scale).round().clamp(lo, hi) as i8
    }
}

/// Quantizes a row-major `[rows, cols]` f32 matrix to INT8 with `group`
/// columns per scale: `(scales, values)`, laid out as the module docs say.
pub fn quantize_int8(w: &[f32], rows: usize, cols: usize, group: usize) -> Result<(Vec<f32>, Vec<i8>), QuantError> {
    let b = int8_bytes(rows, cols, group)?;
    check_weights(w, rows, cols)?;
    let mut scales = Vec::with_capacity(b.scale_count());
    let mut q = Vec::with_capacity(b.value_bytes);
    for g in w.chunks_exact(group) {
        let scale = group_scale(g, 127.0);
        scales.push(scale);
        q.extend(g.iter().map(|&v| quantize_one(v, scale, -127.0, 127.0)));
    }
    Ok((scales, q))
}

/// Quantizes a row-major `[rows, cols]` f32 matrix to INT4 with `group`
/// columns per scale: `(scales, packed bytes)`, laid out as the module docs
/// say.
pub fn quantize_int4(w: &[f32], rows: usize, cols: usize, group: usize) -> Result<(Vec<f32>, Vec<u8>), QuantError> {
    let b = int4_bytes(rows, cols, group)?;
    check_weights(w, rows, cols)?;
    let mut scales = Vec::with_capacity(b.scale_count());
    let mut packed = Vec::with_capacity(b.value_bytes);
    for g in w.chunks_exact(group) {
        let scale = group_scale(g, 7.0);
        scales.push(scale);
        packed.extend(g.chunks_exact(2).map(|p| {
            let lo = (quantize_one(p[0], scale, -8.0, 7.0) + 8) as u8;
            let hi = (quantize_one(p[1], scale, -8.0, 7.0) + 8) as u8;
            lo | (hi << 4)
        }));
    }
    Ok((scales, packed))
}

/// The two values of an INT4 byte: `(q of the even column, q of the odd
/// column)`, each in `-8..=7`.
#[inline(always)]
pub fn unpack_int4(byte: u8) -> (i8, i8) {
    ((byte & 0x0f) as i8 - 8, (byte >> 4) as i8 - 8)
}

/// Dequantizes one INT8 row (`q: cols`, `scales: cols / group`) into `out`.
pub fn dequantize_int8_row(q: &[i8], scales: &[f32], group: usize, out: &mut [f32]) {
    debug_assert_eq!(q.len(), out.len());
    debug_assert_eq!(q.len(), scales.len() * group);
    for ((o, qg), &s) in out.chunks_exact_mut(group).zip(q.chunks_exact(group)).zip(scales) {
        for (o, &v) in o.iter_mut().zip(qg) {
            *o = v as f32 * s;
        }
    }
}

/// Dequantizes one INT4 row (`packed: cols / 2` bytes, `scales: cols /
/// group`) into `out` (`cols`).
pub fn dequantize_int4_row(packed: &[u8], scales: &[f32], group: usize, out: &mut [f32]) {
    debug_assert_eq!(packed.len() * 2, out.len());
    debug_assert_eq!(out.len(), scales.len() * group);
    for ((o, pg), &s) in out
        .chunks_exact_mut(group)
        .zip(packed.chunks_exact(group / 2))
        .zip(scales)
    {
        for (o, &b) in o.chunks_exact_mut(2).zip(pg) {
            let (lo, hi) = unpack_int4(b);
            o[0] = lo as f32 * s;
            o[1] = hi as f32 * s;
        }
    }
}

/// Dequantizes an INT8 `[rows, cols]` matrix (the reference for `w'`).
pub fn dequantize_int8(
    scales: &[f32],
    q: &[i8],
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<Vec<f32>, QuantError> {
    check_int8_buffers(rows, cols, group, scales.len(), q.len())?;
    let mut out = vec![0.0; q.len()];
    dequantize_int8_row(q, scales, group, &mut out);
    Ok(out)
}

/// Dequantizes an INT4 `[rows, cols]` matrix (the reference for `w'`).
pub fn dequantize_int4(
    scales: &[f32],
    packed: &[u8],
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<Vec<f32>, QuantError> {
    check_int4_buffers(rows, cols, group, scales.len(), packed.len())?;
    let mut out = vec![0.0; packed.len() * 2];
    dequantize_int4_row(packed, scales, group, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::kernels::{dot_int4, dot_int4_ref, dot_int8, dot_int8_ref};
    use crate::weight::{Buf, Weight, WeightData};

    /// Weights with a spread of magnitudes, some exact zeros and outliers.
    fn weights(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| match rng.gen_range(0..20) {
                0 => 0.0,
                1 => rng.gen_range(-8.0..8.0),
                _ => rng.gen_range(-1.0f32..1.0) * 0.05,
            })
            .collect()
    }

    fn acts(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect()
    }

    /// `|w - w'| <= scale / 2`, with slack for the f32 division and product.
    fn assert_within_half_step(w: &[f32], deq: &[f32], scales: &[f32], group: usize) {
        for (i, (&a, &b)) in w.iter().zip(deq).enumerate() {
            let s = scales[i / group];
            assert!(
                (a - b).abs() <= s * 0.5 * (1.0 + 1e-4),
                "element {i}: {a} -> {b}, scale {s}"
            );
        }
    }

    #[test]
    fn int8_error_is_at_most_half_a_step() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for &(rows, cols, group) in &[(3, 64, 32), (5, 128, 64), (4, 37, 37), (1, 1, 1)] {
            let w = weights(&mut rng, rows * cols);
            let (s, q) = quantize_int8(&w, rows, cols, group).unwrap();
            assert_eq!(s.len(), rows * cols / group);
            assert!(q.iter().all(|&v| v != -128));
            let deq = dequantize_int8(&s, &q, rows, cols, group).unwrap();
            assert_within_half_step(&w, &deq, &s, group);
            for (g, &sc) in w.chunks(group).zip(&s) {
                let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert_eq!(sc, amax / 127.0);
            }
        }
    }

    #[test]
    fn int4_error_is_at_most_half_a_step() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for &(rows, cols, group) in &[(3, 64, 32), (5, 128, 64), (4, 38, 38), (2, 2, 2)] {
            let w = weights(&mut rng, rows * cols);
            let (s, p) = quantize_int4(&w, rows, cols, group).unwrap();
            assert_eq!(p.len(), rows * cols / 2);
            let deq = dequantize_int4(&s, &p, rows, cols, group).unwrap();
            assert_within_half_step(&w, &deq, &s, group);
            for (g, &sc) in w.chunks(group).zip(&s) {
                let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert_eq!(sc, amax / 7.0);
            }
        }
    }

    #[test]
    fn int4_nibble_layout_is_low_then_high() {
        // Scale 1: q = w. Column 0 -> low nibble, column 1 -> high nibble.
        let w = [-7.0, 7.0, 0.0, 1.0, -1.0, 2.0];
        let (s, p) = quantize_int4(&w, 1, 6, 6).unwrap();
        assert_eq!(s, vec![1.0]);
        assert_eq!(p, vec![0x01 | 0xf0, 0x08 | 0x90, 0x07 | 0xa0]);
        assert_eq!(unpack_int4(0x80), (-8, 0));
        // Rounding is half away from zero; values are clamped to the range.
        let w = [7.0, 0.5, -0.5, 1.5, -2.5, 0.25];
        let (_, p) = quantize_int4(&w, 1, 6, 6).unwrap();
        let q: Vec<i8> = p
            .iter()
            .flat_map(|&b| {
                let (lo, hi) = unpack_int4(b);
                [lo, hi]
            })
            .collect();
        assert_eq!(q, vec![7, 1, -1, 2, -3, 0]);
    }

    #[test]
    fn int8_rounds_half_away_from_zero() {
        let w = [127.0, 0.5, -0.5, 1.5, -2.5, 126.5];
        let (s, q) = quantize_int8(&w, 1, 6, 6).unwrap();
        assert_eq!(s, vec![1.0]);
        assert_eq!(q, vec![127, 1, -1, 2, -3, 127]);
    }

    #[test]
    fn all_zero_groups_have_zero_scale_and_values() {
        let mut w = vec![0.0f32; 2 * 64];
        w[70] = -0.5; // row 1, group 0 (group 32) is the only nonzero group
        let (s, q) = quantize_int8(&w, 2, 64, 32).unwrap();
        assert_eq!(s, vec![0.0, 0.0, 0.5 / 127.0, 0.0]);
        assert_eq!(q.iter().filter(|&&v| v != 0).count(), 1);
        assert_eq!(q[70], -127);
        let (s, p) = quantize_int4(&w, 2, 64, 32).unwrap();
        assert_eq!(s, vec![0.0, 0.0, 0.5 / 7.0, 0.0]);
        assert!(p.iter().enumerate().all(|(i, &b)| b == 0x88 || i == 35));
        assert_eq!(p[35], 0x01 | (8 << 4)); // column 70: low nibble, q = -7
        assert_eq!(dequantize_int4(&s, &p, 2, 64, 32).unwrap(), w);
        let zeros = vec![0.0f32; 3 * 32];
        let (s, q) = quantize_int8(&zeros, 3, 32, 32).unwrap();
        assert!(s.iter().all(|&v| v == 0.0) && q.iter().all(|&v| v == 0));
        let w = Weight::int8(3, 32, 32, Buf::owned(s), Buf::owned(q)).unwrap();
        assert_eq!(w.row_dot(1, &[1.0; 32]), 0.0);
    }

    #[test]
    fn values_on_the_grid_round_trip_exactly() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (rows, cols, group) = (4, 64, 32);
        // Scales with few mantissa bits so `127 * s / 127` and `q * s` are exact.
        let scales: Vec<f32> = (0..rows * cols / group)
            .map(|i| (i as f32 + 1.0) * 3.0 / 1024.0)
            .collect();
        let mut q8: Vec<i8> = (0..rows * cols).map(|_| rng.gen_range(-127..=127)).collect();
        let mut q4: Vec<i8> = (0..rows * cols).map(|_| rng.gen_range(-7..=7)).collect();
        for g in 0..rows * cols / group {
            q8[g * group + g % group] = if g % 2 == 0 { 127 } else { -127 };
            q4[g * group + 1] = if g % 2 == 0 { 7 } else { -7 };
        }
        let grid = |q: &[i8]| -> Vec<f32> {
            q.iter()
                .enumerate()
                .map(|(i, &v)| v as f32 * scales[i / group])
                .collect()
        };
        let w8 = grid(&q8);
        let (s, q) = quantize_int8(&w8, rows, cols, group).unwrap();
        assert_eq!((&s, &q), (&scales, &q8));
        assert_eq!(dequantize_int8(&s, &q, rows, cols, group).unwrap(), w8);
        let w4 = grid(&q4);
        let (s, p) = quantize_int4(&w4, rows, cols, group).unwrap();
        assert_eq!(s, scales);
        assert_eq!(dequantize_int4(&s, &p, rows, cols, group).unwrap(), w4);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let w = vec![0.5f32; 60];
        assert_eq!(quantize_int8(&w, 6, 10, 0).unwrap_err(), QuantError::ZeroGroup);
        assert_eq!(
            quantize_int8(&w, 6, 10, 3).unwrap_err(),
            QuantError::GroupNotDividing { cols: 10, group: 3 }
        );
        assert_eq!(
            quantize_int4(&w, 4, 15, 5).unwrap_err(),
            QuantError::OddCols { cols: 15 }
        );
        assert_eq!(
            quantize_int4(&w, 10, 6, 3).unwrap_err(),
            QuantError::OddGroup { group: 3 }
        );
        assert_eq!(
            quantize_int4(&w, 6, 10, 4).unwrap_err(),
            QuantError::GroupNotDividing { cols: 10, group: 4 }
        );
        assert_eq!(
            quantize_int8(&w, 7, 10, 10).unwrap_err(),
            QuantError::LenMismatch {
                what: "weights",
                expected: 70,
                got: 60
            }
        );
        let mut bad = w.clone();
        bad[13] = f32::NAN;
        assert!(matches!(
            quantize_int4(&bad, 6, 10, 10).unwrap_err(),
            QuantError::NonFinite { row: 1, col: 3, .. }
        ));
        assert_eq!(
            int8_bytes(usize::MAX, 2, 2).unwrap_err(),
            QuantError::TooLarge {
                rows: usize::MAX,
                cols: 2
            }
        );
        assert!(int4_bytes(usize::MAX / 4, 4, 4).is_err());
        assert_eq!(
            int8_bytes(3, 64, 32).unwrap(),
            QuantBytes {
                scale_bytes: 24,
                value_bytes: 192
            }
        );
        assert_eq!(int4_bytes(3, 64, 64).unwrap().total(), 12 + 96);
        assert_eq!(
            WeightFormat::Int4 { group: 32 }.storage(2, 64).unwrap(),
            int4_bytes(2, 64, 32).unwrap()
        );
        assert_eq!(WeightFormat::BF16.storage(2, 3).unwrap().total(), 12);

        // Buffers that do not match their shape (as read from a file).
        let s = Buf::owned(vec![1.0f32; 4]);
        let err = Weight::int8(2, 64, 32, s, Buf::owned(vec![0i8; 127])).err();
        assert_eq!(
            err,
            Some(QuantError::LenMismatch {
                what: "int8 values",
                expected: 128,
                got: 127
            })
        );
        let s = Buf::owned(vec![1.0f32; 3]);
        let err = Weight::int4(2, 64, 32, s, Buf::owned(vec![0u8; 64])).err();
        assert_eq!(
            err,
            Some(QuantError::LenMismatch {
                what: "scales",
                expected: 4,
                got: 3
            })
        );
        let data = WeightData::Int4 {
            scales: Buf::owned(vec![1.0f32; 2]),
            q: Buf::owned(vec![0u8; 32]),
            group: 32,
        };
        assert!(data.check(1, 64).is_ok());
        assert_eq!(
            data.check(2, 64).unwrap_err(),
            QuantError::LenMismatch {
                what: "scales",
                expected: 4,
                got: 2
            }
        );
        assert!(Weight::try_new(1, 63, data).is_err());
    }

    /// The fast path's tolerance against the reference.
    fn close(fast: f32, reference: f32, abs_terms: f32) -> bool {
        (fast - reference).abs() <= 1e-5 * abs_terms + 1e-6
    }

    /// Every build of the fast path this CPU runs (portable, AVX2,
    /// AVX-512) gives the same bits: vector width never changes a sum.
    fn assert_same_on_every_path8(q: &[i8], s: &[f32], group: usize, x: &[f32]) {
        let portable = crate::kernels::dot_int8_on(crate::Isa::Scalar, q, s, group, x);
        assert_eq!(portable.to_bits(), dot_int8(q, s, group, x).to_bits());
        for &isa in crate::Isa::available() {
            let got = crate::kernels::dot_int8_on(isa, q, s, group, x);
            assert_eq!(portable.to_bits(), got.to_bits(), "{isa:?}");
        }
    }

    fn assert_same_on_every_path4(p: &[u8], s: &[f32], group: usize, x: &[f32]) {
        let portable = crate::kernels::dot_int4_on(crate::Isa::Scalar, p, s, group, x);
        assert_eq!(portable.to_bits(), dot_int4(p, s, group, x).to_bits());
        for &isa in crate::Isa::available() {
            let got = crate::kernels::dot_int4_on(isa, p, s, group, x);
            assert_eq!(portable.to_bits(), got.to_bits(), "{isa:?}");
        }
    }

    #[test]
    fn fast_dots_match_the_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for case in 0..300 {
            let group = match case % 3 {
                0 => 32,
                1 => 64,
                _ => 0, // per row
            };
            let rows = rng.gen_range(1..=7);
            let cols = if group == 0 {
                // Any width for INT8 per-row; INT4 uses the next even one.
                if case % 2 == 0 {
                    rng.gen_range(1..=4096)
                } else {
                    rng.gen_range(1..=40)
                }
            } else {
                group * rng.gen_range(1..=4096 / group)
            };
            let g8 = if group == 0 { cols } else { group };
            let w = weights(&mut rng, rows * cols);
            let x = acts(&mut rng, cols);
            let (s, q) = quantize_int8(&w, rows, cols, g8).unwrap();
            let gpr = cols / g8;
            for r in 0..rows {
                let (qr, sr) = (&q[r * cols..(r + 1) * cols], &s[r * gpr..(r + 1) * gpr]);
                let reference = dot_int8_ref(qr, sr, g8, &x);
                let fast = dot_int8(qr, sr, g8, &x);
                let terms: f32 = (0..cols).map(|c| (qr[c] as f32 * sr[c / g8] * x[c]).abs()).sum();
                assert!(
                    close(fast, reference, terms),
                    "int8 {rows}x{cols}/g{g8} row {r}: fast {fast} ref {reference}"
                );
                assert_eq!(fast.to_bits(), dot_int8(qr, sr, g8, &x).to_bits());
                assert_same_on_every_path8(qr, sr, g8, &x);
            }

            let cols4 = cols + cols % 2;
            let g4 = if group == 0 { cols4 } else { group };
            let w = weights(&mut rng, rows * cols4);
            let x = acts(&mut rng, cols4);
            let (s, p) = quantize_int4(&w, rows, cols4, g4).unwrap();
            let deq = dequantize_int4(&s, &p, rows, cols4, g4).unwrap();
            let gpr = cols4 / g4;
            for r in 0..rows {
                let pr = &p[r * cols4 / 2..(r + 1) * cols4 / 2];
                let sr = &s[r * gpr..(r + 1) * gpr];
                let reference = dot_int4_ref(pr, sr, g4, &x);
                let fast = dot_int4(pr, sr, g4, &x);
                let terms: f32 = (0..cols4).map(|c| (deq[r * cols4 + c] * x[c]).abs()).sum();
                assert!(
                    close(fast, reference, terms),
                    "int4 {rows}x{cols4}/g{g4} row {r}: fast {fast} ref {reference}"
                );
                assert_eq!(fast.to_bits(), dot_int4(pr, sr, g4, &x).to_bits());
                assert_same_on_every_path4(pr, sr, g4, &x);
            }
        }
    }

    #[test]
    fn reference_dots_follow_the_definition() {
        // Two groups of 2: (1*1 + 2*2) * 0.5 + (-1*1 + 3*2) * 0.25.
        let x = [1.0, 2.0, 1.0, 2.0];
        assert_eq!(dot_int8_ref(&[1, 2, -1, 3], &[0.5, 0.25], 2, &x), 3.75);
        assert_eq!(dot_int8(&[1, 2, -1, 3], &[0.5, 0.25], 2, &x), 3.75);
        let p = [(1 + 8) | ((2 + 8) << 4), (-1i8 + 8) as u8 | ((3 + 8) << 4)];
        assert_eq!(dot_int4_ref(&p, &[0.5, 0.25], 2, &x), 3.75);
        assert_eq!(dot_int4(&p, &[0.5, 0.25], 2, &x), 3.75);
    }

    #[test]
    fn fast_dots_are_the_same_on_every_thread() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (cols, group) = (4096, 64);
        let w = weights(&mut rng, cols);
        let x = acts(&mut rng, cols);
        let (s8, q8) = quantize_int8(&w, 1, cols, group).unwrap();
        let (s4, p4) = quantize_int4(&w, 1, cols, group).unwrap();
        let here = (
            dot_int8(&q8, &s8, group, &x).to_bits(),
            dot_int4(&p4, &s4, group, &x).to_bits(),
        );
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        (
                            dot_int8(&q8, &s8, group, &x).to_bits(),
                            dot_int4(&p4, &s4, group, &x).to_bits(),
                        )
                    })
                })
                .collect();
            for h in hs {
                assert_eq!(h.join().unwrap(), here);
            }
        });
    }

    fn check_weight(w: &Weight, deq: &[f32], rng: &mut ChaCha8Rng) {
        let (rows, cols) = (w.rows(), w.cols());
        assert_eq!(w.data().len(), rows * cols);
        let mut row = vec![0.0; cols];
        for r in 0..rows {
            w.row_into(r, &mut row);
            assert_eq!(row, deq[r * cols..(r + 1) * cols], "row {r}");
        }
        assert_eq!(w.data().to_f32_vec(), deq);
        let n = 3;
        let xs = acts(rng, n * cols);
        let mut batched = vec![0.0; n * rows];
        w.matmul(&xs, n, &mut batched);
        for t in 0..n {
            let x = &xs[t * cols..(t + 1) * cols];
            let mut one = vec![0.0; rows];
            w.matvec(x, &mut one);
            let mut seq = vec![0.0; rows];
            w.matvec_seq(x, &mut seq);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&batched[t * rows..(t + 1) * rows]));
            assert_eq!(bits(&one), bits(&seq));
            // And close to the product with the dequantized matrix.
            let plain = Weight::from_f32(rows, cols, deq.to_vec());
            let mut want = vec![0.0; rows];
            plain.matvec(x, &mut want);
            for (r, (a, b)) in one.iter().zip(&want).enumerate() {
                let terms: f32 = (0..cols).map(|c| (deq[r * cols + c] * x[c]).abs()).sum();
                assert!(close(*a, *b, terms), "row {r}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn quantized_weights_multiply_like_plain_ones() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let (rows, cols) = (70, 192);
        let w = weights(&mut rng, rows * cols);
        for group in [32, 64, cols] {
            let (s, q) = quantize_int8(&w, rows, cols, group).unwrap();
            let deq = dequantize_int8(&s, &q, rows, cols, group).unwrap();
            let qw = Weight::int8(rows, cols, group, Buf::owned(s), Buf::owned(q)).unwrap();
            assert_eq!(qw.format(), WeightFormat::Int8 { group });
            assert_eq!(qw.dtype(), None);
            check_weight(&qw, &deq, &mut rng);
            assert_eq!(
                Weight::from_f32(rows, cols, w.clone())
                    .to_format(WeightFormat::Int8 { group })
                    .unwrap()
                    .data()
                    .to_f32_vec(),
                deq
            );

            let (s, p) = quantize_int4(&w, rows, cols, group).unwrap();
            let deq = dequantize_int4(&s, &p, rows, cols, group).unwrap();
            let qw = Weight::int4(rows, cols, group, Buf::owned(s), Buf::owned(p)).unwrap();
            assert_eq!(qw.format().to_string(), format!("INT4/g{group}"));
            check_weight(&qw, &deq, &mut rng);
        }
        // An odd width, per-row INT8.
        let (rows, cols) = (9, 37);
        let w = weights(&mut rng, rows * cols);
        let qw = Weight::from_f32(rows, cols, w)
            .to_format(WeightFormat::Int8 { group: cols })
            .unwrap();
        let deq = qw.data().to_f32_vec();
        check_weight(&qw, &deq, &mut rng);
    }

    #[test]
    fn mapped_int8_and_int4_borrow_the_file() {
        use std::io::Write;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (rows, cols, group) = (3, 64, 32);
        let w = weights(&mut rng, rows * cols);
        let (s8, q8) = quantize_int8(&w, rows, cols, group).unwrap();
        let (s4, p4) = quantize_int4(&w, rows, cols, group).unwrap();
        // Odd offsets for the values: i8/u8 never need aligning.
        let mut bytes = vec![0u8; 1];
        bytes.extend(bytemuck::cast_slice::<i8, u8>(&q8));
        bytes.extend(&p4);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&f) }.unwrap());
        let q = Buf::<i8>::mapped(map.clone(), 1, q8.len());
        assert!(q.is_mapped());
        let p = Buf::<u8>::mapped(map, 1 + q8.len(), p4.len());
        assert!(p.is_mapped());
        let a = Weight::int8(rows, cols, group, Buf::owned(s8.clone()), q).unwrap();
        let b = Weight::int4(rows, cols, group, Buf::owned(s4.clone()), p).unwrap();
        assert_eq!(
            a.data().to_f32_vec(),
            dequantize_int8(&s8, &q8, rows, cols, group).unwrap()
        );
        assert_eq!(
            b.data().to_f32_vec(),
            dequantize_int4(&s4, &p4, rows, cols, group).unwrap()
        );
    }
}
