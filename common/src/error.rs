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

/// An error and its causes as the one line a binary prints: each cause
/// after a `: `, except a cause whose text the line already holds (most
/// errors here name their source in their own message, and a chain
/// printer would repeat it), and without a cause's leading `NAME:` where
/// the line already ends with that name (`loading m.gguf` then
/// `m.gguf: …`).
pub fn one_line<'a>(chain: impl IntoIterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut line = String::new();
    for cause in chain {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
            continue;
        }
        if line.contains(&text) {
            continue;
        }
        let last = line.rsplit(' ').next().unwrap_or_default();
        let rest = match text.strip_prefix(last).and_then(|r| r.strip_prefix(':')) {
            Some(rest) if !last.is_empty() => rest.trim_start(),
            _ => &text,
        };
        line.push_str(": ");
        line.push_str(rest);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("binding 127.0.0.1:80: {source}")]
        Named { source: std::io::Error },
        #[error("loading the model")]
        Bare(#[source] std::io::Error),
    }

    fn chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> Vec<&'a (dyn std::error::Error + 'static)> {
        std::iter::successors(Some(e), |e| e.source()).collect()
    }

    #[test]
    fn a_cause_is_printed_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let named = Outer::Named { source: io() };
        assert_eq!(one_line(chain(&named)), "binding 127.0.0.1:80: address in use");
        let bare = Outer::Bare(io());
        assert_eq!(one_line(chain(&bare)), "loading the model: address in use");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("loading /m/x.gguf")]
    struct Loading(#[source] Named);

    #[derive(Debug, thiserror::Error)]
    #[error("/m/x.gguf: truncated")]
    struct Named;

    #[test]
    fn a_name_the_line_ends_with_is_not_repeated() {
        assert_eq!(one_line(chain(&Loading(Named))), "loading /m/x.gguf: truncated");
    }
}
