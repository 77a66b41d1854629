//! charm worker: holds routed experts and computes them for the rows it is
//! sent.
//!
//! # Layout
//! - [`store`]: [`ExpertStore`], where an expert's weights come from, and
//!   [`ResidentStore`], every expert memory-mapped from the model's
//!   safetensors files (the page cache does the staging for now).
//! - [`executor`]: [`InProcessWorker`], the [`ExpertService`] that runs a
//!   batch against a store: the worker `coordinator --local` embeds, with
//!   no serialization.
//!
//! [`ExpertService`]: charm_models::ExpertService

pub mod executor;
pub mod store;

pub use executor::InProcessWorker;
pub use store::{ExpertStore, ResidentStore};
