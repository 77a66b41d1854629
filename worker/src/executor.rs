//! Runs expert batches against a store.

use charm_models::expert::run_group;
use charm_models::{ExpertError, ExpertService};
use charm_proto::{ExpertBatch, ExpertOutputs};
use rayon::prelude::*;

use crate::store::ExpertStore;

/// The worker `coordinator --local` embeds: an [`ExpertService`] that calls
/// the store directly, with no serialization.
pub struct InProcessWorker<S: ExpertStore> {
    store: S,
}

impl<S: ExpertStore> InProcessWorker<S> {
    /// A worker over `store`.
    pub fn new(store: S) -> Self {
        InProcessWorker { store }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: ExpertStore> ExpertService for InProcessWorker<S> {
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError> {
        batch.validate()?;
        let ffns = batch
            .groups
            .iter()
            .map(|g| self.store.get(batch.layer, g.expert))
            .collect::<Result<Vec<_>, _>>()?;
        let groups = batch
            .groups
            .par_iter()
            .zip(ffns)
            .map(|(g, ffn)| run_group(&ffn, batch, g))
            .collect();
        Ok(ExpertOutputs {
            layer: batch.layer,
            groups,
        })
    }
}
