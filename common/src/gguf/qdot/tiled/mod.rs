//! Matrix-matrix products (prefill) of Q8_0, Q4_0, Q5_0, MXFP4, IQ4 and
//! the K-quant rows on x86: the same definition and bits as
//! [`super::dot`], with the data laid out so that no block needs a
//! horizontal fold.
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
//!   MXFP4's looked up to their signed values, Q8_0's and MXFP4's offset
//!   by 128 for `vpdpbusd`; a Q4_K super-block is one chunk,
//!   its sub-blocks the eight blocks) and widened scales (Q4_K: `d`,
//!   `dmin` and the 6-bit scales and mins) into an
//!   [`ArrangedRow`], once per row per product, shared by every activation
//!   row it meets.
//! - [`dot_many_arranged`]: one arranged row with any number of activation
//!   rows ([`ArrangedActs`], checked once), four at a time;
//!   [`dot_many_packed`] the same from a row of a packed copy;
//!   [`dot_many_packed_ahead`] (AVX2: Q4_K, Q5_K, IQ4_XS) with the row's
//!   scale factors formed once ([`scales_ahead`]) for all its passes. A Q6_K row
//!   is arranged by packing it ([`q6k`]'s layout is already transposed:
//!   lane `b` of the first four steps holds sub-block `b`'s first half,
//!   of the last four its second half, each with its own scale).
//!
//! - Decode: [`pack_rows`] stores whole matrices in the same transposed
//!   order but still packed (Q4_0's and MXFP4's nibbles in pairs, the
//!   eight f16 scales or E8M0 exponents of a chunk after its codes: the
//!   GGUF row size exactly), once at load;
//!   [`dot_rows_packed`] multiplies them with one activation row. Q4_K
//!   ([`q4k`]: nibble pairs in the transposed order, the 6-bit scales
//!   decoded per chunk in registers) and Q6_K (the output head of
//!   llama.cpp's Q4_0 files; [`q6k`]: its 6-bit codes split into nibble
//!   and top-bit steps) are packed the same way, the GGUF's size. So are
//!   - IQ4_NL: Q4_0's packing, the nibbles looked up in `kvalues_iq4nl`
//!     as MXFP4's are in theirs;
//!   - IQ4_XS ([`iq4xs`]): Q4_0's nibble steps, a super-block per chunk,
//!     looked up likewise, its `d` and 6-bit sub-block scales after them;
//!   - Q2_K and Q3_K ([`q23k`]): 2-bit codes four to a byte in two
//!     registers, Q3_K's third bits in a third; Q6_K's half sums and terms;
//!   - Q5_K ([`q5k`]): Q4_K's packing with the fifth bits in one more
//!     register.
//!
//! Q5_0 rows are not packed: [`arrange_row`] lays each out as the Q8_0 row
//! it equals ([`q5_0`]: the same scale, codes `q − 16`, the same integer
//! sums and bits), for prefill; decode folds them as stored. Q4_1 and Q5_1
//! rows likewise, with their own term (a min per block, [`q4_1`]).
//!
//! Rows of the 32-element types (Q8_0, Q4_0, MXFP4, IQ4_NL) need not be whole
//! chunks: gpt-oss's 2880 columns are 11 chunks and two blocks, MLA's
//! per-head `attn_k_b` rows 192 columns, no whole chunk at all. The `k`
//! blocks past the last whole chunk (fewer than eight) are a *tail*, laid
//! out like a chunk of `k` lanes ([`pack_tail`]: their scales first, then
//! the steps of `4k` bytes; the activations' tail the same,
//! [`Q8Acts::arrange`]). The kernels read it with masked loads into lanes
//! `0..k` and add its terms into those lanes only, before the one lane
//! reduction, exactly as [`super::dot`] treats a row's partial last chunk.
//!
//! Integer sums are exact in any order and the float part is
//! [`super::combine`]'s operations in its order, so results equal
//! [`super::dot`] bit for bit (tested against it on every instruction set
//! this CPU runs).

use super::super::types::{e8m0_to_f32_half, f16_le, scale_min_k4, GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4, QK};
use super::Q8Acts;
use crate::Isa;

/// Elements per chunk: eight 32-element blocks.
pub const CHUNK: usize = 8 * QK;

pub mod iq4xs;
pub mod q23k;
mod q4_1;
pub mod q4k;
mod q5_0;
pub mod q5k;
pub mod q6k;

/// Whether [`pack_rows`] and [`dot_rows_packed`] (decode) take rows of `ty`
/// with `cols` elements here: the same rows as [`usable`].
pub fn packable(ty: GgmlType, cols: usize) -> bool {
    packable_on(Isa::active(), ty, cols)
}

/// [`packable`] for a chosen instruction set (which this CPU must run).
pub fn packable_on(isa: Isa, ty: GgmlType, cols: usize) -> bool {
    // Q5_0 is arranged as Q8_0 ([`q5_0`]), which a packed copy would take
    // the size of; Q4_1 and Q5_1 are arranged per product only ([`q4_1`]).
    !matches!(ty, GgmlType::Q5_0 | GgmlType::Q4_1 | GgmlType::Q5_1) && usable_on(isa, ty, cols)
}

/// Whether [`dot_many_arranged`] runs rows of `ty` with `cols` elements here:
/// Q8_0, Q4_0, Q5_0 (arranged as Q8_0, [`q5_0`]), Q4_1, Q5_1 ([`q4_1`]),
/// MXFP4 or IQ4_NL rows of whole blocks (whole chunks and up to seven blocks past them, or fewer
/// blocks than a chunk), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS rows (whole
/// super-blocks, so whole chunks), on an AVX2 or AVX-512 VNNI CPU (the
/// active instruction set, [`Isa::active`]).
pub fn usable(ty: GgmlType, cols: usize) -> bool {
    usable_on(Isa::active(), ty, cols)
}

/// [`usable`] for a chosen instruction set (which this CPU must run).
pub fn usable_on(isa: Isa, ty: GgmlType, cols: usize) -> bool {
    let width = match ty {
        GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::MXFP4
        | GgmlType::IQ4_NL => cols > 0 && cols.is_multiple_of(QK),
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS => {
            cols > 0 && cols.is_multiple_of(CHUNK)
        }
        _ => false,
    };
    width && matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) && isa.runs()
}

/// Bytes of one whole chunk of `ty` (eight blocks, or one super-block).
fn chunk_bytes(ty: GgmlType) -> usize {
    CHUNK / ty.block_elems() * ty.block_bytes()
}

/// Bytes before the codes of a block of a 32-element type: the f16 scale
/// (Q8_0, Q4_0), MXFP4's exponent byte.
fn head(ty: GgmlType) -> usize {
    if ty == GgmlType::MXFP4 {
        1
    } else {
        2
    }
}

/// Whether arranging a row of `ty` for each product ([`arrange_row`]) pays
/// against the folding kernel ([`super::dot4`]) when there is no packed
/// copy: not for Q6_K, whose arrangement is the scalar decode packing
/// (measured 3.5x slower than `dot4` for 16 activation rows; a packed copy
/// is 1.6x faster than `dot4`), nor for Q2_K, Q3_K, Q5_K and IQ4_XS,
/// arranged the same way.
pub fn arranging_pays(ty: GgmlType) -> bool {
    !arranged_by_packing(ty)
}

/// Whether [`arrange_row`] lays a row of `ty` out by packing it (its
/// decode layout is already the transposed order).
fn arranged_by_packing(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS
    )
}

/// One weight row laid out for [`dot_many_arranged`] (reused between rows:
/// arranging allocates only when a row is wider than any before).
#[derive(Clone, Debug, Default)]
pub struct ArrangedRow {
    ty: Option<GgmlType>,
    isa: Option<Isa>,
    /// Elements.
    cols: usize,
    /// Per chunk, eight steps of 32 code bytes (lane `b` = block `b`);
    /// Q6_K: the row in [`q6k`]'s packed layout.
    codes: Vec<u8>,
    /// Each block's scale, widened (Q4_K: the super-block's `d` in all
    /// eight lanes of its chunk).
    d: Vec<f32>,
    /// Q4_K: per chunk, the eight sub-blocks' 6-bit scales, then their mins.
    k_scales: Vec<i32>,
    /// Q4_K: per chunk, the super-block's `dmin` in all eight lanes.
    dmin: Vec<f32>,
    /// The blocks past the last whole chunk in the packed tail layout
    /// ([`pack_tail`]).
    tail: Vec<u8>,
}

impl Q8Acts {
    /// Adds the chunk-transposed codes and block totals [`dot_many_arranged`]
    /// reads (requantizing clears them). The `k` blocks past the last whole
    /// chunk are transposed as a chunk of `k` lanes (step `j`: `4k` bytes,
    /// bytes `4j..4j + 4` of each block), as [`pack_tail`] lays out a
    /// weight row's.
    pub fn arrange(&mut self) {
        let whole = self.len() / CHUNK * CHUNK;
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
        transpose_blocks(&src[whole..], &mut dst[whole..], false);
        self.tot.clear();
        self.tot.extend(self.s16.chunks_exact(2).map(|h| h[0] + h[1]));
        self.toff.clear();
        self.toff.extend(self.tot.iter().map(|t| -128 * t));
        q6k::half_offsets(&self.s16, &mut self.off6);
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
        transpose_blocks(src, dst, false);
    }
}

/// `k` blocks of 32 code bytes stored back to back (`src`) as a chunk of
/// `k` lanes (`dst`): step `j` (`4k` bytes) holds bytes `4j..4j + 4` of
/// each block, each byte xor 0x80 when `flip`. With `k = 8` this is the
/// chunk transposition; a tail's is the same with fewer lanes.
fn transpose_blocks(src: &[u8], dst: &mut [u8], flip: bool) {
    transpose_lanes(src, QK, QK / 4, dst, flip)
}

/// [`transpose_blocks`] for blocks `stride` bytes apart whose first
/// `4 * steps` bytes are codes (`src` at the first code).
fn transpose_lanes(src: &[u8], stride: usize, steps: usize, dst: &mut [u8], flip: bool) {
    let k = dst.len() / (4 * steps);
    for b in 0..k {
        for j in 0..steps {
            for x in 0..4 {
                let v = src[stride * b + 4 * j + x];
                dst[4 * k * j + 4 * b + x] = if flip { v ^ 0x80 } else { v };
            }
        }
    }
}

/// The `k` blocks of a 32-element type past a row's whole chunks (`src`,
/// as stored) in the packed tail layout (`dst`, the same size): the `k`
/// scales (f16, MXFP4's exponent bytes) first, then the codes as a chunk
/// of `k` lanes ([`transpose_lanes`]: Q8_0's eight steps of code bytes,
/// xor 0x80 when `flip`; Q4_0's and MXFP4's four steps of nibble pairs).
/// The kernels load the scales with one 16-byte read from the tail's
/// start, which the codes after them keep inside the row.
pub(crate) fn pack_tail(ty: GgmlType, src: &[u8], dst: &mut [u8], flip: bool) {
    let (bs, h) = (ty.block_bytes(), head(ty));
    let k = src.len() / bs;
    debug_assert!(k < 8 && ty.block_elems() == QK && dst.len() == src.len());
    for b in 0..k {
        dst[h * b..h * (b + 1)].copy_from_slice(&src[bs * b..bs * b + h]);
    }
    if k > 0 {
        transpose_lanes(&src[h..], bs, (bs - h) / 4, &mut dst[h * k..], flip);
    }
}

thread_local! {
    /// A Q5_0 row converted for [`arrange_row_on`] (reused between rows).
    static Q5_0_AS_Q8_0: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Lays out `row` (`cols` elements of `ty`) for [`dot_many_arranged`] on the
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
    let cols = row.len() / bs * ty.block_elems();
    assert!(
        usable_on(isa, ty, cols),
        "{ty} rows of {cols} have no arranged product on {isa:?}"
    );
    assert_eq!(row.len() % bs, 0, "{ty} row of {} bytes is not whole blocks", row.len());
    if ty == GgmlType::Q5_0 {
        // The Q8_0 row it equals, bit for bit in every product.
        return Q5_0_AS_Q8_0.with_borrow_mut(|q8| {
            q5_0::as_q8_0(isa, row, q8);
            arrange_row_on(isa, GgmlType::Q8_0, q8, out)
        });
    }
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        return q4_1::arrange(isa, ty, row, out);
    }
    out.ty = Some(ty);
    out.isa = Some(isa);
    out.cols = cols;
    let whole = cols / CHUNK * chunk_bytes(ty);
    out.tail.clear();
    out.tail.resize(row.len() - whole, 0);
    if ty.block_elems() == QK {
        pack_tail(
            ty,
            &row[whole..],
            &mut out.tail,
            isa == Isa::Avx512Vnni && ty == GgmlType::Q8_0,
        );
    }
    if arranged_by_packing(ty) {
        // The decode packing is already the transposed order.
        out.codes.resize(row.len(), 0);
        let bs = ty.block_bytes();
        for (s, d) in row.chunks_exact(bs).zip(out.codes.chunks_exact_mut(bs)) {
            match ty {
                GgmlType::Q6_K => q6k::pack_block(s, d),
                GgmlType::IQ4_XS => iq4xs::pack_block(s, d),
                GgmlType::Q5_K => q5k::pack_block(s, d),
                _ => q23k::pack_block(ty, s, d),
            }
        }
        return;
    }
    out.codes.resize(cols / CHUNK * CHUNK, 0);
    out.d.resize(cols / CHUNK * 8, 0.0);
    if ty == GgmlType::Q4_K {
        return arrange_q4_k(isa, row, out);
    }
    let offset = isa == Isa::Avx512Vnni && matches!(ty, GgmlType::Q8_0 | GgmlType::MXFP4 | GgmlType::IQ4_NL);
    let row = &row[..whole];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `usable_on` checked that the CPU runs AVX2 (both ISAs
    // include it, and F16C); the buffers hold the row's codes and scales.
    unsafe {
        x86::arrange(ty, row, offset, &mut out.codes, &mut out.d)
    }
    #[cfg(not(target_arch = "x86_64"))]
    arrange_scalar(ty, row, offset, &mut out.codes, &mut out.d);
}

/// A Q4_K row (one super-block per chunk): the nibbles of sub-block `b`
/// (elements `32b..32b + 32`; sub-block `2i` the low nibbles of
/// `qs[32i..32i + 32]`, `2i + 1` the high ones) in the transposed order,
/// `d` and `dmin` in every lane, and the 6-bit scales and mins widened.
fn arrange_q4_k(isa: Isa, row: &[u8], out: &mut ArrangedRow) {
    let chunks = out.codes.len() / CHUNK;
    out.k_scales.resize(16 * chunks, 0);
    out.dmin.resize(8 * chunks, 0.0);
    let mut natural = [0u8; CHUNK];
    for (c, sb) in row.chunks_exact(GgmlType::Q4_K.block_bytes()).enumerate() {
        let (d, dmin) = (f16_le([sb[0], sb[1]]), f16_le([sb[2], sb[3]]));
        out.d[8 * c..8 * c + 8].fill(d);
        out.dmin[8 * c..8 * c + 8].fill(dmin);
        let scales: &[u8; 12] = sb[4..16].try_into().expect("12 scale bytes");
        for b in 0..8 {
            let (sc, mn) = scale_min_k4(scales, b);
            out.k_scales[16 * c + b] = sc as i32;
            out.k_scales[16 * c + 8 + b] = mn as i32;
        }
        for (g, qs) in sb[16..].chunks_exact(32).enumerate() {
            for (l, &q) in qs.iter().enumerate() {
                natural[64 * g + l] = q & 0x0f;
                natural[64 * g + 32 + l] = q >> 4;
            }
        }
        let dst = &mut out.codes[c * CHUNK..(c + 1) * CHUNK];
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) {
            // SAFETY: `usable_on` checked that the CPU runs AVX2; eight
            // 32-byte blocks in, 256 bytes out.
            unsafe { x86::transpose32(natural.as_ptr(), QK, dst.as_mut_ptr(), false) };
            continue;
        }
        let _ = isa;
        transpose_scalar(&natural, dst);
    }
}

/// [`arrange_row_on`]'s layout of whole chunks (`row`), element by
/// element (the reference of the vector version); `offset` flips Q8_0's
/// and MXFP4's codes by 128.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn arrange_scalar(ty: GgmlType, row: &[u8], offset: bool, codes: &mut [u8], d: &mut [f32]) {
    let bs = ty.block_bytes();
    for (o, b) in d.iter_mut().zip(row.chunks_exact(bs)) {
        *o = if ty == GgmlType::MXFP4 {
            e8m0_to_f32_half(b[0])
        } else {
            f16_le([b[0], b[1]])
        };
    }
    for (chunk, dst) in row.chunks_exact(8 * bs).zip(codes.chunks_exact_mut(CHUNK)) {
        for b in 0..8 {
            let codes = block_codes(ty, &chunk[b * bs..(b + 1) * bs]);
            for j in 0..8 {
                for k in 0..4 {
                    let c = codes[4 * j + k];
                    let signed = matches!(ty, GgmlType::Q8_0 | GgmlType::MXFP4 | GgmlType::IQ4_NL);
                    dst[32 * j + 4 * b + k] = if offset && signed { c ^ 0x80 } else { c };
                }
            }
        }
    }
}

/// A block's 32 codes as the multiply takes them: Q4_0's nibbles (element
/// `i < 16` the low nibble of byte `i`, `16 + i` its high nibble), MXFP4's
/// and IQ4_NL's nibbles looked up in [`KVALUES_MXFP4`] / [`KVALUES_IQ4NL`]
/// (signed bytes), Q8_0's bytes.
fn block_codes(ty: GgmlType, block: &[u8]) -> [u8; QK] {
    let mut c = [0u8; QK];
    match ty {
        GgmlType::Q4_0 => {
            for i in 0..16 {
                c[i] = block[2 + i] & 0x0f;
                c[16 + i] = block[2 + i] >> 4;
            }
        }
        GgmlType::MXFP4 => {
            for i in 0..16 {
                c[i] = KVALUES_MXFP4[(block[1 + i] & 0x0f) as usize] as u8;
                c[16 + i] = KVALUES_MXFP4[(block[1 + i] >> 4) as usize] as u8;
            }
        }
        GgmlType::IQ4_NL => {
            for i in 0..16 {
                c[i] = KVALUES_IQ4NL[(block[2 + i] & 0x0f) as usize] as u8;
                c[16 + i] = KVALUES_IQ4NL[(block[2 + i] >> 4) as usize] as u8;
            }
        }
        _ => c.copy_from_slice(&block[2..2 + QK]),
    }
    c
}

/// Arranged activation rows of one width, checked once for every weight
/// row of a product to meet them.
#[derive(Clone, Copy, Debug)]
pub struct ArrangedActs<'a> {
    acts: &'a [&'a Q8Acts],
    width: usize,
}

impl<'a> ArrangedActs<'a> {
    /// # Panics
    /// If a row is not arranged ([`Q8Acts::arrange`]), or the rows differ
    /// in width.
    pub fn new(acts: &'a [&'a Q8Acts]) -> Self {
        let width = acts.first().map_or(0, |a| a.len());
        for a in acts {
            assert!(a.arranged(), "activations not arranged");
            assert_eq!(a.len(), width, "activation rows of different widths");
        }
        ArrangedActs { acts, width }
    }

    /// Rows `range` (checked when the whole batch was).
    ///
    /// # Panics
    /// If `range` lies outside the rows.
    pub fn range(&self, range: std::ops::Range<usize>) -> ArrangedActs<'a> {
        ArrangedActs {
            acts: &self.acts[range],
            width: self.width,
        }
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.acts.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.acts.is_empty()
    }
}

/// `out[t]` = the dot product of the arranged row with activation row `t`,
/// for any number of rows: four at a time, then the rest, with one check
/// and one dispatch for all (what matrix products call per weight row).
/// `out[t]` is the bits [`super::dot`] gives for the original row and
/// activation row `t`.
///
/// # Panics
/// If the row was never arranged, the activations were arranged for
/// another width, or `out` and `acts` differ in length.
pub fn dot_many_arranged(row: &ArrangedRow, acts: &ArrangedActs<'_>, out: &mut [f32]) {
    let ty = row.ty.expect("an arranged row");
    assert_eq!(acts.len(), out.len(), "one output per activation row");
    if acts.is_empty() {
        return;
    }
    assert_eq!(acts.width, row.cols, "activations do not match the row");
    #[cfg(target_arch = "x86_64")]
    if arranged_by_packing(ty) {
        // SAFETY: as below; the codes are one packed row of the width.
        return unsafe {
            let (rb, out) = (row.codes.len(), x86::OutRows::one(out));
            match row.isa {
                Some(Isa::Avx512Vnni) => x86::many_packed_vnni(ty, &row.codes, rb, acts.acts, out),
                _ => x86::many_packed_avx2(ty, &row.codes, rb, acts.acts, out),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    match row.isa {
        // SAFETY: rows are only arranged for an instruction set this CPU
        // runs (`usable_on`); the widths were checked above.
        Some(Isa::Avx512Vnni) => return unsafe { x86::many_vnni(ty, row, &row.tail, acts.acts, out) },
        // SAFETY: as above.
        Some(Isa::Avx2) => return unsafe { x86::many_avx2(ty, row, &row.tail, acts.acts, out) },
        _ => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ty;
    unreachable!("arrange_row only runs where `usable` holds")
}

/// [`dot_many_arranged`] for one row of a packed copy ([`pack_rows`] on
/// the active instruction set): the prefill of a repacked matrix, with no
/// arranging per row and the same bits.
///
/// # Panics
/// If [`usable`] is false for `ty` and the activations' width, `row` is
/// not one packed row of that width, or `out` and `acts` differ in length.
pub fn dot_many_packed(ty: GgmlType, row: &[u8], acts: &ArrangedActs<'_>, out: &mut [f32]) {
    dot_many_packed_on(Isa::active(), ty, row, acts, out)
}

/// [`dot_many_packed`] on a chosen instruction set, for a row packed on it
/// ([`pack_rows_on`]; tests and benchmarks).
///
/// # Panics
/// As [`dot_many_packed`], and if [`usable_on`] is false for `isa`.
pub fn dot_many_packed_on(isa: Isa, ty: GgmlType, row: &[u8], acts: &ArrangedActs<'_>, out: &mut [f32]) {
    check_one_row(ty, row, acts, out);
    let (stride, before) = (0, &mut |_| {});
    dot_many_packed_rows_on(isa, ty, row, acts, TileOut { out, stride, before })
}

/// The one-row products' checks: an output per activation row, and `row`
/// one packed row of their width.
fn check_one_row(ty: GgmlType, row: &[u8], acts: &ArrangedActs<'_>, out: &[f32]) {
    assert_eq!(acts.len(), out.len(), "one output per activation row");
    if !acts.is_empty() {
        assert_eq!(
            Some(row.len()),
            ty.row_bytes(acts.width),
            "{ty} packed row does not match the activations"
        );
    }
}

/// Where a product of consecutive weight rows puts its outputs: row `i`'s
/// at `out[i * stride..][..n]` (`n` activation rows), `before(i)` run
/// before row `i` (a tile's prefetch of the next tile).
pub struct TileOut<'a> {
    pub out: &'a mut [f32],
    pub stride: usize,
    pub before: &'a mut dyn FnMut(usize),
}

/// [`dot_many_packed`] for consecutive packed rows (`rows`, whole rows of
/// the activations' width), the outputs where `tile` says: one check and
/// one dispatch for all the rows, the same bits as one call a row.
///
/// # Panics
/// As [`dot_many_packed`], if `rows` is not whole packed rows, or `out`
/// does not reach the last row's outputs.
pub fn dot_many_packed_rows(ty: GgmlType, rows: &[u8], acts: &ArrangedActs<'_>, tile: TileOut<'_>) {
    dot_many_packed_rows_on(Isa::active(), ty, rows, acts, tile)
}

/// [`dot_many_packed_rows`] on a chosen instruction set, for rows packed
/// on it ([`pack_rows_on`]; tests and benchmarks).
///
/// # Panics
/// As [`dot_many_packed_rows`], and if [`usable_on`] is false for `isa`.
pub fn dot_many_packed_rows_on(isa: Isa, ty: GgmlType, rows: &[u8], acts: &ArrangedActs<'_>, tile: TileOut<'_>) {
    if acts.is_empty() {
        return;
    }
    assert!(
        usable_on(isa, ty, acts.width),
        "{ty} rows of {} are not packed here",
        acts.width
    );
    let rb = row_bytes_for(ty, rows, acts, &tile);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `usable_on` checked that the CPU runs `isa`; the widths and
    // the outputs' reach were checked above.
    unsafe {
        let out = x86::OutRows::of(tile);
        if isa == Isa::Avx512Vnni {
            x86::many_packed_vnni(ty, rows, rb, acts.acts, out)
        } else {
            x86::many_packed_avx2(ty, rows, rb, acts.acts, out)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rb, tile);
}

/// The bytes of one packed row of `ty` at the activations' width, after
/// checking that `rows` holds whole rows and that `out` reaches row `i`'s
/// outputs at `i * stride` for every row (`tile`).
fn row_bytes_for(ty: GgmlType, rows: &[u8], acts: &ArrangedActs<'_>, tile: &TileOut<'_>) -> usize {
    let (out, stride) = (&tile.out, tile.stride);
    let rb = ty.row_bytes(acts.width).filter(|&rb| rb > 0);
    let rb = rb.unwrap_or_else(|| panic!("{ty} rows of {} are not packed here", acts.width));
    assert!(
        !rows.is_empty() && rows.len().is_multiple_of(rb),
        "{ty} packed rows do not match the activations"
    );
    let last = (rows.len() / rb - 1) * stride + acts.len();
    assert!(
        out.len() >= last,
        "{} outputs do not reach the last row's {last}",
        out.len()
    );
    assert!(rows.len() / rb == 1 || stride >= acts.len(), "rows' outputs overlap");
    rb
}

/// Whether a product of packed rows of `ty` with several passes of
/// activation rows pays for forming each row's [`scales_ahead`] once and
/// multiplying through [`dot_many_packed_ahead`]: Q4_K, Q5_K and IQ4_XS on
/// AVX2 (VNNI takes rows in pairs instead, [`pairs_pay`]), whose loop
/// otherwise decodes a chunk's 6-bit scales (and mins) again for every
/// four activation rows.
pub fn scales_ahead_pay(ty: GgmlType, cols: usize) -> bool {
    scales_ahead_pay_on(Isa::active(), ty, cols)
}

/// [`scales_ahead_pay`] for a chosen instruction set.
pub fn scales_ahead_pay_on(isa: Isa, ty: GgmlType, cols: usize) -> bool {
    isa == Isa::Avx2 && scales_per_chunk(ty) > 0 && packable_on(isa, ty, cols)
}

/// Floats per chunk of [`scales_ahead`]: 16 for Q4_K and Q5_K, 8 for
/// IQ4_XS, 0 for the other types.
pub fn scales_per_chunk(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => 16,
        GgmlType::IQ4_XS => 8,
        _ => 0,
    }
}

/// One packed row's per-chunk scale factors into `out`: for Q4_K and Q5_K
/// ([`q4k`], [`q5k`]) eight `d · sc`, then eight `dmin · mn`; for IQ4_XS
/// ([`iq4xs`]) eight `d · (ls - 32)` (each exact: an f16 times an integer
/// of at most 6 bits fits an f32's significand, so the bits of the
/// kernels' own), decoded as the AVX2 loops decode them where the CPU runs
/// AVX2, else by [`scales_ahead_scalar`].
///
/// # Panics
/// If `ty` has none ([`scales_per_chunk`]), `row` is not whole chunks, or
/// `out` is not [`scales_per_chunk`] floats per chunk.
pub fn scales_ahead(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    let (cb, per) = (chunk_bytes(ty), scales_per_chunk(ty));
    assert!(per > 0, "{ty} has no sub-block scales");
    assert!(row.len().is_multiple_of(cb), "{ty} row of whole chunks");
    assert_eq!(out.len(), per * (row.len() / cb), "{per} floats per chunk");
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.runs() {
        // SAFETY: the CPU runs AVX2 (and F16C with it, `Isa::runs`); the
        // row is whole chunks of `ty` and `out` holds `per` floats for each.
        return unsafe { x86::scales_ahead_avx2(ty, row, out) };
    }
    scales_ahead_scalar(ty, row, out)
}

/// [`scales_ahead`] in scalar code: the reference of the vector decoding.
///
/// # Panics
/// As [`scales_ahead`].
pub fn scales_ahead_scalar(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    let (cb, per) = (chunk_bytes(ty), scales_per_chunk(ty));
    assert!(per > 0, "{ty} has no sub-block scales");
    assert!(row.len().is_multiple_of(cb), "{ty} row of whole chunks");
    assert_eq!(out.len(), per * (row.len() / cb), "{per} floats per chunk");
    for (block, o) in row.chunks_exact(cb).zip(out.chunks_exact_mut(per)) {
        if ty == GgmlType::IQ4_XS {
            let d = f16_le([block[128], block[129]]);
            for (o, ls) in o.iter_mut().zip(iq4xs::scales_scalar(block)) {
                *o = d * ls as f32;
            }
            continue;
        }
        // A packed Q5_K block reads as a Q4_K one from byte 32.
        let b = &block[if ty == GgmlType::Q5_K { 32 } else { 0 }..];
        let (sc, mn) = q4k::scales_scalar(b);
        let (d, dmin) = (f16_le([b[140], b[141]]), f16_le([b[142], b[143]]));
        for i in 0..8 {
            (o[i], o[8 + i]) = (d * sc[i] as f32, dmin * mn[i] as f32);
        }
    }
}

/// [`dot_many_packed`] of a packed Q4_K, Q5_K or IQ4_XS row with its
/// [`scales_ahead`] formed ahead (`scales`): the same bits.
///
/// # Panics
/// As [`dot_many_packed`], if [`scales_ahead_pay`] is false, or `scales`
/// is not the row's [`scales_ahead`] length.
pub fn dot_many_packed_ahead(ty: GgmlType, row: &[u8], scales: &[f32], acts: &ArrangedActs<'_>, out: &mut [f32]) {
    dot_many_packed_ahead_on(Isa::active(), ty, row, scales, acts, out)
}

/// [`dot_many_packed_ahead`] on a chosen instruction set (tests,
/// benchmarks).
///
/// # Panics
/// As [`dot_many_packed_ahead`], for `isa`.
pub fn dot_many_packed_ahead_on(
    isa: Isa,
    ty: GgmlType,
    row: &[u8],
    scales: &[f32],
    acts: &ArrangedActs<'_>,
    out: &mut [f32],
) {
    check_one_row(ty, row, acts, out);
    let (stride, before) = (0, &mut |_| {});
    dot_many_packed_ahead_rows_on(isa, ty, row, scales, acts, TileOut { out, stride, before })
}

/// [`dot_many_packed_ahead`] for consecutive packed rows, as
/// [`dot_many_packed_rows`]: `scales` holds each row's [`scales_ahead`]
/// in turn.
///
/// # Panics
/// As [`dot_many_packed_ahead`] and [`dot_many_packed_rows`], and if
/// `scales` is not every row's [`scales_ahead`] length.
pub fn dot_many_packed_ahead_rows(
    ty: GgmlType,
    rows: &[u8],
    scales: &[f32],
    acts: &ArrangedActs<'_>,
    tile: TileOut<'_>,
) {
    dot_many_packed_ahead_rows_on(Isa::active(), ty, rows, scales, acts, tile)
}

/// [`dot_many_packed_ahead_rows`] on a chosen instruction set (tests,
/// benchmarks).
///
/// # Panics
/// As [`dot_many_packed_ahead_rows`], for `isa`.
pub fn dot_many_packed_ahead_rows_on(
    isa: Isa,
    ty: GgmlType,
    rows: &[u8],
    scales: &[f32],
    acts: &ArrangedActs<'_>,
    tile: TileOut<'_>,
) {
    if acts.is_empty() {
        return;
    }
    assert!(
        scales_ahead_pay_on(isa, ty, acts.width),
        "{ty} rows of {} take no scales formed ahead here",
        acts.width
    );
    let rb = row_bytes_for(ty, rows, acts, &tile);
    let per = scales_per_chunk(ty) * (acts.width / CHUNK);
    assert_eq!(scales.len(), per * (rows.len() / rb), "{} floats a row", per);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `scales_ahead_pay_on` checked that the CPU runs AVX2 and the
    // type; the lengths were checked above.
    unsafe {
        x86::many_packed_ahead_avx2(ty, rows, rb, (scales, per), acts.acts, x86::OutRows::of(tile))
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rb, per, tile);
}

/// Whether [`dot_pair_packed`] multiplies two packed rows of `ty` × `cols`
/// in one pass here: on AVX-512 VNNI, packed rows of Q8_0, Q4_0, MXFP4 or
/// IQ4_NL (a tail past the whole chunks added per row after them, as the
/// one-row loop does), IQ4_XS, Q4_K, Q5_K or Q6_K (Q2_K's and Q3_K's half
/// scales and sums take the registers a second row would need; AVX2's
/// sixteen registers hold no second row).
pub fn pairs_pay(ty: GgmlType, cols: usize) -> bool {
    pairs_pay_on(Isa::active(), ty, cols)
}

/// [`pairs_pay`] for a chosen instruction set.
pub fn pairs_pay_on(isa: Isa, ty: GgmlType, cols: usize) -> bool {
    isa == Isa::Avx512Vnni
        && packable_on(isa, ty, cols)
        && matches!(
            ty,
            GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::MXFP4
                | GgmlType::IQ4_NL
                | GgmlType::IQ4_XS
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
}

/// [`dot_many_packed`] of two rows of a packed copy at once (`a`, `b`;
/// results in `out_a`, `out_b`): where [`pairs_pay`], each activation
/// step is loaded once for both rows (a prefill's and a batched decode's
/// products are bounded by those loads: 1.3–1.4 × the products per second
/// of one row at a time for Q8_0 and Q4_0 in `bench_kernels`); elsewhere
/// one row after the other. The bits of [`dot_many_packed`] for each row.
///
/// # Panics
/// As [`dot_many_packed`], for either row, or if the outputs' lengths
/// differ from the activation rows'.
pub fn dot_pair_packed(
    ty: GgmlType,
    (a, b): (&[u8], &[u8]),
    acts: &ArrangedActs<'_>,
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    if !pairs_pay(ty, acts.width) || acts.is_empty() {
        dot_many_packed(ty, a, acts, out_a);
        return dot_many_packed(ty, b, acts, out_b);
    }
    assert_eq!(
        (out_a.len(), out_b.len()),
        (acts.len(), acts.len()),
        "one output per activation row"
    );
    let rb = ty.row_bytes(acts.width);
    assert_eq!(
        (Some(a.len()), Some(b.len())),
        (rb, rb),
        "{ty} packed rows do not match the activations"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `pairs_pay` checked that the CPU runs AVX-512 VNNI and that
    // the rows are whole chunks of a type the pair loop takes; the widths
    // were checked above.
    unsafe {
        x86::pair_packed_vnni(ty, (a, b), acts.acts, out_a, out_b)
    }
}

/// `rows` rows of `ty` × `cols` (`data`: GGUF row order) in the packed
/// transposed layout for the active instruction set, the same size: per
/// whole chunk, the codes' eight steps (Q4_0 and MXFP4: four steps of
/// packed nibble bytes, low nibbles the elements `4j..4j + 4` of each
/// block and high nibbles `16 + 4j..`; Q8_0: eight steps of code bytes,
/// offset by 128 for VNNI), then the chunk's eight f16 scales (MXFP4: its
/// eight exponent bytes); then the blocks past the last whole chunk in the
/// tail layout ([`pack_tail`]). Q6_K: [`q6k`]'s layout; Q4_K: [`q4k`]'s.
///
/// # Panics
/// If [`packable`] is false or `data` does not hold `rows` rows.
pub fn pack_rows(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    pack_rows_on(Isa::active(), ty, data, rows, cols)
}

/// [`pack_rows`] for a chosen instruction set.
pub fn pack_rows_on(isa: Isa, ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    pack_rows_into_on(isa, ty, data, rows, cols, &mut out);
    out
}

/// [`pack_rows`] into `out` (as long as `data`), e.g. memory advised for
/// huge pages.
///
/// # Panics
/// As [`pack_rows`], and if `out` is not as long as `data`.
pub fn pack_rows_into(ty: GgmlType, data: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    pack_rows_into_on(Isa::active(), ty, data, rows, cols, out)
}

fn pack_rows_into_on(isa: Isa, ty: GgmlType, data: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    assert!(
        packable_on(isa, ty, cols),
        "{ty} rows of {cols} cannot be packed on {isa:?}"
    );
    assert_eq!(
        Some(data.len()),
        ty.row_bytes(cols).map(|rb| rb * rows),
        "{ty} data does not hold {rows} rows of {cols}"
    );
    assert_eq!(out.len(), data.len(), "the packed copy is as long as the rows");
    match ty {
        GgmlType::Q6_K => return pack_super_blocks(data, out, q6k::BLOCK, q6k::pack_block),
        GgmlType::Q4_K => return pack_super_blocks(data, out, q4k::BLOCK, q4k::pack_block),
        GgmlType::Q5_K => return pack_super_blocks(data, out, q5k::BLOCK, q5k::pack_block),
        GgmlType::IQ4_XS => return pack_super_blocks(data, out, iq4xs::BLOCK, iq4xs::pack_block),
        GgmlType::Q2_K | GgmlType::Q3_K => {
            return pack_super_blocks(data, out, ty.block_bytes(), |s, d| q23k::pack_block(ty, s, d))
        }
        _ => {}
    }
    if data.is_empty() {
        return;
    }
    let flip = isa == Isa::Avx512Vnni && ty == GgmlType::Q8_0;
    #[cfg(target_arch = "x86_64")]
    {
        use rayon::prelude::*;
        let (cb, rb) = (chunk_bytes(ty), data.len() / rows.max(1));
        let whole = cols / CHUNK * cb;
        // Runs of about 64 chunks per task: the copy of a large matrix on
        // every core.
        let run = rb * (64 / (cols / CHUNK).max(1)).max(1);
        out.par_chunks_mut(run)
            .zip(data.par_chunks(run))
            .for_each(|(dst, src)| {
                for (s, d) in src.chunks_exact(rb).zip(dst.chunks_exact_mut(rb)) {
                    for (s, d) in s[..whole].chunks_exact(cb).zip(d[..whole].chunks_exact_mut(cb)) {
                        // SAFETY: `usable_on` checked that AVX2 runs; `s` and `d`
                        // hold one chunk of `ty`.
                        unsafe { x86::pack_chunk(ty, s, d, flip) };
                    }
                    pack_tail(ty, &s[whole..], &mut d[whole..], flip);
                }
            });
    }
    #[cfg(not(target_arch = "x86_64"))]
    pack_scalar(ty, data, cols, flip, out);
}

/// Whole rows of a super-block type (`data`: blocks of `bs` bytes) packed
/// into `out` block by block with `pack` (a module's `pack_block`), on
/// every core.
fn pack_super_blocks(data: &[u8], out: &mut [u8], bs: usize, pack: impl Fn(&[u8], &mut [u8]) + Sync + Send) {
    use rayon::prelude::*;
    debug_assert_eq!(data.len() % bs, 0);
    out.par_chunks_mut(bs * 256)
        .zip(data.par_chunks(bs * 256))
        .for_each(|(dst, src)| {
            for (s, d) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(bs)) {
                pack(s, d);
            }
        });
}

/// [`pack_rows_on`]'s layout of rows of `cols`, byte by byte (the
/// reference of the vector version).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn pack_scalar(ty: GgmlType, data: &[u8], cols: usize, flip: bool, out: &mut [u8]) {
    let (bs, h) = (ty.block_bytes(), head(ty));
    let (cb, rb) = (8 * bs, ty.row_bytes(cols).expect("whole blocks"));
    let whole = cols / CHUNK * cb;
    for (src, dst) in data.chunks_exact(rb).zip(out.chunks_exact_mut(rb)) {
        for (src, dst) in src[..whole].chunks_exact(cb).zip(dst[..whole].chunks_exact_mut(cb)) {
            let code_bytes = cb - 8 * h;
            for b in 0..8 {
                dst[code_bytes + h * b..code_bytes + h * (b + 1)].copy_from_slice(&src[b * bs..b * bs + h]);
            }
            transpose_lanes(&src[h..], bs, (bs - h) / 4, &mut dst[..code_bytes], flip);
        }
        pack_tail(ty, &src[whole..], &mut dst[whole..], flip);
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
    dot_rows_packed_on(Isa::active(), ty, rows, acts, out)
}

/// [`dot_rows_packed`] on a chosen instruction set, for rows packed on it
/// (tests and benchmarks; Q6_K's layout is the same on both).
///
/// # Panics
/// As [`dot_rows_packed`], and if [`packable_on`] is false for `isa`.
pub fn dot_rows_packed_on(isa: Isa, ty: GgmlType, rows: &[u8], acts: &Q8Acts, out: &mut [f32]) {
    assert!(
        packable_on(isa, ty, acts.len()),
        "{ty} rows of {} are not packed here",
        acts.len()
    );
    assert!(acts.arranged(), "activations not arranged");
    let rb = ty.row_bytes(acts.len()).unwrap_or(0);
    assert_eq!(
        rows.len(),
        rb * out.len(),
        "{ty} packed rows do not match the activations"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `packable_on` checked that the CPU runs `isa`; the shapes were
    // checked above.
    unsafe {
        match (isa, ty) {
            (Isa::Avx512Vnni, GgmlType::Q6_K) => q6k::dot_rows::<true>(rows, rb, acts, out),
            (_, GgmlType::Q6_K) => q6k::dot_rows::<false>(rows, rb, acts, out),
            (Isa::Avx512Vnni, GgmlType::Q2_K | GgmlType::Q3_K) => q23k::dot_rows::<true>(ty, rows, rb, acts, out),
            (_, GgmlType::Q2_K | GgmlType::Q3_K) => q23k::dot_rows::<false>(ty, rows, rb, acts, out),
            (Isa::Avx512Vnni, GgmlType::Q5_K) => x86::rows_by_body_vnni(ty, rows, rb, acts, out),
            (_, GgmlType::Q5_K) => x86::rows_by_body_avx2(ty, rows, rb, acts, out),
            (Isa::Avx512Vnni, _) => x86::packed_vnni(ty, rows, rb, acts, out),
            (_, GgmlType::Q8_0 | GgmlType::MXFP4 | GgmlType::IQ4_XS | GgmlType::IQ4_NL) => {
                x86::packed_avx2::<true>(ty, rows, rb, acts, out)
            }
            _ => x86::packed_avx2::<false>(ty, rows, rb, acts, out),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
