//! The engine thread and its queue.
//!
//! The [`Engine`] is synchronous and runs one sequence at a time, so the
//! server owns it on one dedicated thread. HTTP handlers reserve a place in
//! a bounded FIFO ([`Queue::reserve`]; a full queue is a 429) before any
//! work on the request (tokenizing, the chat template), put their [`Job`]
//! in it ([`Slot::send`]) and read
//! [`Event`]s back from the job's own channel. Each job gets a fresh
//! session, so concurrent requests never share a KV cache or a token.
//!
//! On the engine thread each sampled id is detokenized
//! ([`crate::text::StreamDecoder`]) and passed through the job's
//! [`StopMatcher`]; only text that can no longer turn into a stop string is
//! sent. A stop string, or a closed event channel (the client went away),
//! makes the token callback return `false`, which ends the generation at
//! that token.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use charm_models::ModelError;
use tokio::sync::mpsc;

use super::dashboard::{Board, RequestRecord};
use super::logprobs::{generate_with_logprobs, TokenLogprobs};
use super::metrics::{Finished, Metrics, Outcome};
use super::stop::StopMatcher;
use crate::engine::{Engine, FinishReason, GenStats, GenerateParams, Generation};
use crate::text::TextCodec;

/// One request for the engine.
pub struct Job {
    /// The response id (shown on the dashboard).
    pub id: String,
    /// Which endpoint asked (`chat`, `completions`, `messages`).
    pub api: &'static str,
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Stop strings (the text is cut before the first one found).
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's log-probability and the `n` most
    /// likely alternatives.
    pub logprobs: Option<usize>,
    /// Where the job's events go; closing it cancels the job.
    pub events: mpsc::UnboundedSender<Event>,
    /// When the request arrived.
    pub arrived: Instant,
}

/// A generated token.
#[derive(Clone, Debug)]
pub struct Token {
    pub id: u32,
    /// Present when the job asked for log-probabilities.
    pub logprobs: Option<TokenLogprobs>,
}

/// How a job ended.
#[derive(Clone, Debug)]
pub struct Summary {
    pub finish: FinishReason,
    /// The stop string that ended the text, if one did.
    pub stop_sequence: Option<String>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub stats: GenStats,
}

/// What the engine thread tells a handler.
#[derive(Debug)]
pub enum Event {
    /// New tokens; `text` is what they released (may be empty while text
    /// is held back for an incomplete character or a possible stop string).
    Delta { text: String, tokens: Vec<Token> },
    /// The end; no event follows.
    Done(Box<Summary>),
    /// The engine failed; no event follows. `bad_input`: the request did
    /// not fit the model (400), otherwise an engine error (500).
    Failed { message: String, bad_input: bool },
}

/// The bounded FIFO in front of the engine thread.
pub struct Queue {
    tx: mpsc::Sender<Job>,
    /// Jobs taken by the engine thread and not finished (0 or 1).
    running: Arc<AtomicUsize>,
    /// Places reserved whose job is not in yet.
    reserved: Arc<AtomicUsize>,
    capacity: usize,
}

/// The queue is full.
#[derive(Debug)]
pub struct QueueFull;

/// A place reserved in the queue; dropping it unused gives the place back.
/// It counts against the capacity at once, and as waiting
/// ([`Queue::queued`]) once its job is in.
pub struct Slot {
    permit: Option<mpsc::OwnedPermit<Job>>,
    reserved: Arc<AtomicUsize>,
}

impl Slot {
    /// Puts `job` in the reserved place.
    pub fn send(mut self, job: Job) {
        if let Some(p) = self.permit.take() {
            p.send(job);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.reserved.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Queue {
    /// Starts the engine thread with room for `capacity` waiting jobs.
    pub fn start(
        engine: Engine,
        codec: Arc<TextCodec>,
        capacity: usize,
        metrics: Arc<Metrics>,
        board: Arc<Board>,
    ) -> std::io::Result<Queue> {
        let capacity = capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let running = Arc::new(AtomicUsize::new(0));
        let thread = EngineThread {
            engine,
            codec,
            metrics,
            board,
            running: running.clone(),
        };
        std::thread::Builder::new()
            .name("charm-engine".into())
            .spawn(move || thread.run(rx))?;
        Ok(Queue {
            tx,
            running,
            reserved: Arc::new(AtomicUsize::new(0)),
            capacity,
        })
    }

    /// Reserves a place for a job, or refuses when the queue is full (or
    /// the engine thread is gone).
    pub fn reserve(&self) -> Result<Slot, QueueFull> {
        let permit = self.tx.clone().try_reserve_owned().map_err(|_| QueueFull)?;
        self.reserved.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            permit: Some(permit),
            reserved: self.reserved.clone(),
        })
    }

    /// Jobs waiting (not counting places reserved for jobs still being
    /// tokenized).
    pub fn queued(&self) -> usize {
        (self.tx.max_capacity() - self.tx.capacity()).saturating_sub(self.reserved.load(Ordering::Relaxed))
    }

    /// Jobs being generated.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Room for waiting jobs.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

struct EngineThread {
    engine: Engine,
    codec: Arc<TextCodec>,
    metrics: Arc<Metrics>,
    board: Arc<Board>,
    running: Arc<AtomicUsize>,
}

impl EngineThread {
    fn run(self, mut rx: mpsc::Receiver<Job>) {
        while let Some(job) = rx.blocking_recv() {
            self.running.fetch_add(1, Ordering::Relaxed);
            self.run_job(job);
            self.running.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn run_job(&self, job: Job) {
        let started = Instant::now();
        let queue_s = started.duration_since(job.arrived).as_secs_f64();
        if job.events.is_closed() {
            // The client left while the job waited: nothing to compute.
            self.record(&job, queue_s, None, Outcome::Cancelled, None);
            return;
        }
        self.board.begin(&job.id, job.api, job.prompt.len());
        let mut decoder = self.codec.stream();
        let mut stop = StopMatcher::new(&job.stop);
        let mut first_token: Option<Instant> = None;
        let mut cancelled = false;
        let mut decode_error: Option<String> = None;
        let mut on_token = |id: u32, logprobs: Option<TokenLogprobs>| -> bool {
            first_token.get_or_insert_with(Instant::now);
            self.board.token();
            let piece = match decoder.push(id) {
                Ok(p) => p.unwrap_or_default(),
                Err(e) => {
                    decode_error = Some(e.to_string());
                    return false;
                }
            };
            let release = stop.push(&piece);
            let tokens = vec![Token { id, logprobs }];
            if job
                .events
                .send(Event::Delta {
                    text: release.text,
                    tokens,
                })
                .is_err()
            {
                cancelled = true;
                return false;
            }
            release.stopped.is_none()
        };
        let result: Result<Generation, ModelError> = match job.logprobs {
            Some(top) => generate_with_logprobs(&self.engine, &job.prompt, &job.params, top, |id, lp| {
                on_token(id, Some(lp))
            }),
            None => {
                let mut session = self.engine.session();
                self.engine
                    .generate(&mut session, &job.prompt, &job.params, |id| on_token(id, None))
            }
        };
        let ttft_s = first_token.map(|t| t.duration_since(job.arrived).as_secs_f64());
        let gen = match (result, decode_error) {
            (Err(e), _) => {
                let bad_input = matches!(e, ModelError::BadInput(_));
                let _ = job.events.send(Event::Failed {
                    message: e.to_string(),
                    bad_input,
                });
                self.record(&job, queue_s, ttft_s, Outcome::Error, None);
                return;
            }
            (Ok(_), Some(message)) => {
                let _ = job.events.send(Event::Failed {
                    message,
                    bad_input: false,
                });
                self.record(&job, queue_s, ttft_s, Outcome::Error, None);
                return;
            }
            (Ok(gen), None) => gen,
        };
        if cancelled {
            self.record(&job, queue_s, ttft_s, Outcome::Cancelled, Some(&gen));
            return;
        }
        // Flush what the decoder and the stop matcher held back.
        if stop.hit().is_none() {
            let mut tail = String::new();
            match decoder.finish() {
                Ok(Some(rest)) => {
                    let release = stop.push(&rest);
                    tail.push_str(&release.text);
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = job.events.send(Event::Failed {
                        message: e.to_string(),
                        bad_input: false,
                    });
                    self.record(&job, queue_s, ttft_s, Outcome::Error, Some(&gen));
                    return;
                }
            }
            if stop.hit().is_none() {
                tail.push_str(&stop.finish());
            }
            if !tail.is_empty() {
                let _ = job.events.send(Event::Delta {
                    text: tail,
                    tokens: Vec::new(),
                });
            }
        }
        let stop_sequence = stop.hit().map(str::to_string);
        let finish = if stop_sequence.is_some() {
            FinishReason::Stop
        } else {
            gen.finish_reason
        };
        let summary = Summary {
            finish,
            stop_sequence,
            prompt_tokens: job.prompt.len(),
            completion_tokens: gen.ids.len(),
            stats: gen.stats.clone(),
        };
        let _ = job.events.send(Event::Done(Box::new(summary)));
        let outcome = match finish {
            FinishReason::Stop => Outcome::Stop,
            FinishReason::Length => Outcome::Length,
        };
        self.record(&job, queue_s, ttft_s, outcome, Some(&gen));
    }

    /// Metrics and the dashboard's request history.
    fn record(&self, job: &Job, queue_s: f64, ttft_s: Option<f64>, outcome: Outcome, gen: Option<&Generation>) {
        let duration_s = job.arrived.elapsed().as_secs_f64();
        let stats = gen.map(|g| &g.stats);
        let completion_tokens = gen.map_or(0, |g| g.ids.len());
        self.metrics.finished(&Finished {
            outcome,
            prompt_tokens: job.prompt.len(),
            completion_tokens,
            ttft_s,
            decode_tok_s: stats.filter(|s| s.generated_tokens >= 2).map(|s| s.decode_tok_s),
            queue_s,
            duration_s,
            profile: stats.map(|s| &s.profile),
        });
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.board.end(RequestRecord {
            id: job.id.clone(),
            api: job.api,
            at_ms,
            finish: outcome.label(),
            prompt_tokens: job.prompt.len(),
            completion_tokens,
            max_tokens: job.params.max_tokens,
            queue_ms: queue_s * 1e3,
            ttft_ms: ttft_s.map(|t| t * 1e3),
            total_ms: duration_s * 1e3,
            stats: stats.cloned(),
        });
    }
}
