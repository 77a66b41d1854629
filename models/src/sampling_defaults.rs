//! The sampling settings a model's authors recommend: `generation_config.json`'s
//! `temperature`, `top_p`, `top_k`, `min_p` and `repetition_penalty`, or the
//! `general.sampling.*` keys llama.cpp's converter copies from it into a GGUF.
//! The API uses them for the fields a request leaves out (as vLLM and
//! llama-server do); the command line keeps its own flags. Ranges are checked
//! where they are used (the coordinator's sampler), not here.

use charm_common::gguf::{GgufFile, MetaValue};

use crate::config::RawConfig;
use crate::error::ModelError;

/// A model's recommended sampling settings; `None` where it names none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingDefaults {
    /// `temperature` (`general.sampling.temp`).
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `top_k` (0: off).
    pub top_k: Option<usize>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `repetition_penalty` (`general.sampling.penalty_repeat`).
    pub repetition_penalty: Option<f32>,
}

impl SamplingDefaults {
    /// From a parsed `generation_config.json`. `do_sample` is not consulted:
    /// like vLLM and llama.cpp's converter, the values stated are the values
    /// used.
    pub fn from_generation_config(gen: &RawConfig) -> Result<Self, ModelError> {
        let f = |k: &str| gen.f64_opt(&[k]).map(|v| v.map(|v| v as f32));
        Ok(SamplingDefaults {
            temperature: f("temperature")?,
            top_p: f("top_p")?,
            top_k: gen.usize_opt(&["top_k"])?,
            min_p: f("min_p")?,
            repetition_penalty: f("repetition_penalty")?,
        })
    }

    /// From a GGUF's `general.sampling.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Self {
        let f = |k: &str| {
            file.meta(&format!("general.sampling.{k}"))
                .and_then(MetaValue::as_f64)
                .map(|v| v as f32)
        };
        SamplingDefaults {
            temperature: f("temp"),
            top_p: f("top_p"),
            top_k: file
                .meta("general.sampling.top_k")
                .and_then(MetaValue::as_u64)
                .map(|v| v as usize),
            min_p: f("min_p"),
            repetition_penalty: f("penalty_repeat"),
        }
    }

    /// Whether the model names no setting.
    pub fn is_empty(&self) -> bool {
        *self == SamplingDefaults::default()
    }

    /// `temperature 0.6, top_p 0.95, top_k 20` (the settings named).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut put = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                parts.push(format!("{name} {v}"));
            }
        };
        put("temperature", self.temperature.map(|v| v.to_string()));
        put("top_p", self.top_p.map(|v| v.to_string()));
        put("top_k", self.top_k.map(|v| v.to_string()));
        put("min_p", self.min_p.map(|v| v.to_string()));
        put("repetition_penalty", self.repetition_penalty.map(|v| v.to_string()));
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> RawConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("generation_config.json");
        std::fs::write(&path, json).unwrap();
        RawConfig::read(&path).unwrap()
    }

    #[test]
    fn reads_the_stated_settings_and_nothing_else() {
        let d = SamplingDefaults::from_generation_config(&raw(
            r#"{"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": null, "eos_token_id": 2}"#,
        ))
        .unwrap();
        assert_eq!(
            d,
            SamplingDefaults {
                temperature: Some(0.6),
                top_p: Some(0.95),
                top_k: Some(20),
                min_p: None,
                repetition_penalty: None,
            }
        );
        assert_eq!(d.describe(), "temperature 0.6, top_p 0.95, top_k 20");
        let none = SamplingDefaults::from_generation_config(&raw(r#"{"eos_token_id": 2}"#)).unwrap();
        assert!(none.is_empty());
    }

    /// A GGUF v3 file of metadata only: (key, type id, value bytes).
    fn gguf_meta(kvs: &[(&str, u32, Vec<u8>)]) -> GgufFile {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in kvs {
            b.extend_from_slice(&(k.len() as u64).to_le_bytes());
            b.extend_from_slice(k.as_bytes());
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(v);
        }
        GgufFile::from_bytes("m.gguf", b).unwrap()
    }

    #[test]
    fn reads_llama_cpps_sampling_keys() {
        // As the converter writes them: floats as f32 (6), top_k as i32 (5).
        let f = gguf_meta(&[
            ("general.sampling.temp", 6, 0.7f32.to_le_bytes().to_vec()),
            ("general.sampling.top_k", 5, 40i32.to_le_bytes().to_vec()),
            ("general.sampling.penalty_repeat", 6, 1.05f32.to_le_bytes().to_vec()),
            ("general.sampling.penalty_last_n", 5, 64i32.to_le_bytes().to_vec()),
        ]);
        assert_eq!(
            SamplingDefaults::from_gguf(&f),
            SamplingDefaults {
                temperature: Some(0.7),
                top_p: None,
                top_k: Some(40),
                min_p: None,
                repetition_penalty: Some(1.05),
            }
        );
        assert!(SamplingDefaults::from_gguf(&gguf_meta(&[])).is_empty());
    }

    #[test]
    fn a_malformed_setting_is_a_config_error() {
        let e = SamplingDefaults::from_generation_config(&raw(r#"{"top_k": "twenty"}"#)).unwrap_err();
        assert!(e.to_string().contains("top_k"), "{e}");
    }
}
