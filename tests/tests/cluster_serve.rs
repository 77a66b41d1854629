//! `coordinator serve` in cluster mode reports every worker on its own:
//! two real `worker` processes on 127.0.0.1 and a `coordinator serve`
//! (`--workers`, a key file, no mDNS) in front of them.
//!
//! - `metrics_and_dashboard_list_each_cluster_worker`: after one completion
//!   `/metrics` has a series per worker address (`up` 1, experts owned,
//!   experts served, round trips, network bytes both ways, mean rtt, no
//!   failures) and no aggregate `cluster` or `in-process` series;
//!   `/api/state` lists both workers with the same numbers (and each
//!   expert's owner for the grid), their owned
//!   experts covering the model. Then one worker is killed: after the next
//!   request its series says `up` 0 with its request re-sent (a hedge or a
//!   failover counted), and the dashboard row says `down`, while the
//!   survivor keeps serving.
//! - `batched_requests_in_a_cluster_get_what_one_box_gives_each_alone`:
//!   requests batched together (`--max-batch 4`) in front of the two workers
//!   get the tokens and logprob bits a one-box server gives each alone, in
//!   one step or as two halves at once (`--pipeline`).

mod cluster_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster_support::serve::*;
use cluster_support::*;
use serde_json::Value;

fn metrics(addr: SocketAddr) -> String {
    let (status, body) = http(addr, "GET", "/metrics", None);
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample `name{worker="W"}` (`None`: no such series).
fn sample(text: &str, name: &str, worker: &str) -> Option<f64> {
    let prefix = format!("{name}{{worker=\"{worker}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.parse().expect("a number"))
}

fn network(text: &str, worker: &str, direction: &str) -> Option<f64> {
    let prefix = format!("charm_worker_network_bytes_total{{worker=\"{worker}\",direction=\"{direction}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.parse().expect("a number"))
}

/// The dashboard's workers by address.
fn dashboard_workers(state: &Value) -> HashMap<String, Value> {
    state["workers"]
        .as_array()
        .expect("a workers list")
        .iter()
        .map(|w| (w["address"].as_str().expect("an address").to_string(), w.clone()))
        .collect()
}

#[test]
fn metrics_and_dashboard_list_each_cluster_worker() {
    let dir = chat_fixture();
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let mut workers: Vec<Worker> = (0..2).map(|_| Worker::start(&dir, &key, &[])).collect();
    let srv = Serve::cluster(&dir, &key, &workers);
    let addr = srv.addr;

    // Before any request both workers are listed, up.
    let state = get_json(addr, "/api/state");
    assert_eq!(state["model"]["placement"], "remote");
    let listed = dashboard_workers(&state);
    for w in &workers {
        assert_eq!(listed[&w.spec()]["status"], "up", "{state}");
    }

    completion(addr, "The capital of France is", 4);

    let m = metrics(addr);
    assert!(
        !m.contains("worker=\"cluster\"") && !m.contains("worker=\"in-process\""),
        "{m}"
    );
    for w in &workers {
        let a = w.spec();
        let get = |name: &str| sample(&m, name, &a).unwrap_or_else(|| panic!("no {name} for {a} in\n{m}"));
        assert_eq!(get("charm_worker_up"), 1.0);
        assert!(get("charm_worker_experts") > 0.0, "{a} owns nothing:\n{m}");
        assert!(
            get("charm_worker_experts_served_total") > 0.0,
            "{a} served nothing:\n{m}"
        );
        assert!(get("charm_worker_round_trips_total") > 0.0, "{a}: no round trip:\n{m}");
        assert!(get("charm_worker_rtt_ms") > 0.0, "{a}: no rtt:\n{m}");
        assert!(get("charm_worker_compute_ms") > 0.0, "{a}: no compute time:\n{m}");
        assert!(get("charm_worker_wait_seconds_total") > 0.0, "{a}:\n{m}");
        assert_eq!(get("charm_worker_failures_total"), 0.0);
        let hit = get("charm_worker_cache_hit_rate");
        assert!((0.0..=1.0).contains(&hit), "{a}: hit rate {hit}");
        get("charm_worker_disk_bytes_read_total");
        assert!(network(&m, &a, "sent").unwrap() > 0.0, "{a}:\n{m}");
        assert!(network(&m, &a, "received").unwrap() > 0.0, "{a}:\n{m}");
    }

    // The dashboard's snapshot carries the same per-worker list.
    let state = get_json(addr, "/api/state");
    let listed = dashboard_workers(&state);
    assert_eq!(listed.len(), 2, "{state}");
    let mut owned = 0;
    for w in &workers {
        let a = w.spec();
        let d = &listed[&a];
        assert_eq!(d["status"], "up", "{d}");
        assert!(d["experts_owned"].as_u64().unwrap() > 0, "{d}");
        assert!(d["experts_served"].as_u64().unwrap() > 0, "{d}");
        assert!(d["round_trips"].as_u64().unwrap() > 0, "{d}");
        assert!(d["network_bytes_sent"].as_u64().unwrap() > 0, "{d}");
        assert!(d["network_bytes_received"].as_u64().unwrap() > 0, "{d}");
        assert!(d["rtt_ms"].as_f64().unwrap() > 0.0, "{d}");
        assert!(d["compute_ms"].as_f64().unwrap() > 0.0, "{d}");
        assert_eq!(d["failures"], 0, "{d}");
        assert!(!d["disk_bytes_read"].is_null(), "{d}");
        owned += d["experts_owned"].as_u64().unwrap();
    }
    let moe_layers = state["model"]["moe_layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m.as_bool() == Some(true))
        .count() as u64;
    assert_eq!(
        owned,
        moe_layers * state["model"]["experts"].as_u64().unwrap(),
        "every routed expert has one owner: {state}"
    );
    // The grid's owners: each routed expert's cell names its worker (an
    // index into `workers`), as many cells per worker as it owns.
    let owners = state["owners"].as_array().expect("owners in cluster mode");
    let experts = state["model"]["experts"].as_u64().unwrap() as usize;
    let list = state["workers"].as_array().unwrap();
    for (i, w) in list.iter().enumerate() {
        let cells = owners.iter().filter(|o| o.as_i64() == Some(i as i64)).count() as u64;
        assert_eq!(cells, w["experts_owned"].as_u64().unwrap(), "{}: {state}", w["address"]);
    }
    for (i, o) in owners.iter().enumerate() {
        let moe = state["model"]["moe_layers"][i / experts].as_bool() == Some(true);
        assert_eq!(o.as_i64().unwrap() >= 0, moe, "cell {i}: {o}");
    }

    // A lost worker stays listed, down, with the failure counted; the other
    // one carries on.
    let lost = workers[0].spec();
    let kept = workers[1].spec();
    let served_before = sample(&metrics(addr), "charm_worker_experts_served_total", &kept).unwrap();
    workers[0].kill9();
    completion(addr, "Hello", 4);
    let t = Instant::now();
    let m = loop {
        let m = metrics(addr);
        if sample(&m, "charm_worker_up", &lost) == Some(0.0) {
            break m;
        }
        assert!(t.elapsed() < PATIENCE, "{lost} still up after it was killed:\n{m}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(sample(&m, "charm_worker_up", &kept), Some(1.0), "{m}");
    let resent = sample(&m, "charm_worker_hedges_total", &lost).unwrap()
        + sample(&m, "charm_worker_failovers_total", &lost).unwrap();
    assert!(resent >= 1.0, "the lost worker's request was re-sent:\n{m}");
    assert_eq!(sample(&m, "charm_worker_experts", &lost), Some(0.0), "{m}");
    assert!(
        sample(&m, "charm_worker_experts_served_total", &kept).unwrap() > served_before,
        "{kept} took over nothing:\n{m}"
    );
    let listed = dashboard_workers(&get_json(addr, "/api/state"));
    assert_eq!(listed[&lost]["status"], "down");
    assert_eq!(listed[&kept]["status"], "up");
}

/// `POST /v1/chat/completions` of `text`, greedy with log-probabilities:
/// the text and the per-token log-probabilities.
fn chat_answer(addr: SocketAddr, text: &str, max_tokens: usize) -> (String, Value) {
    let body = serde_json::json!({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                                  "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let (status, out) = http(addr, "POST", "/v1/chat/completions", Some(&body));
    assert_eq!(status, 200, "{text:?}: {out}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let c = &v["choices"][0];
    (
        c["message"]["content"].as_str().unwrap().to_string(),
        c["logprobs"]["content"].clone(),
    )
}

/// Requests batched together in front of two workers get the very tokens
/// and log-probability bits one box gives each of them alone.
#[test]
fn batched_requests_in_a_cluster_get_what_one_box_gives_each_alone() {
    let dir = chat_fixture();
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let workers: Vec<Worker> = (0..2).map(|_| Worker::start(&dir, &key, &[])).collect();
    let no_reuse = ["--prefix-cache-mb", "0"];
    let srv = Serve::cluster_with(&dir, &key, &workers, &["--max-batch", "4", no_reuse[0], no_reuse[1]]);
    let one_box = Serve::start_with(
        &["--model", dir.to_str().unwrap(), "--local", "--threads", "1"],
        &["--max-batch", "1", no_reuse[0], no_reuse[1]],
    );
    let asks: Vec<(String, usize)> = (0..4)
        .map(|i| {
            (
                format!("Question {i}:{}", " tell me more".repeat(3 * i)),
                if i == 0 { 120 } else { 16 },
            )
        })
        .collect();
    let alone: Vec<_> = asks.iter().map(|(t, n)| chat_answer(one_box.addr, t, *n)).collect();
    let pipelined = Serve::cluster_with(
        &dir,
        &key,
        &workers,
        &["--max-batch", "4", no_reuse[0], no_reuse[1], "--pipeline"],
    );
    for (srv, what) in [(&srv, "one step"), (&pipelined, "two halves at once (--pipeline)")] {
        let together = batched(srv.addr, &asks);
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            assert!(!a.1.as_array().unwrap().is_empty(), "request {i} has logprobs");
            assert_eq!(a, b, "request {i}, {what}: tokens or logprob bits differ");
        }
        let m = metrics(srv.addr);
        let largest = m
            .lines()
            .find_map(|l| l.strip_prefix("charm_engine_largest_step_requests "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("the largest step in /metrics");
        assert!(largest >= 2, "{what}: the requests never shared a step:\n{m}");
    }
}

/// `asks` sent together: the first (long) one, then the rest once it is
/// generating, so they join its steps.
fn batched(addr: SocketAddr, asks: &[(String, usize)]) -> Vec<(String, Value)> {
    std::thread::scope(|s| {
        let first = s.spawn(|| chat_answer(addr, &asks[0].0, asks[0].1));
        let t = Instant::now();
        while get_json(addr, "/health")["running"] != 1 {
            assert!(t.elapsed() < PATIENCE, "the first request never started");
            std::thread::sleep(Duration::from_millis(2));
        }
        let rest: Vec<_> = asks[1..]
            .iter()
            .map(|(t, n)| s.spawn(move || chat_answer(addr, t, *n)))
            .collect();
        std::iter::once(first).chain(rest).map(|h| h.join().unwrap()).collect()
    })
}
