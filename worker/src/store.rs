//! Where an expert's weights come from.

use std::sync::Arc;

use charm_common::TensorFiles;
use charm_models::{ExpertError, ModelConfig, SwiGlu};

/// Resolves `(layer, expert)` to its weights.
pub trait ExpertStore: Send + Sync {
    /// The expert's FFN, or an error naming it when this store lacks it.
    fn get(&self, layer: u16, expert: u32) -> Result<Arc<SwiGlu>, ExpertError>;
}

/// Every routed expert of the model, memory-mapped from its safetensors
/// files. Shapes are checked for all of them at open, so a bad file fails
/// at start, not mid-answer.
pub struct ResidentStore {
    /// `experts[layer][expert]`; empty for dense layers.
    experts: Vec<Vec<Arc<SwiGlu>>>,
}

impl ResidentStore {
    /// Maps every routed expert named by `cfg` from `files`.
    pub fn open(files: &TensorFiles, cfg: &ModelConfig) -> Result<Self, ExpertError> {
        let names = cfg.family.moe_names();
        let mut experts = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let mut layer = Vec::new();
            if cfg.is_moe_layer(l) {
                for e in 0..cfg.num_experts {
                    let ffn = SwiGlu::load(
                        files,
                        &names.expert(l, e),
                        cfg.hidden_size,
                        cfg.moe_intermediate_size,
                    )?;
                    layer.push(Arc::new(ffn));
                }
            }
            experts.push(layer);
        }
        Ok(ResidentStore { experts })
    }

    /// Number of experts held.
    pub fn len(&self) -> usize {
        self.experts.iter().map(Vec::len).sum()
    }

    /// Whether no expert is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ExpertStore for ResidentStore {
    fn get(&self, layer: u16, expert: u32) -> Result<Arc<SwiGlu>, ExpertError> {
        self.experts
            .get(layer as usize)
            .and_then(|l| l.get(expert as usize))
            .cloned()
            .ok_or(ExpertError::MissingExpert { layer, expert })
    }
}
