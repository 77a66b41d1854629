//! charm wire messages: pure data, no I/O, no async.
//!
//! # Layout
//! - [`expert`]: one MoE layer's routed work grouped by expert (the
//!   batch-union, [`ExpertBatch`]) and the per-expert outputs that come back
//!   ([`ExpertOutputs`]), with the shape checks both sides run. The
//!   in-process worker of `--local` takes these types directly.
//! - [`wire`]: the cluster protocol's messages ([`Message`]: `Auth`,
//!   `Hello`, `RunExperts`, `ExpertsOut`, `Prefetch`, `EndRequest`,
//!   `Stats`, `Error`) and their validation.
//! - [`frame`]: the 12-byte frame header (magic, version, tag, length),
//!   bincode payloads, and the length limits checked before allocating.
//!
//! Nothing here touches a socket, so the decoder can be fuzzed
//! (`fuzz/`, and the randomized test `tests/frame_fuzz.rs` on stable).

pub mod expert;
pub mod frame;
pub mod wire;

pub use expert::{BatchError, ExpertBatch, ExpertGroup, ExpertOutputs, GroupOutput, PrefetchHint};
pub use frame::{FrameError, FrameHeader, HEADER_LEN, MAX_FRAME_LEN, MAX_HANDSHAKE_FRAME_LEN, MIN_FRAME_LEN};
pub use wire::{
    Auth, ErrorKind, ExpertRange, ExpertsOut, Hello, Holdings, LayerHolding, Message, Prefetch, Role, RunExperts, Tag,
    WireError, WorkerStats,
};

/// Version of the wire protocol, carried in every frame header. Bumped on
/// any incompatible change; a frame of another version is refused by number.
pub const PROTOCOL_VERSION: u32 = 3;
