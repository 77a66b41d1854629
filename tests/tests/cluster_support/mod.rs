//! Helpers of the cluster tests (`tests/tests/cluster_*.rs`): real `worker`
//! and `coordinator` processes on 127.0.0.1, and in-process engines whose
//! experts run on those workers.
//!
//! The binaries are the ones `cargo test --workspace` builds next to the
//! test executables (`target/<profile>/worker`, `.../coordinator`); both
//! packages have integration tests of their own, so cargo builds their
//! binaries before running any test.

#![allow(dead_code)] // each test file uses its own part of these helpers

pub mod serve;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use charm_coordinator::cluster::{ClusterOptions, ClusterService, LocalBuilder, ModelShape};
use charm_coordinator::engine::load_model;
use charm_coordinator::{Engine, GenerateParams, SamplingParams};
use charm_worker::net::fingerprint::model_fingerprint;
use charm_worker::net::ClusterKey;

/// `target/<profile>/<name>`, built by `cargo test --workspace`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> → target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test --workspace` (it builds the worker and coordinator binaries) \
         or `cargo build --bins` first",
        path.display()
    );
    path
}

/// A new cluster key made by `coordinator keygen`.
pub fn keygen(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = Command::new(bin("coordinator"))
        .args(["keygen", "--out"])
        .arg(&path)
        .output()
        .expect("run coordinator keygen");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path
}

/// The key in a key file.
pub fn load_key(path: &Path) -> ClusterKey {
    ClusterKey::load(path).expect("cluster key")
}

/// A running `worker` process; killed when dropped.
pub struct Worker {
    pub child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Worker {
    /// Starts `worker --model MODEL --cluster-key-file KEY --listen
    /// 127.0.0.1:0 --no-mdns EXTRA...` and waits for its address.
    pub fn start(model: &Path, key: &Path, extra: &[&str]) -> Worker {
        Self::start_with(Command::new(bin("worker")), model, key, "127.0.0.1:0", true, extra)
    }

    /// Same, on a given address.
    pub fn start_on(model: &Path, key: &Path, listen: &str, extra: &[&str]) -> Worker {
        Self::start_with(Command::new(bin("worker")), model, key, listen, true, extra)
    }

    /// Same, with a prepared command (e.g. `ip netns exec NS worker`) and
    /// mDNS on or off.
    pub fn start_with(
        mut cmd: Command,
        model: &Path,
        key: &Path,
        listen: &str,
        no_mdns: bool,
        extra: &[&str],
    ) -> Worker {
        cmd.arg("--model")
            .arg(model)
            .arg("--cluster-key-file")
            .arg(key)
            .args(["--listen", listen, "--threads", "1"])
            .args(extra);
        if no_mdns {
            cmd.arg("--no-mdns");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the worker");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().expect("piped stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(a) = line.strip_prefix("listening on ") {
                    let _ = tx.send(a.trim().to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("a socket address"),
            Err(_) => {
                let _ = child.kill();
                panic!("the worker did not start: {}", log.lock().unwrap());
            }
        };
        Worker { child, addr, log }
    }

    /// `127.0.0.1:PORT`.
    pub fn spec(&self) -> String {
        self.addr.to_string()
    }

    /// What the worker logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits up to `timeout` for `needle` to appear in the log.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> String {
        let t = std::time::Instant::now();
        loop {
            let log = self.log();
            if log.contains(needle) || t.elapsed() > timeout {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// SIGKILL.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal by name (`STOP`, `CONT`).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Peak resident memory of the process (`VmHWM`), in KiB (Linux).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc status");
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .expect("VmHWM")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.alive() {
            // A stopped process must be continued to die of SIGKILL promptly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(self.child.id().to_string())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the `coordinator` binary.
pub fn coordinator(args: &[&str]) -> Output {
    Command::new(bin("coordinator"))
        .args(args)
        .output()
        .expect("run coordinator")
}

/// A fresh cluster service for the model in `dir` with `workers`, a request
/// timeout, and the coordinator's own copy of the experts when `local`.
pub fn service(dir: &Path, key: &Path, workers: &[SocketAddr], timeout: Duration, local: bool) -> Arc<ClusterService> {
    let (model, _) = load_model(dir).expect("load the model");
    let cfg = &model.cfg;
    let shape = ModelShape {
        num_layers: cfg.num_layers,
        moe_layers: (0..cfg.num_layers)
            .filter(|&l| cfg.is_moe_layer(l))
            .map(|l| l as u16)
            .collect(),
        num_experts: cfg.num_experts as u32,
        top_k: cfg.top_k,
        hidden: cfg.hidden_size as u32,
    };
    let local: Option<LocalBuilder> = local.then(|| {
        let dir = dir.to_path_buf();
        let build: LocalBuilder = Box::new(move || {
            Engine::local(&dir)
                .map(|e| e.expert_service().clone())
                .map_err(|e| e.to_string())
        });
        build
    });
    Arc::new(
        ClusterService::start(ClusterOptions {
            key: load_key(key),
            fingerprint: model_fingerprint(dir).expect("fingerprint"),
            shape,
            workers: workers.to_vec(),
            mdns: None,
            request_timeout: timeout,
            local,
        })
        .expect("start the cluster service"),
    )
}

/// An engine for `dir` whose experts run on `svc`, sending one-layer-ahead
/// predictions (as the CLI does by default).
pub fn engine(dir: &Path, svc: Arc<ClusterService>) -> Engine {
    let (model, _) = load_model(dir).expect("load the model");
    let mut e = Engine::new(model, svc);
    e.prefetch = true;
    e
}

/// Greedy generation of `n` tokens, eos ignored.
pub fn greedy(engine: &Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let params = GenerateParams {
        max_tokens: n,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        ignore_eos: true,
    };
    engine
        .generate(&mut engine.session(), prompt, &params, |_| true)
        .expect("generate")
        .ids
}

/// The bit patterns of a float slice (to compare bit for bit).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `coordinator convert --quant bf16` of `src` into `dir/name`.
pub fn convert_bf16(src: &Path, dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let o = Command::new(bin("coordinator"))
        .arg("--model")
        .arg(src)
        .args(["convert", "--out"])
        .arg(&out)
        .args(["--quant", "bf16"])
        .output()
        .expect("run coordinator convert");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// A copy of the container `src` whose manifest lists only the experts
/// `keep` accepts (a worker that holds part of the model).
pub fn partial_container(src: &Path, dir: &Path, name: &str, keep: impl Fn(u64, u64) -> bool) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, out.join(p.file_name().unwrap())).unwrap();
        }
    }
    let path = out.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let records = m["records"].as_array_mut().unwrap();
    records.retain(|r| keep(r["layer"].as_u64().unwrap(), r["expert"].as_u64().unwrap()));
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    out
}

/// `1,2,3`.
pub fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The ids of a `generate --json` output.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Parses the stdout of a successful `generate --json` run.
pub fn json_out(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "coordinator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}
