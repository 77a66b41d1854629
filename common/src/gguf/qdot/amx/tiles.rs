//! The AMX kernel of [`super::product`]: tile configuration, the tile
//! instructions of a block, and the terms in AVX-512 registers.

use std::arch::asm;
use std::arch::x86_64::*;

use super::super::super::types::QK;
use super::{acts, line_bytes, AmxActs, WeightTile, ROWS};

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

pub(super) const PLAIN: u8 = 0;
pub(super) const MIN_ADD: u8 = 1;
pub(super) const MIN_SUB: u8 = 2;
pub(super) const HALVES: u8 = 3;
pub(super) const Q2K: u8 = 4;

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
pub(super) unsafe fn product_x86<const K: u8>(
    w: &WeightTile,
    acts: &AmxActs,
    out: &mut [f32],
    stride: usize,
    ahead: &[u8],
) {
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
    // `ahead`'s lines spread over every block of every activation tile.
    let share = ahead.len().div_ceil(acts.tiles() * nb).next_multiple_of(64);
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
            let from = ((tile * nb + b) * share).min(ahead.len());
            crate::prefetch::span_to_l2(ahead[from..].as_ptr(), share.min(ahead.len() - from));
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
