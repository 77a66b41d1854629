//! Decode's matrix-vector products at memory speed: each weight format as
//! one large matrix (far larger than the caches, on huge pages as decode's
//! copies are), multiplied by `Weight::matvec` on every rayon thread, in
//! GB/s of weights read, beside a plain read of the same bytes:
//!
//!     cargo run --release -p charm-common --example bench_stream [-- MIB]
//!
//! The last two lines multiply many 2048 × 2048 Q4_0 matrices one after
//! another (a layer's projections: what each product's start and end
//! cost), each packed into a copy of its own as the GGUF loader makes
//! them, then the same number as slices of one packed copy, on a thread of
//! the pool kept warm as the engine calls them (`warm::run_warm`). Each line:
//! format, median of 7 passes (min, max). Compare software prefetch
//! settings with `CHARM_PREFETCH=0` (off) against the default in
//! alternating runs; docs/kernels.md quotes the results.

use std::sync::Arc;
use std::time::Instant;

use charm_common::gguf::qdot::tiled::pack_rows_into;
use charm_common::gguf::GgmlType;
use charm_common::hugemem::HugeBuf;
use charm_common::quant::{quantize_int4, quantize_int8};
use charm_common::{Buf, ByteSource, Weight, WeightData};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

const COLS: usize = 2048;

fn main() {
    let mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1024);
    println!(
        "{mib} MiB per matrix, {COLS} columns, {} threads, prefetch distance {} B; GB/s, median of 7 (min, max)",
        rayon::current_num_threads(),
        charm_common::prefetch::distance()
    );
    let x: Vec<f32> = (0..COLS).map(|i| ((i * 37 % 200) as f32) / 100.0 - 1.0).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    // Bytes per row of each format; the buffer's contents only need to be
    // finite numbers where the format keeps floats.
    let formats: &[(&str, usize)] = &[
        ("read", COLS * 4),
        ("f32", COLS * 4),
        ("bf16", COLS * 2),
        ("int8", COLS + COLS / 32 * 4),
        ("int4", COLS / 2 + COLS / 32 * 4),
        ("Q8_0", GgmlType::Q8_0.row_bytes(COLS).unwrap_or(0)),
        ("Q4_0", GgmlType::Q4_0.row_bytes(COLS).unwrap_or(0)),
        ("Q4_K", GgmlType::Q4_K.row_bytes(COLS).unwrap_or(0)),
        ("Q6_K", GgmlType::Q6_K.row_bytes(COLS).unwrap_or(0)),
    ];
    for &(name, rb) in formats {
        let rows = (mib << 20) / rb / 32 * 32;
        let (subject, bytes) = build(name, rows, &mut rng);
        let gb = bytes as f64 / 1e9;
        let mut out = vec![0.0f32; rows];
        let rate = gbs(gb, || match &subject {
            Subject::Matrix(w) => w.matvec(&x, &mut out),
            Subject::Read(buf) => out[0] = read_all(buf),
        });
        println!("{name:>5} {rate}");
    }
    // A layer's projections: many 2048 × 2048 Q4_0 matrices, one product
    // after another: what each product's start and end cost.
    let (ty, rows) = (GgmlType::Q4_0, COLS);
    let rb = ty.row_bytes(COLS).unwrap_or(0);
    let count = ((mib << 20) / (rows * rb)).max(1);
    let raw: Arc<dyn ByteSource> = gguf_rows(ty, rows * count, &mut rng);
    let slice = |i: usize| {
        let data = Buf::shared(raw.clone(), i * rows * rb, rows * rb);
        Weight::new(rows, COLS, WeightData::Gguf { ty, data })
    };
    let own: Vec<Weight> = (0..count).map(|i| slice(i).pack_for_cpu()).collect();
    let whole = raw.bytes();
    let packed: Arc<dyn ByteSource> = Arc::new(
        HugeBuf::filled(whole.len(), |b| pack_rows_into(ty, whole, rows * count, COLS, b)).expect("huge-page buffer"),
    );
    let shared: Vec<Weight> = (0..count)
        .map(|i| slice(i).with_packed(packed.clone(), i * rows * rb))
        .collect();
    let gb = whole.len() as f64 / 1e9;
    let mut out = vec![0.0f32; rows];
    for (what, set) in [("own copies", &own), ("slices of one", &shared)] {
        // On a thread of the pool with the others kept awake, as the engine
        // runs a step's layers (called from outside the pool, every product
        // is handed to it and waited for).
        let rate = gbs(gb, || {
            charm_common::warm::run_warm(|| {
                for w in set {
                    w.matvec(&x, &mut out);
                    std::hint::black_box(&out);
                }
            })
        });
        println!("Q4_0 {count} x {rows} x {COLS}, {what} {rate}");
    }
}

/// `pass` timed 7 times as `gb` gigabytes read: "median (min, max)" GB/s.
fn gbs(gb: f64, mut pass: impl FnMut()) -> String {
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            pass();
            gb / t.elapsed().as_secs_f64()
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    format!("{:6.1} ({:.1}, {:.1})", runs[3], runs[0], runs[6])
}

/// `rows` random GGML rows of `ty`, `COLS` wide, on huge pages, with every
/// block's f16 scales set to a small finite number.
fn gguf_rows(ty: GgmlType, rows: usize, rng: &mut ChaCha8Rng) -> Arc<HugeBuf> {
    let rb = ty.row_bytes(COLS).expect("a multiple of 256");
    let f16_at: &[usize] = match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 => &[0],
        GgmlType::Q6_K => &[208],
        _ => &[0, 2],
    };
    let buf = HugeBuf::filled(rows * rb, |b| {
        rng.fill_bytes(b);
        for blk in b.chunks_exact_mut(ty.block_bytes()) {
            for &at in f16_at {
                blk[at..at + 2].copy_from_slice(&0x2000u16.to_le_bytes());
            }
        }
    });
    Arc::new(buf.expect("huge-page buffer"))
}

/// What one line measures.
enum Subject {
    /// A plain read of the buffer.
    Read(Arc<HugeBuf>),
    /// `Weight::matvec`.
    Matrix(Weight),
}

/// Sum of every 8-byte word, halves of the buffer on rayon threads.
fn read_all(buf: &HugeBuf) -> f32 {
    let b = buf.bytes();
    let half = b.len().div_ceil(2);
    let s: u64 = b
        .par_chunks(half)
        .map(|c| {
            c.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                .fold(0u64, u64::wrapping_add)
        })
        .sum();
    s as f32
}

/// One `rows × COLS` matrix of `name` on huge pages (or, for `read`, a
/// buffer of f32 size), and its size in bytes.
fn build(name: &str, rows: usize, rng: &mut ChaCha8Rng) -> (Subject, usize) {
    let huge = |len: usize, fill: &mut dyn FnMut(&mut [u8])| -> Arc<HugeBuf> {
        Arc::new(HugeBuf::filled(len, |b| fill(b)).expect("huge-page buffer"))
    };
    let n = rows * COLS;
    let data = match name {
        "read" => {
            return (Subject::Read(huge(n * 4, &mut |b| rng.fill_bytes(b))), n * 4);
        }
        "f32" | "bf16" => {
            let size = if name == "f32" { 4 } else { 2 };
            // Small finite values: the top bits of each element fixed.
            let buf = huge(n * size, &mut |b| {
                rng.fill_bytes(b);
                for e in b.chunks_exact_mut(size) {
                    e[size - 1] = 0x3c;
                }
            });
            let src: Arc<dyn ByteSource> = buf;
            if name == "f32" {
                WeightData::F32(Buf::shared(src, 0, n))
            } else {
                WeightData::BF16(Buf::shared(src, 0, n))
            }
        }
        "int8" | "int4" => {
            let row: Vec<f32> = (0..COLS).map(|i| ((i * 13 % 97) as f32) / 50.0 - 1.0).collect();
            let (scales, codes): (Vec<f32>, Vec<u8>) = if name == "int8" {
                let (s, q) = quantize_int8(&row, 1, COLS, 32).expect("finite row");
                (s, q.iter().map(|&v| v as u8).collect())
            } else {
                quantize_int4(&row, 1, COLS, 32).expect("finite row")
            };
            let s_len = scales.len() * rows;
            let buf = huge(s_len * 4 + codes.len() * rows, &mut |b| {
                let (s, q) = b.split_at_mut(s_len * 4);
                for r in 0..rows {
                    s[r * scales.len() * 4..(r + 1) * scales.len() * 4].copy_from_slice(bytemuck::cast_slice(&scales));
                    q[r * codes.len()..(r + 1) * codes.len()].copy_from_slice(&codes);
                }
            });
            let src: Arc<dyn ByteSource> = buf;
            let s = Buf::shared(src.clone(), 0, s_len);
            let res = if name == "int8" {
                WeightData::int8(rows, COLS, 32, s, Buf::shared(src, s_len * 4, n))
            } else {
                WeightData::int4(rows, COLS, 32, s, Buf::shared(src, s_len * 4, n / 2))
            };
            res.expect("shapes match")
        }
        _ => {
            let ty = match name {
                "Q8_0" => GgmlType::Q8_0,
                "Q4_0" => GgmlType::Q4_0,
                "Q4_K" => GgmlType::Q4_K,
                _ => GgmlType::Q6_K,
            };
            let rb = ty.row_bytes(COLS).expect("a multiple of 256");
            let src: Arc<dyn ByteSource> = gguf_rows(ty, rows, rng);
            let w = Weight::new(
                rows,
                COLS,
                WeightData::Gguf {
                    ty,
                    data: Buf::shared(src, 0, rows * rb),
                },
            );
            // Q8_0 / Q4_0: decode's repacked copy, as the GGUF loader makes it.
            let w = w.pack_for_cpu();
            return (Subject::Matrix(w), rows * rb);
        }
    };
    let w = Weight::new(rows, COLS, data);
    let bytes = match w.data() {
        WeightData::F32(_) => n * 4,
        WeightData::BF16(_) | WeightData::F16(_) => n * 2,
        WeightData::Int8 { .. } => n + n / 32 * 4,
        WeightData::Int4 { .. } => n / 2 + n / 32 * 4,
        WeightData::Gguf { .. } => unreachable!("returned above"),
    };
    (Subject::Matrix(w), bytes)
}
