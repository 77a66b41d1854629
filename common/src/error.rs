//! Errors from reading model files. Every variant names the file, and the
//! tensor where there is one, so a user can tell exactly what is wrong.

use std::path::PathBuf;

use thiserror::Error;

/// Reading a model directory failed.
#[derive(Debug, Error)]
pub enum LoadError {
    /// A file could not be opened, mapped or read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory holds neither `model.safetensors` nor a shard index.
    #[error("{}: no model.safetensors or model.safetensors.index.json", dir.display())]
    NoWeights { dir: PathBuf },
    /// A safetensors header is truncated, not JSON, or inconsistent.
    #[error("{}: not a valid safetensors file: {reason}", path.display())]
    BadSafetensors { path: PathBuf, reason: String },
    /// `model.safetensors.index.json` is malformed or names a missing shard.
    #[error("{}: bad shard index: {reason}", path.display())]
    BadIndex { path: PathBuf, reason: String },
    /// A tensor the model needs is in none of the files.
    #[error("{}: tensor {name} not found", dir.display())]
    MissingTensor { dir: PathBuf, name: String },
    /// A tensor is stored in a dtype charm does not compute with.
    #[error("{}: tensor {name} has dtype {dtype}; supported: F32, BF16, F16", path.display())]
    UnsupportedDtype { path: PathBuf, name: String, dtype: String },
    /// A tensor's shape disagrees with what the config implies.
    #[error("{}: tensor {name} has shape {got:?}, but the config implies {expected:?}", path.display())]
    ShapeMismatch {
        path: PathBuf,
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    /// A GGUF file is malformed or lacks a tensor (names the file and tensor).
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
}
