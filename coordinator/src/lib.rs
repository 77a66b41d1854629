//! charm coordinator: runs everything but the routed experts.
//!
//! # Layout
//! - [`engine`]: the engine loop (chunked prefill, KV cache, decode,
//!   stopping) and the calls to the expert service, layer by layer.
//! - [`sampler`]: greedy and seeded temperature / top-k / top-p / min-p
//!   sampling, after the logit bias and repetition penalties.
//! - [`text`]: tokenizer, chat template, streaming detokenizer.
//! - [`gguf_text`]: the tokenizer a GGUF file carries, rebuilt for the
//!   tokenizers crate (the pre-tokenizer names llama.cpp's converter writes).
//! - [`tiktoken`]: a tiktoken vocabulary (Kimi K2's `tiktoken.model`)
//!   rebuilt for the tokenizers crate.
//! - [`token_bytes`]: the bytes each token stands for (`/tokenize`'s
//!   pieces; a token may hold part of a character).
//! - [`grammar`]: constrained decoding (JSON schemas, Lark grammars,
//!   regular expressions) by masking logits with llguidance.
//! - [`load_bar`]: the progress bar while a model opens.
//! - [`chat_template`]: Jinja chat templates rendered like transformers
//!   (`chat_template/namespace_list.rs`: lists a template changes in place).
//! - [`cluster`]: cluster mode: experts on remote workers over QUIC
//!   (sharded fan-out with failover, placement, discovery, `keygen`, `plan`).
//! - [`convert`]: Hugging Face directory → charm container (bf16/int8/int4
//!   experts, one aligned record each), written atomically.
//! - [`server`]: `serve` / `web`: the OpenAI and Anthropic HTTP APIs,
//!   Prometheus metrics and the live dashboard, in front of one engine
//!   thread that steps every running request together (continuous batching).
//! - [`prefix_cache`]: earlier requests' sequence caches under a RAM budget
//!   (and optionally on disk), so a prompt computes only its new tokens.
//! - [`split`]: a container cut into partial copies, one per machine, by
//!   the placement plan.
//! - [`upcycle`]: a dense GGUF model rebuilt as an MoE (the demo model).
//! - [`convert_gguf`]: a `.gguf` file → a container, expert blocks copied
//!   verbatim into one record per expert.
//! - [`cli`]: the `coordinator` command line (`generate`, `chat`, `convert`,
//!   `serve`, `web`).
//!
//! Reading order for a newcomer: `main.rs` → [`cli`] → [`engine::Engine::generate`]
//! → `charm_models::Model::pre_experts` → `charm_worker::InProcessWorker`.

pub mod chat_template;
pub mod cli;
pub mod cluster;
pub mod convert;
pub mod convert_gguf;
pub mod engine;
pub mod gguf_text;
pub mod grammar;
pub mod load_bar;
pub mod prefix_cache;
pub mod sampler;
pub mod server;
pub mod split;
pub mod text;
pub mod tiktoken;
pub mod token_bytes;
pub mod upcycle;

pub use engine::{
    BatchGeneration, Engine, EngineOptions, FinishReason, GenStats, GenerateParams, Generation, LoadInfo, PhaseTimes,
    Session, StepObserver,
};
pub use sampler::{Sampler, SamplingParams};
pub use text::TextCodec;
