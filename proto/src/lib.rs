//! charm wire messages: pure data, no I/O, no async.
//!
//! # Layout
//! - [`expert`]: one MoE layer's routed work grouped by expert (the
//!   batch-union, [`ExpertBatch`]) and the per-expert outputs that come back
//!   ([`ExpertOutputs`]), with the shape checks both sides run.
//!
//! Today these types cross only the in-process seam (no serialization). The
//! cluster transport will frame them as `RunExperts` / `ExpertsOut`; the
//! types already derive serde and validate every length against the batch
//! so a hostile frame is an error, never a panic.

pub mod expert;

pub use expert::{BatchError, ExpertBatch, ExpertGroup, ExpertOutputs, GroupOutput, PrefetchHint};

/// Version of the wire protocol. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;
