//! Prefill products of GGML quantized rows on AMX tiles (`AMX-INT8`,
//! Intel Sapphire Rapids and later): the same definition and bits as
//! [`super::dot`].
//!
//! One `tdpbssd` multiplies a tile of 16 weight rows by a tile of 16
//! activation rows over one 32-element block (or one 16-element half, for
//! the types whose halves have their own scales), leaving the 256 exact
//! integer sums of that block in a tile of `i32`. Integer sums are exact in
//! any order, so they are the sums every other path computes; the block's
//! f32 term is then [`super::combine`]'s, its operations in its order, in
//! 16 lanes (one per activation row), added to lane `b mod 8` of each
//! output's eight sums, which reduce as every path reduces them. So every
//! output is the bits of [`super::dot`], whichever path computed it.
//!
//! - [`WeightTile`] (`weights`): a tile of weight rows decoded once per
//!   product to signed codes in their natural order, the offset the term
//!   subtracts (Q4_0's 8, Q6_K's 32, ...) taken off the codes, so the tile's
//!   sum is the term's integer itself; the per-block factors widened.
//! - [`AmxActs`] (`acts`): the activation rows of a product laid out once
//!   as the tiles' `B` operands, with their scales and code sums in lanes.
//! - [`product`]: one weight tile against every activation tile; its x86
//!   kernel (`tiles`: the tile configuration, the tile instructions of a
//!   block, the terms in AVX-512 registers).
//!
//! AMX is used where [`crate::isa::amx_active`] says so: the CPU has
//! AMX-INT8, Linux granted this process the tile state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), and `CHARM_ISA` is unset or `amx`.

use super::super::types::{GgmlType, QK_K};

mod acts;
#[cfg(target_arch = "x86_64")]
mod tiles;
mod weights;

pub use acts::AmxActs;
pub use weights::WeightTile;

/// Rows of a tile, on either side.
pub const ROWS: usize = 16;

/// The term of a block, by type (see [`super::combine`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `(wd · dx) · f32(i)`: Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS, MXFP4.
    Plain,
    /// `… + (m · dx) · f32(S)`: Q4_1, Q5_1.
    MinAdd,
    /// `… − (dmin · mn) · (dx · f32(S))`: Q4_K, Q5_K.
    MinSub,
    /// `(d · dx) · f32(sc₀ i₀ + sc₁ i₁)` over halves: Q3_K, Q6_K.
    Halves,
    /// Halves, `− (dmin · dx) · f32(mn₀ s₀ + mn₁ s₁)`: Q2_K.
    Q2K,
}

fn kind(ty: GgmlType) -> Option<Kind> {
    Some(match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS | GgmlType::MXFP4 => {
            Kind::Plain
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => Kind::MinAdd,
        GgmlType::Q4_K | GgmlType::Q5_K => Kind::MinSub,
        GgmlType::Q3_K | GgmlType::Q6_K => Kind::Halves,
        GgmlType::Q2_K => Kind::Q2K,
        _ => return None,
    })
}

/// Whether [`product`] takes rows of `ty` with `cols` elements (every
/// quantized type, whole blocks or super-blocks), whatever the CPU.
pub fn takes(ty: GgmlType, cols: usize) -> bool {
    kind(ty).is_some() && cols > 0 && cols.is_multiple_of(ty.block_elems()) && ty.block_elems() <= QK_K
}

/// Whether prefill products of rows of `ty` with `cols` elements run on AMX
/// here ([`takes`], and [`crate::isa::amx_active`]).
pub fn usable(ty: GgmlType, cols: usize) -> bool {
    crate::isa::amx_active() && takes(ty, cols)
}

/// `out[r · stride + t]` = the dot product of weight row `r` of `w` with
/// activation row `t`, for every row of both: the bits of [`super::dot`].
/// `ahead` (the next tile's rows, or nothing) is asked into L2 a share per
/// block as the product runs: all at once, the prefetches queued behind
/// each other and stalled the loop that issued them.
///
/// # Panics
/// If AMX does not run here ([`crate::isa::amx_runs`]), the widths differ,
/// or `out` does not reach the last output.
pub fn product(w: &WeightTile, acts: &AmxActs, out: &mut [f32], stride: usize, ahead: &[u8]) {
    let ty = w.ty.expect("a decoded tile");
    if acts.is_empty() || w.rows == 0 {
        return;
    }
    assert!(crate::isa::amx_runs(), "AMX does not run here");
    assert_eq!(w.cols, acts.cols, "activations do not match the weight rows");
    assert!(w.rows == 1 || stride >= acts.n, "rows' outputs overlap");
    assert!(
        out.len() >= (w.rows - 1) * stride + acts.n,
        "outputs do not reach the last row's"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX and AVX-512 run here (`amx_runs` requires both) and this
    // process holds the tile state; the shapes were checked above.
    unsafe {
        use tiles::*;
        match kind(ty).expect("a type AMX takes") {
            Kind::Plain => product_x86::<PLAIN>(w, acts, out, stride, ahead),
            Kind::MinAdd => product_x86::<MIN_ADD>(w, acts, out, stride, ahead),
            Kind::MinSub => product_x86::<MIN_SUB>(w, acts, out, stride, ahead),
            Kind::Halves => product_x86::<HALVES>(w, acts, out, stride, ahead),
            Kind::Q2K => product_x86::<Q2K>(w, acts, out, stride, ahead),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, out, stride, ahead);
}

/// A cache line of codes: the tiles' operands are stored in whole lines.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Line(pub [i8; 64]);

impl Default for Line {
    fn default() -> Self {
        Line([0; 64])
    }
}

/// `v` resized to hold `bytes` bytes of zeros, in whole cache lines.
fn zeroed_lines(v: &mut Vec<Line>, bytes: usize) {
    v.clear();
    v.resize(bytes.div_ceil(64), Line::default());
}

/// The bytes of `v`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn line_bytes(v: &[Line]) -> &[i8] {
    // SAFETY: `Line` is 64 bytes with no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), 64 * v.len()) }
}

/// The bytes of `v`, mutable.
fn line_bytes_mut(v: &mut [Line]) -> &mut [i8] {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), 64 * v.len()) }
}

#[cfg(test)]
mod tests;
