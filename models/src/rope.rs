//! Rotary position embedding, the `rotate_half` (non-interleaved) layout of
//! transformers: dimension `i` pairs with `i + head_dim / 2`.

/// Inverse frequencies for one head.
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// `inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2) / dim))`, divided
    /// by the linear scaling factor.
    pub fn new(head_dim: usize, theta: f32, linear_factor: f32) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32) / linear_factor)
            .collect();
        Rope { inv_freq }
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
        for head in x.chunks_exact_mut(2 * half) {
            let (lo, hi) = head.split_at_mut(half);
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
}
