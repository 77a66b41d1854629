//! The decoder under random and mutated input, on stable Rust (the
//! `fuzz/` cargo-fuzz target covers the same decoder under libFuzzer on
//! nightly).
//!
//! For `CHARM_FUZZ_ITERS` inputs (default 300,000; CI runs the default) —
//! random byte strings, valid frames of every message with bits flipped,
//! bytes overwritten, lengths rewritten, truncated, extended and spliced —
//! the decoder must:
//! - never panic (every input is decoded in a loop, as a stream would be);
//! - when it accepts a frame, accept exactly what it re-encodes;
//! - allocate at most `2 MiB + 64 × input length` at its peak, measured by
//!   a counting global allocator: serde pre-allocates at most 1 MiB for a
//!   list whatever length it claims, lists nest at most two deep in our
//!   messages, and the slice decoder cannot read past the payload.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use charm_proto::frame::{decode, encode, FrameError, HEADER_LEN};
use charm_proto::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Counts live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const LIMIT: u32 = 1 << 20;

fn samples(rng: &mut ChaCha8Rng) -> Vec<Message> {
    let hidden = rng.gen_range(1..6u32);
    let n_rows = rng.gen_range(1..4usize);
    let rows: Vec<f32> = (0..n_rows * hidden as usize).map(|_| rng.gen()).collect();
    let groups: Vec<ExpertGroup> = (0..rng.gen_range(0..4u32))
        .map(|i| {
            let rs: Vec<u32> = (0..n_rows as u32).filter(|_| rng.gen()).collect();
            ExpertGroup {
                expert: i * 3,
                weights: rs.iter().map(|_| rng.gen()).collect(),
                rows: rs,
            }
        })
        .collect();
    let outputs = ExpertOutputs {
        layer: 2,
        groups: groups
            .iter()
            .map(|g| GroupOutput {
                expert: g.expert,
                out: vec![1.5; g.rows.len() * hidden as usize],
            })
            .collect(),
    };
    vec![
        Message::Auth(Auth {
            role: Role::Coordinator,
            proof: [rng.gen(); charm_proto::wire::PROOF_LEN],
            fingerprint: "f00d".into(),
        }),
        Message::Hello(Hello {
            software: "charm-worker test".into(),
            arithmetic: 2,
            fingerprint: "f00d".into(),
            num_layers: 4,
            num_experts: 16,
            hidden,
            holdings: Holdings::from_experts([(0, 1), (0, 2), (3, 15), (2, 0)]),
            format: "safetensors bf16".into(),
            expert_bytes: 1234,
            cache_bytes: 99,
            disk_bytes_per_s: 1e9,
            expert_rows_per_s: 1e5,
            max_frame: LIMIT,
            stats: WorkerStats::default(),
        }),
        Message::RunExperts(RunExperts {
            step: rng.gen(),
            batch: ExpertBatch {
                layer: 2,
                hidden,
                rows,
                groups,
                next: Some(PrefetchHint {
                    layer: 3,
                    experts: vec![1, 4, 9],
                }),
            },
        }),
        Message::ExpertsOut(ExpertsOut {
            step: 1,
            outputs,
            worker_ms: 0.25,
        }),
        Message::Prefetch(Prefetch {
            layer: 1,
            hint: PrefetchHint {
                layer: 2,
                experts: vec![0, 7],
            },
        }),
        Message::EndRequest,
        Message::Stats(WorkerStats {
            requests: 9,
            experts_served: 30,
            io_wait_ms: 0.5,
            ..Default::default()
        }),
        Message::Error(WireError {
            kind: ErrorKind::Malformed,
            message: "bad frame".into(),
        }),
    ]
}

fn mutate(rng: &mut ChaCha8Rng, frame: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = frame.to_vec();
    for _ in 0..rng.gen_range(1..4) {
        match rng.gen_range(0..7) {
            0 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                b[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                b[i] = rng.gen();
            }
            2 if b.len() >= HEADER_LEN => {
                // Rewrite the announced length (small, near, or huge).
                let len: u32 = match rng.gen_range(0..3) {
                    0 => rng.gen_range(0..64),
                    1 => (b.len() - HEADER_LEN) as u32 ^ rng.gen_range(1..16),
                    _ => rng.gen(),
                };
                b[8..12].copy_from_slice(&len.to_le_bytes());
            }
            3 => {
                let keep = rng.gen_range(0..=b.len());
                b.truncate(keep);
            }
            4 => b.extend((0..rng.gen_range(1..32)).map(|_| rng.gen::<u8>())),
            5 => b.extend_from_slice(other),
            _ if b.len() > HEADER_LEN => {
                // Overwrite a payload byte with a large varint marker.
                let i = rng.gen_range(HEADER_LEN..b.len());
                b[i] = [251, 252, 253, 0xff][rng.gen_range(0..4)];
            }
            _ => {}
        }
    }
    b
}

/// Decodes `input` as a stream of frames until it ends or an error stops it.
/// Returns the peak extra bytes allocated.
fn decode_stream(input: &[u8]) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let mut rest = input;
    loop {
        match decode(rest, LIMIT) {
            Ok((msg, used)) => {
                assert!(used >= HEADER_LEN && used <= rest.len());
                // What was accepted re-encodes to something accepted as equal.
                let again = encode(&msg).expect("an accepted message encodes");
                let (back, _) = decode(&again, LIMIT).expect("a re-encoded message decodes");
                // Bytes, not values: a NaN activation is legal and NaN != NaN.
                assert_eq!(encode(&back).unwrap(), again);
                rest = &rest[used..];
            }
            Err(FrameError::Incomplete { .. }) => break,
            Err(e) => {
                // Every error has a message for the log line.
                assert!(!e.to_string().is_empty());
                break;
            }
        }
    }
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

#[test]
fn decoder_survives_random_and_mutated_frames_with_bounded_memory() {
    let iters: usize = std::env::var("CHARM_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let mut rng = ChaCha8Rng::seed_from_u64(0xc4a12);
    let mut accepted = 0usize;
    let mut worst_peak = 0usize;
    for i in 0..iters {
        let input: Vec<u8> = if i % 4 == 0 {
            let len = rng.gen_range(0..512);
            let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if rng.gen_bool(0.5) && b.len() >= 8 {
                // A plausible header in front of random bytes.
                b[0..4].copy_from_slice(b"CHRM");
                b[4] = 1;
                b[5] = 0;
                b[6] = rng.gen_range(0..10);
                b[7] = 0;
            }
            b
        } else {
            let msgs = samples(&mut rng);
            let a = encode(&msgs[rng.gen_range(0..msgs.len())]).unwrap();
            let b = encode(&msgs[rng.gen_range(0..msgs.len())]).unwrap();
            if i % 4 == 1 {
                // Unmutated frames back to back must all decode.
                let mut both = a.clone();
                both.extend_from_slice(&b);
                let (_, used) = decode(&both, LIMIT).unwrap();
                assert_eq!(used, a.len());
                accepted += 1;
            }
            mutate(&mut rng, &a, &b)
        };
        let peak = decode_stream(&input);
        let bound = (2 << 20) + 64 * input.len();
        assert!(
            peak <= bound,
            "decoding {} bytes allocated {peak} bytes at peak (bound {bound}): {:02x?}",
            input.len(),
            &input[..input.len().min(64)]
        );
        worst_peak = worst_peak.max(peak);
    }
    assert!(accepted > 0);
    eprintln!("{iters} inputs decoded; largest peak allocation {worst_peak} bytes");
}
