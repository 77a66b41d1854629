//! Chaos: `coordinator serve` in front of three workers, four API clients
//! at once, and a seeded schedule that SIGKILLs and restarts, or SIGSTOPs
//! and SIGCONTs, workers while they answer. All on 127.0.0.1, bounded in
//! requests and time.
//!
//! - `every_answer_survives_killed_stopped_and_restarted_workers`: a seeded
//!   schedule of 8 faults runs while each client sends 8 completions, its
//!   k-th once the k-th fault has begun (so requests and faults interleave
//!   on any machine); every one of the 32 returns 200 with exactly the text
//!   of the undisturbed run for its prompt; the coordinator's file descriptors and
//!   resident memory do not grow across the run (beyond a small slack for
//!   allocator noise). Workers 0 and 1 are the victims, one at a time;
//!   worker 2 is never touched, so a holder of every expert is always
//!   alive and the run tests recovery, not the "no holder left" error.

mod cluster_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::serve::*;
use cluster_support::*;

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "Once upon a time",
    "1, 2, 3, 4,",
    "The quick brown fox",
    "Rust is a language that",
    "Hello",
];
const CLIENTS: usize = 4;
const PER_CLIENT: usize = 8;
const FAULTS: usize = 8;
const SEED: u64 = 0x5eed_c4a0;

/// The greedy completion of `prompt`, 24 tokens.
fn text(addr: SocketAddr, prompt: &str) -> String {
    let v = completion(addr, prompt, 24);
    v["choices"][0]["text"].as_str().expect("a text").to_string()
}

/// Open file descriptors and resident KiB (`VmRSS`) of process `pid`.
fn footprint(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (fds, rss)
}

/// xorshift64*: a seeded schedule, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn every_answer_survives_killed_stopped_and_restarted_workers() {
    let dir = chat_fixture();
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let workers: Vec<Worker> = (0..3).map(|_| Worker::start(&dir, &key, &[])).collect();
    let srv = Serve::cluster(&dir, &key, &workers);
    let addr = srv.addr;

    // The undisturbed answers, twice over (the second pass warms every
    // cache and buffer, so the footprint baseline is a steady state).
    let want: HashMap<&str, String> = PROMPTS.iter().map(|&p| (p, text(addr, p))).collect();
    for p in PROMPTS {
        assert_eq!(text(addr, p), want[p], "{p:?} is deterministic");
    }
    let (fds_before, rss_before) = footprint(srv.child.id());

    let workers = Arc::new(Mutex::new(workers));
    // Faults begun so far (FAULTS + 1 once the schedule is over).
    let begun = Arc::new(AtomicUsize::new(0));
    let chaos = {
        let (workers, begun, dir, key) = (workers.clone(), begun.clone(), dir.clone(), key.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(SEED);
            let mut actions = Vec::new();
            for _ in 0..FAULTS {
                std::thread::sleep(ms(rng.range(50, 300)));
                begun.fetch_add(1, Ordering::SeqCst);
                let victim = rng.range(0, 2) as usize;
                if rng.range(0, 2) == 0 {
                    let spec = workers.lock().unwrap()[victim].spec();
                    workers.lock().unwrap()[victim].kill9();
                    std::thread::sleep(ms(rng.range(200, 800)));
                    let back = Worker::start_on(&dir, &key, &spec, &[]);
                    workers.lock().unwrap()[victim] = back;
                    actions.push(format!("kill+restart {victim}"));
                } else {
                    workers.lock().unwrap()[victim].signal("STOP");
                    std::thread::sleep(ms(rng.range(200, 1500)));
                    workers.lock().unwrap()[victim].signal("CONT");
                    actions.push(format!("stop+cont {victim}"));
                }
            }
            begun.fetch_add(1, Ordering::SeqCst);
            actions
        })
    };

    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (want, begun) = (want.clone(), begun.clone());
            std::thread::spawn(move || {
                for i in 0..PER_CLIENT {
                    let t = Instant::now();
                    while begun.load(Ordering::SeqCst) < i.min(FAULTS) && t.elapsed() < Duration::from_secs(60) {
                        std::thread::sleep(ms(10));
                    }
                    let p = PROMPTS[(c + i * CLIENTS) % PROMPTS.len()];
                    assert_eq!(text(addr, p), want[p], "client {c}, request {i}: {p:?}");
                }
            })
        })
        .collect();
    let mut failed = Vec::new();
    for (c, h) in clients.into_iter().enumerate() {
        if h.join().is_err() {
            failed.push(c);
        }
    }
    let actions = chaos.join().unwrap();
    assert!(failed.is_empty(), "clients {failed:?} failed; chaos: {actions:?}");
    assert_eq!(actions.len(), FAULTS);

    // The coordinator did not leak: same descriptors, about the same memory.
    let m = get_json(addr, "/api/state");
    let (fds_after, rss_after) = footprint(srv.child.id());
    assert!(
        fds_after <= fds_before + 4,
        "file descriptors grew from {fds_before} to {fds_after}; chaos: {actions:?}"
    );
    assert!(
        rss_after <= rss_before + (48 << 10),
        "resident memory grew from {rss_before} KiB to {rss_after} KiB"
    );
    let hedged_or_failed: u64 = m["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["hedges"].as_u64().unwrap_or(0) + w["failovers"].as_u64().unwrap_or(0))
        .sum();
    assert!(hedged_or_failed >= 1, "the faults were noticed: {m}");
}
