//! Single-thread throughput of every dot-product kernel on every instruction
//! set this CPU runs, on a cache-resident matrix (compute, not memory):
//!
//!     cargo run --release -p charm-common --example bench_kernels [-- ROWS COLS REPS]
//!
//! (`CHARM_BENCH_TYPES=Q4_0,Q4_K` limits the GGML types measured.)
//!
//! Prints one line per (format, instruction set): millions of weight
//! elements multiplied per second (median of 5 timed passes), and the
//! speed-up over the scalar build. `scripts/bench_vs_llamacpp.sh` runs it
//! and docs/benchmarks.md quotes it. A width that is not whole 256-element
//! super-blocks (gpt-oss's 2880: `-- 256 2880`) skips the K-quants; the
//! packed lines then take the whole chunks and the blocks past them.

#[path = "shared/random_rows.rs"]
mod random_rows;

use std::time::Instant;

use charm_common::gguf::qdot::{self, Q8Acts};
use charm_common::gguf::GgmlType;
use charm_common::kernels::{dot_bf16_on, dot_f32_on, dot_int4_on, dot_int8_on};
use charm_common::Isa;

/// Whether `CHARM_BENCH_TYPES` (comma-separated GGML type names, e.g.
/// `Q4_0,Q4_K`; all when unset) names `ty`: one type's loops alone, for a
/// profiler.
fn wanted(ty: GgmlType) -> bool {
    std::env::var("CHARM_BENCH_TYPES").map_or(true, |v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(ty.name())))
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = args.first().copied().unwrap_or(256);
    let cols = args.get(1).copied().unwrap_or(2048);
    let reps = args.get(2).copied().unwrap_or(20);
    let mut next = random_rows::xorshift();
    let x: Vec<f32> = (0..cols).map(|_| (next() % 2000) as f32 / 1000.0 - 1.0).collect();
    let acts = Q8Acts::new(&x);
    println!("rows {rows} cols {cols} reps {reps}; M elements/s, median of 5, one thread");

    let time = |f: &dyn Fn() -> f32| -> f64 {
        let mut runs = Vec::new();
        let mut sink = 0.0f32;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                sink += f();
            }
            runs.push(t.elapsed().as_secs_f64());
        }
        std::hint::black_box(sink);
        runs.sort_by(f64::total_cmp);
        (rows * cols * reps) as f64 / runs[2] / 1e6
    };
    let report = |name: &str, f: &dyn Fn(Isa) -> f32| {
        let mut scalar = 0.0;
        for &isa in Isa::available() {
            let rate = time(&|| f(isa));
            if isa == Isa::Scalar {
                scalar = rate;
            }
            println!("{name:>6} {:<11} {rate:>9.0}  x{:.1}", isa.name(), rate / scalar);
        }
    };

    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::MXFP4,
    ] {
        if !wanted(ty) {
            continue;
        }
        let Some(rb) = ty.row_bytes(cols) else {
            println!("{:>6} skipped: {cols} is not whole blocks", ty.name());
            continue;
        };
        let data = random_rows::ggml_rows(ty, rows, rb, &mut next);
        report(ty.name(), &|isa| {
            data.chunks_exact(rb).map(|row| qdot::dot_on(isa, ty, row, &acts)).sum()
        });
        if qdot::tiled::packable(ty, cols) {
            // Decode's repacked rows (`Weight::pack_for_cpu`), active set only.
            let packed = qdot::tiled::pack_rows(ty, &data, rows, cols);
            let mut arranged = acts.clone();
            arranged.arrange();
            let rate = time(&|| {
                let mut out = vec![0.0f32; rows];
                qdot::tiled::dot_rows_packed(ty, &packed, &arranged, &mut out);
                out[rows - 1]
            });
            println!(
                "{:>6} {:<11} {rate:>9.0}  (packed rows, decode)",
                ty.name(),
                Isa::active().name()
            );
            // Four activation rows per weight row (a step of four
            // sequences), and eight (prefill's blocks of activation rows).
            for n in [4usize, 8] {
                let many: Vec<&Q8Acts> = vec![&arranged; n];
                let batch = qdot::tiled::ArrangedActs::new(&many);
                let rate = time(&|| {
                    let mut o = vec![0.0f32; n];
                    let mut s = 0.0;
                    for row in packed.chunks_exact(rb) {
                        qdot::tiled::dot_many_packed(ty, row, &batch, &mut o);
                        s += o[n - 1];
                    }
                    s
                });
                println!(
                    "{:>6} {:<11} {:>9.0}  (packed rows, {n} activation rows: products/s; weights/s {rate:.0})",
                    ty.name(),
                    Isa::active().name(),
                    n as f64 * rate
                );
            }
            // Two weight rows per pass (prefill's tiles, where it pays).
            if qdot::tiled::pairs_pay(ty, cols) && rows % 2 == 0 {
                let n = 8;
                let many: Vec<&Q8Acts> = vec![&arranged; n];
                let batch = qdot::tiled::ArrangedActs::new(&many);
                let rate = time(&|| {
                    let (mut oa, mut ob) = (vec![0.0f32; n], vec![0.0f32; n]);
                    let mut s = 0.0;
                    for pair in packed.chunks_exact(2 * rb) {
                        qdot::tiled::dot_pair_packed(ty, pair.split_at(rb), &batch, &mut oa, &mut ob);
                        s += oa[n - 1] + ob[n - 1];
                    }
                    s
                });
                println!(
                    "{:>6} {:<11} {:>9.0}  (packed row pairs, {n} activation rows: products/s)",
                    ty.name(),
                    Isa::active().name(),
                    n as f64 * rate
                );
            }
            // The folding kernel on the same four rows (prefill without a
            // packed copy or arranging).
            let fold4 = time(&|| {
                data.chunks_exact(rb)
                    .map(|row| qdot::dot4(ty, row, [&acts, &acts, &acts, &acts])[3])
                    .sum()
            });
            println!(
                "{:>6} {:<11} {:>9.0}  (folding dot4, 4 activation rows: products/s; weights/s {fold4:.0})",
                ty.name(),
                Isa::active().name(),
                4.0 * fold4
            );
        }
    }

    let w: Vec<f32> = (0..rows * cols).map(|_| (next() % 2000) as f32 / 1e5).collect();
    report("f32", &|isa| w.chunks_exact(cols).map(|r| dot_f32_on(isa, r, &x)).sum());
    let wb: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    report("bf16", &|isa| {
        wb.chunks_exact(cols).map(|r| dot_bf16_on(isa, r, &x)).sum()
    });
    let q8: Vec<i8> = (0..rows * cols).map(|_| next() as i8).collect();
    let scales = vec![0.01f32; rows * cols / 32];
    let gpr = cols / 32;
    report("int8", &|isa| {
        q8.chunks_exact(cols)
            .zip(scales.chunks_exact(gpr))
            .map(|(r, s)| dot_int8_on(isa, r, s, 32, &x))
            .sum()
    });
    let q4: Vec<u8> = (0..rows * cols / 2).map(|_| next() as u8).collect();
    report("int4", &|isa| {
        q4.chunks_exact(cols / 2)
            .zip(scales.chunks_exact(gpr))
            .map(|(r, s)| dot_int4_on(isa, r, s, 32, &x))
            .sum()
    });
}
