//! A `coordinator serve` process and plain HTTP/1.1 exchanges with it, for
//! the cluster tests that drive the API.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use super::bin;

/// The Qwen3-MoE fixture with its real tokenizer (fetched by
/// `scripts/fetch_test_material.sh`), for tests that speak text.
pub fn chat_fixture() -> std::path::PathBuf {
    let dir = charm_tests::fixture("qwen3moe-chat");
    assert!(
        dir.join("tokenizer.json").exists(),
        "{}: tokenizer missing; run scripts/fetch_test_material.sh",
        dir.display()
    );
    dir
}

pub const PATIENCE: Duration = Duration::from_secs(60);

/// A `coordinator serve` process; killed when dropped.
pub struct Serve {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Serve {
    pub fn start(args: &[&str]) -> Serve {
        Serve::start_with(args, &[])
    }

    /// `coordinator ARGS serve --host 127.0.0.1 --port 0 SERVE_ARGS`.
    pub fn start_with(args: &[&str], serve_args: &[&str]) -> Serve {
        let mut child = Command::new(bin("coordinator"))
            .args(args)
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(serve_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start coordinator serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut log = String::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("listening on http://") {
                    let addr = rest.split_whitespace().next().unwrap_or_default().to_string();
                    let _ = tx.send(Ok(addr));
                }
                log.push_str(&line);
                log.push('\n');
            }
            let _ = tx.send(Err(log));
        });
        match rx.recv_timeout(PATIENCE) {
            Ok(Ok(a)) => Serve {
                child,
                addr: a.parse().expect("a socket address"),
            },
            Ok(Err(log)) => {
                let _ = child.kill();
                panic!("coordinator serve exited before listening:\n{log}");
            }
            Err(_) => {
                let _ = child.kill();
                panic!("coordinator serve did not print its address in {PATIENCE:?}");
            }
        }
    }
}

impl Serve {
    /// `coordinator serve` for `model` in front of `workers` (all of them
    /// required at start), one compute thread, a 3 s request timeout.
    pub fn cluster(model: &Path, key: &Path, workers: &[super::Worker]) -> Serve {
        Serve::cluster_with(model, key, workers, &[])
    }

    /// [`Serve::cluster`] with `serve_args` after `serve`.
    pub fn cluster_with(model: &Path, key: &Path, workers: &[super::Worker], serve_args: &[&str]) -> Serve {
        let specs: Vec<String> = workers.iter().map(super::Worker::spec).collect();
        let n = workers.len().to_string();
        Serve::start_with(
            &[
                "--model",
                model.to_str().expect("a UTF-8 path"),
                "--cluster-key-file",
                key.to_str().expect("a UTF-8 path"),
                "--workers",
                &specs.join(","),
                "--min-workers",
                &n,
                "--worker-timeout-ms",
                "3000",
                "--threads",
                "1",
            ],
            serve_args,
        )
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange (`Connection: close`): status and body.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the server");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let text = String::from_utf8(raw).expect("a UTF-8 answer");
    let (head, rest) = text.split_once("\r\n\r\n").expect("headers end");
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked"));
    (status, if chunked { dechunk(rest) } else { rest.to_string() })
}

pub fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

/// `POST /v1/completions` of `prompt`, greedy, `max_tokens` long: the
/// answer (status 200 and at least one token asserted).
pub fn completion(addr: SocketAddr, prompt: &str, max_tokens: usize) -> Value {
    let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
    let (status, text) = http(addr, "POST", "/v1/completions", Some(&body));
    assert_eq!(status, 200, "{prompt:?}: {text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap_or(0) >= 1, "{v}");
    v
}

pub fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, None);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}
