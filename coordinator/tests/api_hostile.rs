//! The HTTP server against hostile or broken clients, on 127.0.0.1: slow
//! heads and bodies, idle keep-alive connections, more connections than the
//! cap, work refused before it is done when the queue is full, oversized
//! stop lists, API keys that differ only in length, and web pages of
//! origins the server does not trust. The timeouts are
//! set short here; nothing asserts how fast anything runs.

mod api_support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use api_support::*;
use charm_coordinator::server::{ServeError, Server, ServerConfig, MAX_STOP_BYTES, MAX_STOP_SEQUENCES};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn chat_body(text: &str, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0})
}

/// Short connection timeouts (each test lengthens the ones it does not test).
fn short(c: &mut ServerConfig, ms: u64) {
    c.header_read_timeout = Duration::from_millis(ms);
    c.body_read_timeout = Duration::from_millis(ms);
    c.idle_timeout = Duration::from_millis(ms);
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Reads until the server closes the connection; the bytes it sent first.
/// Fails when the server keeps it open for [`PATIENCE`].
fn read_until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => return out,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("the server kept the connection open ({e}); got {out:?}"),
        }
    }
}

/// The first response on a kept-alive connection (with `Content-Length`).
fn read_one_response(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut r = std::io::BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .expect("content-length");
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    assert!(r.buffer().is_empty());
    (status, body)
}

/// `GET /health` until it answers 200 (connections may be refused meanwhile).
fn wait_served(addr: SocketAddr) {
    let t = Instant::now();
    loop {
        let mut s = connect(addr);
        let _ = s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes());
        let got = read_until_closed(&mut s);
        if got.starts_with(b"HTTP/1.1 200") {
            return;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "never served again: {}",
            String::from_utf8_lossy(&got)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn slow_header_client_is_dropped() {
    let srv = server(|c| {
        short(c, 60_000);
        c.header_read_timeout = Duration::from_millis(500);
    });
    let addr = srv.addr();
    // Half a request line, then nothing: closed without an answer.
    let mut half = connect(addr);
    half.write_all(b"GET /health HT").unwrap();
    assert_eq!(read_until_closed(&mut half), b"", "no answer to half a request");
    // A head trickled a header line at a time never completes either.
    let mut trickle = connect(addr);
    trickle.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
    let t = Instant::now();
    let mut closed = false;
    while t.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(50));
        if trickle.write_all(b"X-Slow: 1\r\n").is_err() {
            closed = true;
            break;
        }
        trickle.set_nonblocking(true).unwrap();
        let mut b = [0u8; 16];
        let r = trickle.read(&mut b);
        trickle.set_nonblocking(false).unwrap();
        match r {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => panic!("answered a head that never ended: {:?}", &b[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "a trickled head held the connection");
    // A connection that sends nothing at all is closed too.
    let mut silent = connect(addr);
    assert_eq!(read_until_closed(&mut silent), b"");
    // Whole requests are still answered.
    assert_eq!(get(addr, "/health").status, 200);
}

#[test]
fn slow_body_client_is_dropped() {
    let srv = server(|c| {
        short(c, 60_000);
        c.body_read_timeout = Duration::from_millis(500);
    });
    let addr = srv.addr();
    let mut s = connect(addr);
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(b"{\"messages\": ").unwrap();
    let got = read_until_closed(&mut s);
    assert!(!got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
    assert_eq!(post(addr, CHAT, &chat_body("hi", 2)).status, 200);
}

#[test]
fn idle_keep_alive_connection_is_closed() {
    let srv = server(|c| {
        short(c, 60_000);
        c.idle_timeout = Duration::from_millis(1000);
    });
    let addr = srv.addr();
    let mut s = connect(addr);
    for _ in 0..2 {
        // Kept alive between requests that come in time.
        s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .unwrap();
        let (status, body) = read_one_response(&mut s);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    // Then nothing: the server closes it.
    assert_eq!(read_until_closed(&mut s), b"");
}

#[test]
fn long_answers_and_active_streams_outlive_the_timeouts() {
    // 15 ms per layer step (2 layers): 40 tokens take well over the 500 ms
    // timeouts.
    let (engine, info, gate) = gated_engine(false, Duration::from_millis(15));
    let srv = server_with(engine, &info, |c| short(c, 500));
    let addr = srv.addr();
    // A non-streaming answer that waits (held at the gate) past every timeout.
    let waiting = std::thread::spawn(move || post(addr, CHAT, &chat_body("wait for it", 3)));
    gate.wait_arrival();
    std::thread::sleep(Duration::from_millis(1200));
    gate.open();
    let r = waiting.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    // A stream that keeps producing for longer than every timeout.
    let mut body = chat_body("Tell me a long story", 40);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = SseStream::post(addr, CHAT, &body).collect();
    let n = events.len();
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"), "{events:?}");
    let usage: Value = serde_json::from_str(&events[n - 2].data).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 40, "the whole stream: {usage}");
}

#[test]
fn connections_beyond_the_cap_are_refused() {
    let srv = server(|c| {
        short(c, 60_000);
        c.max_connections = 2;
    });
    let addr = srv.addr();
    // Two silent connections take both places.
    let held = [connect(addr), connect(addr)];
    let mut third = connect(addr);
    let got = read_until_closed(&mut third);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains('2'), "{body}");
    // A place frees when a connection ends.
    drop(held);
    wait_served(addr);
    assert_eq!(post(addr, CHAT, &chat_body("hi", 2)).status, 200);

    let (engine, info) = engine();
    let mut cfg = ServerConfig::new(&chat_fixture());
    cfg.max_connections = 0;
    assert!(matches!(
        Server::start(engine, &info, cfg),
        Err(ServeError::MaxConnections { got: 0, .. })
    ));
}

#[test]
fn prompt_is_not_tokenized_when_queue_is_full() {
    let (engine, info, gate) = gated_engine(false, Duration::ZERO);
    let srv = server_with(engine, &info, |c| c.queue_size = 1);
    let addr = srv.addr();
    let a = std::thread::spawn(move || post(addr, CHAT, &chat_body("first", 2)));
    gate.wait_arrival();
    wait_health(addr, "A running", |h| h["running"] == 1);
    let b = std::thread::spawn(move || post(addr, CHAT, &chat_body("second", 2)));
    wait_health(addr, "B queued", |h| h["queued"] == 1);

    // Prompts over the 512-token context: only tokenizing them finds that
    // out (400), so a 429 says the full queue refused them first.
    let long = "word ".repeat(2000);
    let completion = json!({"prompt": long, "max_tokens": 2});
    let r = post(addr, "/v1/completions", &completion);
    assert_eq!(r.status, 429, "{}", r.text());
    let r = post(addr, CHAT, &chat_body(&long, 2));
    assert_eq!(r.status, 429, "{}", r.text());
    let r = post(
        addr,
        "/v1/messages",
        &json!({"max_tokens": 2, "messages": [{"role": "user", "content": long}]}),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");

    gate.open();
    assert_eq!(a.join().unwrap().status, 200);
    assert_eq!(b.join().unwrap().status, 200);
    // With room, the same prompt is tokenized and found too long.
    let r = post(addr, "/v1/completions", &completion);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("context"));
    // A refused request left its place free.
    wait_health(addr, "idle", |h| h["queued"] == 0 && h["running"] == 0);
}

#[test]
fn too_many_or_too_long_stop_strings_are_refused() {
    let srv = server(|_| {});
    let addr = srv.addr();
    let mut body = chat_body("hi", 2);
    body["stop"] = json!(vec!["zq"; MAX_STOP_SEQUENCES + 1]);
    let r = post(addr, CHAT, &body);
    assert_eq!(r.status, 400, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["param"], "stop");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&MAX_STOP_SEQUENCES.to_string()),
        "{v}"
    );
    body["stop"] = json!("z".repeat(MAX_STOP_BYTES + 1));
    let r = post(addr, CHAT, &body);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&MAX_STOP_BYTES.to_string()));
    let c = json!({"prompt": "abc", "max_tokens": 2, "stop": vec!["zq"; MAX_STOP_SEQUENCES + 1]});
    assert_eq!(post(addr, "/v1/completions", &c).status, 400);
    let a = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
                   "stop_sequences": vec!["zq"; MAX_STOP_SEQUENCES + 1]});
    let r = post(addr, "/v1/messages", &a);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("stop_sequences"));
    // At the limits: served.
    body["stop"] = json!(vec!["z".repeat(MAX_STOP_BYTES); MAX_STOP_SEQUENCES]);
    assert_eq!(post(addr, CHAT, &body).status, 200);
}

#[test]
fn api_key_compare_rejects_prefixes_and_extensions() {
    let srv = server(|c| c.api_key = Some("sekrit-key".into()));
    let addr = srv.addr();
    let body = chat_body("hi", 2).to_string();
    let status = |h: &[(&str, &str)]| request(addr, "POST", CHAT, h, body.as_bytes()).status;
    for wrong in [
        "",
        "s",
        "sekrit-ke",
        "sekrit-key2",
        "sekrit-keysekrit-key",
        "SEKRIT-KEY",
        "sekrit-kez",
    ] {
        assert_eq!(status(&[("x-api-key", wrong)]), 401, "{wrong:?}");
        let bearer = format!("Bearer {wrong}");
        assert_eq!(status(&[("Authorization", &bearer)]), 401, "{wrong:?}");
    }
    assert_eq!(status(&[("x-api-key", "sekrit-key")]), 200);
    assert_eq!(status(&[("Authorization", "Bearer sekrit-key")]), 200);
}

/// A request sent as `host` (the `Host` header) from a page at `origin`.
fn from_page(addr: SocketAddr, method: &str, path: &str, host: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = connect(addr);
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    read_response(s)
}

#[test]
fn web_pages_of_untrusted_origins_cannot_drive_the_server() {
    let srv = server(|c| {
        c.origins = charm_coordinator::server::origin::Origins::parse(&["https://chat.example.com".into()]).unwrap();
        c.api_key = None;
    });
    let addr = srv.addr();
    let host = addr.to_string();
    let body = chat_body("Hi", 2).to_string();
    // A page elsewhere: 403 before anything runs, even as a `text/plain`
    // POST (which a browser sends without a preflight), in the API's shape.
    for (path, ty, flavor) in [
        (CHAT, "text/plain", "openai"),
        ("/v1/messages", "application/json", "anthropic"),
    ] {
        let r = from_page(
            addr,
            "POST",
            path,
            &host,
            &[("Origin", "https://evil.example"), ("Content-Type", ty)],
            body.as_bytes(),
        );
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(r.header("access-control-allow-origin").is_none());
        let v = r.json();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("--cors-origin https://evil.example"), "{v}");
        assert_eq!(v["error"]["type"], "permission_error");
        assert_eq!(v["type"] == "error", flavor == "anthropic", "{v}");
    }
    let pre = from_page(
        addr,
        "OPTIONS",
        CHAT,
        &host,
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        b"",
    );
    assert_eq!(pre.status, 403);
    let served = get(addr, "/metrics").text();
    assert!(
        served.contains("charm_prompt_tokens_total 0\n"),
        "a refused page ran nothing: {served}"
    );

    // Loopback pages, the listed origin and the server's own pages: the
    // preflight is answered and the answer is readable.
    for (origin, as_host) in [
        ("http://localhost:3000", host.as_str()),
        ("http://[::1]:5173", host.as_str()),
        ("https://chat.example.com", host.as_str()),
        ("http://mybox.lan:8000", "mybox.lan:8000"),
    ] {
        let pre = from_page(
            addr,
            "OPTIONS",
            CHAT,
            as_host,
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "content-type, authorization"),
            ],
            b"",
        );
        assert_eq!(pre.status, 204, "{origin}: {}", pre.text());
        assert_eq!(pre.header("access-control-allow-origin"), Some(origin));
        assert_eq!(
            pre.header("access-control-allow-headers"),
            Some("content-type, authorization")
        );
        assert!(pre.header("access-control-allow-methods").unwrap().contains("POST"));
        let r = from_page(
            addr,
            "POST",
            CHAT,
            as_host,
            &[("Origin", origin), ("Content-Type", "application/json")],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{origin}: {}", r.text());
        assert_eq!(r.header("access-control-allow-origin"), Some(origin));
    }
    // The same name on another port is another origin.
    let r = from_page(
        addr,
        "POST",
        CHAT,
        "mybox.lan:8000",
        &[("Origin", "http://mybox.lan:9000")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 403);
    // No Origin (curl, SDKs): unchanged.
    assert_eq!(post(addr, CHAT, &chat_body("Hi", 2)).status, 200);
}

#[test]
fn a_malformed_cors_origin_stops_the_server_from_starting() {
    let e = charm_coordinator::server::origin::Origins::parse(&["chat.example.com".into()]).unwrap_err();
    assert!(e.contains("scheme://host[:port]"), "{e}");
}
