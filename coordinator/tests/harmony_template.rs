//! gpt-oss's harmony chat format against transformers
//! (`tests/fixtures/harmony/reference.json`, made by
//! `scripts/make_harmony_fixtures.py` from the real gpt-oss tokenizer and
//! chat template in `tests/material/gptoss/`):
//!
//! - every chat case: the rendered text (system + developer messages,
//!   reasoning efforts, model identity, built-in tools, tool definitions,
//!   calls and results, earlier reasoning) and its ids;
//! - plain strings' ids;
//! - a harmony answer's ids decoded with and without special tokens, whole
//!   and streamed.
//!
//! The material is fetched by `scripts/fetch_test_material.sh`; a missing
//! file fails the test with a message saying to run it.

use std::path::PathBuf;

use charm_coordinator::chat_template::{strftime_at, Message};
use charm_coordinator::TextCodec;
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Deserialize)]
struct Reference {
    fixed_now: i64,
    special_ids: std::collections::BTreeMap<String, u32>,
    chat: Vec<ChatCase>,
    encode: Vec<EncodeCase>,
    decode: Vec<DecodeCase>,
}

#[derive(Deserialize)]
struct ChatCase {
    name: String,
    messages: Vec<Map<String, Value>>,
    kwargs: Map<String, Value>,
    add_generation_prompt: bool,
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct EncodeCase {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct DecodeCase {
    ids: Vec<u32>,
    text: String,
    text_skip: String,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn reference() -> Reference {
    let path = repo().join("tests/fixtures/harmony/reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn codec() -> TextCodec {
    let dir = repo().join("tests/material/gptoss");
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        assert!(
            dir.join(f).exists(),
            "{}: missing; run scripts/fetch_test_material.sh",
            dir.join(f).display()
        );
    }
    TextCodec::load(&dir).expect("the gpt-oss tokenizer and template load")
}

/// A fixture message as charm carries it (the reasoning given as `thinking`).
fn message(m: &Map<String, Value>) -> Message {
    let text = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
    for k in m.keys() {
        assert!(
            ["role", "content", "thinking", "tool_calls", "tool_call_id"].contains(&k.as_str()),
            "a field charm's Message cannot carry: {k}"
        );
    }
    let mut msg = Message::new(&text("role").unwrap(), &text("content").unwrap_or_default());
    msg.reasoning_content = text("thinking");
    msg.tool_call_id = text("tool_call_id");
    msg.tool_calls = m.get("tool_calls").and_then(Value::as_array).cloned();
    msg
}

#[test]
fn harmony_chats_render_and_tokenize_as_transformers_does() {
    let r = reference();
    let c = codec();
    for case in &r.chat {
        let messages: Vec<Message> = case.messages.iter().map(message).collect();
        let mut extra: Vec<(&str, minijinja::Value)> = case
            .kwargs
            .iter()
            .map(|(k, v)| (k.as_str(), minijinja::Value::from_serialize(v)))
            .collect();
        extra.push(("strftime_now", strftime_at(r.fixed_now)));
        let text = c
            .render_chat(&messages, case.add_generation_prompt, &extra)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(text, case.text, "{}: rendered text", case.name);
        let ids = c.encode_chat(&messages, case.add_generation_prompt, &extra).unwrap();
        assert_eq!(ids, case.ids, "{}: ids", case.name);
    }
}

#[test]
fn harmony_plain_strings_tokenize_as_transformers_does() {
    let r = reference();
    let c = codec();
    for case in &r.encode {
        assert_eq!(c.encode(&case.text).unwrap(), case.ids, "{:?}", case.text);
    }
}

#[test]
fn harmony_markers_are_special_tokens_kept_only_when_asked() {
    let r = reference();
    let c = codec();
    for case in &r.decode {
        assert_eq!(c.decode(&case.ids, false).unwrap(), case.text);
        assert_eq!(c.decode(&case.ids, true).unwrap(), case.text_skip);
        // Streamed one id at a time, keeping the markers (as the server
        // decodes a harmony model's chat answers).
        let mut s = c.stream_keeping_special();
        let mut streamed = String::new();
        for &id in &case.ids {
            streamed.push_str(&s.push(id).unwrap().unwrap_or_default());
        }
        streamed.push_str(&s.finish().unwrap().unwrap_or_default());
        assert_eq!(streamed, case.text);
    }
}

/// Feeds `text`'s tokens to `g`, each one allowed by the mask before it;
/// the mask after the last.
fn feed(g: &mut charm_coordinator::grammar::Constraint, c: &TextCodec, text: &str, vocab: usize) -> Vec<f32> {
    for id in c.encode_plain(text).unwrap() {
        let mut logits = vec![0.0f32; vocab];
        g.mask(&mut logits).unwrap();
        assert!(logits[id as usize].is_finite(), "{text}: token {id} refused");
        g.accept(id).unwrap();
    }
    let mut logits = vec![0.0f32; vocab];
    g.mask(&mut logits).unwrap();
    logits
}

/// The forced-call grammars name harmony's special tokens bare; with the
/// real vocabulary they compile, and the model's own spelling of a call
/// (`NAME <|constrain|>json<|message|>` + arguments) passes them token by
/// token, after which only an end-of-sequence token (`<|call|>`) may come.
#[test]
fn forced_harmony_calls_compile_and_accept_a_call_with_the_real_vocabulary() {
    use charm_coordinator::grammar::Grammars;
    use charm_coordinator::server::answer::Out;
    use charm_coordinator::server::harmony::HarmonySplit;
    use charm_coordinator::server::tools::{ToolDef, ToolSyntax};

    let c = codec();
    let r = reference();
    let call = r.special_ids["<|call|>"];
    // gpt-oss's embedding rows (the tokenizer's ids, padded).
    let vocab = 201_088;
    let eos = [r.special_ids["<|return|>"], 199_999, call];
    let grammars = Grammars::new(&c, vocab, &eos).expect("the gpt-oss vocabulary builds a token trie");
    let tool = |name: &str| ToolDef {
        name: name.into(),
        description: None,
        parameters: Some(
            serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}},
                                             "required": ["city"]}),
        ),
    };
    let tools = [tool("get_weather"), tool("get_time")];
    let h = ToolSyntax::Harmony;
    for (name, text) in [
        (None, "get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"),
        (Some("get_time"), "{\"city\": \"Lima\"}"),
    ] {
        let mut g = grammars.compile(&h.forced_grammar(&tools, name)).unwrap();
        let logits = feed(&mut g, &c, text, vocab);
        assert!(logits[call as usize].is_finite(), "{text}: <|call|> may end the call");
        let allowed = logits.iter().filter(|l| l.is_finite()).count();
        assert_eq!(allowed, eos.len(), "{text}: only end-of-sequence tokens");
        // The prefill and what was generated (as the engine decodes it) split into the call.
        let names = ["get_weather".to_string(), "get_time".to_string()];
        let mut split = HarmonySplit::new(&names, &h.prefill(name));
        let mut pieces = split.push(text);
        pieces.extend(split.push("<|call|>"));
        pieces.extend(split.finish());
        assert!(
            matches!(&pieces[..], [Out::Call(c)] if c.arguments_json().starts_with("{\"city\"")),
            "{text}: {pieces:?}"
        );
    }
}

/// A conversation as the API hands it over (two calls in one turn, their
/// results out of order, reasoning on the turn) renders through the real
/// template: one call per assistant message, each result after its call,
/// the turn's reasoning before its first call.
#[test]
fn api_conversations_with_several_calls_render_through_the_gpt_oss_template() {
    use charm_coordinator::server::tools::{self, Choice, ToolDef, ToolSyntax};

    let c = codec();
    let def = |name: &str| ToolDef {
        name: name.into(),
        description: Some(format!("The {name}.")),
        parameters: Some(serde_json::json!({"type": "object", "properties": {}})),
    };
    let syntax = ToolSyntax::detect(c.template().unwrap().source());
    assert_eq!(syntax, Some(ToolSyntax::Harmony));
    let plan = tools::plan(
        syntax,
        vec![def("weather"), def("clock")],
        Choice::Auto,
        "tools",
        "tool_choice",
    )
    .unwrap()
    .unwrap();
    let call = |id: &str, name: &str| serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": {"city": "Paris"}}});
    let mut turn = Message::assistant_calls("Let me look.", vec![call("c1", "weather"), call("c2", "clock")]);
    turn.reasoning_content = Some("Two lookups.".into());
    let messages = vec![
        Message::new("system", "Be brief."),
        Message::new("user", "Weather and time?"),
        turn,
        Message::tool_result("c2", "12:00"),
        Message::tool_result("c1", "sunny"),
    ];
    let (messages, rendered) = tools::prepare(syntax, Some(&plan), messages);
    let mut extra = vec![("strftime_now", strftime_at(0))];
    extra.push(("tools", minijinja::Value::from_serialize(&rendered)));
    let text = c.render_chat(&messages, true, &extra).unwrap();
    let tail = text.split("Weather and time?<|end|>").nth(1).unwrap();
    assert_eq!(
        tail,
        "<|start|>assistant<|channel|>analysis<|message|>Two lookups.<|end|>\
         <|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>\
         <|start|>functions.weather to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|>\
         <|start|>assistant to=functions.clock<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>\
         <|start|>functions.clock to=assistant<|channel|>commentary<|message|>\"12:00\"<|end|>\
         <|start|>assistant"
    );
    assert!(text.contains("# Instructions\n\nBe brief.\n\n# Tools"), "{text}");
    assert!(text.contains("Current date: 1970-01-01\n"), "{text}");
}

/// A schema asked of a harmony chat answer holds its `final` message to
/// the schema after an optional `analysis` message
/// (`harmony::final_answer`): with the real vocabulary the model's own
/// spelling passes token by token — reasoning then answer, the answer
/// alone, and a reasoning budget's closing — and splits into that
/// reasoning and the JSON; JSON before the `final` header is refused, and
/// after the JSON only an end-of-sequence token may come.
#[test]
fn a_schema_holds_the_final_message_and_leaves_the_reasoning_free() {
    use charm_coordinator::grammar::{GrammarSpec, Grammars};
    use charm_coordinator::server::answer::Out;
    use charm_coordinator::server::harmony::{final_answer, HarmonySplit};
    use charm_coordinator::server::think_budget::HARMONY_CLOSE;

    let c = codec();
    let r = reference();
    let vocab = 201_088;
    let eos = [r.special_ids["<|return|>"], 199_999, r.special_ids["<|call|>"]];
    let grammars = Grammars::new(&c, vocab, &eos).expect("the gpt-oss vocabulary builds a token trie");
    let schema = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]});
    let spec = final_answer(GrammarSpec::JsonSchema(schema));
    let answer = "{\"city\": \"Paris\"}";
    let thought = "The user wants a city; {not JSON} <b>fine</b>.\nSo: Paris.";
    for (text, reasoning) in [
        (
            format!(
                "<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant<|channel|>final<|message|>{answer}"
            ),
            Some(thought),
        ),
        (format!("<|channel|>final<|message|>{answer}"), None),
        (
            format!("<|channel|>analysis<|message|>Let me{HARMONY_CLOSE}{answer}"),
            Some("Let me"),
        ),
    ] {
        let mut g = grammars.compile(&spec).unwrap();
        let logits = feed(&mut g, &c, &text, vocab);
        let allowed: Vec<usize> = (0..vocab).filter(|&i| logits[i].is_finite()).collect();
        let eos_ids: Vec<usize> = eos.iter().map(|&e| e as usize).collect();
        assert!(
            !allowed.is_empty() && allowed.iter().all(|i| eos_ids.contains(i)),
            "{text}: only end-of-sequence tokens may follow the answer, not {allowed:?}"
        );
        let mut split = HarmonySplit::new(&[], "");
        let mut pieces = split.push(&text);
        pieces.extend(split.push("<|return|>"));
        pieces.extend(split.finish());
        let (mut thought_said, mut text_said) = (String::new(), String::new());
        for p in &pieces {
            match p {
                Out::Reasoning(t) => thought_said.push_str(t),
                Out::Text(t) => text_said.push_str(t),
                Out::Call(_) => panic!("{text}: a call in {pieces:?}"),
            }
        }
        assert_eq!(thought_said, reasoning.unwrap_or(""), "{text}: the reasoning");
        assert_eq!(text_said, answer, "{text}: the answer");
    }
    // The answer cannot start the message: a header comes first.
    let mut g = grammars.compile(&spec).unwrap();
    let mut logits = vec![0.0f32; vocab];
    g.mask(&mut logits).unwrap();
    let brace = c.encode_plain("{").unwrap()[0];
    assert!(logits[brace as usize].is_infinite(), "JSON before the final header");
    assert!(
        logits[r.special_ids["<|channel|>"] as usize].is_finite(),
        "a channel header opens the answer"
    );
    // A final message off the schema is refused along the way.
    let mut g = grammars.compile(&spec).unwrap();
    let off = c
        .encode_plain("<|channel|>final<|message|>{\"town\": \"Paris\"}")
        .unwrap();
    let refused = off.iter().any(|&id| {
        let mut logits = vec![0.0f32; vocab];
        g.mask(&mut logits).unwrap();
        let no = logits[id as usize].is_infinite();
        if !no {
            g.accept(id).unwrap();
        }
        no
    });
    assert!(refused, "an answer off the schema passed");
}
