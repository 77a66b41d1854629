//! The tokenizer and chat template a GGUF file carries in its metadata
//! (`tokenizer.ggml.*`, `tokenizer.chat_template`), rebuilt as the
//! `tokenizer.json` the tokenizers crate reads, so a lone `.gguf` file is a
//! complete model.
//!
//! Supported: byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`)
//! with the pre-tokenizers llama.cpp names `default`/`gpt-2`/`olmo`,
//! `smollm`, `qwen2`, `llama-bpe` and `gpt-4o`; and SentencePiece BPE vocabularies
//! (`llama`: pieces with scores and byte-fallback tokens), rebuilt the way
//! transformers converts a SentencePiece model (merges ordered by the score
//! of the merged piece). Other kinds and pre-tokenizers are refused by name.

use charm_common::gguf::{GgufFile, MetaValue};
use serde_json::{json, Value};

/// GPT-2's pre-tokenizer: byte-level with its own split regex.
fn byte_level(use_regex: bool, trim_offsets: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": use_regex})
}

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k's split (llama.cpp's `gpt-4o`: gpt-oss, GPT-4o).
const GPT4O_REGEX: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `(normalizer, pre_tokenizer)` for a llama.cpp pre-tokenizer name.
fn pre_tokenizer(pre: &str) -> Option<(Value, Value)> {
    Some(match pre {
        "default" | "gpt-2" | "gpt2" | "olmo" => (Value::Null, byte_level(true, true)),
        "smollm" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true, true)
            ]}),
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false, false)]}),
        ),
        "llama-bpe" | "llama3" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false, true)]}),
        ),
        "gpt-4o" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(GPT4O_REGEX), byte_level(false, true)]}),
        ),
        _ => return None,
    })
}

/// llama.cpp token types.
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// The `tokenizer.json` equivalent of a GGUF file's tokenizer metadata.
pub fn tokenizer_json(f: &GgufFile) -> Result<Value, String> {
    let s = |k: &str| f.meta(k).and_then(MetaValue::as_str);
    let kind = s("tokenizer.ggml.model").ok_or("no tokenizer.ggml.model")?;
    if kind == "llama" {
        return sentencepiece_json(f);
    }
    if kind != "gpt2" {
        return Err(format!(
            "tokenizer.ggml.model {kind:?} is not supported (supported: gpt2 byte-level BPE, llama SentencePiece)"
        ));
    }
    let pre = s("tokenizer.ggml.pre").unwrap_or("default");
    let (normalizer, pre_tok) = pre_tokenizer(pre).ok_or_else(|| {
        format!(
            "tokenizer.ggml.pre {pre:?} is not supported (supported: default, gpt-2, olmo, smollm, qwen2, llama-bpe, gpt-4o)"
        )
    })?;
    let tokens = f
        .meta("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .ok_or("no tokenizer.ggml.tokens")?;
    let types = f.meta("tokenizer.ggml.token_type").and_then(MetaValue::as_array);
    let merges = f
        .meta("tokenizer.ggml.merges")
        .and_then(MetaValue::as_array)
        .ok_or("no tokenizer.ggml.merges")?;

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        let t = t.as_str().ok_or_else(|| format!("token {id} is not a string"))?;
        vocab.insert(t.to_string(), json!(id));
        let ty = types.and_then(|v| v.get(id)).and_then(MetaValue::as_i64).unwrap_or(1);
        if ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED {
            added.push(json!({
                "id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": ty == TOKEN_USER_DEFINED, "special": ty == TOKEN_CONTROL
            }));
        }
    }
    let merges: Vec<Value> = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.as_str()
                .map(|m| json!(m))
                .ok_or_else(|| format!("merge {i} is not a string"))
        })
        .collect::<Result<_, _>>()?;

    let id = |k: &str| f.meta(k).and_then(MetaValue::as_u64);
    let add_bos = f
        .meta("tokenizer.ggml.add_bos_token")
        .and_then(MetaValue::as_bool)
        .unwrap_or(false);
    let post = match (add_bos, id("tokenizer.ggml.bos_token_id")) {
        (true, Some(bos)) => {
            let bos_tok = tokens.get(bos as usize).and_then(MetaValue::as_str).unwrap_or("");
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos_tok, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos_tok: {"id": bos_tok, "ids": [bos], "tokens": [bos_tok]}}
            })
        }
        _ => byte_level(false, false),
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tok,
        "post_processor": post,
        "decoder": byte_level(true, true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            // o200k takes a whole pre-token that is in the vocabulary as it is
            // (its tokenizer.json says `ignore_merges`).
            "ignore_merges": pre == "gpt-4o",
            "vocab": vocab, "merges": merges
        }
    }))
}

/// `tokenizer.chat_template`, when present.
pub fn chat_template(f: &GgufFile) -> Option<String> {
    f.meta("tokenizer.chat_template")
        .and_then(MetaValue::as_str)
        .map(str::to_string)
}

/// The text of token `key` (`tokenizer.ggml.bos_token_id` → `"<s>"`).
pub fn token_text(f: &GgufFile, key: &str) -> String {
    let id = f.meta(key).and_then(MetaValue::as_u64);
    let tokens = f.meta("tokenizer.ggml.tokens").and_then(MetaValue::as_array);
    match (id, tokens) {
        (Some(i), Some(t)) => t.get(i as usize).and_then(MetaValue::as_str).unwrap_or("").to_string(),
        _ => String::new(),
    }
}

/// Writes `tokenizer.json` and `tokenizer_config.json` (special tokens and
/// chat template) for the GGUF file's tokenizer into `dir`, so a directory
/// made from a GGUF file is complete. A GGUF file without a tokenizer, or
/// with one charm cannot rebuild, writes nothing.
pub fn write_tokenizer_files(f: &GgufFile, dir: &std::path::Path) -> std::io::Result<()> {
    let Ok(codec) = crate::text::TextCodec::from_gguf(f) else {
        return Ok(());
    };
    let json = codec.tokenizer_json().map_err(std::io::Error::other)?;
    std::fs::write(dir.join("tokenizer.json"), json)?;
    let mut tc = json!({
        "bos_token": token_text(f, "tokenizer.ggml.bos_token_id"),
        "eos_token": token_text(f, "tokenizer.ggml.eos_token_id"),
    });
    if let Some(t) = chat_template(f) {
        tc["chat_template"] = json!(t);
    }
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_vec_pretty(&tc)?)
}

/// llama.cpp token type of byte-fallback pieces (`<0x0A>`).
const TOKEN_BYTE: i64 = 6;
/// llama.cpp token type of the unknown piece.
const TOKEN_UNKNOWN: i64 = 2;

/// The `tokenizer.json` of a SentencePiece (`llama`) vocabulary: BPE with
/// byte fallback over `▁`-prefixed pieces. Merges are every split of a piece
/// into two pieces of the vocabulary, ordered by the merged piece's score
/// (highest first; ties by the ids of the two halves), as transformers'
/// SentencePiece converter orders them.
fn sentencepiece_json(f: &GgufFile) -> Result<Value, String> {
    let tokens = f
        .meta("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .ok_or("no tokenizer.ggml.tokens")?;
    let scores = f
        .meta("tokenizer.ggml.scores")
        .and_then(MetaValue::as_array)
        .ok_or("no tokenizer.ggml.scores")?;
    if scores.len() != tokens.len() {
        return Err(format!("{} scores for {} tokens", scores.len(), tokens.len()));
    }
    let types = f.meta("tokenizer.ggml.token_type").and_then(MetaValue::as_array);
    let ty = |id: usize| types.and_then(|v| v.get(id)).and_then(MetaValue::as_i64).unwrap_or(1);
    let mut pieces: Vec<&str> = Vec::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        pieces.push(t.as_str().ok_or_else(|| format!("token {id} is not a string"))?);
    }
    let ids: std::collections::HashMap<&str, usize> = pieces.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let mut vocab = serde_json::Map::with_capacity(pieces.len());
    let mut added = Vec::new();
    let mut unk = None;
    for (id, p) in pieces.iter().enumerate() {
        vocab.insert(p.to_string(), json!(id));
        match ty(id) {
            TOKEN_CONTROL | TOKEN_UNKNOWN | TOKEN_USER_DEFINED => {
                if ty(id) == TOKEN_UNKNOWN {
                    unk = Some(p.to_string());
                }
                added.push(json!({
                    "id": id, "content": p, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": ty(id) != TOKEN_USER_DEFINED
                }));
            }
            _ => {}
        }
    }
    // (score of the merged piece, left id, right id, left, right)
    let mut merges: Vec<(f64, usize, usize, &str, &str)> = Vec::new();
    for (id, p) in pieces.iter().enumerate() {
        if ty(id) != 1 {
            continue; // only normal pieces are built by merges
        }
        let score = scores[id].as_f64().unwrap_or(0.0);
        for (split, _) in p.char_indices().skip(1) {
            let (l, r) = p.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((score, li, ri, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<Value> = merges
        .into_iter()
        .map(|(_, _, _, l, r)| json!(format!("{l} {r}")))
        .collect();
    let has_bytes = (0..pieces.len()).any(|i| ty(i) == TOKEN_BYTE);

    let id = |k: &str| f.meta(k).and_then(MetaValue::as_u64);
    let add_bos = f
        .meta("tokenizer.ggml.add_bos_token")
        .and_then(MetaValue::as_bool)
        .unwrap_or(true);
    let add_space = f
        .meta("tokenizer.ggml.add_space_prefix")
        .and_then(MetaValue::as_bool)
        .unwrap_or(true);
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let normalizer = if add_space {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]})
    } else {
        replace
    };
    let post = match (add_bos, id("tokenizer.ggml.bos_token_id")) {
        (true, Some(bos)) => {
            let b = pieces.get(bos as usize).copied().unwrap_or("");
            json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": b, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {b: {"id": b, "ids": [bos], "tokens": [b]}}
            })
        }
        _ => Value::Null,
    };
    let mut decoders = vec![json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "})];
    if has_bytes {
        decoders.push(json!({"type": "ByteFallback"}));
    }
    decoders.push(json!({"type": "Fuse"}));
    if add_space {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": post,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": has_bytes, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        }
    }))
}
