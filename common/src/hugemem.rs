//! Read-only memory filled once, backed by transparent huge pages where
//! the OS has them: for copies of weights the decode loop streams (the
//! repacked Q8_0 / Q4_0 / Q6_K rows).
//!
//! A decoded token reads hundreds of megabytes spread over the experts it
//! chose. On 4 KiB pages every page is a TLB miss and a place where the
//! hardware prefetcher stops; on 2 MiB pages both go away (decode of the
//! Q4_0 benchmark model: +9 %, docs/benchmarks.md). Anonymous memory gets
//! huge pages only where a 2 MiB-aligned range lies inside the mapping, so
//! the buffer starts at such an address (the unused head is never touched
//! and costs no memory), and the mapping reaches the next such address
//! after its end, so its last partial 2 MiB is a huge page too (at most
//! 2 MiB of memory more per buffer: a 2048 × 2048 Q4_0 projection, 2.4
//! MB, otherwise has its last 0.4 MB on 4 KiB pages; `bench_stream`'s
//! `own copies` line, many such copies one after another, read 16.9 GB/s
//! without this and 19.1 with it, docs/kernels.md).

use std::io;

use memmap2::{Mmap, MmapOptions};

use crate::weight::ByteSource;

/// Huge-page size the buffer aligns to.
const HUGE: usize = 2 << 20;

/// `len` bytes of read-only anonymous memory, starting 2 MiB aligned.
pub struct HugeBuf {
    map: Mmap,
    start: usize,
    len: usize,
}

impl HugeBuf {
    /// Maps `len` bytes, advises huge pages (Linux), lets `fill` write
    /// them, then makes them read-only.
    ///
    /// # Errors
    /// When the OS refuses the mapping (address space or memory limits).
    pub fn filled(len: usize, fill: impl FnOnce(&mut [u8])) -> io::Result<Self> {
        let whole = len.max(1).next_multiple_of(HUGE);
        let mut map = MmapOptions::new().len(whole + HUGE).map_anon()?;
        let start = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
        #[cfg(target_os = "linux")]
        {
            // Only advice: without THP the buffer is simply on small pages.
            let _ = map.advise_range(memmap2::Advice::HugePage, start, whole);
        }
        fill(&mut map[start..start + len]);
        Ok(HugeBuf {
            map: map.make_read_only()?,
            start,
            len,
        })
    }
}

impl ByteSource for HugeBuf {
    fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_fill_wrote_from_an_aligned_start() {
        let b = HugeBuf::filled(3 * HUGE + 5, |m| {
            for (i, v) in m.iter_mut().enumerate() {
                *v = (i % 251) as u8;
            }
        })
        .unwrap();
        let bytes = b.bytes();
        assert_eq!(bytes.len(), 3 * HUGE + 5);
        assert_eq!(bytes.as_ptr() as usize % HUGE, 0);
        assert!(bytes.iter().enumerate().all(|(i, &v)| v == (i % 251) as u8));
        assert!(HugeBuf::filled(0, |m| assert!(m.is_empty()))
            .unwrap()
            .bytes()
            .is_empty());
    }
}
