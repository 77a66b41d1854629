//! Throughput of matrix products ([`Weight::matmul`]) as prefill runs
//! them: float rows (BF16 / F16 / F32 weights against f32 activation
//! rows, the products of HF directories) and charm's INT8 / INT4 (a
//! converted container's experts: `convert`'s default groups, one per row
//! and 32) or, with `CHARM_BENCH_TYPES`
//! naming GGML types (`Q4_K,IQ4_XS,...`), random GGML rows with their
//! packed copy (`Weight::pack_for_cpu`) against `N` distinct activation
//! rows; in G multiply-adds per second on the rayon pool
//! (`RAYON_NUM_THREADS` picks its size). An expert of the OLMoE-shaped
//! bench model in a 512-token prefill is about `1024 2048 64`:
//!
//!     cargo run --release -p charm-common --example bench_matmul [-- ROWS COLS N REPS]

#[path = "shared/random_rows.rs"]
mod random_rows;

use std::time::Instant;

use charm_common::gguf::GgmlType;
use charm_common::{Buf, Weight, WeightData, WeightFormat};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = args.first().copied().unwrap_or(2048);
    let cols = args.get(1).copied().unwrap_or(2048);
    let n = args.get(2).copied().unwrap_or(512);
    let reps = args.get(3).copied().unwrap_or(3);
    let mut bits = random_rows::xorshift();
    let mut next = || (bits() % 2000) as f32 / 1000.0 - 1.0;
    let w: Vec<f32> = (0..rows * cols).map(|_| next() * 0.05).collect();
    let xs: Vec<f32> = (0..n * cols).map(|_| next()).collect();
    let base = Weight::from_f32(rows, cols, w);
    println!(
        "rows {rows} cols {cols} n {n}; G multiply-adds/s, median of 5 x {reps}, {} threads",
        rayon::current_num_threads()
    );
    let weights: Vec<(String, Weight)> = match std::env::var("CHARM_BENCH_TYPES") {
        Ok(list) => list
            .split(',')
            .filter_map(|name| {
                let ty = GgmlType::ALL
                    .into_iter()
                    .filter(|t| t.block_elems() > 1)
                    .find(|t| t.name().eq_ignore_ascii_case(name.trim()))?;
                let rb = ty.row_bytes(cols)?;
                let data = random_rows::ggml_rows(ty, rows, rb, &mut bits);
                let w = Weight::new(
                    rows,
                    cols,
                    WeightData::Gguf {
                        ty,
                        data: Buf::owned(data),
                    },
                );
                Some((ty.name().to_string(), w.pack_for_cpu()))
            })
            .collect(),
        Err(_) => [
            WeightFormat::F32,
            WeightFormat::BF16,
            WeightFormat::F16,
            WeightFormat::Int8 { group: cols },
            WeightFormat::Int4 { group: 32 },
        ]
        .into_iter()
        .map(|f| (format!("{f:?}"), base.to_format(f).expect("formats convert")))
        .collect(),
    };
    for (format, w) in weights {
        let mut out = vec![0.0f32; n * rows];
        let mut runs = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                w.matmul(&xs, n, &mut out);
            }
            runs.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        runs.sort_by(f64::total_cmp);
        let gmacs = (rows * cols * n) as f64 / runs[2] / 1e9;
        println!(
            "{format}: {:.2} ms, {gmacs:.1} G/s (checksum {})",
            runs[2] * 1e3,
            out.iter().sum::<f32>()
        );
    }
}
