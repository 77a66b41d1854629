//! gpt-oss-20b's expert shape (2880 × 2880, 11 chunks of 256 and two
//! blocks) through decode's `Weight::matvec`, MXFP4 and Q8_0, on one and
//! two threads, from cache and from memory:
//!
//!     cargo run --release -p charm-common --example bench_gptoss [-- MIB]
//!
//! - `cache`: one 256 × 2880 matrix (0.4 MB MXFP4, 0.8 MB Q8_0)
//!   multiplied over and over.
//! - `memory`: 2880 × 2880 matrices totalling MIB (default 512) MiB, each
//!   with its own copy on huge pages as the GGUF loader makes it (packed
//!   where `qdot::tiled::packable` holds), multiplied one after another.
//! - `one copy`: the same matrices as slices of one packed copy (the
//!   loader's layout for the experts of one tensor).
//!
//! Each line: G weights/s and GB/s, median of 7 passes (min, max of the
//! GB/s). docs/kernels.md quotes the results.

use std::sync::Arc;
use std::time::Instant;

use charm_common::gguf::GgmlType;
use charm_common::hugemem::HugeBuf;
use charm_common::{Buf, ByteSource, Weight, WeightData};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

const COLS: usize = 2880;

fn main() {
    let mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(512);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let x: Vec<f32> = (0..COLS).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    println!(
        "{COLS} columns, ISA {}; G weights/s, GB/s: median of 7 (GB/s min, max)",
        charm_common::Isa::active().name()
    );
    for ty in [GgmlType::MXFP4, GgmlType::Q8_0] {
        let rb = ty.row_bytes(COLS).expect("whole blocks");
        // Cache: 256 rows, many passes.
        let small = matrix(ty, 256, &mut rng);
        // Memory: whole 2880-row matrices.
        let count = ((mib << 20) / (COLS * rb)).max(1);
        let raw = rows(ty, COLS * count, &mut rng);
        let big: Vec<Weight> = (0..count)
            .map(|i| {
                let data = Buf::shared(raw.clone(), i * COLS * rb, COLS * rb);
                Weight::new(COLS, COLS, WeightData::Gguf { ty, data }).pack_for_cpu()
            })
            .collect();
        let packed = big[0].is_packed();
        let whole = raw.bytes();
        let one: Option<Arc<dyn ByteSource>> = packed.then(|| {
            let buf = HugeBuf::filled(whole.len(), |b| {
                charm_common::gguf::qdot::tiled::pack_rows_into(ty, whole, COLS * count, COLS, b)
            });
            Arc::new(buf.expect("huge-page buffer")) as Arc<dyn ByteSource>
        });
        let sliced: Vec<Weight> = (0..count)
            .map(|i| {
                let data = Buf::shared(raw.clone(), i * COLS * rb, COLS * rb);
                let w = Weight::new(COLS, COLS, WeightData::Gguf { ty, data });
                match &one {
                    Some(c) => w.with_packed(c.clone(), i * COLS * rb),
                    None => w,
                }
            })
            .collect();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| {
                let mut out = vec![0.0f32; COLS];
                let reps = 200;
                let line = rate(256 * COLS * reps, 256 * rb * reps, || {
                    for _ in 0..reps {
                        small.matvec(&x, &mut out[..256]);
                        std::hint::black_box(&out);
                    }
                });
                println!("{:>5} packed {packed:<5} {threads} thr cache  {line}", ty.name());
                let line = rate(COLS * COLS * count, COLS * rb * count, || {
                    for w in &big {
                        w.matvec(&x, &mut out);
                        std::hint::black_box(&out);
                    }
                });
                println!(
                    "{:>5} packed {packed:<5} {threads} thr memory {line}  ({count} matrices)",
                    ty.name()
                );
                let line = rate(COLS * COLS * count, COLS * rb * count, || {
                    for w in &sliced {
                        w.matvec(&x, &mut out);
                        std::hint::black_box(&out);
                    }
                });
                println!("{:>5} packed {packed:<5} {threads} thr onecopy {line}", ty.name());
            });
        }
    }
}

/// `pass` timed 7 times over `elems` weights in `bytes` bytes.
fn rate(elems: usize, bytes: usize, mut pass: impl FnMut()) -> String {
    pass();
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed().as_secs_f64()
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    format!(
        "{:6.2} G/s {:6.1} GB/s ({:.1}, {:.1})",
        elems as f64 / runs[3] / 1e9,
        gbs(runs[3]),
        gbs(runs[6]),
        gbs(runs[0])
    )
}

/// A `rows × COLS` matrix of `ty` with its own (packed where possible) copy.
fn matrix(ty: GgmlType, rows_n: usize, rng: &mut ChaCha8Rng) -> Weight {
    let rb = ty.row_bytes(COLS).expect("whole blocks");
    let data = Buf::shared(rows(ty, rows_n, rng), 0, rows_n * rb);
    Weight::new(rows_n, COLS, WeightData::Gguf { ty, data }).pack_for_cpu()
}

/// `n` random rows of `ty` on huge pages: Q8_0 scales a small f16, MXFP4
/// exponents 2^-8..2^-1 (normal floats: no subnormal assists).
fn rows(ty: GgmlType, n: usize, rng: &mut ChaCha8Rng) -> Arc<dyn ByteSource> {
    let rb = ty.row_bytes(COLS).expect("whole blocks");
    let buf = HugeBuf::filled(n * rb, |b| {
        rng.fill_bytes(b);
        for blk in b.chunks_exact_mut(ty.block_bytes()) {
            if ty == GgmlType::MXFP4 {
                blk[0] = 120 + blk[0] % 8;
            } else {
                blk[..2].copy_from_slice(&0x2000u16.to_le_bytes());
            }
        }
    })
    .expect("huge-page buffer");
    Arc::new(buf)
}
