//! The tokenizer and chat template a GGUF file carries in its metadata
//! (`tokenizer.ggml.*`, `tokenizer.chat_template`), rebuilt as the
//! `tokenizer.json` the tokenizers crate reads, so a lone `.gguf` file is a
//! complete model.
//!
//! Supported: byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`)
//! with the pre-tokenizers llama.cpp's converter names for the families
//! charm runs ([`PRE_TOKENIZERS`]: Qwen2 … Qwen3.6, DeepSeek LLM / Coder /
//! V3, Kimi K2, GLM-4 … 5, gpt-oss, MiniMax-M2, Llama 3, OLMo, SmolLM and
//! GPT-2's kin), each rebuilt as the model's own `tokenizer.json` has it;
//! and SentencePiece BPE vocabularies (`llama`: pieces with scores and
//! byte-fallback tokens), rebuilt the way transformers converts a
//! SentencePiece model (merges ordered by the score of the merged piece).
//! Other kinds and pre-tokenizers are refused by name.

use charm_common::gguf::{GgufFile, MetaValue};
use serde_json::{json, Value};

/// GPT-2's pre-tokenizer: byte-level with its own split regex.
fn byte_level(use_regex: bool, trim_offsets: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": use_regex})
}

fn split(regex: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
}

/// Splits by each regex in turn, then byte-level without its own regex.
fn splits(regexes: &[&str], trim_offsets: bool) -> Value {
    let mut steps: Vec<Value> = regexes.iter().map(|r| split(r)).collect();
    steps.push(byte_level(false, trim_offsets));
    json!({"type": "Sequence", "pretokenizers": steps})
}

// The split regexes as the models' own `tokenizer.json` files write them
// (llama.cpp's `llama-vocab.cpp` carries rewritten equivalents of the same).

/// Qwen2 … Qwen3-Next (`qwen2`).
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5 / Qwen3.6 (`qwen35`): Qwen2's, with combining marks in words.
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k's split (llama.cpp's `gpt-4o`: gpt-oss, GPT-4o; `minimax-m2`).
const GPT4O_REGEX: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Llama 3 (`llama-bpe`), and GLM-4 … GLM-5 (`glm4`, `glm5`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek LLM and DeepSeek-V2 (`deepseek-llm`): newlines, Latin-like
/// letters, ASCII and full-width punctuation, trailing spaces, CJK, numbers.
const DEEPSEEK_LLM_REGEXES: [&str; 6] = [
    r"[\r\n]",
    // Letters of cased scripts, written as code points (some of them have
    // canonical equivalents an editor could swap in).
    concat!(
        r"\s?[A-Za-z",
        "\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}",
        "\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}",
        "\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}",
        "\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}",
        "\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}",
        "\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}",
        "\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}",
        "\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}",
        "\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}",
        "\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}",
        "\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}",
        "\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}",
        "\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+"
    ),
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
];
/// DeepSeek Coder (`deepseek-coder`).
const DEEPSEEK_CODER_REGEXES: [&str; 5] = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"];
/// DeepSeek-V3 / R1 / V3.1 / V3.2 (`deepseek-v3`): numbers of up to three
/// digits, CJK runs, then words, punctuation and spaces.
const DEEPSEEK_V3_REGEXES: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
/// Kimi K2 (`kimi-k2`, its `tokenization_kimi.py`): o200k's split with Han
/// runs apart from other letters.
const KIMI_K2_REGEX: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The Hugging Face pieces of a llama.cpp pre-tokenizer name.
struct PreTokenizer {
    normalizer: Value,
    pre_tokenizer: Value,
    /// A whole pre-token found in the vocabulary is taken as it is, not
    /// merged (`"ignore_merges": true` in the model's `tokenizer.json`).
    ignore_merges: bool,
}

/// Every pre-tokenizer name charm reads.
pub const PRE_TOKENIZERS: &[&str] = &[
    "default",
    "gpt-2",
    "gpt2",
    "olmo",
    "mpt",
    "smollm",
    "starcoder",
    "refact",
    "qwen2",
    "deepseek-r1-qwen",
    "qwen35",
    "llama-bpe",
    "llama3",
    "glm4",
    "glm5",
    "gpt-4o",
    "minimax-m2",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "kimi-k2",
];

/// The `pre_tokenizer` entry of a `tokenizer.json` for the pre-tokenizer
/// llama.cpp calls `pre` (also what a Kimi directory's tiktoken vocabulary
/// splits with: [`crate::tiktoken`]).
pub fn pre_tokenizer_json(pre: &str) -> Option<Value> {
    pre_tokenizer(pre).map(|p| p.pre_tokenizer)
}

/// The pre-tokenizer llama.cpp calls `pre`, as the model's `tokenizer.json`
/// has it.
fn pre_tokenizer(pre: &str) -> Option<PreTokenizer> {
    let nfc = json!({"type": "NFC"});
    let (normalizer, pre_tokenizer, ignore_merges) = match pre {
        "default" | "gpt-2" | "gpt2" | "mpt" => (Value::Null, byte_level(true, true), false),
        // OLMo's and OLMoE's tokenizer normalizes to NFC first.
        "olmo" => (nfc, byte_level(true, true), false),
        "smollm" | "starcoder" | "refact" => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true, true)
            ]}),
            false,
        ),
        "qwen2" | "deepseek-r1-qwen" => (nfc, splits(&[QWEN2_REGEX], false), false),
        // Qwen3.5 keeps combining marks as they come (no NFC).
        "qwen35" => (Value::Null, splits(&[QWEN35_REGEX], false), false),
        "llama-bpe" | "llama3" | "glm4" | "glm5" => (Value::Null, splits(&[LLAMA3_REGEX], true), true),
        "gpt-4o" => (Value::Null, splits(&[GPT4O_REGEX], true), true),
        "minimax-m2" => (Value::Null, splits(&[GPT4O_REGEX], true), false),
        "deepseek-llm" => (Value::Null, splits(&DEEPSEEK_LLM_REGEXES, true), false),
        "deepseek-coder" => (Value::Null, splits(&DEEPSEEK_CODER_REGEXES, true), false),
        "deepseek-v3" => (Value::Null, splits(&DEEPSEEK_V3_REGEXES, true), false),
        // Kimi's tokenizer is tiktoken, which takes a pre-token found whole
        // in the vocabulary as it is ([`crate::tiktoken`]).
        "kimi-k2" => (Value::Null, splits(&[KIMI_K2_REGEX], true), true),
        _ => return None,
    };
    Some(PreTokenizer {
        normalizer,
        pre_tokenizer,
        ignore_merges,
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
    let pre_tok = pre_tokenizer(pre).ok_or_else(|| {
        format!(
            "tokenizer.ggml.pre {pre:?} is not supported (supported: {})",
            PRE_TOKENIZERS.join(", ")
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
        "normalizer": pre_tok.normalizer,
        "pre_tokenizer": pre_tok.pre_tokenizer,
        "post_processor": post,
        "decoder": byte_level(true, true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": pre_tok.ignore_merges,
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

#[cfg(test)]
mod pre_tokenizer_tests {
    use super::*;
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// `text` split by the pre-tokenizer llama.cpp calls `pre`, as pieces of
    /// `text`.
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let p: PreTokenizerWrapper = serde_json::from_value(pre_tokenizer(pre).unwrap().pre_tokenizer).unwrap();
        let mut s = PreTokenizedString::from(text);
        p.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_string())
            .collect()
    }

    #[test]
    fn every_named_pre_tokenizer_builds() {
        for pre in PRE_TOKENIZERS {
            let p = pre_tokenizer(pre).unwrap_or_else(|| panic!("{pre}"));
            let _: PreTokenizerWrapper =
                serde_json::from_value(p.pre_tokenizer).unwrap_or_else(|e| panic!("{pre}: {e}"));
            assert_eq!(pieces(pre, "Hello world").concat(), "Hello world", "{pre}");
        }
        assert!(pre_tokenizer("no-such-model").is_none());
    }

    /// Kimi K2's split keeps runs of Han characters apart from other letters
    /// (o200k's would join them: Han characters are `\p{Lo}`).
    #[test]
    fn kimi_k2_splits_han_from_other_letters() {
        let text = "你好world，Hello世界1234567 don't";
        assert_eq!(
            pieces("kimi-k2", text),
            ["你好", "world", "，Hello", "世界", "123", "456", "7", " don't"]
        );
        assert_eq!(
            pieces("gpt-4o", text),
            ["你好world", "，Hello世界", "123", "456", "7", " don't"]
        );
    }
}
