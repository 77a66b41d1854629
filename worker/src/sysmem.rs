//! Machine facts the stores size themselves by, and where learned state lives.

use std::path::{Path, PathBuf};

/// Memory the OS can give without swapping: `MemAvailable` on Linux; half
/// of RAM (`sysctl hw.memsize`) on macOS.
pub fn available_memory() -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        return Some(kb * 1024);
    }
    let out = std::process::Command::new("sysctl")
        .args(["-n", "hw.memsize"])
        .output()
        .ok()?;
    let total: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some(total / 2)
}

/// The default expert cache budget: free memory after `dense_bytes`,
/// keeping a tenth of it for everything else (KV cache, activations, the OS).
pub fn default_cache_bytes(dense_bytes: u64) -> u64 {
    let avail = available_memory().unwrap_or(0);
    (avail - avail / 10).saturating_sub(dense_bytes)
}

/// Where a learned-state file lives: `STATE_DIR/file` when given, else
/// `<model>/state/file` when that is writable, else (with a fingerprint)
/// `~/.local/state/charm/<fingerprint>/file`.
pub fn state_file(
    model_dir: &Path,
    state_dir: Option<&Path>,
    file: &str,
    fingerprint: Option<&str>,
) -> Option<PathBuf> {
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
    let home = std::env::var_os("HOME")?;
    Some(
        PathBuf::from(home)
            .join(".local/state/charm")
            .join(&fp[..fp.len().min(16)])
            .join(file),
    )
}
