//! Server counters and histograms, rendered in the Prometheus text
//! exposition format (version 0.0.4) for `GET /metrics`.
//!
//! Request-level numbers are recorded here by the HTTP layer and the
//! engine thread; expert-store numbers are read from the expert service at
//! scrape time, so they are never stale.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use charm_models::{ExpertStats, WorkerReport};

use crate::engine::PhaseTimes;
use crate::prefix_cache::PrefixStats;

/// Bucket upper bounds of the time-to-first-token histogram, in seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Bucket upper bounds of the decode-rate histogram, in tokens per second.
const RATE_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
];
/// Bucket upper bounds of the queue-wait and request-duration histograms, in seconds.
const WAIT_BUCKETS: &[f64] = &[0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

/// A cumulative histogram with fixed buckets.
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations `<= bounds[i]` (not cumulative; summed when rendered).
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            acc += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// How a generation ended, as counted by `charm_generations_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// End-of-sequence or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// The client went away (while queued or while generating).
    Cancelled,
    /// The engine failed.
    Error,
}

impl Outcome {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Stop => "stop",
            Outcome::Length => "length",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

#[derive(Debug)]
struct Counters {
    http: BTreeMap<(&'static str, u16), u64>,
    generations: BTreeMap<Outcome, u64>,
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft: Histogram,
    decode_rate: Histogram,
    queue_wait: Histogram,
    duration: Histogram,
    phases: PhaseTimes,
    steps: u64,
    step_requests: u64,
    step_rows: u64,
    largest_step: u64,
}

/// Everything `/metrics` exports that the server itself counts.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Counters>,
}

/// Gauges and counters read at scrape time.
pub struct Live<'a> {
    /// Requests waiting in the queue.
    pub queued: usize,
    /// Requests being generated (at most `max_batch`).
    pub running: usize,
    /// Most requests generated at once.
    pub max_batch: usize,
    /// The prefix cache's counters.
    pub prefix: &'a PrefixStats,
    /// The expert service's counters since start.
    pub experts: &'a ExpertStats,
    /// Who runs the experts.
    pub workers: Workers<'a>,
}

/// The workers `/metrics` reports, one labelled series each.
pub enum Workers<'a> {
    /// `--local`: the one in-process worker (label `in-process`), owning
    /// `experts` routed experts; the engine waited `wait_s` seconds on it.
    InProcess { experts: usize, wait_s: f64 },
    /// Cluster mode: one report per remote worker (label: its address) and
    /// `local` once the coordinator ran experts itself. Workers that were
    /// lost stay listed, with `charm_worker_up` 0.
    Remote(&'a [WorkerReport]),
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            inner: Mutex::new(Counters {
                http: BTreeMap::new(),
                generations: BTreeMap::new(),
                prompt_tokens: 0,
                completion_tokens: 0,
                ttft: Histogram::new(TTFT_BUCKETS),
                decode_rate: Histogram::new(RATE_BUCKETS),
                queue_wait: Histogram::new(WAIT_BUCKETS),
                duration: Histogram::new(WAIT_BUCKETS),
                phases: PhaseTimes::default(),
                steps: 0,
                step_requests: 0,
                step_rows: 0,
                largest_step: 0,
            }),
        }
    }
}

/// One finished (or abandoned) generation, as the metrics see it.
pub struct Finished<'a> {
    pub outcome: Outcome,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Seconds from the request's arrival to its first token (`None`: no token).
    pub ttft_s: Option<f64>,
    /// Decode tokens per second (`None`: fewer than two tokens).
    pub decode_tok_s: Option<f64>,
    /// Seconds spent waiting in the queue.
    pub queue_s: f64,
    /// Seconds from arrival to the end.
    pub duration_s: f64,
    pub profile: Option<&'a PhaseTimes>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one HTTP answer on `route` (a fixed route name, never a raw path).
    pub fn http(&self, route: &'static str, status: u16) {
        *self.lock().http.entry((route, status)).or_default() += 1;
    }

    /// Records a generation's end.
    pub fn finished(&self, f: &Finished<'_>) {
        let mut c = self.lock();
        *c.generations.entry(f.outcome).or_default() += 1;
        c.prompt_tokens += f.prompt_tokens as u64;
        c.completion_tokens += f.completion_tokens as u64;
        if let Some(t) = f.ttft_s {
            c.ttft.observe(t);
        }
        if let Some(r) = f.decode_tok_s {
            c.decode_rate.observe(r);
        }
        c.queue_wait.observe(f.queue_s);
        c.duration.observe(f.duration_s);
        if let Some(p) = f.profile {
            let t = &mut c.phases;
            t.attention_ms += p.attention_ms;
            t.attention_parts.add(&p.attention_parts);
            t.routing_ms += p.routing_ms;
            t.experts_ms += p.experts_ms;
            t.combine_ms += p.combine_ms;
            t.head_ms += p.head_ms;
            t.sample_ms += p.sample_ms;
        }
    }

    /// Seconds the engine has waited on the expert service, in total.
    /// One engine step ran over `requests` requests and `rows` token rows.
    pub fn step(&self, requests: usize, rows: usize) {
        let mut c = self.lock();
        c.steps += 1;
        c.step_requests += requests as u64;
        c.step_rows += rows as u64;
        c.largest_step = c.largest_step.max(requests as u64);
    }

    pub fn experts_wait_s(&self) -> f64 {
        self.lock().phases.experts_ms / 1e3
    }

    /// The Prometheus text exposition.
    pub fn render(&self, live: &Live<'_>) -> String {
        let c = self.lock();
        let mut out = String::new();
        head(
            &mut out,
            "charm_http_requests_total",
            "counter",
            "HTTP answers by route and status code.",
        );
        for ((route, status), n) in &c.http {
            let _ = writeln!(
                out,
                "charm_http_requests_total{{route=\"{route}\",code=\"{status}\"}} {n}"
            );
        }
        head(
            &mut out,
            "charm_generations_total",
            "counter",
            "Generations by how they ended.",
        );
        for o in [Outcome::Stop, Outcome::Length, Outcome::Cancelled, Outcome::Error] {
            let n = c.generations.get(&o).copied().unwrap_or(0);
            let _ = writeln!(out, "charm_generations_total{{finish=\"{}\"}} {n}", o.label());
        }
        head(
            &mut out,
            "charm_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished generations.",
        );
        let _ = writeln!(out, "charm_prompt_tokens_total {}", c.prompt_tokens);
        head(
            &mut out,
            "charm_completion_tokens_total",
            "counter",
            "Generated tokens.",
        );
        let _ = writeln!(out, "charm_completion_tokens_total {}", c.completion_tokens);
        head(
            &mut out,
            "charm_queue_depth",
            "gauge",
            "Requests waiting for the engine.",
        );
        let _ = writeln!(out, "charm_queue_depth {}", live.queued);
        head(&mut out, "charm_requests_running", "gauge", "Requests being generated.");
        let _ = writeln!(out, "charm_requests_running {}", live.running);
        let x = live.prefix;
        // The engine's steps and the prefix cache: one unlabelled series each.
        for (name, kind, help, v) in [
            (
                "charm_engine_steps_total",
                "counter",
                "Passes through the layers.",
                c.steps,
            ),
            (
                "charm_engine_step_requests_total",
                "counter",
                "Requests summed over every step (over steps: the mean batch).",
                c.step_requests,
            ),
            (
                "charm_engine_step_rows_total",
                "counter",
                "Token rows summed over every step.",
                c.step_rows,
            ),
            (
                "charm_engine_largest_step_requests",
                "gauge",
                "Most requests one step has run together.",
                c.largest_step,
            ),
            (
                "charm_max_batch",
                "gauge",
                "Most requests generated at once.",
                live.max_batch as u64,
            ),
            (
                "charm_prefix_cache_entries",
                "gauge",
                "Sequence caches kept for prompt reuse, in RAM.",
                x.entries as u64,
            ),
            (
                "charm_prefix_cache_bytes",
                "gauge",
                "Bytes of the prefix cache's entries in RAM.",
                x.bytes,
            ),
            (
                "charm_prefix_cache_budget_bytes",
                "gauge",
                "The prefix cache's RAM budget.",
                x.budget_bytes,
            ),
            (
                "charm_prefix_cache_disk_entries",
                "gauge",
                "Prefix cache entries in its directory.",
                x.disk_entries as u64,
            ),
            (
                "charm_prefix_cache_disk_bytes",
                "gauge",
                "Bytes of the prefix cache's directory.",
                x.disk_bytes,
            ),
            (
                "charm_prefix_cache_lookups_total",
                "counter",
                "Prompts looked up in the prefix cache.",
                x.lookups,
            ),
            (
                "charm_prefix_cache_hits_total",
                "counter",
                "Prompts that reused a cached prefix.",
                x.hits,
            ),
            (
                "charm_prefix_cache_reused_tokens_total",
                "counter",
                "Prompt tokens served from the prefix cache.",
                x.reused_tokens,
            ),
            (
                "charm_prefix_cache_evictions_total",
                "counter",
                "Entries dropped to stay within the budget.",
                x.evictions,
            ),
            (
                "charm_prefix_cache_bad_files_total",
                "counter",
                "Persisted entries refused (checksum, layout) and removed.",
                x.bad_files,
            ),
        ] {
            head(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {v}");
        }
        c.ttft.render(
            &mut out,
            "charm_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first token (queue wait included).",
        );
        c.decode_rate.render(
            &mut out,
            "charm_decode_tokens_per_second",
            "Decode rate of each generation of two or more tokens.",
        );
        c.queue_wait.render(
            &mut out,
            "charm_queue_wait_seconds",
            "Seconds a request waited in the queue.",
        );
        c.duration.render(
            &mut out,
            "charm_request_duration_seconds",
            "Seconds from a request's arrival to its last token.",
        );
        head(
            &mut out,
            "charm_phase_seconds_total",
            "counter",
            "Engine time by phase.",
        );
        let p = &c.phases;
        for (phase, ms) in [
            ("attention", p.attention_ms),
            ("routing", p.routing_ms),
            ("experts", p.experts_ms),
            ("combine", p.combine_ms),
            ("head", p.head_ms),
            ("sample", p.sample_ms),
        ] {
            let _ = writeln!(out, "charm_phase_seconds_total{{phase=\"{phase}\"}} {}", ms / 1e3);
        }
        let e = live.experts;
        let counters = [
            (
                "charm_expert_hits_total",
                "Routed experts served from RAM.",
                e.expert_hits as f64,
            ),
            (
                "charm_expert_misses_total",
                "Routed experts that needed a disk read.",
                e.expert_misses as f64,
            ),
            (
                "charm_expert_bytes_read_total",
                "Expert bytes read from disk.",
                e.expert_bytes_read as f64,
            ),
            (
                "charm_expert_io_wait_seconds_total",
                "Seconds the engine waited for expert reads.",
                e.io_wait_ms / 1e3,
            ),
            (
                "charm_prefetch_issued_total",
                "Expert prefetch reads issued.",
                e.prefetch_issued as f64,
            ),
            (
                "charm_prefetch_wasted_total",
                "Experts read ahead that left the cache unused.",
                e.prefetch_wasted as f64,
            ),
            (
                "charm_prefetch_harm_total",
                "Demand reads of experts a read-ahead had evicted.",
                e.prefetch_harm as f64,
            ),
            (
                "charm_prefetch_paused_steps_total",
                "Layer steps at which read-ahead stood down, having lost.",
                e.prefetch_paused_steps as f64,
            ),
            (
                "charm_prefetch_hits_total",
                "Prefetched experts a later step used.",
                e.prefetch_hits as f64,
            ),
        ];
        for (name, help, v) in counters {
            head(&mut out, name, "counter", help);
            let _ = writeln!(out, "{name} {v}");
        }
        head(
            &mut out,
            "charm_expert_cache_bytes",
            "gauge",
            "Bytes of experts held in RAM now.",
        );
        let _ = writeln!(out, "charm_expert_cache_bytes {}", e.cache_bytes);
        match &live.workers {
            Workers::InProcess { experts, wait_s } => render_in_process(&mut out, e, *experts, *wait_s),
            Workers::Remote(reports) => render_remote(&mut out, reports),
        }
        out
    }
}

fn head(out: &mut String, name: &str, ty: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}");
}

/// A label value as the exposition format wants it (`\\`, `\"`, `\n` escaped).
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// The `--local` worker's series (unchanged since before cluster mode).
fn render_in_process(out: &mut String, e: &ExpertStats, experts: usize, wait_s: f64) {
    let w = super::IN_PROCESS;
    head(out, "charm_worker_up", "gauge", "1 when the worker answers.");
    let _ = writeln!(out, "charm_worker_up{{worker=\"{w}\"}} 1");
    head(out, "charm_worker_experts", "gauge", "Routed experts the worker owns.");
    let _ = writeln!(out, "charm_worker_experts{{worker=\"{w}\"}} {experts}");
    head(
        out,
        "charm_worker_disk_bytes_read_total",
        "counter",
        "Expert bytes the worker read from its disk.",
    );
    let _ = writeln!(
        out,
        "charm_worker_disk_bytes_read_total{{worker=\"{w}\"}} {}",
        e.expert_bytes_read
    );
    // Nothing crosses a network in-process.
    head(
        out,
        "charm_worker_network_bytes_total",
        "counter",
        "Bytes exchanged with the worker over the network (0 for the in-process worker).",
    );
    for dir in ["sent", "received"] {
        let _ = writeln!(
            out,
            "charm_worker_network_bytes_total{{worker=\"{w}\",direction=\"{dir}\"}} 0"
        );
    }
    head(
        out,
        "charm_worker_wait_seconds_total",
        "counter",
        "Seconds the engine waited for the worker's expert outputs (its round trips, summed).",
    );
    let _ = writeln!(out, "charm_worker_wait_seconds_total{{worker=\"{w}\"}} {wait_s}");
}

/// One series per cluster worker, labelled with its address.
fn render_remote(out: &mut String, reports: &[WorkerReport]) {
    let labels: Vec<String> = reports.iter().map(|r| escape_label(&r.address)).collect();
    type Value = fn(&WorkerReport) -> f64;
    let families: [(&str, &str, &str, Value); 13] = [
        (
            "charm_worker_up",
            "gauge",
            "1 while the worker is a connected member of the cluster, 0 after it was lost.",
            |r| if r.connected { 1.0 } else { 0.0 },
        ),
        (
            "charm_worker_experts",
            "gauge",
            "Routed experts the current placement gives the worker to own.",
            |r| r.experts_owned as f64,
        ),
        (
            "charm_worker_experts_served_total",
            "counter",
            "Expert groups the worker computed.",
            |r| r.experts_served as f64,
        ),
        (
            "charm_worker_disk_bytes_read_total",
            "counter",
            "Expert bytes the worker read from its disk (as it last reported).",
            |r| r.disk_bytes_read as f64,
        ),
        (
            "charm_worker_round_trips_total",
            "counter",
            "Requests the worker answered.",
            |r| r.requests as f64,
        ),
        (
            "charm_worker_rtt_ms",
            "gauge",
            "Mean request round trip seen by the coordinator (network, queueing and compute), in milliseconds.",
            |r| r.rtt_ms,
        ),
        (
            "charm_worker_compute_ms",
            "gauge",
            "Mean time the worker reported computing one request's experts, in milliseconds (rtt minus this: network and queueing).",
            |r| r.compute_ms,
        ),
        (
            "charm_worker_wait_seconds_total",
            "counter",
            "Seconds the engine waited for the worker's expert outputs (its round trips, summed).",
            |r| r.rtt_ms_total / 1e3,
        ),
        (
            "charm_worker_cache_hit_rate",
            "gauge",
            "Share of the worker's expert lookups served from its RAM cache (0 before any).",
            |r| r.cache_hit_rate,
        ),
        (
            "charm_worker_cache_bytes",
            "gauge",
            "Bytes of experts the worker holds in RAM (as it last reported).",
            |r| r.cache_bytes as f64,
        ),
        (
            "charm_worker_failures_total",
            "counter",
            "Requests the worker failed, timed out on, or was dropped for.",
            |r| r.failures as f64,
        ),
        (
            "charm_worker_failovers_total",
            "counter",
            "Requests to the worker that failed and were re-sent to another holder.",
            |r| r.failovers as f64,
        ),
        (
            "charm_worker_hedges_total",
            "counter",
            "Requests to the worker that were late and were re-sent (hedged) to another holder.",
            |r| r.hedges as f64,
        ),
    ];
    for (name, ty, help, value) in families {
        head(out, name, ty, help);
        for (r, w) in reports.iter().zip(&labels) {
            let _ = writeln!(out, "{name}{{worker=\"{w}\"}} {}", value(r));
        }
    }
    head(
        out,
        "charm_worker_network_bytes_total",
        "counter",
        "Frame bytes exchanged with the worker over the network.",
    );
    for (r, w) in reports.iter().zip(&labels) {
        for (dir, n) in [("sent", r.bytes_sent), ("received", r.bytes_received)] {
            let _ = writeln!(
                out,
                "charm_worker_network_bytes_total{{worker=\"{w}\",direction=\"{dir}\"}} {n}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.5, 1.7, 9.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"1\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"2\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_sum 12.7\n"), "{out}");
        assert!(out.contains("x_count 4\n"), "{out}");
    }

    /// Every sample belongs to a metric declared once, and has a number.
    fn well_formed(text: &str) {
        let declared: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut unique = declared.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), declared.len(), "a metric declared twice in\n{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| declared.contains(b)))
                .unwrap_or(name);
            assert!(declared.contains(&base), "undeclared sample {line}");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad value in {line}");
        }
    }

    #[test]
    fn cluster_workers_get_one_series_each() {
        let up = WorkerReport {
            address: "10.0.0.1:7411".into(),
            connected: true,
            experts_owned: 5,
            experts_served: 40,
            requests: 12,
            rtt_ms_total: 30.0,
            compute_ms_total: 24.0,
            bytes_sent: 1000,
            bytes_received: 2000,
            expert_hits: 3,
            expert_misses: 1,
            disk_bytes_read: 4096,
            failures: 0,
            ..Default::default()
        }
        .with_means();
        let lost = WorkerReport {
            address: "10.0.0.2:7411".into(),
            connected: false,
            experts_served: 7,
            requests: 2,
            failures: 1,
            ..Default::default()
        };
        let reports = [up, lost];
        let text = Metrics::default().render(&Live {
            queued: 0,
            running: 0,
            max_batch: 4,
            prefix: &PrefixStats::default(),
            experts: &ExpertStats::default(),
            workers: Workers::Remote(&reports),
        });
        well_formed(&text);
        for line in [
            "charm_worker_up{worker=\"10.0.0.1:7411\"} 1",
            "charm_worker_up{worker=\"10.0.0.2:7411\"} 0",
            "charm_worker_experts{worker=\"10.0.0.1:7411\"} 5",
            "charm_worker_experts_served_total{worker=\"10.0.0.1:7411\"} 40",
            "charm_worker_experts_served_total{worker=\"10.0.0.2:7411\"} 7",
            "charm_worker_disk_bytes_read_total{worker=\"10.0.0.1:7411\"} 4096",
            "charm_worker_round_trips_total{worker=\"10.0.0.1:7411\"} 12",
            "charm_worker_rtt_ms{worker=\"10.0.0.1:7411\"} 2.5",
            "charm_worker_compute_ms{worker=\"10.0.0.1:7411\"} 2",
            "charm_worker_wait_seconds_total{worker=\"10.0.0.1:7411\"} 0.03",
            "charm_worker_cache_hit_rate{worker=\"10.0.0.1:7411\"} 0.75",
            "charm_worker_failures_total{worker=\"10.0.0.2:7411\"} 1",
            "charm_worker_network_bytes_total{worker=\"10.0.0.1:7411\",direction=\"sent\"} 1000",
            "charm_worker_network_bytes_total{worker=\"10.0.0.1:7411\",direction=\"received\"} 2000",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains("in-process") && !text.contains("worker=\"cluster\""),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_sample_line_belongs_to_a_declared_metric() {
        let m = Metrics::default();
        m.http("/v1/chat/completions", 200);
        m.finished(&Finished {
            outcome: Outcome::Length,
            prompt_tokens: 5,
            completion_tokens: 3,
            ttft_s: Some(0.02),
            decode_tok_s: Some(40.0),
            queue_s: 0.0,
            duration_s: 0.1,
            profile: Some(&PhaseTimes::default()),
        });
        let text = m.render(&Live {
            queued: 2,
            running: 1,
            max_batch: 4,
            prefix: &PrefixStats {
                entries: 3,
                hits: 7,
                ..PrefixStats::default()
            },
            experts: &ExpertStats::default(),
            workers: Workers::InProcess {
                experts: 8,
                wait_s: 0.0,
            },
        });
        well_formed(&text);
        assert!(text.contains("charm_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 1\n"));
        assert!(text.contains("charm_generations_total{finish=\"length\"} 1\n"));
        assert!(text.contains("charm_completion_tokens_total 3\n"));
        assert!(text.contains("charm_queue_depth 2\n"));
        assert!(text.contains("charm_max_batch 4\n"));
        assert!(text.contains("charm_prefix_cache_entries 3\n"));
        assert!(text.contains("charm_prefix_cache_hits_total 7\n"));
    }
}
