//! Read-ahead that knows when it loses, on a real container store.
//!
//! - `a_store_reads_ahead_as_its_measure_decides`: every prediction names
//!   experts no step wants, into a cache with room for two experts: the
//!   read-aheads are wasted (counted), the first measurement draws steps
//!   with and without them, and for the next epochs the store does what the
//!   measure decided (nothing read ahead while standing down, paused steps
//!   counted; reading ahead on otherwise); the steps' experts are the same
//!   either way.
//!
//! The decision rule itself (interleaved arms, ties, measuring again) is tested in
//! `worker/src/prefetch_policy.rs`.

mod cluster_support;

use charm_common::container::Manifest;
use charm_proto::PrefetchHint;
use charm_tests::fixture;
use charm_worker::io::ReaderOptions;
use charm_worker::prefetch_policy::{PrefetchPolicy, EPOCH, SETTLE};
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
fn a_store_reads_ahead_as_its_measure_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let s = store(&full, 2);
    let wrong = |layer: u16| PrefetchHint {
        layer,
        experts: vec![4, 5, 6, 7],
    };
    let first = step(&s, 0, &[0, 1], &wrong(1));
    // The first measurement (the step above included): arms drawn step by
    // step until each has an epoch.
    let measure = PrefetchPolicy::first_measurement_steps();
    assert!(measure >= 2 * EPOCH);
    for i in 1..measure {
        let layer = (i % 2) as u16;
        assert_eq!(step(&s, layer, &[0, 1], &wrong(1 - layer)).len(), 2);
    }
    let st = s.stats();
    assert!(st.prefetch_issued > 0, "the measurement's on arm read ahead: {st:?}");
    assert!(st.prefetch_wasted > 0, "wrong predictions waste reads: {st:?}");
    assert_eq!(st.prefetch_paused_steps, 0, "{st:?}");
    // The decision holds for SETTLE epochs, and the store does what it says.
    // (Which way it goes rests on this machine's read timings of tiny
    // experts; the rule itself is tested in worker/src/prefetch_policy.rs.)
    let issued = st.prefetch_issued;
    for i in 0..SETTLE * EPOCH - 1 {
        let layer = (i % 2) as u16;
        step(&s, layer, &[0, 1], &wrong(1 - layer));
    }
    let after = s.stats();
    if st.prefetch_stand_downs == 1 {
        assert_eq!(after.prefetch_issued, issued, "nothing read ahead while standing down");
        assert_eq!(after.prefetch_paused_steps, SETTLE * EPOCH - 1);
    } else {
        assert_eq!(st.prefetch_stand_downs, 0);
        assert!(
            after.prefetch_issued > issued,
            "read-ahead kept on goes on reading ahead"
        );
        assert_eq!(after.prefetch_paused_steps, 0);
    }
    // The same experts whatever read-ahead did.
    assert_eq!(step(&s, 0, &[0, 1], &wrong(1)), first);
}
