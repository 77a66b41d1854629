//! Rotary position embedding, the `rotate_half` (non-interleaved) layout of
//! transformers: dimension `i` pairs with `i + rotary_dim / 2`. With a
//! partial rotary factor (Qwen3-Next, Qwen3.5) only each head's first
//! `rotary_dim` dimensions rotate; the rest pass through:
//!
//! ```text
//! q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
//! q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
//! ```

/// Inverse frequencies for one head.
pub struct Rope {
    inv_freq: Vec<f32>,
    head_dim: usize,
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
        Rope { inv_freq, head_dim }
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
                (a.cos(), a.sin())
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
