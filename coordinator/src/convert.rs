//! `coordinator convert`: a Hugging Face directory → a charm container
//! (see `charm_common::container` for the format).
//!
//! Streams tensor by tensor (memory bounded by one expert, never the whole
//! model), writes into `OUT.partial/` and publishes it by renaming to `OUT`
//! only when everything is written and synced, so an interrupted or failed
//! run never leaves something that looks like a finished container. A rerun
//! removes a leftover `OUT.partial/` and starts over.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use charm_common::container::{
    dense_identity, put_record_bias, record_layout_typed, Manifest, Quant, Record, DENSE_FILE, EXPERTS_FILE,
    FORMAT_NAME, FORMAT_VERSION, MANIFEST, RECORD_ALIGN,
};
use charm_common::dtype::{bf16_to_f32, f16_to_f32};
use charm_common::gguf::GgmlType;
use charm_common::quant::{quantize_int4, quantize_int8};
use charm_common::safetensors::TensorRef;
use charm_common::{DType, TensorFiles};
use charm_models::{GluAct, ModelConfig};
use indicatif::{ProgressBar, ProgressStyle};
use safetensors::tensor::{Dtype as StDtype, View};
use sha2::{Digest, Sha256};

/// Files copied verbatim from the source directory when present.
const COPIED: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
];

/// What `convert` produced.
#[derive(Debug)]
pub struct ConvertSummary {
    pub out: PathBuf,
    pub experts: usize,
    pub expert_bytes: u64,
    pub dense_bytes: u64,
    pub fingerprint: String,
}

/// Converts the Hugging Face model in `src` into a container at `out`.
pub fn convert(src: &Path, out: &Path, quant: Quant, progress: bool) -> Result<ConvertSummary> {
    if charm_common::container::is_container(src) {
        bail!("{}: already a charm container", src.display());
    }
    if out.exists() {
        bail!("{}: already exists; remove it or choose another --out", out.display());
    }
    let partial = partial_dir(out);
    if partial.exists() {
        eprintln!("removing unfinished conversion {}", partial.display());
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let result = if crate::engine::is_gguf(src) {
        crate::convert_gguf::write_container(src, &partial)
    } else {
        write_container(src, &partial, quant, progress)
    };
    match result {
        Ok(mut summary) => {
            std::fs::rename(&partial, out)
                .with_context(|| format!("publishing {} as {}", partial.display(), out.display()))?;
            summary.out = out.to_path_buf();
            Ok(summary)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

/// `OUT.partial` next to `OUT`.
pub fn partial_dir(out: &Path) -> PathBuf {
    let mut name = out.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

fn write_container(src: &Path, dir: &Path, quant: Quant, progress: bool) -> Result<ConvertSummary> {
    let cfg = ModelConfig::load(src)?;
    let files = TensorFiles::open(src)?;
    let names = cfg.family.moe_names();
    // Experts stored in GGML blocks (gpt-oss's MXFP4) are kept as they are.
    let ggml_types = match stored_type(&cfg, &files)? {
        Some(ty) if quant == Quant::Gguf => Some([ty.id(); 3]),
        Some(ty) => bail!(
            "the experts are stored as {}: convert keeps them as they are",
            ty.name()
        ),
        None => None,
    };
    let mut layout = record_layout_typed(cfg.hidden_size, cfg.moe_intermediate_size, quant, ggml_types)?;
    if cfg.expert_bias {
        layout = layout.with_bias(cfg.hidden_size, cfg.moe_intermediate_size)?;
    }

    // Which tensors are routed experts (and their biases), and which are routers.
    let mut expert_names = std::collections::HashSet::new();
    let mut routers = std::collections::HashSet::new();
    for l in (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)) {
        routers.insert(names.router(l));
        for e in 0..cfg.num_experts {
            let proj = names.expert(l, e);
            if cfg.expert_bias {
                expert_names.extend(proj.iter().map(|n| bias_name(n)));
            }
            expert_names.extend(proj);
        }
    }
    let n_experts = cfg.num_layers * cfg.num_experts;
    let bar = if progress {
        ProgressBar::new((files.names().len() - expert_names.len() + n_experts) as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} tensors ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );

    // Dense part: everything but routed experts; norms and routers as f32.
    bar.set_message("dense");
    let mut dense: Vec<(String, DenseView)> = Vec::new();
    for name in files.names() {
        // FP8 scale grids go with their weights, dequantized to bf16.
        if expert_names.contains(name) || files.is_fp8_scale(name) {
            continue;
        }
        let t = files.get(name)?;
        let to_f32 = t.shape.len() == 1 || routers.contains(name);
        dense.push((name.to_string(), DenseView::new(&t, to_f32)));
        bar.inc(1);
    }
    let dense_path = dir.join(DENSE_FILE);
    safetensors::tensor::serialize_to_file(dense.iter().map(|(n, v)| (n.as_str(), v)), None, &dense_path)
        .with_context(|| format!("writing {}", dense_path.display()))?;
    drop(dense);
    sync(&dense_path)?;
    let (dense_len, dense_header_crc32) = dense_identity(&dense_path)?;

    // Experts: one record each, gate/up/down adjacent, 4 KiB aligned.
    bar.set_message("experts");
    let experts_path = dir.join(EXPERTS_FILE);
    let file = File::create(&experts_path).with_context(|| format!("creating {}", experts_path.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut records = Vec::new();
    let mut offset = 0u64;
    let padded = (layout.len as u64).div_ceil(RECORD_ALIGN) * RECORD_ALIGN;
    let mut buf = vec![0u8; padded as usize];
    for l in (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)) {
        for e in 0..cfg.num_experts {
            buf.fill(0);
            let proj = names.expert(l, e);
            for (part, name) in layout.parts.iter().zip(&proj) {
                let t = files.get(name)?;
                t.expect_shape(&[part.rows, part.cols])?;
                let dst = &mut buf[part.offset..part.offset + part.scale_bytes + part.value_bytes];
                encode_part(&t, quant, part.group, part.rows, part.cols, dst)
                    .with_context(|| format!("{}: tensor {name}", t.path.display()))?;
            }
            if cfg.expert_bias {
                let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
                let [g, u, d] =
                    [(&proj[0], i), (&proj[1], i), (&proj[2], h)].map(|(n, len)| files.vector(&bias_name(n), len));
                put_record_bias(&mut buf, &layout, [&g?, &u?, &d?])?;
            }
            let crc32 = crc32fast::hash(&buf[..layout.len]);
            w.write_all(&buf)
                .with_context(|| format!("writing {}", experts_path.display()))?;
            records.push(Record {
                layer: l as u16,
                expert: e as u32,
                offset,
                len: layout.len as u64,
                crc32,
                ggml_types,
            });
            offset += padded;
            bar.inc(1);
        }
    }
    w.flush()
        .with_context(|| format!("writing {}", experts_path.display()))?;
    drop(w);
    sync(&experts_path)?;

    for name in COPIED {
        let from = src.join(name);
        if from.exists() {
            std::fs::copy(&from, dir.join(name)).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json"))?)?;
    let architecture = cfg.family.architecture().to_string();

    // Fingerprint: architecture, config, quantization, dense bytes, records.
    let mut h = Sha256::new();
    h.update(architecture.as_bytes());
    h.update(config.to_string().as_bytes());
    h.update(serde_json::to_string(&quant)?.as_bytes());
    let glu_clamp = glu_clamp(&cfg);
    if let Some([alpha, limit]) = glu_clamp {
        h.update(alpha.to_le_bytes());
        h.update(limit.to_le_bytes());
    }
    hash_file(&mut h, &dense_path)?;
    let fingerprint = finish_fingerprint(h, &records);

    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        architecture,
        config,
        quant,
        hidden_size: cfg.hidden_size,
        moe_intermediate_size: cfg.moe_intermediate_size,
        dense_file: DENSE_FILE.into(),
        dense_len,
        dense_header_crc32,
        experts_file: EXPERTS_FILE.into(),
        experts_len: offset,
        records,
        fingerprint: fingerprint.clone(),
        expert_bias: cfg.expert_bias,
        expert_glu_clamp: glu_clamp,
    };
    let manifest_path = dir.join(MANIFEST);
    std::fs::write(&manifest_path, serde_json::to_vec_pretty(&manifest)?)
        .with_context(|| format!("writing {}", manifest_path.display()))?;
    sync(&manifest_path)?;
    sync(dir)?;
    bar.finish_and_clear();
    Ok(ConvertSummary {
        out: dir.to_path_buf(),
        experts: manifest.records.len(),
        expert_bytes: offset,
        dense_bytes: dense_len,
        fingerprint,
    })
}

/// The GGML type the routed experts of the Hugging Face directory `src`
/// are stored in (gpt-oss's MXFP4), or `None` for float experts.
pub fn experts_stored_as(src: &Path) -> Result<Option<GgmlType>> {
    let cfg = ModelConfig::load(src)?;
    let files = TensorFiles::open(src)?;
    stored_type(&cfg, &files)
}

fn stored_type(cfg: &ModelConfig, files: &TensorFiles) -> Result<Option<GgmlType>> {
    Ok(match (0..cfg.num_layers).find(|&l| cfg.is_moe_layer(l)) {
        Some(l) => files.get(&cfg.family.moe_names().expert(l, 0)[0])?.ggml,
        None => None,
    })
}

/// `{name without .weight}.bias`: a projection's bias.
fn bias_name(weight: &str) -> String {
    format!("{}.bias", weight.strip_suffix(".weight").unwrap_or(weight))
}

/// The manifest's `expert_glu_clamp` of `cfg`: gpt-oss's `[alpha, limit]`.
pub(crate) fn glu_clamp(cfg: &ModelConfig) -> Option<[f32; 2]> {
    match cfg.expert_act {
        GluAct::Clamped { alpha, limit } => Some([alpha, limit]),
        GluAct::Silu => None,
    }
}

/// Writes one matrix of an expert in `quant` into `dst` (scales, then values).
fn encode_part(t: &TensorRef<'_>, quant: Quant, group: usize, rows: usize, cols: usize, dst: &mut [u8]) -> Result<()> {
    match quant {
        Quant::Bf16 => {
            let src = t.bytes();
            match t.dtype {
                DType::BF16 => dst.copy_from_slice(src),
                _ => {
                    for (o, v) in dst.chunks_exact_mut(2).zip(to_f32(t)) {
                        o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
                    }
                }
            }
        }
        Quant::Int8 { .. } => {
            let (scales, q) = quantize_int8(&to_f32(t), rows, cols, group)?;
            let (s, v) = dst.split_at_mut(scales.len() * 4);
            s.copy_from_slice(bytemuck_f32(&scales));
            v.copy_from_slice(&q.iter().map(|&x| x as u8).collect::<Vec<u8>>());
        }
        Quant::Gguf => match t.ggml {
            // Blocks kept as stored (gpt-oss's MXFP4 experts).
            Some(_) if t.bytes().len() == dst.len() => dst.copy_from_slice(t.bytes()),
            _ => bail!("gguf records come only from a .gguf source or experts stored in GGML blocks"),
        },
        Quant::Int4 { .. } => {
            let (scales, q) = quantize_int4(&to_f32(t), rows, cols, group)?;
            let (s, v) = dst.split_at_mut(scales.len() * 4);
            s.copy_from_slice(bytemuck_f32(&scales));
            v.copy_from_slice(&q);
        }
    }
    Ok(())
}

fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // charm targets little-endian machines only (as safetensors does).
    bytemuck::cast_slice(v)
}

/// Every element of a tensor as f32.
fn to_f32(t: &TensorRef<'_>) -> Vec<f32> {
    let b = t.bytes();
    match t.dtype {
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
    }
}

/// f32 → bf16 with round-to-nearest-even (NaN stays NaN).
fn f32_to_bf16(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// A dense tensor to write: borrowed from the source map, or converted to f32.
struct DenseView<'a> {
    dtype: StDtype,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
}

impl<'a> DenseView<'a> {
    fn new(t: &TensorRef<'a>, to_f32_: bool) -> Self {
        if to_f32_ && t.dtype != DType::F32 {
            let data: Vec<u8> = to_f32(t).iter().flat_map(|v| v.to_le_bytes()).collect();
            return DenseView {
                dtype: StDtype::F32,
                shape: t.shape.to_vec(),
                data: Cow::Owned(data),
            };
        }
        let dtype = match t.dtype {
            DType::F32 => StDtype::F32,
            DType::BF16 => StDtype::BF16,
            DType::F16 => StDtype::F16,
        };
        DenseView {
            dtype,
            shape: t.shape.to_vec(),
            data: match t.mapped_bytes() {
                Some(b) => Cow::Borrowed(b),
                None => Cow::Owned(t.bytes().to_vec()),
            },
        }
    }
}

impl View for &DenseView<'_> {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Ends a container fingerprint: every record's identity and checksum, then
/// the hex digest.
pub(crate) fn finish_fingerprint(mut h: Sha256, records: &[Record]) -> String {
    for r in records {
        h.update(r.layer.to_le_bytes());
        h.update(r.expert.to_le_bytes());
        h.update(r.crc32.to_le_bytes());
    }
    format!("{:x}", h.finalize())
}

/// Adds a whole file's bytes to a fingerprint.
pub(crate) fn hash_file(h: &mut Sha256, path: &Path) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

fn sync(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    f.sync_all().with_context(|| format!("syncing {}", path.display()))
}
