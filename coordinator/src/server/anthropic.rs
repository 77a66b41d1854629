//! The Anthropic Messages API: `POST /v1/messages`, streaming and not, and
//! `POST /v1/messages/count_tokens` (the same request's prompt tokens, as
//! Claude Code asks before long turns).
//!
//! Fields: `model`, `system` (a string or text blocks), `messages` (string
//! or text-block content), `max_tokens` (required), `stop_sequences`,
//! `temperature`, `top_p`, `top_k`, `stream`. Streams send
//! `message_start`, `content_block_start`, `content_block_delta`…,
//! `content_block_stop`, `message_delta` (stop reason and output tokens)
//! and `message_stop`.
//!
//! Thinking: `thinking` (`enabled` / `adaptive` / `disabled`) sets the
//! template's `enable_thinking` (a harmony template, which cannot turn
//! reasoning off, gets `reasoning_effort: low` for `disabled`, else
//! `output_config.effort`, `max` as `high`); `display: "omitted"` returns
//! thinking blocks without their text; `enabled`'s
//! `budget_tokens` caps the reasoning (the server closes it after that
//! many tokens, [`super::think_budget`]; any non-negative count below
//! `max_tokens`, where Anthropic asks at least 1,024); the model's reasoning
//! comes back as a `thinking` block (streamed as `thinking_delta`s and a
//! `signature_delta`), and `thinking` blocks of earlier turns reach the
//! template as the turn's `reasoning_content` ([`super::reasoning`]).
//!
//! Structured output: `output_config.format` (or the beta's top-level
//! `output_format`) `{"type": "json_schema", "schema"}` and the `grammar`
//! extension ([`super::structured`]).
//!
//! Tools: `tools` (`name`, `description`, `input_schema`), `tool_choice`
//! (`auto`, `any`, `tool` + `name`, `none`), assistant `tool_use` blocks and
//! user `tool_result` blocks, rendered through the chat template as
//! assistant tool calls and `tool` messages; the model's calls come back as
//! `tool_use` blocks with `stop_reason: "tool_use"` (streamed as a
//! `tool_use` block start and an `input_json_delta`; see [`super::tools`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::answer::{self, AnswerStream, Out, Shape};
use super::error::{ApiError, ErrorKind, Flavor};
use super::queue::{Event, Summary};
use super::reasoning;
use super::sampling::SamplingFields;
use super::sse::SseWriter;
use super::structured;
use super::think_budget::budget_tokens;
use super::tools::{self, CallIds, Choice, ToolDef};
use super::{
    answer_shape, check_target, json_response, new_id, parse_body, prompt_ids, speaks_harmony, submit, tool_syntax,
};
use super::{AppState, Ask, PromptInput, Ticket};
use crate::chat_template::Message;
use crate::engine::FinishReason;
use sha2::{Digest, Sha256};

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<InMessage>,
    #[serde(default)]
    system: Option<Content>,
    /// Required by `/v1/messages`; `count_tokens` takes none.
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    /// `{"type": "json_schema", "schema"}`: the answer's text follows it
    /// (the structured-outputs beta's field; `output_config.format` now).
    #[serde(default)]
    output_format: Option<Value>,
    /// `{"format", "effort"}`: structured output, and how hard the model
    /// works ([`Thinking`]).
    #[serde(default)]
    output_config: Option<Value>,
    /// A Lark grammar (an extension, see [`super::structured`]).
    #[serde(default)]
    grammar: Option<Value>,
    /// `{"type": "enabled", "budget_tokens"}`, `{"type": "adaptive"}` or
    /// `{"type": "disabled"}` ([`Thinking`]).
    #[serde(default)]
    thinking: Option<Value>,
}

/// What a request's `thinking` and `output_config.effort` ask.
#[derive(Debug, Default, PartialEq)]
struct Thinking {
    /// The template's `enable_thinking`: `enabled` and `adaptive` on,
    /// `disabled` off, none: the template's default.
    on: Option<bool>,
    /// `enabled`'s `budget_tokens` ([`super::think_budget`]).
    budget: Option<usize>,
    /// `display: "omitted"`: thinking blocks come back without their text.
    omit: bool,
    /// `output_config.effort` (`low`, `medium`, `high`, `max`), for a
    /// harmony template's `reasoning_effort`.
    effort: Option<&'static str>,
}

impl Thinking {
    fn parse(thinking: Option<&Value>, output_config: Option<&Value>) -> Result<Self, ApiError> {
        let mut t = Thinking::default();
        if let Some(v) = thinking.filter(|v| !v.is_null()) {
            let bad = |m: String| ApiError::invalid_param("thinking", m);
            let budget = v.get("budget_tokens").filter(|b| !b.is_null());
            match v.get("type").and_then(Value::as_str) {
                Some("enabled") => {
                    t.on = Some(true);
                    if let Some(b) = budget {
                        let n = b.as_u64().ok_or_else(|| {
                            bad(format!(
                                "thinking.budget_tokens must be a non-negative integer, got {b}"
                            ))
                        })?;
                        t.budget = Some(budget_tokens(n));
                    }
                }
                Some("adaptive") => {
                    if budget.is_some() {
                        return Err(bad(
                            "thinking.budget_tokens is for type \"enabled\"; adaptive thinking takes none".into(),
                        ));
                    }
                    t.on = Some(true);
                }
                Some("disabled") => t.on = Some(false),
                _ => {
                    return Err(bad(
                        "thinking must be {\"type\": \"enabled\", ...}, {\"type\": \"adaptive\"} or \
                         {\"type\": \"disabled\"}"
                            .into(),
                    ))
                }
            }
            match v.get("display").filter(|d| !d.is_null()).map(Value::as_str) {
                None | Some(Some("summarized")) => {}
                Some(Some("omitted")) => t.omit = true,
                Some(_) => return Err(bad("thinking.display must be \"summarized\" or \"omitted\"".into())),
            }
        }
        if let Some(e) = output_config.and_then(|c| c.get("effort")).filter(|e| !e.is_null()) {
            t.effort = Some(match e.as_str() {
                Some("low") => "low",
                Some("medium") => "medium",
                Some("high") => "high",
                Some("max") => "max",
                _ => {
                    return Err(ApiError::invalid_param(
                        "output_config",
                        format!("output_config.effort must be low, medium, high or max, got {e}"),
                    ))
                }
            });
        }
        Ok(t)
    }
}

#[derive(Debug, Deserialize)]
struct InMessage {
    role: String,
    content: Content,
}

/// Content: a string or a list of blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    /// `tool_use`: the call's id, tool name and input.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    /// `tool_result`: the call answered, and the result (a string or text blocks).
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    is_error: Option<bool>,
    /// `thinking`: an earlier answer's reasoning.
    #[serde(default)]
    thinking: Option<String>,
}

impl Content {
    fn text(self, field: &'static str) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t),
            Content::Blocks(blocks) => {
                let mut out = String::new();
                for b in blocks {
                    match (b.kind.as_str(), b.text) {
                        ("text", Some(t)) => out.push_str(&t),
                        ("text", None) => {
                            return Err(ApiError::invalid_param(
                                field,
                                "a content block of type \"text\" has no `text`".to_string(),
                            ))
                        }
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                field,
                                format!("content block of type {kind:?} is not supported (text only)"),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// `tools`: `{name, description, input_schema}` (custom tools; `cache_control`
/// and other fields are ignored).
fn parse_tools(v: Option<Value>) -> Result<Vec<ToolDef>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("tools", m);
    let list = tools::tool_list(v).map_err(bad)?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.into_iter().enumerate() {
        let Value::Object(mut t) = t else {
            return Err(bad(format!("tools.{i} is not an object")));
        };
        match t.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(k)) if k == "custom" => {}
            Some(k) => {
                return Err(bad(format!(
                    "tools.{i}.type is {k}; only custom tools (name, description, input_schema) are supported"
                )))
            }
        }
        out.push(ToolDef::from_fields(&mut t, &format!("tools.{i}"), "input_schema", true).map_err(bad)?);
    }
    Ok(out)
}

/// `tool_choice`: `{"type": "auto" | "any" | "none" | "tool", "name"}`
/// (`disable_parallel_tool_use` is accepted; every call is returned).
fn parse_choice(v: Option<Value>) -> Result<Choice, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or {\"type\": \"tool\", \"name\": NAME}",
        )
    };
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Choice::Auto);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("auto") => Ok(Choice::Auto),
        Some("any") => Ok(Choice::Required),
        Some("none") => Ok(Choice::None),
        Some("tool") => match v.get("name").and_then(Value::as_str) {
            Some(n) => Ok(Choice::Named(n.to_string())),
            None => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// A tool result's content: a string or text blocks (`is_error`: prefixed
/// `Error: `, the template having no notion of a failed call).
fn result_text(content: Option<Value>, is_error: bool, at: &str) -> Result<String, ApiError> {
    let mut text = match content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(blocks)) => {
            let mut out = String::new();
            for b in blocks {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::invalid_param(
                            "messages",
                            format!("{at}.content: a block of type \"text\" has no `text`"),
                        ))
                    }
                    (kind, _) => {
                        return Err(ApiError::invalid_param(
                            "messages",
                            format!("{at}.content: a block of type {kind:?} is not supported (text only)"),
                        ))
                    }
                }
            }
            out
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "messages",
                format!("{at}.content must be a string or text blocks"),
            ))
        }
    };
    if is_error {
        text.insert_str(0, "Error: ");
    }
    Ok(text)
}

/// Message `i` as chat-template messages: an assistant's `tool_use` blocks
/// become its tool calls, a user's `tool_result` blocks `tool` messages
/// (before the user's text, in order).
fn convert(m: InMessage, i: usize, ids: &mut CallIds, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let blocks = match m.content {
        Content::Text(t) => {
            ids.other();
            out.push(Message::new(&m.role, &t));
            return Ok(());
        }
        Content::Blocks(b) => b,
    };
    let bad = |m: String| ApiError::invalid_param("messages", m);
    let mut text = String::new();
    let mut texts = 0;
    let mut calls = Vec::new();
    let mut call_ids = Vec::new();
    let mut results = 0;
    let mut reasoning: Option<String> = None;
    for (j, b) in blocks.into_iter().enumerate() {
        let at = format!("messages.{i}.content.{j}");
        match (b.kind.as_str(), m.role.as_str()) {
            ("thinking", "assistant") => {
                reasoning
                    .get_or_insert_with(String::new)
                    .push_str(b.thinking.as_deref().unwrap_or(""));
                continue;
            }
            // Encrypted reasoning from another server: nothing to show.
            ("redacted_thinking", "assistant") => continue,
            ("text", _) => {
                let Some(t) = b.text else {
                    return Err(bad(format!("{at}: a text block needs text")));
                };
                text.push_str(&t);
                texts += 1;
            }
            ("tool_use", "assistant") => {
                let Some(id) = b.id.filter(|id| !id.is_empty()) else {
                    return Err(bad(format!("{at}: a tool_use block needs an id")));
                };
                let Some(name) = b.name else {
                    return Err(bad(format!("{at}: a tool_use block needs a name")));
                };
                tools::check_name(&name).map_err(|why| bad(format!("{at}.name {name:?} {why}")))?;
                let input = match b.input {
                    Some(o @ Value::Object(_)) => o,
                    _ => return Err(bad(format!("{at}.input must be an object"))),
                };
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
                call_ids.push(id);
            }
            ("tool_result", "user") => {
                let Some(id) = b.tool_use_id else {
                    return Err(bad(format!("{at}: a tool_result block needs tool_use_id")));
                };
                if texts > 0 {
                    return Err(bad(format!(
                        "{at}: tool_result blocks must come before any text in a user message"
                    )));
                }
                ids.result(&id)
                    .map_err(|why| bad(format!("{at} (tool_result): {why}")))?;
                let content = result_text(b.content, b.is_error.unwrap_or(false), &at)?;
                out.push(Message::tool_result(&id, &content));
                results += 1;
            }
            (kind @ ("tool_use" | "tool_result"), role) => {
                return Err(bad(format!("{at}: a {kind} block cannot be in a {role} message")))
            }
            (kind, _) => {
                return Err(bad(format!(
                    "{at}: content block of type {kind:?} is not supported (text, tool_use, tool_result)"
                )))
            }
        }
    }
    if !calls.is_empty() {
        ids.calls(call_ids);
        out.push(Message::assistant_calls(&text, calls));
    } else if texts > 0 || results == 0 {
        ids.other();
        out.push(Message::new(&m.role, &text));
    }
    if let (Some(r), Some(last)) = (reasoning, out.last_mut()) {
        last.reasoning_content = Some(r);
    }
    Ok(())
}

/// `POST /v1/messages`.
pub async fn messages(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match messages_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(Flavor::Anthropic).into_response(),
    }
}

async fn messages_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: MessagesRequest = parse_body(body, st.config.max_body_bytes)?;
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid_param("max_tokens", "max_tokens is required"));
    };
    let stream = req.stream.unwrap_or(false);
    let (mut ask, plan, omit_thinking) = ask(&st, req)?;
    // Anthropic's rule: the reasoning's budget leaves room for an answer.
    if ask.think_budget.is_some_and(|b| b as u64 >= max_tokens) {
        return Err(ApiError::invalid_param(
            "max_tokens",
            "max_tokens must be greater than thinking.budget_tokens",
        ));
    }
    ask.max_tokens = Some(max_tokens);
    let id = ask.id.clone();
    let ticket = submit(&st, ask).await?;
    let reply = Reply {
        id,
        model: st.model.id.clone(),
        shape: answer_shape(&st, &ticket, plan),
        omit_thinking,
    };
    if stream {
        Ok(reply.stream(ticket))
    } else {
        reply.whole(ticket).await
    }
}

/// `POST /v1/messages/count_tokens`: how many tokens the prompt of the same
/// request to `/v1/messages` takes (system, messages, tools, thinking, all
/// through the chat template), as `{"input_tokens": N}`; nothing runs.
pub async fn count_tokens(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match count_tokens_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(Flavor::Anthropic).into_response(),
    }
}

async fn count_tokens_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: MessagesRequest = parse_body(body, st.config.max_body_bytes)?;
    let (ask, _, _) = ask(&st, req)?;
    check_target(&st, ask.model.as_deref(), &ask.prompt)?;
    let ids = prompt_ids(&st, ask.prompt, ask.tools, ask.prefill, ask.template_kwargs).await?;
    Ok(json_response(StatusCode::OK, &json!({"input_tokens": ids.len()})))
}

/// What a Messages request asks of the engine (its `max_tokens` left to
/// the caller), its tool plan, and whether thinking comes back without
/// its text (`display: "omitted"`).
fn ask(st: &AppState, req: MessagesRequest) -> Result<(Ask, Option<tools::ToolPlan>, bool), ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    let tool_defs = parse_tools(req.tools)?;
    let choice = parse_choice(req.tool_choice)?;
    let config = req.output_config.filter(|c| !c.is_null());
    if config.as_ref().is_some_and(|c| !c.is_object()) {
        return Err(ApiError::invalid_param(
            "output_config",
            "output_config must be an object",
        ));
    }
    let config_format = config.as_ref().and_then(|c| c.get("format")).cloned();
    if config_format.as_ref().is_some_and(|f| !f.is_null()) && req.output_format.as_ref().is_some_and(|f| !f.is_null())
    {
        return Err(ApiError::invalid_param(
            "output_config",
            "give output_config.format or output_format, not both",
        ));
    }
    let format = match structured::output_format(config_format, "output_config.format")? {
        Some(g) => Some((g, "output_config.format")),
        None => structured::output_format(req.output_format, "output_format")?.map(|g| (g, "output_format")),
    };
    let grammar = structured::grammar(req.grammar)?;
    let thinking = Thinking::parse(req.thinking.as_ref(), config.as_ref())?;
    let mut template_kwargs = reasoning::template_kwargs(None, thinking.on, "thinking")?;
    // Harmony cannot turn reasoning off: `disabled` asks for the least;
    // otherwise the requested effort (`max`: gpt-oss's highest).
    let effort = match (thinking.on, thinking.effort) {
        (Some(false), _) => Some("low"),
        (_, Some("max")) => Some("high"),
        (_, e) => e,
    };
    reasoning::harmony_effort(&mut template_kwargs, speaks_harmony(st), effort);
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system {
        messages.push(Message::new("system", &system.text("system")?));
    }
    let mut ids = CallIds::default();
    for (i, m) in req.messages.into_iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(ApiError::invalid_param(
                "messages",
                format!("role must be \"user\" or \"assistant\", got {:?}", m.role),
            ));
        }
        convert(m, i, &mut ids, &mut messages)?;
    }
    let syntax = tool_syntax(st);
    let plan = tools::plan(syntax, tool_defs, choice, "tools", "tool_choice")?;
    tools::check_history(syntax, &messages, "messages")?;
    let (prompt_messages, template_tools) = tools::prepare(syntax, plan.as_ref(), messages.clone());
    let grammar = structured::pick(plan.as_ref().and_then(|p| p.grammar.clone()), grammar, format)?;
    let ask = Ask {
        api: "messages",
        id: new_id("msg_"),
        model: req.model,
        prompt: PromptInput::Chat(prompt_messages),
        max_tokens: None,
        sampling: SamplingFields {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            ..SamplingFields::default()
        },
        ignore_eos: false,
        seed: None,
        stop: req.stop_sequences.unwrap_or_default(),
        stop_param: "stop_sequences",
        max_tokens_param: "max_tokens",
        logprobs: None,
        tools: template_tools,
        template_kwargs,
        prefill: plan.as_ref().map(|p| p.prefill.clone()).unwrap_or_default(),
        grammar,
        think_budget: thinking.budget,
    };
    Ok((ask, plan, thinking.omit))
}

struct Reply {
    id: String,
    model: String,
    /// How the answer splits: thinking, text, tool calls.
    shape: Shape,
    /// Thinking blocks without their text (`display: "omitted"`); the
    /// signature is still the text's.
    omit_thinking: bool,
}

/// Content blocks sent so far in a stream.
#[derive(Default)]
struct Blocks {
    /// The next block's index.
    next: usize,
    /// The text block being written, if one is open.
    open_text: Option<usize>,
    /// The thinking block being written, and its text so far (for its
    /// signature).
    open_thinking: Option<(usize, String)>,
    /// A text block was opened.
    wrote_text: bool,
    calls: usize,
}

/// Closes the open thinking block, if any: its signature, then its stop.
async fn close_thinking(out: &SseWriter, b: &mut Blocks) -> bool {
    let Some((i, all)) = b.open_thinking.take() else {
        return true;
    };
    let sig = json!({"type": "content_block_delta", "index": i,
                     "delta": {"type": "signature_delta", "signature": signature(&all)}});
    out.event("content_block_delta", &sig).await
        && out
            .event("content_block_stop", &json!({"type": "content_block_stop", "index": i}))
            .await
}

/// A thinking block's `signature`: the SHA-256 of its text, in hex (a
/// checksum; charm needs no proof that a client returned it unchanged).
fn signature(thinking: &str) -> String {
    Sha256::digest(thinking.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `stop_reason`: `end_turn`, `max_tokens` or `stop_sequence`.
fn stop_reason(s: &Summary) -> &'static str {
    match (s.finish, &s.stop_sequence) {
        (_, Some(_)) => "stop_sequence",
        (FinishReason::Stop, None) => "end_turn",
        (FinishReason::Length, None) => "max_tokens",
    }
}

fn failed(message: String, bad_input: bool) -> ApiError {
    let kind = if bad_input {
        ErrorKind::InvalidRequest
    } else {
        ErrorKind::Server
    };
    ApiError::new(kind, message).flavor(Flavor::Anthropic)
}

/// A message's `usage`: prompt tokens served from the prefix cache are
/// `cache_read_input_tokens`, the rest `input_tokens` (nothing is written
/// to a cache the client pays for, so `cache_creation_input_tokens` is 0).
/// Before the end (`summary` None) every prompt token is an input token.
fn usage(prompt_tokens: usize, summary: Option<&Summary>) -> Value {
    let cached = summary.map_or(0, |s| s.cached_tokens);
    json!({
        "input_tokens": prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": summary.map_or(0, |s| s.completion_tokens),
    })
}

impl Reply {
    /// A `message` object; `tool_use`: the model called tools (that is the
    /// stop reason then).
    fn message(&self, content: Value, summary: Option<&Summary>, input_tokens: usize, tool_use: bool) -> Value {
        let (reason, sequence) = match summary {
            Some(_) if tool_use => (Some("tool_use"), None),
            Some(s) => (Some(stop_reason(s)), s.stop_sequence.clone()),
            None => (None, None),
        };
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(input_tokens, summary),
        })
    }

    async fn whole(self, mut ticket: Ticket) -> Result<Response, ApiError> {
        let mut text = String::new();
        let summary = loop {
            match ticket.events.recv().await {
                Some(Event::Delta { text: t, .. }) => text.push_str(&t),
                Some(Event::Done(s)) => break s,
                Some(Event::Failed { message, bad_input }) => return Err(failed(message, bad_input)),
                None => return Err(failed("the engine stopped".into(), false)),
            }
        };
        let a = answer::whole(&self.shape, &text);
        self.warn(&a.warnings);
        let mut blocks = Vec::new();
        if !a.reasoning.is_empty() {
            let shown = if self.omit_thinking { "" } else { a.reasoning.as_str() };
            blocks.push(json!({"type": "thinking", "thinking": shown, "signature": signature(&a.reasoning)}));
        }
        // A plain answer always has its text block (empty or not).
        if a.calls.is_empty() || !a.content.is_empty() {
            blocks.push(json!({"type": "text", "text": a.content}));
        }
        for c in &a.calls {
            blocks.push(json!({"type": "tool_use", "id": new_id("toolu_"), "name": c.name, "input": c.arguments}));
        }
        let (tool_use, warnings) = (!a.calls.is_empty(), a.warnings);
        let mut body = self.message(Value::Array(blocks), Some(&summary), summary.prompt_tokens, tool_use);
        if !warnings.is_empty() {
            body["warnings"] = json!(warnings);
        }
        Ok(json_response(StatusCode::OK, &body))
    }

    /// Logs why tool-call blocks were left in the text.
    fn warn(&self, warnings: &[String]) {
        for w in warnings {
            tracing::warn!("{}: {w}", self.id);
        }
    }

    /// Sends reasoning as `thinking_delta`s in a thinking block (closed by
    /// its `signature_delta` when the answer starts), text pieces as
    /// `text_delta`s (opening a text block when none is open) and calls as
    /// whole `tool_use` blocks (start, one `input_json_delta`, stop).
    async fn send_pieces(&self, out: &SseWriter, pieces: Vec<Out>, b: &mut Blocks) -> bool {
        for piece in pieces {
            if !matches!(piece, Out::Reasoning(_)) && !close_thinking(out, b).await {
                return false;
            }
            match piece {
                Out::Reasoning(r) => {
                    let index = match &mut b.open_thinking {
                        Some((i, all)) => {
                            all.push_str(&r);
                            *i
                        }
                        None => {
                            let i = b.next;
                            b.next += 1;
                            b.open_thinking = Some((i, r.clone()));
                            let start = json!({"type": "content_block_start", "index": i,
                                               "content_block": {"type": "thinking", "thinking": "", "signature": ""}});
                            if !out.event("content_block_start", &start).await {
                                return false;
                            }
                            i
                        }
                    };
                    let delta = json!({"type": "content_block_delta", "index": index,
                                       "delta": {"type": "thinking_delta", "thinking": r}});
                    if !self.omit_thinking && !out.event("content_block_delta", &delta).await {
                        return false;
                    }
                }
                Out::Text(text) => {
                    let index = match b.open_text {
                        Some(i) => i,
                        None => {
                            let i = b.next;
                            b.next += 1;
                            b.open_text = Some(i);
                            b.wrote_text = true;
                            let start = json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}});
                            if !out.event("content_block_start", &start).await {
                                return false;
                            }
                            i
                        }
                    };
                    let delta = json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}});
                    if !out.event("content_block_delta", &delta).await {
                        return false;
                    }
                }
                Out::Call(c) => {
                    if let Some(i) = b.open_text.take() {
                        if !out
                            .event("content_block_stop", &json!({"type": "content_block_stop", "index": i}))
                            .await
                        {
                            return false;
                        }
                    }
                    let i = b.next;
                    b.next += 1;
                    b.calls += 1;
                    let frames = [
                        (
                            "content_block_start",
                            json!({"type": "content_block_start", "index": i, "content_block": {
                                "type": "tool_use", "id": new_id("toolu_"), "name": c.name, "input": {}}}),
                        ),
                        (
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": i, "delta": {
                                "type": "input_json_delta", "partial_json": c.arguments_json()}}),
                        ),
                        ("content_block_stop", json!({"type": "content_block_stop", "index": i})),
                    ];
                    for (name, frame) in frames {
                        if !out.event(name, &frame).await {
                            return false;
                        }
                    }
                }
            }
        }
        true
    }

    fn stream(self, mut ticket: Ticket) -> Response {
        let (out, resp) = SseWriter::channel();
        tokio::spawn(async move {
            let start = json!({"type": "message_start",
                               "message": self.message(json!([]), None, ticket.prompt_tokens, false)});
            if !out.event("message_start", &start).await {
                return;
            }
            let mut parser = AnswerStream::new(&self.shape);
            let mut blocks = Blocks::default();
            if self.shape.tools.is_none() && self.shape.think.is_none() && !self.shape.harmony {
                // Without tools the one text block opens at once.
                let block =
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
                if !out.event("content_block_start", &block).await {
                    return;
                }
                blocks.open_text = Some(0);
                blocks.wrote_text = true;
                blocks.next = 1;
            }
            loop {
                let event = tokio::select! {
                    e = ticket.events.recv() => e,
                    _ = out.closed() => return,
                };
                match event {
                    Some(Event::Delta { text, .. }) => {
                        if text.is_empty() {
                            continue;
                        }
                        let pieces = parser.push(&text);
                        if !self.send_pieces(&out, pieces, &mut blocks).await {
                            return;
                        }
                    }
                    Some(Event::Done(s)) => {
                        let pieces = parser.finish();
                        self.warn(parser.warnings());
                        if !self.send_pieces(&out, pieces, &mut blocks).await
                            || !close_thinking(&out, &mut blocks).await
                        {
                            return;
                        }
                        let mut frames = Vec::new();
                        if blocks.calls == 0 && blocks.open_text.is_none() && !blocks.wrote_text {
                            // No text: one empty text block, as the whole answer has.
                            let i = blocks.next;
                            frames.push((
                                "content_block_start",
                                json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}),
                            ));
                            blocks.open_text = Some(i);
                        }
                        if let Some(i) = blocks.open_text {
                            frames.push(("content_block_stop", json!({"type": "content_block_stop", "index": i})));
                        }
                        let (reason, sequence) = if blocks.calls > 0 {
                            ("tool_use", None)
                        } else {
                            (stop_reason(&s), s.stop_sequence.clone())
                        };
                        frames.push((
                            "message_delta",
                            json!({
                                "type": "message_delta",
                                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                "usage": usage(s.prompt_tokens, Some(&*s)),
                            }),
                        ));
                        frames.push(("message_stop", json!({"type": "message_stop"})));
                        for (name, frame) in frames {
                            if !out.event(name, &frame).await {
                                return;
                            }
                        }
                        return;
                    }
                    Some(Event::Failed { message, bad_input }) => {
                        out.event("error", &failed(message, bad_input).body()).await;
                        return;
                    }
                    None => {
                        out.event("error", &failed("the engine stopped".into(), false).body())
                            .await;
                        return;
                    }
                }
            }
        });
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{block_on, body, plan, sse, ticket};
    use super::*;
    use crate::engine::FinishReason;
    use crate::server::tools::ToolPlan;

    fn reply(tools: Option<ToolPlan>) -> Reply {
        Reply {
            id: "msg_test".into(),
            model: "m".into(),
            omit_thinking: false,
            shape: Shape {
                tools,
                ..Shape::default()
            },
        }
    }

    fn whole(tools: Option<ToolPlan>, pieces: &[&str]) -> Value {
        block_on(async {
            let r = reply(tools).whole(ticket(pieces, FinishReason::Stop)).await.unwrap();
            serde_json::from_str(&body(r).await).unwrap()
        })
    }

    fn stream(tools: Option<ToolPlan>, pieces: &[&str]) -> Vec<(Option<String>, Value)> {
        block_on(async { sse(&body(reply(tools).stream(ticket(pieces, FinishReason::Stop))).await) })
    }

    const CALL: [&str; 2] = [
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    ];

    #[test]
    fn a_call_is_a_tool_use_block() {
        let v = whole(Some(plan(&["get_weather"], Choice::Auto)), &CALL);
        assert_eq!(v["stop_reason"], "tool_use");
        assert!(v["stop_sequence"].is_null());
        assert_eq!(v["content"][0], json!({"type": "text", "text": "Checking."}));
        let t = &v["content"][1];
        assert_eq!(t["type"], "tool_use");
        assert!(t["id"].as_str().unwrap().starts_with("toolu_"), "{t}");
        assert_eq!(t["name"], "get_weather");
        assert_eq!(t["input"], json!({"city": "Paris"}));
    }

    #[test]
    fn a_malformed_call_stays_text() {
        let v = whole(
            Some(plan(&["get_weather"], Choice::Auto)),
            &["<tool_call>oops</tool_call>"],
        );
        assert_eq!(v["stop_reason"], "end_turn");
        assert_eq!(
            v["content"],
            json!([{"type": "text", "text": "<tool_call>oops</tool_call>"}])
        );
        assert!(v["warnings"][0].as_str().unwrap().contains("not valid JSON"));
    }

    #[test]
    fn streamed_calls_are_tool_use_blocks_with_input_json_deltas() {
        let ev = stream(Some(plan(&["get_weather"], Choice::Auto)), &CALL);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[1].1["content_block"]["type"], "text");
        assert_eq!(ev[2].1["delta"], json!({"type": "text_delta", "text": "Checking."}));
        assert_eq!(ev[3].1["index"], 0);
        assert_eq!(ev[4].1["index"], 1);
        let block = &ev[4].1["content_block"];
        assert_eq!(block["type"], "tool_use");
        assert_eq!(block["name"], "get_weather");
        assert_eq!(block["input"], json!({}));
        assert!(block["id"].as_str().unwrap().starts_with("toolu_"));
        assert_eq!(ev[5].1["delta"]["type"], "input_json_delta");
        let input: Value = serde_json::from_str(ev[5].1["delta"]["partial_json"].as_str().unwrap()).unwrap();
        assert_eq!(input, json!({"city": "Paris"}));
        assert_eq!(ev[6].1["index"], 1);
        assert_eq!(ev[7].1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn a_stream_that_starts_with_a_call_opens_no_text_block() {
        let p = plan(&["get_weather"], Choice::Named("get_weather".into()));
        let ev = stream(Some(p), &["{}}\n</tool_call>"]);
        assert_eq!(ev[1].1["content_block"]["type"], "tool_use");
        assert_eq!(ev[1].1["index"], 0);
        let starts = ev
            .iter()
            .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
            .count();
        assert_eq!(starts, 1);
    }

    #[test]
    fn a_stream_with_tools_and_no_text_still_has_one_text_block() {
        let ev = stream(Some(plan(&["get_weather"], Choice::Auto)), &[]);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[3].1["delta"]["stop_reason"], "end_turn");
    }

    #[test]
    fn reasoning_comes_back_as_a_signed_thinking_block_whole_and_streamed() {
        let pieces = ["<think>\nweigh", " it up</think>\n\n", "Paris."];
        let shaped = || Reply {
            id: "msg_test".into(),
            model: "m".into(),
            omit_thinking: false,
            shape: Shape {
                think: Some(false),
                harmony: false,
                tools: None,
            },
        };
        let events = assert_thinking_then_paris(shaped, &pieces);
        let data: Vec<&Value> = events.iter().map(|(_, v)| v).collect();
        let sig: Vec<&Value> = data
            .iter()
            .copied()
            .filter(|d| d["delta"]["type"] == "signature_delta")
            .collect();
        assert_eq!(sig.len(), 1);
        assert_eq!(sig[0]["index"], 0);
        assert_eq!(sig[0]["delta"]["signature"], signature("weigh it up"));
    }
    #[test]
    fn a_harmony_answer_comes_back_as_a_thinking_block_and_text() {
        let pieces = [
            "<|channel|>analysis<|message|>",
            "weigh",
            " it up",
            "<|end|>",
            "<|start|>assistant<|channel|>final<|message|>",
            "Paris.",
            "<|return|>",
        ];
        let shaped = || Reply {
            id: "msg_test".into(),
            model: "m".into(),
            omit_thinking: false,
            shape: Shape {
                harmony: true,
                ..Shape::default()
            },
        };
        assert_thinking_then_paris(shaped, &pieces);
    }

    #[test]
    fn omitted_thinking_comes_back_without_its_text_but_signed() {
        let pieces = ["<think>\nweigh", " it up</think>\n\n", "Paris."];
        let shaped = || Reply {
            id: "msg_test".into(),
            model: "m".into(),
            omit_thinking: true,
            shape: Shape {
                think: Some(false),
                ..Shape::default()
            },
        };
        let v: Value = block_on(async {
            let r = shaped().whole(ticket(&pieces, FinishReason::Stop)).await.unwrap();
            serde_json::from_str(&body(r).await).unwrap()
        });
        assert_eq!(
            v["content"],
            json!([{"type": "thinking", "thinking": "", "signature": signature("weigh it up")},
                   {"type": "text", "text": "Paris."}])
        );
        let events = block_on(async { sse(&body(shaped().stream(ticket(&pieces, FinishReason::Stop))).await) });
        let data: Vec<&Value> = events.iter().map(|(_, v)| v).collect();
        assert!(data.iter().all(|d| d["delta"]["type"] != "thinking_delta"), "{data:?}");
        let sig: Vec<&Value> = data
            .iter()
            .filter(|d| d["delta"]["type"] == "signature_delta")
            .copied()
            .collect();
        assert_eq!(sig.len(), 1);
        assert_eq!(sig[0]["delta"]["signature"], signature("weigh it up"));
        let text: String = data.iter().filter_map(|d| d["delta"]["text"].as_str()).collect();
        assert_eq!(text, "Paris.");
    }

    #[test]
    fn thinking_and_effort_read_as_anthropic_sends_them() {
        let parse = |t: Value, c: Value| Thinking::parse(Some(&t).filter(|t| !t.is_null()), Some(&c));
        let on = |budget, omit, effort| Thinking {
            on: Some(true),
            budget,
            omit,
            effort,
        };
        assert_eq!(
            parse(json!({"type": "enabled", "budget_tokens": 2048}), json!({})).unwrap(),
            on(Some(2048), false, None)
        );
        assert_eq!(
            parse(json!({"type": "adaptive"}), json!({"effort": "max"})).unwrap(),
            on(None, false, Some("max"))
        );
        assert_eq!(
            parse(json!({"type": "adaptive", "display": "omitted"}), json!({})).unwrap(),
            on(None, true, None)
        );
        assert_eq!(parse(json!({"type": "disabled"}), json!({})).unwrap().on, Some(false));
        assert_eq!(
            parse(Value::Null, json!({"effort": "low"})).unwrap().effort,
            Some("low")
        );
        for (t, c) in [
            (json!({"type": "sometimes"}), json!({})),
            (json!({"type": "adaptive", "budget_tokens": 1024}), json!({})),
            (json!({"type": "enabled", "budget_tokens": -1}), json!({})),
            (json!({"type": "enabled", "display": "full"}), json!({})),
            (json!({"type": "adaptive"}), json!({"effort": "extreme"})),
        ] {
            assert!(parse(t.clone(), c.clone()).is_err(), "{t} {c}");
        }
    }

    /// `pieces` answered whole and streamed by `shaped()`: a thinking block
    /// "weigh it up" (signed) then the text "Paris."; returns the stream's events.
    fn assert_thinking_then_paris(shaped: impl Fn() -> Reply, pieces: &[&str]) -> Vec<(Option<String>, Value)> {
        let v: Value = block_on(async {
            let r = shaped().whole(ticket(pieces, FinishReason::Stop)).await.unwrap();
            serde_json::from_str(&body(r).await).unwrap()
        });
        assert_eq!(
            v["content"],
            json!([{"type": "thinking", "thinking": "weigh it up", "signature": signature("weigh it up")},
                   {"type": "text", "text": "Paris."}])
        );
        let events = block_on(async { sse(&body(shaped().stream(ticket(pieces, FinishReason::Stop))).await) });
        let data: Vec<&Value> = events.iter().map(|(_, v)| v).collect();
        let starts: Vec<&Value> = data
            .iter()
            .filter(|d| d["type"] == "content_block_start")
            .map(|d| &d["content_block"]["type"])
            .collect();
        assert_eq!(starts, [&json!("thinking"), &json!("text")]);
        let thinking: String = data.iter().filter_map(|d| d["delta"]["thinking"].as_str()).collect();
        let text: String = data.iter().filter_map(|d| d["delta"]["text"].as_str()).collect();
        assert_eq!((thinking.as_str(), text.as_str()), ("weigh it up", "Paris."));
        events
    }
}
