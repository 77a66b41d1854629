//! Throughput of float-row matrix products ([`Weight::matmul`]): the
//! prefill products of HF directories (BF16 / F16 / F32 weights against
//! f32 activation rows), in G multiply-adds per second on the rayon pool
//! (`RAYON_NUM_THREADS` picks its size):
//!
//!     cargo run --release -p charm-common --example bench_matmul [-- ROWS COLS N REPS]

use std::time::Instant;

use charm_common::{Weight, WeightFormat};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = args.first().copied().unwrap_or(2048);
    let cols = args.get(1).copied().unwrap_or(2048);
    let n = args.get(2).copied().unwrap_or(512);
    let reps = args.get(3).copied().unwrap_or(3);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 2000) as f32 / 1000.0 - 1.0
    };
    let w: Vec<f32> = (0..rows * cols).map(|_| next() * 0.05).collect();
    let xs: Vec<f32> = (0..n * cols).map(|_| next()).collect();
    let base = Weight::from_f32(rows, cols, w);
    println!(
        "rows {rows} cols {cols} n {n}; G multiply-adds/s, median of 5 x {reps}, {} threads",
        rayon::current_num_threads()
    );
    for format in [WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16] {
        let w = base.to_format(format).expect("float formats convert");
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
            "{format:?}: {:.2} ms, {gmacs:.1} G/s (checksum {})",
            runs[2] * 1e3,
            out.iter().sum::<f32>()
        );
    }
}
