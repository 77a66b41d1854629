//! Read-ahead that knows when it loses, on a real container store.
//!
//! - `read_ahead_that_only_evicts_stands_down`: every prediction names
//!   experts no step wants, into a cache with room for two experts: each
//!   read-ahead is wasted and evicts an expert the next step reads again,
//!   so the store stops reading ahead (the stand-down is counted in its
//!   stats) and issues nothing more for a while; the steps' experts are
//!   the same either way.
//! - `read_ahead_that_pays_stays_on`: predictions that name the next
//!   step's experts, with room for them, keep read-ahead on.

mod cluster_support;

use charm_common::container::Manifest;
use charm_proto::PrefetchHint;
use charm_tests::fixture;
use charm_worker::io::ReaderOptions;
use charm_worker::prefetch_policy::RETRY_STEPS;
use charm_worker::store::ExpertStore;
use charm_worker::{DiskStore, StoreOptions};
use cluster_support::*;

fn store(dir: &std::path::Path, experts_room: u64) -> DiskStore {
    let manifest = Manifest::open(dir).unwrap();
    let per = manifest.records.iter().map(|r| r.padded_len()).max().unwrap();
    let opts = StoreOptions {
        cache_bytes: per * experts_room,
        prefetch: true,
        reader: ReaderOptions::default(),
        history_path: None,
    };
    DiskStore::open(dir, &manifest, &opts).unwrap()
}

/// One layer step wanting `experts` of `layer`, predicting `next`;
/// returns the wanted experts' gate bits (what the step computes from).
fn step(s: &DiskStore, layer: u16, experts: &[u32], next: &PrefetchHint) -> Vec<Vec<u32>> {
    let wanted: Vec<(u32, u64)> = experts.iter().map(|&e| (e, 1)).collect();
    let mut got: Vec<(usize, Vec<u32>)> = Vec::new();
    s.resolve(layer, &wanted, Some(next), &mut |ready| {
        for (i, ffn) in ready {
            got.push((i, ffn.gate.data().to_f32_vec().iter().map(|x| x.to_bits()).collect()));
        }
    })
    .unwrap();
    got.sort_by_key(|(i, _)| *i);
    got.into_iter().map(|(_, b)| b).collect()
}

#[test]
fn read_ahead_that_only_evicts_stands_down() {
    let tmp = tempfile::tempdir().unwrap();
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let s = store(&full, 2);
    let wrong = |layer: u16| PrefetchHint {
        layer,
        experts: vec![4, 5, 6, 7],
    };
    let first = step(&s, 0, &[0, 1], &wrong(1));
    let mut stood_down_at = None;
    for i in 0..400u64 {
        let layer = (i % 2) as u16;
        assert_eq!(step(&s, layer, &[0, 1], &wrong(1 - layer)).len(), 2);
        let st = s.stats();
        if st.prefetch_stand_downs > 0 && stood_down_at.is_none() {
            stood_down_at = Some((i, st.prefetch_issued));
        }
    }
    let (at, issued) = stood_down_at.expect("read-ahead never stood down");
    let st = s.stats();
    assert!(st.prefetch_wasted > 0 && st.prefetch_harm > 0, "{st:?}");
    assert!(st.prefetch_paused_steps > 0, "{st:?}");
    assert!(at + 2 < RETRY_STEPS, "stood down at step {at}");
    // Nothing more was read ahead while it stood down (a few reads issued
    // just before may still have landed).
    assert!(
        st.prefetch_issued <= issued + 8,
        "issued {} after standing down at {issued}",
        st.prefetch_issued
    );
    // The same experts whatever read-ahead did.
    assert_eq!(step(&s, 0, &[0, 1], &wrong(1)), first);
}

#[test]
fn read_ahead_that_pays_stays_on() {
    let tmp = tempfile::tempdir().unwrap();
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    // Room for every expert of both layers; each prediction is right.
    let s = store(&full, 16);
    for i in 0..300u32 {
        let layer = (i % 2) as u16;
        let next_experts = vec![(i + 1) % 8, (i + 2) % 8];
        step(
            &s,
            layer,
            &[i % 8, (i + 1) % 8],
            &PrefetchHint {
                layer: 1 - layer,
                experts: next_experts,
            },
        );
    }
    let st = s.stats();
    assert_eq!(st.prefetch_stand_downs, 0, "{st:?}");
    assert_eq!(st.prefetch_paused_steps, 0);
}
