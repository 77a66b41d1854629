//! Read-ahead that knows when it loses, on a real container store.
//!
//! - `read_ahead_that_only_evicts_stands_down`: every prediction names
//!   experts no step wants, into a cache with room for two experts: each
//!   read-ahead is wasted and evicts an expert the next step reads again,
//!   so the epoch with read-ahead waits for reads and the epoch without
//!   does not; the store stops reading ahead (the stand-down, the wasted
//!   reads and the harm are counted in its stats) and issues nothing more
//!   while it stands down; the steps' experts are the same either way.
//!
//! The decision rule itself (epochs, ties, measuring again) is tested in
//! `worker/src/prefetch_policy.rs`.

mod cluster_support;

use charm_common::container::Manifest;
use charm_proto::PrefetchHint;
use charm_tests::fixture;
use charm_worker::io::ReaderOptions;
use charm_worker::prefetch_policy::{EPOCH, SETTLE};
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
    // Two epochs measure (the first step above included); then read-ahead
    // stands down for SETTLE epochs.
    for i in 1..2 * EPOCH {
        let layer = (i % 2) as u16;
        assert_eq!(step(&s, layer, &[0, 1], &wrong(1 - layer)).len(), 2);
    }
    let st = s.stats();
    assert_eq!(st.prefetch_stand_downs, 1, "{st:?}");
    assert!(st.prefetch_wasted > 0 && st.prefetch_harm > 0, "{st:?}");
    let issued = st.prefetch_issued;
    for i in 0..(SETTLE - 1) * EPOCH {
        let layer = (i % 2) as u16;
        step(&s, layer, &[0, 1], &wrong(1 - layer));
    }
    let st = s.stats();
    assert_eq!(st.prefetch_issued, issued, "nothing read ahead while standing down");
    assert_eq!(st.prefetch_paused_steps, (SETTLE - 1) * EPOCH);
    // The same experts whatever read-ahead did.
    assert_eq!(step(&s, 0, &[0, 1], &wrong(1)), first);
}
