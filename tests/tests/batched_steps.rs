//! Several sequences in one step ([`Engine::forward_batch`]): each
//! sequence's logits are the bits it gets alone, whichever others share
//! its steps and whatever they are doing (a prefill chunk, a decode
//! token), for every cache kind (attention KV, gated DeltaNet state, MLA
//! latents with sparse attention and GLM-5's shared selections), on
//! `--local` and on two workers. Real `worker` processes on 127.0.0.1.
//! [`Engine::generate_batch`] gives every prompt the ids it gets alone.

mod cluster_support;

use std::time::Duration;

use charm_coordinator::{Engine, FinishReason, GenerateParams, PhaseTimes, SamplingParams};
use charm_models::KvCache;
use charm_tests::{fixture, Reference};
use cluster_support::*;

/// One family of each cache kind, and a gated shared expert.
const FIXTURES: [&str; 5] = ["olmoe", "qwen2moe", "qwen3next", "deepseekv32", "glmmoedsa"];

/// A sequence's work, one entry per step it takes part in: its prompt in
/// chunks, then decoded tokens one at a time.
fn chunks(r: &Reference, skip: usize, cuts: &[usize], decode: usize) -> Vec<Vec<u32>> {
    let prompt = &r.full_sequence()[skip..];
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts {
        out.push(prompt[at..c].to_vec());
        at = c;
    }
    // Teacher-forced continuation: the decode tokens are the next ids of
    // the reference sequence (the same for the solo and the batched run).
    out.extend(prompt[at..at + decode].iter().map(|&t| vec![t]));
    out
}

/// Each step's last-row logits of `work`, run alone.
fn alone(e: &Engine, work: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let mut cache = e.model.new_cache();
    work.iter()
        .map(|c| bits(&e.forward(c, &mut cache, false).unwrap()))
        .collect()
}

/// The same work of every sequence, stepped together: sequence `i` joins
/// at step `joins[i]` and leaves when its work is done.
fn together(e: &Engine, works: &[Vec<Vec<u32>>], joins: &[usize]) -> Vec<Vec<Vec<u32>>> {
    let mut caches: Vec<KvCache> = works.iter().map(|_| e.model.new_cache()).collect();
    let mut out: Vec<Vec<Vec<u32>>> = works.iter().map(|_| Vec::new()).collect();
    let steps = works.iter().zip(joins).map(|(w, j)| w.len() + j).max().unwrap();
    let mut mixed = false;
    for step in 0..steps {
        let active: Vec<usize> = (0..works.len())
            .filter(|&i| step >= joins[i] && step - joins[i] < works[i].len())
            .collect();
        let widths: Vec<usize> = active.iter().map(|&i| works[i][step - joins[i]].len()).collect();
        mixed |= active.len() == works.len() && widths.contains(&1) && widths.iter().any(|&w| w > 1);
        let mut seqs: Vec<(&[u32], &mut KvCache)> = caches
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| active.contains(i))
            .map(|(i, c)| (works[i][step - joins[i]].as_slice(), c))
            .collect();
        let logits = e.forward_batch(&mut seqs, &mut PhaseTimes::default()).unwrap();
        assert_eq!(logits.len(), active.len());
        for (&i, l) in active.iter().zip(logits) {
            out[i].push(bits(&l));
        }
    }
    assert!(
        mixed,
        "some step holds every sequence, decode tokens beside a prefill chunk"
    );
    out
}

fn check(name: &str, e: &Engine, r: &Reference, label: &str) {
    // Three sequences: different prompts (suffixes of the reference
    // sequence), different chunkings, joining at different steps, so prefill
    // chunks and decode tokens share steps.
    let n = r.full_sequence().len();
    let works = [
        chunks(r, 0, &[n / 4, n / 2], n / 4),
        chunks(r, 2, &[n / 3], n / 3),
        chunks(r, n / 4, &[2, 3, n / 3], n / 4),
    ];
    let joins = [0, 1, 3];
    let want: Vec<_> = works.iter().map(|w| alone(e, w)).collect();
    let got = together(e, &works, &joins);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len(), "{name} {label}: sequence {i} steps");
        for (s, (gs, ws)) in g.iter().zip(w).enumerate() {
            assert!(
                gs == ws,
                "{name} {label}: sequence {i} step {s}: logits differ from its solo run"
            );
        }
    }
}

#[test]
fn a_sequence_gets_its_own_bits_whatever_shares_its_steps() {
    for name in FIXTURES {
        let r = Reference::load(name);
        check(name, &Engine::local(&fixture(name)).unwrap(), &r, "local");
    }
}

#[test]
fn batched_steps_on_two_workers_give_each_sequence_its_solo_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let key = keygen(tmp.path(), "cluster.key");
    for name in ["qwen3next", "glmmoedsa"] {
        let dir = fixture(name);
        let r = Reference::load(name);
        let workers: Vec<Worker> = (0..2).map(|_| Worker::start(&dir, &key, &[])).collect();
        let addrs: Vec<_> = workers.iter().map(|w| w.addr).collect();
        let svc = service(&dir, &key, &addrs, Duration::from_secs(10), false);
        svc.wait_for_workers(2, Duration::from_secs(10)).unwrap();
        let e = engine(&dir, svc);
        check(name, &e, &r, "2 workers");
        // And the cluster's bits are the local ones.
        let local = Engine::local(&dir).unwrap();
        let n = r.full_sequence().len();
        let work = chunks(&r, 0, &[n / 4, n / 2], n / 4);
        assert!(alone(&e, &work) == alone(&local, &work), "{name}: 2 workers vs local");
    }
}

#[test]
fn a_step_refuses_an_empty_sequence() {
    let e = Engine::local(&fixture("olmoe")).unwrap();
    let (mut a, mut b) = (e.model.new_cache(), e.model.new_cache());
    let err = e
        .forward_batch(
            &mut [(&[1, 2][..], &mut a), (&[][..], &mut b)],
            &mut PhaseTimes::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("no tokens"), "{err}");
}

/// `generate_batch` over prompts of different lengths, prefilled in chunks
/// of 5 beside the others' decoding, gives each prompt the ids `generate`
/// gives it alone, greedy and sampled.
#[test]
fn generate_batch_gives_each_prompt_its_solo_ids() {
    for name in ["olmoe", "qwen3next", "deepseekv32"] {
        let r = Reference::load(name);
        let mut e = Engine::local(&fixture(name)).unwrap();
        e.prefill_chunk = 5;
        let p = &r.prompt_ids;
        let prompts = vec![p.clone(), p[3..].to_vec(), p[..4].to_vec(), p[1..p.len() / 2].to_vec()];
        for sampling in [
            SamplingParams::default(),
            SamplingParams {
                temperature: 0.8,
                seed: 7,
                ..SamplingParams::default()
            },
        ] {
            let params = GenerateParams {
                max_tokens: 9,
                sampling,
                ignore_eos: true,
            };
            let batch = e.generate_batch(&prompts, &params).unwrap();
            assert_eq!(batch.sequences.len(), prompts.len());
            assert_eq!(batch.generated_tokens, 9 * prompts.len());
            assert_eq!(batch.prompt_tokens, prompts.iter().map(Vec::len).sum::<usize>());
            for (prompt, (ids, finish)) in prompts.iter().zip(&batch.sequences) {
                let solo = e.generate(&mut e.session(), prompt, &params, |_| true).unwrap();
                assert_eq!(ids, &solo.ids, "{name}: batched ids of a {}-token prompt", prompt.len());
                assert_eq!(*finish, FinishReason::Length);
            }
            // The longest prompt's prefill steps and the decode steps: the
            // shorter prompts decoded while it was still prefilling.
            assert_eq!(batch.steps, p.len().div_ceil(5) + 8, "{name}: steps");
        }
    }
}

#[test]
fn generate_batch_refuses_an_empty_prompt() {
    let e = Engine::local(&fixture("olmoe")).unwrap();
    let params = GenerateParams {
        max_tokens: 2,
        sampling: SamplingParams::default(),
        ignore_eos: true,
    };
    for prompts in [vec![], vec![vec![1, 2], vec![]]] {
        let err = e.generate_batch(&prompts, &params).unwrap_err();
        assert!(err.to_string().contains("needs a token"), "{err}");
    }
}
