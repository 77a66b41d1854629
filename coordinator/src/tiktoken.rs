//! A tiktoken vocabulary (`tiktoken.model`: one base64 token and its rank
//! a line) rebuilt as the byte-level BPE `tokenizer.json` the tokenizers
//! crate reads. Kimi K2 and K2.5 ship their tokenizer so, with the split
//! pattern in `tokenization_kimi.py` and the special tokens in
//! `tokenizer_config.json` (`added_tokens_decoder`), and no
//! `tokenizer.json`.
//!
//! A token's id is its rank. tiktoken merges a pre-token's bytes pair by
//! pair, lowest rank first, and takes a pre-token found whole in the
//! vocabulary as it is; the merges that reproduce it are, for each token of
//! two or more bytes in rank order, the two parts its own bytes reach when
//! merged with the ranks below its own (`ignore_merges` covers the whole
//! pre-tokens).

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use serde_json::{json, Value};

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode`): printable
/// Latin-1 bytes stand for themselves, the others for 256 + n.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        out[b as usize] = if printable {
            b as char
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\u{FFFD}')
        };
    }
    out
}

/// `bytes` in GPT-2's byte-level characters.
fn byte_level(bytes: &[u8], chars: &[char; 256]) -> String {
    bytes.iter().map(|&b| chars[b as usize]).collect()
}

/// The ranks of a `tiktoken.model` file's text.
pub fn read_ranks(text: &str) -> Result<Vec<(Vec<u8>, u32)>, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    let mut seen_ranks = std::collections::HashSet::new();
    let mut seen_tokens = std::collections::HashSet::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        let (token, rank) = line.split_once(' ').ok_or_else(|| bad("not a token and a rank"))?;
        let bytes = b64.decode(token).map_err(|_| bad("the token is not base64"))?;
        let rank: u32 = rank.trim().parse().map_err(|_| bad("the rank is not a number"))?;
        if bytes.is_empty() {
            return Err(bad("an empty token"));
        }
        if !seen_ranks.insert(rank) {
            return Err(bad("a rank given twice"));
        }
        if !seen_tokens.insert(bytes.clone()) {
            return Err(bad("a token given twice"));
        }
        out.push((bytes, rank));
    }
    Ok(out)
}

/// The two parts tiktoken's merging reaches for `token`, merging only
/// pairs whose rank is below `rank` (None for a single byte, or where the
/// vocabulary does not build the token from two parts).
fn split_in_two(token: &[u8], rank: u32, ranks: &HashMap<&[u8], u32>) -> Option<(usize, usize)> {
    // Parts as (start, end) byte ranges of `token`.
    let mut parts: Vec<(usize, usize)> = (0..token.len()).map(|i| (i, i + 1)).collect();
    while parts.len() > 2 {
        let best = parts
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| {
                let r = *ranks.get(&token[w[0].0..w[1].1])?;
                (r < rank).then_some((r, i))
            })
            .min()?;
        let i = best.1;
        parts[i].1 = parts[i + 1].1;
        parts.remove(i + 1);
    }
    (parts.len() == 2).then(|| (parts[0].1 - parts[0].0, parts[1].1 - parts[1].0))
}

/// A `tokenizer.json` for the ranks `ranks` (ids), the special tokens
/// `specials` (`(id, text)`), and the pre-tokenizer `pre_tokenizer`.
pub fn tokenizer_json(ranks: &[(Vec<u8>, u32)], specials: &[(u32, String)], pre_tokenizer: Value) -> Value {
    let chars = byte_chars();
    let index: HashMap<&[u8], u32> = ranks.iter().map(|(b, r)| (b.as_slice(), *r)).collect();
    let mut by_rank: Vec<&(Vec<u8>, u32)> = ranks.iter().collect();
    by_rank.sort_by_key(|(_, r)| *r);
    let mut vocab = serde_json::Map::with_capacity(ranks.len());
    let mut merges = Vec::new();
    for (bytes, rank) in by_rank {
        vocab.insert(byte_level(bytes, &chars), json!(rank));
        if let Some((a, _)) = split_in_two(bytes, *rank, &index) {
            merges.push(json!(format!(
                "{} {}",
                byte_level(&bytes[..a], &chars),
                byte_level(&bytes[a..], &chars)
            )));
        }
    }
    let added: Vec<Value> = specials
        .iter()
        .map(|(id, text)| {
            json!({"id": id, "content": text, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let byte_level_step =
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": byte_level_step,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": true, "vocab": vocab, "merges": merges
        }
    })
}

/// Kimi's reserved special tokens: ids from the end of the ranks, 256 of
/// them, each named by the tokenizer config or `<|reserved_token_ID|>`.
const KIMI_RESERVED: u32 = 256;

/// The `tokenizer.json` of a Kimi K2 / K2.5 directory (`tiktoken.model`,
/// `tokenization_kimi.py`, `tokenizer_config.json`), or `Ok(None)` where
/// `dir` holds no `tiktoken.model`. A tiktoken vocabulary of another
/// model is refused: its split pattern lives in that model's Python code.
pub fn for_directory(dir: &Path) -> Result<Option<Value>, String> {
    let model = dir.join("tiktoken.model");
    if !model.exists() {
        return Ok(None);
    }
    if !dir.join("tokenization_kimi.py").exists() {
        return Err(format!(
            "{}: a tiktoken vocabulary without tokenization_kimi.py; charm knows the split pattern of \
             Kimi's (K2, K2.5) only",
            model.display()
        ));
    }
    let text = std::fs::read_to_string(&model).map_err(|e| format!("{}: {e}", model.display()))?;
    let ranks = read_ranks(&text).map_err(|e| format!("{}: {e}", model.display()))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let cfg: Value = match std::fs::read_to_string(&cfg_path) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| format!("{}: not valid JSON: {e}", cfg_path.display()))?,
        Err(_) => Value::Null,
    };
    let specials = kimi_specials(ranks.len() as u32, &cfg)?;
    let pre = crate::gguf_text::pre_tokenizer_json("kimi-k2").ok_or("no kimi-k2 pre-tokenizer")?;
    Ok(Some(tokenizer_json(&ranks, &specials, pre)))
}

/// Kimi's special tokens: those `added_tokens_decoder` names, and the rest
/// of the reserved ids after the `base` ranks as `<|reserved_token_ID|>`.
fn kimi_specials(base: u32, cfg: &Value) -> Result<Vec<(u32, String)>, String> {
    let mut named: HashMap<u32, String> = HashMap::new();
    if let Some(decoder) = cfg.get("added_tokens_decoder").and_then(Value::as_object) {
        for (id, t) in decoder {
            let id: u32 = id
                .parse()
                .map_err(|_| format!("added_tokens_decoder: {id:?} is not a token id"))?;
            let text = t
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("added_tokens_decoder[{id}] has no content"))?;
            named.insert(id, text.to_string());
        }
    }
    let mut out: Vec<(u32, String)> = (base..base + KIMI_RESERVED)
        .map(|id| {
            (
                id,
                named.remove(&id).unwrap_or_else(|| format!("<|reserved_token_{id}|>")),
            )
        })
        .collect();
    // Named tokens outside the reserved run (none in Kimi's releases).
    out.extend(named);
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_gpt2s() {
        let c = byte_chars();
        assert_eq!(c[b'A' as usize], 'A');
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        assert_eq!(c[0], 'Ā');
        assert_eq!(c[0xAD], '\u{143}');
        let mut all: Vec<char> = c.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn merges_follow_the_ranks() {
        // a b c ab bc abc: "abc" is reached as "ab" + "c" (ab's rank is lower).
        let ranks: Vec<(Vec<u8>, u32)> = [("a", 0), ("b", 1), ("c", 2), ("ab", 3), ("bc", 4), ("abc", 5)]
            .iter()
            .map(|(t, r)| (t.as_bytes().to_vec(), *r))
            .collect();
        let j = tokenizer_json(&ranks, &[(6, "<|end|>".into())], json!(null));
        assert_eq!(j["model"]["merges"], json!(["a b", "b c", "ab c"]));
        assert_eq!(j["model"]["vocab"]["abc"], 5);
        assert_eq!(j["added_tokens"][0]["content"], "<|end|>");
    }

    #[test]
    fn bad_tiktoken_lines_are_named() {
        assert!(read_ranks("YQ== 0\nYg== 1\n").is_ok());
        for (text, why) in [
            ("YQ==\n", "line 1: not a token and a rank"),
            ("YQ== 0\n!!! 1\n", "line 2: the token is not base64"),
            ("YQ== x\n", "line 1: the rank is not a number"),
            ("YQ== 0\nYg== 0\n", "line 2: a rank given twice"),
            ("YQ== 0\nYQ== 1\n", "line 2: a token given twice"),
            (" 0\n", "line 1: an empty token"),
        ] {
            let e = read_ranks(text).unwrap_err();
            assert!(e.starts_with(why), "{e}");
        }
    }
}
