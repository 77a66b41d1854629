//! Where an expert's weights come from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use charm_common::WeightSource;
use charm_models::{ExpertError, ExpertStats, ModelConfig, SwiGlu};
use charm_proto::PrefetchHint;

/// Experts handed to the executor, with their index in the request.
pub type Ready = Vec<(usize, Arc<SwiGlu>)>;

/// Resolves a layer step's experts to their weights.
pub trait ExpertStore: Send + Sync {
    /// Resolves `wanted` (expert id, rows routed to it) of `layer`, calling
    /// `ready` with batches of `(index into wanted, weights)` as soon as
    /// they are available: cached experts first, while disk reads for the
    /// others are in flight, then each read as it lands. Every index is
    /// delivered exactly once, or an error is returned. `next` names the
    /// experts a later layer is predicted to need (read ahead, never
    /// evicting what this step needs).
    fn resolve(
        &self,
        layer: u16,
        wanted: &[(u32, u64)],
        next: Option<&PrefetchHint>,
        ready: &mut dyn FnMut(Ready),
    ) -> Result<(), ExpertError>;

    /// Counters since start.
    fn stats(&self) -> ExpertStats;

    /// A request ended: persist routing history, re-pin the hot set.
    fn end_request(&self) {}
}

/// Every routed expert of a Hugging Face directory, memory-mapped from its
/// safetensors files (the page cache does the staging). Shapes are checked
/// for all of them at open, so a bad file fails at start, not mid-answer.
pub struct ResidentStore {
    /// `experts[layer][expert]`; empty for dense layers.
    experts: Vec<Vec<Arc<SwiGlu>>>,
    hits: AtomicU64,
}

impl ResidentStore {
    /// Maps every routed expert named by `cfg` from `files`.
    pub fn open(files: &dyn WeightSource, cfg: &ModelConfig) -> Result<Self, ExpertError> {
        let mut experts = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let mut layer = Vec::new();
            if cfg.is_moe_layer(l) {
                for e in 0..cfg.num_experts {
                    let ffn = charm_models::expert::load_expert(files, cfg, l, e)?;
                    layer.push(Arc::new(ffn));
                }
            }
            experts.push(layer);
        }
        Ok(ResidentStore {
            experts,
            hits: AtomicU64::new(0),
        })
    }

    /// Number of experts held.
    pub fn len(&self) -> usize {
        self.experts.iter().map(Vec::len).sum()
    }

    /// Whether no expert is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, layer: u16, expert: u32) -> Result<Arc<SwiGlu>, ExpertError> {
        self.experts
            .get(layer as usize)
            .and_then(|l| l.get(expert as usize))
            .cloned()
            .ok_or(ExpertError::MissingExpert { layer, expert })
    }
}

impl ExpertStore for ResidentStore {
    fn resolve(
        &self,
        layer: u16,
        wanted: &[(u32, u64)],
        _next: Option<&PrefetchHint>,
        ready: &mut dyn FnMut(Ready),
    ) -> Result<(), ExpertError> {
        let all = wanted
            .iter()
            .enumerate()
            .map(|(i, &(e, _))| Ok((i, self.get(layer, e)?)))
            .collect::<Result<Ready, ExpertError>>()?;
        self.hits.fetch_add(all.len() as u64, Ordering::Relaxed);
        ready(all);
        Ok(())
    }

    fn stats(&self) -> ExpertStats {
        ExpertStats {
            expert_hits: self.hits.load(Ordering::Relaxed),
            ..Default::default()
        }
    }
}
