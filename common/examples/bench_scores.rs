//! Prefill attention's scores in cache: a task's queries (16, as
//! `models::attention` hands them out) against blocks of cached keys,
//! query-major, in G multiply-adds/s on one thread:
//!
//!     cargo run --release -p charm-common --example bench_scores [-- HEAD_DIM [KEYS [BLOCK]]]
//!
//! Defaults: head width 128, 48 keys a block (the prefill's block), 4,000
//! keys in all. Each line: median of 9 passes (min, max), f32 and f16 keys.

use std::time::Instant;

use charm_common::kernels::{scores_by_query_f16, scores_by_query_f32};

fn main() {
    let mut args = std::env::args().skip(1);
    let d: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(128);
    let keys: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4000);
    let block: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(48).max(1);
    let queries = 16;
    let k32: Vec<f32> = (0..keys * d)
        .map(|i| ((i * 7919 % 1000) as f32) / 1000.0 - 0.5)
        .collect();
    let k16: Vec<u16> = k32.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
    let q: Vec<Vec<f32>> = (0..queries)
        .map(|t| {
            (0..d)
                .map(|i| (((t * 131 + i * 37) % 200) as f32) / 400.0 - 0.25)
                .collect()
        })
        .collect();
    let xs: Vec<&[f32]> = q.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0.0f32; queries * keys];
    let macs = (queries * keys * d) as f64;
    println!("{queries} queries x {keys} keys of {d}, blocks of {block}; G multiply-adds/s, median of 9 (min, max)");
    for name in ["f32", "f16"] {
        let mut runs = Vec::new();
        for _ in 0..9 {
            let t = Instant::now();
            for _ in 0..5 {
                for b in (0..keys).step_by(block) {
                    let n = (keys - b).min(block);
                    let o = &mut out[b..];
                    if name == "f32" {
                        scores_by_query_f32(&k32[b * d..(b + n) * d], d, &xs, o, keys);
                    } else {
                        scores_by_query_f16(&k16[b * d..(b + n) * d], d, &xs, o, keys);
                    }
                }
            }
            std::hint::black_box(&out);
            runs.push(5.0 * macs / t.elapsed().as_secs_f64() / 1e9);
        }
        runs.sort_by(f64::total_cmp);
        println!("{name:>4} {:6.1} ({:.1}, {:.1})", runs[4], runs[0], runs[8]);
    }
}
