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
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let finite = xb.iter().all(|v| v.is_finite());
        let (db, inv) = if !finite {
            (f32::NAN, 0.0)
        } else if amax == 0.0 {
            (0.0, 0.0)
        } else {
            (amax / 127.0, 127.0 / amax)
        };
        d[b] = db;
        let qb = &mut qs[b * QK..(b + 1) * QK];
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
        for h in 0..2 {
            s16[2 * b + h] = qb[16 * h..16 * h + 16].iter().map(|&q| q as i32).sum();
        }
    }
}

/// [`quantize_blocks`] compiled for AVX2, where `round` is two vector
/// instructions instead of a library call per element (the same values:
/// rounding half away from zero is exact either way).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_avx2(x: &[f32], d: &mut [f32], qs: &mut [i8], s16: &mut [i32]) {
    quantize_blocks(x, d, qs, s16)
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
