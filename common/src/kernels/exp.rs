//! `exp` for the activations and softmaxes, the same bits on every machine.
//!
//! `f32::exp` is the platform's C library: glibc picks a variant by CPU
//! feature (`__expf_fma` or not) and macOS has its own, and none of them is
//! correctly rounded everywhere (glibc's, on this project's Zen 4 VM, is
//! off the nearest `f32` for about 1 input in 13 000). So an expert's SiLU
//! could round one way on a Linux worker and another on a Mac: a different
//! output bit for the same expert, against DESIGN.md's one rule. This one
//! uses only IEEE-754 `f32` additions, multiplications and bit operations
//! (Rust neither fuses nor reassociates them), so every build, vector width
//! and CPU gives the same bits. Its error is at most 1.2 ulp (tests), about
//! what the vectorized `exp` of PyTorch's CPU kernels allows (1 ulp).
//!
//! `exp(x) = 2^k · e^r` with `k = round(x / ln 2)` and `r = x − k ln 2`
//! (ln 2 in two parts, so `k · LN2_HI` is exact), `|r| ≲ ln 2 / 2`, `e^r`
//! by its Taylor series to `r⁷` in Horner form, `2^k` as two powers of two
//! built from their exponent bits (so subnormal results come out right).
//! No branch, no table, no library call: a loop of them vectorizes (an
//! expert's SiLU row, a softmax).

/// `ln 2`'s leading 16 bits (`0x3F317200`), so `k · LN2_HI` is exact for
/// every `|k| < 2^8`.
const LN2_HI: f32 = 0.693_145_75;
/// `ln 2 − LN2_HI`.
const LN2_LO: f32 = 1.428_606_8e-6;
/// Adding it rounds an `f32` below 2^22 in magnitude to the nearest
/// integer (ties to even), which then sits in the sum's low bits.
const ROUND: f32 = 12_582_912.0;

/// `e^x` as an `f32` within 1.2 ulp: `+inf` above `ln(f32::MAX)`,
/// subnormals and then zero far below zero, NaN for NaN.
#[inline]
pub fn exp(x: f32) -> f32 {
    // Beyond these the result is +inf or 0 (NaN passes through `clamp`
    // and every step below).
    let x = x.clamp(-104.0, 89.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let kf = shifted - ROUND;
    // The same integer, from the sum's low bits (no float-to-int cast).
    let k = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^k for k in -150..=129 as 2^k1 · 2^k2, each a normal f32.
    let k1 = k >> 1;
    let k2 = k.wrapping_sub(k1);
    let two_k1 = f32::from_bits((k1.wrapping_add(127) as u32).wrapping_shl(23));
    let two_k2 = f32::from_bits((k2.wrapping_add(127) as u32).wrapping_shl(23));
    (p * two_k1) * two_k2
}

#[cfg(test)]
mod tests {
    use super::exp;

    /// Units in the last place between `got` and `e^x` (an `f64` reference).
    fn ulps(got: f32, x: f32) -> f64 {
        let want = (x as f64).exp();
        let near = want as f32;
        if near.is_infinite() {
            return if got == near { 0.0 } else { f64::INFINITY };
        }
        let base = near.abs().max(f32::from_bits(1));
        let ulp = (f32::from_bits(base.to_bits() + 1) - base) as f64;
        (got as f64 - want).abs() / ulp
    }

    #[test]
    fn within_1_2_ulp_on_a_sweep_of_every_range() {
        // Every 97th f32 from -104 to 89 (normal, subnormal and overflowing
        // results alike).
        let (mut n, mut worst) = (0u64, 0.0f64);
        for bits in (0u32..=u32::MAX).step_by(97) {
            let x = f32::from_bits(bits);
            if !(-104.0..=89.0).contains(&x) {
                continue;
            }
            let u = ulps(exp(x), x);
            assert!(u <= 1.2, "exp({x:e}) = {:e}: {u} ulp", exp(x));
            worst = worst.max(u);
            n += 1;
        }
        assert!(n > 20_000_000, "{n} points swept");
        println!("worst {worst:.3} ulp over {n} points");
    }

    #[test]
    fn edges_and_special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(1.0), std::f32::consts::E);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(88.7229), f32::INFINITY, "past ln(f32::MAX)");
        assert!(exp(88.72283).is_finite());
        assert_eq!(exp(-103.0), f32::from_bits(1), "the smallest subnormal, not flushed");
        assert_eq!(exp(-104.5), 0.0);
        assert_eq!(exp(-1e-30), 1.0);
    }

    /// A digest of the bits over a sweep, pinned: every machine that runs
    /// the tests (x86-64 natively, AArch64 under qemu in CI) must give
    /// exactly these bits, which is what lets an expert run anywhere.
    #[test]
    fn the_bits_are_pinned_on_every_architecture() {
        let mut digest = 0xcbf2_9ce4_8422_2325u64;
        for bits in (0u32..=u32::MAX).step_by(4099) {
            let x = f32::from_bits(bits);
            // A NaN's payload is the hardware's choice; it only has to
            // stay a NaN.
            if x.is_nan() {
                assert!(exp(x).is_nan());
                continue;
            }
            digest = (digest ^ exp(x).to_bits() as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(digest, PINNED, "exp's bits changed: {digest:#018x}");
    }

    /// The digest of [`the_bits_are_pinned_on_every_architecture`] on the
    /// x86-64 build that introduced this `exp`.
    const PINNED: u64 = 0xfc0a_2d40_e549_d351;

    #[test]
    fn a_vectorized_loop_gives_the_bits_of_one_call_at_a_time() {
        // Rows as SiLU and softmax use them: the compiler may vectorize the
        // loop, never changing a bit (IEEE operations only).
        let xs: Vec<f32> = (0..4099).map(|i| (i as f32 * 0.7312).sin() * 90.0).collect();
        let mut row = xs.clone();
        for v in &mut row {
            *v = exp(*v);
        }
        for (&x, &y) in xs.iter().zip(&row) {
            assert_eq!(std::hint::black_box(exp)(x).to_bits(), y.to_bits(), "exp({x})");
        }
    }
}
