//! Decode attention over an f16 KV cache at memory speed: the per-head work
//! of one decoded token (scores against every cached key, softmax, the
//! weighted sum of the cached values) over many layers' caches, far larger
//! than the caches of the CPU, heads on every rayon thread as
//! `models::attention` runs them, in GB/s of cache read, beside a plain
//! read of the same bytes:
//!
//!     cargo run --release -p charm-common --example bench_attention [-- POSITIONS [LAYERS]]
//!
//! Defaults: 640 cached positions (the llama.cpp benchmark's context at its
//! end), 16 heads of 128 (OLMoE), 64 layers' caches (336 MB) cycled through
//! so every layer's rows come from memory. Each line: median of 7 passes
//! (min, max); `keys` and `values` time the two products alone.

use std::time::Instant;

use charm_common::kernels::{add_weighted_rows_f16, dots_f16, softmax};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

const HEADS: usize = 16;
const HEAD_DIM: usize = 128;

/// One layer's cache: per head, `positions × HEAD_DIM` keys and values, each
/// head in its own allocation (as `LayerKv` holds them).
struct Layer {
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let positions: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(640);
    let layers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut row = || -> Vec<u16> {
        (0..positions * HEAD_DIM)
            .map(|_| half::f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
            .collect()
    };
    let cache: Vec<Layer> = (0..layers)
        .map(|_| Layer {
            k: (0..HEADS).map(|_| row()).collect(),
            v: (0..HEADS).map(|_| row()).collect(),
        })
        .collect();
    let q: Vec<f32> = (0..HEADS * HEAD_DIM)
        .map(|i| ((i * 37 % 200) as f32) / 400.0 - 0.25)
        .collect();
    let bytes = layers * HEADS * 2 * positions * HEAD_DIM * 2;
    let gb = bytes as f64 / 1e9;
    println!(
        "{positions} positions, {HEADS} heads of {HEAD_DIM}, {layers} layers ({:.0} MB of f16 cache), {} threads, prefetch {} B; GB/s, median of 7 (min, max)",
        bytes as f64 / 1e6,
        rayon::current_num_threads(),
        charm_common::prefetch::distance()
    );
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let mut ctx = vec![0.0f32; HEADS * HEAD_DIM];
    let weights = vec![1.0 / positions as f32; positions];
    type Pass<'a> = Box<dyn Fn(&Layer, &mut [f32]) + 'a>;
    let passes: Vec<(&str, f64, Pass)> = vec![
        (
            "read",
            1.0,
            Box::new(|l: &Layer, ctx: &mut [f32]| {
                ctx.par_chunks_mut(HEAD_DIM).enumerate().for_each(|(h, o)| {
                    let s = |r: &[u16]| r.iter().fold(0u32, |a, &b| a.wrapping_add(b as u32));
                    o[0] = (s(&l.k[h]) ^ s(&l.v[h])) as f32;
                })
            }),
        ),
        (
            "attention",
            1.0,
            Box::new(|l: &Layer, ctx: &mut [f32]| {
                ctx.par_chunks_mut(HEAD_DIM).enumerate().for_each(|(h, o)| {
                    let mut scores = vec![0.0f32; positions];
                    dots_f16(&l.k[h], &q[h * HEAD_DIM..(h + 1) * HEAD_DIM], &mut scores);
                    for s in &mut scores {
                        *s *= scale;
                    }
                    softmax(&mut scores);
                    o.fill(0.0);
                    add_weighted_rows_f16(o, &scores, &l.v[h]);
                })
            }),
        ),
        (
            "keys",
            0.5,
            Box::new(|l: &Layer, ctx: &mut [f32]| {
                ctx.par_chunks_mut(HEAD_DIM).enumerate().for_each(|(h, o)| {
                    let mut scores = vec![0.0f32; positions];
                    dots_f16(&l.k[h], &q[h * HEAD_DIM..(h + 1) * HEAD_DIM], &mut scores);
                    o[0] = scores[positions / 2];
                })
            }),
        ),
        (
            "values",
            0.5,
            Box::new(|l: &Layer, ctx: &mut [f32]| {
                ctx.par_chunks_mut(HEAD_DIM).enumerate().for_each(|(h, o)| {
                    o.fill(0.0);
                    add_weighted_rows_f16(o, &weights, &l.v[h]);
                })
            }),
        ),
    ];
    for (name, share, pass) in &passes {
        let mut runs = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            for l in &cache {
                pass(l, &mut ctx);
            }
            std::hint::black_box(&ctx);
            runs.push(gb * share / t.elapsed().as_secs_f64());
        }
        runs.sort_by(f64::total_cmp);
        println!("{name:>9} {:6.1} ({:.1}, {:.1})", runs[3], runs[0], runs[6]);
    }
}
