//! The container store under requests that fail and requests that overlap.
//!
//! - `a_missing_expert_fails_its_request_without_leaving_a_read_stuck`: a
//!   request naming an expert the (partial) container lacks is an error,
//!   and the experts named before it are not left marked "being read"
//!   with no read sent — the next request for one of them completes.
//! - `local_on_a_partial_container_fails_with_one_line`: `coordinator
//!   --local` on a container missing two of layer 0's experts ends with
//!   one error line naming one, instead of hanging.
//! - `the_store_lock_is_not_held_across_compute`: while one request's
//!   experts are being computed (its callback blocks), counters can be
//!   read and another request completes.

mod cluster_support;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use charm_common::container::Manifest;
use charm_models::ExpertError;
use charm_tests::fixture;
use charm_worker::io::ReaderOptions;
use charm_worker::store::ExpertStore;
use charm_worker::{DiskStore, StoreOptions};
use cluster_support::*;

fn store(dir: &std::path::Path, cache_bytes: u64) -> Arc<DiskStore> {
    let manifest = Manifest::open(dir).unwrap();
    let opts = StoreOptions {
        cache_bytes,
        prefetch: true,
        reader: ReaderOptions::default(),
        history_path: None,
    };
    Arc::new(DiskStore::open(dir, &manifest, &opts).unwrap())
}

/// Runs `f` on a thread; `None` if it did not finish within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Resolves `experts` of `layer` and returns the indices delivered.
fn resolve(s: &DiskStore, layer: u16, experts: &[u32]) -> Result<Vec<usize>, ExpertError> {
    let wanted: Vec<(u32, u64)> = experts.iter().map(|&e| (e, 1)).collect();
    let mut got = Vec::new();
    s.resolve(layer, &wanted, None, &mut |ready| {
        got.extend(ready.into_iter().map(|(i, _)| i))
    })?;
    got.sort_unstable();
    Ok(got)
}

#[test]
fn a_missing_expert_fails_its_request_without_leaving_a_read_stuck() {
    let tmp = tempfile::tempdir().unwrap();
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let part = partial_container(&full, tmp.path(), "part", |l, e| !(l == 0 && e == 5));
    let s = store(&part, 1 << 30);
    match resolve(&s, 0, &[4, 5]) {
        Err(ExpertError::MissingExpert { layer: 0, expert: 5 }) => {}
        other => panic!("expected MissingExpert for layer 0 expert 5, got {other:?}"),
    }
    // An id far beyond the model is the same clear error.
    assert!(matches!(
        resolve(&s, 0, &[u32::MAX]),
        Err(ExpertError::MissingExpert { .. })
    ));
    let s2 = s.clone();
    let got = within(Duration::from_secs(20), move || resolve(&s2, 0, &[4]));
    assert_eq!(
        got.expect("expert 4 is not stuck behind a read never sent").unwrap(),
        vec![0]
    );
}

#[test]
fn the_store_lock_is_not_held_across_compute() {
    let tmp = tempfile::tempdir().unwrap();
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let s = store(&full, 0); // every expert read from disk, every time
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let busy = {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut first = true;
            s.resolve(0, &[(1, 1), (2, 1)], None, &mut |_| {
                if std::mem::take(&mut first) {
                    entered_tx.send(()).unwrap();
                    // "Computing" until the other requests are done.
                    release_rx.recv_timeout(Duration::from_secs(30)).unwrap();
                }
            })
        })
    };
    entered.recv_timeout(Duration::from_secs(20)).unwrap();
    let s2 = s.clone();
    let stats = within(Duration::from_secs(10), move || s2.stats());
    assert!(stats.is_some(), "counters are readable while another request computes");
    let s3 = s.clone();
    let other = within(Duration::from_secs(20), move || resolve(&s3, 1, &[3, 6]));
    assert_eq!(
        other
            .expect("a second request completes while the first computes")
            .unwrap(),
        vec![0, 1]
    );
    release.send(()).unwrap();
    busy.join().unwrap().unwrap();
    assert!(s.stats().expert_misses >= 4);
}

#[test]
fn local_on_a_partial_container_fails_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let full = convert_bf16(&fixture("olmoe"), tmp.path(), "olmoe-bf16");
    let part = partial_container(&full, tmp.path(), "part", |l, e| !(l == 0 && (e == 3 || e == 5)));
    let out = within(Duration::from_secs(60), move || {
        coordinator(&[
            "--local",
            "--model",
            part.to_str().unwrap(),
            "generate",
            "--prompt-ids",
            "1,2,3,4,5,6,7,8,9,10,11,12",
            "--max-tokens",
            "8",
        ])
    })
    .expect("the coordinator ended instead of hanging");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: no weights for layer 0 expert"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
