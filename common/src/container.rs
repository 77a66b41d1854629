//! charm's model container: the dense part in one safetensors file the
//! coordinator maps at start, and the routed experts in one file where a
//! single read fetches a single expert.
//!
//! ```text
//! DIR/
//!   manifest.json        format + version, architecture, the source config,
//!                        quantization, per-expert offset/length/checksum,
//!                        model fingerprint
//!   config.json          the source config (so every loader reads one format)
//!   dense.safetensors    embeddings, attention, norms, routers, shared
//!                        experts, dense MLPs, head (source dtype; norms and
//!                        routers f32)
//!   experts.bin          one record per (layer, expert): gate, up, down
//!                        (then their f32 biases when the manifest says
//!                        `expert_bias`, gpt-oss)
//!                        adjacent, each part 64-byte aligned, each record
//!                        4096-byte aligned and padded (O_DIRECT-ready)
//!   tokenizer.json, tokenizer_config.json, generation_config.json,
//!   chat_template.jinja  copied when the source has them
//! ```
//!
//! A record part is, by quantization ([`Quant`]):
//! - `bf16`: `rows × cols` bf16 values;
//! - `int8`: `rows × groups` f32 scales, then `rows × cols` i8 values;
//! - `int4`: `rows × groups` f32 scales, then `rows × cols / 2` bytes of
//!   packed nibbles (see [`crate::quant`]).
//!
//! The fingerprint is a SHA-256 over the architecture, the config, the
//! quantization, the dense file's checksum and every record's checksum: it
//! changes when any weight changes.

use std::path::{Path, PathBuf};

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::gguf::GgmlType;
use crate::weight::{Buf, ByteSource, Weight, WeightData};

/// `format` of every charm container manifest.
pub const FORMAT_NAME: &str = "charm-container";
/// The newest container format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Alignment (and padding) of every expert record.
pub const RECORD_ALIGN: u64 = 4096;
/// Alignment of each part inside a record.
pub const PART_ALIGN: usize = 64;
/// File names inside a container.
pub const MANIFEST: &str = "manifest.json";
pub const DENSE_FILE: &str = "dense.safetensors";
pub const EXPERTS_FILE: &str = "experts.bin";

/// How routed experts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Quant {
    /// bf16 values (lossless for bf16 checkpoints).
    Bf16,
    /// Symmetric int8 with one f32 scale per `group` columns
    /// (`group == 0` in the manifest means one scale per row).
    Int8 { group: usize },
    /// Symmetric int4 with one f32 scale per `group` columns (32 or 64).
    Int4 { group: usize },
    /// The GGUF blocks of the source file, byte for byte; each record names
    /// its parts' GGUF types ([`Record::ggml_types`]).
    Gguf,
}

impl Quant {
    /// Columns per scale for a matrix of `cols` columns (bf16: none).
    pub fn group_for(self, cols: usize) -> usize {
        match self {
            Quant::Bf16 => cols,
            Quant::Int8 { group: 0 } => cols,
            Quant::Int8 { group } | Quant::Int4 { group } => group,
            Quant::Gguf => cols,
        }
    }

    /// Short name (`bf16`, `int8`, `int4`).
    pub fn name(self) -> &'static str {
        match self {
            Quant::Bf16 => "bf16",
            Quant::Int8 { .. } => "int8",
            Quant::Int4 { .. } => "int4",
            Quant::Gguf => "gguf",
        }
    }
}

/// Where one expert's record lies in `experts.bin`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub layer: u16,
    pub expert: u32,
    /// Byte offset, a multiple of [`RECORD_ALIGN`].
    pub offset: u64,
    /// Meaningful bytes (the layout size, before padding).
    pub len: u64,
    /// CRC-32 (IEEE) of the `len` meaningful bytes.
    pub crc32: u32,
    /// GGUF type ids of gate, up and down (only for [`Quant::Gguf`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ggml_types: Option<[u32; 3]>,
}

impl Record {
    /// Bytes to read: `len` rounded up to [`RECORD_ALIGN`]. Saturates at
    /// `u64::MAX` for a length no file can hold ([`Manifest::open`] refuses
    /// such a record; see [`Record::checked_padded_len`]).
    pub fn padded_len(&self) -> u64 {
        self.checked_padded_len().unwrap_or(u64::MAX)
    }

    /// `len` rounded up to [`RECORD_ALIGN`], or `None` when that overflows.
    pub fn checked_padded_len(&self) -> Option<u64> {
        self.len.checked_next_multiple_of(RECORD_ALIGN)
    }

    /// Where the padded record ends (`offset + padded_len`), or `None` when
    /// that overflows.
    pub fn checked_end(&self) -> Option<u64> {
        self.offset.checked_add(self.checked_padded_len()?)
    }
}

/// Layer indices a manifest may name are below this (as on the wire).
pub const MAX_LAYERS: u32 = 4096;
/// Expert indices a manifest may name are below this (as on the wire).
pub const MAX_EXPERTS: u32 = 1 << 20;
/// Most `(layer, expert)` cells the indices of one manifest may span,
/// `(highest layer + 1) × (highest expert + 1)`: per-expert tables (routing
/// history, counters) are that large. Released MoE models span under
/// 40,000 (61 layers × 384 experts).
pub const MAX_INDEX_CELLS: u64 = 1 << 22;
/// Longest fingerprint a manifest may carry (a SHA-256 is 64 hex digits).
pub const MAX_FINGERPRINT_LEN: usize = 128;

/// `manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub architecture: String,
    /// The source `config.json`, verbatim.
    pub config: Value,
    pub quant: Quant,
    pub hidden_size: usize,
    pub moe_intermediate_size: usize,
    pub dense_file: String,
    /// Size of the dense file and CRC-32 of its safetensors header: ties the
    /// manifest to this container's dense part.
    pub dense_len: u64,
    pub dense_header_crc32: u32,
    pub experts_file: String,
    pub experts_len: u64,
    pub records: Vec<Record>,
    /// Hex SHA-256; changes when any weight changes.
    pub fingerprint: String,
    /// Each record ends with its projections' biases (gpt-oss's experts):
    /// gate `[inter]`, up `[inter]`, down `[hidden]`, f32 ([`RecordLayout::bias`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expert_bias: bool,
    /// The experts' GLU is gpt-oss's clamped one, `[alpha, limit]`
    /// (`None`: SwiGLU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_glu_clamp: Option<[f32; 2]>,
}

/// The byte layout of one matrix inside a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartLayout {
    /// Offset inside the record.
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    /// Columns per scale (equal to `cols` for per-row; unused for bf16).
    pub group: usize,
    /// f32 scale bytes at `offset` (0 for bf16).
    pub scale_bytes: usize,
    /// Value bytes right after the scales.
    pub value_bytes: usize,
    /// The GGUF block type of the values ([`Quant::Gguf`] only).
    pub ggml: Option<GgmlType>,
}

/// Gate, up and down of one expert record (and their biases).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    pub parts: [PartLayout; 3],
    /// Offset of the biases, when the record has them: `2 * inter + hidden`
    /// f32 values (gate, up, down), 64-byte aligned after the parts.
    pub bias: Option<usize>,
    /// Meaningful bytes of the record.
    pub len: usize,
}

impl RecordLayout {
    /// This layout with the biases of a `hidden` × `inter` expert after its parts.
    pub fn with_bias(self, hidden: usize, inter: usize) -> Result<RecordLayout, ContainerError> {
        let offset = self.len.next_multiple_of(PART_ALIGN);
        let len = inter
            .checked_mul(2)
            .and_then(|n| n.checked_add(hidden))
            .and_then(|n| n.checked_mul(4))
            .and_then(|n| n.checked_add(offset))
            .ok_or_else(|| ContainerError::Layout(format!("biases of a {hidden} × {inter} expert are too large")))?;
        Ok(RecordLayout {
            bias: Some(offset),
            len,
            ..self
        })
    }
}

/// A container that cannot be read or does not fit together.
#[derive(Debug, Error)]
pub enum ContainerError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The manifest is not JSON, or not a charm container manifest.
    #[error("{}: {reason}", path.display())]
    BadManifest { path: PathBuf, reason: String },
    /// The container was written by a newer charm.
    #[error("{}: container format version {found} is newer than this charm reads (up to {FORMAT_VERSION}); upgrade charm or re-convert", path.display())]
    NewerVersion { path: PathBuf, found: u64 },
    /// The manifest does not describe the files next to it.
    #[error("{}: {reason}", path.display())]
    Mismatch { path: PathBuf, reason: String },
    /// An expert record's bytes do not match their checksum.
    #[error("{}: layer {layer} expert {expert}: checksum mismatch (expected {expected:08x}, got {got:08x}); the file is corrupt", path.display())]
    Checksum {
        path: PathBuf,
        layer: u16,
        expert: u32,
        expected: u32,
        got: u32,
    },
    /// One record of the manifest is impossible: it overflows, lies beyond
    /// the end of the expert file, is misaligned, has the wrong length, an
    /// out-of-range index, or repeats another record.
    #[error("{}: record of layer {layer} expert {expert} (offset {offset}, length {len}): {reason}", path.display())]
    BadRecord {
        path: PathBuf,
        layer: u16,
        expert: u32,
        offset: u64,
        len: u64,
        reason: String,
    },
    /// The shape cannot be stored in this quantization.
    #[error("{0}")]
    Layout(String),
}

/// The layout of an expert with `hidden` → `inter` → `hidden`.
pub fn record_layout(hidden: usize, inter: usize, quant: Quant) -> Result<RecordLayout, ContainerError> {
    record_layout_typed(hidden, inter, quant, None)
}

/// [`record_layout`] with the GGUF types of gate, up and down, which a
/// [`Quant::Gguf`] record needs.
pub fn record_layout_typed(
    hidden: usize,
    inter: usize,
    quant: Quant,
    ggml: Option<[u32; 3]>,
) -> Result<RecordLayout, ContainerError> {
    let types: Option<[GgmlType; 3]> = match (quant, ggml) {
        (Quant::Gguf, Some(ids)) => {
            let t = |id: u32| {
                GgmlType::from_id(id).ok_or_else(|| ContainerError::Layout(format!("unknown GGUF type id {id}")))
            };
            Some([t(ids[0])?, t(ids[1])?, t(ids[2])?])
        }
        (Quant::Gguf, None) => return Err(ContainerError::Layout("a gguf record without its part types".into())),
        (_, _) => None,
    };
    let mut offset = 0;
    let mut parts = [PartLayout {
        offset: 0,
        rows: 0,
        cols: 0,
        group: 0,
        scale_bytes: 0,
        value_bytes: 0,
        ggml: None,
    }; 3];
    for (i, (rows, cols)) in [(inter, hidden), (inter, hidden), (hidden, inter)]
        .into_iter()
        .enumerate()
    {
        let group = quant.group_for(cols);
        if group == 0 || cols % group != 0 {
            return Err(ContainerError::Layout(format!(
                "{} group size {group} does not divide the row length {cols}",
                quant.name()
            )));
        }
        let too_large = || {
            ContainerError::Layout(format!(
                "{}: a {rows} × {cols} matrix is too large to address",
                quant.name()
            ))
        };
        let sizes = match quant {
            Quant::Bf16 => Ok(crate::quant::QuantBytes {
                scale_bytes: 0,
                value_bytes: rows
                    .checked_mul(cols)
                    .and_then(|n| n.checked_mul(2))
                    .ok_or_else(too_large)?,
            }),
            Quant::Int8 { .. } => crate::quant::int8_bytes(rows, cols, group),
            Quant::Int4 { .. } => crate::quant::int4_bytes(rows, cols, group),
            Quant::Gguf => {
                let ty = types.map(|t| t[i]).unwrap_or(GgmlType::F32);
                match ty.row_bytes(cols) {
                    Some(b) => Ok(crate::quant::QuantBytes {
                        scale_bytes: 0,
                        value_bytes: rows.checked_mul(b).ok_or_else(too_large)?,
                    }),
                    None if cols.is_multiple_of(ty.block_elems()) => return Err(too_large()),
                    None => Err(crate::QuantError::GroupNotDividing {
                        cols,
                        group: ty.block_elems(),
                    }),
                }
            }
        }
        .map_err(|e| ContainerError::Layout(format!("{}: {e}", quant.name())))?;
        let (scale_bytes, value_bytes) = (sizes.scale_bytes, sizes.value_bytes);
        parts[i] = PartLayout {
            offset,
            rows,
            cols,
            group,
            scale_bytes,
            value_bytes,
            ggml: types.map(|t| t[i]),
        };
        offset = offset
            .checked_add(scale_bytes)
            .and_then(|o| o.checked_add(value_bytes))
            .and_then(|o| o.checked_next_multiple_of(PART_ALIGN))
            .ok_or_else(too_large)?;
    }
    let last = parts[2];
    let len = last.offset + last.scale_bytes + last.value_bytes;
    // Every record is read whole into memory, padded to RECORD_ALIGN.
    if (len as u64).checked_next_multiple_of(RECORD_ALIGN).is_none() || len > isize::MAX as usize {
        return Err(ContainerError::Layout(format!(
            "{}: an expert of {hidden} → {inter} → {hidden} is too large to address",
            quant.name()
        )));
    }
    Ok(RecordLayout { parts, bias: None, len })
}

/// Whether `dir` is a charm container (has a manifest).
pub fn is_container(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

impl Manifest {
    /// Reads and checks `dir/manifest.json`: format name, version (a newer
    /// one is refused by number), record alignment and bounds, and that the
    /// dense and expert files next to it are the ones it describes.
    pub fn open(dir: &Path) -> Result<Manifest, ContainerError> {
        let path = dir.join(MANIFEST);
        let bad = |reason: String| ContainerError::BadManifest {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ContainerError::Io {
            path: path.clone(),
            source,
        })?;
        let raw: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        if raw.get("format").and_then(Value::as_str) != Some(FORMAT_NAME) {
            return Err(bad(format!("not a {FORMAT_NAME} manifest")));
        }
        let version = raw
            .get("format_version")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("no format_version".into()))?;
        if version > FORMAT_VERSION as u64 {
            return Err(ContainerError::NewerVersion { path, found: version });
        }
        let m: Manifest = serde_json::from_value(raw).map_err(|e| bad(format!("malformed: {e}")))?;
        m.check(dir, &path)?;
        Ok(m)
    }

    fn check(&self, dir: &Path, path: &Path) -> Result<(), ContainerError> {
        let mismatch = |reason: String| ContainerError::Mismatch {
            path: path.to_path_buf(),
            reason,
        };
        for name in [&self.dense_file, &self.experts_file] {
            if name.is_empty() || name.contains(['/', '\\', '\0']) || name.starts_with('.') {
                return Err(mismatch(format!("file name {name:?} is not a plain file name")));
            }
        }
        if !is_plain_fingerprint(&self.fingerprint) {
            return Err(ContainerError::BadManifest {
                path: path.to_path_buf(),
                reason: format!(
                    "fingerprint {:?} is not 1 to {MAX_FINGERPRINT_LEN} letters, digits, - or _",
                    self.fingerprint.chars().take(80).collect::<String>()
                ),
            });
        }
        let experts_path = dir.join(&self.experts_file);
        let experts_len = file_len(&experts_path)?;
        if experts_len != self.experts_len {
            return Err(ContainerError::Mismatch {
                path: experts_path,
                reason: format!(
                    "is {experts_len} bytes but the manifest says {}; the file is truncated or from another conversion",
                    self.experts_len
                ),
            });
        }
        self.check_records(path, experts_len)?;
        let dense_path = dir.join(&self.dense_file);
        let (dense_len, header_crc) = dense_identity(&dense_path)?;
        if dense_len != self.dense_len || header_crc != self.dense_header_crc32 {
            return Err(mismatch(format!(
                "describes another model: {} differs (size {dense_len} vs {}, header checksum {header_crc:08x} vs {:08x})",
                self.dense_file, self.dense_len, self.dense_header_crc32
            )));
        }
        if self.config.is_null() {
            // A GGUF container: its config is the dense GGUF's metadata,
            // already tied to the manifest by the dense identity above.
            return Ok(());
        }
        let config_path = dir.join("config.json");
        let config: Value = std::fs::read_to_string(&config_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .ok_or_else(|| ContainerError::Mismatch {
                path: config_path.clone(),
                reason: "missing or not valid JSON".into(),
            })?;
        if config != self.config {
            return Err(mismatch(
                "describes another model: config.json differs from the manifest's config".into(),
            ));
        }
        Ok(())
    }

    /// Checks every record against the expert file's length `experts_len`
    /// with checked arithmetic: indices in range and each listed once, the
    /// length this manifest's shape and quantization give, the offset
    /// aligned, and `offset + padded_len` inside the file. Errors name the
    /// record and `manifest_path`. [`Manifest::open`] runs it; a store handed
    /// a manifest from elsewhere should too.
    pub fn check_records(&self, manifest_path: &Path, experts_len: u64) -> Result<(), ContainerError> {
        let path = manifest_path;
        let mut seen = std::collections::HashSet::with_capacity(self.records.len().min(1 << 16));
        let mut span = (0u16, 0u32);
        for r in &self.records {
            let bad = |reason: String| ContainerError::BadRecord {
                path: path.to_path_buf(),
                layer: r.layer,
                expert: r.expert,
                offset: r.offset,
                len: r.len,
                reason,
            };
            if u32::from(r.layer) >= MAX_LAYERS || r.expert >= MAX_EXPERTS {
                return Err(bad(format!(
                    "index out of range (at most {MAX_LAYERS} layers of {MAX_EXPERTS} experts)"
                )));
            }
            span = (span.0.max(r.layer), span.1.max(r.expert));
            let cells = (u64::from(span.0) + 1) * (u64::from(span.1) + 1);
            if cells > MAX_INDEX_CELLS {
                return Err(bad(format!(
                    "with the records before it, the indices span {cells} (layer, expert) cells, \
                     more than {MAX_INDEX_CELLS}"
                )));
            }
            if !seen.insert((r.layer, r.expert)) {
                return Err(bad("listed twice".into()));
            }
            let layout = self.layout(r).map_err(|e| bad(e.to_string()))?;
            if r.len != layout.len as u64 {
                return Err(bad(format!(
                    "the length should be {} for this model's shape and quantization",
                    layout.len
                )));
            }
            if r.offset % RECORD_ALIGN != 0 {
                return Err(bad(format!("the offset is not a multiple of {RECORD_ALIGN}")));
            }
            match r.checked_end() {
                Some(end) if end <= experts_len => {}
                Some(end) => {
                    return Err(bad(format!(
                        "ends at byte {end}, beyond the end of {} ({experts_len} bytes)",
                        self.experts_file
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "offset + padded length overflows; it cannot lie inside {}",
                        self.experts_file
                    )))
                }
            }
        }
        Ok(())
    }

    /// The byte layout of one of this manifest's records.
    pub fn layout(&self, r: &Record) -> Result<RecordLayout, ContainerError> {
        let l = record_layout_typed(self.hidden_size, self.moe_intermediate_size, self.quant, r.ggml_types)?;
        if self.expert_bias {
            l.with_bias(self.hidden_size, self.moe_intermediate_size)
        } else {
            Ok(l)
        }
    }

    /// The record of `(layer, expert)`, if stored.
    pub fn record(&self, layer: u16, expert: u32) -> Option<&Record> {
        self.records.iter().find(|r| r.layer == layer && r.expert == expert)
    }
}

/// Whether a fingerprint is plain: 1 to [`MAX_FINGERPRINT_LEN`] ASCII
/// letters, digits, `-` or `_` (converters write hex digits), and so safe as
/// a path component or in a message.
pub fn is_plain_fingerprint(fingerprint: &str) -> bool {
    !fingerprint.is_empty()
        && fingerprint.len() <= MAX_FINGERPRINT_LEN
        && fingerprint
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Size of a file.
pub fn file_len(path: &Path) -> Result<u64, ContainerError> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| ContainerError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// `(size, CRC-32 of the safetensors header)` of a dense file: cheap to
/// compute at every start, and different for any other model.
pub fn dense_identity(path: &Path) -> Result<(u64, u32), ContainerError> {
    use std::io::Read;
    let io = |source| ContainerError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = file_len(path)?;
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(io)?;
    if &n[..4] == b"GGUF" {
        // GGUF: the header, metadata and tensor table lie at the start.
        let mut head = vec![0u8; (len.min(1 << 20) as usize).saturating_sub(8)];
        f.read_exact(&mut head).map_err(io)?;
        let mut h = crc32fast::Hasher::new();
        h.update(&n);
        h.update(&head);
        return Ok((len, h.finalize()));
    }
    let n = u64::from_le_bytes(n);
    if n > len.saturating_sub(8) || n > 100 << 20 {
        return Err(ContainerError::Mismatch {
            path: path.to_path_buf(),
            reason: "not a valid safetensors file (header length out of range)".into(),
        });
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io)?;
    Ok((len, crc32fast::hash(&header)))
}

/// The gate, up and down weights of one record held in `src` (borrowed in
/// place: parts are 64-byte aligned).
pub fn record_weights(
    src: Arc<dyn ByteSource>,
    layout: &RecordLayout,
    quant: Quant,
) -> Result<[Weight; 3], ContainerError> {
    if src.bytes().len() < layout.len {
        return Err(ContainerError::Layout(format!(
            "expert record of {} bytes is shorter than its layout ({} bytes)",
            src.bytes().len(),
            layout.len
        )));
    }
    let part = |p: &PartLayout| -> Result<Weight, ContainerError> {
        let bad = |e: crate::QuantError| ContainerError::Layout(e.to_string());
        let outside = || {
            ContainerError::Layout(format!(
                "a {} × {} part at offset {} does not lie inside its {}-byte record",
                p.rows,
                p.cols,
                p.offset,
                src.bytes().len()
            ))
        };
        let values = p.offset.checked_add(p.scale_bytes).ok_or_else(outside)?;
        let n = p.rows.checked_mul(p.cols).ok_or_else(outside)?;
        let data = match quant {
            Quant::Gguf => match p.ggml {
                Some(GgmlType::F32) => WeightData::F32(shared(&src, values, n).ok_or_else(outside)?),
                Some(GgmlType::F16) => WeightData::F16(shared(&src, values, n).ok_or_else(outside)?),
                Some(GgmlType::BF16) => WeightData::BF16(shared(&src, values, n).ok_or_else(outside)?),
                Some(ty) => WeightData::Gguf {
                    ty,
                    data: shared(&src, values, p.value_bytes).ok_or_else(outside)?,
                },
                None => return Err(ContainerError::Layout("gguf part without a type".into())),
            },
            Quant::Bf16 => WeightData::BF16(shared(&src, p.offset, n).ok_or_else(outside)?),
            Quant::Int8 { .. } => WeightData::int8(
                p.rows,
                p.cols,
                p.group,
                shared(&src, p.offset, p.scale_bytes / 4).ok_or_else(outside)?,
                shared(&src, values, p.value_bytes).ok_or_else(outside)?,
            )
            .map_err(bad)?,
            Quant::Int4 { .. } => WeightData::int4(
                p.rows,
                p.cols,
                p.group,
                shared(&src, p.offset, p.scale_bytes / 4).ok_or_else(outside)?,
                shared(&src, values, p.value_bytes).ok_or_else(outside)?,
            )
            .map_err(bad)?,
        };
        Weight::try_new(p.rows, p.cols, data).map_err(bad)
    };
    Ok([
        part(&layout.parts[0])?,
        part(&layout.parts[1])?,
        part(&layout.parts[2])?,
    ])
}

/// Writes an expert's biases (gate, up, down) where `layout` keeps them
/// in the record `buf` ([`RecordLayout::bias`]); nothing when it has none.
pub fn put_record_bias(buf: &mut [u8], layout: &RecordLayout, bias: [&[f32]; 3]) -> Result<(), ContainerError> {
    let Some(at) = layout.bias else { return Ok(()) };
    let (inter, hidden) = (layout.parts[0].rows, layout.parts[0].cols);
    if bias.map(<[f32]>::len) != [inter, inter, hidden] || buf.len() < layout.len {
        return Err(ContainerError::Layout(format!(
            "expert biases of {:?} values for a {hidden} × {inter} expert",
            bias.map(<[f32]>::len)
        )));
    }
    let values = bias.iter().flat_map(|b| b.iter());
    for (o, v) in buf[at..layout.len].chunks_exact_mut(4).zip(values) {
        o.copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// The biases a record ends with ([`RecordLayout::bias`]): gate, up and
/// down, or `None` when its layout has none.
pub fn record_bias(src: &[u8], layout: &RecordLayout) -> Result<Option<[Vec<f32>; 3]>, ContainerError> {
    let Some(at) = layout.bias else { return Ok(None) };
    let (inter, hidden) = (layout.parts[0].rows, layout.parts[0].cols);
    let bytes = src
        .get(at..layout.len)
        .filter(|b| b.len() == (2 * inter + hidden) * 4)
        .ok_or_else(|| {
            ContainerError::Layout(format!(
                "expert biases at {at}..{} do not lie inside a {}-byte record",
                layout.len,
                src.len()
            ))
        })?;
    let f: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Some([
        f[..inter].to_vec(),
        f[inter..2 * inter].to_vec(),
        f[2 * inter..].to_vec(),
    ]))
}

/// `len` elements of `T` at byte `start` of `src`, or `None` when that range
/// does not lie inside `src` (so [`Buf::shared`] cannot panic).
fn shared<T: bytemuck::Pod>(src: &Arc<dyn ByteSource>, start: usize, len: usize) -> Option<Buf<T>> {
    let end = len.checked_mul(std::mem::size_of::<T>())?.checked_add(start)?;
    (end <= src.bytes().len()).then(|| Buf::shared(src.clone(), start, len))
}

/// Checks a record's bytes against its checksum.
pub fn verify_record(path: &Path, record: &Record, bytes: &[u8]) -> Result<(), ContainerError> {
    let got = crc32fast::hash(&bytes[..(record.len as usize).min(bytes.len())]);
    if got != record.crc32 || bytes.len() < record.len as usize {
        return Err(ContainerError::Checksum {
            path: path.to_path_buf(),
            layer: record.layer,
            expert: record.expert,
            expected: record.crc32,
            got,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_aligned_and_sized() {
        let l = record_layout(64, 32, Quant::Bf16).unwrap();
        assert_eq!(l.parts[0].value_bytes, 32 * 64 * 2);
        assert_eq!(l.parts[1].offset, 4096);
        assert_eq!(l.len, 3 * 4096);
        let l = record_layout(64, 32, Quant::Int4 { group: 32 }).unwrap();
        assert_eq!(l.parts[0].scale_bytes, 32 * 2 * 4);
        assert_eq!(l.parts[0].value_bytes, 32 * 32);
        assert!(l.parts.iter().all(|p| p.offset % PART_ALIGN == 0));
        let l = record_layout(64, 32, Quant::Int8 { group: 0 }).unwrap();
        assert_eq!(l.parts[2].group, 32);
        assert_eq!(l.parts[2].scale_bytes, 64 * 4);
        assert!(record_layout(64, 48, Quant::Int4 { group: 32 }).is_err());
    }

    /// A minimal valid bf16 container (hidden 64, intermediate 32: records of
    /// 3 × 4096 bytes) with `n` records in `dir`; returns its manifest.
    fn write_container(dir: &Path, n: u32) -> Manifest {
        let layout = record_layout(64, 32, Quant::Bf16).unwrap();
        let header = br#"{"__metadata__":{}}"#;
        let mut dense = (header.len() as u64).to_le_bytes().to_vec();
        dense.extend_from_slice(header);
        std::fs::write(dir.join(DENSE_FILE), &dense).unwrap();
        let record_len = layout.len as u64;
        let experts = vec![0u8; (record_len * u64::from(n)) as usize];
        std::fs::write(dir.join(EXPERTS_FILE), &experts).unwrap();
        let config = serde_json::json!({"hidden_size": 64});
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let records = (0..n)
            .map(|e| Record {
                layer: 0,
                expert: e,
                offset: u64::from(e) * record_len,
                len: record_len,
                crc32: crc32fast::hash(&experts[..layout.len]),
                ggml_types: None,
            })
            .collect();
        let m = Manifest {
            format: FORMAT_NAME.into(),
            format_version: FORMAT_VERSION,
            architecture: "MixtralForCausalLM".into(),
            config,
            quant: Quant::Bf16,
            hidden_size: 64,
            moe_intermediate_size: 32,
            dense_file: DENSE_FILE.into(),
            dense_len: dense.len() as u64,
            dense_header_crc32: crc32fast::hash(header),
            experts_file: EXPERTS_FILE.into(),
            experts_len: experts.len() as u64,
            records,
            fingerprint: "0123456789abcdef".into(),
            expert_bias: false,
            expert_glu_clamp: None,
        };
        write_manifest(dir, &m);
        m
    }

    fn write_manifest(dir: &Path, m: &Manifest) {
        std::fs::write(dir.join(MANIFEST), serde_json::to_string(m).unwrap()).unwrap();
    }

    /// Opens `dir` after `edit` changed its valid manifest; the error.
    fn open_edited(edit: impl FnOnce(&mut Manifest)) -> ContainerError {
        let tmp = tempfile::tempdir().unwrap();
        let mut m = write_container(tmp.path(), 3);
        Manifest::open(tmp.path()).expect("the unedited container opens");
        edit(&mut m);
        write_manifest(tmp.path(), &m);
        match Manifest::open(tmp.path()) {
            Ok(_) => panic!("an edited manifest opened"),
            Err(e) => e,
        }
    }

    /// A `BadRecord` naming layer 0 expert `expert`, whose reason contains `why`.
    fn assert_bad_record(e: &ContainerError, expert: u32, why: &str) {
        match e {
            ContainerError::BadRecord {
                path,
                layer: 0,
                expert: x,
                ..
            } if *x == expert => {
                let msg = e.to_string();
                assert!(path.ends_with(MANIFEST), "{msg}");
                assert!(msg.contains(&format!("layer 0 expert {expert}")), "{msg}");
                assert!(msg.contains(why), "{msg}");
            }
            other => panic!("expected BadRecord for expert {expert}, got {other:?}"),
        }
    }

    #[test]
    fn record_whose_offset_plus_length_overflows_is_a_typed_error() {
        // Aligned, right length, but offset + padded length wraps past u64::MAX
        // (and would land inside the file if it wrapped).
        let e = open_edited(|m| m.records[1].offset = u64::MAX - 4095);
        assert_bad_record(&e, 1, "overflows");
        let r = Record {
            offset: u64::MAX - 4095,
            len: 1,
            ..Record::default_for_test()
        };
        assert_eq!(r.checked_end(), None);
        let huge = Record {
            len: u64::MAX,
            ..Record::default_for_test()
        };
        assert_eq!(huge.checked_padded_len(), None);
        assert_eq!(huge.padded_len(), u64::MAX, "saturates instead of panicking");
    }

    #[test]
    fn record_beyond_the_end_of_the_expert_file_is_a_typed_error() {
        let e = open_edited(|m| m.records[2].offset += 4096);
        assert_bad_record(&e, 2, "beyond the end of experts.bin");
        let e = open_edited(|m| m.records[0].offset = 1 << 40);
        assert_bad_record(&e, 0, "beyond the end");
    }

    #[test]
    fn record_with_a_wrong_length_or_misaligned_offset_is_a_typed_error() {
        let e = open_edited(|m| m.records[1].len = u64::MAX);
        assert_bad_record(&e, 1, "length should be 12288");
        let e = open_edited(|m| m.records[1].offset += 64);
        assert_bad_record(&e, 1, "multiple of 4096");
    }

    #[test]
    fn record_listed_twice_or_with_out_of_range_indices_is_a_typed_error() {
        let e = open_edited(|m| m.records[2].expert = 0);
        assert_bad_record(&e, 0, "listed twice");
        let e = open_edited(|m| m.records[1].expert = u32::MAX);
        assert_bad_record(&e, u32::MAX, "out of range");
        // Indices that would make per-(layer, expert) tables huge.
        let e = open_edited(|m| {
            m.records[0].layer = (MAX_LAYERS - 1) as u16;
            m.records[1].expert = MAX_EXPERTS - 1;
        });
        assert!(
            matches!(e, ContainerError::BadRecord { expert, .. } if expert == MAX_EXPERTS - 1),
            "{e:?}"
        );
        assert!(e.to_string().contains("cells"), "{e}");
    }

    #[test]
    fn manifest_with_shapes_too_large_to_address_is_a_typed_error() {
        for (hidden, inter) in [(usize::MAX / 2, 2), (1 << 40, 1 << 40), (usize::MAX - 63, 64)] {
            let e = open_edited(|m| {
                m.hidden_size = hidden;
                m.moe_intermediate_size = inter;
            });
            assert_bad_record(&e, 0, "too large");
        }
        for quant in [Quant::Bf16, Quant::Int8 { group: 0 }, Quant::Int4 { group: 32 }] {
            assert!(matches!(
                record_layout(1 << 40, 1 << 40, quant),
                Err(ContainerError::Layout(_))
            ));
        }
        assert!(matches!(
            record_layout_typed(1 << 40, 1 << 40, Quant::Gguf, Some([0, 0, 0])),
            Err(ContainerError::Layout(_))
        ));
    }

    #[test]
    fn manifest_fingerprint_or_file_name_that_is_not_plain_is_refused() {
        for fp in [
            "../../etc/x",
            "a/b",
            "",
            "ab\\cd",
            "é",
            &"a".repeat(MAX_FINGERPRINT_LEN + 1),
        ] {
            let e = open_edited(|m| m.fingerprint = fp.to_string());
            assert!(
                matches!(e, ContainerError::BadManifest { .. }) && e.to_string().contains("fingerprint"),
                "{fp:?}: {e:?}"
            );
        }
        for name in ["", "../experts.bin", "a/b", ".hidden", "x\0y"] {
            let e = open_edited(|m| m.experts_file = name.to_string());
            assert!(
                matches!(e, ContainerError::Mismatch { .. }) && e.to_string().contains("plain file name"),
                "{name:?}: {e:?}"
            );
        }
        assert!(is_plain_fingerprint("0123abcdef"));
        assert!(is_plain_fingerprint("hf-0123_ABC"));
    }

    #[test]
    fn dense_file_shorter_than_its_length_prefix_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("d");
        std::fs::write(&path, b"GGU").unwrap();
        assert!(matches!(dense_identity(&path), Err(ContainerError::Io { .. })));
        std::fs::write(&path, b"GGUF\0\0\0\0").unwrap();
        assert!(dense_identity(&path).is_ok());
    }

    /// `record_weights` on a hand-made layout whose parts lie outside the
    /// record's bytes is an error, not a slice panic.
    #[test]
    fn record_weights_with_parts_outside_the_record_is_a_typed_error() {
        let layout = record_layout(64, 32, Quant::Int8 { group: 0 }).unwrap();
        let src: Arc<dyn ByteSource> = Arc::new(vec![0u8; layout.len]);
        assert!(record_weights(src.clone(), &layout, Quant::Int8 { group: 0 }).is_ok());
        for edit in [
            (|p: &mut PartLayout| p.offset = usize::MAX - 8) as fn(&mut PartLayout),
            |p| p.value_bytes = usize::MAX,
            |p| p.rows = usize::MAX,
            |p| p.scale_bytes = 1 << 40,
        ] {
            for quant in [Quant::Int8 { group: 0 }, Quant::Bf16] {
                let mut bad = layout;
                edit(&mut bad.parts[2]);
                match record_weights(src.clone(), &bad, quant) {
                    Err(ContainerError::Layout(_)) => {}
                    other => panic!(
                        "{quant:?} {bad:?}: expected a Layout error, got {:?}",
                        other.map(|_| ())
                    ),
                }
            }
        }
    }

    impl Record {
        fn default_for_test() -> Record {
            Record {
                layer: 0,
                expert: 0,
                offset: 0,
                len: 4096,
                crc32: 0,
                ggml_types: None,
            }
        }
    }

    #[test]
    fn expert_biases_follow_the_parts_and_read_back() {
        let plain = record_layout(64, 32, Quant::Bf16).unwrap();
        let l = plain.with_bias(64, 32).unwrap();
        let at = l.bias.unwrap();
        assert!(at >= plain.len && at.is_multiple_of(PART_ALIGN));
        assert_eq!(l.len, at + (2 * 32 + 64) * 4);
        let mut buf = vec![0u8; l.len];
        let (g, u, d) = (vec![1.5f32; 32], vec![-2.0f32; 32], vec![0.25f32; 64]);
        put_record_bias(&mut buf, &l, [&g, &u, &d]).unwrap();
        assert_eq!(record_bias(&buf, &l).unwrap(), Some([g.clone(), u.clone(), d.clone()]));
        assert_eq!(record_bias(&buf, &plain).unwrap(), None);
        // Wrong lengths and a short record are typed errors.
        assert!(matches!(
            put_record_bias(&mut buf, &l, [&g, &u, &g]),
            Err(ContainerError::Layout(_))
        ));
        assert!(matches!(
            record_bias(&buf[..l.len - 4], &l),
            Err(ContainerError::Layout(_))
        ));
    }
}
