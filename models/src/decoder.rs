//! The decoder every supported family shares, stepped layer by layer.
//!
//! A step is a list of rows (tokens) with their positions, from one
//! sequence or several ([`Model::begin_many`]: each sequence's rows are
//! consecutive and attend through its own cache). For each layer
//! the engine calls [`Model::pre_experts`] (attention, norm, router; dense
//! MLP layers finish here) and, when it returns a batch, hands that batch
//! to an [`crate::ExpertService`] and gives the outputs back to
//! [`Model::post_experts`]. The model does no I/O and never waits: the
//! engine owns the calls to the expert service.

use std::path::Path;

use charm_common::kernels::{rms_norm_rows, sigmoid};
use charm_common::{LoadError, TensorFiles, Weight, WeightSource};
use charm_proto::{ExpertBatch, ExpertOutputs, PrefetchHint};

use crate::attention::{Attention, AttentionTimes};
use crate::config::{norm_weight, MixerKind, ModelConfig};
use crate::dsa_indexer::Selection;
use crate::error::{ExpertError, ModelError};
use crate::ffn::SwiGlu;
use crate::gated_delta_net::GatedDeltaNet;
use crate::group_router::SigmoidGroup;
use crate::kv_cache::{KvCache, KvDtype, LatentKv, LayerCache, LayerKv};
use crate::mla::Mla;
use crate::recurrent_state::RecurrentState;
use crate::rope::Rope;
use crate::router::{batch_union, Router, Scoring};

/// A loaded model: everything but the routed experts (those live in a worker).
pub struct Model {
    pub cfg: ModelConfig,
    /// `[vocab, hidden]`
    embed: Weight,
    layers: Vec<Layer>,
    /// `[hidden]`
    norm: Vec<f32>,
    /// `[vocab, hidden]`; `None` when tied to `embed`.
    lm_head: Option<Weight>,
    rope: Rope,
    /// Sliding-window layers' own rope, when their theta differs (MiMo-V2-Flash).
    rope_swa: Option<Rope>,
    /// What [`Model::new_cache`] stores keys and values in.
    pub kv_dtype: KvDtype,
}

struct Layer {
    /// `[hidden]`
    input_norm: Vec<f32>,
    mixer: Mixer,
    /// `[hidden]`
    post_norm: Vec<f32>,
    mlp: Mlp,
}

/// A layer's token mixer: `self_attn` (softmax or latent attention) or `linear_attn`.
enum Mixer {
    Attention(Box<Attention>),
    GatedDeltaNet(Box<GatedDeltaNet>),
    Mla(Box<Mla>),
}

enum Mlp {
    Dense(Box<SwiGlu>),
    Moe {
        router: Box<Router>,
        /// The shared expert: Qwen2-MoE's with its `[1, hidden]` sigmoid
        /// gate, or DeepSeek's ungated `shared_experts`.
        shared: Option<Box<(SwiGlu, Option<Weight>)>>,
    },
}

/// The rows of one step as they move through the layers.
pub struct StepState {
    positions: Vec<usize>,
    /// Each sequence's rows (consecutive, in the order of the caches the
    /// step attends through).
    seqs: Vec<std::ops::Range<usize>>,
    /// Residual stream, `n × hidden`.
    hidden: Vec<f32>,
    /// Gated shared-expert output of the current MoE layer, `n × hidden`.
    shared_out: Option<Vec<f32>>,
}

impl StepState {
    /// Rows in the step.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether the step has no rows.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Each sequence's rows in the step.
    pub fn seqs(&self) -> &[std::ops::Range<usize>] {
        &self.seqs
    }
}

impl Model {
    /// Loads config and dense weights from a Hugging Face model directory.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let cfg = ModelConfig::load(dir)?;
        let files = TensorFiles::open(dir)?;
        Self::from_files(cfg, &files)
    }

    /// Loads the dense weights of `cfg` from already opened files.
    pub fn from_files(cfg: ModelConfig, files: &dyn WeightSource) -> Result<Self, ModelError> {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let names = cfg.family.moe_names();
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let mlp = if cfg.is_moe_layer(l) {
                let shared = match cfg.shared_expert_intermediate_size {
                    Some(si) if cfg.shared_expert_gated => {
                        let n =
                            ["gate_proj", "up_proj", "down_proj"].map(|x| format!("{p}.mlp.shared_expert.{x}.weight"));
                        Some(Box::new((
                            SwiGlu::load(files, &n, h, si)?,
                            Some(files.matrix(&format!("{p}.mlp.shared_expert_gate.weight"), 1, h)?),
                        )))
                    }
                    Some(si) => {
                        let n =
                            ["gate_proj", "up_proj", "down_proj"].map(|x| format!("{p}.mlp.shared_experts.{x}.weight"));
                        Some(Box::new((SwiGlu::load(files, &n, h, si)?, None)))
                    }
                    None => None,
                };
                let scoring = match cfg.group_routing {
                    None if cfg.router_softmax_after_topk => Scoring::TopKSoftmax,
                    None => Scoring::Softmax {
                        renormalize: cfg.norm_topk_prob,
                    },
                    Some(g) => {
                        let bias = if g.bias {
                            files.vector(&names.router_bias(l), cfg.num_experts)?
                        } else {
                            vec![0.0; cfg.num_experts]
                        };
                        Scoring::SigmoidGroup(SigmoidGroup {
                            bias,
                            groups: g.groups,
                            topk_groups: g.topk_groups,
                            renormalize: cfg.norm_topk_prob,
                            scale: g.scale,
                        })
                    }
                };
                Mlp::Moe {
                    router: Box::new(Router {
                        weight: files.matrix(&names.router(l), cfg.num_experts, h)?,
                        bias: if cfg.router_bias {
                            Some(files.vector(&names.router_logit_bias(l), cfg.num_experts)?)
                        } else {
                            None
                        },
                        top_k: cfg.top_k,
                        scoring,
                    }),
                    shared,
                }
            } else {
                let n = ["gate_proj", "up_proj", "down_proj"].map(|x| format!("{p}.mlp.{x}.weight"));
                Mlp::Dense(Box::new(SwiGlu::load(files, &n, h, cfg.intermediate_size)?))
            };
            let mixer = match (cfg.mixers[l], cfg.delta_net, cfg.mla) {
                (MixerKind::GatedDeltaNet, Some(shape), _) => {
                    GatedDeltaNet::load(files, shape, h, cfg.rms_norm_eps, l).map(|d| Mixer::GatedDeltaNet(Box::new(d)))
                }
                (MixerKind::Mla, _, Some(shape)) => Mla::load(files, &cfg, shape, l).map(|m| Mixer::Mla(Box::new(m))),
                _ => Attention::load(files, &cfg, l).map(|a| Mixer::Attention(Box::new(a))),
            }
            .map_err(|source| mixer_error(files, l, cfg.mixers[l], source))?;
            layers.push(Layer {
                input_norm: norm_weight(files, &cfg, &format!("{p}.input_layernorm.weight"), h)?,
                mixer,
                post_norm: norm_weight(files, &cfg, &format!("{p}.post_attention_layernorm.weight"), h)?,
                mlp,
            });
        }
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(files.matrix("lm_head.weight", v, h)?)
        };
        Ok(Model {
            embed: files.matrix("model.embed_tokens.weight", v, h)?,
            norm: norm_weight(files, &cfg, "model.norm.weight", h)?,
            rope: match &cfg.rope_yarn {
                Some(y) => Rope::yarn(cfg.head_dim, cfg.rotary_dim, cfg.rope_theta, y),
                None => Rope::partial(cfg.head_dim, cfg.rotary_dim, cfg.rope_theta, cfg.rope_linear_factor),
            },
            rope_swa: cfg
                .swa
                .map(|s| Rope::partial(cfg.head_dim, cfg.rotary_dim, s.rope_theta, cfg.rope_linear_factor)),
            layers,
            lm_head,
            cfg,
            kv_dtype: KvDtype::default(),
        })
    }

    /// An empty cache for one sequence: keys and values for attention
    /// layers (bounded to the window for sliding ones), conv and recurrent
    /// state for gated DeltaNet layers.
    pub fn new_cache(&self) -> KvCache {
        KvCache::of(
            self.layers
                .iter()
                .enumerate()
                .map(|(i, l)| match &l.mixer {
                    Mixer::Attention(_) => LayerCache::attention(
                        self.cfg.kv_heads(i),
                        self.cfg.head_dim,
                        self.cfg.v_head_dim(),
                        self.kv_dtype,
                        self.cfg.sliding_window[i],
                    ),
                    Mixer::GatedDeltaNet(d) => LayerCache::Recurrent(d.new_state()),
                    Mixer::Mla(_) => LayerCache::latent(self.cfg.mla.map_or(0, |m| m.cache_width()), self.kv_dtype),
                })
                .collect(),
        )
    }

    /// Embeds `tokens` at positions `start..start + tokens.len()`.
    pub fn begin(&self, tokens: &[u32], start: usize) -> Result<StepState, ModelError> {
        self.begin_many(&[(tokens, start)])
    }

    /// Embeds several sequences' rows into one step: each `(tokens, start)`
    /// at positions `start..start + tokens.len()` of its own sequence. The
    /// layers then attend each sequence through its own cache (the caches
    /// handed to [`Model::attend_many_timed`], in this order) and run
    /// everything else, the routed experts' batch-union included, over all
    /// rows at once. Every kernel is row-independent and every row combines
    /// its experts in one order, so a sequence's bits do not depend on which
    /// others share its steps.
    pub fn begin_many(&self, parts: &[(&[u32], usize)]) -> Result<StepState, ModelError> {
        let h = self.cfg.hidden_size;
        let rows: usize = parts.iter().map(|(t, _)| t.len()).sum();
        let (mut positions, mut seqs) = (Vec::with_capacity(rows), Vec::with_capacity(parts.len()));
        let mut hidden = vec![0.0; rows * h];
        let mut row = 0;
        for &(tokens, start) in parts {
            if tokens.is_empty() {
                return Err(ModelError::BadInput("a sequence in the step has no tokens".into()));
            }
            if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
                return Err(ModelError::BadInput(format!(
                    "token id {bad} is outside the vocabulary (size {})",
                    self.cfg.vocab_size
                )));
            }
            for (r, &t) in hidden[row * h..(row + tokens.len()) * h]
                .chunks_exact_mut(h)
                .zip(tokens)
            {
                self.embed.row_into(t as usize, r);
            }
            positions.extend(start..start + tokens.len());
            seqs.push(row..row + tokens.len());
            row += tokens.len();
        }
        Ok(StepState {
            positions,
            seqs,
            hidden,
            shared_out: None,
        })
    }

    /// Attention and everything before the routed experts of `layer`.
    /// Returns the layer's batch-union, or `None` for a dense layer (which
    /// is then complete).
    pub fn pre_experts(&self, layer: usize, st: &mut StepState, cache: &mut KvCache) -> Option<ExpertBatch> {
        self.attend(layer, st, cache);
        self.route(layer, st)
    }

    /// The attention sublayer of `layer` (first half of [`Model::pre_experts`]).
    pub fn attend(&self, layer: usize, st: &mut StepState, cache: &mut KvCache) {
        self.attend_timed(layer, st, cache, &mut AttentionTimes::default())
    }

    /// [`Model::attend`], adding the time of attention's parts to `times`.
    pub fn attend_timed(&self, layer: usize, st: &mut StepState, cache: &mut KvCache, times: &mut AttentionTimes) {
        self.attend_many_timed(layer, st, &mut [cache], times)
    }

    /// The attention sublayer of `layer` for a step of several sequences
    /// ([`Model::begin_many`]): the mixer's products over all the rows at
    /// once (its weights read once for the step), and each sequence's rows
    /// through its own cache in `caches`.
    ///
    /// # Panics
    /// If `caches` does not hold one cache per sequence of the step.
    pub fn attend_many_timed(
        &self,
        layer: usize,
        st: &mut StepState,
        caches: &mut [&mut KvCache],
        times: &mut AttentionTimes,
    ) {
        assert_eq!(caches.len(), st.seqs.len(), "one cache per sequence of the step");
        let h = self.cfg.hidden_size;
        let l = &self.layers[layer];
        // hidden_states = residual + self_attn(input_layernorm(hidden_states))
        let mut xs = st.hidden.clone();
        rms_norm_rows(&mut xs, &l.input_norm, self.cfg.rms_norm_eps);
        let mut attn_out = vec![0.0; st.len() * h];
        // Every mixer kind runs its projections over every sequence's rows
        // at once, and what reads a cache or a state sequence by sequence.
        match &l.mixer {
            Mixer::Attention(a) => {
                let mut kvs: Vec<&mut LayerKv> = caches
                    .iter_mut()
                    .map(|c| match &mut c.layers[layer] {
                        LayerCache::Kv(kv) => kv,
                        _ => unreachable!("Model::new_cache gives every layer its mixer's cache"),
                    })
                    .collect();
                let rope = match (&self.rope_swa, self.cfg.sliding_window[layer]) {
                    (Some(swa), Some(_)) => swa,
                    _ => &self.rope,
                };
                a.forward_many_timed(&xs, &st.seqs, &st.positions, rope, &mut kvs, &mut attn_out, times);
            }
            Mixer::Mla(m) => {
                // A layer that shares an earlier layer's sparse-attention
                // selection reads it from that layer's cache, per sequence.
                let source = self.cfg.dsa.as_ref().map_or(layer, |d| d.source(layer));
                let mut latents: Vec<(&mut LatentKv, Option<&Selection>)> = caches
                    .iter_mut()
                    .map(|c| {
                        let (before, rest) = c.layers.split_at_mut(layer);
                        let LayerCache::Latent(own) = &mut rest[0] else {
                            unreachable!("Model::new_cache gives every layer its mixer's cache")
                        };
                        let shared = match before.get(source) {
                            Some(LayerCache::Latent(c)) if source < layer => Some(c.selection()),
                            _ => None,
                        };
                        (own, shared)
                    })
                    .collect();
                m.forward_many_timed(
                    &xs,
                    &st.seqs,
                    &st.positions,
                    &self.rope,
                    &mut latents,
                    &mut attn_out,
                    times,
                );
            }
            Mixer::GatedDeltaNet(d) => {
                let mut states: Vec<&mut RecurrentState> = caches
                    .iter_mut()
                    .zip(&st.seqs)
                    .map(|(c, rows)| match &mut c.layers[layer] {
                        LayerCache::Recurrent(state) => {
                            debug_assert_eq!(
                                state.len(),
                                st.positions[rows.start],
                                "positions must continue the state"
                            );
                            state
                        }
                        _ => unreachable!("Model::new_cache gives every layer its mixer's cache"),
                    })
                    .collect();
                d.forward_many_timed(&xs, &st.seqs, &mut states, &mut attn_out, times);
            }
        }
        add_into(&mut st.hidden, &attn_out);
    }

    /// The MLP half of `layer` up to the experts (second half of
    /// [`Model::pre_experts`]): norm, then the dense MLP (returns `None`) or
    /// shared expert + router (returns the batch-union).
    pub fn route(&self, layer: usize, st: &mut StepState) -> Option<ExpertBatch> {
        let (h, n) = (self.cfg.hidden_size, st.len());
        let eps = self.cfg.rms_norm_eps;
        let l = &self.layers[layer];

        // hidden_states = post_attention_layernorm(hidden_states)
        let mut xs = st.hidden.clone();
        rms_norm_rows(&mut xs, &l.post_norm, eps);
        match &l.mlp {
            Mlp::Dense(ffn) => {
                let mut out = vec![0.0; n * h];
                ffn.forward(&xs, n, &mut out);
                add_into(&mut st.hidden, &out);
                None
            }
            Mlp::Moe { router, shared } => {
                st.shared_out = shared.as_deref().map(|(ffn, gate)| {
                    let mut out = vec![0.0; n * h];
                    ffn.forward(&xs, n, &mut out);
                    // shared_expert_output = F.sigmoid(self.shared_expert_gate(x)) * shared_expert(x)
                    // (DeepSeek: hidden_states + self.shared_experts(residuals), ungated)
                    if let Some(gate) = gate {
                        for (row, x) in out.chunks_exact_mut(h).zip(xs.chunks_exact(h)) {
                            let g = sigmoid(gate.row_dot(0, x));
                            row.iter_mut().for_each(|v| *v *= g);
                        }
                    }
                    out
                });
                let choices = router.route(&xs, n);
                Some(batch_union(layer as u16, h, xs, &choices))
            }
        }
    }

    /// One-layer-ahead prediction: the next MoE layer's router applied to
    /// this layer's MoE input `xs` (`n × hidden`, i.e. `batch.rows`).
    /// Returns that layer and the union of its predicted top-k experts.
    pub fn predict_next(&self, layer: usize, xs: &[f32]) -> Option<PrefetchHint> {
        let next = (layer + 1..self.cfg.num_layers).find(|&l| self.cfg.is_moe_layer(l))?;
        let Mlp::Moe { router, .. } = &self.layers[next].mlp else {
            return None;
        };
        let n = xs.len() / self.cfg.hidden_size;
        let mut experts: Vec<u32> = router.route(xs, n).into_iter().flatten().map(|(e, _)| e).collect();
        experts.sort_unstable();
        experts.dedup();
        Some(PrefetchHint {
            layer: next as u16,
            experts,
        })
    }

    /// Combines the experts' outputs of `layer` into the residual stream.
    ///
    /// Each row sums its experts' weighted outputs in ascending expert order,
    /// whichever service computed them and in whatever order they came
    /// back: the canonical order that keeps placement out of the bits.
    pub fn post_experts(
        &self,
        layer: usize,
        st: &mut StepState,
        batch: &ExpertBatch,
        outputs: &ExpertOutputs,
    ) -> Result<(), ModelError> {
        let h = self.cfg.hidden_size;
        let ordered = outputs.in_batch_order(batch).map_err(ExpertError::from)?;
        debug_assert_eq!(batch.layer as usize, layer);
        let mut moe = vec![0.0f32; st.len() * h];
        for (g, out) in batch.groups.iter().zip(ordered) {
            for (&r, y) in g.rows.iter().zip(out.out.chunks_exact(h)) {
                add_into(&mut moe[r as usize * h..(r as usize + 1) * h], y);
            }
        }
        // final_hidden_states = final_hidden_states + shared_expert_output
        if let Some(shared) = st.shared_out.take() {
            add_into(&mut moe, &shared);
        }
        add_into(&mut st.hidden, &moe);
        Ok(())
    }

    /// Final norm and LM head for the step's rows `from..` (the last row
    /// only during generation; every row for teacher forcing).
    /// Returns `(rows - from) × vocab` logits.
    pub fn logits(&self, st: &StepState, from: usize) -> Vec<f32> {
        let rows: Vec<usize> = (from..st.len()).collect();
        self.logits_of(st, &rows)
    }

    /// Final norm and LM head for the step's `rows` (say, each sequence's
    /// last). Returns `rows.len() × vocab` logits, in that order.
    pub fn logits_of(&self, st: &StepState, rows: &[usize]) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let n = rows.len();
        let mut xs: Vec<f32> = rows
            .iter()
            .flat_map(|&r| st.hidden[r * h..(r + 1) * h].iter().copied())
            .collect();
        rms_norm_rows(&mut xs, &self.norm, self.cfg.rms_norm_eps);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut out = vec![0.0; n * self.cfg.vocab_size];
        head.matmul(&xs, n, &mut out);
        out
    }
}

/// A mixer that failed to load: when the weights hold the other kind's
/// tensors for that layer, say the config's layer types are wrong.
fn mixer_error(files: &dyn WeightSource, layer: usize, kind: MixerKind, source: LoadError) -> ModelError {
    let p = format!("model.layers.{layer}");
    let has_linear = files.contains(&format!("{p}.linear_attn.out_proj.weight"));
    let has_attn = files.contains(&format!("{p}.self_attn.o_proj.weight"));
    match kind {
        MixerKind::Attention if has_linear && !has_attn => ModelError::LayerKind {
            layer,
            configured: "full attention",
            found: "linear_attn (gated DeltaNet)",
            source: Box::new(source),
        },
        MixerKind::GatedDeltaNet if has_attn && !has_linear => ModelError::LayerKind {
            layer,
            configured: "linear attention (gated DeltaNet)",
            found: "self_attn",
            source: Box::new(source),
        },
        _ => ModelError::Load(source),
    }
}

fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}
