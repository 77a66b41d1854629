//! The Anthropic Messages API: `POST /v1/messages`, streaming and not.
//!
//! Fields: `model`, `system` (a string or text blocks), `messages` (string
//! or text-block content), `max_tokens` (required), `stop_sequences`,
//! `temperature`, `top_p`, `top_k`, `stream`. Streams send
//! `message_start`, `content_block_start`, `content_block_delta`…,
//! `content_block_stop`, `message_delta` (stop reason and output tokens)
//! and `message_stop`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::{ApiError, ErrorKind, Flavor};
use super::queue::{Event, Summary};
use super::sse::SseWriter;
use super::{json_response, new_id, parse_body, submit, AppState, Ask, PromptInput, Ticket};
use crate::chat_template::Message;
use crate::engine::FinishReason;

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<InMessage>,
    #[serde(default)]
    system: Option<Content>,
    max_tokens: u64,
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

/// `POST /v1/messages`.
pub async fn messages(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match messages_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.flavor(Flavor::Anthropic).into_response(),
    }
}

async fn messages_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: MessagesRequest = parse_body(body, st.config.max_body_bytes)?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system {
        messages.push(Message::new("system", &system.text("system")?));
    }
    for m in req.messages {
        if m.role != "user" && m.role != "assistant" {
            return Err(ApiError::invalid_param(
                "messages",
                format!("role must be \"user\" or \"assistant\", got {:?}", m.role),
            ));
        }
        messages.push(Message::new(&m.role, &m.content.text("messages")?));
    }
    let id = new_id("msg_");
    let ticket = submit(
        &st,
        Ask {
            api: "messages",
            id: id.clone(),
            model: req.model,
            prompt: PromptInput::Chat(messages),
            max_tokens: Some(req.max_tokens),
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            seed: None,
            stop: req.stop_sequences.unwrap_or_default(),
            stop_param: "stop_sequences",
            logprobs: None,
        },
    )
    .await?;
    let reply = Reply {
        id,
        model: st.model.id.clone(),
    };
    if req.stream.unwrap_or(false) {
        Ok(reply.stream(ticket))
    } else {
        reply.whole(ticket).await
    }
}

struct Reply {
    id: String,
    model: String,
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

impl Reply {
    fn message(&self, content: Value, summary: Option<&Summary>, input_tokens: usize) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": summary.map(stop_reason),
            "stop_sequence": summary.and_then(|s| s.stop_sequence.clone()),
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": summary.map_or(0, |s| s.completion_tokens),
            },
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
        let content = json!([{"type": "text", "text": text}]);
        Ok(json_response(
            StatusCode::OK,
            &self.message(content, Some(&summary), summary.prompt_tokens),
        ))
    }

    fn stream(self, mut ticket: Ticket) -> Response {
        let (out, resp) = SseWriter::channel();
        tokio::spawn(async move {
            let start =
                json!({"type": "message_start", "message": self.message(json!([]), None, ticket.prompt_tokens)});
            let block =
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
            if !out.event("message_start", &start).await || !out.event("content_block_start", &block).await {
                return;
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
                        let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}});
                        if !out.event("content_block_delta", &delta).await {
                            return;
                        }
                    }
                    Some(Event::Done(s)) => {
                        let frames = [
                            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
                            (
                                "message_delta",
                                json!({
                                    "type": "message_delta",
                                    "delta": {"stop_reason": stop_reason(&s), "stop_sequence": s.stop_sequence},
                                    "usage": {"output_tokens": s.completion_tokens},
                                }),
                            ),
                            ("message_stop", json!({"type": "message_stop"})),
                        ];
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
