//! The engine loop: prefill in chunks, decode one token at a time, sample,
//! stop. It owns the calls to the expert service, layer by layer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use charm_common::container::{is_container, Manifest, Quant};
use charm_common::TensorFiles;
use charm_models::attention::AttentionTimes;
use charm_models::gguf::GgufModel;
use charm_models::{
    ExpertError, ExpertService, ExpertStats, KvCache, KvDtype, Model, ModelConfig, ModelError, StepState,
};
use charm_worker::io::{Backend, ReaderOptions};
use charm_worker::sysmem;
use charm_worker::{DiskStore, InProcessWorker, ResidentStore, StoreOptions};
use serde::Serialize;

use crate::sampler::{Sampler, SamplingParams};

/// Rows per prefill step: bounds activation memory on long prompts.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// A model plus the service that runs its experts.
pub struct Engine {
    pub model: Model,
    experts: Arc<dyn ExpertService>,
    /// Prompt tokens per prefill step.
    pub prefill_chunk: usize,
    /// Send one-layer-ahead expert predictions with each batch.
    pub prefetch: bool,
    /// When the experts run elsewhere (cluster mode), split a step of two
    /// or more sequences into two halves that run at once, so one half's
    /// attention overlaps the other half's expert round trips (at the cost
    /// of the batch-union across the halves). The bits do not change.
    pub pipeline: bool,
    /// Sees every MoE layer step's routing (dashboard, metrics).
    observer: Option<Arc<dyn StepObserver>>,
}

/// Watches the engine work: called on the engine thread, keep it cheap.
pub trait StepObserver: Send + Sync {
    /// One MoE layer step ran: each routed expert with the rows that chose it.
    fn on_experts(&self, layer: u16, experts: &[(u32, u32)]);
}

/// Where a generation's time went, in milliseconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PhaseTimes {
    /// Norms, attention and the KV cache.
    pub attention_ms: f64,
    /// The three parts of `attention_ms` that are not norms and residual
    /// adds: q/k/v (with RoPE and the cache append), the heads (scores,
    /// softmax, weighted values), the output projection.
    pub attention_parts: AttentionTimes,
    /// Router, top-k, shared experts and dense MLP layers.
    pub routing_ms: f64,
    /// Waiting for the expert service (compute, disk, network).
    pub experts_ms: f64,
    /// Combining expert outputs into the residual stream.
    pub combine_ms: f64,
    /// Final norm and LM head.
    pub head_ms: f64,
    /// Sampling.
    pub sample_ms: f64,
}

impl PhaseTimes {
    /// Adds `other`'s times to these.
    pub fn add(&mut self, other: &PhaseTimes) {
        self.add_scaled(other, 1.0);
    }

    /// Adds `share` of `other`'s times to these (a request's part of a
    /// step it shared with others).
    pub fn add_scaled(&mut self, other: &PhaseTimes, share: f64) {
        self.attention_ms += other.attention_ms * share;
        self.attention_parts.qkv_ms += other.attention_parts.qkv_ms * share;
        self.attention_parts.heads_ms += other.attention_parts.heads_ms * share;
        self.attention_parts.o_proj_ms += other.attention_parts.o_proj_ms * share;
        self.routing_ms += other.routing_ms * share;
        self.experts_ms += other.experts_ms * share;
        self.combine_ms += other.combine_ms * share;
        self.head_ms += other.head_ms * share;
        self.sample_ms += other.sample_ms * share;
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced an end-of-sequence id (or the caller stopped it).
    Stop,
    /// `max_tokens` or the model's context length was reached.
    Length,
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep going past end-of-sequence ids.
    pub ignore_eos: bool,
}

/// Timings and counts of one generation; the names are part of the JSON
/// contract of `generate --json`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Prompt tokens served from the session's KV cache (not recomputed).
    pub cached_prompt_tokens: usize,
    /// Bytes the session's KV cache holds at the end (`--kv-cache` type).
    pub kv_cache_bytes: usize,
    /// Expert store counters of this generation.
    #[serde(flatten)]
    pub experts: ExpertStats,
    /// Share of needed experts the one-layer-ahead prediction named.
    pub prefetch_accuracy: f64,
    /// Of `expert_bytes_read`, the bytes read while the prompt was read
    /// (`generate` in-process; `None` in cluster mode, where the workers'
    /// counters arrive when the request ends, and where the engine does
    /// not split them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_expert_bytes_read: Option<u64>,
    /// Where the time went.
    pub profile: PhaseTimes,
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: GenStats,
}

/// One sequence's state across turns: its tokens and their KV cache, so a
/// chat only computes what is new.
pub struct Session {
    cache: KvCache,
    tokens: Vec<u32>,
}

impl Session {
    /// Tokens whose keys and values are cached.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The cache itself (per layer: what each holds).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Bytes the KV cache holds.
    pub fn kv_bytes(&self) -> usize {
        self.cache.bytes()
    }
}

impl Engine {
    /// `--local` with default options: the model plus one in-process worker.
    pub fn local(dir: &Path) -> Result<Self, ModelError> {
        Ok(Self::load(dir, &EngineOptions::default())?.0)
    }

    /// `--local`: the model plus one in-process worker. A Hugging Face
    /// directory keeps every expert memory-mapped; a charm container streams
    /// experts from disk through a RAM cache with the given budget.
    pub fn load(dir: &Path, opts: &EngineOptions) -> Result<(Self, LoadInfo), ModelError> {
        let (mut engine, info) = Self::open(dir, opts)?;
        engine.model.kv_dtype = opts.kv_dtype;
        if engine.model.cfg.vision_ignored {
            tracing::warn!(
                "{}: a vision-language checkpoint: its language model runs; image input is not supported yet",
                dir.display()
            );
        }
        Ok((engine, info))
    }

    fn open(dir: &Path, opts: &EngineOptions) -> Result<(Self, LoadInfo), ModelError> {
        if is_gguf(dir) {
            // A lone GGUF file: dense part and experts mapped from it, blocks as stored.
            let gguf = GgufModel::open(dir)?;
            let store = ResidentStore::open(&gguf, &gguf.cfg)?;
            let model = Model::from_files(gguf.cfg.clone(), &gguf)?;
            let info = LoadInfo::default();
            return Ok((Self::new(model, Arc::new(InProcessWorker::new(store))), info));
        }
        if !is_container(dir) {
            let cfg = ModelConfig::load(dir)?;
            let files = TensorFiles::open(dir)?;
            let store = ResidentStore::open(&files, &cfg)?;
            let model = Model::from_files(cfg, &files)?;
            let info = LoadInfo::default();
            return Ok((Self::new(model, Arc::new(InProcessWorker::new(store))), info));
        }
        let (model, manifest) = load_model(dir)?;
        let manifest = manifest.expect("a container has a manifest");
        let all_experts = manifest.records.iter().map(|r| r.padded_len()).sum::<u64>();
        let (cache_bytes, default_cache) = match opts.expert_cache_bytes {
            Some(b) => (b, false),
            None => (sysmem::default_cache_bytes(manifest.dense_len).min(all_experts), true),
        };
        let history_path = sysmem::state_file(
            dir,
            opts.state_dir.as_deref(),
            "routing-history.json",
            Some(&manifest.fingerprint),
        );
        let store = DiskStore::open(
            dir,
            &manifest,
            &StoreOptions {
                cache_bytes,
                prefetch: opts.prefetch,
                reader: ReaderOptions {
                    direct_io: opts.direct_io,
                    backend: opts.io_backend,
                    ..ReaderOptions::default()
                },
                history_path,
            },
        )?;
        let info = LoadInfo {
            container: true,
            quant: Some(manifest.quant),
            cache_bytes,
            default_cache,
            all_expert_bytes: all_experts,
            backend: Some(store.backend()),
            fingerprint: manifest.fingerprint.clone(),
            warning: store.warning.clone(),
        };
        let mut engine = Self::new(model, Arc::new(InProcessWorker::new(store)));
        engine.prefetch = opts.prefetch;
        Ok((engine, info))
    }

    /// A model whose experts are run by `experts`.
    pub fn new(model: Model, experts: Arc<dyn ExpertService>) -> Self {
        Engine {
            model,
            experts,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            prefetch: false,
            pipeline: false,
            observer: None,
        }
    }

    /// Installs an observer of every MoE layer step.
    pub fn set_observer(&mut self, observer: Arc<dyn StepObserver>) {
        self.observer = Some(observer);
    }

    /// The expert service (to share it, or to ask it for its counters).
    pub fn expert_service(&self) -> &Arc<dyn ExpertService> {
        &self.experts
    }

    /// The expert service's counters since start.
    pub fn expert_stats(&self) -> ExpertStats {
        self.experts.stats()
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }

    /// A fresh session.
    pub fn session(&self) -> Session {
        Session {
            cache: self.model.new_cache(),
            tokens: Vec::new(),
        }
    }

    /// Runs `tokens` through every layer after what `cache` holds and
    /// returns logits for the last row (or every row when `all_logits`).
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, all_logits: bool) -> Result<Vec<f32>, ModelError> {
        self.forward_timed(tokens, cache, all_logits, &mut PhaseTimes::default())
    }

    /// [`Engine::forward`], adding each phase's time to `prof`.
    ///
    /// The layers run on a thread of rayon's compute pool: each parallel
    /// product of the step (about five per layer in decode) then
    /// starts on that thread at once and only wakes the others, instead of
    /// the caller handing every product to the pool and sleeping until it
    /// is done (a wake-up per product, measured as scheduler time in
    /// decode); with in-process experts the pool's other threads poll for
    /// work through the step ([`charm_common::warm`]) instead of falling
    /// asleep between its products. Which thread computes a part never
    /// changes a bit.
    pub fn forward_timed(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        all_logits: bool,
        prof: &mut PhaseTimes,
    ) -> Result<Vec<f32>, ModelError> {
        if self.experts.computes_in_process() {
            charm_common::warm::run_warm(|| self.forward_in_pool(tokens, cache, all_logits, prof))
        } else {
            rayon::scope(|_| self.forward_in_pool(tokens, cache, all_logits, prof))
        }
    }

    fn forward_in_pool(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        all_logits: bool,
        prof: &mut PhaseTimes,
    ) -> Result<Vec<f32>, ModelError> {
        let mut st = self.begin_step(&[(tokens, &*cache)])?;
        self.run_layers(&mut st, &mut [cache], prof)?;
        let t = Instant::now();
        let from = if all_logits { 0 } else { st.len() - 1 };
        let logits = self.model.logits(&st, from);
        prof.head_ms += t.elapsed().as_secs_f64() * 1e3;
        Ok(logits)
    }

    /// One step over several sequences: each `(tokens, cache)` continues
    /// its own cache (a prefill chunk, or one decode token), and every
    /// layer's routed experts run once for the union of all the rows
    /// (in-process or on the workers). Returns each sequence's logits for
    /// its last row, in order. A sequence's bits are the ones it gets alone
    /// ([`Engine::forward`]), whichever others share the step. Adds each
    /// phase's time to `prof`.
    pub fn forward_batch(
        &self,
        seqs: &mut [(&[u32], &mut KvCache)],
        prof: &mut PhaseTimes,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if self.experts.computes_in_process() {
            charm_common::warm::run_warm(|| self.forward_batch_in_pool(seqs, prof))
        } else if self.pipeline && seqs.len() >= 2 {
            self.forward_batch_pipelined(seqs, prof)
        } else {
            rayon::scope(|_| self.forward_batch_in_pool(seqs, prof))
        }
    }

    /// [`Engine::forward_batch`] as two halves on two threads: while one
    /// half waits for its workers, the other computes. Each half's phase
    /// times are added to `prof` (they overlap in wall time).
    fn forward_batch_pipelined(
        &self,
        seqs: &mut [(&[u32], &mut KvCache)],
        prof: &mut PhaseTimes,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let (a, b) = seqs.split_at_mut(seqs.len().div_ceil(2));
        let (mut pa, mut pb) = (PhaseTimes::default(), PhaseTimes::default());
        let (ra, rb) = std::thread::scope(|s| {
            let other = s.spawn(|| rayon::scope(|_| self.forward_batch_in_pool(b, &mut pb)));
            let mine = rayon::scope(|_| self.forward_batch_in_pool(a, &mut pa));
            (mine, other.join())
        });
        prof.add(&pa);
        prof.add(&pb);
        let mut logits = ra?;
        match rb {
            Ok(r) => logits.extend(r?),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        Ok(logits)
    }

    fn forward_batch_in_pool(
        &self,
        seqs: &mut [(&[u32], &mut KvCache)],
        prof: &mut PhaseTimes,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let parts: Vec<(&[u32], &KvCache)> = seqs.iter().map(|(t, c)| (*t, &**c)).collect();
        let mut st = self.begin_step(&parts)?;
        let mut caches: Vec<&mut KvCache> = seqs.iter_mut().map(|(_, c)| &mut **c).collect();
        self.run_layers(&mut st, &mut caches, prof)?;
        let t = Instant::now();
        let last: Vec<usize> = st.seqs().iter().map(|r| r.end - 1).collect();
        let v = self.model.cfg.vocab_size;
        let logits = self
            .model
            .logits_of(&st, &last)
            .chunks_exact(v)
            .map(<[f32]>::to_vec)
            .collect();
        prof.head_ms += t.elapsed().as_secs_f64() * 1e3;
        Ok(logits)
    }

    /// Embeds each `(tokens, cache)`'s rows after what its cache holds,
    /// refusing a sequence that would pass the model's context.
    fn begin_step(&self, parts: &[(&[u32], &KvCache)]) -> Result<StepState, ModelError> {
        let ctx = self.model.cfg.max_position_embeddings;
        let mut starts = Vec::with_capacity(parts.len());
        for (tokens, cache) in parts {
            let start = cache.len();
            if start + tokens.len() > ctx {
                return Err(ModelError::BadInput(format!(
                    "{} tokens exceed the model's context of {ctx}",
                    start + tokens.len()
                )));
            }
            starts.push((*tokens, start));
        }
        self.model.begin_many(&starts)
    }

    /// Every layer of a step: each sequence's attention through its cache,
    /// then the router, the batch-union's experts and their combination
    /// over all rows.
    fn run_layers(
        &self,
        st: &mut StepState,
        caches: &mut [&mut KvCache],
        prof: &mut PhaseTimes,
    ) -> Result<(), ModelError> {
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        for layer in 0..self.model.cfg.num_layers {
            let t = Instant::now();
            self.model
                .attend_many_timed(layer, st, caches, &mut prof.attention_parts);
            prof.attention_ms += ms(t);
            let t = Instant::now();
            let batch = self.model.route(layer, st);
            prof.routing_ms += ms(t);
            if let Some(mut batch) = batch {
                let t = Instant::now();
                if self.prefetch {
                    batch.next = self.model.predict_next(layer, &batch.rows);
                }
                if let Some(obs) = &self.observer {
                    let routed: Vec<(u32, u32)> =
                        batch.groups.iter().map(|g| (g.expert, g.rows.len() as u32)).collect();
                    obs.on_experts(layer as u16, &routed);
                }
                prof.routing_ms += ms(t);
                let t = Instant::now();
                let out = self.experts.run(&batch)?;
                prof.experts_ms += ms(t);
                let t = Instant::now();
                self.model.post_experts(layer, st, &batch, &out)?;
                prof.combine_ms += ms(t);
            }
        }
        Ok(())
    }

    /// Logits at every position of `tokens` from an empty cache, prefilled in
    /// chunks (teacher forcing).
    pub fn logits_all(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut cache = self.model.new_cache();
        let mut out = Vec::with_capacity(tokens.len() * self.model.cfg.vocab_size);
        for chunk in tokens.chunks(self.prefill_chunk.max(1)) {
            out.extend(self.forward(chunk, &mut cache, true)?);
        }
        Ok(out)
    }

    /// Generates after `prompt` in `session`, reusing the longest cached
    /// prefix. `on_token` sees every new id as it is produced and may
    /// return `false` to stop early.
    pub fn generate(
        &self,
        session: &mut Session,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, ModelError> {
        self.generate_observed(session, prompt, params, |id, _| on_token(id))
    }

    /// [`Engine::generate`], also handing `on_token` the logits each id was
    /// sampled from (for log-probabilities).
    pub fn generate_observed(
        &self,
        session: &mut Session,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: impl FnMut(u32, &[f32]) -> bool,
    ) -> Result<Generation, ModelError> {
        self.generate_steered(session, prompt, params, || None, on_token)
    }

    /// [`Engine::generate_observed`] where `force` may name the next id
    /// instead of the sampler (a reasoning budget writing the end of the
    /// reasoning); a forced id counts for the penalties as a sampled one.
    pub fn generate_steered(
        &self,
        session: &mut Session,
        prompt: &[u32],
        params: &GenerateParams,
        mut force: impl FnMut() -> Option<u32>,
        mut on_token: impl FnMut(u32, &[f32]) -> bool,
    ) -> Result<Generation, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::BadInput("the prompt is empty".into()));
        }
        params.sampling.validate().map_err(ModelError::BadInput)?;
        let cfg = &self.model.cfg;
        let t0 = Instant::now();
        let before = self.experts.stats();

        // Reuse the shared prefix; always recompute at least the last prompt
        // token. A recurrent layer's state cannot be cut back: a prefix
        // shorter than what it has seen starts the sequence over.
        let common = session
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        let common = session.cache.truncate(common);
        session.tokens.truncate(common);

        let mut prof = PhaseTimes::default();
        let mut logits = Vec::new();
        for chunk in prompt[common..].chunks(self.prefill_chunk.max(1)) {
            logits = self.forward_timed(chunk, &mut session.cache, false, &mut prof)?;
            session.tokens.extend_from_slice(chunk);
        }
        let prefill_s = t0.elapsed().as_secs_f64();
        let prefill_bytes = self.experts.stats().since(&before).expert_bytes_read;

        let mut sampler = Sampler::new(params.sampling.clone(), prompt);
        let mut ids = Vec::new();
        let mut finish = FinishReason::Length;
        let mut ttft_ms = 0.0;
        let t_decode = Instant::now();
        while ids.len() < params.max_tokens {
            let t = Instant::now();
            let next = match force() {
                Some(id) => {
                    sampler.note(id);
                    id
                }
                None => sampler.sample(&logits),
            };
            prof.sample_ms += t.elapsed().as_secs_f64() * 1e3;
            if ids.is_empty() {
                ttft_ms = t0.elapsed().as_secs_f64() * 1e3;
            }
            ids.push(next);
            let keep_going = on_token(next, &logits);
            if (!params.ignore_eos && cfg.eos_token_ids.contains(&next)) || !keep_going {
                finish = FinishReason::Stop;
                break;
            }
            if ids.len() == params.max_tokens || session.cache.len() >= cfg.max_position_embeddings {
                break;
            }
            logits = self.forward_timed(&[next], &mut session.cache, false, &mut prof)?;
            session.tokens.push(next);
        }
        let decode_s = t_decode.elapsed().as_secs_f64();
        self.experts.end_request();
        let experts = self.experts.stats().since(&before);
        let computed = prompt.len() - common;
        let stats = GenStats {
            prompt_tokens: prompt.len(),
            generated_tokens: ids.len(),
            ttft_ms,
            prefill_tok_s: rate(computed, prefill_s),
            decode_tok_s: rate(ids.len().saturating_sub(1), decode_s),
            cached_prompt_tokens: common,
            kv_cache_bytes: session.cache.bytes(),
            prefetch_accuracy: experts.prefetch_accuracy(),
            prefill_expert_bytes_read: self.experts.computes_in_process().then_some(prefill_bytes),
            experts,
            profile: prof,
        };
        Ok(Generation {
            ids,
            finish_reason: finish,
            stats,
        })
    }
}

/// What [`Engine::generate_batch`] produced: each sequence's ids and why it
/// ended, and the counts and timings of the whole batch.
#[derive(Clone, Debug)]
pub struct BatchGeneration {
    /// Per sequence, in the order of the prompts.
    pub sequences: Vec<(Vec<u32>, FinishReason)>,
    /// Prompt tokens of every sequence; generated ones in `generated_tokens`.
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Steps the batch took (each one pass through the layers).
    pub steps: usize,
    /// Wall time of the whole batch.
    pub wall_ms: f64,
    /// Generated tokens of every sequence per second of wall time.
    pub tok_s: f64,
    /// Expert store counters of the batch (bytes read from disk, hits…).
    pub experts: ExpertStats,
    pub profile: PhaseTimes,
}

impl Engine {
    /// Generates after each of `prompts` at once: every step holds one
    /// piece of each unfinished sequence (its next prefill chunk of
    /// [`Engine::prefill_chunk`] tokens, or its last sampled token), so one
    /// sequence's prefill runs beside others' decoding, and each layer's
    /// routed experts are read and run once for the union of all the rows.
    /// Each sequence samples with its own [`Sampler`] from `params`, and its
    /// ids are the ones [`Engine::generate`] gives it alone.
    pub fn generate_batch(&self, prompts: &[Vec<u32>], params: &GenerateParams) -> Result<BatchGeneration, ModelError> {
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(ModelError::BadInput("every prompt of the batch needs a token".into()));
        }
        params.sampling.validate().map_err(ModelError::BadInput)?;
        let cfg = &self.model.cfg;
        let t0 = Instant::now();
        let before = self.experts.stats();
        let chunk = self.prefill_chunk.max(1);
        struct Seq {
            cache: KvCache,
            sampler: Sampler,
            /// Prompt tokens not yet run.
            fed: usize,
            ids: Vec<u32>,
            done: Option<FinishReason>,
        }
        let mut seqs: Vec<Seq> = prompts
            .iter()
            .map(|prompt| Seq {
                cache: self.model.new_cache(),
                sampler: Sampler::new(params.sampling.clone(), prompt),
                fed: 0,
                ids: Vec::new(),
                done: (params.max_tokens == 0).then_some(FinishReason::Length),
            })
            .collect();
        let (mut prof, mut steps) = (PhaseTimes::default(), 0);
        while seqs.iter().any(|s| s.done.is_none()) {
            // Each unfinished sequence's piece of this step.
            let pieces: Vec<(usize, Vec<u32>)> = seqs
                .iter()
                .enumerate()
                .filter(|(_, s)| s.done.is_none())
                .map(|(i, s)| match prompts[i].len() - s.fed {
                    0 => (i, vec![*s.ids.last().expect("a sequence past its prompt has sampled")]),
                    left => (i, prompts[i][s.fed..s.fed + left.min(chunk)].to_vec()),
                })
                .collect();
            let mut batch: Vec<(&[u32], &mut KvCache)> = seqs
                .iter_mut()
                .filter(|s| s.done.is_none())
                .zip(&pieces)
                .map(|(s, (_, piece))| (piece.as_slice(), &mut s.cache))
                .collect();
            let logits = self.forward_batch(&mut batch, &mut prof)?;
            steps += 1;
            for ((i, piece), logits) in pieces.iter().zip(logits) {
                let s = &mut seqs[*i];
                if s.fed < prompts[*i].len() {
                    s.fed += piece.len();
                    if s.fed < prompts[*i].len() {
                        continue;
                    }
                }
                let t = Instant::now();
                let next = s.sampler.sample(&logits);
                prof.sample_ms += t.elapsed().as_secs_f64() * 1e3;
                s.ids.push(next);
                if !params.ignore_eos && cfg.eos_token_ids.contains(&next) {
                    s.done = Some(FinishReason::Stop);
                } else if s.ids.len() >= params.max_tokens || s.cache.len() >= cfg.max_position_embeddings {
                    s.done = Some(FinishReason::Length);
                }
            }
        }
        self.experts.end_request();
        let wall_s = t0.elapsed().as_secs_f64();
        let generated = seqs.iter().map(|s| s.ids.len()).sum();
        Ok(BatchGeneration {
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            generated_tokens: generated,
            steps,
            wall_ms: wall_s * 1e3,
            tok_s: rate(generated, wall_s),
            experts: self.experts.stats().since(&before),
            profile: prof,
            sequences: seqs
                .into_iter()
                .map(|s| (s.ids, s.done.unwrap_or(FinishReason::Length)))
                .collect(),
        })
    }
}

/// Whether `path` is a GGUF file (by its magic bytes).
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == b"GGUF"
}

/// How to load a model for `--local`.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// RAM budget for cached experts (`None`: free memory after the dense part).
    pub expert_cache_bytes: Option<u64>,
    /// One-layer-ahead expert prefetch.
    pub prefetch: bool,
    /// Bypass the page cache for expert reads.
    pub direct_io: bool,
    /// Force a disk reader backend (`None`: io_uring when available).
    pub io_backend: Option<Backend>,
    /// Where routing history is kept (`None`: `<model>/state`, else the
    /// user's state directory).
    pub state_dir: Option<PathBuf>,
    /// What the KV cache stores keys and values in.
    pub kv_dtype: KvDtype,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            expert_cache_bytes: None,
            prefetch: true,
            direct_io: false,
            io_backend: None,
            state_dir: None,
            kv_dtype: KvDtype::F32,
        }
    }
}

/// What loading decided, for the start-up line.
#[derive(Clone, Debug, Default)]
pub struct LoadInfo {
    /// A charm container (experts streamed) rather than a Hugging Face dir.
    pub container: bool,
    pub quant: Option<Quant>,
    /// Expert cache budget in bytes.
    pub cache_bytes: u64,
    /// Whether the budget was chosen from free memory.
    pub default_cache: bool,
    /// Bytes of all expert records.
    pub all_expert_bytes: u64,
    pub backend: Option<Backend>,
    pub fingerprint: String,
    /// Something the user should know (e.g. a routing history from another
    /// model was ignored).
    pub warning: Option<String>,
}

fn rate(n: usize, secs: f64) -> f64 {
    if n == 0 || secs <= 0.0 {
        0.0
    } else {
        n as f64 / secs
    }
}

/// Everything but the routed experts of the model in `dir` (a Hugging Face
/// directory or a charm container), for an engine whose experts run
/// elsewhere (cluster mode), and the container's manifest when it is one.
pub fn load_model(dir: &Path) -> Result<(Model, Option<Manifest>), ModelError> {
    if is_gguf(dir) {
        let gguf = GgufModel::open(dir)?;
        return Ok((Model::from_files(gguf.cfg.clone(), &gguf)?, None));
    }
    if !is_container(dir) {
        let cfg = ModelConfig::load(dir)?;
        let files = TensorFiles::open(dir)?;
        return Ok((Model::from_files(cfg, &files)?, None));
    }
    let manifest = Manifest::open(dir).map_err(ExpertError::from)?;
    let dense = dir.join(&manifest.dense_file);
    if is_gguf(&dense) {
        // A container converted from GGUF: config, tokenizer and dense blocks in dense.gguf.
        let gguf = GgufModel::open(&dense)?;
        return Ok((Model::from_files(gguf.cfg.clone(), &gguf)?, Some(manifest)));
    }
    let cfg = ModelConfig::load(dir)?;
    let files = TensorFiles::open_file(&dense)?;
    Ok((Model::from_files(cfg, &files)?, Some(manifest)))
}
