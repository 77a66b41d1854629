//! The OpenAI Responses API: `POST /v1/responses` (what Codex CLI and the
//! OpenAI Agents SDK speak), streaming and not, and `GET
//! /v1/responses/{id}` for stored responses.
//!
//! Request: `model`, `input` (a string, or items: messages with string or
//! `input_text` / `output_text` parts, `function_call`,
//! `function_call_output`, `reasoning`), `instructions` (a system
//! message), `tools` (function tools, flat: `name`, `description`,
//! `parameters`), `tool_choice` (`auto`, `none`, `required`, `{"type":
//! "function", "name"}`), `max_output_tokens`, `temperature`, `top_p`,
//! `text.format` (structured output, [`super::structured`]), `reasoning.
//! effort` (`"none"` turns thinking off; gpt-oss's harmony template gets
//! it as its `reasoning_effort`), `thinking_token_budget` (an extension:
//! the most tokens the reasoning may take, [`super::think_budget`]),
//! `store` (default true),
//! `previous_response_id` (continue a stored response: its conversation,
//! answer included, comes before `input`), `metadata`. Output items:
//! `reasoning` (the model's `<think>` text, or harmony's analysis channel,
//! as `reasoning_text`), `message`
//! (`output_text`), `function_call`.
//!
//! Streams send `response.created`, `response.in_progress`, per item
//! `response.output_item.added` / `.done` around its deltas
//! (`response.reasoning_text.delta`, `response.content_part.added`,
//! `response.output_text.delta` / `.done`, `response.content_part.done`,
//! `response.function_call_arguments.delta` / `.done`), then
//! `response.completed` (or `response.incomplete` when `max_output_tokens`
//! cut the answer), each with its `sequence_number`.
//!
//! Stored responses (conversation + response object) live in memory, the
//! most recent [`STORED_RESPONSES`] of them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::answer::{self, AnswerStream, Out, Shape};
use super::error::{ApiError, ErrorKind};
use super::queue::{Event, Summary};
use super::sampling::SamplingFields;
use super::sse::SseWriter;
use super::think_budget::budget_tokens;
use super::tools::{self, CallIds, Choice, ToolCall, ToolDef};
use super::{answer_shape, json_response, new_id, parse_body, reasoning, speaks_harmony, structured, submit};
use super::{tool_syntax, AppState, Ask};
use super::{PromptInput, Ticket};
use crate::chat_template::Message;
use crate::engine::FinishReason;

/// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
pub const STORED_RESPONSES: usize = 256;

/// Stored responses, oldest first.
#[derive(Default)]
pub struct Store {
    entries: Mutex<VecDeque<Stored>>,
}

#[derive(Clone)]
struct Stored {
    id: String,
    /// The conversation that produced it, its answer appended.
    messages: Vec<Message>,
    /// The calls its answer made (their results may follow).
    call_ids: Vec<String>,
    response: Value,
}

impl Store {
    fn get(&self, id: &str) -> Option<Stored> {
        lock(&self.entries).iter().find(|s| s.id == id).cloned()
    }

    fn put(&self, s: Stored) {
        let mut e = lock(&self.entries);
        if e.len() >= STORED_RESPONSES {
            e.pop_front();
        }
        e.push_back(s);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
    /// The most tokens the reasoning may take (an extension, as on chat
    /// completions; [`super::think_budget`]).
    #[serde(default)]
    thinking_token_budget: Option<u64>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    /// Accepted; every call the model writes is returned.
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    /// A Lark grammar (an extension, see [`super::structured`]).
    #[serde(default)]
    grammar: Option<Value>,
}

fn bad_input(m: String) -> ApiError {
    ApiError::invalid_param("input", m)
}

/// `tools`: function tools in the Responses shape (`name` beside `type`).
fn parse_tools(v: Option<Value>) -> Result<Vec<ToolDef>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("tools", m);
    let list = tools::tool_list(v).map_err(bad)?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.into_iter().enumerate() {
        let Value::Object(mut t) = t else {
            return Err(bad(format!("tools[{i}] is not an object")));
        };
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(k) => {
                return Err(bad(format!(
                    "tools[{i}].type is {k:?}; only \"function\" tools are supported"
                )))
            }
            None => return Err(bad(format!("tools[{i}].type must be \"function\""))),
        }
        out.push(ToolDef::from_fields(&mut t, &format!("tools[{i}]"), "parameters", false).map_err(bad)?);
    }
    Ok(out)
}

/// `tool_choice`: `auto`, `none`, `required` or `{"type": "function", "name"}`.
fn parse_choice(v: Option<Value>) -> Result<Choice, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": NAME}",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(Choice::Auto),
        Some(Value::String(s)) => Choice::from_word(&s).ok_or_else(bad),
        Some(Value::Object(o)) => match (
            o.get("type").and_then(Value::as_str),
            o.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(n)) => Ok(Choice::Named(n.to_string())),
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

/// A message item's text: a string, or `input_text` / `output_text` parts.
fn item_text(content: Option<Value>, at: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    (Some(k @ ("input_text" | "output_text" | "text")), None) => {
                        return Err(bad_input(format!(
                            "{at}.content[{j}]: a part of type {k:?} has no `text`"
                        )))
                    }
                    (Some(k), _) => {
                        return Err(bad_input(format!(
                            "{at}.content[{j}]: a part of type {k:?} is not supported (input_text, output_text)"
                        )))
                    }
                    (None, _) => return Err(bad_input(format!("{at}.content[{j}] needs a type"))),
                }
            }
            Ok(text)
        }
        Some(_) => Err(bad_input(format!("{at}.content must be a string or a list of parts"))),
    }
}

/// Appends `input`'s items to `messages` (after a stored conversation, if
/// any): consecutive `function_call` items form one assistant turn with
/// calls, `function_call_output` items its `tool` results, a `reasoning`
/// item the next assistant turn's `reasoning_content`.
fn convert_input(input: Value, messages: &mut Vec<Message>, ids: &mut CallIds) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) => {
            ids.other();
            messages.push(Message::new("user", &s));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => return Err(bad_input("input must be a string or a list of items".into())),
    };
    let mut pending_calls: Vec<Value> = Vec::new();
    let mut pending_ids: Vec<String> = Vec::new();
    let mut pending_reasoning: Option<String> = None;
    let flush = |calls: &mut Vec<Value>,
                 cids: &mut Vec<String>,
                 r: &mut Option<String>,
                 m: &mut Vec<Message>,
                 ids: &mut CallIds| {
        if !calls.is_empty() {
            let mut msg = Message::assistant_calls("", std::mem::take(calls));
            msg.reasoning_content = r.take();
            m.push(msg);
            ids.calls(std::mem::take(cids));
        }
    };
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("input[{i}]");
        let Value::Object(mut item) = item else {
            return Err(bad_input(format!("{at} is not an object")));
        };
        let kind = match item.get("type").and_then(Value::as_str) {
            Some(k) => k.to_string(),
            None if item.contains_key("role") => "message".into(),
            None => return Err(bad_input(format!("{at} needs a type"))),
        };
        match kind.as_str() {
            "message" => {
                flush(
                    &mut pending_calls,
                    &mut pending_ids,
                    &mut pending_reasoning,
                    messages,
                    ids,
                );
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer" | "system") => "system",
                    Some("user") => "user",
                    Some("assistant") => "assistant",
                    Some(r) => {
                        return Err(bad_input(format!(
                            "{at}.role {r:?} is not user, assistant, system or developer"
                        )))
                    }
                    None => return Err(bad_input(format!("{at}.role is missing"))),
                };
                let text = item_text(item.remove("content"), &at)?;
                let mut m = Message::new(role, &text);
                if role == "assistant" {
                    m.reasoning_content = pending_reasoning.take();
                }
                ids.other();
                messages.push(m);
            }
            "function_call" => {
                let field = |item: &mut Map<String, Value>, k: &str| match item.remove(k) {
                    Some(Value::String(s)) if !s.is_empty() => Ok(s),
                    _ => Err(bad_input(format!("{at}.{k} must be a non-empty string"))),
                };
                let call_id = field(&mut item, "call_id")?;
                let name = field(&mut item, "name")?;
                tools::check_name(&name).map_err(|why| bad_input(format!("{at}.name {name:?} {why}")))?;
                let args = match item.remove("arguments") {
                    None | Some(Value::Null) => json!({}),
                    Some(Value::String(a)) => match serde_json::from_str::<Value>(&a) {
                        Ok(o @ Value::Object(_)) => o,
                        _ => return Err(bad_input(format!("{at}.arguments is not a JSON object string: {a:?}"))),
                    },
                    Some(_) => return Err(bad_input(format!("{at}.arguments must be a JSON string"))),
                };
                pending_calls
                    .push(json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}));
                pending_ids.push(call_id);
            }
            "function_call_output" => {
                flush(
                    &mut pending_calls,
                    &mut pending_ids,
                    &mut pending_reasoning,
                    messages,
                    ids,
                );
                let Some(Value::String(call_id)) = item.remove("call_id") else {
                    return Err(bad_input(format!("{at}.call_id must be a string")));
                };
                let output = match item.remove("output") {
                    Some(Value::String(s)) => s,
                    Some(v @ Value::Array(_)) => item_text(Some(v), &at)?,
                    _ => return Err(bad_input(format!("{at}.output must be a string or a list of parts"))),
                };
                ids.result(&call_id)
                    .map_err(|why| bad_input(format!("{at} (function_call_output): {why}")))?;
                messages.push(Message::tool_result(&call_id, &output));
            }
            "reasoning" => {
                let mut text = String::new();
                for key in ["content", "summary"] {
                    if let Some(Value::Array(parts)) = item.get(key) {
                        for p in parts {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                text.push_str(t);
                            }
                        }
                    }
                    if !text.is_empty() {
                        break;
                    }
                }
                pending_reasoning = Some(text);
            }
            "item_reference" => {
                return Err(bad_input(format!(
                    "{at}: item_reference is not supported; send the item, or previous_response_id"
                )))
            }
            k => return Err(bad_input(format!("{at}: an item of type {k:?} is not supported"))),
        }
    }
    flush(
        &mut pending_calls,
        &mut pending_ids,
        &mut pending_reasoning,
        messages,
        ids,
    );
    Ok(())
}

/// `POST /v1/responses`.
pub async fn create(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match create_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn retrieve(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    match st.responses.get(&id) {
        Some(s) => json_response(StatusCode::OK, &s.response),
        None => ApiError::new(ErrorKind::NotFound, format!("no stored response with id {id:?}")).into_response(),
    }
}

async fn create_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: ResponsesRequest = parse_body(body, st.config.max_body_bytes)?;
    let tool_defs = parse_tools(req.tools.clone())?;
    let choice = parse_choice(req.tool_choice.clone())?;
    let text_field = req.text.clone().unwrap_or(Value::Null);
    let format = structured::text_format(text_field.get("format"))?.map(|g| (g, "text.format"));
    let grammar = structured::grammar(req.grammar)?;
    let effort = req
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str);
    let thinking_on = reasoning::effort_switch(effort, "reasoning.effort")?;
    let mut template_kwargs = reasoning::template_kwargs(None, thinking_on, "reasoning")?;
    reasoning::harmony_effort(&mut template_kwargs, speaks_harmony(&st), effort);

    // The conversation: a stored one first, then the instructions and input.
    let mut messages = Vec::new();
    let mut ids = CallIds::default();
    if let Some(prev) = &req.previous_response_id {
        let Some(s) = st.responses.get(prev) else {
            return Err(ApiError::invalid_param(
                "previous_response_id",
                format!(
                    "no stored response with id {prev:?} (responses are kept in memory, the last {STORED_RESPONSES})"
                ),
            ));
        };
        // A stored system message gives way to new instructions.
        messages = s.messages;
        if req.instructions.is_some() && messages.first().is_some_and(|m| m.role == "system") {
            messages.remove(0);
        }
        if !s.call_ids.is_empty() {
            ids.calls(s.call_ids);
        }
    }
    if let Some(i) = &req.instructions {
        messages.insert(0, Message::new("system", i));
    }
    match req.input {
        Some(input) => convert_input(input, &mut messages, &mut ids)?,
        None if req.previous_response_id.is_none() => return Err(bad_input("input is required".into())),
        None => {}
    }
    if !messages.iter().any(|m| m.role != "system") {
        return Err(bad_input("input must hold at least one message or item".into()));
    }
    let syntax = tool_syntax(&st);
    let plan = tools::plan(syntax, tool_defs, choice, "tools", "tool_choice")?;
    tools::check_history(syntax, &messages, "input")?;
    let (prompt_messages, template_tools) = tools::prepare(syntax, plan.as_ref(), messages.clone());
    let grammar = structured::pick(plan.as_ref().and_then(|p| p.grammar.clone()), grammar, format)?;
    let id = new_id("resp_");
    let ticket = submit(
        &st,
        Ask {
            api: "responses",
            id: id.clone(),
            model: req.model,
            prompt: PromptInput::Chat(prompt_messages),
            max_tokens: req.max_output_tokens,
            sampling: SamplingFields {
                temperature: req.temperature,
                top_p: req.top_p,
                ..SamplingFields::default()
            },
            ignore_eos: false,
            seed: None,
            stop: Vec::new(),
            stop_param: "stop",
            max_tokens_param: "max_output_tokens",
            logprobs: None,
            tools: template_tools,
            template_kwargs,
            prefill: plan.as_ref().map(|p| p.prefill.clone()).unwrap_or_default(),
            grammar,
            think_budget: req.thinking_token_budget.map(budget_tokens),
        },
    )
    .await?;
    let echo = json!({
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata.unwrap_or_else(|| json!({})),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": effort, "summary": null},
        "store": req.store.unwrap_or(true),
        "temperature": req.temperature.or(st.model.sampling.temperature).unwrap_or(1.0),
        "text": {"format": text_field.get("format").cloned().unwrap_or_else(|| json!({"type": "text"}))},
        "tool_choice": req.tool_choice.unwrap_or_else(|| json!("auto")),
        "tools": req.tools.unwrap_or_else(|| json!([])),
        "top_p": req.top_p.or(st.model.sampling.top_p).unwrap_or(1.0),
        "truncation": "disabled",
    });
    let reply = Reply {
        st: st.clone(),
        id,
        model: st.model.id.clone(),
        created: ticket.created,
        shape: answer_shape(&st, &ticket, plan),
        echo,
        store: req.store.unwrap_or(true),
        messages,
    };
    if req.stream.unwrap_or(false) {
        Ok(reply.stream(ticket))
    } else {
        reply.whole(ticket).await
    }
}

struct Reply {
    st: Arc<AppState>,
    id: String,
    model: String,
    created: u64,
    shape: Shape,
    /// The request's settings, as the response object repeats them.
    echo: Value,
    store: bool,
    /// The conversation sent (stored with the answer).
    messages: Vec<Message>,
}

/// An output item being built: its id and kind.
fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}], "status": status})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content = text.map_or_else(|| json!([]), |t| json!([text_part(t)]));
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call_id: &str, c: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": c.name,
           "arguments": arguments, "status": status})
}

fn usage(s: &Summary) -> Value {
    json!({
        "input_tokens": s.prompt_tokens,
        "input_tokens_details": {"cached_tokens": s.cached_tokens},
        "output_tokens": s.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": s.prompt_tokens + s.completion_tokens,
    })
}

impl Reply {
    /// The response object (`status`: in_progress, completed, incomplete).
    fn object(&self, status: &str, output: Vec<Value>, summary: Option<&Summary>) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "model": self.model,
            "output": output,
            "usage": summary.map(usage),
        });
        if let (Value::Object(r), Value::Object(e)) = (&mut r, &self.echo) {
            for (k, v) in e {
                r.insert(k.clone(), v.clone());
            }
        }
        r
    }

    fn status(s: &Summary, calls: usize) -> &'static str {
        if s.finish == FinishReason::Length && calls == 0 {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// Keeps the response (and its conversation, answer appended) for
    /// `previous_response_id`, unless the request said `store: false`.
    fn keep(&self, a: &answer::Answer, call_ids: Vec<String>, response: &Value) {
        if !self.store {
            return;
        }
        let mut messages = self.messages.clone();
        let mut m = if a.calls.is_empty() {
            Message::new("assistant", &a.content)
        } else {
            let calls = a
                .calls
                .iter()
                .zip(&call_ids)
                .map(|(c, id)| json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
            Message::assistant_calls(&a.content, calls)
        };
        if !a.reasoning.is_empty() {
            m.reasoning_content = Some(a.reasoning.clone());
        }
        messages.push(m);
        self.st.responses.put(Stored {
            id: self.id.clone(),
            messages,
            call_ids,
            response: response.clone(),
        });
    }

    async fn whole(self, mut ticket: Ticket) -> Result<Response, ApiError> {
        let mut text = String::new();
        let summary = loop {
            match ticket.events.recv().await {
                Some(Event::Delta { text: t, .. }) => text.push_str(&t),
                Some(Event::Done(s)) => break s,
                Some(Event::Failed { message, bad_input }) => {
                    let kind = if bad_input {
                        ErrorKind::InvalidRequest
                    } else {
                        ErrorKind::Server
                    };
                    return Err(ApiError::new(kind, message));
                }
                None => return Err(ApiError::new(ErrorKind::Server, "the engine stopped")),
            }
        };
        let a = answer::whole(&self.shape, &text);
        for w in &a.warnings {
            tracing::warn!("{}: {w}", self.id);
        }
        let mut output = Vec::new();
        if !a.reasoning.is_empty() {
            output.push(reasoning_item(&new_id("rs_"), &a.reasoning, "completed"));
        }
        if a.calls.is_empty() || !a.content.is_empty() {
            output.push(message_item(&new_id("msg_"), Some(&a.content), "completed"));
        }
        let mut call_ids = Vec::new();
        for c in &a.calls {
            let call_id = new_id("call_");
            output.push(call_item(&new_id("fc_"), &call_id, c, &c.arguments_json(), "completed"));
            call_ids.push(call_id);
        }
        let body = self.object(Self::status(&summary, a.calls.len()), output, Some(&summary));
        self.keep(&a, call_ids, &body);
        Ok(json_response(StatusCode::OK, &body))
    }

    fn stream(self, mut ticket: Ticket) -> Response {
        let (out, resp) = SseWriter::channel();
        tokio::spawn(async move {
            let mut ev = Events { out, seq: 0 };
            let start = self.object("in_progress", Vec::new(), None);
            if !ev.send("response.created", json!({"response": start})).await
                || !ev.send("response.in_progress", json!({"response": start})).await
            {
                return;
            }
            let mut parser = AnswerStream::new(&self.shape);
            let mut items = Items::default();
            let mut text = String::new();
            loop {
                let event = tokio::select! {
                    e = ticket.events.recv() => e,
                    _ = ev.out.closed() => return,
                };
                match event {
                    Some(Event::Delta { text: t, .. }) => {
                        text.push_str(&t);
                        let outs = parser.push(&t);
                        if !items.send(&mut ev, outs).await {
                            return;
                        }
                    }
                    Some(Event::Done(s)) => {
                        let outs = parser.finish();
                        for w in parser.warnings() {
                            tracing::warn!("{}: {w}", self.id);
                        }
                        if !items.send(&mut ev, outs).await || !items.close(&mut ev).await {
                            return;
                        }
                        let a = answer::whole(&self.shape, &text);
                        if items.done.is_empty() {
                            // No output at all: one empty message, as the whole answer has.
                            let id = new_id("msg_");
                            items.open_message(&mut ev, &id).await;
                            items.close(&mut ev).await;
                        }
                        let status = Self::status(&s, a.calls.len());
                        let body = self.object(status, std::mem::take(&mut items.done), Some(&s));
                        self.keep(&a, std::mem::take(&mut items.call_ids), &body);
                        let name = if status == "completed" {
                            "response.completed"
                        } else {
                            "response.incomplete"
                        };
                        ev.send(name, json!({"response": body})).await;
                        return;
                    }
                    Some(Event::Failed { message, .. }) => {
                        ev.send(
                            "error",
                            json!({"code": "server_error", "message": message, "param": null}),
                        )
                        .await;
                        return;
                    }
                    None => {
                        ev.send(
                            "error",
                            json!({"code": "server_error", "message": "the engine stopped", "param": null}),
                        )
                        .await;
                        return;
                    }
                }
            }
        });
        resp
    }
}

/// The event writer: numbers every event.
struct Events {
    out: SseWriter,
    seq: u64,
}

impl Events {
    async fn send(&mut self, kind: &str, mut data: Value) -> bool {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.out.event(kind, &data).await
    }
}

/// The item being streamed.
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
}

/// Output items of a stream: the open one and those done.
#[derive(Default)]
struct Items {
    open: Option<Open>,
    done: Vec<Value>,
    call_ids: Vec<String>,
}

impl Items {
    async fn send(&mut self, ev: &mut Events, outs: Vec<Out>) -> bool {
        for o in outs {
            let ok = match o {
                Out::Reasoning(r) => {
                    if !matches!(self.open, Some(Open::Reasoning { .. })) {
                        if !self.close(ev).await {
                            return false;
                        }
                        let id = new_id("rs_");
                        let item = json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"});
                        if !ev
                            .send(
                                "response.output_item.added",
                                json!({"output_index": self.done.len(), "item": item}),
                            )
                            .await
                        {
                            return false;
                        }
                        self.open = Some(Open::Reasoning {
                            id,
                            text: String::new(),
                        });
                    }
                    let Some(Open::Reasoning { id, text }) = &mut self.open else {
                        unreachable!()
                    };
                    text.push_str(&r);
                    let data = json!({"item_id": id, "output_index": self.done.len(), "content_index": 0, "delta": r});
                    ev.send("response.reasoning_text.delta", data).await
                }
                Out::Text(t) => {
                    if !matches!(self.open, Some(Open::Message { .. })) {
                        if !self.close(ev).await {
                            return false;
                        }
                        let id = new_id("msg_");
                        if !self.open_message(ev, &id).await {
                            return false;
                        }
                    }
                    let Some(Open::Message { id, text }) = &mut self.open else {
                        unreachable!()
                    };
                    text.push_str(&t);
                    let data = json!({"item_id": id, "output_index": self.done.len(), "content_index": 0,
                                      "delta": t, "logprobs": []});
                    ev.send("response.output_text.delta", data).await
                }
                Out::Call(c) => {
                    if !self.close(ev).await {
                        return false;
                    }
                    let (id, call_id) = (new_id("fc_"), new_id("call_"));
                    let index = self.done.len();
                    let args = c.arguments_json();
                    let ok = ev
                        .send(
                            "response.output_item.added",
                            json!({"output_index": index,
                              "item": call_item(&id, &call_id, &c, "", "in_progress")}),
                        )
                        .await
                        && ev
                            .send(
                                "response.function_call_arguments.delta",
                                json!({"item_id": id, "output_index": index, "delta": args}),
                            )
                            .await
                        && ev
                            .send(
                                "response.function_call_arguments.done",
                                json!({"item_id": id, "output_index": index, "name": c.name, "arguments": args}),
                            )
                            .await;
                    let item = call_item(&id, &call_id, &c, &args, "completed");
                    self.done.push(item.clone());
                    self.call_ids.push(call_id);
                    ok && ev
                        .send(
                            "response.output_item.done",
                            json!({"output_index": index, "item": item}),
                        )
                        .await
                }
            };
            if !ok {
                return false;
            }
        }
        true
    }

    async fn open_message(&mut self, ev: &mut Events, id: &str) -> bool {
        let index = self.done.len();
        self.open = Some(Open::Message {
            id: id.to_string(),
            text: String::new(),
        });
        ev.send(
            "response.output_item.added",
            json!({"output_index": index, "item": message_item(id, None, "in_progress")}),
        )
        .await
            && ev
                .send(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": index,
                      "content_index": 0, "part": text_part("")}),
                )
                .await
    }

    /// Closes the open item: its `.done` events.
    async fn close(&mut self, ev: &mut Events) -> bool {
        let index = self.done.len();
        let (ok, item) = match self.open.take() {
            None => return true,
            Some(Open::Reasoning { id, text }) => {
                let ok = ev
                    .send(
                        "response.reasoning_text.done",
                        json!({"item_id": id, "output_index": index,
                          "content_index": 0, "text": text}),
                    )
                    .await;
                (ok, reasoning_item(&id, &text, "completed"))
            }
            Some(Open::Message { id, text }) => {
                let ok = ev
                    .send(
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": index,
                          "content_index": 0, "text": text, "logprobs": []}),
                    )
                    .await
                    && ev
                        .send(
                            "response.content_part.done",
                            json!({"item_id": id, "output_index": index,
                              "content_index": 0, "part": text_part(&text)}),
                        )
                        .await;
                (ok, message_item(&id, Some(&text), "completed"))
            }
        };
        self.done.push(item.clone());
        ok && ev
            .send(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_become_template_messages() {
        let input = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]}
        ]);
        let mut m = Vec::new();
        convert_input(input, &mut m, &mut CallIds::default()).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[0], Message::new("user", "Weather in Paris?"));
        assert_eq!(m[1].role, "assistant");
        assert_eq!(m[1].reasoning_content.as_deref(), Some("Ask the tool."));
        let calls = m[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(calls[1]["id"], "call_2");
        assert_eq!(m[2], Message::tool_result("call_1", "18 C"));
        assert_eq!(m[3], Message::tool_result("call_2", "noon"));
        assert_eq!(m[4], Message::new("system", "Be brief."));
    }

    #[test]
    fn bad_items_are_refused_with_their_place() {
        let cases = [
            (json!(3), "input must be"),
            (
                json!([{"type": "function_call_output", "call_id": "nope", "output": "x"}]),
                "input[0]",
            ),
            (
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]),
                "input[0].arguments",
            ),
            (json!([{"role": "robot", "content": "x"}]), "input[0].role"),
            (json!([{"type": "item_reference", "id": "x"}]), "item_reference"),
            (json!([{"type": "web_search_call"}]), "not supported"),
            (
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                "input_image",
            ),
            (
                json!([{"role": "user", "content": [{"type": "input_text"}]}]),
                "input[0].content[0]: a part of type \"input_text\" has no `text`",
            ),
        ];
        for (input, want) in cases {
            let e = convert_input(input.clone(), &mut Vec::new(), &mut CallIds::default()).unwrap_err();
            assert!(e.message.contains(want), "{input}: {}", e.message);
            assert_eq!(e.param, Some("input"));
        }
    }

    #[test]
    fn tools_and_choices_in_the_flat_shape() {
        let t = parse_tools(Some(
            json!([{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}]),
        ))
        .unwrap();
        assert_eq!(t[0].name, "f");
        assert!(parse_tools(Some(json!([{"type": "web_search"}]))).is_err());
        assert_eq!(
            parse_choice(Some(json!({"type": "function", "name": "f"}))).unwrap(),
            Choice::Named("f".into())
        );
        assert_eq!(parse_choice(Some(json!("required"))).unwrap(), Choice::Required);
        assert!(parse_choice(Some(json!({"type": "function", "function": {"name": "f"}}))).is_err());
    }
}
