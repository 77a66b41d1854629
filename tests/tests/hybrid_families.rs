//! Qwen3-Next and Qwen3.5 (gated DeltaNet + gated attention hybrids) under
//! the one rule, and their bad input. Real `worker` processes on 127.0.0.1.
//!
//! - `hybrids_are_bit_identical_on_any_worker_count_and_cache`: for both
//!   fixtures, teacher-forced logits and 16 greedy ids from `--local`, one
//!   and three workers are the same bits (Hugging Face directory); a bf16
//!   container gives the same bits with cache 0 and an unlimited cache, and
//!   on three workers.
//! - `layer_types_that_disagree_with_the_tensors_name_the_missing_tensor`:
//!   a config calling a DeltaNet layer full attention fails saying so and
//!   naming the attention tensor it lacks; an unknown layer type is named.
//! - `a_missing_conv_tensor_is_named`: a checkpoint without a layer's
//!   `conv1d.weight` fails naming it.
//! - `hybrid_ggufs_convert_to_containers_with_the_same_bits`: llama.cpp's
//!   F32 and Q8_0 files of both families, re-laid into containers by
//!   `coordinator convert`, give the GGUF's own logit bits and ids.

mod cluster_support;

use std::path::Path;
use std::time::Duration;

use charm_coordinator::{Engine, EngineOptions};
use charm_tests::{fixture, Reference};
use cluster_support::*;

const TIMEOUT: Duration = Duration::from_secs(10);

fn logits_and_ids(e: &Engine, r: &Reference) -> (Vec<u32>, Vec<u32>) {
    (
        bits(&e.logits_all(&r.full_sequence()).unwrap()),
        greedy(e, &r.prompt_ids, 16),
    )
}

#[test]
fn hybrids_are_bit_identical_on_any_worker_count_and_cache() {
    for name in ["qwen3next", "qwen35moe", "qwen35moe-vl"] {
        let dir = fixture(name);
        let r = Reference::load(name);
        let tmp = tempfile::tempdir().unwrap();
        let key = keygen(tmp.path(), "cluster.key");

        let want = logits_and_ids(&Engine::local(&dir).unwrap(), &r);
        assert_eq!(want.1, r.greedy_ids, "{name}: local run against transformers");
        let workers: Vec<Worker> = (0..3).map(|_| Worker::start(&dir, &key, &[])).collect();
        for n in [1, 3] {
            let addrs: Vec<_> = workers[..n].iter().map(|w| w.addr).collect();
            let svc = service(&dir, &key, &addrs, TIMEOUT, false);
            svc.wait_for_workers(n, TIMEOUT).unwrap();
            assert!(logits_and_ids(&engine(&dir, svc), &r) == want, "{name}: {n} workers");
        }
        drop(workers);

        let c = convert_bf16(&dir, tmp.path(), &format!("{name}-bf16"));
        let run = |cache_gb: f64| {
            let opts = EngineOptions {
                expert_cache_bytes: Some((cache_gb * (1u64 << 30) as f64) as u64),
                state_dir: Some(tmp.path().join("state")),
                ..EngineOptions::default()
            };
            logits_and_ids(&Engine::load(&c, &opts).unwrap().0, &r)
        };
        let uncached = run(0.0);
        assert!(run(64.0) == uncached, "{name}: cache 0 vs unlimited");
        let workers: Vec<Worker> = (0..3)
            .map(|_| Worker::start(&c, &key, &["--expert-cache-gb", "0"]))
            .collect();
        let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
        let svc = service(&c, &key, &addrs, TIMEOUT, false);
        svc.wait_for_workers(3, TIMEOUT).unwrap();
        assert!(
            logits_and_ids(&engine(&c, svc), &r) == uncached,
            "{name}: container on 3 workers"
        );
    }
}

/// A copy of fixture `name` with its config edited by `edit`.
fn edited_config(name: &str, tmp: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
    let out = tmp.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, out.join(p.file_name().unwrap())).unwrap();
    }
    let path = out.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    out
}

fn load_err(dir: &Path) -> String {
    match Engine::local(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn layer_types_that_disagree_with_the_tensors_name_the_missing_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = edited_config("qwen3next", tmp.path(), |v| {
        v["layer_types"] = serde_json::json!([
            "full_attention",
            "linear_attention",
            "linear_attention",
            "full_attention"
        ]);
    });
    let err = load_err(&dir);
    assert!(
        err.contains("layer 0: the config makes it full attention, but the weights hold linear_attn"),
        "{err}"
    );
    assert!(
        err.contains("model.layers.0.self_attn."),
        "names the tensor it looked for: {err}"
    );
    let dir = edited_config("qwen3next", tmp.path(), |v| {
        v["layer_types"] = serde_json::json!(["linear_attention", "bogus", "linear_attention", "full_attention"]);
    });
    let err = load_err(&dir);
    assert!(err.contains("\"bogus\""), "{err}");
}

#[test]
fn a_missing_conv_tensor_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = edited_config("qwen35moe", tmp.path(), |_| {});
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let gone = "model.layers.1.linear_attn.conv1d.weight";
    let kept: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| n != gone).collect();
    assert!(kept.len() + 1 == st.len(), "the fixture has {gone}");
    safetensors::tensor::serialize_to_file(kept, None, &path).unwrap();
    let err = load_err(&dir);
    assert!(err.contains(gone), "{err}");
}

#[test]
fn hybrid_ggufs_convert_to_containers_with_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, reference) in [
        ("qwen3next-f32", "qwen3next"),
        ("qwen3next-q8_0", "qwen3next"),
        ("qwen35moe-f32", "qwen35moe"),
        ("qwen35moe-q8_0", "qwen35moe"),
    ] {
        let gguf = fixture("gguf").join(format!("{name}.gguf"));
        let r = Reference::load(reference);
        let want = logits_and_ids(&Engine::local(&gguf).unwrap(), &r);
        let out = tmp.path().join(name);
        let o = coordinator(&[
            "--model",
            gguf.to_str().unwrap(),
            "convert",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(
            logits_and_ids(&Engine::local(&out).unwrap(), &r) == want,
            "{name}: container"
        );
    }
}
