//! The expert seam: what the engine sends an [`ExpertService`] and what it
//! does with the answer.
//!
//! - A [`CountingService`] around the in-process worker records every
//!   batch: each MoE layer is called once per forward step (dense layers
//!   never), every batch is a batch-union (each expert at most once, each
//!   row exactly `top_k` times), the experts and gate weights match the
//!   router recomputed here from the router weights, and generation still
//!   reproduces the reference.
//! - A service that answers with a wrong-size output, a missing group, a
//!   wrong layer or an error makes [`Engine::generate`] return `Err` (no
//!   panic), and the session stays usable.
//! - Returning the groups in another order gives bit-identical logits
//!   (the coordinator's canonical combine).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use charm_common::TensorFiles;
use charm_coordinator::{Engine, GenerateParams, SamplingParams};
use charm_models::{ExpertError, ExpertService, ExpertStats, Model, ModelConfig, ModelError};
use charm_proto::{ExpertBatch, ExpertOutputs};
use charm_tests::{fixture, Reference};
use charm_worker::{InProcessWorker, ResidentStore};

/// Records every batch it forwards to `inner`.
struct CountingService {
    inner: Arc<dyn ExpertService>,
    calls: Mutex<Vec<ExpertBatch>>,
}

impl CountingService {
    fn new(inner: Arc<dyn ExpertService>) -> Self {
        CountingService {
            inner,
            calls: Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Vec<ExpertBatch> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl ExpertService for CountingService {
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError> {
        self.calls.lock().unwrap().push(batch.clone());
        self.inner.run(batch)
    }

    fn stats(&self) -> ExpertStats {
        self.inner.stats()
    }

    fn end_request(&self) {
        self.inner.end_request();
    }
}

type TamperFn = dyn Fn(usize, &mut ExpertOutputs) -> Result<(), ExpertError> + Send + Sync;

/// Runs `inner`, then lets `tamper` edit (or fail) the answer of call `i`.
struct TamperService {
    inner: Arc<dyn ExpertService>,
    calls: AtomicUsize,
    tamper: Box<TamperFn>,
}

impl ExpertService for TamperService {
    fn run(&self, batch: &ExpertBatch) -> Result<ExpertOutputs, ExpertError> {
        let i = self.calls.fetch_add(1, Ordering::SeqCst);
        let mut out = self.inner.run(batch)?;
        (self.tamper)(i, &mut out)?;
        Ok(out)
    }

    fn stats(&self) -> ExpertStats {
        self.inner.stats()
    }
}

/// The fixture's config, its tensor files and an in-process worker over them.
fn worker(dir: &Path) -> (ModelConfig, TensorFiles, Arc<dyn ExpertService>) {
    let cfg = ModelConfig::load(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let files = TensorFiles::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let store = ResidentStore::open(&files, &cfg).expect("ResidentStore::open");
    let inner: Arc<dyn ExpertService> = Arc::new(InProcessWorker::new(store));
    (cfg, files, inner)
}

/// An engine over fixture `name` whose experts are run by `wrap(worker)`.
fn engine_with(name: &str, wrap: impl FnOnce(Arc<dyn ExpertService>) -> Arc<dyn ExpertService>) -> Engine {
    let (cfg, files, inner) = worker(&fixture(name));
    let model = Model::from_files(cfg, &files).expect("Model::from_files");
    Engine::new(model, wrap(inner))
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
    }
}

/// The experts (ascending) and gate weights `row` gets from the router of
/// `layer`, recomputed in f64 from the router weights:
/// softmax over experts, top-k, renormalized when `norm_topk_prob`.
fn route(cfg: &ModelConfig, files: &TensorFiles, layer: usize, row: &[f32]) -> Vec<(u32, f64)> {
    let (e, h) = (cfg.num_experts, cfg.hidden_size);
    let w = files
        .matrix(&cfg.family.moe_names().router(layer), e, h)
        .expect("router weight");
    let mut wr = vec![0.0f32; h];
    let logits: Vec<f64> = (0..e)
        .map(|i| {
            w.row_into(i, &mut wr);
            wr.iter().zip(row).map(|(&a, &b)| a as f64 * b as f64).sum()
        })
        .collect();
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    let mut idx: Vec<usize> = (0..e).collect();
    idx.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
    idx.truncate(cfg.top_k);
    let mut chosen: Vec<(u32, f64)> = idx.iter().map(|&i| (i as u32, exps[i] / total)).collect();
    if cfg.norm_topk_prob {
        let s: f64 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= s);
    }
    chosen.sort_by_key(|c| c.0);
    chosen
}

/// Checks one batch: shape, batch-union, and routing against [`route`].
fn check_batch(name: &str, cfg: &ModelConfig, files: &TensorFiles, b: &ExpertBatch) {
    let layer = b.layer as usize;
    assert_eq!(b.validate(), Ok(()), "{name}: layer {layer}: invalid batch");
    assert_eq!(b.hidden as usize, cfg.hidden_size, "{name}: batch width");
    let n = b.n_rows();
    assert!(n > 0, "{name}: layer {layer}: empty batch");

    // Batch-union: each expert at most once, ascending.
    let experts: Vec<u32> = b.groups.iter().map(|g| g.expert).collect();
    assert!(
        experts.windows(2).all(|w| w[0] < w[1]),
        "{name}: layer {layer}: experts {experts:?} not unique and ascending"
    );
    assert!(
        experts.iter().all(|&e| (e as usize) < cfg.num_experts),
        "{name}: layer {layer}: expert out of range in {experts:?}"
    );
    let pairs: usize = b.groups.iter().map(|g| g.rows.len()).sum();
    assert_eq!(
        pairs,
        n * cfg.top_k,
        "{name}: layer {layer}: {pairs} (row, expert) pairs for {n} rows × top_k {}",
        cfg.top_k
    );

    // Every row: exactly top_k experts, the ones the router picks, with its weights.
    let mut per_row: Vec<Vec<(u32, f32)>> = vec![Vec::new(); n];
    for g in &b.groups {
        assert!(
            g.rows.windows(2).all(|w| w[0] < w[1]),
            "{name}: layer {layer} expert {}: rows not ascending",
            g.expert
        );
        for (&r, &w) in g.rows.iter().zip(&g.weights) {
            per_row[r as usize].push((g.expert, w));
        }
    }
    for (r, got) in per_row.iter().enumerate() {
        let want = route(cfg, files, layer, b.row(r));
        let got_ids: Vec<u32> = got.iter().map(|x| x.0).collect();
        let want_ids: Vec<u32> = want.iter().map(|x| x.0).collect();
        assert_eq!(
            got_ids, want_ids,
            "{name}: layer {layer} row {r}: experts differ from the recomputed router"
        );
        for (&(e, w), &(_, ww)) in got.iter().zip(&want) {
            assert!(
                (w as f64 - ww).abs() <= 1e-5,
                "{name}: layer {layer} row {r} expert {e}: gate weight {w} vs recomputed {ww}"
            );
        }
        let sum: f64 = got.iter().map(|x| x.1 as f64).sum();
        if cfg.norm_topk_prob {
            assert!((sum - 1.0).abs() < 1e-5, "{name}: renormalized weights sum to {sum}");
        } else {
            assert!(sum > 0.0 && sum < 1.0, "{name}: weights sum to {sum}");
        }
    }
}

/// Distinct experts used per MoE layer (in `moe_layers` order).
fn distinct_per_layer(calls: &[ExpertBatch], moe_layers: &[usize]) -> Vec<usize> {
    moe_layers
        .iter()
        .map(|&l| {
            calls
                .iter()
                .filter(|b| b.layer as usize == l)
                .flat_map(|b| b.groups.iter().map(|g| g.expert))
                .collect::<BTreeSet<u32>>()
                .len()
        })
        .collect()
}

fn check_calls(name: &str) {
    let dir = fixture(name);
    let r = Reference::load(name);
    let (cfg, files, inner) = worker(&dir);
    let counting = Arc::new(CountingService::new(inner));
    let engine = Engine::new(
        Model::from_files(cfg.clone(), &files).expect("Model::from_files"),
        counting.clone(),
    );
    let moe_layers: Vec<usize> = (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)).collect();
    let dense_layers: Vec<usize> = (0..cfg.num_layers).filter(|&l| !cfg.is_moe_layer(l)).collect();
    if name == "qwen3moe" {
        assert_eq!(dense_layers, vec![1], "qwen3moe: layer 1 is the dense (mlp_only) layer");
    }

    // (a) Outputs unchanged by the wrapper.
    let mut session = engine.session();
    let gen = engine
        .generate(&mut session, &r.prompt_ids, &greedy(16), |_| true)
        .unwrap_or_else(|e| panic!("{name}: generate: {e}"));
    assert_eq!(gen.ids, r.greedy_ids, "{name}: greedy ids through the counting service");
    let calls = counting.take();

    // (b) Every MoE layer once per forward step, in layer order; dense layers never.
    // Steps: the prompt in one prefill chunk, then one per fed-back token.
    let step_rows: Vec<usize> = std::iter::once(r.prompt_ids.len())
        .chain(std::iter::repeat_n(1, r.greedy_ids.len() - 1))
        .collect();
    assert_eq!(
        calls.len(),
        step_rows.len() * moe_layers.len(),
        "{name}: {} expert calls for {} steps × {} MoE layers",
        calls.len(),
        step_rows.len(),
        moe_layers.len()
    );
    for (i, b) in calls.iter().enumerate() {
        let (step, k) = (i / moe_layers.len(), i % moe_layers.len());
        assert_eq!(
            b.layer as usize, moe_layers[k],
            "{name}: call {i} (step {step}) is for layer {}, expected {}",
            b.layer, moe_layers[k]
        );
        assert!(!dense_layers.contains(&(b.layer as usize)));
        assert_eq!(b.n_rows(), step_rows[step], "{name}: rows of call {i} (step {step})");
        // (c) + (d)
        check_batch(name, &cfg, &files, b);
    }
    let distinct = distinct_per_layer(&calls, &moe_layers);
    for (&l, &d) in moe_layers.iter().zip(&distinct) {
        assert!(
            2 * d > cfg.num_experts,
            "{name}: layer {l}: only {d} of {} experts used over the run",
            cfg.num_experts
        );
    }
    println!("{name}: generation used {distinct:?} distinct experts per MoE layer");

    // The teacher-forced forward routes like transformers did: same number of
    // distinct experts per MoE layer as the reference recorded.
    let all = r.full_sequence();
    engine.logits_all(&all).expect("logits_all");
    let calls = counting.take();
    assert_eq!(calls.len(), moe_layers.len(), "{name}: one call per MoE layer");
    for b in &calls {
        check_batch(name, &cfg, &files, b);
    }
    if let Some(want) = &r.distinct_experts_per_layer {
        assert_eq!(
            &distinct_per_layer(&calls, &moe_layers),
            want,
            "{name}: distinct experts per MoE layer over prompt + greedy"
        );
    }
}

#[test]
fn olmoe_expert_calls() {
    check_calls("olmoe");
}

#[test]
fn qwen3moe_expert_calls() {
    check_calls("qwen3moe");
}

/// Runs a greedy generation with `tamper` applied to every answer; returns
/// the result's error, panicking if generation succeeded.
fn generate_tampered(
    what: &str,
    tamper: impl Fn(usize, &mut ExpertOutputs) -> Result<(), ExpertError> + Send + Sync + 'static,
) -> ModelError {
    let r = Reference::load("olmoe");
    let engine = engine_with("olmoe", |inner| {
        Arc::new(TamperService {
            inner,
            calls: AtomicUsize::new(0),
            tamper: Box::new(tamper),
        })
    });
    let mut session = engine.session();
    match engine.generate(&mut session, &r.prompt_ids, &greedy(16), |_| true) {
        Ok(g) => panic!("{what}: generate succeeded ({:?}) but should have failed", g.ids),
        Err(e) => {
            println!("{what}: {e}");
            e
        }
    }
}

#[test]
fn wrong_size_output_is_an_error() {
    let e = generate_tampered("short output", |_, out| {
        out.groups[0].out.pop();
        Ok(())
    });
    assert!(matches!(e, ModelError::Expert(ExpertError::Batch(_))), "{e:?}");
    assert!(e.to_string().contains("floats"), "{e}");

    let e = generate_tampered("long output", |i, out| {
        if i == 3 {
            let last = out.groups.len() - 1;
            out.groups[last].out.push(0.0);
        }
        Ok(())
    });
    assert!(matches!(e, ModelError::Expert(ExpertError::Batch(_))), "{e:?}");
}

#[test]
fn missing_group_is_an_error() {
    let e = generate_tampered("missing group", |_, out| {
        out.groups.pop();
        Ok(())
    });
    assert!(matches!(e, ModelError::Expert(ExpertError::Batch(_))), "{e:?}");

    // As many groups as asked for, but one expert twice and one never.
    let e = generate_tampered("duplicated group", |_, out| {
        if out.groups.len() >= 2 {
            out.groups[1] = out.groups[0].clone();
        } else {
            out.groups[0].expert += 1;
        }
        Ok(())
    });
    assert!(e.to_string().contains("no output for expert"), "{e}");

    let e = generate_tampered("wrong layer", |_, out| {
        out.layer += 1;
        Ok(())
    });
    assert!(matches!(e, ModelError::Expert(ExpertError::Batch(_))), "{e:?}");

    let e = generate_tampered("service error", |i, out| {
        if i == 5 {
            return Err(ExpertError::MissingExpert {
                layer: out.layer,
                expert: 7,
            });
        }
        Ok(())
    });
    assert!(
        matches!(e, ModelError::Expert(ExpertError::MissingExpert { expert: 7, .. })),
        "{e:?}"
    );
}

#[test]
fn session_recovers_after_a_failed_step() {
    // The service fails once, mid-decode; the same session then generates
    // the reference exactly (no half-written KV cache left behind).
    let r = Reference::load("olmoe");
    let engine = engine_with("olmoe", |inner| {
        Arc::new(TamperService {
            inner,
            calls: AtomicUsize::new(0),
            tamper: Box::new(|i, out| {
                if i == 7 {
                    Err(ExpertError::MissingExpert {
                        layer: out.layer,
                        expert: 0,
                    })
                } else {
                    Ok(())
                }
            }),
        })
    });
    let mut session = engine.session();
    let e = engine
        .generate(&mut session, &r.prompt_ids, &greedy(16), |_| true)
        .expect_err("the seventh expert call fails");
    assert!(matches!(e, ModelError::Expert(_)), "{e:?}");
    let gen = engine
        .generate(&mut session, &r.prompt_ids, &greedy(16), |_| true)
        .expect("the retry succeeds");
    assert_eq!(gen.ids, r.greedy_ids, "retry in the same session");
}

#[test]
fn group_order_does_not_change_a_bit() {
    for name in ["olmoe", "qwen3moe", "mixtral", "qwen2moe"] {
        let r = Reference::load(name);
        let all = r.full_sequence();
        let plain = engine_with(name, |inner| inner);
        let base = plain.logits_all(&all).expect("logits_all");
        let permuted_calls = Arc::new(AtomicUsize::new(0));
        for (how, rotate) in [("reversed", false), ("rotated", true)] {
            let seen = permuted_calls.clone();
            let engine = engine_with(name, move |inner| {
                Arc::new(TamperService {
                    inner,
                    calls: AtomicUsize::new(0),
                    tamper: Box::new(move |_, out| {
                        if out.groups.len() >= 2 {
                            seen.fetch_add(1, Ordering::SeqCst);
                        }
                        if rotate {
                            out.groups.rotate_left(1);
                        } else {
                            out.groups.reverse();
                        }
                        Ok(())
                    }),
                })
            });
            let got = engine.logits_all(&all).expect("logits_all, permuted");
            assert_eq!(got.len(), base.len());
            let differing = got
                .iter()
                .zip(&base)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differing, 0, "{name}: {how} groups changed {differing} logits' bits");
            let mut session = engine.session();
            let gen = engine
                .generate(&mut session, &r.prompt_ids, &greedy(16), |_| true)
                .expect("generate, permuted");
            assert_eq!(gen.ids, r.greedy_ids, "{name}: {how} groups");
        }
        assert!(
            permuted_calls.load(Ordering::SeqCst) > 0,
            "{name}: no batch had two groups to permute"
        );
    }
}
