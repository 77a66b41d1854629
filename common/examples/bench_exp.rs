//! SiLU over a row with charm's `exp` ([`charm_common::kernels::silu`]) and
//! with the C library's `f32::exp`, in nanoseconds per element (one
//! thread, best of five): what `docs/kernels.md` quotes.
//!
//!     cargo run --release -p charm-common --example bench_exp

use std::hint::black_box;
use std::time::Instant;

use charm_common::kernels::silu;

fn main() {
    let xs: Vec<f32> = (0..4096).map(|i| ((i * 7919) % 2000) as f32 / 100.0 - 10.0).collect();
    let mut out = vec![0.0f32; xs.len()];
    let reps = 10_000;
    fn time(xs: &[f32], out: &mut [f32], reps: usize, f: impl Fn(f32) -> f32) -> f64 {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..reps {
                    for (o, &x) in out.iter_mut().zip(black_box(xs)) {
                        *o = f(x);
                    }
                    black_box(&*out);
                }
                t.elapsed().as_secs_f64() * 1e9 / (reps * xs.len()) as f64
            })
            .fold(f64::INFINITY, f64::min)
    }
    let ours = time(&xs, &mut out, reps, silu);
    let libc = time(&xs, &mut out, reps, |x| x / (1.0 + (-x).exp()));
    println!(
        "SiLU row of {}: charm exp {ours:.2} ns/element, f32::exp {libc:.2} ns/element",
        xs.len()
    );
}
