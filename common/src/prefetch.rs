//! Software prefetch for the loops that stream weights from memory.
//!
//! Decode reads every weight byte once per token, so it runs at the speed
//! memory delivers bytes to a core. A core's hardware prefetchers follow a
//! stream only within a 4 KiB page and only as far ahead as the loop's own
//! loads let them; a dot-product loop issues fewer loads per cycle than a
//! plain read, so it keeps fewer lines in flight and streams slower than
//! the memory could serve it. Asking for the line [`DISTANCE`] bytes ahead
//! of the one being read closes most of that gap (measured by
//! `common/examples/bench_stream.rs`; numbers in docs/kernels.md).
//!
//! A prefetch is a hint: it never faults, whatever the address, and never
//! changes a result. On other architectures [`ahead`] does nothing (the
//! NEON kernels have not been measured with it).

use std::sync::OnceLock;

/// Bytes ahead of the current read that a streaming loop asks for, unless
/// `CHARM_PREFETCH` says otherwise: far enough to cover memory latency at
/// one core's streaming rate, near enough that the line is still in L1
/// when the loop gets there (4 KiB and more measured slower than none).
pub const DISTANCE: usize = 2048;

/// The distance the kernels use: [`DISTANCE`], or the byte count in the
/// environment variable `CHARM_PREFETCH` (`0` turns prefetching off; for
/// measuring it on other machines — an unreadable value is ignored, as
/// `CHARM_ISA`'s is). Read once; a kernel call reads it once, not per
/// line.
pub fn distance() -> usize {
    static DIST: OnceLock<usize> = OnceLock::new();
    *DIST.get_or_init(|| parse_distance(std::env::var("CHARM_PREFETCH").ok().as_deref()))
}

/// `CHARM_PREFETCH`'s value as a distance: a byte count, else [`DISTANCE`].
fn parse_distance(value: Option<&str>) -> usize {
    value.and_then(|v| v.trim().parse().ok()).unwrap_or(DISTANCE)
}

/// Asks for the cache line `dist` bytes after `p` (`dist` from
/// [`distance`]; 0: nothing). Any address is fine: nothing is read.
#[inline(always)]
pub fn ahead<T>(p: *const T, dist: usize) {
    #[cfg(target_arch = "x86_64")]
    if dist > 0 {
        // SAFETY: PREFETCHT0 is SSE (part of x86-64's baseline); it never
        // faults, and the address is only computed, never dereferenced.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>((p as *const i8).wrapping_add(dist));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, dist);
}

/// Asks for every cache line of the `len` bytes at `p` into L2 (not L1): a
/// matrix product's next tile, wanted while the current one is computed
/// many times over from L1 and L2. Nothing when [`distance`] is 0 (prefetch
/// turned off). Any address is fine: nothing is read.
#[inline(always)]
pub fn span_to_l2<T>(p: *const T, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if distance() > 0 {
        let p = p as *const i8;
        let mut off = 0;
        while off < len {
            // SAFETY: PREFETCHT1 is SSE (x86-64's baseline); it never
            // faults, and the address is only computed, never dereferenced.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off));
            }
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// [`span_to_l2`] a slice at a time: `parts` equal slices of one span
/// (whole lines, the last slice shorter or empty), their size reckoned
/// once, for a tile's prefetch of the next tile spread over the loop steps
/// that use the current one. Asked for all at once, a span of hundreds of
/// lines queues behind the core's few outstanding misses and the loop
/// waits with it (a 4-row Q6_K output head ran at half the speed of its
/// bytes and its multiplies side by side); a slice per step keeps both
/// going.
#[derive(Clone, Copy)]
pub struct Slices {
    p: *const u8,
    len: usize,
    part: usize,
}

impl Slices {
    /// `parts` slices of the `len` bytes at `p`.
    pub fn new<T>(p: *const T, len: usize, parts: usize) -> Self {
        Slices {
            p: p as *const u8,
            len,
            part: len.div_ceil(parts.max(1)).next_multiple_of(64),
        }
    }

    /// [`span_to_l2`] of slice `i`.
    #[inline(always)]
    pub fn to_l2(self, i: usize) {
        let lo = i.saturating_mul(self.part).min(self.len);
        span_to_l2(self.p.wrapping_add(lo), self.part.min(self.len - lo));
    }
}

/// [`ahead`] for every cache line of the `len` bytes at `p`: a loop step
/// that reads more than one line (a chunk of quantized blocks).
#[inline(always)]
pub fn ahead_span<T>(p: *const T, len: usize, dist: usize) {
    let p = p as *const u8;
    let mut off = 0;
    while off < len {
        ahead(p.wrapping_add(off), dist);
        off += 64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_address_is_only_a_hint() {
        // Null, the end of a slice and the top of the address space: no fault.
        let v = [1u8; 100];
        for p in [
            std::ptr::null(),
            v.as_ptr().wrapping_add(v.len()),
            usize::MAX as *const u8,
        ] {
            ahead(p, DISTANCE);
            ahead_span(p, 300, DISTANCE);
            ahead_span(p, 300, 0);
            for i in 0..4 {
                Slices::new(p, 300, 3).to_l2(i);
            }
            Slices::new(p, 300, 0).to_l2(0);
        }
        assert_eq!(v, [1u8; 100]);
    }

    #[test]
    fn the_environment_sets_the_distance_or_leaves_the_default() {
        assert_eq!(parse_distance(None), DISTANCE);
        assert_eq!(parse_distance(Some("0")), 0);
        assert_eq!(parse_distance(Some(" 1024 ")), 1024);
        assert_eq!(parse_distance(Some("lots")), DISTANCE);
        assert_eq!(parse_distance(Some("-64")), DISTANCE);
    }
}
