//! Thinking switches and earlier reasoning reach the real Qwen3 template
//! (the qwen3moe-chat fixture) as transformers' `apply_chat_template`
//! takes them: `enable_thinking` from OpenAI's `chat_template_kwargs` and
//! `reasoning_effort`, from Anthropic's `thinking`; an earlier assistant
//! turn's `reasoning_content` / `thinking` block as the message's
//! `reasoning_content`. Splitting the model's own `<think>` output is
//! tested in `coordinator/src/server/{reasoning,answer,openai,anthropic}.rs`.

mod api_support;

use api_support::*;
use charm_coordinator::chat_template::Message;
use charm_coordinator::server::{Server, ServerConfig};
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

fn prompt_ids(messages: &[Message], thinking: Option<bool>) -> usize {
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let extra: Vec<(&str, minijinja::Value)> = thinking
        .map(|t| vec![("enable_thinking", minijinja::Value::from(t))])
        .unwrap_or_default();
    codec.encode_chat(messages, true, &extra).unwrap().len()
}

fn prompt_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens"]
        .as_u64()
        .or_else(|| v["usage"]["input_tokens"].as_u64())
        .unwrap_or_else(|| panic!("no usage: {v}"))
}

#[test]
fn thinking_switches_reach_the_template() {
    let srv = server(|c| c.prefix_cache_bytes = Some(0));
    let msgs = [Message::new("user", "hi")];
    let on = prompt_ids(&msgs, None);
    let off = prompt_ids(&msgs, Some(false));
    assert!(
        off > on,
        "Qwen3's template closes an empty think block when thinking is off"
    );
    let chat = |extra: Value| {
        let mut b = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = post(srv.addr(), "/v1/chat/completions", &b);
        assert_eq!(r.status, 200, "{extra}: {}", r.text());
        prompt_tokens(&r.json())
    };
    assert_eq!(chat(json!({})), on as u64);
    assert_eq!(
        chat(json!({"chat_template_kwargs": {"enable_thinking": false}})),
        off as u64
    );
    assert_eq!(chat(json!({"reasoning_effort": "none"})), off as u64);
    assert_eq!(chat(json!({"reasoning_effort": "high"})), on as u64);
    assert_eq!(chat(json!({"reasoning_effort": "xhigh"})), on as u64);
    let msgs_api = |thinking: Value| {
        let b = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1, "thinking": thinking});
        let r = post(srv.addr(), "/v1/messages", &b);
        assert_eq!(r.status, 200, "{}", r.text());
        prompt_tokens(&r.json())
    };
    assert_eq!(msgs_api(json!({"type": "disabled"})), off as u64);
    assert_eq!(msgs_api(json!({"type": "enabled"})), on as u64);
    assert_eq!(msgs_api(json!({"type": "adaptive"})), on as u64);

    for (path, extra, param) in [
        (
            "/v1/chat/completions",
            json!({"chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs",
        ),
        (
            "/v1/chat/completions",
            json!({"chat_template_kwargs": 3}),
            "chat_template_kwargs",
        ),
        (
            "/v1/chat/completions",
            json!({"reasoning_effort": "max"}),
            "reasoning_effort",
        ),
        ("/v1/messages", json!({"thinking": {"type": "sometimes"}}), "thinking"),
    ] {
        let mut b = json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = post(srv.addr(), path, &b);
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        if path.ends_with("completions") {
            assert_eq!(r.json()["error"]["param"], param);
        }
    }
}

#[test]
fn earlier_reasoning_reaches_the_template() {
    let srv = server(|c| c.prefix_cache_bytes = Some(0));
    let mut reasoned = Message::new("assistant", "Paris.");
    reasoned.reasoning_content = Some("The capital of France.".into());
    // The reasoning of the turn after the last user message is shown.
    let with = [Message::new("user", "Capital of France?"), reasoned];
    let without = [
        Message::new("user", "Capital of France?"),
        Message::new("assistant", "Paris."),
    ];
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let want = codec.encode_chat(&with, false, &[]).unwrap().len();
    assert_ne!(
        want,
        codec.encode_chat(&without, false, &[]).unwrap().len(),
        "the template shows the reasoning"
    );
    // An assistant turn last: the answer continues it (no generation prompt
    // is what transformers renders for a continued turn; the server always
    // adds one, so compare with it).
    let want = codec.encode_chat(&with, true, &[]).unwrap().len() as u64;
    let openai = json!({"model": "qwen3moe-chat", "max_tokens": 1, "messages": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital of France."}]});
    let r = post(srv.addr(), "/v1/chat/completions", &openai);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(prompt_tokens(&r.json()), want);
    let anthropic = json!({"model": "qwen3moe-chat", "max_tokens": 1, "messages": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The capital of France.", "signature": "x"},
            {"type": "text", "text": "Paris."}]}]});
    let r = post(srv.addr(), "/v1/messages", &anthropic);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(prompt_tokens(&r.json()), want);
}

/// The chat fixture served with Qwen3.5's template (which opens the
/// `<think>` block in the prompt) and `--reasoning-budget`.
fn qwen35_server(reasoning_budget: Option<usize>) -> Server {
    let (engine, info) = engine();
    let mut config = ServerConfig::new(&chat_fixture());
    config.chat_template = Some(repo().join("tests/material/templates/Qwen3.5-4B.jinja"));
    config.reasoning_budget = reasoning_budget;
    Server::start(engine, &info, config).unwrap()
}

/// A greedy chat answer of 24 tokens (end-of-sequence ignored) with its
/// `thinking_token_budget`: the message and each token's text.
fn budgeted_chat(srv: &Server, user: &Value, budget: Option<u64>) -> (Value, Vec<String>) {
    let mut b = json!({"messages": user, "max_tokens": 24, "temperature": 0, "ignore_eos": true,
                       "logprobs": true});
    if let Some(n) = budget {
        b["thinking_token_budget"] = json!(n);
    }
    let r = post(srv.addr(), "/v1/chat/completions", &b);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let tokens: Vec<String> = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(v["usage"]["completion_tokens"], 24, "{v}");
    assert_eq!(tokens.len(), 24, "{v}");
    (v["choices"][0]["message"].clone(), tokens)
}

/// A reasoning budget: the first `budget` tokens of the reasoning are the
/// uncapped answer's, then the server writes the end of the reasoning
/// (`\n</think>\n\n`) and the model answers after it. Qwen3.5's template
/// opens the block in the prompt, so the reasoning starts at once.
#[test]
fn a_thinking_budget_closes_the_reasoning_and_the_answer_follows() {
    let srv = qwen35_server(None);
    let user = json!([{"role": "user", "content": "Why is the sky blue?"}]);
    let chat = |budget: Option<u64>| budgeted_chat(&srv, &user, budget);
    let (free, free_tokens) = chat(None);
    assert!(
        !free_tokens.iter().any(|t| t == "</think>"),
        "the random model does not close its reasoning by itself: {free}"
    );
    assert_eq!(free["content"], "", "all reasoning: {free}");
    for budget in [0usize, 1, 8] {
        let (capped, tokens) = chat(Some(budget as u64));
        assert_eq!(tokens[..budget], free_tokens[..budget], "budget {budget}");
        assert_eq!(
            tokens[budget..budget + 3],
            ["\n", "</think>", "\n\n"],
            "budget {budget}"
        );
        let reasoning = free_tokens[..budget].concat();
        assert_eq!(
            capped["reasoning_content"].as_str().unwrap_or(""),
            reasoning.trim(),
            "budget {budget}: {capped}"
        );
        let answer = tokens[budget + 3..].concat();
        assert!(!answer.trim().is_empty(), "budget {budget}: {capped}");
        assert_eq!(capped["content"], answer.trim_start(), "budget {budget}: {capped}");
    }

    // Anthropic's `budget_tokens`: a thinking block of the same reasoning,
    // then the answer's text.
    let body = json!({"messages": user, "max_tokens": 24, "temperature": 0,
                      "thinking": {"type": "enabled", "budget_tokens": 8}});
    let r = post(srv.addr(), "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["content"][0]["type"], "thinking", "{v}");
    assert_eq!(v["content"][0]["thinking"], free_tokens[..8].concat().trim(), "{v}");
    assert_eq!(v["content"][1]["type"], "text", "{v}");

    // The Responses API's `thinking_token_budget`: a reasoning item of the
    // same reasoning, then the message.
    let body = json!({"input": "Why is the sky blue?", "max_output_tokens": 24, "temperature": 0,
                      "thinking_token_budget": 8});
    let r = post(srv.addr(), "/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["output"][0]["type"], "reasoning", "{v}");
    assert_eq!(
        v["output"][0]["content"][0]["text"],
        free_tokens[..8].concat().trim(),
        "{v}"
    );
    assert_eq!(v["output"][1]["type"], "message", "{v}");

    // A schema with a template that opens the reasoning: the model
    // reasons first (here until its budget), then answers in the schema;
    // the JSON is the content, not the reasoning.
    let schema = json!({"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}},
                        "required": ["verdict"], "additionalProperties": false});
    let body = json!({"messages": user, "max_tokens": 40, "temperature": 0, "thinking_token_budget": 4,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}});
    let r = post(srv.addr(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let message = &v["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], free_tokens[..4].concat().trim(), "{v}");
    let answer: Value = serde_json::from_str(message["content"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("the content is the schema's JSON: {e}: {v}"));
    assert!(["yes", "no"].contains(&answer["verdict"].as_str().unwrap()), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");

    // The server's `--reasoning-budget` caps requests that set none.
    let capped_srv = qwen35_server(Some(4));
    for (budget, want) in [(None, 4usize), (Some(8u64), 8)] {
        let (v, tokens) = budgeted_chat(&capped_srv, &user, budget);
        assert_eq!(tokens[..want], free_tokens[..want], "{budget:?}");
        assert_eq!(tokens[want + 1], "</think>", "{budget:?}: {v}");
    }
    drop(capped_srv);

    // Bad budgets are refused, naming the field.
    for (path, extra, param) in [
        ("/v1/chat/completions", json!({"thinking_token_budget": -1}), None),
        ("/v1/chat/completions", json!({"thinking_token_budget": "many"}), None),
        (
            "/v1/messages",
            json!({"thinking": {"type": "enabled", "budget_tokens": -5}}),
            Some("thinking"),
        ),
        (
            "/v1/messages",
            json!({"thinking": {"type": "enabled", "budget_tokens": 24}}),
            Some("max_tokens"),
        ),
    ] {
        let mut b = json!({"messages": user, "max_tokens": 24});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = post(srv.addr(), path, &b);
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        let text = r.text();
        assert!(
            text.contains("thinking_token_budget") || text.contains("budget_tokens"),
            "{extra}: {text}"
        );
        if let Some(p) = param {
            assert!(text.contains(p), "{extra}: {text}");
        }
    }
}
