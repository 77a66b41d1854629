//! The sampling fields of the API: each reaches the sampler exactly as the
//! engine applies it (`logit_bias`, `min_p`, the repetition, presence and
//! frequency penalties), omitted fields take the model's recommended
//! settings from `generation_config.json`, and out-of-range values are
//! refused with a 400 naming the field, at request time or, for a model
//! file's own settings, when the server starts.

mod api_support;

use api_support::*;
use charm_coordinator::sampler::SamplingParams;
use charm_coordinator::server::{ServeError, Server, ServerConfig};
use charm_coordinator::{GenerateParams, TextCodec};
use serde_json::{json, Value};

const COMPLETIONS: &str = "/v1/completions";

fn prompt() -> Vec<u32> {
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    codec
        .encode("The quick brown fox jumps over the lazy dog. The quick")
        .unwrap()
}

/// The text the engine generates for `prompt` with `sampling`.
fn engine_text(sampling: SamplingParams, max_tokens: usize) -> String {
    let (engine, _) = engine();
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let params = GenerateParams {
        max_tokens,
        sampling,
        ignore_eos: true,
    };
    let gen = engine
        .generate(&mut engine.session(), &prompt(), &params, |_| true)
        .unwrap();
    codec.decode(&gen.ids, true).unwrap()
}

/// `/v1/completions` of `prompt` with these extra fields.
fn completion(srv: &Server, max_tokens: usize, fields: Value) -> Resp {
    let mut body = json!({"prompt": prompt(), "max_tokens": max_tokens, "ignore_eos": true});
    for (k, v) in fields.as_object().unwrap() {
        body[k] = v.clone();
    }
    post(srv.addr(), COMPLETIONS, &body)
}

fn text(r: Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn every_sampling_field_reaches_the_sampler_as_the_engine_applies_it() {
    let srv = server(|_| {});
    let codec = TextCodec::load(&chat_fixture()).unwrap();
    let hello = codec.encode(" hello").unwrap()[0];
    let cases = [
        (
            json!({"temperature": 0, "logit_bias": {hello.to_string(): 100}}),
            SamplingParams {
                logit_bias: vec![(hello, 100.0)],
                ..Default::default()
            },
        ),
        (
            json!({"temperature": 0, "repetition_penalty": 1.5}),
            SamplingParams {
                repetition_penalty: 1.5,
                ..Default::default()
            },
        ),
        (
            json!({"temperature": 0, "presence_penalty": 1.5, "frequency_penalty": 0.5}),
            SamplingParams {
                presence_penalty: 1.5,
                frequency_penalty: 0.5,
                ..Default::default()
            },
        ),
        (
            json!({"temperature": 0.9, "min_p": 0.2, "top_k": 50, "seed": 5}),
            SamplingParams {
                temperature: 0.9,
                min_p: 0.2,
                top_k: 50,
                seed: 5,
                ..Default::default()
            },
        ),
    ];
    let greedy = text(completion(&srv, 12, json!({"temperature": 0})));
    assert_eq!(greedy, engine_text(SamplingParams::default(), 12));
    for (fields, params) in cases {
        let got = text(completion(&srv, 12, fields.clone()));
        assert_eq!(got, engine_text(params, 12), "{fields}");
        if fields.get("temperature") == Some(&json!(0)) {
            assert_ne!(got, greedy, "{fields} changed nothing");
        }
    }
    // A +100 bias makes that token every pick.
    let forced = text(completion(
        &srv,
        4,
        json!({"temperature": 0, "logit_bias": {hello.to_string(): 100}}),
    ));
    assert_eq!(forced, codec.decode(&[hello; 4], true).unwrap());
}

#[test]
fn out_of_range_fields_are_refused_with_the_field_named() {
    let srv = server(|_| {});
    for (fields, param, says) in [
        (json!({"min_p": 1.5}), None, "min-p"),
        (json!({"presence_penalty": 2.5}), None, "presence-penalty"),
        (json!({"frequency_penalty": -3}), None, "frequency-penalty"),
        (json!({"repetition_penalty": 0}), None, "repetition-penalty"),
        (json!({"logit_bias": {"7": 101}}), None, "logit bias"),
        (json!({"logit_bias": {"word": 1}}), Some("logit_bias"), "token ids"),
        (
            json!({"logit_bias": {"999999999": 1}}),
            Some("logit_bias"),
            "vocabulary",
        ),
        // A value of the wrong type: where in the body (the sampling
        // fields are flattened into the request, so serde knows the column,
        // not the name).
        (json!({"logit_bias": ["7"]}), None, "expected a map at line 1"),
        (json!({"min_p": "high"}), None, "expected f32 at line 1"),
        (json!({"max_tokens": "many"}), None, "max_tokens: invalid type"),
    ] {
        let r = completion(&srv, 2, fields.clone());
        assert_eq!(r.status, 400, "{fields}: {}", r.text());
        let e = &r.json()["error"];
        assert!(e["message"].as_str().unwrap().contains(says), "{fields}: {e}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{fields}");
        }
    }
    // The server still answers.
    assert_eq!(completion(&srv, 2, json!({"temperature": 0})).status, 200);
}

/// The chat fixture with `settings` merged into its generation_config.json.
fn fixture_with_generation_config(settings: Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = chat_fixture();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::os::unix::fs::symlink(fixture.join(f), dir.path().join(f)).unwrap();
    }
    let mut gen: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("generation_config.json")).unwrap()).unwrap();
    for (k, v) in settings.as_object().unwrap() {
        gen[k] = v.clone();
    }
    std::fs::write(dir.path().join("generation_config.json"), gen.to_string()).unwrap();
    dir
}

fn server_for(dir: &std::path::Path) -> Result<Server, ServeError> {
    let (engine, info) = charm_coordinator::engine::Engine::load(dir, &Default::default()).unwrap();
    Server::start(engine, &info, ServerConfig::new(dir))
}

#[test]
fn omitted_fields_take_the_models_recommended_settings() {
    // top_k 1 at temperature 2: every seed gives the greedy answer unless
    // the request names its own top_k.
    let dir = fixture_with_generation_config(json!({"do_sample": true, "temperature": 2.0, "top_k": 1}));
    let srv = server_for(dir.path()).unwrap();
    let greedy = engine_text(SamplingParams::default(), 10);
    for seed in 0..4 {
        assert_eq!(text(completion(&srv, 10, json!({"seed": seed}))), greedy, "seed {seed}");
    }
    let own: std::collections::HashSet<String> = (0..4)
        .map(|seed| text(completion(&srv, 10, json!({"seed": seed, "top_k": 0}))))
        .collect();
    assert!(
        own.len() > 1,
        "temperature 2 without top_k should vary with the seed: {own:?}"
    );
    assert_eq!(
        text(completion(&srv, 10, json!({"seed": 3, "top_k": 0}))),
        engine_text(
            SamplingParams {
                temperature: 2.0,
                seed: 3,
                ..Default::default()
            },
            10
        )
    );
}

#[test]
fn a_model_recommending_an_out_of_range_setting_is_refused_at_start() {
    let dir = fixture_with_generation_config(json!({"top_p": 1.5}));
    let e = server_for(dir.path()).err().expect("top_p 1.5 refused");
    let msg = e.to_string();
    assert!(
        msg.contains("top_p 1.5") && msg.contains("top-p must be in (0, 1]"),
        "{msg}"
    );
}
