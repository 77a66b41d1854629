//! The expert seam: how a model's routed work reaches a worker.
//!
//! The model builds an [`ExpertBatch`] per MoE layer step (router and top-k
//! run on the coordinator); an [`ExpertService`] runs it and returns one
//! [`GroupOutput`] per expert. The in-process worker of `--local`, a remote
//! worker and a sharded fan-out all implement [`ExpertService`]; the model
//! never knows which one it talks to.

use charm_proto::{ExpertBatch, ExpertGroup, ExpertOutputs, GroupOutput};

use crate::error::ExpertError;
use crate::ffn::SwiGlu;

/// Runs the routed experts of one layer step.
///
/// Implementations must return, for every group, exactly
/// [`run_group`]'s result: the same math whatever the placement, so the
/// coordinator's canonical combine gives the same bits everywhere.
pub trait ExpertService: Send + Sync {
    /// Runs every group of `batch`.
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError>;

    /// Advisory: these experts of `layer` are likely needed soon.
    fn hint(&self, _layer: u16, _experts: &[u32]) {}
}

/// Computes one expert's weighted outputs for the rows that chose it:
/// `weights[i] * ffn(rows[i])`.
///
/// `current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]`
pub fn run_group(ffn: &SwiGlu, batch: &ExpertBatch, group: &ExpertGroup) -> GroupOutput {
    let h = batch.hidden as usize;
    let n = group.rows.len();
    let mut xs = Vec::with_capacity(n * h);
    for &r in &group.rows {
        xs.extend_from_slice(batch.row(r as usize));
    }
    let mut out = vec![0.0; n * h];
    ffn.forward(&xs, n, &mut out);
    for (row, &w) in out.chunks_exact_mut(h).zip(&group.weights) {
        for v in row {
            *v *= w;
        }
    }
    GroupOutput {
        expert: group.expert,
        out,
    }
}
