//! Server counters and histograms, rendered in the Prometheus text
//! exposition format (version 0.0.4) for `GET /metrics`.
//!
//! Request-level numbers are recorded here by the HTTP layer and the
//! engine thread; expert-store numbers are read from the expert service at
//! scrape time, so they are never stale.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use charm_models::ExpertStats;

use crate::engine::PhaseTimes;

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
    /// Requests being generated (0 or 1: one engine thread).
    pub running: usize,
    /// The expert service's counters since start.
    pub experts: &'a ExpertStats,
    /// The worker's label (`in-process`, or `cluster` for the whole fan-out).
    pub worker: &'a str,
    /// Experts the worker owns.
    pub worker_experts: usize,
    /// Seconds the engine waited on the worker (sum of `experts_ms`).
    pub worker_wait_s: f64,
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
            t.routing_ms += p.routing_ms;
            t.experts_ms += p.experts_ms;
            t.combine_ms += p.combine_ms;
            t.head_ms += p.head_ms;
            t.sample_ms += p.sample_ms;
        }
    }

    /// Seconds the engine has waited on the expert service, in total.
    pub fn experts_wait_s(&self) -> f64 {
        self.lock().phases.experts_ms / 1e3
    }

    /// The Prometheus text exposition.
    pub fn render(&self, live: &Live<'_>) -> String {
        let c = self.lock();
        let mut out = String::new();
        let head = |out: &mut String, name: &str, ty: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}");
        };
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
        let w = live.worker;
        head(&mut out, "charm_worker_up", "gauge", "1 when the worker answers.");
        let _ = writeln!(out, "charm_worker_up{{worker=\"{w}\"}} 1");
        head(
            &mut out,
            "charm_worker_experts",
            "gauge",
            "Routed experts the worker owns.",
        );
        let _ = writeln!(out, "charm_worker_experts{{worker=\"{w}\"}} {}", live.worker_experts);
        head(
            &mut out,
            "charm_worker_disk_bytes_read_total",
            "counter",
            "Expert bytes the worker read from its disk.",
        );
        let _ = writeln!(
            out,
            "charm_worker_disk_bytes_read_total{{worker=\"{w}\"}} {}",
            e.expert_bytes_read
        );
        if w == super::IN_PROCESS {
            // Nothing crosses a network in-process; the cluster's workers
            // report their own traffic.
            head(
                &mut out,
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
        }
        head(
            &mut out,
            "charm_worker_wait_seconds_total",
            "counter",
            "Seconds the engine waited for the worker's expert outputs (its round trips, summed).",
        );
        let _ = writeln!(
            out,
            "charm_worker_wait_seconds_total{{worker=\"{w}\"}} {}",
            live.worker_wait_s
        );
        out
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
            experts: &ExpertStats::default(),
            worker: "in-process",
            worker_experts: 8,
            worker_wait_s: 0.0,
        });
        let declared: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
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
        assert!(text.contains("charm_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 1\n"));
        assert!(text.contains("charm_generations_total{finish=\"length\"} 1\n"));
        assert!(text.contains("charm_completion_tokens_total 3\n"));
        assert!(text.contains("charm_queue_depth 2\n"));
    }
}
