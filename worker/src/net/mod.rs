//! The network half of charm's cluster mode, shared by the worker (which
//! serves) and the coordinator (which connects): QUIC endpoints, the
//! cluster key and its proofs, the handshake, frame I/O on QUIC streams,
//! model fingerprints, and mDNS advertisement and browsing.
//!
//! - [`tls`]: QUIC + TLS 1.3 endpoints (self-signed worker certificates).
//! - [`key`]: the cluster key file and the session-bound HMAC proofs.
//! - [`frames`]: one [`charm_proto::Message`] per frame on a QUIC stream,
//!   with the length limit checked before the payload is read.
//! - [`handshake`]: both sides of the opening exchange (`Auth` both ways,
//!   then the worker's `Hello`), and refusals with a reason.
//! - [`fingerprint`]: which model a directory holds.
//! - [`served`]: the model a worker serves: its expert service, holdings
//!   and measured speeds (the worker's `Hello`).
//! - [`mdns`]: advertising workers and finding them (mDNS is only a hint:
//!   every peer found still has to pass the handshake).

pub mod fingerprint;
pub mod frames;
pub mod handshake;
pub mod key;
pub mod mdns;
pub mod served;
pub mod tls;

use std::net::SocketAddr;

use charm_proto::{ErrorKind, FrameError, Tag, WireError};
use thiserror::Error;

pub use key::ClusterKey;

/// A network exchange with a peer failed.
#[derive(Debug, Error)]
pub enum NetError {
    /// A frame from the peer failed to decode or validate.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The QUIC connection failed, timed out or was closed.
    #[error("{}", describe_close(.0))]
    Connection(#[from] quinn::ConnectionError),
    /// Sending on a stream failed.
    #[error("sending: {0}")]
    Write(#[from] quinn::WriteError),
    /// Receiving on a stream failed or the stream ended inside a frame.
    #[error("receiving: {0}")]
    Read(String),
    /// A connection could not be started (bad address or configuration).
    #[error("connecting to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    /// TLS or QUIC endpoint configuration failed.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// The UDP socket could not be bound.
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    /// The peer refused us or the request, saying why (an `Error` frame or a
    /// connection closed with an application code).
    #[error("{message}")]
    Refused { kind: ErrorKind, message: String },
    /// The peer sent a valid message that does not belong at this point.
    #[error("unexpected {got} message (expected {expected})")]
    Unexpected { got: &'static str, expected: &'static str },
    /// The peer did not answer in time.
    #[error("no answer within {0} ms")]
    Timeout(u64),
    /// mDNS could not be started or used.
    #[error("mDNS: {0}")]
    Mdns(String),
}

impl NetError {
    /// The error kind to report to the peer for this failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            NetError::Frame(FrameError::TooLarge { .. }) => ErrorKind::TooLarge,
            NetError::Frame(FrameError::UnsupportedVersion { .. }) => ErrorKind::UnsupportedVersion,
            NetError::Frame(_) | NetError::Unexpected { .. } => ErrorKind::Malformed,
            NetError::Refused { kind, .. } => *kind,
            NetError::Timeout(_) => ErrorKind::Timeout,
            _ => ErrorKind::Failed,
        }
    }

    /// A refusal built from an `Error` message of the peer.
    pub fn from_wire(e: WireError) -> NetError {
        NetError::Refused {
            kind: e.kind,
            message: e.message,
        }
    }

    /// An unexpected message.
    pub fn unexpected(got: Tag, expected: &'static str) -> NetError {
        NetError::Unexpected {
            got: got.name(),
            expected,
        }
    }
}

/// One line for a closed or failed connection; a peer's close reason is
/// quoted as it sent it.
pub fn describe_close(e: &quinn::ConnectionError) -> String {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => {
            let reason = String::from_utf8_lossy(&c.reason);
            if reason.is_empty() {
                format!("the peer closed the connection (code {})", c.error_code)
            } else {
                format!("the peer closed the connection: {reason}")
            }
        }
        quinn::ConnectionError::TimedOut => "the connection timed out (no answer from the peer)".into(),
        other => other.to_string(),
    }
}

/// The error kind a peer closed the connection with, if it gave one.
pub fn close_kind(e: &quinn::ConnectionError) -> Option<ErrorKind> {
    let quinn::ConnectionError::ApplicationClosed(c) = e else {
        return None;
    };
    let code = c.error_code.into_inner();
    [
        ErrorKind::Unauthenticated,
        ErrorKind::WrongModel,
        ErrorKind::Malformed,
        ErrorKind::TooLarge,
        ErrorKind::UnsupportedVersion,
        ErrorKind::Busy,
        ErrorKind::Failed,
        ErrorKind::Timeout,
    ]
    .into_iter()
    .find(|k| k.code() as u64 == code)
}

/// Closes `conn` for `kind`, with `message` (cut to fit a close frame) as
/// the reason the peer will read.
pub fn close(conn: &quinn::Connection, kind: ErrorKind, message: &str) {
    let mut end = message.len().min(1000);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    conn.close(quinn::VarInt::from_u32(kind.code()), &message.as_bytes()[..end]);
}
