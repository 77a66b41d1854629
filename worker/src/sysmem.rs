//! Machine facts the stores size themselves by, and where learned state lives.

use std::path::{Path, PathBuf};

use charm_common::container::is_plain_fingerprint;
use sha2::{Digest, Sha256};

/// Memory the process can take without swapping: `MemAvailable` on Linux
/// (half of RAM on macOS), capped by the room under its memory cgroup
/// limit ([`charm_common::memory::available`]).
pub fn available_memory() -> Option<u64> {
    charm_common::memory::available()
}

pub use charm_common::memory::mem_available;

/// The default expert cache budget: free memory after `dense_bytes`,
/// keeping a tenth of it for everything else (KV cache, activations, the OS).
pub fn default_cache_bytes(dense_bytes: u64) -> u64 {
    let avail = available_memory().unwrap_or(0);
    (avail - avail / 10).saturating_sub(dense_bytes)
}

/// Where a learned-state file lives: `STATE_DIR/file` when given, else
/// `<model>/state/file` when that is writable, else (with a fingerprint)
/// `~/.local/state/charm/<fingerprint>/file`.
///
/// The fingerprint comes from a manifest, so it is untrusted: a plain one
/// (ASCII letters, digits, `-`, `_`) names the directory by its first 16
/// characters; any other (`../../etc`, `a/b`, non-ASCII) by a hash of it, so
/// the path never leaves `~/.local/state/charm`. `file` must be a plain file
/// name (no separator, not `.` or `..`), else there is no state file.
pub fn state_file(
    model_dir: &Path,
    state_dir: Option<&Path>,
    file: &str,
    fingerprint: Option<&str>,
) -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    state_file_under(model_dir, state_dir, file, fingerprint, home.as_deref())
}

/// [`state_file`] with the home directory given.
fn state_file_under(
    model_dir: &Path,
    state_dir: Option<&Path>,
    file: &str,
    fingerprint: Option<&str>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    if !is_plain_file_name(file) {
        tracing::warn!("state file name {file:?} is not a plain file name; keeping no state");
        return None;
    }
    if let Some(s) = state_dir {
        return Some(s.join(file));
    }
    let local = model_dir.join("state");
    let probe = local.join(".write-probe");
    let writable = std::fs::create_dir_all(&local).is_ok() && std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    if writable {
        return Some(local.join(file));
    }
    let fp = fingerprint?;
    Some(home?.join(".local/state/charm").join(fingerprint_dir(fp)).join(file))
}

/// The directory name for a model's state: a plain fingerprint's first 16
/// characters, else `h-` and 16 hex digits of its SHA-256.
fn fingerprint_dir(fingerprint: &str) -> String {
    if is_plain_fingerprint(fingerprint) {
        // Plain means ASCII, so any byte index is a character boundary.
        return fingerprint[..fingerprint.len().min(16)].to_string();
    }
    let digest = Sha256::digest(fingerprint.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("h-{hex}")
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_parses_meminfo_and_ignores_hostile_text() {
        let text = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   16000000 kB\n";
        assert_eq!(mem_available(text), Some(16_000_000 * 1024));
        for bad in [
            "",
            "MemAvailable:",
            "MemAvailable: é€ kB",
            "MemAvailable: 12é kB",
            "MemAvailable: -5 kB",
            "MemAvailable: 18446744073709551615 kB",
            "MemAvailable: 99999999999999999999999 kB",
            "MemAvailable: 100 MB",
            "日本語\nMemAvailable€: 1 kB",
            "\u{feff}MemAvailable: 1 kB",
        ] {
            assert_eq!(mem_available(bad), None, "{bad:?}");
        }
        assert_eq!(mem_available("x\nMemAvailable: 1\n"), Some(1024));
    }

    /// A fingerprint from a hostile manifest must not steer the state file
    /// outside `~/.local/state/charm`, nor panic when cut to 16 characters.
    #[test]
    fn hostile_fingerprint_never_escapes_the_state_directory() {
        // A model "directory" that is a file cannot hold `state/`, which
        // forces the fingerprint fallback.
        let tmp = tempfile::tempdir().unwrap();
        let model = &tmp.path().join("not-a-dir");
        std::fs::write(model, b"").unwrap();
        let home = Path::new("/home/someone");
        let base = home.join(".local/state/charm");
        let at = |fp: &str| state_file_under(model, None, "h.json", Some(fp), Some(home));
        let plain = at("0123456789abcdef0123").unwrap();
        assert_eq!(plain, base.join("0123456789abcdef").join("h.json"));
        let mut dirs = std::collections::HashSet::new();
        for fp in [
            "../../etc/x",
            "..",
            "a/b",
            "/etc/passwd",
            "a\\b",
            "ééééééééééééééééé",
            "abcdefghijklmnoé",
            "x\0y",
            "",
        ] {
            let path = at(fp).unwrap();
            assert_eq!(path.parent().and_then(Path::parent), Some(base.as_path()), "{fp:?}");
            let dir = path.parent().unwrap().file_name().unwrap().to_str().unwrap().to_owned();
            assert!(
                dir.starts_with("h-") && dir.len() == 18 && dir[2..].bytes().all(|b| b.is_ascii_hexdigit()),
                "{fp:?}: {dir}"
            );
            assert!(dirs.insert(dir), "{fp:?}: two fingerprints share a directory");
        }
    }

    #[test]
    fn state_file_names_are_plain() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("s");
        assert_eq!(
            state_file(dir.path(), Some(&state), "h.json", None),
            Some(state.join("h.json"))
        );
        for bad in ["", ".", "..", "../h.json", "a/b", "/etc/passwd"] {
            assert_eq!(state_file(dir.path(), Some(&state), bad, None), None, "{bad:?}");
        }
    }
}
