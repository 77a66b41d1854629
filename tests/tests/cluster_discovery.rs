//! Discovery: a coordinator started with no `--workers` finds, through
//! mDNS, two workers started after it, and uses both.
//!
//! Every process runs inside a network namespace this test creates (only a
//! loopback interface exists there) and every mDNS daemon is restricted to
//! loopback as well (`--mdns-loopback`), so no packet can leave 127.0.0.1.
//! Creating the namespace needs root and iproute2 (`ip netns`), as CI has;
//! without them the test fails saying so.

#![cfg(target_os = "linux")]

mod cluster_support;

use std::process::{Command, Stdio};
use std::time::Duration;

use charm_tests::{fixture, Reference};
use cluster_support::*;

/// A network namespace with only `lo`, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        let name = format!("charm-test-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let run = |args: &[&str]| {
            let out = Command::new("ip")
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("this test needs iproute2 (`ip netns`): {e}"));
            assert!(
                out.status.success(),
                "`ip {}` failed: {} (this test needs root to make a private network namespace)",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&["netns", "add", &name]);
        let ns = Netns(name);
        run(&["netns", "exec", &ns.0, "ip", "link", "set", "lo", "up"]);
        ns
    }

    /// `ip netns exec NS program`.
    fn cmd(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn a_coordinator_finds_two_workers_started_after_it_and_uses_both() {
    let dir = fixture("olmoe");
    let r = Reference::load("olmoe");
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let ns = Netns::new();
    let coord = ns
        .cmd(&bin("coordinator"))
        .arg("--model")
        .arg(&dir)
        .arg("--cluster-key-file")
        .arg(&key)
        .args(["--mdns-loopback", "--min-workers", "2", "--discovery-timeout-s", "30"])
        .args(["generate", "--prompt-ids", &csv(&r.prompt_ids)])
        .args(["--max-tokens", "16", "--ignore-eos", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let workers: Vec<Worker> = (0..2)
        .map(|_| {
            Worker::start_with(
                ns.cmd(&bin("worker")),
                &dir,
                &key,
                "127.0.0.1:0",
                false,
                &["--mdns-loopback"],
            )
        })
        .collect();
    let out = coord.wait_with_output().unwrap();
    let v = json_out(&out);
    assert_eq!(json_ids(&v), r.greedy_ids);
    let ws = v["stats"]["workers"].as_array().unwrap();
    let mut seen: Vec<String> = ws.iter().map(|w| w["address"].as_str().unwrap().to_string()).collect();
    seen.sort();
    let mut started: Vec<String> = workers.iter().map(Worker::spec).collect();
    started.sort();
    assert_eq!(seen, started, "both workers found");
    for w in ws {
        assert!(w["experts_served"].as_u64().unwrap() > 0, "{w}");
    }
}
