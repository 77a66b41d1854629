//! GGUF models: the config from GGUF metadata and the tensors through a
//! [`WeightSource`] that maps Hugging Face names onto llama.cpp's.
//!
//! Architectures as llama.cpp names them: `llama` (dense, or Mixtral when
//! it has experts), `olmoe`, `qwen3moe`, `qwen2moe`. Stacked expert tensors
//! (`blk.N.ffn_{gate,up,down}_exps`) are read one expert slice at a time,
//! and quantized blocks are used as stored.
//!
//! llama.cpp's converter reorders the rows of `attn_q` / `attn_k` of
//! `llama` models within each head (pairs interleaved instead of halves).
//! Rather than copying weights, [`ModelConfig::qk_rows_interleaved`] tells
//! attention to undo that order on the projected q and k, which is exact.

use std::path::Path;

use charm_common::gguf::{GgufError, GgufFile, MetaValue};
use charm_common::{LoadError, Weight, WeightSource};

use crate::config::{MixerKind, ModelConfig, QkNorm};
use crate::error::ModelError;
use crate::family::Family;

/// A GGUF file as a model: its config and its tensors by HF name.
pub struct GgufModel {
    pub file: GgufFile,
    pub cfg: ModelConfig,
    arch: String,
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
        Ok(GgufModel { file, cfg, arch })
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
pub const GGUF_ARCHES: [&str; 4] = ["llama", "olmoe", "qwen3moe", "qwen2moe"];

fn config_from_gguf(f: &GgufFile, arch: &str) -> Result<ModelConfig, ModelError> {
    let family = match arch {
        "llama" if f.tensor("blk.0.ffn_gate_inp.weight").is_some() => Family::Mixtral,
        "llama" => Family::Llama,
        "olmoe" => Family::Olmoe,
        "qwen3moe" => Family::Qwen3Moe,
        "qwen2moe" => Family::Qwen2Moe,
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
    let layers = req_u("block_count")?;
    let heads = req_u("attention.head_count")?;
    let kv_heads = opt_u("attention.head_count_kv").unwrap_or(heads);
    let head_dim = opt_u("attention.key_length").unwrap_or(hidden.checked_div(heads).unwrap_or(0));
    let vocab = match f.meta("tokenizer.ggml.tokens").and_then(MetaValue::as_array) {
        Some(t) => t.len(),
        None => opt_u("vocab_size").ok_or_else(|| bad(f, "no tokenizer.ggml.tokens and no vocab_size".into()))?,
    };
    let rope_linear_factor = match get("rope.scaling.type").and_then(MetaValue::as_str) {
        None | Some("none") => 1.0,
        Some("linear") => opt_f("rope.scaling.factor").unwrap_or(1.0) as f32,
        Some(other) => {
            return Err(bad(
                f,
                format!("rope scaling type {other} is not supported (supported: none, linear)"),
            ));
        }
    };
    let id = |k: &str| f.meta(k).and_then(MetaValue::as_u64).map(|v| v as u32);
    let mut eos: Vec<u32> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| id(k))
        .collect();
    eos.sort_unstable();
    eos.dedup();

    let experts = opt_u("expert_count").unwrap_or(0);
    let moe_layers: Vec<bool> = (0..layers)
        .map(|l| experts > 0 && f.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_some())
        .collect();
    let ffn = opt_u("feed_forward_length").unwrap_or(0);
    let expert_ffn = opt_u("expert_feed_forward_length").unwrap_or(ffn);
    let norm_topk_default = matches!(family, Family::Mixtral | Family::Qwen3Moe);
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
        max_position_embeddings: opt_u("context_length").unwrap_or(4096),
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        qk_norm: match family {
            Family::Olmoe => QkNorm::Full,
            Family::Qwen3Moe => QkNorm::PerHead,
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
        moe_layers,
        eos_token_ids: eos,
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        qk_rows_interleaved: arch == "llama",
        mixers: vec![MixerKind::Attention; layers],
        delta_net: None,
        rotary_dim: head_dim,
        attn_output_gate: false,
        zero_centred_norms: false,
        vision_ignored: false,
    };
    cfg.validate().map_err(|reason| bad(f, reason))?;
    Ok(cfg)
}

/// Where a Hugging Face tensor name lives in a GGUF file.
#[derive(Debug, PartialEq, Eq)]
enum Mapped {
    /// A tensor of its own.
    Whole(String),
    /// Slice `index` of a stacked expert tensor.
    Slice(String, usize),
}

/// Maps a Hugging Face tensor name to llama.cpp's.
fn map_name(hf: &str) -> Option<Mapped> {
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
    match rest {
        "input_layernorm.weight" => return blk("attn_norm.weight"),
        "post_attention_layernorm.weight" => return blk("ffn_norm.weight"),
        "self_attn.q_proj.weight" => return blk("attn_q.weight"),
        "self_attn.k_proj.weight" => return blk("attn_k.weight"),
        "self_attn.v_proj.weight" => return blk("attn_v.weight"),
        "self_attn.o_proj.weight" => return blk("attn_output.weight"),
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
        _ => {}
    }
    let experts = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))?;
    let (e, proj) = experts.split_once('.')?;
    let e: usize = e.parse().ok()?;
    let kind = match proj {
        "gate_proj.weight" | "w1.weight" => "gate",
        "up_proj.weight" | "w3.weight" => "up",
        "down_proj.weight" | "w2.weight" => "down",
        _ => return None,
    };
    Some(Mapped::Slice(format!("blk.{l}.ffn_{kind}_exps.weight"), e))
}

impl WeightSource for GgufModel {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        let missing = || {
            LoadError::Gguf(GgufError::MissingTensor {
                path: self.file.path().to_path_buf(),
                name: name.to_string(),
            })
        };
        match map_name(name).ok_or_else(missing)? {
            Mapped::Whole(g) => {
                let t = self.file.tensor(&g).ok_or_else(missing)?;
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
                Err(LoadError::Gguf(GgufError::MissingTensor {
                    path: self.file.path().to_path_buf(),
                    name: format!("{g} (for {name})"),
                }))
            }
        }
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        match map_name(name) {
            Some(Mapped::Whole(g)) => Ok(self.file.vector(&g, len)?),
            _ => Err(LoadError::Gguf(GgufError::MissingTensor {
                path: self.file.path().to_path_buf(),
                name: name.to_string(),
            })),
        }
    }

    /// Only 1-D arrays are read from GGUF files so far (the families that
    /// need more, such as a DeltaNet conv weight, are not mapped yet).
    fn array(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        match shape {
            [len] => self.vector(name, *len),
            _ => Err(LoadError::Gguf(GgufError::MissingTensor {
                path: self.file.path().to_path_buf(),
                name: format!("{name} (a {}-D tensor, not read from GGUF files yet)", shape.len()),
            })),
        }
    }

    fn contains(&self, name: &str) -> bool {
        match map_name(name) {
            Some(Mapped::Whole(g)) | Some(Mapped::Slice(g, _)) => self.file.tensor(&g).is_some(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_llama_cpp() {
        assert_eq!(
            map_name("model.embed_tokens.weight"),
            Some(Mapped::Whole("token_embd.weight".into()))
        );
        assert_eq!(
            map_name("model.layers.3.self_attn.k_norm.weight"),
            Some(Mapped::Whole("blk.3.attn_k_norm.weight".into()))
        );
        assert_eq!(
            map_name("model.layers.0.block_sparse_moe.experts.5.w3.weight"),
            Some(Mapped::Slice("blk.0.ffn_up_exps.weight".into(), 5))
        );
        assert_eq!(
            map_name("model.layers.12.mlp.experts.63.down_proj.weight"),
            Some(Mapped::Slice("blk.12.ffn_down_exps.weight".into(), 63))
        );
        assert_eq!(
            map_name("model.layers.1.mlp.shared_expert_gate.weight"),
            Some(Mapped::Whole("blk.1.ffn_gate_inp_shexp.weight".into()))
        );
        assert_eq!(map_name("model.layers.x.mlp.gate.weight"), None);
        assert_eq!(map_name("something.else"), None);
    }
}
