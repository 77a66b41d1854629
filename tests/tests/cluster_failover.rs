//! Failure mid-generation never changes the output: a worker killed with
//! SIGKILL, a worker that hangs (SIGSTOP), and a worker whose disk returns
//! corrupt experts all have their share re-sent to another holder — a late
//! one as soon as it is late against its own round trips (a hedge), not
//! after the request timeout — and the ids and logits stay bit-identical to
//! an undisturbed run. Only when no holder is left does the step fail, with
//! an error naming the experts.

mod cluster_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use charm_coordinator::cluster::ClusterService;
use charm_coordinator::Engine;
use charm_models::{ExpertError, ExpertService, ExpertStats, ModelError};
use charm_proto::{ExpertBatch, ExpertOutputs};
use charm_tests::{fixture, Reference};
use cluster_support::*;

/// Forwards to the cluster and runs `act` once, before call number `at`.
struct Trigger {
    inner: Arc<ClusterService>,
    calls: AtomicUsize,
    at: usize,
    act: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl ExpertService for Trigger {
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == self.at {
            if let Some(act) = self.act.lock().unwrap().take() {
                act();
            }
        }
        self.inner.run(batch)
    }

    fn stats(&self) -> ExpertStats {
        self.inner.stats()
    }

    fn end_request(&self) {
        self.inner.end_request();
    }
}

fn engine_with(dir: &std::path::Path, svc: Arc<ClusterService>, at: usize, act: Box<dyn FnOnce() + Send>) -> Engine {
    let (model, _) = charm_coordinator::engine::load_model(dir).unwrap();
    Engine::new(
        model,
        Arc::new(Trigger {
            inner: svc,
            calls: AtomicUsize::new(0),
            at,
            act: Mutex::new(Some(act)),
        }),
    )
}

#[test]
fn kill_9_of_one_of_three_workers_mid_generation_keeps_the_ids() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let mut workers: Vec<Worker> = (0..3).map(|_| Worker::start(&dir, &key, &[])).collect();
    let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
    let svc = service(&dir, &key, &addrs, Duration::from_millis(1500), false);
    svc.wait_for_workers(3, Duration::from_secs(10)).unwrap();

    // Kill worker 1 before the 11th expert call: mid-decode (the prompt is
    // one step of 2 layers; each token is 2 more).
    let victim = workers.remove(1);
    let victim_addr = victim.spec();
    let victim = Arc::new(Mutex::new(victim));
    let v = victim.clone();
    let e = engine_with(&dir, svc.clone(), 10, Box::new(move || v.lock().unwrap().kill9()));
    assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
    // Its request was re-sent (hedged) when late; the connection is dropped
    // once the request timeout or the QUIC idle timeout passes.
    let dead = dropped(&svc, &victim_addr);
    assert!(dead.hedges + dead.failovers >= 1, "{dead:?}");
    assert!(!victim.lock().unwrap().alive());
    let s = svc.stats();
    for w in s.workers.iter().filter(|w| w.address != victim_addr) {
        assert!(w.connected && w.failures == 0, "{w:?}");
    }
    // The survivors keep serving the next request; logits stay exact.
    let local = Engine::local(&dir).unwrap();
    let seq = r.full_sequence();
    assert_eq!(
        bits(&e.logits_all(&seq).unwrap()),
        bits(&local.logits_all(&seq).unwrap())
    );
}

/// The report of `addr` once it is disconnected (polled, at most 15 s).
fn dropped(svc: &ClusterService, addr: &str) -> charm_models::WorkerReport {
    let t = std::time::Instant::now();
    loop {
        let s = svc.stats();
        let w = s.workers.iter().find(|w| w.address == addr).unwrap().clone();
        if !w.connected || t.elapsed() > Duration::from_secs(15) {
            assert!(!w.connected, "never dropped: {w:?}");
            return w;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_hung_worker_is_hedged_then_timed_out_and_its_share_resent() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let workers: Vec<Worker> = (0..2).map(|_| Worker::start(&dir, &key, &[])).collect();
    let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
    let svc = service(&dir, &key, &addrs, Duration::from_millis(800), false);
    svc.wait_for_workers(2, Duration::from_secs(10)).unwrap();
    let pid = workers[0].child.id();
    let hung = workers[0].spec();
    let e = engine_with(
        &dir,
        svc.clone(),
        6,
        Box::new(move || {
            let ok = std::process::Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status()
                .unwrap()
                .success();
            assert!(ok);
        }),
    );
    assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
    let w = dropped(&svc, &hung);
    assert!(w.hedges >= 1, "re-sent when late, before the timeout: {w:?}");
    assert!(w.failures >= 1, "then timed out: {w:?}");
    workers[0].signal("CONT");
}

#[test]
fn a_worker_serving_corrupt_experts_is_routed_around() {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let bad = partial_container(&full, tmp.path(), "bad", |_, _| true);
    // Every record but the first flipped: each read of them fails its
    // checksum (the worker checks the first one when it starts).
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bad.join("manifest.json")).unwrap()).unwrap();
    let first = &manifest["records"][0];
    let keep = first["offset"].as_u64().unwrap() as usize
        ..(first["offset"].as_u64().unwrap() + first["len"].as_u64().unwrap()) as usize;
    let path = bad.join("experts.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    for (i, b) in bytes.iter_mut().enumerate().step_by(64) {
        if !keep.contains(&i) {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&path, bytes).unwrap();
    let w_bad = Worker::start(&bad, &key, &["--expert-cache-gb", "0"]);
    let w_good = Worker::start(&full, &key, &["--expert-cache-gb", "0"]);
    let r = Reference::load("olmoe");
    let local = Engine::local(&full).unwrap();
    let seq = r.full_sequence();
    let want = bits(&local.logits_all(&seq).unwrap());

    let svc = service(&full, &key, &[w_bad.addr, w_good.addr], Duration::from_secs(10), false);
    svc.wait_for_workers(2, Duration::from_secs(10)).unwrap();
    let e = engine(&full, svc.clone());
    assert_eq!(bits(&e.logits_all(&seq).unwrap()), want);
    let s = svc.stats();
    let b = s.workers.iter().find(|w| w.address == w_bad.spec()).unwrap();
    assert!(
        b.failures >= 1 && b.connected,
        "an error reply does not drop the worker: {b:?}"
    );
    assert!(w_bad.wait_log("checksum", Duration::from_secs(5)).contains("checksum"));
}

#[test]
fn with_no_holder_left_the_error_names_the_experts() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let mut w = Worker::start(&dir, &key, &[]);
    let svc = service(&dir, &key, &[w.addr], Duration::from_millis(800), false);
    svc.wait_for_workers(1, Duration::from_secs(10)).unwrap();
    w.kill9();
    let e = engine(&dir, svc.clone());
    let err = e
        .generate(
            &mut e.session(),
            &r.prompt_ids,
            &charm_coordinator::GenerateParams {
                max_tokens: 4,
                sampling: charm_coordinator::SamplingParams {
                    temperature: 0.0,
                    ..Default::default()
                },
                ignore_eos: true,
            },
            |_| true,
        )
        .unwrap_err();
    match &err {
        ModelError::Expert(ExpertError::Unavailable { layer, experts, .. }) => {
            assert_eq!(*layer, 0);
            assert!(!experts.is_empty());
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("no holder left for layer 0 experts"), "{msg}");
    assert!(msg.contains(&w.spec()), "names the failed worker: {msg}");

    // With the coordinator's own copy, the same failure is absorbed.
    let mut w2 = Worker::start(&dir, &key, &[]);
    let svc = service(&dir, &key, &[w2.addr], Duration::from_millis(800), true);
    svc.wait_for_workers(1, Duration::from_secs(10)).unwrap();
    w2.kill9();
    let e = engine(&dir, svc.clone());
    assert_eq!(greedy(&e, &r.prompt_ids, 16), r.greedy_ids);
    let s = svc.stats();
    let local = s.workers.iter().find(|w| w.address == "local").unwrap();
    assert!(local.experts_served > 0, "{local:?}");
}
