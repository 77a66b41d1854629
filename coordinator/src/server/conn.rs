//! Connections: the accept loop, the connection cap and the per-connection
//! timeouts that keep a hostile or broken client from holding the server.
//!
//! `axum::serve` has neither a cap nor timeouts, so the server drives
//! hyper's HTTP/1 connections itself:
//!
//! - at most [`Limits::max_connections`] connections are served at once;
//!   one more is answered `503` at once (a fixed response, written without
//!   waiting) and closed;
//! - [`Limits::header_read_timeout`]: a request head must be complete this
//!   long after the connection was accepted, or, on a kept-alive
//!   connection, after its first byte arrived (slowloris);
//! - [`Limits::body_read_timeout`]: a request body must be complete this
//!   long after its head;
//! - [`Limits::idle_timeout`]: a kept-alive connection with no request for
//!   this long is closed, and so is one whose client stops reading a
//!   response (a write waiting this long for room in the socket).
//!
//! While a request is being answered — a generation waiting in the queue, a
//! stream producing tokens — no timer runs but the stalled-write one, so
//! long answers and active streams are never cut.
//!
//! Each connection has a [`Watch`]: the socket wrapper ([`Watched`]) marks
//! reads and blocked writes, the service marks requests begun and their
//! bodies read ([`RequestBody`]), the response body marks the answer's end
//! ([`ResponseBody`]), and a timer task closes the connection once one of
//! the deadlines above has passed.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::error::{ApiError, ErrorKind};

/// What one connection may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// From accept (or a kept-alive request's first byte) to a complete head.
    pub header_read_timeout: Duration,
    /// From a request's head to the end of its body.
    pub body_read_timeout: Duration,
    /// A kept-alive connection with no request, or a write the client does
    /// not make room for, this long is closed.
    pub idle_timeout: Duration,
}

/// Accepts connections on `listener` and serves `app` on each, within
/// `limits`, until the future is dropped.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off rather
                // than spin on the error.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(&stream, limits.max_connections);
            continue;
        };
        // Stream frames go out as soon as they are written.
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            serve_connection(stream, app, limits).await;
            drop(slot);
        });
    }
}

/// Answers a connection over the cap with a 503 and closes it. The answer
/// is small enough for an empty socket buffer; it is written once, without
/// waiting, so a flood of refused connections costs no task and no timer.
fn refuse(stream: &TcpStream, max: usize) {
    let err = ApiError::new(
        ErrorKind::Overloaded,
        format!("too many connections (this server serves {max} at once); retry later"),
    );
    let body = err.body().to_string();
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(resp.as_bytes());
    tracing::debug!("refused a connection: {max} connections already open");
}

/// Serves one connection until it ends or a deadline passes.
async fn serve_connection(stream: TcpStream, app: Router, limits: Limits) {
    let watch = Arc::new(Watch::new(Instant::now()));
    let io = TokioIo::new(Watched {
        inner: stream,
        watch: watch.clone(),
    });
    let w = watch.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut app = app.clone();
        let w = w.clone();
        async move {
            let answering = Answering::begin(&w, http_body::Body::is_end_stream(req.body()));
            let req = req.map(|inner| RequestBody {
                inner,
                watch: w.clone(),
                done: false,
            });
            let resp = tower_service::Service::call(&mut app, req).await?;
            Ok::<_, Infallible>(resp.map(|inner| {
                Body::new(ResponseBody {
                    inner,
                    _answering: answering,
                })
            }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        // The watch keeps the time (hyper's own timer is not set).
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::select! {
        r = conn => if let Err(e) = r {
            tracing::debug!("connection ended: {e}");
        },
        why = watch.expired(limits) => tracing::debug!("closing a connection: {why}"),
    }
}

/// Where one connection stands, for its deadlines.
struct Watch {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Requests being answered (HTTP/1: one at a time).
    requests: usize,
    /// When the connection last had no request (accepted, or an answer ended).
    idle_since: Instant,
    /// While no request is being answered: when the next head began to
    /// arrive (the first request's counts from the accept).
    head_since: Option<Instant>,
    /// While a request's body is being read: when its head was complete.
    body_since: Option<Instant>,
    /// Since when a write has waited for the client to make room.
    write_blocked_since: Option<Instant>,
}

impl State {
    /// The deadline that has passed at `now`, if one has.
    fn overdue(&self, now: Instant, limits: &Limits) -> Option<&'static str> {
        let past = |since: Instant, limit: Duration| now.saturating_duration_since(since) >= limit;
        if self.write_blocked_since.is_some_and(|t| past(t, limits.idle_timeout)) {
            return Some("the client stopped reading");
        }
        if self.requests == 0 {
            match self.head_since {
                Some(t) if past(t, limits.header_read_timeout) => Some("the request head did not arrive in time"),
                None if past(self.idle_since, limits.idle_timeout) => Some("idle"),
                _ => None,
            }
        } else if self.body_since.is_some_and(|t| past(t, limits.body_read_timeout)) {
            Some("the request body did not arrive in time")
        } else {
            None
        }
    }
}

impl Watch {
    fn new(accepted: Instant) -> Self {
        Watch {
            state: Mutex::new(State {
                requests: 0,
                idle_since: accepted,
                head_since: Some(accepted),
                body_since: None,
                write_blocked_since: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain data; a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived.
    fn read(&self) {
        let mut s = self.lock();
        if s.requests == 0 && s.head_since.is_none() {
            s.head_since = Some(Instant::now());
        }
    }

    /// A write returned: `blocked` when it waits for room in the socket.
    fn wrote(&self, blocked: bool) {
        let mut s = self.lock();
        if blocked {
            s.write_blocked_since.get_or_insert_with(Instant::now);
        } else {
            s.write_blocked_since = None;
        }
    }

    /// Resolves once a deadline has passed, saying which.
    async fn expired(&self, limits: Limits) -> &'static str {
        let shortest = limits
            .header_read_timeout
            .min(limits.body_read_timeout)
            .min(limits.idle_timeout);
        let tick = (shortest / 8).clamp(Duration::from_millis(5), Duration::from_millis(500));
        loop {
            tokio::time::sleep(tick).await;
            if let Some(why) = self.lock().overdue(Instant::now(), &limits) {
                return why;
            }
        }
    }
}

/// A request being answered, from its head until its response body is
/// dropped (sent, or the connection closed).
struct Answering(Arc<Watch>);

impl Answering {
    fn begin(watch: &Arc<Watch>, empty_body: bool) -> Self {
        let mut s = watch.lock();
        s.requests += 1;
        s.head_since = None;
        s.body_since = (!empty_body).then(Instant::now);
        drop(s);
        Answering(watch.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.requests = s.requests.saturating_sub(1);
        if s.requests == 0 {
            s.idle_since = Instant::now();
            s.head_since = None;
            s.body_since = None;
        }
    }
}

/// A request body that tells the watch when it has been read (or dropped).
struct RequestBody {
    inner: Incoming,
    watch: Arc<Watch>,
    done: bool,
}

impl RequestBody {
    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.watch.lock().body_since = None;
        }
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || this.inner.is_end_stream() {
            this.finish();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A response body that ends its request's [`Answering`] when dropped.
struct ResponseBody {
    inner: Body,
    _answering: Answering,
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, telling the watch about reads and blocked writes.
struct Watched {
    inner: TcpStream,
    watch: Arc<Watch>,
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.watch.read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch.wrote(r.is_pending());
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch.wrote(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_connections: 4,
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(60),
    };

    fn state(t0: Instant) -> State {
        State {
            requests: 0,
            idle_since: t0,
            head_since: Some(t0),
            body_since: None,
            write_blocked_since: None,
        }
    }

    #[test]
    fn a_new_connection_has_the_header_timeout_to_send_its_head() {
        let t0 = Instant::now();
        let s = state(t0);
        assert_eq!(s.overdue(t0 + Duration::from_secs(9), &LIMITS), None);
        assert!(s.overdue(t0 + Duration::from_secs(10), &LIMITS).is_some());
    }

    #[test]
    fn a_request_being_answered_has_no_deadline_but_a_stalled_write() {
        let t0 = Instant::now();
        let mut s = state(t0);
        s.requests = 1;
        s.head_since = None;
        let late = t0 + Duration::from_secs(3600);
        assert_eq!(s.overdue(late, &LIMITS), None, "a long answer is never cut");
        s.write_blocked_since = Some(t0);
        assert_eq!(s.overdue(late, &LIMITS), Some("the client stopped reading"));
    }

    #[test]
    fn a_kept_alive_connection_idles_until_the_idle_timeout() {
        let t0 = Instant::now();
        let mut s = state(t0);
        s.head_since = None;
        assert_eq!(s.overdue(t0 + Duration::from_secs(59), &LIMITS), None);
        assert_eq!(s.overdue(t0 + Duration::from_secs(60), &LIMITS), Some("idle"));
    }

    #[test]
    fn a_body_must_arrive_within_the_body_timeout() {
        let t0 = Instant::now();
        let mut s = state(t0);
        s.requests = 1;
        s.head_since = None;
        s.body_since = Some(t0);
        assert_eq!(s.overdue(t0 + Duration::from_secs(29), &LIMITS), None);
        assert!(s.overdue(t0 + Duration::from_secs(30), &LIMITS).is_some());
    }
}
