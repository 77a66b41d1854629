//! charm's shared foundations: the pieces every other crate stands on.
//!
//! # Layout
//! - [`arithmetic`]: the version of the bits charm's kernels compute,
//!   checked between coordinator and workers and in the prefix cache.
//! - [`error`]: typed load errors that name the file and the tensor.
//! - [`dtype`]: the weight element types charm reads (F32, BF16, F16).
//! - [`quant`]: charm's quantized formats (symmetric INT8 and INT4 with f32
//!   group scales): their exact layout, quantizers and dequantizers.
//! - [`weight`]: a weight matrix or vector, memory-mapped when it can be,
//!   and its matrix-vector / matrix-matrix products.
//! - [`container`]: charm's model container (dense file + one record per
//!   expert, 4 KiB aligned, checksummed) — manifest, layout, checks.
//! - [`safetensors`]: a model directory's safetensors files (single or
//!   sharded), memory-mapped, validated, looked up by tensor name.
//! - [`fp8`]: block-scaled FP8 (`F8_E4M3` + `weight_scale_inv`) weights,
//!   read as their bf16 dequantization.
//! - [`gguf`]: GGUF files (v2/v3), memory-mapped and validated: metadata,
//!   tensor table, GGML block types with their reference dequantization
//!   and dot products; tensors become [`Weight`]s without re-quantizing.
//! - [`source`]: [`WeightSource`], tensors by Hugging Face name from any
//!   file format.
//! - [`kernels`]: the scalar math on f32 activations (dot products, RMS
//!   norm, softmax, SiLU, argmax), with a scalar reference and a fast path
//!   for each quantized dot; f32 activations and accumulation for F32,
//!   BF16, F16 and charm's INT8 / INT4.
//! - [`gguf::qdot`]: integer dot products of GGML quantized blocks with
//!   8-bit activations (scalar reference, AVX2, AVX-512 VNNI, NEON).
//! - [`hugemem`]: read-only buffers on transparent huge pages, for the
//!   repacked weight copies decode streams.
//! - [`load_progress`]: bytes of weights made so far (a loading progress
//!   bar's count).
//! - [`memory`]: memory the process can still take (`MemAvailable`, capped
//!   by its cgroup limit), which repacking and cache budgets size by.
//! - [`prefetch`]: the software prefetch decode's streaming loops issue
//!   (a hint: never a different result).
//! - [`warm`]: keeps rayon's threads awake through a decode step (no
//!   wake-up per parallel loop).
//! - [`isa`]: the instruction sets the kernels are compiled for, detected
//!   at run time (`CHARM_ISA` picks one); every one gives the same bits.

pub mod arithmetic;
pub mod container;
pub mod dtype;
pub mod error;
pub mod fp8;
pub mod gguf;
pub mod hugemem;
pub mod isa;
pub mod kernels;
pub mod load_progress;
pub mod memory;
pub mod prefetch;
pub mod quant;
pub mod safetensors;
pub mod source;
pub mod warm;
pub mod weight;

pub use arithmetic::ARITHMETIC;
pub use dtype::DType;
pub use error::LoadError;
pub use isa::Isa;
pub use quant::{QuantError, WeightFormat};
pub use safetensors::TensorFiles;
pub use source::{MlaHeads, WeightSource};
pub use weight::{Buf, ByteSource, Weight, WeightData};
