//! x86 kernels of [`super`]: arranging, packing and the chunk loops (AVX2
//! and AVX-512 VNNI).

use std::arch::x86_64::*;

use super::{ArrangedRow, GgmlType, Q8Acts, CHUNK};

/// Dwords `j` of four 128-bit rows per 128-bit half: `out[j]` lane `b`
/// (of 4) is dword `j` of row `b`.
#[inline(always)]
unsafe fn transpose4(v: [__m256i; 4]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// Blocks `b` and `b + 4`'s 16 bytes at `off` as one register.
#[inline(always)]
unsafe fn pair(src: *const u8, stride: usize, b: usize, off: usize) -> __m256i {
    // SAFETY: the caller's pointer covers eight blocks of `stride` bytes.
    unsafe {
        let lo = _mm_loadu_si128(src.add(b * stride + off) as *const __m128i);
        let hi = _mm_loadu_si128(src.add((b + 4) * stride + off) as *const __m128i);
        _mm256_set_m128i(hi, lo)
    }
}

/// A Q4_0 chunk's packed code bytes transposed (`src` at its first block):
/// step `j` holds bytes `4j..4j + 4` of each block's 16, lane `b` for block
/// `b`.
#[inline(always)]
unsafe fn q4_steps(src: *const u8, bs: usize) -> [__m256i; 4] {
    // SAFETY: the caller's pointer covers a chunk of eight blocks.
    unsafe {
        transpose4([
            pair(src, bs, 0, 2),
            pair(src, bs, 1, 2),
            pair(src, bs, 2, 2),
            pair(src, bs, 3, 2),
        ])
    }
}

/// The chunk transposition of eight 32-byte code blocks `stride` bytes
/// apart (`src` at the first code), into 256 bytes at `dst`, each byte
/// xor 0x80 when `flip`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose32(src: *const u8, stride: usize, dst: *mut u8, flip: bool) {
    // SAFETY: the caller's pointers cover eight blocks and 256 bytes.
    unsafe {
        let x = _mm256_set1_epi8(if flip { -128 } else { 0 });
        for h in 0..2 {
            let v = [
                pair(src, stride, 0, 16 * h),
                pair(src, stride, 1, 16 * h),
                pair(src, stride, 2, 16 * h),
                pair(src, stride, 3, 16 * h),
            ];
            let o = transpose4(v);
            for (j, o) in o.into_iter().enumerate() {
                _mm256_storeu_si256(dst.add(32 * (4 * h + j)) as *mut __m256i, _mm256_xor_si256(o, x));
            }
        }
    }
}

/// [`super::arrange_row_on`]'s layout: codes (Q4_0 unpacked, Q8_0's
/// flipped by 128 when `offset`) and widened scales.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn arrange(ty: GgmlType, row: &[u8], offset: bool, codes: &mut [u8], d: &mut [f32]) {
    let bs = ty.block_bytes();
    let low4 = _mm256_set1_epi8(0x0f);
    // SAFETY: `row` holds `codes.len() / 256` chunks of eight blocks of
    // `ty`; `codes` one byte per element and `d` one float per block.
    unsafe {
        for c in 0..codes.len() / CHUNK {
            let src = row.as_ptr().add(c * 8 * bs);
            let dst = codes.as_mut_ptr().add(c * CHUNK);
            let h = |b: usize| (src.add(b * bs) as *const i16).read_unaligned();
            let scales = _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
            _mm256_storeu_ps(d.as_mut_ptr().add(8 * c), scales);
            if ty == GgmlType::Q4_0 {
                for (j, o) in q4_steps(src, bs).into_iter().enumerate() {
                    let lo = _mm256_and_si256(o, low4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(o, 4), low4);
                    _mm256_storeu_si256(dst.add(32 * j) as *mut __m256i, lo);
                    _mm256_storeu_si256(dst.add(32 * (4 + j)) as *mut __m256i, hi);
                }
            } else {
                transpose32(src.add(2), bs, dst, offset);
            }
        }
    }
}

/// One chunk of [`super::pack_rows_on`]'s layout.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_chunk(ty: GgmlType, src: &[u8], dst: &mut [u8], flip: bool) {
    let bs = ty.block_bytes();
    let codes = 8 * bs - 16;
    // SAFETY: `src` and `dst` hold one chunk (eight blocks) of `ty`.
    unsafe {
        let s = src.as_ptr();
        let d = dst.as_mut_ptr();
        for b in 0..8 {
            (d.add(codes + 2 * b) as *mut u16).write_unaligned((s.add(b * bs) as *const u16).read_unaligned());
        }
        if ty == GgmlType::Q4_0 {
            for (j, o) in q4_steps(s, bs).into_iter().enumerate() {
                _mm256_storeu_si256(d.add(32 * j) as *mut __m256i, o);
            }
        } else {
            transpose32(s.add(2), bs, d, flip);
        }
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn packed_vnni(ty: GgmlType, rows: &[u8], rb: usize, acts: &Q8Acts, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { packed::<true, false>(ty, rows, rb, acts, out) }
}

#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn packed_avx2<const SIGNED: bool>(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    acts: &Q8Acts,
    out: &mut [f32],
) {
    // SAFETY: forwarded.
    unsafe { packed::<false, SIGNED>(ty, rows, rb, acts, out) }
}

/// The packed rows' loop: per chunk, the codes' steps (Q4_0's nibbles
/// split as they are loaded) against the activation steps, then the
/// same term as `body`.
#[inline(always)]
unsafe fn packed<const VNNI: bool, const SIGNED: bool>(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    acts: &Q8Acts,
    out: &mut [f32],
) {
    let q4 = ty == GgmlType::Q4_0;
    let count = _mm_cvtsi32_si128(if q4 { 3 } else { 7 });
    let low4 = _mm256_set1_epi8(0x0f);
    let chunks = acts.len() / CHUNK;
    let cb = rb / chunks;
    let codes = cb - 16;
    let pf = crate::prefetch::distance();
    // SAFETY: each row holds `chunks` chunks of `cb` bytes (the caller
    // checked the sizes); the activations hold `chunks` chunks of codes
    // and eight totals and scales per chunk.
    unsafe {
        for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
            let mut acc = _mm256_setzero_ps();
            for c in 0..chunks {
                let p = row.as_ptr().add(c * cb);
                crate::prefetch::ahead_span(p, cb, pf);
                let q0 = acts.qt.as_ptr().add(c * CHUNK) as *const u8;
                let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                let w = |j: usize| _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
                let mut s0 = _mm256_setzero_si256();
                let mut s1 = _mm256_setzero_si256();
                if q4 && VNNI {
                    // The high nibbles multiplied in place (16 times their
                    // value: no shift per step; VNNI's 32-bit sums cannot
                    // saturate) and the sum divided by 16 once, exactly.
                    for j in 0..4 {
                        let v = w(j);
                        s0 = madd::<VNNI, false>(s0, _mm256_and_si256(v, low4), q(j));
                        s1 = madd::<VNNI, false>(s1, _mm256_andnot_si256(low4, v), q(4 + j));
                    }
                    s1 = _mm256_srai_epi32::<4>(s1);
                } else if q4 {
                    for j in 0..4 {
                        let v = w(j);
                        let lo = _mm256_and_si256(v, low4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                        s0 = madd::<VNNI, false>(s0, lo, q(j));
                        s1 = madd::<VNNI, false>(s1, hi, q(4 + j));
                    }
                } else {
                    for j in (0..8).step_by(2) {
                        s0 = madd::<VNNI, SIGNED>(s0, w(j), q(j));
                        s1 = madd::<VNNI, SIGNED>(s1, w(j + 1), q(j + 1));
                    }
                }
                let mut i = _mm256_add_epi32(s0, s1);
                if !SIGNED {
                    let tot = _mm256_loadu_si256(acts.tot.as_ptr().add(8 * c) as *const __m256i);
                    i = _mm256_sub_epi32(i, _mm256_sll_epi32(tot, count));
                }
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(codes) as *const __m128i));
                let dx = _mm256_loadu_ps(acts.d.as_ptr().add(8 * c));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i)));
            }
            *o = crate::gguf::qdot::x86::lane_sums([acc])[0];
        }
    }
}

/// `acc + Σ` of four-product groups, lane `i` over bytes `4i..4i + 4`.
#[inline(always)]
pub(super) unsafe fn madd<const VNNI: bool, const SIGNED: bool>(acc: __m256i, w: __m256i, q: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(acc, w, q)
    } else {
        let (w, q) = if SIGNED {
            // |w| times q·sign(w): unsigned by signed, exact.
            (_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w))
        } else {
            (w, q)
        };
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), _mm256_set1_epi16(1)))
    }
}

/// One weight row's chunk `c` as the chunk loop takes it: eight steps of
/// codes (lane `b` = block `b`, Q4_0's nibbles unpacked) and the eight
/// block scales widened.
type Chunk = ([__m256i; 8], __m256);

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn many_vnni(ty: GgmlType, row: &ArrangedRow, acts: &[&Q8Acts], out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { many::<true>(ty, row.codes.len() / CHUNK, |c| arranged_chunk(row, c), acts, out) }
}

#[target_feature(enable = "avx2")]
pub(super) unsafe fn many_avx2(ty: GgmlType, row: &ArrangedRow, acts: &[&Q8Acts], out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe { many::<false>(ty, row.codes.len() / CHUNK, |c| arranged_chunk(row, c), acts, out) }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn many_packed_vnni(ty: GgmlType, row: &[u8], acts: &[&Q8Acts], out: &mut [f32]) {
    let cb = 8 * ty.block_bytes();
    // SAFETY: forwarded; `row` holds whole chunks of `cb` bytes.
    unsafe {
        many::<true>(
            ty,
            row.len() / cb,
            |c| packed_chunk(ty, row.as_ptr().add(c * cb)),
            acts,
            out,
        )
    }
}

#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn many_packed_avx2(ty: GgmlType, row: &[u8], acts: &[&Q8Acts], out: &mut [f32]) {
    let cb = 8 * ty.block_bytes();
    // SAFETY: as above.
    unsafe {
        many::<false>(
            ty,
            row.len() / cb,
            |c| packed_chunk(ty, row.as_ptr().add(c * cb)),
            acts,
            out,
        )
    }
}

/// Chunk `c` of an arranged row.
#[inline(always)]
unsafe fn arranged_chunk(row: &ArrangedRow, c: usize) -> Chunk {
    // SAFETY: the caller's `c` is below the row's chunk count; codes hold
    // 256 bytes and `d` eight floats per chunk.
    unsafe {
        let w0 = row.codes.as_ptr().add(c * CHUNK);
        let mut w = [_mm256_setzero_si256(); 8];
        for (j, w) in w.iter_mut().enumerate() {
            *w = _mm256_loadu_si256(w0.add(32 * j) as *const __m256i);
        }
        (w, _mm256_loadu_ps(row.d.as_ptr().add(8 * c)))
    }
}

/// The packed chunk at `p` ([`super::pack_rows_on`]'s layout): Q4_0's
/// four steps of nibble pairs split into the low (steps 0..4) and high
/// (4..8) codes, as [`super::arrange_row_on`] lays them out.
#[inline(always)]
unsafe fn packed_chunk(ty: GgmlType, p: *const u8) -> Chunk {
    let codes = 8 * ty.block_bytes() - 16;
    // SAFETY: the caller's pointer covers one packed chunk of `ty`.
    unsafe {
        let mut w = [_mm256_setzero_si256(); 8];
        if ty == GgmlType::Q4_0 {
            let low4 = _mm256_set1_epi8(0x0f);
            for j in 0..4 {
                let v = _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
                w[j] = _mm256_and_si256(v, low4);
                w[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            }
        } else {
            for (j, w) in w.iter_mut().enumerate() {
                *w = _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
            }
        }
        (w, _mm256_cvtph_ps(_mm_loadu_si128(p.add(codes) as *const __m128i)))
    }
}

/// Quads of activation rows, then the one to three left.
#[inline(always)]
unsafe fn many<const VNNI: bool>(
    ty: GgmlType,
    chunks: usize,
    row: impl Fn(usize) -> Chunk + Copy,
    acts: &[&Q8Acts],
    out: &mut [f32],
) {
    let n = acts.len();
    let mut t = 0;
    // SAFETY (every call): forwarded; `t + N <= n` indexes `acts` and `out`.
    unsafe {
        while t + 4 <= n {
            let v = dot::<VNNI, 4>(ty, chunks, row, [acts[t], acts[t + 1], acts[t + 2], acts[t + 3]]);
            out[t..t + 4].copy_from_slice(&v);
            t += 4;
        }
        match n - t {
            1 => out[t..].copy_from_slice(&dot::<VNNI, 1>(ty, chunks, row, [acts[t]])),
            2 => out[t..].copy_from_slice(&dot::<VNNI, 2>(ty, chunks, row, [acts[t], acts[t + 1]])),
            3 => out[t..].copy_from_slice(&dot::<VNNI, 3>(ty, chunks, row, [acts[t], acts[t + 1], acts[t + 2]])),
            _ => {}
        }
    }
}

#[inline(always)]
unsafe fn dot<const VNNI: bool, const N: usize>(
    ty: GgmlType,
    chunks: usize,
    row: impl Fn(usize) -> Chunk,
    acts: [&Q8Acts; N],
) -> [f32; N] {
    if ty == GgmlType::Q8_0 && !VNNI {
        // SAFETY: forwarded.
        unsafe { body::<VNNI, true, N>(ty, chunks, row, acts) }
    } else {
        // SAFETY: forwarded.
        unsafe { body::<VNNI, false, N>(ty, chunks, row, acts) }
    }
}

/// The chunk loop: block `b`'s integer sum in lane `b`, less the
/// activation total times the type's offset (Q4_0's 8; VNNI's Q8_0
/// codes carry +128), then [`super::super::combine`]'s term and lane sums.
#[inline(always)]
unsafe fn body<const VNNI: bool, const SIGNED: bool, const N: usize>(
    ty: GgmlType,
    chunks: usize,
    row: impl Fn(usize) -> Chunk,
    acts: [&Q8Acts; N],
) -> [f32; N] {
    // Q4_0's offset 8, VNNI's Q8_0 offset 128 (AVX2's signed Q8_0 has none).
    let shift = if ty == GgmlType::Q4_0 { 3 } else { 7 };
    let count = _mm_cvtsi32_si128(shift);
    let mut acc = [_mm256_setzero_ps(); N];
    // SAFETY: `row` yields `chunks` chunks, and the activations' `qt`,
    // `tot`, `d` hold as many (the caller checked the widths: codes and
    // `qt` one byte per element, the others one entry per block).
    unsafe {
        for c in 0..chunks {
            let (w, dw) = row(c);
            for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                let q0 = a.qt.as_ptr().add(c * CHUNK) as *const u8;
                let q = |j: usize| _mm256_loadu_si256(q0.add(32 * j) as *const __m256i);
                let mut s0 = _mm256_setzero_si256();
                let mut s1 = _mm256_setzero_si256();
                for j in (0..8).step_by(2) {
                    s0 = madd::<VNNI, SIGNED>(s0, w[j], q(j));
                    s1 = madd::<VNNI, SIGNED>(s1, w[j + 1], q(j + 1));
                }
                let mut i = _mm256_add_epi32(s0, s1);
                if !SIGNED {
                    let tot = _mm256_loadu_si256(a.tot.as_ptr().add(8 * c) as *const __m256i);
                    i = _mm256_sub_epi32(i, _mm256_sll_epi32(tot, count));
                }
                let dx = _mm256_loadu_ps(a.d.as_ptr().add(8 * c));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i)));
            }
        }
        crate::gguf::qdot::x86::lane_sums(acc)
    }
}
