//! Real chat templates (as released, from llama-cpp-python's sdist via
//! `scripts/fetch_test_material.sh`) are read in their own tool-call
//! syntax; Qwen3.5's, DeepSeek-V3.1's, MiniMax-M2's and Kimi K2's render
//! earlier calls in theirs, and forced calls through Qwen3.5's, DeepSeek-V3.1's,
//! V3.2's and Kimi K2's come back parsed.

mod api_support;

use api_support::*;
use charm_coordinator::chat_template::Message;
use charm_coordinator::server::tools::ToolSyntax;
use charm_coordinator::server::{Server, ServerConfig};
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn template(name: &str) -> String {
    let path = repo().join("tests/material/templates").join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/fetch_test_material.sh", path.display()))
}

#[test]
fn real_templates_are_read_in_their_own_tool_syntax() {
    for (name, syntax) in [
        ("Qwen3.5-4B.jinja", ToolSyntax::QwenXml),
        ("Qwen3-Coder.jinja", ToolSyntax::QwenXml),
        ("Qwen-Qwen3-0.6B.jinja", ToolSyntax::Hermes),
        ("GLM-4.6.jinja", ToolSyntax::Glm),
        ("GLM-4.7-Flash.jinja", ToolSyntax::Glm),
        ("deepseek-ai-DeepSeek-V3.1.jinja", ToolSyntax::DeepSeekV31),
        ("openai-gpt-oss-120b.jinja", ToolSyntax::Harmony),
        ("MiniMax-M2.jinja", ToolSyntax::MiniMax),
        ("deepseek-ai-DeepSeek-V3.2.jinja", ToolSyntax::Dsml),
        ("moonshotai-Kimi-K2.jinja", ToolSyntax::Kimi),
        ("Kimi-K2-Thinking.jinja", ToolSyntax::Kimi),
    ] {
        assert_eq!(ToolSyntax::detect(&template(name)), Some(syntax), "{name}");
    }
}

const TEMPLATES: [&str; 11] = [
    "Qwen3.5-4B.jinja",
    "Qwen3-Coder.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "GLM-4.6.jinja",
    "GLM-4.7-Flash.jinja",
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "openai-gpt-oss-120b.jinja",
    "MiniMax-M2.jinja",
    "deepseek-ai-DeepSeek-V3.2.jinja",
    "moonshotai-Kimi-K2.jinja",
    "Kimi-K2-Thinking.jinja",
];

/// Every released template takes a tool conversation through the API: the
/// tools, an earlier call with non-ASCII and non-string arguments, its
/// result and a system message render (the answer itself is the random
/// fixture's).
#[test]
fn every_real_template_renders_a_tool_conversation() {
    for name in TEMPLATES {
        let dir = fixture_with_template(&template(name));
        let (engine, info) = charm_coordinator::engine::Engine::load(dir.path(), &Default::default()).unwrap();
        let srv = Server::start(engine, &info, ServerConfig::new(dir.path())).unwrap();
        let body = json!({"max_tokens": 2, "temperature": 0, "tools": [weather_tool()], "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"metric\": true}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"}]});
        let r = post(srv.addr(), CHAT, &body);
        assert_eq!(r.status, 200, "{name}: {}", r.text());
    }
}

/// A user asking for Paris's weather, the assistant's call of
/// `get_weather` with `arguments` (as an object) and its result, "sunny".
fn paris_history(arguments: Value) -> Vec<Message> {
    vec![
        Message::new("user", "Weather in Paris?"),
        Message::assistant_calls(
            "",
            vec![json!({"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments}})],
        ),
        Message::tool_result("c1", "sunny"),
    ]
}

/// [`paris_history`] rendered by `codec`'s template with the weather tool
/// offered, as ids.
fn paris_prompt(codec: &TextCodec, arguments: Value) -> Vec<u32> {
    let tools = [("tools", minijinja::Value::from_serialize(vec![weather_tool()]))];
    codec.encode_chat(&paris_history(arguments), true, &tools).unwrap()
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "required": ["city"], "additionalProperties": false,
            "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}, "metric": {"type": "boolean"}}}}})
}

#[test]
fn qwen35_renders_earlier_calls_in_its_xml_and_forced_calls_parse() {
    let dir = fixture_with_template(&template("Qwen3.5-4B.jinja"));
    // The template writes an earlier call's arguments as XML parameters.
    let codec = TextCodec::load(dir.path()).unwrap();
    let ids = paris_prompt(&codec, json!({"city": "Paris", "metric": true}));
    let text = codec.decode(&ids, false).unwrap();
    assert!(
        text.contains("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"),
        "{text}"
    );
    assert!(text.contains("<tools>\n{\"type\": \"function\""), "{text}");
    // As Python renders `args_value | string` of a boolean.
    assert!(text.contains("<parameter=metric>\nTrue\n</parameter>"), "{text}");

    // The server: the chat fixture as it is, with Qwen3.5's template given
    // as `--chat-template` (its tool syntax comes from that template).
    let (engine, info) = engine();
    let mut config = ServerConfig::new(&chat_fixture());
    config.chat_template = Some(repo().join("tests/material/templates/Qwen3.5-4B.jinja"));
    let srv = Server::start(engine, &info, config).unwrap();
    let ask = |choice: Value, messages: Value| {
        let body = json!({"messages": messages, "tools": [weather_tool()], "tool_choice": choice,
                          "max_tokens": 200, "temperature": 0});
        let r = post(srv.addr(), CHAT, &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let user = json!([{"role": "user", "content": "Weather in Lima?"}]);
    for choice in [
        json!({"type": "function", "function": {"name": "get_weather"}}),
        json!("required"),
    ] {
        let v = ask(choice.clone(), user.clone());
        let choice0 = &v["choices"][0];
        assert_eq!(choice0["finish_reason"], "tool_calls", "{choice}: {v}");
        let calls = choice0["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(["Paris", "Lima"].contains(&args["city"].as_str().unwrap()), "{args}");
        assert!(args.get("metric").is_none_or(Value::is_boolean), "{args}");
    }
    // The round trip: the earlier call and its result go back in.
    let round = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ]);
    let v = ask(json!("auto"), round);
    assert!(v["choices"][0]["message"].is_object(), "{v}");
}

#[test]
fn minimax_renders_earlier_calls_as_invokes() {
    let dir = fixture_with_template(&template("MiniMax-M2.jinja"));
    let codec = TextCodec::load(dir.path()).unwrap();
    let text = codec
        .decode(&paris_prompt(&codec, json!({"city": "Paris", "metric": true})), false)
        .unwrap();
    assert!(
        text.contains(
            "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
        ),
        "{text}"
    );
    assert!(text.contains("<parameter name=\"metric\">true</parameter>"), "{text}");
    assert!(text.contains("<response>sunny</response>"), "{text}");
    // What the model would write back parses as the call.
    let calls = charm_coordinator::server::tools::parse(
        ToolSyntax::MiniMax,
        &["get_weather".to_string()],
        "<minimax:tool_call>\n<invoke name=\"get_weather\"><parameter name=\"city\">Lima</parameter>\n</invoke>\n</minimax:tool_call>",
    )
    .calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments["city"], "Lima");
}

#[test]
fn deepseek_v31_renders_calls_with_json_arguments_and_forced_calls_parse() {
    let dir = fixture_with_template(&template("deepseek-ai-DeepSeek-V3.1.jinja"));
    let codec = TextCodec::load(dir.path()).unwrap();
    let history = paris_history(json!({"city": "Paris"}));
    let conv = charm_coordinator::server::tools::deepseek_v31_conversation(history, &[weather_tool()]);
    let text = codec.render_chat(&conv, true, &[]).unwrap();
    assert!(
        text.contains("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"),
        "{text}"
    );
    assert!(text.contains("## Tools"), "{text}");

    let (engine, info) = charm_coordinator::engine::Engine::load(dir.path(), &Default::default()).unwrap();
    let srv = Server::start(engine, &info, ServerConfig::new(dir.path())).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Weather in Lima?"}], "tools": [weather_tool()],
                      "tool_choice": "required", "max_tokens": 200, "temperature": 0});
    let v = post(srv.addr(), CHAT, &body).json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(["Paris", "Lima"].contains(&args["city"].as_str().unwrap()), "{args}");
}

#[test]
fn deepseek_v32_dsml_through_chat_template_renders_and_forced_calls_parse() {
    // DeepSeek-V3.2 ships no Jinja template; llama.cpp's, given as
    // `--chat-template`.
    let file = repo().join("tests/material/templates/deepseek-ai-DeepSeek-V3.2.jinja");
    let codec = TextCodec::load(&chat_fixture())
        .unwrap()
        .with_template_file(&file)
        .unwrap();
    let history = paris_history(json!({"city": "Paris", "metric": true}));
    let tools = [("tools", minijinja::Value::from_serialize(vec![weather_tool()]))];
    let text = codec.render_chat(&history, true, &tools).unwrap();
    assert!(
        text.contains("<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"metric\" string=\"false\">true</｜DSML｜parameter>"),
        "{text}"
    );
    assert!(text.contains("<result>sunny</result>"), "{text}");

    let (engine, info) = engine();
    let mut config = ServerConfig::new(&chat_fixture());
    config.chat_template = Some(file);
    let srv = Server::start(engine, &info, config).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Weather in Lima?"}], "tools": [weather_tool()],
                      "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                      "max_tokens": 200, "temperature": 0});
    let v = post(srv.addr(), CHAT, &body).json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(["Paris", "Lima"].contains(&args["city"].as_str().unwrap()), "{args}");
}

/// The chat fixture with `template` and Kimi K2's tool-call markers added
/// to its tokenizer as special tokens (ids the fixture's vocabulary leaves
/// free), as they are in Kimi's own.
fn kimi_fixture(template: &str) -> tempfile::TempDir {
    use charm_coordinator::server::tools::kimi;
    let dir = fixture_with_template(template);
    let path = dir.path().join("tokenizer.json");
    let mut tok: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    let added = tok["added_tokens"].as_array_mut().unwrap();
    for (i, marker) in [
        kimi::SECTION,
        kimi::SECTION_END,
        kimi::CALL_BEGIN,
        kimi::ARGUMENTS,
        kimi::CALL_END,
    ]
    .into_iter()
    .enumerate()
    {
        added.push(
            json!({"id": 151_669 + i, "content": marker, "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}),
        );
    }
    std::fs::write(&path, tok.to_string()).unwrap();
    dir
}

#[test]
fn kimi_renders_calls_by_their_ids_and_forced_calls_parse_from_special_tokens() {
    let dir = kimi_fixture(&template("Kimi-K2-Thinking.jinja"));
    let codec = TextCodec::load(dir.path()).unwrap();
    let ids = paris_prompt(&codec, json!({"city": "Paris"}));
    // The markers are single special tokens.
    assert!(ids.contains(&151_671) && ids.contains(&151_672), "{ids:?}");
    let text = codec.decode(&ids, false).unwrap();
    assert!(
        text.contains("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>"),
        "{text}"
    );
    assert!(text.contains("## Return of functions.get_weather:0\nsunny"), "{text}");
    assert!(text.contains("tool_declare"), "{text}");

    // Forced calls (any tool: the grammar names the special token; a named
    // tool: the prefill does), decoded with the markers kept, parse.
    let (engine, info) = charm_coordinator::engine::Engine::load(dir.path(), &Default::default()).unwrap();
    let srv = Server::start(engine, &info, ServerConfig::new(dir.path())).unwrap();
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        for stream in [false, true] {
            let body = json!({"messages": [{"role": "user", "content": "Weather in Lima?"}],
                              "tools": [weather_tool()], "tool_choice": choice, "max_tokens": 200,
                              "temperature": 0, "stream": stream});
            let (finish, name, arguments, content) = if stream {
                let events: Vec<Value> = SseStream::post(srv.addr(), CHAT, &body)
                    .collect()
                    .iter()
                    .filter(|e| e.data != "[DONE]")
                    .map(|e| serde_json::from_str(&e.data).unwrap())
                    .collect();
                let mut name = String::new();
                let mut arguments = String::new();
                let mut content = String::new();
                let mut finish = Value::Null;
                for e in &events {
                    let d = &e["choices"][0]["delta"];
                    if let Some(c) = d["content"].as_str() {
                        content.push_str(c);
                    }
                    if let Some(calls) = d["tool_calls"].as_array() {
                        for c in calls {
                            name.push_str(c["function"]["name"].as_str().unwrap_or(""));
                            arguments.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
                        }
                    }
                    if !e["choices"][0]["finish_reason"].is_null() {
                        finish = e["choices"][0]["finish_reason"].clone();
                    }
                }
                (finish, name, arguments, content)
            } else {
                let v = post(srv.addr(), CHAT, &body).json();
                let m = &v["choices"][0]["message"];
                let call = &m["tool_calls"][0]["function"];
                (
                    v["choices"][0]["finish_reason"].clone(),
                    call["name"].as_str().unwrap_or("").to_string(),
                    call["arguments"].as_str().unwrap_or("").to_string(),
                    m["content"].as_str().unwrap_or("").to_string(),
                )
            };
            assert_eq!(finish, "tool_calls", "{choice} stream {stream}");
            assert_eq!(name, "get_weather", "{choice} stream {stream}");
            let args: Value = serde_json::from_str(&arguments).unwrap();
            assert!(["Paris", "Lima"].contains(&args["city"].as_str().unwrap()), "{args}");
            assert!(!content.contains("<|tool"), "markers left in the text: {content:?}");
        }
    }
    // Special tokens are kept in the text, but the one that ends the answer
    // adds none (the fixture's <|im_end|>, made the first token).
    for stream in [false, true] {
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
                          "logit_bias": {"151645": 100}, "stream": stream});
        let r = post(srv.addr(), CHAT, &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let text = r.text();
        assert!(!text.contains("im_end"), "stream {stream}: {text}");
        assert!(text.contains("\"finish_reason\":\"stop\""), "stream {stream}: {text}");
    }
}
