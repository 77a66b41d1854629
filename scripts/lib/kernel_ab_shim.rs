//! The C interface that `scripts/bench_kernels_ab.sh` builds from each of
//! two commits' `charm-common` (a `cdylib` per commit) and loads side by
//! side into one process: a product case (random GGML rows of a type, their
//! packed copy, `n` activation rows: the data of `bench_matmul`, from the
//! same generator and seed in both builds), timed runs of
//! `Weight::matmul`, and a hash of the outputs' bits so that the script can
//! check that both builds compute the same bits.

use std::ffi::{c_char, CStr};
use std::time::Instant;

use charm_common::gguf::GgmlType;
use charm_common::{Buf, Weight, WeightData};

#[path = "../../common/examples/shared/random_rows.rs"]
#[allow(dead_code)]
mod random_rows;

/// One product: the packed weight, its activation rows and an output.
pub struct Case {
    w: Weight,
    xs: Vec<f32>,
    n: usize,
    out: Vec<f32>,
}

/// A case of `rows` × `cols` random rows of the GGML type named `ty` with
/// `n` activation rows; null when `ty` names no block type or `cols` is
/// not a whole number of its blocks.
///
/// # Safety
/// `ty` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ab_new(ty: *const c_char, rows: usize, cols: usize, n: usize) -> *mut Case {
    // SAFETY: the caller's string.
    let name = unsafe { CStr::from_ptr(ty) }.to_str().unwrap_or("");
    let Some(ty) = GgmlType::ALL
        .into_iter()
        .filter(|t| t.block_elems() > 1)
        .find(|t| t.name().eq_ignore_ascii_case(name))
    else {
        return std::ptr::null_mut();
    };
    let Some(rb) = ty.row_bytes(cols) else {
        return std::ptr::null_mut();
    };
    let mut bits = random_rows::xorshift();
    let data = random_rows::ggml_rows(ty, rows, rb, &mut bits);
    let xs = (0..n * cols).map(|_| (bits() % 2000) as f32 / 1000.0 - 1.0).collect();
    let w = Weight::new(rows, cols, WeightData::Gguf { ty, data: Buf::owned(data) }).pack_for_cpu();
    Box::into_raw(Box::new(Case { w, xs, n, out: vec![0.0; n * rows] }))
}

/// Seconds per product over `reps` products (at least one); the FNV-1a
/// hash of the last product's output bits into `hash`.
///
/// # Safety
/// `case` from [`ab_new`], not freed; `hash` writable.
#[no_mangle]
pub unsafe extern "C" fn ab_run(case: *mut Case, reps: usize, hash: *mut u64) -> f64 {
    // SAFETY: the caller's live case.
    let c = unsafe { &mut *case };
    let reps = reps.max(1);
    let t = Instant::now();
    for _ in 0..reps {
        c.w.matmul(&c.xs, c.n, &mut c.out);
    }
    let s = t.elapsed().as_secs_f64() / reps as f64;
    let h = c.out.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
    });
    // SAFETY: the caller's pointer.
    unsafe { *hash = h };
    s
}

/// Frees a case.
///
/// # Safety
/// `case` from [`ab_new`], freed once.
#[no_mangle]
pub unsafe extern "C" fn ab_free(case: *mut Case) {
    // SAFETY: the caller's case, from `Box::into_raw`.
    drop(unsafe { Box::from_raw(case) });
}
