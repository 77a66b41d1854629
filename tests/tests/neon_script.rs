//! `scripts/test_neon.sh` in CI strict mode: when its tools cannot be had,
//! a developer gets a loud warning and exit 0, but `CHARM_CI=1` (set by
//! `.ci/run`) makes it exit 1, so CI never passes with the NEON leg skipped.
//!
//! The script runs with a `PATH` that holds only the few commands it needs
//! before its first tool check (`dirname`, `uname`, `grep`), so `rustup` is
//! missing whatever this machine has installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use charm_tests::repo_root;

/// `command -v name`, resolved by the shell.
fn which(name: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && path.starts_with('/')).then(|| PathBuf::from(path))
}

/// Runs the script with only `bin` on `PATH` and `CHARM_CI` as given;
/// `(exit code, stderr)`.
fn run_script(bin: &Path, charm_ci: Option<&str>) -> (Option<i32>, String) {
    let bash = which("bash").expect("bash");
    let mut cmd = Command::new(bash);
    cmd.arg(repo_root().join("scripts/test_neon.sh"))
        .env_clear()
        .env("PATH", bin)
        .env("HOME", bin);
    if let Some(v) = charm_ci {
        cmd.env("CHARM_CI", v);
    }
    let out = cmd.output().expect("running scripts/test_neon.sh");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[cfg(unix)]
#[test]
fn neon_script_fails_instead_of_skipping_under_charm_ci() {
    if std::env::consts::ARCH == "aarch64" {
        // Native AArch64: the script tests nothing (cargo test already ran NEON).
        return;
    }
    let bin = tempfile::tempdir().unwrap();
    for tool in ["dirname", "uname", "grep"] {
        let path = which(tool).unwrap_or_else(|| panic!("{tool} not found"));
        std::os::unix::fs::symlink(&path, bin.path().join(tool)).unwrap();
    }
    let (code, err) = run_script(bin.path(), None);
    assert_eq!(code, Some(0), "a developer without the tools gets a skip: {err}");
    assert!(err.contains("WARNING: NEON tests skipped"), "{err}");
    let (code, err) = run_script(bin.path(), Some("1"));
    assert_eq!(code, Some(1), "CHARM_CI=1 must fail: {err}");
    assert!(err.contains("CHARM_CI=1 forbids skipping"), "{err}");
    assert!(!err.contains("WARNING"), "{err}");
}
