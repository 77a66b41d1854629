//! The opening exchange of every connection, both sides:
//!
//! ```text
//! coordinator                                   worker
//!   ── Auth {Coordinator, proof, fingerprint} ──▶  checks the proof, then the model
//!   ◀── Auth {Worker, proof, fingerprint} ───────  (or closes: Unauthenticated / WrongModel)
//!   ◀── Hello {holdings, cache, speeds, ...} ─────
//! checks the proof, then the model
//! ```
//!
//! Nothing else is read or sent before both proofs verify, and neither side
//! grants the other more than a handshake's worth of flow-control credit
//! (or, on a worker, more than the handshake's stream) until the other's
//! proof verified ([`super::tls::grant`]). A refusal closes
//! the connection with an application code ([`charm_proto::ErrorKind::code`])
//! and a one-line reason the other side prints.

use std::net::SocketAddr;

use charm_proto::wire::PROOF_LEN;
use charm_proto::{Auth, ErrorKind, Hello, Message, Role, MAX_HANDSHAKE_FRAME_LEN};
use quinn::{Connection, Endpoint};

use super::frames::{read_frame, write_frame};
use super::key::{ClusterKey, EXPORTER_LABEL, EXPORTER_LEN};
use super::tls::{self, SERVER_NAME};
use super::{close, close_kind, describe_close, NetError};

/// The secret both ends of this TLS session share (RFC 5705 exporter).
pub fn session_secret(conn: &Connection) -> Result<[u8; EXPORTER_LEN], NetError> {
    let mut out = [0u8; EXPORTER_LEN];
    conn.export_keying_material(&mut out, EXPORTER_LABEL, b"")
        .map_err(|_| NetError::Tls("the TLS session cannot export keying material".into()))?;
    Ok(out)
}

/// The first 16 hex digits of a fingerprint, for messages.
pub fn short(fingerprint: &str) -> &str {
    let mut end = fingerprint.len().min(16);
    while !fingerprint.is_char_boundary(end) {
        end -= 1;
    }
    &fingerprint[..end]
}

/// Closes `conn` for `kind` and returns the matching error.
fn refuse(conn: &Connection, kind: ErrorKind, message: String) -> NetError {
    close(conn, kind, &message);
    NetError::Refused { kind, message }
}

/// A connection the peer closed with a reason becomes a refusal that quotes it.
fn as_refusal(e: NetError) -> NetError {
    match e {
        NetError::Connection(c) => match close_kind(&c) {
            Some(kind) => NetError::Refused {
                kind,
                message: describe_close(&c),
            },
            None => NetError::Connection(c),
        },
        other => other,
    }
}

/// Worker side: waits for the coordinator's proof, checks it and the model,
/// then proves itself and says hello (`hello` is asked for only then, so a
/// stranger costs no look at the store). On any failure the connection is
/// closed with the reason and the error returned (for the worker's log).
pub async fn accept(conn: &Connection, key: &ClusterKey, hello: impl FnOnce() -> Hello) -> Result<(), NetError> {
    let (mut send, mut recv) = conn.accept_bi().await?;
    let secret = session_secret(conn)?;
    let msg = match read_frame(&mut recv, MAX_HANDSHAKE_FRAME_LEN).await {
        Ok((m, _)) => m,
        Err(NetError::Connection(c)) => return Err(NetError::Connection(c)),
        Err(e) => return Err(refuse(conn, e.kind(), format!("handshake: {e}"))),
    };
    let Message::Auth(auth) = msg else {
        return Err(refuse(
            conn,
            ErrorKind::Malformed,
            format!("handshake: expected Auth, got {}", msg.tag().name()),
        ));
    };
    if auth.role != Role::Coordinator || !key.verify(Role::Coordinator, &secret, &auth.proof) {
        return Err(refuse(
            conn,
            ErrorKind::Unauthenticated,
            "cluster key proof did not verify: the peer does not hold this worker's cluster key".into(),
        ));
    }
    let hello = hello();
    if auth.fingerprint != hello.fingerprint {
        return Err(refuse(
            conn,
            ErrorKind::WrongModel,
            format!(
                "this worker holds a different model (fingerprint {}…; the coordinator runs {}…)",
                short(&hello.fingerprint),
                short(&auth.fingerprint)
            ),
        ));
    }
    tls::grant(conn, true);
    let proof = key.proof(Role::Worker, &secret);
    write_frame(
        &mut send,
        &Message::Auth(Auth {
            role: Role::Worker,
            proof,
            fingerprint: hello.fingerprint.clone(),
        }),
    )
    .await?;
    write_frame(&mut send, &Message::Hello(hello)).await?;
    let _ = send.finish();
    Ok(())
}

/// Coordinator side: connects to `addr`, proves the key, checks the
/// worker's proof and returns the connection and the worker's `Hello`.
/// Model checks beyond the fingerprint (shape) are the caller's.
pub async fn connect(
    endpoint: &Endpoint,
    addr: SocketAddr,
    key: &ClusterKey,
    fingerprint: &str,
) -> Result<(Connection, Hello), NetError> {
    let connecting = endpoint.connect(addr, SERVER_NAME).map_err(|e| NetError::Connect {
        addr,
        reason: e.to_string(),
    })?;
    let conn = connecting.await?;
    let secret = session_secret(&conn)?;
    let (mut send, mut recv) = conn.open_bi().await?;
    write_frame(
        &mut send,
        &Message::Auth(Auth {
            role: Role::Coordinator,
            proof: key.proof(Role::Coordinator, &secret),
            fingerprint: fingerprint.to_string(),
        }),
    )
    .await
    .map_err(as_refusal)?;
    let _ = send.finish();
    let (msg, _) = read_frame(&mut recv, MAX_HANDSHAKE_FRAME_LEN)
        .await
        .map_err(as_refusal)?;
    match msg {
        Message::Auth(a) if a.role == Role::Worker && key.verify(Role::Worker, &secret, &a.proof) => {
            tls::grant(&conn, false)
        }
        Message::Auth(_) => {
            return Err(refuse(
                &conn,
                ErrorKind::Unauthenticated,
                "cluster key proof did not verify: the worker does not hold our cluster key".into(),
            ))
        }
        Message::Error(e) => return Err(NetError::from_wire(e)),
        other => return Err(NetError::unexpected(other.tag(), "Auth")),
    }
    let (msg, _) = read_frame(&mut recv, MAX_HANDSHAKE_FRAME_LEN)
        .await
        .map_err(as_refusal)?;
    match msg {
        Message::Hello(h) => Ok((conn, h)),
        Message::Error(e) => Err(NetError::from_wire(e)),
        other => Err(NetError::unexpected(other.tag(), "Hello")),
    }
}

const _: () = assert!(PROOF_LEN == 32, "HMAC-SHA256 proofs are 32 bytes");
