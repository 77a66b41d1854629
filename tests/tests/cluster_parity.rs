//! The one rule across machines: `--local`, one remote worker and three
//! remote workers give bit-identical ids and logits, for a Hugging Face
//! directory and for a container (also when each worker holds only part of
//! it). Real `worker` processes on 127.0.0.1.
//!
//! - `hf_dir_local_one_and_three_workers_are_bit_identical`: teacher-forced
//!   logits at every position and 16 greedy ids, in-process engines over
//!   the cluster service (no local experts), equal bit for bit to
//!   `Engine::local`; with 3 workers every worker served experts and the
//!   network counters are non-zero; the ids equal transformers' reference;
//!   with an f16 KV cache the logits equal `--local`'s f16 run too.
//! - `cli_generate_over_three_workers`: `coordinator generate --json` with
//!   `--workers` gives the reference ids and reports the network fields and
//!   one entry per worker; `coordinator plan --json` places every expert.
//! - `partial_containers_cover_the_model_between_them`: two workers each
//!   holding half of a bf16 container's experts; the placement follows what
//!   each holds, logits and ids equal the whole container run locally, and
//!   the workers' stores report reads and read-aheads.
//! - `a_split_model_serves_from_its_parts`: `coordinator split --parts 2`
//!   cuts a container into two partial copies (each about half the expert
//!   bytes, together every expert once); two workers on them give the
//!   whole container's logits and ids; a part sized beyond its machine's
//!   disk, a part of a part, and no machines are refused with one line;
//!   machines with RAM beyond their share hold replicas, the hottest
//!   expert of the learned routing history among them.
//! - `a_worker_joining_between_requests_is_used_without_restart`: a worker
//!   started after the service is found on its next retry and given work.

mod cluster_support;

use std::net::UdpSocket;
use std::time::Duration;

use charm_coordinator::{Engine, EngineOptions};
use charm_models::{ExpertService, KvDtype};
use charm_tests::{fixture, Reference};
use cluster_support::*;

const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn hf_dir_local_one_and_three_workers_are_bit_identical() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let workers: Vec<Worker> = (0..3).map(|_| Worker::start(&dir, &key, &[])).collect();

    let local = Engine::local(&dir).unwrap();
    let seq = r.full_sequence();
    let want_logits = bits(&local.logits_all(&seq).unwrap());
    let want_ids = greedy(&local, &r.prompt_ids, 16);
    assert_eq!(want_ids, r.greedy_ids, "local run against transformers");
    // An f16 KV cache is the coordinator's arithmetic: the same bits on any worker count.
    let f16_opts = EngineOptions {
        kv_dtype: KvDtype::F16,
        ..EngineOptions::default()
    };
    let want_f16 = bits(&Engine::load(&dir, &f16_opts).unwrap().0.logits_all(&seq).unwrap());
    assert_ne!(want_f16, want_logits, "the f16 cache rounds");

    for n in [1, 3] {
        let addrs: Vec<_> = workers[..n].iter().map(|w| w.addr).collect();
        let svc = service(&dir, &key, &addrs, TIMEOUT, false);
        svc.wait_for_workers(n, TIMEOUT).unwrap();
        let e = engine(&dir, svc.clone());
        assert_eq!(bits(&e.logits_all(&seq).unwrap()), want_logits, "{n} workers: logits");
        assert_eq!(greedy(&e, &r.prompt_ids, 16), want_ids, "{n} workers: ids");
        let s = svc.stats();
        assert_eq!(s.workers.len(), n);
        for w in &s.workers {
            assert!(w.experts_served > 0, "{n} workers: {} served nothing", w.address);
            assert!(w.connected && w.failures == 0, "{w:?}");
            // The worker's own compute time is part of the round trip.
            assert!(w.compute_ms > 0.0 && w.compute_ms <= w.rtt_ms, "{w:?}");
        }
        assert!(s.network_bytes_sent > 0 && s.network_bytes_received > 0 && s.round_trips > 0);
        // Every routed expert was computed by exactly one worker.
        let served: u64 = s.workers.iter().map(|w| w.experts_served).sum();
        assert_eq!(served, s.expert_hits, "{s:?}");
        let mut e16 = engine(&dir, svc.clone());
        e16.model.kv_dtype = KvDtype::F16;
        assert_eq!(
            bits(&e16.logits_all(&seq).unwrap()),
            want_f16,
            "{n} workers: f16 KV logits"
        );
    }
}

#[test]
fn cli_generate_over_three_workers() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let workers: Vec<Worker> = (0..3).map(|_| Worker::start(&dir, &key, &[])).collect();
    let specs = workers.iter().map(Worker::spec).collect::<Vec<_>>().join(",");
    let (d, k) = (dir.to_str().unwrap(), key.to_str().unwrap());
    let p = csv(&r.prompt_ids);
    let v = json_out(&coordinator(&[
        "--model",
        d,
        "--cluster-key-file",
        k,
        "--workers",
        &specs,
        "--min-workers",
        "3",
        "generate",
        "--prompt-ids",
        &p,
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--json",
    ]));
    assert_eq!(json_ids(&v), r.greedy_ids);
    let stats = &v["stats"];
    assert!(stats["network_bytes_sent"].as_u64().unwrap() > 0);
    assert!(stats["network_bytes_received"].as_u64().unwrap() > 0);
    // Two MoE layers, 12 prompt rows in one step and 15 decode steps.
    assert_eq!(stats["round_trips"].as_u64().unwrap(), 2 * 16);
    let ws = stats["workers"].as_array().unwrap();
    assert_eq!(ws.len(), 3);
    for w in ws {
        for field in [
            "address",
            "experts_served",
            "rtt_ms",
            "compute_ms",
            "cache_hit_rate",
            "failures",
            "bytes_sent",
        ] {
            assert!(!w[field].is_null(), "{field} missing in {w}");
        }
        assert_eq!(w["failures"], 0);
    }

    let out = coordinator(&[
        "--model",
        d,
        "--cluster-key-file",
        k,
        "--workers",
        &specs,
        "--min-workers",
        "3",
        "plan",
        "--json",
    ]);
    let plan = json_out(&out);
    let owns: u64 = plan["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["owns"].as_u64().unwrap())
        .sum();
    assert_eq!(owns, 16, "{plan}");
    assert!(plan["uncovered"].as_array().unwrap().is_empty());
    assert!(
        (plan["per_token"]["round_trips"].as_f64().unwrap() - 2.0).abs() < 1e-9,
        "{plan}"
    );
    let text = coordinator(&["--model", d, "--cluster-key-file", k, "--workers", &specs, "plan"]);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    for w in &workers {
        assert!(text.contains(&w.spec()), "{text}");
    }
}

#[test]
fn partial_containers_cover_the_model_between_them() {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let low = partial_container(&full, tmp.path(), "low", |_, e| e < 4);
    let high = partial_container(&full, tmp.path(), "high", |_, e| e >= 4);
    let a = Worker::start(&low, &key, &["--expert-cache-gb", "1"]);
    let b = Worker::start(&high, &key, &["--expert-cache-gb", "1"]);
    let r = Reference::load("olmoe");
    let seq = r.full_sequence();

    let local = Engine::local(&full).unwrap();
    let want = bits(&local.logits_all(&seq).unwrap());
    let want_ids = greedy(&local, &r.prompt_ids, 16);

    let svc = service(&full, &key, &[a.addr, b.addr], TIMEOUT, false);
    svc.wait_for_workers(2, TIMEOUT).unwrap();
    let plan = svc.placement();
    for l in 0..2u16 {
        for e in 0..8u32 {
            let expected = if e < 4 { a.addr } else { b.addr };
            assert_eq!(
                plan.holders((l, e)),
                &[charm_coordinator::cluster::Holder::Worker(expected)],
                "layer {l} expert {e}"
            );
        }
    }
    let e = engine(&full, svc.clone());
    assert_eq!(bits(&e.logits_all(&seq).unwrap()), want, "logits");
    assert_eq!(greedy(&e, &r.prompt_ids, 16), want_ids, "ids");
    let s = svc.stats();
    assert!(s.workers.iter().all(|w| w.experts_served > 0), "{:?}", s.workers);
    // Cold caches: experts were read from the workers' disks, and the
    // next-layer predictions reached the workers as read-aheads.
    assert!(s.expert_misses > 0 && s.expert_bytes_read > 0, "{s:?}");
    assert!(s.prefetch_issued > 0, "{s:?}");
}

#[test]
fn a_worker_joining_between_requests_is_used_without_restart() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let a = Worker::start(&dir, &key, &[]);
    // A free port for the second worker, which starts later.
    let later = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let svc = service(&dir, &key, &[a.addr, later], TIMEOUT, false);
    svc.wait_for_workers(1, TIMEOUT).unwrap();
    let e = engine(&dir, svc.clone());
    assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
    assert_eq!(svc.stats().workers.len(), 1);

    let b = Worker::start_on(&dir, &key, &later.to_string(), &[]);
    svc.wait_for_workers(2, Duration::from_secs(30)).unwrap();
    let before = svc.stats();
    assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
    let after = svc.stats().since(&before);
    let served_by_b = after
        .workers
        .iter()
        .find(|w| w.address == b.spec())
        .map_or(0, |w| w.experts_served);
    assert!(served_by_b > 0, "{:?}", after.workers);
}

#[test]
fn a_split_model_serves_from_its_parts() {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let parts = tmp.path().join("parts");
    let o = coordinator(&[
        "--model",
        full.to_str().unwrap(),
        "split",
        "--out",
        parts.to_str().unwrap(),
        "--parts",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let whole = charm_common::container::Manifest::open(&full).unwrap();
    let p0 = charm_common::container::Manifest::open(&parts.join("part-0")).unwrap();
    let p1 = charm_common::container::Manifest::open(&parts.join("part-1")).unwrap();
    assert_eq!(p0.fingerprint, whole.fingerprint);
    assert_eq!(
        p0.records.len() + p1.records.len(),
        whole.records.len(),
        "each expert once"
    );
    for r in &whole.records {
        let held = [&p0, &p1]
            .iter()
            .filter(|p| p.record(r.layer, r.expert).is_some())
            .count();
        assert_eq!(held, 1, "layer {} expert {}", r.layer, r.expert);
    }
    assert_eq!(
        p0.records.len(),
        whole.records.len() / 2,
        "even shares for equal machines"
    );
    assert_eq!(p0.experts_len + p1.experts_len, whole.experts_len);
    let a = Worker::start(&parts.join("part-0"), &key, &["--expert-cache-gb", "1"]);
    // The other part read from disk every time, by pread, without
    // read-ahead: placement options, the same bits.
    let b = Worker::start(
        &parts.join("part-1"),
        &key,
        &["--expert-cache-gb", "0", "--no-prefetch", "--io", "pread"],
    );
    let r = Reference::load("olmoe");
    let seq = r.full_sequence();
    let local = Engine::local(&full).unwrap();
    let svc = service(&full, &key, &[a.addr, b.addr], TIMEOUT, false);
    svc.wait_for_workers(2, TIMEOUT).unwrap();
    assert!(svc.placement().uncovered.is_empty());
    let e = engine(&full, svc.clone());
    assert_eq!(
        bits(&e.logits_all(&seq).unwrap()),
        bits(&local.logits_all(&seq).unwrap()),
        "logits"
    );
    assert_eq!(greedy(&e, &r.prompt_ids, 16), greedy(&local, &r.prompt_ids, 16), "ids");

    // Refusals, each in one line.
    let refused = |args: &[&str], needle: &str| {
        let o = coordinator(args);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{needle}: {err}");
    };
    let out = |n: &str| tmp.path().join(n).to_str().unwrap().to_string();
    let f = full.to_str().unwrap();
    refused(
        &[
            "--model",
            f,
            "split",
            "--out",
            &out("x"),
            "--ram-gb",
            "1,1",
            "--disk-gb",
            "0.000001,1",
        ],
        "disk",
    );
    refused(
        &[
            "--model",
            parts.join("part-0").to_str().unwrap(),
            "split",
            "--out",
            &out("y"),
            "--parts",
            "2",
        ],
        "partial copy",
    );
    refused(&["--model", f, "split", "--out", &out("z")], "--parts N or --ram-gb");
    refused(
        &["--model", f, "split", "--out", parts.to_str().unwrap(), "--parts", "2"],
        "already exists",
    );
    assert!(!tmp.path().join("x").exists() && !tmp.path().join("x.partial").exists());

    // Machines with RAM beyond their share keep replicas of the hottest
    // experts (by the routing this model learned here): every expert is
    // held at least once, the hottest twice.
    let state = tmp.path().join("state");
    let o = coordinator(&[
        "--model",
        f,
        "--local",
        "--state-dir",
        state.to_str().unwrap(),
        "generate",
        "--prompt-ids",
        "1,2,3,4,5,6,7,8",
        "--max-tokens",
        "4",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let per = whole.records[0].padded_len() as f64 / (1u64 << 30) as f64;
    // Room for 10 of the 16 experts each: 2 × 10 = 20 slots for 16 experts.
    let ram = format!("{},{}", per * 10.0, per * 10.0);
    let spare = tmp.path().join("spare");
    let o = coordinator(&[
        "--model",
        f,
        "--state-dir",
        state.to_str().unwrap(),
        "split",
        "--out",
        spare.to_str().unwrap(),
        "--ram-gb",
        &ram,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q0 = charm_common::container::Manifest::open(&spare.join("part-0")).unwrap();
    let q1 = charm_common::container::Manifest::open(&spare.join("part-1")).unwrap();
    for r in &whole.records {
        let held = [&q0, &q1]
            .iter()
            .filter(|p| p.record(r.layer, r.expert).is_some())
            .count();
        assert!(held >= 1, "layer {} expert {} is held nowhere", r.layer, r.expert);
    }
    let copies = q0.records.len() + q1.records.len();
    assert!(
        copies > whole.records.len(),
        "spare RAM holds replicas: {copies} copies of {}",
        whole.records.len()
    );
    assert!(copies <= 20, "no part holds more than its RAM: {copies}");
    // The most-routed expert of the learned history is among the replicated.
    let history: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("routing-history.json")).unwrap()).unwrap();
    let counts = history["counts"].as_array().unwrap();
    let (mut hot, mut most) = ((0u16, 0u32), 0u64);
    for (l, row) in counts.iter().enumerate() {
        for (e, c) in row.as_array().unwrap().iter().enumerate() {
            if c.as_u64().unwrap() > most {
                (hot, most) = ((l as u16, e as u32), c.as_u64().unwrap());
            }
        }
    }
    assert!(most > 0, "the generate run taught a routing history");
    assert!(
        q0.record(hot.0, hot.1).is_some() && q1.record(hot.0, hot.1).is_some(),
        "the hottest expert {hot:?} ({most} rows) has a replica"
    );
}
