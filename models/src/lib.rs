//! charm's model families: configuration, layers, the router, the expert
//! FFN math and the expert seam. No I/O beyond reading weights, no async.
//!
//! # Layout
//! - [`config`]: `config.json` / `generation_config.json` normalized into
//!   [`ModelConfig`], accepting hub and transformers-5 spellings.
//! - [`family`]: the supported architectures and their tensor names; one
//!   file per family ([`olmoe`], [`qwen3_moe`], [`mixtral`], [`qwen2_moe`],
//!   dense [`llama`], the hybrids [`qwen3_next`] and [`qwen3_5_moe`], the
//!   DeepSeek lineage [`deepseek_v3`], [`glm4_moe`], [`glm4_moe_lite`],
//!   [`minimax_m2`], and with sparse attention [`deepseek_v32`]; with
//!   sinks and sliding windows [`gpt_oss`] and [`mimo_v2_flash`]) holds
//!   only what differs.
//! - [`decoder`]: the shared decoder, stepped layer by layer
//!   ([`Model::pre_experts`] → expert service → [`Model::post_experts`]).
//! - [`attention`], [`rope`], [`kv_cache`]: attention with GQA, QK-norm,
//!   biases, sliding windows; rotary embeddings; per-layer KV cache (f32, or
//!   f16 with [`KvDtype::F16`]).
//! - Mixers besides attention: [`gated_delta_net`] (gated DeltaNet over a
//!   [`recurrent_state`]) and [`mla`] (multi-head latent attention in the
//!   absorbed form over a latent cache, [`LayerCache::Latent`]), with
//!   DeepSeek Sparse Attention's [`dsa_indexer`] picking the keys it sees.
//! - [`router`]: top-k routing (softmax, or [`group_router`]'s sigmoid
//!   scores with a selection bias and group limit) and the batch-union.
//! - [`ffn`]: the gated FFN block, the one place for expert / MLP math
//!   (SwiGLU, or gpt-oss's [`clamped_swiglu`] with biases).
//! - [`gguf`]: GGUF files as models: config from metadata, tensors by
//!   Hugging Face name mapped onto llama.cpp's names.
//! - [`sampling_defaults`]: the sampling settings a model file recommends
//!   (`generation_config.json`, GGUF `general.sampling.*`).
//! - [`expert`]: the [`ExpertService`] seam and [`expert::run_group`], the
//!   function every worker calls to compute an expert's outputs.

pub mod attention;
pub mod clamped_swiglu;
pub mod config;
pub mod decoder;
pub mod deepseek_v3;
pub mod deepseek_v32;
pub mod dsa_indexer;
pub mod error;
pub mod expert;
pub mod family;
pub mod ffn;
pub mod gated_delta_net;
pub mod gguf;
pub mod glm4_moe;
pub mod glm4_moe_lite;
pub mod gpt_oss;
pub mod group_router;
pub mod kv_cache;
pub mod llama;
pub mod mimo_v2_flash;
pub mod minimax_m2;
pub mod mixtral;
pub mod mla;
pub mod olmoe;
pub mod qwen2_moe;
pub mod qwen3_5_moe;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod recurrent_state;
pub mod rope;
pub mod router;
pub mod sampling_defaults;

pub use config::{MixerKind, ModelConfig, QkNorm};
pub use decoder::{Model, StepState};
pub use error::{ExpertError, ModelError};
pub use expert::{ExpertService, ExpertStats, WorkerReport};
pub use family::Family;
pub use ffn::{FfnBias, GluAct, SwiGlu};
pub use kv_cache::{KvCache, KvDtype, LayerCache};
pub use sampling_defaults::SamplingDefaults;
