//! The `worker` binary's command line: it reports its version, refuses a
//! missing or exposed key file with one clear line, and once started says
//! where it listens (what the cluster tests in `tests/` rely on). Having
//! this integration test also makes `cargo test` build the binary.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn worker(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_worker")).args(args).output().unwrap()
}

fn key_file(dir: &Path, mode: u32) -> PathBuf {
    let path = dir.join("cluster.key");
    std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    path
}

fn one_line_error(out: &Output, needles: &[&str]) {
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr}");
    }
}

#[test]
fn version() {
    let out = worker(&["--version".as_ref()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("worker "));
}

#[test]
fn bad_key_files_are_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("olmoe");
    let missing = tmp.path().join("nope.key");
    let out = worker(&[
        "--model".as_ref(),
        model.as_os_str(),
        "--cluster-key-file".as_ref(),
        missing.as_os_str(),
    ]);
    one_line_error(&out, &["nope.key"]);
    #[cfg(unix)]
    {
        let exposed = key_file(tmp.path(), 0o644);
        let out = worker(&[
            "--model".as_ref(),
            model.as_os_str(),
            "--cluster-key-file".as_ref(),
            exposed.as_os_str(),
        ]);
        one_line_error(&out, &["cluster.key", "chmod 600"]);
    }
    let key = key_file(tmp.path(), 0o600);
    let out = worker(&[
        "--model".as_ref(),
        tmp.path().join("no-model").as_os_str(),
        "--cluster-key-file".as_ref(),
        key.as_os_str(),
    ]);
    one_line_error(&out, &["no-model", "not found"]);
}

#[test]
fn a_started_worker_says_where_it_listens() {
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path(), 0o600);
    let mut child = Command::new(env!("CARGO_BIN_EXE_worker"))
        .arg("--model")
        .arg(fixture("olmoe"))
        .arg("--cluster-key-file")
        .arg(&key)
        .args(["--listen", "127.0.0.1:0", "--no-mdns"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line: {line:?}"))
        .parse()
        .unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
}
