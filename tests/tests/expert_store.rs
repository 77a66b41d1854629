//! The expert store of a charm container, against the one rule: for the
//! same container, any cache budget, prefetch on or off, io_uring or pread,
//! O_DIRECT or not give bit-identical ids and logits. Also: a bf16
//! container reproduces its Hugging Face directory exactly, cache 0 reads
//! exactly what the routing implies, an unlimited cache reads nothing the
//! second time, routing history is learned and tied to the model, and bad
//! containers are clear errors.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use charm_common::container::{Manifest, Quant};
use charm_common::TensorFiles;
use charm_coordinator::convert::convert;
use charm_coordinator::{Engine, EngineOptions, GenerateParams, SamplingParams};
use charm_models::{ExpertError, ExpertService, ExpertStats, Model, ModelConfig};
use charm_proto::{ExpertBatch, ExpertOutputs};
use charm_tests::{fixture, repo_root, Reference};
use charm_worker::io::{Backend, DiskReader, IoError, ReaderOptions};
use charm_worker::{InProcessWorker, ResidentStore};

/// CI strict mode (`CHARM_CI=1`): a combination this machine cannot run
/// fails instead of being skipped.
fn strict() -> bool {
    std::env::var("CHARM_CI").is_ok_and(|v| v == "1")
}

/// Whether `experts` can be read with `backend` and `direct_io` here: `Err`
/// says why not when io_uring is unavailable or the filesystem refuses
/// `O_DIRECT` (told apart by the reader's typed error, not its message).
/// Any other failure to open is a test failure.
fn io_capability(experts: &Path, backend: Backend, direct_io: bool) -> Result<(), String> {
    let o = ReaderOptions {
        direct_io,
        backend: Some(backend),
        ..ReaderOptions::default()
    };
    match DiskReader::open(experts, &o) {
        Ok(_) => Ok(()),
        Err(e @ (IoError::UringUnavailable { .. } | IoError::DirectIoUnsupported { .. })) => Err(e.to_string()),
        Err(e) => panic!("opening {} with {o:?}: {e}", experts.display()),
    }
}

/// A scratch directory on the repository's disk (O_DIRECT needs a real
/// filesystem; /tmp may be tmpfs elsewhere).
fn scratch() -> tempfile::TempDir {
    let base = repo_root().join("target").join("test-scratch");
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new().prefix("store-").tempdir_in(base).unwrap()
}

fn container(tmp: &Path, name: &str, quant: Quant) -> PathBuf {
    let out = tmp.join(format!("{name}-{}", quant.name()));
    convert(&fixture(name), &out, quant, false).unwrap_or_else(|e| panic!("convert {name}: {e:#}"));
    out
}

fn opts(tmp: &Path, cache: Option<u64>) -> EngineOptions {
    EngineOptions {
        expert_cache_bytes: cache,
        state_dir: Some(tmp.join(format!("state-{}", rand_suffix()))),
        ..EngineOptions::default()
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn greedy(n: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n,
        sampling: SamplingParams::default(),
        ignore_eos: true,
    }
}

/// Greedy ids, the teacher-forced logits over prompt + ids, and the
/// generation's expert counters.
fn run(engine: &Engine, prompt: &[u32]) -> (Vec<u32>, Vec<f32>, ExpertStats) {
    let mut s = engine.session();
    let gen = engine
        .generate(&mut s, prompt, &greedy(16), |_| true)
        .expect("generate");
    let mut all = prompt.to_vec();
    all.extend(&gen.ids);
    let logits = engine.logits_all(&all).expect("logits_all");
    (gen.ids, logits, gen.stats.experts)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn bf16_container_reproduces_the_hf_directory_bit_for_bit() {
    let tmp = scratch();
    for name in ["mixtral", "qwen3moe-chat"] {
        if name == "qwen3moe-chat" {
            charm_tests::material("tests/fixtures/qwen3moe-chat/tokenizer.json");
        }
        let r = Reference::load(name);
        let hf = Engine::local(&fixture(name)).unwrap();
        let (hf_ids, hf_logits, _) = run(&hf, &r.prompt_ids);
        assert_eq!(hf_ids, r.greedy_ids, "{name}: HF directory");
        let c = container(tmp.path(), name, Quant::Bf16);
        let (engine, info) = Engine::load(&c, &opts(tmp.path(), Some(0))).unwrap();
        assert!(info.container);
        let (ids, logits, _) = run(&engine, &r.prompt_ids);
        assert_eq!(ids, r.greedy_ids, "{name}: bf16 container");
        assert_eq!(
            bits(&logits),
            bits(&hf_logits),
            "{name}: logits differ from the HF directory"
        );
        // The container is a complete model directory: tokenizer and config came along.
        assert_eq!(
            c.join("tokenizer.json").exists(),
            fixture(name).join("tokenizer.json").exists()
        );
    }
}

#[test]
fn placement_and_io_settings_never_change_a_bit() {
    let tmp = scratch();
    let r = Reference::load("mixtral");
    for quant in [Quant::Bf16, Quant::Int8 { group: 32 }, Quant::Int4 { group: 32 }] {
        let c = container(tmp.path(), "mixtral", quant);
        let per_expert = Manifest::open(&c).unwrap().records[0].padded_len();
        let mut baseline: Option<(Vec<u32>, Vec<u32>)> = None;
        for cache in [0, 3 * per_expert, u64::MAX] {
            for prefetch in [true, false] {
                for backend in [Backend::Pread, Backend::IoUring] {
                    for direct_io in [false, true] {
                        let mut o = opts(tmp.path(), Some(cache));
                        o.prefetch = prefetch;
                        o.direct_io = direct_io;
                        o.io_backend = Some(backend);
                        let what =
                            format!("{quant:?} cache={cache} prefetch={prefetch} {backend:?} direct={direct_io}");
                        // io_uring or O_DIRECT may be unavailable on a developer's
                        // machine: that combination cannot run (loudly), the others
                        // still must agree. CI (`CHARM_CI=1`) runs every one.
                        if let Err(why) = io_capability(&c.join("experts.bin"), backend, direct_io) {
                            assert!(!strict(), "CHARM_CI=1 but {what} cannot run here: {why}");
                            eprintln!("WARNING: skipping {what} (CHARM_CI=1 would fail): {why}");
                            continue;
                        }
                        let engine = match Engine::load(&c, &o) {
                            Ok((e, _)) => e,
                            Err(e) => panic!("{what}: {e}"),
                        };
                        let (ids, logits, _) = run(&engine, &r.prompt_ids);
                        let got = (ids, bits(&logits));
                        match &baseline {
                            None => baseline = Some(got),
                            Some(b) => assert!(*b == got, "{what}: ids or logits differ"),
                        }
                    }
                }
            }
        }
        if quant == Quant::Bf16 {
            assert_eq!(baseline.unwrap().0, r.greedy_ids);
        }
    }
}

/// A filesystem refusing `O_DIRECT` (procfs always does; tmpfs before Linux
/// 6.6) is recognised by the reader's typed error, so the placement test
/// skips (or, under `CHARM_CI=1`, fails) instead of panicking on a message
/// it did not expect.
#[cfg(target_os = "linux")]
#[test]
fn direct_io_refusal_is_told_apart_by_error_type() {
    let proc_file = Path::new("/proc/self/status");
    let why = io_capability(proc_file, Backend::Pread, true).unwrap_err();
    assert!(why.contains("O_DIRECT") && why.contains("Invalid argument"), "{why}");
    assert_eq!(io_capability(proc_file, Backend::Pread, false), Ok(()));
    // The scratch dir is on the repository's disk, which CI keeps O_DIRECT-capable.
    let tmp = scratch();
    let experts = tmp.path().join("experts.bin");
    std::fs::write(&experts, vec![0u8; 8192]).unwrap();
    let here = io_capability(&experts, Backend::Pread, true);
    assert!(here.is_ok() || !strict(), "CHARM_CI=1 but {here:?}");
    let missing = std::panic::catch_unwind(|| io_capability(&tmp.path().join("missing.bin"), Backend::Pread, true));
    assert!(missing.is_err(), "a missing file is a failure, not a skip");
}

/// Counts the unique experts of every layer step.
struct Counting {
    inner: Arc<dyn ExpertService>,
    groups: Mutex<u64>,
}

impl ExpertService for Counting {
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError> {
        *self.groups.lock().unwrap() += batch.groups.len() as u64;
        self.inner.run(batch)
    }
    fn stats(&self) -> ExpertStats {
        self.inner.stats()
    }
}

#[test]
fn cache_zero_reads_exactly_what_the_routing_implies() {
    let tmp = scratch();
    let r = Reference::load("olmoe");
    let dir = fixture("olmoe");
    let cfg = ModelConfig::load(&dir).unwrap();
    let files = TensorFiles::open(&dir).unwrap();
    let counting = Arc::new(Counting {
        inner: Arc::new(InProcessWorker::new(ResidentStore::open(&files, &cfg).unwrap())),
        groups: Mutex::new(0),
    });
    let hf = Engine::new(Model::from_files(cfg, &files).unwrap(), counting.clone());
    let mut s = hf.session();
    hf.generate(&mut s, &r.prompt_ids, &greedy(16), |_| true).unwrap();
    let unique_per_step_total = *counting.groups.lock().unwrap();

    let c = container(tmp.path(), "olmoe", Quant::Int8 { group: 0 });
    let record = Manifest::open(&c).unwrap().records[0].padded_len();
    let mut o = opts(tmp.path(), Some(0));
    o.prefetch = false;
    let (engine, _) = Engine::load(&c, &o).unwrap();
    let mut s = engine.session();
    let gen = engine.generate(&mut s, &r.prompt_ids, &greedy(16), |_| true).unwrap();
    let e = gen.stats.experts;
    assert_eq!(e.expert_hits, 0);
    assert_eq!(e.expert_misses, unique_per_step_total);
    assert_eq!(e.expert_bytes_read, unique_per_step_total * record);
    assert_eq!(e.cache_bytes, 0);
    assert_eq!(e.prefetch_issued, 0);
}

#[test]
fn unlimited_cache_reads_nothing_the_second_time() {
    let tmp = scratch();
    let r = Reference::load("qwen3moe");
    let c = container(tmp.path(), "qwen3moe", Quant::Bf16);
    let (engine, _) = Engine::load(&c, &opts(tmp.path(), Some(u64::MAX))).unwrap();
    let (ids1, _, first) = run(&engine, &r.prompt_ids);
    assert!(first.expert_bytes_read > 0);
    let mut s = engine.session();
    let gen = engine.generate(&mut s, &r.prompt_ids, &greedy(16), |_| true).unwrap();
    let second = gen.stats.experts;
    assert_eq!(gen.ids, ids1);
    assert_eq!(second.expert_bytes_read, 0, "{second:?}");
    assert_eq!(second.expert_misses, 0);
    assert!(second.expert_hits > 0);
    assert_eq!(second.cache_bytes, first.cache_bytes.max(second.cache_bytes));
}

#[test]
fn routing_history_is_learned_and_tied_to_the_model() {
    let tmp = scratch();
    let r = Reference::load("mixtral");
    let c = container(tmp.path(), "mixtral", Quant::Bf16);
    let state = tmp.path().join("state-shared");
    let mut o = opts(tmp.path(), Some(u64::MAX));
    o.state_dir = Some(state.clone());
    let (engine, info) = Engine::load(&c, &o).unwrap();
    assert!(info.warning.is_none());
    let mut s = engine.session();
    engine.generate(&mut s, &r.prompt_ids, &greedy(16), |_| true).unwrap();
    let path = state.join("routing-history.json");
    let h: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(h["fingerprint"], info.fingerprint.as_str());
    let total: u64 = h["counts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l.as_array().unwrap().iter().map(|c| c.as_u64().unwrap()))
        .sum();
    // Rows run: the prompt, then 15 decode steps (the 16th token is not fed back);
    // each row routes to top_k = 2 experts in each of the 2 MoE layers.
    assert_eq!(total, (r.prompt_ids.len() as u64 + 15) * 2 * 2);

    // The same history offered to another model is ignored with a warning.
    let other = container(tmp.path(), "olmoe", Quant::Bf16);
    let mut o2 = opts(tmp.path(), Some(u64::MAX));
    o2.state_dir = Some(state);
    let (_, info2) = Engine::load(&other, &o2).unwrap();
    let w = info2.warning.expect("a warning about the foreign history");
    assert!(w.contains("another model"), "{w}");
}

fn load_err(c: &Path) -> String {
    match Engine::load(c, &EngineOptions::default()) {
        Ok(_) => panic!("{} loaded", c.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_containers_are_clear_errors() {
    let tmp = scratch();
    let r = Reference::load("olmoe");

    // Truncated expert file.
    let c = container(tmp.path(), "olmoe", Quant::Bf16);
    let experts = c.join("experts.bin");
    let len = std::fs::metadata(&experts).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&experts)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let e = load_err(&c);
    assert!(e.contains("experts.bin") && e.contains("truncated"), "{e}");

    // A record whose bytes do not match its checksum: corrupt every record.
    let c = container(tmp.path(), "olmoe", Quant::Int4 { group: 32 });
    let m = Manifest::open(&c).unwrap();
    let experts = c.join("experts.bin");
    let mut bytes = std::fs::read(&experts).unwrap();
    for rec in &m.records {
        bytes[rec.offset as usize + 100] ^= 0x5a;
    }
    std::fs::write(&experts, bytes).unwrap();
    let (engine, _) = Engine::load(&c, &opts(tmp.path(), Some(0))).unwrap();
    let mut s = engine.session();
    let e = engine
        .generate(&mut s, &r.prompt_ids, &greedy(4), |_| true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("experts.bin") && e.contains("checksum"), "{e}");

    // A manifest that belongs to another model.
    let a = container(tmp.path(), "mixtral", Quant::Bf16);
    let b = container(tmp.path(), "qwen2moe", Quant::Bf16);
    std::fs::copy(a.join("manifest.json"), b.join("manifest.json")).unwrap();
    let e = load_err(&b);
    assert!(e.contains("manifest.json") && e.contains("another model"), "{e}");

    // A container from a newer format version.
    let c = container(tmp.path(), "qwen3moe", Quant::Int8 { group: 0 });
    let path = c.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["format_version"] = 99.into();
    std::fs::write(&path, v.to_string()).unwrap();
    let e = load_err(&c);
    assert!(e.contains("manifest.json") && e.contains("version 99"), "{e}");

    // Not JSON at all.
    std::fs::write(&path, "{ half a manifest").unwrap();
    let e = load_err(&c);
    assert!(e.contains("manifest.json") && e.contains("not valid JSON"), "{e}");

    // The expert file is missing.
    let c = container(tmp.path(), "mixtral", Quant::Int8 { group: 32 });
    std::fs::remove_file(c.join("experts.bin")).unwrap();
    let e = load_err(&c);
    assert!(e.contains("experts.bin"), "{e}");
}

/// A manifest whose record lies past the end of `experts.bin`, or whose
/// `offset + padded_len` overflows, is refused at load with an error naming
/// the record: no panic, no read, no huge allocation.
#[test]
fn corrupt_record_offsets_are_clear_errors_naming_the_record() {
    let tmp = scratch();
    let c = container(tmp.path(), "olmoe", Quant::Bf16);
    let path = c.join("manifest.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let m = Manifest::open(&c).unwrap();
    let (layer, expert) = (m.records[1].layer, m.records[1].expert);
    for (offset, why) in [
        (u64::MAX - 4095, "overflows"),
        (m.experts_len, "beyond the end of experts.bin"),
        (1 << 50, "beyond the end of experts.bin"),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
        v["records"][1]["offset"] = offset.into();
        std::fs::write(&path, v.to_string()).unwrap();
        let e = load_err(&c);
        assert!(
            e.contains("manifest.json") && e.contains(&format!("layer {layer} expert {expert}")) && e.contains(why),
            "{e}"
        );
    }
    std::fs::write(&path, original).unwrap();
    assert!(Engine::load(&c, &opts(tmp.path(), Some(0))).is_ok());
}

#[test]
fn conversion_publishes_atomically_and_restarts_cleanly() {
    let tmp = scratch();
    let out = tmp.path().join("olmoe-c");
    // A leftover from an interrupted run is removed and the conversion restarts.
    let partial = charm_coordinator::convert::partial_dir(&out);
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("experts.bin"), b"half written").unwrap();
    convert(&fixture("olmoe"), &out, Quant::Bf16, false).unwrap();
    assert!(!partial.exists());
    assert!(Manifest::open(&out).is_ok());
    // An existing output is never overwritten.
    let e = convert(&fixture("olmoe"), &out, Quant::Bf16, false).unwrap_err();
    assert!(format!("{e:#}").contains("already exists"), "{e:#}");

    // A corrupt source fails without leaving anything that looks finished.
    let bad_src = tmp.path().join("bad-src");
    std::fs::create_dir_all(&bad_src).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(fixture("olmoe").join(f), bad_src.join(f)).unwrap();
    }
    let bytes = std::fs::read(fixture("olmoe").join("model.safetensors")).unwrap();
    std::fs::write(bad_src.join("model.safetensors"), &bytes[..bytes.len() / 3]).unwrap();
    let out2 = tmp.path().join("bad-out");
    let e = convert(&bad_src, &out2, Quant::Int8 { group: 0 }, false).unwrap_err();
    assert!(format!("{e:#}").contains("model.safetensors"), "{e:#}");
    assert!(!out2.exists() && !charm_coordinator::convert::partial_dir(&out2).exists());

    // A different weight gives a different fingerprint.
    let a = Manifest::open(&out).unwrap().fingerprint;
    let b = Manifest::open(&container(tmp.path(), "olmoe", Quant::Int8 { group: 0 }))
        .unwrap()
        .fingerprint;
    assert_ne!(a, b);
}

/// int8 and int4 containers measured against the bf16 one on every
/// family fixture: top-1 agreement and mean KL(bf16 ‖ quantized) over the
/// teacher-forced positions of the reference sequence. The numbers are
/// printed for docs/quantization.md; the bounds only catch a broken format.
#[test]
fn quantized_containers_stay_close_to_bf16() {
    let tmp = scratch();
    println!("| fixture | quant | top-1 agreement | mean KL |");
    for name in ["olmoe", "qwen3moe", "mixtral", "qwen2moe"] {
        let r = Reference::load(name);
        let seq = r.full_sequence();
        let vocab = ModelConfig::load(&fixture(name)).unwrap().vocab_size;
        let logits = |q: Quant| {
            let c = container(tmp.path(), name, q);
            let (e, _) = Engine::load(&c, &opts(tmp.path(), Some(u64::MAX))).unwrap();
            e.logits_all(&seq).unwrap()
        };
        let base = logits(Quant::Bf16);
        for (q, min_top1, max_kl) in [
            (Quant::Int8 { group: 0 }, 0.9, 0.05),
            (Quant::Int4 { group: 32 }, 0.5, 1.0),
        ] {
            let got = logits(q);
            let (mut agree, mut kl) = (0usize, 0f64);
            for (p, g) in base.chunks(vocab).zip(got.chunks(vocab)) {
                agree += (charm_tests::argmax(p) == charm_tests::argmax(g)) as usize;
                kl += kl_div(p, g);
            }
            let n = seq.len();
            let (top1, mean_kl) = (agree as f64 / n as f64, kl / n as f64);
            println!("| {name} | {} | {:.3} | {:.5} |", q.name(), top1, mean_kl);
            assert!(
                top1 >= min_top1 && mean_kl <= max_kl,
                "{name} {q:?}: top-1 {top1}, KL {mean_kl}"
            );
        }
    }
}

fn kl_div(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lsm = |x: &[f32]| {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        x.iter().map(|&v| v as f64 - z).collect::<Vec<f64>>()
    };
    let (lp, lq) = (lsm(p_logits), lsm(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}
