//! The dashboard in a real headless Chromium, driven over the WebDriver
//! protocol (chromedriver): the page loads from the binary, shows the
//! in-process worker, its chat streams an answer (the engine's own greedy
//! answer, with TTFT and tok/s shown), and the expert grid changes — both
//! its routed-row count (exactly what the request routed) and its pixels.
//! With tools typed in and `required` chosen, the chat shows the forced
//! call; against a template that opens a `<think>` block, it shows the
//! reasoning apart from the answer (both the engine's own, split).
//! Synthetic snapshots at the demo's 30 × 4 and at 48 × 128 over three
//! workers show the grid fits its panel and a third of the window, each
//! worker's experts in its colour.
//! Screenshots are kept in `target/test-artifacts/` (`dashboard.png`,
//! `dashboard-30x4.png`, `dashboard-48x128.png`).
//!
//! Needs `chromium` and `chromedriver` (Debian: `chromium chromium-driver`,
//! installed by `scripts/test.sh`). Without them the test is skipped with a
//! loud message, unless `CHARM_CI=1`, where it fails.

mod api_support;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use api_support::*;
use charm_coordinator::chat_template::Message;
use serde_json::{json, Value};

const MESSAGE: &str = "Hello dashboard";

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

struct Driver {
    child: Child,
    addr: SocketAddr,
    session: Option<String>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = request(self.addr, "DELETE", &format!("/session/{s}"), &[], b"");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start(chromedriver: &PathBuf) -> Driver {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let d = Driver {
            child,
            addr,
            session: None,
        };
        let t = Instant::now();
        loop {
            if std::net::TcpStream::connect(addr).is_ok() && get(addr, "/status").json()["value"]["ready"] == true {
                return d;
            }
            assert!(t.elapsed() < PATIENCE, "chromedriver never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let s = self.session.as_deref().expect("a session");
        let r = request(
            self.addr,
            method,
            &format!("/session/{s}{path}"),
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        let v = r.json();
        assert_eq!(r.status, 200, "WebDriver {method} {path}: {v}");
        v["value"].clone()
    }

    fn new_session(&mut self, chromium: &PathBuf, profile: &std::path::Path) {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                         "--disable-background-networking", "--disable-component-update", "--disable-sync",
                         "--disable-dev-shm-usage", "--window-size=1400,1100",
                         format!("--user-data-dir={}", profile.display())]
            }
        }}});
        let r = request(
            self.addr,
            "POST",
            "/session",
            &[("Content-Type", "application/json")],
            caps.to_string().as_bytes(),
        );
        let v = r.json();
        assert_eq!(r.status, 200, "new session: {v}");
        self.session = Some(v["value"]["sessionId"].as_str().unwrap().to_string());
    }

    fn js(&self, script: &str) -> Value {
        self.call("POST", "/execute/sync", &json!({"script": script, "args": []}))
    }

    /// Polls `script` until `pred` holds on its result.
    fn wait_for(&self, what: &str, script: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let t = Instant::now();
        loop {
            let v = self.js(script);
            if pred(&v) {
                return v;
            }
            assert!(t.elapsed() < PATIENCE, "timed out waiting for {what}; last {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn element(&self, css: &str) -> String {
        let v = self.call("POST", "/element", &json!({"using": "css selector", "value": css}));
        v.as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// A hash of the expert grid's pixels.
const GRID_PIXELS: &str = "const c = document.getElementById('grid');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let h = 0; for (let i = 0; i < d.length; i++) { h = (h * 31 + d[i]) >>> 0; } return h;";

#[test]
fn dashboard_shows_the_worker_chats_and_lights_the_grid() {
    let (Some(chromium), Some(chromedriver)) = (
        find(&["chromium", "chromium-browser", "google-chrome"]),
        find(&["chromedriver"]),
    ) else {
        assert!(!strict(), "CHARM_CI=1 but chromium / chromedriver are missing");
        eprintln!("\n!!! SKIPPED dashboard test: chromium and chromedriver not found (apt-get install chromium chromium-driver) !!!\n");
        return;
    };
    let srv = server(|_| {});
    let (prompt, ids, text) = solo_chat(&[Message::new("user", MESSAGE)], 64);
    let routed = ((prompt.len() + ids.len() - 1) * 2 * 2) as u64;

    let profile = tempfile::tempdir().unwrap();
    let mut d = Driver::start(&chromedriver);
    d.new_session(&chromium, profile.path());
    d.call("POST", "/url", &json!({"url": srv.url()}));

    // The cluster panel shows the in-process worker, and the feed is live.
    let worker = d.wait_for(
        "the worker row",
        "const r = document.querySelector('#workers tbody tr.worker');
         return r ? Array.from(r.children).map(td => td.textContent) : null;",
        |v| v.is_array(),
    );
    assert_eq!(worker[0], "in-process");
    assert_eq!(worker[1], "up");
    assert_eq!(worker[2], "8", "2 MoE layers × 4 experts");
    assert_eq!(worker[5], "n/a", "no network round trip in-process");
    d.wait_for(
        "the live feed",
        "return document.getElementById('conn').textContent;",
        |v| v == "live",
    );
    assert_eq!(
        d.js("return document.getElementById('grid-total').dataset.routed;"),
        "0"
    );
    let before = d.js(GRID_PIXELS);

    // Chat through the page: the engine's greedy answer, with TTFT and tok/s.
    let input = d.element("#chat-input");
    d.call("POST", &format!("/element/{input}/value"), &json!({"text": MESSAGE}));
    let send = d.element("#chat-send");
    d.call("POST", &format!("/element/{send}/click"), &json!({}));
    d.wait_for(
        "the chat answer",
        "return document.getElementById('chat-stats').dataset.done || null;",
        |v| v == "1",
    );
    let answer =
        d.js("const m = document.querySelectorAll('#chat-log .msg.assistant'); return m[m.length - 1].textContent;");
    assert_eq!(answer, text.as_str());
    let stats = d.js("return document.getElementById('chat-stats').textContent;");
    let stats = stats.as_str().unwrap();
    assert!(
        stats.starts_with("TTFT ") && stats.contains(" tok/s · ") && stats.ends_with(&format!("{} tokens", ids.len())),
        "{stats}"
    );

    // The grid counted exactly what the request routed, and its pixels changed.
    d.wait_for(
        "the grid to count the routed rows",
        "return document.getElementById('grid-total').dataset.routed;",
        |v| v == routed.to_string().as_str(),
    );
    // The count is set at once; the canvas repaints on the next animation
    // frame, so its pixels are polled (a grid that never repaints times out).
    d.wait_for("the expert grid's pixels to change", GRID_PIXELS, |v| *v != before);
    // The profile panel lists the request.
    d.wait_for(
        "the profile row",
        "return document.querySelectorAll('#profile .req').length;",
        |v| v.as_u64() >= Some(1),
    );

    // Tools: a forced call shows as a tool call, held to its schema.
    d.js("document.getElementById('chat-tools-box').open = true;
          document.getElementById('chat-tools').value = JSON.stringify([{type: 'function', function: {name: 'get_weather',
            parameters: {type: 'object', properties: {city: {enum: ['Paris', 'Lagos']}}, required: ['city'],
                         additionalProperties: false}}}]);
          document.getElementById('chat-tool-choice').value = 'required';
          document.getElementById('chat-stats').dataset.done = '';
          return null;");
    d.call(
        "POST",
        &format!("/element/{input}/value"),
        &json!({"text": "Weather in Paris?"}),
    );
    d.call("POST", &format!("/element/{send}/click"), &json!({}));
    d.wait_for(
        "the tool call",
        "return document.getElementById('chat-stats').dataset.done || null;",
        |v| v == "1",
    );
    let call = d.js("const m = document.querySelectorAll('#chat-log .msg.call'); return m.length ? m[m.length - 1].textContent : null;");
    let call = call.as_str().unwrap_or_else(|| panic!("no tool call shown: {call}"));
    assert!(
        call == r#"get_weather({"city":"Paris"})"# || call == r#"get_weather({"city":"Lagos"})"#,
        "{call}"
    );

    // Let the white flashes fade so the screenshot shows the heat colours.
    std::thread::sleep(Duration::from_millis(1000));
    let png_b64 = d.call("GET", "/screenshot", &json!({}));
    let png = base64_decode(png_b64.as_str().unwrap());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let dir = repo().join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dashboard.png"), &png).unwrap();
    eprintln!("screenshot: {}", dir.join("dashboard.png").display());

    // Real shapes fit one screen (synthetic snapshots): the demo's 30 × 4
    // and a Qwen3-30B-A3B-sized 48 × 128 over three workers, each expert
    // in its owner's colour.
    for (layers, experts, workers, name) in [
        (30usize, 4usize, 1usize, "dashboard-30x4.png"),
        (48, 128, 3, "dashboard-48x128.png"),
    ] {
        let cells = layers * experts;
        let owners: Vec<i64> = (0..cells).map(|i| (i % experts % workers) as i64).collect();
        let heat: Vec<u64> = (0..cells as u64).map(|i| (i * 7919) % 97).collect();
        let worker_rows: Vec<Value> = (0..workers)
            .map(|w| json!({"address": format!("10.0.0.{}:7411", w + 1), "status": "up", "experts_owned": cells / workers,
                            "experts_served": 10, "cache_bytes": 1u64 << 30, "cache_budget_bytes": null, "hit_rate": 0.9,
                            "rtt_ms": 1.5, "compute_ms": 0.5, "disk_bytes_read": 0, "network_bytes_sent": 0,
                            "network_bytes_received": 0, "round_trips": 5, "failures": 0, "failovers": 0, "hedges": 0}))
            .collect();
        let snapshot = json!({
            "model": {"id": "synthetic", "path": "synthetic", "family": "Qwen3MoeForCausalLM", "layers": layers,
                      "experts": experts, "top_k": 8, "moe_layers": vec![true; layers], "context": 4096,
                      "placement": if workers > 1 { "remote" } else { "disk" }},
            "heat": heat, "owners": if workers > 1 { json!(owners) } else { Value::Null },
            "workers": worker_rows, "worker": worker_rows[0],
            "queue": {"queued": 0, "running": 0, "capacity": 16, "max_batch": 4}, "prefix_cache": null,
            "active": [], "recent": [], "recent_seq": 0, "steps": 0, "uptime_s": 1.0
        });
        d.js(&format!("window.charmShow({snapshot}); return null;"));
        let fit = d.js("const c = document.getElementById('grid').getBoundingClientRect();
             const p = document.getElementById('grid').parentElement.getBoundingClientRect();
             return {top: c.top, bottom: c.bottom, left: c.left, right: c.right, width: c.width, height: c.height,
                     panelRight: p.right, viewport: window.innerHeight};");
        let f = |k: &str| fit[k].as_f64().unwrap();
        assert!(f("width") > 0.0 && f("height") > 0.0, "{name}: {fit}");
        assert!(
            f("right") <= f("panelRight") + 0.5,
            "{name}: the grid overflows its panel: {fit}"
        );
        assert!(
            f("height") <= f("viewport") / 3.0 + 0.5,
            "{name}: the grid is over a third of the window: {fit}"
        );
        assert!(
            f("bottom") <= f("viewport"),
            "{name}: the grid runs below the fold: {fit}"
        );
        if workers > 1 {
            // Cells of different owners are drawn in different colours.
            let hues = d.js(&format!(
                "const c = document.getElementById('grid'); const x = c.getContext('2d');
                 const cell = c.width / {experts};
                 const px = (e) => Array.from(x.getImageData(Math.floor((e + 0.5) * cell), Math.floor(cell / 2), 1, 1).data.slice(0, 3));
                 return [px(0), px(1), px(2)].map(p => p.indexOf(Math.max(...p)));"
            ));
            let h = hues.as_array().unwrap();
            assert!(
                h[0] != h[1] || h[1] != h[2],
                "{name}: one colour for every worker: {hues}"
            );
            let legend = d.js("return document.getElementById('grid-legend').textContent;");
            for w in 1..=workers {
                assert!(
                    legend.as_str().unwrap().contains(&format!("10.0.0.{w}:7411")),
                    "{legend}"
                );
            }
        }
        let png = base64_decode(d.call("GET", "/screenshot", &json!({})).as_str().unwrap());
        std::fs::write(dir.join(name), &png).unwrap();
    }

    // Reasoning: a template that opens a <think> block in the prompt (as
    // DeepSeek-R1's and the Qwen3 thinking models' do) makes the answer
    // reasoning until it closes; the page shows it as thinking.
    let dir = fixture_with_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
    );
    let (served, info) = engine();
    let thinker = server_with(served, &info, |c| c.model_dir = dir.path().to_path_buf());
    d.call("POST", "/url", &json!({"url": thinker.url()}));
    d.wait_for(
        "the live feed",
        "return document.getElementById('conn').textContent;",
        |v| v == "live",
    );
    let input = d.element("#chat-input");
    d.call("POST", &format!("/element/{input}/value"), &json!({"text": MESSAGE}));
    let send = d.element("#chat-send");
    d.call("POST", &format!("/element/{send}/click"), &json!({}));
    d.wait_for(
        "the thinking answer",
        "return document.getElementById('chat-stats').dataset.done || null;",
        |v| v == "1",
    );
    let codec = charm_coordinator::TextCodec::load(dir.path()).unwrap();
    let (engine, _) = engine();
    let prompt = codec.encode_chat(&[Message::new("user", MESSAGE)], true, &[]).unwrap();
    let params = charm_coordinator::GenerateParams {
        max_tokens: 64,
        sampling: Default::default(),
        ignore_eos: false,
    };
    let gen = engine
        .generate(&mut engine.session(), &prompt, &params, |_| true)
        .unwrap();
    let text = codec.decode(&gen.ids, true).unwrap();
    let (reasoning, answer) = charm_coordinator::server::reasoning::split(true, &text);
    let shown = d.js(
        "const m = document.querySelectorAll('#chat-log .msg.reasoning'); return m.length ? m[0].textContent : null;",
    );
    assert_eq!(shown, reasoning.as_str(), "the page shows the reasoning");
    assert!(!reasoning.is_empty());
    let answered = d.js("const m = document.querySelectorAll('#chat-log .msg.assistant'); return m.length ? m[m.length - 1].textContent : null;");
    assert_eq!(answered, answer.as_str());
}

/// Standard base64 (the WebDriver screenshot encoding).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().fold(0u32, |acc, &c| (acc << 6) | val(c) as u32) << (6 * (4 - chunk.len()));
        let b = n.to_be_bytes();
        out.extend_from_slice(&b[1..chunk.len()]);
    }
    out
}
