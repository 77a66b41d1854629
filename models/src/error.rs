//! Errors from building or running a model.

use std::path::PathBuf;

use charm_common::container::ContainerError;
use charm_common::LoadError;
use charm_proto::BatchError;
use thiserror::Error;

/// Building or stepping a model failed.
#[derive(Debug, Error)]
pub enum ModelError {
    /// Reading weights failed (names the file and tensor).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// `config.json` (or `generation_config.json`) is missing, malformed, or
    /// lacks a key.
    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    /// `architectures` names a model family charm does not implement.
    #[error("unsupported architecture {name}; supported: {}", supported.join(", "))]
    UnknownArchitecture { name: String, supported: Vec<&'static str> },
    /// The expert service failed or returned something that does not fit the batch.
    #[error(transparent)]
    Expert(#[from] ExpertError),
    /// The config's layer kinds disagree with the tensors the weights hold.
    #[error("layer {layer}: the config makes it {configured}, but the weights hold {found} tensors ({source})")]
    LayerKind {
        layer: usize,
        configured: &'static str,
        found: &'static str,
        source: Box<LoadError>,
    },
    /// The request does not fit the model (e.g. a token id outside the vocabulary).
    #[error("{0}")]
    BadInput(String),
}

/// An expert service could not run a batch.
#[derive(Debug, Error)]
pub enum ExpertError {
    /// The batch or its outputs are malformed.
    #[error("malformed expert batch: {0}")]
    Batch(#[from] BatchError),
    /// The service holds no weights for this expert.
    #[error("no weights for layer {layer} expert {expert}")]
    MissingExpert { layer: u16, expert: u32 },
    /// Loading an expert's weights failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An expert record is corrupt or does not fit its container.
    #[error(transparent)]
    Container(#[from] ContainerError),
    /// Reading an expert from disk failed.
    #[error("reading layer {layer} expert {expert}: {message}")]
    Read { layer: u16, expert: u32, message: String },
    /// Cluster mode: no connected worker (nor the coordinator) holds these
    /// experts any more; `reason` says what happened to the last holders.
    #[error("no holder left for layer {layer} experts {experts:?}: {reason}")]
    Unavailable {
        layer: u16,
        experts: Vec<u32>,
        reason: String,
    },
}
