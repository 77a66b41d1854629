//! Errors from reading GGUF files. Every variant but [`GgufError::DataLength`]
//! (from the file-less [`super::dequantize`]) names the file, and the tensor
//! or metadata key where there is one.

use std::path::PathBuf;

use thiserror::Error;

use super::types::{ggml_type_name, GgmlType};

/// The weight types charm reads, for error messages.
const SUPPORTED: &str =
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4";

/// `Q3_K (id 11)` or `unknown type id 99`.
fn type_desc(id: u32) -> String {
    match ggml_type_name(id) {
        Some(name) => format!("type {name} (id {id})"),
        None => format!("unknown type id {id}"),
    }
}

/// `version 1 (GGUF v1 used 32-bit counts; re-convert the file)`, ...
fn version_desc(version: u32) -> String {
    match version {
        1 => "version 1 (GGUF v1, superseded in 2023; re-convert the file with a current llama.cpp)".into(),
        v if matches!(v.swap_bytes(), 2 | 3) => format!(
            "version {v} (a big-endian GGUF v{}; charm reads little-endian files only)",
            v.swap_bytes()
        ),
        v => format!("version {v}"),
    }
}

fn length_desc(ty: GgmlType, n: usize, expected: Option<usize>, got: usize) -> String {
    match expected {
        Some(e) => format!("{n} elements of {ty} take {e} bytes, got {got}"),
        None => format!(
            "{n} elements are not a whole number of {ty} blocks ({} elements each)",
            ty.block_elems()
        ),
    }
}

/// Reading a GGUF file failed.
#[derive(Debug, Error)]
pub enum GgufError {
    /// The file could not be opened, sized or memory-mapped.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the four bytes `GGUF` (`found` holds
    /// the bytes it starts with, at most 4).
    #[error("{}: not a GGUF file (starts with {found:02x?}, expected \"GGUF\")", path.display())]
    BadMagic { path: PathBuf, found: Vec<u8> },
    /// The format version is not 2 or 3: v1 files, big-endian files (their
    /// version reads byte-swapped) and future versions.
    #[error("{}: unsupported GGUF {}; charm reads versions 2 and 3", path.display(), version_desc(*version))]
    UnsupportedVersion { path: PathBuf, version: u32 },
    /// The file ends inside the header, the metadata or the tensor table:
    /// `needed` bytes of `what` at byte `offset`, but the file has
    /// `file_len` bytes.
    #[error(
        "{}: truncated: {what} needs {needed} bytes at byte {offset}, but the file ends at byte {file_len}",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    /// A count or length read from the file (tensors, metadata entries,
    /// array elements, a string's bytes) is more than the rest of the file
    /// could hold, or more metadata array elements than charm keeps in
    /// memory; refused before anything is allocated for it.
    #[error("{}: {what} is {count}, more than the {limit} that can fit", path.display())]
    TooLarge {
        path: PathBuf,
        what: String,
        count: u64,
        limit: u64,
    },
    /// A metadata entry is malformed: an unknown value type, a string that
    /// is not UTF-8, a bool byte other than 0 or 1, arrays nested too
    /// deeply, a key given twice, or a `general.alignment` that is not a
    /// power-of-two unsigned integer.
    #[error("{}: metadata {key}: {reason}", path.display())]
    BadMetadata { path: PathBuf, key: String, reason: String },
    /// A tensor-table entry is malformed: a name that is not UTF-8 or given
    /// twice, more than 4 dimensions, a dimension above `i64::MAX`, an
    /// element count that overflows, a row length that is not a whole
    /// number of blocks, or an offset that is not a multiple of the
    /// alignment.
    #[error("{}: tensor {tensor}: {reason}", path.display())]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    /// A tensor's type id is not one charm reads (a ggml type it does not
    /// support, such as Q3_K or IQ2_XXS, or an id ggml does not define).
    #[error("{}: tensor {tensor} has {}, which charm does not read (supported: {SUPPORTED})", path.display(), type_desc(*id))]
    UnsupportedType { path: PathBuf, tensor: String, id: u32 },
    /// A tensor's data (bytes `start..end`) lies past the end of the file.
    #[error(
        "{}: tensor {tensor}: data at bytes {start}..{end} lies past the end of the file ({file_len} bytes)",
        path.display()
    )]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    /// No tensor of that name in the file.
    #[error("{}: tensor {name} not found", path.display())]
    MissingTensor { path: PathBuf, name: String },
    /// A tensor's dims (ggml order, innermost first) are not the ones the
    /// caller expects (also ggml order; missing trailing dims count as 1).
    #[error("{}: tensor {tensor} has ggml dims {dims:?}, expected {expected:?}", path.display())]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        dims: Vec<u64>,
        expected: Vec<u64>,
    },
    /// [`super::GgufFile::weight_slice`] asked for slice `index` of a
    /// tensor stacking only `count`.
    #[error("{}: tensor {tensor}: slice {index} requested, but it stacks {count}", path.display())]
    SliceOutOfRange {
        path: PathBuf,
        tensor: String,
        index: usize,
        count: u64,
    },
    /// [`super::dequantize`] got bytes that do not hold `n` elements of
    /// `ty` (`expected: None` when `n` is not a whole number of blocks).
    /// The only variant without a file: that function reads no file.
    #[error("{}", length_desc(*ty, *n, *expected, *got))]
    DataLength {
        ty: GgmlType,
        n: usize,
        expected: Option<usize>,
        got: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supported_list_names_every_type_read() {
        let named: Vec<&str> = SUPPORTED.split(", ").collect();
        assert_eq!(named.len(), GgmlType::ALL.len());
        for t in GgmlType::ALL {
            assert!(named.contains(&t.name()), "{t} missing from SUPPORTED");
        }
    }
}
