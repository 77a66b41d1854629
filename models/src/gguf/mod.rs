//! GGUF models: the config from GGUF metadata and the tensors through a
//! [`WeightSource`] that maps Hugging Face names onto llama.cpp's.
//!
//! Architectures as llama.cpp names them: `llama` (dense, or Mixtral when
//! it has experts), `olmoe`, `qwen3moe`, `qwen2moe`, the gated-DeltaNet
//! hybrids `qwen3next` (Qwen3-Next) and `qwen35moe` (Qwen3.5 MoE), and the
//! DeepSeek lineage `deepseek2`, `glm4moe`, `minimax-m2`, `deepseek32`,
//! `glm-dsa`, `gpt-oss` and `mimo2` (MiMo-V2-Flash). Stacked
//! expert tensors (`blk.N.ffn_{gate,up,down}_exps`) are read one expert
//! slice at a time, and quantized blocks are used as stored.
//!
//! llama.cpp's converter reorders the rows of `attn_q` / `attn_k` of
//! `llama` models within each head (pairs interleaved instead of halves).
//! Rather than copying weights, [`ModelConfig::qk_rows_interleaved`] tells
//! attention to undo that order on the projected q and k, which is exact.
//!
//! What the converter changes for the gated-DeltaNet hybrids, and how it
//! is undone, is in [`hybrid`]; the DeepSeek lineage's layout (MLA's split
//! `kv_b_proj`, YaRN's log multiplier, the sparse-attention indexer) in
//! [`lineage`]; gpt-oss's split experts, sinks, biases, sliding windows and
//! clamped GLU in [`gpt_oss`]; MiMo-V2-Flash's per-kind KV heads and rope,
//! value heads and sigmoid router in [`mimo`]. Where a generation ends
//! (the tokens `generation_config.json` would list) is in
//! [`end_of_generation`].

use std::path::Path;

use charm_common::gguf::GgmlType;
use charm_common::gguf::{GgufError, GgufFile, MetaValue};
use charm_common::{Buf, LoadError, MlaHeads, Weight, WeightData, WeightSource};

use crate::config::{MixerKind, ModelConfig, QkNorm, Yarn};
use crate::error::ModelError;
use crate::family::Family;
use crate::gated_delta_net::DeltaNetShape;

mod end_of_generation;
mod gpt_oss;
mod hybrid;
mod lineage;
mod mimo;

pub use end_of_generation::end_of_generation_ids;
use gpt_oss::gpt_oss;
use hybrid::{a_log_from_ssm_a, hybrid_layers, input_order, rearranged, untile};
use lineage::{lineage, sparse_attention};
use mimo::mimo;

/// A GGUF file as a model: its config and its tensors by HF name.
pub struct GgufModel {
    pub file: GgufFile,
    pub cfg: ModelConfig,
    arch: String,
    hybrid: Hybrid,
}

/// Which gated-DeltaNet hybrid layout (llama.cpp's converter's) the file has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hybrid {
    /// Not a hybrid.
    No,
    /// `qwen3next`: `ssm_ba` grouped per key head, V heads grouped.
    Qwen3Next,
    /// `qwen35moe`: separate `ssm_beta` / `ssm_alpha`, V heads tiled.
    Qwen35,
}

impl GgufModel {
    /// Opens a GGUF file and reads its config from the metadata.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = GgufFile::open(path).map_err(LoadError::from)?;
        let arch = file
            .meta("general.architecture")
            .and_then(MetaValue::as_str)
            .ok_or_else(|| bad(&file, "no general.architecture".into()))?
            .to_string();
        let cfg = config_from_gguf(&file, &arch)?;
        let hybrid = match arch.as_str() {
            "qwen3next" => Hybrid::Qwen3Next,
            "qwen35moe" => Hybrid::Qwen35,
            _ => Hybrid::No,
        };
        Ok(GgufModel {
            file,
            cfg,
            arch,
            hybrid,
        })
    }

    /// `general.architecture`.
    pub fn arch(&self) -> &str {
        &self.arch
    }
}

fn bad(file: &GgufFile, reason: String) -> ModelError {
    ModelError::Config {
        path: file.path().to_path_buf(),
        reason,
    }
}

/// Architectures charm reads from GGUF.
pub const GGUF_ARCHES: [&str; 13] = [
    "llama",
    "olmoe",
    "qwen3moe",
    "qwen2moe",
    "qwen3next",
    "qwen35moe",
    "deepseek2",
    "glm4moe",
    "minimax-m2",
    "deepseek32",
    "glm-dsa",
    "gpt-oss",
    "mimo2",
];

fn config_from_gguf(f: &GgufFile, arch: &str) -> Result<ModelConfig, ModelError> {
    let family = match arch {
        "llama" if f.tensor("blk.0.ffn_gate_inp.weight").is_some() => Family::Mixtral,
        "llama" => Family::Llama,
        "olmoe" => Family::Olmoe,
        "qwen3moe" => Family::Qwen3Moe,
        "qwen2moe" => Family::Qwen2Moe,
        "qwen3next" => Family::Qwen3Next,
        "qwen35moe" => Family::Qwen35Moe,
        "deepseek2" => Family::DeepseekV3,
        "glm4moe" => Family::Glm4Moe,
        "minimax-m2" => Family::MiniMaxM2,
        "deepseek32" => Family::DeepseekV32,
        "glm-dsa" => Family::GlmMoeDsa,
        "gpt-oss" => Family::GptOss,
        "mimo2" => Family::MiMoV2Flash,
        other => {
            return Err(ModelError::UnknownArchitecture {
                name: format!("{other} (GGUF general.architecture)"),
                supported: GGUF_ARCHES.to_vec(),
            })
        }
    };
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| f.meta(&key(k));
    let req_u = |k: &str| -> Result<usize, ModelError> {
        get(k)
            .and_then(MetaValue::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| bad(f, format!("missing or non-integer metadata {}", key(k))))
    };
    let opt_u = |k: &str| get(k).and_then(MetaValue::as_u64).map(|v| v as usize);
    let opt_f = |k: &str| get(k).and_then(MetaValue::as_f64);

    let hidden = req_u("embedding_length")?;
    let blocks = req_u("block_count")?;
    // A converted MTP head adds `nextn_predict_layers` blocks after the model's own.
    let layers = blocks.saturating_sub(opt_u("nextn_predict_layers").unwrap_or(0));
    let heads = req_u("attention.head_count")?;
    let kv_heads = opt_u("attention.head_count_kv").unwrap_or(heads);
    let head_dim = opt_u("attention.key_length").unwrap_or(hidden.checked_div(heads).unwrap_or(0));
    let vocab = match f.meta("tokenizer.ggml.tokens").and_then(MetaValue::as_array) {
        Some(t) => t.len(),
        None => opt_u("vocab_size").ok_or_else(|| bad(f, "no tokenizer.ggml.tokens and no vocab_size".into()))?,
    };
    let (rope_linear_factor, rope_yarn) = match get("rope.scaling.type").and_then(MetaValue::as_str) {
        None | Some("none") => (1.0, None),
        Some("linear") => (opt_f("rope.scaling.factor").unwrap_or(1.0) as f32, None),
        Some("yarn") => (1.0, Some(yarn_from_gguf(f, arch)?)),
        Some(other) => {
            return Err(bad(
                f,
                format!("rope scaling type {other} is not supported (supported: none, linear, yarn)"),
            ));
        }
    };
    let id = |k: &str| f.meta(k).and_then(MetaValue::as_u64).map(|v| v as u32);
    let eos = end_of_generation_ids(f);

    let experts = opt_u("expert_count").unwrap_or(0);
    let moe_layers: Vec<bool> = (0..layers)
        .map(|l| experts > 0 && f.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_some())
        .collect();
    let ffn = opt_u("feed_forward_length").unwrap_or(0);
    let expert_ffn = opt_u("expert_feed_forward_length").unwrap_or(ffn);
    let hybrid = matches!(family, Family::Qwen3Next | Family::Qwen35Moe);
    let norm_topk_default = matches!(
        family,
        Family::Mixtral | Family::Qwen3Moe | Family::Qwen3Next | Family::Qwen35Moe
    );
    let (mixers, delta_net, rotary_dim) = if hybrid {
        let (mixers, shape) = hybrid_layers(f, arch, layers)?;
        // rope.dimension_count = int(head_dim * partial_rotary_factor)
        let rotary = opt_u("rope.dimension_count").unwrap_or(head_dim / 4);
        (mixers, Some(shape), rotary)
    } else {
        (vec![MixerKind::Attention; layers], None, head_dim)
    };
    let cfg = ModelConfig {
        family,
        vocab_size: vocab,
        hidden_size: hidden,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        rms_norm_eps: opt_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6) as f32,
        rope_theta: opt_f("rope.freq_base").unwrap_or(10000.0) as f32,
        rope_linear_factor,
        rope_yarn,
        rope_interleave: false,
        max_position_embeddings: opt_u("context_length").unwrap_or(4096),
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        qk_norm: match family {
            Family::Olmoe => QkNorm::Full,
            Family::Qwen3Moe | Family::Qwen3Next | Family::Qwen35Moe => QkNorm::PerHead,
            _ => QkNorm::None,
        },
        qkv_bias: f.tensor("blk.0.attn_q.bias").is_some(),
        clip_qkv: None,
        sliding_window: vec![None; layers],
        num_experts: experts,
        top_k: opt_u("expert_used_count").unwrap_or(0),
        norm_topk_prob: get("expert_weights_norm")
            .and_then(MetaValue::as_bool)
            .unwrap_or(norm_topk_default),
        moe_intermediate_size: expert_ffn,
        intermediate_size: ffn,
        shared_expert_intermediate_size: opt_u("expert_shared_feed_forward_length").filter(|&n| n > 0),
        shared_expert_gated: true,
        group_routing: None,
        moe_layers,
        eos_token_ids: eos,
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        sampling: crate::SamplingDefaults::from_gguf(f),
        qk_rows_interleaved: arch == "llama",
        mixers,
        delta_net,
        mla: None,
        dsa: None,
        rotary_dim,
        attn_output_gate: hybrid,
        // The converter folded the `1 +` of zero-centred norms into the weights.
        zero_centred_norms: false,
        vision_ignored: false,
        attn_sinks: vec![false; layers],
        o_proj_bias: false,
        router_bias: false,
        router_softmax_after_topk: false,
        expert_act: crate::ffn::GluAct::Silu,
        expert_bias: false,
        v_head_dim: None,
        value_scale: None,
        swa: None,
    };
    let mut cfg = cfg;
    if matches!(
        family,
        Family::DeepseekV3 | Family::Glm4Moe | Family::MiniMaxM2 | Family::DeepseekV32 | Family::GlmMoeDsa
    ) {
        lineage(f, arch, &mut cfg)?;
    }
    if matches!(family, Family::DeepseekV32 | Family::GlmMoeDsa) {
        cfg.dsa = Some(sparse_attention(f, arch, &cfg)?);
    }
    if family == Family::GptOss {
        gpt_oss(f, arch, &mut cfg)?;
    }
    if family == Family::MiMoV2Flash {
        mimo(f, arch, &mut cfg)?;
    }
    cfg.validate().map_err(|reason| bad(f, reason))?;
    Ok(cfg)
}

/// YaRN from `rope.scaling.*`: `factor`, `original_context_length`,
/// `yarn_beta_fast` / `yarn_beta_slow` (32 / 1 when absent), the attention
/// factor from `yarn_attn_factor` (else transformers' default
/// `0.1 ln(factor) + 1`, or 1 for the DeepSeek lineage's
/// `mscale == mscale_all_dim`), and `mscale_all_dim` from `deepseek2`'s
/// `yarn_log_multiplier` (`0.1 · mscale_all_dim`, undone in f32, the
/// precision it was stored in).
fn yarn_from_gguf(f: &GgufFile, arch: &str) -> Result<Yarn, ModelError> {
    let num = |k: &str| f.meta(&format!("{arch}.rope.scaling.{k}")).and_then(MetaValue::as_f64);
    let factor =
        num("factor").ok_or_else(|| bad(f, format!("yarn rope scaling without {arch}.rope.scaling.factor")))?;
    let original = f
        .meta(&format!("{arch}.rope.scaling.original_context_length"))
        .and_then(MetaValue::as_u64)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            bad(
                f,
                format!("yarn rope scaling without {arch}.rope.scaling.original_context_length"),
            )
        })?;
    let log_mul = num("yarn_log_multiplier").filter(|&m| m != 0.0);
    let mscale_all_dim = log_mul.map_or(0.0, |m| (m as f32 / 0.1f32) as f64);
    let attention_factor = match (num("yarn_attn_factor"), log_mul) {
        (Some(a), _) => a,
        (None, Some(_)) => 1.0,
        (None, None) => Yarn::get_mscale(factor, 1.0),
    };
    Ok(Yarn {
        factor,
        original_max_position_embeddings: original as usize,
        beta_fast: num("yarn_beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
        beta_slow: num("yarn_beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
        attention_factor,
        mscale_all_dim,
        truncate: true,
    })
}

/// Where a Hugging Face tensor name lives in a GGUF file.
#[derive(Debug, PartialEq, Eq)]
enum Mapped {
    /// A tensor of its own.
    Whole(String),
    /// Slice `index` of a stacked expert tensor.
    Slice(String, usize),
}

/// Maps a Hugging Face tensor name to llama.cpp's (for the hybrids, the
/// `qwen3next` / `qwen35moe` names: `post_attention_norm`, `ssm_*`).
fn map_name(hf: &str, hybrid: Hybrid) -> Option<Mapped> {
    let whole = |s: String| Some(Mapped::Whole(s));
    match hf {
        "model.embed_tokens.weight" => return whole("token_embd.weight".into()),
        "model.norm.weight" => return whole("output_norm.weight".into()),
        "lm_head.weight" => return whole("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let l: usize = layer.parse().ok()?;
    let blk = |s: &str| Some(Mapped::Whole(format!("blk.{l}.{s}")));
    if hybrid != Hybrid::No {
        match rest {
            "post_attention_layernorm.weight" => return blk("post_attention_norm.weight"),
            // Qwen3-Next's in_proj_ba is stored as it is; b and a are its rows.
            "linear_attn.in_proj_b.weight" | "linear_attn.in_proj_a.weight" if hybrid == Hybrid::Qwen3Next => {
                return blk("ssm_ba.weight")
            }
            "linear_attn.in_proj_qkv.weight" => return blk("attn_qkv.weight"),
            "linear_attn.in_proj_z.weight" => return blk("attn_gate.weight"),
            "linear_attn.in_proj_b.weight" => return blk("ssm_beta.weight"),
            "linear_attn.in_proj_a.weight" => return blk("ssm_alpha.weight"),
            "linear_attn.in_proj_ba.weight" => return blk("ssm_ba.weight"),
            "linear_attn.conv1d.weight" => return blk("ssm_conv1d.weight"),
            "linear_attn.dt_bias" => return blk("ssm_dt.bias"),
            "linear_attn.A_log" => return blk("ssm_a"),
            "linear_attn.norm.weight" => return blk("ssm_norm.weight"),
            "linear_attn.out_proj.weight" => return blk("ssm_out.weight"),
            _ => {}
        }
    }
    match rest {
        "input_layernorm.weight" => return blk("attn_norm.weight"),
        "post_attention_layernorm.weight" => return blk("ffn_norm.weight"),
        "self_attn.q_proj.weight" => return blk("attn_q.weight"),
        "self_attn.k_proj.weight" => return blk("attn_k.weight"),
        "self_attn.v_proj.weight" => return blk("attn_v.weight"),
        "self_attn.o_proj.weight" => return blk("attn_output.weight"),
        "self_attn.o_proj.bias" => return blk("attn_output.bias"),
        // gpt-oss: `if "sinks" in name: name += ".weight"`.
        "self_attn.sinks" => return blk("attn_sinks.weight"),
        // MiMo-V2-Flash: `if "attention_sink" in name ...: name += ".weight"`.
        "self_attn.attention_sink_bias" => return blk("attn_sinks.weight"),
        "mlp.router.weight" => return blk("ffn_gate_inp.weight"),
        "mlp.router.bias" => return blk("ffn_gate_inp.bias"),
        "self_attn.q_proj.bias" => return blk("attn_q.bias"),
        "self_attn.k_proj.bias" => return blk("attn_k.bias"),
        "self_attn.v_proj.bias" => return blk("attn_v.bias"),
        "self_attn.q_norm.weight" => return blk("attn_q_norm.weight"),
        "self_attn.k_norm.weight" => return blk("attn_k_norm.weight"),
        "mlp.gate_proj.weight" => return blk("ffn_gate.weight"),
        "mlp.up_proj.weight" => return blk("ffn_up.weight"),
        "mlp.down_proj.weight" => return blk("ffn_down.weight"),
        "mlp.gate.weight" | "block_sparse_moe.gate.weight" => return blk("ffn_gate_inp.weight"),
        "mlp.shared_expert.gate_proj.weight" => return blk("ffn_gate_shexp.weight"),
        "mlp.shared_expert.up_proj.weight" => return blk("ffn_up_shexp.weight"),
        "mlp.shared_expert.down_proj.weight" => return blk("ffn_down_shexp.weight"),
        "mlp.shared_expert_gate.weight" => return blk("ffn_gate_inp_shexp.weight"),
        // The DeepSeek lineage: ungated shared experts, the selection bias
        // and MLA's projections (`kv_b_proj` is joined from attn_k_b and
        // attn_v_b by the source).
        "mlp.shared_experts.gate_proj.weight" => return blk("ffn_gate_shexp.weight"),
        "mlp.shared_experts.up_proj.weight" => return blk("ffn_up_shexp.weight"),
        "mlp.shared_experts.down_proj.weight" => return blk("ffn_down_shexp.weight"),
        "mlp.gate.e_score_correction_bias" | "block_sparse_moe.e_score_correction_bias" => {
            return blk("exp_probs_b.bias")
        }
        "self_attn.q_a_proj.weight" => return blk("attn_q_a.weight"),
        "self_attn.q_a_layernorm.weight" => return blk("attn_q_a_norm.weight"),
        "self_attn.q_b_proj.weight" => return blk("attn_q_b.weight"),
        "self_attn.kv_a_proj_with_mqa.weight" => return blk("attn_kv_a_mqa.weight"),
        "self_attn.kv_a_layernorm.weight" => return blk("attn_kv_a_norm.weight"),
        "self_attn.kv_b_proj.weight" => return blk("attn_kv_b.weight"),
        // DeepSeek Sparse Attention's indexer.
        "self_attn.indexer.wq_b.weight" => return blk("indexer.attn_q_b.weight"),
        "self_attn.indexer.wk.weight" => return blk("indexer.attn_k.weight"),
        "self_attn.indexer.k_norm.weight" => return blk("indexer.k_norm.weight"),
        "self_attn.indexer.k_norm.bias" => return blk("indexer.k_norm.bias"),
        "self_attn.indexer.weights_proj.weight" => return blk("indexer.proj.weight"),
        _ => {}
    }
    let experts = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))?;
    let (e, proj) = experts.split_once('.')?;
    let e: usize = e.parse().ok()?;
    let (kind, part) = match proj {
        "gate_proj.weight" | "w1.weight" => ("gate", "weight"),
        "up_proj.weight" | "w3.weight" => ("up", "weight"),
        "down_proj.weight" | "w2.weight" => ("down", "weight"),
        // gpt-oss's expert biases: one row per expert of `[E, I]` / `[E, H]`.
        "gate_proj.bias" => ("gate", "bias"),
        "up_proj.bias" => ("up", "bias"),
        "down_proj.bias" => ("down", "bias"),
        _ => return None,
    };
    Some(Mapped::Slice(format!("blk.{l}.ffn_{kind}_exps.{part}"), e))
}

impl GgufModel {
    /// `hf`'s llama.cpp name, with the alternatives one converter or another
    /// writes: `glm4moe` stores `post_attention_layernorm` as
    /// `post_attention_norm` where the other architectures use `ffn_norm`.
    fn locate(&self, hf: &str) -> Option<Mapped> {
        match map_name(hf, self.hybrid)? {
            Mapped::Whole(g) if self.file.tensor(&g).is_none() && g.ends_with(".ffn_norm.weight") => {
                let alt = g.replace(".ffn_norm.weight", ".post_attention_norm.weight");
                Some(Mapped::Whole(if self.file.tensor(&alt).is_some() { alt } else { g }))
            }
            m => Some(m),
        }
    }

    /// MLA's `kv_b_proj` (`heads · (nope + v)` × `kv_lora_rank`) joined back
    /// from the converter's `attn_k_b` (per head `[kv_lora_rank, nope]`,
    /// the key part transposed) and `attn_v_b` (per head `[v,
    /// kv_lora_rank]`), as f32.
    fn joined_kv_b(&self, layer: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        let shape = self
            .cfg
            .mla
            .ok_or_else(|| self.missing(format!("blk.{layer}.attn_kv_b.weight")))?;
        let (heads, r) = (self.cfg.num_heads, shape.kv_lora_rank);
        let (nope, v) = (shape.qk_nope_head_dim, shape.v_head_dim);
        if rows != heads * (nope + v) || cols != r {
            return Err(self.bad_tensor(
                &format!("blk.{layer}.attn_kv_b.weight"),
                format!(
                    "asked for {rows} x {cols}, MLA's shape gives {} x {r}",
                    heads * (nope + v)
                ),
            ));
        }
        let (kb, vb) = (
            format!("blk.{layer}.attn_k_b.weight"),
            format!("blk.{layer}.attn_v_b.weight"),
        );
        for g in [&kb, &vb] {
            if self.file.tensor(g).is_none() {
                return Err(self.missing(format!("{g} (for model.layers.{layer}.self_attn.kv_b_proj.weight)")));
            }
        }
        let mut out = vec![0.0f32; rows * cols];
        for h in 0..heads {
            let k = self.file.weight_slice(&kb, h, r, nope)?.data().to_f32_vec();
            let vv = self.file.weight_slice(&vb, h, v, r)?.data().to_f32_vec();
            let head = &mut out[h * (nope + v) * r..(h + 1) * (nope + v) * r];
            for i in 0..nope {
                for c in 0..r {
                    head[i * r + c] = k[c * nope + i];
                }
            }
            head[nope * r..].copy_from_slice(&vv);
        }
        Ok(Weight::from_f32(rows, cols, out))
    }

    fn missing(&self, name: String) -> LoadError {
        missing(&self.file, name)
    }

    /// Row `e` (of `len`) of the 2-D `g` that stacks one vector per expert
    /// (gpt-oss's `ffn_{gate,up,down}_exps.bias`, ggml dims `[len, E]`),
    /// as f32.
    fn stacked_row(&self, hf: &str, g: &str, e: usize, len: usize) -> Result<Vec<f32>, LoadError> {
        let t = self
            .file
            .tensor(g)
            .ok_or_else(|| self.missing(format!("{g} (for {hf})")))?;
        let count = match t.dims[..] {
            [_, count] => count as usize,
            _ => return Err(self.bad_tensor(g, format!("has dims {:?}, expected [{len}, experts]", t.dims))),
        };
        if e >= count {
            return Err(self.bad_tensor(g, format!("holds {count} experts, asked for expert {e}")));
        }
        let mut row = vec![0.0; len];
        self.file.weight(g, count, len)?.row_into(e, &mut row);
        Ok(row)
    }

    fn bad_tensor(&self, tensor: &str, reason: String) -> LoadError {
        bad_tensor(&self.file, tensor, reason)
    }

    /// The DeltaNet shape and `r = v_heads / k_heads` of a hybrid.
    fn delta(&self) -> Option<(DeltaNetShape, usize)> {
        let s = self.cfg.delta_net?;
        Some((s, s.v_heads / s.k_heads))
    }

    /// How the converter moved the rows and columns of the linear-attention
    /// matrix `hf` (`rows` × `cols` as the model asks for it): the stored
    /// row count, the stored row of each Hugging Face row, and for
    /// `ssm_out` the stored column of each (value-head units). `None` when
    /// nothing moved.
    #[allow(clippy::type_complexity)]
    fn moved(&self, hf: &str, rows: usize) -> Option<(usize, Option<Vec<usize>>, Option<Vec<usize>>)> {
        let (s, r) = self.delta()?;
        let part = hf.split_once(".linear_attn.")?.1;
        let kh = s.k_heads;
        match (self.hybrid, part) {
            // ssm_ba per key head: [b (r) | a (r)].
            (Hybrid::Qwen3Next, "in_proj_b.weight" | "in_proj_a.weight") => {
                let off = if part == "in_proj_a.weight" { r } else { 0 };
                let pick = (0..s.v_heads).map(|h| (h / r) * 2 * r + off + h % r).collect();
                Some((2 * s.v_heads, Some(pick), None))
            }
            (Hybrid::Qwen35, _) if r > 1 => match part {
                "in_proj_qkv.weight" => {
                    let qk = 2 * s.key_dim();
                    let v = untile(s.v_heads, s.v_head_dim, kh, r);
                    Some((rows, Some((0..qk).chain(v.into_iter().map(|i| qk + i)).collect()), None))
                }
                "in_proj_z.weight" => Some((rows, Some(untile(s.v_heads, s.v_head_dim, kh, r)), None)),
                "in_proj_b.weight" | "in_proj_a.weight" => Some((rows, Some(untile(s.v_heads, 1, kh, r)), None)),
                "out_proj.weight" => Some((rows, None, Some(untile(s.v_heads, 1, kh, r)))),
                _ => None,
            },
            _ => None,
        }
    }

    /// A 1-D linear-attention parameter of `len` with Qwen3.5's tiled value
    /// heads put back in grouped order (`ssm_a`, `ssm_dt.bias`).
    fn head_vector(&self, g: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        let v = self.file.vector(g, len)?;
        match self.delta() {
            Some((s, r)) if self.hybrid == Hybrid::Qwen35 && r > 1 && len == s.v_heads => {
                Ok(untile(s.v_heads, 1, s.k_heads, r).into_iter().map(|i| v[i]).collect())
            }
            _ => Ok(v),
        }
    }
}

fn missing(file: &GgufFile, name: String) -> LoadError {
    LoadError::Gguf(GgufError::MissingTensor {
        path: file.path().to_path_buf(),
        name,
    })
}

fn bad_tensor(file: &GgufFile, tensor: &str, reason: String) -> LoadError {
    LoadError::Gguf(GgufError::BadTensor {
        path: file.path().to_path_buf(),
        tensor: tensor.to_string(),
        reason,
    })
}

/// A Q5_0 matrix as Q8_0 with a packed copy ([`charm_common::gguf::q5_0_as_q8_0`]:
/// the same values and product bits): llama.cpp's K-quant mixes store MLA's
/// 192-column `attn_k_b` as Q5_0, which has no packed kernel, and prefill
/// multiplies it by every row of every head. Other matrices as they are.
fn q5_0_as_q8_0_weight(file: &GgufFile, name: &str, w: Weight) -> Result<Weight, LoadError> {
    let (rows, cols) = (w.rows(), w.cols());
    let bytes = match w.data() {
        WeightData::Gguf {
            ty: GgmlType::Q5_0,
            data,
        } => charm_common::gguf::q5_0_as_q8_0(data.as_slice()),
        _ => return Ok(w),
    };
    let q8 = Weight::try_new(
        rows,
        cols,
        WeightData::Gguf {
            ty: GgmlType::Q8_0,
            data: Buf::owned(bytes),
        },
    )
    .map_err(|e| bad_tensor(file, name, format!("as Q8_0: {e}")))?;
    Ok(q8.pack_for_cpu())
}

impl WeightSource for GgufModel {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        let hybrid = self.hybrid != Hybrid::No;
        let missing = || self.missing(name.to_string());
        match self.locate(name).ok_or_else(missing)? {
            Mapped::Whole(g) if g.ends_with(".attn_kv_b.weight") && self.file.tensor(&g).is_none() => {
                let layer = g.trim_start_matches("blk.").trim_end_matches(".attn_kv_b.weight");
                self.joined_kv_b(layer, rows, cols)
            }
            Mapped::Whole(g) => {
                if hybrid {
                    if let Some((src_rows, pick, units)) = self.moved(name, rows) {
                        if self.file.tensor(&g).is_none() {
                            return Err(self.missing(format!("{g} (for {name})")));
                        }
                        return rearranged(&self.file, &g, src_rows, cols, pick.as_deref(), units.as_deref());
                    }
                }
                let t = self
                    .file
                    .tensor(&g)
                    .ok_or_else(|| self.missing(format!("{g} (for {name})")))?;
                // A [1, cols] gate may be stored as a 1-D tensor.
                if rows == 1 && t.dims.len() == 1 {
                    let v = self.file.vector(&g, cols)?;
                    return Ok(Weight::from_f32(1, cols, v));
                }
                Ok(self.file.weight(&g, rows, cols)?)
            }
            Mapped::Slice(g, e) => {
                if self.file.tensor(&g).is_some() {
                    return Ok(self.file.weight_slice(&g, e, rows, cols)?);
                }
                // Older Mixtral GGUFs: one tensor per expert, blk.N.ffn_gate.E.weight.
                let per = g.replace("_exps.weight", &format!(".{e}.weight"));
                if self.file.tensor(&per).is_some() {
                    return Ok(self.file.weight(&per, rows, cols)?);
                }
                Err(self.missing(format!("{g} (for {name})")))
            }
        }
    }

    fn matrix_in_stored_order(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<(Weight, Option<Vec<usize>>), LoadError> {
        // Qwen3.5's tiled `ssm_out` columns in a type whose blocks span a
        // value head (K-quants over 128-wide heads): keep the blocks, move
        // the inputs.
        if let (Some(Mapped::Whole(g)), Some((_, None, Some(units)))) =
            (map_name(name, self.hybrid), self.moved(name, rows))
        {
            let t = self
                .file
                .tensor(&g)
                .ok_or_else(|| self.missing(format!("{g} (for {name})")))?;
            if let Some(order) = input_order(&units, cols, t.ty.block_elems()) {
                return Ok((self.file.weight(&g, rows, cols)?, Some(order)));
            }
        }
        Ok((self.matrix(name, rows, cols)?, None))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        let g = match self.locate(name) {
            Some(Mapped::Whole(g)) => g,
            Some(Mapped::Slice(g, e)) => return self.stacked_row(name, &g, e, len),
            None => return Err(self.missing(name.to_string())),
        };
        if self.file.tensor(&g).is_none() {
            return Err(self.missing(format!("{g} (for {name})")));
        }
        if name.ends_with(".linear_attn.A_log") {
            // ssm_a = -exp(A_log)
            return self
                .head_vector(&g, len)?
                .into_iter()
                .map(|a| {
                    a_log_from_ssm_a(a).ok_or_else(|| self.bad_tensor(&g, format!("holds {a}, not -exp(A_log) <= 0")))
                })
                .collect();
        }
        if name.ends_with(".linear_attn.dt_bias") {
            return self.head_vector(&g, len);
        }
        Ok(self.file.vector(&g, len)?)
    }

    /// 1-D tensors as [`WeightSource::vector`]; a tensor of more dims is
    /// read as the 2-D tensor its size-1 dims squeeze to (llama.cpp stores
    /// a conv weight `[channels, 1, kernel]` as ggml `[kernel, channels]`),
    /// dequantized to f32. Qwen3.5's DeltaNet conv has its tiled v channels
    /// put back in grouped order.
    fn array(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let dims: Vec<usize> = shape.iter().copied().filter(|&d| d != 1).collect();
        let (rows, cols) = match dims[..] {
            [] => return self.vector(name, 1),
            [len] => return self.vector(name, len),
            [rows, cols] => (rows, cols),
            _ => return Err(self.missing(format!("{name} (a {}-D tensor, not read from GGUF files)", dims.len()))),
        };
        let g = match self.locate(name) {
            Some(Mapped::Whole(g)) => g,
            _ => return Err(self.missing(name.to_string())),
        };
        if self.file.tensor(&g).is_none() {
            return Err(self.missing(format!("{g} (for {name})")));
        }
        let all = self.file.weight(&g, rows, cols)?.data().to_f32_vec();
        match self.delta() {
            Some((s, r)) if self.hybrid == Hybrid::Qwen35 && r > 1 && name.ends_with(".linear_attn.conv1d.weight") => {
                let qk = 2 * s.key_dim();
                if rows != s.conv_dim() {
                    return Err(self.bad_tensor(&g, format!("{rows} channels, expected {}", s.conv_dim())));
                }
                let order = (0..qk).chain(
                    untile(s.v_heads, s.v_head_dim, s.k_heads, r)
                        .into_iter()
                        .map(|i| qk + i),
                );
                Ok(order
                    .flat_map(|c| all[c * cols..(c + 1) * cols].iter().copied())
                    .collect())
            }
            _ => Ok(all),
        }
    }

    fn mla_heads(
        &self,
        layer: usize,
        heads: usize,
        (r, nope, v): (usize, usize, usize),
    ) -> Result<Option<MlaHeads>, LoadError> {
        let (kb, vb) = (
            format!("blk.{layer}.attn_k_b.weight"),
            format!("blk.{layer}.attn_v_b.weight"),
        );
        if self.file.tensor(&kb).is_none() || self.file.tensor(&vb).is_none() {
            return Ok(None);
        }
        // attn_k_b: per head [kv_lora_rank, nope] (the key part transposed:
        // W_UKᵀ as stored); attn_v_b: per head [v, kv_lora_rank].
        let uk_t = (0..heads)
            .map(|h| q5_0_as_q8_0_weight(&self.file, &kb, self.file.weight_slice(&kb, h, r, nope)?))
            .collect::<Result<Vec<_>, LoadError>>()?;
        let uv = (0..heads)
            .map(|h| self.file.weight_slice(&vb, h, v, r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some((uk_t, uv)))
    }

    fn contains(&self, name: &str) -> bool {
        match self.locate(name) {
            Some(Mapped::Whole(g)) if g.ends_with(".attn_kv_b.weight") && self.file.tensor(&g).is_none() => {
                self.file.tensor(&g.replace("attn_kv_b", "attn_k_b")).is_some()
                    && self.file.tensor(&g.replace("attn_kv_b", "attn_v_b")).is_some()
            }
            Some(Mapped::Whole(g)) | Some(Mapped::Slice(g, _)) => self.file.tensor(&g).is_some(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_name_plain(hf: &str) -> Option<Mapped> {
        map_name(hf, Hybrid::No)
    }

    #[test]
    fn names_map_to_llama_cpp() {
        assert_eq!(
            map_name_plain("model.embed_tokens.weight"),
            Some(Mapped::Whole("token_embd.weight".into()))
        );
        assert_eq!(
            map_name_plain("model.layers.3.self_attn.k_norm.weight"),
            Some(Mapped::Whole("blk.3.attn_k_norm.weight".into()))
        );
        assert_eq!(
            map_name_plain("model.layers.0.block_sparse_moe.experts.5.w3.weight"),
            Some(Mapped::Slice("blk.0.ffn_up_exps.weight".into(), 5))
        );
        assert_eq!(
            map_name_plain("model.layers.12.mlp.experts.63.down_proj.weight"),
            Some(Mapped::Slice("blk.12.ffn_down_exps.weight".into(), 63))
        );
        assert_eq!(
            map_name_plain("model.layers.1.mlp.shared_expert_gate.weight"),
            Some(Mapped::Whole("blk.1.ffn_gate_inp_shexp.weight".into()))
        );
        // gpt-oss: router, sinks, o_proj's bias, and one row per expert of the stacked biases.
        for (hf, g) in [
            ("model.layers.2.mlp.router.weight", "blk.2.ffn_gate_inp.weight"),
            ("model.layers.2.mlp.router.bias", "blk.2.ffn_gate_inp.bias"),
            ("model.layers.0.self_attn.sinks", "blk.0.attn_sinks.weight"),
            ("model.layers.1.self_attn.o_proj.bias", "blk.1.attn_output.bias"),
        ] {
            assert_eq!(map_name_plain(hf), Some(Mapped::Whole(g.into())), "{hf}");
        }
        assert_eq!(
            map_name_plain("model.layers.3.mlp.experts.7.up_proj.bias"),
            Some(Mapped::Slice("blk.3.ffn_up_exps.bias".into(), 7))
        );
        assert_eq!(
            map_name_plain("model.layers.3.mlp.experts.0.down_proj.bias"),
            Some(Mapped::Slice("blk.3.ffn_down_exps.bias".into(), 0))
        );
        assert_eq!(map_name_plain("model.layers.x.mlp.gate.weight"), None);
        assert_eq!(map_name_plain("something.else"), None);
    }

    #[test]
    fn hybrid_names_map_to_llama_cpp() {
        let m = |hf: &str, h| match map_name(hf, h) {
            Some(Mapped::Whole(g)) => g,
            other => panic!("{hf}: {other:?}"),
        };
        for h in [Hybrid::Qwen3Next, Hybrid::Qwen35] {
            assert_eq!(
                m("model.layers.2.post_attention_layernorm.weight", h),
                "blk.2.post_attention_norm.weight"
            );
            assert_eq!(
                m("model.layers.0.linear_attn.in_proj_qkv.weight", h),
                "blk.0.attn_qkv.weight"
            );
            assert_eq!(
                m("model.layers.0.linear_attn.in_proj_z.weight", h),
                "blk.0.attn_gate.weight"
            );
            assert_eq!(m("model.layers.1.linear_attn.A_log", h), "blk.1.ssm_a");
            assert_eq!(m("model.layers.1.linear_attn.dt_bias", h), "blk.1.ssm_dt.bias");
            assert_eq!(
                m("model.layers.1.linear_attn.conv1d.weight", h),
                "blk.1.ssm_conv1d.weight"
            );
            assert_eq!(m("model.layers.1.linear_attn.norm.weight", h), "blk.1.ssm_norm.weight");
            assert_eq!(
                m("model.layers.1.linear_attn.out_proj.weight", h),
                "blk.1.ssm_out.weight"
            );
        }
        assert_eq!(
            m("model.layers.0.linear_attn.in_proj_b.weight", Hybrid::Qwen3Next),
            "blk.0.ssm_ba.weight"
        );
        assert_eq!(
            m("model.layers.0.linear_attn.in_proj_a.weight", Hybrid::Qwen3Next),
            "blk.0.ssm_ba.weight"
        );
        assert_eq!(
            m("model.layers.0.linear_attn.in_proj_b.weight", Hybrid::Qwen35),
            "blk.0.ssm_beta.weight"
        );
        assert_eq!(
            m("model.layers.0.linear_attn.in_proj_a.weight", Hybrid::Qwen35),
            "blk.0.ssm_alpha.weight"
        );
        assert_eq!(
            m("model.layers.0.post_attention_layernorm.weight", Hybrid::No),
            "blk.0.ffn_norm.weight"
        );
        assert_eq!(map_name("model.layers.0.linear_attn.A_log", Hybrid::No), None);
    }
}
