//! The DeepSeek lineage (DeepSeek-V3 with and without `q_lora_rank`,
//! GLM-4.5-style MoE, GLM-4.7-Flash, MiniMax-M2) under the one rule, the
//! latent cache's size, and bad input. Real `worker` processes on 127.0.0.1.
//!
//! - `deepseek_lineage_is_bit_identical_on_any_worker_count_and_cache`:
//!   teacher-forced logits and 16 greedy ids from `--local` and three
//!   workers (Hugging Face directory) are the same bits; a bf16 container
//!   gives the same bits with cache 0, an unlimited cache and on three
//!   workers.
//! - `lineage_ggufs_keep_their_bits_in_containers_and_on_workers`: the
//!   Q8_0 GGUFs of llama.cpp's converter against their containers, on
//!   `--local` and on three workers.
//! - `gguf_mla_up_projections_keep_their_stored_type`: GGUF's per-head
//!   `attn_k_b` / `attn_v_b` are multiplied in their stored type, not
//!   widened to f32.
//! - `the_latent_cache_holds_the_latent_and_the_rope_key`: an MLA layer
//!   caches `(kv_lora_rank + qk_rope_head_dim) × 4` bytes per position
//!   (× 2 with the f16 cache), whatever the head count.
//! - `sparse_attention_layers_cache_the_indexer_keys`: DeepSeek-V3.2 and
//!   GLM-5 layers with an indexer also cache its keys; shared ones do not.
//! - `bad_configs_and_tensors_are_named`: a missing `kv_b_proj`, an
//!   unknown rope scaling type, `n_group` that does not divide the experts,
//!   a wrong-sized `e_score_correction_bias`; for FP8, a scale grid of the
//!   wrong shape, a missing one, a malformed `weight_block_size`.
//!
//! The sparse-attention fixtures (`deepseekv32`, `glmmoedsa`) and Kimi
//! K2.5's vision-language wrapper (`kimik25-vl`) join the bit-identity test
//! too.
//!
//! The FP8 fixture (`deepseekv3-fp8`, DeepSeek-V3 as released: F8_E4M3
//! matrices with `weight_scale_inv` blocks) joins the bit-identity test:
//! read directly, and converted to a bf16 container.

mod cluster_support;

use std::path::Path;
use std::time::Duration;

use charm_coordinator::{Engine, EngineOptions};
use charm_models::{KvDtype, LayerCache, MixerKind};
use charm_tests::{fixture, Reference};
use cluster_support::*;

const TIMEOUT: Duration = Duration::from_secs(10);
const FIXTURES: [&str; 5] = ["deepseekv3", "deepseekv3-noq", "glm4moe", "glm4moelite", "minimax-m2"];
/// DeepSeek-V3 as released: block-scaled FP8 matrices (`make_fixtures.py deepseekv3-fp8`).
const FP8: &str = "deepseekv3-fp8";
/// DeepSeek Sparse Attention: DeepSeek-V3.2 and GLM-5 (shared selections).
const DSA: [&str; 2] = ["deepseekv32", "glmmoedsa"];
/// Kimi K2.5's vision-language wrapper around the deepseekv3 weights.
const KIMI_VL: &str = "kimik25-vl";

fn logits_and_ids(e: &Engine, r: &Reference) -> (Vec<u32>, Vec<u32>) {
    (
        bits(&e.logits_all(&r.full_sequence()).unwrap()),
        greedy(e, &r.prompt_ids, 16),
    )
}

#[test]
fn deepseek_lineage_is_bit_identical_on_any_worker_count_and_cache() {
    for name in FIXTURES.into_iter().chain([FP8, KIMI_VL]).chain(DSA) {
        let dir = fixture(name);
        let r = Reference::load(name);
        let tmp = tempfile::tempdir().unwrap();
        let key = keygen(tmp.path(), "cluster.key");

        let want = logits_and_ids(&Engine::local(&dir).unwrap(), &r);
        assert_eq!(want.1, r.greedy_ids, "{name}: local run against transformers");
        let workers: Vec<Worker> = (0..3).map(|_| Worker::start(&dir, &key, &[])).collect();
        let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
        let svc = service(&dir, &key, &addrs, TIMEOUT, false);
        svc.wait_for_workers(3, TIMEOUT).unwrap();
        assert!(logits_and_ids(&engine(&dir, svc), &r) == want, "{name}: 3 workers");
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

/// A sparse-attention layer that runs an indexer caches its keys
/// (`index_head_dim` per position) beside the latent; a GLM-5 layer that
/// shares an earlier layer's selection caches the latent only.
#[test]
fn sparse_attention_layers_cache_the_indexer_keys() {
    for name in DSA {
        let r = Reference::load(name);
        let e = Engine::local(&fixture(name)).unwrap();
        let (mla, dsa) = (e.config().mla.unwrap(), e.config().dsa.clone().expect("a DSA model"));
        let mut cache = e.model.new_cache();
        e.forward(&r.prompt_ids, &mut cache, false).unwrap();
        let n = r.prompt_ids.len();
        for (l, c) in cache.layers.iter().enumerate() {
            let index = if dsa.shared[l] { 0 } else { dsa.head_dim };
            assert_eq!(
                c.bytes(),
                (mla.kv_lora_rank + mla.qk_rope_head_dim + index) * 4 * n,
                "{name} layer {l}"
            );
        }
        assert_eq!(
            dsa.shared.iter().filter(|&&s| s).count(),
            if name == "glmmoedsa" { 2 } else { 0 }
        );
    }
}

/// llama.cpp's Q8_0 conversions of the fixtures (`make_gguf_lineage_fixtures.py`)
/// give the GGUF's bits converted to containers (blocks as stored), on
/// `--local` and on three workers.
#[test]
fn lineage_ggufs_keep_their_bits_in_containers_and_on_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    for name in FIXTURES.into_iter().chain(DSA) {
        let gguf = fixture("gguf").join(format!("{name}-q8_0.gguf"));
        let r = Reference::load(name);
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
            "{name}: container of the GGUF"
        );
        let workers: Vec<Worker> = (0..3).map(|_| Worker::start(&out, &key, &[])).collect();
        let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
        let svc = service(&out, &key, &addrs, TIMEOUT, false);
        svc.wait_for_workers(3, TIMEOUT).unwrap();
        assert!(logits_and_ids(&engine(&out, svc), &r) == want, "{name}: on 3 workers");
    }
}

/// GGUF's per-head up-projections are multiplied as stored: each head's
/// `W_UKᵀ` / `W_UV` has the stored type of `attn_k_b` / `attn_v_b` (the
/// converter's Q8_0 fixtures keep these narrow tensors in F16; a Q5_0
/// one becomes Q8_0), never an f32 widening of a narrower type; a file
/// with the joined `attn_kv_b` of older converters leaves the split to
/// latent attention (`None`).
#[test]
fn gguf_mla_up_projections_keep_their_stored_type() {
    use charm_common::gguf::GgmlType;
    use charm_common::{WeightFormat, WeightSource};
    let stored = |m: &charm_models::gguf::GgufModel, name: &str| match m.file.tensor(name).unwrap().ty {
        GgmlType::F32 => WeightFormat::F32,
        GgmlType::F16 => WeightFormat::F16,
        GgmlType::BF16 => WeightFormat::BF16,
        GgmlType::Q5_0 => WeightFormat::Gguf(GgmlType::Q8_0),
        ty => WeightFormat::Gguf(ty),
    };
    let mut narrower = 0;
    for (file, split) in [
        ("deepseekv3-q8_0.gguf", true),
        ("glm4moelite-q8_0.gguf", true),
        ("deepseekv3-f32.gguf", true),
        ("deepseekv3-kvb-f32.gguf", false),
    ] {
        let m = charm_models::gguf::GgufModel::open(&fixture("gguf").join(file)).unwrap();
        let s = m.cfg.mla.expect("an MLA model");
        let (heads, dims) = (m.cfg.num_heads, (s.kv_lora_rank, s.qk_nope_head_dim, s.v_head_dim));
        let got = m.mla_heads(0, heads, dims).unwrap();
        assert_eq!(got.is_some(), split, "{file}");
        let Some((uk_t, uv)) = got else { continue };
        let (kf, vf) = (stored(&m, "blk.0.attn_k_b.weight"), stored(&m, "blk.0.attn_v_b.weight"));
        narrower += usize::from(kf != WeightFormat::F32) + usize::from(vf != WeightFormat::F32);
        assert_eq!((uk_t.len(), uv.len()), (heads, heads), "{file}");
        for (k, v) in uk_t.iter().zip(&uv) {
            assert_eq!((k.rows(), k.cols(), k.format()), (dims.0, dims.1, kf), "{file}: W_UKᵀ");
            assert_eq!((v.rows(), v.cols(), v.format()), (dims.2, dims.0, vf), "{file}: W_UV");
        }
    }
    assert!(
        narrower > 0,
        "the quantized fixtures store the up-projections narrower than f32"
    );
}

#[test]
fn the_latent_cache_holds_the_latent_and_the_rope_key() {
    for name in ["deepseekv3", "glm4moelite"] {
        let r = Reference::load(name);
        for (dtype, size) in [(KvDtype::F32, 4), (KvDtype::F16, 2)] {
            let mut e = Engine::local(&fixture(name)).unwrap();
            e.model.kv_dtype = dtype;
            let mla = e.config().mla.expect("an MLA model");
            assert!(e.config().mixers.iter().all(|&m| m == MixerKind::Mla), "{name}");
            let mut cache = e.model.new_cache();
            e.forward(&r.prompt_ids, &mut cache, false).unwrap();
            let per_layer = (mla.kv_lora_rank + mla.qk_rope_head_dim) * size * r.prompt_ids.len();
            for l in &cache.layers {
                assert!(matches!(l, LayerCache::Latent(_)), "{name}: a latent cache");
                assert_eq!(l.bytes(), per_layer, "{name} {dtype}");
            }
            assert_eq!(cache.bytes(), per_layer * e.config().num_layers, "{name} {dtype}");
        }
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

/// `dir/model.safetensors` without the tensor `gone`, or with it replaced
/// by `replace` (same dtype, the given shape and little-endian f32 data).
fn edit_tensor(dir: &Path, gone: &str, replace: Option<(Vec<usize>, Vec<f32>)>) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let data: Vec<u8> = replace
        .as_ref()
        .map(|(_, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .unwrap_or_default();
    let mut kept: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| n != gone).collect();
    assert_eq!(kept.len() + 1, st.len(), "the fixture has {gone}");
    if let Some((shape, _)) = &replace {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), &data).unwrap();
        kept.push((gone.to_string(), view));
    }
    safetensors::tensor::serialize_to_file(kept, None, &path).unwrap();
}

#[test]
fn bad_configs_and_tensors_are_named() {
    let tmp = tempfile::tempdir().unwrap();

    let dir = edited_config("deepseekv3", &tmp.path().join("a"), |_| {});
    edit_tensor(&dir, "model.layers.2.self_attn.kv_b_proj.weight", None);
    let err = load_err(&dir);
    assert!(err.contains("model.layers.2.self_attn.kv_b_proj.weight"), "{err}");

    let dir = edited_config("deepseekv3", &tmp.path().join("b"), |v| {
        v["rope_scaling"]["type"] = serde_json::json!("longrope");
    });
    let err = load_err(&dir);
    assert!(err.contains("rope scaling type longrope is not supported"), "{err}");

    let dir = edited_config("glm4moe", &tmp.path().join("c"), |v| {
        v["n_group"] = serde_json::json!(3);
    });
    let err = load_err(&dir);
    assert!(err.contains("n_group (3) must divide the 16 experts"), "{err}");

    let dir = edited_config("deepseekv3", &tmp.path().join("d"), |_| {});
    let name = "model.layers.1.mlp.gate.e_score_correction_bias";
    edit_tensor(&dir, name, Some((vec![8], vec![0.0; 8])));
    let err = load_err(&dir);
    assert!(err.contains(name), "{err}");

    // FP8: a scale grid of the wrong shape, and a missing one, are named.
    let dir = edited_config(FP8, &tmp.path().join("e"), |_| {});
    let name = "model.layers.2.self_attn.o_proj.weight_scale_inv";
    edit_tensor(&dir, name, Some((vec![16, 21], vec![1.0; 16 * 21])));
    let err = load_err(&dir);
    assert!(
        err.contains(name) && err.contains("[16, 21]") && err.contains("[16, 20]"),
        "{err}"
    );
    let dir = edited_config(FP8, &tmp.path().join("f"), |_| {});
    let name = "model.layers.3.mlp.experts.5.down_proj.weight_scale_inv";
    edit_tensor(&dir, name, None);
    let err = load_err(&dir);
    assert!(err.contains(name), "{err}");
    // A block size that is not two positive integers.
    let dir = edited_config(FP8, &tmp.path().join("g"), |v| {
        v["quantization_config"]["weight_block_size"] = serde_json::json!([128]);
    });
    let err = load_err(&dir);
    assert!(err.contains("weight_block_size"), "{err}");

    // Kimi K2.5 as released stores its experts as compressed-tensors int4.
    let dir = edited_config(KIMI_VL, &tmp.path().join("m"), |v| {
        v["quantization_config"] =
            serde_json::json!({"quant_method": "compressed-tensors", "format": "pack-quantized"});
    });
    let err = load_err(&dir);
    assert!(
        err.contains("quantization_config.quant_method \"compressed-tensors\" is not supported"),
        "{err}"
    );

    // Sparse attention: a missing indexer tensor, indexer_types that do not
    // fit the layers, an unknown indexer type, an empty selection.
    let dir = edited_config("glmmoedsa", &tmp.path().join("h"), |_| {});
    let name = "model.layers.2.self_attn.indexer.wk.weight";
    edit_tensor(&dir, name, None);
    let err = load_err(&dir);
    assert!(err.contains(name), "{err}");
    for (sub, edit, want) in [
        (
            "i",
            serde_json::json!({"indexer_types": ["full", "shared"]}),
            "indexer_types has 2 entries for 4 layers",
        ),
        (
            "j",
            serde_json::json!({"indexer_types": ["shared", "full", "full", "full"]}),
            "the first must be \"full\"",
        ),
        (
            "k",
            serde_json::json!({"indexer_types": ["full", "dense", "full", "full"]}),
            "indexer type \"dense\"",
        ),
        ("l", serde_json::json!({"index_topk": 0}), "index_topk 0"),
    ] {
        let dir = edited_config("glmmoedsa", &tmp.path().join(sub), |v| {
            for (k, x) in edit.as_object().unwrap() {
                v[k] = x.clone();
            }
        });
        let err = load_err(&dir);
        assert!(err.contains(want), "{sub}: {err}");
    }
}
