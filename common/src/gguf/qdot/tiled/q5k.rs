//! Q5_K rows packed at load: Q4_K's packing ([`super::q4k`]) with the
//! fifth bits in one more register, so prefill meets a packed row with no
//! arranging and decode needs no horizontal fold. The same bits as
//! [`crate::gguf::qdot::dot`] (its Q5_K term, Q4_K's), in the GGUF's 176
//! bytes per super-block:
//!
//! | bytes | content |
//! |---|---|
//! | `0..128` | four steps `j` of nibble bytes: byte `32j + 4b + k` holds the low four bits of element `4j + k` of sub-block `b` (low nibble) and of element `16 + 4j + k` (high nibble) |
//! | `128..160` | bit `s` of byte `128 + 4b + k`: bit 4 of element `4s + k` of sub-block `b` (step `s`) |
//! | `160..172` | the twelve bytes of 6-bit scales and mins, as stored |
//! | `172..174`, `174..176` | the f16 `d` and `dmin` |
//!
//! From byte 32 on, a block reads as a packed Q4_K one for its scales
//! ([`super::q4k::scales`] at `p + 32`).

/// Bytes of one packed (and one GGUF) Q5_K super-block.
pub const BLOCK: usize = 176;

/// One super-block (`src`: its GGUF bytes) in the packed layout: the
/// nibbles as Q4_K's ([`super::q4k::nibble_steps`], `qs` from byte 48),
/// and sub-block `b`'s element `l`'s fifth bit, bit `b` of `qh[l]` (`qh`
/// at 16..48), gathered byte-wise with fixed offsets.
///
/// # Panics
/// If `src` or `dst` is shorter than [`BLOCK`].
pub fn pack_block(src: &[u8], dst: &mut [u8]) {
    let (src, dst): (&[u8; BLOCK], &mut [u8; BLOCK]) = (
        src[..BLOCK].try_into().expect("a whole super-block"),
        (&mut dst[..BLOCK]).try_into().expect("a whole super-block"),
    );
    super::q4k::nibble_steps(src[48..176].try_into().expect("128 nibble bytes"), &mut dst[..128]);
    let qh: &[u8; 32] = src[16..48].try_into().expect("32 fifth-bit bytes");
    for b in 0..8 {
        // Bit `s` of byte `128 + 4b + k`: the fifth bit of element `4s + k`.
        for k in 0..4 {
            dst[128 + 4 * b + k] = (0..8).fold(0u8, |v, s| v | (((qh[4 * s + k] >> b) & 1) << s));
        }
    }
    dst[160..172].copy_from_slice(&src[4..16]);
    dst[172..176].copy_from_slice(&src[0..4]);
}
