//! What a JSON-schema constraint costs per decoded token.
//!
//! For each model given (a Hugging Face directory, a container or a GGUF
//! file), greedy decoding of one prompt (through the chat template when the
//! model has one), alternating rounds: plain,
//! then under a JSON schema ([`charm_coordinator::grammar`]). Reports the
//! grammar compiler's build time (the vocabulary's token trie, once per
//! model), the mask's time per token (compute the allowed set, apply it to
//! the logits, advance the grammar), and decode tokens per second with and
//! without the constraint (medians of the rounds).
//!
//! cargo run --release -p charm-coordinator --example bench_constrained -- MODEL... [--rounds N] [--tokens N]

use std::path::PathBuf;
use std::time::Instant;

use charm_coordinator::chat_template::Message;
use charm_coordinator::grammar::{GrammarSpec, Grammars};
use charm_coordinator::{Engine, EngineOptions, Sampler, SamplingParams, TextCodec};
use serde_json::json;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Greedy decode of up to `n` tokens; returns (tokens, decode seconds,
/// seconds spent in the mask).
fn decode(
    engine: &Engine,
    prompt: &[u32],
    n: usize,
    mut c: Option<charm_coordinator::grammar::Constraint>,
) -> (usize, f64, f64) {
    let eos = engine.config().eos_token_ids.clone();
    let mut cache = engine.model.new_cache();
    let mut logits = engine.forward(prompt, &mut cache, false).unwrap();
    let mut sampler = Sampler::new(SamplingParams::default(), &[]);
    let (mut masked_s, mut count) = (0.0, 0);
    let mut allowed: Vec<f32> = Vec::new();
    let t = Instant::now();
    while count < n {
        let id = match &mut c {
            None => sampler.sample(&logits),
            Some(c) => {
                // What the scheduler does: the logits copied into a reused
                // buffer, masked, sampled, the grammar advanced (the sample
                // itself is timed in neither: plain decoding pays it too).
                let m = Instant::now();
                allowed.clear();
                allowed.extend_from_slice(&logits);
                c.mask(&mut allowed).unwrap();
                masked_s += m.elapsed().as_secs_f64();
                let id = sampler.sample(&allowed);
                let m = Instant::now();
                if !eos.contains(&id) {
                    c.accept(id).unwrap();
                }
                masked_s += m.elapsed().as_secs_f64();
                id
            }
        };
        count += 1;
        if eos.contains(&id) || c.as_ref().is_some_and(|c| c.is_done()) {
            break;
        }
        logits = engine.forward(&[id], &mut cache, false).unwrap();
    }
    (count, t.elapsed().as_secs_f64(), masked_s)
}

fn main() {
    let mut models = Vec::new();
    let (mut rounds, mut tokens) = (5usize, 64usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--tokens" => tokens = args.next().and_then(|v| v.parse().ok()).expect("--tokens N"),
            _ => models.push(PathBuf::from(a)),
        }
    }
    assert!(
        !models.is_empty(),
        "usage: bench_constrained MODEL... [--rounds N] [--tokens N]"
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
            "detailed": {"type": "boolean"}
        },
        "required": ["city", "unit", "days", "tags", "detailed"],
        "additionalProperties": false
    });
    println!("model | vocab | trie build ms | mask µs/token (median) | plain tok/s | constrained tok/s | ratio | tokens plain / constrained");
    for m in &models {
        let (engine, _) = Engine::load(m, &EngineOptions::default()).expect("load the model");
        let codec = TextCodec::for_model(m).expect("the model's tokenizer");
        let cfg = engine.config().clone();
        let ask = "Plan a weather report as JSON.";
        let prompt = if codec.has_template() {
            codec.encode_chat(&[Message::new("user", ask)], true, &[])
        } else {
            codec.encode(ask)
        }
        .expect("tokenize the prompt");
        let t = Instant::now();
        let grammars = Grammars::new(&codec, cfg.vocab_size, &cfg.eos_token_ids).expect("grammar compiler");
        let build_ms = t.elapsed().as_secs_f64() * 1e3;
        let spec = GrammarSpec::JsonSchema(schema.clone());
        let (mut plain, mut constrained, mut mask_us) = (Vec::new(), Vec::new(), Vec::new());
        let (mut n_plain, mut n_con) = (0, 0);
        // One warm-up of each, then alternating rounds.
        decode(&engine, &prompt, tokens, None);
        decode(&engine, &prompt, tokens, Some(grammars.compile(&spec).unwrap()));
        for _ in 0..rounds {
            let (n, s, _) = decode(&engine, &prompt, tokens, None);
            plain.push(n as f64 / s);
            n_plain = n;
            let (n, s, ms) = decode(&engine, &prompt, tokens, Some(grammars.compile(&spec).unwrap()));
            constrained.push(n as f64 / s);
            mask_us.push(ms / n as f64 * 1e6);
            n_con = n;
        }
        let (p, c) = (median(plain), median(constrained));
        println!(
            "{} | {} | {build_ms:.0} | {:.0} | {p:.1} | {c:.1} | {:.3} | {n_plain} / {n_con}",
            m.display(),
            cfg.vocab_size,
            median(mask_us),
            c / p
        );
    }
}
