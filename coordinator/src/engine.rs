//! The engine loop: prefill in chunks, decode one token at a time, sample,
//! stop. It owns the calls to the expert service, layer by layer.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use charm_common::TensorFiles;
use charm_models::{ExpertService, KvCache, Model, ModelConfig, ModelError};
use charm_worker::{InProcessWorker, ResidentStore};
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
}

impl Engine {
    /// `--local`: the model plus one in-process worker holding every expert.
    pub fn local(dir: &Path) -> Result<Self, ModelError> {
        let cfg = ModelConfig::load(dir)?;
        let files = TensorFiles::open(dir)?;
        let store = ResidentStore::open(&files, &cfg)?;
        let model = Model::from_files(cfg, &files)?;
        Ok(Self::new(model, Arc::new(InProcessWorker::new(store))))
    }

    /// A model whose experts are run by `experts`.
    pub fn new(model: Model, experts: Arc<dyn ExpertService>) -> Self {
        Engine {
            model,
            experts,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
        }
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
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        all_logits: bool,
    ) -> Result<Vec<f32>, ModelError> {
        let start = cache.len();
        if start + tokens.len() > self.model.cfg.max_position_embeddings {
            return Err(ModelError::BadInput(format!(
                "{} tokens exceed the model's context of {}",
                start + tokens.len(),
                self.model.cfg.max_position_embeddings
            )));
        }
        let mut st = self.model.begin(tokens, start)?;
        for layer in 0..self.model.cfg.num_layers {
            if let Some(batch) = self.model.pre_experts(layer, &mut st, cache) {
                let out = self.experts.run(&batch)?;
                self.model.post_experts(layer, &mut st, &batch, &out)?;
            }
        }
        let from = if all_logits { 0 } else { st.len() - 1 };
        Ok(self.model.logits(&st, from))
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
        if prompt.is_empty() {
            return Err(ModelError::BadInput("the prompt is empty".into()));
        }
        params.sampling.validate().map_err(ModelError::BadInput)?;
        let cfg = &self.model.cfg;
        let t0 = Instant::now();

        // Reuse the shared prefix; always recompute at least the last prompt token.
        let common = session
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        session.cache.truncate(common);
        session.tokens.truncate(common);

        let mut logits = Vec::new();
        for chunk in prompt[common..].chunks(self.prefill_chunk.max(1)) {
            logits = self.forward(chunk, &mut session.cache, false)?;
            session.tokens.extend_from_slice(chunk);
        }
        let prefill_s = t0.elapsed().as_secs_f64();

        let mut sampler = Sampler::new(params.sampling.clone());
        let mut ids = Vec::new();
        let mut finish = FinishReason::Length;
        let mut ttft_ms = 0.0;
        let t_decode = Instant::now();
        while ids.len() < params.max_tokens {
            let next = sampler.sample(&logits);
            if ids.is_empty() {
                ttft_ms = t0.elapsed().as_secs_f64() * 1e3;
            }
            ids.push(next);
            let keep_going = on_token(next);
            if (!params.ignore_eos && cfg.eos_token_ids.contains(&next)) || !keep_going {
                finish = FinishReason::Stop;
                break;
            }
            if ids.len() == params.max_tokens || session.cache.len() >= cfg.max_position_embeddings
            {
                break;
            }
            logits = self.forward(&[next], &mut session.cache, false)?;
            session.tokens.push(next);
        }
        let decode_s = t_decode.elapsed().as_secs_f64();
        let computed = prompt.len() - common;
        let stats = GenStats {
            prompt_tokens: prompt.len(),
            generated_tokens: ids.len(),
            ttft_ms,
            prefill_tok_s: rate(computed, prefill_s),
            decode_tok_s: rate(ids.len().saturating_sub(1), decode_s),
            cached_prompt_tokens: common,
        };
        Ok(Generation {
            ids,
            finish_reason: finish,
            stats,
        })
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if n == 0 || secs <= 0.0 {
        0.0
    } else {
        n as f64 / secs
    }
}
