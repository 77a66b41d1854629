//! Constrained decoding against a real server on 127.0.0.1 serving the
//! qwen3moe-chat fixture (the real Qwen3 vocabulary of 151k tokens, random
//! weights: left alone it writes no JSON at all).
//!
//! - `response_format` `json_schema` / `json_object`, Anthropic's
//!   `output_config.format` / `output_format`, and the `grammar` extension (Lark, regex): the answer
//!   is exactly the engine's greedy answer under the grammar's mask
//!   (computed here without the server), and it parses and validates.
//! - A forced tool call (`tool_choice` required / named, Anthropic `any` /
//!   `tool`) comes back as a real call whose arguments validate against
//!   the tool's schema, in both APIs, streamed and not.
//! - A constrained request batched beside a plain one changes neither.
//! - Grammars that do not compile, GBNF, and two constraints at once are
//!   400s naming the field.

mod api_support;

use api_support::*;
use charm_coordinator::chat_template::Message;
use charm_coordinator::grammar::GrammarSpec;
use charm_coordinator::server::tools::{ToolDef, ToolSyntax};
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const COMPLETIONS: &str = "/v1/completions";

fn verdict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
            "score": {"type": "integer", "minimum": 0, "maximum": 9},
            "sure": {"type": "boolean"}
        },
        "required": ["answer", "score", "sure"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`verdict_schema`].
fn assert_verdict(v: &Value) {
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 3, "{v}");
    assert!(["yes", "no", "maybe"].contains(&o["answer"].as_str().unwrap()), "{v}");
    assert!((0..=9).contains(&o["score"].as_i64().unwrap()), "{v}");
    assert!(o["sure"].is_boolean(), "{v}");
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
          "parameters": {"type": "object", "properties": {
              "city": {"type": "string", "enum": ["Paris", "Zürich", "Lagos"]},
              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "Local time in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lagos"]}},
            "required": ["city"], "additionalProperties": false}}}
    ])
}

fn assert_weather_args(name: &str, args: &Value) {
    let o = args
        .as_object()
        .unwrap_or_else(|| panic!("arguments not an object: {args}"));
    match name {
        "get_weather" => {
            assert_eq!(o.len(), 2, "{args}");
            assert!(
                ["Paris", "Zürich", "Lagos"].contains(&o["city"].as_str().unwrap()),
                "{args}"
            );
            assert!(
                ["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap()),
                "{args}"
            );
        }
        "get_time" => {
            assert_eq!(o.len(), 1, "{args}");
            assert!(["Paris", "Lagos"].contains(&o["city"].as_str().unwrap()), "{args}");
        }
        other => panic!("a call to a tool never offered: {other}"),
    }
}

fn user(text: &str) -> Vec<Message> {
    vec![Message::new("user", text)]
}

fn chat_prompt(messages: &[Message], tools: Option<&Value>, prefill: &str) -> Vec<u32> {
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let extra: Vec<(&str, minijinja::Value)> = tools
        .map(|t| vec![("tools", minijinja::Value::from_serialize(t))])
        .unwrap_or_default();
    codec.encode_chat_prefilled(messages, true, &extra, prefill).unwrap()
}

#[test]
fn a_json_schema_answer_is_the_masked_greedy_answer_and_validates() {
    let srv = server(|_| {});
    let q = "Is the sky green? Answer as JSON.";
    let body = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": q}],
        "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": verdict_schema(), "strict": true}}});
    let r = post(srv.addr(), CHAT, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let (ids, want) = constrained_greedy(
        &chat_prompt(&user(q), None, ""),
        &GrammarSpec::JsonSchema(verdict_schema()),
        40,
    );
    assert_eq!(content, want, "the answer is the engine's greedy answer under the mask");
    assert_eq!(v["usage"]["completion_tokens"], ids.len());
    assert_eq!(
        v["choices"][0]["finish_reason"], "stop",
        "the grammar closes the answer"
    );
    assert_verdict(&serde_json::from_str(&content).unwrap());

    // Streamed: the same text.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let events = SseStream::post(srv.addr(), CHAT, &sbody).collect();
    let text: String = events[..events.len() - 1]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(String::from))
        .collect();
    assert_eq!(text, content);

    // Without the format the fixture writes no JSON at all.
    let mut plain = body;
    plain.as_object_mut().unwrap().remove("response_format");
    let p = post(srv.addr(), CHAT, &plain).json();
    let free = p["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(free).is_err(), "{free}");
}

#[test]
fn anthropic_output_format_and_completions_json_object() {
    let srv = server(|_| {});
    let q = "Rate this idea.";
    let body = json!({"model": "qwen3moe-chat", "max_tokens": 40, "temperature": 0,
        "messages": [{"role": "user", "content": q}],
        "output_format": {"type": "json_schema", "schema": verdict_schema()}});
    let r = post(srv.addr(), MESSAGES, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["content"][0]["text"].as_str().unwrap();
    let (_, want) = constrained_greedy(
        &chat_prompt(&user(q), None, ""),
        &GrammarSpec::JsonSchema(verdict_schema()),
        40,
    );
    assert_eq!(text, want);
    assert_eq!(v["stop_reason"], "end_turn");
    assert_verdict(&serde_json::from_str(text).unwrap());
    // The same schema as today's API sends it, `output_config.format`.
    let mut current = body.clone();
    current.as_object_mut().unwrap().remove("output_format");
    current["output_config"] = json!({"format": {"type": "json_schema", "schema": verdict_schema()}});
    let r = post(srv.addr(), MESSAGES, &current);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], want.as_str());
    // Both at once is ambiguous.
    current["output_format"] = body["output_format"].clone();
    assert_eq!(post(srv.addr(), MESSAGES, &current).status, 400);

    // /v1/completions with json_object: any JSON object, the masked answer.
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let prompt = "The record:";
    let body = json!({"model": "qwen3moe-chat", "prompt": prompt, "max_tokens": 24, "temperature": 0,
                      "response_format": {"type": "json_object"}});
    let r = post(srv.addr(), COMPLETIONS, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let got = v["choices"][0]["text"].as_str().unwrap();
    let (_, want) = constrained_greedy(&codec.encode(prompt).unwrap(), &GrammarSpec::JsonObject, 24);
    assert_eq!(got, want);
    assert!(got.starts_with('{'), "{got}");
}

#[test]
fn lark_and_regex_grammars_shape_the_answer() {
    let srv = server(|_| {});
    let q = "Yes or no?";
    let lark = "start: \"yes\" | \"no\" | \"not sure\"";
    let body = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": q}],
                      "max_tokens": 10, "temperature": 0, "grammar": lark});
    let v = post(srv.addr(), CHAT, &body).json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(["yes", "no", "not sure"].contains(&content), "{v}");
    let (_, want) = constrained_greedy(&chat_prompt(&user(q), None, ""), &GrammarSpec::Lark(lark.into()), 10);
    assert_eq!(content, want);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let body = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": q}],
                      "max_tokens": 10, "temperature": 0.9, "seed": 7,
                      "grammar": {"type": "regex", "definition": "[0-9]{3}-[a-c]"}});
    let v = post(srv.addr(), CHAT, &body).json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let b = content.as_bytes();
    assert_eq!(b.len(), 5, "{content}");
    assert!(
        b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-' && (b'a'..=b'c').contains(&b[4]),
        "{content}"
    );
}

/// The forced cases: (tool_choice in OpenAI's shape, in Anthropic's, the
/// forced name).
fn forced() -> Vec<(Value, Value, Option<&'static str>)> {
    vec![
        (json!("required"), json!({"type": "any"}), None),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            json!({"type": "tool", "name": "get_time"}),
            Some("get_time"),
        ),
    ]
}

#[test]
fn forced_tool_calls_are_valid_calls_in_both_apis_streamed_or_not() {
    let srv = server(|_| {});
    let tools = weather_tools();
    let q = "What's the weather in Paris?";
    let defs: Vec<ToolDef> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| ToolDef {
            name: t["function"]["name"].as_str().unwrap().into(),
            description: None,
            parameters: Some(t["function"]["parameters"].clone()),
        })
        .collect();
    for (openai_choice, anthropic_choice, name) in forced() {
        let prefill = ToolSyntax::Hermes.prefill(name);
        let grammar = ToolSyntax::Hermes.forced_grammar(&defs, name);
        let (_, want) = constrained_greedy(&chat_prompt(&user(q), Some(&tools), &prefill), &grammar, 60);
        let want_call: Value = serde_json::from_str(&format!("{prefill}{want}")["<tool_call>".len()..]).unwrap();

        // OpenAI, whole.
        let body = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": q}],
                          "tools": tools, "tool_choice": openai_choice, "max_tokens": 60, "temperature": 0});
        let r = post(srv.addr(), CHAT, &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap().clone();
        assert_eq!(calls.len(), 1, "{v}");
        let fname = calls[0]["function"]["name"].as_str().unwrap();
        if let Some(n) = name {
            assert_eq!(fname, n);
        }
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_weather_args(fname, &args);
        assert_eq!(fname, want_call["name"]);
        assert_eq!(args, want_call["arguments"], "the call is the masked greedy answer");

        // OpenAI, streamed: the same call in tool_call deltas.
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let events = SseStream::post(srv.addr(), CHAT, &sbody).collect();
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect();
        let mut sname = String::new();
        let mut sargs = String::new();
        for c in &chunks {
            for tc in c["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
                sname.push_str(tc["function"]["name"].as_str().unwrap_or(""));
                sargs.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(sname, fname);
        assert_eq!(serde_json::from_str::<Value>(&sargs).unwrap(), args);
        assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));

        // Anthropic, whole and streamed.
        let atools: Vec<Value> = tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let f = &t["function"];
                json!({"name": f["name"], "description": f["description"], "input_schema": f["parameters"]})
            })
            .collect();
        let body = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": q}],
                          "tools": atools, "tool_choice": anthropic_choice, "max_tokens": 60, "temperature": 0});
        let v = post(srv.addr(), MESSAGES, &body).json();
        assert_eq!(v["stop_reason"], "tool_use", "{v}");
        let uses: Vec<&Value> = v["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .collect();
        assert_eq!(uses.len(), 1, "{v}");
        assert_eq!(uses[0]["name"], fname);
        assert_eq!(uses[0]["input"], args);
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let events = SseStream::post(srv.addr(), MESSAGES, &sbody).collect();
        let partial: String = events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
            .filter(|d| d["delta"]["type"] == "input_json_delta")
            .map(|d| d["delta"]["partial_json"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), args);
    }
}

#[test]
fn a_constrained_request_beside_a_plain_one_changes_neither() {
    let q1 = "Is water wet?";
    let q2 = "Tell me a story.";
    let schema_body = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": q1}],
        "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": verdict_schema()}}});
    let plain_body = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": q2}],
        "max_tokens": 24, "temperature": 0});
    // Alone, one at a time.
    let alone = server(|c| c.max_batch = Some(1));
    let a1 = post(alone.addr(), CHAT, &schema_body).json();
    let a2 = post(alone.addr(), CHAT, &plain_body).json();
    drop(alone);
    // Together: the first holds the engine until the second waits, then
    // both run in the same steps.
    let (engine, info, gate) = gated_engine(false, std::time::Duration::ZERO);
    let both = server_with(engine, &info, |c| {
        c.max_batch = Some(4);
        c.prefix_cache_bytes = Some(0);
    });
    let addr = both.addr();
    let (b1, b2) = std::thread::scope(|s| {
        let h1 = s.spawn(|| post(addr, CHAT, &schema_body).json());
        gate.wait_arrival();
        let h2 = s.spawn(|| post(addr, CHAT, &plain_body).json());
        wait_health(addr, "one waiting", |h| h["queued"] == 1 && h["running"] == 1);
        gate.open();
        (h1.join().unwrap(), h2.join().unwrap())
    });
    assert_eq!(a1["choices"][0]["message"], b1["choices"][0]["message"]);
    assert_eq!(a2["choices"][0]["message"], b2["choices"][0]["message"]);
    assert_verdict(&serde_json::from_str(b1["choices"][0]["message"]["content"].as_str().unwrap()).unwrap());
}

#[test]
fn bad_constraints_are_400s_naming_the_field() {
    let srv = server(|_| {});
    let base = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}}),
            "response_format",
        ),
        (json!({"response_format": {"type": "yaml"}}), "response_format"),
        (json!({"grammar": "root ::= \"a\""}), "grammar"),
        (json!({"grammar": "start: (("}), "grammar"),
        (
            json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}),
            "grammar",
        ),
    ];
    for (extra, param) in cases {
        let mut body = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(srv.addr(), CHAT, &body);
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{extra}: {}", r.text());
    }
    let r = post(
        srv.addr(),
        MESSAGES,
        &json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "output_format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    // The server still answers.
    assert_eq!(post(srv.addr(), CHAT, &base).status, 200);
}

#[test]
fn ids_without_bytes_are_never_allowed() {
    // The fixture's 151,936 logits against the tokenizer's 151,669 tokens:
    // the ids past it decode to nothing; were one allowed, it would fit any
    // grammar state without advancing it (an answer that never ends).
    // llguidance's trie allows no token without bytes.
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let (engine, _) = engine();
    let cfg = engine.config();
    let grammars = charm_coordinator::grammar::Grammars::new(&codec, cfg.vocab_size, &cfg.eos_token_ids).unwrap();
    let known = codec.decode(&[151_668], false).unwrap();
    assert_eq!(known, "</think>", "the tokenizer's last token");
    for spec in [GrammarSpec::Regex("[a-z]*".into()), GrammarSpec::JsonObject] {
        let mut c = grammars.compile(&spec).unwrap();
        let mut logits = vec![0.0f32; cfg.vocab_size];
        c.mask(&mut logits).unwrap();
        assert!(logits[151_669..].iter().all(|l| *l == f32::NEG_INFINITY), "{spec:?}");
        assert!(logits.iter().any(|l| l.is_finite()));
    }
}
