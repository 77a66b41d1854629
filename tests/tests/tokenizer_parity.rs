//! Tokenizer parity: [`TextCodec`] against what transformers produced for
//! real Qwen3, OLMo and DeepSeek-V3 tokenizers
//! (`tests/fixtures/tokenizers/*_cases.json`).
//!
//! - every encode case (special tokens added as the post-processor says);
//! - every decode case, with and without `skip_special_tokens`;
//! - every Qwen3 and DeepSeek-V3 chat case: the rendered template text and
//!   its ids (DeepSeek-V3: joined system prompts, BOS from the template);
//! - the streaming decoder: ids pushed one at a time, pieces concatenated,
//!   equal `decode(ids, true)`.
//!
//! The tokenizer files are fetched by `scripts/fetch_test_material.sh`; a
//! missing one fails the test with a message saying to run it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use charm_coordinator::chat_template::Message;
use charm_coordinator::TextCodec;
use charm_tests::{fixture, material};
use serde::Deserialize;

#[derive(Deserialize)]
struct Cases {
    encode: Vec<EncodeCase>,
    decode: Vec<DecodeCase>,
    #[serde(default)]
    chat: Vec<ChatCase>,
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

#[derive(Deserialize)]
struct ChatCase {
    /// Kept as maps so a field [`Message`] cannot carry is noticed.
    messages: Vec<BTreeMap<String, serde_json::Value>>,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
    text: String,
    ids: Vec<u32>,
}

fn cases(name: &str) -> Cases {
    let path = fixture("tokenizers").join(format!("{name}_cases.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Qwen3 tokenizer and chat template, as the `qwen3moe-chat` model
/// directory ships them.
fn qwen3() -> TextCodec {
    material("tests/fixtures/qwen3moe-chat/tokenizer.json");
    material("tests/fixtures/qwen3moe-chat/tokenizer_config.json");
    let dir = fixture("qwen3moe-chat");
    let codec = TextCodec::load(&dir).unwrap_or_else(|e| panic!("TextCodec::load: {e}"));
    assert!(
        codec.has_template(),
        "the Qwen3 tokenizer_config.json has a chat template"
    );
    codec
}

/// The OLMo tokenizer, alone in a temporary model directory.
fn olmo() -> (tempfile::TempDir, TextCodec) {
    let src: PathBuf = material("tests/material/olmo/tokenizer.json");
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&src, tmp.path().join("tokenizer.json")).expect("copy tokenizer.json");
    let codec = TextCodec::load(tmp.path()).unwrap_or_else(|e| panic!("TextCodec::load: {e}"));
    assert!(!codec.has_template(), "no tokenizer_config.json, no template");
    (tmp, codec)
}

fn check_encode(name: &str, codec: &TextCodec, cases: &Cases) {
    assert!(!cases.encode.is_empty());
    for c in &cases.encode {
        let ids = codec
            .encode(&c.text)
            .unwrap_or_else(|e| panic!("{name}: encode {:?}: {e}", c.text));
        assert_eq!(ids, c.ids, "{name}: encode {:?}", c.text);
    }
}

fn check_decode(name: &str, codec: &TextCodec, cases: &Cases) {
    assert!(!cases.decode.is_empty());
    for c in &cases.decode {
        let text = codec.decode(&c.ids, false).unwrap();
        assert_eq!(text, c.text, "{name}: decode {:?}", c.ids);
        let skip = codec.decode(&c.ids, true).unwrap();
        assert_eq!(skip, c.text_skip, "{name}: decode {:?} skipping specials", c.ids);
    }
}

/// Pushes `ids` one by one through the streaming decoder and concatenates
/// the pieces; checks on the way that text only ever grows as a prefix of
/// `whole` (nothing printed is ever wrong).
fn stream_all(name: &str, codec: &TextCodec, ids: &[u32], whole: &str) -> String {
    let mut s = codec.stream();
    let mut out = String::new();
    for (i, &id) in ids.iter().enumerate() {
        if let Some(piece) = s.push(id).expect("stream push") {
            out.push_str(&piece);
            assert!(
                whole.starts_with(&out),
                "{name}: after {} of ids {ids:?} the stream printed {out:?}, not a prefix of {whole:?}",
                i + 1
            );
        }
    }
    if let Some(rest) = s.finish().expect("stream finish") {
        out.push_str(&rest);
    }
    out
}

fn check_stream(name: &str, codec: &TextCodec, cases: &Cases) {
    for c in &cases.encode {
        let whole = codec.decode(&c.ids, true).unwrap();
        let streamed = stream_all(name, codec, &c.ids, &whole);
        assert_eq!(
            streamed, whole,
            "{name}: streaming decode of {:?} (ids {:?})",
            c.text, c.ids
        );
    }
    // Decode cases include id lists that stop in the middle of a character:
    // the held-back bytes must come out at the end, as whole decoding does.
    for c in &cases.decode {
        let whole = codec.decode(&c.ids, true).unwrap();
        let streamed = stream_all(name, codec, &c.ids, &whole);
        assert_eq!(streamed, whole, "{name}: streaming decode of ids {:?}", c.ids);
    }
}

#[test]
fn qwen3_encode() {
    check_encode("qwen3", &qwen3(), &cases("qwen3"));
}

#[test]
fn qwen3_decode() {
    check_decode("qwen3", &qwen3(), &cases("qwen3"));
}

#[test]
fn qwen3_stream_decode() {
    check_stream("qwen3", &qwen3(), &cases("qwen3"));
}

#[test]
fn qwen3_chat_template() {
    check_chat("qwen3", &qwen3(), &cases("qwen3"));
}

/// Every chat case of `cases`: the rendered text and its ids. Messages carry
/// a role, a content (none for a turn that only calls tools) and tool calls.
fn check_chat(name: &str, codec: &TextCodec, cases: &Cases) {
    assert!(!cases.chat.is_empty());
    for (i, c) in cases.chat.iter().enumerate() {
        let messages: Vec<Message> = c
            .messages
            .iter()
            .map(|m| {
                let extra: Vec<&String> = m
                    .keys()
                    .filter(|k| !["role", "content", "tool_calls"].contains(&k.as_str()))
                    .collect();
                assert!(
                    extra.is_empty(),
                    "{name} chat case {i}: message fields {extra:?} cannot be represented by Message"
                );
                let role = m
                    .get("role")
                    .and_then(|v| v.as_str())
                    .unwrap_or_else(|| panic!("{name} chat case {i}: message without a role"));
                let content = match m.get("content") {
                    Some(serde_json::Value::String(s)) => s.as_str(),
                    Some(serde_json::Value::Null) if m.contains_key("tool_calls") => "",
                    _ => panic!("{name} chat case {i}: message without a string content"),
                };
                match m.get("tool_calls").and_then(|v| v.as_array()) {
                    Some(calls) => Message::assistant_calls(content, calls.clone()),
                    None => Message::new(role, content),
                }
            })
            .collect();
        let extra = match c.enable_thinking {
            Some(v) => vec![("enable_thinking", v.into())],
            None => vec![],
        };
        let text = codec
            .render_chat(&messages, c.add_generation_prompt, &extra)
            .unwrap_or_else(|e| panic!("chat case {i}: render_chat: {e}"));
        assert_eq!(
            text, c.text,
            "{name} chat case {i} (enable_thinking {:?}): rendered text",
            c.enable_thinking
        );
        let ids = codec
            .encode_chat(&messages, c.add_generation_prompt, &extra)
            .unwrap_or_else(|e| panic!("{name} chat case {i}: encode_chat: {e}"));
        assert_eq!(
            ids, c.ids,
            "{name} chat case {i} (enable_thinking {:?}): ids",
            c.enable_thinking
        );
    }
}

/// The real DeepSeek-V3 tokenizer and chat template, alone in a temporary
/// model directory.
fn deepseek_v3() -> (tempfile::TempDir, TextCodec) {
    let tmp = tempfile::tempdir().expect("tempdir");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        let src: PathBuf = material(format!("tests/material/deepseek_v3/{f}"));
        std::fs::copy(&src, tmp.path().join(f)).expect("copy the tokenizer");
    }
    let codec = TextCodec::load(tmp.path()).unwrap_or_else(|e| panic!("TextCodec::load: {e}"));
    assert!(
        codec.has_template(),
        "DeepSeek-V3's tokenizer_config.json has a chat template"
    );
    (tmp, codec)
}

#[test]
fn deepseek_v3_encode_decode_and_stream() {
    let (_tmp, codec) = deepseek_v3();
    let cases = cases("deepseek_v3");
    check_encode("deepseek_v3", &codec, &cases);
    check_decode("deepseek_v3", &codec, &cases);
    check_stream("deepseek_v3", &codec, &cases);
}

#[test]
fn deepseek_v3_chat_template() {
    let (_tmp, codec) = deepseek_v3();
    check_chat("deepseek_v3", &codec, &cases("deepseek_v3"));
}

#[test]
fn olmo_encode() {
    let (_tmp, codec) = olmo();
    check_encode("olmo", &codec, &cases("olmo"));
}

#[test]
fn olmo_decode() {
    let (_tmp, codec) = olmo();
    check_decode("olmo", &codec, &cases("olmo"));
}

#[test]
fn olmo_stream_decode() {
    let (_tmp, codec) = olmo();
    check_stream("olmo", &codec, &cases("olmo"));
}

#[test]
fn olmo_has_no_chat_template() {
    let (_tmp, codec) = olmo();
    let e = codec.render_chat(&[Message::new("user", "hi")], true, &[]).unwrap_err();
    assert!(e.to_string().contains("chat_template"), "{e}");
}
