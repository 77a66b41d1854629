//! Integer dot products of GGML quantized rows with 8-bit activations, the
//! way those formats are meant to run: the activation row is quantized once
//! per product ([`Q8Acts`], blocks of 32 with an f32 scale), each 32-element
//! block multiplies weight codes by activation codes in integers, and only
//! the per-block scales are applied in f32.
//!
//! # The definition
//!
//! For a row of type `ty` and activations `a` ([`Q8Acts`]), every 32-element
//! block `b` of the row (a K-quant super-block is 8 such blocks) yields two
//! exact integer sums over its halves, `lo = Σ_{i<16} c_i q_i` and
//! `hi = Σ_{16≤i<32} c_i q_i` (`c` the stored weight code: the nibble, the
//! 5- or 6-bit code, Q8_0's signed byte, MXFP4's `kvalues_mxfp4[nibble]`
//! in `-12..=12`, or IQ4_NL's and IQ4_XS's `kvalues_iq4nl[nibble]` in
//! `-127..=113`; `q` the activation codes), and
//! with `S = a.s16[2b] + a.s16[2b + 1]`, `dx = a.d[b]`, one f32 term:
//!
//! | type | term |
//! |---|---|
//! | Q8_0, IQ4_NL | `(d * dx) * f32(lo + hi)` |
//! | IQ4_XS | `((d · (ls - 32)) * dx) * f32(lo + hi)` |
//! | MXFP4 | `(e8m0_half(e) * dx) * f32(lo + hi)` |
//! | Q4_0 / Q5_0 | `(d * dx) * f32(lo + hi - 8 S)` / `- 16 S` |
//! | Q4_1 / Q5_1 | `(d * dx) * f32(lo + hi) + (m * dx) * f32(S)` |
//! | Q2_K | `(d * dx) * f32(sc₀ lo + sc₁ hi) - (dmin * dx) * f32(mn₀ s16[2b] + mn₁ s16[2b + 1])` |
//! | Q3_K | `(d * dx) * f32(sc₀ (lo - 4 s16[2b]) + sc₁ (hi - 4 s16[2b + 1]))` |
//! | Q4_K / Q5_K | `((d · sc) * dx) * f32(lo + hi) - (dmin · mn) * (dx * f32(S))` |
//! | Q6_K | `(d * dx) * f32(sc₀ (lo - 32 s16[2b]) + sc₁ (hi - 32 s16[2b + 1]))` |
//!
//! (`d`, `m`, `dmin` the f16 fields widened; `sc`, `mn` the sub-block's
//! 6-bit scale and min; Q2_K's `sc₀`, `mn₀` / `sc₁`, `mn₁` the 4-bit scales
//! and mins of the block's two 16-element groups, Q3_K's their 6-bit
//! scales less 32 ([`super::types::q3_k_scale`], codes `low | high << 2`
//! in 0..8, so the 4 comes off as for Q4_0's 8); `ls` IQ4_XS's 6-bit sub-block scale
//! ([`super::types::iq4_xs_scale`]); `sc₀`, `sc₁` Q6_K's i8 scales of the two halves;
//! `e8m0_half(e)` MXFP4's `2^(e - 128)`, [`super::types::e8m0_to_f32_half`]:
//! ggml's `GGML_E8M0_TO_FP32_HALF(x[ib].e) * GGML_FP16_TO_FP32(y[ib].d) * sumi`,
//! with the f32 activation scale in place of the f16 one). `d · sc`,
//! `dmin · mn` and `d · (ls - 32)` are exact (an f16 times an integer of at
//! most 6 bits fits an f32's 24-bit significand), so a kernel may form them
//! once per weight chunk and `dx * f32(S)` once per activation block: the
//! per-term work of a tile is then three multiplies and a subtraction.
//! Term `b` is added to lane `b % 8` of eight f32 sums, which are reduced as
//! `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`.
//!
//! # One result on every CPU
//!
//! The integer sums are exact whatever the instruction set (no product or
//! partial sum can saturate: codes are at most 63 in magnitude or are
//! Q8_0's bytes, and activation codes at most 127 in magnitude), and the
//! float part is this module's one [`combine`] routine, inlined into every
//! path, with no fused multiply-add. So the scalar reference, AVX2, AVX-512 VNNI and NEON give
//! the same bits, which is what lets an expert run on any machine of a
//! cluster (DESIGN.md's one rule). Tests hold every path available here to
//! the scalar reference bit for bit, and the reference to the f64 product of
//! the dequantized row with the dequantized activations.
//!
//! # Layout
//! - [`acts`]: [`Q8Acts`], the activation quantization.
//! - `reference`: the scalar codes and sums (the definition, and the path on
//!   CPUs without a vector unit charm knows).
//! - `x86`: AVX2 (`maddubs`) and AVX-512 VNNI (`vpdpbusd`) sums.
//! - `neon`: AArch64 sums (widening multiplies, or `sdot` where the CPU has
//!   it), the codes decoded once for the four activation rows of `dot4`.
//! - [`amx`]: prefill products of every type on AMX-INT8 tiles (x86 CPUs
//!   that have them), the same bits.
//! - [`tiled`]: Q8_0, Q4_0, MXFP4, Q4_K and Q6_K matrix products on x86
//!   with both sides chunk-transposed, so no block needs a horizontal fold
//!   (same bits), and decode's packed copies of the same rows (the blocks
//!   past a row's last whole chunk through this module's per-block code).

/// `$body` with `$t` bound to `$ty`, one arm per type the x86 and NEON kernels'
/// chunk loops take, each with the type as a constant: inlined into an arm, every test
/// of the type in the loops folds away. With the type a run-time value the
/// loops branched on it per chunk and per activation row (a jump table in
/// the chunk loop); folded, the four-row products of `bench_kernels` ran
/// 17–31 % faster for Q8_0, Q4_0 and the K-quants, decode rows 4–16 %.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! each_type {
    ($ty:expr, $t:ident => $body:expr) => {
        match $ty {
            GgmlType::Q8_0 => {
                let $t = GgmlType::Q8_0;
                $body
            }
            GgmlType::Q4_0 => {
                let $t = GgmlType::Q4_0;
                $body
            }
            GgmlType::MXFP4 => {
                let $t = GgmlType::MXFP4;
                $body
            }
            GgmlType::IQ4_NL => {
                let $t = GgmlType::IQ4_NL;
                $body
            }
            GgmlType::IQ4_XS => {
                let $t = GgmlType::IQ4_XS;
                $body
            }
            GgmlType::Q2_K => {
                let $t = GgmlType::Q2_K;
                $body
            }
            GgmlType::Q3_K => {
                let $t = GgmlType::Q3_K;
                $body
            }
            GgmlType::Q4_K => {
                let $t = GgmlType::Q4_K;
                $body
            }
            GgmlType::Q5_K => {
                let $t = GgmlType::Q5_K;
                $body
            }
            GgmlType::Q6_K => {
                let $t = GgmlType::Q6_K;
                $body
            }
            GgmlType::Q4_1 => {
                let $t = GgmlType::Q4_1;
                $body
            }
            GgmlType::Q5_0 => {
                let $t = GgmlType::Q5_0;
                $body
            }
            GgmlType::Q5_1 => {
                let $t = GgmlType::Q5_1;
                $body
            }
            other => {
                let $t = other;
                $body
            }
        }
    };
}

mod acts;
pub mod amx;
#[cfg(target_arch = "aarch64")]
mod neon;
mod reference;
pub mod tiled;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use acts::Q8Acts;

pub use crate::isa::Isa;

use super::types::{e8m0_to_f32_half, f16_le, iq4_xs_scale, q3_k_scale, scale_min_k4, GgmlType, QK, QK_K};

/// Whether `ty` has an integer dot product here (every quantized type).
pub fn supports(ty: GgmlType) -> bool {
    ty.is_quantized()
}

/// Integer sums of up to eight 32-element blocks: `lo[b]`, `hi[b]` over the
/// halves of block `b` (blocks past the chunk's end are zero).
#[derive(Clone, Copy, Default)]
pub(crate) struct Raw {
    pub lo: [i32; 8],
    pub hi: [i32; 8],
}

/// One instruction set's integer sums for a chunk of a row: up to eight
/// 32-element blocks of the 32-element types (`nblocks` of them), or one
/// K-quant super-block (`nblocks == 8`). `q` holds the chunk's activation
/// codes.
pub(crate) trait Sums {
    /// # Safety
    /// The CPU must run the instruction set; `chunk` must hold `nblocks`
    /// blocks of `ty` (or one super-block) and `q` `32 * nblocks` codes.
    unsafe fn raw(ty: GgmlType, chunk: &[u8], q: &[i8], nblocks: usize) -> Raw;

    /// [`Sums::raw`] for `N` activation rows' codes of the same chunk (an
    /// instruction set may decode the weight codes once for all of them).
    ///
    /// # Safety
    /// As [`Sums::raw`], for each of `qs`.
    #[inline(always)]
    unsafe fn raw_n<const N: usize>(ty: GgmlType, chunk: &[u8], qs: [&[i8]; N], nblocks: usize) -> [Raw; N] {
        // SAFETY: forwarded.
        qs.map(|q| unsafe { Self::raw(ty, chunk, q, nblocks) })
    }
}

/// Dot product of a row of `ty` (`row`: its bytes) with quantized
/// activations, on the active instruction set ([`Isa::active`]).
///
/// # Panics
/// If `ty` is not quantized or `row` does not hold `acts.len()` elements.
#[inline]
pub fn dot(ty: GgmlType, row: &[u8], acts: &Q8Acts) -> f32 {
    dot_on(Isa::active(), ty, row, acts)
}

/// [`dot`] on a chosen instruction set (tests and benchmarks); an
/// instruction set this CPU does not run falls back to the scalar path.
pub fn dot_on(isa: Isa, ty: GgmlType, row: &[u8], acts: &Q8Acts) -> f32 {
    check(ty, row, acts);
    #[cfg(target_arch = "x86_64")]
    if isa.runs() {
        match isa {
            // SAFETY: the CPU runs the instruction set (checked above).
            Isa::Avx512Vnni => return unsafe { x86::dot_avx512vnni(ty, row, acts) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { x86::dot_avx2(ty, row, acts) },
            _ => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    match isa {
        // SAFETY: Advanced SIMD is part of every AArch64 CPU.
        Isa::Neon => return unsafe { neon::rows_dot_neon(ty, row, [acts])[0] },
        // SAFETY: `dotprod` was detected (the caller's `isa` is available
        // or the scalar path runs below).
        Isa::NeonDot if isa.runs() => return unsafe { neon::rows_dot_sdot(ty, row, [acts])[0] },
        _ => {}
    }
    let _ = isa;
    // SAFETY: the scalar path runs everywhere.
    unsafe { rows_dot::<reference::Scalar, 1>(ty, row, [acts])[0] }
}

/// `out[i] = dot(row i of rows, acts)` for `out.len()` consecutive rows
/// (`rows`: their bytes, back to back), with one check and one dispatch for
/// all: what matrix-vector products use. The bits of [`dot`] per row.
///
/// # Panics
/// If `ty` is not quantized or `rows` does not hold `out.len()` rows of
/// `acts.len()` elements.
pub fn dot_rows(ty: GgmlType, rows: &[u8], acts: &Q8Acts, out: &mut [f32]) {
    assert!(supports(ty), "{ty} has no integer dot product");
    let rb = ty.row_bytes(acts.len()).unwrap_or(0);
    assert_eq!(
        rows.len(),
        rb * out.len(),
        "{ty} rows do not match {} activations",
        acts.len()
    );
    if rb == 0 {
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    match Isa::active() {
        // SAFETY: the active instruction set is one this CPU runs; the
        // shapes were checked above.
        Isa::Avx512Vnni => return unsafe { x86::dot_rows_avx512vnni(ty, rows, rb, acts, out) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { x86::dot_rows_avx2(ty, rows, rb, acts, out) },
        _ => {}
    }
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
        *o = dot(ty, row, acts);
    }
}

/// Dot products of one row with four activation rows (what tiled matrix
/// products use): result `n` is the bits [`dot`] gives for `acts[n]`; the
/// row's codes and scales are decoded once for all four.
///
/// # Panics
/// As [`dot`], for any of the four.
#[inline]
pub fn dot4(ty: GgmlType, row: &[u8], acts: [&Q8Acts; 4]) -> [f32; 4] {
    dot4_on(Isa::active(), ty, row, acts)
}

/// [`dot4`] on a chosen instruction set.
pub fn dot4_on(isa: Isa, ty: GgmlType, row: &[u8], acts: [&Q8Acts; 4]) -> [f32; 4] {
    for a in acts {
        check(ty, row, a);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.runs() {
        match isa {
            // SAFETY: the CPU runs the instruction set (checked above).
            Isa::Avx512Vnni => return unsafe { x86::dot4_avx512vnni(ty, row, acts) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { x86::dot4_avx2(ty, row, acts) },
            _ => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    match isa {
        // SAFETY: Advanced SIMD is part of every AArch64 CPU; the shapes
        // were checked above.
        Isa::Neon => return unsafe { neon::rows_dot_neon(ty, row, acts) },
        // SAFETY: as above, and `dotprod` was detected.
        Isa::NeonDot if isa.runs() => return unsafe { neon::rows_dot_sdot(ty, row, acts) },
        _ => {}
    }
    acts.map(|a| dot_on(isa, ty, row, a))
}

/// The promise every path relies on: `ty` is quantized and `row` holds
/// `acts.len()` of its elements.
fn check(ty: GgmlType, row: &[u8], acts: &Q8Acts) {
    assert!(supports(ty), "{ty} has no integer dot product");
    assert_eq!(
        ty.row_bytes(acts.len()),
        Some(row.len()),
        "{ty} row does not match {} activations",
        acts.len()
    );
}

/// The row loop shared by the scalar and NEON paths: chunks of 8 blocks
/// (or one super-block), integer sums from `S` for `N` activation rows at
/// once, terms from [`combine`], one result per activation row.
///
/// # Safety
/// The CPU must run `S`'s instruction set; `row` must hold `acts[n].len()`
/// elements of `ty` for every `n`.
#[inline(always)]
pub(crate) unsafe fn rows_dot<S: Sums, const N: usize>(ty: GgmlType, row: &[u8], acts: [&Q8Acts; N]) -> [f32; N] {
    let mut acc = [[0.0f32; 8]; N];
    let super_blocks = ty.block_elems() == QK_K;
    let chunk_bytes = if super_blocks {
        ty.block_bytes()
    } else {
        8 * ty.block_bytes()
    };
    let mut b0 = 0;
    for chunk in row.chunks(chunk_bytes) {
        let k = if super_blocks {
            8
        } else {
            chunk.len() / ty.block_bytes()
        };
        let qs = acts.map(|a| &a.qs[b0 * QK..(b0 + k) * QK]);
        // SAFETY: forwarded from the caller; `chunk` holds `k` blocks.
        let raw = unsafe { S::raw_n(ty, chunk, qs, k) };
        for ((raw, a), acc) in raw.iter().zip(acts).zip(&mut acc) {
            combine(ty, chunk, k, raw, &a.d[b0..b0 + k], &a.s16[2 * b0..2 * (b0 + k)], acc);
        }
        b0 += k;
    }
    acc.map(|acc| ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])))
}

/// Adds the f32 terms of one chunk's `k` blocks to the lanes (the table in
/// the module docs). The one place for the float part of every path.
#[inline(always)]
pub(crate) fn combine(ty: GgmlType, chunk: &[u8], k: usize, raw: &Raw, dx: &[f32], s16: &[i32], acc: &mut [f32; 8]) {
    let half = |b: usize| (s16[2 * b], s16[2 * b + 1]);
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL => {
            let (bs, off) = match ty {
                GgmlType::Q8_0 => (34, 0),
                GgmlType::Q4_0 => (18, 8),
                GgmlType::IQ4_NL => (18, 0),
                _ => (22, 16),
            };
            for b in 0..k {
                let d = f16_le([chunk[b * bs], chunk[b * bs + 1]]);
                let (s0, s1) = half(b);
                let i = raw.lo[b] + raw.hi[b] - off * (s0 + s1);
                acc[b] += (d * dx[b]) * i as f32;
            }
        }
        GgmlType::MXFP4 => {
            for b in 0..k {
                let d = e8m0_to_f32_half(chunk[17 * b]);
                acc[b] += (d * dx[b]) * (raw.lo[b] + raw.hi[b]) as f32;
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let bs = if ty == GgmlType::Q4_1 { 20 } else { 24 };
            for b in 0..k {
                let p = &chunk[b * bs..];
                let (d, m) = (f16_le([p[0], p[1]]), f16_le([p[2], p[3]]));
                let (s0, s1) = half(b);
                acc[b] += (d * dx[b]) * (raw.lo[b] + raw.hi[b]) as f32 + (m * dx[b]) * (s0 + s1) as f32;
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (f16_le([chunk[0], chunk[1]]), f16_le([chunk[2], chunk[3]]));
            let scales: &[u8; 12] = chunk[4..16].try_into().expect("12 scale bytes");
            for b in 0..8 {
                let (sc, mn) = scale_min_k4(scales, b);
                let (s0, s1) = half(b);
                // Exact: an f16 times a 6-bit integer fits an f32's 24 bits.
                let (ds, dm) = (d * sc as f32, dmin * mn as f32);
                let xs = dx[b] * (s0 + s1) as f32;
                acc[b] += (ds * dx[b]) * (raw.lo[b] + raw.hi[b]) as f32 - dm * xs;
            }
        }
        GgmlType::Q2_K => {
            let (d, dmin) = (f16_le([chunk[80], chunk[81]]), f16_le([chunk[82], chunk[83]]));
            for b in 0..8 {
                let (g0, g1) = (chunk[2 * b] as i32, chunk[2 * b + 1] as i32);
                let (s0, s1) = half(b);
                let i = (g0 & 15) * raw.lo[b] + (g1 & 15) * raw.hi[b];
                let m = (g0 >> 4) * s0 + (g1 >> 4) * s1;
                acc[b] += (d * dx[b]) * i as f32 - (dmin * dx[b]) * m as f32;
            }
        }
        GgmlType::Q3_K => {
            let d = f16_le([chunk[108], chunk[109]]);
            for b in 0..8 {
                let (sc0, sc1) = (
                    q3_k_scale(&chunk[96..108], 2 * b),
                    q3_k_scale(&chunk[96..108], 2 * b + 1),
                );
                let (s0, s1) = half(b);
                let i = sc0 * (raw.lo[b] - 4 * s0) + sc1 * (raw.hi[b] - 4 * s1);
                acc[b] += (d * dx[b]) * i as f32;
            }
        }
        GgmlType::IQ4_XS => {
            let d = f16_le([chunk[0], chunk[1]]);
            for b in 0..8 {
                // Exact, as Q4_K's `d · sc`.
                let ds = d * iq4_xs_scale([chunk[2], chunk[3]], &chunk[4..8], b) as f32;
                acc[b] += (ds * dx[b]) * (raw.lo[b] + raw.hi[b]) as f32;
            }
        }
        GgmlType::Q6_K => {
            let d = f16_le([chunk[208], chunk[209]]);
            for b in 0..8 {
                let (sc0, sc1) = (chunk[192 + 2 * b] as i8 as i32, chunk[193 + 2 * b] as i8 as i32);
                let (s0, s1) = half(b);
                let i = sc0 * (raw.lo[b] - 32 * s0) + sc1 * (raw.hi[b] - 32 * s1);
                acc[b] += (d * dx[b]) * i as f32;
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float rows have no integer dot"),
    }
}

#[cfg(test)]
mod tests;
