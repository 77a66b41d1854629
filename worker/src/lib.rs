//! charm worker: holds routed experts and computes them for the rows it is
//! sent.
//!
//! # Layout
//! - [`store`]: [`ExpertStore`], which resolves a layer step's experts to
//!   weights, and [`ResidentStore`], every expert memory-mapped from a
//!   Hugging Face directory's safetensors files.
//! - [`disk_store`]: [`DiskStore`], a charm container's experts streamed
//!   from disk into a RAM cache with a budget, read-ahead of the predicted
//!   next layer, and a pinned hot set learned from routing history.
//! - [`cache`]: the byte-budgeted cache (pinned set + LRU).
//! - [`prefetch_policy`]: whether read-ahead pays (used against wasted
//!   reads and the evictions it caused); it stands down while it loses.
//! - [`history`]: routing counts, persisted and checked against the model
//!   fingerprint.
//! - [`io`]: the disk reader: io_uring on Linux, a pread thread pool
//!   elsewhere, optional O_DIRECT.
//! - [`sysmem`]: available memory, the default cache budget, where learned
//!   state lives.
//! - [`executor`]: [`InProcessWorker`], the [`ExpertService`] that runs a
//!   batch against a store: the worker `coordinator --local` embeds, with
//!   no serialization.
//! - [`net`]: the cluster network layer shared with the coordinator: QUIC
//!   endpoints, the cluster key and its proofs, the handshake, frame I/O,
//!   model fingerprints, the served model, mDNS.
//! - [`server`]: the QUIC server the `worker` binary runs: authenticated
//!   coordinators send `RunExperts` and get the same per-expert outputs the
//!   in-process worker computes.
//!
//! [`ExpertService`]: charm_models::ExpertService

pub mod cache;
pub mod disk_store;
pub mod executor;
pub mod history;
pub mod io;
pub mod net;
pub mod prefetch_policy;
pub mod server;
pub mod store;
pub mod sysmem;

pub use disk_store::{DiskStore, StoreOptions};
pub use executor::InProcessWorker;
pub use store::{ExpertStore, ResidentStore};

impl charm_common::ByteSource for io::AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}
