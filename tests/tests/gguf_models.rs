//! Real weights from a GGUF file: SmolLM2-135M-Instruct (Q4_1, fetched by
//! `scripts/fetch_test_material.sh`) answers through its own tokenizer and
//! chat template, dense and upcycled into the demo MoE; identical expert
//! copies reproduce the dense model; the upcycled routing uses every expert.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use charm_coordinator::chat_template::Message;
use charm_coordinator::upcycle::{upcycle, UpcycleOptions};
use charm_coordinator::{Engine, GenerateParams, SamplingParams, StepObserver, TextCodec};
use charm_tests::{material, repo_root};

fn smollm2() -> PathBuf {
    material("tests/material/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn scratch() -> tempfile::TempDir {
    let base = repo_root().join("target").join("test-scratch");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new().prefix("gguf-").tempdir_in(base).unwrap()
}

fn greedy(n: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n,
        sampling: SamplingParams::default(),
        ignore_eos: false,
    }
}

/// Greedy answer to one user message through the model's chat template.
fn answer(engine: &Engine, codec: &TextCodec, question: &str) -> String {
    let prompt = codec.encode_chat(&[Message::new("user", question)], true, &[]).unwrap();
    let mut s = engine.session();
    let gen = engine.generate(&mut s, &prompt, &greedy(32), |_| true).unwrap();
    codec.decode(&gen.ids, true).unwrap()
}

#[test]
fn smollm2_gguf_dense_answers_with_its_own_tokenizer_and_template() {
    let path = smollm2();
    let engine = Engine::local(&path).unwrap();
    assert!(engine.config().moe_layers.iter().all(|m| !m), "SmolLM2 is dense");
    let codec = TextCodec::for_model(&path).unwrap();
    assert!(codec.has_template());
    // The template adds SmolLM2's default system turn.
    let text = codec.render_chat(&[Message::new("user", "Hi")], true, &[]).unwrap();
    assert!(
        text.starts_with("<|im_start|>system\n") && text.ends_with("<|im_start|>assistant\n"),
        "{text:?}"
    );
    for s in [
        "Hello world",
        "  spaces\tand\nnewlines",
        "digits 12345",
        "émoji 🚀 ünïcode",
    ] {
        let ids = codec.encode(s).unwrap();
        assert_eq!(codec.decode(&ids, false).unwrap(), s, "round trip of {s:?}");
    }
    // SmolLM2 splits digits one by one.
    assert_eq!(codec.encode("123").unwrap().len(), 3);
    // Quantized GGUF rows multiply 8-bit activations, as llama.cpp runs
    // them; at 135M parameters in Q4_1 that costs the model the bare
    // "What is the capital of France?" (llama.cpp 0.3.36 answers it
    // "L'Étoile, la Cité, ..." too), so the question asks for one word.
    let a = answer(
        &engine,
        &codec,
        "What is the capital city of France? Answer in one word.",
    );
    assert!(a.contains("Paris"), "{a:?}");
}

/// Records which experts each layer routed to.
#[derive(Default)]
struct Seen(Mutex<HashSet<(u16, u32)>>);

impl StepObserver for Seen {
    fn on_experts(&self, layer: u16, experts: &[(u32, u32)]) {
        let mut s = self.0.lock().unwrap();
        for &(e, _) in experts {
            s.insert((layer, e));
        }
    }
}

fn upcycled(dir: &Path, name: &str, opts: &UpcycleOptions) -> PathBuf {
    let out = dir.join(name);
    upcycle(&smollm2(), &out, opts).unwrap_or_else(|e| panic!("upcycle {name}: {e:#}"));
    out
}

#[test]
fn upcycled_demo_moe_answers_and_routes_to_every_expert() {
    let tmp = scratch();
    let dir = upcycled(tmp.path(), "moe", &UpcycleOptions::default());
    let mut engine = Engine::local(&dir).unwrap();
    let cfg = engine.config().clone();
    assert_eq!((cfg.num_experts, cfg.top_k), (4, 2));
    let seen = Arc::new(Seen::default());
    engine.set_observer(seen.clone());
    let codec = TextCodec::for_model(&dir).unwrap();
    // Quantized GGUF rows multiply 8-bit activations, as llama.cpp runs
    // them; at 135M parameters in Q4_1 that costs the model the bare
    // "What is the capital of France?" (llama.cpp 0.3.36 answers it
    // "L'Étoile, la Cité, ..." too), so the question asks for one word.
    let a = answer(
        &engine,
        &codec,
        "What is the capital city of France? Answer in one word.",
    );
    assert!(a.contains("Paris"), "{a:?}");

    let paragraph = "The history of the city begins with a small fishing village on the river. Over the \
                     centuries, merchants, scholars and artists arrived; bridges, markets and cathedrals \
                     followed, and the town grew into a capital known for its libraries and its food.";
    engine.logits_all(&codec.encode(paragraph).unwrap()).unwrap();
    let seen = seen.0.lock().unwrap();
    for l in 0..cfg.num_layers as u16 {
        for e in 0..4u32 {
            assert!(seen.contains(&(l, e)), "layer {l} never routed to expert {e}");
        }
    }
}

#[test]
fn identical_expert_copies_reproduce_the_dense_model() {
    let tmp = scratch();
    let dense = upcycled(
        tmp.path(),
        "dense",
        &UpcycleOptions {
            experts: 0,
            ..Default::default()
        },
    );
    let moe = upcycled(
        tmp.path(),
        "same",
        &UpcycleOptions {
            noise: 0.0,
            ..Default::default()
        },
    );
    let codec = TextCodec::for_model(&dense).unwrap();
    let ids = codec
        .encode("Paris is the capital and largest city of France.")
        .unwrap();
    let a = Engine::local(&dense).unwrap().logits_all(&ids).unwrap();
    let b = Engine::local(&moe).unwrap().logits_all(&ids).unwrap();
    let max_ref = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    println!("OK maxdiff={diff:e} (max |logit| {max_ref})");
    assert!(diff <= 1e-3 * max_ref.max(1.0), "maxdiff {diff}");
    let vocab = a.len() / ids.len();
    for (p, (ra, rb)) in a.chunks(vocab).zip(b.chunks(vocab)).enumerate() {
        assert_eq!(
            charm_tests::argmax(ra),
            charm_tests::argmax(rb),
            "argmax differs at position {p}"
        );
    }
}
