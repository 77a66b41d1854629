//! The HTTP API contract against a real server on 127.0.0.1 (in-process,
//! port 0) serving the qwen3moe-chat fixture: both APIs streaming and not,
//! stop strings cut exactly, usage equal to the real token counts, errors
//! in each API's shape (400/401/404/405/413/429), disconnects cancel,
//! concurrent requests get exactly what they get alone, metrics and the
//! dashboard's data follow the work.

mod api_support;

use std::time::{Duration, Instant};

use api_support::*;
use charm_coordinator::chat_template::Message;
use charm_coordinator::server::{ServeError, Server, ServerConfig};
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn user(text: &str) -> Vec<Message> {
    vec![Message::new("user", text)]
}

fn chat_body(text: &str, max_tokens: usize) -> Value {
    json!({"model": "qwen3moe-chat", "messages": [{"role": "user", "content": text}],
           "max_tokens": max_tokens, "temperature": 0})
}

/// Concatenated `delta.content` of OpenAI chunks, and the chunks.
fn openai_stream(events: &[SseEvent]) -> (String, Vec<Value>) {
    assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"), "{events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| {
            assert!(e.event.is_none(), "OpenAI streams have no event names");
            serde_json::from_str(&e.data).unwrap()
        })
        .collect();
    let text = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap().clone())
        .filter_map(|c| c["delta"]["content"].as_str().map(str::to_string))
        .collect();
    (text, chunks)
}

#[test]
fn openai_chat_non_streaming_is_the_engines_greedy_answer() {
    let srv = server(|_| {});
    let (prompt, ids, text) = solo_chat(&user("Hello there"), 12);
    let r = post(srv.addr(), CHAT, &chat_body("Hello there", 12));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "qwen3moe-chat");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], text.as_str());
    assert_eq!(choice["finish_reason"], if ids.len() == 12 { "length" } else { "stop" });
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], ids.len());
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + ids.len());
}

#[test]
fn openai_chat_stream_has_role_content_finish_usage_and_done() {
    let srv = server(|_| {});
    let (prompt, ids, text) = solo_chat(&user("Stream me"), 16);
    let mut body = chat_body("Stream me", 16);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let s = SseStream::post(srv.addr(), CHAT, &body);
    assert_eq!(s.status, 200);
    assert!(s
        .headers
        .iter()
        .any(|(k, v)| k == "content-type" && v == "text/event-stream"));
    let (streamed, chunks) = openai_stream(&s.collect());
    assert_eq!(streamed, text);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"], "one id per stream");
    }
    // The finish chunk, then the usage chunk with no choices.
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    assert!(chunks[n - 2]["usage"].is_null());
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], ids.len());
    for c in &chunks[..n - 2] {
        assert!(c["choices"][0]["finish_reason"].is_null());
    }
}

#[test]
fn openai_completions_take_text_or_ids_and_default_to_16_tokens() {
    let srv = server(|_| {});
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let (engine, _) = engine();
    let prompt = codec.encode("The quick brown fox").unwrap();
    let params = charm_coordinator::GenerateParams {
        max_tokens: 16,
        sampling: Default::default(),
        ignore_eos: false,
    };
    let gen = engine
        .generate(&mut engine.session(), &prompt, &params, |_| true)
        .unwrap();
    let expect = codec.decode(&gen.ids, true).unwrap();
    for p in [json!("The quick brown fox"), json!(prompt), json!([prompt])] {
        let r = post(
            srv.addr(),
            "/v1/completions",
            &json!({"model": "qwen3moe-chat", "prompt": p, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], expect.as_str());
        assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
        assert_eq!(v["usage"]["completion_tokens"], gen.ids.len());
    }
    let mut body = json!({"prompt": "The quick brown fox", "temperature": 0, "stream": true});
    let events = SseStream::post(srv.addr(), "/v1/completions", &body).collect();
    let (_, chunks) = openai_stream(&events);
    let streamed: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, expect);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    body["prompt"] = json!([prompt.clone(), prompt]);
    assert_eq!(
        post(srv.addr(), "/v1/completions", &body).status,
        400,
        "one prompt only"
    );
}

/// Greedy output long enough to hold a stop string, with the pieces each
/// token released (as the server's streaming decoder sees them).
fn pieces(ids: &[u32]) -> Vec<String> {
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let mut dec = codec.stream();
    let mut out: Vec<String> = ids
        .iter()
        .map(|&id| dec.push(id).unwrap().unwrap_or_default())
        .collect();
    if let Some(rest) = dec.finish().unwrap() {
        out.last_mut().unwrap().push_str(&rest);
    }
    out
}

/// A stop string that starts in one token's text and ends inside the next
/// one's, its expected cut, and the tokens generated until it completed.
fn spanning_stop(ids: &[u32]) -> (String, String, usize) {
    let p = pieces(ids);
    for i in 4..p.len() {
        let (a, b) = (&p[i - 1], &p[i]);
        if a.is_empty() || b.chars().count() < 2 {
            continue;
        }
        let stop: String = a.chars().last().into_iter().chain(b.chars().take(1)).collect();
        let full: String = p.concat();
        let cut = full.find(&stop).unwrap();
        // Tokens until the stop string first appears in the released text.
        let mut seen = String::new();
        let n = p
            .iter()
            .position(|x| {
                seen.push_str(x);
                seen.contains(&stop)
            })
            .unwrap()
            + 1;
        return (stop, full[..cut].to_string(), n);
    }
    panic!("no token boundary to put a stop string across in {p:?}");
}

#[test]
fn stop_strings_cut_exactly_before_the_match_in_every_mode() {
    let srv = server(|_| {});
    let msgs = user("Tell me a long story");
    let (_, ids, text) = solo_chat(&msgs, 40);
    let (stop, expect, n_tokens) = spanning_stop(&ids);
    assert!(text.contains(&stop) && expect.len() < text.len());
    eprintln!("stop {stop:?}: expect {expect:?} after {n_tokens} tokens");

    let mut body = chat_body("Tell me a long story", 40);
    body["stop"] = json!([stop.clone(), "never-appears-zq"]);
    let v = post(srv.addr(), CHAT, &body).json();
    assert_eq!(v["choices"][0]["message"]["content"], expect.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], n_tokens, "generation ends at the stop");

    body["stop"] = json!(stop.clone());
    body["stream"] = json!(true);
    let (streamed, chunks) = openai_stream(&SseStream::post(srv.addr(), CHAT, &body).collect());
    assert_eq!(streamed, expect, "nothing after the stop string is streamed");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");

    let a = json!({"model": "qwen3moe-chat", "max_tokens": 40, "temperature": 0,
                   "messages": [{"role": "user", "content": "Tell me a long story"}],
                   "stop_sequences": [stop.clone()]});
    let v = post(srv.addr(), "/v1/messages", &a).json();
    assert_eq!(v["content"][0]["text"], expect.as_str());
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], stop.as_str());
    assert_eq!(v["usage"]["output_tokens"], n_tokens);
}

#[test]
fn anthropic_messages_whole_and_streamed() {
    let srv = server(|_| {});
    let msgs = vec![Message::new("system", "Be brief."), Message::new("user", "Hi")];
    let (prompt, ids, text) = solo_chat(&msgs, 10);
    let body = json!({"model": "qwen3moe-chat", "max_tokens": 10, "temperature": 0, "system": "Be brief.",
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]});
    let v = post(srv.addr(), "/v1/messages", &body).json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["content"], json!([{"type": "text", "text": text}]));
    assert_eq!(
        v["stop_reason"],
        if ids.len() == 10 { "max_tokens" } else { "end_turn" }
    );
    assert_eq!(v["usage"]["input_tokens"], prompt.len());
    assert_eq!(v["usage"]["output_tokens"], ids.len());

    let mut body = body;
    body["stream"] = json!(true);
    let events = SseStream::post(srv.addr(), "/v1/messages", &body).collect();
    let names: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap()).collect();
    let deltas = names.iter().filter(|n| **n == "content_block_delta").count();
    assert!(deltas >= 1);
    let mut expect = vec!["message_start", "content_block_start"];
    expect.extend(std::iter::repeat_n("content_block_delta", deltas));
    expect.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expect);
    let data: Vec<Value> = events.iter().map(|e| serde_json::from_str(&e.data).unwrap()).collect();
    for (d, n) in data.iter().zip(&names) {
        assert_eq!(d["type"], *n, "each event's data names its type");
    }
    assert_eq!(data[0]["message"]["usage"]["input_tokens"], prompt.len());
    let streamed: String = data
        .iter()
        .filter(|d| d["type"] == "content_block_delta")
        .map(|d| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, text);
    let md = &data[data.len() - 2];
    assert_eq!(md["delta"]["stop_reason"], v["stop_reason"]);
    assert_eq!(md["usage"]["output_tokens"], ids.len());
}

#[test]
fn anthropic_count_tokens_counts_the_prompt_messages_would_run() {
    let srv = server(|_| {});
    let tool = json!({"name": "get_weather", "description": "Weather of a city",
                      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let body = json!({"model": "qwen3moe-chat", "system": "Be brief.", "tools": [tool],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]});
    let counted = post(srv.addr(), "/v1/messages/count_tokens", &body);
    assert_eq!(counted.status, 200, "{}", counted.text());
    assert_eq!(counted.header("content-type"), Some("application/json"));
    let n = counted.json()["input_tokens"].as_u64().unwrap();
    let mut run = body.clone();
    run["max_tokens"] = json!(1);
    let v = post(srv.addr(), "/v1/messages", &run).json();
    assert_eq!(v["usage"]["input_tokens"], n, "{v}");
    // Without the tool and its turns the prompt is shorter.
    let plain = json!({"system": "Be brief.", "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let fewer = post(srv.addr(), "/v1/messages/count_tokens", &plain).json()["input_tokens"]
        .as_u64()
        .unwrap();
    assert!(fewer < n, "{fewer} vs {n}");
    // Errors in the Messages API's shape; /v1/messages still needs max_tokens.
    for (path, body, status) in [
        (
            "/v1/messages/count_tokens",
            json!({"model": "other", "messages": plain["messages"]}),
            404,
        ),
        ("/v1/messages/count_tokens", json!({"messages": []}), 400),
        ("/v1/messages", plain.clone(), 400),
    ] {
        let r = post(srv.addr(), path, &body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
        assert_eq!(r.json()["type"], "error");
    }
    let missing = post(srv.addr(), "/v1/messages", &plain).json();
    assert!(missing["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens is required"));
}

/// `/tokenize` and `/detokenize` in llama-server's and vLLM's shapes: text
/// with and without special tokens, a chat counted as the chat route runs
/// it, pieces, the round trip, and bad requests as 400 / 404.
#[test]
fn tokenize_and_detokenize_answer_as_llama_server_and_vllm_do() {
    let srv = server(|_| {});
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let text = "Hello there, tokenizer! 123 ünïcode";
    let plain = codec.encode_plain(text).unwrap();
    let special = codec.encode(text).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    // llama-server: `content`, special tokens only when asked.
    let r = post(srv.addr(), "/tokenize", &json!({"content": text}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(ids(&v), plain);
    assert_eq!(v["count"], plain.len());
    assert_eq!(v["max_model_len"], 512, "the fixture's context");
    let v = post(srv.addr(), "/tokenize", &json!({"content": text, "add_special": true})).json();
    assert_eq!(ids(&v), special);
    // vLLM: `prompt`, special tokens unless turned off.
    let v = post(
        srv.addr(),
        "/tokenize",
        &json!({"model": "qwen3moe-chat", "prompt": text}),
    )
    .json();
    assert_eq!(ids(&v), special);
    let v = post(
        srv.addr(),
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    )
    .json();
    assert_eq!(ids(&v), plain);
    // Pieces are each token's bytes: its text where that is whole UTF-8,
    // else the byte values (a rare character is split across byte-level
    // tokens), and they join to the text.
    let rare = format!("{text} \u{1F9A9}\u{13000}");
    let rare_ids = codec.encode_plain(&rare).unwrap();
    let v = post(srv.addr(), "/tokenize", &json!({"content": rare, "with_pieces": true})).json();
    let pieces = v["tokens"].as_array().unwrap();
    assert_eq!(pieces.len(), rare_ids.len());
    let mut joined = Vec::new();
    let mut split = 0;
    for (p, &id) in pieces.iter().zip(&rare_ids) {
        assert_eq!(p["id"], id);
        match &p["piece"] {
            Value::String(s) => {
                assert_eq!(s, &codec.decode(&[id], false).unwrap());
                joined.extend_from_slice(s.as_bytes());
            }
            Value::Array(bytes) => {
                split += 1;
                joined.extend(bytes.iter().map(|b| b.as_u64().unwrap() as u8));
            }
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(joined, rare.as_bytes());
    assert!(split >= 2, "the rare characters' tokens hold parts of them: {pieces:?}");
    // A chat counts the prompt /v1/chat/completions runs.
    let chat = json!({"messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Weather in Paris?"}]});
    let v = post(srv.addr(), "/tokenize", &chat).json();
    let mut run = chat.clone();
    run["max_tokens"] = json!(1);
    let ran = post(srv.addr(), CHAT, &run).json();
    assert_eq!(v["count"], ran["usage"]["prompt_tokens"], "{v} {ran}");
    // Back to text, in both shapes.
    let r = post(srv.addr(), "/detokenize", &json!({"tokens": plain}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["content"], text);
    assert_eq!(v["prompt"], text);
    for (path, body, status) in [
        ("/tokenize", json!({}), 400),
        ("/tokenize", json!({"content": "a", "prompt": "b"}), 400),
        ("/tokenize", json!({"content": 5}), 400),
        ("/tokenize", json!({"content": "a", "model": "other"}), 404),
        ("/tokenize", json!({"messages": []}), 400),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "hi"}], "with_pieces": "yes"}),
            400,
        ),
        ("/detokenize", json!({"tokens": [1, 999_999_999]}), 400),
        ("/detokenize", json!({"tokens": "1 2"}), 400),
        ("/detokenize", json!({}), 400),
    ] {
        let r = post(srv.addr(), path, &body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
        assert!(r.json()["error"]["message"].is_string(), "{path} {body}: {}", r.text());
    }
}

#[test]
fn logprobs_leave_the_text_unchanged_and_are_well_formed() {
    let srv = server(|_| {});
    let mut body = chat_body("Numbers please", 12);
    let plain = post(srv.addr(), CHAT, &body).json();
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let v = post(srv.addr(), CHAT, &body).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text, plain["choices"][0]["message"]["content"].as_str().unwrap());
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        v["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), lp);
        assert_eq!(top[0]["token"], t["token"]);
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        assert_eq!(t["bytes"], json!(t["token"].as_str().unwrap().as_bytes()));
    }
    let r = post(
        srv.addr(),
        "/v1/completions",
        &json!({"prompt": "abc", "max_tokens": 5, "temperature": 0, "logprobs": 2}),
    );
    let lp = &r.json()["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
    body["top_logprobs"] = json!(21);
    assert_eq!(post(srv.addr(), CHAT, &body).status, 400);
}

#[test]
fn concurrent_requests_get_exactly_what_they_get_alone() {
    let srv = server(|c| c.queue_size = 8);
    let addr = srv.addr();
    let bodies: Vec<Value> = (0..6)
        .map(|i| {
            let mut b = chat_body(&format!("Request number {i} says hello"), 20 + i);
            b["logprobs"] = json!(true);
            b["top_logprobs"] = json!(2);
            if i % 2 == 1 {
                // Seeded sampling is reproducible too.
                b["temperature"] = json!(0.9);
                b["seed"] = json!(1000 + i);
            }
            if i % 3 == 2 {
                b["stream"] = json!(true);
            }
            b
        })
        .collect();
    let answer = |b: &Value| -> (String, Value) {
        if b["stream"] == true {
            let (text, chunks) = openai_stream(&SseStream::post(addr, CHAT, b).collect());
            let lps: Vec<Value> = chunks
                .iter()
                .flat_map(|c| c["choices"].as_array().unwrap().clone())
                .flat_map(|c| c["logprobs"]["content"].as_array().cloned().unwrap_or_default())
                .collect();
            (text, json!(lps))
        } else {
            let v = post(addr, CHAT, b).json();
            let c = &v["choices"][0];
            (
                c["message"]["content"].as_str().unwrap().to_string(),
                c["logprobs"]["content"].clone(),
            )
        }
    };
    let solo: Vec<(String, Value)> = bodies.iter().map(answer).collect();
    let together: Vec<(String, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = bodies.iter().map(|b| s.spawn(move || answer(b))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a.0, b.0, "request {i}: text differs under concurrency");
        assert_eq!(a.1, b.1, "request {i}: tokens or logprobs differ under concurrency");
        assert!(!a.1.as_array().unwrap().is_empty());
    }
}

#[test]
fn errors_come_in_each_apis_shape() {
    let srv = server(|c| c.max_body_bytes = 4096);
    let addr = srv.addr();
    let openai_err = |r: &Resp, status: u16, ty: &str| {
        assert_eq!(r.status, status, "{}", r.text());
        let v = r.json();
        assert_eq!(v["error"]["type"], ty, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    };
    let anthropic_err = |r: &Resp, status: u16, ty: &str| {
        assert_eq!(r.status, status, "{}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], ty, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    };
    let raw = |path: &str, body: &[u8]| request(addr, "POST", path, &[("Content-Type", "application/json")], body);

    // Malformed JSON, wrong types, missing fields: 400.
    openai_err(&raw(CHAT, b"{not json"), 400, "invalid_request_error");
    openai_err(&raw(CHAT, br#"{"messages": "hi"}"#), 400, "invalid_request_error");
    let wizard = raw(CHAT, br#"{"messages": [{"role": "wizard", "content": "hi"}]}"#);
    openai_err(&wizard, 400, "invalid_request_error");
    let said = wizard.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(said.contains("role \"wizard\" is not one of"), "{said}");
    openai_err(
        &raw("/v1/completions", br#"{"prompt": [99999999]}"#),
        400,
        "invalid_request_error",
    );
    anthropic_err(&raw("/v1/messages", b"{not json"), 400, "invalid_request_error");
    anthropic_err(
        &raw("/v1/messages", br#"{"messages": [{"role": "user", "content": "hi"}]}"#),
        400,
        "invalid_request_error",
    );
    // A text part without its text is named as such, not as unsupported.
    let no_text = raw(
        CHAT,
        br#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#,
    );
    openai_err(&no_text, 400, "invalid_request_error");
    let said = no_text.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(said.contains("messages[0]") && said.contains("has no `text`"), "{said}");
    let no_text = raw(
        "/v1/messages",
        br#"{"max_tokens": 4, "system": [{"type": "text"}], "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    anthropic_err(&no_text, 400, "invalid_request_error");
    let said = no_text.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(said.contains("has no `text`"), "{said}");
    // A message without content: only an assistant turn (of calls) may.
    for body in [
        &br#"{"messages": [{"role": "user"}]}"#[..],
        br#"{"messages": [{"role": "user", "content": null}]}"#,
        br#"{"messages": [{"role": "system"}, {"role": "user", "content": "hi"}]}"#,
    ] {
        let r = raw(CHAT, body);
        openai_err(&r, 400, "invalid_request_error");
        let said = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(said.contains("has no content"), "{said}");
    }
    let r = raw(
        CHAT,
        br#"{"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null}, {"role": "user", "content": "and?"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Several candidates are refused, not silently dropped.
    let best_of = raw("/v1/completions", br#"{"prompt": "hi", "best_of": 3}"#);
    openai_err(&best_of, 400, "invalid_request_error");
    assert_eq!(best_of.json()["error"]["param"], "best_of");
    let mut b = chat_body("hi", 0);
    let zero = post(addr, CHAT, &b);
    openai_err(&zero, 400, "invalid_request_error");
    assert_eq!(zero.json()["error"]["param"], "max_tokens");
    let zero = raw(
        CHAT,
        br#"{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}"#,
    );
    openai_err(&zero, 400, "invalid_request_error");
    assert_eq!(zero.json()["error"]["param"], "max_completion_tokens");
    b["max_tokens"] = json!(4);
    b["temperature"] = json!(-1);
    openai_err(&post(addr, CHAT, &b), 400, "invalid_request_error");

    // Unknown model: 404; the full path is the same model.
    b["temperature"] = json!(0);
    b["model"] = json!("gpt-17");
    openai_err(&post(addr, CHAT, &b), 404, "invalid_request_error");
    b["model"] = json!(chat_fixture().canonicalize().unwrap().display().to_string());
    assert_eq!(post(addr, CHAT, &b).status, 200);
    let a = json!({"model": "claude-9", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    anthropic_err(&post(addr, "/v1/messages", &a), 404, "not_found_error");
    openai_err(&get(addr, "/v1/models/gpt-17"), 404, "invalid_request_error");

    // Over the body limit: 413, declared up front or streamed in chunks.
    let big = vec![b' '; 5000];
    openai_err(&raw(CHAT, &big), 413, "invalid_request_error");
    anthropic_err(&raw("/v1/messages", &big), 413, "request_too_large");
    let mut s = send_request(
        addr,
        "POST",
        CHAT,
        &[("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")],
        b"",
    );
    {
        use std::io::Write;
        for _ in 0..5 {
            let _ = s.write_all(b"400\r\n");
            let _ = s.write_all(&[b' '; 1024]);
            let _ = s.write_all(b"\r\n");
        }
        let _ = s.write_all(b"0\r\n\r\n");
    }
    openai_err(&read_response(s), 413, "invalid_request_error");

    // Unknown route and wrong method.
    openai_err(&get(addr, "/v1/nothing"), 404, "invalid_request_error");
    openai_err(&get(addr, CHAT), 405, "invalid_request_error");
    anthropic_err(&get(addr, "/v1/messages"), 405, "invalid_request_error");

    // The server is still fine.
    assert_eq!(post(addr, CHAT, &chat_body("still there?", 2)).status, 200);
}

#[test]
fn an_api_key_guards_every_data_route() {
    let srv = server(|c| c.api_key = Some("sekrit-key".into()));
    let addr = srv.addr();
    let body = chat_body("hi", 2).to_string();
    let post_with = |path: &str, h: &[(&str, &str)]| request(addr, "POST", path, h, body.as_bytes());

    let r = post_with(CHAT, &[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_eq!(post_with(CHAT, &[("Authorization", "Bearer wrong")]).status, 401);
    assert_eq!(post_with(CHAT, &[("Authorization", "Bearer sekrit-key")]).status, 200);
    assert_eq!(post_with(CHAT, &[("x-api-key", "sekrit-key")]).status, 200);

    let a = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let r = request(addr, "POST", "/v1/messages", &[], a.as_bytes());
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_eq!(r.json()["type"], "error");
    let r = request(
        addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sekrit-key")],
        a.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(addr, "POST", "/v1/messages/count_tokens", &[], a.as_bytes());
    assert_eq!(r.status, 401);

    for path in ["/v1/models", "/metrics", "/api/state", "/api/events"] {
        assert_eq!(get(addr, path).status, 401, "{path}");
    }
    let ok = request(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekrit-key")],
        b"",
    );
    assert_eq!(ok.status, 200);
    // The page and the health check carry no data and stay open.
    for path in ["/", "/assets/dashboard.js", "/health"] {
        assert_eq!(get(addr, path).status, 200, "{path}");
    }
}

#[test]
fn binding_beyond_loopback_needs_a_key() {
    let (engine, info) = engine();
    let mut cfg = ServerConfig::new(&chat_fixture());
    cfg.host = "0.0.0.0".into();
    match Server::start(engine, &info, cfg) {
        Err(e @ ServeError::KeyRequired { .. }) => assert!(e.to_string().contains("--api-key-file"), "{e}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("bound 0.0.0.0 without a key"),
    }
    let (engine, info) = api_support::engine();
    let mut cfg = ServerConfig::new(&chat_fixture());
    cfg.host = "localhost".into();
    let srv = Server::start(engine, &info, cfg).expect("localhost is loopback");
    assert!(srv.addr().ip().is_loopback());
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let (engine, info, gate) = gated_engine(false, Duration::ZERO);
    let srv = server_with(engine, &info, |c| c.queue_size = 1);
    let addr = srv.addr();
    // A runs (held at the gate), B waits in the queue: the queue is full.
    let a = std::thread::spawn(move || post(addr, CHAT, &chat_body("first", 3)));
    gate.wait_arrival();
    wait_health(addr, "A running", |h| h["running"] == 1);
    let b = std::thread::spawn(move || {
        post(
            addr,
            "/v1/messages",
            &json!({"max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": "second"}]}),
        )
    });
    wait_health(addr, "B queued", |h| h["queued"] == 1);

    let r = post(addr, CHAT, &chat_body("third", 3));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let retry: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!(retry >= 1);
    let r = post(
        addr,
        "/v1/messages",
        &json!({"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert!(r.header("retry-after").is_some());

    gate.open();
    assert_eq!(a.join().unwrap().status, 200);
    assert_eq!(b.join().unwrap().status, 200);
    assert_eq!(post(addr, CHAT, &chat_body("fourth", 3)).status, 200, "room again");
    let m = get(addr, "/metrics").text();
    assert!(
        m.contains("charm_http_requests_total{route=\"/v1/chat/completions\",code=\"429\"} 1\n"),
        "{m}"
    );
    assert!(
        m.contains("charm_http_requests_total{route=\"/v1/messages\",code=\"429\"} 1\n"),
        "{m}"
    );
}

#[test]
fn a_client_that_disconnects_cancels_its_generation() {
    // 5 ms per layer step: 400 tokens would take 4 s.
    let (engine, info, _gate) = gated_engine(true, Duration::from_millis(5));
    let srv = server_with(engine, &info, |_| {});
    let addr = srv.addr();

    // Streaming: read one chunk, hang up.
    let mut body = chat_body("go on forever", 400);
    body["stream"] = json!(true);
    let mut s = SseStream::post(addr, CHAT, &body);
    let first: Value = serde_json::from_str(&s.next_event().unwrap().data).unwrap();
    let id = first["id"].as_str().unwrap().to_string();
    s.disconnect();
    let t = Instant::now();
    let r = post(addr, CHAT, &chat_body("next", 2));
    assert_eq!(r.status, 200);
    let waited = t.elapsed();
    let rec = wait_record(addr, &id);
    assert_eq!(rec["finish"], "cancelled", "{rec}");
    assert!(rec["completion_tokens"].as_u64().unwrap() < 400, "{rec}");
    assert!(waited < Duration::from_secs(3), "the next request waited {waited:?}");

    // Non-streaming: the client gives up while the answer is being generated.
    let s = send_request(
        addr,
        "POST",
        CHAT,
        &[],
        chat_body("and again", 400).to_string().as_bytes(),
    );
    wait_health(addr, "generating", |h| h["running"] == 1);
    std::thread::sleep(Duration::from_millis(100));
    drop(s);
    wait_health(addr, "engine idle", |h| h["running"] == 0 && h["queued"] == 0);
    let state = get(addr, "/api/state").json();
    let last = state["recent"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["finish"], "cancelled", "{last}");
    assert!(last["completion_tokens"].as_u64().unwrap() < 400, "{last}");
    let m = get(addr, "/metrics").text();
    assert!(m.contains("charm_generations_total{finish=\"cancelled\"} 2\n"), "{m}");
}

#[test]
fn a_request_abandoned_in_the_queue_is_never_run() {
    let (engine, info, gate) = gated_engine(false, Duration::ZERO);
    let srv = server_with(engine, &info, |c| c.queue_size = 2);
    let addr = srv.addr();
    let a = std::thread::spawn(move || post(addr, CHAT, &chat_body("held", 2)));
    gate.wait_arrival();
    let s = send_request(
        addr,
        "POST",
        CHAT,
        &[],
        chat_body("abandoned", 50).to_string().as_bytes(),
    );
    wait_health(addr, "queued", |h| h["queued"] == 1);
    drop(s);
    std::thread::sleep(Duration::from_millis(50));
    gate.open();
    assert_eq!(a.join().unwrap().status, 200);
    wait_health(addr, "engine idle", |h| h["running"] == 0 && h["queued"] == 0);
    let recent = get(addr, "/api/state").json()["recent"].clone();
    let recent = recent.as_array().unwrap();
    assert_eq!(recent.len(), 2, "{recent:?}");
    // The abandoned job joins the batch beside the held one (and leaves at
    // once), so it may be recorded first.
    let abandoned = recent
        .iter()
        .find(|r| r["finish"] == "cancelled")
        .expect("a cancelled record");
    assert!(recent.iter().any(|r| r["finish"] == "length"), "{recent:?}");
    assert_eq!(abandoned["completion_tokens"], 0);
    assert!(abandoned["stats"].is_null(), "never generated: {abandoned}");
}

#[test]
fn metrics_and_dashboard_data_follow_the_work() {
    let srv = server(|_| {});
    let addr = srv.addr();
    let state = get(addr, "/api/state").json();
    assert_eq!(state["model"]["id"], "qwen3moe-chat");
    assert_eq!(state["worker"]["address"], "in-process");
    assert_eq!(state["worker"]["status"], "up");
    let (layers, experts) = (2, 4);
    assert_eq!(state["model"]["layers"], layers);
    assert_eq!(state["model"]["experts"], experts);
    assert_eq!(state["worker"]["experts_owned"], layers * experts);
    // The table's rows: just the in-process worker.
    assert_eq!(state["workers"], json!([state["worker"].clone()]));
    assert_eq!(state["heat"], json!(vec![0; layers * experts]));

    let mut live = SseStream::get(addr, "/api/events");
    assert_eq!(live.status, 200);
    let v = post(addr, CHAT, &chat_body("Light up the grid", 8)).json();
    let (p, c) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    // Every forwarded token routes top_k = 2 experts in each MoE layer; the
    // last sampled token is never forwarded.
    let routed = (p + c - 1) * 2 * layers as u64;
    let mut from_feed = 0;
    let t = Instant::now();
    while from_feed < routed {
        assert!(
            t.elapsed() < PATIENCE,
            "the feed showed {from_feed} of {routed} routed rows"
        );
        let e = live.next_event().unwrap();
        assert_eq!(e.event.as_deref(), Some("tick"));
        let f: Value = serde_json::from_str(&e.data).unwrap();
        from_feed += f["heat_delta"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d[1].as_u64().unwrap())
            .sum::<u64>();
    }
    assert_eq!(from_feed, routed);
    live.disconnect();
    let state = get(addr, "/api/state").json();
    let heat: u64 = state["heat"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .sum();
    assert_eq!(heat, routed);
    let rec = &state["recent"][0];
    assert_eq!(rec["id"], v["id"]);
    assert_eq!(rec["prompt_tokens"], p);
    assert_eq!(rec["completion_tokens"], c);
    assert!(rec["stats"]["profile"]["attention_ms"].as_f64().unwrap() > 0.0);

    let m = get(addr, "/metrics");
    // The in-process worker looks each (step, expert) up once: each decode
    // step needs top_k experts per MoE layer, the one prefill step between
    // top_k and all of them.
    let hits: u64 = m
        .text()
        .lines()
        .find_map(|l| l.strip_prefix("charm_expert_hits_total "))
        .unwrap()
        .parse()
        .unwrap();
    let decode = (c - 1) * 2 * layers as u64;
    assert!(
        (2 * layers as u64..=(layers * experts) as u64).contains(&(hits - decode)),
        "hits {hits}"
    );
    assert_eq!(
        m.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let m = m.text();
    for line in [
        "charm_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 1".to_string(),
        format!("charm_prompt_tokens_total {p}"),
        format!("charm_completion_tokens_total {c}"),
        "charm_time_to_first_token_seconds_count 1".to_string(),
        "charm_decode_tokens_per_second_count 1".to_string(),
        "charm_expert_misses_total 0".to_string(),
        "charm_worker_up{worker=\"in-process\"} 1".to_string(),
        "charm_worker_experts{worker=\"in-process\"} 8".to_string(),
        "charm_generations_total{finish=\"length\"} 1".to_string(),
    ] {
        assert!(m.lines().any(|l| l == line), "missing {line:?} in\n{m}");
    }
}

#[test]
fn health_models_and_the_page() {
    let srv = server(|_| {});
    let addr = srv.addr();
    let h = get(addr, "/health").json();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["model"], "qwen3moe-chat");
    let m = get(addr, "/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "qwen3moe-chat");
    assert_eq!(m["data"][0]["object"], "model");
    // The fixture's context, under vLLM's and OpenRouter's names.
    assert_eq!(m["data"][0]["max_model_len"], 512);
    assert_eq!(m["data"][0]["context_length"], 512);
    assert_eq!(get(addr, "/v1/models/qwen3moe-chat").json()["id"], "qwen3moe-chat");
    let page = get(addr, "/");
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(page.text().contains("<script src=\"/assets/dashboard.js\">"));
    let js = get(addr, "/assets/dashboard.js");
    assert_eq!(js.header("content-type"), Some("text/javascript; charset=utf-8"));
    assert!(js.text().contains("/api/events"));
    assert_eq!(get(addr, "/assets/dashboard.css").status, 200);
}
