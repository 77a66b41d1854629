//! The OpenAI API: `POST /v1/chat/completions` and `POST /v1/completions`,
//! streaming (SSE chunks, then `data: [DONE]`) and not.
//!
//! Fields: `model`, `messages` / `prompt`, `max_tokens` /
//! `max_completion_tokens`, the sampling fields of [`super::sampling`]
//! (`temperature`, `top_p`, `presence_penalty`, `frequency_penalty`,
//! `logit_bias`; the extensions `top_k`, `min_p`, `repetition_penalty`;
//! omitted ones take the model's recommended settings), `seed`, `stop` (a
//! string or a list), `stream`, `stream_options.include_usage`, `logprobs` /
//! `top_logprobs` (chat) or `logprobs: N` (completions), `n` (1 only).
//! `ignore_eos` (generate `max_tokens` whatever the model's
//! end-of-sequence tokens, for benchmarks; as llama.cpp and vLLM accept
//! it) is accepted as an extension. Log-probabilities are those of the
//! model's distribution (`log_softmax(logits)`, before temperature).
//!
//! Structured output: `response_format` (`json_object`, `json_schema`) and
//! the `grammar` extension (a Lark grammar), enforced by masking the logits
//! each step ([`super::structured`], [`crate::grammar`]).
//!
//! Tools (chat): `tools` (function tools), `tool_choice` (`auto`, `none`,
//! `required`, `{"type": "function", "function": {"name"}}`), assistant
//! `tool_calls` and `tool` messages, rendered through the chat template;
//! the model's calls come back as `message.tool_calls` (streamed as
//! `delta.tool_calls`) with `finish_reason: "tool_calls"` (see [`super::tools`]).
//!
//! Reasoning (chat): `reasoning_effort` (`"none"` turns thinking off),
//! `chat_template_kwargs`, and `thinking_token_budget` (an extension, as
//! vLLM names it: the most tokens the reasoning may take before the
//! server closes it, [`super::think_budget`]); the reasoning comes back as
//! `reasoning_content`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::answer::{self, AnswerStream, Out, Shape};
use super::error::{ApiError, ErrorKind};
use super::queue::{Event, Summary, Token};
use super::reasoning;
use super::sampling::SamplingFields;
use super::sse::SseWriter;
use super::structured;
use super::think_budget::budget_tokens;
use super::tools::{self, CallIds, Choice, ToolDef};
use super::{
    answer_shape, json_response, new_id, parse_body, speaks_harmony, submit, tool_syntax, AppState, Ask, PromptInput,
    StopField, Ticket,
};
use crate::chat_template::Message;
use crate::engine::FinishReason;
use crate::text::TextCodec;

/// Most alternatives per token (`top_logprobs` of chat completions).
const MAX_TOP_LOGPROBS: usize = 20;
/// Most alternatives per token (`logprobs` of completions).
const MAX_COMPLETION_LOGPROBS: usize = 5;
/// `max_tokens` of `/v1/completions` when absent, as OpenAI documents it.
const COMPLETIONS_DEFAULT_MAX_TOKENS: u64 = 16;

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(flatten)]
    sampling: SamplingFields,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<StopField>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<usize>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    /// Accepted; every call the model writes is returned.
    #[serde(default)]
    #[allow(dead_code)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    functions: Option<Value>,
    #[serde(default)]
    function_call: Option<Value>,
    #[serde(default)]
    response_format: Option<Value>,
    /// A Lark grammar (an extension, see [`super::structured`]).
    #[serde(default)]
    grammar: Option<Value>,
    /// Template variables (`enable_thinking`, …), as vLLM takes them.
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    /// `"none"` turns thinking off; any other effort leaves it on. A
    /// harmony template (gpt-oss) gets it as its `reasoning_effort`.
    #[serde(default)]
    reasoning_effort: Option<String>,
    /// The most tokens the reasoning may take (vLLM's field; see
    /// [`super::think_budget`]).
    #[serde(default)]
    thinking_token_budget: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    /// An earlier answer's reasoning, for templates that show it.
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Value>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    #[serde(default)]
    model: Option<String>,
    prompt: PromptField,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(flatten)]
    sampling: SamplingFields,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<StopField>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    logprobs: Option<usize>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    suffix: Option<String>,
    /// Candidates generated to return the best: only 1 (as `n`).
    #[serde(default)]
    best_of: Option<u32>,
    #[serde(default)]
    response_format: Option<Value>,
    /// A Lark grammar (an extension, see [`super::structured`]).
    #[serde(default)]
    grammar: Option<Value>,
}

/// `prompt`: text, token ids, or a list of one of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// `tools`: function tools, `{"type": "function", "function": {name,
/// description, parameters}}` (`strict` and other fields are ignored).
fn parse_tools(v: Option<Value>) -> Result<Vec<ToolDef>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("tools", m);
    let list = tools::tool_list(v).map_err(bad)?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.into_iter().enumerate() {
        let Value::Object(mut t) = t else {
            return Err(bad(format!("tools[{i}] is not an object")));
        };
        match t.get("type") {
            Some(Value::String(k)) if k == "function" => {}
            Some(Value::String(k)) => {
                return Err(bad(format!(
                    "tools[{i}].type is {k:?}; only \"function\" tools are supported"
                )))
            }
            _ => return Err(bad(format!("tools[{i}].type must be \"function\""))),
        }
        let Some(Value::Object(mut f)) = t.remove("function") else {
            return Err(bad(format!("tools[{i}].function is missing or not an object")));
        };
        out.push(ToolDef::from_fields(&mut f, &format!("tools[{i}].function"), "parameters", false).map_err(bad)?);
    }
    Ok(out)
}

/// `tool_choice`: `auto` (the default), `none`, `required` or
/// `{"type": "function", "function": {"name": NAME}}`.
fn parse_choice(v: Option<Value>) -> Result<Choice, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": NAME}}",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(Choice::Auto),
        Some(Value::String(s)) => Choice::from_word(&s).ok_or_else(bad),
        Some(Value::Object(o)) => match (o.get("type").and_then(Value::as_str), o.get("function")) {
            (Some("function"), Some(f)) => match f.get("name").and_then(Value::as_str) {
                Some(n) => Ok(Choice::Named(n.to_string())),
                None => Err(bad()),
            },
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

/// An assistant message's `tool_calls` (`i`: the message's index): their
/// ids, and the calls as templates get them (`arguments` parsed from the
/// JSON string into an object, as transformers' templates expect).
fn parse_calls(v: Value, i: usize) -> Result<(Vec<String>, Vec<Value>), ApiError> {
    let bad = |m: String| ApiError::invalid_param("messages", m);
    let Value::Array(list) = v else {
        return Err(bad(format!("messages[{i}].tool_calls must be a list")));
    };
    let mut ids = Vec::with_capacity(list.len());
    let mut calls = Vec::with_capacity(list.len());
    for (j, c) in list.into_iter().enumerate() {
        let at = format!("messages[{i}].tool_calls[{j}]");
        let Value::Object(mut c) = c else {
            return Err(bad(format!("{at} is not an object")));
        };
        let id = match c.remove("id") {
            Some(Value::String(id)) if !id.is_empty() => id,
            _ => return Err(bad(format!("{at}.id is missing"))),
        };
        match c.get("type") {
            None => {}
            Some(Value::String(k)) if k == "function" => {}
            Some(_) => return Err(bad(format!("{at}.type must be \"function\""))),
        }
        let Some(Value::Object(mut f)) = c.remove("function") else {
            return Err(bad(format!("{at}.function is missing or not an object")));
        };
        let name = match f.remove("name") {
            Some(Value::String(n)) => n,
            _ => return Err(bad(format!("{at}.function.name is missing"))),
        };
        tools::check_name(&name).map_err(|why| bad(format!("{at}.function.name {name:?} {why}")))?;
        let arguments = match f.remove("arguments") {
            None | Some(Value::Null) => Value::Object(Default::default()),
            Some(Value::String(a)) => match serde_json::from_str::<Value>(&a) {
                Ok(obj @ Value::Object(_)) => obj,
                _ => {
                    return Err(bad(format!(
                        "{at}.function.arguments is not a JSON object string: {a:?}"
                    )))
                }
            },
            Some(obj @ Value::Object(_)) => obj,
            Some(_) => return Err(bad(format!("{at}.function.arguments must be a JSON string"))),
        };
        calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
        ids.push(id);
    }
    Ok((ids, calls))
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match chat_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: ChatRequest = parse_body(body, st.config.max_body_bytes)?;
    let stream = req.stream.unwrap_or(false);
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let (ask, plan) = chat_ask(&st, req)?;
    let want_logprobs = ask.logprobs.is_some();
    let id = ask.id.clone();
    let ticket = submit(&st, ask).await?;
    let reply = Reply {
        id,
        model: st.model.id.clone(),
        created: ticket.created,
        codec: st.codec.clone(),
        chat: true,
        shape: answer_shape(&st, &ticket, plan),
        logprobs: want_logprobs,
        include_usage,
    };
    if stream {
        Ok(reply.stream(ticket))
    } else {
        reply.whole(ticket).await
    }
}

/// What a chat request asks of the engine, and its tool plan (also what
/// `/tokenize` counts for `messages`).
pub(crate) fn chat_ask(st: &AppState, req: ChatRequest) -> Result<(Ask, Option<tools::ToolPlan>), ApiError> {
    if req.n.unwrap_or(1) != 1 {
        return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = req.top_logprobs.unwrap_or(0);
    if top > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"),
        ));
    }
    if top > 0 && !want_logprobs {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    if req.functions.is_some() || req.function_call.is_some() {
        return Err(ApiError::invalid_param(
            if req.functions.is_some() {
                "functions"
            } else {
                "function_call"
            },
            "functions / function_call (deprecated by OpenAI) are not supported; use tools / tool_choice",
        ));
    }
    let tool_defs = parse_tools(req.tools)?;
    let choice = parse_choice(req.tool_choice)?;
    let format = structured::response_format(req.response_format)?.map(|g| (g, "response_format"));
    let grammar = structured::grammar(req.grammar)?;
    let thinking_on = reasoning::effort_switch(req.reasoning_effort.as_deref(), "reasoning_effort")?;
    let mut template_kwargs =
        reasoning::template_kwargs(req.chat_template_kwargs, thinking_on, "chat_template_kwargs")?;
    reasoning::harmony_effort(
        &mut template_kwargs,
        speaks_harmony(st),
        req.reasoning_effort.as_deref(),
    );
    let mut messages = Vec::with_capacity(req.messages.len());
    let mut call_ids = CallIds::default();
    for (i, m) in req.messages.into_iter().enumerate() {
        let has_content = m.content.is_some();
        let text = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        ("text", None) => {
                            return Err(ApiError::invalid_param(
                                "messages",
                                format!("messages[{i}]: a content part of type \"text\" has no `text`"),
                            ))
                        }
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                "messages",
                                format!("content part of type {kind:?} is not supported (text only)"),
                            ))
                        }
                    }
                }
                text
            }
        };
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!(
                        "messages[{i}]: role {other:?} is not one of system, developer, user, assistant, tool{}",
                        if other == "function" {
                            " (function messages are deprecated by OpenAI; send tool messages)"
                        } else {
                            ""
                        }
                    ),
                ))
            }
        };
        // Only an assistant turn may leave its content out (a turn of calls).
        if !has_content && role != "assistant" {
            return Err(ApiError::invalid_param(
                "messages",
                format!("messages[{i}] ({}) has no content", m.role),
            ));
        }
        let calls = match m.tool_calls {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) if a.is_empty() => None,
            Some(v) if role == "assistant" => Some(parse_calls(v, i)?),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("messages[{i}]: only assistant messages carry tool_calls"),
                ))
            }
        };
        if role == "tool" {
            let Some(id) = m.tool_call_id else {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("messages[{i}]: a tool message needs tool_call_id"),
                ));
            };
            call_ids
                .result(&id)
                .map_err(|why| ApiError::invalid_param("messages", format!("messages[{i}] (tool): {why}")))?;
            messages.push(Message::tool_result(&id, &text));
        } else if let Some((ids, calls)) = calls {
            call_ids.calls(ids);
            messages.push(Message::assistant_calls(&text, calls));
        } else {
            call_ids.other();
            messages.push(Message::new(role, &text));
        }
        if let (Some(r), "assistant") = (m.reasoning_content, role) {
            if let Some(last) = messages.last_mut() {
                last.reasoning_content = Some(r);
            }
        }
    }
    let syntax = tool_syntax(st);
    let plan = tools::plan(syntax, tool_defs, choice, "tools", "tool_choice")?;
    tools::check_history(syntax, &messages, "messages")?;
    let (prompt_messages, template_tools) = tools::prepare(syntax, plan.as_ref(), messages.clone());
    let grammar = structured::pick(plan.as_ref().and_then(|p| p.grammar.clone()), grammar, format)?;
    let prefill = plan.as_ref().map(|p| p.prefill.clone()).unwrap_or_default();
    let ask = Ask {
        api: "chat",
        id: new_id("chatcmpl-"),
        model: req.model,
        prompt: PromptInput::Chat(prompt_messages),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        sampling: req.sampling,
        ignore_eos: req.ignore_eos,
        seed: req.seed,
        stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
        stop_param: "stop",
        max_tokens_param: if req.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        },
        logprobs: want_logprobs.then_some(top),
        tools: template_tools,
        template_kwargs,
        prefill,
        grammar,
        think_budget: req.thinking_token_budget.map(budget_tokens),
    };
    Ok((ask, plan))
}

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match completions_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(body, st.config.max_body_bytes)?;
    if req.n.unwrap_or(1) != 1 {
        return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
    }
    if req.echo.unwrap_or(false) {
        return Err(ApiError::invalid_param("echo", "echo is not supported"));
    }
    if req.suffix.is_some() {
        return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
    }
    if req.best_of.unwrap_or(1) != 1 {
        return Err(ApiError::invalid_param("best_of", "only best_of = 1 is supported"));
    }
    if let Some(n) = req.logprobs.filter(|n| *n > MAX_COMPLETION_LOGPROBS) {
        return Err(ApiError::invalid_param(
            "logprobs",
            format!("logprobs must be at most {MAX_COMPLETION_LOGPROBS}, got {n}"),
        ));
    }
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid_param("prompt", "exactly one prompt is supported"))
        }
    };
    let prompt = match req.prompt {
        PromptField::Text(t) => PromptInput::Text(t),
        PromptField::Ids(ids) => PromptInput::Ids(ids),
        PromptField::Texts(mut v) => {
            one(v.len())?;
            PromptInput::Text(v.remove(0))
        }
        PromptField::IdLists(mut v) => {
            one(v.len())?;
            PromptInput::Ids(v.remove(0))
        }
    };
    if let PromptInput::Ids(ids) = &prompt {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= st.model.vocab) {
            return Err(ApiError::invalid_param(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {}", st.model.vocab),
            ));
        }
    }
    let format = structured::response_format(req.response_format)?.map(|g| (g, "response_format"));
    let grammar = structured::pick(None, structured::grammar(req.grammar)?, format)?;
    let id = new_id("cmpl-");
    let ticket = submit(
        &st,
        Ask {
            api: "completions",
            id: id.clone(),
            model: req.model,
            prompt,
            max_tokens: Some(req.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)),
            sampling: req.sampling,
            ignore_eos: req.ignore_eos,
            seed: req.seed,
            stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
            stop_param: "stop",
            max_tokens_param: "max_tokens",
            logprobs: req.logprobs,
            tools: Vec::new(),
            template_kwargs: Vec::new(),
            prefill: String::new(),
            grammar,
            think_budget: None,
        },
    )
    .await?;
    let reply = Reply {
        id,
        model: st.model.id.clone(),
        created: ticket.created,
        codec: st.codec.clone(),
        chat: false,
        shape: Shape::default(),
        logprobs: req.logprobs.is_some(),
        include_usage: req.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
    };
    if req.stream.unwrap_or(false) {
        Ok(reply.stream(ticket))
    } else {
        reply.whole(ticket).await
    }
}

/// How to shape one request's answer.
struct Reply {
    id: String,
    model: String,
    created: u64,
    codec: Arc<TextCodec>,
    /// Chat completion (else legacy text completion).
    chat: bool,
    /// How the answer splits (chat): reasoning, text, tool calls.
    shape: Shape,
    logprobs: bool,
    include_usage: bool,
}

fn finish_reason(s: &Summary) -> &'static str {
    match s.finish {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// A failed generation as an API error.
fn failed(message: String, bad_input: bool) -> ApiError {
    let kind = if bad_input {
        ErrorKind::InvalidRequest
    } else {
        ErrorKind::Server
    };
    ApiError::new(kind, message)
}

impl Reply {
    /// A token's text (special tokens shown) for log-probability entries.
    fn token_text(&self, id: u32) -> String {
        self.codec.decode(&[id], false).unwrap_or_default()
    }

    /// Chat `logprobs.content` entries, or the legacy completions object.
    fn logprobs_json(&self, tokens: &[Token], text_offset: &mut usize) -> Value {
        if self.chat {
            let content: Vec<Value> = tokens
                .iter()
                .filter_map(|t| {
                    let lp = t.logprobs.as_ref()?;
                    let text = self.token_text(t.id);
                    let top: Vec<Value> = lp
                        .top
                        .iter()
                        .map(|&(id, l)| {
                            let s = self.token_text(id);
                            json!({"token": s, "logprob": l, "bytes": s.as_bytes()})
                        })
                        .collect();
                    Some(json!({"token": text, "logprob": lp.logprob, "bytes": text.as_bytes(), "top_logprobs": top}))
                })
                .collect();
            json!({ "content": content })
        } else {
            let mut toks = Vec::new();
            let mut lps = Vec::new();
            let mut tops = Vec::new();
            let mut offsets = Vec::new();
            for t in tokens {
                let Some(lp) = &t.logprobs else { continue };
                let text = self.token_text(t.id);
                offsets.push(*text_offset);
                *text_offset += text.len();
                toks.push(text);
                lps.push(lp.logprob);
                let top: serde_json::Map<String, Value> =
                    lp.top.iter().map(|&(id, l)| (self.token_text(id), json!(l))).collect();
                tops.push(Value::Object(top));
            }
            json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
        }
    }

    /// Waits for the whole generation; one JSON answer.
    async fn whole(self, mut ticket: Ticket) -> Result<Response, ApiError> {
        let mut text = String::new();
        let mut tokens = Vec::new();
        let summary = loop {
            match ticket.events.recv().await {
                Some(Event::Delta {
                    text: t,
                    tokens: mut ts,
                }) => {
                    text.push_str(&t);
                    tokens.append(&mut ts);
                }
                Some(Event::Done(s)) => break s,
                Some(Event::Failed { message, bad_input }) => return Err(failed(message, bad_input)),
                None => return Err(ApiError::new(ErrorKind::Server, "the engine stopped")),
            }
        };
        let logprobs = if self.logprobs {
            self.logprobs_json(&tokens, &mut 0)
        } else {
            Value::Null
        };
        let body = if self.chat {
            let mut finish = finish_reason(&summary);
            let a = answer::whole(&self.shape, &text);
            self.warn(&a.warnings);
            let warnings = a.warnings;
            let mut message = if a.calls.is_empty() {
                json!({"role": "assistant", "content": a.content})
            } else {
                finish = "tool_calls";
                let calls: Vec<Value> = a
                    .calls
                    .iter()
                    .map(|c| {
                        json!({"id": new_id("call_"), "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments_json()}})
                    })
                    .collect();
                let content = Some(a.content).filter(|c| !c.is_empty());
                json!({"role": "assistant", "content": content, "tool_calls": calls})
            };
            if !a.reasoning.is_empty() {
                message["reasoning_content"] = json!(a.reasoning);
            }
            let mut body = json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }],
                "usage": usage(&summary),
            });
            if !warnings.is_empty() {
                body["warnings"] = json!(warnings);
            }
            body
        } else {
            json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(&summary),
                }],
                "usage": usage(&summary),
            })
        };
        Ok(json_response(StatusCode::OK, &body))
    }

    /// One chunk object around `choice` (and `usage: null` when usage was asked for).
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            c["usage"] = usage.unwrap_or(Value::Null);
        }
        c
    }

    fn choice(&self, text: Option<&str>, logprobs: Value, finish: Option<&str>) -> Value {
        if self.chat {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None => json!({}),
            };
            json!([{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}])
        } else {
            json!([{"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}])
        }
    }

    /// Logs why tool-call blocks were left in the text.
    fn warn(&self, warnings: &[String]) {
        for w in warnings {
            tracing::warn!("{}: {w}", self.id);
        }
    }

    /// Sends reasoning as `delta.reasoning_content` chunks, text as
    /// `delta.content` chunks and calls as `delta.tool_calls` chunks (the
    /// id, type and name, then the arguments); held tokens'
    /// log-probabilities ride on the first chunk.
    async fn send_pieces(
        &self,
        out: &SseWriter,
        pieces: Vec<Out>,
        pending: &mut Vec<Token>,
        text_offset: &mut usize,
        calls: &mut usize,
    ) -> bool {
        for piece in pieces {
            let lp = if self.logprobs {
                self.logprobs_json(&std::mem::take(pending), text_offset)
            } else {
                Value::Null
            };
            let chunk = match piece {
                Out::Text(t) => self.choice(Some(&t), lp, None),
                Out::Reasoning(r) => {
                    json!([{"index": 0, "delta": {"reasoning_content": r}, "logprobs": lp, "finish_reason": null}])
                }
                Out::Call(c) => {
                    let index = *calls;
                    *calls += 1;
                    let head = json!([{"index": 0, "delta": {"tool_calls": [{
                        "index": index, "id": new_id("call_"), "type": "function",
                        "function": {"name": c.name, "arguments": ""}}]},
                        "logprobs": lp, "finish_reason": null}]);
                    if !out.data(&self.chunk(head, None)).await {
                        return false;
                    }
                    json!([{"index": 0, "delta": {"tool_calls": [{
                        "index": index, "function": {"arguments": c.arguments_json()}}]},
                        "logprobs": null, "finish_reason": null}])
                }
            };
            if !out.data(&self.chunk(chunk, None)).await {
                return false;
            }
        }
        true
    }

    /// Streams chunks as the engine produces text; `data: [DONE]` at the end.
    fn stream(self, mut ticket: Ticket) -> Response {
        let (out, resp) = SseWriter::channel();
        tokio::spawn(async move {
            if self.chat {
                let first = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
                if !out.data(&self.chunk(first, None)).await {
                    return;
                }
            }
            // Tokens whose text is still held back wait for the next text.
            let mut pending: Vec<Token> = Vec::new();
            let mut text_offset = 0;
            let mut parser = self.chat.then(|| AnswerStream::new(&self.shape));
            let mut calls = 0;
            loop {
                let event = tokio::select! {
                    e = ticket.events.recv() => e,
                    _ = out.closed() => return,
                };
                match event {
                    Some(Event::Delta { text, mut tokens }) => {
                        pending.append(&mut tokens);
                        if text.is_empty() {
                            continue;
                        }
                        let pieces = match &mut parser {
                            None => vec![Out::Text(text)],
                            Some(p) => p.push(&text),
                        };
                        if !self
                            .send_pieces(&out, pieces, &mut pending, &mut text_offset, &mut calls)
                            .await
                        {
                            return;
                        }
                    }
                    Some(Event::Done(s)) => {
                        if let Some(p) = &mut parser {
                            let pieces = p.finish();
                            self.warn(p.warnings());
                            if !self
                                .send_pieces(&out, pieces, &mut pending, &mut text_offset, &mut calls)
                                .await
                            {
                                return;
                            }
                        }
                        let lp = if self.logprobs && !pending.is_empty() {
                            self.logprobs_json(&pending, &mut text_offset)
                        } else {
                            Value::Null
                        };
                        let finish = if calls > 0 { "tool_calls" } else { finish_reason(&s) };
                        let last = self.choice(None, lp, Some(finish));
                        if !out.data(&self.chunk(last, None)).await {
                            return;
                        }
                        if self.include_usage && !out.data(&self.chunk(json!([]), Some(usage(&s)))).await {
                            return;
                        }
                        out.raw("[DONE]").await;
                        return;
                    }
                    Some(Event::Failed { message, bad_input }) => {
                        out.data(&failed(message, bad_input).body()).await;
                        return;
                    }
                    None => {
                        out.data(&ApiError::new(ErrorKind::Server, "the engine stopped").body())
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
    use super::super::testing::{block_on, body, codec, plan, sse, ticket};
    use super::*;
    use crate::engine::FinishReason;
    use crate::server::tools::{self, Choice, ToolPlan};

    fn reply(tools: Option<ToolPlan>) -> Reply {
        reply_shaped(Shape {
            tools,
            ..Shape::default()
        })
    }

    fn reply_shaped(shape: Shape) -> Reply {
        Reply {
            id: "chatcmpl-test".into(),
            model: "m".into(),
            created: 0,
            codec: codec(),
            chat: true,
            shape,
            logprobs: false,
            include_usage: false,
        }
    }

    fn whole(tools: Option<ToolPlan>, pieces: &[&str]) -> Value {
        block_on(async {
            let r = reply(tools).whole(ticket(pieces, FinishReason::Stop)).await.unwrap();
            serde_json::from_str(&body(r).await).unwrap()
        })
    }

    fn stream(tools: Option<ToolPlan>, pieces: &[&str]) -> Vec<Value> {
        block_on(async {
            let r = reply(tools).stream(ticket(pieces, FinishReason::Stop));
            sse(&body(r).await).into_iter().map(|(_, v)| v).collect()
        })
    }

    const CALL: [&str; 3] = [
        "I'll look.\n",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
        "\"Paris\"}}\n</tool_call>",
    ];

    #[test]
    fn a_call_in_the_text_is_a_tool_call() {
        let v = whole(Some(plan(&["get_weather"], Choice::Auto)), &CALL);
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], "I'll look.");
        let call = &c["message"]["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert!(v.get("warnings").is_none());
    }

    #[test]
    fn only_a_call_has_null_content_and_parallel_calls_keep_their_order() {
        let two = [
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n",
            "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": 1}}\n</tool_call>",
        ];
        let v = whole(Some(plan(&["a", "b"], Choice::Auto)), &two);
        let m = &v["choices"][0]["message"];
        assert!(m["content"].is_null(), "{m}");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "a");
        assert_eq!(m["tool_calls"][1]["function"]["arguments"], r#"{"x":1}"#);
        assert_ne!(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);
    }

    #[test]
    fn a_malformed_call_stays_text_with_a_warning() {
        let bad = ["<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"\n</tool_call>"];
        let v = whole(Some(plan(&["get_weather"], Choice::Auto)), &bad);
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "stop");
        assert_eq!(c["message"]["content"], bad[0]);
        assert!(c["message"].get("tool_calls").is_none());
        assert!(v["warnings"][0].as_str().unwrap().contains("not valid JSON"), "{v}");
    }

    #[test]
    fn without_tools_a_call_is_just_text() {
        let v = whole(None, &CALL);
        assert_eq!(v["choices"][0]["message"]["content"], CALL.concat());
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn a_named_choice_continues_the_prefilled_call() {
        let p = plan(&["get_weather", "search"], Choice::Named("search".into()));
        let v = whole(Some(p.clone()), &["{\"q\": \"x\"}}\n</tool_call>"]);
        let m = &v["choices"][0]["message"];
        assert_eq!(m["tool_calls"][0]["function"]["name"], "search");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], r#"{"q":"x"}"#);
        // A continuation that is no JSON: the raw text (prefill included), no call.
        let v = whole(Some(p.clone()), &["banana"]);
        let m = &v["choices"][0]["message"];
        assert_eq!(m["content"], format!("{}banana", p.prefill));
        assert!(m.get("tool_calls").is_none());
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn streamed_calls_are_tool_call_deltas() {
        let chunks = stream(Some(plan(&["get_weather"], Choice::Auto)), &CALL);
        assert_eq!(chunks.last().unwrap(), "[DONE]");
        let deltas: Vec<&Value> = chunks[..chunks.len() - 1]
            .iter()
            .map(|c| &c["choices"][0]["delta"])
            .collect();
        assert_eq!(deltas[0]["role"], "assistant");
        let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!(content, "I'll look.");
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
        assert_eq!(calls.len(), 2, "{chunks:?}");
        assert_eq!(calls[0][0]["index"], 0);
        assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(calls[0][0]["type"], "function");
        assert_eq!(calls[0][0]["function"]["name"], "get_weather");
        assert_eq!(calls[0][0]["function"]["arguments"], "");
        assert_eq!(calls[1][0]["index"], 0);
        assert_eq!(calls[1][0]["function"]["arguments"], r#"{"city":"Paris"}"#);
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_streamed_malformed_call_is_released_as_text_at_the_end() {
        let p = plan(&["get_weather"], Choice::Named("get_weather".into()));
        let chunks = stream(Some(p.clone()), &["not", " json"]);
        let content: String = chunks[..chunks.len() - 1]
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, format!("{}not json", p.prefill));
        assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "stop");
    }

    const THOUGHT: [&str; 4] = ["<think>\nweigh", " it up</th", "ink>\n\n", "Paris."];

    #[test]
    fn reasoning_comes_back_as_reasoning_content_whole_and_streamed() {
        let shape = Shape {
            think: Some(false),
            harmony: false,
            tools: None,
        };
        let (v, chunks) = whole_and_chunks(shape, &THOUGHT);
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        let m = &v["choices"][0]["message"];
        assert_eq!(m["reasoning_content"], "weigh it up");
        assert_eq!(m["content"], "Paris.");
        let r: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
        let c: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!((r.as_str(), c.as_str()), ("weigh it up", "Paris."));
        // A model whose template writes no thinking keeps the tags as text.
        let v = whole(None, &THOUGHT);
        assert_eq!(v["choices"][0]["message"]["content"], THOUGHT.concat());
        assert!(v["choices"][0]["message"].get("reasoning_content").is_none());
    }
    /// `pieces` answered whole and streamed under `shape`: the whole reply,
    /// and the streamed chunks but the final, empty one.
    fn whole_and_chunks(shape: Shape, pieces: &[&str]) -> (Value, Vec<Value>) {
        let v = block_on(async {
            let r = reply_shaped(shape.clone())
                .whole(ticket(pieces, FinishReason::Stop))
                .await
                .unwrap();
            serde_json::from_str::<Value>(&body(r).await).unwrap()
        });
        let chunks: Vec<Value> = block_on(async {
            let r = reply_shaped(shape).stream(ticket(pieces, FinishReason::Stop));
            sse(&body(r).await).into_iter().map(|(_, v)| v).collect()
        });
        (v, chunks[..chunks.len() - 1].to_vec())
    }

    /// A harmony answer as the engine decodes it for gpt-oss (markers kept),
    /// one token's text per piece.
    const HARMONY_CALL: [&str; 16] = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Need",
        " weather.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "commentary to=functions.get_weather",
        " ",
        "<|constrain|>",
        "json",
        "<|message|>",
        "{\"city\": \"Paris\"}",
        "<|call|>",
    ];

    #[test]
    fn a_harmony_answer_comes_back_as_reasoning_and_a_tool_call_whole_and_streamed() {
        let mut p = plan(&["get_weather"], Choice::Auto);
        p.syntax = tools::ToolSyntax::Harmony;
        let shape = Shape {
            think: None,
            harmony: true,
            tools: Some(p),
        };
        let (v, chunks) = whole_and_chunks(shape, &HARMONY_CALL);
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["reasoning_content"], "Need weather.");
        assert_eq!(c["message"]["content"], Value::Null);
        assert_eq!(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(
            c["message"]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Paris"}"#
        );
        let r: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
        let text: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!((r.as_str(), text.as_str()), ("Need weather.", ""));
        let args: String = deltas
            .iter()
            .filter_map(|d| d["tool_calls"][0]["function"]["arguments"].as_str())
            .collect();
        assert_eq!(args, r#"{"city":"Paris"}"#);
        assert_eq!(chunks[chunks.len() - 1]["choices"][0]["finish_reason"], "tool_calls");
        // A final answer: reasoning, then content; the end token is no text.
        let answer = [
            "<|channel|>analysis<|message|>",
            "Easy.",
            "<|end|>",
            "<|start|>assistant<|channel|>final<|message|>",
            "Paris",
            ".",
            "<|return|>",
        ];
        let shape = Shape {
            harmony: true,
            ..Shape::default()
        };
        let v = block_on(async {
            let r = reply_shaped(shape)
                .whole(ticket(&answer, FinishReason::Stop))
                .await
                .unwrap();
            serde_json::from_str::<Value>(&body(r).await).unwrap()
        });
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], "Easy.");
        assert_eq!(v["choices"][0]["message"]["content"], "Paris.");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}
