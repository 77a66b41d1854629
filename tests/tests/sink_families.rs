//! The families with attention sinks and sliding windows, gpt-oss and
//! MiMo-V2-Flash, beyond the oracle tests (`oracle_parity::gptoss`,
//! `oracle_parity::mimo`): the one rule across workers, containers, the
//! bounded sliding-window cache, and bad input.
//!
//! - `sink_families_are_bit_identical_on_any_worker_count`: teacher-forced
//!   logits and 16 greedy ids from `--local` and from three `worker`
//!   processes on 127.0.0.1 (gpt-oss's expert biases and clamped GLU run on
//!   the workers), for both families.
//! - `containers_keep_expert_biases_and_mxfp4_blocks`: a bf16 container
//!   (gpt-oss: biases in each expert's record; MiMo-V2-Flash) gives the same
//!   bits with cache 0, an unlimited cache and on three workers; the MXFP4 checkpoint's container
//!   keeps its experts as MXFP4 records and gives the bits of the
//!   checkpoint itself, on `--local` and on three workers.
//! - `a_long_run_holds_only_the_windows_of_sliding_layers`: after a
//!   4,000-token prompt and a few decoded tokens, each full layer holds
//!   every position and each sliding layer (window 4) between `w` and
//!   `2w - 1`, and `kv_cache_bytes` is exactly that sum; for both families
//!   (MiMo-V2-Flash with its per-layer KV heads and narrower values).
//! - `bad_gpt_oss_tensors_and_configs_are_named`: a missing sink, a wrong
//!   router bias, a non-positive `swiglu_limit`.

mod cluster_support;

use std::path::Path;
use std::time::Duration;

use charm_coordinator::{Engine, EngineOptions, GenerateParams, SamplingParams};
use charm_models::LayerCache;
use charm_tests::{fixture, Reference};
use cluster_support::*;

const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn sink_families_are_bit_identical_on_any_worker_count() {
    for name in ["gptoss", "mimo"] {
        let dir = fixture(name);
        let r = Reference::load(name);
        let tmp = tempfile::tempdir().unwrap();
        let key = keygen(tmp.path(), "cluster.key");
        let run = |e: &Engine| {
            (
                bits(&e.logits_all(&r.full_sequence()).unwrap()),
                greedy(e, &r.prompt_ids, 16),
            )
        };
        let want = run(&Engine::local(&dir).unwrap());
        assert_eq!(want.1, r.greedy_ids, "{name}: local run against transformers");
        let workers: Vec<Worker> = (0..3).map(|_| Worker::start(&dir, &key, &[])).collect();
        let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
        let svc = service(&dir, &key, &addrs, TIMEOUT, false);
        svc.wait_for_workers(3, TIMEOUT).unwrap();
        assert!(run(&engine(&dir, svc)) == want, "{name}: 3 workers");
    }
}

#[test]
fn containers_keep_expert_biases_and_mxfp4_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    let three = |dir: &Path, r: &Reference| {
        let workers: Vec<Worker> = (0..3)
            .map(|_| Worker::start(dir, &key, &["--expert-cache-gb", "0"]))
            .collect();
        let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
        let svc = service(dir, &key, &addrs, TIMEOUT, false);
        svc.wait_for_workers(3, TIMEOUT).unwrap();
        let e = engine(dir, svc);
        (
            bits(&e.logits_all(&r.full_sequence()).unwrap()),
            greedy(&e, &r.prompt_ids, 16),
        )
    };
    let cached = |dir: &Path, r: &Reference, gb: f64| {
        let opts = EngineOptions {
            expert_cache_bytes: Some((gb * (1u64 << 30) as f64) as u64),
            state_dir: Some(tmp.path().join("state")),
            ..EngineOptions::default()
        };
        let e = Engine::load(dir, &opts).unwrap().0;
        (
            bits(&e.logits_all(&r.full_sequence()).unwrap()),
            greedy(&e, &r.prompt_ids, 16),
        )
    };

    let r = Reference::load("gptoss");
    let c = convert_bf16(&fixture("gptoss"), tmp.path(), "gptoss-bf16");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["expert_bias"], true);
    assert_eq!(m["expert_glu_clamp"], serde_json::json!([1.702, 1.0]));
    let uncached = cached(&c, &r, 0.0);
    assert!(cached(&c, &r, 64.0) == uncached, "bf16 container: cache 0 vs unlimited");
    assert!(three(&c, &r) == uncached, "bf16 container on 3 workers");

    // MiMo-V2-Flash's experts are plain SwiGLU: its container the same way.
    let r = Reference::load("mimo");
    let c = convert_bf16(&fixture("mimo"), tmp.path(), "mimo-bf16");
    let uncached = cached(&c, &r, 0.0);
    assert!(
        cached(&c, &r, 64.0) == uncached,
        "mimo bf16 container: cache 0 vs unlimited"
    );
    assert!(three(&c, &r) == uncached, "mimo bf16 container on 3 workers");

    let r = Reference::load("gptoss-mxfp4");
    let src = fixture("gptoss-mxfp4");
    let direct = {
        let e = Engine::local(&src).unwrap();
        (
            bits(&e.logits_all(&r.full_sequence()).unwrap()),
            greedy(&e, &r.prompt_ids, 16),
        )
    };
    assert_eq!(direct.1, r.greedy_ids);
    // Kept as stored: no --quant to choose, and one given is refused.
    let convert = |quant: &[&str], out: &str| {
        std::process::Command::new(bin("coordinator"))
            .arg("--model")
            .arg(&src)
            .args(["convert", "--out"])
            .arg(tmp.path().join(out))
            .args(quant)
            .output()
            .unwrap()
    };
    let refused = convert(&["--quant", "bf16"], "refused");
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("MXFP4") && err.contains("drop --quant"), "{err}");
    let o = convert(&[], "gptoss-mxfp4-kept");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = tmp.path().join("gptoss-mxfp4-kept");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["quant"]["kind"], "gguf");
    assert!(m["records"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["ggml_types"] == serde_json::json!([39, 39, 39])));
    assert!(cached(&c, &r, 0.0) == direct, "MXFP4 container against the checkpoint");
    assert!(three(&c, &r) == direct, "MXFP4 container on 3 workers");
}

/// A fixture with a context long enough for 4,000 tokens.
fn long_context_copy(root: &Path, name: &str) -> std::path::PathBuf {
    let src = fixture(name);
    let dir = root.join(format!("{name}-long"));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["max_position_embeddings"] = 8192.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn a_long_run_holds_only_the_windows_of_sliding_layers() {
    for name in ["gptoss", "mimo"] {
        long_run(name);
    }
}

fn long_run(name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let engine = Engine::local(&long_context_copy(tmp.path(), name)).unwrap();
    let cfg = engine.config().clone();
    let prompt: Vec<u32> = (0..4000u32).map(|i| 3 + (i * 7919) % 1000).collect();
    let mut session = engine.session();
    let params = GenerateParams {
        max_tokens: 5,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        ignore_eos: true,
    };
    let gen = engine.generate(&mut session, &prompt, &params, |_| true).unwrap();
    let seen = prompt.len() + 4; // the last sampled id is never fed back
    assert_eq!(session.cache().len(), seen);
    // Keys and values, f32, with each layer's KV heads.
    let per_position = |l: usize| cfg.kv_heads(l) * (cfg.head_dim + cfg.v_head_dim()) * 4;
    let (mut expected, mut full, mut sliding_max) = (0, 0, 0);
    for (l, layer) in session.cache().layers.iter().enumerate() {
        let LayerCache::Kv(kv) = layer else {
            panic!("{name} layer {l} is attention")
        };
        match cfg.sliding_window[l] {
            Some(w) => {
                assert_eq!(w, 4);
                assert!((w..2 * w).contains(&kv.held()), "{name} layer {l} holds {}", kv.held());
                assert_eq!(kv.start() + kv.held(), seen);
                sliding_max += (2 * w - 1) * per_position(l);
            }
            None => {
                assert_eq!(kv.held(), seen, "{name} layer {l}");
                full += seen * per_position(l);
            }
        }
        assert_eq!(layer.bytes(), kv.held() * per_position(l), "{name} layer {l}");
        expected += kv.held() * per_position(l);
    }
    assert_eq!(gen.stats.kv_cache_bytes, expected, "{name}");
    // The full layers hold every position; each sliding one at most 2w - 1.
    assert!(expected > full && expected <= full + sliding_max, "{name}");
    assert_eq!(session.cache().sliding_bytes(), sliding_max, "{name}");
}

/// Writes `tensors` over a copy of the gptoss fixture (each named tensor
/// replaced by the given shape of zeros, or removed) and a config edit.
fn damaged(
    root: &Path,
    name: &str,
    edit: &dyn Fn(&mut serde_json::Value),
    drop: &[&str],
    reshape: &[(&str, Vec<usize>)],
) -> std::path::PathBuf {
    use safetensors::tensor::{serialize_to_file, Dtype, TensorView};
    let src = fixture("gptoss");
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let zeros: Vec<(String, Vec<usize>, Vec<u8>)> = reshape
        .iter()
        .map(|(n, shape)| {
            (
                n.to_string(),
                shape.clone(),
                vec![0u8; shape.iter().product::<usize>() * 4],
            )
        })
        .collect();
    let mut views: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| !drop.contains(&n.as_str()) && !reshape.iter().any(|(r, _)| r == n))
        .collect();
    for (n, shape, data) in &zeros {
        views.push((n.clone(), TensorView::new(Dtype::F32, shape.clone(), data).unwrap()));
    }
    serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn bad_gpt_oss_tensors_and_configs_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let same = |_: &mut serde_json::Value| {};
    let err = |dir: std::path::PathBuf| match Engine::local(&dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => format!("{e:#}"),
    };
    let e = err(damaged(
        tmp.path(),
        "nosink",
        &same,
        &["model.layers.1.self_attn.sinks"],
        &[],
    ));
    assert!(e.contains("model.layers.1.self_attn.sinks"), "{e}");
    let e = err(damaged(
        tmp.path(),
        "routerbias",
        &same,
        &[],
        &[("model.layers.2.mlp.router.bias", vec![7])],
    ));
    assert!(e.contains("model.layers.2.mlp.router.bias"), "{e}");
    let e = err(damaged(
        tmp.path(),
        "limit",
        &|c| c["swiglu_limit"] = (-1.0).into(),
        &[],
        &[],
    ));
    assert!(e.contains("swiglu_limit"), "{e}");
    let e = err(damaged(
        tmp.path(),
        "experts",
        &same,
        &["model.layers.0.mlp.experts.down_proj_bias"],
        &[],
    ));
    assert!(e.contains("model.layers.0.mlp.experts.0."), "{e}");
}
