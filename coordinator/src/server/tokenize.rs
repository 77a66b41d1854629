//! `POST /tokenize` and `POST /detokenize`: the model's tokenizer over
//! HTTP, in the shapes llama-server and vLLM answer (clients of either
//! count and cut their prompts with them).
//!
//! `/tokenize` takes text (`content`, llama-server's, special tokens added
//! only with `add_special: true`; or `prompt`, vLLM's, added unless
//! `add_special_tokens: false`) or a chat (`messages`, `tools`, … as
//! `/v1/chat/completions` takes them: the prompt that request would run,
//! template and all). It answers `{"tokens", "count", "max_model_len"}`;
//! with `with_pieces: true` each token is `{"id", "piece"}`, the piece the
//! token's text, or its byte values where they are not whole UTF-8 (part
//! of a character), as llama-server gives them. `/detokenize`
//! takes `{"tokens": [ids]}` and answers the text as both `content` and
//! `prompt`. Nothing is queued: both run beside generation.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::openai::{chat_ask, ChatRequest};
use super::{
    check_target, json_response, parse_body, parse_value, prompt_ids, tokenize as encode, AppState, PromptInput,
};

/// A `/tokenize` body that is text, not a chat.
#[derive(Debug, Deserialize)]
struct TextRequest {
    #[serde(default)]
    model: Option<String>,
    /// llama-server's text field.
    #[serde(default)]
    content: Option<String>,
    /// vLLM's text field.
    #[serde(default)]
    prompt: Option<String>,
    /// llama-server's switch (default off).
    #[serde(default)]
    add_special: Option<bool>,
    /// vLLM's switch (default on).
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    with_pieces: bool,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
}

/// `POST /tokenize`.
pub async fn tokenize(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match tokenize_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn tokenize_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let v: Value = parse_body(body, st.config.max_body_bytes)?;
    let (ids, with_pieces) = if v.get("messages").is_some() {
        let mut v = v;
        let with_pieces = match v.as_object_mut().and_then(|o| o.remove("with_pieces")) {
            None => false,
            Some(Value::Bool(b)) => b,
            Some(_) => return Err(ApiError::invalid_param("with_pieces", "with_pieces must be a boolean")),
        };
        let req: ChatRequest = parse_value(v)?;
        let (ask, _) = chat_ask(&st, req)?;
        check_target(&st, ask.model.as_deref(), &ask.prompt)?;
        let ids = prompt_ids(&st, ask.prompt, ask.tools, ask.prefill, ask.template_kwargs).await?;
        (ids, with_pieces)
    } else {
        let req: TextRequest = parse_value(v)?;
        check_model(&st, req.model.as_deref())?;
        let (text, special) = match (req.content, req.prompt) {
            (Some(t), None) => (t, req.add_special.or(req.add_special_tokens).unwrap_or(false)),
            (None, Some(t)) => (t, req.add_special_tokens.or(req.add_special).unwrap_or(true)),
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid_param("prompt", "give content or prompt, not both"));
            }
            (None, None) => {
                return Err(ApiError::invalid_param(
                    "content",
                    "give the text as content (or prompt), or a chat as messages",
                ));
            }
        };
        let ids = encode(st.codec.clone(), move |c| {
            if special {
                c.encode(&text)
            } else {
                c.encode_plain(&text)
            }
        })
        .await?;
        (ids, req.with_pieces)
    };
    let count = ids.len();
    let tokens: Vec<Value> = if with_pieces {
        let codec = st.codec.clone();
        // The ids are the tokenizer's own: a failure here is the server's.
        let (ids, bytes) = off_the_async_threads(move || codec.token_bytes(&ids).map(|b| (ids, b)))
            .await?
            .map_err(|e| ApiError::new(super::error::ErrorKind::Server, e.to_string()))?;
        ids.iter()
            .zip(bytes)
            .map(|(&id, b)| json!({"id": id, "piece": piece(b)}))
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({"tokens": tokens, "count": count, "max_model_len": st.model.context}),
    ))
}

/// A token's bytes as llama-server gives a piece: the text where the bytes
/// are whole UTF-8, else the list of byte values.
fn piece(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(text) => Value::String(text),
        Err(e) => json!(e.into_bytes()),
    }
}

/// `f`'s result, computed on a blocking thread (decoding a long prompt
/// token by token is not for the async workers).
async fn off_the_async_threads<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(super::error::ErrorKind::Server, format!("decoding: {e}")))
}

/// `POST /detokenize`.
pub async fn detokenize(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match detokenize_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn detokenize_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse_body(body, st.config.max_body_bytes)?;
    check_model(&st, req.model.as_deref())?;
    if let Some((i, id)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= st.model.vocab)
    {
        return Err(ApiError::invalid_param(
            "tokens",
            format!(
                "tokens[{i}] = {id} is not a token id (the vocabulary has {})",
                st.model.vocab
            ),
        ));
    }
    let codec = st.codec.clone();
    let text = off_the_async_threads(move || codec.decode(&req.tokens, false))
        .await?
        .map_err(|e| ApiError::invalid_param("tokens", e.to_string()))?;
    Ok(json_response(StatusCode::OK, &json!({"content": text, "prompt": text})))
}

/// 404 for a model other than the one served (none named is fine).
fn check_model(st: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    check_target(st, model, &PromptInput::Ids(Vec::new()))
}
