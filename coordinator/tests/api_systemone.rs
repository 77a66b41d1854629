//! System One decisions (`POST /v1/systemone`) against a real server on
//! 127.0.0.1 serving the qwen3moe-chat fixture: every option's probability
//! is the model's own teacher-forced probability of the option's tokens
//! and of the end after them (computed here with `Engine::logits_all` on
//! the whole sequence), normalized over the options, so they sum to 1; a
//! second request about the same state starts after it (the prefix cache);
//! bad questions are 400s.

mod api_support;

use api_support::*;
use charm_coordinator::server::systemone::question_messages;
use charm_coordinator::TextCodec;
use serde_json::{json, Value};

const PATH: &str = "/v1/systemone";
const INSTRUCTIONS: &str = "Decide.";

/// `log p(ids | row)` summed over `ids`.
fn lp(row: &[f32], ids: &[u32]) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
    let p: f64 = ids.iter().map(|&i| (row[i as usize] as f64 - m).exp()).sum();
    (p / z).ln()
}

#[test]
fn option_probabilities_are_the_models_teacher_forced_ones() {
    let srv = server(|_| {});
    let state = json!({"door": "open", "alarm": false, "people": 2});
    let questions = json!([
        {"id": "act", "type": "choice", "question": "What should the robot do?", "labels": ["close the door", "wait", "call someone"]},
        {"id": "safe", "type": "noul", "question": "Is the house safe?"},
        {"id": "risk", "type": "score", "question": "How risky is it?", "levels": 10}
    ]);
    let body = json!({"model": "qwen3moe-chat", "state": state, "instructions": INSTRUCTIONS, "questions": questions});
    let r = post(srv.addr(), PATH, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "systemone.decision");
    let answers = v["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 3);

    let (engine, _) = engine();
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let eos = engine.config().eos_token_ids.clone();
    let vocab = engine.config().vocab_size;
    let state_text = charm_coordinator::chat_template::py_json(&state);
    for (a, q) in answers.iter().zip(questions.as_array().unwrap()) {
        assert_eq!(a["id"], q["id"]);
        let probs = a["probabilities"].as_array().unwrap();
        let labels: Vec<String> = probs.iter().map(|p| p["label"].as_str().unwrap().to_string()).collect();
        let sum: f64 = probs.iter().map(|p| p["probability"].as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-9, "{a}: probabilities sum to {sum}");
        let msgs = question_messages(INSTRUCTIONS, &state_text, q["question"].as_str().unwrap(), &labels);
        let prompt = codec
            .encode_chat(&msgs, true, &[("enable_thinking", minijinja::Value::from(false))])
            .unwrap();
        // Each option's score from the whole sequence, teacher-forced.
        let mut want = Vec::new();
        for l in &labels {
            let opt = codec.encode_plain(l).unwrap();
            let mut seq = prompt.clone();
            seq.extend(&opt);
            let logits = engine.logits_all(&seq).unwrap();
            let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
            let mut s = 0.0;
            for (t, &id) in opt.iter().enumerate() {
                s += lp(row(prompt.len() - 1 + t), &[id]);
            }
            s += lp(row(seq.len() - 1), &eos);
            want.push(s);
        }
        let got: Vec<f64> = a["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-9, "{}: score {g} vs teacher-forced {w}", a["id"]);
        }
        let m = want.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = want.iter().map(|w| (w - m).exp()).sum();
        for (p, w) in probs.iter().zip(&want) {
            assert!(
                (p["probability"].as_f64().unwrap() - (w - m).exp() / z).abs() < 1e-9,
                "{a}"
            );
        }
        let best = probs
            .iter()
            .max_by(|x, y| {
                x["probability"]
                    .as_f64()
                    .partial_cmp(&y["probability"].as_f64())
                    .unwrap()
            })
            .unwrap();
        assert_eq!(a["answer"], best["label"]);
        let c = a["confidence"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&c), "{a}");
    }
    assert_eq!(answers[1]["probabilities"][0]["label"], "yes");
    assert_eq!(answers[2]["probabilities"].as_array().unwrap().len(), 10);
    let e = answers[2]["expected"].as_f64().unwrap();
    assert!((1.0..=10.0).contains(&e), "{e}");

    // The same state again: its tokens come from the prefix cache.
    let again = post(srv.addr(), PATH, &body).json();
    assert!(again["usage"]["cached_tokens"].as_u64().unwrap() > 0, "{again}");
    assert_eq!(again["answers"], v["answers"], "same bits from the cache");
}

#[test]
fn bad_decision_requests_are_400s() {
    let srv = server(|_| {});
    let q = |question: Value| json!({"model": "qwen3moe-chat", "state": "s", "questions": [question]});
    for (body, what) in [
        (json!({"model": "qwen3moe-chat", "state": "s", "questions": []}), "1 to"),
        (q(json!({"type": "choice", "question": "?", "labels": ["a"]})), "2 to"),
        (q(json!({"type": "score", "question": "?", "levels": 1})), "2 to 10"),
        (q(json!({"type": "guess", "question": "?"})), "not choice"),
        (q(json!({"type": "noul", "question": " "})), "empty"),
        (
            json!({"model": "qwen3moe-chat", "questions": [{"type": "noul", "question": "?"}]}),
            "state",
        ),
    ] {
        let r = post(srv.addr(), PATH, &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.text().contains(what), "{what}: {}", r.text());
    }
    let r = post(
        srv.addr(),
        PATH,
        &json!({"model": "other", "state": "s", "questions": [{"type": "noul", "question": "?"}]}),
    );
    assert_eq!(r.status, 404);
}
