//! `coordinator upcycle`: a dense GGUF model (e.g. SmolLM2) rebuilt as a
//! Mixture-of-Experts by *sparse upcycling*: every layer's MLP becomes `E`
//! experts — copies of it with small deterministic perturbations — behind a
//! seeded random router with renormalized top-k (Mixtral semantics). The
//! result is a Hugging Face `MixtralForCausalLM` directory (bf16 weights,
//! the GGUF's tokenizer and chat template) that every charm command reads.
//!
//! With `noise = 0` the experts are identical and the renormalized top-k
//! weights sum to one, so the MoE computes the dense model's function (up
//! to float rounding). With a small noise the routing still varies by token
//! (the router is random) while the answers stay the dense model's.
//! `experts = 0` exports the dense model itself as `LlamaForCausalLM`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use charm_common::Weight;
use charm_models::gguf::GgufModel;
use charm_models::{Family, ModelConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

/// How to upcycle.
#[derive(Clone, Debug)]
pub struct UpcycleOptions {
    /// Experts per layer (0: export the dense model unchanged).
    pub experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Perturbation of each expert copy, relative to the weight's RMS.
    pub noise: f32,
    /// Router weight scale, relative to `1/sqrt(hidden)`.
    pub router_gain: f32,
    pub seed: u64,
}

impl Default for UpcycleOptions {
    fn default() -> Self {
        UpcycleOptions {
            experts: 4,
            top_k: 2,
            noise: 0.02,
            router_gain: 4.0,
            seed: 0,
        }
    }
}

/// One tensor to write: name, shape, dtype name, and a producer of its bytes.
struct Planned {
    name: String,
    shape: Vec<usize>,
    dtype: &'static str,
    source: Source,
}

enum Source {
    /// bf16 of a dense matrix; `deinterleave` reorders q/k rows per head.
    Matrix {
        hf: String,
        rows: usize,
        cols: usize,
        deinterleave: Option<usize>,
    },
    /// An expert copy of a dense MLP matrix, perturbed.
    Expert {
        hf: String,
        rows: usize,
        cols: usize,
        layer: usize,
        expert: usize,
        proj: usize,
    },
    /// A random router `[experts, hidden]`.
    Router {
        layer: usize,
        experts: usize,
        hidden: usize,
    },
    /// An f32 vector (norms).
    Vector { hf: String, len: usize },
}

/// Upcycles the dense GGUF at `src` into a Hugging Face directory `out`.
pub fn upcycle(src: &Path, out: &Path, opts: &UpcycleOptions) -> Result<()> {
    if out.exists() {
        bail!("{}: already exists; remove it or choose another --out", out.display());
    }
    let gguf = GgufModel::open(src)?;
    let cfg = gguf.cfg.clone();
    if cfg.family != Family::Llama {
        bail!(
            "{}: upcycling needs a dense llama GGUF, this one is {:?}",
            src.display(),
            cfg.family
        );
    }
    if opts.experts > 0 && (opts.top_k == 0 || opts.top_k > opts.experts) {
        bail!("--top-k must be between 1 and --experts ({})", opts.experts);
    }
    let partial = crate::convert::partial_dir(out);
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    let result = write_dir(&gguf, &cfg, &partial, opts);
    match result {
        Ok(()) => {
            std::fs::rename(&partial, out)?;
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

fn plan(cfg: &ModelConfig, opts: &UpcycleOptions) -> Vec<Planned> {
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (q, kv) = (cfg.q_dim(), cfg.kv_dim());
    let mut out = Vec::new();
    let mat = |name: &str, rows: usize, cols: usize, deint: Option<usize>| Planned {
        name: name.to_string(),
        shape: vec![rows, cols],
        dtype: "BF16",
        source: Source::Matrix {
            hf: name.to_string(),
            rows,
            cols,
            deinterleave: deint,
        },
    };
    let vecf = |name: &str, len: usize| Planned {
        name: name.to_string(),
        shape: vec![len],
        dtype: "F32",
        source: Source::Vector {
            hf: name.to_string(),
            len,
        },
    };
    out.push(mat("model.embed_tokens.weight", v, h, None));
    if !cfg.tie_word_embeddings {
        out.push(mat("lm_head.weight", v, h, None));
    }
    out.push(vecf("model.norm.weight", h));
    let deint = cfg.qk_rows_interleaved.then_some(cfg.head_dim);
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        out.push(vecf(&format!("{p}.input_layernorm.weight"), h));
        out.push(vecf(&format!("{p}.post_attention_layernorm.weight"), h));
        out.push(mat(&format!("{p}.self_attn.q_proj.weight"), q, h, deint));
        out.push(mat(&format!("{p}.self_attn.k_proj.weight"), kv, h, deint));
        out.push(mat(&format!("{p}.self_attn.v_proj.weight"), kv, h, None));
        out.push(mat(&format!("{p}.self_attn.o_proj.weight"), h, q, None));
        let dense = [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)];
        if opts.experts == 0 {
            for (n, r, c) in dense {
                out.push(mat(&format!("{p}.mlp.{n}.weight"), r, c, None));
            }
            continue;
        }
        out.push(Planned {
            name: format!("{p}.block_sparse_moe.gate.weight"),
            shape: vec![opts.experts, h],
            dtype: "F32",
            source: Source::Router {
                layer: l,
                experts: opts.experts,
                hidden: h,
            },
        });
        for e in 0..opts.experts {
            for (proj, ((n, r, c), w)) in dense.into_iter().zip(["w1", "w3", "w2"]).enumerate() {
                out.push(Planned {
                    name: format!("{p}.block_sparse_moe.experts.{e}.{w}.weight"),
                    shape: vec![r, c],
                    dtype: "BF16",
                    source: Source::Expert {
                        hf: format!("{p}.mlp.{n}.weight"),
                        rows: r,
                        cols: c,
                        layer: l,
                        expert: e,
                        proj,
                    },
                });
            }
        }
    }
    out
}

fn bytes_of(p: &Planned) -> usize {
    p.shape.iter().product::<usize>() * if p.dtype == "F32" { 4 } else { 2 }
}

fn write_dir(gguf: &GgufModel, cfg: &ModelConfig, dir: &Path, opts: &UpcycleOptions) -> Result<()> {
    use charm_common::WeightSource;
    let tensors = plan(cfg, opts);
    // safetensors: 8-byte header length, JSON header, then the data in order.
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for t in &tensors {
        let n = bytes_of(t);
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut h = serde_json::to_vec(&header)?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let path = dir.join("model.safetensors");
    let mut w = BufWriter::with_capacity(
        1 << 20,
        File::create(&path).with_context(|| path.display().to_string())?,
    );
    w.write_all(&(h.len() as u64).to_le_bytes())?;
    w.write_all(&h)?;
    let mut row = Vec::new();
    for t in &tensors {
        match &t.source {
            Source::Vector { hf, len } => {
                for x in gguf.vector(hf, *len)? {
                    w.write_all(&x.to_le_bytes())?;
                }
            }
            Source::Router { layer, experts, hidden } => {
                let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ (0x5e1e_c7ed << 8) ^ (*layer as u64));
                let scale = opts.router_gain / (*hidden as f32).sqrt();
                for _ in 0..experts * hidden {
                    let x: f32 = normal(&mut rng) * scale;
                    w.write_all(&x.to_le_bytes())?;
                }
            }
            Source::Matrix {
                hf,
                rows,
                cols,
                deinterleave,
            } => {
                let m = gguf.matrix(hf, *rows, *cols)?;
                for r in 0..*rows {
                    let src_row = match deinterleave {
                        Some(hd) => interleaved_row(r, *hd),
                        None => r,
                    };
                    row.resize(*cols, 0.0);
                    m.row_into(src_row, &mut row);
                    write_bf16(&mut w, &row)?;
                }
            }
            Source::Expert {
                hf,
                rows,
                cols,
                layer,
                expert,
                proj,
            } => {
                let m: Weight = gguf.matrix(hf, *rows, *cols)?;
                let rms = matrix_rms(&m, *rows, *cols);
                let seed = opts.seed ^ ((*layer as u64) << 32) ^ ((*expert as u64) << 16) ^ (*proj as u64);
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                for r in 0..*rows {
                    row.resize(*cols, 0.0);
                    m.row_into(r, &mut row);
                    if opts.noise != 0.0 {
                        for x in row.iter_mut() {
                            *x += opts.noise * rms * normal(&mut rng);
                        }
                    }
                    write_bf16(&mut w, &row)?;
                }
            }
        }
    }
    w.flush()?;
    drop(w);

    let mut config = json!({
        "architectures": [if opts.experts > 0 { "MixtralForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": if opts.experts > 0 { "mixtral" } else { "llama" },
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_ids.first(),
        "charm_upcycled_from": gguf.file.path().file_name().map(|n| n.to_string_lossy().to_string()),
    });
    if opts.experts > 0 {
        config["num_local_experts"] = json!(opts.experts);
        config["num_experts_per_tok"] = json!(opts.top_k);
        config["sliding_window"] = serde_json::Value::Null;
        config["charm_upcycle"] = json!({"noise": opts.noise, "router_gain": opts.router_gain, "seed": opts.seed});
    }
    if cfg.rope_linear_factor != 1.0 {
        config["rope_scaling"] = json!({"rope_type": "linear", "factor": cfg.rope_linear_factor});
    }
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::to_vec_pretty(&json!({"eos_token_id": cfg.eos_token_ids, "bos_token_id": cfg.bos_token_id}))?,
    )?;
    crate::gguf_text::write_tokenizer_files(&gguf.file, dir)?;
    Ok(())
}

/// GGUF row holding Hugging Face row `r` of an interleaved q/k projection.
fn interleaved_row(r: usize, head_dim: usize) -> usize {
    let (head, within) = (r / head_dim, r % head_dim);
    let half = head_dim / 2;
    let (j, i) = (within / half, within % half);
    head * head_dim + 2 * i + j
}

fn matrix_rms(m: &Weight, rows: usize, cols: usize) -> f32 {
    let mut row = vec![0.0; cols];
    let mut sum = 0.0f64;
    for r in 0..rows {
        m.row_into(r, &mut row);
        sum += row.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>();
    }
    (sum / (rows * cols).max(1) as f64).sqrt() as f32
}

/// A standard normal draw (Box-Muller), reproducible from the stream.
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.gen::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.gen();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

fn write_bf16(w: &mut impl Write, row: &[f32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(row.len() * 2);
    for x in row {
        buf.extend_from_slice(&half::bf16::from_f32(*x).to_bits().to_le_bytes());
    }
    w.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::interleaved_row;

    #[test]
    fn interleaved_rows_map_back_to_halves() {
        // head_dim 4: HF rows (x0, x1, y0, y1) live at GGUF rows (x0, y0, x1, y1).
        let got: Vec<usize> = (0..8).map(|r| interleaved_row(r, 4)).collect();
        assert_eq!(got, vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }
}
