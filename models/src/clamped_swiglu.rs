//! gpt-oss's clamped SwiGLU (`GptOssExperts._apply_gate`), the gating of
//! its experts; [`crate::ffn::GluAct::Clamped`] selects it.
//!
//! ```python
//! gate, up = gate_up[..., ::2], gate_up[..., 1::2]
//! gate = gate.clamp(min=None, max=self.limit)
//! up = up.clamp(min=-self.limit, max=self.limit)
//! glu = gate * torch.sigmoid(gate * self.alpha)
//! gated_output = (up + 1) * glu
//! ```
//!
//! (The gate/up column interleave is undone when the weights are read:
//! [`charm_common::TensorFiles`].)

use charm_common::kernels::sigmoid;

/// The gated value of one `(gate, up)` pair.
#[inline]
pub fn clamped_glu(gate: f32, up: f32, alpha: f32, limit: f32) -> f32 {
    let g = gate.min(limit);
    let u = up.clamp(-limit, limit);
    (u + 1.0) * (g * sigmoid(g * alpha))
}

/// Whether the clamp changes this pair.
pub fn clamps(gate: f32, up: f32, limit: f32) -> bool {
    gate > limit || up.abs() > limit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_is_clamped_above_and_up_both_ways() {
        let glu = |g: f32| g * sigmoid(g * 1.702);
        let f = |g, u| clamped_glu(g, u, 1.702, 7.0);
        assert_eq!(f(10.0, 0.5), 1.5 * glu(7.0));
        assert_eq!(f(-10.0, 0.5), 1.5 * glu(-10.0));
        assert_eq!(f(1.0, -9.0), -6.0 * glu(1.0));
        assert_eq!(f(1.0, 9.0), 8.0 * glu(1.0));
        assert!(clamps(7.5, 0.0, 7.0) && clamps(0.0, -7.5, 7.0) && !clamps(-9.0, 6.9, 7.0));
    }
}
