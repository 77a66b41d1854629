//! `coordinator convert` of a `.gguf` file: the routed experts are re-laid
//! into `experts.bin`, one record per expert with gate, up and down
//! adjacent, **without changing any quantized block** (the bytes of each
//! expert's slice of `blk.N.ffn_{gate,up,down}_exps` are copied as they
//! are); everything else — metadata (tokenizer, chat template) and the dense
//! tensors — is written to `dense.gguf`, a GGUF file of its own. The
//! tokenizer and chat template are also written as `tokenizer.json` /
//! `tokenizer_config.json` so every tool reads the container like any other.
//! Written into `OUT.partial/` and renamed when complete, like
//! [`crate::convert`].

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use charm_common::container::{
    dense_identity, put_record_bias, record_layout_typed, Manifest, Quant, Record, EXPERTS_FILE, FORMAT_NAME,
    FORMAT_VERSION, MANIFEST, RECORD_ALIGN,
};
use charm_common::gguf::{GgufFile, GgufTensor, MetaValue};
use charm_models::gguf::GgufModel;
use sha2::{Digest, Sha256};

use crate::convert::ConvertSummary;

/// Expert `e`'s `len` bias values of `blk.{layer}.ffn_{part}_exps.bias`
/// (f32, `[experts, len]`).
fn expert_bias(f: &GgufFile, src: &Path, layer: usize, part: &str, e: usize, len: usize) -> Result<Vec<f32>> {
    let name = format!("blk.{layer}.ffn_{part}_exps.bias");
    let t = f
        .tensor(&name)
        .with_context(|| format!("{}: no expert bias {name}", src.display()))?;
    if t.ty != charm_common::gguf::GgmlType::F32 {
        bail!("{}: {name} is {}, not F32", src.display(), t.ty.name());
    }
    let bytes = f
        .tensor_bytes(t)
        .get(e * len * 4..(e + 1) * len * 4)
        .with_context(|| format!("{}: {name} holds no expert {e} of {len} values", src.display()))?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The dense part of a GGUF container.
pub const DENSE_GGUF: &str = "dense.gguf";

/// Converts the GGUF model `src` into a container in `dir` (an empty,
/// partial directory the caller publishes).
pub fn write_container(src: &Path, dir: &Path) -> Result<ConvertSummary> {
    let model = GgufModel::open(src)?;
    let cfg = &model.cfg;
    let f = &model.file;
    if !cfg.moe_layers.iter().any(|&m| m) {
        bail!(
            "{}: a dense model has no experts to stream; run it directly with --model",
            src.display()
        );
    }
    let is_expert = |name: &str| {
        name.contains("_exps.weight") || (cfg.expert_bias && name.contains("_exps.bias")) || is_per_expert(name)
    };
    let mut records = Vec::new();
    let experts_path = dir.join(EXPERTS_FILE);
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&experts_path)?);
    let mut offset = 0u64;
    for l in (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)) {
        let parts = ["gate", "up", "down"].map(|p| stacked(f, l, p));
        for e in 0..cfg.num_experts {
            let mut slices = Vec::with_capacity(3);
            let mut types = [0u32; 3];
            for (i, part) in parts.iter().enumerate() {
                let (bytes, ty) = match part {
                    Some(t) => {
                        let all = f.tensor_bytes(t);
                        let per = all.len() / cfg.num_experts;
                        (&all[e * per..(e + 1) * per], t.ty.id())
                    }
                    None => {
                        let name = format!("blk.{l}.ffn_{}.{e}.weight", ["gate", "up", "down"][i]);
                        let t = f
                            .tensor(&name)
                            .with_context(|| format!("{}: no expert tensor {name}", src.display()))?;
                        (f.tensor_bytes(t), t.ty.id())
                    }
                };
                slices.push(bytes);
                types[i] = ty;
            }
            let mut layout = record_layout_typed(cfg.hidden_size, cfg.moe_intermediate_size, Quant::Gguf, Some(types))?;
            if cfg.expert_bias {
                layout = layout.with_bias(cfg.hidden_size, cfg.moe_intermediate_size)?;
            }
            let padded = (layout.len as u64).div_ceil(RECORD_ALIGN) * RECORD_ALIGN;
            let mut buf = vec![0u8; padded as usize];
            for (p, bytes) in layout.parts.iter().zip(&slices) {
                if bytes.len() != p.value_bytes {
                    bail!(
                        "{}: layer {l} expert {e}: {} bytes where the config implies {}",
                        src.display(),
                        bytes.len(),
                        p.value_bytes
                    );
                }
                buf[p.offset..p.offset + p.value_bytes].copy_from_slice(bytes);
            }
            if cfg.expert_bias {
                let (h, i) = (cfg.hidden_size, cfg.moe_intermediate_size);
                let [g, u, d] = [("gate", i), ("up", i), ("down", h)].map(|(p, n)| expert_bias(f, src, l, p, e, n));
                put_record_bias(&mut buf, &layout, [&g?, &u?, &d?])?;
            }
            let crc32 = crc32fast::hash(&buf[..layout.len]);
            w.write_all(&buf)?;
            records.push(Record {
                layer: l as u16,
                expert: e as u32,
                offset,
                len: layout.len as u64,
                crc32,
                ggml_types: Some(types),
            });
            offset += padded;
        }
    }
    w.flush()?;
    drop(w);
    File::open(&experts_path)?.sync_all()?;

    // The dense part: every other tensor and all metadata, blocks verbatim.
    let dense: Vec<&GgufTensor> = f.tensors().iter().filter(|t| !is_expert(&t.name)).collect();
    let dense_path = dir.join(DENSE_GGUF);
    write_gguf(f, &dense, &dense_path)?;
    File::open(&dense_path)?.sync_all()?;
    let (dense_len, dense_header_crc32) = dense_identity(&dense_path)?;

    crate::gguf_text::write_tokenizer_files(f, dir)?;

    let architecture = model.arch().to_string();
    let mut h = Sha256::new();
    h.update(architecture.as_bytes());
    h.update(b"gguf");
    crate::convert::hash_file(&mut h, &dense_path)?;
    let fingerprint = crate::convert::finish_fingerprint(h, &records);
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        architecture,
        config: serde_json::Value::Null,
        quant: Quant::Gguf,
        hidden_size: cfg.hidden_size,
        moe_intermediate_size: cfg.moe_intermediate_size,
        dense_file: DENSE_GGUF.into(),
        dense_len,
        dense_header_crc32,
        experts_file: EXPERTS_FILE.into(),
        experts_len: offset,
        records,
        fingerprint: fingerprint.clone(),
        expert_bias: cfg.expert_bias,
        expert_glu_clamp: crate::convert::glu_clamp(cfg),
    };
    std::fs::write(dir.join(MANIFEST), serde_json::to_vec_pretty(&manifest)?)?;
    Ok(ConvertSummary {
        out: dir.to_path_buf(),
        experts: manifest.records.len(),
        expert_bytes: offset,
        dense_bytes: dense_len,
        fingerprint,
    })
}

/// `blk.L.ffn_gate.E.weight` (older per-expert GGUFs).
fn is_per_expert(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() == 5
        && parts[0] == "blk"
        && ["ffn_gate", "ffn_up", "ffn_down"].contains(&parts[2])
        && parts[3].parse::<usize>().is_ok()
}

fn stacked<'a>(f: &'a GgufFile, layer: usize, part: &str) -> Option<&'a GgufTensor> {
    f.tensor(&format!("blk.{layer}.ffn_{part}_exps.weight"))
}

/// Writes a GGUF v3 file with all of `f`'s metadata and the given tensors
/// (bytes copied verbatim).
fn write_gguf(f: &GgufFile, tensors: &[&GgufTensor], path: &Path) -> Result<()> {
    let align = f.alignment().max(1);
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut head: Vec<u8> = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(f.metadata().len() as u64).to_le_bytes());
    for (k, v) in f.metadata() {
        put_str(&mut head, k);
        head.extend_from_slice(&type_id(v).to_le_bytes());
        put_value(&mut head, v);
    }
    let mut data_off = 0u64;
    let mut offsets = Vec::with_capacity(tensors.len());
    for t in tensors {
        put_str(&mut head, &t.name);
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&t.ty.id().to_le_bytes());
        head.extend_from_slice(&data_off.to_le_bytes());
        offsets.push(data_off);
        data_off = (data_off + t.size).div_ceil(align) * align;
    }
    while !(head.len() as u64).is_multiple_of(align) {
        head.push(0);
    }
    w.write_all(&head)?;
    let mut written = 0u64;
    for (t, off) in tensors.iter().zip(offsets) {
        let pad = off - written;
        w.write_all(&vec![0u8; pad as usize])?;
        w.write_all(f.tensor_bytes(t))?;
        written = off + t.size;
    }
    w.flush()?;
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// GGUF metadata value type ids.
fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::Str(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::Str(s) => put_str(out, s),
        MetaValue::Array(items) => {
            // Element type from the first element (an empty array is written as uint8).
            let ty = items.first().map_or(0, type_id);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it);
            }
        }
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}
