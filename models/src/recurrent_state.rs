//! The cache of a gated DeltaNet layer for one sequence: the causal conv's
//! last `kernel - 1` inputs and the delta rule's recurrent state, in f32.
//!
//! Unlike a KV cache it does not grow with the context and cannot be cut
//! back to an earlier position: it holds exactly the state after the last
//! position it has seen ([`RecurrentState::len`]).

/// Conv inputs and recurrent state after `len` positions.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RecurrentState {
    /// The last `kernel - 1` conv inputs, oldest first, `conv_dim` each
    /// (zeros before the sequence starts, as the causal padding).
    conv: Vec<f32>,
    conv_dim: usize,
    /// Per value head, a `k_head_dim × v_head_dim` matrix (row-major).
    state: Vec<f32>,
    len: usize,
}

impl RecurrentState {
    /// The state before the first position.
    pub fn new(conv_dim: usize, kernel: usize, v_heads: usize, k_head_dim: usize, v_head_dim: usize) -> Self {
        RecurrentState {
            conv: vec![0.0; kernel.saturating_sub(1) * conv_dim],
            conv_dim,
            state: vec![0.0; v_heads * k_head_dim * v_head_dim],
            len: 0,
        }
    }

    /// Positions seen.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position was seen.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Back to the state before the first position.
    pub fn reset(&mut self) {
        self.conv.fill(0.0);
        self.state.fill(0.0);
        self.len = 0;
    }

    /// The conv history (oldest first) and the recurrent state, for one
    /// position's update; [`RecurrentState::advance`] counts it.
    pub fn parts(&mut self) -> (&mut [f32], usize, &mut [f32]) {
        (&mut self.conv, self.conv_dim, &mut self.state)
    }

    /// Counts one more position seen.
    pub fn advance(&mut self) {
        self.len += 1;
    }

    /// Whether `other` has this state's sizes (conv history and state).
    pub fn same_shape(&self, other: &RecurrentState) -> bool {
        self.conv_dim == other.conv_dim && self.conv.len() == other.conv.len() && self.state.len() == other.state.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.state.len()) * 4
    }
}
