//! The worker's QUIC server: accepts coordinators, checks that they hold
//! the cluster key and run the same model, then answers their requests
//! with the served model ([`Served`]).
//!
//! - Nothing is granted before the key proof: a new connection holds only
//!   a half-open slot (at most `max_half_open`; beyond that new connections
//!   are refused before their QUIC handshake), a handshake's worth of
//!   flow-control credit and one stream, and must finish the QUIC handshake
//!   and prove the cluster key within `handshake_timeout` or be closed.
//! - Many coordinators may connect at once (up to `max_connections`, taken
//!   after the proof; the next is closed with a reason saying the worker is
//!   full). They share the expert store, which is safe to use from many
//!   threads and locks only its bookkeeping: requests of different
//!   coordinators run side by side, and results never depend on who else
//!   is being served, only the cache's contents.
//! - Every request is checked against the model before any work: layer,
//!   row width, expert ids in range and held, each row at most once per
//!   group, at most top-k routes per row. A bad request gets an `Error`
//!   reply; the connection and every other request carry on.
//! - One task per connection, one per request stream: `RunExperts` →
//!   `ExpertsOut` (or `Error` when the store fails), `EndRequest` →
//!   `Stats`; one-way `Prefetch` on unidirectional streams. Expert math
//!   runs on the blocking pool, off the network threads.
//! - A frame that does not decode, is too large, or does not belong on its
//!   stream closes that connection with the reason (the peer and the log
//!   both see it); the process and every other connection carry on.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::{Duration, Instant};

use charm_proto::{ErrorKind, ExpertBatch, ExpertsOut, FrameError, Message, RunExperts, WireError, MAX_FRAME_LEN};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use tokio::sync::Semaphore;

use crate::net::frames::{read_frame, write_frame};
use crate::net::served::Served;
use crate::net::{close, describe_close, handshake, ClusterKey, NetError};

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub key: ClusterKey,
    /// Authenticated coordinators served at once.
    pub max_connections: usize,
    /// Connections that have not proved the key yet, at once.
    pub max_half_open: usize,
    /// Time a new connection has for the QUIC handshake and the key proof.
    pub handshake_timeout: Duration,
}

impl ServerOptions {
    /// Defaults: 64 coordinators, 256 half-open connections, 2 s to
    /// authenticate.
    pub fn new(key: ClusterKey) -> Self {
        ServerOptions {
            key,
            max_connections: 64,
            max_half_open: 256,
            handshake_timeout: Duration::from_secs(2),
        }
    }
}

/// Serves `served` on `endpoint` until `shutdown` completes.
pub async fn run(endpoint: Endpoint, served: Arc<Served>, opts: ServerOptions, shutdown: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(opts.max_connections));
    let half_open = Arc::new(Semaphore::new(opts.max_half_open));
    let opts = Arc::new(opts);
    tokio::pin!(shutdown);
    loop {
        let incoming = tokio::select! {
            _ = &mut shutdown => break,
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
        };
        let Ok(half) = half_open.clone().try_acquire_owned() else {
            tracing::debug!(
                "refused {}: {} connections are already authenticating",
                incoming.remote_address(),
                opts.max_half_open
            );
            incoming.refuse();
            continue;
        };
        let (served, opts, slots) = (served.clone(), opts.clone(), slots.clone());
        tokio::spawn(async move {
            let Some(conn) = authenticate(incoming, &served, &opts).await else {
                return;
            };
            drop(half);
            let Ok(_slot) = slots.try_acquire_owned() else {
                let msg = format!("worker busy: already serving {} connections", opts.max_connections);
                tracing::warn!("refused {}: {msg}", conn.remote_address());
                close(&conn, ErrorKind::Busy, &msg);
                return;
            };
            serve_connection(conn, served).await;
        });
    }
    endpoint.close(quinn::VarInt::from_u32(0), b"worker shutting down");
}

/// The QUIC handshake and the key proof, both within `handshake_timeout`:
/// the connection, or `None` (closed, with the reason logged).
async fn authenticate(incoming: quinn::Incoming, served: &Arc<Served>, opts: &ServerOptions) -> Option<Connection> {
    let peer = incoming.remote_address();
    let deadline = tokio::time::Instant::now() + opts.handshake_timeout;
    let late = || format!("no authentication within {} ms", opts.handshake_timeout.as_millis());
    let conn = match tokio::time::timeout_at(deadline, incoming.into_future()).await {
        Err(_) => {
            tracing::debug!("refused {peer}: {}", late());
            return None;
        }
        Ok(Err(e)) => {
            tracing::debug!("{peer}: QUIC handshake failed: {e}");
            return None;
        }
        Ok(Ok(c)) => c,
    };
    match tokio::time::timeout_at(deadline, handshake::accept(&conn, &opts.key, || served.hello())).await {
        Err(_) => {
            let msg = late();
            tracing::warn!("refused {peer}: {msg}");
            close(&conn, ErrorKind::Timeout, &msg);
            None
        }
        Ok(Err(NetError::Connection(e))) => {
            tracing::info!("{peer} left during the handshake: {}", describe_close(&e));
            None
        }
        Ok(Err(e)) => {
            tracing::warn!("refused {peer}: {e}");
            None
        }
        Ok(Ok(())) => {
            tracing::info!("coordinator {peer} connected");
            Some(conn)
        }
    }
}

async fn serve_connection(conn: Connection, served: Arc<Served>) {
    let peer = conn.remote_address();
    loop {
        tokio::select! {
            bi = conn.accept_bi() => match bi {
                Ok((send, recv)) => {
                    tokio::spawn(answer(conn.clone(), send, recv, served.clone()));
                }
                Err(e) => {
                    tracing::info!("coordinator {peer} left: {}", describe_close(&e));
                    break;
                }
            },
            uni = conn.accept_uni() => match uni {
                Ok(recv) => {
                    tokio::spawn(prefetch(conn.clone(), recv, served.clone()));
                }
                Err(e) => {
                    tracing::info!("coordinator {peer} left: {}", describe_close(&e));
                    break;
                }
            },
        }
    }
}

/// Closes the connection of a peer that broke the protocol.
fn violation(conn: &Connection, e: &NetError) {
    tracing::warn!("closing the connection from {}: {e}", conn.remote_address());
    close(conn, e.kind(), &e.to_string());
}

/// Answers one request stream.
async fn answer(conn: Connection, mut send: SendStream, mut recv: RecvStream, served: Arc<Served>) {
    let msg = match read_frame(&mut recv, MAX_FRAME_LEN).await {
        Ok((m, _)) => m,
        Err(NetError::Connection(_)) => return,
        // A well-framed request whose contents do not add up is refused on
        // its own stream; the connection carries on.
        Err(NetError::Frame(e @ FrameError::Invalid { .. })) => {
            tracing::warn!("refused a request from {}: {e}", conn.remote_address());
            let reply = Message::Error(WireError {
                kind: ErrorKind::Malformed,
                message: e.to_string(),
            });
            if write_frame(&mut send, &reply).await.is_ok() {
                let _ = send.finish();
            }
            return;
        }
        Err(e) => return violation(&conn, &e),
    };
    let reply = match msg {
        Message::RunExperts(r) => run_experts(&served, r).await,
        Message::EndRequest => {
            let svc = served.service.clone();
            if tokio::task::spawn_blocking(move || svc.end_request()).await.is_err() {
                tracing::error!("saving routing history panicked");
            }
            Message::Stats(served.stats())
        }
        other => return violation(&conn, &NetError::unexpected(other.tag(), "RunExperts or EndRequest")),
    };
    if write_frame(&mut send, &reply).await.is_ok() {
        let _ = send.finish();
    }
}

async fn run_experts(served: &Arc<Served>, r: RunExperts) -> Message {
    let failed = |message: String| {
        Message::Error(WireError {
            kind: ErrorKind::Failed,
            message,
        })
    };
    let hello = served.hello_ref();
    if r.batch.hidden != hello.hidden || r.batch.layer as u32 >= hello.num_layers {
        return failed(format!(
            "layer {} with rows of width {} does not fit this worker's model ({} layers, width {})",
            r.batch.layer, r.batch.hidden, hello.num_layers, hello.hidden
        ));
    }
    if let Err(e) = r.batch.validate_for(hello.num_experts, served.top_k()) {
        return failed(format!("request {}: {e}", r.step));
    }
    if let Some(g) = r
        .batch
        .groups
        .iter()
        .find(|g| !hello.holdings.contains(r.batch.layer, g.expert))
    {
        return failed(format!(
            "request {}: this worker does not hold layer {} expert {}",
            r.step, r.batch.layer, g.expert
        ));
    }
    let t = Instant::now();
    let svc = served.service.clone();
    let step = r.step;
    let groups = r.batch.groups.len();
    match tokio::task::spawn_blocking(move || svc.run(&r.batch)).await {
        Ok(Ok(outputs)) => {
            served.count_request(groups);
            Message::ExpertsOut(ExpertsOut {
                step,
                outputs,
                worker_ms: (t.elapsed().as_secs_f64() * 1e3) as f32,
            })
        }
        Ok(Err(e)) => {
            tracing::warn!("request {step} failed: {e}");
            failed(e.to_string())
        }
        Err(_) => {
            tracing::error!("request {step}: the expert computation panicked");
            failed("the worker's expert computation panicked".into())
        }
    }
}

/// Handles one one-way prefetch hint.
async fn prefetch(conn: Connection, mut recv: RecvStream, served: Arc<Served>) {
    let msg = match read_frame(&mut recv, MAX_FRAME_LEN).await {
        Ok((m, _)) => m,
        Err(NetError::Connection(_)) => return,
        Err(e) => return violation(&conn, &e),
    };
    let Message::Prefetch(p) = msg else {
        return violation(&conn, &NetError::unexpected(msg.tag(), "Prefetch"));
    };
    let hello = served.hello_ref();
    if p.layer as u32 >= hello.num_layers || p.hint.layer as u32 >= hello.num_layers {
        return;
    }
    // An empty batch with a hint: the store only reads ahead.
    let batch = ExpertBatch {
        layer: p.layer,
        hidden: hello.hidden,
        rows: Vec::new(),
        groups: Vec::new(),
        next: Some(p.hint),
    };
    let svc = served.service.clone();
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || svc.run(&batch)).await {
        tracing::debug!("prefetch: {e}");
    }
}
