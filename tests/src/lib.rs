//! Helpers shared by charm's integration tests (`tests/tests/*.rs`).
//!
//! - [`repo_root`], [`fixture`]: where the committed fixtures live
//!   (`tests/fixtures/<name>/`: a tiny model directory plus the
//!   `reference.json` that transformers produced for it).
//! - [`Reference`]: `reference.json`, deserialized.
//! - [`material`]: files fetched by `scripts/fetch_test_material.sh`
//!   (gitignored); a missing one panics with a message saying to run the
//!   script, so a test never passes by silently skipping.
//! - [`argmax`], [`max_abs_diff`], [`tolerance`]: the comparisons the
//!   parity tests share.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The five model fixtures, one per family (plus the real-tokenizer chat one).
pub const FAMILY_FIXTURES: [&str; 5] = ["olmoe", "qwen3moe", "mixtral", "qwen2moe", "qwen3moe-chat"];

/// Relative tolerance of logits against the reference:
/// `max |ours - ref| <= LOGIT_RTOL * max(1, max |ref|)`.
pub const LOGIT_RTOL: f32 = 1e-4;

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// `tests/fixtures/<name>`; panics if it does not exist.
pub fn fixture(name: &str) -> PathBuf {
    let dir = repo_root().join("tests").join("fixtures").join(name);
    assert!(
        dir.is_dir(),
        "fixture {} is missing (it is committed; is the checkout complete?)",
        dir.display()
    );
    dir
}

/// A file fetched by `scripts/fetch_test_material.sh`, relative to the
/// repository root (e.g. `tests/material/olmo/tokenizer.json` or
/// `tests/fixtures/qwen3moe-chat/tokenizer.json`). Panics, naming the
/// script, when it is missing.
pub fn material(rel: impl AsRef<Path>) -> PathBuf {
    let path = repo_root().join(rel.as_ref());
    if !path.exists() {
        panic!(
            "test material {} is missing: run scripts/fetch_test_material.sh \
             (it fetches the tokenizer files the tests need; they are gitignored)",
            path.display()
        );
    }
    path
}

/// `tests/fixtures/<name>/reference.json`, written by `scripts/make_fixtures.py`
/// from transformers.
#[derive(Clone, Debug, Deserialize)]
pub struct Reference {
    /// `olmoe`, `qwen3_moe`, `mixtral` or `qwen2_moe`.
    pub family: String,
    /// The dtype the weights are stored in (`float32`, `bfloat16`, `float16`).
    pub stored_dtype: String,
    pub prompt_ids: Vec<u32>,
    /// 16 greedy ids after the prompt (eos ignored).
    pub greedy_ids: Vec<u32>,
    /// Argmax at every position of one forward over `prompt_ids + greedy_ids`.
    pub teacher_forced_argmax: Vec<u32>,
    /// Full-vocabulary float32 logits at the last position of that forward.
    #[serde(default)]
    pub last_logits: Option<Vec<f32>>,
    /// The top 64 of those logits, for fixtures with a large vocabulary.
    #[serde(default)]
    pub last_logits_top: Option<TopLogits>,
    /// Smallest top-1 minus top-2 logit gap over every position checked.
    pub min_margin: f32,
    /// Smallest gap between the k-th and (k+1)-th router probability.
    #[serde(default)]
    pub min_router_gap: Option<f32>,
    /// Distinct experts chosen per MoE layer over the teacher-forced forward.
    #[serde(default)]
    pub distinct_experts_per_layer: Option<Vec<usize>>,
}

/// The highest logits of one position, best first.
#[derive(Clone, Debug, Deserialize)]
pub struct TopLogits {
    pub top_ids: Vec<u32>,
    pub top_logits: Vec<f32>,
}

impl Reference {
    /// Reads `tests/fixtures/<name>/reference.json`.
    pub fn load(name: &str) -> Reference {
        let path = fixture(name).join("reference.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not a reference.json: {e}", path.display()))
    }

    /// `prompt_ids + greedy_ids`: the sequence of the teacher-forced forward.
    pub fn full_sequence(&self) -> Vec<u32> {
        let mut all = self.prompt_ids.clone();
        all.extend_from_slice(&self.greedy_ids);
        all
    }

    /// Share of positions of [`Reference::full_sequence`] whose argmax in
    /// `logits` (one row per position) is the reference's teacher-forced one.
    pub fn top1_agreement(&self, logits: &[f32]) -> f64 {
        let n = self.teacher_forced_argmax.len();
        assert_eq!(logits.len() % n, 0, "one logit row per position");
        let agree = logits
            .chunks(logits.len() / n)
            .zip(&self.teacher_forced_argmax)
            .filter(|(row, &want)| argmax(row) == want)
            .count();
        agree as f64 / n as f64
    }

    /// The reference's last-position logits as `(token id, logit)` pairs:
    /// the whole vocabulary, or the stored top entries.
    pub fn last_logit_entries(&self) -> Vec<(u32, f32)> {
        match (&self.last_logits, &self.last_logits_top) {
            (Some(all), _) => all.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect(),
            (None, Some(top)) => {
                assert_eq!(top.top_ids.len(), top.top_logits.len());
                top.top_ids
                    .iter()
                    .copied()
                    .zip(top.top_logits.iter().copied())
                    .collect()
            }
            (None, None) => panic!("reference has neither last_logits nor last_logits_top"),
        }
    }
}

/// Index of the largest value (the first one on ties, like `torch.argmax`).
pub fn argmax(x: &[f32]) -> u32 {
    assert!(!x.is_empty(), "argmax of an empty row");
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Largest `|a[i] - b[i]|`; NaN anywhere gives infinity.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "comparing rows of different lengths");
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    })
}

/// The allowed max abs difference against reference values `reference`:
/// `LOGIT_RTOL * max(1, max |ref|)`.
pub fn tolerance(reference: &[f32]) -> f32 {
    LOGIT_RTOL * reference.iter().fold(1.0f32, |m, v| m.max(v.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "run scripts/fetch_test_material.sh")]
    fn missing_material_names_the_fetch_script() {
        material("tests/material/no-such-file.json");
    }

    #[test]
    fn every_family_fixture_has_a_reference() {
        for name in FAMILY_FIXTURES {
            let r = Reference::load(name);
            assert_eq!(r.greedy_ids.len(), 16, "{name}");
            assert!(!r.last_logit_entries().is_empty(), "{name}");
        }
    }

    #[test]
    fn comparisons() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 1.0]), 1.0);
        assert_eq!(max_abs_diff(&[f32::NAN], &[0.0]), f32::INFINITY);
        assert_eq!(tolerance(&[0.5]), LOGIT_RTOL);
        assert_eq!(tolerance(&[-20.0, 3.0]), 20.0 * LOGIT_RTOL);
    }
}
