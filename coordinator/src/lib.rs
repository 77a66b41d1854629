//! charm coordinator: runs everything but the routed experts.
//!
//! # Layout
//! - [`engine`]: the engine loop (chunked prefill, KV cache, decode,
//!   stopping) and the calls to the expert service, layer by layer.
//! - [`sampler`]: greedy and seeded temperature / top-k / top-p sampling.
//! - [`text`]: tokenizer, chat template, streaming detokenizer.
//! - [`chat_template`]: Jinja chat templates rendered like transformers.
//! - [`convert`]: Hugging Face directory → charm container (bf16/int8/int4
//!   experts, one aligned record each), written atomically.
//! - [`cli`]: the `coordinator` command line (`generate`, `chat`, `convert`).
//!
//! Reading order for a newcomer: `main.rs` → [`cli`] → [`engine::Engine::generate`]
//! → `charm_models::Model::pre_experts` → `charm_worker::InProcessWorker`.

pub mod chat_template;
pub mod cli;
pub mod convert;
pub mod engine;
pub mod sampler;
pub mod text;

pub use engine::{
    Engine, EngineOptions, FinishReason, GenStats, GenerateParams, Generation, LoadInfo, PhaseTimes, Session,
    StepObserver,
};
pub use sampler::{Sampler, SamplingParams};
pub use text::TextCodec;
