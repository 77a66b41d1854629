//! GGUF files (llama.cpp's model format): the header, metadata and tensor
//! table, validated once at open; tensors then viewed in place in the
//! memory-mapped file as charm [`Weight`]s whose quantized blocks are used
//! as stored (never re-quantized).
//!
//! # Format (versions 2 and 3, little-endian)
//!
//! `"GGUF"`, `u32 version`, `u64 tensor_count`, `u64 kv_count`; then
//! `kv_count` metadata entries (`string key`, `u32 value_type`, value),
//! then `tensor_count` tensor infos (`string name`, `u32 n_dims`,
//! `u64 dims[n_dims]` innermost first, `u32 ggml_type`, `u64 offset`), then
//! padding to `general.alignment` (default 32), then the data section.
//! A string is `u64 len` + UTF-8 bytes; an array is `u32 elem_type`,
//! `u64 count`, elements. Each tensor's `offset` is relative to the data
//! section and a multiple of the alignment; its size follows from its dims
//! and type (`dims[0]` must be a whole number of blocks).
//!
//! # Hostile input
//!
//! Every count and length is checked against the bytes left in the file
//! before anything is allocated for it; arrays nest at most
//! [`MAX_ARRAY_DEPTH`] deep and hold at most [`MAX_META_ELEMENTS`] elements
//! in all; every size computation is checked for overflow. Any input gives
//! a [`GgufError`] naming the file (and the key or tensor), never a panic.
//!
//! # Layout
//! - [`types`]: [`GgmlType`] and the block structs.
//! - [`dequant`]: the scalar reference dequantization ([`dequantize`]).
//! - [`dot`]: row · f32 activation dot products, reference and fast path.
//! - [`qdot`]: integer dot products of quantized rows with 8-bit
//!   activations, what [`Weight`] products of quantized blocks use.
//! - [`mxfp4`]: Hugging Face (gpt-oss) MXFP4 tensors converted to GGML
//!   MXFP4 blocks.
//! - `meta`, `error`: [`MetaValue`], [`GgufError`].

mod dequant;
pub mod dot;
mod error;
mod meta;
pub mod mxfp4;
pub mod qdot;
pub mod types;

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

pub(crate) use dequant::dequantize_into;
pub use dequant::{dequantize, q5_0_as_q8_0};
pub use error::GgufError;
pub use meta::MetaValue;
pub use mxfp4::{blocks_from_hub, blocks_from_hub_rows, HubMxfp4Error};
pub use types::GgmlType;

use crate::hugemem::HugeBuf;
use crate::weight::{Buf, ByteSource, Weight, WeightData};

/// The magic at the start of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of the data section and of every tensor when the file has
/// no `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// How deep metadata arrays may nest (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Metadata array elements kept in memory, over all arrays of a file
/// (a 256k-token vocabulary with its merges and scores uses about 1M).
pub const MAX_META_ELEMENTS: u64 = 1 << 24;
/// Dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (the row length).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl GgufTensor {
    /// Number of elements (the product of the dims; 1 for no dims).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A GGUF file, memory-mapped and validated.
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    src: Arc<dyn ByteSource>,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<GgufTensor>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    /// Whether quantized weights get a copy on huge pages, packed for this
    /// CPU where it can be ([`repack_policy`]).
    repack: bool,
    /// Per tensor, its copy on huge pages once a matrix was made from it
    /// (packed for Q8_0 / Q4_0 / Q6_K, as stored for the other quantized types; one
    /// copy per tensor, shared by every expert sliced from it); `None` when
    /// it has none.
    copies: Vec<OnceLock<Option<Arc<HugeBuf>>>>,
}

/// Whether a file's quantized weights (`copied` bytes of them) get a copy
/// on huge pages for faster decode — packed for this CPU where the type
/// has a packing ([`Weight::pack_for_cpu`]), as stored otherwise: the copy
/// doubles their memory while the mapped pages stay in the page cache, so
/// only when it takes at most half of the memory the process can take now
/// ([`crate::memory::available`]: `MemAvailable`, capped by the room under
/// a memory cgroup limit). `CHARM_GGUF_REPACK=0` / `=1` forces it off / on.
pub fn repack_policy(copied: u64) -> bool {
    match std::env::var("CHARM_GGUF_REPACK").as_deref() {
        Ok("0") => return false,
        Ok("1") => return true,
        _ => {}
    }
    if copied == 0 {
        return false;
    }
    crate::memory::available().is_some_and(|a| copied <= a / 2)
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .finish()
    }
}

impl GgufFile {
    /// Opens, maps and validates `path`.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let src: Arc<dyn ByteSource> = if len == 0 {
            // Nothing to map; parsing reports the truncation.
            Arc::new(Vec::new())
        } else {
            // SAFETY: the file is opened read-only and charm never writes
            // model files while serving them; a file truncated underneath a
            // running process is outside what any mmap-based loader can
            // defend against.
            let mut opts = memmap2::MmapOptions::new();
            if crate::memory::populate_policy(len) {
                opts.populate();
            }
            Arc::new(unsafe { opts.map(&file) }.map_err(io)?)
        };
        Self::parse(path.to_path_buf(), src)
    }

    /// Validates an in-memory GGUF image; `path` only names it in errors.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(path.into(), Arc::new(bytes))
    }

    fn parse(path: PathBuf, src: Arc<dyn ByteSource>) -> Result<GgufFile, GgufError> {
        let bytes = src.bytes();
        let mut p = Parser {
            b: bytes,
            pos: 0,
            path: &path,
            meta_elems: 0,
        };
        let magic = p.take(4, &|| "the magic".into())?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                path: path.clone(),
                found: magic.to_vec(),
            });
        }
        let version = p.u32(&|| "the version".into())?;
        if !matches!(version, 2 | 3) {
            return Err(GgufError::UnsupportedVersion { path, version });
        }
        let n_tensors = p.u64(&|| "the tensor count".into())?;
        let n_kv = p.u64(&|| "the metadata count".into())?;
        // Each entry takes at least: key length + value type + 1 byte.
        let n_kv = p.count(n_kv, 8 + 4 + 1, &|| "the metadata entry count".into())?;

        let mut metadata = Vec::with_capacity(n_kv);
        let mut meta_index = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = p.string(&|| format!("the key of metadata entry {i}"), &|reason| {
                format!("entry {i}: key {reason}")
            })?;
            let ty = p.u32(&|| format!("the value type of metadata {key}"))?;
            let value = p.value(ty, &key, 1)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(p.bad_meta(&key, "the key appears twice".into()));
            }
            metadata.push((key, value));
        }
        let alignment = match meta_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let v = &metadata[i].1;
                match v.as_u64() {
                    Some(a) if a.is_power_of_two() && v.as_i64().is_some() => a,
                    _ => {
                        return Err(p.bad_meta(
                            "general.alignment",
                            format!("{v:?} is not a power of two (a {} of at most 2^62)", v.type_name()),
                        ))
                    }
                }
            }
        };

        // Each tensor info takes at least: name length + n_dims + type + offset.
        let n_tensors = p.count(n_tensors, 8 + 4 + 4 + 8, &|| "the tensor count".into())?;
        let mut raw = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            raw.push(p.tensor_info(i)?);
        }
        let file_len = bytes.len() as u64;
        let data_offset = align_up(p.pos as u64, alignment);
        let mut tensors = Vec::with_capacity(raw.len());
        let mut tensor_index = HashMap::with_capacity(raw.len());
        for (name, dims, ty, rel) in raw {
            let bad = |reason: String| GgufError::BadTensor {
                path: path.clone(),
                tensor: name.clone(),
                reason,
            };
            let n = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| bad(format!("dims {dims:?} have more elements than a u64 counts")))?;
            let row = dims.first().copied().unwrap_or(1);
            let block = ty.block_elems() as u64;
            if row % block != 0 {
                return Err(bad(format!(
                    "row length {row} is not a whole number of {ty} blocks ({block} elements)"
                )));
            }
            let size = (n / block)
                .checked_mul(ty.block_bytes() as u64)
                .ok_or_else(|| bad(format!("dims {dims:?} of {ty} take more bytes than a u64 counts")))?;
            if rel % alignment != 0 {
                return Err(bad(format!(
                    "data offset {rel} is not a multiple of the alignment {alignment}"
                )));
            }
            let start = data_offset.checked_add(rel);
            let end = start.and_then(|s| s.checked_add(size));
            match (start, end) {
                (Some(start), Some(end)) if end <= file_len => {
                    if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                        return Err(bad("the name appears twice".into()));
                    }
                    tensors.push(GgufTensor {
                        name,
                        dims,
                        ty,
                        offset: start,
                        size,
                    });
                }
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        path: path.clone(),
                        tensor: name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    })
                }
            }
        }
        let n_tensors = tensors.len();
        let copied = tensors.iter().filter(|t| qdot::supports(t.ty)).map(|t| t.size).sum();
        Ok(GgufFile {
            path,
            version,
            src,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
            repack: repack_policy(copied),
            copies: (0..n_tensors).map(|_| OnceLock::new()).collect(),
        })
    }

    /// Overrides [`repack_policy`]: whether matrices made from now on get
    /// a packed copy (where the type, width and CPU allow one).
    pub fn set_repack(&mut self, on: bool) {
        self.repack = on;
    }

    /// The file's path (as given to [`GgufFile::open`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Every metadata entry, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value of metadata `key`.
    pub fn meta(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's bytes, in place. `t` comes from this file's
    /// [`GgufFile::tensors`]; a range outside this file (a tensor of
    /// another file) gives an empty slice.
    pub fn tensor_bytes(&self, t: &GgufTensor) -> &[u8] {
        let range = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.offset.saturating_add(t.size)).ok());
        range.and_then(|(a, b)| self.src.bytes().get(a..b)).unwrap_or(&[])
    }

    /// The tensor `name`, or [`GgufError::MissingTensor`].
    fn find(&self, name: &str) -> Result<&GgufTensor, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            path: self.path.clone(),
            name: name.to_string(),
        })
    }

    /// Checks `t.dims` against `expected` (ggml order), missing trailing
    /// dims on either side counting as 1.
    fn check_dims(&self, t: &GgufTensor, expected: &[u64]) -> Result<(), GgufError> {
        let n = t.dims.len().max(expected.len());
        let at = |d: &[u64], i: usize| d.get(i).copied().unwrap_or(1);
        if (0..n).all(|i| at(&t.dims, i) == at(expected, i)) {
            Ok(())
        } else {
            Err(GgufError::ShapeMismatch {
                path: self.path.clone(),
                tensor: t.name.clone(),
                dims: t.dims.clone(),
                expected: expected.to_vec(),
            })
        }
    }

    /// A 2-D weight `[rows, cols]` (ggml dims `[cols, rows]`), blocks used
    /// as stored (no re-quantization); F32 / F16 / BF16 map to the plain
    /// [`WeightData`] variants, quantized types to [`WeightData::Gguf`].
    /// Borrows the mapped file (floats are copied only when their address
    /// is not aligned for their type).
    pub fn weight(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, GgufError> {
        let t = self.find(name)?;
        self.check_dims(t, &[cols as u64, rows as u64])?;
        self.make_weight(t, t.offset, rows, cols)
    }

    /// Slice `index` of a stacked 3-D tensor `[n, rows, cols]` (ggml dims
    /// `[cols, rows, n]`), e.g. expert `index` of `blk.N.ffn_gate_exps.weight`,
    /// as [`GgufFile::weight`] gives a 2-D one, without copying.
    pub fn weight_slice(&self, name: &str, index: usize, rows: usize, cols: usize) -> Result<Weight, GgufError> {
        let t = self.find(name)?;
        let count = t.dims.get(2).copied().unwrap_or(1);
        self.check_dims(t, &[cols as u64, rows as u64, count])?;
        if index as u64 >= count {
            return Err(GgufError::SliceOutOfRange {
                path: self.path.clone(),
                tensor: t.name.clone(),
                index,
                count,
            });
        }
        // Bounded by the tensor's size, which lies in the file: no overflow.
        let slice_bytes = t.size / count;
        self.make_weight(t, t.offset + index as u64 * slice_bytes, rows, cols)
    }

    /// `[rows, cols]` of `t`'s type whose bytes start at absolute `start`
    /// (the caller has checked that they lie inside `t`).
    fn make_weight(&self, t: &GgufTensor, start: u64, rows: usize, cols: usize) -> Result<Weight, GgufError> {
        // The caller matched `rows` and `cols` to the dims, and the tensor
        // lies in the mapped file: these products are at most its size.
        let start = start as usize;
        let src = self.src.clone();
        let data = match t.ty {
            GgmlType::F32 => WeightData::F32(Buf::shared(src, start, rows * cols)),
            GgmlType::F16 => WeightData::F16(Buf::shared(src, start, rows * cols)),
            GgmlType::BF16 => WeightData::BF16(Buf::shared(src, start, rows * cols)),
            ty => {
                // Whole blocks (checked at open), so `row_bytes` is `Some`.
                let bytes = rows * ty.row_bytes(cols).unwrap_or(0);
                let data = match self.plain_copy(t, cols) {
                    Some(copy) => Buf::shared(copy, start - t.offset as usize, bytes),
                    None => Buf::shared(src, start, bytes),
                };
                WeightData::Gguf { ty, data }
            }
        };
        let w = Weight::try_new(rows, cols, data).map_err(|e| GgufError::BadTensor {
            path: self.path.clone(),
            tensor: t.name.clone(),
            reason: e.to_string(),
        })?;
        let w = match self.packed_copy(t, cols) {
            Some(copy) => w.with_packed(copy, start - t.offset as usize),
            None => w,
        };
        crate::load_progress::add(w.data().byte_len() as u64);
        Ok(w)
    }

    /// `t`'s bytes copied as they are onto huge pages, for the quantized
    /// tensors that get no packed copy (Q4_1, Q5_0, Q5_1, rows narrower
    /// than a chunk...): decode streams them too, and the file's mapping is on
    /// huge pages only when the page cache happens to hold them in large
    /// folios (the Q6_K output head of the Q4_0 benchmark file took 5 ms
    /// per token from the mapping in one state of the page cache and 7 ms
    /// in another). Made on first use when the file repacks; `None`
    /// otherwise, or if the OS refused the memory.
    fn plain_copy(&self, t: &GgufTensor, cols: usize) -> Option<Arc<dyn ByteSource>> {
        if !self.repack || qdot::tiled::packable(t.ty, cols) || !qdot::supports(t.ty) {
            return None;
        }
        let i = *self.tensor_index.get(&t.name)?;
        let copy = self.copies[i].get_or_init(|| {
            let bytes = self.tensor_bytes(t);
            HugeBuf::filled(bytes.len(), |out| out.copy_from_slice(bytes))
                .ok()
                .map(Arc::new)
        });
        copy.clone().map(|c| c as Arc<dyn ByteSource>)
    }

    /// `t`'s rows (`cols` wide) repacked for this CPU ([`Weight::with_packed`]),
    /// made on first use when the file repacks and the type and width allow;
    /// `None` otherwise, or if the OS refused the memory.
    fn packed_copy(&self, t: &GgufTensor, cols: usize) -> Option<Arc<dyn ByteSource>> {
        if !self.repack || !qdot::tiled::packable(t.ty, cols) {
            return None;
        }
        let i = *self.tensor_index.get(&t.name)?;
        let copy = self.copies[i].get_or_init(|| {
            let bytes = self.tensor_bytes(t);
            let row_bytes = t.ty.row_bytes(cols)?;
            // Whole rows (checked at open); anything else stays unpacked.
            let rows = bytes.len() / row_bytes;
            if rows * row_bytes != bytes.len() {
                return None;
            }
            HugeBuf::filled(bytes.len(), |out| {
                qdot::tiled::pack_rows_into(t.ty, bytes, rows, cols, out)
            })
            .ok()
            .map(Arc::new)
        });
        copy.clone().map(|c| c as Arc<dyn ByteSource>)
    }

    /// A 1-D tensor of `len` elements (norms, biases) as f32, dequantized
    /// from any type.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, GgufError> {
        let t = self.find(name)?;
        self.check_dims(t, &[len as u64])?;
        let mut out = vec![0.0; len];
        dequantize_into(t.ty, self.tensor_bytes(t), &mut out);
        Ok(out)
    }
}

/// `x` rounded up to a multiple of `align` (a power of two at most 2^62),
/// saturating (a data offset past any file fails the bounds check).
fn align_up(x: u64, align: u64) -> u64 {
    x.div_ceil(align).saturating_mul(align)
}

/// A cursor over the header with the file's path for errors.
struct Parser<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Metadata array elements read so far (bounded by [`MAX_META_ELEMENTS`]).
    meta_elems: u64,
}

type What<'w> = &'w dyn Fn() -> String;

impl<'a> Parser<'a> {
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: usize, what: What) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                needed: n as u64,
                file_len: self.b.len() as u64,
            });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: What) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// `count` items of at least `min_bytes` each, if the rest of the file
    /// can hold them.
    fn count(&self, count: u64, min_bytes: usize, what: What) -> Result<usize, GgufError> {
        let limit = (self.remaining() / min_bytes) as u64;
        if count > limit {
            return Err(GgufError::TooLarge {
                path: self.path.to_path_buf(),
                what: what(),
                count,
                limit,
            });
        }
        Ok(count as usize)
    }

    /// A string: `u64` length and UTF-8 bytes. `not_utf8` turns a reason
    /// into the error for invalid UTF-8.
    fn string(&mut self, what: What, not_utf8: &dyn Fn(String) -> String) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let len = self.count(len, 1, &|| format!("the length of {}", what()))?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::BadMetadata {
                path: self.path.to_path_buf(),
                key: String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned(),
                reason: not_utf8(format!("is not UTF-8 ({e})")),
            }),
        }
    }

    fn bad_meta(&self, key: &str, reason: String) -> GgufError {
        GgufError::BadMetadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason,
        }
    }

    /// The smallest encoding of a value of type `ty`, or `None` for an
    /// unknown type.
    fn min_bytes(ty: u32) -> Option<usize> {
        Some(match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 => 8,
            9 => 4 + 8,
            10..=12 => 8,
            _ => return None,
        })
    }

    /// A value of type `ty` of metadata `key`, at array depth `depth`
    /// (1 for a top-level value).
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
        let what = || format!("the value of metadata {key}");
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(&what)?[0]),
            1 => MetaValue::I8(self.array::<1>(&what)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => match self.array::<1>(&what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.bad_meta(key, format!("bool byte {b} is neither 0 nor 1"))),
            },
            8 => MetaValue::Str(self.string(&what, &|reason| format!("string value {reason}")).map_err(
                |e| match e {
                    GgufError::BadMetadata { path, reason, .. } => GgufError::BadMetadata {
                        path,
                        key: key.to_string(),
                        reason,
                    },
                    e => e,
                },
            )?),
            9 => {
                if depth > MAX_ARRAY_DEPTH {
                    return Err(self.bad_meta(key, format!("arrays nested more than {MAX_ARRAY_DEPTH} deep")));
                }
                let elem = self.u32(&|| format!("the element type of metadata {key}"))?;
                let Some(min) = Self::min_bytes(elem) else {
                    return Err(self.bad_meta(key, format!("unknown array element type {elem}")));
                };
                let n = self.u64(&|| format!("the element count of metadata {key}"))?;
                let n = self.count(n, min, &|| format!("the element count of metadata {key}"))?;
                let left = MAX_META_ELEMENTS - self.meta_elems;
                if n as u64 > left {
                    return Err(GgufError::TooLarge {
                        path: self.path.to_path_buf(),
                        what: format!("the element count of metadata {key} (over all arrays)"),
                        count: n as u64,
                        limit: left,
                    });
                }
                self.meta_elems += n as u64;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(&what)?)),
            t => return Err(self.bad_meta(key, format!("unknown value type {t}"))),
        })
    }

    /// Tensor info `i`: name, dims, type and offset relative to the data.
    fn tensor_info(&mut self, i: usize) -> Result<(String, Vec<u64>, GgmlType, u64), GgufError> {
        let path = self.path.to_path_buf();
        let name = self
            .string(&|| format!("the name of tensor {i}"), &|reason| reason)
            .map_err(|e| match e {
                GgufError::BadMetadata { key, reason, .. } => GgufError::BadTensor {
                    path: path.clone(),
                    tensor: format!("{i} ({key:?})"),
                    reason: format!("name {reason}"),
                },
                e => e,
            })?;
        let bad = |reason: String| GgufError::BadTensor {
            path: path.clone(),
            tensor: name.clone(),
            reason,
        };
        let n_dims = self.u32(&|| format!("the dimension count of tensor {name}"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(bad(format!("{n_dims} dimensions; at most {MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let v = self.u64(&|| format!("dimension {d} of tensor {name}"))?;
            if v > i64::MAX as u64 {
                return Err(bad(format!("dimension {d} is {v}, more than ggml's i64 holds")));
            }
            dims.push(v);
        }
        let id = self.u32(&|| format!("the type of tensor {name}"))?;
        let Some(ty) = GgmlType::from_id(id) else {
            return Err(GgufError::UnsupportedType { path, tensor: name, id });
        };
        let offset = self.u64(&|| format!("the data offset of tensor {name}"))?;
        Ok((name, dims, ty, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn gguf_file_is_send_and_sync() {
        assert_send_sync::<GgufFile>();
    }

    #[test]
    fn gguf_weights_multiply_like_their_dequantized_matrix() {
        use crate::quant::{QuantError, WeightFormat};
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for ty in GgmlType::ALL {
            let (rows, cols) = (37, 2 * 256);
            let bytes: Vec<u8> = (0..rows)
                .flat_map(|_| dot::tests::random_row(&mut rng, ty, cols))
                .collect();
            let deq = dequantize(ty, &bytes, rows * cols).unwrap();
            let data = WeightData::Gguf {
                ty,
                data: Buf::owned(bytes.clone()),
            };
            assert_eq!(data.len(), rows * cols);
            let w = Weight::try_new(rows, cols, data).unwrap();
            assert_eq!(w.format(), WeightFormat::Gguf(ty));
            assert_eq!(w.format().to_string(), ty.name());
            assert_eq!(w.dtype(), None);
            assert_eq!(WeightFormat::Gguf(ty).storage(rows, cols).unwrap().total(), bytes.len());
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&w.data().to_f32_vec()), bits(&deq));
            let mut row = vec![0.0; cols];
            for r in [0, 1, rows - 1] {
                w.row_into(r, &mut row);
                assert_eq!(bits(&row), bits(&deq[r * cols..(r + 1) * cols]));
            }
            // matvec = matvec_seq = matmul = row_dot, bit for bit (six
            // activation rows: a group of four, as prefill tiles take them
            // — chunk-transposed for Q8_0 / Q4_0 on x86 — and two more).
            let n = 6;
            let xs = dot::tests::acts(&mut rng, n * cols);
            let mut batched = vec![0.0; n * rows];
            w.matmul(&xs, n, &mut batched);
            for (t, x) in xs.chunks_exact(cols).enumerate() {
                let (mut one, mut seq) = (vec![0.0; rows], vec![0.0; rows]);
                w.matvec(x, &mut one);
                w.matvec_seq(x, &mut seq);
                assert_eq!(bits(&one), bits(&seq));
                assert_eq!(bits(&one), bits(&batched[t * rows..(t + 1) * rows]));
                // Quantized blocks run in integers on 8-bit activations.
                let rb = ty.row_bytes(cols).unwrap();
                let q8 = qdot::Q8Acts::new(x);
                for (r, &v) in one.iter().enumerate() {
                    let row = &bytes[r * rb..(r + 1) * rb];
                    let want = if ty.is_quantized() {
                        qdot::dot(ty, row, &q8)
                    } else {
                        dot::dot(ty, row, x)
                    };
                    assert_eq!(v.to_bits(), want.to_bits());
                    if r < 3 {
                        assert_eq!(w.row_dot(r, x).to_bits(), want.to_bits());
                    }
                }
            }
            // Converting out of GGUF dequantizes; converting into it is refused.
            let f = w.to_format(WeightFormat::F32).unwrap();
            assert_eq!(bits(&f.data().to_f32_vec()), bits(&deq));
            assert_eq!(
                f.to_format(WeightFormat::Gguf(ty)).err(),
                Some(QuantError::NoQuantizer {
                    format: WeightFormat::Gguf(ty)
                })
            );
            // Shapes that do not fit the blocks are errors, not panics.
            let data = |n| WeightData::Gguf {
                ty,
                data: Buf::owned(vec![0u8; n]),
            };
            assert!(matches!(
                Weight::try_new(rows, cols, data(bytes.len() - 1)),
                Err(QuantError::LenMismatch { .. })
            ));
            if ty.is_quantized() {
                assert!(matches!(
                    Weight::try_new(1, ty.block_elems() + 1, data(bytes.len())),
                    Err(QuantError::GroupNotDividing { .. })
                ));
            }
        }
    }

    #[test]
    fn align_up_rounds_and_saturates() {
        assert_eq!(align_up(0, 32), 0);
        assert_eq!(align_up(1, 32), 32);
        assert_eq!(align_up(64, 64), 64);
        assert_eq!(align_up(u64::MAX - 3, 1 << 62), u64::MAX);
    }
}
