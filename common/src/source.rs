//! Where a model's tensors come from, by their Hugging Face names: a
//! directory of safetensors files ([`crate::TensorFiles`]), a GGUF file seen
//! through a name map, or a container's dense file. Model code loads
//! through this trait and never knows which.

use crate::error::LoadError;
use crate::weight::Weight;

/// Tensors by Hugging Face name.
pub trait WeightSource: Send + Sync {
    /// A 2-D weight `[rows, cols]`, checked against the expected shape.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError>;

    /// A 1-D tensor of `len` elements as f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError>;

    /// A tensor of exactly `shape` as f32, row-major (e.g. a conv weight).
    fn array(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError>;

    /// Whether a tensor of that name exists.
    fn contains(&self, name: &str) -> bool;

    /// A 2-D weight as [`WeightSource::matrix`] gives it, or — where a
    /// source stores its columns in another order and moving them would
    /// cost the stored format (a GGUF block spanning the moved units) — the
    /// matrix as stored and `order`, the stored column of each model
    /// column: the caller then moves its inputs instead
    /// (`x_stored[order[c]] = x[c]`), which keeps the stored blocks.
    fn matrix_in_stored_order(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<(Weight, Option<Vec<usize>>), LoadError> {
        Ok((self.matrix(name, rows, cols)?, None))
    }

    /// Layer `layer`'s MLA up-projections per head as latent attention
    /// multiplies them — `W_UKᵀ` (`kv_lora_rank × nope`) and `W_UV` (`v ×
    /// kv_lora_rank`), `dims = (kv_lora_rank, nope, v)` — where the source
    /// stores them so (GGUF's `attn_k_b` / `attn_v_b`), in their stored
    /// type: products read those bytes, not an f32 copy. `None` where the
    /// caller splits `kv_b_proj` itself.
    fn mla_heads(
        &self,
        _layer: usize,
        _heads: usize,
        _dims: (usize, usize, usize),
    ) -> Result<Option<MlaHeads>, LoadError> {
        Ok(None)
    }
}

/// Per head, MLA's `W_UKᵀ` and `W_UV` ([`WeightSource::mla_heads`]).
pub type MlaHeads = (Vec<Weight>, Vec<Weight>);

impl WeightSource for crate::TensorFiles {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        crate::TensorFiles::matrix(self, name, rows, cols)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        crate::TensorFiles::vector(self, name, len)
    }

    fn array(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        crate::TensorFiles::array(self, name, shape)
    }

    fn contains(&self, name: &str) -> bool {
        crate::TensorFiles::contains(self, name)
    }
}
