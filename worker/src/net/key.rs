//! The cluster key: 32 random bytes, written as hex to a file only its owner
//! may read (`coordinator keygen`), given to every worker and coordinator of
//! one cluster. It never travels: each side proves it knows the key with an
//! HMAC over a secret that only this TLS session has (RFC 5705 keying
//! material exported from the handshake), so a proof cannot be replayed on
//! another connection, and the role is part of the proof, so a peer cannot
//! answer a proof by reflecting it.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use charm_proto::wire::PROOF_LEN;
use charm_proto::Role;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use thiserror::Error;

/// Bytes of a cluster key.
pub const KEY_LEN: usize = 32;
/// TLS exporter label of the authentication secret.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-charm-cluster-auth";
/// Bytes of the exported secret.
pub const EXPORTER_LEN: usize = 32;
/// Domain separation of the proof.
const PROOF_CONTEXT: &[u8] = b"charm-auth-v1";

/// A cluster key (its bytes are never printed).
#[derive(Clone)]
pub struct ClusterKey([u8; KEY_LEN]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// A key file could not be made or read.
#[derive(Debug, Error)]
pub enum KeyError {
    /// Reading or writing the file failed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The file does not hold 64 hexadecimal digits.
    #[error("{}: not a cluster key (expected 64 hex digits, as written by `coordinator keygen`)", path.display())]
    Malformed { path: PathBuf },
    /// Other users may read the file (Unix permissions).
    #[error("{}: readable by other users (mode {mode:03o}); run `chmod 600 {}`", path.display(), path.display())]
    Exposed { path: PathBuf, mode: u32 },
    /// `keygen` never overwrites a key: the file exists.
    #[error("{}: already exists; remove it or choose another --out", path.display())]
    Exists { path: PathBuf },
}

impl ClusterKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> ClusterKey {
        let mut k = [0u8; KEY_LEN];
        rand::rngs::OsRng.fill_bytes(&mut k);
        ClusterKey(k)
    }

    /// A key from raw bytes (tests).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// Generates a key and writes it to a new file `path` with mode 0600.
    pub fn write_new(path: &Path) -> Result<ClusterKey, KeyError> {
        let key = ClusterKey::generate();
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let io = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = opts.open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => KeyError::Exists {
                path: path.to_path_buf(),
            },
            _ => io(e),
        })?;
        writeln!(f, "{}", key.hex()).map_err(io)?;
        f.sync_all().map_err(io)?;
        Ok(key)
    }

    /// Reads a key file; refuses one that other users can read.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        let io = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyError::Exposed {
                    path: path.to_path_buf(),
                    mode,
                });
            }
        }
        #[cfg(not(unix))]
        let _ = meta;
        let text = std::fs::read_to_string(path).map_err(io)?;
        let malformed = || KeyError::Malformed {
            path: path.to_path_buf(),
        };
        let hex = text.trim();
        if hex.len() != 2 * KEY_LEN || !hex.is_ascii() {
            return Err(malformed());
        }
        let mut k = [0u8; KEY_LEN];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| malformed())?;
        }
        Ok(ClusterKey(k))
    }

    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(&self, role: Role, secret: &[u8; EXPORTER_LEN]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(PROOF_CONTEXT);
        mac.update(match role {
            Role::Coordinator => b"coordinator",
            Role::Worker => b"worker     ",
        });
        mac.update(secret);
        mac
    }

    /// The proof `role` sends on the session whose exported secret is `secret`.
    pub fn proof(&self, role: Role, secret: &[u8; EXPORTER_LEN]) -> [u8; PROOF_LEN] {
        self.mac(role, secret).finalize().into_bytes().into()
    }

    /// Whether `proof` is `role`'s proof for this session (constant time).
    pub fn verify(&self, role: Role, secret: &[u8; EXPORTER_LEN], proof: &[u8]) -> bool {
        self.mac(role, secret).verify_slice(proof).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_a_private_file_that_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let key = ClusterKey::write_new(&path).unwrap();
        let back = ClusterKey::load(&path).unwrap();
        assert_eq!(key.0, back.0);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let err = ClusterKey::load(&path).unwrap_err();
            assert!(err.to_string().contains("chmod 600"), "{err}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert!(matches!(ClusterKey::write_new(&path), Err(KeyError::Exists { .. })));
        std::fs::write(&path, "not hex\n").unwrap();
        assert!(matches!(ClusterKey::load(&path), Err(KeyError::Malformed { .. })));
        assert_ne!(ClusterKey::generate().0, ClusterKey::generate().0);
    }

    #[test]
    fn proofs_bind_key_session_and_role() {
        let key = ClusterKey::from_bytes([7; KEY_LEN]);
        let other = ClusterKey::from_bytes([8; KEY_LEN]);
        let session = [1u8; EXPORTER_LEN];
        let p = key.proof(Role::Coordinator, &session);
        assert!(key.verify(Role::Coordinator, &session, &p));
        assert!(!other.verify(Role::Coordinator, &session, &p), "another key");
        assert!(!key.verify(Role::Worker, &session, &p), "reflected to the other role");
        assert!(
            !key.verify(Role::Coordinator, &[2u8; EXPORTER_LEN], &p),
            "replayed on another session"
        );
        assert!(!key.verify(Role::Coordinator, &session, &p[..31]), "truncated");
        assert_eq!(format!("{key:?}"), "ClusterKey(..)");
    }
}
