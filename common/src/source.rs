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
}

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
