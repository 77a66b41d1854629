//! The official `openai` and `anthropic` Python SDKs, unmodified, against a
//! real server (base URL and key only): `scripts/test_sdks.py` completes a
//! chat and a streamed chat with each, and its answers must equal the
//! engine's own greedy answers for the same prompts; then a tool round trip
//! with each (tools, a call, its result, the tool forced by name), whose
//! prompt must be the template's rendering with the call's prefill and
//! whose call the greedy continuation of it under the call's grammar; a
//! strict `json_schema` answer (and the SDK's `parse()`), a required call
//! with two tools, and the Responses API (whole, streamed, a forced call
//! and its result sent back with `previous_response_id`), each validated
//! with `jsonschema` in the script and compared with the engine here.
//!
//! The SDKs live in `target/sdk-venv` (made by `scripts/sdk_venv.sh`, which
//! `scripts/test.sh` runs). Without python3/pip the test is skipped with a
//! loud message, unless `CHARM_CI=1`, where it fails.

mod api_support;

use std::process::Command;

use api_support::*;
use charm_coordinator::chat_template::Message;
use charm_coordinator::grammar::GrammarSpec;
use charm_coordinator::server::tools::{parse, ToolDef, ToolSyntax};
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

const SYSTEM: &str = "You are terse.";
const USER: &str = "Say something about hummingbirds.";
const MAX_TOKENS: usize = 24;

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
    // The same prompt as the OpenAI request's: served by the prefix cache.
    let anthropic_prompt =
        v["anthropic"]["input_tokens"].as_u64().unwrap() + v["anthropic"]["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(anthropic_prompt, prompt.len() as u64);
    assert_eq!(v["anthropic"]["output_tokens"], ids.len());
    assert_eq!(
        v["anthropic"]["stop_reason"],
        if full { "max_tokens" } else { "end_turn" }
    );

    // Tools: both SDKs' round trips render to the same prompt, and the
    // forced call is the engine's greedy answer under the call's grammar.
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let weather_schema = json!({"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lagos", "Lima"]}},
                                "required": ["city"], "additionalProperties": false});
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city.", "parameters": weather_schema}}]);
    let call = json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}});
    let msgs = [
        Message::new("user", "What is the weather in Paris?"),
        Message::assistant_calls("", vec![call]),
        Message::tool_result("call_1", "18 C, clear"),
    ];
    let prefill = ToolSyntax::Hermes.prefill(Some("get_weather"));
    let extra = [("tools", minijinja::Value::from_serialize(&tools))];
    let prompt = codec.encode_chat_prefilled(&msgs, true, &extra, &prefill).unwrap();
    let defs = [ToolDef {
        name: "get_weather".into(),
        description: None,
        parameters: Some(weather_schema.clone()),
    }];
    let grammar = ToolSyntax::Hermes.forced_grammar(&defs, Some("get_weather"));
    let (_, text) = constrained_greedy(&prompt, &grammar, MAX_TOKENS);
    let want = parse(ToolSyntax::Hermes, &["get_weather".into()], &format!("{prefill}{text}"));
    assert_eq!(want.calls.len(), 1, "the forced call completes: {text:?}");
    let want_calls = json!([{"name": "get_weather", "arguments": want.calls[0].arguments}]);
    let o = &v["openai_tools"];
    assert_eq!(o["prompt_tokens"], prompt.len(), "{o}");
    assert_eq!(o["calls"], want_calls);
    assert_eq!(o["finish_reason"], "tool_calls");
    let a = &v["anthropic_tools"];
    let read = a["input_tokens"].as_u64().unwrap() + a["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(read, prompt.len() as u64, "{a}");
    assert_eq!(a["calls"], want_calls);

    // Structured output through the SDK: the masked greedy answer.
    let s = &v["openai_structured"];
    let verdict = json!({"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
                         "score": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["answer", "score"], "additionalProperties": false});
    let q = codec
        .encode_chat(&[Message::new("user", "Is the sky green? Answer as JSON.")], true, &[])
        .unwrap();
    let (_, want_json) = constrained_greedy(&q, &GrammarSpec::JsonSchema(verdict), 48);
    assert_eq!(s["text"], want_json.as_str());

    // The Responses API: the same greedy answer as chat completions.
    let r = &v["responses"];
    let msgs = [Message::new("system", SYSTEM), Message::new("user", USER)];
    let (prompt, ids, text) = solo_chat(&msgs, MAX_TOKENS);
    assert_eq!(r["text"], text.as_str());
    assert_eq!(r["input_tokens"], prompt.len());
    assert_eq!(r["output_tokens"], ids.len());
    assert_eq!(
        r["status"],
        if ids.len() == MAX_TOKENS {
            "incomplete"
        } else {
            "completed"
        }
    );
    assert_eq!(r["call"]["name"], "get_weather");
}
