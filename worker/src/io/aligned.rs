//! [`AlignedBuf`]: a zeroed heap buffer whose start is 4096-byte aligned and
//! whose capacity is a whole number of 4096-byte blocks, as `O_DIRECT` reads
//! need.
//!
//! Buffers of a megabyte or more (expert records) are anonymous mappings:
//! a cold run fills its expert cache with fresh memory, and the allocator's
//! zeroed aligned blocks were a user-space memset over pages the kernel
//! faults in zeroed anyway, run on the io_uring thread that submits every
//! read, so reads waited behind it. A
//! mapping comes zeroed from the kernel and is faulted in by the read
//! itself. Measured on the 48-layer Qwen3-30B-A3B-shaped bench inside an
//! 8 GiB limit (`docs/benchmarks.md`), cold prefill went from 6.0 to 9.1
//! tok/s (medians of 4 rotated rounds). Huge pages for these mappings
//! (`MADV_HUGEPAGE`) were slower there (6.8), probably the synchronous
//! compaction that the kernel's `defrag=madvise` asks of such faults.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The alignment (and capacity granule) of every [`AlignedBuf`]: the largest
/// logical block size `O_DIRECT` asks for on common devices.
pub const ALIGN: usize = 4096;

/// Buffers at least this large are mapped (see the module docs) and
/// recycled instead of freed.
const RECYCLE_MIN: usize = 1 << 20;
/// Most bytes kept for recycling; beyond this, dropped buffers are freed.
const POOL_MAX_BYTES: usize = 256 << 20;

/// Free allocations kept for [`AlignedBuf::for_read`]: `(address, capacity)`.
struct Pool {
    free: Vec<(usize, usize)>,
    bytes: usize,
}

static POOL: std::sync::Mutex<Pool> = std::sync::Mutex::new(Pool {
    free: Vec::new(),
    bytes: 0,
});

/// A 4096-byte-aligned, zero-initialised heap buffer (`O_DIRECT` needs
/// aligned memory).
///
/// `len()` is the number of valid bytes; the allocation behind it is rounded
/// up to a multiple of 4096 (a zero-length buffer allocates nothing).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: an `AlignedBuf` uniquely owns its allocation, exactly like a
// `Vec<u8>`: moving it to another thread moves that ownership, and `&self`
// only hands out `&[u8]`.
unsafe impl Send for AlignedBuf {}
// SAFETY: see `Send`; shared references only allow reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `len` zero bytes whose capacity is `len` rounded up to a
    /// multiple of 4096.
    ///
    /// # Panics
    /// If the rounded capacity overflows `isize` (as `Vec` does); aborts via
    /// [`alloc::handle_alloc_error`] when the allocator fails.
    pub fn new_zeroed(len: usize) -> AlignedBuf {
        let cap = len
            .checked_next_multiple_of(ALIGN)
            .expect("AlignedBuf capacity overflow");
        if cap == 0 {
            // A zero-length slice may point anywhere non-null and aligned
            // for `u8`; nothing is allocated or freed.
            return AlignedBuf {
                ptr: NonNull::dangling(),
                len: 0,
                cap: 0,
            };
        }
        let layout = Self::layout(cap);
        if cap >= RECYCLE_MIN {
            if let Some(ptr) = map_zeroed(cap) {
                return AlignedBuf { ptr, len, cap };
            }
            alloc::handle_alloc_error(layout)
        }
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len, cap }
    }

    /// A buffer of `len` bytes for a read to fill: a recycled allocation
    /// of the same capacity when one is free (its bytes are whatever the
    /// previous read left, all initialised), else a fresh zeroed one.
    /// Recycling spares the page faults, zeroing and unmapping that a fresh
    /// multi-megabyte allocation per expert read costs.
    pub fn for_read(len: usize) -> AlignedBuf {
        let cap = len
            .checked_next_multiple_of(ALIGN)
            .expect("AlignedBuf capacity overflow");
        if cap >= RECYCLE_MIN {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = pool.free.iter().position(|&(_, c)| c == cap) {
                let (addr, _) = pool.free.swap_remove(i);
                pool.bytes -= cap;
                // SAFETY: `addr` came from a dropped `AlignedBuf` of capacity
                // `cap` (non-null, allocated with `layout(cap)`, every byte
                // initialised), whose ownership the pool took over.
                let ptr = unsafe { NonNull::new_unchecked(addr as *mut u8) };
                return AlignedBuf { ptr, len, cap };
            }
        }
        Self::new_zeroed(len)
    }

    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap, ALIGN).expect("AlignedBuf capacity overflow")
    }

    /// Number of valid bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of the allocation: `len()` rounded up to a multiple of 4096.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The valid bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` initialised (zeroed or
        // written) bytes, or dangling with `len == 0`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The valid bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Start of the allocation, for handing to the kernel. The pointer stays
    /// valid (it does not move when the `AlignedBuf` value moves) until the
    /// buffer is dropped; it is dangling when the capacity is 0.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap >= RECYCLE_MIN {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            if pool.bytes + self.cap <= POOL_MAX_BYTES {
                pool.bytes += self.cap;
                pool.free.push((self.ptr.as_ptr() as usize, self.cap));
                return;
            }
        }
        if self.cap >= RECYCLE_MIN {
            unmap(self.ptr, self.cap);
        } else if self.cap != 0 {
            // SAFETY: allocated in `new_zeroed` with exactly this layout
            // (recycled buffers keep their original capacity and layout).
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
        }
    }
}

/// `cap` zero bytes (a multiple of 4096) in a fresh anonymous mapping
/// (page-aligned, so 4096-aligned); `None` when the OS refuses the memory.
#[cfg(unix)]
fn map_zeroed(cap: usize) -> Option<NonNull<u8>> {
    // SAFETY: a new private anonymous mapping; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            cap,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(raw.cast())
}

#[cfg(unix)]
fn unmap(ptr: NonNull<u8>, cap: usize) {
    // SAFETY: `ptr..ptr + cap` is exactly a mapping made by `map_zeroed`,
    // owned by the buffer being dropped.
    unsafe {
        libc::munmap(ptr.as_ptr().cast(), cap);
    }
}

/// Without `mmap`: the allocator, zeroed.
#[cfg(not(unix))]
fn map_zeroed(cap: usize) -> Option<NonNull<u8>> {
    // SAFETY: `cap` is non-zero.
    NonNull::new(unsafe { alloc::alloc_zeroed(AlignedBuf::layout(cap)) })
}

#[cfg(not(unix))]
fn unmap(ptr: NonNull<u8>, cap: usize) {
    // SAFETY: allocated by `map_zeroed` with this layout.
    unsafe { alloc::dealloc(ptr.as_ptr(), AlignedBuf::layout(cap)) }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn large_read_buffers_are_recycled_not_refaulted() {
        // An unusual capacity so other tests cannot take it from the pool.
        let len = (3 << 20) + 7 * 4096 + 5;
        let mut a = AlignedBuf::for_read(len);
        a.as_mut_slice()[len - 1] = 42;
        let addr = a.as_mut_ptr() as usize;
        drop(a);
        let mut b = AlignedBuf::for_read(len);
        assert_eq!(b.as_mut_ptr() as usize, addr, "the freed allocation is reused");
        assert_eq!(b.len(), len);
        assert_eq!(b.as_slice()[len - 1], 42, "recycled bytes are the previous read's");
        // Small buffers are simply freed.
        let small = AlignedBuf::for_read(4096);
        assert_eq!(small.len(), 4096);
    }
    use super::*;

    #[test]
    fn zero_length_allocates_nothing() {
        let mut b = AlignedBuf::new_zeroed(0);
        assert_eq!(b.len(), 0);
        assert_eq!(b.capacity(), 0);
        assert!(b.is_empty());
        assert!(b.as_slice().is_empty());
        assert!(b.as_mut_slice().is_empty());
    }

    #[test]
    fn capacity_rounds_up_and_start_is_aligned() {
        for (len, cap) in [(1, 4096), (4095, 4096), (4096, 4096), (4097, 8192), (3 << 20, 3 << 20)] {
            let mut b = AlignedBuf::new_zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.capacity(), cap);
            assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
            assert!(b.iter().all(|&x| x == 0));
            b.as_mut_slice()[len - 1] = 7;
            assert_eq!(b[len - 1], 7);
        }
    }

    #[test]
    fn large_buffers_are_zeroed_aligned_mappings() {
        // An unusual capacity so the pool holds none of it.
        let len = (5 << 20) + 3 * 4096 + 11;
        let mut b = AlignedBuf::new_zeroed(len);
        assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
        assert_eq!(b.capacity(), len.next_multiple_of(ALIGN));
        assert!(b.iter().all(|&x| x == 0));
        b.as_mut_slice()[0] = 1;
        b.as_mut_slice()[len - 1] = 2;
        assert_eq!((b[0], b[len - 1]), (1, 2));
        // Dropped into the pool, then taken back by a read of that size.
        let addr = b.as_mut_ptr() as usize;
        drop(b);
        let mut again = AlignedBuf::for_read(len);
        assert_eq!(again.as_mut_ptr() as usize, addr);
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<AlignedBuf>();
    }
}
