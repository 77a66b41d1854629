//! A real agent framework against `serve` on the demo model: the OpenAI
//! Agents SDK (pinned in `scripts/sdk_venv.sh`) runs `scripts/test_agents.py`,
//! a two-tool loop (get_time, then get_weather, then a text answer) over the
//! Responses API and over Chat Completions, against SmolLM2-135M-Instruct
//! upcycled into the demo MoE (its template knows no tools: charm's generic
//! tool shape) on 127.0.0.1. Each call is grammar-forced, so the SDK parses
//! and validates every argument and runs every tool.
//!
//! Without python3/pip the test is skipped with a loud message, unless
//! `CHARM_CI=1`, where it fails.

mod api_support;

use std::process::Command;

use api_support::*;
use charm_coordinator::upcycle::{upcycle, UpcycleOptions};
use charm_coordinator::Engine;
use serde_json::Value;

#[test]
fn the_openai_agents_sdk_runs_a_two_tool_loop_on_the_demo_model() {
    let Some(python) = sdk_python() else {
        assert!(!strict(), "CHARM_CI=1 but python3 with pip and venv is missing");
        eprintln!("\n!!! SKIPPED the agents SDK test: python3 with pip and venv not found !!!\n");
        return;
    };
    let gguf = repo().join("tests/material/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "{}: run scripts/fetch_test_material.sh", gguf.display());
    let base = repo().join("target/test-scratch");
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::Builder::new().prefix("agents-").tempdir_in(base).unwrap();
    let demo = tmp.path().join("demo");
    upcycle(&gguf, &demo, &UpcycleOptions::default()).expect("upcycle the demo model");
    let (engine, info) = Engine::load(&demo, &Default::default()).unwrap();
    let srv = server_with(engine, &info, |c| c.model_dir = demo.clone());

    let out = Command::new(&python)
        .arg(repo().join("scripts/test_agents.py"))
        .args(["--base-url", &srv.url(), "--model", "demo"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "test_agents.py failed:\n{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    eprintln!("openai-agents {}: {v}", v["agents_version"]);
    for api in ["responses", "chat_completions"] {
        let r = &v[api];
        let calls = r["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "{api}: {r}");
        assert_eq!(calls[0]["tool"], "get_time");
        assert_eq!(calls[1]["tool"], "get_weather");
        for c in calls {
            assert!(
                ["Paris", "Lagos", "Lima"].contains(&c["city"].as_str().unwrap()),
                "{api}: {c}"
            );
        }
        assert!(
            ["celsius", "fahrenheit"].contains(&calls[1]["unit"].as_str().unwrap()),
            "{api}: {r}"
        );
        assert_eq!(r["turns"], 3, "{api}: two calls and the answer");
        assert!(r["final_output"].is_string(), "{api}: {r}");
    }
    // Both APIs render the same conversation: the same calls, the same answer.
    assert_eq!(v["responses"]["calls"], v["chat_completions"]["calls"]);
    assert_eq!(v["responses"]["final_output"], v["chat_completions"]["final_output"]);
}
