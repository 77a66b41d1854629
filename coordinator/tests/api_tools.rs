//! Tool calling against a real server on 127.0.0.1 serving the
//! qwen3moe-chat fixture (the real Qwen3 chat template, random weights).
//!
//! - The template with tools renders exactly what transformers'
//!   `apply_chat_template(messages, tools=...)` renders
//!   (`tests/fixtures/tokenizers/qwen3_tool_cases.json`, from
//!   `scripts/make_fixtures.py tool-cases`), with and without the prefill a
//!   forced `tool_choice` adds.
//! - Each case sent through both APIs in their own shapes (OpenAI arguments
//!   as JSON strings and `tool` messages, Anthropic `tool_use` /
//!   `tool_result` blocks) reaches the engine as exactly those ids, and the
//!   answer is the engine's own greedy answer (a forced call's under its
//!   grammar's mask), parsed for calls: cut short by `max_tokens`, a forced
//!   call comes back as the raw text (prefill included) and no
//!   `tool_calls`, never a fabricated call. The round trip (calls, their results, the final
//!   answer asked for) is one of the cases.
//! - Streams give what the whole answers give.
//! - Bad tools, choices and tool messages are 400s in each API's shape.
//! - A template without tools of its own gets charm's generic shape (tools
//!   in the system message, calls and results as text), forced calls
//!   included.
//!
//! Parsing real calls out of model text (whole, streamed, malformed) is
//! tested in `coordinator/src/server/{tools,openai,anthropic}.rs`.

mod api_support;

use api_support::*;
use charm_coordinator::chat_template::Message;
use charm_coordinator::server::tools::{self, ToolSyntax};
use charm_coordinator::server::Server;
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const MAX_TOKENS: usize = 6;

fn cases() -> Vec<Value> {
    let path = repo().join("tests/fixtures/tokenizers/qwen3_tool_cases.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["chat"].as_array().unwrap().clone()
}

fn case(name: &str) -> Value {
    cases().into_iter().find(|c| c["name"] == name).unwrap()
}

/// A case's messages as charm's template messages.
fn template_messages(case: &Value) -> Vec<Message> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let content = m["content"].as_str().unwrap();
            match (m.get("tool_calls"), m.get("tool_call_id")) {
                (Some(calls), _) => Message::assistant_calls(content, calls.as_array().unwrap().clone()),
                (_, Some(id)) => Message::tool_result(id.as_str().unwrap(), content),
                _ => Message::new(m["role"].as_str().unwrap(), content),
            }
        })
        .collect()
}

fn tool_names(case: &Value) -> Vec<String> {
    case["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The case as an OpenAI request: arguments as JSON strings (as the API
/// and its SDKs carry them); `named` / `required` choose as their names say.
fn openai_body(case: &Value) -> Value {
    let mut messages = case["messages"].clone();
    for m in messages.as_array_mut().unwrap() {
        if let Some(calls) = m.get_mut("tool_calls") {
            for c in calls.as_array_mut().unwrap() {
                let args = c["function"]["arguments"].to_string();
                c["function"]["arguments"] = json!(args);
            }
        }
    }
    let mut body = json!({"model": "qwen3moe-chat", "messages": messages, "tools": case["tools"],
                          "max_tokens": MAX_TOKENS, "temperature": 0});
    match case["name"].as_str().unwrap() {
        "named" => body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}}),
        "required" => body["tool_choice"] = json!("required"),
        _ => {}
    }
    body
}

/// The case as an Anthropic request: the system message as `system`,
/// assistant calls as `tool_use` blocks, results as a user message's
/// `tool_result` blocks.
fn anthropic_body(case: &Value) -> Value {
    let mut system = None;
    let mut messages: Vec<Value> = Vec::new();
    for m in case["messages"].as_array().unwrap() {
        let content = m["content"].as_str().unwrap();
        match m["role"].as_str().unwrap() {
            "system" => system = Some(content.to_string()),
            "assistant" if m.get("tool_calls").is_some() => {
                let mut blocks = Vec::new();
                if !content.is_empty() {
                    blocks.push(json!({"type": "text", "text": content}));
                }
                for c in m["tool_calls"].as_array().unwrap() {
                    blocks.push(json!({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                                       "input": c["function"]["arguments"]}));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            "tool" => {
                let block = json!({"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": content});
                match messages.last_mut() {
                    Some(last) if last["role"] == "user" && last["content"].is_array() => {
                        last["content"].as_array_mut().unwrap().push(block)
                    }
                    _ => messages.push(json!({"role": "user", "content": [block]})),
                }
            }
            role => messages.push(json!({"role": role, "content": content})),
        }
    }
    let tools: Vec<Value> = case["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            let mut tool = json!({"name": f["name"], "input_schema": f["parameters"]});
            if let Some(d) = f.get("description") {
                tool["description"] = d.clone();
            }
            tool
        })
        .collect();
    let mut body = json!({"model": "qwen3moe-chat", "messages": messages, "tools": tools,
                          "max_tokens": MAX_TOKENS, "temperature": 0});
    if let Some(s) = system {
        body["system"] = json!(s);
    }
    match case["name"].as_str().unwrap() {
        "named" => body["tool_choice"] = json!({"type": "tool", "name": "get_weather"}),
        "required" => body["tool_choice"] = json!({"type": "any"}),
        _ => {}
    }
    body
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

/// The engine's greedy answer to `prompt`: generated ids and their text.
fn greedy(prompt: &[u32], max_tokens: usize) -> (Vec<u32>, String) {
    let (engine, _) = engine();
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let params = charm_coordinator::GenerateParams {
        max_tokens,
        sampling: Default::default(),
        ignore_eos: false,
    };
    let gen = engine
        .generate(&mut engine.session(), prompt, &params, |_| true)
        .unwrap();
    let text = codec.decode(&gen.ids, true).unwrap();
    (gen.ids, text)
}

/// The grammar a forced call's continuation follows, if the case forces one.
fn forced_grammar(case: &Value) -> Option<charm_coordinator::grammar::GrammarSpec> {
    let defs: Vec<tools::ToolDef> = case["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| tools::ToolDef {
            name: t["function"]["name"].as_str().unwrap().into(),
            description: None,
            parameters: Some(t["function"]["parameters"].clone()),
        })
        .collect();
    match case["name"].as_str().unwrap() {
        "named" => Some(ToolSyntax::Hermes.forced_grammar(&defs, Some("get_weather"))),
        "required" => Some(ToolSyntax::Hermes.forced_grammar(&defs, None)),
        _ => None,
    }
}

/// What the server must answer for `case`: the greedy continuation of its
/// prefilled prompt (under the forced call's grammar, if any), parsed with
/// the case's tools.
fn expected(case: &Value) -> (tools::Parsed, &'static str) {
    let prompt = ids(&case["prefilled_ids"]);
    let (gen, text) = match forced_grammar(case) {
        Some(g) => constrained_greedy(&prompt, &g, MAX_TOKENS),
        None => greedy(&prompt, MAX_TOKENS),
    };
    let prefill = case["prefill"].as_str().unwrap();
    let parsed = tools::parse(ToolSyntax::Hermes, &tool_names(case), &format!("{prefill}{text}"));
    let finish = if !parsed.calls.is_empty() {
        "calls"
    } else if gen.len() == MAX_TOKENS {
        "length"
    } else {
        "stop"
    };
    (parsed, finish)
}

#[test]
fn qwen3_template_with_tools_renders_what_transformers_renders() {
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let syntax = ToolSyntax::detect(codec.template().unwrap().source());
    assert_eq!(
        syntax,
        Some(ToolSyntax::Hermes),
        "the Qwen3 template has <tool_call> syntax"
    );
    let all = cases();
    assert!(all.len() >= 5);
    for c in &all {
        let name = c["name"].as_str().unwrap();
        let messages = template_messages(c);
        let extra = [("tools", minijinja::Value::from_serialize(&c["tools"]))];
        let text = codec.render_chat(&messages, true, &extra).unwrap();
        assert_eq!(text, c["text"].as_str().unwrap(), "case {name}: rendered text");
        assert_eq!(
            codec.encode_chat(&messages, true, &extra).unwrap(),
            ids(&c["ids"]),
            "case {name}: ids"
        );
        let prefill = c["prefill"].as_str().unwrap();
        assert_eq!(
            codec.encode_chat_prefilled(&messages, true, &extra, prefill).unwrap(),
            ids(&c["prefilled_ids"]),
            "case {name}: prefilled ids"
        );
    }
}

#[test]
fn openai_tool_conversations_reach_the_engine_as_transformers_renders_them() {
    let srv = server(|_| {});
    for c in cases() {
        let name = c["name"].as_str().unwrap();
        let r = post(srv.addr(), CHAT, &openai_body(&c));
        assert_eq!(r.status, 200, "case {name}: {}", r.text());
        let v = r.json();
        assert_eq!(
            v["usage"]["prompt_tokens"],
            c["prefilled_ids"].as_array().unwrap().len(),
            "case {name}: the prompt is transformers' rendering (+ the forced call's prefill)"
        );
        let (want, finish) = expected(&c);
        let choice = &v["choices"][0];
        let msg = &choice["message"];
        if want.calls.is_empty() {
            assert_eq!(msg["content"], want.content.as_str(), "case {name}");
            assert!(msg.get("tool_calls").is_none(), "case {name}: {msg}");
            assert_eq!(choice["finish_reason"], finish, "case {name}");
        } else {
            assert_eq!(choice["finish_reason"], "tool_calls");
            for (got, w) in msg["tool_calls"].as_array().unwrap().iter().zip(&want.calls) {
                assert_eq!(got["function"]["name"], w.name.as_str());
                assert_eq!(got["function"]["arguments"], w.arguments_json());
            }
        }
        if !c["prefill"].as_str().unwrap().is_empty() {
            // A forced call cut by max_tokens is not a call: the raw text
            // comes back, prefill included, and no call is made up (whole
            // forced calls: tests/api_structured.rs).
            assert!(
                want.calls.is_empty(),
                "case {name}: a forced call cut at {MAX_TOKENS} tokens cannot be whole"
            );
            assert!(
                msg["content"]
                    .as_str()
                    .unwrap()
                    .starts_with(c["prefill"].as_str().unwrap()),
                "case {name}: {msg}"
            );
            assert!(
                v["warnings"][0].as_str().unwrap().contains("left in the text"),
                "case {name}: {v}"
            );
        }
    }
}

#[test]
fn anthropic_tool_conversations_reach_the_engine_as_transformers_renders_them() {
    let srv = server(|_| {});
    for c in cases() {
        let name = c["name"].as_str().unwrap();
        let r = post(srv.addr(), MESSAGES, &anthropic_body(&c));
        assert_eq!(r.status, 200, "case {name}: {}", r.text());
        let v = r.json();
        assert_eq!(
            anthropic_prompt_tokens(&v["usage"]),
            c["prefilled_ids"].as_array().unwrap().len() as u64,
            "case {name}"
        );
        let (want, finish) = expected(&c);
        if want.calls.is_empty() {
            assert_eq!(
                v["content"],
                json!([{"type": "text", "text": want.content}]),
                "case {name}"
            );
            let reason = if finish == "length" { "max_tokens" } else { "end_turn" };
            assert_eq!(v["stop_reason"], reason, "case {name}");
        } else {
            assert_eq!(v["stop_reason"], "tool_use");
            let uses: Vec<&Value> = v["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .collect();
            assert_eq!(uses.len(), want.calls.len());
            for (got, w) in uses.iter().zip(&want.calls) {
                assert_eq!(got["name"], w.name.as_str());
                assert_eq!(got["input"], Value::Object(w.arguments.clone()));
            }
        }
    }
}

#[test]
fn streams_with_tools_give_what_the_whole_answers_give() {
    let srv = server(|_| {});
    for name in ["named", "round_trip"] {
        let c = case(name);
        // OpenAI.
        let whole = post(srv.addr(), CHAT, &openai_body(&c)).json();
        let mut body = openai_body(&c);
        body["stream"] = json!(true);
        let events = SseStream::post(srv.addr(), CHAT, &body).collect();
        assert_eq!(events.last().unwrap().data, "[DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect();
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        let msg = &whole["choices"][0]["message"];
        assert_eq!(content, msg["content"].as_str().unwrap_or(""), "case {name}");
        assert_eq!(
            deltas.iter().filter(|d| d.get("tool_calls").is_some()).count(),
            0,
            "case {name}: no call was made"
        );
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            whole["choices"][0]["finish_reason"],
            "case {name}"
        );
        // Anthropic.
        let whole = post(srv.addr(), MESSAGES, &anthropic_body(&c)).json();
        let mut body = anthropic_body(&c);
        body["stream"] = json!(true);
        let events = SseStream::post(srv.addr(), MESSAGES, &body).collect();
        let frames: Vec<(String, Value)> = events
            .iter()
            .map(|e| (e.event.clone().unwrap(), serde_json::from_str(&e.data).unwrap()))
            .collect();
        let text: String = frames
            .iter()
            .filter(|(n, _)| n == "content_block_delta")
            .map(|(_, f)| f["delta"]["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(text, whole["content"][0]["text"].as_str().unwrap(), "case {name}");
        let starts: Vec<&Value> = frames
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, f)| &f["content_block"])
            .collect();
        assert_eq!(starts, [&json!({"type": "text", "text": ""})], "case {name}");
        let delta = frames.iter().find(|(n, _)| n == "message_delta").unwrap();
        assert_eq!(delta.1["delta"]["stop_reason"], whole["stop_reason"], "case {name}");
        assert_eq!(frames.last().unwrap().0, "message_stop");
    }
}

#[test]
fn tool_choice_none_shows_no_tools_to_the_model() {
    let srv = server(|_| {});
    let c = case("offer");
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let plain = codec.encode_chat(&template_messages(&c), true, &[]).unwrap();
    assert!(plain.len() < c["ids"].as_array().unwrap().len());
    let (_, text) = greedy(&plain, MAX_TOKENS);
    let mut body = openai_body(&c);
    body["tool_choice"] = json!("none");
    let v = post(srv.addr(), CHAT, &body).json();
    assert_eq!(v["usage"]["prompt_tokens"], plain.len(), "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], text.as_str());
    let mut body = anthropic_body(&c);
    body["tool_choice"] = json!({"type": "none"});
    let v = post(srv.addr(), MESSAGES, &body).json();
    assert_eq!(anthropic_prompt_tokens(&v["usage"]), plain.len() as u64, "{v}");
}

/// An Anthropic `usage`'s prompt tokens: computed plus read from the
/// prefix cache.
fn anthropic_prompt_tokens(usage: &Value) -> u64 {
    usage["input_tokens"].as_u64().unwrap() + usage["cache_read_input_tokens"].as_u64().unwrap()
}

/// Posts `body` and expects a 400 in the route's error shape whose message
/// contains `needle`.
fn refused(srv: &Server, path: &str, body: &Value, needle: &str) {
    let r = post(srv.addr(), path, body);
    assert_eq!(r.status, 400, "{needle}: {}", r.text());
    let v = r.json();
    let msg = if path == MESSAGES {
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        v["error"]["message"].as_str().unwrap().to_string()
    } else {
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        v["error"]["message"].as_str().unwrap().to_string()
    };
    assert!(msg.contains(needle), "wanted {needle:?} in {msg:?}");
}

#[test]
fn bad_openai_tool_requests_are_400s() {
    let srv = server(|_| {});
    let base = openai_body(&case("round_trip"));
    let with = |f: &dyn Fn(&mut Value)| {
        let mut b = base.clone();
        f(&mut b);
        b
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            with(&|b| {
                b["tools"][0]["function"]
                    .as_object_mut()
                    .unwrap()
                    .remove("name")
                    .map(drop)
                    .unwrap()
            }),
            "tools[0].function.name is missing",
        ),
        (
            with(&|b| b["tools"][1]["function"]["parameters"] = json!("a string")),
            "tools[1].function.parameters must be a JSON schema object",
        ),
        (
            with(&|b| b["tools"][0]["type"] = json!("code_interpreter")),
            "only \"function\" tools",
        ),
        (
            with(&|b| b["tools"][0]["function"]["name"] = json!("say \"hi\"")),
            "only letters, digits",
        ),
        (with(&|b| b["tools"] = json!({"a": 1})), "tools must be a list"),
        (with(&|b| b["tools"][1] = b["tools"][0].clone()), "used twice"),
        (
            with(&|b| b["tool_choice"] = json!({"type": "function", "function": {"name": "nope"}})),
            "\"nope\", which is not among tools",
        ),
        (with(&|b| b["tool_choice"] = json!("sometimes")), "tool_choice must be"),
        (
            with(&|b| {
                b.as_object_mut().unwrap().remove("tools");
                b["tool_choice"] = json!("required");
            }),
            "no tools are given",
        ),
        (
            with(&|b| {
                b["messages"][3]
                    .as_object_mut()
                    .unwrap()
                    .remove("tool_call_id")
                    .map(drop)
                    .unwrap()
            }),
            "needs tool_call_id",
        ),
        (
            with(&|b| b["messages"][4]["tool_call_id"] = json!("call_9")),
            "did not make",
        ),
        (
            with(&|b| b["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!("{not json")),
            "not a JSON object string",
        ),
        (
            with(&|b| {
                b["messages"][2]["tool_calls"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("id")
                    .map(drop)
                    .unwrap()
            }),
            "tool_calls[0].id is missing",
        ),
        (
            with(&|b| b["messages"][1]["tool_calls"] = b["messages"][2]["tool_calls"].clone()),
            "only assistant messages carry tool_calls",
        ),
        (with(&|b| b["functions"] = json!([{"name": "f"}])), "use tools"),
    ];
    for (body, needle) in &cases {
        refused(&srv, CHAT, body, needle);
    }
    // A tool message with nothing before it to answer.
    let body = json!({"messages": [{"role": "tool", "tool_call_id": "x", "content": "1"}], "max_tokens": 2});
    refused(&srv, CHAT, &body, "must follow an assistant message with tool calls");
}

#[test]
fn bad_anthropic_tool_requests_are_400s() {
    let srv = server(|_| {});
    let base = anthropic_body(&case("round_trip"));
    let with = |f: &dyn Fn(&mut Value)| {
        let mut b = base.clone();
        f(&mut b);
        b
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            with(&|b| b["tools"][0].as_object_mut().unwrap().remove("name").map(drop).unwrap()),
            "tools.0.name is missing",
        ),
        (
            with(&|b| {
                b["tools"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("input_schema")
                    .map(drop)
                    .unwrap()
            }),
            "tools.0.input_schema is missing",
        ),
        (
            with(&|b| b["tools"][1]["input_schema"] = json!([1])),
            "input_schema must be a JSON schema object",
        ),
        (
            with(&|b| b["tools"][0]["type"] = json!("web_search_20250305")),
            "only custom tools",
        ),
        (
            with(&|b| b["tool_choice"] = json!({"type": "tool", "name": "nope"})),
            "\"nope\", which is not among tools",
        ),
        (
            with(&|b| b["tool_choice"] = json!({"type": "whatever"})),
            "tool_choice must be",
        ),
        (
            with(&|b| {
                b["messages"][2]["content"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("tool_use_id")
                    .map(drop)
                    .unwrap()
            }),
            "needs tool_use_id",
        ),
        (
            with(&|b| b["messages"][2]["content"][1]["tool_use_id"] = json!("toolu_9")),
            "did not make",
        ),
        (
            with(&|b| b["messages"][1]["content"][0]["input"] = json!("city=Paris")),
            "input must be an object",
        ),
        (
            with(&|b| {
                b["messages"][1]["content"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("id")
                    .map(drop)
                    .unwrap()
            }),
            "needs an id",
        ),
        (
            with(&|b| {
                b["messages"][0]["content"] = json!([{"type": "tool_use", "id": "t", "name": "search", "input": {}}])
            }),
            "cannot be in a user message",
        ),
        (
            with(&|b| {
                b["messages"][2]["content"]
                    .as_array_mut()
                    .unwrap()
                    .insert(0, json!({"type": "text", "text": "hi"}))
            }),
            "must come before any text",
        ),
    ];
    for (body, needle) in &cases {
        refused(&srv, MESSAGES, body, needle);
    }
}

#[test]
fn a_template_without_tools_gets_them_in_the_generic_shape() {
    // The fixture's model and tokenizer, with a plain ChatML template that
    // knows no tools (as the demo model's).
    let dir = fixture_with_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    );
    let (engine, info) = engine();
    let path = dir.path().to_path_buf();
    let srv = server_with(engine, &info, |c| {
        c.model_dir = path.clone();
        c.prefix_cache_bytes = Some(0);
    });
    let codec = TextCodec::load(&path).unwrap();
    assert_eq!(
        codec.template().map(|t| ToolSyntax::for_template(t.source())),
        Some(ToolSyntax::Generic)
    );

    // The round trip reaches the template as charm's generic conversation:
    // tools in the system message, calls and results as text.
    let c = case("round_trip");
    let want = |with_tools: bool| {
        let rendered: Vec<Value> = if with_tools {
            c["tools"].as_array().unwrap().clone()
        } else {
            Vec::new()
        };
        let msgs = tools::generic_conversation(template_messages(&c), &rendered);
        codec.encode_chat(&msgs, true, &[]).unwrap().len() as u64
    };
    let mut openai = openai_body(&c);
    openai.as_object_mut().unwrap().remove("model");
    let mut anthropic = anthropic_body(&c);
    anthropic.as_object_mut().unwrap().remove("model");
    let r = post(srv.addr(), CHAT, &openai);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["prompt_tokens"], want(true));
    let r = post(srv.addr(), MESSAGES, &anthropic);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(anthropic_prompt_tokens(&r.json()["usage"]), want(true));
    // Without tools, the history's calls and results are still shown.
    openai.as_object_mut().unwrap().remove("tools");
    let r = post(srv.addr(), CHAT, &openai);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["prompt_tokens"], want(false));
    // A forced call is held to the tool's schema here too.
    let pick = json!([{"type": "function", "function": {"name": "pick", "parameters": {"type": "object",
        "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"], "additionalProperties": false}}}]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": pick, "max_tokens": 40,
                      "temperature": 0, "tool_choice": "required"});
    let v = post(srv.addr(), CHAT, &body).json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "pick");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args == json!({"color": "red"}) || args == json!({"color": "green"}),
        "{args}"
    );
    // tool_choice none turns tools off: a plain chat.
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": c["tools"],
                      "tool_choice": "none", "max_tokens": 2});
    assert_eq!(post(srv.addr(), CHAT, &body).status, 200);
}

#[test]
fn deepseek_templates_get_deepseek_calls() {
    // The fixture's random model behind DeepSeek-V3's real tokenizer and
    // chat template (its vocabulary fits in the model's 151,936 logits).
    let dir = tempfile::tempdir().unwrap();
    let fixture = chat_fixture();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::os::unix::fs::symlink(fixture.join(f), dir.path().join(f)).unwrap();
    }
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        let src = repo().join("tests/material/deepseek_v3").join(f);
        assert!(src.exists(), "{}: run scripts/fetch_test_material.sh", src.display());
        std::os::unix::fs::symlink(src, dir.path().join(f)).unwrap();
    }
    let (engine, info) = engine();
    let path = dir.path().to_path_buf();
    let srv = server_with(engine, &info, |c| {
        c.model_dir = path.clone();
        c.prefix_cache_bytes = Some(0);
    });
    let codec = TextCodec::load(&path).unwrap();
    assert_eq!(
        ToolSyntax::detect(codec.template().unwrap().source()),
        Some(ToolSyntax::DeepSeek)
    );
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}}, "required": ["city"],
                       "additionalProperties": false}}}]);
    let msgs = vec![
        Message::new("user", "Weather in Paris?"),
        Message::assistant_calls(
            "",
            vec![
                json!({"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}),
            ],
        ),
        Message::tool_result("c1", "18 C"),
        Message::new("user", "And in Lima?"),
    ];
    // The template writes the earlier call and its result in DeepSeek's tokens.
    let conv = tools::deepseek_conversation(msgs.clone(), tools.as_array().unwrap());
    let text = codec.render_chat(&conv, true, &[]).unwrap();
    assert!(
        text.contains("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"),
        "{text}"
    );
    assert!(
        text.contains("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18 C<｜tool▁output▁end｜>"),
        "{text}"
    );
    assert!(text.contains("## Tools"), "the tools are shown: {text}");

    // A forced call through the API: DeepSeek's prefill, the call parsed back.
    let body = json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
            {"role": "user", "content": "And in Lima?"}],
        "tools": tools, "tool_choice": "required", "max_tokens": 40, "temperature": 0});
    let r = post(srv.addr(), CHAT, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let prefill = ToolSyntax::DeepSeek.prefill(None);
    let want_prompt = codec.encode_chat_prefilled(&conv, true, &[], &prefill).unwrap().len();
    assert_eq!(v["usage"]["prompt_tokens"], want_prompt);
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args == json!({"city": "Paris"}) || args == json!({"city": "Lima"}),
        "{args}"
    );
}

/// GLM-4.6's released template (`scripts/fetch_test_material.sh`): calls
/// as `<tool_call>NAME` + `<arg_key>` / `<arg_value>` pairs, held to each
/// tool's schema when forced, whole or streamed; earlier calls rendered
/// back in that syntax.
#[test]
fn glm_templates_get_glm_calls_held_to_the_schema() {
    let glm = repo().join("tests/material/templates/GLM-4.6.jinja");
    let glm = std::fs::read_to_string(&glm)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/fetch_test_material.sh", glm.display()));
    let dir = fixture_with_template(&glm);
    let (engine, info) = engine();
    let path = dir.path().to_path_buf();
    let srv = server_with(engine, &info, |c| c.model_dir = path.clone());
    let codec = TextCodec::load(&path).unwrap();
    assert_eq!(
        ToolSyntax::detect(codec.template().unwrap().source()),
        Some(ToolSyntax::Glm)
    );
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 3},
            "note": {"type": "string", "maxLength": 8}}, "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
            "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
    ]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                          "tool_choice": choice, "max_tokens": 200, "temperature": 0});
        let v = post(srv.addr(), CHAT, &body).json();
        // (The Qwen tokenizer has no tokens for GLM's tags: the random
        // model spells them in small pieces, hence the token budget.)
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{choice}: {v}");
        let f = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
        match f["name"].as_str().unwrap() {
            "get_weather" => {
                assert!(["Paris", "Lima"].contains(&args["city"].as_str().unwrap()), "{args}");
                assert!((1..=3).contains(&args["days"].as_i64().unwrap()), "{args}");
                assert!(
                    args.get("note")
                        .is_none_or(|n| n.as_str().is_some_and(|s| s.chars().count() <= 8)),
                    "{args}"
                );
            }
            "get_time" => assert!(["UTC", "CET"].contains(&args["zone"].as_str().unwrap()), "{args}"),
            other => panic!("{other}"),
        }
        // Streamed: the same call.
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let events = SseStream::post(srv.addr(), CHAT, &sbody).collect();
        let streamed: String = events[..events.len() - 1]
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .map(String::from)
            })
            .collect();
        assert_eq!(serde_json::from_str::<Value>(&streamed).unwrap(), args);
    }
    // An earlier call goes back through the template in GLM's syntax.
    let msgs = vec![
        Message::new("user", "Weather?"),
        Message::assistant_calls(
            "",
            vec![json!({"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Lima", "days": 2}}})],
        ),
        Message::tool_result("c1", "18 C"),
    ];
    let text = codec.render_chat(&msgs, true, &[]).unwrap();
    assert!(
        text.contains("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lima</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"),
        "{text}"
    );
}
