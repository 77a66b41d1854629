//! A SentencePiece (`tokenizer.ggml.model = llama`) vocabulary in GGUF
//! metadata, rebuilt by charm, tokenizes exactly like the Hugging Face
//! tokenizer of the same vocabulary. The GGUF metadata is made here from
//! the Llama-2 `tokenizer.json` (fetched by `scripts/fetch_test_material.sh`)
//! the way llama.cpp stores such a vocabulary: pieces by id, a score per
//! piece (here: minus the rank of the first merge that builds it), and token
//! types (normal, unknown, control, byte).

use std::collections::HashMap;

use charm_common::gguf::GgufFile;
use charm_coordinator::TextCodec;
use charm_tests::material;
use serde_json::Value;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A GGUF v3 image with only metadata: `(key, type id, encoded value)`.
fn gguf_bytes(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, ty, v) in kvs {
        put_str(&mut b, k);
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(v);
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b
}

fn array(elem_ty: u32, items: Vec<Vec<u8>>) -> Vec<u8> {
    let mut v = elem_ty.to_le_bytes().to_vec();
    v.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for it in items {
        v.extend_from_slice(&it);
    }
    v
}

fn string(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    put_str(&mut v, s);
    v
}

#[test]
fn sentencepiece_gguf_vocabulary_tokenizes_like_the_hf_tokenizer() {
    let hf_path = material("tests/material/llama2/tokenizer.json");
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(&hf_path).unwrap()).unwrap();
    let vocab = hf["model"]["vocab"].as_object().unwrap();
    let mut pieces = vec![String::new(); vocab.len()];
    for (p, id) in vocab {
        pieces[id.as_u64().unwrap() as usize] = p.clone();
    }
    let ids: HashMap<&str, usize> = pieces.iter().enumerate().map(|(i, p)| (p.as_str(), i)).collect();
    let mut scores = vec![0f32; pieces.len()];
    let mut scored = vec![false; pieces.len()];
    for (rank, m) in hf["model"]["merges"].as_array().unwrap().iter().enumerate() {
        let merged = match m {
            Value::String(s) => s.replacen(' ', "", 1),
            Value::Array(a) => format!("{}{}", a[0].as_str().unwrap(), a[1].as_str().unwrap()),
            _ => panic!("merge {m}"),
        };
        if let Some(&i) = ids.get(merged.as_str()) {
            if !scored[i] {
                scores[i] = -(rank as f32);
                scored[i] = true;
            }
        }
    }
    let types: Vec<i32> = pieces
        .iter()
        .enumerate()
        .map(|(i, p)| match (i, p.as_str()) {
            (0, _) => 2,
            (1, _) | (2, _) => 3,
            (_, p) if p.starts_with("<0x") && p.ends_with('>') && p.len() == 6 => 6,
            _ => 1,
        })
        .collect();
    let bytes = gguf_bytes(&[
        ("general.architecture", 8, string("llama")),
        ("tokenizer.ggml.model", 8, string("llama")),
        (
            "tokenizer.ggml.tokens",
            9,
            array(8, pieces.iter().map(|p| string(p)).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            9,
            array(6, scores.iter().map(|s| s.to_le_bytes().to_vec()).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            9,
            array(5, types.iter().map(|t| t.to_le_bytes().to_vec()).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", 4, 1u32.to_le_bytes().to_vec()),
        ("tokenizer.ggml.eos_token_id", 4, 2u32.to_le_bytes().to_vec()),
        ("tokenizer.ggml.add_bos_token", 7, vec![1]),
    ]);
    let gguf = GgufFile::from_bytes("llama2-vocab.gguf", bytes).unwrap();
    assert_tokenizes_alike(
        &gguf,
        &hf_path,
        true,
        &[
            "Hello world",
            "The quick brown fox jumps over the lazy dog.",
            "  leading and  double  spaces ",
            "line one\nline two\n\n\ttabbed",
            "numbers 12345 and 3.14159",
            "émoji 🚀 and ünïcode, 中文, 日本語",
            "rare bytes: \u{1F9E0}\u{0301}",
            "code: fn main() { println!(\"hi\"); }",
        ],
    );
}

/// The tokenizer rebuilt from `gguf`'s metadata and the `tokenizer.json` at
/// `hf_path` give the same ids for every text, and decode them (skipping
/// special tokens or not) to the same text.
fn assert_tokenizes_alike(gguf: &GgufFile, hf_path: &std::path::Path, skip_special: bool, texts: &[&str]) {
    let ours = TextCodec::from_gguf(gguf).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(hf_path, dir.path().join("tokenizer.json")).unwrap();
    let theirs = TextCodec::load(dir.path()).unwrap();
    for text in texts {
        let a = ours.encode(text).unwrap();
        let b = theirs.encode(text).unwrap();
        assert_eq!(a, b, "ids of {text:?}");
        assert_eq!(
            ours.decode(&a, skip_special).unwrap(),
            theirs.decode(&b, skip_special).unwrap(),
            "text of {text:?}"
        );
    }
}

/// gpt-oss's o200k vocabulary as llama.cpp's converter stores it
/// (`tokenizer.ggml.model = gpt2`, `tokenizer.ggml.pre = gpt-4o`: tokens by
/// id with the unused ids as padding tokens, control types for the special
/// ones, merges as `"a b"`), rebuilt by charm, tokenizes exactly like the
/// real gpt-oss `tokenizer.json` (from `scripts/fetch_test_material.sh`).
#[test]
fn gpt4o_gguf_vocabulary_tokenizes_like_the_gpt_oss_tokenizer() {
    let hf_path = material("tests/material/gptoss/tokenizer.json");
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(&hf_path).unwrap()).unwrap();
    let mut pieces: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: usize, piece: &str, ty: i32| {
        if pieces.len() <= id {
            pieces.resize(id + 1, None);
        }
        pieces[id] = Some((piece.to_string(), ty));
    };
    for (p, id) in hf["model"]["vocab"].as_object().unwrap() {
        put(id.as_u64().unwrap() as usize, p, 1);
    }
    for t in hf["added_tokens"].as_array().unwrap() {
        let ty = if t["special"].as_bool().unwrap() { 3 } else { 4 };
        put(t["id"].as_u64().unwrap() as usize, t["content"].as_str().unwrap(), ty);
    }
    let (tokens, types): (Vec<String>, Vec<i32>) = pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.unwrap_or((format!("[PAD{i}]"), 5)))
        .unzip();
    let merges: Vec<String> = hf["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(a) => format!("{} {}", a[0].as_str().unwrap(), a[1].as_str().unwrap()),
            _ => panic!("merge {m}"),
        })
        .collect();
    let bytes = gguf_bytes(&[
        ("general.architecture", 8, string("gpt-oss")),
        ("tokenizer.ggml.model", 8, string("gpt2")),
        ("tokenizer.ggml.pre", 8, string("gpt-4o")),
        (
            "tokenizer.ggml.tokens",
            9,
            array(8, tokens.iter().map(|p| string(p)).collect()),
        ),
        (
            "tokenizer.ggml.token_type",
            9,
            array(5, types.iter().map(|t| t.to_le_bytes().to_vec()).collect()),
        ),
        (
            "tokenizer.ggml.merges",
            9,
            array(8, merges.iter().map(|m| string(m)).collect()),
        ),
        ("tokenizer.ggml.add_bos_token", 7, vec![0]),
    ]);
    let gguf = GgufFile::from_bytes("gptoss-vocab.gguf", bytes).unwrap();
    assert_tokenizes_alike(
        &gguf,
        &hf_path,
        false,
        &[
            "Hello world",
            "The quick brown fox jumps over the lazy dog.",
            "HTTPServer's JSONParser didn't parse 'camelCaseWords' or ALLCAPS'll",
            "  leading and  double  spaces ",
            "line one\nline two\n\n\ttabbed\r\n",
            "numbers 12345 and 3.14159, 1000000",
            "émoji 🚀 and ünïcode, 中文, 日本語, Ελληνικά",
            "rare bytes: \u{1F9E0}\u{0301}",
            "path/to/file.rs and a//b",
            "code: fn main() { println!(\"hi\"); }",
            "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant",
        ],
    );
}
