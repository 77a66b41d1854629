//! The gated feed-forward block: `down(act(gate x) * up x)`.
//!
//! One place for the math of every routed expert, every shared expert and
//! every dense MLP layer. Workers call [`SwiGlu::forward`] (through
//! [`crate::expert::run_group`]); the coordinator calls it for dense and
//! shared blocks. Two gating kinds ([`GluAct`]): the SwiGLU of most
//! families, and gpt-oss's clamped variant with biases.

use charm_common::kernels::{silu, zip_apply};
use charm_common::{LoadError, Weight, WeightSource};

use crate::clamped_swiglu::clamped_glu;

/// How the gate and up projections combine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GluAct {
    /// `self.act_fn(gate) * up` with SiLU.
    Silu,
    /// gpt-oss's clamped SwiGLU ([`crate::clamped_swiglu`]).
    Clamped { alpha: f32, limit: f32 },
}

impl GluAct {
    /// The gated value of one `(gate, up)` pair.
    #[inline]
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        match self {
            GluAct::Silu => silu(gate) * up,
            GluAct::Clamped { alpha, limit } => clamped_glu(gate, up, alpha, limit),
        }
    }

    /// [`GluAct::apply`] to every pair of `g` and `u`, into `g`: one
    /// vectorized loop per kind ([`zip_apply`], the same bits per pair).
    pub fn apply_rows(self, g: &mut [f32], u: &[f32]) {
        match self {
            GluAct::Silu => zip_apply(g, u, |gate, up| silu(gate) * up),
            GluAct::Clamped { alpha, limit } => zip_apply(g, u, move |gate, up| clamped_glu(gate, up, alpha, limit)),
        }
    }

    /// Whether the clamp changes this pair (for counting how often it
    /// triggers; always false for SiLU).
    pub fn clamps(self, gate: f32, up: f32) -> bool {
        match self {
            GluAct::Silu => false,
            GluAct::Clamped { limit, .. } => crate::clamped_swiglu::clamps(gate, up, limit),
        }
    }
}

/// The biases of a gated FFN's three projections (gpt-oss's experts).
#[derive(Clone, Debug, PartialEq)]
pub struct FfnBias {
    /// `[intermediate]`
    pub gate: Vec<f32>,
    /// `[intermediate]`
    pub up: Vec<f32>,
    /// `[hidden]`
    pub down: Vec<f32>,
}

/// One gated FFN.
pub struct SwiGlu {
    /// `[intermediate, hidden]`
    pub gate: Weight,
    /// `[intermediate, hidden]`
    pub up: Weight,
    /// `[hidden, intermediate]`
    pub down: Weight,
    /// Projection biases, when the family has them.
    pub bias: Option<Box<FfnBias>>,
    pub act: GluAct,
}

impl SwiGlu {
    /// A bias-free SwiGLU of these projections.
    pub fn new(gate: Weight, up: Weight, down: Weight) -> Self {
        SwiGlu {
            gate,
            up,
            down,
            bias: None,
            act: GluAct::Silu,
        }
    }

    /// Loads gate / up / down by name, checking their shapes.
    pub fn load(files: &dyn WeightSource, names: &[String; 3], hidden: usize, inter: usize) -> Result<Self, LoadError> {
        Ok(SwiGlu::new(
            files.matrix(&names[0], inter, hidden)?,
            files.matrix(&names[1], inter, hidden)?,
            files.matrix(&names[2], hidden, inter)?,
        ))
    }

    /// Loads the biases `{name without .weight}.bias` of the three projections.
    pub fn load_bias(
        files: &dyn WeightSource,
        names: &[String; 3],
        hidden: usize,
        inter: usize,
    ) -> Result<FfnBias, LoadError> {
        let bias = |n: &String| n.strip_suffix(".weight").unwrap_or(n).to_string() + ".bias";
        Ok(FfnBias {
            gate: files.vector(&bias(&names[0]), inter)?,
            up: files.vector(&bias(&names[1]), inter)?,
            down: files.vector(&bias(&names[2]), hidden)?,
        })
    }

    /// Hidden width.
    pub fn hidden(&self) -> usize {
        self.gate.cols()
    }

    /// Intermediate width.
    pub fn intermediate(&self) -> usize {
        self.gate.rows()
    }

    /// `out[t] = down(act(gate xs[t]) * up xs[t])` for `n` rows (plus the
    /// biases where there are some).
    ///
    /// `current_hidden_states = self.act_fn(gate) * up`
    /// `current_hidden_states = F.linear(current_hidden_states, self.down_proj[expert_idx])`
    pub fn forward(&self, xs: &[f32], n: usize, out: &mut [f32]) {
        self.forward_with(xs, n, out, true)
    }

    /// [`SwiGlu::forward`] on the calling thread when `parallel` is false
    /// (for a caller that already runs several FFNs side by side, such as
    /// the experts of one decode step); the same bits either way.
    pub fn forward_with(&self, xs: &[f32], n: usize, out: &mut [f32], parallel: bool) {
        let inter = self.intermediate();
        let mut g = vec![0.0; n * inter];
        let mut u = vec![0.0; n * inter];
        if n == 1 && parallel {
            Weight::matvec_many(&[&self.gate, &self.up], xs, &mut [&mut g, &mut u]);
        } else if n > 1 {
            Weight::matmul_many(&[&self.gate, &self.up], xs, n, &mut [&mut g, &mut u]);
        } else {
            self.gate.matvec_seq(xs, &mut g);
            self.up.matvec_seq(xs, &mut u);
        }
        if let Some(b) = &self.bias {
            // gate_up = current_state @ self.gate_up_proj[expert_idx] + self.gate_up_proj_bias[expert_idx]
            add_rows(&mut g, &b.gate);
            add_rows(&mut u, &b.up);
        }
        self.act.apply_rows(&mut g, &u);
        if parallel || n > 1 {
            self.down.matmul(&g, n, out);
        } else {
            self.down.matvec_seq(&g, out);
        }
        if let Some(b) = &self.bias {
            // out = gated_output @ self.down_proj[expert_idx] + self.down_proj_bias[expert_idx]
            add_rows(out, &b.down);
        }
    }
}

/// Adds `bias` to every `bias.len()`-wide row of `xs`.
pub fn add_rows(xs: &mut [f32], bias: &[f32]) {
    for row in xs.chunks_exact_mut(bias.len()) {
        for (x, b) in row.iter_mut().zip(bias) {
            *x += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clamped_act_is_the_clamped_swiglu() {
        let act = GluAct::Clamped {
            alpha: 1.702,
            limit: 7.0,
        };
        assert_eq!(act.apply(10.0, 0.5), clamped_glu(10.0, 0.5, 1.702, 7.0));
        assert!(act.clamps(7.5, 0.0) && !GluAct::Silu.clamps(100.0, 100.0));
    }

    #[test]
    fn rows_take_each_pairs_bits() {
        let gate: Vec<f32> = (0..203).map(|i| (i as f32 - 100.0) * 0.097).collect();
        let up: Vec<f32> = (0..203).map(|i| ((i * 13) % 29) as f32 * 0.7 - 10.0).collect();
        for act in [
            GluAct::Silu,
            GluAct::Clamped {
                alpha: 1.702,
                limit: 7.0,
            },
        ] {
            let mut g = gate.clone();
            act.apply_rows(&mut g, &up);
            for ((&got, &gv), &uv) in g.iter().zip(&gate).zip(&up) {
                assert_eq!(got.to_bits(), act.apply(gv, uv).to_bits(), "{act:?} at ({gv}, {uv})");
            }
        }
    }

    #[test]
    fn biases_add_before_the_gate_and_after_down() {
        let w = |r, c, v: Vec<f32>| Weight::from_f32(r, c, v);
        let mut ffn = SwiGlu::new(w(1, 1, vec![1.0]), w(1, 1, vec![1.0]), w(1, 1, vec![2.0]));
        ffn.bias = Some(Box::new(FfnBias {
            gate: vec![0.5],
            up: vec![-0.25],
            down: vec![3.0],
        }));
        let mut out = [0.0];
        ffn.forward(&[1.0], 1, &mut out);
        assert_eq!(out[0], 2.0 * (silu(1.5) * 0.75) + 3.0);
    }
}
