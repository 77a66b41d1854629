//! The model families charm implements, found from `architectures`.

use crate::config::{ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::{llama, mixtral, olmoe, qwen2_moe, qwen3_moe};

/// A supported architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Olmoe,
    Qwen3Moe,
    Mixtral,
    Qwen2Moe,
    /// Dense Llama (no routed experts).
    Llama,
}

/// Tensor naming of a family's MoE block.
#[derive(Clone, Copy, Debug)]
pub struct MoeNames {
    /// Module holding router and experts under `model.layers.N.`
    /// (`mlp` or `block_sparse_moe`).
    pub block: &'static str,
    /// Projection names of one expert: gate, up, down.
    pub proj: [&'static str; 3],
}

impl Family {
    /// Every supported family.
    pub const ALL: [Family; 5] = [
        Family::Olmoe,
        Family::Qwen3Moe,
        Family::Mixtral,
        Family::Qwen2Moe,
        Family::Llama,
    ];

    /// The `architectures` entry of this family.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Olmoe => "OlmoeForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
            Family::Qwen2Moe => "Qwen2MoeForCausalLM",
            Family::Llama => "LlamaForCausalLM",
        }
    }

    /// Finds the family from `architectures` (or `model_type` when the list
    /// is absent). Unknown names are an error that lists what is supported.
    pub fn from_config(raw: &RawConfig) -> Result<Family, ModelError> {
        let supported = || Family::ALL.iter().map(|f| f.architecture()).collect();
        if let Some(list) = raw.lookup(&["architectures"]).and_then(|v| v.as_array()) {
            let names: Vec<&str> = list.iter().filter_map(|v| v.as_str()).collect();
            for name in &names {
                if let Some(f) = Family::ALL.iter().find(|f| f.architecture() == *name) {
                    return Ok(*f);
                }
            }
            return Err(ModelError::UnknownArchitecture {
                name: names.join(", "),
                supported: supported(),
            });
        }
        let model_type = raw.str_opt(&["model_type"]).unwrap_or("");
        let f = match model_type {
            "olmoe" => Family::Olmoe,
            "qwen3_moe" => Family::Qwen3Moe,
            "mixtral" => Family::Mixtral,
            "qwen2_moe" => Family::Qwen2Moe,
            "llama" => Family::Llama,
            _ => {
                return Err(ModelError::UnknownArchitecture {
                    name: format!("(no architectures; model_type {model_type:?})"),
                    supported: supported(),
                })
            }
        };
        Ok(f)
    }

    /// Parses a config of this family.
    pub fn parse(self, raw: &RawConfig) -> Result<ModelConfig, ModelError> {
        match self {
            Family::Olmoe => olmoe::parse(raw),
            Family::Qwen3Moe => qwen3_moe::parse(raw),
            Family::Mixtral => mixtral::parse(raw),
            Family::Qwen2Moe => qwen2_moe::parse(raw),
            Family::Llama => llama::parse(raw),
        }
    }

    /// How this family names its router and experts.
    pub fn moe_names(self) -> MoeNames {
        match self {
            Family::Mixtral => mixtral::MOE_NAMES,
            Family::Olmoe | Family::Qwen3Moe | Family::Qwen2Moe | Family::Llama => MoeNames {
                block: "mlp",
                proj: ["gate_proj", "up_proj", "down_proj"],
            },
        }
    }
}

impl MoeNames {
    /// `model.layers.{layer}.{block}.gate.weight`, the router.
    pub fn router(&self, layer: usize) -> String {
        format!("model.layers.{layer}.{}.gate.weight", self.block)
    }

    /// The gate, up and down projection names of one expert.
    pub fn expert(&self, layer: usize, expert: usize) -> [String; 3] {
        self.proj
            .map(|p| format!("model.layers.{layer}.{}.experts.{expert}.{p}.weight", self.block))
    }
}
