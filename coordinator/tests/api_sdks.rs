//! The official `openai` and `anthropic` Python SDKs, unmodified, against a
//! real server (base URL and key only): `scripts/test_sdks.py` completes a
//! chat and a streamed chat with each, and its answers must equal the
//! engine's own greedy answers for the same prompts.
//!
//! The SDKs live in `target/sdk-venv` (made by `scripts/sdk_venv.sh`, which
//! `scripts/test.sh` runs). Without python3/pip the test is skipped with a
//! loud message, unless `CHARM_CI=1`, where it fails.

mod api_support;

use std::process::Command;

use api_support::*;
use charm_coordinator::chat_template::Message;
use serde_json::Value;

const SYSTEM: &str = "You are terse.";
const USER: &str = "Say something about hummingbirds.";
const MAX_TOKENS: usize = 24;

/// The venv's python, or `None` when this machine has no python3 with pip and venv.
fn sdk_python() -> Option<String> {
    let has = |args: &[&str]| {
        Command::new("python3")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has(&["-m", "pip", "--version"]) || !has(&["-m", "venv", "--help"]) {
        return None;
    }
    let out = Command::new("bash")
        .arg(repo().join("scripts/sdk_venv.sh"))
        .output()
        .expect("run scripts/sdk_venv.sh");
    assert!(
        out.status.success(),
        "scripts/sdk_venv.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap().trim().to_string())
}

#[test]
fn official_python_sdks_chat_and_stream() {
    let Some(python) = sdk_python() else {
        assert!(!strict(), "CHARM_CI=1 but python3 with pip and venv is missing");
        eprintln!("\n!!! SKIPPED official_python_sdks_chat_and_stream: python3 with pip and venv not found !!!\n");
        return;
    };
    let srv = server(|c| c.api_key = Some("sdk-test-key".into()));
    let out = Command::new(&python)
        .arg(repo().join("scripts/test_sdks.py"))
        .args([
            "--base-url",
            &srv.url(),
            "--model",
            "qwen3moe-chat",
            "--api-key",
            "sdk-test-key",
        ])
        .args(["--max-tokens", &MAX_TOKENS.to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "test_sdks.py failed:\n{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    eprintln!("openai {} / anthropic {}", v["openai_version"], v["anthropic_version"]);

    let msgs = [Message::new("system", SYSTEM), Message::new("user", USER)];
    let (prompt, ids, text) = solo_chat(&msgs, MAX_TOKENS);
    let full = ids.len() == MAX_TOKENS;
    assert_eq!(v["openai"]["text"], text.as_str());
    assert_eq!(v["openai"]["prompt_tokens"], prompt.len());
    assert_eq!(v["openai"]["completion_tokens"], ids.len());
    assert_eq!(v["openai"]["finish_reason"], if full { "length" } else { "stop" });
    assert_eq!(v["anthropic"]["text"], text.as_str());
    assert_eq!(v["anthropic"]["input_tokens"], prompt.len());
    assert_eq!(v["anthropic"]["output_tokens"], ids.len());
    assert_eq!(
        v["anthropic"]["stop_reason"],
        if full { "max_tokens" } else { "end_turn" }
    );
}
