//! What the HTTP API tests share: the chat fixture, an in-process server,
//! an expert service that can be held or slowed (to fill the queue and to
//! watch cancellation), and a small HTTP/1.1 client over `TcpStream` that
//! reads exact status lines, headers, chunked bodies and SSE frames.

#![allow(dead_code)] // each test file uses its own part of this module

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use charm_coordinator::chat_template::Message;
use charm_coordinator::engine::{Engine, EngineOptions, GenerateParams};
use charm_coordinator::sampler::SamplingParams;
use charm_coordinator::server::{Server, ServerConfig};
use charm_coordinator::TextCodec;
use charm_models::{ExpertError, ExpertService, ExpertStats};
use charm_proto::{ExpertBatch, ExpertOutputs};
use serde_json::Value;

/// How long any single wait in these tests may take before failing.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `tests/fixtures/qwen3moe-chat`, with the tokenizer fetched by
/// `scripts/fetch_test_material.sh` (a missing one fails the test).
pub fn chat_fixture() -> PathBuf {
    let dir = repo().join("tests/fixtures/qwen3moe-chat");
    assert!(
        dir.join("tokenizer.json").exists() && dir.join("tokenizer_config.json").exists(),
        "{}: tokenizer missing; run scripts/fetch_test_material.sh",
        dir.display()
    );
    dir
}

/// The fixture's engine (one in-process worker).
pub fn engine() -> (Engine, charm_coordinator::LoadInfo) {
    Engine::load(&chat_fixture(), &EngineOptions::default()).expect("load the chat fixture")
}

/// A server on 127.0.0.1 with a free port, adjusted by `tweak`.
pub fn server(tweak: impl FnOnce(&mut ServerConfig)) -> Server {
    let (engine, info) = engine();
    server_with(engine, &info, tweak)
}

pub fn server_with(
    engine: Engine,
    info: &charm_coordinator::LoadInfo,
    tweak: impl FnOnce(&mut ServerConfig),
) -> Server {
    let mut cfg = ServerConfig::new(&chat_fixture());
    tweak(&mut cfg);
    Server::start(engine, info, cfg).expect("start the server")
}

/// An expert service in front of the real one that can be held shut (every
/// layer step waits until [`Gate::open`]) and slowed (a sleep per step).
pub struct Gate {
    inner: Arc<dyn ExpertService>,
    open: Mutex<bool>,
    cv: Condvar,
    /// Layer steps that reached the gate.
    pub arrived: AtomicU64,
    /// Requests the service heard end (`ExpertService::end_request`).
    pub ended: AtomicU64,
    delay: Duration,
}

impl Gate {
    /// Opens the gate for good.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Waits until a layer step is held at (or passed) the gate.
    pub fn wait_arrival(&self) {
        let t = Instant::now();
        while self.arrived.load(Ordering::SeqCst) == 0 {
            assert!(t.elapsed() < PATIENCE, "no layer step reached the gate");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

struct Gated(Arc<Gate>);

impl ExpertService for Gated {
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError> {
        let g = &self.0;
        g.arrived.fetch_add(1, Ordering::SeqCst);
        let mut open = g.open.lock().unwrap();
        while !*open {
            open = g.cv.wait(open).unwrap();
        }
        drop(open);
        if !g.delay.is_zero() {
            std::thread::sleep(g.delay);
        }
        g.inner.run(batch)
    }

    fn stats(&self) -> ExpertStats {
        self.0.inner.stats()
    }

    fn end_request(&self) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
        self.0.inner.end_request()
    }
}

/// The fixture's engine behind a [`Gate`] (`open`: whether it starts open;
/// `delay`: sleep per layer step).
pub fn gated_engine(open: bool, delay: Duration) -> (Engine, charm_coordinator::LoadInfo, Arc<Gate>) {
    gated_engine_for(&chat_fixture(), open, delay)
}

/// [`gated_engine`] for the model in `dir`.
pub fn gated_engine_for(dir: &Path, open: bool, delay: Duration) -> (Engine, charm_coordinator::LoadInfo, Arc<Gate>) {
    let (engine, info) = Engine::load(dir, &EngineOptions::default()).expect("load the model");
    let gate = Arc::new(Gate {
        inner: engine.expert_service().clone(),
        open: Mutex::new(open),
        cv: Condvar::new(),
        arrived: AtomicU64::new(0),
        ended: AtomicU64::new(0),
        delay,
    });
    let model = engine.model;
    let engine = Engine::new(model, Arc::new(Gated(gate.clone())));
    (engine, info, gate)
}

/// Greedy ids and text for `messages` straight from the engine (no server).
pub fn solo_chat(messages: &[Message], max_tokens: usize) -> (Vec<u32>, Vec<u32>, String) {
    let (engine, _) = engine();
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let prompt = codec.encode_chat(messages, true, &[]).unwrap();
    let params = GenerateParams {
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: false,
    };
    let gen = engine
        .generate(&mut engine.session(), &prompt, &params, |_| true)
        .unwrap();
    let text = codec.decode(&gen.ids, true).unwrap();
    (prompt, gen.ids, text)
}

// ---- HTTP client -------------------------------------------------------------

/// A whole HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Writes a request with `Connection: close` (and `Content-Length` when there is a body).
pub fn send_request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> TcpStream {
    let mut s = connect(addr);
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

/// Status line and headers.
pub fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header line");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').expect("header has a colon");
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    (status, headers)
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"))
}

/// Reads a whole response.
pub fn read_response(stream: TcpStream) -> Resp {
    let mut r = BufReader::new(stream);
    let (status, headers) = read_head(&mut r);
    let mut body = Vec::new();
    if is_chunked(&headers) {
        let mut chunks = Chunks { r, done: false };
        while let Some(c) = chunks.next_chunk() {
            body.extend(c);
        }
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse::<usize>().unwrap())
    {
        body.resize(len, 0);
        r.read_exact(&mut body).unwrap();
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Resp { status, headers, body }
}

/// One request, whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    read_response(send_request(addr, method, path, headers, body))
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// A chunked body read chunk by chunk.
struct Chunks {
    r: BufReader<TcpStream>,
    done: bool,
}

impl Chunks {
    fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let mut line = String::new();
        if self.r.read_line(&mut line).ok()? == 0 {
            self.done = true;
            return None;
        }
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap(), 16).expect("chunk size");
        let mut data = vec![0; size + 2];
        self.r.read_exact(&mut data).ok()?;
        data.truncate(size);
        if size == 0 {
            self.done = true;
            return None;
        }
        Some(data)
    }
}

/// One server-sent event.
#[derive(Clone, Debug)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// A streaming response read event by event.
pub struct SseStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunks: Chunks,
    buf: Vec<u8>,
}

impl SseStream {
    /// Posts `body` to `path` and reads the head.
    pub fn post(addr: SocketAddr, path: &str, body: &Value) -> SseStream {
        let s = send_request(
            addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        Self::open(s)
    }

    /// `GET path`, reading the head.
    pub fn get(addr: SocketAddr, path: &str) -> SseStream {
        Self::open(send_request(addr, "GET", path, &[], b""))
    }

    fn open(s: TcpStream) -> SseStream {
        let mut r = BufReader::new(s);
        let (status, headers) = read_head(&mut r);
        assert!(is_chunked(&headers), "a stream is chunked: {headers:?}");
        SseStream {
            status,
            headers,
            chunks: Chunks { r, done: false },
            buf: Vec::new(),
        }
    }

    /// The next event, or `None` at the end of the body.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(at) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let frame = String::from_utf8(self.buf[..at].to_vec()).expect("UTF-8 frame");
                self.buf.drain(..at + 2);
                let mut ev = SseEvent {
                    event: None,
                    data: String::new(),
                };
                let mut data = Vec::new();
                for line in frame.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        ev.event = Some(e.to_string());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push(d);
                    } else {
                        panic!("unexpected SSE line {line:?}");
                    }
                }
                ev.data = data.join("\n");
                return Some(ev);
            }
            let chunk = self.chunks.next_chunk()?;
            self.buf.extend(chunk);
        }
    }

    /// Every remaining event.
    pub fn collect(mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(e) = self.next_event() {
            out.push(e);
        }
        out
    }

    /// Closes the connection (the client goes away).
    pub fn disconnect(self) {
        let _ = self.chunks.r.get_ref().shutdown(std::net::Shutdown::Both);
    }
}

/// Polls `GET /health` until `pred` holds on its JSON.
pub fn wait_health(addr: SocketAddr, what: &str, pred: impl Fn(&Value) -> bool) {
    let t = Instant::now();
    loop {
        let h = get(addr, "/health").json();
        if pred(&h) {
            return;
        }
        assert!(t.elapsed() < PATIENCE, "timed out waiting for {what}: {h}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The dashboard's record of request `id` once it finished.
pub fn wait_record(addr: SocketAddr, id: &str) -> Value {
    let t = Instant::now();
    loop {
        let s = get(addr, "/api/state").json();
        if let Some(r) = s["recent"].as_array().unwrap().iter().find(|r| r["id"] == id) {
            return r.clone();
        }
        assert!(t.elapsed() < PATIENCE, "request {id} never finished: {s}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the flag is set: a test that needs an external tool fails
/// rather than skips.
pub fn strict() -> bool {
    std::env::var("CHARM_CI").is_ok_and(|v| v == "1")
}

/// Greedy decoding of `prompt` under `spec`, straight from the engine and
/// the grammar compiler (no server): the reference a constrained answer
/// must equal. Returns the generated ids and their text.
pub fn constrained_greedy(
    prompt: &[u32],
    spec: &charm_coordinator::grammar::GrammarSpec,
    max_tokens: usize,
) -> (Vec<u32>, String) {
    let (engine, _) = engine();
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let cfg = engine.config().clone();
    let grammars = charm_coordinator::grammar::Grammars::new(&codec, cfg.vocab_size, &cfg.eos_token_ids).unwrap();
    let mut constraint = grammars.compile(spec).unwrap();
    let mut sampler = charm_coordinator::Sampler::new(SamplingParams::default(), &[]);
    let mut cache = engine.model.new_cache();
    let mut logits = engine.forward(prompt, &mut cache, false).unwrap();
    let mut ids = Vec::new();
    while ids.len() < max_tokens {
        constraint.mask(&mut logits).unwrap();
        let id = sampler.sample(&logits);
        ids.push(id);
        if cfg.eos_token_ids.contains(&id) {
            break;
        }
        constraint.accept(id).unwrap();
        if constraint.is_done() {
            break;
        }
        logits = engine.forward(&[id], &mut cache, false).unwrap();
    }
    let text = codec.decode(&ids, true).unwrap();
    (ids, text)
}

/// The venv's python, or `None` when this machine has no python3 with pip and venv.
pub fn sdk_python() -> Option<String> {
    let has = |args: &[&str]| {
        std::process::Command::new("python3")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has(&["-m", "pip", "--version"]) || !has(&["-m", "venv", "--help"]) {
        return None;
    }
    let out = std::process::Command::new("bash")
        .arg(repo().join("scripts/sdk_venv.sh"))
        .output()
        .expect("run scripts/sdk_venv.sh");
    assert!(
        out.status.success(),
        "scripts/sdk_venv.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap().trim().to_string())
}

/// The chat fixture's model and tokenizer with another chat template, in a
/// temporary directory (symlinks, and a rewritten `tokenizer_config.json`).
pub fn fixture_with_template(template: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = chat_fixture();
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::os::unix::fs::symlink(fixture.join(f), dir.path().join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("tokenizer_config.json")).unwrap()).unwrap();
    cfg["chat_template"] = Value::String(template.to_string());
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}
