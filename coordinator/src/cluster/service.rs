//! [`ClusterService`]: the [`ExpertService`] that runs a layer step's
//! experts on remote workers — sharded fan-out with failover.
//!
//! The engine is synchronous; the service blocks on its own tokio runtime
//! for each layer step:
//!
//! 1. Each group of the batch goes to the first usable holder of its
//!    expert in the placement ([`super::placement`]): owner, replica, other
//!    holders, the coordinator's in-process worker.
//! 2. One `RunExperts` per involved worker (split only if it would exceed
//!    the worker's frame limit), all sent before any reply is awaited. Each
//!    carries the rows its experts need, once each, with per-expert row
//!    lists and gate weights, and the part of the next-layer prediction
//!    that worker owns. Owners of predicted experts with no work in this
//!    layer get a one-way `Prefetch`. The coordinator's own share, if any,
//!    is computed while the replies travel.
//! 3. A worker that answers with an error, times out, or breaks the
//!    protocol has its groups re-sent to the next holder (a timed-out or
//!    broken worker is also disconnected and re-planned around). Only when
//!    no holder of an expert is left does the step fail, naming the experts.
//! 4. Every worker returns one output per expert ([`GroupOutput`]), never a
//!    partial sum, and the engine combines them in a fixed order: the bits
//!    cannot depend on which worker ran what.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use charm_models::{ExpertError, ExpertService, ExpertStats, WorkerReport};
use charm_proto::frame::encode;
use charm_proto::{
    ErrorKind, ExpertBatch, ExpertGroup, ExpertOutputs, GroupOutput, Message, Prefetch, PrefetchHint, RunExperts,
    MAX_FRAME_LEN,
};
use charm_worker::net::frames::{read_frame, write_bytes};
use charm_worker::net::{tls, ClusterKey, NetError};
use quinn::Connection;
use thiserror::Error;

use super::members::{browse, maintain, Shared};
use super::placement::{plan, Holder, ModelShape, Plan};

/// The worker address reported for the coordinator's own in-process worker.
pub const LOCAL: &str = "local";

/// Longest wait for the workers' counters at the end of a request.
const END_REQUEST_WAIT: Duration = Duration::from_secs(1);

/// Builds the coordinator's in-process worker (on first use).
pub type LocalBuilder = Box<dyn Fn() -> Result<Arc<dyn ExpertService>, String> + Send + Sync>;

/// How a cluster service runs.
pub struct ClusterOptions {
    pub key: ClusterKey,
    /// Fingerprint of the coordinator's model; workers must hold the same.
    pub fingerprint: String,
    pub shape: ModelShape,
    /// Workers to keep connected (`--workers`).
    pub workers: Vec<SocketAddr>,
    /// Browse mDNS for more workers: `Some(loopback_only)`.
    pub mdns: Option<bool>,
    /// Longest wait for one request's answer before its worker is dropped
    /// and the request re-sent elsewhere.
    pub request_timeout: Duration,
    /// The coordinator's own copy of the experts, used when no worker holds
    /// an expert or every holder failed (`None`: never run experts here).
    pub local: Option<LocalBuilder>,
}

/// The cluster could not be started or used.
#[derive(Debug, Error)]
pub enum ClusterError {
    /// The QUIC endpoint could not be set up.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The network runtime could not start.
    #[error("starting the network runtime: {0}")]
    Runtime(std::io::Error),
    /// Fewer workers than required passed the handshake in time.
    #[error(
        "{found} of {wanted} workers usable after {waited_s:.0} s{}",
        if refusals.is_empty() { String::new() } else { format!(": {}", refusals.join("; ")) }
    )]
    NotEnoughWorkers {
        found: usize,
        wanted: usize,
        waited_s: f64,
        refusals: Vec<String>,
    },
}

/// The coordinator's in-process worker, built on first use.
struct Local {
    build: LocalBuilder,
    service: OnceLock<Result<Arc<dyn ExpertService>, String>>,
    report: Mutex<WorkerReport>,
}

impl Local {
    fn get(&self) -> Result<&Arc<dyn ExpertService>, &str> {
        self.service
            .get_or_init(|| (self.build)())
            .as_ref()
            .map_err(String::as_str)
    }

    fn built(&self) -> Option<&Arc<dyn ExpertService>> {
        self.service.get().and_then(|r| r.as_ref().ok())
    }
}

#[derive(Default)]
struct NetTotals {
    bytes_sent: u64,
    bytes_received: u64,
    round_trips: u64,
}

/// Remote expert service over QUIC: see the module docs.
pub struct ClusterService {
    rt: Option<tokio::runtime::Runtime>,
    shared: Arc<Shared>,
    plan: Mutex<Arc<Plan>>,
    heat: Mutex<Vec<Vec<u64>>>,
    heat_changed: AtomicBool,
    local: Option<Local>,
    totals: Arc<Mutex<NetTotals>>,
    step: AtomicU64,
    timeout: Duration,
}

/// One request of a step on its way: its worker, the groups it carries
/// and when to give up waiting on it.
struct Flight {
    addr: SocketAddr,
    idxs: Vec<usize>,
    /// When it is late enough to re-send its groups elsewhere.
    hedge_at: Instant,
    /// When its exchange has surely ended (its limit, and a margin).
    hard_at: Instant,
    hedged: bool,
    done: bool,
}

/// A flight's result, reported by its task: the outputs in its groups'
/// order, or why there are none (the task has already dealt with the
/// worker: counted, dropped when broken).
type Landing = (usize, Result<Vec<GroupOutput>, String>);

/// What a wave of a step sends from.
struct Wave<'a> {
    batch: &'a ExpertBatch,
    plan: &'a Plan,
    first: bool,
    tx: &'a std::sync::mpsc::Sender<Landing>,
}

/// The step's state a wave updates.
struct WaveState<'a> {
    slots: &'a mut Vec<Option<GroupOutput>>,
    excluded: &'a mut Vec<Holder>,
    reasons: &'a mut Vec<String>,
    flights: &'a mut Vec<Flight>,
    /// Groups to send again (their holder could not take them).
    pending: &'a mut Vec<usize>,
}

/// Of `idxs`, the groups neither answered nor still awaited from a flight
/// that is on time.
fn uncovered(flights: &[Flight], slots: &[Option<GroupOutput>], idxs: &[usize]) -> Vec<usize> {
    idxs.iter()
        .copied()
        .filter(|&i| slots[i].is_none())
        .filter(|i| !flights.iter().any(|f| !f.done && !f.hedged && f.idxs.contains(i)))
        .collect()
}

impl ClusterService {
    /// Starts the network runtime, connects to the given workers and starts
    /// mDNS discovery; returns at once (see [`ClusterService::wait_for_workers`]).
    pub fn start(opts: ClusterOptions) -> Result<ClusterService, ClusterError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("charm-net")
            .enable_all()
            .build()
            .map_err(ClusterError::Runtime)?;
        let bind: SocketAddr = if opts.workers.iter().any(|a| a.is_ipv6()) {
            "[::]:0".parse().expect("valid address")
        } else {
            "0.0.0.0:0".parse().expect("valid address")
        };
        let endpoint = {
            let _guard = rt.enter();
            tls::client_endpoint(bind)?
        };
        let heat = vec![vec![0u64; opts.shape.num_experts as usize]; opts.shape.num_layers];
        let shared = Arc::new(Shared::new(opts.key, opts.fingerprint, opts.shape, endpoint));
        shared.know(opts.workers);
        rt.spawn(maintain(shared.clone()));
        if let Some(loopback_only) = opts.mdns {
            browse(shared.clone(), loopback_only);
        }
        Ok(ClusterService {
            rt: Some(rt),
            shared,
            plan: Mutex::new(Arc::new(Plan::default())),
            heat: Mutex::new(heat),
            heat_changed: AtomicBool::new(true),
            local: opts.local.map(|build| Local {
                build,
                service: OnceLock::new(),
                report: Mutex::new(WorkerReport {
                    address: LOCAL.into(),
                    connected: true,
                    ..Default::default()
                }),
            }),
            totals: Arc::new(Mutex::new(NetTotals::default())),
            step: AtomicU64::new(0),
            timeout: opts.request_timeout,
        })
    }

    /// Waits until at least `min` workers are connected, at most `timeout`.
    pub fn wait_for_workers(&self, min: usize, timeout: Duration) -> Result<usize, ClusterError> {
        let t = Instant::now();
        loop {
            let n = self.shared.live().len();
            if n >= min {
                return Ok(n);
            }
            if t.elapsed() >= timeout {
                return Err(ClusterError::NotEnoughWorkers {
                    found: n,
                    wanted: min,
                    waited_s: t.elapsed().as_secs_f64(),
                    refusals: self.shared.refusals(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Addresses of the connected workers.
    pub fn workers(&self) -> Vec<SocketAddr> {
        self.shared.live().into_iter().map(|(a, _)| a).collect()
    }

    /// The model as the service sees it.
    pub fn shape(&self) -> &ModelShape {
        &self.shared.shape
    }

    /// The current placement (recomputed when workers joined or left, or
    /// when routing heat was measured since the last one).
    pub fn placement(&self) -> Arc<Plan> {
        let changed = self.shared.take_changed();
        let heat_changed = self.heat_changed.swap(false, Ordering::Relaxed);
        let mut current = self.plan.lock().unwrap_or_else(|p| p.into_inner());
        if changed || heat_changed {
            let heat = self.heat.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let next = plan(
                &self.shared.shape,
                &self.shared.candidates(),
                &heat,
                self.local.is_some(),
                Some(&current),
            );
            tracing::info!(
                "placement: {}",
                next.workers
                    .iter()
                    .map(|w| format!("{} owns {}", w.address, w.owns))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            *current = Arc::new(next);
        }
        current.clone()
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("the runtime lives as long as the service")
    }

    fn record_heat(&self, batch: &ExpertBatch) {
        let mut heat = self.heat.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(row) = heat.get_mut(batch.layer as usize) {
            for g in &batch.groups {
                if let Some(c) = row.get_mut(g.expert as usize) {
                    *c += g.rows.len() as u64;
                }
            }
        }
    }

    /// Whether `h` may take work now: not excluded in this step, and (with
    /// `strict`) not waiting out a hedge.
    fn usable(&self, h: Holder, excluded: &[Holder], strict: bool) -> bool {
        if excluded.contains(&h) {
            return false;
        }
        match h {
            Holder::Worker(a) if strict => self.shared.trusted(a),
            Holder::Worker(a) => self.shared.conn(a).is_some(),
            Holder::Local => self.local.as_ref().is_some_and(|l| l.get().is_ok()),
        }
    }

    /// Sends `todo` (groups of `w.batch`) to their holders: every remote
    /// share first, then the coordinator's own share computed here while
    /// the replies travel. Groups whose holder cannot take them go back to
    /// `st.pending` with the holder excluded. Fails only when a group has
    /// no holder left and no flight still carries it.
    fn send_wave(&self, w: &Wave, todo: Vec<usize>, st: &mut WaveState) -> Result<(), ExpertError> {
        let (batch, plan, layer) = (w.batch, w.plan, w.batch.layer);
        let (mut shares, orphans) = assign(plan, batch, &todo, |h| self.usable(h, st.excluded, true));
        if !orphans.is_empty() {
            // Only late holders are left for some: better them than nothing.
            let rest: Vec<usize> = todo
                .iter()
                .copied()
                .filter(|&i| orphans.contains(&batch.groups[i].expert))
                .collect();
            let (more, still) = assign(plan, batch, &rest, |h| self.usable(h, st.excluded, false));
            for (h, idxs) in more {
                let share = shares.entry(h).or_default();
                share.extend(idxs);
                share.sort_unstable();
            }
            let lost: Vec<u32> = still
                .into_iter()
                .filter(|&e| {
                    let i = batch.groups.iter().position(|g| g.expert == e);
                    !i.is_some_and(|i| st.flights.iter().any(|f| !f.done && f.idxs.contains(&i)))
                })
                .collect();
            if !lost.is_empty() {
                let reason = if st.reasons.is_empty() {
                    "no connected worker holds them and the coordinator has no copy to run".to_string()
                } else {
                    st.reasons.join("; ")
                };
                return Err(ExpertError::Unavailable {
                    layer,
                    experts: lost,
                    reason,
                });
            }
        }

        // The next-layer prediction, split by owner (first wave only).
        let mut hints: HashMap<Holder, Vec<u32>> = HashMap::new();
        if let (true, Some(next)) = (w.first, &batch.next) {
            for &e in &next.experts {
                if let Some(h) = plan.owner((next.layer, e)) {
                    hints.entry(h).or_default().push(e);
                }
            }
        }

        // Send every remote share before computing any here.
        for (&h, idxs) in &shares {
            let Holder::Worker(addr) = h else { continue };
            let Some(conn) = self.shared.conn(addr) else {
                // It left since the shares were made: next holder.
                st.excluded.push(h);
                note_failure(st.reasons, addr, "disconnected");
                st.pending.extend(idxs);
                continue;
            };
            let chunks = match split(batch, idxs, self.shared.max_frame(addr) as u64) {
                Ok(c) => c,
                Err(e) => {
                    st.excluded.push(h);
                    note_failure(st.reasons, addr, &e.to_string());
                    st.pending.extend(idxs);
                    continue;
                }
            };
            let mut hint = hints
                .remove(&h)
                .zip(batch.next.as_ref())
                .map(|(experts, next)| PrefetchHint {
                    layer: next.layer,
                    experts,
                });
            for chunk in chunks {
                let mut sub = sub_batch(batch, &chunk);
                sub.next = hint.take();
                let step = self.step.fetch_add(1, Ordering::Relaxed);
                let msg = Message::RunExperts(RunExperts { step, batch: sub });
                let frame = match encode(&msg) {
                    Ok(f) => f,
                    Err(e) => {
                        st.excluded.push(h);
                        note_failure(st.reasons, addr, &e.to_string());
                        st.pending.extend(chunk);
                        continue;
                    }
                };
                let Message::RunExperts(RunExperts { batch: sub, .. }) = msg else {
                    unreachable!("built as RunExperts above")
                };
                let rows: u32 = chunk.iter().map(|&i| batch.groups[i].rows.len() as u32).sum();
                let now = Instant::now();
                let hedge = self.shared.hedge_after(addr, rows, chunk.len(), self.timeout);
                let id = st.flights.len();
                st.flights.push(Flight {
                    addr,
                    idxs: chunk,
                    hedge_at: now + hedge,
                    hard_at: now + self.timeout + Duration::from_millis(500),
                    hedged: false,
                    done: false,
                });
                let task = Fly {
                    shared: self.shared.clone(),
                    totals: self.totals.clone(),
                    addr,
                    conn: conn.clone(),
                    sub,
                    rows,
                    limit: self.timeout,
                };
                let tx = w.tx.clone();
                self.runtime().spawn(async move {
                    let _ = tx.send((id, task.fly(frame).await));
                });
            }
        }
        // Prefetch hints for owners with no work in this layer.
        for (h, experts) in hints.drain() {
            let (Holder::Worker(addr), Some(next)) = (h, &batch.next) else {
                continue;
            };
            if !self.shared.trusted(addr) {
                continue;
            }
            let Some(conn) = self.shared.conn(addr) else { continue };
            let msg = Message::Prefetch(Prefetch {
                layer,
                hint: PrefetchHint {
                    layer: next.layer,
                    experts,
                },
            });
            if let Ok(frame) = encode(&msg) {
                self.totals_add(frame.len() as u64, 0, 0);
                self.shared.with_report(addr, |r| r.bytes_sent += frame.len() as u64);
                self.runtime().spawn(send_one_way(conn, frame));
            }
        }
        if st.flights.iter().any(|f| !f.done) {
            self.totals_add(0, 0, 1);
        }

        // The coordinator's own share, while the replies travel.
        if let Some(idxs) = shares.get(&Holder::Local) {
            let Some(local) = self.local.as_ref() else {
                return Err(ExpertError::Unavailable {
                    layer,
                    experts: idxs.iter().map(|&i| batch.groups[i].expert).collect(),
                    reason: "the coordinator has no copy of the experts".into(),
                });
            };
            let mut sub = sub_batch(batch, idxs);
            sub.next = if w.first {
                batch.next.clone().map(|n| PrefetchHint {
                    layer: n.layer,
                    experts: n
                        .experts
                        .iter()
                        .copied()
                        .filter(|&e| plan.owner((n.layer, e)) == Some(Holder::Local))
                        .collect(),
                })
            } else {
                None
            };
            let t = Instant::now();
            let result = local
                .get()
                .map_err(|e| e.to_string())
                .and_then(|svc| svc.run(&sub).map_err(|e| e.to_string()));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let mut report = local.report.lock().unwrap_or_else(|p| p.into_inner());
            match result.and_then(|out| take_outputs(out, &sub).map_err(|e| e.to_string())) {
                Ok(outs) => {
                    report.requests += 1;
                    report.experts_served += idxs.len() as u64;
                    report.rtt_ms_total += ms;
                    report.compute_ms_total += ms;
                    for (&i, o) in idxs.iter().zip(outs) {
                        st.slots[i].get_or_insert(o);
                    }
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!("the coordinator's own experts failed in layer {layer}: {e}");
                    st.reasons.push(format!("local: {e}"));
                    st.excluded.push(Holder::Local);
                    st.pending.extend(idxs);
                }
            }
        }
        st.pending.sort_unstable();
        st.pending.dedup();
        Ok(())
    }
}

/// Splits a step's `pending` groups among holders: each group goes to the
/// usable holder that keeps it cached (owner or replica) with the fewest
/// rows assigned so far in this step (the owner on ties), so a step's
/// experts spread over the workers that have them at hand even when the
/// owners alone would split them 6/2; a group with no usable cached holder
/// goes to its first usable holder. Larger groups are placed first. Returns
/// the shares (each in request order) and the experts no usable holder has.
/// Who computes an expert changes speed only, never the bits.
fn assign(
    plan: &Plan,
    batch: &ExpertBatch,
    pending: &[usize],
    usable: impl Fn(Holder) -> bool,
) -> (BTreeMap<Holder, Vec<usize>>, Vec<u32>) {
    let mut shares: BTreeMap<Holder, Vec<usize>> = BTreeMap::new();
    let mut rows: HashMap<Holder, usize> = HashMap::new();
    let mut orphans = Vec::new();
    let mut order = pending.to_vec();
    order.sort_by_key(|&i| (std::cmp::Reverse(batch.groups[i].rows.len()), i));
    for i in order {
        let key = (batch.layer, batch.groups[i].expert);
        let warm = plan
            .warm_holders(key)
            .iter()
            .copied()
            .filter(|&h| usable(h))
            .enumerate()
            .min_by_key(|&(rank, h)| (rows.get(&h).copied().unwrap_or(0), rank))
            .map(|(_, h)| h);
        match warm.or_else(|| plan.holders(key).iter().copied().find(|&h| usable(h))) {
            Some(h) => {
                *rows.entry(h).or_default() += batch.groups[i].rows.len();
                shares.entry(h).or_default().push(i);
            }
            None => orphans.push(key.1),
        }
    }
    for idxs in shares.values_mut() {
        idxs.sort_unstable();
    }
    orphans.sort_unstable();
    (shares, orphans)
}

/// One request/answer exchange on a fresh stream, with a deadline.
async fn exchange(conn: Connection, frame: Vec<u8>, limit: Duration) -> Result<(Message, usize, f64), NetError> {
    let t = Instant::now();
    let work = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        write_bytes(&mut send, &frame).await?;
        let _ = send.finish();
        read_frame(&mut recv, MAX_FRAME_LEN).await
    };
    match tokio::time::timeout(limit, work).await {
        Err(_) => Err(NetError::Timeout(limit.as_millis() as u64)),
        Ok(Err(e)) => Err(e),
        Ok(Ok((m, n))) => Ok((m, n, t.elapsed().as_secs_f64() * 1e3)),
    }
}

/// A request's task: sends it, waits for the answer (at most `limit`) and
/// settles the worker's account whether or not the step still waits for
/// it: counters and round-trip samples on an answer, a drop when the
/// worker broke the protocol, timed out or lost the connection.
struct Fly {
    shared: Arc<Shared>,
    totals: Arc<Mutex<NetTotals>>,
    addr: SocketAddr,
    conn: Connection,
    sub: ExpertBatch,
    rows: u32,
    limit: Duration,
}

impl Fly {
    async fn fly(self, frame: Vec<u8>) -> Result<Vec<GroupOutput>, String> {
        let (addr, layer, sent) = (self.addr, self.sub.layer, frame.len() as u64);
        let answer = exchange(self.conn.clone(), frame, self.limit).await;
        let received = match &answer {
            Ok((_, n, _)) => *n as u64,
            Err(_) => 0,
        };
        add_totals(&self.totals, sent, received, 0);
        self.shared.with_report(addr, |r| {
            r.bytes_sent += sent;
            r.bytes_received += received;
        });
        let broken = |kind: ErrorKind, message: String| {
            self.shared.fail(addr, kind, &message);
            Err(message)
        };
        match answer {
            Ok((Message::ExpertsOut(o), _, rtt)) => {
                let compute_ms = f64::from(o.worker_ms);
                match take_outputs(o.outputs, &self.sub) {
                    Ok(outs) => {
                        self.shared.with_report(addr, |r| {
                            r.requests += 1;
                            r.experts_served += self.sub.groups.len() as u64;
                            r.rtt_ms_total += rtt;
                            r.compute_ms_total += compute_ms;
                        });
                        self.shared.answered(addr, self.conn.stable_id(), rtt, self.rows);
                        Ok(outs)
                    }
                    Err(e) => broken(
                        ErrorKind::Malformed,
                        format!("answered with outputs that do not fit the request: {e}"),
                    ),
                }
            }
            Ok((Message::Error(e), _, _)) => {
                self.shared.with_report(addr, |r| r.failures += 1);
                tracing::warn!("worker {addr} failed layer {layer}: {}", e.message);
                Err(e.message)
            }
            Ok((other, _, _)) => broken(
                ErrorKind::Malformed,
                format!("answered with an unexpected {} message", other.tag().name()),
            ),
            Err(NetError::Timeout(ms)) => {
                broken(ErrorKind::Timeout, format!("no answer to layer {layer} within {ms} ms"))
            }
            Err(e) => broken(e.kind(), e.to_string()),
        }
    }
}

fn add_totals(totals: &Mutex<NetTotals>, sent: u64, received: u64, round_trips: u64) {
    let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
    t.bytes_sent += sent;
    t.bytes_received += received;
    t.round_trips += round_trips;
}

/// One-way send on a unidirectional stream.
async fn send_one_way(conn: Connection, frame: Vec<u8>) {
    if let Ok(mut send) = conn.open_uni().await {
        if write_bytes(&mut send, &frame).await.is_ok() {
            let _ = send.finish();
        }
    }
}

/// The groups `idxs` of `batch` with only the rows they use (each once,
/// renumbered); groups stay in batch order, so sorted by expert.
fn sub_batch(batch: &ExpertBatch, idxs: &[usize]) -> ExpertBatch {
    let h = batch.hidden as usize;
    let mut renumber = vec![u32::MAX; batch.n_rows()];
    let mut rows = Vec::new();
    let groups = idxs
        .iter()
        .map(|&i| {
            let g = &batch.groups[i];
            let local_rows = g
                .rows
                .iter()
                .map(|&r| {
                    let slot = &mut renumber[r as usize];
                    if *slot == u32::MAX {
                        *slot = (rows.len() / h) as u32;
                        rows.extend_from_slice(batch.row(r as usize));
                    }
                    *slot
                })
                .collect();
            ExpertGroup {
                expert: g.expert,
                rows: local_rows,
                weights: g.weights.clone(),
            }
        })
        .collect();
    ExpertBatch {
        layer: batch.layer,
        hidden: batch.hidden,
        rows,
        groups,
        next: None,
    }
}

/// Splits `idxs` into requests whose frames (activations out, outputs
/// back) stay under `limit` bytes. A single expert too large for one frame
/// is an error.
fn split(batch: &ExpertBatch, idxs: &[usize], limit: u64) -> Result<Vec<Vec<usize>>, ExpertError> {
    let row_bytes = batch.hidden as u64 * 4;
    let margin = 64 << 10;
    let limit = limit.saturating_sub(margin);
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let (mut req, mut resp) = (0u64, 0u64);
    for &i in idxs {
        let n = batch.groups[i].rows.len() as u64;
        // At most: every row new (activation + index + weight), every output.
        let g_req = n * (row_bytes + 9);
        let g_resp = n * row_bytes + 16;
        if g_req > limit || g_resp > limit {
            return Err(ExpertError::Unavailable {
                layer: batch.layer,
                experts: vec![batch.groups[i].expert],
                reason: format!("its {n} rows do not fit one frame of {limit} bytes; use a smaller prefill chunk"),
            });
        }
        if !cur.is_empty() && (req + g_req > limit || resp + g_resp > limit) {
            out.push(std::mem::take(&mut cur));
            req = 0;
            resp = 0;
        }
        cur.push(i);
        req += g_req;
        resp += g_resp;
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

impl ExpertService for ClusterService {
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError> {
        batch.validate()?;
        self.record_heat(batch);
        let plan = self.placement();
        let layer = batch.layer;
        let mut slots: Vec<Option<GroupOutput>> = vec![None; batch.groups.len()];
        let mut pending: Vec<usize> = (0..batch.groups.len()).collect();
        let mut excluded: Vec<Holder> = Vec::new();
        let mut reasons: Vec<String> = Vec::new();
        let mut first_wave = true;
        let mut flights: Vec<Flight> = Vec::new();
        let (tx, rx) = std::sync::mpsc::channel::<Landing>();
        loop {
            if !pending.is_empty() {
                self.send_wave(
                    &Wave {
                        batch,
                        plan: &plan,
                        first: first_wave,
                        tx: &tx,
                    },
                    std::mem::take(&mut pending),
                    &mut WaveState {
                        slots: &mut slots,
                        excluded: &mut excluded,
                        reasons: &mut reasons,
                        flights: &mut flights,
                        pending: &mut pending,
                    },
                )?;
                first_wave = false;
                continue;
            }
            if slots.iter().all(Option::is_some) {
                break;
            }
            // Wait for the next answer, or the next hedging deadline.
            let now = Instant::now();
            let wake = flights
                .iter()
                .filter(|f| !f.done)
                .map(|f| if f.hedged { f.hard_at } else { f.hedge_at })
                .min();
            let Some(wake) = wake else {
                // Nothing in flight yet groups unanswered: send them again.
                pending = (0..slots.len()).filter(|&i| slots[i].is_none()).collect();
                continue;
            };
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok((id, outcome)) => {
                    let f = &mut flights[id];
                    f.done = true;
                    match outcome {
                        Ok(outs) => {
                            for (&i, o) in f.idxs.iter().zip(outs) {
                                // A late answer after a re-send: the bits
                                // are the same, the first one counts.
                                slots[i].get_or_insert(o);
                            }
                        }
                        Err(message) => {
                            let addr = f.addr;
                            note_failure(&mut reasons, addr, &message);
                            excluded.push(Holder::Worker(addr));
                            let lost = uncovered(&flights, &slots, &flights[id].idxs);
                            if !lost.is_empty() {
                                self.shared.with_report(addr, |r| r.failovers += 1);
                                tracing::warn!(
                                    "re-sending {} experts of layer {layer} from {addr} to other holders",
                                    lost.len()
                                );
                            }
                            pending = lost;
                        }
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    let mut late = Vec::new();
                    for f in flights.iter_mut().filter(|f| !f.done) {
                        if !f.hedged && f.hedge_at <= now {
                            f.hedged = true;
                            late.push(f.idxs.clone());
                            self.shared.suspect(f.addr);
                            excluded.push(Holder::Worker(f.addr));
                            note_failure(&mut reasons, f.addr, "late");
                        } else if f.hard_at <= now {
                            // Its task should have reported by now (its
                            // exchange has the same limit): give up on it.
                            f.done = true;
                            late.push(f.idxs.clone());
                            note_failure(&mut reasons, f.addr, "no answer");
                        }
                    }
                    let mut resend: Vec<usize> =
                        late.iter().flat_map(|idxs| uncovered(&flights, &slots, idxs)).collect();
                    resend.sort_unstable();
                    resend.dedup();
                    if !resend.is_empty() {
                        tracing::warn!(
                            "hedging {} late experts of layer {layer} to other holders",
                            resend.len()
                        );
                    }
                    pending = resend;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    // The step holds a sender of its own: cannot happen.
                    return Err(ExpertError::Unavailable {
                        layer,
                        experts: batch.groups.iter().map(|g| g.expert).collect(),
                        reason: "the network runtime stopped".into(),
                    });
                }
            }
        }
        let groups = slots
            .into_iter()
            .map(|o| o.expect("the loop ends when every group is answered"))
            .collect();
        Ok(ExpertOutputs { layer, groups })
    }

    fn stats(&self) -> ExpertStats {
        let (mut s, mut reports) = self.shared.totals();
        if let Some(local) = &self.local {
            if let Some(svc) = local.built() {
                let ls = svc.stats();
                s.expert_hits += ls.expert_hits;
                s.expert_misses += ls.expert_misses;
                s.expert_bytes_read += ls.expert_bytes_read;
                s.io_wait_ms += ls.io_wait_ms;
                s.prefetch_hits += ls.prefetch_hits;
                s.prefetch_issued += ls.prefetch_issued;
                s.cache_bytes += ls.cache_bytes;
                s.predicted_correct += ls.predicted_correct;
                s.predicted_total += ls.predicted_total;
                s.prefetch_wasted += ls.prefetch_wasted;
                s.prefetch_harm += ls.prefetch_harm;
                s.prefetch_paused_steps += ls.prefetch_paused_steps;
                s.prefetch_stand_downs += ls.prefetch_stand_downs;
                let r = local.report.lock().unwrap_or_else(|p| p.into_inner());
                reports.push(
                    WorkerReport {
                        expert_hits: ls.expert_hits,
                        expert_misses: ls.expert_misses,
                        disk_bytes_read: ls.expert_bytes_read,
                        cache_bytes: ls.cache_bytes,
                        ..r.clone()
                    }
                    .with_means(),
                );
            }
        }
        // Ownership as the current placement has it (not recomputed here:
        // a scrape must not move experts).
        let plan = self.plan.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for r in &mut reports {
            r.experts_owned = if !r.connected {
                0
            } else if r.address == LOCAL {
                plan.uncovered.len() as u64
            } else {
                plan.workers
                    .iter()
                    .find(|w| w.address == r.address)
                    .map_or(0, |w| w.owns)
            };
        }
        let t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        s.network_bytes_sent = t.bytes_sent;
        s.network_bytes_received = t.bytes_received;
        s.round_trips = t.round_trips;
        s.workers = reports;
        s
    }

    /// The workers compute; a step waits on the network (the in-process
    /// fallback, when it runs, is a failover, not the steady state).
    fn computes_in_process(&self) -> bool {
        false
    }

    /// The current placement's owners (as placed last; reading them
    /// does not re-plan).
    fn owners(&self) -> Vec<((u16, u32), String)> {
        let plan = self.plan.lock().unwrap_or_else(|p| p.into_inner()).clone();
        plan.owners()
            .map(|(k, h)| {
                let who = match h {
                    Holder::Worker(a) => a.to_string(),
                    Holder::Local => LOCAL.to_string(),
                };
                (k, who)
            })
            .collect()
    }

    fn end_request(&self) {
        if let Some(svc) = self.local.as_ref().and_then(Local::built) {
            svc.end_request();
        }
        let frame = match encode(&Message::EndRequest) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("encoding EndRequest: {e}");
                return;
            }
        };
        // Late workers are skipped, and nobody is waited for long: the
        // answers only refresh counters, and one that comes later still does.
        let live: Vec<(SocketAddr, Connection)> = self
            .shared
            .live()
            .into_iter()
            .filter(|(a, _)| self.shared.trusted(*a))
            .collect();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        for (addr, conn) in live.iter().cloned() {
            let (shared, totals, frame, limit, tx) = (
                self.shared.clone(),
                self.totals.clone(),
                frame.clone(),
                self.timeout,
                tx.clone(),
            );
            self.runtime().spawn(async move {
                let sent = frame.len() as u64;
                let answer = exchange(conn, frame, limit).await;
                add_totals(&totals, sent, 0, 0);
                shared.with_report(addr, |r| r.bytes_sent += sent);
                match answer {
                    Ok((Message::Stats(s), n, _)) => {
                        add_totals(&totals, 0, n as u64, 0);
                        shared.with_report(addr, |r| r.bytes_received += n as u64);
                        shared.set_stats(addr, s);
                    }
                    Ok((other, _, _)) => {
                        tracing::warn!("worker {addr} answered EndRequest with {}", other.tag().name())
                    }
                    Err(e) => tracing::warn!("worker {addr}: ending the request: {e}"),
                }
                let _ = tx.send(());
            });
        }
        drop(tx);
        let deadline = Instant::now() + END_REQUEST_WAIT.min(self.timeout);
        for _ in &live {
            if rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .is_err()
            {
                break;
            }
        }
        // Re-place with this request's routing heat before the next one.
        self.heat_changed.store(true, Ordering::Relaxed);
    }
}

impl ClusterService {
    fn totals_add(&self, sent: u64, received: u64, round_trips: u64) {
        add_totals(&self.totals, sent, received, round_trips);
    }
}

/// Remembers why a holder failed, for the error if no holder is left.
fn note_failure(reasons: &mut Vec<String>, addr: SocketAddr, why: &str) {
    reasons.push(format!("{addr}: {why}"));
}

/// The outputs of `sub`, checked against it, in its group order.
fn take_outputs(out: ExpertOutputs, sub: &ExpertBatch) -> Result<Vec<GroupOutput>, charm_proto::BatchError> {
    out.in_batch_order(sub)?;
    let mut by_expert: HashMap<u32, GroupOutput> = out.groups.into_iter().map(|g| (g.expert, g)).collect();
    Ok(sub
        .groups
        .iter()
        .map(|g| by_expert.remove(&g.expert).expect("checked by in_batch_order"))
        .collect())
}

impl Drop for ClusterService {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        let endpoint = self.shared.endpoint.clone();
        if let Some(rt) = self.rt.take() {
            // Let the close frames go out before the runtime stops (waiting
            // on a channel, not `block_on`, so dropping the service inside
            // another runtime is fine too).
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            rt.spawn(async move {
                endpoint.close(quinn::VarInt::from_u32(0), b"coordinator done");
                let _ = tokio::time::timeout(Duration::from_millis(300), endpoint.wait_idle()).await;
                let _ = tx.send(());
            });
            let _ = rx.recv_timeout(Duration::from_millis(500));
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> ExpertBatch {
        ExpertBatch {
            layer: 1,
            hidden: 2,
            rows: vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5],
            groups: vec![
                ExpertGroup {
                    expert: 1,
                    rows: vec![0, 2],
                    weights: vec![0.1, 0.2],
                },
                ExpertGroup {
                    expert: 4,
                    rows: vec![2],
                    weights: vec![0.3],
                },
                ExpertGroup {
                    expert: 6,
                    rows: vec![1, 2],
                    weights: vec![0.4, 0.5],
                },
            ],
            next: None,
        }
    }

    /// Two workers holding all 8 experts of one layer, with cache for all
    /// (so every expert gets a replica on the other worker) or for none.
    fn two_workers(cache: u64) -> (Plan, [Holder; 2]) {
        use crate::cluster::placement::Candidate;
        let shape = ModelShape {
            num_layers: 1,
            moe_layers: vec![0],
            num_experts: 8,
            top_k: 8,
            hidden: 2,
        };
        let addr = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let cand = |port, speed| Candidate {
            address: addr(port),
            holdings: charm_proto::Holdings::from_experts((0..8).map(|e| (0u16, e))),
            expert_bytes: 100,
            cache_bytes: cache,
            disk_bytes_per_s: 1e9,
            expert_rows_per_s: speed,
        };
        // The first worker measured faster: it owns most experts.
        let p = plan(&shape, &[cand(1, 3e6), cand(2, 1e6)], &[], false, None);
        (p, [Holder::Worker(addr(1)), Holder::Worker(addr(2))])
    }

    fn decode_step() -> ExpertBatch {
        ExpertBatch {
            layer: 0,
            hidden: 2,
            rows: vec![0.0, 0.5],
            groups: (0..8)
                .map(|e| ExpertGroup {
                    expert: e,
                    rows: vec![0],
                    weights: vec![0.125],
                })
                .collect(),
            next: None,
        }
    }

    #[test]
    fn a_step_spreads_over_the_holders_that_cache_its_experts() {
        let (p, [a, b]) = two_workers(10_000);
        let owned_by_a = (0..8).filter(|&e| p.owner((0, e)) == Some(a)).count();
        assert!(owned_by_a > 4, "the faster worker owns more ({owned_by_a} of 8)");
        let step = decode_step();
        let all: Vec<usize> = (0..8).collect();
        let (shares, orphans) = assign(&p, &step, &all, |_| true);
        assert!(orphans.is_empty());
        assert_eq!((shares[&a].len(), shares[&b].len()), (4, 4), "{shares:?}");
        for idxs in shares.values() {
            assert!(idxs.windows(2).all(|w| w[0] < w[1]), "request order kept");
        }
        // One worker gone: the other takes everything.
        let (shares, orphans) = assign(&p, &step, &all, |h| h != a);
        assert!(orphans.is_empty());
        assert_eq!(shares.len(), 1);
        assert_eq!(shares[&b], all);
        // Nobody usable: every expert is named.
        let (shares, orphans) = assign(&p, &step, &all, |_| false);
        assert!(shares.is_empty());
        assert_eq!(orphans, (0..8).collect::<Vec<u32>>());
    }

    #[test]
    fn without_replicas_experts_stay_with_their_owners() {
        let (p, [a, _]) = two_workers(0);
        assert!(p.workers.iter().all(|w| w.replicas == 0));
        let step = decode_step();
        let all: Vec<usize> = (0..8).collect();
        let (shares, _) = assign(&p, &step, &all, |_| true);
        for (h, idxs) in &shares {
            for &i in idxs {
                assert_eq!(p.owner((0, step.groups[i].expert)), Some(*h));
            }
        }
        assert!(shares[&a].len() > 4);
    }

    #[test]
    fn sub_batches_carry_each_needed_row_once() {
        let b = batch();
        let s = sub_batch(&b, &[0, 1]);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.rows, vec![0.0, 0.5, 2.0, 2.5], "rows 0 and 2, once each");
        assert_eq!(s.groups[0].rows, vec![0, 1]);
        assert_eq!(s.groups[1].rows, vec![1]);
        assert_eq!(s.groups[1].weights, vec![0.3]);
        let s = sub_batch(&b, &[2]);
        assert_eq!(s.rows, vec![1.0, 1.5, 2.0, 2.5]);
        assert_eq!(s.groups[0].rows, vec![0, 1]);
    }

    #[test]
    fn large_shares_split_by_frame_size() {
        let b = batch();
        assert_eq!(split(&b, &[0, 1, 2], 1 << 20).unwrap(), vec![vec![0, 1, 2]]);
        // Room for about one group per frame (plus the margin).
        let limit = (64 << 10) + 2 * (8 + 9) + 1;
        assert_eq!(split(&b, &[0, 1, 2], limit).unwrap(), vec![vec![0], vec![1], vec![2]]);
        let err = split(&b, &[0], (64 << 10) + 10).unwrap_err();
        assert!(err.to_string().contains("do not fit one frame"), "{err}");
    }

    #[test]
    fn outputs_are_checked_and_put_in_request_order() {
        let b = batch();
        let s = sub_batch(&b, &[0, 2]);
        let out = ExpertOutputs {
            layer: 1,
            groups: vec![
                GroupOutput {
                    expert: 6,
                    out: vec![6.0; 4],
                },
                GroupOutput {
                    expert: 1,
                    out: vec![1.0; 4],
                },
            ],
        };
        let got = take_outputs(out, &s).unwrap();
        assert_eq!(got[0].expert, 1);
        assert_eq!(got[1].expert, 6);
        let short = ExpertOutputs {
            layer: 1,
            groups: vec![GroupOutput {
                expert: 1,
                out: vec![1.0; 4],
            }],
        };
        assert!(take_outputs(short, &s).is_err());
    }
}
