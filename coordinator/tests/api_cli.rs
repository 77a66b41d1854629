//! `coordinator serve` and `coordinator web` as real processes: the
//! listening line, the bind-address rule, the key file, the browser
//! opener, and one clear error line when serving cannot start.

mod api_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api_support::*;

/// A `coordinator` child process, killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn coordinator(model: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coordinator"));
    c.args(["--local", "--model"]).arg(model).args(args);
    c
}

/// Starts `serve`/`web` and reads stderr up to the `listening on` line.
fn start(mut cmd: Command) -> (Proc, SocketAddr, Vec<String>) {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let proc = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let t = Instant::now();
    loop {
        let line = rx
            .recv_timeout(PATIENCE.saturating_sub(t.elapsed()))
            .unwrap_or_else(|_| panic!("no listening line; stderr so far: {lines:?}"));
        if let Some(rest) = line.strip_prefix("listening on http://") {
            let addr = rest.split_whitespace().next().unwrap().parse().unwrap();
            lines.push(line);
            // Keep draining so the child never blocks on a full pipe.
            std::thread::spawn(move || while rx.recv().is_ok() {});
            return (proc, addr, lines);
        }
        lines.push(line);
    }
}

#[test]
fn serve_prints_where_it_listens_and_answers() {
    let (_p, addr, lines) = start(coordinator(&chat_fixture(), &["serve", "--port", "0"]));
    assert!(addr.ip().is_loopback(), "binds 127.0.0.1 by default: {lines:?}");
    assert_ne!(addr.port(), 0);
    assert_eq!(get(addr, "/health").json()["status"], "ok");
    let r = post(
        addr,
        "/v1/chat/completions",
        &serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
}

/// Writes `text` to `path` with permissions `mode`.
fn write_mode(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    let mut perms = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, mode);
    std::fs::set_permissions(path, perms).unwrap();
}

fn assert_one_error_line(out: &std::process::Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one clear line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "should name {n:?}: {stderr}");
    }
}

#[test]
fn serve_refuses_other_addresses_without_a_key_and_bad_key_files() {
    let out = coordinator(&chat_fixture(), &["serve", "--host", "0.0.0.0", "--port", "0"])
        .output()
        .unwrap();
    assert_one_error_line(&out, &["0.0.0.0", "--api-key-file"]);

    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty.key");
    write_mode(&empty, "\n", 0o600);
    let out = coordinator(&chat_fixture(), &["serve", "--port", "0", "--api-key-file"])
        .arg(&empty)
        .output()
        .unwrap();
    assert_one_error_line(&out, &["empty.key", "is empty"]);
    let out = coordinator(
        &chat_fixture(),
        &["serve", "--port", "0", "--api-key-file", "/nonexistent/key"],
    )
    .output()
    .unwrap();
    assert_one_error_line(&out, &["/nonexistent/key"]);
    let out = coordinator(&chat_fixture(), &["serve", "--port", "0", "--queue-size", "0"])
        .output()
        .unwrap();
    assert_one_error_line(&out, &["--queue-size"]);
}

#[test]
fn serve_needs_a_tokenizer() {
    let olmoe = repo().join("tests/fixtures/olmoe");
    let out = coordinator(&olmoe, &["serve", "--port", "0"]).output().unwrap();
    assert_one_error_line(&out, &["tokenizer.json", "serving needs"]);
}

#[test]
fn serve_with_a_key_file_checks_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("api.key");
    write_mode(&key, "k-123\n", 0o600);
    let mut cmd = coordinator(&chat_fixture(), &["serve", "--port", "0", "--api-key-file"]);
    cmd.arg(&key);
    let (_p, addr, _) = start(cmd);
    assert_eq!(get(addr, "/v1/models").status, 401);
    let ok = request(addr, "GET", "/v1/models", &[("Authorization", "Bearer k-123")], b"");
    assert_eq!(ok.status, 200, "the key file's trailing newline is not part of the key");
}

#[test]
fn api_key_file_readable_by_others_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("open.key");
    for mode in [0o644, 0o640, 0o604, 0o620] {
        write_mode(&key, "k-123\n", mode);
        let out = coordinator(&chat_fixture(), &["serve", "--port", "0", "--api-key-file"])
            .arg(&key)
            .output()
            .unwrap();
        let chmod = format!("chmod 600 {}", key.display());
        assert_one_error_line(&out, &["open.key", "group or others", &chmod]);
    }
}

#[test]
fn serve_refuses_a_zero_connection_cap_or_timeout() {
    for (flag, value) in [
        ("--max-connections", "0"),
        ("--header-timeout-ms", "0"),
        ("--body-timeout-ms", "0"),
        ("--idle-timeout-ms", "0"),
    ] {
        let out = coordinator(&chat_fixture(), &["serve", "--port", "0", flag, value])
            .output()
            .unwrap();
        assert_one_error_line(&out, &[flag]);
    }
}

#[test]
fn web_opens_the_dashboard_in_the_browser() {
    let bin = tempfile::tempdir().unwrap();
    let seen = bin.path().join("opened.txt");
    let opener = bin
        .path()
        .join(if cfg!(target_os = "macos") { "open" } else { "xdg-open" });
    std::fs::write(&opener, format!("#!/bin/sh\necho \"$1\" > '{}'\n", seen.display())).unwrap();
    let mut perms = std::fs::metadata(&opener).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&opener, perms).unwrap();
    let mut cmd = coordinator(&chat_fixture(), &["web", "--port", "0"]);
    cmd.env("PATH", format!("{}:/usr/bin:/bin", bin.path().display()));
    let (_p, addr, _) = start(cmd);
    let t = Instant::now();
    while !seen.exists() {
        assert!(t.elapsed() < PATIENCE, "the opener was never run");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), format!("http://{addr}"));
    assert_eq!(get(addr, "/").status, 200);
}

#[test]
fn web_prints_the_url_when_no_browser_opens() {
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = coordinator(&chat_fixture(), &["web", "--port", "0"]);
    cmd.env("PATH", empty.path());
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let _p = Proc(child);
    let mut lines = BufReader::new(stderr).lines();
    let listening = lines.next().unwrap().unwrap();
    let url = listening
        .strip_prefix("listening on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("{listening}"))
        .to_string();
    let next = lines.next().unwrap().unwrap();
    assert!(
        next.contains("could not open a browser") && next.contains(&url),
        "{next}"
    );
}
