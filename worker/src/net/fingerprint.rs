//! Which model a directory holds, as one string that coordinator and
//! workers compare before any work: placement may change speed, never the
//! model, so a worker holding other weights is refused.
//!
//! - A charm container: its manifest's `fingerprint` (SHA-256 over the
//!   config, the quantization and every record's checksum).
//! - A Hugging Face directory: `hf-` and a SHA-256 over `config.json`, and
//!   for every `*.safetensors` file (by name) its name, length, header, and
//!   16 samples of 4 KiB spread over its data. Headers alone would not
//!   tell two checkpoints of the same shapes apart (a fine-tune); samples
//!   do, while the whole stays cheap to compute on a large model.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use charm_common::container::{is_container, Manifest};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Samples of the data taken per safetensors file.
const SAMPLES: u64 = 16;
/// Bytes per sample.
const SAMPLE_LEN: u64 = 4096;
/// Largest safetensors header read (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

/// The fingerprint could not be computed.
#[derive(Debug, Error)]
pub enum FingerprintError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The container's manifest is unreadable or does not match its files.
    #[error(transparent)]
    Container(#[from] charm_common::container::ContainerError),
    /// A safetensors file is too short or its header length is absurd.
    #[error("{}: not a safetensors file ({reason})", path.display())]
    BadSafetensors { path: PathBuf, reason: String },
    /// The directory has no `*.safetensors` file.
    #[error("{}: no *.safetensors files", dir.display())]
    NoWeights { dir: PathBuf },
}

/// The fingerprint of the model in `dir` (container or Hugging Face).
pub fn model_fingerprint(dir: &Path) -> Result<String, FingerprintError> {
    if is_container(dir) {
        return Ok(Manifest::open(dir)?.fingerprint);
    }
    hf_fingerprint(dir)
}

/// The fingerprint of a Hugging Face directory (see the module docs).
pub fn hf_fingerprint(dir: &Path) -> Result<String, FingerprintError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FingerprintError::Io { path, source }
    };
    let mut h = Sha256::new();
    let config = dir.join("config.json");
    h.update(std::fs::read(&config).map_err(io(&config))?);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(FingerprintError::NoWeights { dir: dir.to_path_buf() });
    }
    for path in &files {
        let mut f = File::open(path).map_err(io(path))?;
        let len = f.metadata().map_err(io(path))?.len();
        let bad = |reason: String| FingerprintError::BadSafetensors {
            path: path.clone(),
            reason,
        };
        let mut n = [0u8; 8];
        f.read_exact(&mut n).map_err(|_| bad("shorter than 8 bytes".into()))?;
        let header_len = u64::from_le_bytes(n);
        if header_len > MAX_HEADER || 8 + header_len > len {
            return Err(bad(format!("header length {header_len} in a file of {len} bytes")));
        }
        let mut header = vec![0u8; header_len as usize];
        f.read_exact(&mut header).map_err(io(path))?;
        h.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        h.update(len.to_le_bytes());
        h.update(&header);
        let data_start = 8 + header_len;
        let data_len = len - data_start;
        let mut sample = vec![0u8; SAMPLE_LEN as usize];
        for i in 0..SAMPLES {
            let at = data_start + data_len * i / SAMPLES;
            let n = SAMPLE_LEN.min(len - at) as usize;
            f.seek(SeekFrom::Start(at)).map_err(io(path))?;
            f.read_exact(&mut sample[..n]).map_err(io(path))?;
            h.update(&sample[..n]);
        }
    }
    Ok(format!("hf-{:x}", h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_st(path: &Path, data: &[u8]) {
        let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(data);
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn weights_config_and_files_all_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        write_st(&dir.path().join("model.safetensors"), &[1; 8]);
        let a = model_fingerprint(dir.path()).unwrap();
        assert!(a.starts_with("hf-") && a.len() == 67, "{a}");
        assert_eq!(a, model_fingerprint(dir.path()).unwrap());
        write_st(&dir.path().join("model.safetensors"), &[2; 8]);
        let b = model_fingerprint(dir.path()).unwrap();
        assert_ne!(a, b, "same header, other weights");
        std::fs::write(dir.path().join("config.json"), "{ }").unwrap();
        assert_ne!(b, model_fingerprint(dir.path()).unwrap(), "other config");
        std::fs::write(dir.path().join("model.safetensors"), [1u8, 2]).unwrap();
        assert!(matches!(
            model_fingerprint(dir.path()),
            Err(FingerprintError::BadSafetensors { .. })
        ));
        std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
        assert!(matches!(
            model_fingerprint(dir.path()),
            Err(FingerprintError::NoWeights { .. })
        ));
    }
}
