//! charm's shared foundations: the pieces every other crate stands on.
//!
//! # Layout
//! - [`error`]: typed load errors that name the file and the tensor.
//! - [`dtype`]: the weight element types charm reads (F32, BF16, F16).
//! - [`weight`]: a weight matrix or vector, memory-mapped when it can be,
//!   and its matrix-vector / matrix-matrix products.
//! - [`safetensors`]: a model directory's safetensors files (single or
//!   sharded), memory-mapped, validated, looked up by tensor name.
//! - [`kernels`]: the scalar math on f32 activations (dot products, RMS
//!   norm, softmax, SiLU, argmax). Activations and accumulation are always
//!   f32, whatever the weight dtype.

pub mod dtype;
pub mod error;
pub mod kernels;
pub mod safetensors;
pub mod weight;

pub use dtype::DType;
pub use error::LoadError;
pub use safetensors::TensorFiles;
pub use weight::{Weight, WeightData};
