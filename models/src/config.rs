//! A model's `config.json` (and `generation_config.json`), normalized.
//!
//! Hub files and transformers 5 spell several keys differently
//! (`rope_theta` / `rope_parameters.rope_theta`, `torch_dtype` / `dtype`,
//! `num_experts` / `num_local_experts`); [`RawConfig`] looks a key up under
//! each of its spellings so family parsers never care.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::ModelError;
use crate::family::Family;
use crate::ffn::GluAct;

/// How queries and keys are normalized before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// No QK-norm (Mixtral, Qwen2-MoE).
    None,
    /// RMS norm over the whole projection, `[heads * head_dim]` (OLMoE).
    Full,
    /// RMS norm per head, `[head_dim]` (Qwen3-MoE).
    PerHead,
}

/// A layer's token mixer kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    /// Softmax attention over a KV cache (full, sliding or gated).
    Attention,
    /// Gated DeltaNet linear attention over a recurrent state.
    GatedDeltaNet,
    /// Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash) over a
    /// cache of compressed latents and rope keys.
    Mla,
}

/// The shape of a model's multi-head latent attention (DeepSeek's config keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaShape {
    /// `q_lora_rank`: queries through a low-rank `q_a_proj` / `q_b_proj`
    /// pair; `None` for the plain `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`: width of the cached latent.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`: per-head query/key dimensions without position.
    pub qk_nope_head_dim: usize,
    /// `qk_rope_head_dim`: the rotary part, one key shared by every head.
    pub qk_rope_head_dim: usize,
    /// `v_head_dim`.
    pub v_head_dim: usize,
}

impl MlaShape {
    /// `qk_head_dim = qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Values cached per position: the latent and the rope key.
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    fn validate(&self) -> Result<(), String> {
        if self.kv_lora_rank == 0 || self.qk_nope_head_dim == 0 || self.v_head_dim == 0 || self.q_lora_rank == Some(0) {
            return Err("kv_lora_rank, qk_nope_head_dim, v_head_dim and q_lora_rank must be positive".into());
        }
        if self.qk_rope_head_dim == 0 || !self.qk_rope_head_dim.is_multiple_of(2) {
            return Err(format!(
                "qk_rope_head_dim {} must be even and positive",
                self.qk_rope_head_dim
            ));
        }
        Ok(())
    }
}

/// The DeepSeek lineage's router settings ([`crate::group_router`]); the
/// correction bias is a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupRouting {
    /// `n_group` (1: no group limit).
    pub groups: usize,
    /// `topk_group`.
    pub topk_groups: usize,
    /// `routed_scaling_factor`.
    pub scale: f32,
    /// The router has an `e_score_correction_bias`.
    pub bias: bool,
}

/// DeepSeek Sparse Attention's indexer (`DeepseekV32Indexer`): `index_n_heads`
/// heads of `index_head_dim` score every earlier key, and attention keeps
/// the `index_topk` best.
#[derive(Clone, Debug, PartialEq)]
pub struct Dsa {
    /// `index_n_heads`.
    pub heads: usize,
    /// `index_head_dim` (its first `qk_rope_head_dim` dims are roped).
    pub head_dim: usize,
    /// `index_topk`: keys each query attends to.
    pub topk: usize,
    /// Per layer: reuses the previous indexer layer's selection (GLM-5's
    /// `indexer_types` `"shared"`) instead of running an indexer.
    pub shared: Vec<bool>,
    /// The indexer's RoPE takes interleaved pairs (GLM-5) rather than halves
    /// (DeepSeek-V3.2).
    pub rope_interleave: bool,
}

impl Dsa {
    fn validate(&self, c: &ModelConfig) -> Result<(), String> {
        let rope = c.mla.map_or(0, |m| m.qk_rope_head_dim);
        if c.mla.and_then(|m| m.q_lora_rank).is_none() {
            return Err("the sparse-attention indexer needs q_lora_rank (it reads the queries' latent)".into());
        }
        if self.heads == 0 || self.topk == 0 || self.head_dim < rope || !rope.is_multiple_of(2) {
            return Err(format!(
                "index_n_heads {}, index_head_dim {} (at least qk_rope_head_dim {rope}) and index_topk {} must be positive",
                self.heads, self.head_dim, self.topk
            ));
        }
        if self.shared.len() != c.num_layers || self.shared.first() == Some(&true) {
            return Err(format!(
                "indexer_types has {} entries for {} layers (the first must be \"full\")",
                self.shared.len(),
                c.num_layers
            ));
        }
        Ok(())
    }

    /// The layer whose selection `layer` reuses: itself, or the last
    /// layer before it that runs an indexer.
    pub fn source(&self, layer: usize) -> usize {
        (0..=layer).rev().find(|&l| !self.shared[l]).unwrap_or(0)
    }
}

/// YaRN rope scaling (`rope_type: yarn`), as transformers'
/// `_compute_yarn_parameters` reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// `attention_factor`, explicit or from `mscale` / `mscale_all_dim`.
    pub attention_factor: f64,
    /// `mscale_all_dim` (0 when absent): MLA's softmax scale is multiplied
    /// by `yarn_get_mscale(factor, mscale_all_dim) ** 2`.
    pub mscale_all_dim: f64,
    /// `truncate` (default true): floor / ceil the correction range.
    pub truncate: bool,
}

impl Yarn {
    /// `yarn_get_mscale(scale, mscale)`: `0.1 * mscale * log(scale) + 1`, 1 below scale 1.
    pub fn get_mscale(scale: f64, mscale: f64) -> f64 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * mscale * scale.ln() + 1.0
        }
    }
}

/// Everything the decoder needs to know, whatever the family.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    /// Linear RoPE scaling factor (positions divided by it); 1.0 = none.
    pub rope_linear_factor: f32,
    /// YaRN rope scaling, when configured.
    pub rope_yarn: Option<Yarn>,
    /// Each head's rotary dimensions come in interleaved pairs
    /// `(x0, x1), (x2, x3), …` (DeepSeek's `rope_interleave`) rather than
    /// as halves; they are reordered to halves before RoPE.
    pub rope_interleave: bool,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub qk_norm: QkNorm,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// OLMoE's optional clamp of q, k, v.
    pub clip_qkv: Option<f32>,
    /// Per-layer sliding attention window (`None` = full causal).
    pub sliding_window: Vec<Option<usize>>,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Renormalize the chosen experts' weights to sum to 1.
    pub norm_topk_prob: bool,
    /// Intermediate width of a routed expert.
    pub moe_intermediate_size: usize,
    /// Intermediate width of a dense MLP layer.
    pub intermediate_size: usize,
    /// Intermediate width of the shared expert (Qwen2-MoE), if any.
    pub shared_expert_intermediate_size: Option<usize>,
    /// The shared expert is Qwen's `mlp.shared_expert` behind a sigmoid
    /// `shared_expert_gate` (true), or DeepSeek's ungated
    /// `mlp.shared_experts` (false).
    pub shared_expert_gated: bool,
    /// The sigmoid group router of the DeepSeek lineage; `None` routes by
    /// softmax.
    pub group_routing: Option<GroupRouting>,
    /// Which layers are MoE (the others run a dense MLP).
    pub moe_layers: Vec<bool>,
    /// End-of-sequence ids from config.json and generation_config.json.
    pub eos_token_ids: Vec<u32>,
    /// `bos_token_id`, when the config names one.
    pub bos_token_id: Option<u32>,
    /// The sampling settings the model's authors recommend
    /// (`generation_config.json`); the API's defaults for omitted fields.
    pub sampling: crate::SamplingDefaults,
    /// q/k projection rows are stored with each head's rotary pairs
    /// interleaved (llama.cpp's `llama` GGUF layout) rather than as halves;
    /// attention reorders the projected q and k before RoPE.
    pub qk_rows_interleaved: bool,
    /// Each layer's token mixer (from `layer_types`).
    pub mixers: Vec<MixerKind>,
    /// The gated DeltaNet layers' shape, when the model has any.
    pub delta_net: Option<crate::gated_delta_net::DeltaNetShape>,
    /// The latent attention layers' shape, when the model has any.
    pub mla: Option<MlaShape>,
    /// DeepSeek Sparse Attention: the indexer that picks which keys each
    /// query of a latent attention layer sees.
    pub dsa: Option<Dsa>,
    /// Leading dimensions of each head that RoPE rotates
    /// (`head_dim * partial_rotary_factor`; `head_dim` for most families).
    pub rotary_dim: usize,
    /// `q_proj` also yields a per-head output gate: `[q | gate]` per head,
    /// and attention's output is multiplied by `sigmoid(gate)`.
    pub attn_output_gate: bool,
    /// RMSNorm weights are zero-centred: the norm multiplies by `1 + w`
    /// (the decoder's, the final and the q/k norms); folded in at load.
    pub zero_centred_norms: bool,
    /// The config is a vision-language wrapper's: only its language model
    /// runs (image input is not supported).
    pub vision_ignored: bool,
    /// Per layer: attention has a learned sink logit per head
    /// (`self_attn.sinks`), an extra softmax entry that takes weight from
    /// every key and adds nothing (gpt-oss; MiMo-V2-Flash's sliding layers).
    pub attn_sinks: Vec<bool>,
    /// `o_proj` carries a bias (gpt-oss's `attention_bias`).
    pub o_proj_bias: bool,
    /// The router's logits carry a bias (`mlp.router.bias`).
    pub router_bias: bool,
    /// The router takes the top-k logits first and softmaxes only those
    /// (gpt-oss) instead of a softmax over every expert.
    pub router_softmax_after_topk: bool,
    /// How routed experts gate ([`GluAct`]).
    pub expert_act: GluAct,
    /// Routed experts' projections carry biases.
    pub expert_bias: bool,
    /// Width of a value head when it differs from `head_dim`
    /// (MiMo-V2-Flash's `v_head_dim`).
    pub v_head_dim: Option<usize>,
    /// A factor on every attention value (`attention_value_scale`).
    pub value_scale: Option<f32>,
    /// Sliding-window layers' own KV head count and rope theta, when they
    /// differ from the full layers' (MiMo-V2-Flash).
    pub swa: Option<SwaShape>,
}

/// What MiMo-V2-Flash's sliding-window layers do differently.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwaShape {
    /// KV heads of a sliding layer.
    pub kv_heads: usize,
    /// Rope theta of a sliding layer.
    pub rope_theta: f32,
}

impl ModelConfig {
    /// Reads `dir/config.json` and, when present, `dir/generation_config.json`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let raw = RawConfig::read(&dir.join("config.json"))?;
        let mut cfg = Family::from_config(&raw)?.parse(&raw)?;
        let gen_path = dir.join("generation_config.json");
        if gen_path.exists() {
            let gen = RawConfig::read(&gen_path)?;
            cfg.eos_token_ids.extend(gen.id_list("eos_token_id")?);
            if cfg.bos_token_id.is_none() {
                cfg.bos_token_id = gen.id_list("bos_token_id")?.first().copied();
            }
            cfg.sampling = crate::SamplingDefaults::from_generation_config(&gen)?;
        }
        let set: BTreeSet<u32> = cfg.eos_token_ids.iter().copied().collect();
        cfg.eos_token_ids = set.into_iter().collect();
        cfg.check(&raw)?;
        Ok(cfg)
    }

    /// Width of the query projection output.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the key / value projection outputs.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// KV heads of `layer` (sliding layers may have their own count).
    pub fn kv_heads(&self, layer: usize) -> usize {
        match (self.sliding_window[layer], self.swa) {
            (Some(_), Some(s)) => s.kv_heads,
            _ => self.num_kv_heads,
        }
    }

    /// Width of a value head.
    pub fn v_head_dim(&self) -> usize {
        self.v_head_dim.unwrap_or(self.head_dim)
    }

    /// Whether `layer` routes to experts (otherwise it runs a dense MLP).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe_layers[layer]
    }

    fn check(&self, raw: &RawConfig) -> Result<(), ModelError> {
        self.validate().map_err(|reason| raw.err(reason))
    }

    /// Checks the shape parameters fit together; the message names the keys.
    pub fn validate(&self) -> Result<(), String> {
        if self.hidden_size == 0 || self.num_layers == 0 || self.vocab_size == 0 || self.head_dim == 0 {
            return Err("hidden_size, num_hidden_layers, vocab_size and head_dim must be positive".into());
        }
        if let Some(s) = self.swa {
            if s.kv_heads == 0 || !self.num_heads.is_multiple_of(s.kv_heads) {
                return Err(format!(
                    "num_attention_heads ({}) must be a positive multiple of the sliding layers' KV heads ({})",
                    self.num_heads, s.kv_heads
                ));
            }
        }
        if self.v_head_dim == Some(0) {
            return Err("v_head_dim must be positive".into());
        }
        if self.num_heads == 0 || self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.moe_layers.iter().any(|&m| m) && (self.top_k == 0 || self.top_k > self.num_experts) {
            return Err(format!(
                "num_experts_per_tok ({}) must be between 1 and the number of experts ({})",
                self.top_k, self.num_experts
            ));
        }
        if self.moe_layers.len() != self.num_layers
            || self.sliding_window.len() != self.num_layers
            || self.mixers.len() != self.num_layers
            || self.attn_sinks.len() != self.num_layers
        {
            return Err("per-layer settings do not cover every layer".into());
        }
        if self.rotary_dim == 0 || self.rotary_dim > self.head_dim || !self.rotary_dim.is_multiple_of(2) {
            return Err(format!(
                "the rotary dimension {} (head_dim × partial_rotary_factor) must be even and between 2 and head_dim {}",
                self.rotary_dim, self.head_dim
            ));
        }
        if self.mixers.contains(&MixerKind::Mla) {
            match &self.mla {
                Some(m) => m.validate()?,
                None => return Err("latent attention layers need kv_lora_rank and the qk_*_head_dim keys".into()),
            }
        }
        if let Some(d) = &self.dsa {
            d.validate(self)?;
        }
        if let Some(g) = &self.group_routing {
            if g.groups == 0 || (self.num_experts > 0 && !self.num_experts.is_multiple_of(g.groups)) {
                return Err(format!(
                    "n_group ({}) must divide the {} experts",
                    g.groups, self.num_experts
                ));
            }
            if g.topk_groups == 0 || g.topk_groups > g.groups {
                return Err(format!(
                    "topk_group ({}) must be between 1 and n_group ({})",
                    g.topk_groups, g.groups
                ));
            }
            if self.top_k > g.topk_groups * (self.num_experts / g.groups) {
                return Err(format!(
                    "num_experts_per_tok ({}) exceeds the experts of topk_group ({}) groups",
                    self.top_k, g.topk_groups
                ));
            }
        }
        if self.mixers.contains(&MixerKind::GatedDeltaNet) {
            match &self.delta_net {
                Some(d) => d.validate()?,
                None => return Err("linear_attention layers need the linear_* keys".into()),
            }
        }
        Ok(())
    }
}

/// A norm weight of `len` from `files`, with the `1 + w` of zero-centred
/// norms folded in (`output * (1.0 + self.weight.float())`).
pub fn norm_weight(
    files: &dyn charm_common::WeightSource,
    cfg: &ModelConfig,
    name: &str,
    len: usize,
) -> Result<Vec<f32>, charm_common::LoadError> {
    let mut w = files.vector(name, len)?;
    if cfg.zero_centred_norms {
        w.iter_mut().for_each(|x| *x += 1.0);
    }
    Ok(w)
}

/// A parsed JSON config with its path, for key lookups with clear errors.
pub struct RawConfig {
    pub path: PathBuf,
    pub value: Value,
}

impl RawConfig {
    /// Reads and parses a JSON object.
    pub fn read(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            reason: format!("cannot read: {e}"),
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            reason: format!("not valid JSON: {e}"),
        })?;
        if !value.is_object() {
            return Err(ModelError::Config {
                path: path.to_path_buf(),
                reason: "not a JSON object".into(),
            });
        }
        Ok(RawConfig {
            path: path.to_path_buf(),
            value,
        })
    }

    /// A config error at this file.
    pub fn err(&self, reason: String) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            reason,
        }
    }

    /// The first present, non-null value among `keys`. A key may be a dotted
    /// path (`rope_parameters.rope_theta`).
    pub fn lookup(&self, keys: &[&str]) -> Option<&Value> {
        keys.iter().find_map(|k| {
            let mut v = &self.value;
            for part in k.split('.') {
                v = v.get(part)?;
            }
            (!v.is_null()).then_some(v)
        })
    }

    /// A required non-negative integer.
    pub fn usize(&self, keys: &[&str]) -> Result<usize, ModelError> {
        self.usize_opt(keys)?
            .ok_or_else(|| self.err(format!("missing key {}", keys.join(" / "))))
    }

    /// An optional non-negative integer.
    pub fn usize_opt(&self, keys: &[&str]) -> Result<Option<usize>, ModelError> {
        match self.lookup(keys) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(format!("{} must be a non-negative integer, got {v}", keys[0]))),
        }
    }

    /// An optional number.
    pub fn f64_opt(&self, keys: &[&str]) -> Result<Option<f64>, ModelError> {
        match self.lookup(keys) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(format!("{} must be a number, got {v}", keys[0]))),
        }
    }

    /// An optional boolean.
    pub fn bool_opt(&self, keys: &[&str]) -> Result<Option<bool>, ModelError> {
        match self.lookup(keys) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("{} must be true or false, got {v}", keys[0]))),
        }
    }

    /// An optional string.
    pub fn str_opt(&self, keys: &[&str]) -> Option<&str> {
        self.lookup(keys).and_then(Value::as_str)
    }

    /// A token id or a list of them (`eos_token_id` is spelled both ways).
    pub fn id_list(&self, key: &str) -> Result<Vec<u32>, ModelError> {
        let bad = || self.err(format!("{key} must be a token id or a list of token ids"));
        match self.lookup(&[key]) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a.iter().map(|v| v.as_u64().map(|n| n as u32).ok_or_else(bad)).collect(),
            Some(v) => Ok(vec![v.as_u64().ok_or_else(bad)? as u32]),
        }
    }

    /// An optional list of non-negative integers.
    pub fn usize_list(&self, key: &str) -> Result<Vec<usize>, ModelError> {
        Ok(self.id_list(key)?.into_iter().map(|v| v as usize).collect())
    }

    /// A vision-language wrapper's language model config: the
    /// `text_config` object, with the wrapper's own top-level keys (ids,
    /// tied embeddings) where the text config lacks them. `None` when there
    /// is no `text_config`.
    pub fn text_config(&self) -> Option<RawConfig> {
        let text = self.value.get("text_config")?.as_object()?;
        let mut merged = text.clone();
        if let Some(top) = self.value.as_object() {
            for (k, v) in top {
                if k != "text_config" && k != "vision_config" && !merged.contains_key(k) {
                    merged.insert(k.clone(), v.clone());
                }
            }
        }
        Some(RawConfig {
            path: self.path.clone(),
            value: Value::Object(merged),
        })
    }

    /// Common attention / embedding fields shared by every family.
    /// Family parsers fill in the MoE-specific ones.
    pub fn base(&self, family: Family) -> Result<ModelConfig, ModelError> {
        // Block-scaled FP8 is read as it is, and gpt-oss's MXFP4 experts;
        // other stored quantizations (Kimi K2.5's compressed-tensors int4
        // experts, AWQ, GPTQ) are not.
        if let Some(m) = self.str_opt(&["quantization_config.quant_method"]) {
            let mxfp4 = m == "mxfp4" && family == Family::GptOss;
            if m != "fp8" && !mxfp4 {
                return Err(self.err(format!(
                    "quantization_config.quant_method {m:?} is not supported (block-scaled fp8 is, and mxfp4 \
                     for gpt-oss; use a bf16 checkpoint or a GGUF of the model)"
                )));
            }
        }
        let hidden_size = self.usize(&["hidden_size"])?;
        let num_layers = self.usize(&["num_hidden_layers"])?;
        let num_heads = self.usize(&["num_attention_heads"])?;
        let num_kv_heads = self.usize_opt(&["num_key_value_heads"])?.unwrap_or(num_heads);
        let head_dim = match self.usize_opt(&["head_dim"])? {
            Some(d) => d,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        let rope_theta = self
            .f64_opt(&["rope_parameters.rope_theta", "rope_theta"])?
            .unwrap_or(10000.0) as f32;
        let (rope_linear_factor, rope_yarn) = self.rope_scaling()?;
        let mut eos = self.id_list("eos_token_id")?;
        eos.sort_unstable();
        Ok(ModelConfig {
            family,
            vocab_size: self.usize(&["vocab_size"])?,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.f64_opt(&["rms_norm_eps"])?.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_linear_factor,
            rope_yarn,
            rope_interleave: false,
            max_position_embeddings: self.usize_opt(&["max_position_embeddings"])?.unwrap_or(4096),
            tie_word_embeddings: self.bool_opt(&["tie_word_embeddings"])?.unwrap_or(false),
            qk_norm: QkNorm::None,
            qkv_bias: false,
            clip_qkv: None,
            sliding_window: vec![None; num_layers],
            num_experts: 0,
            top_k: 0,
            norm_topk_prob: false,
            moe_intermediate_size: 0,
            intermediate_size: self.usize_opt(&["intermediate_size"])?.unwrap_or(0),
            shared_expert_intermediate_size: None,
            shared_expert_gated: true,
            group_routing: None,
            moe_layers: vec![true; num_layers],
            eos_token_ids: eos,
            bos_token_id: self.id_list("bos_token_id")?.first().copied(),
            sampling: crate::SamplingDefaults::default(),
            qk_rows_interleaved: false,
            mixers: vec![MixerKind::Attention; num_layers],
            delta_net: None,
            mla: None,
            dsa: None,
            rotary_dim: head_dim,
            attn_output_gate: false,
            zero_centred_norms: false,
            vision_ignored: false,
            attn_sinks: vec![false; num_layers],
            o_proj_bias: false,
            router_bias: false,
            router_softmax_after_topk: false,
            expert_act: GluAct::Silu,
            expert_bias: false,
            v_head_dim: None,
            value_scale: None,
            swa: None,
        })
    }

    /// RoPE scaling: `rope_scaling` (hub) or `rope_parameters`
    /// (transformers 5). Default, linear (the factor) and YaRN are
    /// supported; anything else is refused by name rather than silently
    /// mis-computed. `max_position_embeddings` stands in for a missing
    /// YaRN factor as transformers does.
    fn rope_scaling(&self) -> Result<(f32, Option<Yarn>), ModelError> {
        let kind = self
            .str_opt(&[
                "rope_parameters.rope_type",
                "rope_scaling.rope_type",
                "rope_scaling.type",
            ])
            .unwrap_or("default");
        let num = |k: &str| self.f64_opt(&[&format!("rope_parameters.{k}"), &format!("rope_scaling.{k}")]);
        match kind {
            "default" => Ok((1.0, None)),
            "linear" => Ok((
                num("factor")?.ok_or_else(|| self.err("linear rope scaling without a factor".into()))? as f32,
                None,
            )),
            "yarn" => {
                let original = self
                    .usize_opt(&[
                        "rope_parameters.original_max_position_embeddings",
                        "rope_scaling.original_max_position_embeddings",
                    ])?
                    .ok_or_else(|| self.err("yarn rope scaling without original_max_position_embeddings".into()))?;
                if original == 0 {
                    return Err(self.err("original_max_position_embeddings must be positive".into()));
                }
                let factor = match num("factor")? {
                    Some(f) => f,
                    None => self.usize(&["max_position_embeddings"])? as f64 / original as f64,
                };
                let (mscale, mscale_all_dim) = (num("mscale")?, num("mscale_all_dim")?);
                // if attention_factor is None: if mscale and mscale_all_dim: get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) else get_mscale(factor)
                let attention_factor = match (num("attention_factor")?, mscale, mscale_all_dim) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
                        Yarn::get_mscale(factor, m) / Yarn::get_mscale(factor, a)
                    }
                    _ => Yarn::get_mscale(factor, 1.0),
                };
                let truncate = self
                    .bool_opt(&["rope_parameters.truncate", "rope_scaling.truncate"])?
                    .unwrap_or(true);
                Ok((
                    1.0,
                    Some(Yarn {
                        factor,
                        original_max_position_embeddings: original,
                        beta_fast: num("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
                        beta_slow: num("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                        attention_factor,
                        mscale_all_dim: mscale_all_dim.unwrap_or(0.0),
                        truncate,
                    }),
                ))
            }
            other => Err(self.err(format!(
                "rope scaling type {other} is not supported (supported: default, linear, yarn)"
            ))),
        }
    }

    /// Per-layer sliding windows from transformers 5 `layer_types`, or from
    /// the Qwen-style `use_sliding_window` / `max_window_layers` pair.
    pub fn qwen_sliding_windows(&self, num_layers: usize) -> Result<Vec<Option<usize>>, ModelError> {
        let window = self.usize_opt(&["sliding_window"])?.filter(|&w| w > 0);
        if let Some(types) = self.lookup(&["layer_types"]).and_then(Value::as_array) {
            let w: Vec<Option<usize>> = types
                .iter()
                .map(|t| {
                    if t.as_str() == Some("sliding_attention") {
                        window
                    } else {
                        None
                    }
                })
                .collect();
            if w.len() != num_layers {
                return Err(self.err(format!("layer_types has {} entries for {num_layers} layers", w.len())));
            }
            return Ok(w);
        }
        if self.bool_opt(&["use_sliding_window"])?.unwrap_or(false) {
            let from = self.usize_opt(&["max_window_layers"])?.unwrap_or(num_layers);
            return Ok((0..num_layers).map(|l| if l >= from { window } else { None }).collect());
        }
        Ok(vec![None; num_layers])
    }

    /// Qwen-style MoE layer selection: `mlp_only_layers` run dense MLPs,
    /// and otherwise every `decoder_sparse_step`-th layer is sparse.
    pub fn qwen_moe_layers(&self, num_layers: usize, num_experts: usize) -> Result<Vec<bool>, ModelError> {
        let dense = self.usize_list("mlp_only_layers")?;
        let step = self.usize_opt(&["decoder_sparse_step"])?.unwrap_or(1);
        if step == 0 {
            return Err(self.err("decoder_sparse_step must be at least 1".into()));
        }
        Ok((0..num_layers)
            .map(|l| !dense.contains(&l) && num_experts > 0 && (l + 1) % step == 0)
            .collect())
    }
}
