//! The expert seam: how a model's routed work reaches a worker.
//!
//! The model builds an [`ExpertBatch`] per MoE layer step (router and top-k
//! run on the coordinator); an [`ExpertService`] runs it and returns one
//! [`GroupOutput`] per expert. The in-process worker of `--local`, a remote
//! worker and a sharded fan-out all implement [`ExpertService`]; the model
//! never knows which one it talks to.

use charm_proto::{ExpertBatch, ExpertGroup, ExpertOutputs, GroupOutput};
use serde::Serialize;

use charm_common::{LoadError, Weight, WeightSource};

use crate::config::ModelConfig;
use crate::error::ExpertError;
use crate::ffn::{FfnBias, SwiGlu};

/// Runs the routed experts of one layer step.
///
/// Implementations must return, for every group, exactly
/// [`run_group`]'s result: the same math whatever the placement, so the
/// coordinator's canonical combine gives the same bits everywhere.
pub trait ExpertService: Send + Sync {
    /// Runs every group of `batch`. `batch.next`, when present, predicts
    /// the next MoE layer's experts so they can be read ahead.
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError>;

    /// Counters since the service started.
    fn stats(&self) -> ExpertStats;

    /// Advisory: a request ended (persist what was learned, re-pin).
    fn end_request(&self) {}

    /// Whether [`ExpertService::run`] computes on this process's rayon
    /// pool (the in-process worker) rather than waiting on other
    /// processes. The engine keeps the pool's threads awake through a
    /// step only then: while a step waits on the network they would have
    /// nothing to run, and on a box shared with workers they would take
    /// the workers' cores.
    fn computes_in_process(&self) -> bool {
        true
    }

    /// Who runs each routed expert now, for a service that places experts
    /// on several workers: `((layer, expert), address)` as in
    /// [`WorkerReport::address`]. Empty for a single in-process worker.
    fn owners(&self) -> Vec<((u16, u32), String)> {
        Vec::new()
    }
}

/// Expert store counters, cumulative since start (`cache_bytes` is current).
/// Field names are part of the `generate --json` contract.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExpertStats {
    /// Routed experts served from RAM without a read.
    pub expert_hits: u64,
    /// Routed experts that needed a disk read (demand or in-flight prefetch).
    pub expert_misses: u64,
    /// Bytes read from disk (demand and prefetch).
    pub expert_bytes_read: u64,
    /// Time the engine waited for reads.
    pub io_wait_ms: f64,
    /// Prefetched experts that a later step used.
    pub prefetch_hits: u64,
    /// Prefetch reads issued.
    pub prefetch_issued: u64,
    /// Experts read ahead that left the cache unused (in-process store).
    pub prefetch_wasted: u64,
    /// Demand reads of experts a read-ahead had evicted (in-process store).
    pub prefetch_harm: u64,
    /// Layer steps at which read-ahead stood down, having lost (in-process store).
    pub prefetch_paused_steps: u64,
    /// Times read-ahead stood down (in-process store).
    pub prefetch_stand_downs: u64,
    /// Bytes of experts held in RAM now.
    pub cache_bytes: u64,
    /// Of the experts a step needed, how many the one-layer-ahead
    /// prediction had named (numerator / denominator).
    pub predicted_correct: u64,
    pub predicted_total: u64,
    /// Cluster mode: frame bytes sent to workers (0 in-process).
    pub network_bytes_sent: u64,
    /// Cluster mode: frame bytes received from workers.
    pub network_bytes_received: u64,
    /// Cluster mode: layer steps that waited on the network (one fan-out
    /// to every involved worker counts once; a failover re-send counts
    /// again).
    pub round_trips: u64,
    /// Cluster mode: one entry per worker (and the coordinator's own
    /// in-process worker once it computed anything).
    pub workers: Vec<WorkerReport>,
}

/// One worker's share of the work, as `generate --json` reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkerReport {
    /// `HOST:PORT`, or `local` for the coordinator's in-process worker.
    pub address: String,
    /// Whether the worker is connected now.
    pub connected: bool,
    /// Routed experts the current placement makes it the owner of (0 before
    /// the first placement and while it is disconnected).
    pub experts_owned: u64,
    /// Expert groups it computed.
    pub experts_served: u64,
    /// Requests it answered.
    pub requests: u64,
    /// Mean request round trip seen by the coordinator (network, queueing
    /// and the worker's compute), in ms.
    pub rtt_ms: f64,
    /// Sum of request round trips, in ms (for `since`).
    #[serde(skip)]
    pub rtt_ms_total: f64,
    /// Mean time the worker reported spending in its expert computation per
    /// request, in ms (`rtt_ms - compute_ms`: network, framing, queueing).
    pub compute_ms: f64,
    /// Sum of the worker-reported compute times, in ms (for `since`).
    #[serde(skip)]
    pub compute_ms_total: f64,
    /// Frame bytes sent to it and received from it.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Its expert store's hits and misses (the worker's own counters).
    pub expert_hits: u64,
    pub expert_misses: u64,
    /// `expert_hits / (expert_hits + expert_misses)` (0 when none).
    pub cache_hit_rate: f64,
    /// Expert bytes its store read from disk (the worker's own counter).
    pub disk_bytes_read: u64,
    /// Bytes of experts its store holds in RAM now (as last reported).
    pub cache_bytes: u64,
    /// Requests it failed, timed out on, or dropped.
    pub failures: u64,
    /// Requests of its that failed (error, timeout, broken or lost
    /// connection) and were re-sent to another holder.
    pub failovers: u64,
    /// Requests of its that were late against its own measured round trips
    /// and were re-sent (hedged) to another holder; whichever answer came
    /// first was used.
    pub hedges: u64,
}

impl WorkerReport {
    /// Fills the derived means (`rtt_ms`, `compute_ms`, `cache_hit_rate`)
    /// from the sums.
    pub fn with_means(mut self) -> WorkerReport {
        let per_request = |total: f64| {
            if self.requests == 0 {
                0.0
            } else {
                total / self.requests as f64
            }
        };
        self.rtt_ms = per_request(self.rtt_ms_total);
        self.compute_ms = per_request(self.compute_ms_total);
        let looked_up = self.expert_hits + self.expert_misses;
        self.cache_hit_rate = if looked_up == 0 {
            0.0
        } else {
            self.expert_hits as f64 / looked_up as f64
        };
        self
    }

    /// Counters accumulated between `before` and `self`.
    pub fn since(&self, before: &WorkerReport) -> WorkerReport {
        WorkerReport {
            address: self.address.clone(),
            connected: self.connected,
            experts_owned: self.experts_owned,
            experts_served: self.experts_served.saturating_sub(before.experts_served),
            requests: self.requests.saturating_sub(before.requests),
            rtt_ms: 0.0,
            rtt_ms_total: (self.rtt_ms_total - before.rtt_ms_total).max(0.0),
            compute_ms: 0.0,
            compute_ms_total: (self.compute_ms_total - before.compute_ms_total).max(0.0),
            bytes_sent: self.bytes_sent.saturating_sub(before.bytes_sent),
            bytes_received: self.bytes_received.saturating_sub(before.bytes_received),
            expert_hits: self.expert_hits.saturating_sub(before.expert_hits),
            expert_misses: self.expert_misses.saturating_sub(before.expert_misses),
            cache_hit_rate: 0.0,
            disk_bytes_read: self.disk_bytes_read.saturating_sub(before.disk_bytes_read),
            cache_bytes: self.cache_bytes,
            failures: self.failures.saturating_sub(before.failures),
            failovers: self.failovers.saturating_sub(before.failovers),
            hedges: self.hedges.saturating_sub(before.hedges),
        }
        .with_means()
    }
}

impl ExpertStats {
    /// Counters accumulated between `before` and `self` (`cache_bytes`: now).
    pub fn since(&self, before: &ExpertStats) -> ExpertStats {
        ExpertStats {
            expert_hits: self.expert_hits - before.expert_hits,
            expert_misses: self.expert_misses - before.expert_misses,
            expert_bytes_read: self.expert_bytes_read - before.expert_bytes_read,
            io_wait_ms: self.io_wait_ms - before.io_wait_ms,
            prefetch_hits: self.prefetch_hits - before.prefetch_hits,
            prefetch_issued: self.prefetch_issued - before.prefetch_issued,
            prefetch_wasted: self.prefetch_wasted - before.prefetch_wasted,
            prefetch_harm: self.prefetch_harm - before.prefetch_harm,
            prefetch_paused_steps: self.prefetch_paused_steps - before.prefetch_paused_steps,
            prefetch_stand_downs: self.prefetch_stand_downs - before.prefetch_stand_downs,
            cache_bytes: self.cache_bytes,
            predicted_correct: self.predicted_correct - before.predicted_correct,
            predicted_total: self.predicted_total - before.predicted_total,
            network_bytes_sent: self.network_bytes_sent - before.network_bytes_sent,
            network_bytes_received: self.network_bytes_received - before.network_bytes_received,
            round_trips: self.round_trips - before.round_trips,
            workers: self
                .workers
                .iter()
                .map(|w| match before.workers.iter().find(|b| b.address == w.address) {
                    Some(b) => w.since(b),
                    None => w.clone().with_means(),
                })
                .collect(),
        }
    }

    /// Share of needed experts the prediction named (0 when none measured).
    pub fn prefetch_accuracy(&self) -> f64 {
        if self.predicted_total == 0 {
            0.0
        } else {
            self.predicted_correct as f64 / self.predicted_total as f64
        }
    }
}

/// Loads routed expert `expert` of `layer` from `files` as the family
/// computes it: its projections, their biases when the family has them,
/// and the family's gating ([`ModelConfig::expert_act`]).
pub fn load_expert(
    files: &dyn WeightSource,
    cfg: &ModelConfig,
    layer: usize,
    expert: usize,
) -> Result<SwiGlu, LoadError> {
    let names = cfg.family.moe_names().expert(layer, expert);
    let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
    let bias = if cfg.expert_bias {
        Some(SwiGlu::load_bias(files, &names, h, i)?)
    } else {
        None
    };
    let ffn = SwiGlu::load(files, &names, h, i)?;
    Ok(routed_expert(cfg, ffn.gate, ffn.up, ffn.down, bias))
}

/// A routed expert of `cfg`'s family from its projections (read from a
/// store) and biases.
pub fn routed_expert(cfg: &ModelConfig, gate: Weight, up: Weight, down: Weight, bias: Option<FfnBias>) -> SwiGlu {
    let mut ffn = SwiGlu::new(gate, up, down);
    ffn.bias = bias.map(Box::new);
    ffn.act = cfg.expert_act;
    ffn
}

/// Computes one expert's weighted outputs for the rows that chose it:
/// `weights[i] * ffn(rows[i])`.
///
/// `current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]`
pub fn run_group(ffn: &SwiGlu, batch: &ExpertBatch, group: &ExpertGroup) -> GroupOutput {
    run_group_with(ffn, batch, group, true)
}

/// [`run_group`], with the FFN's products split across threads or not
/// (`parallel`): a caller running many single-row groups side by side
/// saves the nested fork-joins. The same bits either way.
pub fn run_group_with(ffn: &SwiGlu, batch: &ExpertBatch, group: &ExpertGroup, parallel: bool) -> GroupOutput {
    let h = batch.hidden as usize;
    let n = group.rows.len();
    let mut xs = Vec::with_capacity(n * h);
    for &r in &group.rows {
        xs.extend_from_slice(batch.row(r as usize));
    }
    let mut out = vec![0.0; n * h];
    ffn.forward_with(&xs, n, &mut out, parallel);
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
