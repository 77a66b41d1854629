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
    /// Bytes to read: `len` rounded up to [`RECORD_ALIGN`].
    pub fn padded_len(&self) -> u64 {
        self.len.div_ceil(RECORD_ALIGN) * RECORD_ALIGN
    }
}

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

/// Gate, up and down of one expert record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    pub parts: [PartLayout; 3],
    /// Meaningful bytes of the record.
    pub len: usize,
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
        let sizes = match quant {
            Quant::Bf16 => Ok(crate::quant::QuantBytes {
                scale_bytes: 0,
                value_bytes: rows * cols * 2,
            }),
            Quant::Int8 { .. } => crate::quant::int8_bytes(rows, cols, group),
            Quant::Int4 { .. } => crate::quant::int4_bytes(rows, cols, group),
            Quant::Gguf => {
                let ty = types.map(|t| t[i]).unwrap_or(GgmlType::F32);
                ty.row_bytes(cols)
                    .map(|b| crate::quant::QuantBytes {
                        scale_bytes: 0,
                        value_bytes: rows * b,
                    })
                    .ok_or_else(|| crate::QuantError::GroupNotDividing {
                        cols,
                        group: ty.block_elems(),
                    })
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
        offset = (offset + scale_bytes + value_bytes).div_ceil(PART_ALIGN) * PART_ALIGN;
    }
    let last = parts[2];
    Ok(RecordLayout {
        parts,
        len: last.offset + last.scale_bytes + last.value_bytes,
    })
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
            if name.contains('/') || name.contains('\\') || name.starts_with('.') {
                return Err(mismatch(format!("file name {name} is not a plain file name")));
            }
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
        for r in &self.records {
            let layout = self.layout(r)?;
            if r.offset % RECORD_ALIGN != 0 || r.len != layout.len as u64 || r.offset + r.padded_len() > experts_len {
                return Err(mismatch(format!(
                    "record of layer {} expert {} (offset {}, length {}) does not fit {}",
                    r.layer, r.expert, r.offset, r.len, self.experts_file
                )));
            }
        }
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

    /// The byte layout of one of this manifest's records.
    pub fn layout(&self, r: &Record) -> Result<RecordLayout, ContainerError> {
        record_layout_typed(self.hidden_size, self.moe_intermediate_size, self.quant, r.ggml_types)
    }

    /// The record of `(layer, expert)`, if stored.
    pub fn record(&self, layer: u16, expert: u32) -> Option<&Record> {
        self.records.iter().find(|r| r.layer == layer && r.expert == expert)
    }
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
        let mut head = vec![0u8; len.min(1 << 20) as usize - 8];
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
        let values = p.offset + p.scale_bytes;
        let data = match quant {
            Quant::Gguf => {
                let n = p.rows * p.cols;
                match p.ggml {
                    Some(GgmlType::F32) => WeightData::F32(Buf::shared(src.clone(), values, n)),
                    Some(GgmlType::F16) => WeightData::F16(Buf::shared(src.clone(), values, n)),
                    Some(GgmlType::BF16) => WeightData::BF16(Buf::shared(src.clone(), values, n)),
                    Some(ty) => WeightData::Gguf {
                        ty,
                        data: Buf::shared(src.clone(), values, p.value_bytes),
                    },
                    None => return Err(ContainerError::Layout("gguf part without a type".into())),
                }
            }
            Quant::Bf16 => WeightData::BF16(Buf::shared(src.clone(), p.offset, p.rows * p.cols)),
            Quant::Int8 { .. } => WeightData::int8(
                p.rows,
                p.cols,
                p.group,
                Buf::shared(src.clone(), p.offset, p.scale_bytes / 4),
                Buf::shared(src.clone(), values, p.value_bytes),
            )
            .map_err(bad)?,
            Quant::Int4 { .. } => WeightData::int4(
                p.rows,
                p.cols,
                p.group,
                Buf::shared(src.clone(), p.offset, p.scale_bytes / 4),
                Buf::shared(src.clone(), values, p.value_bytes),
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
}
