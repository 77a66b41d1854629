//! One message per frame on a QUIC stream. The header is read and checked
//! (magic, version, tag, length against the limit) before a single payload
//! byte is buffered, and the payload buffer grows only as bytes arrive, so
//! a peer announcing a huge frame gets an error, not an allocation.

use charm_proto::frame::{decode_payload, encode, parse_header};
use charm_proto::{Message, HEADER_LEN};
use quinn::{ReadExactError, RecvStream, SendStream};

use super::NetError;

/// Bytes requested from the stream at a time.
const CHUNK: usize = 1 << 20;

/// Reads one frame of at most `max_len` payload bytes; returns the message
/// and the frame's size in bytes.
pub async fn read_frame(recv: &mut RecvStream, max_len: u32) -> Result<(Message, usize), NetError> {
    let mut header = [0u8; HEADER_LEN];
    recv.read_exact(&mut header).await.map_err(|e| match e {
        ReadExactError::FinishedEarly(0) => NetError::Read("the stream ended before a frame".into()),
        ReadExactError::FinishedEarly(n) => NetError::Read(format!("the stream ended {n} bytes into a frame header")),
        ReadExactError::ReadError(quinn::ReadError::ConnectionLost(c)) => NetError::Connection(c),
        ReadExactError::ReadError(e) => NetError::Read(e.to_string()),
    })?;
    let h = parse_header(&header, max_len)?;
    let len = h.len as usize;
    let mut payload = Vec::with_capacity(len.min(CHUNK));
    while payload.len() < len {
        match recv.read_chunk(len - payload.len(), true).await {
            Ok(Some(chunk)) => payload.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(NetError::Read(format!(
                    "the stream ended {} bytes into a {}-byte {} frame",
                    payload.len(),
                    len,
                    h.tag.name()
                )))
            }
            Err(quinn::ReadError::ConnectionLost(c)) => return Err(NetError::Connection(c)),
            Err(e) => return Err(NetError::Read(e.to_string())),
        }
    }
    Ok((decode_payload(h, &payload)?, HEADER_LEN + len))
}

/// Writes one already encoded frame.
pub async fn write_bytes(send: &mut SendStream, frame: &[u8]) -> Result<usize, NetError> {
    send.write_all(frame).await?;
    Ok(frame.len())
}

/// Encodes and writes one message; returns the frame's size in bytes.
pub async fn write_frame(send: &mut SendStream, msg: &Message) -> Result<usize, NetError> {
    let frame = encode(msg)?;
    write_bytes(send, &frame).await
}
