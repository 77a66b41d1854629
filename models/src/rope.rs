//! Rotary position embedding, the `rotate_half` (non-interleaved) layout of
//! transformers: dimension `i` pairs with `i + rotary_dim / 2`. With a
//! partial rotary factor (Qwen3-Next, Qwen3.5) only each head's first
//! `rotary_dim` dimensions rotate; the rest pass through:
//!
//! ```text
//! q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
//! q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
//! ```

use crate::config::Yarn;

/// Inverse frequencies for one head.
pub struct Rope {
    inv_freq: Vec<f32>,
    head_dim: usize,
    /// YaRN's attention factor on cos and sin (`cos = emb.cos() * self.attention_scaling`); 1 otherwise.
    scale: f32,
}

impl Rope {
    /// `inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2) / dim))`, divided
    /// by the linear scaling factor; every dimension of a head rotates.
    pub fn new(head_dim: usize, theta: f32, linear_factor: f32) -> Self {
        Self::partial(head_dim, head_dim, theta, linear_factor)
    }

    /// The same over the first `rotary_dim` dimensions of each
    /// `head_dim`-wide head (`dim = rotary_dim` in the formula).
    pub fn partial(head_dim: usize, rotary_dim: usize, theta: f32, linear_factor: f32) -> Self {
        let inv_freq = (0..rotary_dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32) / linear_factor)
            .collect();
        Rope {
            inv_freq,
            head_dim,
            scale: 1.0,
        }
    }

    /// YaRN (transformers `_compute_yarn_parameters`) over the first
    /// `rotary_dim` dimensions of each head:
    ///
    /// ```python
    /// pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    /// low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max_position_embeddings, truncate)
    /// inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
    /// inv_freq = inv_freq_interpolation * (1 - inv_freq_extrapolation_factor) + inv_freq_extrapolation * inv_freq_extrapolation_factor
    /// ```
    pub fn yarn(head_dim: usize, rotary_dim: usize, theta: f32, y: &Yarn) -> Self {
        let dim = rotary_dim;
        // (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))
        let correction = |rotations: f64| {
            (dim as f64 * (y.original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln())
                / (2.0 * (theta as f64).ln())
        };
        let (mut low, mut high) = (correction(y.beta_fast), correction(y.beta_slow));
        if y.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001; // Prevent singularity
        }
        let factor = y.factor as f32;
        let inv_freq = (0..dim / 2)
            .map(|i| {
                let pos_freq = theta.powf((2 * i) as f32 / dim as f32);
                let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
                let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                let extrapolation_factor = 1.0 - ramp;
                interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
            })
            .collect();
        Rope {
            inv_freq,
            head_dim,
            scale: y.attention_factor as f32,
        }
    }

    /// Rotates every `head_dim`-wide head of `x` for position `pos`.
    ///
    /// `q_embed = (q * cos) + (rotate_half(q) * sin)`
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        let (cos, sin): (Vec<f32>, Vec<f32>) = self
            .inv_freq
            .iter()
            .map(|f| {
                let a = pos as f32 * f;
                (a.cos() * self.scale, a.sin() * self.scale)
            })
            .unzip();
        for head in x.chunks_exact_mut(self.head_dim) {
            let (lo, hi) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let rope = Rope::new(8, 10000.0, 1.0);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, 0);
        assert_eq!(x, orig);
        rope.apply(&mut x, 17);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
    }

    #[test]
    fn yarn_keeps_fast_dimensions_and_interpolates_slow_ones() {
        let y = Yarn {
            factor: 4.0,
            original_max_position_embeddings: 128,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.0,
            mscale_all_dim: 1.0,
            truncate: true,
        };
        let plain = Rope::partial(16, 16, 10000.0, 1.0);
        let yarn = Rope::yarn(16, 16, 10000.0, &y);
        // dim 16, base 1e4, 128 positions: correction range [0, 3] after truncation.
        assert_eq!(yarn.inv_freq[0], plain.inv_freq[0]);
        assert_eq!(yarn.inv_freq[7], 1.0 / (4.0 * 10000f32.powf(14.0 / 16.0)));
        assert!(yarn.inv_freq[2] < plain.inv_freq[2] && yarn.inv_freq[2] > plain.inv_freq[2] / 4.0);
    }

    #[test]
    fn partial_rotary_leaves_the_tail_of_each_head() {
        let full = Rope::new(4, 10000.0, 1.0);
        let part = Rope::partial(8, 4, 10000.0, 1.0);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 2.0).collect();
        let mut x = orig.clone();
        part.apply(&mut x, 5);
        for h in 0..2 {
            let mut rot = orig[h * 8..h * 8 + 4].to_vec();
            full.apply(&mut rot, 5);
            assert_eq!(&x[h * 8..h * 8 + 4], &rot[..]);
            assert_eq!(&x[h * 8 + 4..h * 8 + 8], &orig[h * 8 + 4..h * 8 + 8]);
        }
    }
}
