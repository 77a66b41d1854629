//! Tokenizers charm rebuilds from other formats tokenize exactly like the
//! Hugging Face tokenizers of the same vocabularies: GGUF metadata
//! (SentencePiece and byte-level BPE vocabularies as llama.cpp's converter
//! stores them, llama.cpp's own vocabulary test files) and tiktoken files
//! (Kimi K2's format). Real vocabularies come from
//! `scripts/fetch_test_material.sh`; the SentencePiece metadata is made
//! here from the Llama-2 `tokenizer.json` the way llama.cpp stores such a
//! vocabulary: pieces by id, a score per piece (here: minus the rank of the
//! first merge that builds it), and token types (normal, unknown, control,
//! byte).

use std::collections::HashMap;

use charm_common::gguf::GgufFile;
use charm_coordinator::TextCodec;
use charm_tests::material;
use serde_json::{json, Value};

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
    assert_codecs_alike(&ours, hf_path, skip_special, texts, &gguf.path().display().to_string());
}

/// `ours` and the `tokenizer.json` at `hf_path` give the same ids for
/// every text, and decode them to the same text (`what` names ours).
fn assert_codecs_alike(ours: &TextCodec, hf_path: &std::path::Path, skip_special: bool, texts: &[&str], what: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(hf_path, dir.path().join("tokenizer.json")).unwrap();
    let theirs = TextCodec::load(dir.path()).unwrap();
    for text in texts {
        let a = ours.encode(text).unwrap();
        let b = theirs.encode(text).unwrap();
        assert_eq!(a, b, "{what}: ids of {text:?}");
        assert_eq!(
            ours.decode(&a, skip_special).unwrap(),
            theirs.decode(&b, skip_special).unwrap(),
            "{what}: text of {text:?}"
        );
    }
}

/// A byte-level BPE `tokenizer.json` as llama.cpp's converter stores it in
/// GGUF metadata (`tokenizer.ggml.model = gpt2`, the given
/// `tokenizer.ggml.pre`): tokens by id with unused ids as padding tokens,
/// control types for the special added tokens and user-defined types for
/// the others, merges as `"a b"`.
fn byte_level_gguf(hf_path: &std::path::Path, arch: &str, pre: &str) -> GgufFile {
    byte_level_gguf_with(hf_path, arch, pre, &[])
}

/// [`byte_level_gguf`] with `tokenizer.ggml.KEY_token_id` entries (`("eos",
/// "<|return|>")`: the id of that token).
fn byte_level_gguf_with(hf_path: &std::path::Path, arch: &str, pre: &str, special: &[(&str, &str)]) -> GgufFile {
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(hf_path).unwrap()).unwrap();
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
    let mut kvs = vec![
        ("general.architecture", 8, string(arch)),
        ("tokenizer.ggml.model", 8, string("gpt2")),
        ("tokenizer.ggml.pre", 8, string(pre)),
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
    ];
    let keys: Vec<String> = special
        .iter()
        .map(|(k, _)| format!("tokenizer.ggml.{k}_token_id"))
        .collect();
    for ((_, text), key) in special.iter().zip(&keys) {
        let id = tokens.iter().position(|t| t == text).unwrap() as u32;
        kvs.push((key, 4, id.to_le_bytes().to_vec()));
    }
    GgufFile::from_bytes(format!("{arch}-vocab.gguf"), gguf_bytes(&kvs)).unwrap()
}

/// gpt-oss's o200k vocabulary as llama.cpp's converter stores it
/// (`tokenizer.ggml.pre = gpt-4o`), rebuilt by charm, tokenizes exactly
/// like the real gpt-oss `tokenizer.json` (from
/// `scripts/fetch_test_material.sh`).
#[test]
fn gpt4o_gguf_vocabulary_tokenizes_like_the_gpt_oss_tokenizer() {
    let hf_path = material("tests/material/gptoss/tokenizer.json");
    let gguf = byte_level_gguf(&hf_path, "gpt-oss", "gpt-4o");
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

/// llama.cpp's texts and expected ids for one vocabulary test file
/// (`ggml-vocab-NAME.gguf.inp` / `.out`): texts joined by
/// `"\n__ggml_vocab_test__\n"`, one line of space-separated ids per text,
/// written by llama.cpp's `convert_hf_to_gguf_update.py` from the model's
/// Hugging Face tokenizer (`encode(text, add_special_tokens=False)`).
fn llama_vocab_tests(gguf: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let with = |ext: &str| {
        let mut p = gguf.as_os_str().to_owned();
        p.push(ext);
        std::fs::read_to_string(std::path::PathBuf::from(p)).unwrap()
    };
    let inp = with(".inp");
    let out = with(".out");
    let sep = "\n__ggml_vocab_test__\n";
    let texts: Vec<&str> = inp.strip_suffix(sep).unwrap_or(&inp).split(sep).collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{}: texts and id lines", gguf.display());
    texts.into_iter().map(str::to_string).zip(ids).collect()
}

/// The vocabulary-only GGUF files llama.cpp tests its tokenizer on (as its
/// converter wrote them from each model's Hugging Face tokenizer: Qwen2,
/// Qwen3.5, DeepSeek LLM and Coder, Llama 3, Llama 2's SentencePiece,
/// GPT-2, StarCoder, Refact, MPT), rebuilt by charm, give every test text
/// the ids the Hugging Face tokenizer gave it, and decode them back to the
/// text.
#[test]
fn llama_cpp_vocabulary_tests_tokenize_as_the_hugging_face_tokenizers() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for name in [
        "gpt-2",
        "llama-bpe",
        "llama-spm",
        "qwen2",
        "qwen35",
        "deepseek-llm",
        "deepseek-coder",
        "starcoder",
        "refact",
        "mpt",
    ] {
        let path = material(format!("tests/material/llama-vocab/ggml-vocab-{name}.gguf"));
        let gguf = GgufFile::open(&path).unwrap();
        let codec = TextCodec::from_gguf(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (text, want) in llama_vocab_tests(&path) {
            let got = codec.encode_plain(&text).unwrap();
            if got != want {
                let mut line = format!("{name} {text:?}: want {want:?}, got {got:?}");
                line.truncate(line.floor_char_boundary(400));
                failures.push(line);
            }
            // And the ids decode back to the text.
            let back = codec.decode(&got, false).unwrap();
            if back != text {
                let mut line = format!("{name} {text:?} decodes as {back:?}");
                line.truncate(line.floor_char_boundary(300));
                failures.push(line);
            }
            checked += 1;
        }
    }
    assert!(checked > 300, "only {checked} texts");
    assert!(
        failures.is_empty(),
        "{} of {checked}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Texts that part pre-tokenizers: llama.cpp's tokenizer test texts (the
/// richest set, Qwen3.5's) and scripts, digits, punctuation and spaces of
/// every kind.
fn hard_texts() -> Vec<String> {
    let qwen35 = material("tests/material/llama-vocab/ggml-vocab-qwen35.gguf");
    let mut texts: Vec<String> = llama_vocab_tests(&qwen35).into_iter().map(|(t, _)| t).collect();
    texts.extend(
        [
            "DeepSeek-V3是一个强大的混合专家模型，总参数671B。",
            "日本語のテキスト：ひらがな、カタカナ、漢字が混ざっています。",
            "한국어 문장도 있습니다. 숫자 1234567과 함께.",
            "Ｆｕｌｌ－ｗｉｄｔｈ ＡＳＣＩＩ　と　全角スペース",
            "e\u{301}te\u{301} (decomposed) and été (composed)",
            "x=1;y=22;z=333;w=4444;  if(a&&b||!c){return -0.5e-10;}",
            "'s 'T 'RE 'Ve don't WON'T I'd",
            "tabs\t\tand\r\nwindows\r\n\r\nnewlines   \n  ",
            "🦙🦙 ₿ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﬁ ﬀ Ⅻ ½ ²",
        ]
        .map(str::to_string),
    );
    texts
}

/// Real byte-level vocabularies as llama.cpp's converter stores them, with
/// the pre-tokenizer name it gives each model, rebuilt by charm, tokenize
/// every hard text exactly like the model's own `tokenizer.json`: Qwen3's
/// (`qwen2`: Qwen3-MoE, Qwen3-Next), DeepSeek-V3's (`deepseek-v3`: V3, R1,
/// V3.1, V3.2) and OLMo's (`olmo`: OLMoE; its normalizer composes
/// characters, NFC, before splitting).
#[test]
fn real_vocabularies_in_gguf_tokenize_like_their_tokenizers() {
    let texts = hard_texts();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    for (dir, arch, pre) in [
        ("qwen3", "qwen3moe", "qwen2"),
        ("deepseek_v3", "deepseek2", "deepseek-v3"),
        ("olmo", "olmoe", "olmo"),
    ] {
        let hf_path = material(format!("tests/material/{dir}/tokenizer.json"));
        let gguf = byte_level_gguf(&hf_path, arch, pre);
        assert_tokenizes_alike(&gguf, &hf_path, false, &texts);
    }
}

/// gpt-oss's GGUF names only `<|return|>` as eos (llama.cpp's converter
/// keeps the tokenizer config's), yet a tool call ends at `<|call|>` and
/// `<|end|>` only ends one message of an answer: the generation ends where
/// gpt-oss's `generation_config.json` says (`<|return|>`, `<|call|>`,
/// `<|endoftext|>`), as llama.cpp ends it.
#[test]
fn gpt_oss_gguf_ends_generations_at_return_and_call() {
    let hf_path = material("tests/material/gptoss/tokenizer.json");
    let gguf = byte_level_gguf_with(&hf_path, "gpt-oss", "gpt-4o", &[("eos", "<|return|>")]);
    let codec = TextCodec::from_gguf(&gguf).unwrap();
    let ends: Vec<String> = charm_models::gguf::end_of_generation_ids(&gguf)
        .iter()
        .map(|&id| codec.decode(&[id], false).unwrap())
        .collect();
    assert_eq!(ends, ["<|endoftext|>", "<|return|>", "<|call|>"]);
}

/// GPT-2's byte for each byte-level character (the inverse of
/// `bytes_to_unicode`).
fn byte_level_bytes(piece: &str) -> Vec<u8> {
    let mut to_byte = HashMap::new();
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            b as char
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
        to_byte.insert(c, b);
    }
    piece.chars().map(|c| to_byte[&c]).collect()
}

/// gpt-oss's o200k vocabulary written as a tiktoken file (tokens by rank,
/// ranks = ids, as OpenAI's tiktoken has it) and its special tokens:
/// charm's tiktoken rebuild, split as o200k splits, tokenizes every hard
/// text and the special tokens exactly like gpt-oss's `tokenizer.json`
/// (the merges come back from the ranks alone).
#[test]
fn a_tiktoken_vocabulary_tokenizes_like_the_same_vocabulary_in_tokenizer_json() {
    let hf_path = material("tests/material/gptoss/tokenizer.json");
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(&hf_path).unwrap()).unwrap();
    let ranks: Vec<(Vec<u8>, u32)> = hf["model"]["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(p, id)| (byte_level_bytes(p), id.as_u64().unwrap() as u32))
        .collect();
    let specials: Vec<(u32, String)> = hf["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap() as u32,
                t["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let o200k = charm_coordinator::gguf_text::pre_tokenizer_json("gpt-4o").unwrap();
    let json = charm_coordinator::tiktoken::tokenizer_json(&ranks, &specials, o200k);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    let ours = TextCodec::load(dir.path()).unwrap();
    let mut texts = hard_texts();
    texts.push("<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant".into());
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert_codecs_alike(&ours, &hf_path, false, &texts, "o200k from tiktoken");
}

/// A Kimi K2 directory (`tiktoken.model`, `tokenization_kimi.py`,
/// `tokenizer_config.json`; no `tokenizer.json`) loads with Kimi's split
/// and special tokens; a tiktoken file without Kimi's code, or a broken
/// one, is refused by name.
#[test]
fn a_kimi_directory_loads_its_tiktoken_vocabulary() {
    use base64::Engine as _;
    let hf_path = material("tests/material/gptoss/tokenizer.json");
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(&hf_path).unwrap()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut lines: Vec<(u64, String)> = hf["model"]["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(p, id)| {
            (
                id.as_u64().unwrap(),
                format!("{} {}", b64.encode(byte_level_bytes(p)), id),
            )
        })
        .collect();
    lines.sort();
    let base = lines.len() as u64;
    let dir = tempfile::tempdir().unwrap();
    let text: String = lines.into_iter().map(|(_, l)| l + "\n").collect();
    std::fs::write(dir.path().join("tiktoken.model"), &text).unwrap();
    let e = TextCodec::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("tokenization_kimi.py"), "{e}");
    std::fs::write(dir.path().join("tokenization_kimi.py"), "# Kimi's tokenizer code\n").unwrap();
    let cfg = json!({"added_tokens_decoder": {
        base.to_string(): {"content": "[BOS]", "special": true},
        (base + 1).to_string(): {"content": "[EOS]", "special": true},
        (base + 3).to_string(): {"content": "<|im_end|>", "special": true}}});
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let codec = TextCodec::load(dir.path()).unwrap();
    let ids = codec.encode_plain("你好world<|im_end|>").unwrap();
    assert_eq!(ids.last(), Some(&(base as u32 + 3)));
    // Han runs apart from letters (o200k would join them).
    assert_eq!(codec.decode(&ids[..ids.len() - 1], false).unwrap(), "你好world");
    let pieces: Vec<String> = ids.iter().map(|&i| codec.decode(&[i], false).unwrap()).collect();
    assert!(
        pieces.iter().any(|p| p == "world" || p.starts_with("world")),
        "{pieces:?}"
    );
    assert!(!pieces.iter().any(|p| p.contains("好w")), "{pieces:?}");
    assert_eq!(
        codec.decode(&[base as u32 + 2], false).unwrap(),
        format!("<|reserved_token_{}|>", base + 2)
    );
    // A broken line is named.
    std::fs::write(dir.path().join("tiktoken.model"), "YQ== 0\nnot base64!! 1\n").unwrap();
    let e = TextCodec::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("line 2"), "{e}");
}
