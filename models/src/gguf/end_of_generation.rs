//! The tokens that end a generation in a GGUF model.
//!
//! A Hugging Face directory lists them in `generation_config.json`
//! (`eos_token_id`, often several: GLM-4.5's `<|endoftext|>`, `<|user|>`
//! and `<|observation|>`; gpt-oss's `<|return|>` and `<|call|>`). llama.cpp's
//! converter keeps only the tokenizer config's `eos_token` and, for some
//! families, an `eot` / `eom` token, and llama.cpp then ends a generation
//! at those and at every token whose text is a known end of turn
//! (`llama-vocab.cpp`, `special_eog_ids`). charm does the same, so that a
//! GGUF file stops where its directory would: a gpt-oss tool call at
//! `<|call|>`, a GLM tool call at `<|observation|>`, a Kimi K2 turn at
//! `<|im_end|>`.

use charm_common::gguf::{GgufFile, MetaValue};

/// Token texts that end a generation wherever they are in a vocabulary
/// (the ones of llama.cpp's list that the families charm runs use).
const END_OF_TURN: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The ids that end a generation: `tokenizer.ggml.{eos,eot,eom}_token_id`
/// and the tokens whose text is in [`END_OF_TURN`], sorted. In harmony's
/// vocabulary (`<|return|>` and `<|call|>` present) `<|end|>` ends one
/// message of an answer, not the answer, and is left out.
pub fn end_of_generation_ids(f: &GgufFile) -> Vec<u32> {
    let mut ids: Vec<u32> = ["eos", "eot", "eom"]
        .iter()
        .filter_map(|k| f.meta(&format!("tokenizer.ggml.{k}_token_id")))
        .filter_map(MetaValue::as_u64)
        .map(|v| v as u32)
        .collect();
    // The end-of-turn tokens present, by text, in one pass.
    let mut found: Vec<(&str, u32)> = Vec::new();
    if let Some(tokens) = f.meta("tokenizer.ggml.tokens").and_then(MetaValue::as_array) {
        for (i, t) in tokens.iter().enumerate() {
            if let Some(text) = t.as_str().filter(|t| END_OF_TURN.contains(t)) {
                found.push((text, i as u32));
            }
        }
    }
    let has = |text: &str| found.iter().any(|&(t, _)| t == text);
    let harmony = has("<|return|>") && has("<|call|>");
    ids.extend(
        found
            .iter()
            .filter(|&&(t, _)| !(harmony && t == "<|end|>"))
            .map(|&(_, i)| i),
    );
    if harmony {
        // Even where a converter named it eos / eot.
        let end: Vec<u32> = found
            .iter()
            .filter(|&&(t, _)| t == "<|end|>")
            .map(|&(_, i)| i)
            .collect();
        ids.retain(|i| !end.contains(i));
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// A metadata-only GGUF with `tokens` and the given special token ids.
    fn vocab(tokens: &[&str], special: &[(&str, u32)]) -> GgufFile {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&(1 + special.len() as u64).to_le_bytes());
        put_str(&mut b, "tokenizer.ggml.tokens");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            put_str(&mut b, t);
        }
        for (k, v) in special {
            put_str(&mut b, &format!("tokenizer.ggml.{k}_token_id"));
            b.extend_from_slice(&4u32.to_le_bytes());
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.resize(b.len().div_ceil(32) * 32, 0);
        GgufFile::from_bytes("vocab.gguf", b).unwrap()
    }

    #[test]
    fn harmony_ends_at_return_and_call_but_not_at_end() {
        // gpt-oss's converter writes only eos = <|return|>.
        let f = vocab(
            &["a", "<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"],
            &[("eos", 3)],
        );
        assert_eq!(end_of_generation_ids(&f), [3, 4, 5]);
    }

    #[test]
    fn glm_ends_at_its_eot_and_eom_tokens() {
        // GLM-4.5's converter: eos <|endoftext|>, eot <|user|>, eom <|observation|>.
        let f = vocab(
            &["a", "<|endoftext|>", "<|user|>", "<|observation|>", "<|assistant|>"],
            &[("eos", 1), ("eot", 2), ("eom", 3)],
        );
        assert_eq!(end_of_generation_ids(&f), [1, 2, 3]);
    }

    #[test]
    fn kimi_ends_at_im_end_beside_its_eos() {
        // Kimi K2's tokenizer config names [EOS]; a turn ends at <|im_end|>.
        let f = vocab(&["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "[EOT]"], &[("eos", 1)]);
        assert_eq!(end_of_generation_ids(&f), [1, 2, 4]);
        // <|end|> ends a generation where harmony's markers are absent.
        let f = vocab(&["a", "<|end|>"], &[]);
        assert_eq!(end_of_generation_ids(&f), [1]);
        // No tokenizer: only the ids given.
        let f = vocab(&[], &[("eos", 7)]);
        assert_eq!(end_of_generation_ids(&f), [7]);
    }
}
