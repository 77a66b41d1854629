//! How many bytes of model weights this process has made into [`Weight`]s
//! so far, for a loading progress bar: the GGUF reader (mapped, copied or
//! repacked) and the safetensors reader add each matrix's bytes as they
//! make it. A count only; nothing reads it to decide anything.
//!
//! [`Weight`]: crate::Weight

use std::sync::atomic::{AtomicU64, Ordering};

static MADE: AtomicU64 = AtomicU64::new(0);

/// Counts `bytes` of a weight just made.
pub fn add(bytes: u64) {
    MADE.fetch_add(bytes, Ordering::Relaxed);
}

/// Bytes of weights made since the process started (it only grows).
pub fn made() -> u64 {
    MADE.load(Ordering::Relaxed)
}
