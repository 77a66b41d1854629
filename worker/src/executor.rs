//! Runs expert batches against a store.

use charm_models::expert::run_group_with;
use charm_models::{ExpertError, ExpertService, ExpertStats};
use charm_proto::{BatchError, ExpertBatch, ExpertOutputs, GroupOutput};
use rayon::prelude::*;

use crate::store::ExpertStore;

/// The worker `coordinator --local` embeds: an [`ExpertService`] that calls
/// the store directly, with no serialization. Cached experts are computed
/// while the store's disk reads for the others are in flight.
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
        let wanted: Vec<(u32, u64)> = batch.groups.iter().map(|g| (g.expert, g.rows.len() as u64)).collect();
        let mut outputs: Vec<Option<GroupOutput>> = vec![None; batch.groups.len()];
        self.store
            .resolve(batch.layer, &wanted, batch.next.as_ref(), &mut |ready| {
                // Enough groups to keep every thread busy: one thread per
                // group (no nested fork-join); else split each group's rows.
                let parallel = ready.len() < 2 * rayon::current_num_threads();
                let done: Vec<(usize, GroupOutput)> = ready
                    .into_par_iter()
                    .map(|(i, ffn)| (i, run_group_with(&ffn, batch, &batch.groups[i], parallel)))
                    .collect();
                for (i, out) in done {
                    outputs[i] = Some(out);
                }
            })?;
        let groups = outputs
            .into_iter()
            .zip(&batch.groups)
            .map(|(o, g)| {
                o.ok_or_else(|| {
                    ExpertError::Batch(BatchError::OutputMismatch(format!(
                        "store delivered no weights for expert {}",
                        g.expert
                    )))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExpertOutputs {
            layer: batch.layer,
            groups,
        })
    }

    fn stats(&self) -> ExpertStats {
        self.store.stats()
    }

    fn end_request(&self) {
        self.store.end_request();
    }
}
