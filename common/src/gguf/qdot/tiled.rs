//! Matrix-matrix products (prefill) of Q8_0 and Q4_0 rows on x86: the same
//! definition and bits as [`super::dot`], with the data laid out so that
//! no block needs a horizontal fold.
//!
//! [`super::dot`] multiplies each block's 32 codes in one register and
//! then folds the eight i32 lanes of each block into one sum (`vphaddd`),
//! which costs about as much as the multiplies. Here both sides are stored
//! *chunk-transposed*: for every chunk of eight blocks, step `j` (0..8) is
//! one 32-byte register whose lane `b` holds bytes `4j..4j + 4` of block
//! `b`. Eight multiply-accumulates (`vpdpbusd`, or `vpmaddubsw` +
//! `vpmaddwd` on AVX2) then leave block `b`'s exact integer sum in lane
//! `b`, which is where [`super::combine`]'s lane `b` term wants it.
//!
//! - Activations: [`Q8Acts::arrange`] adds the transposed codes and the
//!   per-block code totals (once per activation row).
//! - Weights: [`arrange_row`] writes one row's codes (nibbles unpacked,
//!   Q8_0 offset by 128 for `vpdpbusd`) and widened scales into an
//!   [`ArrangedRow`], once per row per product, shared by every activation
//!   row it meets.
//! - [`dot4_arranged`]: one arranged row with four activation rows.
//!
//! - Decode: [`pack_rows`] stores whole matrices in the same transposed
//!   order but still packed (Q4_0's nibbles in pairs, the eight f16 scales of
//!   a chunk after its codes: the GGUF row size exactly), once at load;
//!   [`dot_rows_packed`] multiplies them with one activation row.
//!
//! Integer sums are exact in any order and the float part is
//! [`super::combine`]'s operations in its order, so results equal
//! [`super::dot`] bit for bit (tested against it on every instruction set
//! this CPU runs).

use super::super::types::{f16_le, GgmlType, QK};
use super::Q8Acts;
use crate::Isa;

/// Elements per chunk: eight 32-element blocks.
pub const CHUNK: usize = 8 * QK;

/// Whether [`dot4_arranged`] runs rows of `ty` with `cols` elements here:
/// Q8_0 or Q4_0, whole chunks, and an AVX2 or AVX-512 VNNI CPU (the active
/// instruction set, [`Isa::active`]).
pub fn usable(ty: GgmlType, cols: usize) -> bool {
    usable_on(Isa::active(), ty, cols)
}

/// [`usable`] for a chosen instruction set (which this CPU must run).
pub fn usable_on(isa: Isa, ty: GgmlType, cols: usize) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0)
        && cols > 0
        && cols.is_multiple_of(CHUNK)
        && matches!(isa, Isa::Avx2 | Isa::Avx512Vnni)
        && isa.runs()
}

/// One weight row laid out for [`dot4_arranged`] (reused between rows:
/// arranging allocates only when a row is wider than any before).
#[derive(Clone, Debug, Default)]
pub struct ArrangedRow {
    ty: Option<GgmlType>,
    isa: Option<Isa>,
    /// Per chunk, eight steps of 32 code bytes (lane `b` = block `b`).
    codes: Vec<u8>,
    /// Each block's scale, widened.
    d: Vec<f32>,
}

impl Q8Acts {
    /// Adds the chunk-transposed codes and block totals [`dot4_arranged`]
    /// reads (requantizing clears them).
    ///
    /// # Panics
    /// If the row is not a whole number of chunks (256 elements).
    pub fn arrange(&mut self) {
        assert!(
            self.len().is_multiple_of(CHUNK),
            "{} activations are not whole chunks of {CHUNK}",
            self.len()
        );
        self.qt.clear();
        self.qt.resize(self.len(), 0);
        // SAFETY: i8 and u8 have the same layout.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(self.qs.as_ptr() as *const u8, self.qs.len()),
                std::slice::from_raw_parts_mut(self.qt.as_mut_ptr() as *mut u8, self.qt.len()),
            )
        };
        #[cfg(target_arch = "x86_64")]
        if matches!(Isa::active(), Isa::Avx2 | Isa::Avx512Vnni) {
            for (s, d) in src.chunks_exact(CHUNK).zip(dst.chunks_exact_mut(CHUNK)) {
                // SAFETY: AVX2 runs here; `s` holds eight 32-byte blocks and
                // `d` 256 bytes.
                unsafe { x86::transpose32(s.as_ptr(), QK, d.as_mut_ptr(), false) };
            }
        } else {
            transpose_scalar(src, dst);
        }
        #[cfg(not(target_arch = "x86_64"))]
        transpose_scalar(src, dst);
        self.tot.clear();
        self.tot.extend(self.s16.chunks_exact(2).map(|h| h[0] + h[1]));
    }

    /// Whether [`Q8Acts::arrange`] ran since the last quantization.
    pub fn arranged(&self) -> bool {
        !self.qs.is_empty() && self.qt.len() == self.qs.len()
    }
}

/// The chunk transposition of 32-byte blocks stored back to back (the
/// reference of the vector version).
fn transpose_scalar(src: &[u8], dst: &mut [u8]) {
    for (src, dst) in src.chunks_exact(CHUNK).zip(dst.chunks_exact_mut(CHUNK)) {
        for b in 0..8 {
            for j in 0..8 {
                dst[32 * j + 4 * b..32 * j + 4 * b + 4].copy_from_slice(&src[QK * b + 4 * j..QK * b + 4 * j + 4]);
            }
        }
    }
}

/// Lays out `row` (`cols` elements of `ty`) for [`dot4_arranged`] on the
/// active instruction set.
///
/// # Panics
/// If [`usable`] is false for `ty` and the row's width, or `row` is not a
/// whole row.
pub fn arrange_row(ty: GgmlType, row: &[u8], out: &mut ArrangedRow) {
    arrange_row_on(Isa::active(), ty, row, out)
}

/// [`arrange_row`] for a chosen instruction set (tests and benchmarks).
///
/// # Panics
/// If [`usable_on`] is false for `isa`, `ty` and the row's width.
pub fn arrange_row_on(isa: Isa, ty: GgmlType, row: &[u8], out: &mut ArrangedRow) {
    let bs = ty.block_bytes();
    let cols = row.len() / bs * QK;
    assert!(
        usable_on(isa, ty, cols),
        "{ty} rows of {cols} have no arranged product on {isa:?}"
    );
    assert_eq!(row.len() % bs, 0, "{ty} row of {} bytes is not whole blocks", row.len());
    out.ty = Some(ty);
    out.isa = Some(isa);
    out.codes.resize(cols, 0);
    out.d.resize(cols / QK, 0.0);
    let offset = isa == Isa::Avx512Vnni && ty == GgmlType::Q8_0;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `usable_on` checked that the CPU runs AVX2 (both ISAs
    // include it, and F16C); the buffers hold the row's codes and scales.
    unsafe {
        x86::arrange(ty, row, offset, &mut out.codes, &mut out.d)
    }
    #[cfg(not(target_arch = "x86_64"))]
    arrange_scalar(ty, row, offset, &mut out.codes, &mut out.d);
}

/// [`arrange_row_on`]'s layout, element by element (the reference of the
/// vector version); `offset` flips Q8_0's codes by 128.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn arrange_scalar(ty: GgmlType, row: &[u8], offset: bool, codes: &mut [u8], d: &mut [f32]) {
    let bs = ty.block_bytes();
    for (o, b) in d.iter_mut().zip(row.chunks_exact(bs)) {
        *o = f16_le([b[0], b[1]]);
    }
    for (chunk, dst) in row.chunks_exact(8 * bs).zip(codes.chunks_exact_mut(CHUNK)) {
        for b in 0..8 {
            let codes = block_codes(ty, &chunk[b * bs..(b + 1) * bs]);
            for j in 0..8 {
                for k in 0..4 {
                    let c = codes[4 * j + k];
                    dst[32 * j + 4 * b + k] = if offset && ty == GgmlType::Q8_0 { c ^ 0x80 } else { c };
                }
            }
        }
    }
}

/// A block's 32 codes as the multiply takes them: Q4_0's nibbles (element
/// `i < 16` the low nibble of byte `i`, `16 + i` its high nibble), Q8_0's
/// bytes.
fn block_codes(ty: GgmlType, block: &[u8]) -> [u8; QK] {
    let mut c = [0u8; QK];
    match ty {
        GgmlType::Q4_0 => {
            for i in 0..16 {
                c[i] = block[2 + i] & 0x0f;
                c[16 + i] = block[2 + i] >> 4;
            }
        }
        _ => c.copy_from_slice(&block[2..2 + QK]),
    }
    c
}

/// Dot products of one arranged row with four arranged activation rows:
/// result `n` is the bits [`super::dot`] gives for the row and `acts[n]`.
///
/// # Panics
/// If the row was never arranged, or an activation row is not arranged or
/// does not match the row's width.
pub fn dot4_arranged(row: &ArrangedRow, acts: [&Q8Acts; 4]) -> [f32; 4] {
    dot_arranged(row, acts)
}

/// [`dot4_arranged`] for `N` (1 to 4) activation rows: what the rows past
/// a multiple of four take.
///
/// # Panics
/// As [`dot4_arranged`].
pub fn dot_arranged<const N: usize>(row: &ArrangedRow, acts: [&Q8Acts; N]) -> [f32; N] {
    let ty = row.ty.expect("an arranged row");
    for a in acts {
        assert!(a.arranged(), "activations not arranged");
        assert_eq!(a.len(), row.codes.len(), "activations do not match the row");
    }
    #[cfg(target_arch = "x86_64")]
    match row.isa {
        // SAFETY: rows are only arranged for an instruction set this CPU
        // runs (`usable_on`); the widths were checked above.
        Some(Isa::Avx512Vnni) => return unsafe { x86::dot_vnni(ty, row, acts) },
        // SAFETY: as above.
        Some(Isa::Avx2) => return unsafe { x86::dot_avx2(ty, row, acts) },
        _ => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ty;
    unreachable!("arrange_row only runs where `usable` holds")
}

/// `out[t]` = the dot product of the arranged row with `acts[t]`, for any
/// number of activation rows: four at a time, then the rest, with one
/// check and one dispatch for all (what matrix products call per weight
/// row). The bits of [`dot4_arranged`].
///
/// # Panics
/// As [`dot4_arranged`], or if `out` and `acts` differ in length.
pub fn dot_many_arranged(row: &ArrangedRow, acts: &[&Q8Acts], out: &mut [f32]) {
    let ty = row.ty.expect("an arranged row");
    assert_eq!(acts.len(), out.len(), "one output per activation row");
    for a in acts {
        assert!(a.arranged(), "activations not arranged");
        assert_eq!(a.len(), row.codes.len(), "activations do not match the row");
    }
    #[cfg(target_arch = "x86_64")]
    match row.isa {
        // SAFETY: rows are only arranged for an instruction set this CPU
        // runs (`usable_on`); the widths were checked above.
        Some(Isa::Avx512Vnni) => return unsafe { x86::many_vnni(ty, row, acts, out) },
        // SAFETY: as above.
        Some(Isa::Avx2) => return unsafe { x86::many_avx2(ty, row, acts, out) },
        _ => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ty;
    unreachable!("arrange_row only runs where `usable` holds")
}

/// `rows` rows of `ty` × `cols` (`data`: GGUF row order) in the packed
/// transposed layout for the active instruction set, the same size: per
/// chunk, the codes' eight steps (Q4_0: four steps of packed nibble bytes,
/// low nibbles the elements `4j..4j + 4` of each block and high nibbles
/// `16 + 4j..`; Q8_0: eight steps of code bytes, offset by 128 for VNNI),
/// then the chunk's eight f16 scales.
///
/// # Panics
/// If [`usable`] is false or `data` does not hold `rows` rows.
pub fn pack_rows(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    pack_rows_on(Isa::active(), ty, data, rows, cols)
}

/// [`pack_rows`] for a chosen instruction set.
pub fn pack_rows_on(isa: Isa, ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    assert!(
        usable_on(isa, ty, cols),
        "{ty} rows of {cols} cannot be packed on {isa:?}"
    );
    let bs = ty.block_bytes();
    assert_eq!(
        data.len(),
        rows * cols / QK * bs,
        "{ty} data does not hold {rows} rows of {cols}"
    );
    let flip = isa == Isa::Avx512Vnni && ty == GgmlType::Q8_0;
    let mut out = vec![0u8; data.len()];
    #[cfg(target_arch = "x86_64")]
    {
        use rayon::prelude::*;
        let cb = 8 * bs;
        // Runs of chunks per task: the copy of a large matrix on every core.
        out.par_chunks_mut(cb * 64)
            .zip(data.par_chunks(cb * 64))
            .for_each(|(dst, src)| {
                for (s, d) in src.chunks_exact(cb).zip(dst.chunks_exact_mut(cb)) {
                    // SAFETY: `usable_on` checked that AVX2 runs; `s` and `d`
                    // hold one chunk of `ty`.
                    unsafe { x86::pack_chunk(ty, s, d, flip) };
                }
            });
    }
    #[cfg(not(target_arch = "x86_64"))]
    pack_scalar(ty, data, flip, &mut out);
    out
}

/// [`pack_rows_on`]'s layout, byte by byte (the reference of the vector
/// version).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn pack_scalar(ty: GgmlType, data: &[u8], flip: bool, out: &mut [u8]) {
    let bs = ty.block_bytes();
    let cb = 8 * bs;
    for (src, dst) in data.chunks_exact(cb).zip(out.chunks_exact_mut(cb)) {
        let code_bytes = cb - 16;
        let step_src = code_bytes / 8 / 4; // dwords per block: Q4_0 4, Q8_0 8
        for b in 0..8 {
            let blk = &src[b * bs..(b + 1) * bs];
            dst[code_bytes + 2 * b..code_bytes + 2 * b + 2].copy_from_slice(&blk[..2]);
            for j in 0..step_src {
                for k in 0..4 {
                    let v = blk[2 + 4 * j + k];
                    dst[32 * j + 4 * b + k] = if flip { v ^ 0x80 } else { v };
                }
            }
        }
    }
}

/// `out[i]` = the dot product of packed row `i` ([`pack_rows`] on the
/// active instruction set) with the arranged activations: the bits of
/// [`super::dot`] on the original row.
///
/// # Panics
/// If the activations are not arranged, or `rows` does not hold
/// `out.len()` packed rows of their width.
pub fn dot_rows_packed(ty: GgmlType, rows: &[u8], acts: &Q8Acts, out: &mut [f32]) {
    let isa = Isa::active();
    assert!(
        usable_on(isa, ty, acts.len()),
        "{ty} rows of {} are not packed here",
        acts.len()
    );
    assert!(acts.arranged(), "activations not arranged");
    let rb = acts.len() / QK * ty.block_bytes();
    assert_eq!(
        rows.len(),
        rb * out.len(),
        "{ty} packed rows do not match the activations"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `usable_on` checked that the CPU runs `isa`; the shapes were
    // checked above.
    unsafe {
        match (isa, ty) {
            (Isa::Avx512Vnni, _) => x86::packed_vnni(ty, rows, rb, acts, out),
            (_, GgmlType::Q8_0) => x86::packed_avx2::<true>(ty, rows, rb, acts, out),
            _ => x86::packed_avx2::<false>(ty, rows, rb, acts, out),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{ArrangedRow, GgmlType, Q8Acts, CHUNK};

    /// Dwords `j` of four 128-bit rows per 128-bit half: `out[j]` lane `b`
    /// (of 4) is dword `j` of row `b`.
    #[inline(always)]
    unsafe fn transpose4(v: [__m256i; 4]) -> [__m256i; 4] {
        let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
        let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
        let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
        let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
        [
            _mm256_unpacklo_epi64(t0, t2),
            _mm256_unpackhi_epi64(t0, t2),
            _mm256_unpacklo_epi64(t1, t3),
            _mm256_unpackhi_epi64(t1, t3),
        ]
    }

    /// Blocks `b` and `b + 4`'s 16 bytes at `off` as one register.
    #[inline(always)]
    unsafe fn pair(src: *const u8, stride: usize, b: usize, off: usize) -> __m256i {
        // SAFETY: the caller's pointer covers eight blocks of `stride` bytes.
        unsafe {
            let lo = _mm_loadu_si128(src.add(b * stride + off) as *const __m128i);
            let hi = _mm_loadu_si128(src.add((b + 4) * stride + off) as *const __m128i);
            _mm256_set_m128i(hi, lo)
        }
    }

    /// The chunk transposition of eight 32-byte code blocks `stride` bytes
    /// apart (`src` at the first code), into 256 bytes at `dst`, each byte
    /// xor 0x80 when `flip`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose32(src: *const u8, stride: usize, dst: *mut u8, flip: bool) {
        // SAFETY: the caller's pointers cover eight blocks and 256 bytes.
        unsafe {
            let x = _mm256_set1_epi8(if flip { -128 } else { 0 });
            for h in 0..2 {
                let v = [
                    pair(src, stride, 0, 16 * h),
                    pair(src, stride, 1, 16 * h),
                    pair(src, stride, 2, 16 * h),
                    pair(src, stride, 3, 16 * h),
                ];
                let o = transpose4(v);
                for (j, o) in o.into_iter().enumerate() {
                    _mm256_storeu_si256(dst.add(32 * (4 * h + j)) as *mut __m256i, _mm256_xor_si256(o, x));
                }
            }
        }
    }

    /// [`super::arrange_row_on`]'s layout: codes (Q4_0 unpacked, Q8_0's
    /// flipped by 128 when `offset`) and widened scales.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn arrange(ty: GgmlType, row: &[u8], offset: bool, codes: &mut [u8], d: &mut [f32]) {
        let bs = ty.block_bytes();
        let low4 = _mm256_set1_epi8(0x0f);
        // SAFETY: `row` holds `codes.len() / 256` chunks of eight blocks of
        // `ty`; `codes` one byte per element and `d` one float per block.
        unsafe {
            for c in 0..codes.len() / CHUNK {
                let src = row.as_ptr().add(c * 8 * bs);
                let dst = codes.as_mut_ptr().add(c * CHUNK);
                let h = |b: usize| (src.add(b * bs) as *const i16).read_unaligned();
                let scales = _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
                _mm256_storeu_ps(d.as_mut_ptr().add(8 * c), scales);
                if ty == GgmlType::Q4_0 {
                    let v = [
                        pair(src, bs, 0, 2),
                        pair(src, bs, 1, 2),
                        pair(src, bs, 2, 2),
                        pair(src, bs, 3, 2),
                    ];
                    let o = transpose4(v);
                    for (j, o) in o.into_iter().enumerate() {
                        let lo = _mm256_and_si256(o, low4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(o, 4), low4);
                        _mm256_storeu_si256(dst.add(32 * j) as *mut __m256i, lo);
                        _mm256_storeu_si256(dst.add(32 * (4 + j)) as *mut __m256i, hi);
                    }
                } else {
                    transpose32(src.add(2), bs, dst, offset);
                }
            }
        }
    }

    /// One chunk of [`super::pack_rows_on`]'s layout.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pack_chunk(ty: GgmlType, src: &[u8], dst: &mut [u8], flip: bool) {
        let bs = ty.block_bytes();
        let codes = 8 * bs - 16;
        // SAFETY: `src` and `dst` hold one chunk (eight blocks) of `ty`.
        unsafe {
            let s = src.as_ptr();
            let d = dst.as_mut_ptr();
            for b in 0..8 {
                (d.add(codes + 2 * b) as *mut u16).write_unaligned((s.add(b * bs) as *const u16).read_unaligned());
            }
            if ty == GgmlType::Q4_0 {
                let v = [
                    pair(s, bs, 0, 2),
                    pair(s, bs, 1, 2),
                    pair(s, bs, 2, 2),
                    pair(s, bs, 3, 2),
                ];
                for (j, o) in transpose4(v).into_iter().enumerate() {
                    _mm256_storeu_si256(d.add(32 * j) as *mut __m256i, o);
                }
            } else {
                transpose32(s.add(2), bs, d, flip);
            }
        }
    }

    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn packed_vnni(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe { packed::<true, false>(ty, rows, rb, acts, out) }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn packed_avx2<const SIGNED: bool>(
        ty: GgmlType,
        rows: &[u8],
        rb: usize,
        acts: &Q8Acts,
        out: &mut [f32],
    ) {
        // SAFETY: forwarded.
        unsafe { packed::<false, SIGNED>(ty, rows, rb, acts, out) }
    }

    /// The packed rows' loop: per chunk, the codes' steps (Q4_0's nibbles
    /// split as they are loaded) against the activation steps, then the
    /// same term as `body`.
    #[inline(always)]
    unsafe fn packed<const VNNI: bool, const SIGNED: bool>(
        ty: GgmlType,
        rows: &[u8],
        rb: usize,
        acts: &Q8Acts,
        out: &mut [f32],
    ) {
        let q4 = ty == GgmlType::Q4_0;
        let count = _mm_cvtsi32_si128(if q4 { 3 } else { 7 });
        let low4 = _mm256_set1_epi8(0x0f);
        let chunks = acts.len() / CHUNK;
        let cb = rb / chunks;
        let codes = cb - 16;
        // SAFETY: each row holds `chunks` chunks of `cb` bytes (the caller
        // checked the sizes); the activations hold `chunks` chunks of codes
        // and eight totals and scales per chunk.
        unsafe {
            for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
                let mut acc = _mm256_setzero_ps();
                for c in 0..chunks {
                    let p = row.as_ptr().add(c * cb);
                    let q0 = acts.qt.as_ptr().add(c * CHUNK) as *const u8;
                    let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                    let w = |j: usize| _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
                    let mut s0 = _mm256_setzero_si256();
                    let mut s1 = _mm256_setzero_si256();
                    if q4 {
                        for j in 0..4 {
                            let v = w(j);
                            let lo = _mm256_and_si256(v, low4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                            s0 = madd::<VNNI, false>(s0, lo, q(j));
                            s1 = madd::<VNNI, false>(s1, hi, q(4 + j));
                        }
                    } else {
                        for j in (0..8).step_by(2) {
                            s0 = madd::<VNNI, SIGNED>(s0, w(j), q(j));
                            s1 = madd::<VNNI, SIGNED>(s1, w(j + 1), q(j + 1));
                        }
                    }
                    let mut i = _mm256_add_epi32(s0, s1);
                    if !SIGNED {
                        let tot = _mm256_loadu_si256(acts.tot.as_ptr().add(8 * c) as *const __m256i);
                        i = _mm256_sub_epi32(i, _mm256_sll_epi32(tot, count));
                    }
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(codes) as *const __m128i));
                    let dx = _mm256_loadu_ps(acts.d.as_ptr().add(8 * c));
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i)));
                }
                *o = crate::gguf::qdot::x86::lane_sums([acc])[0];
            }
        }
    }

    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_vnni<const N: usize>(ty: GgmlType, row: &ArrangedRow, acts: [&Q8Acts; N]) -> [f32; N] {
        // SAFETY: forwarded.
        unsafe { dot::<true, N>(ty, row, acts) }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_avx2<const N: usize>(ty: GgmlType, row: &ArrangedRow, acts: [&Q8Acts; N]) -> [f32; N] {
        // SAFETY: forwarded.
        unsafe { dot::<false, N>(ty, row, acts) }
    }

    /// `acc + Σ` of four-product groups, lane `i` over bytes `4i..4i + 4`.
    #[inline(always)]
    unsafe fn madd<const VNNI: bool, const SIGNED: bool>(acc: __m256i, w: __m256i, q: __m256i) -> __m256i {
        if VNNI {
            _mm256_dpbusd_epi32(acc, w, q)
        } else {
            let (w, q) = if SIGNED {
                // |w| times q·sign(w): unsigned by signed, exact.
                (_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w))
            } else {
                (w, q)
            };
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), _mm256_set1_epi16(1)))
        }
    }

    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn many_vnni(ty: GgmlType, row: &ArrangedRow, acts: &[&Q8Acts], out: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe { many::<true>(ty, row, acts, out) }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn many_avx2(ty: GgmlType, row: &ArrangedRow, acts: &[&Q8Acts], out: &mut [f32]) {
        // SAFETY: forwarded.
        unsafe { many::<false>(ty, row, acts, out) }
    }

    /// Quads of activation rows, then the one to three left.
    #[inline(always)]
    unsafe fn many<const VNNI: bool>(ty: GgmlType, row: &ArrangedRow, acts: &[&Q8Acts], out: &mut [f32]) {
        let n = acts.len();
        let mut t = 0;
        // SAFETY (every call): forwarded; `t + N <= n` indexes `acts` and `out`.
        unsafe {
            while t + 4 <= n {
                let v = dot::<VNNI, 4>(ty, row, [acts[t], acts[t + 1], acts[t + 2], acts[t + 3]]);
                out[t..t + 4].copy_from_slice(&v);
                t += 4;
            }
            match n - t {
                1 => out[t..].copy_from_slice(&dot::<VNNI, 1>(ty, row, [acts[t]])),
                2 => out[t..].copy_from_slice(&dot::<VNNI, 2>(ty, row, [acts[t], acts[t + 1]])),
                3 => out[t..].copy_from_slice(&dot::<VNNI, 3>(ty, row, [acts[t], acts[t + 1], acts[t + 2]])),
                _ => {}
            }
        }
    }

    #[inline(always)]
    unsafe fn dot<const VNNI: bool, const N: usize>(ty: GgmlType, row: &ArrangedRow, acts: [&Q8Acts; N]) -> [f32; N] {
        if ty == GgmlType::Q8_0 && !VNNI {
            // SAFETY: forwarded.
            unsafe { body::<VNNI, true, N>(ty, row, acts) }
        } else {
            // SAFETY: forwarded.
            unsafe { body::<VNNI, false, N>(ty, row, acts) }
        }
    }

    /// The chunk loop: block `b`'s integer sum in lane `b`, less the
    /// activation total times the type's offset (Q4_0's 8; VNNI's Q8_0
    /// codes carry +128), then [`super::super::combine`]'s term and lane sums.
    #[inline(always)]
    unsafe fn body<const VNNI: bool, const SIGNED: bool, const N: usize>(
        ty: GgmlType,
        row: &ArrangedRow,
        acts: [&Q8Acts; N],
    ) -> [f32; N] {
        // Q4_0's offset 8, VNNI's Q8_0 offset 128 (AVX2's signed Q8_0 has none).
        let shift = if ty == GgmlType::Q4_0 { 3 } else { 7 };
        let count = _mm_cvtsi32_si128(shift);
        let mut acc = [_mm256_setzero_ps(); N];
        // SAFETY: every pointer below stays inside `row.codes`, `row.d` and
        // the activations' `qt`, `tot`, `d`, whose lengths the caller
        // checked equal (codes and `qt` one byte per element, the others one
        // entry per block).
        unsafe {
            for c in 0..row.codes.len() / CHUNK {
                let w0 = row.codes.as_ptr().add(c * CHUNK);
                let mut w = [_mm256_setzero_si256(); 8];
                for (j, w) in w.iter_mut().enumerate() {
                    *w = _mm256_loadu_si256(w0.add(32 * j) as *const __m256i);
                }
                let dw = _mm256_loadu_ps(row.d.as_ptr().add(8 * c));
                for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                    let q0 = a.qt.as_ptr().add(c * CHUNK) as *const u8;
                    let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                    let mut s0 = _mm256_setzero_si256();
                    let mut s1 = _mm256_setzero_si256();
                    for j in (0..8).step_by(2) {
                        s0 = madd::<VNNI, SIGNED>(s0, w[j], q(j));
                        s1 = madd::<VNNI, SIGNED>(s1, w[j + 1], q(j + 1));
                    }
                    let mut i = _mm256_add_epi32(s0, s1);
                    if !SIGNED {
                        let tot = _mm256_loadu_si256(a.tot.as_ptr().add(8 * c) as *const __m256i);
                        i = _mm256_sub_epi32(i, _mm256_sll_epi32(tot, count));
                    }
                    let dx = _mm256_loadu_ps(a.d.as_ptr().add(8 * c));
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i)));
                }
            }
            crate::gguf::qdot::x86::lane_sums(acc)
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::gguf::dot::tests::random_row;
    use crate::gguf::qdot::dot_on;

    #[test]
    fn arranged_products_equal_the_row_dot_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut ran = false;
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            if !isa.runs() {
                continue;
            }
            for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
                for case in 0..12 {
                    let cols = CHUNK * rng.gen_range(1..=8);
                    let row = random_row(&mut rng, ty, cols);
                    let mut acts: Vec<Q8Acts> = (0..4)
                        .map(|n| {
                            let x: Vec<f32> = (0..cols)
                                .map(|i| match (case + n) % 4 {
                                    // Extreme codes: ±127 everywhere.
                                    0 => {
                                        if i % 3 == 0 {
                                            -1.0
                                        } else {
                                            1.0
                                        }
                                    }
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
                    let got = dot4_arranged(&arranged, [&acts[0], &acts[1], &acts[2], &acts[3]]);
                    for (n, a) in acts.iter().enumerate() {
                        let want = dot_on(Isa::Scalar, ty, &row, a);
                        assert_eq!(got[n].to_bits(), want.to_bits(), "{isa:?} {ty} cols {cols} act {n}");
                    }
                    // Many rows per call (quads, then the rest): the same bits.
                    let many: Vec<&Q8Acts> = [0, 1, 2, 3, 0, 2, 1].iter().map(|&i| &acts[i]).collect();
                    let mut out = vec![0.0f32; many.len()];
                    dot_many_arranged(&arranged, &many, &mut out);
                    for (o, &i) in out.iter().zip(&[0usize, 1, 2, 3, 0, 2, 1]) {
                        assert_eq!(o.to_bits(), got[i].to_bits());
                    }
                    // Fewer rows per call: the same bits.
                    assert_eq!(dot_arranged(&arranged, [&acts[1]])[0].to_bits(), got[1].to_bits());
                    let two = dot_arranged(&arranged, [&acts[2], &acts[0]]);
                    assert_eq!(two.map(f32::to_bits), [got[2].to_bits(), got[0].to_bits()]);
                    let three = dot_arranged(&arranged, [&acts[3], &acts[1], &acts[2]]);
                    assert_eq!(three.map(f32::to_bits), [got[3], got[1], got[2]].map(f32::to_bits));
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
            let got = dot4_arranged(&arranged, [&a, &a, &a, &a]);
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
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
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
        let x: Vec<f32> = (0..2 * CHUNK).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut a = Q8Acts::new(&x);
        a.arrange();
        let src: Vec<u8> = a.qs.iter().map(|&q| q as u8).collect();
        let mut want = vec![0u8; src.len()];
        transpose_scalar(&src, &mut want);
        assert_eq!(a.qt.iter().map(|&q| q as u8).collect::<Vec<_>>(), want);
    }

    #[test]
    fn packed_rows_give_the_row_dot_bits() {
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        // Only the active instruction set multiplies packed rows (the layout
        // is chosen at load); the AVX2 layout is checked through `pack_rows_on`.
        let isa = Isa::active();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
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
                    // The AVX2 layout differs only by Q8_0's offset.
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
    fn vector_packing_equals_the_scalar_one() {
        if !Isa::Avx2.runs() {
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
            for isa in [Isa::Avx2, Isa::Avx512Vnni] {
                if !isa.runs() {
                    continue;
                }
                let (rows, cols) = (70, 3 * CHUNK);
                let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
                let mut want = vec![0u8; data.len()];
                pack_scalar(ty, &data, isa == Isa::Avx512Vnni && ty == GgmlType::Q8_0, &mut want);
                assert!(pack_rows_on(isa, ty, &data, rows, cols) == want, "{ty} {isa:?}");
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
    fn only_whole_chunks_of_q8_0_and_q4_0_are_usable() {
        assert!(!usable(GgmlType::Q4_K, 4096));
        assert!(!usable(GgmlType::Q8_0, 32 * 9));
        assert!(!usable(GgmlType::Q8_0, 0));
        assert_eq!(
            usable(GgmlType::Q8_0, 2048),
            matches!(Isa::active(), Isa::Avx2 | Isa::Avx512Vnni)
        );
    }
}
