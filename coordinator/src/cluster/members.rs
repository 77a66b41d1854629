//! The workers a coordinator knows: which are connected, what each holds
//! and has done, and the background tasks that keep them connected.
//!
//! - `known` addresses come from `--workers` and from mDNS sightings whose
//!   fingerprint hint matches; a maintenance task connects to every known
//!   address that is not connected (retrying with backoff, 1 s doubling to
//!   10 s), so a worker that joins, leaves or comes back is picked up
//!   without a restart.
//! - Every connection must pass the handshake (cluster key both ways, then
//!   the model's fingerprint and shape); a refusal is logged once per
//!   distinct reason and remembered for the "not enough workers" error.
//! - A watcher per connection notices when it closes; the member stays
//!   listed (its counters still count) but is no longer offered work, and
//!   the placement is recomputed before the next step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use charm_models::{ExpertStats, WorkerReport};
use charm_proto::{ErrorKind, Hello, WorkerStats};
use charm_worker::net::handshake::{connect, short};
use charm_worker::net::mdns::Browser;
use charm_worker::net::{close, describe_close, ClusterKey};
use quinn::{Connection, Endpoint};

use super::placement::{Candidate, ModelShape};

/// Time a connection attempt (QUIC, TLS and our handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the maintenance task looks for addresses to (re)connect.
const MAINTAIN_EVERY: Duration = Duration::from_millis(200);
/// Most addresses kept from mDNS sightings (mDNS is untrusted: anyone on
/// the LAN can announce anything).
pub const MAX_SIGHTINGS: usize = 32;
/// An address seen in mDNS and not connected is forgotten this long after
/// it was last seen.
pub const SIGHTING_TTL: Duration = Duration::from_secs(600);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// State shared by the service and its background tasks.
pub(crate) struct Shared {
    pub key: ClusterKey,
    pub fingerprint: String,
    pub shape: ModelShape,
    pub endpoint: Endpoint,
    pub closed: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    members: BTreeMap<SocketAddr, Member>,
    known: BTreeSet<SocketAddr>,
    /// Addresses from mDNS, with when each was last seen (or connected).
    sighted: HashMap<SocketAddr, Instant>,
    connecting: BTreeSet<SocketAddr>,
    retry: HashMap<SocketAddr, (Instant, Duration)>,
    refusals: BTreeMap<SocketAddr, String>,
    /// Membership changed since the placement was last computed.
    changed: bool,
}

/// Round trips remembered per worker for its hedging deadline.
const RECENT: usize = 64;
/// A request is re-sent elsewhere when it is this many times later than
/// the worker's recent worst (p99) round trip for its size...
pub const HEDGE_FACTOR: f64 = 10.0;
/// ...but never sooner than this (a scheduling hiccup is not a failure).
pub const HEDGE_FLOOR: Duration = Duration::from_millis(150);
/// Samples needed before the measured round trips set the deadline (until
/// then the worker's `Hello` speeds do).
const MIN_SAMPLES: usize = 8;

impl State {
    /// Drops an mDNS address (and what was remembered of its attempts).
    fn forget(&mut self, addr: SocketAddr) {
        self.sighted.remove(&addr);
        self.known.remove(&addr);
        self.retry.remove(&addr);
        self.refusals.remove(&addr);
    }
}

/// One worker, connected or not.
pub(crate) struct Member {
    pub conn: Option<Connection>,
    /// A request to it was hedged and it has not answered since: it gets
    /// no new work until it answers or its connection is dropped.
    suspect: bool,
    /// Its latest round trips (ms) with the routed rows each carried.
    recent: std::collections::VecDeque<(f64, u32)>,
    pub hello: Hello,
    /// What the coordinator measured: requests, bytes, round trips, failures.
    pub report: WorkerReport,
    /// The worker's counters at this connection's handshake, the latest
    /// reported, and the deltas of earlier connections.
    base: WorkerStats,
    latest: WorkerStats,
    carried: WorkerStats,
}

impl Member {
    /// The worker's store counters attributable to its time with us.
    fn store_delta(&self) -> WorkerStats {
        add(&self.carried, &delta(&self.latest, &self.base))
    }
}

fn delta(a: &WorkerStats, b: &WorkerStats) -> WorkerStats {
    WorkerStats {
        requests: a.requests.saturating_sub(b.requests),
        experts_served: a.experts_served.saturating_sub(b.experts_served),
        expert_hits: a.expert_hits.saturating_sub(b.expert_hits),
        expert_misses: a.expert_misses.saturating_sub(b.expert_misses),
        expert_bytes_read: a.expert_bytes_read.saturating_sub(b.expert_bytes_read),
        io_wait_ms: (a.io_wait_ms - b.io_wait_ms).max(0.0),
        prefetch_hits: a.prefetch_hits.saturating_sub(b.prefetch_hits),
        prefetch_issued: a.prefetch_issued.saturating_sub(b.prefetch_issued),
        cache_bytes: a.cache_bytes,
        predicted_correct: a.predicted_correct.saturating_sub(b.predicted_correct),
        predicted_total: a.predicted_total.saturating_sub(b.predicted_total),
        prefetch_wasted: a.prefetch_wasted.saturating_sub(b.prefetch_wasted),
        prefetch_harm: a.prefetch_harm.saturating_sub(b.prefetch_harm),
        prefetch_paused_steps: a.prefetch_paused_steps.saturating_sub(b.prefetch_paused_steps),
        prefetch_stand_downs: a.prefetch_stand_downs.saturating_sub(b.prefetch_stand_downs),
    }
}

fn add(a: &WorkerStats, b: &WorkerStats) -> WorkerStats {
    WorkerStats {
        requests: a.requests + b.requests,
        experts_served: a.experts_served + b.experts_served,
        expert_hits: a.expert_hits + b.expert_hits,
        expert_misses: a.expert_misses + b.expert_misses,
        expert_bytes_read: a.expert_bytes_read + b.expert_bytes_read,
        io_wait_ms: a.io_wait_ms + b.io_wait_ms,
        prefetch_hits: a.prefetch_hits + b.prefetch_hits,
        prefetch_issued: a.prefetch_issued + b.prefetch_issued,
        cache_bytes: b.cache_bytes,
        predicted_correct: a.predicted_correct + b.predicted_correct,
        predicted_total: a.predicted_total + b.predicted_total,
        prefetch_wasted: a.prefetch_wasted + b.prefetch_wasted,
        prefetch_harm: a.prefetch_harm + b.prefetch_harm,
        prefetch_paused_steps: a.prefetch_paused_steps + b.prefetch_paused_steps,
        prefetch_stand_downs: a.prefetch_stand_downs + b.prefetch_stand_downs,
    }
}

impl Shared {
    pub fn new(key: ClusterKey, fingerprint: String, shape: ModelShape, endpoint: Endpoint) -> Shared {
        Shared {
            key,
            fingerprint,
            shape,
            endpoint,
            closed: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state consistent; recover from a panic elsewhere.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds addresses to keep connected.
    pub fn know(&self, addrs: impl IntoIterator<Item = SocketAddr>) {
        self.lock().known.extend(addrs);
    }

    /// Notes an address seen in mDNS: kept while it is seen or connected,
    /// forgotten [`SIGHTING_TTL`] after; at most [`MAX_SIGHTINGS`] are kept
    /// (the stalest unconnected one makes room; when every one is
    /// connected, the new one is ignored).
    pub fn sighted(&self, addr: SocketAddr) {
        let mut st = self.lock();
        let now = Instant::now();
        if st.known.contains(&addr) && !st.sighted.contains_key(&addr) {
            return; // a --workers address: kept for good
        }
        if !st.sighted.contains_key(&addr) && st.sighted.len() >= MAX_SIGHTINGS {
            let stalest = st
                .sighted
                .iter()
                .filter(|(a, _)| st.members.get(a).is_none_or(|m| m.conn.is_none()))
                .min_by_key(|(_, t)| **t)
                .map(|(a, _)| *a);
            match stalest {
                Some(a) => st.forget(a),
                None => return,
            }
        }
        st.sighted.insert(addr, now);
        st.known.insert(addr);
    }

    /// Forgets mDNS addresses not seen (nor connected) for [`SIGHTING_TTL`].
    fn expire_sightings(&self, now: Instant) {
        let mut st = self.lock();
        let connected: Vec<SocketAddr> = st
            .sighted
            .keys()
            .filter(|a| st.members.get(a).is_some_and(|m| m.conn.is_some()))
            .copied()
            .collect();
        for a in connected {
            st.sighted.insert(a, now);
        }
        let stale: Vec<SocketAddr> = st
            .sighted
            .iter()
            .filter(|(_, t)| now.duration_since(**t) > SIGHTING_TTL)
            .map(|(a, _)| *a)
            .collect();
        for a in stale {
            st.forget(a);
        }
    }

    /// Addresses it would (re)connect to now, for tests.
    #[cfg(test)]
    fn known(&self) -> BTreeSet<SocketAddr> {
        self.lock().known.clone()
    }

    /// Connected workers.
    pub fn live(&self) -> Vec<(SocketAddr, Connection)> {
        self.lock()
            .members
            .iter()
            .filter_map(|(a, m)| m.conn.clone().map(|c| (*a, c)))
            .collect()
    }

    /// The connection to `addr`, if connected.
    pub fn conn(&self, addr: SocketAddr) -> Option<Connection> {
        self.lock().members.get(&addr).and_then(|m| m.conn.clone())
    }

    /// Whether `addr` is connected and not waiting out a hedge.
    pub fn trusted(&self, addr: SocketAddr) -> bool {
        self.lock()
            .members
            .get(&addr)
            .is_some_and(|m| m.conn.is_some() && !m.suspect)
    }

    /// A request to `addr` was late and re-sent elsewhere.
    pub fn suspect(&self, addr: SocketAddr) {
        if let Some(m) = self.lock().members.get_mut(&addr) {
            m.report.hedges += 1;
            if !m.suspect {
                tracing::warn!("worker {addr} is late; its work goes to other holders until it answers");
            }
            m.suspect = true;
        }
    }

    /// `addr` (still on connection `stable_id`) answered a request of
    /// `rows` routed rows in `rtt_ms`.
    pub fn answered(&self, addr: SocketAddr, stable_id: usize, rtt_ms: f64, rows: u32) {
        if let Some(m) = self.lock().members.get_mut(&addr) {
            if m.conn.as_ref().is_some_and(|c| c.stable_id() == stable_id) {
                if m.suspect {
                    tracing::info!("worker {addr} answered again");
                }
                m.suspect = false;
                if m.recent.len() == RECENT {
                    m.recent.pop_front();
                }
                m.recent.push_back((rtt_ms, rows));
            }
        }
    }

    /// How long a request of `rows` routed rows over `experts` experts may
    /// take on `addr` before it is re-sent elsewhere: [`HEDGE_FACTOR`] times
    /// the worker's recent p99 round trip (scaled up for a request larger
    /// than usual), or, before enough samples, times what its `Hello` speeds
    /// and the connection's RTT predict with every expert read from disk;
    /// at least [`HEDGE_FLOOR`], at most `limit`.
    pub fn hedge_after(&self, addr: SocketAddr, rows: u32, experts: usize, limit: Duration) -> Duration {
        let st = self.lock();
        let Some(m) = st.members.get(&addr) else { return limit };
        let expected_ms = if m.recent.len() >= MIN_SAMPLES {
            let p99 = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1]
            };
            let rtt = p99(m.recent.iter().map(|&(t, _)| t).collect());
            let per_row = p99(m.recent.iter().map(|&(t, r)| t / f64::from(r.max(1))).collect());
            rtt.max(per_row * f64::from(rows.max(1)))
        } else {
            let h = &m.hello;
            let net = m.conn.as_ref().map_or(0.0, |c| c.rtt().as_secs_f64() * 1e3);
            let compute = f64::from(rows) / h.expert_rows_per_s.max(1.0) * 1e3;
            let disk = (experts as f64 * h.expert_bytes as f64) / h.disk_bytes_per_s.max(1.0) * 1e3;
            net + compute + disk
        };
        let after = Duration::from_secs_f64((expected_ms * HEDGE_FACTOR / 1e3).clamp(0.0, 3600.0));
        after.clamp(HEDGE_FLOOR, limit.max(HEDGE_FLOOR))
    }

    /// Largest frame `addr` accepts.
    pub fn max_frame(&self, addr: SocketAddr) -> u32 {
        self.lock().members.get(&addr).map_or(charm_proto::MAX_FRAME_LEN, |m| {
            m.hello.max_frame.min(charm_proto::MAX_FRAME_LEN)
        })
    }

    /// Connected workers as placement candidates.
    pub fn candidates(&self) -> Vec<Candidate> {
        self.lock()
            .members
            .iter()
            .filter(|(_, m)| m.conn.is_some())
            .map(|(a, m)| Candidate {
                address: *a,
                holdings: m.hello.holdings.clone(),
                expert_bytes: m.hello.expert_bytes,
                cache_bytes: m.hello.cache_bytes,
                disk_bytes_per_s: m.hello.disk_bytes_per_s,
                expert_rows_per_s: m.hello.expert_rows_per_s,
            })
            .collect()
    }

    /// Whether membership changed since the last call (and resets it).
    pub fn take_changed(&self) -> bool {
        std::mem::take(&mut self.lock().changed)
    }

    /// Why known addresses are not connected, one line each.
    pub fn refusals(&self) -> Vec<String> {
        let st = self.lock();
        st.refusals
            .iter()
            .filter(|(a, _)| st.members.get(a).is_none_or(|m| m.conn.is_none()))
            .map(|(a, r)| format!("{a}: {r}"))
            .collect()
    }

    /// Updates the report of `addr`.
    pub fn with_report(&self, addr: SocketAddr, f: impl FnOnce(&mut WorkerReport)) {
        if let Some(m) = self.lock().members.get_mut(&addr) {
            f(&mut m.report);
        }
    }

    /// Records the counters a worker reported.
    pub fn set_stats(&self, addr: SocketAddr, stats: WorkerStats) {
        if let Some(m) = self.lock().members.get_mut(&addr) {
            m.latest = stats;
        }
    }

    /// Closes the connection to `addr` (if it is still `conn`) for `kind`,
    /// counting a failure. The worker stays known and is retried.
    pub fn fail(&self, addr: SocketAddr, kind: ErrorKind, reason: &str) {
        let mut st = self.lock();
        if let Some(m) = st.members.get_mut(&addr) {
            m.report.failures += 1;
            if let Some(c) = m.conn.take() {
                close(&c, kind, reason);
                m.report.connected = false;
                st.changed = true;
                tracing::warn!("worker {addr} dropped: {reason}");
            }
        }
    }

    /// The connection `stable_id` to `addr` closed by itself.
    fn gone(&self, addr: SocketAddr, stable_id: usize, reason: &str) {
        let mut st = self.lock();
        if let Some(m) = st.members.get_mut(&addr) {
            if m.conn.as_ref().is_some_and(|c| c.stable_id() == stable_id) {
                m.conn = None;
                m.report.connected = false;
                st.changed = true;
                if !self.closed.load(Ordering::Relaxed) {
                    tracing::warn!("worker {addr} left: {reason}");
                }
            }
        }
    }

    fn join(&self, addr: SocketAddr, conn: Connection, hello: Hello) {
        let mut st = self.lock();
        st.refusals.remove(&addr);
        st.retry.remove(&addr);
        st.changed = true;
        tracing::info!(
            "worker {addr} joined: {} experts held ({}), cache {:.2} GiB",
            hello.holdings.count(),
            hello.format,
            hello.cache_bytes as f64 / (1u64 << 30) as f64
        );
        let base = hello.stats.clone();
        match st.members.get_mut(&addr) {
            Some(m) => {
                // A returning worker: keep what it did before.
                m.carried = m.store_delta();
                m.base = base.clone();
                m.latest = base;
                m.hello = hello;
                m.conn = Some(conn);
                m.suspect = false;
                m.recent.clear();
                m.report.connected = true;
            }
            None => {
                st.members.insert(
                    addr,
                    Member {
                        conn: Some(conn),
                        suspect: false,
                        recent: Default::default(),
                        hello,
                        report: WorkerReport {
                            address: addr.to_string(),
                            connected: true,
                            ..Default::default()
                        },
                        latest: base.clone(),
                        base,
                        carried: WorkerStats::default(),
                    },
                );
            }
        }
    }

    fn refuse(&self, addr: SocketAddr, reason: String) {
        let mut st = self.lock();
        if st.refusals.get(&addr) != Some(&reason) {
            tracing::warn!("refused worker {addr}: {reason}");
        }
        st.refusals.insert(addr, reason);
        let next = st
            .retry
            .get(&addr)
            .map_or(FIRST_RETRY, |(_, d)| (*d * 2).min(MAX_RETRY));
        st.retry.insert(addr, (Instant::now() + next, next));
    }

    /// Store counters of every worker plus one report each.
    pub fn totals(&self) -> (ExpertStats, Vec<WorkerReport>) {
        let st = self.lock();
        let mut s = ExpertStats::default();
        let mut reports = Vec::new();
        for m in st.members.values() {
            let d = m.store_delta();
            s.expert_hits += d.expert_hits;
            s.expert_misses += d.expert_misses;
            s.expert_bytes_read += d.expert_bytes_read;
            s.io_wait_ms += d.io_wait_ms;
            s.prefetch_hits += d.prefetch_hits;
            s.prefetch_issued += d.prefetch_issued;
            s.predicted_correct += d.predicted_correct;
            s.predicted_total += d.predicted_total;
            s.prefetch_wasted += d.prefetch_wasted;
            s.prefetch_harm += d.prefetch_harm;
            s.prefetch_paused_steps += d.prefetch_paused_steps;
            s.prefetch_stand_downs += d.prefetch_stand_downs;
            if m.conn.is_some() {
                s.cache_bytes += m.latest.cache_bytes;
            }
            reports.push(
                WorkerReport {
                    expert_hits: d.expert_hits,
                    expert_misses: d.expert_misses,
                    disk_bytes_read: d.expert_bytes_read,
                    cache_bytes: if m.conn.is_some() { m.latest.cache_bytes } else { 0 },
                    ..m.report.clone()
                }
                .with_means(),
            );
        }
        (s, reports)
    }

    /// Checks a worker's `Hello` against our model.
    fn check(&self, hello: &Hello) -> Result<(), String> {
        let s = &self.shape;
        if hello.arithmetic != charm_common::ARITHMETIC {
            return Err(format!(
                "it computes with charm arithmetic {} ({}), this coordinator with {}: \
                 run the same charm release on every machine, or the experts' bits would depend on placement",
                hello.arithmetic,
                hello.software,
                charm_common::ARITHMETIC
            ));
        }
        if hello.fingerprint != self.fingerprint {
            return Err(format!(
                "it holds a different model (fingerprint {}…; this model is {}…)",
                short(&hello.fingerprint),
                short(&self.fingerprint)
            ));
        }
        if hello.max_frame < charm_proto::MIN_FRAME_LEN {
            return Err(format!(
                "it accepts frames of only {} bytes (at least {} are needed)",
                hello.max_frame,
                charm_proto::MIN_FRAME_LEN
            ));
        }
        if hello.num_layers as usize != s.num_layers || hello.num_experts != s.num_experts || hello.hidden != s.hidden {
            return Err(format!(
                "it describes the model as {} layers × {} experts of width {}, not {} × {} of width {}",
                hello.num_layers, hello.num_experts, hello.hidden, s.num_layers, s.num_experts, s.hidden
            ));
        }
        Ok(())
    }
}

/// Keeps every known address connected, until the service closes.
pub(crate) async fn maintain(shared: Arc<Shared>) {
    while !shared.closed.load(Ordering::Relaxed) {
        shared.expire_sightings(Instant::now());
        let due: Vec<SocketAddr> = {
            let mut st = shared.lock();
            let now = Instant::now();
            let due: Vec<SocketAddr> = st
                .known
                .iter()
                .copied()
                .filter(|a| st.members.get(a).is_none_or(|m| m.conn.is_none()))
                .filter(|a| !st.connecting.contains(a))
                .filter(|a| st.retry.get(a).is_none_or(|(t, _)| *t <= now))
                .collect();
            st.connecting.extend(due.iter().copied());
            due
        };
        for addr in due {
            tokio::spawn(connect_one(shared.clone(), addr));
        }
        tokio::time::sleep(MAINTAIN_EVERY).await;
    }
}

async fn connect_one(shared: Arc<Shared>, addr: SocketAddr) {
    let attempt = tokio::time::timeout(
        CONNECT_TIMEOUT,
        connect(&shared.endpoint, addr, &shared.key, &shared.fingerprint),
    )
    .await;
    match attempt {
        Err(_) => shared.refuse(
            addr,
            format!(
                "no handshake within {} s (is a worker listening there?)",
                CONNECT_TIMEOUT.as_secs()
            ),
        ),
        Ok(Err(e)) => shared.refuse(addr, e.to_string()),
        Ok(Ok((conn, hello))) => match shared.check(&hello) {
            Err(reason) => {
                close(&conn, ErrorKind::WrongModel, &reason);
                shared.refuse(addr, reason);
            }
            Ok(()) if shared.closed.load(Ordering::Relaxed) => close(&conn, ErrorKind::Failed, "coordinator closing"),
            Ok(()) => {
                shared.join(addr, conn.clone(), hello);
                let watcher = shared.clone();
                tokio::spawn(async move {
                    let e = conn.closed().await;
                    watcher.gone(addr, conn.stable_id(), &describe_close(&e));
                });
            }
        },
    }
    shared.lock().connecting.remove(&addr);
}

/// Browses mDNS on a thread of its own (the browser blocks) and adds every
/// worker whose fingerprint hint matches to the known addresses.
pub(crate) fn browse(shared: Arc<Shared>, loopback_only: bool) {
    let browser = match Browser::start(loopback_only) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!("mDNS discovery unavailable ({e}); use --workers HOST:PORT");
            return;
        }
    };
    let spawned = std::thread::Builder::new().name("charm-mdns".into()).spawn(move || {
        while !shared.closed.load(Ordering::Relaxed) {
            let Some(seen) = browser.next(Duration::from_millis(300)) else {
                continue;
            };
            if seen.fingerprint.as_deref() != Some(shared.fingerprint.as_str()) {
                tracing::debug!("mDNS: {:?} serves another model; ignored", seen.addrs);
                continue;
            }
            // One address per worker: IPv4 first.
            let pick = seen.addrs.iter().find(|a| a.is_ipv4()).or(seen.addrs.first()).copied();
            if let Some(addr) = pick {
                shared.sighted(addr);
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("mDNS discovery unavailable ({e}); use --workers HOST:PORT");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use charm_worker::net::tls;

    fn shared() -> (tokio::runtime::Runtime, Shared) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let endpoint = {
            let _g = rt.enter();
            tls::client_endpoint("127.0.0.1:0".parse().unwrap()).unwrap()
        };
        let shape = ModelShape {
            num_layers: 1,
            moe_layers: vec![0],
            num_experts: 4,
            top_k: 2,
            hidden: 8,
        };
        (rt, Shared::new(ClusterKey::generate(), "fp".into(), shape, endpoint))
    }

    fn addr(i: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 20000 + i))
    }

    #[test]
    fn deltas_and_sums_carry_every_counter() {
        // Distinct values in every field: a counter left out of `add` or
        // `delta` breaks `delta(add(a, b), a) == b`.
        let a = WorkerStats {
            requests: 1,
            experts_served: 2,
            expert_hits: 3,
            expert_misses: 4,
            expert_bytes_read: 5,
            io_wait_ms: 6.5,
            prefetch_hits: 7,
            prefetch_issued: 8,
            cache_bytes: 9,
            predicted_correct: 10,
            predicted_total: 11,
            prefetch_wasted: 12,
            prefetch_harm: 13,
            prefetch_paused_steps: 14,
            prefetch_stand_downs: 15,
        };
        let b = WorkerStats {
            requests: 101,
            experts_served: 102,
            expert_hits: 103,
            expert_misses: 104,
            expert_bytes_read: 105,
            io_wait_ms: 106.25,
            prefetch_hits: 107,
            prefetch_issued: 108,
            cache_bytes: 109,
            predicted_correct: 110,
            predicted_total: 111,
            prefetch_wasted: 112,
            prefetch_harm: 113,
            prefetch_paused_steps: 114,
            prefetch_stand_downs: 115,
        };
        assert_eq!(delta(&add(&a, &b), &a), b);
        assert_eq!(add(&a, &b).prefetch_stand_downs, 130);
    }

    #[test]
    fn a_worker_announcing_a_tiny_frame_limit_is_refused() {
        let (_rt, s) = shared();
        let hello = |max_frame| Hello {
            software: "charm-worker test".into(),
            arithmetic: charm_common::ARITHMETIC,
            fingerprint: "fp".into(),
            num_layers: 1,
            num_experts: 4,
            hidden: 8,
            holdings: charm_proto::Holdings::from_experts((0..4).map(|e| (0, e))),
            format: "test".into(),
            expert_bytes: 1,
            cache_bytes: 1,
            disk_bytes_per_s: 1.0,
            expert_rows_per_s: 1.0,
            max_frame,
            stats: WorkerStats::default(),
        };
        assert_eq!(s.check(&hello(charm_proto::MAX_FRAME_LEN)), Ok(()));
        let err = s.check(&hello(64)).unwrap_err();
        assert!(err.contains("frames of only 64 bytes"), "{err}");
        // A worker of a build whose kernels round differently.
        let other = Hello {
            arithmetic: charm_common::ARITHMETIC + 1,
            ..hello(charm_proto::MAX_FRAME_LEN)
        };
        let err = s.check(&other).unwrap_err();
        assert!(
            err.contains(&format!("charm arithmetic {}", charm_common::ARITHMETIC + 1))
                && err.contains("charm-worker test")
                && err.contains("same charm release"),
            "{err}"
        );
    }

    #[test]
    fn mdns_sightings_are_capped_and_expire() {
        let (_rt, s) = shared();
        let fixed = addr(999);
        s.know([fixed]);
        for i in 0..(MAX_SIGHTINGS as u16 + 20) {
            s.sighted(addr(i));
        }
        let known = s.known();
        assert_eq!(known.len(), MAX_SIGHTINGS + 1, "capped, plus the --workers address");
        assert!(known.contains(&fixed));
        // The newest sightings stayed; the stalest made room.
        assert!(known.contains(&addr(MAX_SIGHTINGS as u16 + 19)));
        assert!(!known.contains(&addr(0)));
        // A --workers address seen in mDNS is still never forgotten.
        s.sighted(fixed);
        s.expire_sightings(Instant::now() + SIGHTING_TTL + Duration::from_secs(1));
        assert_eq!(s.known(), BTreeSet::from([fixed]));
    }
}
