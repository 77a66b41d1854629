//! A model directory's safetensors weights: one `model.safetensors`, or the
//! shards listed by `model.safetensors.index.json`. Files are memory-mapped
//! (memmap2) and their headers validated once at open; tensors are then
//! looked up by name without copying.
//!
//! A vision-language checkpoint stores its language model under
//! `model.language_model.` (Qwen3.5's `Qwen3_5MoeForConditionalGeneration`)
//! or `language_model.model.` with `language_model.lm_head` (Kimi K2.5's
//! `KimiK25ForConditionalGeneration`): those tensors are named `model.` and
//! `lm_head` here, as the text model names them, and the vision tower's
//! tensors (`model.visual.`; `vision_tower.` and `mm_projector.`) are left
//! out — charm runs the language model alone.
//!
//! Experts stored fused, one 3-D tensor per layer (`mlp.experts.gate_up_proj`
//! `[E, 2·I, H]`, gate rows first, and `mlp.experts.down_proj` `[E, H, I]`,
//! as Qwen3.5 checkpoints store them), are seen as the per-expert tensors
//! `mlp.experts.{e}.{gate,up,down}_proj.weight` the other families use: each
//! is a contiguous byte range of the fused one, so nothing is copied.
//!
//! gpt-oss stores its experts fused the other way round, as the product
//! `x @ W` reads them (`mlp.experts.gate_up_proj` `[E, H, 2I]` with gate
//! and up in alternate columns, `down_proj` `[E, I, H]`, and biases
//! `gate_up_proj_bias` `[E, 2I]`, `down_proj_bias` `[E, H]`): those are
//! seen as the same per-expert names with `.weight` and `.bias`, each copied
//! out (transposed, the columns picked) when read.
//!
//! Block-scaled FP8 matrices (`F8_E4M3` with a `{name}_scale_inv` grid, the
//! block from `config.json`'s `quantization_config.weight_block_size`,
//! default 128 × 128) are read as their bf16 dequantization ([`crate::fp8`]);
//! the scale tensors themselves are listed by [`TensorFiles::is_fp8_scale`].

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::{Dtype as StDtype, SafeTensors};

use crate::dtype::DType;
use crate::error::LoadError;
use crate::fp8;
use crate::gguf::GgmlType;
use crate::weight::{Buf, Weight, WeightData};

/// One mapped file.
struct MappedFile {
    path: PathBuf,
    map: Arc<Mmap>,
}

/// Where a tensor's bytes lie.
#[derive(Clone, Debug)]
struct Entry {
    file: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    /// Absolute byte range in the mapped file (of the fused source tensor
    /// when `derive` is set).
    start: usize,
    end: usize,
    /// A per-expert view computed from a fused tensor (gpt-oss's layout).
    derive: Option<Derive>,
}

/// How a per-expert tensor is computed from gpt-oss's fused expert tensors
/// (see the module docs); `shape` of its [`Entry`] is the result's.
#[derive(Clone, Copy, Debug)]
enum Derive {
    /// `out[r][c] = src[expert][c][first + r * step]` of a `[E, a, b]`
    /// tensor: a transposed selection of columns.
    Columns {
        expert: usize,
        a: usize,
        b: usize,
        first: usize,
        step: usize,
    },
    /// `out[r] = src[expert][first + r * step]` of a `[E, b]` tensor.
    Strided {
        expert: usize,
        b: usize,
        first: usize,
        step: usize,
    },
    /// Rows `first + r * step` of an MXFP4 `*_blocks` tensor of `rows`
    /// rows of `cols` values (the entry's bytes), with its `*_scales`
    /// (`scales`: file index and byte range), as GGML MXFP4 blocks.
    Mxfp4 {
        scales: (usize, usize, usize),
        rows: usize,
        cols: usize,
        first: usize,
        step: usize,
    },
}

impl Derive {
    /// The derived tensor's bytes, `size` bytes per element, from the
    /// source tensor's bytes.
    fn compute(self, src: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
        let n: usize = shape.iter().product();
        let mut out = Vec::with_capacity(n * size);
        let mut copy = |el: usize| out.extend_from_slice(&src[el * size..(el + 1) * size]);
        match self {
            Derive::Columns {
                expert,
                a,
                b,
                first,
                step,
            } => {
                let (rows, cols) = (shape[0], shape[1]);
                debug_assert_eq!(cols, a);
                for r in 0..rows {
                    for c in 0..cols {
                        copy(expert * a * b + c * b + first + r * step);
                    }
                }
            }
            Derive::Strided { expert, b, first, step } => {
                for r in 0..n {
                    copy(expert * b + first + r * step);
                }
            }
            Derive::Mxfp4 { .. } => unreachable!("MXFP4 views are converted by TensorFiles::get"),
        }
        out
    }
}

/// All tensors of a model directory, by name.
pub struct TensorFiles {
    dir: PathBuf,
    files: Vec<MappedFile>,
    entries: HashMap<String, Entry>,
    /// FP8 weights' block (rows, cols) per scale.
    fp8_block: [usize; 2],
}

/// Released FP8 checkpoints' block.
const FP8_BLOCK: [usize; 2] = [128, 128];

/// The FP8 scale tensor of weight `name`.
fn scale_name(name: &str) -> String {
    format!("{name}_scale_inv")
}

/// A located tensor: its dtype, shape and bytes (borrowed from the map).
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub path: &'a Path,
    pub dtype: DType,
    pub shape: &'a [usize],
    map: &'a Arc<Mmap>,
    start: usize,
    end: usize,
    /// An FP8 matrix's bf16 dequantization or a per-expert copy
    /// (little-endian bytes), in place of the mapped bytes.
    owned: Option<Arc<Vec<u8>>>,
    /// The GGML type of `owned` when it holds quantized blocks (gpt-oss's
    /// MXFP4 experts) rather than `dtype` values.
    pub ggml: Option<GgmlType>,
}

/// Where vision-language checkpoints keep their language model, and the
/// text model's name for it: Qwen3.5's `model.language_model.*`, Kimi
/// K2.5's `language_model.model.*` and `language_model.lm_head.*`.
const LANGUAGE_MODEL: [(&str, &str); 3] = [
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
];
/// Vision-language checkpoints' vision towers and projectors (not run).
const VISUAL: [&str; 3] = ["model.visual.", "vision_tower.", "mm_projector."];

impl TensorFiles {
    /// Opens `dir/model.safetensors`, or every shard named by
    /// `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if index.exists() {
            read_index(&index)?
        } else if single.exists() {
            vec!["model.safetensors".to_string()]
        } else {
            return Err(LoadError::NoWeights { dir: dir.to_path_buf() });
        };
        let mut out = TensorFiles {
            dir: dir.to_path_buf(),
            files: Vec::new(),
            entries: HashMap::new(),
            fp8_block: fp8_block(dir)?,
        };
        for name in &shard_names {
            if !dir.join(name).exists() {
                return Err(LoadError::BadIndex {
                    path: index.clone(),
                    reason: format!("shard {name} does not exist"),
                });
            }
        }
        // One decision for every shard, from their total size.
        let total: u64 = shard_names
            .iter()
            .filter_map(|name| std::fs::metadata(dir.join(name)).ok())
            .map(|m| m.len())
            .sum();
        let populate = crate::memory::populate_policy(total);
        for name in shard_names {
            out.add_file(&dir.join(&name), populate)?;
        }
        out.as_language_model();
        out.split_fused_experts();
        out.split_gpt_oss_experts();
        Ok(out)
    }

    /// Per-expert views of fused expert tensors (see the module docs). A
    /// fused tensor of an unexpected shape is left as it is, and a model
    /// that needs its experts then fails naming the per-expert tensor.
    fn split_fused_experts(&mut self) {
        let fused: Vec<String> = self
            .entries
            .keys()
            .filter(|k| k.ends_with(".experts.gate_up_proj"))
            .cloned()
            .collect();
        for gate_up in fused {
            let prefix = &gate_up[..gate_up.len() - "gate_up_proj".len()];
            let down = format!("{prefix}down_proj");
            let (Some(gu), Some(d)) = (self.entries.get(&gate_up), self.entries.get(&down)) else {
                continue;
            };
            let (&[e, i2, h], &[e2, h2, i]) = (gu.shape.as_slice(), d.shape.as_slice()) else {
                continue;
            };
            let size = gu.dtype.bitsize() / 8;
            if e != e2 || h != h2 || i2 != 2 * i || gu.dtype != d.dtype || gu.end - gu.start != e * i2 * h * size {
                continue;
            }
            let (gu, d) = (gu.clone(), d.clone());
            let part = |base: &Entry, start_el: usize, rows: usize, cols: usize| Entry {
                file: base.file,
                dtype: base.dtype,
                shape: vec![rows, cols],
                start: base.start + start_el * size,
                end: base.start + (start_el + rows * cols) * size,
                derive: None,
            };
            for x in 0..e {
                let at = x * i2 * h;
                self.entries
                    .insert(format!("{prefix}{x}.gate_proj.weight"), part(&gu, at, i, h));
                self.entries
                    .insert(format!("{prefix}{x}.up_proj.weight"), part(&gu, at + i * h, i, h));
                self.entries
                    .insert(format!("{prefix}{x}.down_proj.weight"), part(&d, x * h * i, h, i));
            }
            self.entries.remove(&gate_up);
            self.entries.remove(&down);
        }
    }

    /// Per-expert tensors from gpt-oss's fused experts (see the module
    /// docs): `experts.gate_up_proj` `[E, H, 2I]` (gate in even columns, up
    /// in odd ones) with `gate_up_proj_bias` `[E, 2I]`, and `down_proj`
    /// `[E, I, H]` with `down_proj_bias` `[E, H]`, become
    /// `experts.{e}.{gate,up,down}_proj.{weight,bias}` in the `Linear`
    /// layout, copied out when read. Tensors of unexpected shapes are left
    /// as they are (the model then fails naming the per-expert tensor).
    fn split_gpt_oss_experts(&mut self) {
        let fused: Vec<String> = self
            .entries
            .keys()
            .filter_map(|k| k.strip_suffix("gate_up_proj_bias"))
            .filter(|p| p.ends_with(".experts."))
            .map(str::to_string)
            .collect();
        for prefix in fused {
            self.split_gpt_oss_mxfp4(&prefix);
            let get = |n: &str| self.entries.get(&format!("{prefix}{n}")).cloned();
            let (Some(gu), Some(gub), Some(d), Some(db)) = (
                get("gate_up_proj"),
                get("gate_up_proj_bias"),
                get("down_proj"),
                get("down_proj_bias"),
            ) else {
                continue;
            };
            let (&[e, h, i2], &[e2, i2b], &[e3, i, h2], &[e4, h3]) = (
                gu.shape.as_slice(),
                gub.shape.as_slice(),
                d.shape.as_slice(),
                db.shape.as_slice(),
            ) else {
                continue;
            };
            let sizes_ok = [(&gu, e * h * i2), (&gub, e * i2), (&d, e * i * h), (&db, e * h)]
                .iter()
                .all(|(t, n)| t.end - t.start == n * (t.dtype.bitsize() / 8) && t.dtype.bitsize() >= 16);
            if [e2, e3, e4] != [e; 3] || [h2, h3] != [h; 2] || i2b != i2 || i2 != 2 * i || !sizes_ok {
                continue;
            }
            let view = |base: &Entry, shape: Vec<usize>, derive: Derive| Entry {
                shape,
                derive: Some(derive),
                ..base.clone()
            };
            for x in 0..e {
                let columns = |first, step| Derive::Columns {
                    expert: x,
                    a: h,
                    b: i2,
                    first,
                    step,
                };
                let mut add = |name: &str, entry: Entry| {
                    self.entries.insert(format!("{prefix}{x}.{name}"), entry);
                };
                add("gate_proj.weight", view(&gu, vec![i, h], columns(0, 2)));
                add("up_proj.weight", view(&gu, vec![i, h], columns(1, 2)));
                let down = Derive::Columns {
                    expert: x,
                    a: i,
                    b: h,
                    first: 0,
                    step: 1,
                };
                add("down_proj.weight", view(&d, vec![h, i], down));
            }
            self.entries.remove(&format!("{prefix}gate_up_proj"));
            self.entries.remove(&format!("{prefix}down_proj"));
            self.split_gpt_oss_biases(&prefix, e, i, h);
        }
    }

    /// Per-expert views of gpt-oss's fused biases (`gate_up_proj_bias`
    /// `[E, 2I]`, gate and up alternating; `down_proj_bias` `[E, H]`) as
    /// `experts.{e}.{gate,up,down}_proj.bias`, whatever the matrices are
    /// stored in. Biases of unexpected sizes are left as they are.
    fn split_gpt_oss_biases(&mut self, prefix: &str, e: usize, i: usize, h: usize) {
        let get = |n: &str| self.entries.get(&format!("{prefix}{n}")).cloned();
        let (Some(gub), Some(db)) = (get("gate_up_proj_bias"), get("down_proj_bias")) else {
            return;
        };
        let sized = |t: &Entry, n: usize| t.dtype.bitsize() >= 16 && t.end - t.start == n * (t.dtype.bitsize() / 8);
        if !sized(&gub, e * 2 * i) || !sized(&db, e * h) {
            return;
        }
        for x in 0..e {
            let strided = |base: &Entry, len: usize, b: usize, first: usize, step: usize| Entry {
                shape: vec![len],
                derive: Some(Derive::Strided {
                    expert: x,
                    b,
                    first,
                    step,
                }),
                ..base.clone()
            };
            let mut add = |name: &str, entry: Entry| {
                self.entries.insert(format!("{prefix}{x}.{name}"), entry);
            };
            add("gate_proj.bias", strided(&gub, i, 2 * i, 0, 2));
            add("up_proj.bias", strided(&gub, i, 2 * i, 1, 2));
            add("down_proj.bias", strided(&db, h, h, 0, 1));
        }
        self.entries.remove(&format!("{prefix}gate_up_proj_bias"));
        self.entries.remove(&format!("{prefix}down_proj_bias"));
    }

    /// gpt-oss's MXFP4 experts as released: `gate_up_proj_blocks`
    /// `[E, 2I, H/32, 16]` with `gate_up_proj_scales` `[E, 2I, H/32]` (the
    /// rows are outputs, gate and up alternating) and `down_proj_blocks`
    /// `[E, H, I/32, 16]` with its scales, beside the biases: the per-expert
    /// matrices become GGML MXFP4 views ([`crate::gguf::mxfp4`]: the same
    /// values, nibbles reordered), the biases as in the dense layout
    /// ([`TensorFiles::split_gpt_oss_biases`]).
    fn split_gpt_oss_mxfp4(&mut self, prefix: &str) {
        let get = |n: &str| self.entries.get(&format!("{prefix}{n}")).cloned();
        let (Some(gub), Some(db), Some(gb), Some(gs), Some(dbl), Some(ds)) = (
            get("gate_up_proj_bias"),
            get("down_proj_bias"),
            get("gate_up_proj_blocks"),
            get("gate_up_proj_scales"),
            get("down_proj_blocks"),
            get("down_proj_scales"),
        ) else {
            return;
        };
        let u8s = [&gb, &gs, &dbl, &ds].iter().all(|t| t.dtype == StDtype::U8);
        let (&[e, i2, hg, 16], &[e2, i2s, hgs], &[e3, h, ig, 16], &[e4, hs, igs]) = (
            gb.shape.as_slice(),
            gs.shape.as_slice(),
            dbl.shape.as_slice(),
            ds.shape.as_slice(),
        ) else {
            return;
        };
        let (Some(&[e5, i2b]), Some(&[e6, hb])) = (gub.shape.get(..2), db.shape.get(..2)) else {
            return;
        };
        let i = i2 / 2;
        if !u8s
            || [e2, e3, e4, e5, e6] != [e; 5]
            || (i2s, hgs, hs, igs, i2b, hb) != (i2, hg, h, ig, i2, h)
            || i2 != 2 * i
            || hg * 32 != h
            || ig * 32 != i
            || gub.shape.len() != 2
            || db.shape.len() != 2
        {
            return;
        }
        let mxfp4 =
            |blocks: &Entry, scales: &Entry, rows: usize, cols: usize, first: usize, step: usize, n: usize| Entry {
                shape: vec![n, cols],
                derive: Some(Derive::Mxfp4 {
                    scales: (scales.file, scales.start, scales.end),
                    rows,
                    cols,
                    first,
                    step,
                }),
                ..blocks.clone()
            };
        for x in 0..e {
            let mut add = |name: &str, entry: Entry| {
                self.entries.insert(format!("{prefix}{x}.{name}"), entry);
            };
            add("gate_proj.weight", mxfp4(&gb, &gs, e * i2, h, x * i2, 2, i));
            add("up_proj.weight", mxfp4(&gb, &gs, e * i2, h, x * i2 + 1, 2, i));
            add("down_proj.weight", mxfp4(&dbl, &ds, e * h, i, x * h, 1, h));
        }
        for n in [
            "gate_up_proj_blocks",
            "gate_up_proj_scales",
            "down_proj_blocks",
            "down_proj_scales",
        ] {
            self.entries.remove(&format!("{prefix}{n}"));
        }
        self.split_gpt_oss_biases(prefix, e, i, h);
    }

    /// Names a vision-language checkpoint's language model as the text
    /// model does and drops its vision tower (see the module docs).
    fn as_language_model(&mut self) {
        let wrapped = |k: &str| LANGUAGE_MODEL.iter().find(|(from, _)| k.starts_with(from));
        if !self.entries.keys().any(|k| wrapped(k).is_some()) {
            return;
        }
        let entries = std::mem::take(&mut self.entries);
        self.entries = entries
            .into_iter()
            .filter(|(k, _)| !VISUAL.iter().any(|v| k.starts_with(v)))
            .map(|(k, e)| match wrapped(&k) {
                Some((from, to)) => (format!("{to}{}", &k[from.len()..]), e),
                None => (k, e),
            })
            .collect();
    }

    /// Opens one safetensors file (a container's `dense.safetensors`).
    pub fn open_file(path: &Path) -> Result<Self, LoadError> {
        let mut out = TensorFiles {
            dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            files: Vec::new(),
            entries: HashMap::new(),
            fp8_block: FP8_BLOCK,
        };
        if !path.exists() {
            return Err(LoadError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
            });
        }
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX);
        out.add_file(path, crate::memory::populate_policy(len))?;
        Ok(out)
    }

    /// Maps `path` (its page tables made at open when `populate`) and
    /// indexes its tensors.
    fn add_file(&mut self, path: &Path, populate: bool) -> Result<(), LoadError> {
        let io = |source| LoadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the file is opened read-only and charm never writes model
        // files while serving them; a file truncated underneath a running
        // process is outside what any mmap-based loader can defend against.
        let mut opts = memmap2::MmapOptions::new();
        if populate {
            opts.populate();
        }
        let map = unsafe { opts.map(&file) }.map_err(io)?;
        let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| LoadError::BadSafetensors {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let data_start = 8 + header_len;
        let file_idx = self.files.len();
        for (name, info) in meta.tensors() {
            let (a, b) = info.data_offsets;
            let (start, end) = (data_start + a, data_start + b);
            if end > map.len() || start > end {
                return Err(LoadError::BadSafetensors {
                    path: path.to_path_buf(),
                    reason: format!("tensor {name} lies outside the file"),
                });
            }
            self.entries.insert(
                name,
                Entry {
                    file: file_idx,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                    derive: None,
                },
            );
        }
        self.files.push(MappedFile {
            path: path.to_path_buf(),
            map: Arc::new(map),
        });
        Ok(())
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a tensor of that name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Whether `name` is the scale grid of a block-scaled FP8 weight (read
    /// with the weight, not on its own).
    pub fn is_fp8_scale(&self, name: &str) -> bool {
        name.strip_suffix("_scale_inv")
            .and_then(|w| self.entries.get(w))
            .is_some_and(|e| e.dtype == StDtype::F8_E4M3)
    }

    /// Locates a tensor, checking that its dtype is one charm computes with
    /// (a block-scaled FP8 matrix is dequantized to bf16 here).
    pub fn get<'a>(&'a self, name: &'a str) -> Result<TensorRef<'a>, LoadError> {
        let e = self.entries.get(name).ok_or_else(|| LoadError::MissingTensor {
            dir: self.dir.clone(),
            name: name.to_string(),
        })?;
        let f = &self.files[e.file];
        let unsupported = |dtype: StDtype| LoadError::UnsupportedDtype {
            path: f.path.clone(),
            name: name.to_string(),
            dtype: format!("{dtype:?}"),
        };
        let float = |dtype: StDtype| match dtype {
            StDtype::F32 => Ok(DType::F32),
            StDtype::BF16 => Ok(DType::BF16),
            StDtype::F16 => Ok(DType::F16),
            other => Err(unsupported(other)),
        };
        // What the tensor is read as: its bytes in the map, or computed here.
        let (dtype, owned, ggml) = match (e.derive, e.dtype) {
            (
                Some(Derive::Mxfp4 {
                    scales: (sf, ss, se),
                    rows,
                    cols,
                    first,
                    step,
                }),
                _,
            ) => {
                let picked = (0..e.shape[0]).map(|r| first + r * step);
                let blocks = crate::gguf::blocks_from_hub_rows(
                    &f.map[e.start..e.end],
                    &self.files[sf].map[ss..se],
                    rows,
                    cols,
                    picked,
                )
                .map_err(|err| LoadError::BadSafetensors {
                    path: f.path.clone(),
                    reason: format!("MXFP4 tensor behind {name}: {err}"),
                })?;
                (DType::BF16, Some(blocks), Some(GgmlType::MXFP4))
            }
            (Some(derive), dtype) => {
                let dtype = float(dtype)?;
                let owned = derive.compute(&f.map[e.start..e.end], &e.shape, dtype.size());
                (dtype, Some(owned), None)
            }
            (None, StDtype::F8_E4M3) if e.shape.len() == 2 => (DType::BF16, Some(self.dequantize_fp8(name, e)?), None),
            (None, dtype) => (float(dtype)?, None, None),
        };
        Ok(TensorRef {
            name,
            path: &f.path,
            dtype,
            shape: &e.shape,
            map: &f.map,
            start: e.start,
            end: e.end,
            owned: owned.map(Arc::new),
            ggml,
        })
    }

    /// FP8 matrix `name` (entry `e`) times its `_scale_inv` grid, as bf16
    /// little-endian bytes ([`fp8::dequantize_bf16`]).
    fn dequantize_fp8(&self, name: &str, e: &Entry) -> Result<Vec<u8>, LoadError> {
        let (rows, cols) = (e.shape[0], e.shape[1]);
        let path = &self.files[e.file].path;
        let sname = scale_name(name);
        if !self.entries.contains_key(&sname) {
            return Err(LoadError::MissingTensor {
                dir: self.dir.clone(),
                name: format!("{sname} (the block scales of FP8 {name})"),
            });
        }
        let scales = self.get(&sname)?;
        let grid = fp8::scale_grid(rows, cols, self.fp8_block);
        if scales.shape != grid {
            return Err(LoadError::ShapeMismatch {
                path: scales.path.to_path_buf(),
                name: sname.clone(),
                got: scales.shape.to_vec(),
                expected: grid.to_vec(),
            });
        }
        let codes = &self.files[e.file].map[e.start..e.end];
        if codes.len() != rows * cols {
            return Err(LoadError::BadSafetensors {
                path: path.clone(),
                reason: format!("FP8 tensor {name} of shape {:?} holds {} bytes", e.shape, codes.len()),
            });
        }
        let scales = scales.data().to_f32_vec();
        let w = fp8::dequantize_bf16(codes, rows, cols, &scales, self.fp8_block);
        Ok(w.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// A 2-D weight `[rows, cols]`, checked against the expected shape.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        let t = self.get(name)?;
        t.expect_shape(&[rows, cols])?;
        let w = Weight::new(rows, cols, t.data());
        crate::load_progress::add(w.data().byte_len() as u64);
        Ok(w)
    }

    /// A 1-D vector of length `len` as f32, checked against the expected shape.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        self.array(name, &[len])
    }

    /// A tensor of exactly `shape` as f32, row-major.
    pub fn array(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let t = self.get(name)?;
        t.expect_shape(shape)?;
        Ok(t.data().to_f32_vec())
    }
}

impl<'a> TensorRef<'a> {
    /// Fails with [`LoadError::ShapeMismatch`] unless the shape is `expected`.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<(), LoadError> {
        if self.shape != expected {
            return Err(LoadError::ShapeMismatch {
                path: self.path.to_path_buf(),
                name: self.name.to_string(),
                got: self.shape.to_vec(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }

    /// The tensor's little-endian bytes in [`TensorRef::dtype`] (an FP8
    /// matrix's dequantization, a per-expert copy out of gpt-oss's fused
    /// experts).
    pub fn bytes(&self) -> &[u8] {
        match &self.owned {
            Some(v) => v,
            None => &self.map[self.start..self.end],
        }
    }

    /// [`TensorRef::bytes`] borrowed from the map for the files' lifetime;
    /// `None` for a dequantized FP8 matrix or a per-expert copy.
    pub fn mapped_bytes(&self) -> Option<&'a [u8]> {
        let map: &'a Mmap = self.map;
        self.owned.is_none().then(|| &map[self.start..self.end])
    }

    /// The tensor's elements, mapped in place when suitably aligned.
    pub fn data(&self) -> WeightData {
        if let (Some(v), Some(ty)) = (&self.owned, self.ggml) {
            return WeightData::Gguf {
                ty,
                data: Buf::shared(v.clone(), 0, v.len()),
            };
        }
        if let Some(v) = &self.owned {
            let n = v.len() / self.dtype.size();
            return match self.dtype {
                DType::F32 => WeightData::F32(Buf::shared(v.clone(), 0, n)),
                DType::BF16 => WeightData::BF16(Buf::shared(v.clone(), 0, n)),
                DType::F16 => WeightData::F16(Buf::shared(v.clone(), 0, n)),
            };
        }
        let n = (self.end - self.start) / self.dtype.size();
        match self.dtype {
            DType::F32 => WeightData::F32(Buf::mapped(self.map.clone(), self.start, n)),
            DType::BF16 => WeightData::BF16(Buf::mapped(self.map.clone(), self.start, n)),
            DType::F16 => WeightData::F16(Buf::mapped(self.map.clone(), self.start, n)),
        }
    }
}

/// `quantization_config.weight_block_size` of `dir/config.json` (FP8
/// checkpoints), else 128 × 128.
fn fp8_block(dir: &Path) -> Result<[usize; 2], LoadError> {
    let path = dir.join("config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(FP8_BLOCK);
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        // The config reader reports a malformed config.json.
        return Ok(FP8_BLOCK);
    };
    let Some(b) = v.pointer("/quantization_config/weight_block_size") else {
        return Ok(FP8_BLOCK);
    };
    match b
        .as_array()
        .map(|a| a.iter().map(serde_json::Value::as_u64).collect::<Vec<_>>())
    {
        Some(a) if a.len() == 2 && a.iter().all(|x| x.is_some_and(|x| x > 0)) => {
            Ok([a[0].unwrap_or(1) as usize, a[1].unwrap_or(1) as usize])
        }
        _ => Err(LoadError::BadSafetensors {
            path,
            reason: format!("quantization_config.weight_block_size {b} is not two positive integers"),
        }),
    }
}

fn read_index(path: &Path) -> Result<Vec<String>, LoadError> {
    let bad = |reason: String| LoadError::BadIndex {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut shards: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{tensor}] is not a file name")))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(bad(format!("shard name {file} is not a plain file name")));
        }
        if !shards.iter().any(|s| s == file) {
            shards.push(file.to_string());
        }
    }
    shards.sort();
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn write(dir: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let views: Vec<(&str, TensorView)> = tensors
            .iter()
            .zip(&bytes)
            .map(|((n, shape, _), b)| (*n, TensorView::new(StDtype::F32, shape.clone(), b).unwrap()))
            .collect();
        safetensors::tensor::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }

    #[test]
    fn kimi_k25s_language_model_reads_as_the_text_models_names() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                (
                    "language_model.model.layers.0.input_layernorm.weight",
                    vec![2],
                    vec![1.0; 2],
                ),
                ("language_model.model.embed_tokens.weight", vec![1, 2], vec![2.0; 2]),
                ("language_model.lm_head.weight", vec![1, 2], vec![3.0; 2]),
                ("vision_tower.encoder.blocks.0.wqkv.weight", vec![2], vec![4.0; 2]),
                ("mm_projector.proj.0.weight", vec![2], vec![5.0; 2]),
            ],
        );
        let f = TensorFiles::open(dir.path()).unwrap();
        let mut names: Vec<String> = f.names().iter().map(|n| n.to_string()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "lm_head.weight",
                "model.embed_tokens.weight",
                "model.layers.0.input_layernorm.weight"
            ]
        );
        assert_eq!(f.array("lm_head.weight", &[1, 2]).unwrap(), vec![3.0; 2]);
    }

    #[test]
    fn fused_experts_and_a_language_model_prefix_read_as_the_text_models_names() {
        let dir = tempfile::tempdir().unwrap();
        let (e, i, h) = (2, 2, 3);
        let gate_up: Vec<f32> = (0..e * 2 * i * h).map(|x| x as f32).collect();
        let down: Vec<f32> = (0..e * h * i).map(|x| 100.0 + x as f32).collect();
        write(
            dir.path(),
            &[
                (
                    "model.language_model.layers.0.mlp.experts.gate_up_proj",
                    vec![e, 2 * i, h],
                    gate_up,
                ),
                (
                    "model.language_model.layers.0.mlp.experts.down_proj",
                    vec![e, h, i],
                    down,
                ),
                ("model.language_model.norm.weight", vec![h], vec![1.0; h]),
                ("model.visual.blocks.0.norm1.weight", vec![h], vec![2.0; h]),
                ("lm_head.weight", vec![1, h], vec![3.0; h]),
            ],
        );
        let f = TensorFiles::open(dir.path()).unwrap();
        assert!(f.contains("model.norm.weight") && f.contains("lm_head.weight"));
        assert!(!f
            .names()
            .iter()
            .any(|n| n.contains("visual") || n.contains("language_model")));
        assert!(!f.contains("model.layers.0.mlp.experts.gate_up_proj"));
        let m = |n: &str| f.array(n, &[i, h]).unwrap();
        // Expert 1: gate rows are its block's first I rows, up the next I.
        assert_eq!(
            m("model.layers.0.mlp.experts.1.gate_proj.weight"),
            vec![12., 13., 14., 15., 16., 17.]
        );
        assert_eq!(
            m("model.layers.0.mlp.experts.1.up_proj.weight"),
            vec![18., 19., 20., 21., 22., 23.]
        );
        let d = f
            .array("model.layers.0.mlp.experts.1.down_proj.weight", &[h, i])
            .unwrap();
        assert_eq!(d, vec![106., 107., 108., 109., 110., 111.]);
    }
}
