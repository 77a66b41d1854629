//! The Responses API (`/v1/responses`) against a real server on 127.0.0.1
//! serving the qwen3moe-chat fixture (the real Qwen3 template, random
//! weights).
//!
//! - A text input's answer is the engine's greedy answer; the stream's
//!   events come numbered in order (created, in_progress, item added,
//!   part added, text deltas, done events, completed / incomplete) and add
//!   up to the whole answer.
//! - A forced call comes back as a `function_call` item; its result sent
//!   with `previous_response_id`, or as the whole item list, reaches the
//!   template as the same conversation (same prompt tokens as transformers'
//!   rendering of it).
//! - Stored responses can be read back; `store: false` keeps nothing.
//! - `text.format` with a JSON schema gives a valid answer; bad input is a
//!   400 naming the field.

mod api_support;

use api_support::*;
use charm_coordinator::chat_template::Message;
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

const RESPONSES: &str = "/v1/responses";

fn output_text(v: &Value) -> String {
    v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .filter_map(|p| p["text"].as_str())
        .collect()
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Current weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lagos"]}},
                          "required": ["city"], "additionalProperties": false}})
}

#[test]
fn a_text_answer_whole_and_streamed() {
    let srv = server(|_| {});
    let body = json!({"model": "qwen3moe-chat", "instructions": "You are terse.", "input": "Tell me about hummingbirds.",
                      "max_output_tokens": 12, "temperature": 0});
    let r = post(srv.addr(), RESPONSES, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let msgs = [
        Message::new("system", "You are terse."),
        Message::new("user", "Tell me about hummingbirds."),
    ];
    let (prompt, ids, text) = solo_chat(&msgs, 12);
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(output_text(&v), text);
    assert_eq!(v["usage"]["input_tokens"], prompt.len());
    assert_eq!(v["usage"]["output_tokens"], ids.len());
    let full = ids.len() == 12;
    assert_eq!(v["status"], if full { "incomplete" } else { "completed" });
    if full {
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    }
    assert_eq!(v["instructions"], "You are terse.");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let events = SseStream::post(srv.addr(), RESPONSES, &sbody).collect();
    let data: Vec<Value> = events.iter().map(|e| serde_json::from_str(&e.data).unwrap()).collect();
    for (i, (e, d)) in events.iter().zip(&data).enumerate() {
        assert_eq!(d["sequence_number"], i, "{d}");
        assert_eq!(
            e.event.as_deref(),
            d["type"].as_str(),
            "the event name is the data's type"
        );
    }
    let kinds: Vec<&str> = data.iter().map(|d| d["type"].as_str().unwrap()).collect();
    assert_eq!(
        &kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    let n = kinds.len();
    assert_eq!(
        &kinds[n - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            if full {
                "response.incomplete"
            } else {
                "response.completed"
            }
        ]
    );
    let deltas: String = data
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    let last = &data[n - 1]["response"];
    assert_eq!(output_text(last), text);
    assert_eq!(last["usage"]["input_tokens"], v["usage"]["input_tokens"]);
    assert_eq!(last["usage"]["output_tokens"], v["usage"]["output_tokens"]);
    // The second time the prompt is served by the prefix cache.
    assert_eq!(last["usage"]["input_tokens_details"]["cached_tokens"], prompt.len());
}

#[test]
fn a_forced_call_and_its_result_continue_the_conversation() {
    let srv = server(|c| c.prefix_cache_bytes = Some(0));
    let q = "Weather in Paris?";
    let body = json!({"model": "qwen3moe-chat", "input": q, "tools": [weather_tool()],
                      "tool_choice": "required", "max_output_tokens": 40, "temperature": 0});
    let v = post(srv.addr(), RESPONSES, &body).json();
    assert_eq!(v["status"], "completed", "{v}");
    let calls: Vec<&Value> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{v}");
    let call = calls[0];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(["Paris", "Lagos"].contains(&args["city"].as_str().unwrap()), "{args}");
    let call_id = call["call_id"].as_str().unwrap();

    // The result, after the stored response.
    let result = json!({"type": "function_call_output", "call_id": call_id, "output": "18 C"});
    let follow = json!({"model": "qwen3moe-chat", "previous_response_id": v["id"], "input": [result.clone()],
                        "tools": [weather_tool()], "max_output_tokens": 4, "temperature": 0});
    let r = post(srv.addr(), RESPONSES, &follow);
    assert_eq!(r.status, 200, "{}", r.text());
    let f = r.json();
    // The same conversation sent whole, as a stateless client sends it.
    let items = json!([{"role": "user", "content": q},
                       {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": call["arguments"]},
                       result]);
    let whole = json!({"model": "qwen3moe-chat", "input": items, "tools": [weather_tool()], "store": false,
                       "max_output_tokens": 4, "temperature": 0});
    let w = post(srv.addr(), RESPONSES, &whole).json();
    // What transformers renders for it.
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
                        "parameters": weather_tool()["parameters"]}}]);
    let msgs = [
        Message::new("user", q),
        Message::assistant_calls(
            "",
            vec![json!({"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}})],
        ),
        Message::tool_result(call_id, "18 C"),
    ];
    let want = codec
        .encode_chat(&msgs, true, &[("tools", minijinja::Value::from_serialize(&tools))])
        .unwrap()
        .len();
    assert_eq!(f["usage"]["input_tokens"], want, "{f}");
    assert_eq!(w["usage"]["input_tokens"], want, "{w}");
    assert_eq!(output_text(&f), output_text(&w));
    assert_eq!(f["previous_response_id"], v["id"]);

    // Stored ones read back; unstored ones are not there.
    let g = get(srv.addr(), &format!("{RESPONSES}/{}", v["id"].as_str().unwrap()));
    assert_eq!(g.status, 200);
    assert_eq!(g.json()["output"], v["output"]);
    assert_eq!(
        get(srv.addr(), &format!("{RESPONSES}/{}", w["id"].as_str().unwrap())).status,
        404
    );
    let r = post(
        srv.addr(),
        RESPONSES,
        &json!({"model": "qwen3moe-chat", "input": "x", "previous_response_id": w["id"], "max_output_tokens": 2}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "previous_response_id");
}

#[test]
fn a_json_schema_format_and_bad_requests() {
    let srv = server(|_| {});
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 3}},
                        "required": ["ok", "n"], "additionalProperties": false});
    let body = json!({"model": "qwen3moe-chat", "input": "Answer in JSON.", "max_output_tokens": 30, "temperature": 0,
                      "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}}});
    let v = post(srv.addr(), RESPONSES, &body).json();
    assert_eq!(v["status"], "completed", "{v}");
    let got: Value = serde_json::from_str(&output_text(&v)).unwrap();
    assert!(
        got["ok"].is_boolean() && (1..=3).contains(&got["n"].as_i64().unwrap()),
        "{got}"
    );
    assert_eq!(v["text"]["format"]["type"], "json_schema");

    for (b, param) in [
        (json!({"model": "qwen3moe-chat"}), "input"),
        (
            json!({"model": "qwen3moe-chat", "input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]}),
            "input",
        ),
        (
            json!({"model": "qwen3moe-chat", "input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"model": "qwen3moe-chat", "input": "x", "tools": [{"type": "web_search"}]}),
            "tools",
        ),
        (
            json!({"model": "qwen3moe-chat", "input": "x", "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"model": "qwen3moe-chat", "input": "x", "text": {"format": {"type": "xml"}}}),
            "text.format",
        ),
        (
            json!({"model": "qwen3moe-chat", "input": "x", "reasoning": {"effort": "extreme"}}),
            "reasoning.effort",
        ),
    ] {
        let r = post(srv.addr(), RESPONSES, &b);
        assert_eq!(r.status, 400, "{b}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{b}");
    }
}
