//! Activations quantized to 8 bits per 32-element block, the way GGML's
//! quantized formats are meant to be multiplied.

use super::super::types::QK;

/// One activation row quantized in blocks of [`QK`] (32): block `b` holds
/// `qs[32b..32b + 32]` with `x ≈ d[b] * qs`, `d[b] = amax / 127` (`amax`
/// the block's largest `|x|`), `qs = round(x / d)` (half away from zero),
/// and the sums of its two 16-element halves in `s16[2b]`, `s16[2b + 1]`.
///
/// A block holding a NaN or an infinity gets `d = NaN`, so every dot
/// product with it is NaN, as the f32 product would be.
///
/// The buffers are reused by [`Q8Acts::quantize`]: quantizing another row
/// of the same width allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct Q8Acts {
    pub d: Vec<f32>,
    pub qs: Vec<i8>,
    pub s16: Vec<i32>,
    /// The codes chunk-transposed for matrix products, and each block's
    /// code total `s16[2b] + s16[2b + 1]`: empty until
    /// [`Q8Acts::arrange`] (`tiled`), cleared by every quantization.
    pub qt: Vec<i8>,
    pub tot: Vec<i32>,
    /// Per chunk, `32 s16[2b]` of its eight blocks then `32 s16[2b + 1]`:
    /// what packed Q6_K rows subtract (`tiled::q6k`), set with `qt`.
    pub off6: Vec<i32>,
    /// Each block's `-128 tot` (`tot` as above), set with `qt`: where the
    /// pair loop starts a block's integer sum for codes stored offset by
    /// 128 (`tiled::dot_pair_packed`; Q4_0's `-8 tot` is it shifted by 4).
    pub toff: Vec<i32>,
}

impl Q8Acts {
    /// `x` quantized (`x.len()` a multiple of 32).
    pub fn new(x: &[f32]) -> Self {
        let mut a = Q8Acts::default();
        a.quantize(x);
        a
    }

    /// Number of quantized elements.
    pub fn len(&self) -> usize {
        self.qs.len()
    }

    /// Whether no element is held.
    pub fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }

    /// Replaces the content with `x` quantized, reusing the buffers.
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of 32 (GGML rows always are).
    pub fn quantize(&mut self, x: &[f32]) {
        assert!(
            x.len().is_multiple_of(QK),
            "activation length {} is not a multiple of {QK}",
            x.len()
        );
        let nb = x.len() / QK;
        self.d.clear();
        self.d.resize(nb, 0.0);
        self.qs.clear();
        self.qs.resize(x.len(), 0);
        self.s16.clear();
        self.s16.resize(2 * nb, 0);
        self.qt.clear();
        self.tot.clear();
        self.off6.clear();
        self.toff.clear();
        #[cfg(target_arch = "x86_64")]
        if matches!(crate::Isa::active(), crate::Isa::Avx2 | crate::Isa::Avx512Vnni) {
            // SAFETY: the active instruction set is one this CPU runs, and
            // both include AVX2.
            unsafe { quantize_avx2(x, &mut self.d, &mut self.qs, &mut self.s16) };
            return;
        }
        quantize_blocks(x, &mut self.d, &mut self.qs, &mut self.s16);
    }

    /// The dequantized values `d * q` (tests and error bounds).
    pub fn dequantized(&self) -> Vec<f32> {
        self.qs
            .chunks_exact(QK)
            .zip(&self.d)
            .flat_map(|(qb, &d)| qb.iter().map(move |&q| d * q as f32))
            .collect()
    }
}

/// The body of [`Q8Acts::quantize`] (buffers already sized).
#[inline(always)]
fn quantize_blocks(x: &[f32], d: &mut [f32], qs: &mut [i8], s16: &mut [i32]) {
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        quantize_block(xb, &mut d[b], &mut qs[b * QK..(b + 1) * QK], &mut s16[2 * b..2 * b + 2]);
    }
}

/// A finite block's scale and its inverse from its largest magnitude
/// (both 0 for an all-zero block).
#[inline(always)]
fn scale(amax: f32) -> (f32, f32) {
    if amax == 0.0 {
        (0.0, 0.0)
    } else {
        (amax / 127.0, 127.0 / amax)
    }
}

/// One block: the definition in [`Q8Acts`]'s docs.
#[inline(always)]
fn quantize_block(xb: &[f32], d: &mut f32, qb: &mut [i8], s16: &mut [i32]) {
    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let finite = xb.iter().all(|v| v.is_finite());
    let (db, inv) = if finite { scale(amax) } else { (f32::NAN, 0.0) };
    *d = db;
    for (q, &v) in qb.iter_mut().zip(xb) {
        *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    for h in 0..2 {
        s16[h] = qb[16 * h..16 * h + 16].iter().map(|&q| q as i32).sum();
    }
}

/// [`quantize_blocks`] in AVX2 registers: the same values. A block with a
/// NaN or an infinity goes through [`quantize_block`]; otherwise the scale
/// and its inverse are the same f32 divisions, each code the same product
/// rounded half away from zero (`trunc(v + copysign(0.49999997, v))`, exact
/// for every f32 of magnitude below 2²³ — the codes are at most 127 — where
/// a plain round-to-nearest would send ties to even), clamped and narrowed.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_avx2(x: &[f32], d: &mut [f32], qs: &mut [i8], s16: &mut [i32]) {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let half = _mm256_set1_ps(0.499_999_97);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let inf = _mm256_set1_ps(f32::INFINITY);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        // SAFETY: `xb` holds 32 floats; `qs` 32 codes per block. (Loops,
        // not `array::map`: closures called from a generic function would
        // not get this function's target features.)
        unsafe {
            let p = xb.as_ptr();
            let mut v = [_mm256_setzero_ps(); 4];
            let mut m = _mm256_setzero_ps();
            let mut bad = _mm256_setzero_ps();
            for (i, v) in v.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(p.add(8 * i));
                let a = _mm256_and_ps(*v, abs_mask);
                m = _mm256_max_ps(m, a);
                // Not finite: |v| not below infinity (NaN compares unordered).
                bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
            }
            if _mm256_movemask_ps(bad) != 0 {
                quantize_block(xb, &mut d[b], &mut qs[b * QK..(b + 1) * QK], &mut s16[2 * b..2 * b + 2]);
                continue;
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
            let (db, inv) = scale(amax);
            d[b] = db;
            let inv = _mm256_set1_ps(inv);
            let mut codes = [_mm256_setzero_si256(); 4];
            for (c, v) in codes.iter_mut().zip(v) {
                let q = _mm256_mul_ps(v, inv);
                let r = _mm256_add_ps(q, _mm256_or_ps(_mm256_and_ps(q, sign_mask), half));
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(r);
                *c = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
            }
            // i32 → i16 → i8 within 128-bit halves, then the dwords back in order.
            let w = _mm256_packs_epi16(
                _mm256_packs_epi32(codes[0], codes[1]),
                _mm256_packs_epi32(codes[2], codes[3]),
            );
            _mm256_storeu_si256(
                qs.as_mut_ptr().add(b * QK) as *mut __m256i,
                _mm256_permutevar8x32_epi32(w, order),
            );
            for h in 0..2 {
                let s = _mm256_add_epi32(codes[2 * h], codes[2 * h + 1]);
                let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                s16[2 * b + h] = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_scale_to_their_largest_value() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) / 8.0).collect();
        x[40] = -100.0;
        let a = Q8Acts::new(&x);
        assert_eq!(a.d, vec![2.5 / 127.0, 100.0 / 127.0]);
        assert_eq!(a.qs[0], -127);
        assert_eq!(a.qs[40], -127);
        for (b, half) in [(0usize, 0usize), (0, 1), (1, 0), (1, 1)] {
            let s: i32 = a.qs[32 * b + 16 * half..32 * b + 16 * half + 16]
                .iter()
                .map(|&q| q as i32)
                .sum();
            assert_eq!(a.s16[2 * b + half], s);
        }
        for (got, want) in a.dequantized().iter().zip(&x) {
            let d = a.d[0].max(a.d[1]);
            assert!((got - want).abs() <= d / 2.0 + 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn every_build_rounds_alike() {
        // Values whose scaled codes sit on and next to the .5 boundaries.
        let mut x = Vec::new();
        for b in 0..64 {
            x.push(127.0);
            for i in 1..32 {
                let code = (i * 4 + b) as f32 % 127.0 + 0.5;
                let v = match b % 3 {
                    0 => code,
                    1 => f32::from_bits(code.to_bits() - 1),
                    _ => f32::from_bits(code.to_bits() + 1),
                };
                x.push(if i % 2 == 0 { v } else { -v });
            }
        }
        let nb = x.len() / QK;
        let mut want = (vec![0.0; nb], vec![0i8; x.len()], vec![0i32; 2 * nb]);
        quantize_blocks(&x, &mut want.0, &mut want.1, &mut want.2);
        assert_eq!(
            (want.1[2], want.1[1]),
            (9, -5),
            "half away from zero: 8.5 -> 9, -4.5 -> -5"
        );
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::Avx2.runs() {
            let mut got = (vec![0.0; nb], vec![0i8; x.len()], vec![0i32; 2 * nb]);
            // SAFETY: AVX2 is present, checked just above.
            unsafe { quantize_avx2(&x, &mut got.0, &mut got.1, &mut got.2) };
            assert_eq!(got.1, want.1);
            assert_eq!(got.2, want.2);
            assert_eq!(
                got.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        let a = Q8Acts::new(&x);
        assert_eq!(a.qs, want.1);
    }

    /// Every f32 of magnitude up to 127 through the AVX2 rounding (a block
    /// whose largest value is 127 has scale inverse 1, so its codes are the
    /// values rounded): the same codes as the scalar build. About 2·10⁹
    /// values: `cargo test --release -p charm-common -- --ignored every_f32`.
    #[test]
    #[ignore]
    fn every_f32_rounds_alike() {
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::Avx2.runs() {
            let limit = 127.0f32.to_bits();
            let mut x = vec![127.0f32; 32 * 4096];
            let nb = x.len() / QK;
            let (mut got, mut want) = (
                (vec![0.0; nb], vec![0i8; x.len()], vec![0i32; 2 * nb]),
                (vec![0.0; nb], vec![0i8; x.len()], vec![0i32; 2 * nb]),
            );
            let mut bits = 0u32;
            while bits <= limit {
                // Slot 0 of each block holds the 127; the others take the
                // next bit patterns in turn, alternating signs.
                for (i, v) in x.iter_mut().enumerate() {
                    if i % QK != 0 {
                        let b = (bits + (i - i / QK - 1) as u32).min(limit);
                        *v = if i % 2 == 0 {
                            f32::from_bits(b)
                        } else {
                            -f32::from_bits(b)
                        };
                    }
                }
                bits += (nb * (QK - 1)) as u32;
                quantize_blocks(&x, &mut want.0, &mut want.1, &mut want.2);
                // SAFETY: AVX2 is present, checked above.
                unsafe { quantize_avx2(&x, &mut got.0, &mut got.1, &mut got.2) };
                assert_eq!(got.1, want.1, "around bits {bits:#x}");
                assert_eq!(got.2, want.2);
            }
        }
    }

    #[test]
    fn zero_and_non_finite_blocks() {
        let mut x = vec![0.0f32; 64];
        x[33] = f32::INFINITY;
        let a = Q8Acts::new(&x);
        assert_eq!(a.d[0], 0.0);
        assert!(a.qs[..32].iter().all(|&q| q == 0));
        assert!(a.d[1].is_nan());
    }

    #[test]
    fn reuse_keeps_no_stale_state() {
        let mut a = Q8Acts::new(&[1.0; 96]);
        a.quantize(&[-2.0; 32]);
        assert_eq!(a.len(), 32);
        assert_eq!(a.d, vec![2.0 / 127.0]);
        assert_eq!(a.s16, vec![-127 * 16, -127 * 16]);
    }
}
