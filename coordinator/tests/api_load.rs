//! `scripts/load_test.py`, briefly, against a real server with a short
//! queue: 8 streaming clients for 4 seconds, no waiting after a 429. Every
//! request completes with its solo answer or is refused with 429; the
//! server's counters agree with the clients' (the script checks all of it
//! and exits non-zero otherwise).

mod api_support;

use std::process::Command;

use api_support::*;
use serde_json::Value;

#[test]
fn load_test_script_finds_nothing_lost_or_mixed() {
    if Command::new("python3").arg("--version").output().is_err() {
        assert!(!strict(), "CHARM_CI=1 but python3 is missing");
        eprintln!("\n!!! SKIPPED load test: python3 not found !!!\n");
        return;
    }
    let srv = server(|c| c.queue_size = 2);
    let out = Command::new("python3")
        .arg(repo().join("scripts/load_test.py"))
        .args([
            "--url",
            &srv.url(),
            "--clients",
            "8",
            "--duration",
            "4",
            "--max-tokens",
            "24",
        ])
        .args(["--prompts", "3", "--no-retry-wait", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "load_test.py failed:\n{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON summary");
    eprintln!("{v}");
    assert_eq!(v["errors"], 0);
    assert_eq!(v["lost"], serde_json::json!([]));
    let (done, refused, all) = (
        v["completed"].as_u64().unwrap(),
        v["rejected_429"].as_u64().unwrap(),
        v["requests"].as_u64().unwrap(),
    );
    assert!(done > 0);
    assert_eq!(done + refused, all);
}
