//! The AMX prefill product's parts on one core: `amx::product` of one
//! decoded tile of 16 weight rows (random GGML rows of `TYPE`, `COLS`
//! wide) against `N` activation rows, in ns per block-tile (16 weight
//! rows × 16 activation rows × 32 elements: 8,192 multiply-adds), and the
//! tile's decode (`WeightTile::decode`), best of five runs. Needs a CPU
//! with AMX-INT8 (it says so and stops elsewhere):
//!
//!     cargo run --release -p charm-common --example bench_amx [-- TYPE COLS N]
//!
//! (`TYPE` a GGML type name, `Q8_0` by default; `COLS` 2048, `N` 64.)

#[path = "shared/random_rows.rs"]
mod random_rows;

use std::time::Instant;

use charm_common::gguf::qdot::{amx, Q8Acts};
use charm_common::gguf::GgmlType;

fn main() {
    if !charm_common::isa::amx_runs() {
        println!("no AMX-INT8 here (or the tile state was refused): nothing to time");
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ty_name = args.first().map_or("Q8_0", |s| s.as_str());
    let ty = GgmlType::ALL
        .into_iter()
        .find(|t| t.to_string().eq_ignore_ascii_case(ty_name))
        .unwrap_or_else(|| panic!("no GGML type {ty_name}"));
    let cols: usize = args.get(1).map_or(2048, |v| v.parse().expect("COLS"));
    let n: usize = args.get(2).map_or(64, |v| v.parse().expect("N"));
    assert!(amx::takes(ty, cols), "{ty} rows of {cols} do not run on AMX");
    let mut bits = random_rows::xorshift();
    let rows = random_rows::ggml_rows(ty, 16, ty.row_bytes(cols).expect("whole blocks"), &mut bits);
    let xs: Vec<Q8Acts> = (0..n)
        .map(|_| {
            let x: Vec<f32> = (0..cols).map(|_| (bits() % 2000) as f32 / 1000.0 - 1.0).collect();
            Q8Acts::new(&x)
        })
        .collect();
    let refs: Vec<&Q8Acts> = xs.iter().collect();
    let acts = amx::AmxActs::new(&refs);
    let mut tile = amx::WeightTile::default();
    tile.decode(ty, &rows, cols);
    let mut out = vec![0f32; 16 * n];
    let reps = (200_000 / n).max(10);
    let time = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..reps {
                    f();
                }
                t.elapsed().as_nanos() as f64 / reps as f64
            })
            .fold(f64::MAX, f64::min)
    };
    let product = time(&mut || amx::product(&tile, &acts, &mut out, n, &[]));
    let decode = time(&mut || tile.decode(ty, &rows, cols));
    let block_tiles = (cols / 32 * n.div_ceil(16)) as f64;
    println!(
        "{ty} × {cols}, {n} activation rows: product {:.0} ns ({:.1} ns a block-tile, {:.0} G multiply-adds/s), decode {:.0} ns (checksum {})",
        product,
        product / block_tiles,
        (16 * n * cols) as f64 / product,
        decode,
        out.iter().sum::<f32>()
    );
}
