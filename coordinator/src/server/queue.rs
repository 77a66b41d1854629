//! The queue in front of the engine thread.
//!
//! The [`Engine`] is synchronous, so the server owns it on one dedicated
//! thread, the [`Scheduler`], which runs up to `max_batch` jobs at once.
//! HTTP handlers reserve a place in a bounded FIFO ([`Queue::reserve`]; a
//! full queue is a 429) before any work on the request (tokenizing, the
//! chat template), put their [`Job`] in it ([`Slot::send`]) and read
//! [`Event`]s back from the job's own channel. Each job has its own cache
//! and sampler, so concurrent requests never share a token; closing the
//! channel (the client went away) cancels the job at the next step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::logprobs::TokenLogprobs;
use super::scheduler::{Scheduler, Shared};
use super::systemone::ScoreJob;
use super::think_budget::ThinkBudget;
use crate::engine::{Engine, FinishReason, GenStats, GenerateParams};
use crate::grammar::Constraint;
use crate::prefix_cache::PrefixCache;

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
    /// The grammar its answer follows, if any.
    pub constraint: Option<Constraint>,
    /// The cap on its reasoning, if any (also what tells a grammar that
    /// waits for the reasoning when it ended).
    pub think_budget: Option<ThinkBudget>,
    /// The grammar applies once the reasoning the prompt opened has ended
    /// (the model thinks first, then answers in the grammar).
    pub grammar_after_reasoning: bool,
    /// Decode the answer with special tokens kept (a harmony chat answer,
    /// whose channel markers are special tokens).
    pub keep_special: bool,
    /// A System One request: options to score, not text to generate
    /// (`prompt` is then the questions' shared prefix).
    pub score: Option<ScoreJob>,
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
    /// Prompt tokens served from the prefix cache (not computed).
    pub cached_tokens: usize,
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
    /// Jobs in the running batch (at most `max_batch`).
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
    /// Starts the engine thread, running up to `max_batch` jobs at once,
    /// with room for `capacity` waiting jobs. The thread ends once the queue
    /// is dropped and its last job is done.
    pub fn start(
        engine: Engine,
        shared: Shared,
        capacity: usize,
        max_batch: usize,
        prefix: PrefixCache,
    ) -> std::io::Result<(Queue, std::thread::JoinHandle<()>)> {
        let capacity = capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let running = shared.running.clone();
        let thread = std::thread::Builder::new().name("charm-engine".into()).spawn(move || {
            let codec = shared.codec.clone();
            Scheduler::new(engine, &codec, shared, max_batch, prefix).run(rx)
        })?;
        let queue = Queue {
            tx,
            running,
            reserved: Arc::new(AtomicUsize::new(0)),
            capacity,
        };
        Ok((queue, thread))
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
