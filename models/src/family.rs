//! The model families charm implements, found from `architectures`.

use crate::config::{ModelConfig, RawConfig};
use crate::error::ModelError;
use crate::{
    deepseek_v3, deepseek_v32, glm4_moe, glm4_moe_lite, gpt_oss, llama, mimo_v2_flash, minimax_m2, mixtral, olmoe,
    qwen2_moe, qwen3_5_moe, qwen3_moe, qwen3_next,
};

/// A supported architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Olmoe,
    Qwen3Moe,
    Mixtral,
    Qwen2Moe,
    /// Dense Llama (no routed experts).
    Llama,
    /// Gated DeltaNet + gated attention hybrid.
    Qwen3Next,
    /// Qwen3.5 / Qwen3.6 MoE, the same hybrid with separate projections.
    Qwen35Moe,
    /// DeepSeek-V3 / R1 / Kimi K2: latent attention, sigmoid group router.
    DeepseekV3,
    /// GLM-4.5 … 4.7: GQA with partial rotary, the DeepSeek MoE.
    Glm4Moe,
    /// GLM-4.7-Flash: latent attention, the DeepSeek MoE.
    Glm4MoeLite,
    /// MiniMax-M2: full-width QK-norm, sigmoid router.
    MiniMaxM2,
    /// DeepSeek-V3.2: DeepSeek-V3 with sparse attention (an indexer).
    DeepseekV32,
    /// GLM-5.x: latent attention with sparse attention whose selection
    /// some layers share, the DeepSeek MoE.
    GlmMoeDsa,
    /// gpt-oss: sinks, alternating sliding windows, clamped biased experts.
    GptOss,
    /// MiMo-V2-Flash: sliding layers with their own KV heads, rope and
    /// sinks; value heads narrower than query/key heads; the DeepSeek router.
    MiMoV2Flash,
}

/// Tensor naming of a family's MoE block.
#[derive(Clone, Copy, Debug)]
pub struct MoeNames {
    /// Module holding router and experts under `model.layers.N.`
    /// (`mlp` or `block_sparse_moe`).
    pub block: &'static str,
    /// The router module under the block (`gate`, or gpt-oss's `router`).
    pub router: &'static str,
    /// Projection names of one expert: gate, up, down.
    pub proj: [&'static str; 3],
    /// The sigmoid router's selection bias under the block.
    pub router_bias: &'static str,
}

impl Family {
    /// Every supported family.
    pub const ALL: [Family; 15] = [
        Family::Olmoe,
        Family::Qwen3Moe,
        Family::Mixtral,
        Family::Qwen2Moe,
        Family::Llama,
        Family::Qwen3Next,
        Family::Qwen35Moe,
        Family::DeepseekV3,
        Family::Glm4Moe,
        Family::Glm4MoeLite,
        Family::MiniMaxM2,
        Family::DeepseekV32,
        Family::GlmMoeDsa,
        Family::GptOss,
        Family::MiMoV2Flash,
    ];

    /// The `architectures` entry of this family.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Olmoe => "OlmoeForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
            Family::Qwen2Moe => "Qwen2MoeForCausalLM",
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen3Next => "Qwen3NextForCausalLM",
            Family::Qwen35Moe => "Qwen3_5MoeForCausalLM",
            Family::DeepseekV3 => "DeepseekV3ForCausalLM",
            Family::Glm4Moe => "Glm4MoeForCausalLM",
            Family::Glm4MoeLite => "Glm4MoeLiteForCausalLM",
            Family::MiniMaxM2 => "MiniMaxM2ForCausalLM",
            Family::DeepseekV32 => "DeepseekV32ForCausalLM",
            Family::GlmMoeDsa => "GlmMoeDsaForCausalLM",
            Family::GptOss => "GptOssForCausalLM",
            Family::MiMoV2Flash => "MiMoV2FlashForCausalLM",
        }
    }

    /// Other `architectures` entries read as this family (a wrapper whose
    /// language model is this family).
    fn aliases(self) -> &'static [&'static str] {
        match self {
            Family::Qwen35Moe => &["Qwen3_5MoeForConditionalGeneration"],
            // Kimi K2.5's vision-language wrapper around a DeepSeek-V3 text model.
            Family::DeepseekV3 => &["KimiK25ForConditionalGeneration"],
            _ => &[],
        }
    }

    /// Finds the family from `architectures` (or `model_type` when the list
    /// is absent). Unknown names are an error that lists what is supported.
    pub fn from_config(raw: &RawConfig) -> Result<Family, ModelError> {
        let supported = || Family::ALL.iter().map(|f| f.architecture()).collect();
        if let Some(list) = raw.lookup(&["architectures"]).and_then(|v| v.as_array()) {
            let names: Vec<&str> = list.iter().filter_map(|v| v.as_str()).collect();
            for name in &names {
                if let Some(f) = Family::ALL
                    .iter()
                    .find(|f| f.architecture() == *name || f.aliases().contains(name))
                {
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
            "qwen3_next" => Family::Qwen3Next,
            "qwen3_5_moe" | "qwen3_5_moe_text" => Family::Qwen35Moe,
            "deepseek_v3" | "kimi_k2" | "kimi_k25" => Family::DeepseekV3,
            "glm4_moe" => Family::Glm4Moe,
            "glm4_moe_lite" => Family::Glm4MoeLite,
            "minimax_m2" => Family::MiniMaxM2,
            "deepseek_v32" => Family::DeepseekV32,
            "glm_moe_dsa" => Family::GlmMoeDsa,
            "gpt_oss" => Family::GptOss,
            "mimo_v2_flash" => Family::MiMoV2Flash,
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
            Family::Qwen3Next => qwen3_next::parse(raw),
            Family::Qwen35Moe => qwen3_5_moe::parse(raw),
            Family::DeepseekV3 => deepseek_v3::parse(raw),
            Family::Glm4Moe => glm4_moe::parse(raw),
            Family::Glm4MoeLite => glm4_moe_lite::parse(raw),
            Family::MiniMaxM2 => minimax_m2::parse(raw),
            Family::DeepseekV32 => deepseek_v32::parse(raw, Family::DeepseekV32),
            Family::GlmMoeDsa => deepseek_v32::parse(raw, Family::GlmMoeDsa),
            Family::GptOss => gpt_oss::parse(raw),
            Family::MiMoV2Flash => mimo_v2_flash::parse(raw),
        }
    }

    /// How this family names its router and experts.
    pub fn moe_names(self) -> MoeNames {
        match self {
            Family::Mixtral | Family::MiniMaxM2 => mixtral::MOE_NAMES,
            Family::Olmoe
            | Family::Qwen3Moe
            | Family::Qwen2Moe
            | Family::Llama
            | Family::Qwen3Next
            | Family::Qwen35Moe
            | Family::DeepseekV3
            | Family::Glm4Moe
            | Family::Glm4MoeLite
            | Family::DeepseekV32
            | Family::GlmMoeDsa
            | Family::GptOss
            | Family::MiMoV2Flash => MoeNames {
                block: "mlp",
                router: if self == Family::GptOss { "router" } else { "gate" },
                proj: ["gate_proj", "up_proj", "down_proj"],
                router_bias: "gate.e_score_correction_bias",
            },
        }
    }
}

impl MoeNames {
    /// `model.layers.{layer}.{block}.{router}.weight`, the router.
    pub fn router(&self, layer: usize) -> String {
        format!("model.layers.{layer}.{}.{}.weight", self.block, self.router)
    }

    /// `model.layers.{layer}.{block}.{router}.bias`, the router's logit bias.
    pub fn router_logit_bias(&self, layer: usize) -> String {
        format!("model.layers.{layer}.{}.{}.bias", self.block, self.router)
    }

    /// `model.layers.{layer}.{block}.{router_bias}`, the sigmoid router's
    /// selection bias.
    pub fn router_bias(&self, layer: usize) -> String {
        format!("model.layers.{layer}.{}.{}", self.block, self.router_bias)
    }

    /// The gate, up and down projection names of one expert.
    pub fn expert(&self, layer: usize, expert: usize) -> [String; 3] {
        self.proj
            .map(|p| format!("model.layers.{layer}.{}.experts.{expert}.{p}.weight", self.block))
    }
}
