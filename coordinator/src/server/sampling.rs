//! A request's sampling fields and what fills the ones it leaves out: the
//! model's recommended settings ([`SamplingDefaults`]: `generation_config.json`
//! or a GGUF's `general.sampling.*`, as vLLM and llama-server use them), then
//! OpenAI's defaults (temperature 1, everything else off).
//!
//! OpenAI's `temperature`, `top_p`, `presence_penalty`, `frequency_penalty`
//! and `logit_bias` (token id strings to a bias in [-100, 100]), with
//! vLLM's and llama.cpp's extensions `top_k`, `min_p` and
//! `repetition_penalty`. Out-of-range values are refused with a 400 naming
//! the field; nothing is silently ignored.

use std::collections::BTreeMap;

use charm_models::SamplingDefaults;
use serde::Deserialize;

use super::error::ApiError;
use crate::sampler::SamplingParams;

/// The sampling fields of an OpenAI request (flattened into it).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SamplingFields {
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub logit_bias: Option<BTreeMap<String, f32>>,
}

impl SamplingFields {
    /// The settings to sample with: the request's, else the model's, else
    /// OpenAI's defaults; checked against the ranges and the vocabulary.
    pub fn resolve(self, model: &SamplingDefaults, vocab: usize, seed: u64) -> Result<SamplingParams, ApiError> {
        let mut logit_bias = Vec::new();
        for (key, bias) in self.logit_bias.unwrap_or_default() {
            let id: u32 = key.trim().parse().map_err(|_| {
                ApiError::invalid_param("logit_bias", format!("logit_bias keys are token ids; got {key:?}"))
            })?;
            if id as usize >= vocab {
                return Err(ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias names token {id}; the vocabulary has {vocab} tokens"),
                ));
            }
            logit_bias.push((id, bias));
        }
        let p = SamplingParams {
            temperature: self.temperature.or(model.temperature).unwrap_or(1.0),
            top_p: self.top_p.or(model.top_p).unwrap_or(1.0),
            top_k: self.top_k.or(model.top_k).unwrap_or(0),
            min_p: self.min_p.or(model.min_p).unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.or(model.repetition_penalty).unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias,
            seed,
        };
        p.validate().map_err(ApiError::invalid)?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_wins_then_the_model_then_openai() {
        let model = SamplingDefaults {
            temperature: Some(0.6),
            top_k: Some(20),
            min_p: Some(0.05),
            ..Default::default()
        };
        let asked = SamplingFields {
            temperature: Some(0.2),
            presence_penalty: Some(0.5),
            ..Default::default()
        };
        let p = asked.resolve(&model, 100, 9).unwrap();
        assert_eq!(
            p,
            SamplingParams {
                temperature: 0.2,
                top_p: 1.0,
                top_k: 20,
                min_p: 0.05,
                repetition_penalty: 1.0,
                presence_penalty: 0.5,
                frequency_penalty: 0.0,
                logit_bias: vec![],
                seed: 9,
            }
        );
        let plain = SamplingFields::default()
            .resolve(&SamplingDefaults::default(), 100, 0)
            .unwrap();
        assert_eq!(plain.temperature, 1.0);
        assert_eq!(plain.top_k, 0);
    }

    #[test]
    fn logit_bias_keys_must_be_ids_in_the_vocabulary() {
        let with = |k: &str, b: f32| SamplingFields {
            logit_bias: Some(BTreeMap::from([(k.to_string(), b)])),
            ..Default::default()
        };
        let ok = with("42", -100.0)
            .resolve(&SamplingDefaults::default(), 100, 0)
            .unwrap();
        assert_eq!(ok.logit_bias, vec![(42, -100.0)]);
        for (k, b, says) in [
            ("word", 1.0, "token ids"),
            ("100", 1.0, "vocabulary has 100"),
            ("-1", 1.0, "token ids"),
            ("7", 150.0, "must be in"),
        ] {
            let e = with(k, b).resolve(&SamplingDefaults::default(), 100, 0).unwrap_err();
            assert!(e.message.contains(says), "{k} {b}: {}", e.message);
        }
    }
}
