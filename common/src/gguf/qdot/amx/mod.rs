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
//! - [`product`]: one weight tile against every activation tile.
//!
//! AMX is used where [`crate::isa::amx_active`] says so: the CPU has
//! AMX-INT8, Linux granted this process the tile state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), and `CHARM_ISA` is unset or `amx`.

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::super::types::{GgmlType, QK, QK_K};

mod acts;
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
///
/// # Panics
/// If AMX does not run here ([`crate::isa::amx_runs`]), the widths differ,
/// or `out` does not reach the last output.
pub fn product(w: &WeightTile, acts: &AmxActs, out: &mut [f32], stride: usize) {
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
        match kind(ty).expect("a type AMX takes") {
            Kind::Plain => product_x86::<PLAIN>(w, acts, out, stride),
            Kind::MinAdd => product_x86::<MIN_ADD>(w, acts, out, stride),
            Kind::MinSub => product_x86::<MIN_SUB>(w, acts, out, stride),
            Kind::Halves => product_x86::<HALVES>(w, acts, out, stride),
            Kind::Q2K => product_x86::<Q2K>(w, acts, out, stride),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ty, out, stride);
}

/// The 64-byte tile configuration (palette 1) of two register sets, one
/// for even blocks and one for odd, so that a block's tiles are computed
/// while the previous block's sums are scaled. Whole blocks: `A` (tmm0,
/// tmm3) 16 weight rows of 32 code bytes, `B` (tmm1, tmm4) 8 rows of 64
/// bytes, `C` (tmm2, tmm5) 16 rows of 16 `i32`. Halves: `A` (tmm0, tmm4)
/// 16 rows of 16 bytes, `B` (tmm1, tmm5) 4 rows of 64, `C` of the first
/// and second halves (tmm2, tmm3; tmm6, tmm7).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(halves: bool) -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut set = |reg: usize, cols: u8, rows: u8| {
            c[16 + 2 * reg] = cols;
            c[48 + reg] = rows;
        };
        if halves {
            for base in [0, 4] {
                set(base, 16, 16);
                set(base + 1, 64, 4);
                set(base + 2, 64, 16);
                set(base + 3, 64, 16);
            }
        } else {
            for base in [0, 3] {
                set(base, 32, 16);
                set(base + 1, 64, 8);
                set(base + 2, 64, 16);
            }
        }
        TileConfig(c)
    }
}

/// A block's integer sums (the whole block's, or its two halves'), as
/// the tiles store them.
#[repr(C, align(64))]
struct Sums([i32; 2 * ROWS * ROWS]);

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
fn line_bytes(v: &[Line]) -> &[i8] {
    // SAFETY: `Line` is 64 bytes with no padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), 64 * v.len()) }
}

/// The bytes of `v`, mutable.
fn line_bytes_mut(v: &mut [Line]) -> &mut [i8] {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), 64 * v.len()) }
}

const PLAIN: u8 = 0;
const MIN_ADD: u8 = 1;
const MIN_SUB: u8 = 2;
const HALVES: u8 = 3;
const Q2K: u8 = 4;

/// Starts a block's integer sums on register set `SET` of [`TileConfig`]:
/// loads its `A` and `B` tiles and issues the `tdpbssd` (both halves'
/// for `HALF`). The AMX unit runs tile instructions in order, and a store
/// waits for its product (tens of cycles): so the next block is started
/// before this one is stored ([`store_sums`]), and its product runs
/// meanwhile.
///
/// # Safety
/// The tile configuration is loaded; `a` starts 16 rows of `stride` bytes
/// (32 read from each), `b` a block's `B` tile.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn start_sums<const HALF: bool, const SET: u8>(a: *const i8, stride: usize, b: *const i8) {
    macro_rules! whole {
        ($a:literal, $b:literal, $c:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{a} + {s}*1]"),
                concat!("tileloadd ", $b, ", [{b} + {w}*1]"),
                concat!("tilezero ", $c),
                concat!("tdpbssd ", $c, ", ", $a, ", ", $b),
                a = in(reg) a, s = in(reg) stride, b = in(reg) b, w = in(reg) 64usize,
                options(nostack, readonly),
            )
        };
    }
    macro_rules! halves {
        ($a:literal, $b:literal, $c0:literal, $c1:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{a} + {s}*1]"),
                concat!("tileloadd ", $b, ", [{b} + {w}*1]"),
                concat!("tilezero ", $c0),
                concat!("tdpbssd ", $c0, ", ", $a, ", ", $b),
                concat!("tileloadd ", $a, ", [{a} + {s}*1 + 16]"),
                concat!("tileloadd ", $b, ", [{b} + {w}*1 + 256]"),
                concat!("tilezero ", $c1),
                concat!("tdpbssd ", $c1, ", ", $a, ", ", $b),
                a = in(reg) a, s = in(reg) stride, b = in(reg) b, w = in(reg) 64usize,
                options(nostack, readonly),
            )
        };
    }
    // SAFETY: the caller's promises.
    unsafe {
        match (HALF, SET) {
            (false, 0) => whole!("tmm0", "tmm1", "tmm2"),
            (false, _) => whole!("tmm3", "tmm4", "tmm5"),
            (true, 0) => halves!("tmm0", "tmm1", "tmm2", "tmm3"),
            (true, _) => halves!("tmm4", "tmm5", "tmm6", "tmm7"),
        }
    }
}

/// Stores the sums [`start_sums`] began on set `SET` into `c` (the first
/// half's, or the whole block's, at `c`; the second half's 1 KiB later).
///
/// # Safety
/// The tile configuration is loaded and the set's sums were started; `c`
/// holds 2 KiB (halves) or 1 KiB.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store_sums<const HALF: bool, const SET: u8>(c: *mut i32) {
    let c1 = c.wrapping_add(ROWS * ROWS);
    macro_rules! store {
        ($c0:literal) => {
            asm!(concat!("tilestored [{c0} + {w}*1], ", $c0), c0 = in(reg) c, w = in(reg) 64usize, options(nostack))
        };
        ($c0:literal, $c1:literal) => {
            asm!(
                concat!("tilestored [{c0} + {w}*1], ", $c0),
                concat!("tilestored [{c1} + {w}*1], ", $c1),
                c0 = in(reg) c, c1 = in(reg) c1, w = in(reg) 64usize,
                options(nostack),
            )
        };
    }
    // SAFETY: the caller's promises.
    unsafe {
        match (HALF, SET) {
            (false, 0) => store!("tmm2"),
            (false, _) => store!("tmm5"),
            (true, 0) => store!("tmm2", "tmm3"),
            (true, _) => store!("tmm6", "tmm7"),
        }
    }
}

/// [`product`] for one kind of term.
///
/// # Safety
/// AMX-INT8 and AVX-512F run here and the tile state is granted; the
/// shapes are [`product`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn product_x86<const K: u8>(w: &WeightTile, acts: &AmxActs, out: &mut [f32], stride: usize) {
    const { assert!(K <= Q2K) };
    let halves = K == HALVES || K == Q2K;
    let cfg = TileConfig::new(halves);
    let nb = w.cols / QK;
    // Two blocks' sums (each: the whole block's, or the two halves').
    // Aligned to cache lines: a tile row split over two lines stores at
    // half the rate.
    let mut c = [const { Sums([0; 2 * ROWS * ROWS]) }; 2];
    // SAFETY: the configuration is a valid palette-1 layout.
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
    for tile in 0..acts.tiles() {
        let mut acc = [[_mm512_setzero_ps(); 8]; ROWS];
        let start = |b: usize| {
            let a = line_bytes(&w.codes).as_ptr().wrapping_add(QK * b);
            let bt = line_bytes(&acts.b)
                .as_ptr()
                .wrapping_add((tile * nb + b) * acts::B_TILE);
            // SAFETY: `a` starts the tile's 16 rows of `cols` codes at
            // block `b`, `bt` its `B` tile; the set alternates with the
            // block, as the configuration has it.
            unsafe {
                match (halves, b % 2) {
                    (false, 0) => start_sums::<false, 0>(a, w.cols, bt),
                    (false, _) => start_sums::<false, 1>(a, w.cols, bt),
                    (true, 0) => start_sums::<true, 0>(a, w.cols, bt),
                    (true, _) => start_sums::<true, 1>(a, w.cols, bt),
                }
            }
        };
        start(0);
        for b in 0..nb {
            // The next block's product runs while this block's sums are
            // stored and scaled.
            if b + 1 < nb {
                start(b + 1);
            }
            let at_c = c[b % 2].0.as_mut_ptr();
            // SAFETY: block `b`'s sums were started on its set; `at_c`
            // holds 2 KiB.
            unsafe {
                match (halves, b % 2) {
                    (false, 0) => store_sums::<false, 0>(at_c),
                    (false, _) => store_sums::<false, 1>(at_c),
                    (true, 0) => store_sums::<true, 0>(at_c),
                    (true, _) => store_sums::<true, 1>(at_c),
                }
            }
            let c = &c[b % 2].0;
            let lane = b % 8;
            let at = (tile * nb + b) * ROWS;
            let dx = _mm512_loadu_ps(acts.dx.as_ptr().add(at));
            for (r, acc) in acc.iter_mut().enumerate().take(w.rows) {
                let wd = _mm512_set1_ps(*w.wd.get_unchecked(r * nb + b));
                let sum = if halves {
                    let i0 = _mm512_loadu_si512(c.as_ptr().add(ROWS * r).cast());
                    let i1 = _mm512_loadu_si512(c.as_ptr().add(ROWS * (ROWS + r)).cast());
                    let h = 2 * (r * nb + b);
                    let sc0 = _mm512_set1_epi32(*w.sc.get_unchecked(h));
                    let sc1 = _mm512_set1_epi32(*w.sc.get_unchecked(h + 1));
                    _mm512_add_epi32(_mm512_mullo_epi32(sc0, i0), _mm512_mullo_epi32(sc1, i1))
                } else {
                    _mm512_loadu_si512(c.as_ptr().add(ROWS * r).cast())
                };
                let mut term = _mm512_mul_ps(_mm512_mul_ps(wd, dx), _mm512_cvtepi32_ps(sum));
                if K == MIN_ADD {
                    let s = _mm512_cvtepi32_ps(_mm512_loadu_si512(acts.s.as_ptr().add(at).cast()));
                    let wm = _mm512_set1_ps(*w.wm.get_unchecked(r * nb + b));
                    term = _mm512_add_ps(term, _mm512_mul_ps(_mm512_mul_ps(wm, dx), s));
                } else if K == MIN_SUB {
                    let xs = _mm512_loadu_ps(acts.xs.as_ptr().add(at));
                    term = _mm512_sub_ps(term, _mm512_mul_ps(_mm512_set1_ps(*w.wm.get_unchecked(r * nb + b)), xs));
                } else if K == Q2K {
                    let h = 2 * (r * nb + b);
                    let s0 = _mm512_loadu_si512(acts.s0.as_ptr().add(at).cast());
                    let s1 = _mm512_loadu_si512(acts.s1.as_ptr().add(at).cast());
                    let m = _mm512_add_epi32(
                        _mm512_mullo_epi32(_mm512_set1_epi32(*w.mn.get_unchecked(h)), s0),
                        _mm512_mullo_epi32(_mm512_set1_epi32(*w.mn.get_unchecked(h + 1)), s1),
                    );
                    let wm = _mm512_set1_ps(*w.wm.get_unchecked(r * nb + b));
                    term = _mm512_sub_ps(term, _mm512_mul_ps(_mm512_mul_ps(wm, dx), _mm512_cvtepi32_ps(m)));
                }
                acc[lane] = _mm512_add_ps(acc[lane], term);
            }
        }
        let t0 = tile * ROWS;
        let live = (acts.n - t0).min(ROWS);
        let mask: __mmask16 = if live == ROWS { !0 } else { (1u16 << live) - 1 };
        for (r, l) in acc.iter().enumerate().take(w.rows) {
            let v = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[1], l[5])),
                _mm512_add_ps(_mm512_add_ps(l[2], l[6]), _mm512_add_ps(l[3], l[7])),
            );
            // SAFETY: `out` reaches `r · stride + t0 + live` (checked by
            // `product`); the mask stores `live` lanes.
            unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(r * stride + t0), mask, v) };
        }
    }
    // SAFETY: releases the tile state this function configured.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

#[cfg(test)]
mod tests;
