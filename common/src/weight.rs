//! Weights: a matrix `[rows, cols]` (row-major, the layout of a Hugging Face
//! `Linear.weight`: `out_features × in_features`) stored as F32, BF16 or F16,
//! and its products with f32 activations.
//!
//! Storage borrows the memory-mapped file when the bytes are aligned for
//! their type, and copies otherwise (safetensors does not promise
//! alignment).

use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;

use crate::dtype::{bf16_to_f32, f16_to_f32, DType};
use crate::kernels::{dot_bf16, dot_f16, dot_f32};

/// Elements of type `T`, either mapped from a file or owned.
pub struct Buf<T: bytemuck::Pod> {
    inner: BufInner<T>,
}

enum BufInner<T> {
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    },
    Owned(Vec<T>),
}

impl<T: bytemuck::Pod> Buf<T> {
    /// `len` elements starting at byte `start` of `map`; copied if the
    /// address is not aligned for `T`.
    pub fn mapped(map: Arc<Mmap>, start: usize, len: usize) -> Self {
        let bytes = &map[start..start + len * std::mem::size_of::<T>()];
        if (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            Buf {
                inner: BufInner::Mapped { map, start, len },
            }
        } else {
            let owned: Vec<T> = bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned)
                .collect();
            Buf {
                inner: BufInner::Owned(owned),
            }
        }
    }

    /// Owned elements.
    pub fn owned(v: Vec<T>) -> Self {
        Buf {
            inner: BufInner::Owned(v),
        }
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        match &self.inner {
            BufInner::Mapped { map, start, len } => {
                bytemuck::cast_slice(&map[*start..*start + len * std::mem::size_of::<T>()])
            }
            BufInner::Owned(v) => v,
        }
    }
}

/// Elements of a weight in their stored dtype.
pub enum WeightData {
    F32(Buf<f32>),
    BF16(Buf<u16>),
    F16(Buf<u16>),
}

impl WeightData {
    /// The stored dtype.
    pub fn dtype(&self) -> DType {
        match self {
            WeightData::F32(_) => DType::F32,
            WeightData::BF16(_) => DType::BF16,
            WeightData::F16(_) => DType::F16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            WeightData::F32(b) => b.as_slice().len(),
            WeightData::BF16(b) | WeightData::F16(b) => b.as_slice().len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element converted to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            WeightData::F32(b) => b.as_slice().to_vec(),
            WeightData::BF16(b) => b.as_slice().iter().map(|&x| bf16_to_f32(x)).collect(),
            WeightData::F16(b) => b.as_slice().iter().map(|&x| f16_to_f32(x)).collect(),
        }
    }
}

/// A weight matrix `[rows, cols]`, row-major.
pub struct Weight {
    rows: usize,
    cols: usize,
    data: WeightData,
}

/// Rows per rayon task: small enough to spread a 2-core or 16-core machine,
/// large enough that task overhead stays negligible.
const ROWS_PER_TASK: usize = 32;

impl Weight {
    /// Wraps `data` as a `[rows, cols]` matrix.
    ///
    /// # Panics
    /// If `data` does not hold exactly `rows * cols` elements (loaders check
    /// shapes before constructing, so this is a programming error).
    pub fn new(rows: usize, cols: usize, data: WeightData) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "weight data does not match its shape"
        );
        Weight { rows, cols, data }
    }

    /// An owned f32 matrix (tests, derived weights).
    pub fn from_f32(rows: usize, cols: usize, v: Vec<f32>) -> Self {
        Self::new(rows, cols, WeightData::F32(Buf::owned(v)))
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Stored dtype.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Row `r` converted to f32 into `out` (embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        let range = r * c..(r + 1) * c;
        match &self.data {
            WeightData::F32(b) => out.copy_from_slice(&b.as_slice()[range]),
            WeightData::BF16(b) => {
                for (o, &x) in out.iter_mut().zip(&b.as_slice()[range]) {
                    *o = bf16_to_f32(x);
                }
            }
            WeightData::F16(b) => {
                for (o, &x) in out.iter_mut().zip(&b.as_slice()[range]) {
                    *o = f16_to_f32(x);
                }
            }
        }
    }

    /// `dot(row r, x)` with f32 accumulation.
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        let c = self.cols;
        let range = r * c..(r + 1) * c;
        match &self.data {
            WeightData::F32(b) => dot_f32(&b.as_slice()[range], x),
            WeightData::BF16(b) => dot_bf16(&b.as_slice()[range], x),
            WeightData::F16(b) => dot_f16(&b.as_slice()[range], x),
        }
    }

    /// `out = W x` for one activation row (`x: cols`, `out: rows`), on the
    /// calling thread.
    pub fn matvec_seq(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        debug_assert_eq!(out.len(), self.rows);
        for (r, o) in out.iter_mut().enumerate() {
            *o = self.row_dot(r, x);
        }
    }

    /// `out = W x` for one activation row, output rows split across rayon.
    pub fn matvec(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!(x.len(), self.cols);
        debug_assert_eq!(out.len(), self.rows);
        out.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(chunk, o)| {
                let base = chunk * ROWS_PER_TASK;
                for (i, v) in o.iter_mut().enumerate() {
                    *v = self.row_dot(base + i, x);
                }
            });
    }

    /// `out[t] = W xs[t]` for `n` activation rows (`xs: n × cols`,
    /// `out: n × rows`). Every output element is the same [`Weight::row_dot`]
    /// as in [`Weight::matvec`], so batching never changes a bit.
    pub fn matmul(&self, xs: &[f32], n: usize, out: &mut [f32]) {
        debug_assert_eq!(xs.len(), n * self.cols);
        debug_assert_eq!(out.len(), n * self.rows);
        if n == 1 {
            return self.matvec(xs, out);
        }
        out.par_chunks_mut(self.rows)
            .zip(xs.par_chunks(self.cols))
            .for_each(|(o, x)| self.matvec_seq(x, o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_and_matmul_agree_bit_for_bit() {
        let rows = 70;
        let cols = 37;
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let w = Weight::from_f32(rows, cols, w);
        let xs: Vec<f32> = (0..3 * cols)
            .map(|i| ((i * 31) % 11) as f32 / 11.0 - 0.3)
            .collect();
        let mut batched = vec![0.0; 3 * rows];
        w.matmul(&xs, 3, &mut batched);
        for t in 0..3 {
            let mut one = vec![0.0; rows];
            w.matvec(&xs[t * cols..(t + 1) * cols], &mut one);
            assert_eq!(one, batched[t * rows..(t + 1) * rows]);
            let mut seq = vec![0.0; rows];
            w.matvec_seq(&xs[t * cols..(t + 1) * cols], &mut seq);
            assert_eq!(one, seq);
        }
    }

    #[test]
    fn bf16_rows_convert_exactly() {
        // 1.0, -2.0, 0.5 in bf16.
        let w = Weight::new(
            1,
            3,
            WeightData::BF16(Buf::owned(vec![0x3f80, 0xc000, 0x3f00])),
        );
        let mut row = vec![0.0; 3];
        w.row_into(0, &mut row);
        assert_eq!(row, vec![1.0, -2.0, 0.5]);
        assert_eq!(w.row_dot(0, &[1.0, 1.0, 2.0]), 0.0);
    }
}
