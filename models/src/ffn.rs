//! The SwiGLU feed-forward block: `down(silu(gate x) * up x)`.
//!
//! One place for the math of every routed expert, every shared expert and
//! every dense MLP layer. Workers call [`SwiGlu::forward`] (through
//! [`crate::expert::run_group`]); the coordinator calls it for dense and
//! shared blocks.

use charm_common::kernels::silu;
use charm_common::{LoadError, Weight, WeightSource};

/// One SwiGLU FFN.
pub struct SwiGlu {
    /// `[intermediate, hidden]`
    pub gate: Weight,
    /// `[intermediate, hidden]`
    pub up: Weight,
    /// `[hidden, intermediate]`
    pub down: Weight,
}

impl SwiGlu {
    /// Loads gate / up / down by name, checking their shapes.
    pub fn load(files: &dyn WeightSource, names: &[String; 3], hidden: usize, inter: usize) -> Result<Self, LoadError> {
        Ok(SwiGlu {
            gate: files.matrix(&names[0], inter, hidden)?,
            up: files.matrix(&names[1], inter, hidden)?,
            down: files.matrix(&names[2], hidden, inter)?,
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

    /// `out[t] = down(silu(gate xs[t]) * up xs[t])` for `n` rows.
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
        for (gv, uv) in g.iter_mut().zip(&u) {
            *gv = silu(*gv) * uv;
        }
        if parallel || n > 1 {
            self.down.matmul(&g, n, out);
        } else {
            self.down.matvec_seq(&g, out);
        }
    }
}
