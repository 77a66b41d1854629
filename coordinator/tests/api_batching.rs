//! Serving several clients at once, against real servers on 127.0.0.1
//! serving the qwen3moe-chat fixture: requests batched together (prompts
//! of different lengths read in small chunks beside others' decoding,
//! greedy and seeded, some waiting for a free place) get the very tokens
//! and log-probability bits they get alone; a request cancelled while its
//! prompt is read frees its place; the prefix cache serves a repeated or
//! extended prompt with the same tokens and says so in `usage`, keeps its
//! entries across a restart (refusing a damaged file) and stays within its
//! budget; a model with recurrent layers (qwen3next) is batched and its
//! prefixes reused (the state kept at the end of each prompt) with the
//! same tokens; `ignore_eos` generates past an end-of-sequence token.

mod api_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use api_support::*;
use charm_coordinator::server::{Server, ServerConfig};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn chat(messages: Value, max_tokens: usize) -> Value {
    json!({"model": "qwen3moe-chat", "messages": messages, "max_tokens": max_tokens,
           "temperature": 0, "logprobs": true, "top_logprobs": 2})
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// A server that runs one request at a time and keeps no prefixes: the
/// reference for what a request gets alone.
fn reference() -> Server {
    server(|c| {
        c.max_batch = Some(1);
        c.prefix_cache_bytes = Some(0);
    })
}

/// Text, per-token log-probabilities and usage of a chat answer (whole or
/// streamed).
fn answer(addr: std::net::SocketAddr, body: &Value) -> (String, Value, Value) {
    if body["stream"] == true {
        let events = SseStream::post(addr, CHAT, body).collect();
        assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
        let (mut text, mut lps, mut usage) = (String::new(), Vec::new(), Value::Null);
        for e in &events[..events.len() - 1] {
            let v: Value = serde_json::from_str(&e.data).unwrap();
            if !v["usage"].is_null() {
                usage = v["usage"].clone();
            }
            for c in v["choices"].as_array().unwrap() {
                text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
                lps.extend(c["logprobs"]["content"].as_array().cloned().unwrap_or_default());
            }
        }
        (text, json!(lps), usage)
    } else {
        let r = post(addr, CHAT, body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let c = &v["choices"][0];
        (
            c["message"]["content"].as_str().unwrap().to_string(),
            c["logprobs"]["content"].clone(),
            v["usage"].clone(),
        )
    }
}

/// The value of an unlabelled series in `/metrics`.
fn metric(addr: std::net::SocketAddr, name: &str) -> u64 {
    let text = get(addr, "/metrics").text();
    let line = text
        .lines()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"));
    line.split(' ').nth(1).unwrap().parse::<f64>().unwrap() as u64
}

#[test]
fn batched_requests_get_exactly_what_they_get_alone() {
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(12);
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            let text = if i == 2 {
                long.clone()
            } else {
                format!("Request number {i} says hello{}", " again".repeat(i))
            };
            let mut b = chat(user(&text), 12 + 3 * i);
            if i % 2 == 1 {
                b["temperature"] = json!(0.9);
                b["seed"] = json!(4242 + i);
            }
            if i == 4 {
                b["stream"] = json!(true);
                b["stream_options"] = json!({"include_usage": true});
            }
            b
        })
        .collect();
    let solo: Vec<_> = {
        let r = reference();
        bodies.iter().map(|b| answer(r.addr(), b)).collect()
    };

    // The first request holds the engine in its first step while the rest
    // queue up; then up to four run together, prompts read 8 rows at a time.
    let (mut engine, info, gate) = gated_engine(false, Duration::ZERO);
    engine.prefill_chunk = 8;
    let srv = server_with(engine, &info, |c| {
        c.max_batch = Some(4);
        c.prefix_cache_bytes = Some(0);
        c.queue_size = 8;
    });
    let addr = srv.addr();
    let together: Vec<_> = std::thread::scope(|s| {
        let first = s.spawn(|| answer(addr, &bodies[0]));
        gate.wait_arrival();
        let rest: Vec<_> = bodies[1..].iter().map(|b| s.spawn(move || answer(addr, b))).collect();
        wait_health(addr, "five waiting", |h| h["queued"] == 5 && h["running"] == 1);
        gate.open();
        std::iter::once(first).chain(rest).map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert!(!a.1.as_array().unwrap().is_empty(), "request {i} has logprobs");
        assert_eq!(a.0, b.0, "request {i}: text differs in a batch");
        assert_eq!(a.1, b.1, "request {i}: tokens or logprob bits differ in a batch");
        assert_eq!(a.2, b.2, "request {i}: usage differs in a batch");
    }
    assert_eq!(metric(addr, "charm_engine_largest_step_requests"), 4);
    // The expert store hears each request end (to persist what it learned),
    // just after its answer.
    let t = std::time::Instant::now();
    while gate.ended.load(std::sync::atomic::Ordering::SeqCst) < 6 {
        assert!(t.elapsed() < PATIENCE, "the expert store heard only some requests end");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(gate.ended.load(std::sync::atomic::Ordering::SeqCst), 6);
    assert_eq!(metric(addr, "charm_max_batch"), 4);
    let h = get(addr, "/health").json();
    assert_eq!((h["running"].as_u64(), h["queued"].as_u64()), (Some(0), Some(0)), "{h}");
}

#[test]
fn a_request_cancelled_while_its_prompt_is_read_frees_its_place() {
    // Slow steps and 4-row chunks: the long prompt takes dozens of steps.
    let (mut engine, info, gate) = gated_engine(true, Duration::from_millis(15));
    engine.prefill_chunk = 4;
    let srv = server_with(engine, &info, |c| {
        c.max_batch = Some(1);
        c.prefix_cache_bytes = Some(0);
    });
    let addr = srv.addr();
    let mut long = chat(user(&"Tell me everything about rivers. ".repeat(10)), 400);
    long["stream"] = json!(true);
    let stream = SseStream::post(addr, CHAT, &long);
    assert_eq!(stream.status, 200);
    let short = chat(user("hello"), 6);
    let waiting = std::thread::spawn(move || answer(addr, &short));
    wait_health(addr, "one running, one waiting", |h| {
        h["running"] == 1 && h["queued"] == 1
    });
    let steps = gate.arrived.load(std::sync::atomic::Ordering::SeqCst);
    stream.disconnect();
    let got = waiting.join().unwrap();
    let want = answer(reference().addr(), &chat(user("hello"), 6));
    assert_eq!(got.0, want.0);
    assert_eq!(got.1, want.1);
    let recent = get(addr, "/api/state").json()["recent"].clone();
    let cancelled = recent
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["finish"] == "cancelled")
        .unwrap_or_else(|| panic!("no cancelled record: {recent}"))
        .clone();
    // It never got past its prompt: no token was generated.
    assert_eq!(cancelled["completion_tokens"], 0, "{cancelled}");
    assert!(steps < 60, "the prompt was still being read ({steps} layer steps)");
}

#[test]
fn the_prefix_cache_serves_repeated_and_extended_prompts_with_the_same_tokens() {
    let r = reference();
    let srv = server(|_| {});
    let turn1 = chat(user("Tell me about the sea"), 10);
    let (a1, lp1, u1) = answer(srv.addr(), &turn1);
    assert_eq!(answer(r.addr(), &turn1).0, a1);
    assert_eq!(u1["prompt_tokens_details"]["cached_tokens"], 0, "{u1}");

    // The next turn starts with the first turn's tokens.
    let turn2 = chat(
        json!([{"role": "user", "content": "Tell me about the sea"},
               {"role": "assistant", "content": a1},
               {"role": "user", "content": "And the sky?"}]),
        10,
    );
    let want = answer(r.addr(), &turn2);
    let got = answer(srv.addr(), &turn2);
    assert_eq!((&got.0, &got.1), (&want.0, &want.1), "an extended prompt");
    let cached = got.2["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = got.2["prompt_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt, "{}", got.2);
    assert_eq!(want.2["prompt_tokens_details"]["cached_tokens"], 0);

    // The same prompt again is served whole, streamed too.
    let again = answer(srv.addr(), &turn1);
    assert_eq!((&again.0, &again.1), (&a1, &lp1), "a repeated prompt");
    assert_eq!(again.2["prompt_tokens_details"]["cached_tokens"], u1["prompt_tokens"]);
    let mut streamed = turn2.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let s = answer(srv.addr(), &streamed);
    assert_eq!((&s.0, &s.1), (&want.0, &want.1));
    assert_eq!(s.2["prompt_tokens_details"]["cached_tokens"], prompt);

    // Anthropic: cached prompt tokens are cache reads, the rest input.
    let msg = json!({"model": "qwen3moe-chat", "max_tokens": 10, "temperature": 0,
                     "messages": [{"role": "user", "content": "Tell me about the sea"}]});
    let m1 = post(srv.addr(), MESSAGES, &msg).json();
    let m2 = post(srv.addr(), MESSAGES, &msg).json();
    assert_eq!(m1["content"], m2["content"]);
    let u = &m2["usage"];
    let total =
        m1["usage"]["input_tokens"].as_u64().unwrap() + m1["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(u["cache_read_input_tokens"].as_u64(), Some(total), "{u}");
    assert_eq!(u["input_tokens"], 0, "{u}");
    assert_eq!(u["cache_creation_input_tokens"], 0, "{u}");
    assert!(metric(srv.addr(), "charm_prefix_cache_hits_total") >= 3);
    // The dashboard's data says the same.
    let state = get(srv.addr(), "/api/state").json();
    assert!(state["prefix_cache"]["hits"].as_u64().unwrap() >= 3, "{state}");
    assert!(state["queue"]["max_batch"].as_u64().unwrap() >= 1, "{state}");
    assert!(metric(srv.addr(), "charm_prefix_cache_reused_tokens_total") >= cached + prompt);
}

/// Every `*.prefix` file under `dir`.
fn prefix_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(prefix_files(&p));
        } else if p.extension().is_some_and(|x| x == "prefix") {
            out.push(p);
        }
    }
    out
}

#[test]
fn prefix_cache_entries_persist_across_a_restart_and_damaged_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let with_dir = |c: &mut ServerConfig| c.prefix_cache_dir = Some(dir.path().to_path_buf());
    let body = chat(user("Remember this sentence across restarts"), 8);
    let first = {
        let srv = server(with_dir);
        answer(srv.addr(), &body)
    };
    assert_eq!(first.2["prompt_tokens_details"]["cached_tokens"], 0);
    let files = prefix_files(dir.path());
    assert!(!files.is_empty(), "the entry was written when the server stopped");

    // A restarted server finds the entry: the whole prompt is served.
    {
        let srv = server(with_dir);
        assert!(metric(srv.addr(), "charm_prefix_cache_disk_entries") >= 1);
        let again = answer(srv.addr(), &body);
        assert_eq!((&again.0, &again.1), (&first.0, &first.1));
        assert_eq!(
            again.2["prompt_tokens_details"]["cached_tokens"],
            first.2["prompt_tokens"]
        );
    }

    // A flipped byte: the file is refused and removed, the answer computed.
    for f in prefix_files(dir.path()) {
        let mut bytes = std::fs::read(&f).unwrap();
        let at = bytes.len() - 7;
        bytes[at] ^= 0x40;
        std::fs::write(&f, bytes).unwrap();
    }
    let srv = server(with_dir);
    let cold = answer(srv.addr(), &body);
    assert_eq!((&cold.0, &cold.1), (&first.0, &first.1));
    assert_eq!(cold.2["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(metric(srv.addr(), "charm_prefix_cache_bad_files_total") >= 1);
}

#[test]
fn a_small_prefix_budget_evicts_the_least_recent_and_stays_within_it() {
    let (engine, info) = engine();
    let fresh = engine.model.new_cache();
    // About one entry: the logits of its two checkpoints and 64 positions.
    let vocab = engine.config().vocab_size as u64;
    let budget = 3 * (2 * vocab * 4 + 64 * fresh.bytes_per_position() as u64) / 2;
    let srv = server_with(engine, &info, |c| c.prefix_cache_bytes = Some(budget));
    let addr = srv.addr();
    let prompts = ["first of four", "second of four", "third of four", "fourth of four"];
    for p in prompts {
        answer(addr, &chat(user(p), 6));
        assert!(metric(addr, "charm_prefix_cache_bytes") <= budget);
    }
    assert_eq!(metric(addr, "charm_prefix_cache_budget_bytes"), budget);
    // The most recent stays; the first is gone.
    let last = answer(addr, &chat(user(prompts[3]), 6));
    assert!(last.2["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
    // (Read after a later request began: an answer is sent before its
    // cache is kept.)
    assert_eq!(metric(addr, "charm_prefix_cache_entries"), 1);
    assert!(metric(addr, "charm_prefix_cache_evictions_total") >= 3);
    let first = answer(addr, &chat(user(prompts[0]), 6));
    let shared = first.2["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(shared < first.2["prompt_tokens"].as_u64().unwrap() - 3, "{}", first.2);
}

/// A copy of the qwen3next fixture (gated DeltaNet layers, whose state
/// cannot be cut back, and gated attention) under `root/qwen3next`, with a
/// word-level tokenizer over its 1024 ids (`t0` … `t1023`), so it can be
/// served.
fn hybrid_model(root: &Path) -> PathBuf {
    let src = repo().join("tests/fixtures/qwen3next");
    let dir = root.join("qwen3next");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let vocab: serde_json::Map<String, Value> = (0..1024).map(|i| (format!("t{i}"), json!(i))).collect();
    let tokenizer = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    dir
}

fn hybrid_server(dir: &Path, tweak: impl FnOnce(&mut ServerConfig)) -> Server {
    let (engine, info) = charm_coordinator::Engine::load(dir, &Default::default()).unwrap();
    let mut cfg = ServerConfig::new(dir);
    tweak(&mut cfg);
    Server::start(engine, &info, cfg).unwrap()
}

/// `/v1/completions` of `ids`: the generated ids (from the word-level
/// text), the log-probabilities and the cached prompt tokens.
fn complete_ids(addr: std::net::SocketAddr, ids: &[u32], max_tokens: usize) -> (Vec<u32>, Value, u64) {
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    let out: Vec<u32> = text.split_whitespace().map(|t| t[1..].parse().unwrap()).collect();
    assert_eq!(out.len(), max_tokens, "{v}");
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    (out, v["choices"][0]["logprobs"].clone(), cached)
}

#[test]
fn a_recurrent_model_is_batched_and_its_prefixes_reused_with_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = hybrid_model(tmp.path());
    let reference = hybrid_server(&dir, |c| {
        c.max_batch = Some(1);
        c.prefix_cache_bytes = Some(0);
    });
    let srv = hybrid_server(&dir, |_| {});
    let alone = |ids: &[u32]| complete_ids(reference.addr(), ids, 6);
    let p: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1024).collect();

    let first = complete_ids(srv.addr(), &p, 6);
    let want = alone(&p);
    assert_eq!((&first.0, &first.1, first.2), (&want.0, &want.1, 0));
    // The same prompt: the state kept at the end of the prompt serves it whole.
    let again = complete_ids(srv.addr(), &p, 6);
    assert_eq!((&again.0, &again.1, again.2), (&want.0, &want.1, 40));
    // Another continuation of the prompt: the prompt's state, then the rest.
    let other: Vec<u32> = p.iter().copied().chain([5, 6, 7]).collect();
    let got = complete_ids(srv.addr(), &other, 6);
    let w = alone(&other);
    assert_eq!((&got.0, &got.1, got.2), (&w.0, &w.1, 40));
    // The conversation goes on after the answer: the finished request's
    // state (its prompt and the answer's first five tokens, the sixth was
    // never fed) serves that much.
    let next: Vec<u32> = p.iter().chain(&first.0).copied().chain([9, 10]).collect();
    let got = complete_ids(srv.addr(), &next, 6);
    let w = alone(&next);
    assert_eq!((&got.0, &got.1, got.2), (&w.0, &w.1, 45));
    // A prompt that leaves the cached path (its last tokens differ) cannot
    // cut a recurrent state back: computed from the start.
    let diverged: Vec<u32> = p[..30].iter().copied().chain([1, 2, 3]).collect();
    let got = complete_ids(srv.addr(), &diverged, 6);
    let w = alone(&diverged);
    assert_eq!((&got.0, &got.1, got.2), (&w.0, &w.1, 0));

    // Four at once (the first holds the engine until the rest wait), prompts
    // of different lengths read 4 rows at a time (one prompt chunk per step:
    // each joins the decoders as its prompt is read), none reused.
    let (mut engine, info, gate) = gated_engine_for(&dir, false, Duration::ZERO);
    engine.prefill_chunk = 4;
    let mut cfg = ServerConfig::new(&dir);
    cfg.max_batch = Some(4);
    cfg.prefix_cache_bytes = Some(0);
    let batched = Server::start(engine, &info, cfg).unwrap();
    let addr = batched.addr();
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|k| (0..10 + 7 * k).map(|i| (i * 13 + k * 101) % 1024).collect())
        .collect();
    let together: Vec<_> = std::thread::scope(|s| {
        let first = s.spawn(|| complete_ids(addr, &prompts[0], 30));
        gate.wait_arrival();
        let rest: Vec<_> = prompts[1..]
            .iter()
            .map(|q| s.spawn(move || complete_ids(addr, q, 30)))
            .collect();
        wait_health(addr, "three waiting", |h| h["queued"] == 3);
        gate.open();
        std::iter::once(first).chain(rest).map(|h| h.join().unwrap()).collect()
    });
    for (q, got) in prompts.iter().zip(&together) {
        let w = complete_ids(reference.addr(), q, 30);
        assert_eq!((&got.0, &got.1), (&w.0, &w.1), "a batched recurrent sequence");
    }
    assert_eq!(metric(addr, "charm_engine_largest_step_requests"), 4);
}

#[test]
fn ignore_eos_generates_past_an_end_of_sequence_token() {
    let tmp = tempfile::tempdir().unwrap();
    let plain = hybrid_model(tmp.path());
    let p: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 1024).collect();
    let (want, lps, _) = complete_ids(hybrid_server(&plain, |_| {}).addr(), &p, 6);
    // The same model whose end-of-sequence token is its greedy first token.
    let dir = tmp.path().join("eos");
    std::fs::create_dir_all(&dir).unwrap();
    let eos = hybrid_model(&dir);
    for f in ["config.json", "generation_config.json"] {
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(eos.join(f)).unwrap()).unwrap();
        v["eos_token_id"] = json!(want[0]);
        std::fs::write(eos.join(f), v.to_string()).unwrap();
    }
    let srv = hybrid_server(&eos, |_| {});
    let stopped = post(
        srv.addr(),
        "/v1/completions",
        &json!({"prompt": p, "max_tokens": 6, "temperature": 0}),
    )
    .json();
    assert_eq!(stopped["usage"]["completion_tokens"], 1, "{stopped}");
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop", "{stopped}");
    // With ignore_eos: all six, the ids and bits of the plain model.
    let (got, got_lps, _) = complete_ids(srv.addr(), &p, 6);
    assert_eq!((got, got_lps), (want, lps));
}
