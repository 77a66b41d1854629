//! The version of charm's arithmetic: which bits its kernels compute.
//!
//! DESIGN.md's one rule (placement decides speed, never semantics) holds
//! between machines running the same kernels; every instruction set of one
//! build gives the same bits. Two builds whose kernels round differently
//! (a new term order, a new `exp`) would give the same expert different
//! bits on two workers, or let a restarted server continue from a prefix
//! an older build computed. So the number below is bumped with every
//! change to the bits any kernel returns, and it travels:
//! - in a worker's `Hello`: a coordinator refuses a worker whose
//!   arithmetic is not its own, naming both;
//! - in the prefix cache's model fingerprint: a persisted prefix of
//!   another arithmetic is never read.
//!
//! History:
//! - 1: before `fd9bb9f` (the C library's `expf`).
//! - 2: `fd9bb9f`, `kernels::exp` for SiLU, sigmoid and every softmax.
//! - 3: Q4_K, Q5_K and IQ4_XS terms with the exact `d · sc`, `dmin · mn`,
//!   `d · (ls - 32)` formed first (`gguf::qdot`'s definition table).

/// The arithmetic this build computes with (see the module docs).
pub const ARITHMETIC: u32 = 3;
