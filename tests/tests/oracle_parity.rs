//! Oracle parity: every family fixture against the transformers reference
//! in its `reference.json`.
//!
//! For each fixture (one `#[test]` per family, so a failure names it):
//! - greedy generation (temperature 0, eos ignored) through a fresh
//!   [`Session`] reproduces `greedy_ids` exactly, and a second turn that
//!   reuses the session's KV cache continues them exactly;
//! - the teacher-forced forward ([`Engine::logits_all`]) has the reference
//!   argmax at every position and last-position logits within
//!   `1e-4 * max(1, max |ref|)` of the reference;
//! - prefilling in small chunks gives the same argmax and logits as one
//!   chunk;
//! - decoding token by token through the KV cache gives, at every step,
//!   the logits of the teacher-forced forward at that position;
//! - for families with recurrent (gated DeltaNet) layers, a second turn
//!   that cuts back into the cache starts over (the state cannot rewind),
//!   and one that extends it reuses all of it;
//! - one-shot, chunked and token-by-token prefill give the same logit bits
//!   in every family (the recurrence, latent attention's absorbed form and
//!   attention's blocks of prefill rows each run in one order whatever
//!   the chunking).

use charm_coordinator::{Engine, FinishReason, GenerateParams, SamplingParams, Session};
use charm_models::MixerKind;
use charm_tests::{argmax, fixture, max_abs_diff, tolerance, Reference};

/// Greedy, eos ignored, `max_tokens` new tokens.
fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        ignore_eos: true,
    }
}

/// Row `i` of a `rows × vocab` logits matrix.
fn row(logits: &[f32], vocab: usize, i: usize) -> &[f32] {
    &logits[i * vocab..(i + 1) * vocab]
}

/// Compares `ours` (full vocabulary) with the reference's last-position
/// entries; returns `(maxdiff, tol)`.
fn diff_against_reference(name: &str, what: &str, ours: &[f32], r: &Reference) -> (f32, f32) {
    let entries = r.last_logit_entries();
    if r.last_logits.is_some() {
        assert_eq!(
            entries.len(),
            ours.len(),
            "{name}: reference has {} last logits, the model's vocabulary is {}",
            entries.len(),
            ours.len()
        );
    }
    let reference: Vec<f32> = entries.iter().map(|&(_, v)| v).collect();
    let mine: Vec<f32> = entries.iter().map(|&(id, _)| ours[id as usize]).collect();
    let d = max_abs_diff(&mine, &reference);
    let tol = tolerance(&reference);
    if d > tol {
        let (worst, _) = entries
            .iter()
            .zip(&mine)
            .map(|(&(id, rv), &m)| (id, (m - rv).abs()))
            .fold((0, 0.0f32), |b, x| if x.1 > b.1 { x } else { b });
        panic!(
            "{name}: {what}: last-position logits differ from the reference: \
             maxdiff={d:.3e} > tol={tol:.3e} (worst at token {worst}: ours {} vs ref {})",
            ours[worst as usize],
            entries.iter().find(|e| e.0 == worst).unwrap().1
        );
    }
    (d, tol)
}

/// Asserts every row's argmax equals `expected`.
fn assert_argmax(name: &str, what: &str, logits: &[f32], vocab: usize, expected: &[u32]) {
    assert_eq!(
        logits.len(),
        expected.len() * vocab,
        "{name}: {what}: expected {} rows of {vocab} logits, got {} floats",
        expected.len(),
        logits.len()
    );
    let got: Vec<u32> = (0..expected.len()).map(|i| argmax(row(logits, vocab, i))).collect();
    if got != expected {
        let first = got.iter().zip(expected).position(|(a, b)| a != b).unwrap();
        panic!(
            "{name}: {what}: argmax differs from the reference first at position {first}\n  ours: {got:?}\n  ref:  {expected:?}"
        );
    }
}

fn check_family(name: &str) {
    let dir = fixture(name);
    let r = Reference::load(name);
    let mut engine =
        Engine::local(&dir).unwrap_or_else(|e| panic!("{name}: Engine::local({}) failed: {e}", dir.display()));
    let vocab = engine.config().vocab_size;
    let all = r.full_sequence();
    let n_prompt = r.prompt_ids.len();
    assert_eq!(r.greedy_ids.len(), 16, "{name}: reference greedy run length");
    assert_eq!(
        r.teacher_forced_argmax.len(),
        all.len(),
        "{name}: teacher_forced_argmax length"
    );

    // 1. Greedy generation through a fresh session.
    let mut session: Session = engine.session();
    let mut streamed = Vec::new();
    let gen = engine
        .generate(&mut session, &r.prompt_ids, &greedy(16), |id| {
            streamed.push(id);
            true
        })
        .unwrap_or_else(|e| panic!("{name}: generate failed: {e}"));
    assert_eq!(
        gen.ids, r.greedy_ids,
        "{name}: greedy generation differs from the reference"
    );
    assert_eq!(streamed, gen.ids, "{name}: on_token saw other ids");
    assert_eq!(gen.finish_reason, FinishReason::Length, "{name}");
    assert_eq!(gen.stats.prompt_tokens, n_prompt, "{name}");
    assert_eq!(gen.stats.generated_tokens, 16, "{name}");
    assert_eq!(gen.stats.cached_prompt_tokens, 0, "{name}: fresh session");
    // The session holds the prompt and every generated id but the last
    // (which was never fed back).
    assert_eq!(session.tokens(), &all[..all.len() - 1], "{name}: session tokens");

    // 1b. A second turn in the same session reuses the cached prefix and
    // continues the reference exactly.
    let recurrent = engine.config().mixers.contains(&MixerKind::GatedDeltaNet);
    // A sliding layer keeps only what its window can still see: a cut 8
    // tokens back, past a window of 4, starts over too.
    let window = engine.config().sliding_window.iter().flatten().min().copied();
    let cut_past_window = window.is_some_and(|w| all.len() - 1 - (n_prompt + 7) > w);
    let turn2 = &all[..n_prompt + 8];
    let gen2 = engine
        .generate(&mut session, turn2, &greedy(8), |_| true)
        .unwrap_or_else(|e| panic!("{name}: second generate failed: {e}"));
    assert_eq!(
        gen2.ids,
        &r.greedy_ids[8..],
        "{name}: continuing from the session's KV cache differs from the reference"
    );
    let reused = if recurrent || cut_past_window {
        0
    } else {
        turn2.len() - 1
    };
    assert_eq!(
        gen2.stats.cached_prompt_tokens, reused,
        "{name}: the second turn should reuse all but the last prompt token \
         (none when a recurrent layer's state would have to rewind, or a window dropped what it needs)"
    );
    if recurrent || cut_past_window {
        // 1c. A turn that extends everything cached reuses all of it.
        let cached = session.tokens().to_vec();
        let mut turn3 = cached.clone();
        turn3.push(r.greedy_ids[15]);
        let gen3 = engine
            .generate(&mut session, &turn3, &greedy(1), |_| true)
            .unwrap_or_else(|e| panic!("{name}: third generate failed: {e}"));
        assert_eq!(gen3.stats.cached_prompt_tokens, cached.len(), "{name}: extension reuse");
    }

    // 2. Teacher forcing in one prefill chunk.
    assert!(all.len() <= engine.prefill_chunk, "{name}: one chunk");
    let one_shot = engine
        .logits_all(&all)
        .unwrap_or_else(|e| panic!("{name}: logits_all failed: {e}"));
    assert_argmax(
        name,
        "teacher-forced forward",
        &one_shot,
        vocab,
        &r.teacher_forced_argmax,
    );
    let last = row(&one_shot, vocab, all.len() - 1);
    let (d, tol) = diff_against_reference(name, "teacher-forced forward", last, &r);
    println!(
        "{name}: OK maxdiff={d:.3e} (tol {tol:.1e}, {} logits compared, stored {})",
        r.last_logit_entries().len(),
        r.stored_dtype
    );

    // 3. Chunked prefill == one-shot prefill.
    engine.prefill_chunk = 5;
    let chunked = engine
        .logits_all(&all)
        .unwrap_or_else(|e| panic!("{name}: chunked logits_all failed: {e}"));
    engine.prefill_chunk = crate_default_chunk();
    assert_argmax(name, "chunked prefill (5)", &chunked, vocab, &r.teacher_forced_argmax);
    let d_chunk = max_abs_diff(&chunked, &one_shot);
    let tol_chunk = tolerance(&one_shot);
    assert!(
        d_chunk <= tol_chunk,
        "{name}: chunked prefill differs from one-shot prefill: maxdiff={d_chunk:.3e} > {tol_chunk:.3e}"
    );
    diff_against_reference(name, "chunked prefill", row(&chunked, vocab, all.len() - 1), &r);
    println!("{name}: chunked prefill vs one-shot maxdiff={d_chunk:.3e}");

    // 4. Decode through the KV cache, one token at a time, as generation
    // does: every step's logits equal the teacher-forced row.
    let mut cache = engine.model.new_cache();
    let mut logits = engine
        .forward(&r.prompt_ids, &mut cache, false)
        .unwrap_or_else(|e| panic!("{name}: prefill forward failed: {e}"));
    let mut d_decode = 0.0f32;
    for (step, &next) in r.greedy_ids.iter().enumerate() {
        let pos = n_prompt - 1 + step;
        assert_eq!(logits.len(), vocab, "{name}: forward returns one row");
        assert_eq!(
            argmax(&logits),
            next,
            "{name}: KV-cache decode step {step} picks another token"
        );
        let tf = row(&one_shot, vocab, pos);
        let d = max_abs_diff(&logits, tf);
        let tol = tolerance(tf);
        assert!(
            d <= tol,
            "{name}: KV-cache decode step {step} (position {pos}) differs from the \
             teacher-forced forward: maxdiff={d:.3e} > {tol:.3e}"
        );
        d_decode = d_decode.max(d);
        logits = engine
            .forward(&[next], &mut cache, false)
            .unwrap_or_else(|e| panic!("{name}: decode forward failed: {e}"));
    }
    // After feeding every greedy id: the last position of prompt + greedy.
    assert_eq!(cache.len(), all.len(), "{name}: cache length");
    let tf_last = row(&one_shot, vocab, all.len() - 1);
    let d = max_abs_diff(&logits, tf_last);
    assert!(
        d <= tolerance(tf_last),
        "{name}: KV-cache decode last position differs from logits_all: maxdiff={d:.3e}"
    );
    let (d_ref, _) = diff_against_reference(name, "KV-cache decode", &logits, &r);
    d_decode = d_decode.max(d);
    println!("{name}: KV-cache decode vs logits_all maxdiff={d_decode:.3e}; vs reference maxdiff={d_ref:.3e}");

    // 5. Every mixer runs in one order whatever the chunking (the
    // recurrence, latent attention's absorbed form, attention's blocks of
    // prefill rows): the same bits from one chunk, chunks of 5 and one
    // token at a time.
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let mut by_token = Vec::new();
    let mut cache = engine.model.new_cache();
    for &t in &all {
        by_token.extend(engine.forward(&[t], &mut cache, true).unwrap());
    }
    assert!(
        bits(&chunked) == bits(&one_shot),
        "{name}: chunked prefill changed logit bits"
    );
    assert!(
        bits(&by_token) == bits(&one_shot),
        "{name}: token-by-token changed logit bits"
    );
}

fn crate_default_chunk() -> usize {
    charm_coordinator::engine::DEFAULT_PREFILL_CHUNK
}

#[test]
fn olmoe() {
    check_family("olmoe");
}

#[test]
fn qwen3moe() {
    check_family("qwen3moe");
}

#[test]
fn mixtral() {
    check_family("mixtral");
}

#[test]
fn qwen2moe() {
    check_family("qwen2moe");
}

#[test]
fn qwen3moe_chat() {
    check_family("qwen3moe-chat");
}

#[test]
fn qwen3next() {
    check_family("qwen3next");
}

#[test]
fn qwen35moe() {
    check_family("qwen35moe");
}

#[test]
fn qwen35moe_vl() {
    check_family("qwen35moe-vl");
}

#[test]
fn deepseekv3() {
    check_family("deepseekv3");
}

#[test]
fn deepseekv3_noq() {
    check_family("deepseekv3-noq");
}

/// DeepSeek-V3 as released in FP8 (`F8_E4M3` with `weight_scale_inv` per
/// 4 × 8 block): transformers' bf16 dequantization, run in f32.
#[test]
fn deepseekv3_fp8() {
    check_family("deepseekv3-fp8");
}

#[test]
fn glm4moe() {
    check_family("glm4moe");
}

#[test]
fn glm4moelite() {
    check_family("glm4moelite");
}

#[test]
fn minimax_m2() {
    check_family("minimax-m2");
}

/// Kimi K2.5's vision-language wrapper around the deepseekv3 weights: its
/// text model runs (`language_model.*`; vision tensors ignored).
#[test]
fn kimik25_vl() {
    check_family("kimik25-vl");
}

/// DeepSeek-V3.2: DeepSeek Sparse Attention, 44 of 56 rows attending to
/// the indexer's 12 picks.
#[test]
fn deepseekv32() {
    check_family("deepseekv32");
}

/// GLM-5: the indexer's RoPE interleaved, layers 1 and 3 reusing the
/// previous indexer's selection.
#[test]
fn glmmoedsa() {
    check_family("glmmoedsa");
}

/// gpt-oss: attention sinks, sliding windows of 4 over a 56-token run,
/// YaRN, the biased top-k-then-softmax router, and fused experts with
/// biases whose clamped GLU (limit 1.0) clamps thousands of pairs.
#[test]
fn gptoss() {
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("gptoss").join("reference.json")).unwrap()).unwrap();
    assert!(r["clamp_counts"]["gate"].as_u64().unwrap() > 0 && r["clamp_counts"]["up"].as_u64().unwrap() > 0);
    check_family("gptoss");
}

/// gpt-oss as released: MXFP4 experts (`*_blocks` / `*_scales`), run as
/// stored (their 4-bit values in integers against 8-bit activations),
/// against transformers' own dequantization of the same checkpoint. The
/// fixture was chosen so that 8-bit expert activations keep the greedy run
/// and every argmax (`make_fixtures.py`'s emulation of them); the last
/// logits may move by up to twice what that emulation moved them.
#[test]
fn gptoss_mxfp4() {
    let name = "gptoss-mxfp4";
    let r = Reference::load(name);
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap()).unwrap();
    let drift = raw["q8_last_logits_drift"].as_f64().unwrap() as f32;
    let engine = Engine::local(&fixture(name)).unwrap();
    let vocab = engine.config().vocab_size;
    let mut session = engine.session();
    let gen = engine
        .generate(&mut session, &r.prompt_ids, &greedy(16), |_| true)
        .unwrap();
    assert_eq!(gen.ids, r.greedy_ids, "{name}: greedy generation");
    let all = r.full_sequence();
    let logits = engine.logits_all(&all).unwrap();
    assert_argmax(name, "teacher-forced forward", &logits, vocab, &r.teacher_forced_argmax);
    let last = row(&logits, vocab, all.len() - 1);
    let reference = r.last_logits.as_ref().unwrap();
    let d = max_abs_diff(last, reference);
    assert!(
        d <= 2.0 * drift,
        "{name}: last logits move by {d} (8-bit activations: {drift})"
    );
    assert!(
        d > 0.0,
        "{name}: the products run on 8-bit activations, not the f32 reference's"
    );
}

/// MiMo-V2-Flash: sliding layers (window 4) with twice the KV heads, their
/// own rope theta and sinks; value heads narrower than query/key heads and
/// scaled; partial rotary; the sigmoid group router without a shared expert.
#[test]
fn mimo() {
    check_family("mimo");
}

/// The fixture scripts/make_gguf_mimo_fixtures.py converts (no routed scaling).
#[test]
fn mimo_gguf() {
    check_family("mimo-gguf");
}
