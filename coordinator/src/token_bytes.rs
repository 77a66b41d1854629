//! The bytes each token stands for, as llama-server's `/tokenize` gives
//! them with `with_pieces` (`common_token_to_piece`): a token may hold part
//! of a character (byte-level BPE splits a rare character across tokens),
//! so a piece is bytes, not text.

use serde_json::Value;
use tokenizers::Tokenizer;

/// How the tokenizer's decoder turns a vocabulary string into bytes.
struct DecoderKind {
    /// GPT-2 byte-level: each character of a token stands for one byte.
    byte_level: bool,
    /// SentencePiece byte fallback: `<0xHH>` tokens are the byte `HH`.
    byte_fallback: bool,
    /// SentencePiece's `▁` stands for a space.
    metaspace: bool,
}

impl DecoderKind {
    fn of(tokenizer: &Tokenizer) -> Self {
        let mut types = Vec::new();
        if let Ok(v) = serde_json::to_value(tokenizer.get_decoder()) {
            collect_types(&v, &mut types);
        }
        let has = |t: &str| types.iter().any(|x| x == t);
        DecoderKind {
            byte_level: has("ByteLevel"),
            byte_fallback: has("ByteFallback"),
            metaspace: has("Metaspace") || has("Replace"),
        }
    }
}

/// Every `"type"` string in a decoder's JSON (a `Sequence` nests them).
fn collect_types(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(t)) = o.get("type") {
                out.push(t.clone());
            }
            o.values().for_each(|x| collect_types(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_types(x, out)),
        _ => {}
    }
}

/// `<0xHH>` as the byte `HH`.
fn fallback_byte(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// Each id's bytes: an added (special) token's text; a byte-level token's
/// characters mapped back to their bytes; a `<0xHH>` byte-fallback token's
/// byte; a SentencePiece token with `▁` as a space (llama-server keeps a
/// piece's leading space); otherwise the token decoded alone. `Err` names
/// an id outside the vocabulary.
pub fn token_bytes(tokenizer: &Tokenizer, ids: &[u32]) -> Result<Vec<Vec<u8>>, u32> {
    let kind = DecoderKind::of(tokenizer);
    let bytes_of: std::collections::HashMap<char, u8> = crate::tiktoken::byte_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect();
    let byte_of = |c: char| bytes_of.get(&c).copied();
    let added = tokenizer.get_added_tokens_decoder();
    ids.iter()
        .map(|&id| {
            if let Some(t) = added.get(&id) {
                return Ok(t.content.as_bytes().to_vec());
            }
            let token = tokenizer.id_to_token(id).ok_or(id)?;
            if kind.byte_fallback {
                if let Some(b) = fallback_byte(&token) {
                    return Ok(vec![b]);
                }
            }
            if kind.byte_level {
                if let Some(bytes) = token.chars().map(byte_of).collect::<Option<Vec<u8>>>() {
                    return Ok(bytes);
                }
            }
            if kind.metaspace {
                return Ok(token.replace('\u{2581}', " ").into_bytes());
            }
            tokenizer.decode(&[id], false).map(String::into_bytes).map_err(|_| id)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_fallback_tokens_name_one_byte() {
        assert_eq!(fallback_byte("<0xE2>"), Some(0xE2));
        assert_eq!(fallback_byte("<0x0A>"), Some(0x0A));
        assert_eq!(fallback_byte("<0xE>"), None);
        assert_eq!(fallback_byte("<0xZZ>"), None);
        assert_eq!(fallback_byte("0xE2"), None);
    }
}
