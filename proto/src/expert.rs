//! The batch-union of one MoE layer step and the outputs returned for it.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One MoE layer's routed work, already grouped by expert.
///
/// Every row's activation is carried once (`rows`, row-major
/// `n_rows × hidden`); each [`ExpertGroup`] names the rows that chose that
/// expert and their gate weights. Groups are sorted by expert id and each
/// expert appears at most once: every unique expert is read and run once per
/// layer step, whatever the number of rows that chose it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertBatch {
    /// Decoder layer index.
    pub layer: u16,
    /// Width of one activation row.
    pub hidden: u32,
    /// Activations, `n_rows × hidden`, row-major.
    pub rows: Vec<f32>,
    /// Routed groups, sorted by `expert`, no duplicates.
    pub groups: Vec<ExpertGroup>,
    /// Prediction of the next MoE layer's experts, to read ahead
    /// (advisory: never changes the result).
    #[serde(default)]
    pub next: Option<PrefetchHint>,
}

/// The experts a later layer is predicted to need.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefetchHint {
    pub layer: u16,
    /// Sorted, unique.
    pub experts: Vec<u32>,
}

/// The rows that chose one expert, with their gate weights.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertGroup {
    /// Expert index within the layer.
    pub expert: u32,
    /// Indices into [`ExpertBatch::rows`].
    pub rows: Vec<u32>,
    /// Gate weight of this expert for each row in `rows`.
    pub weights: Vec<f32>,
}

/// What an expert service returns for an [`ExpertBatch`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertOutputs {
    /// Decoder layer index (echoes the batch).
    pub layer: u16,
    /// One entry per group of the batch, any order.
    pub groups: Vec<GroupOutput>,
}

/// The weighted outputs of one expert: `weight[i] * ffn(rows[i])` for every
/// row of its group, `group.rows.len() × hidden`, row-major.
///
/// Outputs are returned per expert and summed by the coordinator in a
/// canonical order, so the result's bits do not depend on which worker ran
/// which expert (floating-point addition is not associative).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupOutput {
    /// Expert index within the layer.
    pub expert: u32,
    /// Weighted outputs, `rows × hidden`.
    pub out: Vec<f32>,
}

/// A batch or an output set whose shapes do not add up.
#[derive(Debug, Error, PartialEq)]
pub enum BatchError {
    /// `rows.len()` is not a multiple of `hidden` (or `hidden` is zero).
    #[error("activation buffer of {len} floats is not a whole number of rows of width {hidden}")]
    RaggedRows { len: usize, hidden: u32 },
    /// A group's `rows` and `weights` lists differ in length.
    #[error("expert {expert}: {rows} rows but {weights} weights")]
    WeightCount { expert: u32, rows: usize, weights: usize },
    /// A group names a row the batch does not carry.
    #[error("expert {expert}: row {row} out of range (batch has {n_rows} rows)")]
    RowOutOfRange { expert: u32, row: u32, n_rows: usize },
    /// Groups are not strictly increasing by expert id.
    #[error("expert groups are not sorted and unique at expert {expert}")]
    UnsortedGroups { expert: u32 },
    /// A group names the same row twice.
    #[error("expert {expert}: row {row} appears twice")]
    DuplicateRow { expert: u32, row: u32 },
    /// A group names an expert the model does not have.
    #[error("expert {expert} out of range (the layer has {num_experts} experts)")]
    ExpertOutOfRange { expert: u32, num_experts: u32 },
    /// The batch routes more rows to experts than the model's top-k allows.
    #[error("{routed} routed rows for {n_rows} rows: more than {per_row} experts per row")]
    TooManyRoutes { routed: usize, n_rows: usize, per_row: u32 },
    /// An output is missing for a group, or names an expert not in the batch.
    #[error("outputs do not match the batch: {0}")]
    OutputMismatch(String),
}

impl ExpertBatch {
    /// Number of activation rows carried.
    pub fn n_rows(&self) -> usize {
        if self.hidden == 0 {
            0
        } else {
            self.rows.len() / self.hidden as usize
        }
    }

    /// Activation of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        let h = self.hidden as usize;
        &self.rows[i * h..(i + 1) * h]
    }

    /// Checks every length and index; run on anything that crossed a seam.
    pub fn validate(&self) -> Result<(), BatchError> {
        let h = self.hidden as usize;
        if h == 0 || !self.rows.len().is_multiple_of(h) {
            return Err(BatchError::RaggedRows {
                len: self.rows.len(),
                hidden: self.hidden,
            });
        }
        let n_rows = self.rows.len() / h;
        let mut prev: Option<u32> = None;
        // `seen[r]` is the number (1-based) of the last group that named row r.
        let mut seen = vec![0u32; n_rows];
        for (gi, g) in self.groups.iter().enumerate() {
            if prev.is_some_and(|p| p >= g.expert) {
                return Err(BatchError::UnsortedGroups { expert: g.expert });
            }
            prev = Some(g.expert);
            if g.rows.len() != g.weights.len() {
                return Err(BatchError::WeightCount {
                    expert: g.expert,
                    rows: g.rows.len(),
                    weights: g.weights.len(),
                });
            }
            for &row in &g.rows {
                let Some(stamp) = seen.get_mut(row as usize) else {
                    return Err(BatchError::RowOutOfRange {
                        expert: g.expert,
                        row,
                        n_rows,
                    });
                };
                if *stamp == gi as u32 + 1 {
                    return Err(BatchError::DuplicateRow { expert: g.expert, row });
                }
                *stamp = gi as u32 + 1;
            }
        }
        Ok(())
    }

    /// [`ExpertBatch::validate`], and the bounds a model's shapes set: every
    /// expert id below `num_experts`, and at most `per_row` experts routed
    /// per row in all (so the outputs a batch asks for are bounded by its
    /// activations, whatever the groups say).
    pub fn validate_for(&self, num_experts: u32, per_row: u32) -> Result<(), BatchError> {
        self.validate()?;
        if let Some(g) = self.groups.iter().find(|g| g.expert >= num_experts) {
            return Err(BatchError::ExpertOutOfRange {
                expert: g.expert,
                num_experts,
            });
        }
        let routed: usize = self.groups.iter().map(|g| g.rows.len()).sum();
        let n_rows = self.n_rows();
        if routed > n_rows.saturating_mul(per_row as usize) {
            return Err(BatchError::TooManyRoutes {
                routed,
                n_rows,
                per_row,
            });
        }
        Ok(())
    }
}

impl ExpertOutputs {
    /// Checks that there is exactly one output per group of `batch`, of the
    /// right size, and returns them in the batch's group order.
    pub fn in_batch_order<'a>(&'a self, batch: &ExpertBatch) -> Result<Vec<&'a GroupOutput>, BatchError> {
        if self.layer != batch.layer {
            return Err(BatchError::OutputMismatch(format!(
                "outputs for layer {} returned for layer {}",
                self.layer, batch.layer
            )));
        }
        if self.groups.len() != batch.groups.len() {
            return Err(BatchError::OutputMismatch(format!(
                "{} outputs for {} expert groups",
                self.groups.len(),
                batch.groups.len()
            )));
        }
        let h = batch.hidden as usize;
        let mut ordered = Vec::with_capacity(batch.groups.len());
        for g in &batch.groups {
            let out = self
                .groups
                .iter()
                .find(|o| o.expert == g.expert)
                .ok_or_else(|| BatchError::OutputMismatch(format!("no output for expert {}", g.expert)))?;
            if out.out.len() != g.rows.len() * h {
                return Err(BatchError::OutputMismatch(format!(
                    "expert {}: {} floats for {} rows of width {h}",
                    g.expert,
                    out.out.len(),
                    g.rows.len()
                )));
            }
            ordered.push(out);
        }
        Ok(ordered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> ExpertBatch {
        ExpertBatch {
            layer: 3,
            hidden: 2,
            rows: vec![1.0, 2.0, 3.0, 4.0],
            groups: vec![
                ExpertGroup {
                    expert: 1,
                    rows: vec![0, 1],
                    weights: vec![0.5, 0.25],
                },
                ExpertGroup {
                    expert: 5,
                    rows: vec![1],
                    weights: vec![0.75],
                },
            ],
            next: None,
        }
    }

    #[test]
    fn valid_batch_passes() {
        let b = batch();
        assert_eq!(b.validate(), Ok(()));
        assert_eq!(b.n_rows(), 2);
        assert_eq!(b.row(1), &[3.0, 4.0]);
    }

    #[test]
    fn every_bad_shape_is_named() {
        let mut b = batch();
        b.rows.push(9.0);
        assert!(matches!(b.validate(), Err(BatchError::RaggedRows { .. })));
        let mut b = batch();
        b.groups[0].weights.pop();
        assert!(matches!(b.validate(), Err(BatchError::WeightCount { expert: 1, .. })));
        let mut b = batch();
        b.groups[1].rows[0] = 2;
        assert!(matches!(b.validate(), Err(BatchError::RowOutOfRange { row: 2, .. })));
        let mut b = batch();
        b.groups.swap(0, 1);
        assert!(matches!(b.validate(), Err(BatchError::UnsortedGroups { .. })));
        let mut b = batch();
        b.hidden = 0;
        assert!(matches!(b.validate(), Err(BatchError::RaggedRows { .. })));
    }

    #[test]
    fn a_row_repeated_in_a_group_is_refused() {
        // A few bytes on the wire must not become gigabytes of outputs.
        let mut b = batch();
        b.groups[0].rows = vec![1, 0, 1];
        b.groups[0].weights = vec![0.5; 3];
        assert_eq!(b.validate(), Err(BatchError::DuplicateRow { expert: 1, row: 1 }));
        // The same row in two groups is routing, not a repeat.
        assert_eq!(batch().validate(), Ok(()));
    }

    #[test]
    fn model_bounds_refuse_foreign_experts_and_excess_routes() {
        let b = batch();
        assert_eq!(b.validate_for(6, 2), Ok(()));
        assert_eq!(
            b.validate_for(5, 2),
            Err(BatchError::ExpertOutOfRange {
                expert: 5,
                num_experts: 5
            })
        );
        // Three routed rows over two activation rows: more than one per row.
        assert_eq!(
            b.validate_for(6, 1),
            Err(BatchError::TooManyRoutes {
                routed: 3,
                n_rows: 2,
                per_row: 1
            })
        );
    }

    #[test]
    fn outputs_are_matched_to_groups() {
        let b = batch();
        let out = ExpertOutputs {
            layer: 3,
            groups: vec![
                GroupOutput {
                    expert: 5,
                    out: vec![0.0; 2],
                },
                GroupOutput {
                    expert: 1,
                    out: vec![0.0; 4],
                },
            ],
        };
        let ordered = out.in_batch_order(&b).unwrap();
        assert_eq!(ordered[0].expert, 1);
        assert_eq!(ordered[1].expert, 5);
        let short = ExpertOutputs {
            layer: 3,
            groups: vec![
                GroupOutput {
                    expert: 5,
                    out: vec![0.0; 2],
                },
                GroupOutput {
                    expert: 1,
                    out: vec![0.0; 3],
                },
            ],
        };
        assert!(short.in_batch_order(&b).is_err());
        let wrong_layer = ExpertOutputs {
            layer: 2,
            groups: out.groups.clone(),
        };
        assert!(wrong_layer.in_batch_order(&b).is_err());
    }
}
