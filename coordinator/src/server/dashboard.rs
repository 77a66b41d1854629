//! The live dashboard: the page (shipped inside the binary), its JSON
//! snapshot (`GET /api/state`) and its live feed (`GET /api/events`, SSE).
//!
//! [`Board`] is the engine's [`StepObserver`]: every MoE layer step adds
//! the rows routed to each expert to a layers × experts heat grid (atomic
//! counters, cheap on the engine thread). The feed sends, every
//! [`TICK`], the cells that changed since the client's last tick, the
//! requests being generated (every sequence of the running batch), the queue, the workers' counters (one row per
//! cluster worker) and the requests that finished, so the grid flashes
//! while a request runs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use charm_models::WorkerReport;
use serde::Serialize;
use serde_json::json;

use super::sse::SseWriter;
use super::AppState;
use crate::engine::{GenStats, StepObserver};

/// How often the live feed sends a frame.
pub const TICK: Duration = Duration::from_millis(250);
/// Finished requests kept for the profile panel.
const HISTORY: usize = 50;

const INDEX_HTML: &str = include_str!("../../assets/index.html");
const DASHBOARD_JS: &str = include_str!("../../assets/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("../../assets/dashboard.css");

/// One finished request, as the profile panel shows it.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    pub id: String,
    pub api: &'static str,
    /// Unix time of the end, in milliseconds.
    pub at_ms: u64,
    /// `stop`, `length`, `cancelled` or `error`.
    pub finish: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub max_tokens: usize,
    pub queue_ms: f64,
    /// From arrival to the first token (queue wait included).
    pub ttft_ms: Option<f64>,
    /// From arrival to the end.
    pub total_ms: f64,
    /// The engine's numbers (absent when the job never ran).
    pub stats: Option<GenStats>,
}

/// A request being generated.
#[derive(Clone, Debug, Serialize)]
struct Active {
    id: String,
    api: &'static str,
    prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    cached_tokens: usize,
    tokens: usize,
    #[serde(skip)]
    started: Option<Instant>,
    elapsed_ms: f64,
}

/// Routing heat and request history, shared by the engine thread and the
/// dashboard handlers.
pub struct Board {
    layers: usize,
    experts: usize,
    /// Rows routed to `(layer, expert)` since start, at `layer * experts + expert`.
    heat: Vec<AtomicU64>,
    /// MoE layer steps observed.
    steps: AtomicU64,
    /// The running batch's requests, in the order they were admitted.
    active: Mutex<Vec<Active>>,
    /// Finished requests, oldest first, with a running sequence number.
    history: Mutex<VecDeque<(u64, RequestRecord)>>,
    finished: AtomicU64,
}

impl Board {
    /// An empty board for `layers` × `experts`.
    pub fn new(layers: usize, experts: usize) -> Self {
        Board {
            layers,
            experts,
            heat: (0..layers * experts).map(|_| AtomicU64::new(0)).collect(),
            steps: AtomicU64::new(0),
            active: Mutex::new(Vec::new()),
            history: Mutex::new(VecDeque::new()),
            finished: AtomicU64::new(0),
        }
    }

    /// A request joined the running batch.
    pub fn begin(&self, id: &str, api: &'static str, prompt_tokens: usize, cached_tokens: usize) {
        lock(&self.active).push(Active {
            id: id.to_string(),
            api,
            prompt_tokens,
            cached_tokens,
            tokens: 0,
            started: Some(Instant::now()),
            elapsed_ms: 0.0,
        });
    }

    /// Request `id` produced a token.
    pub fn token(&self, id: &str) {
        if let Some(a) = lock(&self.active).iter_mut().find(|a| a.id == id) {
            a.tokens += 1;
        }
    }

    /// A request ended (or was dropped from the queue).
    pub fn end(&self, record: RequestRecord) {
        lock(&self.active).retain(|a| a.id != record.id);
        let seq = self.finished.fetch_add(1, Ordering::Relaxed) + 1;
        let mut h = lock(&self.history);
        h.push_back((seq, record));
        while h.len() > HISTORY {
            h.pop_front();
        }
    }

    /// Mean duration of the finished requests kept, in seconds.
    pub fn mean_duration_s(&self) -> Option<f64> {
        let h = lock(&self.history);
        let ran: Vec<f64> = h
            .iter()
            .filter(|(_, r)| r.stats.is_some())
            .map(|(_, r)| r.total_ms)
            .collect();
        (!ran.is_empty()).then(|| ran.iter().sum::<f64>() / ran.len() as f64 / 1e3)
    }

    fn heat(&self) -> Vec<u64> {
        self.heat.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    fn active(&self) -> Vec<Active> {
        let mut running = lock(&self.active).clone();
        for a in &mut running {
            a.elapsed_ms = a.started.map_or(0.0, |s| s.elapsed().as_secs_f64() * 1e3);
        }
        running
    }

    /// Finished requests with a sequence number above `after`.
    fn history_after(&self, after: u64) -> (u64, Vec<RequestRecord>) {
        let h = lock(&self.history);
        let last = h.back().map_or(after, |(s, _)| *s);
        (
            last,
            h.iter().filter(|(s, _)| *s > after).map(|(_, r)| r.clone()).collect(),
        )
    }
}

impl StepObserver for Board {
    fn on_experts(&self, layer: u16, experts: &[(u32, u32)]) {
        let layer = layer as usize;
        if layer >= self.layers {
            return;
        }
        for &(e, rows) in experts {
            if let Some(c) = self.heat.get(layer * self.experts + e as usize) {
                c.fetch_add(rows as u64, Ordering::Relaxed);
            }
        }
        self.steps.fetch_add(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /assets/dashboard.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", DASHBOARD_JS)
}

/// `GET /assets/dashboard.css`.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", DASHBOARD_CSS)
}

/// One remote worker's row of the cluster table.
fn remote_worker(r: &WorkerReport) -> serde_json::Value {
    let lookups = r.expert_hits + r.expert_misses;
    json!({
        "address": r.address,
        "status": if r.connected { "up" } else { "down" },
        "experts_owned": r.experts_owned,
        "experts_served": r.experts_served,
        "cache_bytes": r.cache_bytes,
        "cache_budget_bytes": serde_json::Value::Null,
        "hit_rate": if lookups == 0 { serde_json::Value::Null } else { json!(r.cache_hit_rate) },
        "rtt_ms": if r.requests == 0 { serde_json::Value::Null } else { json!(r.rtt_ms) },
        "compute_ms": if r.requests == 0 { serde_json::Value::Null } else { json!(r.compute_ms) },
        "disk_bytes_read": r.disk_bytes_read,
        "network_bytes_sent": r.bytes_sent,
        "network_bytes_received": r.bytes_received,
        "round_trips": r.requests,
        "failures": r.failures,
        "failovers": r.failovers,
        "hedges": r.hedges,
    })
}

/// The counters every frame carries: queue, workers, expert store.
///
/// `worker` is the one in-process worker of `--local`, or the cluster as a
/// whole (`cluster`); `workers` has one row per worker: the in-process one,
/// or each remote worker by address (lost ones stay, `down`), and `local`
/// once the coordinator ran experts itself.
fn live(st: &AppState) -> serde_json::Value {
    let e = st.experts.stats();
    let lookups = e.expert_hits + e.expert_misses;
    let in_process = st.config.worker == super::IN_PROCESS;
    let worker = json!({
        "address": st.config.worker,
        "status": if in_process || e.workers.iter().any(|w| w.connected) { "up" } else { "down" },
        "experts_owned": st.model.routed_experts(),
        "experts_served": if in_process { serde_json::Value::Null } else { json!(e.workers.iter().map(|w| w.experts_served).sum::<u64>()) },
        "cache_bytes": e.cache_bytes,
        "cache_budget_bytes": st.model.cache_budget_bytes,
        "hit_rate": if lookups == 0 { serde_json::Value::Null } else { json!(e.expert_hits as f64 / lookups as f64) },
        "rtt_ms": serde_json::Value::Null,
        "disk_bytes_read": e.expert_bytes_read,
        "io_wait_ms": e.io_wait_ms,
        "network_bytes_sent": e.network_bytes_sent,
        "network_bytes_received": e.network_bytes_received,
        "round_trips": e.round_trips,
        "failures": e.workers.iter().map(|w| w.failures).sum::<u64>(),
        "failovers": e.workers.iter().map(|w| w.failovers).sum::<u64>(),
        "hedges": e.workers.iter().map(|w| w.hedges).sum::<u64>(),
    });
    let workers: Vec<serde_json::Value> = if in_process {
        vec![worker.clone()]
    } else {
        e.workers.iter().map(remote_worker).collect()
    };
    json!({
        "queue": {"queued": st.queue.queued(), "running": st.queue.running(), "capacity": st.queue.capacity(),
                  "max_batch": st.max_batch},
        "prefix_cache": st.prefix.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        "worker": worker,
        "workers": workers,
        "experts": e,
        "steps": st.board.steps.load(Ordering::Relaxed),
        "uptime_s": st.started.elapsed().as_secs_f64(),
    })
}

/// Each grid cell's owner in cluster mode: an index into `workers` (the
/// order [`live`] lists them), or -1 for an expert no worker owns (a dense
/// layer, or nobody placed yet); `null` for one in-process worker.
fn owners(st: &AppState) -> serde_json::Value {
    if st.config.worker == super::IN_PROCESS {
        return serde_json::Value::Null;
    }
    let workers = st.experts.stats().workers;
    let index: std::collections::HashMap<&str, i64> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (w.address.as_str(), i as i64))
        .collect();
    let m = &st.model;
    let mut cells = vec![-1i64; m.layers * m.experts];
    for ((l, e), who) in st.experts.owners() {
        let i = l as usize * m.experts + e as usize;
        if let (Some(c), Some(&w)) = (cells.get_mut(i), index.get(who.as_str())) {
            *c = w;
        }
    }
    json!(cells)
}

/// `GET /api/state`: everything the page draws, once.
pub async fn state(State(st): State<Arc<AppState>>) -> Response {
    let m = &st.model;
    let (last, recent) = st.board.history_after(0);
    let mut body = live(&st);
    body["model"] = json!({
        "id": m.id,
        "path": m.path,
        "family": m.family,
        "layers": m.layers,
        "experts": m.experts,
        "top_k": m.top_k,
        "moe_layers": m.moe_layers,
        "context": m.context,
        "placement": m.placement,
    });
    body["heat"] = json!(st.board.heat());
    body["owners"] = owners(&st);
    body["active"] = json!(st.board.active());
    body["recent"] = json!(recent);
    body["recent_seq"] = json!(last);
    super::json_response(StatusCode::OK, &body)
}

/// `GET /api/events`: one `tick` event every [`TICK`] with the heat cells
/// that changed (`[index, rows added]`), the running requests, the counters
/// and newly finished requests.
pub async fn events(State(st): State<Arc<AppState>>) -> Response {
    let (writer, resp) = SseWriter::channel();
    tokio::spawn(async move {
        let mut seen = st.board.heat();
        let mut placed = owners(&st);
        let (mut seq, _) = st.board.history_after(0);
        let mut interval = tokio::time::interval(TICK);
        loop {
            interval.tick().await;
            let heat = st.board.heat();
            let delta: Vec<(usize, u64)> = heat
                .iter()
                .zip(&seen)
                .enumerate()
                .filter(|(_, (now, before))| now != before)
                .map(|(i, (now, before))| (i, now - before))
                .collect();
            seen = heat;
            let (last, finished) = st.board.history_after(seq);
            seq = last;
            let mut frame = live(&st);
            frame["heat_delta"] = json!(delta);
            frame["active"] = json!(st.board.active());
            frame["finished"] = json!(finished);
            // The placement, when it changed.
            let now = owners(&st);
            if now != placed {
                frame["owners"] = now.clone();
                placed = now;
            }
            if !writer.event("tick", &frame).await {
                break;
            }
        }
    });
    resp
}
