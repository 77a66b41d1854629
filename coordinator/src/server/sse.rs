//! Server-sent events: a response whose body is fed frame by frame from a
//! task. When the client goes away the body is dropped, every later write
//! fails, and the task (and with it the job's event channel) ends — that is
//! how a disconnect reaches the engine.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::Response;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Frames buffered between the writer task and the socket.
const BUFFER: usize = 64;

/// Writes SSE frames into a streaming response.
pub struct SseWriter {
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
}

impl SseWriter {
    /// A writer and the `text/event-stream` response it feeds.
    pub fn channel() -> (SseWriter, Response) {
        let (tx, rx) = mpsc::channel(BUFFER);
        let resp = Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .header("x-accel-buffering", "no")
            .body(Body::from_stream(ReceiverStream::new(rx)))
            .unwrap_or_else(|_| Response::new(Body::empty()));
        (SseWriter { tx }, resp)
    }

    /// `data: <json>`; `false` once the client is gone.
    pub async fn data(&self, value: &impl Serialize) -> bool {
        self.send(None, &to_json(value)).await
    }

    /// `event: <name>` + `data: <json>`; `false` once the client is gone.
    pub async fn event(&self, name: &str, value: &impl Serialize) -> bool {
        self.send(Some(name), &to_json(value)).await
    }

    /// `data: <text>` verbatim (e.g. OpenAI's `[DONE]`).
    pub async fn raw(&self, text: &str) -> bool {
        self.send(None, text).await
    }

    /// Whether the client has gone away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    async fn send(&self, event: Option<&str>, data: &str) -> bool {
        let mut frame = String::with_capacity(data.len() + 32);
        if let Some(e) = event {
            frame.push_str("event: ");
            frame.push_str(e);
            frame.push('\n');
        }
        // JSON from serde_json has no raw newlines; split anyway so any text is valid SSE.
        for line in data.split('\n') {
            frame.push_str("data: ");
            frame.push_str(line);
            frame.push('\n');
        }
        frame.push('\n');
        self.tx.send(Ok(Bytes::from(frame))).await.is_ok()
    }
}

fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"serializing: {e}\"}}"))
}
