//! Time of one gated DeltaNet layer at real width (Qwen3-Next-80B's linear
//! layers: hidden 2048, 16 key heads and 32 value heads of 128, conv 4),
//! random f32 weights: prefill of a chunk of tokens, then the median of 32
//! decode steps after it.
//!
//!     [HIDDEN=2048] cargo run --release -p charm-models --example bench_deltanet [-- TOKENS]
//!
//! `HIDDEN=64` leaves the projections negligible: what remains is the conv
//! and the delta rule.
//!
//! Then the rule alone on one thread, all 32 value heads, over the same
//! tokens and over one: the reference loops (`delta_rule_ref`, row by row
//! as transformers writes it) against the column-blocked kernel the layer
//! runs (`delta_rule`, the same bits), side by side.

use std::collections::HashMap;
use std::time::Instant;

use charm_common::kernels::{delta_rule, delta_rule_ref, DeltaInputs};
use charm_common::{LoadError, Weight, WeightSource};
use charm_models::gated_delta_net::{DeltaNetShape, GatedDeltaNet, ProjectionLayout};

/// Tensors by name, made up on the spot.
struct Random(HashMap<String, Vec<f32>>);

impl Random {
    fn fill(&self, name: &str, n: usize) -> Vec<f32> {
        if let Some(v) = self.0.get(name) {
            return v.clone();
        }
        let mut s = name.bytes().fold(0x9e37_79b9u32, |a, b| a.rotate_left(5) ^ b as u32);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 0.05
            })
            .collect()
    }
}

impl WeightSource for Random {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        Ok(Weight::from_f32(rows, cols, self.fill(name, rows * cols)))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        Ok(self.fill(name, len))
    }

    fn array(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        Ok(self.fill(name, shape.iter().product()))
    }

    fn contains(&self, _: &str) -> bool {
        true
    }
}

fn main() {
    let tokens: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let hidden: usize = std::env::var("HIDDEN")
        .ok()
        .and_then(|h| h.parse().ok())
        .unwrap_or(2048);
    let shape = DeltaNetShape {
        k_heads: 16,
        v_heads: 32,
        k_head_dim: 128,
        v_head_dim: 128,
        conv_kernel: 4,
        layout: ProjectionLayout::Grouped,
    };
    let files = Random(HashMap::new());
    let layer = GatedDeltaNet::load(&files, shape, hidden, 1e-6, 0).expect("random weights load");
    let xs = files.fill("xs", tokens * hidden);
    let mut out = vec![0.0; tokens * hidden];

    let mut state = layer.new_state();
    let t = Instant::now();
    layer.forward(&xs, tokens, &mut state, &mut out);
    let prefill = t.elapsed().as_secs_f64();
    let mut decode = Vec::new();
    for i in 0..32 {
        let x = &xs[(i % tokens) * hidden..(i % tokens + 1) * hidden];
        let t = Instant::now();
        layer.forward(x, 1, &mut state, &mut out[..hidden]);
        decode.push(t.elapsed().as_secs_f64() * 1e3);
    }
    decode.sort_by(f64::total_cmp);
    println!(
        "threads {}: prefill {tokens} tokens {:.1} ms ({:.0} tok/s per layer); decode median {:.3} ms per token per layer",
        rayon::current_num_threads(),
        prefill * 1e3,
        tokens as f64 / prefill,
        decode[decode.len() / 2]
    );

    let (dk, dv, heads) = (shape.k_head_dim, shape.v_head_dim, shape.v_heads);
    for n in [tokens, 1] {
        let (q, k, v) = (
            files.fill("q", n * dk),
            files.fill("k", n * dk),
            files.fill("v", n * dv),
        );
        let (decay, beta) = (vec![0.97f32; n], vec![0.6f32; n]);
        let x = DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            decay: &decay,
            beta: &beta,
        };
        let time = |f: &dyn Fn(&mut [f32], &mut [f32])| {
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let (mut st, mut o) = (vec![0.1f32; dk * dv], vec![0.0f32; n * dv]);
                let t = Instant::now();
                for _ in 0..heads {
                    f(&mut st, &mut o);
                }
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            best
        };
        let r = time(&|st, o| delta_rule_ref(st, dv, x, o));
        let f = time(&|st, o| delta_rule(st, dv, x, o));
        println!(
            "delta rule, {heads} heads x {n} tokens, one thread (best of 5): reference {r:.3} ms, kernel {f:.3} ms ({:.1}x)",
            r / f
        );
    }
}
