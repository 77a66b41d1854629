//! The engine thread: continuous batching over the queue.
//!
//! Up to `max_batch` requests run at once. Between steps, jobs leave (done,
//! failed, or their client went away — a cancelled prefill stops at the
//! next step boundary) and waiting jobs join in arrival order. Each step is
//! one [`Engine::forward_batch`] over a piece of every running request:
//! each decoder's last sampled token, and prefill chunks of the prompts
//! still being read, taken oldest first while the step holds at most
//! [`Engine::prefill_chunk`] prompt rows (one chunk, whatever the oldest
//! needs), so a long prompt never stalls the decoders for more than one
//! chunk per token. A request's prompt is cut into chunks from where its
//! cache starts, as [`Engine::generate`] cuts it, and each request samples
//! with its own sampler: its ids are the ones it gets alone, whichever
//! others share its steps ([`Engine::forward_batch`] is row-independent).
//!
//! A joining request first asks the [`PrefixCache`] for the longest
//! computed prefix of its prompt; a request that ends leaves its cache
//! there (and, for a model whose caches cannot be cut back, a copy taken
//! when its prompt was read, so the same prompt or an extension of it is
//! served again).
//!
//! Each sampled id is detokenized ([`crate::text::StreamDecoder`]) and
//! passed through the job's [`StopMatcher`]; only text that can no longer
//! turn into a stop string is sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use charm_models::{ExpertStats, KvCache, ModelError};
use tokio::sync::mpsc;

use super::dashboard::{Board, RequestRecord};
use super::logprobs::logprobs;
use super::metrics::{Finished, Metrics, Outcome};
use super::queue::{Event, Job, Summary, Token};
use super::stop::StopMatcher;
use super::systemone;
use super::think_budget::ThinkBudget;
use crate::engine::{Engine, FinishReason, GenStats, PhaseTimes};
use crate::prefix_cache::{PrefixCache, PrefixStats};
use crate::sampler::Sampler;
use crate::text::{StreamDecoder, TextCodec};

/// What the engine thread shares with the handlers.
pub struct Shared {
    pub codec: Arc<TextCodec>,
    pub metrics: Arc<Metrics>,
    pub board: Arc<Board>,
    /// Requests in the running batch.
    pub running: Arc<AtomicUsize>,
    /// The prefix cache's counters, refreshed after each step that changed them.
    pub prefix: Arc<Mutex<PrefixStats>>,
}

/// One running request.
struct Seq<'c> {
    job: Job,
    queue_s: f64,
    started: Instant,
    cache: KvCache,
    /// Prompt tokens the cache holds.
    fed: usize,
    /// Prompt tokens served from the prefix cache.
    cached: usize,
    sampler: Sampler,
    ids: Vec<u32>,
    /// Logits after the whole prompt, and after everything fed.
    prompt_logits: Option<Vec<f32>>,
    last_logits: Vec<f32>,
    /// The logits a grammar allows (a buffer reused every step).
    masked: Vec<f32>,
    /// The grammar masks the logits (from the first token, or, for a job
    /// whose grammar waits for the reasoning, once the reasoning ended).
    grammar_on: bool,
    decoder: StreamDecoder<'c>,
    stop: StopMatcher,
    first_token: Option<Instant>,
    prefill_done: Option<Instant>,
    decode_error: Option<String>,
    prof: PhaseTimes,
    experts_before: ExpertStats,
    done: Option<FinishReason>,
}

/// The engine thread's state.
pub struct Scheduler<'c> {
    engine: Engine,
    /// The detokenizer the running requests' stream decoders borrow.
    codec: &'c TextCodec,
    shared: Shared,
    max_batch: usize,
    prefix: PrefixCache,
    seqs: Vec<Seq<'c>>,
}

impl<'c> Scheduler<'c> {
    pub fn new(engine: Engine, codec: &'c TextCodec, shared: Shared, max_batch: usize, prefix: PrefixCache) -> Self {
        *lock(&shared.prefix) = prefix.stats();
        Scheduler {
            engine,
            codec,
            shared,
            max_batch: max_batch.max(1),
            prefix,
            seqs: Vec::new(),
        }
    }

    /// Runs until the queue closes and the last request is done.
    pub fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut open = true;
        loop {
            if self.seqs.is_empty() {
                if !open {
                    break;
                }
                match rx.blocking_recv() {
                    Some(job) => self.admit(job),
                    None => break,
                }
            }
            while open && self.seqs.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(job) => self.admit(job),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => open = false,
                }
            }
            self.step();
            self.shared.running.store(self.seqs.len(), Ordering::Relaxed);
        }
        self.prefix.flush();
    }

    /// A job joins the batch (or ends at once: its client left while it
    /// waited, or its whole prompt was served and its first token ends it).
    fn admit(&mut self, job: Job) {
        let started = Instant::now();
        let queue_s = started.duration_since(job.arrived).as_secs_f64();
        if job.events.is_closed() {
            // The client left while the job waited: nothing to compute.
            self.record(&job, queue_s, None, Outcome::Cancelled, None);
            return;
        }
        if job.score.is_some() {
            self.score(job, queue_s);
            return;
        }
        let hit = self.prefix.lookup(&job.prompt);
        *lock(&self.shared.prefix) = self.prefix.stats();
        let (cache, cached, pending) = match hit {
            Some(h) => (h.cache, h.reused, h.logits),
            None => (self.engine.model.new_cache(), 0, None),
        };
        self.shared.board.begin(&job.id, job.api, job.prompt.len(), cached);
        let full = pending.is_some();
        let job_waits = job.grammar_after_reasoning;
        let mut seq = Seq {
            sampler: Sampler::new(job.params.sampling.clone(), &job.prompt),
            stop: StopMatcher::new(&job.stop),
            decoder: if job.keep_special {
                self.codec.stream_keeping_special()
            } else {
                self.codec.stream()
            },
            job,
            queue_s,
            started,
            cache,
            fed: cached,
            cached,
            ids: Vec::new(),
            prompt_logits: pending.clone(),
            last_logits: Vec::new(),
            masked: Vec::new(),
            grammar_on: !job_waits,
            first_token: None,
            prefill_done: full.then_some(started),
            decode_error: None,
            prof: PhaseTimes::default(),
            experts_before: self.engine.expert_stats(),
            done: None,
        };
        // A prompt served whole by the prefix cache samples its first
        // token at once.
        if let Some(logits) = pending {
            sample(&self.engine, &self.shared.board, &mut seq, logits);
        }
        if seq.done.is_some() {
            self.finish(seq);
        } else {
            self.seqs.push(seq);
            self.shared.running.store(self.seqs.len(), Ordering::Relaxed);
        }
    }

    /// One step over every running request.
    fn step(&mut self) {
        // The clients that went away free their places first.
        let mut i = 0;
        while i < self.seqs.len() {
            if self.seqs[i].job.events.is_closed() {
                let s = self.seqs.remove(i);
                let ttft = ttft_s(&s);
                let stats = self.stats(&s);
                self.record(&s.job, s.queue_s, ttft, Outcome::Cancelled, Some((&s.ids, &stats)));
                self.keep(s);
            } else {
                i += 1;
            }
        }
        if self.seqs.is_empty() {
            return;
        }
        let chunk = self.engine.prefill_chunk.max(1);
        // Decoders feed their last id; prompts their next chunk, oldest
        // first, while the step's prompt rows stay within one chunk.
        let mut pieces: Vec<(usize, Vec<u32>)> = Vec::with_capacity(self.seqs.len());
        let mut prompt_rows = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            let n = s.job.prompt.len();
            if s.fed == n {
                pieces.push((i, vec![*s.ids.last().expect("a decoder has sampled")]));
            } else {
                let take = (n - s.fed).min(chunk);
                if prompt_rows == 0 || prompt_rows + take <= chunk {
                    prompt_rows += take;
                    pieces.push((i, s.job.prompt[s.fed..s.fed + take].to_vec()));
                }
            }
        }
        let mut prof = PhaseTimes::default();
        let result = {
            let mut taken: Vec<Option<&mut KvCache>> = self.seqs.iter_mut().map(|s| Some(&mut s.cache)).collect();
            let mut batch: Vec<(&[u32], &mut KvCache)> = pieces
                .iter()
                .map(|(i, p)| (p.as_slice(), taken[*i].take().expect("one piece per request")))
                .collect();
            self.engine.forward_batch(&mut batch, &mut prof)
        };
        let rows = pieces.iter().map(|(_, p)| p.len()).sum();
        self.shared.metrics.step(pieces.len(), rows);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // The step failed for every request in it.
                let bad_input = matches!(e, ModelError::BadInput(_));
                let mut failed: Vec<usize> = pieces.iter().map(|(i, _)| *i).collect();
                failed.sort_unstable();
                for i in failed.into_iter().rev() {
                    let s = self.seqs.remove(i);
                    let _ = s.job.events.send(Event::Failed {
                        message: e.to_string(),
                        bad_input,
                    });
                    let ttft = ttft_s(&s);
                    let stats = self.stats(&s);
                    self.record(&s.job, s.queue_s, ttft, Outcome::Error, Some((&s.ids, &stats)));
                }
                return;
            }
        };
        let share = 1.0 / pieces.len() as f64;
        for ((i, piece), logits) in pieces.iter().zip(logits) {
            let s = &mut self.seqs[*i];
            s.prof.add_scaled(&prof, share);
            if s.fed < s.job.prompt.len() {
                s.fed += piece.len();
                if s.fed < s.job.prompt.len() {
                    continue;
                }
                s.prefill_done = Some(Instant::now());
                s.prompt_logits = Some(logits.clone());
                if !s.cache.rewinds() && self.prefix.enabled() {
                    // A recurrent state cannot be cut back later: keep a
                    // copy at the end of the prompt now.
                    self.prefix.insert(
                        s.job.prompt.clone(),
                        s.cache.clone(),
                        vec![(s.job.prompt.len(), logits.clone())],
                    );
                }
            }
            sample(&self.engine, &self.shared.board, s, logits);
        }
        // The finished leave, in order.
        let mut i = 0;
        while i < self.seqs.len() {
            if self.seqs[i].done.is_some() {
                let s = self.seqs.remove(i);
                self.finish(s);
            } else {
                i += 1;
            }
        }
        *lock(&self.shared.prefix) = self.prefix.stats();
    }

    /// A request is done: the rest of its text, its summary, its records,
    /// and its cache into the prefix cache.
    fn finish(&mut self, mut s: Seq<'_>) {
        let ttft = ttft_s(&s);
        let stats = self.stats(&s);
        if let Some(message) = s.decode_error.take() {
            let _ = s.job.events.send(Event::Failed {
                message,
                bad_input: false,
            });
            self.record(&s.job, s.queue_s, ttft, Outcome::Error, Some((&s.ids, &stats)));
            self.keep(s);
            return;
        }
        if s.job.events.is_closed() {
            self.record(&s.job, s.queue_s, ttft, Outcome::Cancelled, Some((&s.ids, &stats)));
            self.keep(s);
            return;
        }
        // Flush what the decoder and the stop matcher held back.
        if s.stop.hit().is_none() {
            let mut tail = String::new();
            match s.decoder.finish() {
                Ok(Some(rest)) => tail.push_str(&s.stop.push(&rest).text),
                Ok(None) => {}
                Err(e) => {
                    let _ = s.job.events.send(Event::Failed {
                        message: e.to_string(),
                        bad_input: false,
                    });
                    self.record(&s.job, s.queue_s, ttft, Outcome::Error, Some((&s.ids, &stats)));
                    self.keep(s);
                    return;
                }
            }
            if s.stop.hit().is_none() {
                tail.push_str(&s.stop.finish());
            }
            if !tail.is_empty() {
                let _ = s.job.events.send(Event::Delta {
                    text: tail,
                    tokens: Vec::new(),
                });
            }
        }
        let stop_sequence = s.stop.hit().map(str::to_string);
        let finish = if stop_sequence.is_some() {
            FinishReason::Stop
        } else {
            s.done.unwrap_or(FinishReason::Length)
        };
        let _ = s.job.events.send(Event::Done(Box::new(Summary {
            finish,
            stop_sequence,
            prompt_tokens: s.job.prompt.len(),
            completion_tokens: s.ids.len(),
            cached_tokens: s.cached,
            stats: stats.clone(),
        })));
        let outcome = match finish {
            FinishReason::Stop => Outcome::Stop,
            FinishReason::Length => Outcome::Length,
        };
        self.record(&s.job, s.queue_s, ttft, outcome, Some((&s.ids, &stats)));
        self.keep(s);
    }

    /// Leaves a request's cache in the prefix cache: the tokens it has
    /// seen, with the logits after its prompt and after everything.
    fn keep(&mut self, s: Seq<'_>) {
        if !self.prefix.enabled() || s.fed < s.job.prompt.len() {
            // A prefill cut short is not worth keeping half of.
            return;
        }
        let n = s.job.prompt.len();
        let mut tokens = s.job.prompt;
        // The last sampled id was never fed back.
        let fed_ids = s.cache.len() - n;
        tokens.extend_from_slice(&s.ids[..fed_ids]);
        let mut checkpoints = Vec::with_capacity(2);
        if s.cache.rewinds() {
            if let Some(l) = s.prompt_logits {
                checkpoints.push((n, l));
            }
        }
        if tokens.len() > n && !s.last_logits.is_empty() {
            checkpoints.push((tokens.len(), s.last_logits));
        }
        self.prefix.insert(tokens, s.cache, checkpoints);
        *lock(&self.shared.prefix) = self.prefix.stats();
    }

    /// A request's numbers: its share of the steps it ran in, and the
    /// expert store's counters while it ran (shared with whoever ran beside it).
    fn stats(&self, s: &Seq<'_>) -> GenStats {
        let experts = self.engine.expert_stats().since(&s.experts_before);
        let computed = s.job.prompt.len() - s.cached;
        let prefill_s = s
            .prefill_done
            .map_or(0.0, |t| t.duration_since(s.started).as_secs_f64());
        let decode_s = s.prefill_done.map_or(0.0, |t| t.elapsed().as_secs_f64());
        GenStats {
            prompt_tokens: s.job.prompt.len(),
            generated_tokens: s.ids.len(),
            ttft_ms: s
                .first_token
                .map_or(0.0, |t| t.duration_since(s.started).as_secs_f64() * 1e3),
            prefill_tok_s: rate(computed, prefill_s),
            decode_tok_s: rate(s.ids.len().saturating_sub(1), decode_s),
            cached_prompt_tokens: s.cached,
            kv_cache_bytes: s.cache.bytes(),
            prefetch_accuracy: experts.prefetch_accuracy(),
            prefill_expert_bytes_read: None,
            experts,
            profile: s.prof.clone(),
        }
    }

    /// A System One job, at once (between two steps of the batch): its
    /// shared prefix from the prefix cache where it can, the options scored
    /// ([`systemone::score`]), the shared prefix's cache kept for the next
    /// question about the same state.
    fn score(&mut self, mut job: Job, queue_s: f64) {
        let Some(sj) = job.score.take() else { return };
        self.shared.board.begin(&job.id, job.api, job.prompt.len(), 0);
        let before = self.engine.expert_stats();
        let hit = self.prefix.lookup(&job.prompt);
        let (cache, cached) = match hit {
            Some(h) => (h.cache, h.reused),
            None => (self.engine.model.new_cache(), 0),
        };
        let t = Instant::now();
        let result = systemone::score(&self.engine, &job.prompt, cache, &sj).map(|(scores, cache, logits)| {
            let checkpoints = logits.map(|l| vec![(job.prompt.len(), l)]).unwrap_or_default();
            self.prefix.insert(job.prompt.clone(), cache, checkpoints);
            systemone::Scored {
                scores,
                cached_tokens: cached,
            }
        });
        let outcome = match &result {
            Ok(_) if job.events.is_closed() => Outcome::Cancelled,
            Ok(_) => Outcome::Stop,
            Err(_) => Outcome::Error,
        };
        if let Some(reply) = sj.reply {
            let _ = reply.send(result);
        }
        *lock(&self.shared.prefix) = self.prefix.stats();
        let secs = t.elapsed().as_secs_f64();
        let stats = GenStats {
            prompt_tokens: job.prompt.len(),
            cached_prompt_tokens: cached,
            prefill_tok_s: rate(job.prompt.len() - cached, secs),
            experts: self.engine.expert_stats().since(&before),
            ..Default::default()
        };
        self.record(&job, queue_s, None, outcome, Some((&[], &stats)));
    }

    /// Metrics and the dashboard's request history; the expert service
    /// hears that a request it worked for ended (as after
    /// [`Engine::generate`]).
    fn record(&self, job: &Job, queue_s: f64, ttft_s: Option<f64>, outcome: Outcome, ran: Option<(&[u32], &GenStats)>) {
        if ran.is_some() {
            self.engine.expert_service().end_request();
        }
        let duration_s = job.arrived.elapsed().as_secs_f64();
        let stats = ran.map(|(_, s)| s);
        let completion_tokens = ran.map_or(0, |(ids, _)| ids.len());
        self.shared.metrics.finished(&Finished {
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
        self.shared.board.end(RequestRecord {
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

/// Samples the next id from `logits`, sends what it releases and says
/// whether the request is done (as [`Engine::generate`] decides it).
fn sample(engine: &Engine, board: &Board, s: &mut Seq<'_>, logits: Vec<f32>) {
    let cfg = engine.config();
    let t = Instant::now();
    // A spent reasoning budget writes its closing instead of sampling
    // (a grammar already under way takes it as it takes a sampled id). A
    // grammar samples from the logits it allows; the model's own logits
    // are kept (log-probabilities, the prefix cache's checkpoints). A
    // grammar that waits for the reasoning starts with the first token
    // sampled after it.
    let forced = s.job.think_budget.as_mut().and_then(ThinkBudget::forced);
    if !s.grammar_on && forced.is_none() && !s.job.think_budget.as_ref().is_some_and(ThinkBudget::in_reasoning) {
        s.grammar_on = true;
    }
    let constraint = s.job.constraint.as_mut().filter(|_| s.grammar_on);
    let picked = match (forced, constraint) {
        (Some(id), c) => {
            s.sampler.note(id);
            match c {
                Some(c) if !cfg.eos_token_ids.contains(&id) => c.accept(id).map(|()| id),
                _ => Ok(id),
            }
        }
        (None, None) => Ok(s.sampler.sample(&logits)),
        (None, Some(c)) => {
            let allowed = &mut s.masked;
            allowed.clear();
            allowed.extend_from_slice(&logits);
            c.mask(allowed).map(|()| s.sampler.sample(allowed)).and_then(|id| {
                if !cfg.eos_token_ids.contains(&id) {
                    c.accept(id)?;
                }
                Ok(id)
            })
        }
    };
    s.prof.sample_ms += t.elapsed().as_secs_f64() * 1e3;
    let id = match picked {
        Ok(id) => id,
        Err(e) => {
            s.decode_error = Some(e.to_string());
            s.done = Some(FinishReason::Stop);
            return;
        }
    };
    let grammar_done = s.grammar_on && s.job.constraint.as_ref().is_some_and(|c| c.is_done());
    let lp = s.job.logprobs.map(|top| logprobs(&logits, id, top));
    s.last_logits = logits;
    s.first_token.get_or_insert_with(Instant::now);
    s.ids.push(id);
    board.token(&s.job.id);
    // The token that ends the answer adds no text (a decoder that keeps
    // special tokens, for harmony's or Kimi's markers, would print it).
    let ends = !s.job.params.ignore_eos && cfg.eos_token_ids.contains(&id);
    let decoded = if ends { Ok(None) } else { s.decoder.push(id) };
    let keep_going = match decoded {
        Err(e) => {
            s.decode_error = Some(e.to_string());
            false
        }
        Ok(piece) => {
            let piece = piece.unwrap_or_default();
            if let Some(b) = s.job.think_budget.as_mut() {
                b.push(&piece);
            }
            let release = s.stop.push(&piece);
            let sent = s.job.events.send(Event::Delta {
                text: release.text,
                tokens: vec![Token { id, logprobs: lp }],
            });
            sent.is_ok() && release.stopped.is_none()
        }
    };
    // A complete grammar ends the answer after its last token.
    let keep_going = keep_going && !grammar_done;
    if ends || !keep_going {
        s.done = Some(FinishReason::Stop);
    } else if s.ids.len() >= s.job.params.max_tokens || s.cache.len() >= cfg.max_position_embeddings {
        s.done = Some(FinishReason::Length);
    }
}

fn ttft_s(s: &Seq<'_>) -> Option<f64> {
    s.first_token.map(|t| t.duration_since(s.job.arrived).as_secs_f64())
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
