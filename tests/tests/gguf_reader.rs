//! The GGUF reader against the `gguf` Python package
//! (`tests/fixtures/gguf/`, made by `scripts/make_gguf_fixtures.py`).
//!
//! - Every weight type dequantizes to the package's `gguf.quants.dequantize`
//!   values bit for bit; metadata of every value type reads back exactly.
//! - `weight()` / `weight_slice()` rows equal the reference bit for bit;
//!   `row_dot` / `matvec` stay within the per-type tolerance of the float64
//!   dot products numpy computed.
//! - Bad input (truncated, offsets past the end, unknown types, bad magic,
//!   v1, oversized counts and lengths, misaligned offsets, bad alignment,
//!   thousands of seeded random mutations of the fixture) gives a clear
//!   error naming the file (and tensor or key), never a panic, and never a
//!   large allocation: a counting allocator records the largest request.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use charm_common::gguf::dot::{dot_magnitude, dot_tolerance};
use charm_common::gguf::{dequantize, GgmlType, GgufError, GgufFile, MetaValue};
use charm_common::{Weight, WeightFormat};
use charm_tests::fixture;
use serde::Deserialize;

/// The system allocator, recording the largest single request.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to `System` unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// No test in this file needs a larger single allocation; a hostile header
/// that got one past the checks would show here.
const ALLOC_LIMIT: usize = 16 << 20;

fn assert_no_huge_allocation() {
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest < ALLOC_LIMIT, "an allocation of {largest} bytes happened");
}

#[derive(Deserialize)]
struct RefTensor {
    name: String,
    #[serde(rename = "type")]
    ty: String,
    dims: Vec<u64>,
    ref_offset: usize,
    len: usize,
    dots: Vec<String>,
}

#[derive(Deserialize)]
struct RefFile {
    file: String,
    x_len: usize,
    tensors: Vec<RefTensor>,
}

struct Fixture {
    path: PathBuf,
    refs: RefFile,
    /// `reference.bin` as f32 (activation vector first).
    values: Vec<f32>,
}

impl Fixture {
    fn load() -> Fixture {
        let dir = fixture("gguf");
        let refs: RefFile = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        let bin = std::fs::read(dir.join("reference.bin")).unwrap();
        let values = bin
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        Fixture {
            path: dir.join(&refs.file),
            refs,
            values,
        }
    }

    fn x(&self) -> &[f32] {
        &self.values[..self.refs.x_len]
    }

    fn reference(&self, t: &RefTensor) -> &[f32] {
        &self.values[t.ref_offset..t.ref_offset + t.len]
    }

    fn open(&self) -> GgufFile {
        GgufFile::open(&self.path).unwrap()
    }
}

/// The error of a result that must be one (`Weight` has no `Debug`).
fn failure<T>(r: Result<T, GgufError>) -> GgufError {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn ty_named(name: &str) -> GgmlType {
    *GgmlType::ALL.iter().find(|t| t.name() == name).unwrap()
}

/// `(rows, cols)` of a tensor viewed as a matrix of `dims[0]`-long rows.
fn matrix(dims: &[u64]) -> (usize, usize) {
    let cols = dims[0] as usize;
    (dims[1..].iter().product::<u64>() as usize, cols)
}

#[test]
fn every_type_dequantizes_bit_for_bit() {
    let fx = Fixture::load();
    let f = fx.open();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.tensors().len(), fx.refs.tensors.len());
    let mut seen = std::collections::HashSet::new();
    for (t, r) in f.tensors().iter().zip(&fx.refs.tensors) {
        assert_eq!(t.name, r.name, "file order");
        assert_eq!(t.ty.name(), r.ty);
        assert_eq!(t.dims, r.dims);
        assert_eq!(t.offset % 64, 0);
        assert_eq!(t.n_elements() as usize, r.len);
        let got = dequantize(t.ty, f.tensor_bytes(t), r.len).unwrap();
        assert_eq!(bits(&got), bits(fx.reference(r)), "{} ({})", r.name, r.ty);
        seen.insert(t.ty);
    }
    assert_eq!(seen.len(), GgmlType::ALL.len(), "every type has a fixture tensor");
    assert_no_huge_allocation();
}

/// Copies on huge pages (Q8_0 / Q4_0 / Q5_K / Q6_K / IQ4_NL / IQ4_XS / Q2_K / Q3_K in decode's packed layout, other
/// quantized types as stored; one per tensor) change no bit: every matrix
/// and expert slice of the fixture, copied or not, gives the same products.
#[test]
fn repacked_weights_give_the_same_bits() {
    let fx = Fixture::load();
    let mut plain = fx.open();
    plain.set_repack(false);
    let mut packed = fx.open();
    packed.set_repack(true);
    let x = fx.x();
    let mut any_packed = false;
    for name in [
        "t.q8_0", "t.q4_0", "t.q5_k", "t.q6_k", "t.iq4_nl", "t.iq4_xs", "t.q2_k", "t.q3_k",
    ] {
        let t = plain.tensors().iter().find(|t| t.name == name).unwrap();
        let (rows, cols) = matrix(&t.dims);
        let (a, b) = (
            plain.weight(name, rows, cols).unwrap(),
            packed.weight(name, rows, cols).unwrap(),
        );
        assert!(!a.is_packed());
        let packable = charm_common::gguf::qdot::tiled::packable(t.ty, cols);
        assert_eq!(b.is_packed(), packable, "{name}");
        any_packed |= packable;
        let (mut ya, mut yb) = (vec![0.0; rows], vec![0.0; rows]);
        a.matvec(&x[..cols], &mut ya);
        b.matvec(&x[..cols], &mut yb);
        assert_eq!(bits(&ya), bits(&yb), "{name}");
    }
    // Expert slices: Q8_0 (packed where this CPU can) and Q4_K (copied as
    // stored), through every product.
    for (name, ty, cols) in [
        ("blk.0.ffn_down_exps.weight", GgmlType::Q8_0, 256),
        ("blk.0.ffn_gate_exps.weight", GgmlType::Q4_K, 512),
    ] {
        for e in 0..3 {
            let (a, b) = (
                plain.weight_slice(name, e, 4, cols).unwrap(),
                packed.weight_slice(name, e, 4, cols).unwrap(),
            );
            assert_eq!(
                b.is_packed(),
                charm_common::gguf::qdot::tiled::packable(ty, cols),
                "{name}"
            );
            let xs: Vec<f32> = x[..cols].iter().chain(&x[..cols]).map(|v| v * 0.5).collect();
            let (mut ya, mut yb) = (vec![0.0; 8], vec![0.0; 8]);
            a.matmul(&xs, 2, &mut ya);
            b.matmul(&xs, 2, &mut yb);
            assert_eq!(bits(&ya), bits(&yb), "{name} expert {e} matmul");
            a.matvec(&xs[..cols], &mut ya[..4]);
            b.matvec(&xs[..cols], &mut yb[..4]);
            assert_eq!(bits(&ya), bits(&yb), "{name} expert {e} matvec");
            let (mut ra, mut rb) = (vec![0.0; cols], vec![0.0; cols]);
            a.row_into(3, &mut ra);
            b.row_into(3, &mut rb);
            assert_eq!(bits(&ra), bits(&rb), "{name} expert {e} row");
        }
    }
    if cfg!(target_arch = "x86_64") && charm_common::Isa::active() != charm_common::Isa::Scalar {
        assert!(any_packed, "an AVX2 CPU repacks Q8_0 / Q4_0");
    }
}

/// Every weight made counts its bytes for the loading progress bar
/// (`load_progress`: a process-wide count that only grows, so other tests
/// running beside this one can only add to it).
#[test]
fn weights_made_count_their_bytes() {
    let fx = Fixture::load();
    let f = fx.open();
    let before = charm_common::load_progress::made();
    let w = f.weight("t.q8_0", 4, 512).unwrap();
    let v = f.weight_slice("blk.0.ffn_down_exps.weight", 1, 4, 256).unwrap();
    let made = charm_common::load_progress::made() - before;
    assert!(made >= (4 * 544 + 4 * 272) as u64, "{made}");
    assert_eq!((w.data().byte_len(), v.data().byte_len()), (4 * 544, 4 * 272));
}

#[test]
fn vectors_dequantize_any_type() {
    let fx = Fixture::load();
    let f = fx.open();
    for name in ["t.norm", "t.vec_q8_0", "t.vec_bf16"] {
        let r = fx.refs.tensors.iter().find(|t| t.name == name).unwrap();
        let v = f.vector(name, r.len).unwrap();
        assert_eq!(bits(&v), bits(fx.reference(r)), "{name}");
    }
    let e = f.vector("t.norm", 511).unwrap_err();
    assert!(matches!(e, GgufError::ShapeMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("types.gguf") && e.to_string().contains("t.norm"),
        "{e}"
    );
    let e = f.vector("t.f32", 512).unwrap_err();
    assert!(matches!(e, GgufError::ShapeMismatch { .. }), "{e}");
}

#[test]
fn metadata_reads_back_exactly() {
    let f = Fixture::load().open();
    use MetaValue::*;
    let expected = [
        ("general.architecture", Str("charm-test".into())),
        ("general.alignment", U32(64)),
        ("test.u8", U8(200)),
        ("test.i8", I8(-100)),
        ("test.u16", U16(60000)),
        ("test.i16", I16(-30000)),
        ("test.u32", U32(4_000_000_000)),
        ("test.i32", I32(-2_000_000_000)),
        ("test.f32", F32(-1.15625)),
        ("test.bool", Bool(true)),
        ("test.string", Str("héllo, GGUF ✓".into())),
        ("test.u64", U64((1 << 63) + 5)),
        ("test.i64", I64(-(1 << 62) - 7)),
        ("test.f64", F64(0.1)),
        ("test.array.i32", Array(vec![I32(1), I32(-2), I32(3)])),
        (
            "test.array.str",
            Array(vec![Str("a".into()), Str("".into()), Str("ü".into())]),
        ),
        ("test.array.f32", Array(vec![F32(0.5), F32(-0.25)])),
        ("test.array.bool", Array(vec![Bool(true), Bool(false)])),
        ("test.array.u8", Array(vec![U8(0), U8(255)])),
        ("test.array.u64", Array(vec![U64(0), U64(u64::MAX)])),
        ("test.array.f64", Array(vec![F64(2.5), F64(-0.1)])),
        (
            "test.array.nested",
            Array(vec![Array(vec![I32(1), I32(2)]), Array(vec![I32(3)])]),
        ),
    ];
    let got: Vec<(&str, &MetaValue)> = f.metadata().iter().map(|(k, v)| (k.as_str(), v)).collect();
    let want: Vec<(&str, &MetaValue)> = expected.iter().map(|(k, v)| (*k, v)).collect();
    assert_eq!(got, want, "values and file order");
    for (k, v) in &expected {
        assert_eq!(f.meta(k), Some(v));
    }
    assert_eq!(f.meta("missing"), None);
    // Accessors.
    assert_eq!(f.meta("test.u8").unwrap().as_u64(), Some(200));
    assert_eq!(f.meta("test.i8").unwrap().as_i64(), Some(-100));
    assert_eq!(f.meta("test.i8").unwrap().as_u64(), None);
    assert_eq!(f.meta("test.u64").unwrap().as_i64(), None);
    assert_eq!(f.meta("test.f32").unwrap().as_f64(), Some(-1.15625));
    assert_eq!(f.meta("test.f64").unwrap().as_f64(), Some(0.1));
    assert_eq!(f.meta("test.bool").unwrap().as_bool(), Some(true));
    assert_eq!(f.meta("test.string").unwrap().as_str(), Some("héllo, GGUF ✓"));
    assert_eq!(f.meta("test.array.str").unwrap().as_array().map(|a| a.len()), Some(3));
}

#[test]
fn weights_and_expert_slices_equal_the_reference() {
    let fx = Fixture::load();
    let f = fx.open();
    let mut row = Vec::new();
    let check_rows = |w: &Weight, want: &[f32], what: &str, row: &mut Vec<f32>| {
        row.resize(w.cols(), 0.0);
        for r in 0..w.rows() {
            w.row_into(r, row);
            assert_eq!(
                bits(row),
                bits(&want[r * w.cols()..(r + 1) * w.cols()]),
                "{what} row {r}"
            );
        }
        assert_eq!(bits(&w.data().to_f32_vec()), bits(want), "{what}");
    };
    for r in fx.refs.tensors.iter().filter(|t| t.dims.len() >= 2) {
        let ty = ty_named(&r.ty);
        let want = fx.reference(r);
        let format = match ty {
            GgmlType::F32 => WeightFormat::F32,
            GgmlType::F16 => WeightFormat::F16,
            GgmlType::BF16 => WeightFormat::BF16,
            q => WeightFormat::Gguf(q),
        };
        let (rows, cols) = (r.dims[1] as usize, r.dims[0] as usize);
        if r.dims.len() == 2 {
            let w = f.weight(&r.name, rows, cols).unwrap();
            assert_eq!((w.rows(), w.cols(), w.format()), (rows, cols, format));
            check_rows(&w, want, &r.name, &mut row);
            let e = failure(f.weight(&r.name, cols, rows));
            assert!(matches!(e, GgufError::ShapeMismatch { .. }), "{e}");
        } else {
            let n = r.dims[2] as usize;
            let per = rows * cols;
            for e in 0..n {
                let w = f.weight_slice(&r.name, e, rows, cols).unwrap();
                assert_eq!(w.format(), format);
                check_rows(
                    &w,
                    &want[e * per..(e + 1) * per],
                    &format!("{} expert {e}", r.name),
                    &mut row,
                );
            }
            let e = failure(f.weight_slice(&r.name, n, rows, cols));
            assert!(matches!(e, GgufError::SliceOutOfRange { index, count, .. } if index == n && count == n as u64));
            assert!(e.to_string().contains(&r.name), "{e}");
            let e = failure(f.weight(&r.name, rows, cols));
            assert!(matches!(e, GgufError::ShapeMismatch { .. }), "{e}");
        }
    }
    // Quantized blocks are borrowed from the mapped file, not copied.
    let w = f.weight_slice("blk.0.ffn_gate_exps.weight", 2, 4, 512).unwrap();
    match w.data() {
        charm_common::WeightData::Gguf { ty, data } => {
            assert_eq!(*ty, GgmlType::Q4_K);
            assert!(data.is_mapped());
            assert_eq!(data.len(), 4 * 2 * 144);
        }
        _ => panic!("expected GGUF blocks"),
    }
    let e = failure(f.weight("no.such.tensor", 1, 1));
    assert!(matches!(e, GgufError::MissingTensor { .. }));
    assert!(e.to_string().contains("no.such.tensor") && e.to_string().contains("types.gguf"));
}

#[test]
fn dots_are_within_tolerance_of_the_f64_reference() {
    let fx = Fixture::load();
    let f = fx.open();
    for r in fx.refs.tensors.iter().filter(|t| t.dims.len() >= 2) {
        let ty = ty_named(&r.ty);
        let (rows, cols) = matrix(&r.dims);
        let x = &fx.x()[..cols];
        let t = f.tensor(&r.name).unwrap();
        let w = if r.dims.len() == 2 {
            f.weight(&r.name, rows, cols).unwrap()
        } else {
            // The whole stack as one matrix through the quantized path.
            Weight::try_new(
                rows,
                cols,
                charm_common::WeightData::Gguf {
                    ty,
                    data: charm_common::Buf::owned(f.tensor_bytes(t).to_vec()),
                },
            )
            .unwrap()
        };
        let mut out = vec![0.0; rows];
        w.matvec(x, &mut out);
        let mut seq = vec![0.0; rows];
        w.matvec_seq(x, &mut seq);
        assert_eq!(bits(&out), bits(&seq), "{}", r.name);
        let mut batched = vec![0.0; 2 * rows];
        let xs: Vec<f32> = x.iter().chain(x).copied().collect();
        w.matmul(&xs, 2, &mut batched);
        assert_eq!(bits(&batched[..rows]), bits(&out));
        assert_eq!(bits(&batched[rows..]), bits(&out));
        let row_bytes = ty.row_bytes(cols).unwrap();
        let mut worst = 0.0f64;
        for (i, hex) in r.dots.iter().enumerate() {
            let want = f64::from_bits(u64::from_str_radix(hex, 16).unwrap());
            let got = w.row_dot(i, x);
            assert_eq!(got.to_bits(), out[i].to_bits());
            let row = &f.tensor_bytes(t)[i * row_bytes..(i + 1) * row_bytes];
            let mag = dot_magnitude(ty, row, x);
            let err = (got as f64 - want).abs();
            // Quantized rows multiply 8-bit activations (gguf::qdot): each
            // activation moves by at most half its block's step.
            let act_rounding = if ty.is_quantized() {
                let w = charm_common::gguf::dequantize(ty, row, cols).unwrap();
                let a = charm_common::gguf::qdot::Q8Acts::new(x);
                w.chunks_exact(32)
                    .zip(&a.d)
                    .map(|(wb, &d)| wb.iter().map(|v| v.abs() as f64).sum::<f64>() * d as f64 / 2.0)
                    .sum::<f64>()
            } else {
                0.0
            };
            assert!(
                err <= act_rounding * 1.001 + dot_tolerance(ty) as f64 * mag + 1e-6,
                "{} ({ty}) row {i}: {got} vs f64 {want} (magnitude {mag}, activation rounding {act_rounding})",
                r.name
            );
            worst = worst.max(err / mag);
        }
        println!("OK {} {ty}: max relative error {worst:.2e}", r.name);
    }
}

// ---- Bad input -------------------------------------------------------------

/// A minimal GGUF writer for hostile files.
#[derive(Default)]
struct Build {
    version: u32,
    /// `(key, value type, value bytes)`.
    kvs: Vec<(String, u32, Vec<u8>)>,
    /// `(name, dims, type id, offset)`.
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    /// Overrides of the counts in the header.
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    data: Vec<u8>,
}

fn gstr(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s);
    v
}

impl Build {
    fn new() -> Build {
        Build {
            version: 3,
            ..Default::default()
        }
    }

    fn kv(mut self, key: &str, ty: u32, value: Vec<u8>) -> Build {
        self.kvs.push((key.into(), ty, value));
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Build {
        self.tensors.push((name.into(), dims.to_vec(), ty, offset));
        self
    }

    fn data(mut self, n: usize) -> Build {
        self.data = vec![0; n];
        self
    }

    /// The file bytes, with the data section at the next multiple of `align`.
    fn bytes_aligned(&self, align: usize) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend(self.n_tensors.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        b.extend(self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kvs {
            b.extend(gstr(k.as_bytes()));
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, ty, off) in &self.tensors {
            b.extend(gstr(name.as_bytes()));
            b.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(off.to_le_bytes());
        }
        b.resize(b.len().div_ceil(align) * align, 0);
        b.extend(&self.data);
        b
    }

    fn bytes(&self) -> Vec<u8> {
        self.bytes_aligned(32)
    }

    fn open(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes("bad.gguf", self.bytes())
    }
}

/// Opens `b`, expects an error, checks it names `bad.gguf` and every one of
/// `names`, and returns it.
fn fails(b: &Build, names: &[&str]) -> GgufError {
    let e = b.open().unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("bad.gguf: "), "{msg}");
    for n in names {
        assert!(msg.contains(n), "{msg:?} does not name {n:?}");
    }
    assert_no_huge_allocation();
    e
}

fn u32v(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

#[test]
fn a_minimal_file_opens_with_the_default_alignment() {
    // 1 x 32 Q8_0 at offset 0 and 4 f32 at offset 64 (34 bytes, padded).
    let f = Build::new()
        .kv("general.architecture", 8, gstr(b"llama"))
        .tensor("a", &[32], 8, 0)
        .tensor("b", &[4], 0, 64)
        .data(64 + 16)
        .open()
        .unwrap();
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.tensor("b").unwrap().offset, f.data_offset() + 64);
    assert_eq!(f.vector("b", 4).unwrap(), vec![0.0; 4]);
    // Version 2 reads as version 3 does.
    let mut b = Build::new().tensor("a", &[32], 8, 0).data(34);
    b.version = 2;
    assert_eq!(b.open().unwrap().version(), 2);
    // No tensors, no metadata.
    assert_eq!(Build::new().open().unwrap().tensors().len(), 0);
}

#[test]
fn bad_magic_and_versions_are_refused_by_number() {
    let mut b = Build::new().bytes();
    b[..4].copy_from_slice(b"GGML");
    let e = GgufFile::from_bytes("bad.gguf", b).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    for (v, says) in [
        (1, "version 1"),
        (4, "version 4"),
        (0, "version 0"),
        (0x0300_0000, "big-endian"),
    ] {
        let mut b = Build::new();
        b.version = v;
        let e = fails(&b, &[says]);
        assert!(matches!(e, GgufError::UnsupportedVersion { version, .. } if version == v));
    }
}

#[test]
fn truncated_files_say_where_they_end() {
    let full = Build::new()
        .kv("general.name", 8, gstr(b"tiny"))
        .tensor("blk.0.w", &[32, 2], 8, 0)
        .data(68)
        .bytes();
    for cut in [0, 3, 4, 7, 12, 23, 30, 40, 60, full.len() - 1] {
        let e = GgufFile::from_bytes("bad.gguf", full[..cut].to_vec()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("bad.gguf: "), "{msg}");
        match e {
            GgufError::Truncated { .. } | GgufError::TooLarge { .. } => {
                assert!(msg.contains("truncated") || msg.contains("more than"))
            }
            GgufError::TensorOutOfBounds { tensor, .. } => assert_eq!(tensor, "blk.0.w"),
            GgufError::BadMagic { .. } => assert!(cut < 4),
            e => panic!("cut at {cut}: {e}"),
        }
    }
    // The same through the file system (mmap path, and an empty file).
    let dir = tempfile::tempdir().unwrap();
    for cut in [0, 10, full.len() - 1] {
        let p = dir.path().join("cut.gguf");
        std::fs::write(&p, &full[..cut]).unwrap();
        let e = GgufFile::open(&p).unwrap_err();
        assert!(e.to_string().contains("cut.gguf"), "{e}");
    }
    let e = GgufFile::open(&dir.path().join("missing.gguf")).unwrap_err();
    assert!(
        matches!(e, GgufError::Io { .. }) && e.to_string().contains("missing.gguf"),
        "{e}"
    );
}

#[test]
fn tensors_past_the_end_are_named() {
    let b = Build::new()
        .tensor("blk.3.ffn_up.weight", &[32, 4], 8, 1 << 20)
        .data(4 * 34);
    let e = fails(&b, &["blk.3.ffn_up.weight", "past the end"]);
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }));
    // An offset so large that start + size overflows.
    let b = Build::new().tensor("x", &[32], 8, u64::MAX - 31).data(34);
    assert!(matches!(fails(&b, &["x"]), GgufError::TensorOutOfBounds { .. }));
    // One byte short.
    let b = Build::new().tensor("short", &[32, 4], 8, 0).data(4 * 34 - 1);
    assert!(matches!(fails(&b, &["short"]), GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn unknown_and_unsupported_types_name_the_tensor_and_id() {
    for (id, says) in [
        (99, "unknown type id 99"),
        (18, "IQ3_XXS (id 18)"),
        (16, "IQ2_XXS (id 16)"),
    ] {
        let b = Build::new().tensor("blk.0.attn_q.weight", &[256], id, 0).data(1024);
        let e = fails(&b, &["blk.0.attn_q.weight", says, "Q4_K"]);
        assert!(matches!(e, GgufError::UnsupportedType { id: got, .. } if got == id));
    }
}

#[test]
fn oversized_counts_and_lengths_fail_before_allocating() {
    let mut b = Build::new();
    b.n_tensors = Some(1 << 60);
    assert!(matches!(fails(&b, &["tensor count"]), GgufError::TooLarge { .. }));
    let mut b = Build::new();
    b.n_kv = Some(1 << 60);
    assert!(matches!(fails(&b, &["metadata"]), GgufError::TooLarge { .. }));
    // A 2^40-byte string value.
    let mut v = (1u64 << 40).to_le_bytes().to_vec();
    v.extend(b"abc");
    let b = Build::new().kv("general.name", 8, v);
    assert!(matches!(fails(&b, &["general.name"]), GgufError::TooLarge { .. }));
    // A 2^40-byte key (no padding after the header: the key follows it).
    let mut bytes = Build::new().bytes_aligned(1);
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes());
    bytes.extend((1u64 << 40).to_le_bytes());
    let e = GgufFile::from_bytes("bad.gguf", bytes).unwrap_err();
    assert!(matches!(e, GgufError::TooLarge { .. }), "{e}");
    // Arrays claiming 2^60 elements, of u8 and of strings.
    for elem in [0u32, 8, 9] {
        let mut v = elem.to_le_bytes().to_vec();
        v.extend((1u64 << 60).to_le_bytes());
        v.extend([0; 16]);
        let b = Build::new().kv("tokenizer.ggml.tokens", 9, v);
        assert!(matches!(
            fails(&b, &["tokenizer.ggml.tokens"]),
            GgufError::TooLarge { .. }
        ));
    }
    // A tensor name of 2^40 bytes.
    let mut bytes = Build::new().bytes_aligned(1);
    bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
    bytes.extend((1u64 << 40).to_le_bytes());
    bytes.extend([0; 40]);
    let e = GgufFile::from_bytes("bad.gguf", bytes).unwrap_err();
    assert!(matches!(e, GgufError::TooLarge { .. }), "{e}");
    // Dims whose product overflows, or above ggml's i64.
    let b = Build::new().tensor("big", &[1 << 40, 1 << 40], 0, 0);
    assert!(matches!(
        fails(&b, &["big", "more elements"]),
        GgufError::BadTensor { .. }
    ));
    let b = Build::new().tensor("neg", &[u64::MAX], 0, 0);
    assert!(matches!(fails(&b, &["neg", "i64"]), GgufError::BadTensor { .. }));
    // Large but representable: the size check against the file refuses it.
    let b = Build::new().tensor("huge", &[1 << 20, 1 << 20], 0, 0);
    assert!(matches!(fails(&b, &["huge"]), GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn malformed_tables_are_named() {
    let b = Build::new().tensor("w", &[32], 8, 16).data(64);
    assert!(matches!(fails(&b, &["w", "alignment 32"]), GgufError::BadTensor { .. }));
    let b = Build::new().tensor("w5", &[1, 1, 1, 1, 1], 0, 0).data(64);
    assert!(matches!(
        fails(&b, &["w5", "5 dimensions"]),
        GgufError::BadTensor { .. }
    ));
    let b = Build::new().tensor("k", &[100], 12, 0).data(1024);
    assert!(matches!(fails(&b, &["k", "Q4_K blocks"]), GgufError::BadTensor { .. }));
    let b = Build::new().tensor("d", &[4], 0, 0).tensor("d", &[4], 0, 32).data(64);
    assert!(matches!(fails(&b, &["d", "twice"]), GgufError::BadTensor { .. }));
    let b = Build::new().kv("k", 4, u32v(1)).kv("k", 4, u32v(2));
    assert!(matches!(fails(&b, &["k", "twice"]), GgufError::BadMetadata { .. }));
    let b = Build::new().kv("k", 13, u32v(1));
    assert!(matches!(
        fails(&b, &["k", "unknown value type 13"]),
        GgufError::BadMetadata { .. }
    ));
    let b = Build::new().kv("k", 7, vec![2]);
    assert!(matches!(fails(&b, &["k", "bool"]), GgufError::BadMetadata { .. }));
    let b = Build::new().kv("s", 8, gstr(&[0xff, 0xfe]));
    assert!(matches!(fails(&b, &["s", "UTF-8"]), GgufError::BadMetadata { .. }));
    // Arrays nested 9 deep.
    let mut v = Vec::new();
    for _ in 0..8 {
        v.extend(9u32.to_le_bytes());
        v.extend(1u64.to_le_bytes());
    }
    v.extend(4u32.to_le_bytes());
    v.extend(1u64.to_le_bytes());
    v.extend(7u32.to_le_bytes());
    let b = Build::new().kv("deep", 9, v.clone());
    assert!(matches!(fails(&b, &["deep", "nested"]), GgufError::BadMetadata { .. }));
    // 8 deep is fine.
    let b = Build::new().kv("deep", 9, v[12..].to_vec());
    let f = b.open().unwrap();
    let mut d = f.meta("deep").unwrap();
    for _ in 0..8 {
        d = &d.as_array().unwrap()[0];
    }
    assert_eq!(d, &MetaValue::U32(7));
}

#[test]
fn alignment_must_be_a_power_of_two() {
    for (ty, v) in [
        (4u32, u32v(48)),
        (4, u32v(0)),
        (8, gstr(b"32")),
        (5, (-32i32).to_le_bytes().to_vec()),
    ] {
        let b = Build::new()
            .kv("general.alignment", ty, v)
            .tensor("w", &[4], 0, 0)
            .data(16);
        assert!(matches!(
            fails(&b, &["general.alignment"]),
            GgufError::BadMetadata { .. }
        ));
    }
    // 16 and 1 are fine; offsets follow them.
    let b = Build::new()
        .kv("general.alignment", 4, u32v(16))
        .tensor("a", &[4], 0, 0)
        .tensor("b", &[4], 0, 16);
    let f = GgufFile::from_bytes("ok.gguf", b.data(32).bytes_aligned(16)).unwrap();
    assert_eq!(f.alignment(), 16);
    assert_eq!(f.data_offset() % 16, 0);
    let b = Build::new()
        .kv("general.alignment", 0, vec![1])
        .tensor("a", &[3], 1, 0)
        .tensor("b", &[1], 1, 6);
    let f = GgufFile::from_bytes("ok.gguf", b.data(8).bytes_aligned(1)).unwrap();
    assert_eq!(f.tensor("b").unwrap().offset, f.data_offset() + 6);
}

/// splitmix64: a seeded generator without dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Uses everything an opened file offers, as a loader would.
fn exercise(f: &GgufFile) {
    for (k, v) in f.metadata() {
        assert!(std::ptr::eq(f.meta(k).unwrap(), v), "{k}");
    }
    for t in f.tensors() {
        let bytes = f.tensor_bytes(t);
        assert_eq!(bytes.len() as u64, t.size);
        let n = t.n_elements() as usize;
        // Keep the test's own buffers small (a zero dim lets another be huge).
        if n > 1 << 16 || t.dims.iter().any(|&d| d > 1 << 16) {
            continue;
        }
        let v = dequantize(t.ty, bytes, n).unwrap();
        if t.dims.len() <= 1 {
            assert_eq!(f.vector(&t.name, n).unwrap().len(), n);
        } else if let Ok(w) = f.weight_slice(&t.name, 0, t.dims[1] as usize, t.dims[0] as usize) {
            let mut out = vec![0.0; w.rows()];
            w.matvec(&vec![1.0; w.cols()], &mut out);
            let mut row = vec![0.0; w.cols()];
            if w.rows() > 0 {
                w.row_into(0, &mut row);
                // Equal, except that F16 weights (the plain `WeightData::F16`,
                // converted by the `half` crate) quiet a NaN's payload.
                let same = |a: &f32, b: &f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                assert!(row.iter().zip(&v[..w.cols()]).all(|(a, b)| same(a, b)), "{}", t.name);
            }
        }
    }
}

#[test]
fn random_mutations_never_panic() {
    let fx = Fixture::load();
    let original = std::fs::read(&fx.path).unwrap();
    // Header, metadata and tensor table: where the mutations matter most.
    let header_end = fx.open().data_offset() as usize;
    let mut rng = Rng(0x5eed_6775_f00d);
    let (mut ok, mut err) = (0, 0);
    let iterations = 20_000;
    for i in 0..iterations {
        let mut b = original.clone();
        let len = b.len();
        let in_header = |rng: &mut Rng| {
            if rng.below(4) == 0 {
                rng.below(len)
            } else {
                rng.below(header_end)
            }
        };
        let at = in_header(&mut rng);
        match rng.below(6) {
            // Flip 1..8 bits.
            0 => {
                for _ in 0..1 + rng.below(8) {
                    let at = in_header(&mut rng);
                    b[at] ^= 1 << rng.below(8);
                }
            }
            // Truncate.
            1 => b.truncate(rng.below(b.len())),
            // A random 8-byte word (a count, length, dim or offset).
            2 => {
                let v = match rng.below(4) {
                    0 => u64::MAX,
                    1 => 1 << rng.below(64),
                    2 => rng.next(),
                    _ => rng.next() % 1024,
                };
                let end = (at + 8).min(b.len());
                b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            // A random 4-byte word (a type, n_dims).
            3 => {
                let v = (rng.next() % 40) as u32;
                let end = (at + 4).min(b.len());
                b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            // Garble a run of bytes.
            4 => {
                let end = (at + 1 + rng.below(64)).min(b.len());
                for v in &mut b[at..end] {
                    *v = rng.next() as u8;
                }
            }
            // Delete or duplicate a run of bytes.
            _ => {
                let end = (at + 1 + rng.below(32)).min(b.len());
                if rng.below(2) == 0 {
                    b.drain(at..end);
                } else {
                    let run = b[at..end].to_vec();
                    b.splice(at..at, run);
                }
            }
        }
        let result = std::panic::catch_unwind(|| match GgufFile::from_bytes("mutant.gguf", b) {
            Ok(f) => {
                exercise(&f);
                true
            }
            Err(e) => {
                assert!(e.to_string().starts_with("mutant.gguf: "), "{e}");
                false
            }
        });
        match result {
            Ok(true) => ok += 1,
            Ok(false) => err += 1,
            Err(_) => panic!("mutation {i} panicked"),
        }
    }
    println!("{iterations} mutations: {ok} opened, {err} refused");
    assert!(
        err > iterations / 4,
        "most mutations of the header should be refused ({err})"
    );
    assert_no_huge_allocation();
}
