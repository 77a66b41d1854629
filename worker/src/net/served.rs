//! The model a worker serves: its expert service (the same
//! [`InProcessWorker`] `coordinator --local` embeds, so the same
//! `run_group` computes every expert everywhere), which experts it holds,
//! and the speeds it measured at start — everything its `Hello` says.
//!
//! - A Hugging Face directory: every routed expert memory-mapped
//!   ([`ResidentStore`]); the page cache stages them.
//! - A charm container: the experts its manifest lists, read from
//!   `experts.bin` into a RAM cache of `--expert-cache-gb`
//!   ([`DiskStore`]). A manifest may list only some layers' or experts'
//!   records (a partial copy); the worker holds exactly those.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use charm_common::container::{is_container, record_bias, record_weights, verify_record, Manifest};
use charm_common::TensorFiles;
use charm_models::{ExpertError, ExpertService, ExpertStats, ModelConfig, ModelError, SwiGlu};
use charm_proto::{Hello, Holdings, WorkerStats, MAX_FRAME_LEN};
use thiserror::Error;

use super::fingerprint::{model_fingerprint, FingerprintError};
use crate::io::{AlignedBuf, ReaderOptions};
use crate::{DiskStore, InProcessWorker, ResidentStore, StoreOptions};

/// Bytes read to measure read bandwidth at start (at most).
const PROBE_READ_BYTES: u64 = 64 << 20;
/// Time spent measuring compute at start (at least one run).
const PROBE_COMPUTE_MS: f64 = 20.0;

/// How a worker opens its model.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// RAM budget for a container's cached experts (`None`: free memory
    /// less a tenth, at most every expert).
    pub cache_bytes: Option<u64>,
    /// Where the routing history is kept (`None`: `<model>/state` when
    /// writable, else not persisted).
    pub state_dir: Option<PathBuf>,
    /// Do not read the predicted next layer's experts ahead (a container's
    /// read-ahead; placement only, never the bits).
    pub no_prefetch: bool,
    /// How a container's expert records are read: `O_DIRECT` (past the page
    /// cache, which then does not hold a second copy of what the expert
    /// cache holds), io_uring or pread.
    pub reader: ReaderOptions,
}

/// The model could not be served.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The config or the weights are missing or malformed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The expert store could not be opened.
    #[error(transparent)]
    Expert(#[from] ExpertError),
    /// The model's fingerprint could not be computed.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// Reading an expert file to measure it failed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The directory holds no routed expert (a dense model, or an empty
    /// partial container).
    #[error("{}: holds no routed experts to serve", dir.display())]
    NoExperts { dir: PathBuf },
}

/// What a worker serves, and its counters.
pub struct Served {
    pub service: Arc<dyn ExpertService>,
    /// The `Hello` sent to every coordinator (its `stats` are refreshed on
    /// each handshake).
    hello: Hello,
    /// Routed experts per token: the most experts one row may be sent to.
    top_k: u32,
    requests: AtomicU64,
    experts_served: AtomicU64,
}

/// The config of the model in `dir`: `config.json`, or for a container
/// converted from a GGUF file the metadata of its dense GGUF.
fn model_config(dir: &Path) -> Result<ModelConfig, ServeError> {
    if is_container(dir) {
        let manifest = Manifest::open(dir).map_err(ExpertError::from)?;
        let dense = dir.join(&manifest.dense_file);
        if dense.extension().is_some_and(|x| x == "gguf") {
            return Ok(charm_models::gguf::GgufModel::open(&dense)?.cfg);
        }
    }
    Ok(ModelConfig::load(dir)?)
}

impl Served {
    /// Opens the model in `dir` and measures it.
    pub fn open(dir: &Path, opts: &ServeOptions) -> Result<Served, ServeError> {
        let cfg = model_config(dir)?;
        let fingerprint = model_fingerprint(dir)?;
        let moe_layers: Vec<usize> = (0..cfg.num_layers).filter(|&l| cfg.is_moe_layer(l)).collect();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ServeError::Io { path, source }
        };
        let (service, holdings, format, expert_bytes, cache_bytes, disk, probe): (
            Arc<dyn ExpertService>,
            Holdings,
            String,
            u64,
            u64,
            f64,
            SwiGlu,
        ) = if is_container(dir) {
            let manifest = Manifest::open(dir).map_err(ExpertError::from)?;
            let Some(first) = manifest.records.first().cloned() else {
                return Err(ServeError::NoExperts { dir: dir.to_path_buf() });
            };
            let all: u64 = manifest.records.iter().map(|r| r.padded_len()).sum();
            let cache_bytes = opts
                .cache_bytes
                .unwrap_or_else(|| crate::sysmem::default_cache_bytes(0).min(all));
            let store = DiskStore::open(
                dir,
                &manifest,
                &StoreOptions {
                    cache_bytes,
                    prefetch: !opts.no_prefetch,
                    reader: opts.reader.clone(),
                    history_path: crate::sysmem::state_file(
                        dir,
                        opts.state_dir.as_deref(),
                        "worker-routing-history.json",
                        None,
                    ),
                },
            )?;
            let path = dir.join(&manifest.experts_file);
            let ranges: Vec<(u64, u64)> = manifest.records.iter().map(|r| (r.offset, r.padded_len())).collect();
            let disk = measure_read(&path, &ranges).map_err(io(&path))?;
            // The first record, decoded the way the store decodes it (read
            // here, so the store's counters and history stay untouched).
            let layout = manifest.layout(&first).map_err(ExpertError::from)?;
            let mut buf = AlignedBuf::new_zeroed(first.padded_len() as usize);
            let mut f = File::open(&path).map_err(io(&path))?;
            f.seek(SeekFrom::Start(first.offset)).map_err(io(&path))?;
            f.read_exact(buf.as_mut_slice()).map_err(io(&path))?;
            verify_record(&path, &first, buf.as_slice()).map_err(ExpertError::from)?;
            let bias = record_bias(buf.as_slice(), &layout).map_err(ExpertError::from)?;
            let [gate, up, down] = record_weights(Arc::new(buf), &layout, manifest.quant).map_err(ExpertError::from)?;
            let probe = crate::disk_store::expert_ffn(gate, up, down, bias, crate::disk_store::expert_act(&manifest));
            let holdings = Holdings::from_experts(manifest.records.iter().map(|r| (r.layer, r.expert)));
            let bytes = store.expert_bytes();
            let format = format!("container {}", manifest.quant.name());
            (
                Arc::new(InProcessWorker::new(store)),
                holdings,
                format,
                bytes,
                cache_bytes,
                disk,
                probe,
            )
        } else {
            let files = TensorFiles::open(dir).map_err(ModelError::from)?;
            let Some(&l0) = moe_layers.first() else {
                return Err(ServeError::NoExperts { dir: dir.to_path_buf() });
            };
            let store = ResidentStore::open(&files, &cfg)?;
            let names = cfg.family.moe_names();
            let probe = SwiGlu::load(&files, &names.expert(l0, 0), cfg.hidden_size, cfg.moe_intermediate_size)
                .map_err(ModelError::from)?;
            let bytes: u64 = [&probe.gate, &probe.up, &probe.down]
                .iter()
                .map(|w| {
                    w.format()
                        .storage(w.rows(), w.cols())
                        .map_or(0, |b| (b.scale_bytes + b.value_bytes) as u64)
                })
                .sum();
            let holdings = Holdings::from_experts(
                moe_layers
                    .iter()
                    .flat_map(|&l| (0..cfg.num_experts as u32).map(move |e| (l as u16, e))),
            );
            let largest = largest_safetensors(dir).map_err(io(dir))?;
            let len = std::fs::metadata(&largest).map_err(io(&largest))?.len();
            let disk = measure_read(&largest, &[(0, len)]).map_err(io(&largest))?;
            let format = format!("safetensors {}", probe.gate.format().name());
            let resident = holdings.count() * bytes;
            (
                Arc::new(InProcessWorker::new(store)),
                holdings,
                format,
                bytes,
                resident,
                disk,
                probe,
            )
        };
        let rows_per_s = measure_compute(&probe, cfg.hidden_size);
        Ok(Served {
            service,
            hello: Hello {
                software: format!("charm-worker {}", env!("CARGO_PKG_VERSION")),
                arithmetic: charm_common::ARITHMETIC,
                fingerprint,
                num_layers: cfg.num_layers as u32,
                num_experts: cfg.num_experts as u32,
                hidden: cfg.hidden_size as u32,
                holdings,
                format,
                expert_bytes,
                cache_bytes,
                disk_bytes_per_s: disk,
                expert_rows_per_s: rows_per_s,
                max_frame: MAX_FRAME_LEN,
                stats: WorkerStats::default(),
            },
            top_k: cfg.top_k as u32,
            requests: AtomicU64::new(0),
            experts_served: AtomicU64::new(0),
        })
    }

    /// The `Hello` to send now (with the current counters).
    pub fn hello(&self) -> Hello {
        Hello {
            stats: self.stats(),
            ..self.hello.clone()
        }
    }

    /// The `Hello` as opened (its `stats` are those of start-up).
    pub fn hello_ref(&self) -> &Hello {
        &self.hello
    }

    /// Routed experts per token (the most groups one row may be in).
    pub fn top_k(&self) -> u32 {
        self.top_k
    }

    /// Counts one answered request of `groups` experts.
    pub fn count_request(&self, groups: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.experts_served.fetch_add(groups as u64, Ordering::Relaxed);
    }

    /// Counters since start: requests answered and the store's counters.
    pub fn stats(&self) -> WorkerStats {
        to_wire(
            &self.service.stats(),
            self.requests.load(Ordering::Relaxed),
            self.experts_served.load(Ordering::Relaxed),
        )
    }
}

/// A store's counters as the wire carries them.
pub fn to_wire(s: &ExpertStats, requests: u64, experts_served: u64) -> WorkerStats {
    WorkerStats {
        requests,
        experts_served,
        expert_hits: s.expert_hits,
        expert_misses: s.expert_misses,
        expert_bytes_read: s.expert_bytes_read,
        io_wait_ms: s.io_wait_ms,
        prefetch_hits: s.prefetch_hits,
        prefetch_issued: s.prefetch_issued,
        cache_bytes: s.cache_bytes,
        predicted_correct: s.predicted_correct,
        predicted_total: s.predicted_total,
        prefetch_wasted: s.prefetch_wasted,
        prefetch_harm: s.prefetch_harm,
        prefetch_paused_steps: s.prefetch_paused_steps,
        prefetch_stand_downs: s.prefetch_stand_downs,
    }
}

/// Reads `ranges` of `path` front to back, up to [`PROBE_READ_BYTES`], and
/// returns bytes per second (page-cache hits included: this is what the
/// worker will see).
fn measure_read(path: &Path, ranges: &[(u64, u64)]) -> std::io::Result<f64> {
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    let t = Instant::now();
    'outer: for &(offset, len) in ranges {
        f.seek(SeekFrom::Start(offset))?;
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            f.read_exact(&mut buf[..n])?;
            left -= n as u64;
            done += n as u64;
            if done >= PROBE_READ_BYTES {
                break 'outer;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    Ok(done as f64 / secs)
}

/// Expert FFN rows per second, one row at a time (decode's shape).
fn measure_compute(ffn: &SwiGlu, hidden: usize) -> f64 {
    let xs: Vec<f32> = (0..hidden).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    let mut out = vec![0.0f32; hidden];
    let t = Instant::now();
    let mut runs = 0u64;
    while runs == 0 || (t.elapsed().as_secs_f64() * 1e3 < PROBE_COMPUTE_MS && runs < 10_000) {
        ffn.forward(&xs, 1, &mut out);
        runs += 1;
    }
    runs as f64 / t.elapsed().as_secs_f64().max(1e-9)
}

fn largest_safetensors(dir: &Path) -> std::io::Result<PathBuf> {
    let mut best: Option<(u64, PathBuf)> = None;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let len = std::fs::metadata(&p)?.len();
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, p));
            }
        }
    }
    best.map(|(_, p)| p)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no *.safetensors file"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_carries_every_store_counter() {
        let s = ExpertStats {
            expert_hits: 1,
            expert_misses: 2,
            expert_bytes_read: 3,
            io_wait_ms: 4.5,
            prefetch_hits: 5,
            prefetch_issued: 6,
            cache_bytes: 7,
            predicted_correct: 8,
            predicted_total: 9,
            prefetch_wasted: 10,
            prefetch_harm: 11,
            prefetch_paused_steps: 12,
            prefetch_stand_downs: 13,
            ..ExpertStats::default()
        };
        let w = to_wire(&s, 20, 21);
        assert_eq!((w.requests, w.experts_served), (20, 21));
        assert_eq!(
            (w.expert_hits, w.expert_misses, w.expert_bytes_read, w.io_wait_ms),
            (1, 2, 3, 4.5)
        );
        assert_eq!((w.prefetch_hits, w.prefetch_issued, w.cache_bytes), (5, 6, 7));
        assert_eq!((w.predicted_correct, w.predicted_total), (8, 9));
        assert_eq!(
            (
                w.prefetch_wasted,
                w.prefetch_harm,
                w.prefetch_paused_steps,
                w.prefetch_stand_downs
            ),
            (10, 11, 12, 13)
        );
    }
}
