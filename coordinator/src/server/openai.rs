//! The OpenAI API: `POST /v1/chat/completions` and `POST /v1/completions`,
//! streaming (SSE chunks, then `data: [DONE]`) and not.
//!
//! Fields: `model`, `messages` / `prompt`, `max_tokens` /
//! `max_completion_tokens`, `temperature`, `top_p`, `seed`, `stop` (a string
//! or a list), `stream`, `stream_options.include_usage`, `logprobs` /
//! `top_logprobs` (chat) or `logprobs: N` (completions), `n` (1 only).
//! `top_k` is accepted as an extension. Log-probabilities are those of the
//! model's distribution (`log_softmax(logits)`, before temperature).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::{ApiError, ErrorKind};
use super::queue::{Event, Summary, Token};
use super::sse::SseWriter;
use super::{json_response, new_id, parse_body, submit, AppState, Ask, PromptInput, StopField, Ticket};
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
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<usize>,
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
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
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
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<usize>,
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

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match chat_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: ChatRequest = parse_body(body, st.config.max_body_bytes)?;
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
    let mut messages = Vec::with_capacity(req.messages.len());
    for m in req.messages {
        let text = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
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
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        messages.push(Message::new(role, &text));
    }
    let id = new_id("chatcmpl-");
    let ticket = submit(
        &st,
        Ask {
            api: "chat",
            id: id.clone(),
            model: req.model,
            prompt: PromptInput::Chat(messages),
            max_tokens: req.max_completion_tokens.or(req.max_tokens),
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            seed: req.seed,
            stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
            stop_param: "stop",
            logprobs: want_logprobs.then_some(top),
        },
    )
    .await?;
    let reply = Reply {
        id,
        model: st.model.id.clone(),
        created: ticket.created,
        codec: st.codec.clone(),
        chat: true,
        logprobs: want_logprobs,
        include_usage: req.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
    };
    if req.stream.unwrap_or(false) {
        Ok(reply.stream(ticket))
    } else {
        reply.whole(ticket).await
    }
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
    let id = new_id("cmpl-");
    let ticket = submit(
        &st,
        Ask {
            api: "completions",
            id: id.clone(),
            model: req.model,
            prompt,
            max_tokens: Some(req.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)),
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            seed: req.seed,
            stop: req.stop.map(StopField::into_vec).unwrap_or_default(),
            stop_param: "stop",
            logprobs: req.logprobs,
        },
    )
    .await?;
    let reply = Reply {
        id,
        model: st.model.id.clone(),
        created: ticket.created,
        codec: st.codec.clone(),
        chat: false,
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
            json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(&summary),
                }],
                "usage": usage(&summary),
            })
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
                        let lp = if self.logprobs {
                            self.logprobs_json(&std::mem::take(&mut pending), &mut text_offset)
                        } else {
                            Value::Null
                        };
                        if !out.data(&self.chunk(self.choice(Some(&text), lp, None), None)).await {
                            return;
                        }
                    }
                    Some(Event::Done(s)) => {
                        let lp = if self.logprobs && !pending.is_empty() {
                            self.logprobs_json(&pending, &mut text_offset)
                        } else {
                            Value::Null
                        };
                        let last = self.choice(None, lp, Some(finish_reason(&s)));
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
