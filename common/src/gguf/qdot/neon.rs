//! AArch64 integer sums: each 16-element half of a block decoded into one
//! 128-bit register of codes (unsigned codes all below 128, so they are
//! valid `i8`; Q8_0's bytes, MXFP4's `kvalues_mxfp4` and IQ4_NL's /
//! IQ4_XS's `kvalues_iq4nl`, looked up with `tbl`, are signed), then
//! multiplied by the activation codes in one of two ways:
//!
//! - [`Neon`]: widening `smull` (i8 × i8 → i16, never overflowing),
//!   pairwise-added into i32 lanes and summed across the register;
//! - [`NeonDot`]: `sdot` (ARMv8.2 `dotprod`), four i32 lanes of four
//!   products each, summed across the register: one instruction where
//!   the widening path takes five.
//!
//! Both give the exact integer sums, so the same bits. Their
//! [`Sums::raw_n`] decodes a chunk's codes once for every activation row
//! it meets (what `dot4`, the four-row products of prefill, uses).

use std::arch::aarch64::*;
use std::arch::asm;

use super::super::types::{GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4, QK};
use super::{Q8Acts, Raw, Sums};

/// How 16 decoded codes meet 16 activation codes.
pub(crate) trait HalfDot {
    /// `sum(c[i] * q[i])` over 16 elements, exact.
    ///
    /// # Safety
    /// `q` covers 16 codes; the CPU runs the instructions used.
    unsafe fn dot16(c: uint8x16_t, q: *const i8) -> i32;
}

/// Advanced SIMD sums with widening multiplies.
pub(crate) struct Neon;

/// Advanced SIMD sums with `sdot`.
pub(crate) struct NeonDot;

impl HalfDot for Neon {
    #[inline(always)]
    unsafe fn dot16(c: uint8x16_t, q: *const i8) -> i32 {
        // SAFETY: the caller's pointer covers 16 codes.
        unsafe {
            let c = vreinterpretq_s8_u8(c);
            let q = vld1q_s8(q);
            let p0 = vmull_s8(vget_low_s8(c), vget_low_s8(q));
            let p1 = vmull_high_s8(c, q);
            vaddvq_s32(vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)))
        }
    }
}

impl HalfDot for NeonDot {
    #[inline(always)]
    unsafe fn dot16(c: uint8x16_t, q: *const i8) -> i32 {
        // SAFETY: the caller's pointer covers 16 codes and the CPU runs
        // `dotprod` (the caller's promise). `vdotq_s32` is not stable Rust
        // yet, so the instruction is written out.
        unsafe {
            let q = vld1q_s8(q);
            let mut acc = vdupq_n_s32(0);
            asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {c:v}.16b, {q:v}.16b",
                acc = inout(vreg) acc,
                c = in(vreg) c,
                q = in(vreg) q,
                options(pure, nomem, nostack, preserves_flags)
            );
            vaddvq_s32(acc)
        }
    }
}

/// `0x10` in byte `i` where bit `i` of `bits` is set.
#[inline(always)]
unsafe fn high_bits16(bits: u16) -> uint8x16_t {
    const MASK: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: MASK holds 16 bytes.
    unsafe {
        let v = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
        vandq_u8(vtstq_u8(v, vld1q_u8(MASK.as_ptr())), vdupq_n_u8(0x10))
    }
}

/// `((x >> s) & mask) << 4` in every byte.
#[inline(always)]
unsafe fn shifted_high(x: uint8x16_t, s: i8, mask: u8) -> uint8x16_t {
    vshlq_n_u8::<4>(vandq_u8(vshlq_u8(x, vdupq_n_s8(-s)), vdupq_n_u8(mask)))
}

/// Every block's codes of a chunk, as `put(b, first half, second half)`:
/// up to eight 32-element blocks (`nblocks`) or one K-quant super-block's
/// eight sub-blocks.
///
/// # Safety
/// `chunk` holds `nblocks` blocks of `ty` (or one super-block).
#[inline(always)]
unsafe fn decode(ty: GgmlType, chunk: &[u8], nblocks: usize, mut put: impl FnMut(usize, uint8x16_t, uint8x16_t)) {
    let c = chunk.as_ptr();
    // SAFETY (every load below): `chunk` holds `nblocks` blocks of `ty`
    // (or one super-block).
    unsafe {
        let low4 = vdupq_n_u8(0x0f);
        match ty {
            GgmlType::Q8_0 => {
                for b in 0..nblocks {
                    let p = c.add(34 * b + 2);
                    put(b, vld1q_u8(p), vld1q_u8(p.add(16)));
                }
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let (bs, at) = if ty == GgmlType::Q4_0 { (18, 2) } else { (20, 4) };
                for b in 0..nblocks {
                    let x = vld1q_u8(c.add(bs * b + at));
                    put(b, vandq_u8(x, low4), vshrq_n_u8::<4>(x));
                }
            }
            GgmlType::MXFP4 => {
                // kvalues_mxfp4[nibble]: a table lookup (`tbl`) per half.
                let table = vld1q_s8(KVALUES_MXFP4.as_ptr());
                for b in 0..nblocks {
                    let x = vld1q_u8(c.add(17 * b + 1));
                    let lo = vqtbl1q_s8(table, vandq_u8(x, low4));
                    let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(x));
                    put(b, vreinterpretq_u8_s8(lo), vreinterpretq_u8_s8(hi));
                }
            }
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
                // kvalues_iq4nl[nibble]; IQ4_XS's sub-block `b` at
                // bytes 8 + 16b of its super-block.
                let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
                let (bs, at) = if ty == GgmlType::IQ4_NL { (18, 2) } else { (16, 8) };
                for b in 0..nblocks {
                    let x = vld1q_u8(c.add(bs * b + at));
                    let lo = vqtbl1q_s8(table, vandq_u8(x, low4));
                    let hi = vqtbl1q_s8(table, vshrq_n_u8::<4>(x));
                    put(b, vreinterpretq_u8_s8(lo), vreinterpretq_u8_s8(hi));
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let (bs, qh_at, qs_at) = if ty == GgmlType::Q5_0 { (22, 2, 6) } else { (24, 4, 8) };
                for b in 0..nblocks {
                    let p = c.add(bs * b);
                    let bits = (p.add(qh_at) as *const u32).read_unaligned();
                    let x = vld1q_u8(p.add(qs_at));
                    put(
                        b,
                        vorrq_u8(vandq_u8(x, low4), high_bits16(bits as u16)),
                        vorrq_u8(vshrq_n_u8::<4>(x), high_bits16((bits >> 16) as u16)),
                    );
                }
            }
            GgmlType::Q2_K | GgmlType::Q3_K => {
                // Block b = 4n + j: bits 2j..2j + 2 of qs[32n..32n + 32];
                // Q3_K's third bit is bit b of each hmask byte.
                let k3 = ty == GgmlType::Q3_K;
                let qs = c.add(if k3 { 32 } else { 16 });
                let (hm0, hm1) = (vld1q_u8(c), vld1q_u8(c.add(16)));
                let three = vdupq_n_u8(3);
                let high =
                    |hm: uint8x16_t, b: i8| vshlq_n_u8::<2>(vandq_u8(vshlq_u8(hm, vdupq_n_s8(-b)), vdupq_n_u8(1)));
                for n in 0..2 {
                    let (x0, x1) = (vld1q_u8(qs.add(32 * n)), vld1q_u8(qs.add(32 * n + 16)));
                    for j in 0..4 {
                        let b = 4 * n + j;
                        let shift = vdupq_n_s8(-2 * j as i8);
                        let mut lo = vandq_u8(vshlq_u8(x0, shift), three);
                        let mut hi = vandq_u8(vshlq_u8(x1, shift), three);
                        if k3 {
                            lo = vorrq_u8(lo, high(hm0, b as i8));
                            hi = vorrq_u8(hi, high(hm1, b as i8));
                        }
                        put(b, lo, hi);
                    }
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let k5 = ty == GgmlType::Q5_K;
                let qs = c.add(if k5 { 48 } else { 16 });
                let (qh0, qh1) = (vld1q_u8(c.add(16)), vld1q_u8(c.add(32)));
                for i in 0..4 {
                    let (x0, x1) = (vld1q_u8(qs.add(32 * i)), vld1q_u8(qs.add(32 * i + 16)));
                    let (mut a0, mut a1) = (vandq_u8(x0, low4), vandq_u8(x1, low4));
                    let (mut b0, mut b1) = (vshrq_n_u8::<4>(x0), vshrq_n_u8::<4>(x1));
                    if k5 {
                        let (j0, j1) = (2 * i as i8, 2 * i as i8 + 1);
                        a0 = vorrq_u8(a0, shifted_high(qh0, j0, 1));
                        a1 = vorrq_u8(a1, shifted_high(qh1, j0, 1));
                        b0 = vorrq_u8(b0, shifted_high(qh0, j1, 1));
                        b1 = vorrq_u8(b1, shifted_high(qh1, j1, 1));
                    }
                    put(2 * i, a0, a1);
                    put(2 * i + 1, b0, b1);
                }
            }
            GgmlType::Q6_K => {
                for h in 0..2 {
                    let ql = c.add(64 * h);
                    let (l0a, l0b) = (vld1q_u8(ql), vld1q_u8(ql.add(16)));
                    let (l1a, l1b) = (vld1q_u8(ql.add(32)), vld1q_u8(ql.add(48)));
                    let (ha, hb) = (vld1q_u8(c.add(128 + 32 * h)), vld1q_u8(c.add(144 + 32 * h)));
                    let lows = [
                        (vandq_u8(l0a, low4), vandq_u8(l0b, low4)),
                        (vandq_u8(l1a, low4), vandq_u8(l1b, low4)),
                        (vshrq_n_u8::<4>(l0a), vshrq_n_u8::<4>(l0b)),
                        (vshrq_n_u8::<4>(l1a), vshrq_n_u8::<4>(l1b)),
                    ];
                    for (k, (la, lb)) in lows.into_iter().enumerate() {
                        let s = 2 * k as i8;
                        put(
                            4 * h + k,
                            vorrq_u8(la, shifted_high(ha, s, 3)),
                            vorrq_u8(lb, shifted_high(hb, s, 3)),
                        );
                    }
                }
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no integer sums"),
        }
    }
}

/// The sums of one chunk with `N` activation rows' codes, the codes
/// decoded once for all of them.
///
/// # Safety
/// As [`Sums::raw`] for each of `qs`; the CPU runs `D`'s instructions.
#[inline(always)]
unsafe fn raw_n<D: HalfDot, const N: usize>(ty: GgmlType, chunk: &[u8], qs: [&[i8]; N], nblocks: usize) -> [Raw; N] {
    let mut raw = [Raw::default(); N];
    // SAFETY: forwarded; every `q` holds the chunk's `32 * nblocks` codes.
    unsafe {
        decode(ty, chunk, nblocks, |b, lo, hi| {
            for (r, q) in raw.iter_mut().zip(qs) {
                r.lo[b] = D::dot16(lo, q[b * QK..].as_ptr());
                r.hi[b] = D::dot16(hi, q[b * QK + 16..].as_ptr());
            }
        })
    };
    raw
}

/// Both NEON paths: the codes decoded once per chunk for every activation row.
impl<D: HalfDot> Sums for D {
    #[inline(always)]
    unsafe fn raw(ty: GgmlType, chunk: &[u8], q: &[i8], nblocks: usize) -> Raw {
        // SAFETY: forwarded.
        unsafe { raw_n::<D, 1>(ty, chunk, [q], nblocks)[0] }
    }

    #[inline(always)]
    unsafe fn raw_n<const N: usize>(ty: GgmlType, chunk: &[u8], qs: [&[i8]; N], nblocks: usize) -> [Raw; N] {
        // SAFETY: forwarded.
        unsafe { raw_n::<D, N>(ty, chunk, qs, nblocks) }
    }
}

/// [`super::rows_dot`] on [`NeonDot`], compiled with `dotprod`.
///
/// # Safety
/// The CPU runs `dotprod`; `row` holds `acts[n].len()` elements of `ty`
/// for every `n`.
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn rows_dot_sdot<const N: usize>(ty: GgmlType, row: &[u8], acts: [&Q8Acts; N]) -> [f32; N] {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => super::rows_dot::<NeonDot, N>(t, row, acts)) }
}

/// [`super::rows_dot`] on [`Neon`].
///
/// # Safety
/// `row` holds `acts[n].len()` elements of `ty` for every `n`.
pub(crate) unsafe fn rows_dot_neon<const N: usize>(ty: GgmlType, row: &[u8], acts: [&Q8Acts; N]) -> [f32; N] {
    // SAFETY: forwarded.
    unsafe { each_type!(ty, t => super::rows_dot::<Neon, N>(t, row, acts)) }
}
