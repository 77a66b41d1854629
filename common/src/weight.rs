//! Weights: a matrix `[rows, cols]` (row-major, the layout of a Hugging Face
//! `Linear.weight`: `out_features × in_features`) stored as F32, BF16, F16,
//! quantized INT8 / INT4 with f32 group scales ([`crate::quant`]), or GGML
//! blocks from a GGUF file ([`crate::gguf`]), and its products with f32
//! activations.
//!
//! Products go through activations prepared once per product for the
//! matrix's format: the f32 row as it is, or, for GGML quantized blocks,
//! the row quantized to 8 bits per block ([`gguf::qdot::Q8Acts`]) so the
//! dot products run in integers, as those formats are meant to. Every
//! output element is the same [`Weight::row_dot`] whether it comes from a
//! single row, a matrix-vector or a (tiled) matrix-matrix product.
//!
//! Storage borrows the memory-mapped file when the bytes are aligned for
//! their type, and copies otherwise (safetensors does not promise
//! alignment; i8/u8 values never need copying).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;

use crate::dtype::{bf16_to_f32, f16_to_f32, DType};
use crate::gguf::qdot::{self, Q8Acts};
use crate::gguf::{self, GgmlType};
use crate::hugemem::HugeBuf;
use crate::kernels::{
    dot_bf16, dot_f16, dot_f32, dot_int4, dot_int8, dots_tile_bf16, dots_tile_f16, dots_tile_f32, dots_tile_int4,
    dots_tile_int8,
};
use crate::quant::{
    check_int4_buffers, check_int8_buffers, dequantize_int4_row, dequantize_int8_row, gguf_bytes, quantize_int4,
    quantize_int8, QuantError, WeightFormat,
};

/// Bytes that weights can borrow: a memory-mapped file, or a buffer an
/// expert was read into.
pub trait ByteSource: Send + Sync {
    /// The bytes.
    fn bytes(&self) -> &[u8];
}

impl ByteSource for Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl ByteSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Elements of type `T`, either borrowed from shared bytes or owned.
pub struct Buf<T: bytemuck::Pod> {
    inner: BufInner<T>,
}

enum BufInner<T> {
    Mapped {
        src: Arc<dyn ByteSource>,
        start: usize,
        len: usize,
    },
    Owned(Vec<T>),
}

impl<T: bytemuck::Pod> Buf<T> {
    /// `len` elements starting at byte `start` of `map`; copied if the
    /// address is not aligned for `T`.
    pub fn mapped(map: Arc<Mmap>, start: usize, len: usize) -> Self {
        Self::shared(map, start, len)
    }

    /// `len` elements starting at byte `start` of `src`, borrowed in place
    /// when aligned for `T`, copied otherwise.
    ///
    /// # Panics
    /// If the range lies outside `src` (callers check ranges first).
    pub fn shared(src: Arc<dyn ByteSource>, start: usize, len: usize) -> Self {
        let bytes = &src.bytes()[start..start + len * std::mem::size_of::<T>()];
        if (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            Buf {
                inner: BufInner::Mapped { src, start, len },
            }
        } else {
            let owned: Vec<T> = bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned)
                .collect();
            Buf {
                inner: BufInner::Owned(owned),
            }
        }
    }

    /// Owned elements.
    pub fn owned(v: Vec<T>) -> Self {
        Buf {
            inner: BufInner::Owned(v),
        }
    }

    /// Whether the elements are borrowed from a mapped file (not copied).
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, BufInner::Mapped { .. })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.inner {
            BufInner::Mapped { len, .. } => *len,
            BufInner::Owned(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        match &self.inner {
            BufInner::Mapped { src, start, len } => {
                bytemuck::cast_slice(&src.bytes()[*start..*start + len * std::mem::size_of::<T>()])
            }
            BufInner::Owned(v) => v,
        }
    }
}

/// Elements of a weight in their stored format.
pub enum WeightData {
    F32(Buf<f32>),
    BF16(Buf<u16>),
    F16(Buf<u16>),
    /// INT8: `scales: rows * (cols / group)`, `q: rows * cols`.
    Int8 {
        scales: Buf<f32>,
        q: Buf<i8>,
        group: usize,
    },
    /// INT4: `scales: rows * (cols / group)`, `q: rows * cols / 2` bytes of
    /// two nibbles each.
    Int4 {
        scales: Buf<f32>,
        q: Buf<u8>,
        group: usize,
    },
    /// GGML blocks of `ty` from a GGUF file: `rows * ty.row_bytes(cols)`
    /// bytes, row `r` at byte `r * ty.row_bytes(cols)` (`cols` a multiple
    /// of `ty.block_elems()`), used as stored.
    Gguf {
        ty: GgmlType,
        data: Buf<u8>,
    },
}

impl WeightData {
    /// INT8 data for a `[rows, cols]` matrix; an error (not a panic) when
    /// the buffers do not match the shape.
    pub fn int8(rows: usize, cols: usize, group: usize, scales: Buf<f32>, q: Buf<i8>) -> Result<Self, QuantError> {
        check_int8_buffers(rows, cols, group, scales.len(), q.len())?;
        Ok(WeightData::Int8 { scales, q, group })
    }

    /// INT4 data for a `[rows, cols]` matrix; an error (not a panic) when
    /// the buffers do not match the shape.
    pub fn int4(rows: usize, cols: usize, group: usize, scales: Buf<f32>, q: Buf<u8>) -> Result<Self, QuantError> {
        check_int4_buffers(rows, cols, group, scales.len(), q.len())?;
        Ok(WeightData::Int4 { scales, q, group })
    }

    /// The stored format.
    pub fn format(&self) -> WeightFormat {
        match self {
            WeightData::F32(_) => WeightFormat::F32,
            WeightData::BF16(_) => WeightFormat::BF16,
            WeightData::F16(_) => WeightFormat::F16,
            WeightData::Int8 { group, .. } => WeightFormat::Int8 { group: *group },
            WeightData::Int4 { group, .. } => WeightFormat::Int4 { group: *group },
            WeightData::Gguf { ty, .. } => WeightFormat::Gguf(*ty),
        }
    }

    /// The stored dtype; `None` for a quantized format (see
    /// [`WeightData::format`]).
    pub fn dtype(&self) -> Option<DType> {
        self.format().dtype()
    }

    /// Number of logical elements (`rows * cols`), whatever the format.
    pub fn len(&self) -> usize {
        match self {
            WeightData::F32(b) => b.len(),
            WeightData::BF16(b) | WeightData::F16(b) => b.len(),
            WeightData::Int8 { q, .. } => q.len(),
            WeightData::Int4 { q, .. } => q.len() * 2,
            WeightData::Gguf { ty, data } => data.len() / ty.block_bytes() * ty.block_elems(),
        }
    }

    /// Bytes of the stored data (codes and scales).
    pub fn byte_len(&self) -> usize {
        match self {
            WeightData::F32(b) => 4 * b.len(),
            WeightData::BF16(b) | WeightData::F16(b) => 2 * b.len(),
            WeightData::Int8 { scales, q, .. } => q.len() + 4 * scales.len(),
            WeightData::Int4 { scales, q, .. } => q.len() + 4 * scales.len(),
            WeightData::Gguf { data, .. } => data.len(),
        }
    }

    /// Checks that the buffers hold a `[rows, cols]` matrix.
    pub fn check(&self, rows: usize, cols: usize) -> Result<(), QuantError> {
        match self {
            WeightData::Int8 { scales, q, group } => check_int8_buffers(rows, cols, *group, scales.len(), q.len()),
            WeightData::Int4 { scales, q, group } => check_int4_buffers(rows, cols, *group, scales.len(), q.len()),
            WeightData::Gguf { ty, data } => {
                let expected = gguf_bytes(*ty, rows, cols)?;
                if data.len() != expected {
                    return Err(QuantError::LenMismatch {
                        what: "gguf block bytes",
                        expected,
                        got: data.len(),
                    });
                }
                Ok(())
            }
            plain => {
                let n = rows.checked_mul(cols).ok_or(QuantError::TooLarge { rows, cols })?;
                if plain.len() != n {
                    return Err(QuantError::LenMismatch {
                        what: "elements",
                        expected: n,
                        got: plain.len(),
                    });
                }
                Ok(())
            }
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element converted to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            WeightData::F32(b) => b.as_slice().to_vec(),
            WeightData::BF16(b) => b.as_slice().iter().map(|&x| bf16_to_f32(x)).collect(),
            WeightData::F16(b) => b.as_slice().iter().map(|&x| f16_to_f32(x)).collect(),
            WeightData::Int8 { scales, q, group } => {
                let mut out = vec![0.0; q.len()];
                dequantize_int8_row(q.as_slice(), scales.as_slice(), *group, &mut out);
                out
            }
            WeightData::Int4 { scales, q, group } => {
                let mut out = vec![0.0; q.len() * 2];
                dequantize_int4_row(q.as_slice(), scales.as_slice(), *group, &mut out);
                out
            }
            WeightData::Gguf { ty, data } => {
                let bytes = &data.as_slice()[..data.len() - data.len() % ty.block_bytes()];
                let mut out = vec![0.0; self.len()];
                gguf::dequantize_into(*ty, bytes, &mut out);
                out
            }
        }
    }
}

/// A weight matrix `[rows, cols]`, row-major.
pub struct Weight {
    rows: usize,
    cols: usize,
    data: WeightData,
    /// Rows repacked for this CPU's matrix-vector products (`qdot::tiled::packable`)
    /// ([`Weight::pack_for_cpu`]); `data` stays for everything else.
    packed: Option<Buf<u8>>,
}

/// Rows per rayon task: small enough to spread a 2-core or 16-core machine,
/// large enough that task overhead stays negligible.
const ROWS_PER_TASK: usize = 32;

/// Weight rows per tile of a matrix-matrix product: the tile stays in
/// cache while every activation row passes over it.
const TILE_ROWS: usize = 16;

// A tile of weight rows is one AMX tile (`qdot::amx::WeightTile`).
const _: () = assert!(TILE_ROWS <= qdot::amx::ROWS);

/// The token-major output of a matrix-matrix product, written by its
/// tiles in disjoint columns ([`Weight::matmul`]).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: the tiles that share it write disjoint elements, and the product
// waits for all of them before the output is used again.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element `i` places from the start.
    ///
    /// # Safety
    /// `i` lies inside the output.
    unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: the caller's promise.
        unsafe { self.0.add(i) }
    }
}

/// Activation rows from which a product of GGML rows runs on AMX tiles
/// (where AMX is active): below it the padding of a 16-row tile costs more
/// than the VNNI loops.
const AMX_MIN_ROWS: usize = 16;

/// Activation rows per block of a tiled product: eight 2048-wide rows and
/// their block sums (~20 KiB) share L1 with a tile's weight rows.
const ACT_BLOCK: usize = 8;

/// One activation row prepared for a matrix's format.
enum Prepared<'a> {
    /// Formats multiplied with f32 activations.
    F32(&'a [f32]),
    /// GGML quantized blocks: the row quantized per 32-element block.
    Q8(Q8Acts),
}

thread_local! {
    /// The quantized-activation buffer a matrix-vector product reuses, so
    /// the decode loop allocates nothing (taken while in use: a nested
    /// product on the same thread simply allocates its own).
    static Q8_SCRATCH: Cell<Q8Acts> = Cell::new(Q8Acts::default());
    /// The weight rows of a tile a matrix product arranges for its activations.
    static ARRANGED: RefCell<Vec<qdot::tiled::ArrangedRow>> = const { RefCell::new(Vec::new()) };
    /// A matrix product's tile outputs before they are stored token-major
    /// (taken while in use, as [`Q8_SCRATCH`]).
    static TILE_OUT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// A tile's packed rows' scale factors, formed once for all the passes
    /// of activation rows (`qdot::tiled::scales_ahead_pay`; taken while in
    /// use, as [`TILE_OUT`]).
    static TILE_SCALES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// A matrix product's activation rows laid out for AMX (taken while
    /// in use, as [`TILE_OUT`]: its pages are touched once, not per product).
    static AMX_ACTS: Cell<qdot::amx::AmxActs> = const { Cell::new(qdot::amx::AmxActs::EMPTY) };
    /// A matrix product's tile of weight rows decoded for AMX.
    static AMX_TILE: RefCell<qdot::amx::WeightTile> = RefCell::new(Default::default());
}

impl Weight {
    /// Wraps `data` as a `[rows, cols]` matrix.
    ///
    /// # Panics
    /// If `data` does not hold exactly `rows * cols` elements, or quantized
    /// scales that match (loaders check shapes before constructing, so this
    /// is a programming error; [`Weight::try_new`] returns the error).
    pub fn new(rows: usize, cols: usize, data: WeightData) -> Self {
        match Self::try_new(rows, cols, data) {
            Ok(w) => w,
            Err(e) => panic!("weight data does not match its shape: {e}"),
        }
    }

    /// Wraps `data` as a `[rows, cols]` matrix, or says why it does not fit.
    pub fn try_new(rows: usize, cols: usize, data: WeightData) -> Result<Self, QuantError> {
        data.check(rows, cols)?;
        Ok(Weight {
            rows,
            cols,
            data,
            packed: None,
        })
    }

    /// An INT8 matrix from its buffers (e.g. mapped from a container).
    pub fn int8(rows: usize, cols: usize, group: usize, scales: Buf<f32>, q: Buf<i8>) -> Result<Self, QuantError> {
        Self::try_new(rows, cols, WeightData::int8(rows, cols, group, scales, q)?)
    }

    /// An INT4 matrix from its buffers (e.g. mapped from a container).
    pub fn int4(rows: usize, cols: usize, group: usize, scales: Buf<f32>, q: Buf<u8>) -> Result<Self, QuantError> {
        Self::try_new(rows, cols, WeightData::int4(rows, cols, group, scales, q)?)
    }

    /// This matrix converted to `format` (owned): quantized with
    /// [`quantize_int8`] / [`quantize_int4`], or rounded to nearest-even
    /// for BF16 / F16. A quantized source is dequantized first. GGUF block
    /// formats are read, never written: [`QuantError::NoQuantizer`].
    pub fn to_format(&self, format: WeightFormat) -> Result<Self, QuantError> {
        let (rows, cols) = (self.rows, self.cols);
        let w = self.data.to_f32_vec();
        let data = match format {
            WeightFormat::F32 => WeightData::F32(Buf::owned(w)),
            WeightFormat::BF16 => WeightData::BF16(Buf::owned(
                w.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect(),
            )),
            WeightFormat::F16 => WeightData::F16(Buf::owned(
                w.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect(),
            )),
            WeightFormat::Int8 { group } => {
                let (s, q) = quantize_int8(&w, rows, cols, group)?;
                WeightData::Int8 {
                    scales: Buf::owned(s),
                    q: Buf::owned(q),
                    group,
                }
            }
            WeightFormat::Int4 { group } => {
                let (s, q) = quantize_int4(&w, rows, cols, group)?;
                WeightData::Int4 {
                    scales: Buf::owned(s),
                    q: Buf::owned(q),
                    group,
                }
            }
            WeightFormat::Gguf(_) => return Err(QuantError::NoQuantizer { format }),
        };
        Self::try_new(rows, cols, data)
    }

    /// An owned f32 matrix (tests, derived weights).
    pub fn from_f32(rows: usize, cols: usize, v: Vec<f32>) -> Self {
        Self::new(rows, cols, WeightData::F32(Buf::owned(v)))
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Stored dtype; `None` for a quantized format.
    pub fn dtype(&self) -> Option<DType> {
        self.data.dtype()
    }

    /// Stored format (dtype or quantization).
    pub fn format(&self) -> WeightFormat {
        self.data.format()
    }

    /// The stored buffers (e.g. to write them to a container).
    pub fn data(&self) -> &WeightData {
        &self.data
    }

    /// Row `r` converted to f32 into `out` (embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        let range = r * c..(r + 1) * c;
        match &self.data {
            WeightData::F32(b) => out.copy_from_slice(&b.as_slice()[range]),
            WeightData::BF16(b) => {
                for (o, &x) in out.iter_mut().zip(&b.as_slice()[range]) {
                    *o = bf16_to_f32(x);
                }
            }
            WeightData::F16(b) => {
                for (o, &x) in out.iter_mut().zip(&b.as_slice()[range]) {
                    *o = f16_to_f32(x);
                }
            }
            WeightData::Int8 { scales, q, group } => {
                let gpr = c / group;
                let s = &scales.as_slice()[r * gpr..(r + 1) * gpr];
                dequantize_int8_row(&q.as_slice()[range], s, *group, out);
            }
            WeightData::Int4 { scales, q, group } => {
                let gpr = c / group;
                let s = &scales.as_slice()[r * gpr..(r + 1) * gpr];
                let bytes = &q.as_slice()[r * c / 2..(r + 1) * c / 2];
                dequantize_int4_row(bytes, s, *group, out);
            }
            WeightData::Gguf { ty, data } => {
                let rb = data.len() / self.rows.max(1);
                gguf::dequantize_into(*ty, &data.as_slice()[r * rb..(r + 1) * rb], out);
            }
        }
    }

    /// Adds a copy of Q8_0 / Q4_0 / MXFP4 / Q4_K / Q6_K rows in the packed transposed layout
    /// ([`qdot::tiled::pack_rows`]: the same size, the same bits) that
    /// matrix-vector products read instead of the GGUF rows; other formats,
    /// widths and CPUs are left as they are. Costs one copy of the matrix
    /// in memory ([`HugeBuf`]: on huge pages where the OS has them; left
    /// unpacked if the OS refuses the memory).
    pub fn pack_for_cpu(self) -> Self {
        match &self.data {
            WeightData::Gguf { ty, data } if qdot::tiled::packable(*ty, self.cols) => {
                let (ty, rows, cols, src) = (*ty, self.rows, self.cols, data.as_slice());
                match HugeBuf::filled(src.len(), |out| qdot::tiled::pack_rows_into(ty, src, rows, cols, out)) {
                    Ok(buf) => self.with_packed(Arc::new(buf), 0),
                    Err(_) => self,
                }
            }
            _ => self,
        }
    }

    /// Uses the packed copy of this matrix's rows that starts at byte
    /// `start` of `src` (a copy of a whole tensor, made once for all the
    /// matrices sliced from it: [`crate::gguf::GgufFile`]).
    ///
    /// # Panics
    /// If this is not a matrix [`qdot::tiled::packable`] here,
    /// or `src` does not hold its bytes from `start`.
    pub fn with_packed(mut self, src: Arc<dyn ByteSource>, start: usize) -> Self {
        let WeightData::Gguf { ty, data } = &self.data else {
            panic!("only GGML block rows have a packed copy");
        };
        assert!(
            qdot::tiled::packable(*ty, self.cols),
            "{ty} rows of {} are not packed here",
            self.cols
        );
        self.packed = Some(Buf::shared(src, start, data.len()));
        self
    }

    /// Whether [`Weight::pack_for_cpu`] made a packed copy.
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    /// Whether products quantize the activations (GGML quantized blocks).
    fn int8_activations(&self) -> bool {
        matches!(&self.data, WeightData::Gguf { ty, .. } if qdot::supports(*ty))
    }

    /// `x` prepared for this matrix, reusing the thread's buffer.
    fn prepare<'a>(&self, x: &'a [f32]) -> Prepared<'a> {
        if self.int8_activations() {
            let mut a = Q8_SCRATCH.take();
            a.quantize(x);
            if self.packed.is_some() {
                a.arrange();
            }
            Prepared::Q8(a)
        } else {
            Prepared::F32(x)
        }
    }

    /// Hands a prepared row's buffer back to the thread.
    fn release(p: Prepared<'_>) {
        if let Prepared::Q8(a) = p {
            Q8_SCRATCH.set(a);
        }
    }

    /// `dot(row r, x)`, accumulated in f32 (for GGML quantized blocks, with
    /// `x` quantized per block as every product of this matrix does).
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        let p = self.prepare(x);
        let v = self.dot_prepared(r, &p);
        Self::release(p);
        v
    }

    #[inline]
    fn dot_prepared(&self, r: usize, x: &Prepared<'_>) -> f32 {
        let c = self.cols;
        let range = r * c..(r + 1) * c;
        let x = match x {
            Prepared::F32(x) => x,
            Prepared::Q8(a) => {
                let WeightData::Gguf { ty, data } = &self.data else {
                    unreachable!("only GGML blocks quantize activations")
                };
                let rb = data.len() / self.rows.max(1);
                return qdot::dot(*ty, &data.as_slice()[r * rb..(r + 1) * rb], a);
            }
        };
        match &self.data {
            WeightData::F32(b) => dot_f32(&b.as_slice()[range], x),
            WeightData::BF16(b) => dot_bf16(&b.as_slice()[range], x),
            WeightData::F16(b) => dot_f16(&b.as_slice()[range], x),
            WeightData::Int8 { scales, q, group } => {
                let gpr = c / group;
                let s = &scales.as_slice()[r * gpr..(r + 1) * gpr];
                dot_int8(&q.as_slice()[range], s, *group, x)
            }
            WeightData::Int4 { scales, q, group } => {
                let gpr = c / group;
                let s = &scales.as_slice()[r * gpr..(r + 1) * gpr];
                dot_int4(&q.as_slice()[r * c / 2..(r + 1) * c / 2], s, *group, x)
            }
            WeightData::Gguf { ty, data } => {
                let rb = data.len() / self.rows.max(1);
                gguf::dot::dot(*ty, &data.as_slice()[r * rb..(r + 1) * rb], x)
            }
        }
    }

    /// `out = W x` for one activation row (`x: cols`, `out: rows`), on the
    /// calling thread.
    pub fn matvec_seq(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        debug_assert_eq!(out.len(), self.rows);
        let p = self.prepare(x);
        self.rows_into(0, out, &p);
        Self::release(p);
    }

    /// `out[i] = row_dot(base + i, x)` for the prepared `x` (GGML blocks:
    /// one call for the whole run of rows).
    fn rows_into(&self, base: usize, out: &mut [f32], p: &Prepared<'_>) {
        if let (WeightData::Gguf { ty, data }, Prepared::Q8(a)) = (&self.data, p) {
            let rb = data.len() / self.rows.max(1);
            if let (Some(packed), true) = (&self.packed, a.arranged()) {
                let rows = &packed.as_slice()[base * rb..(base + out.len()) * rb];
                return qdot::tiled::dot_rows_packed(*ty, rows, a, out);
            }
            let rows = &data.as_slice()[base * rb..(base + out.len()) * rb];
            return qdot::dot_rows(*ty, rows, a, out);
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.dot_prepared(base + i, p);
        }
    }

    /// `out = W x` for one activation row, output rows split across rayon.
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        debug_assert_eq!(out.len(), self.rows);
        let p = self.prepare(x);
        out.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(chunk, o)| self.rows_into(chunk * ROWS_PER_TASK, o, &p));
        Self::release(p);
    }

    /// `outs[i] = ws[i] x` for several matrices of the same input (a
    /// layer's q/k/v projections, an FFN's gate and up), as one parallel
    /// loop over all their rows: one fork-join instead of one per matrix.
    /// Every element is the same [`Weight::row_dot`] as in
    /// [`Weight::matvec`].
    ///
    /// # Panics
    /// If the counts or shapes do not match.
    pub fn matvec_many(ws: &[&Weight], x: &[f32], outs: &mut [&mut [f32]]) {
        assert_eq!(ws.len(), outs.len(), "one output per matrix");
        let Some(first) = ws.first() else { return };
        // The activations are prepared once when every matrix wants the
        // same kind (all quantize them, or none does).
        if ws.iter().any(|w| w.int8_activations() != first.int8_activations()) {
            for (w, o) in ws.iter().zip(outs.iter_mut()) {
                w.matvec(x, o);
            }
            return;
        }
        for (w, o) in ws.iter().zip(outs.iter()) {
            assert_eq!((x.len(), o.len()), (w.cols, w.rows), "matrix shape");
        }
        let mut p = first.prepare(x);
        if let Prepared::Q8(a) = &mut p {
            if ws.iter().any(|w| w.packed.is_some()) && !a.arranged() {
                a.arrange();
            }
        }
        // Nested parallel loops: rayon schedules all the row chunks of all
        // the matrices in one region.
        outs.par_iter_mut().zip(ws.par_iter()).for_each(|(o, w)| {
            o.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(chunk, part)| w.rows_into(chunk * ROWS_PER_TASK, part, &p));
        });
        Self::release(p);
    }

    /// `out[t] = W xs[t]` for `n` activation rows (`xs: n × cols`,
    /// `out: n × rows`). Every output element is the same [`Weight::row_dot`]
    /// as in [`Weight::matvec`], so batching never changes a bit. The
    /// activations are prepared once; tiles of [`TILE_ROWS`] weight rows are
    /// split across rayon and each tile meets every activation row while it
    /// is in cache, so the weights are read from memory once per product.
    pub fn matmul(&self, xs: &[f32], n: usize, out: &mut [f32]) {
        Self::matmul_many(&[self], xs, n, &mut [out]);
    }

    /// [`Weight::matmul`] of several matrices with the same input (a
    /// layer's q/k/v, an FFN's gate and up): the activation rows are
    /// quantized (and arranged) once for all of them, on every core. The
    /// same bits as one [`Weight::matmul`] per matrix.
    ///
    /// # Panics
    /// If the counts or shapes do not match.
    pub fn matmul_many(ws: &[&Weight], xs: &[f32], n: usize, outs: &mut [&mut [f32]]) {
        assert_eq!(ws.len(), outs.len(), "one output per matrix");
        let Some(first) = ws.first() else { return };
        for (w, o) in ws.iter().zip(outs.iter()) {
            assert_eq!((xs.len(), o.len()), (n * w.cols, n * w.rows), "matrix shape");
        }
        if n == 0 {
            return;
        }
        if n == 1 {
            return Self::matvec_many(ws, xs, outs);
        }
        // One preparation serves all only when every matrix wants the same kind.
        if ws.len() > 1 && ws.iter().any(|w| w.int8_activations() != first.int8_activations()) {
            for (w, o) in ws.iter().zip(outs.iter_mut()) {
                w.matmul(xs, n, o);
            }
            return;
        }
        let int8 = first.int8_activations();
        // Q8_0 / Q4_0 / K-quants on x86: both sides chunk-transposed (same bits),
        // unless AMX tiles take the product.
        let arrange = int8 && ws.iter().any(|w| w.tiled(n) && !w.on_amx(n));
        let acts: Vec<Prepared<'_>> = xs
            .par_chunks_exact(first.cols)
            .with_min_len(4)
            .map(|x| {
                if int8 {
                    let mut a = Q8Acts::new(x);
                    if arrange {
                        a.arrange();
                    }
                    Prepared::Q8(a)
                } else {
                    Prepared::F32(x)
                }
            })
            .collect();
        let arranged_acts: Vec<&Q8Acts> = if arrange {
            acts.iter()
                .map(|p| match p {
                    Prepared::Q8(a) => a,
                    Prepared::F32(_) => unreachable!("GGML blocks quantize activations"),
                })
                .collect()
        } else {
            Vec::new()
        };
        // AMX: the activation rows laid out once as the tiles' operands.
        let amx = (int8 && ws.iter().any(|w| w.on_amx(n))).then(|| {
            let rows: Vec<&Q8Acts> = acts
                .iter()
                .map(|p| match p {
                    Prepared::Q8(a) => a,
                    Prepared::F32(_) => unreachable!("GGML blocks quantize activations"),
                })
                .collect();
            let mut amx = AMX_ACTS.take();
            amx.fill(&rows);
            amx
        });
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            let arranged = if w.tiled(n) && !w.on_amx(n) {
                &arranged_acts[..]
            } else {
                &[]
            };
            let amx = amx.as_ref().filter(|_| w.on_amx(n));
            w.matmul_prepared(&acts, arranged, amx, n, o);
        }
        if let Some(amx) = amx {
            AMX_ACTS.set(amx);
        }
    }

    /// Whether a product with `n` activation rows runs on AMX tiles
    /// ([`qdot::amx`]): GGML rows AMX takes, on a CPU where it is active,
    /// with at least [`AMX_MIN_ROWS`] activation rows.
    fn on_amx(&self, n: usize) -> bool {
        matches!(&self.data, WeightData::Gguf { ty, .. } if n >= AMX_MIN_ROWS && qdot::amx::usable(*ty, self.cols))
    }

    /// Whether a product with `n` activation rows takes the chunk-transposed
    /// path ([`qdot::tiled`]): from the packed copy for any `n` (an expert
    /// in prefill often meets one to three rows), or arranging rows per
    /// product from four rows on where that pays.
    fn tiled(&self, n: usize) -> bool {
        matches!(&self.data, WeightData::Gguf { ty, .. }
            if qdot::tiled::usable(*ty, self.cols)
                && (self.packed.is_some() || (n >= 4 && qdot::tiled::arranging_pays(*ty))))
    }

    /// The tiles of [`Weight::matmul_many`] for one matrix: `acts` prepared
    /// for it, `arranged_acts` the same rows arranged (empty: not tiled).
    fn matmul_prepared(
        &self,
        acts: &[Prepared<'_>],
        arranged_acts: &[&Q8Acts],
        amx: Option<&qdot::amx::AmxActs>,
        n: usize,
        out: &mut [f32],
    ) {
        assert_eq!(out.len(), n * self.rows, "one output row per activation row");
        let arranged = !arranged_acts.is_empty();
        let batch = qdot::tiled::ArrangedActs::new(arranged_acts);
        // Each tile's outputs gather in a small tile-major buffer (`o[i * n
        // + t]`, what the kernels write), stored into the token-major `out`
        // once the tile is done: `tile_rows` columns of every activation
        // row, which no other tile writes.
        let dst = OutPtr(out.as_mut_ptr());
        let tiles = self.rows.div_ceil(TILE_ROWS);
        (0..tiles).into_par_iter().for_each(|tile| {
            let r0 = tile * TILE_ROWS;
            let tile_rows = TILE_ROWS.min(self.rows - r0);
            let mut buf = TILE_OUT.take();
            buf.clear();
            buf.resize(tile_rows * n, 0.0);
            let o = &mut buf[..];
            let mut t = 0;
            // GGML blocks: four activation rows per call, codes decoded once.
            if let (WeightData::Gguf { ty, data }, true) = (&self.data, self.int8_activations()) {
                let rb = data.len() / self.rows.max(1);
                let q8 = |t: usize| match &acts[t] {
                    Prepared::Q8(a) => a,
                    Prepared::F32(_) => unreachable!("GGML blocks quantize activations"),
                };
                // Blocks of activation rows small enough to stay in L1 while
                // every weight row of the tile meets them (all the rows at
                // once would stream them from L2 for each weight row).
                let blocks = (0..n).step_by(ACT_BLOCK).map(|b| b..(b + ACT_BLOCK).min(n));
                if let Some(amx) = amx {
                    // AMX: the tile's rows decoded once, then every
                    // activation tile against them.
                    AMX_TILE.with_borrow_mut(|w| {
                        let data = data.as_slice();
                        w.decode(*ty, &data[r0 * rb..(r0 + tile_rows) * rb], self.cols);
                        // The next tile's rows into L2 while this tile's
                        // products run (its decode read them from memory:
                        // a fifth of an OLMoE Q6_K prefill without this).
                        let next = ((r0 + tile_rows) * rb).min(data.len());
                        let len = (tile_rows * rb).min(data.len() - next);
                        qdot::amx::product(w, amx, o, n, &data[next..next + len]);
                    });
                    t = n;
                } else if let (true, Some(packed)) = (arranged, &self.packed) {
                    let packed = packed.as_slice();
                    // The next tile's packed rows into L2, a share per
                    // block of activation rows, while this tile's are used.
                    let tile_bytes = tile_rows * rb;
                    let next = packed.as_ptr().wrapping_add((r0 + tile_rows) * rb);
                    let share = tile_bytes.div_ceil(n.div_ceil(ACT_BLOCK)).next_multiple_of(64);
                    // Q4_K, Q5_K and IQ4_XS on AVX2 with more than a pass
                    // of four activation rows per weight row: the rows'
                    // scale factors once for the tile, not once per pass.
                    let mut scales = TILE_SCALES.take();
                    scales.clear();
                    if n > 4 && qdot::tiled::scales_ahead_pay(*ty, self.cols) {
                        let per = qdot::tiled::scales_per_chunk(*ty) * (self.cols / qdot::tiled::CHUNK);
                        scales.resize(tile_rows * per, 0.0);
                        for (i, s) in scales.chunks_exact_mut(per).enumerate() {
                            let r = r0 + i;
                            qdot::tiled::scales_ahead(*ty, &packed[r * rb..(r + 1) * rb], s);
                        }
                    }
                    for b in blocks {
                        let from = (b.start / ACT_BLOCK * share).min(tile_bytes);
                        let len = share.min(tile_bytes - from);
                        let acts = batch.range(b.clone());
                        // Two weight rows per pass where that pays (each
                        // activation step loaded once for both).
                        let step = if qdot::tiled::pairs_pay(*ty, self.cols) { 2 } else { 1 };
                        let row = |r: usize| &packed[r * rb..(r + 1) * rb];
                        // The block's share a slice per weight row; the
                        // tile's rows in one call (one dispatch a tile).
                        let pf = crate::prefetch::Slices::new(next.wrapping_add(from), len, tile_rows);
                        let rows = &packed[r0 * rb..(r0 + tile_rows) * rb];
                        let mut each = |i: usize| pf.to_l2(i);
                        if !scales.is_empty() {
                            let (out, stride, before) = (&mut o[b.start..], n, &mut each);
                            let tile = qdot::tiled::TileOut { out, stride, before };
                            qdot::tiled::dot_many_packed_ahead_rows(*ty, rows, &scales, &acts, tile);
                            continue;
                        }
                        if step == 1 {
                            let (out, stride, before) = (&mut o[b.start..], n, &mut each);
                            qdot::tiled::dot_many_packed_rows(
                                *ty,
                                rows,
                                &acts,
                                qdot::tiled::TileOut { out, stride, before },
                            );
                            continue;
                        }
                        for i in (0..tile_rows).step_by(2) {
                            pf.to_l2(i);
                            let r = r0 + i;
                            if i + 1 < tile_rows {
                                pf.to_l2(i + 1);
                                let (first, second) = o[i * n..(i + 2) * n].split_at_mut(n);
                                qdot::tiled::dot_pair_packed(
                                    *ty,
                                    (row(r), row(r + 1)),
                                    &acts,
                                    &mut first[b.clone()],
                                    &mut second[b.clone()],
                                );
                            } else {
                                qdot::tiled::dot_many_packed(
                                    *ty,
                                    row(r),
                                    &acts,
                                    &mut o[i * n + b.start..i * n + b.end],
                                );
                            }
                        }
                    }
                    TILE_SCALES.set(scales);
                    t = n;
                } else if arranged {
                    // The next tile's rows into L2 while this one is
                    // arranged (a slice per row, as the packed rows above).
                    let tile_bytes = tile_rows * rb;
                    let next = data.as_slice().as_ptr().wrapping_add((r0 + tile_rows) * rb);
                    // The tile's rows arranged once, then met by every block.
                    let pf = crate::prefetch::Slices::new(next, tile_bytes, tile_rows);
                    ARRANGED.with_borrow_mut(|rows| {
                        rows.resize_with(tile_rows.max(rows.len()), Default::default);
                        for (i, row) in rows.iter_mut().enumerate().take(tile_rows) {
                            pf.to_l2(i);
                            let r = r0 + i;
                            qdot::tiled::arrange_row(*ty, &data.as_slice()[r * rb..(r + 1) * rb], row);
                        }
                        for b in blocks {
                            let acts = batch.range(b.clone());
                            for (i, row) in rows.iter().enumerate().take(tile_rows) {
                                let o = &mut o[i * n + b.start..i * n + b.end];
                                qdot::tiled::dot_many_arranged(row, &acts, o);
                            }
                        }
                    });
                    t = n;
                }
                while t + 4 <= n {
                    let four = [q8(t), q8(t + 1), q8(t + 2), q8(t + 3)];
                    for i in 0..tile_rows {
                        let r = r0 + i;
                        let v = qdot::dot4(*ty, &data.as_slice()[r * rb..(r + 1) * rb], four);
                        o[i * n + t..i * n + t + 4].copy_from_slice(&v);
                    }
                    t += 4;
                }
            }
            // Float and INT8 / INT4 rows: the tile against every activation
            // row at once, register-blocked (the one-row dot's bits).
            if t == 0 && !matches!(self.data, WeightData::Gguf { .. }) {
                let xs: Vec<&[f32]> = acts
                    .iter()
                    .map(|a| match a {
                        Prepared::F32(x) => *x,
                        Prepared::Q8(_) => unreachable!("float and charm-quantized rows take f32 activations"),
                    })
                    .collect();
                let c = self.cols;
                let range = r0 * c..(r0 + tile_rows) * c;
                match &self.data {
                    WeightData::F32(b) => dots_tile_f32(&b.as_slice()[range], c, &xs, o),
                    WeightData::BF16(b) => dots_tile_bf16(&b.as_slice()[range], c, &xs, o),
                    WeightData::F16(b) => dots_tile_f16(&b.as_slice()[range], c, &xs, o),
                    WeightData::Int8 { scales, q, group } => {
                        let gpr = c / group;
                        let s = &scales.as_slice()[r0 * gpr..(r0 + tile_rows) * gpr];
                        dots_tile_int8(&q.as_slice()[range], s, *group, c, &xs, o)
                    }
                    WeightData::Int4 { scales, q, group } => {
                        let gpr = c / group;
                        let s = &scales.as_slice()[r0 * gpr..(r0 + tile_rows) * gpr];
                        dots_tile_int4(&q.as_slice()[range.start / 2..range.end / 2], s, *group, c, &xs, o)
                    }
                    WeightData::Gguf { .. } => unreachable!("checked above"),
                }
                t = n;
            }
            for (t, a) in acts.iter().enumerate().skip(t) {
                for i in 0..tile_rows {
                    o[i * n + t] = self.dot_prepared(r0 + i, a);
                }
            }
            for t in 0..n {
                // SAFETY: `out` holds `n × rows` elements (checked above)
                // and lives until every tile is done; this tile
                // alone writes columns `r0..r0 + tile_rows`.
                let row = unsafe { std::slice::from_raw_parts_mut(dst.at(t * self.rows + r0), tile_rows) };
                for (i, v) in row.iter_mut().enumerate() {
                    *v = o[i * n + t];
                }
            }
            TILE_OUT.set(buf);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_with_no_activation_rows_writes_nothing() {
        let w = Weight::from_f32(3, 64, vec![0.5; 3 * 64]);
        for format in [WeightFormat::F32, WeightFormat::BF16] {
            let w = w.to_format(format).unwrap();
            let mut out: Vec<f32> = Vec::new();
            w.matmul(&[], 0, &mut out);
            assert!(out.is_empty());
        }
    }

    #[test]
    fn matvec_and_matmul_agree_bit_for_bit() {
        let rows = 70;
        // Seven activation rows: two groups of three (the float rows'
        // three-row products) and one more, in every float format; INT8 and
        // INT4 with groups of whole 16-column chunks (their tiles) and not.
        let n = 7;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let check = |w: &Weight, xs: &[f32], what: WeightFormat| {
            let cols = w.cols;
            let mut batched = vec![0.0; n * rows];
            w.matmul(xs, n, &mut batched);
            for t in 0..n {
                let mut one = vec![0.0; rows];
                w.matvec(&xs[t * cols..(t + 1) * cols], &mut one);
                assert_eq!(bits(&one), bits(&batched[t * rows..(t + 1) * rows]), "{what:?} row {t}");
                let mut seq = vec![0.0; rows];
                w.matvec_seq(&xs[t * cols..(t + 1) * cols], &mut seq);
                assert_eq!(bits(&one), bits(&seq), "{what:?} row {t}");
            }
        };
        for (cols, formats) in [
            (37, vec![WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16]),
            (
                96,
                [16, 32, 48, 8]
                    .into_iter()
                    .flat_map(|group| [WeightFormat::Int8 { group }, WeightFormat::Int4 { group }])
                    .collect(),
            ),
        ] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let w = Weight::from_f32(rows, cols, w);
            let xs: Vec<f32> = (0..n * cols).map(|i| ((i * 31) % 11) as f32 / 11.0 - 0.3).collect();
            for format in formats {
                check(&w.to_format(format).unwrap(), &xs, format);
            }
        }
    }

    #[test]
    fn packed_copies_change_no_bit() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        // 2880: gpt-oss's width, 11 chunks and two blocks (Q8_0, Q4_0 and
        // MXFP4 rows past their whole chunks).
        let shapes = [
            (GgmlType::Q8_0, 512),
            (GgmlType::Q4_0, 512),
            (GgmlType::Q6_K, 512),
            (GgmlType::Q4_K, 512),
            (GgmlType::Q5_K, 512),
            (GgmlType::IQ4_XS, 512),
            (GgmlType::MXFP4, 512),
            (GgmlType::MXFP4, 2880),
            (GgmlType::Q8_0, 2880),
            (GgmlType::Q4_0, 2880),
            // Q5_0 (arranged as Q8_0 in prefill, never packed), Q4_1 and
            // Q5_1 (arranged per product) at GLM-4.5-Air's expert width, 5
            // chunks and 4 blocks.
            (GgmlType::Q5_0, 512),
            (GgmlType::Q5_0, 1408),
            (GgmlType::Q4_1, 512),
            (GgmlType::Q5_1, 1408),
            (GgmlType::Q2_K, 512),
            (GgmlType::Q3_K, 512),
        ];
        for (ty, cols) in shapes {
            let rows = 40;
            let bytes: Vec<u8> = (0..rows)
                .flat_map(|_| gguf::dot::tests::random_row(&mut rng, ty, cols))
                .collect();
            let make = || {
                let data = WeightData::Gguf {
                    ty,
                    data: Buf::owned(bytes.clone()),
                };
                Weight::try_new(rows, cols, data).unwrap()
            };
            let (plain, packed) = (make(), make().pack_for_cpu());
            // Packed where this CPU multiplies the layout (on AVX2 or
            // VNNI), left alone elsewhere.
            assert_eq!(packed.is_packed(), qdot::tiled::packable(ty, cols), "{ty}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let x = gguf::dot::tests::acts(&mut rng, cols);
            let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
            plain.matvec(&x, &mut a);
            packed.matvec(&x, &mut b);
            assert_eq!(bits(&a), bits(&b), "{ty} matvec");
            packed.matvec_seq(&x, &mut b);
            assert_eq!(bits(&a), bits(&b), "{ty} matvec_seq");
            // Mixed with an unpacked matrix of the same input.
            let (mut c, mut d) = (vec![0.0; rows], vec![0.0; rows]);
            Weight::matvec_many(&[&plain, &packed], &x, &mut [&mut c[..], &mut d[..]]);
            assert_eq!((bits(&c), bits(&d)), (bits(&a), bits(&a)), "{ty} matvec_many");
            assert_eq!(packed.row_dot(7, &x).to_bits(), a[7].to_bits());
            // Two and three rows (packed: the chunk-transposed path, plain:
            // the row dot), five (both chunk-transposed where usable), nine
            // and 33 (AMX tiles where the CPU has them: a partial tile, and
            // two whole tiles and one row): each element the row dot of the
            // folding kernel.
            for n in [2, 3, 5, 9, 33] {
                let xs = gguf::dot::tests::acts(&mut rng, n * cols);
                let (mut e, mut f) = (vec![0.0; n * rows], vec![0.0; n * rows]);
                plain.matmul(&xs, n, &mut e);
                packed.matmul(&xs, n, &mut f);
                assert_eq!(bits(&e), bits(&f), "{ty} {cols} matmul of {n} rows");
                let plain = &plain;
                let want: Vec<f32> = (0..n)
                    .flat_map(|t| {
                        let x = &xs[t * cols..(t + 1) * cols];
                        (0..rows).map(move |r| plain.row_dot(r, x))
                    })
                    .collect();
                assert_eq!(bits(&e), bits(&want), "{ty} {cols} matmul of {n} rows against row_dot");
            }
        }
    }

    #[test]
    fn matmul_many_equals_one_matmul_per_matrix() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let cols = 512;
        let mut make = |ty: GgmlType, rows: usize| {
            let bytes: Vec<u8> = (0..rows)
                .flat_map(|_| gguf::dot::tests::random_row(&mut rng, ty, cols))
                .collect();
            let data = WeightData::Gguf {
                ty,
                data: Buf::owned(bytes),
            };
            Weight::try_new(rows, cols, data).unwrap()
        };
        // Tiled rows (Q8_0, Q4_0 packed or not, Q4_K and MXFP4 arranged per
        // product from four activation rows on) side by side.
        let ws = [
            make(GgmlType::Q8_0, 24),
            make(GgmlType::Q4_0, 40).pack_for_cpu(),
            make(GgmlType::Q4_K, 17),
            make(GgmlType::MXFP4, 11),
        ];
        let f = Weight::from_f32(9, cols, (0..9 * cols).map(|i| (i % 13) as f32 * 0.01).collect());
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for n in [1, 2, 5, 9] {
            let xs = gguf::dot::tests::acts(&mut rng, n * cols);
            // The definition: one row dot per (activation row, weight row).
            let want: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| {
                    let x = |t: usize| &xs[t * cols..(t + 1) * cols];
                    (0..n)
                        .flat_map(|t| (0..w.rows()).map(move |r| w.row_dot(r, x(t))))
                        .collect()
                })
                .collect();
            let mut got: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; n * w.rows()]).collect();
            let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|o| &mut o[..]).collect();
            Weight::matmul_many(&[&ws[0], &ws[1], &ws[2], &ws[3]], &xs, n, &mut outs);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(bits(g), bits(w), "n={n}");
            }
            // Mixed with f32 activations: each matrix on its own, same bits.
            let mut of = vec![0.0; n * 9];
            let mut fo = vec![0.0; n * 9];
            f.matmul(&xs, n, &mut fo);
            let mut oq = vec![0.0; n * 24];
            Weight::matmul_many(&[&f, &ws[0]], &xs, n, &mut [&mut of, &mut oq]);
            assert_eq!((bits(&of), bits(&oq)), (bits(&fo), bits(&want[0])), "n={n}");
        }
    }

    #[test]
    fn matvec_many_equals_one_matvec_per_matrix() {
        let cols = 64;
        let make = |rows: usize, seed: usize| {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| (((i + seed) * 7919) % 101) as f32 / 101.0 - 0.5)
                .collect();
            Weight::from_f32(rows, cols, w)
        };
        let (a, b) = (make(70, 1), make(33, 2));
        // A GGML Q8_0 matrix quantizes its activations: mixed with f32
        // matrices, each still gets its own product.
        let mut q8 = Vec::new();
        for r in 0..40 {
            for blk in 0..cols / 32 {
                q8.extend(half::f16::from_f32(0.01 * (r + blk + 1) as f32).to_bits().to_le_bytes());
                q8.extend((0..32).map(|i| ((i * 37 + r * 11 + blk) % 255) as u8));
            }
        }
        let c = Weight::new(
            40,
            cols,
            WeightData::Gguf {
                ty: GgmlType::Q8_0,
                data: Buf::owned(q8),
            },
        );
        let x: Vec<f32> = (0..cols).map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.4).collect();
        for set in [vec![&a, &b], vec![&a, &b, &c], vec![&c, &c]] {
            let mut outs: Vec<Vec<f32>> = set.iter().map(|w| vec![0.0; w.rows()]).collect();
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            Weight::matvec_many(&set, &x, &mut refs);
            for (w, got) in set.iter().zip(&outs) {
                let mut want = vec![0.0; w.rows()];
                w.matvec(&x, &mut want);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want));
            }
        }
    }

    #[test]
    fn bf16_rows_convert_exactly() {
        // 1.0, -2.0, 0.5 in bf16.
        let w = Weight::new(1, 3, WeightData::BF16(Buf::owned(vec![0x3f80, 0xc000, 0x3f00])));
        let mut row = vec![0.0; 3];
        w.row_into(0, &mut row);
        assert_eq!(row, vec![1.0, -2.0, 0.5]);
        assert_eq!(w.row_dot(0, &[1.0, 1.0, 2.0]), 0.0);
    }
}
