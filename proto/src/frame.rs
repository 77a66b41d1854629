//! Framing: every message travels as a 12-byte header and a bincode payload.
//!
//! ```text
//! offset  size  field
//! 0       4     magic "CHRM"
//! 4       2     protocol version, little-endian (PROTOCOL_VERSION)
//! 6       1     tag (which message, see `Tag`)
//! 7       1     flags, must be 0
//! 8       4     payload length in bytes, little-endian
//! 12      len   payload: the message body, bincode 2 (standard config:
//!               little-endian, variable-length integers) through serde
//! ```
//!
//! The header is checked field by field before anything else is read: a
//! foreign byte stream fails at the magic, a peer of another protocol
//! version is refused by number, and a length above the receiver's limit is
//! refused before a single payload byte is buffered. The payload must decode
//! to exactly its length and pass [`Message::validate`].
//!
//! Memory: the decoder borrows from the payload slice, so a string's
//! claimed length is checked against the bytes really there before it is
//! copied, and serde pre-allocates at most 1 MiB for a list whatever length
//! it claims (lists nest at most two deep). Decoding a payload of `len`
//! bytes therefore allocates at most 2 MiB plus a small multiple of `len`
//! (checked with a counting allocator by the randomized test in
//! `proto/tests/frame_fuzz.rs`).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::wire::{Message, Tag};
use crate::PROTOCOL_VERSION;

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"CHRM";
/// Bytes of the frame header.
pub const HEADER_LEN: usize = 12;
/// Largest payload accepted from an authenticated peer. Requests larger
/// than this are split by the coordinator (by expert groups).
pub const MAX_FRAME_LEN: u32 = 64 << 20;
/// Smallest frame limit a worker may announce: room for a decode step's
/// request at any model width charm runs. A worker announcing less is
/// refused at the handshake instead of failing every request split.
pub const MIN_FRAME_LEN: u32 = 1 << 20;
/// Largest payload accepted before the peer has proven the cluster key
/// (`Auth`, `Hello`, `Error`): strangers cannot make anyone allocate much.
pub const MAX_HANDSHAKE_FRAME_LEN: u32 = 64 << 10;

const _: () = assert!(
    PROTOCOL_VERSION <= u16::MAX as u32,
    "the header carries the version in 16 bits"
);

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// A frame could not be encoded or decoded.
#[derive(Debug, Error, PartialEq)]
pub enum FrameError {
    /// The buffer ends before the header or the payload does (`needed`
    /// more bytes); only [`decode`] on a partial buffer says this.
    #[error("frame incomplete: {needed} more bytes needed")]
    Incomplete { needed: usize },
    /// The bytes do not start with the frame magic: the peer does not speak
    /// the charm protocol.
    #[error("not a charm frame (starts with {found:02x?}, expected \"CHRM\")")]
    BadMagic { found: [u8; 4] },
    /// The frame carries a protocol version this build does not speak.
    #[error("peer speaks charm protocol version {found}; this build speaks version {PROTOCOL_VERSION}")]
    UnsupportedVersion { found: u16 },
    /// The tag byte names no message.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// The flags byte is not zero (no flags are defined).
    #[error("frame flags {0:#04x} are not zero")]
    BadFlags(u8),
    /// The payload is longer than the receiver accepts (or, when encoding,
    /// than a frame can carry).
    #[error("{tag} frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { tag: &'static str, len: u64, max: u32 },
    /// The payload does not decode as its message, or has bytes left over.
    #[error("malformed {tag} frame: {reason}")]
    Malformed { tag: &'static str, reason: String },
    /// The payload decodes but its contents are inconsistent (a row index
    /// out of range, unsorted groups, an oversized field).
    #[error("invalid {tag} message: {reason}")]
    Invalid { tag: &'static str, reason: String },
}

/// The fixed part of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub tag: Tag,
    /// Payload bytes that follow the header.
    pub len: u32,
}

/// Encodes `msg` as one frame (header and payload).
pub fn encode(msg: &Message) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; HEADER_LEN];
    let tag = msg.tag();
    let body = match msg {
        Message::Auth(m) => append(&mut out, m),
        Message::Hello(m) => append(&mut out, m),
        Message::RunExperts(m) => append(&mut out, m),
        Message::ExpertsOut(m) => append(&mut out, m),
        Message::Prefetch(m) => append(&mut out, m),
        Message::EndRequest => Ok(()),
        Message::Stats(m) => append(&mut out, m),
        Message::Error(m) => append(&mut out, m),
    };
    body.map_err(|reason| FrameError::Malformed {
        tag: tag.name(),
        reason,
    })?;
    let len = out.len() - HEADER_LEN;
    let len = u32::try_from(len).map_err(|_| FrameError::TooLarge {
        tag: tag.name(),
        len: len as u64,
        max: u32::MAX,
    })?;
    out[0..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&(PROTOCOL_VERSION as u16).to_le_bytes());
    out[6] = tag as u8;
    out[7] = 0;
    out[8..12].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

fn append<T: Serialize>(out: &mut Vec<u8>, m: &T) -> Result<(), String> {
    bincode::serde::encode_into_std_write(m, out, config())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Checks a frame header: magic, version, tag, flags, and `len <= max_len`.
/// `bytes` must hold at least [`HEADER_LEN`] bytes.
pub fn parse_header(bytes: &[u8], max_len: u32) -> Result<FrameHeader, FrameError> {
    if bytes.len() < HEADER_LEN {
        return Err(FrameError::Incomplete {
            needed: HEADER_LEN - bytes.len(),
        });
    }
    let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(FrameError::BadMagic { found: magic });
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version as u32 != PROTOCOL_VERSION {
        return Err(FrameError::UnsupportedVersion { found: version });
    }
    let tag = Tag::from_u8(bytes[6]).ok_or(FrameError::UnknownTag(bytes[6]))?;
    if bytes[7] != 0 {
        return Err(FrameError::BadFlags(bytes[7]));
    }
    let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if len > max_len {
        return Err(FrameError::TooLarge {
            tag: tag.name(),
            len: len as u64,
            max: max_len,
        });
    }
    Ok(FrameHeader { tag, len })
}

/// Decodes and validates the payload of a frame whose header was `header`.
pub fn decode_payload(header: FrameHeader, payload: &[u8]) -> Result<Message, FrameError> {
    let tag = header.tag;
    if payload.len() != header.len as usize {
        return Err(FrameError::Malformed {
            tag: tag.name(),
            reason: format!("{} payload bytes, header says {}", payload.len(), header.len),
        });
    }
    let msg = match tag {
        Tag::Auth => Message::Auth(body(tag, payload)?),
        Tag::Hello => Message::Hello(body(tag, payload)?),
        Tag::RunExperts => Message::RunExperts(body(tag, payload)?),
        Tag::ExpertsOut => Message::ExpertsOut(body(tag, payload)?),
        Tag::Prefetch => Message::Prefetch(body(tag, payload)?),
        Tag::EndRequest => {
            if !payload.is_empty() {
                return Err(FrameError::Malformed {
                    tag: tag.name(),
                    reason: format!("{} unexpected payload bytes", payload.len()),
                });
            }
            Message::EndRequest
        }
        Tag::Stats => Message::Stats(body(tag, payload)?),
        Tag::Error => Message::Error(body(tag, payload)?),
    };
    msg.validate().map_err(|reason| FrameError::Invalid {
        tag: tag.name(),
        reason,
    })?;
    Ok(msg)
}

fn body<'a, T: Deserialize<'a>>(tag: Tag, payload: &'a [u8]) -> Result<T, FrameError> {
    let malformed = |reason: String| FrameError::Malformed {
        tag: tag.name(),
        reason,
    };
    // The borrowing decoder hands strings over as slices of the payload, so
    // their lengths are checked against what is really there (and against
    // `MAX_TEXT_LEN`) before anything is copied.
    let (value, used) =
        bincode::serde::borrow_decode_from_slice(payload, config()).map_err(|e| malformed(e.to_string()))?;
    if used != payload.len() {
        return Err(malformed(format!("{} bytes left over", payload.len() - used)));
    }
    Ok(value)
}

/// Decodes one frame from the start of `buf`; returns the message and the
/// bytes it used. [`FrameError::Incomplete`] says how many more bytes are
/// needed; every other error is final for the stream.
pub fn decode(buf: &[u8], max_len: u32) -> Result<(Message, usize), FrameError> {
    let header = parse_header(buf, max_len)?;
    let end = HEADER_LEN + header.len as usize;
    if buf.len() < end {
        return Err(FrameError::Incomplete {
            needed: end - buf.len(),
        });
    }
    Ok((decode_payload(header, &buf[HEADER_LEN..end])?, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expert::{ExpertBatch, ExpertGroup, ExpertOutputs, GroupOutput, PrefetchHint};
    use crate::wire::*;

    fn run() -> Message {
        Message::RunExperts(RunExperts {
            step: 7,
            batch: ExpertBatch {
                layer: 1,
                hidden: 2,
                rows: vec![1.0, -2.0],
                groups: vec![ExpertGroup {
                    expert: 3,
                    rows: vec![0],
                    weights: vec![0.5],
                }],
                next: Some(PrefetchHint {
                    layer: 2,
                    experts: vec![4],
                }),
            },
        })
    }

    fn samples() -> Vec<Message> {
        vec![
            Message::Auth(Auth {
                role: Role::Worker,
                proof: [9; PROOF_LEN],
                fingerprint: "abc".into(),
            }),
            Message::Hello(Hello {
                software: "charm-worker 0.1.0".into(),
                arithmetic: 2,
                fingerprint: "abc".into(),
                num_layers: 2,
                num_experts: 8,
                hidden: 64,
                holdings: Holdings::from_experts([(0, 1), (0, 2), (1, 7)]),
                format: "safetensors f32".into(),
                expert_bytes: 4096,
                cache_bytes: 1 << 20,
                disk_bytes_per_s: 1e9,
                expert_rows_per_s: 5e4,
                max_frame: MAX_FRAME_LEN,
                stats: WorkerStats::default(),
            }),
            run(),
            Message::ExpertsOut(ExpertsOut {
                step: 7,
                outputs: ExpertOutputs {
                    layer: 1,
                    groups: vec![GroupOutput {
                        expert: 3,
                        out: vec![0.25, 4.0],
                    }],
                },
                worker_ms: 0.5,
            }),
            Message::Prefetch(Prefetch {
                layer: 0,
                hint: PrefetchHint {
                    layer: 1,
                    experts: vec![0, 5],
                },
            }),
            Message::EndRequest,
            Message::Stats(WorkerStats {
                requests: 3,
                expert_hits: 2,
                io_wait_ms: 1.5,
                ..Default::default()
            }),
            Message::Error(WireError {
                kind: ErrorKind::Failed,
                message: "no weights".into(),
            }),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            let bytes = encode(&m).unwrap();
            let (back, used) = decode(&bytes, MAX_FRAME_LEN).unwrap();
            assert_eq!(back, m);
            assert_eq!(used, bytes.len());
            assert_eq!(bytes[6], m.tag() as u8);
        }
    }

    /// The version, the tags and the close codes are the protocol: a silent
    /// renumbering must fail here.
    #[test]
    fn version_tags_and_codes_are_pinned() {
        assert_eq!(PROTOCOL_VERSION, 3);
        let tags: Vec<(u8, &str)> = Tag::ALL.iter().map(|t| (*t as u8, t.name())).collect();
        assert_eq!(
            tags,
            vec![
                (1, "Auth"),
                (2, "Hello"),
                (3, "RunExperts"),
                (4, "ExpertsOut"),
                (5, "Prefetch"),
                (6, "EndRequest"),
                (7, "Stats"),
                (8, "Error"),
            ]
        );
        let codes: Vec<u32> = [
            ErrorKind::Unauthenticated,
            ErrorKind::WrongModel,
            ErrorKind::Malformed,
            ErrorKind::TooLarge,
            ErrorKind::UnsupportedVersion,
            ErrorKind::Busy,
            ErrorKind::Failed,
            ErrorKind::Timeout,
        ]
        .iter()
        .map(|k| k.code())
        .collect();
        assert_eq!(codes, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(MAGIC, *b"CHRM");
        assert_eq!(HEADER_LEN, 12);
    }

    /// The exact bytes of one small request: any change to the header, the
    /// bincode configuration or the field order of `RunExperts` fails here.
    #[test]
    fn golden_bytes_of_a_request() {
        let bytes = encode(&run()).unwrap();
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            b'C', b'H', b'R', b'M', 3, 0, 3, 0, 25, 0, 0, 0, // header: version 3, tag 3, 25 bytes
            7,                                   // step (varint)
            1,                                   // layer
            2,                                   // hidden
            2, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, // rows: [1.0, -2.0]
            1, 3, 1, 0, 1, 0x00, 0x00, 0x00, 0x3f, // groups: [{expert 3, rows [0], weights [0.5]}]
            1, 2, 1, 4,                          // next: Some({layer 2, experts [4]})
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn header_errors_are_named() {
        let good = encode(&run()).unwrap();
        let mut b = good.clone();
        b[0] = b'G';
        assert!(matches!(decode(&b, MAX_FRAME_LEN), Err(FrameError::BadMagic { .. })));
        let mut b = good.clone();
        b[4] = 1;
        let err = decode(&b, MAX_FRAME_LEN).unwrap_err();
        assert_eq!(err, FrameError::UnsupportedVersion { found: 1 });
        assert!(err.to_string().contains("version 1") && err.to_string().contains("version 3"));
        let mut b = good.clone();
        b[6] = 200;
        assert_eq!(decode(&b, MAX_FRAME_LEN), Err(FrameError::UnknownTag(200)));
        let mut b = good.clone();
        b[7] = 1;
        assert_eq!(decode(&b, MAX_FRAME_LEN), Err(FrameError::BadFlags(1)));
        let err = decode(&good, 10).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len: 25, max: 10, .. }), "{err}");
        assert_eq!(
            decode(&good[..5], MAX_FRAME_LEN),
            Err(FrameError::Incomplete { needed: 7 })
        );
        assert_eq!(
            decode(&good[..20], MAX_FRAME_LEN),
            Err(FrameError::Incomplete { needed: 17 })
        );
    }

    #[test]
    fn an_announced_length_is_refused_before_the_payload_arrives() {
        let mut header = encode(&Message::EndRequest).unwrap();
        header[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = parse_header(&header, MAX_FRAME_LEN).unwrap_err();
        assert!(err.to_string().contains("exceeds the limit"), "{err}");
    }

    #[test]
    fn payload_errors_are_named() {
        // Trailing garbage after a valid body.
        let mut b = encode(&run()).unwrap();
        b.push(0);
        let len = (b.len() - HEADER_LEN) as u32;
        b[8..12].copy_from_slice(&len.to_le_bytes());
        let err = decode(&b, MAX_FRAME_LEN).unwrap_err();
        assert!(err.to_string().contains("left over"), "{err}");
        // A row index beyond the rows carried decodes but does not validate.
        let Message::RunExperts(mut r) = run() else {
            unreachable!()
        };
        r.batch.groups[0].rows[0] = 5;
        let b = encode(&Message::RunExperts(r)).unwrap();
        let err = decode(&b, MAX_FRAME_LEN).unwrap_err();
        assert!(matches!(err, FrameError::Invalid { tag: "RunExperts", .. }), "{err}");
        // A truncated body.
        let mut b = encode(&run()).unwrap();
        b.truncate(b.len() - 3);
        let len = (b.len() - HEADER_LEN) as u32;
        b[8..12].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(decode(&b, MAX_FRAME_LEN), Err(FrameError::Malformed { .. })));
        // EndRequest carries nothing.
        let mut b = encode(&Message::EndRequest).unwrap();
        b.push(1);
        b[8] = 1;
        assert!(matches!(decode(&b, MAX_FRAME_LEN), Err(FrameError::Malformed { .. })));
        // Non-finite measurements are refused.
        let mut m = samples()[1].clone();
        if let Message::Hello(h) = &mut m {
            h.disk_bytes_per_s = f64::NAN;
        }
        let err = decode(&encode(&m).unwrap(), MAX_FRAME_LEN).unwrap_err();
        assert!(err.to_string().contains("disk_bytes_per_s"), "{err}");
    }
}
