//! Cluster mode, the coordinator's side: the routed experts of each layer
//! step run on workers reached over QUIC, behind the same
//! [`ExpertService`](charm_models::ExpertService) trait as the in-process
//! worker of `--local`, so the engine and the model code do not change.
//!
//! - [`service`]: [`ClusterService`], the sharded fan-out with failover
//!   (one request per involved worker per layer, all sent before any reply
//!   is awaited; a failed share goes to the next holder).
//! - [`members`]: the workers known and connected, their counters, and the
//!   background tasks that connect them (static `--workers`, mDNS).
//! - [`placement`]: who owns which expert (holdings, cache, measured speed,
//!   routing heat), replicas, and the expected cost per token.
//! - [`cli`]: the command line of cluster mode (`--workers`,
//!   `--cluster-key-file`, `keygen`, `plan`).
//!
//! The network pieces both sides share (TLS, the cluster key, the
//! handshake, frames, mDNS) live in [`charm_worker::net`].

pub mod cli;
pub mod members;
pub mod placement;
pub mod service;

pub use placement::{Holder, ModelShape, Plan};
pub use service::{ClusterError, ClusterOptions, ClusterService, LocalBuilder};
