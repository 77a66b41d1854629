//! The prefix cache: sequence caches of earlier requests, kept so a request
//! whose prompt starts with tokens already computed (the next turn of a
//! chat, an agent's fixed tool catalogue, the same prompt again) computes
//! only what is new.
//!
//! An entry is a [`KvCache`] with the tokens it has seen and, at some of
//! its lengths, the logits that followed them (a *checkpoint*). A prompt is
//! matched against every entry:
//!
//! - an entry whose tokens start with the whole prompt and that has a
//!   checkpoint at the prompt's length serves it entirely: its cache (cut
//!   back to the prompt) and the logits the first token is sampled from,
//!   the very bits the run that stored them computed;
//! - otherwise the longest common prefix is reused, short of the prompt's
//!   last token (whose logits must be computed). A cache with a recurrent
//!   layer cannot be cut back ([`KvCache::rewinds`]): such an entry is
//!   reused only when the prompt extends all of it.
//!
//! Every kind of layer cache the engine has fits (attention KV in f32 or
//! f16, MLA latents with their indexer keys, gated DeltaNet states): the
//! entry is the whole sequence cache.
//!
//! Entries live under a RAM budget (least recently used first out). With a
//! directory, each entry is also written there (one checksummed file per
//! entry, in a subdirectory per model fingerprint, written by a background
//! thread), so a restarted server finds them again; the directory has its
//! own byte budget. A file that fails its checksum or does not fit the
//! model is reported and removed, never used.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use charm_models::KvCache;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// First bytes of a persisted prefix file.
const MAGIC: &[u8; 8] = b"CHARMPFX";
/// Version of the file layout.
const VERSION: u32 = 1;
/// Bytes before the header: magic, version, header length and CRC, body
/// length and CRC.
const PREAMBLE: usize = 8 + 4 + 8 + 4 + 8 + 4;

/// Why the prefix cache's directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    #[error("prefix cache directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Settings of a prefix cache.
#[derive(Clone, Debug)]
pub struct PrefixOptions {
    /// RAM budget in bytes (0: no prefix cache).
    pub ram_bytes: u64,
    /// Where entries persist, if anywhere.
    pub dir: Option<PathBuf>,
    /// Byte budget of the directory.
    pub disk_bytes: u64,
    /// Logits per checkpoint: the model's vocabulary (a file with others
    /// is refused).
    pub vocab: usize,
}

/// What a lookup found.
pub struct Hit {
    /// A copy of the entry's cache, cut back to `reused` positions.
    pub cache: KvCache,
    /// Prompt tokens the cache holds.
    pub reused: usize,
    /// Logits after the whole prompt, when the entry had them: nothing is
    /// left to compute before sampling.
    pub logits: Option<Vec<f32>>,
}

/// Counters for `/metrics`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PrefixStats {
    pub entries: usize,
    pub bytes: u64,
    pub budget_bytes: u64,
    pub disk_entries: usize,
    pub disk_bytes: u64,
    pub lookups: u64,
    pub hits: u64,
    /// Prompt tokens served from the cache.
    pub reused_tokens: u64,
    pub evictions: u64,
    /// Persisted files refused (bad checksum, wrong layout).
    pub bad_files: u64,
}

/// The tokens-and-state of one entry, shared with the writer thread.
struct Snapshot {
    tokens: Vec<u32>,
    cache: KvCache,
    /// `(len, logits after tokens[..len])`.
    checkpoints: Vec<(usize, Vec<f32>)>,
}

impl Snapshot {
    fn bytes(&self) -> u64 {
        let logits: usize = self.checkpoints.iter().map(|(_, l)| l.len() * 4).sum();
        (self.cache.bytes() + self.tokens.len() * 4 + logits) as u64
    }
}

struct Entry {
    snap: Arc<Snapshot>,
    bytes: u64,
    used_at: u64,
}

/// What a file says of itself before its body: enough to rank it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    tokens: Vec<u32>,
    rewinds: bool,
    /// Lengths with logits.
    checkpoints: Vec<usize>,
}

/// A persisted entry, in RAM or not.
struct OnDisk {
    header: Header,
    path: PathBuf,
    bytes: u64,
    used_at: u64,
}

enum DiskOp {
    Write(PathBuf, Arc<Snapshot>),
    Remove(PathBuf),
    /// Answer once every earlier operation is done.
    Flush(mpsc::Sender<()>),
}

struct Disk {
    dir: PathBuf,
    budget: u64,
    files: Vec<OnDisk>,
    ops: mpsc::Sender<DiskOp>,
}

/// Sequence caches of earlier requests under a RAM budget (and optionally a
/// directory); see the module docs.
pub struct PrefixCache {
    budget: u64,
    used: u64,
    entries: Vec<Entry>,
    clock: u64,
    /// An empty cache of the model: the layout persisted files must have.
    fresh: KvCache,
    /// Logits per checkpoint.
    vocab: usize,
    disk: Option<Disk>,
    stats: PrefixStats,
}

/// Tokens `a` and `b` share at their start.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How much of `prompt` an entry of `tokens` can serve: `(reused, full)`,
/// `full` when a checkpoint at the prompt's length makes the whole prompt
/// served.
fn reuse(tokens: &[u32], rewinds: bool, has_checkpoint: impl Fn(usize) -> bool, prompt: &[u32]) -> (usize, bool) {
    let n = prompt.len();
    let common = common_prefix(tokens, prompt);
    if common == n && (rewinds || tokens.len() == n) && has_checkpoint(n) {
        return (n, true);
    }
    let keep = common.min(n.saturating_sub(1));
    if !rewinds && keep < tokens.len() {
        return (0, false);
    }
    (keep, false)
}

impl PrefixCache {
    /// A cache for sequences shaped like `fresh` (the model's empty cache).
    /// With a directory, opens (creating) its subdirectory for `fingerprint`
    /// and indexes the entries found there.
    pub fn new(opts: &PrefixOptions, fresh: KvCache, fingerprint: &str) -> Result<Self, PrefixError> {
        let disk = match &opts.dir {
            None => None,
            Some(root) => {
                let dir = root.join(fingerprint);
                let fail = |source| PrefixError::Dir {
                    path: dir.clone(),
                    source,
                };
                std::fs::create_dir_all(&dir).map_err(fail)?;
                let (tx, rx) = mpsc::channel();
                std::thread::Builder::new()
                    .name("charm-prefix-writer".into())
                    .spawn(move || writer(rx))
                    .map_err(fail)?;
                let mut disk = Disk {
                    dir: dir.clone(),
                    budget: opts.disk_bytes,
                    files: Vec::new(),
                    ops: tx,
                };
                disk.files = index(&dir).map_err(fail)?;
                Some(disk)
            }
        };
        let mut cache = PrefixCache {
            budget: opts.ram_bytes,
            used: 0,
            entries: Vec::new(),
            clock: now_ms(),
            fresh,
            vocab: opts.vocab,
            disk,
            stats: PrefixStats::default(),
        };
        cache.trim_disk();
        Ok(cache)
    }

    /// Whether the cache keeps anything (a RAM budget above 0).
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    fn tick(&mut self) -> u64 {
        self.clock = self.clock.max(now_ms()) + 1;
        self.clock
    }

    /// The cache that serves the most of `prompt`, copied and cut back to
    /// what it serves; `None` when nothing is reusable.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<Hit> {
        if !self.enabled() || prompt.is_empty() {
            return None;
        }
        self.stats.lookups += 1;
        // The best RAM entry, then whether a file does better.
        let mut best: Option<(usize, usize, bool)> = None; // (index, reused, full)
        for (i, e) in self.entries.iter().enumerate() {
            let s = &e.snap;
            let has = |n: usize| s.checkpoints.iter().any(|(at, _)| *at == n);
            let (r, full) = reuse(&s.tokens, s.cache.rewinds(), has, prompt);
            if r > 0 && best.is_none_or(|(_, b, bf)| (r, full) > (b, bf)) {
                best = Some((i, r, full));
            }
        }
        let ram_best = best.map_or((0, false), |(_, r, f)| (r, f));
        if let Some(disk) = &self.disk {
            let mut file: Option<(usize, usize, bool)> = None;
            for (i, f) in disk.files.iter().enumerate() {
                let h = &f.header;
                let (r, full) = reuse(&h.tokens, h.rewinds, |n| h.checkpoints.contains(&n), prompt);
                if r > 0 && (r, full) > ram_best && file.is_none_or(|(_, b, bf)| (r, full) > (b, bf)) {
                    file = Some((i, r, full));
                }
            }
            if let Some((i, _, _)) = file {
                if let Some(idx) = self.load_file(i) {
                    let s = &self.entries[idx].snap;
                    let has = |n: usize| s.checkpoints.iter().any(|(at, _)| *at == n);
                    let (r, full) = reuse(&s.tokens, s.cache.rewinds(), has, prompt);
                    if r > 0 && (r, full) > ram_best {
                        best = Some((idx, r, full));
                    }
                }
            }
        }
        let (i, reused, full) = best?;
        let t = self.tick();
        let e = &mut self.entries[i];
        e.used_at = t;
        let mut cache = e.snap.cache.clone();
        let kept = cache.truncate(reused);
        debug_assert_eq!(kept, reused);
        let logits = full.then(|| {
            e.snap
                .checkpoints
                .iter()
                .find(|(at, _)| *at == reused)
                .map(|(_, l)| l.clone())
                .expect("a full hit has its checkpoint")
        });
        self.stats.hits += 1;
        self.stats.reused_tokens += reused as u64;
        Some(Hit { cache, reused, logits })
    }

    /// Keeps `cache`, which has seen `tokens`, with the logits that followed
    /// some of its lengths. An entry it extends is replaced (its checkpoints
    /// kept) when caches of this model can be cut back; an entry that
    /// already covers it takes its checkpoints instead.
    pub fn insert(&mut self, tokens: Vec<u32>, cache: KvCache, mut checkpoints: Vec<(usize, Vec<f32>)>) {
        if !self.enabled() || tokens.is_empty() || cache.len() != tokens.len() {
            return;
        }
        let rewinds = cache.rewinds();
        if rewinds {
            // Covered by an entry that extends it: add what it lacks.
            if let Some(e) = self
                .entries
                .iter_mut()
                .find(|e| e.snap.tokens.len() >= tokens.len() && e.snap.tokens.starts_with(&tokens))
            {
                let missing: Vec<(usize, Vec<f32>)> = checkpoints
                    .into_iter()
                    .filter(|(at, _)| !e.snap.checkpoints.iter().any(|(a, _)| a == at))
                    .collect();
                if !missing.is_empty() {
                    let mut snap = Snapshot {
                        tokens: e.snap.tokens.clone(),
                        cache: e.snap.cache.clone(),
                        checkpoints: e.snap.checkpoints.clone(),
                    };
                    snap.checkpoints.extend(missing);
                    self.used -= e.bytes;
                    e.bytes = snap.bytes();
                    self.used += e.bytes;
                    e.snap = Arc::new(snap);
                }
                e.used_at = self.clock + 1;
                self.clock += 1;
                self.trim_ram();
                return;
            }
            // Entries it extends go, their checkpoints kept.
            let mut i = 0;
            while i < self.entries.len() {
                if tokens.starts_with(&self.entries[i].snap.tokens) {
                    let old = self.entries.swap_remove(i);
                    self.used -= old.bytes;
                    for (at, l) in &old.snap.checkpoints {
                        if !checkpoints.iter().any(|(a, _)| a == at) {
                            checkpoints.push((*at, l.clone()));
                        }
                    }
                } else {
                    i += 1;
                }
            }
        } else if self.entries.iter().any(|e| e.snap.tokens == tokens) {
            return;
        }
        checkpoints.retain(|(at, _)| *at <= tokens.len());
        checkpoints.sort_by_key(|(at, _)| *at);
        let snap = Arc::new(Snapshot {
            tokens,
            cache,
            checkpoints,
        });
        let bytes = snap.bytes();
        if bytes > self.budget {
            return;
        }
        if let Some(disk) = &mut self.disk {
            let path = disk.dir.join(file_name(&snap.tokens));
            // The files this one supersedes go too.
            let mut i = 0;
            while i < disk.files.len() {
                let f = &disk.files[i];
                let superseded = f.path == path || (rewinds && snap.tokens.starts_with(&f.header.tokens));
                if superseded {
                    let f = disk.files.swap_remove(i);
                    if f.path != path {
                        let _ = disk.ops.send(DiskOp::Remove(f.path));
                    }
                } else {
                    i += 1;
                }
            }
            disk.files.push(OnDisk {
                header: Header {
                    tokens: snap.tokens.clone(),
                    rewinds,
                    checkpoints: snap.checkpoints.iter().map(|(at, _)| *at).collect(),
                },
                path: path.clone(),
                bytes,
                used_at: self.clock,
            });
            let _ = disk.ops.send(DiskOp::Write(path, snap.clone()));
        }
        let used_at = self.tick();
        self.used += bytes;
        self.entries.push(Entry { snap, bytes, used_at });
        self.trim_ram();
        self.trim_disk();
    }

    /// Evicts the least recently used entries until the budget holds.
    fn trim_ram(&mut self) {
        while self.used > self.budget {
            let Some((i, _)) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used_at) else {
                break;
            };
            let e = self.entries.swap_remove(i);
            self.used -= e.bytes;
            self.stats.evictions += 1;
        }
    }

    /// Removes the least recently used files until the directory's budget holds.
    fn trim_disk(&mut self) {
        let Some(disk) = &mut self.disk else { return };
        let mut total: u64 = disk.files.iter().map(|f| f.bytes).sum();
        while total > disk.budget {
            let Some((i, _)) = disk.files.iter().enumerate().min_by_key(|(_, f)| f.used_at) else {
                break;
            };
            let f = disk.files.swap_remove(i);
            total -= f.bytes;
            let _ = disk.ops.send(DiskOp::Remove(f.path));
        }
    }

    /// Reads file `i` of the directory into RAM; its index among the
    /// entries, or `None` (the file is dropped) when it cannot be used.
    fn load_file(&mut self, i: usize) -> Option<usize> {
        let disk = self.disk.as_mut()?;
        let path = disk.files[i].path.clone();
        match read_file(&path, &self.fresh, self.vocab) {
            Ok(snap) => {
                disk.files[i].used_at = self.clock;
                let bytes = snap.bytes();
                if bytes > self.budget {
                    return None;
                }
                let used_at = self.tick();
                self.used += bytes;
                self.entries.push(Entry {
                    snap: Arc::new(snap),
                    bytes,
                    used_at,
                });
                // The new entry is the most recent: trimming never takes it.
                self.trim_ram();
                self.entries.iter().position(|e| e.used_at == used_at)
            }
            Err(why) => {
                tracing::warn!("prefix cache: {}: {why}; removed", path.display());
                self.stats.bad_files += 1;
                let f = disk.files.swap_remove(i);
                let _ = disk.ops.send(DiskOp::Remove(f.path));
                None
            }
        }
    }

    /// Counters and sizes.
    pub fn stats(&self) -> PrefixStats {
        let mut s = self.stats.clone();
        s.entries = self.entries.len();
        s.bytes = self.used;
        s.budget_bytes = self.budget;
        if let Some(d) = &self.disk {
            s.disk_entries = d.files.len();
            s.disk_bytes = d.files.iter().map(|f| f.bytes).sum();
        }
        s
    }

    /// Blocks until every file write queued so far is done (tests, shutdown).
    pub fn flush(&self) {
        if let Some(d) = &self.disk {
            let (tx, rx) = mpsc::channel();
            if d.ops.send(DiskOp::Flush(tx)).is_ok() {
                let _ = rx.recv_timeout(std::time::Duration::from_secs(60));
            }
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A file's name: a hash of its tokens and their count.
fn file_name(tokens: &[u32]) -> String {
    let mut h = DefaultHasher::new();
    tokens.hash(&mut h);
    format!("{:016x}-{}.prefix", h.finish(), tokens.len())
}

/// A fingerprint of the model a prefix file belongs to: the engine's
/// arithmetic ([`charm_common::ARITHMETIC`]: a restarted server never
/// continues from a prefix another build computed), the layout of its sequence cache, and the
/// names, sizes and modification times of its files (`model` is a
/// directory or a GGUF file).
pub fn model_fingerprint(model: &Path, fresh: &KvCache) -> String {
    let mut h = Sha256::new();
    h.update(format!("charm arithmetic {}\0", charm_common::ARITHMETIC).as_bytes());
    h.update(bincode::serde::encode_to_vec(fresh, bincode::config::standard()).unwrap_or_default());
    let files: Vec<PathBuf> = if model.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(model)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    } else {
        vec![model.to_path_buf()]
    };
    for f in files {
        let Ok(meta) = std::fs::metadata(&f) else { continue };
        if !meta.is_file() {
            continue;
        }
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h.update(
            f.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        h.update(meta.len().to_le_bytes());
        h.update(mtime.to_le_bytes());
    }
    h.finalize()[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// The writer thread: writes (to a temporary name, then renamed) and
/// removes files in the order they were asked for.
fn writer(rx: mpsc::Receiver<DiskOp>) {
    while let Ok(op) = rx.recv() {
        match op {
            DiskOp::Flush(tx) => {
                let _ = tx.send(());
            }
            DiskOp::Write(path, snap) => {
                if let Err(e) = write_file(&path, &snap) {
                    tracing::warn!("prefix cache: writing {}: {e}", path.display());
                }
            }
            DiskOp::Remove(path) => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

fn write_file(path: &Path, snap: &Snapshot) -> std::io::Result<()> {
    let cfg = bincode::config::standard();
    let header = Header {
        tokens: snap.tokens.clone(),
        rewinds: snap.cache.rewinds(),
        checkpoints: snap.checkpoints.iter().map(|(at, _)| *at).collect(),
    };
    let header = bincode::serde::encode_to_vec(&header, cfg).map_err(std::io::Error::other)?;
    let body = bincode::serde::encode_to_vec((&snap.checkpoints, &snap.cache), cfg).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    let mut pre = Vec::with_capacity(PREAMBLE);
    pre.extend_from_slice(MAGIC);
    pre.extend_from_slice(&VERSION.to_le_bytes());
    pre.extend_from_slice(&(header.len() as u64).to_le_bytes());
    pre.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
    pre.extend_from_slice(&(body.len() as u64).to_le_bytes());
    pre.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    f.write_all(&pre)?;
    f.write_all(&header)?;
    f.write_all(&body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The preamble's fields: header length and CRC, body length and CRC.
fn preamble(pre: &[u8; PREAMBLE]) -> Result<(u64, u32, u64, u32), String> {
    if &pre[..8] != MAGIC {
        return Err("not a charm prefix file".into());
    }
    let u32_at = |i: usize| u32::from_le_bytes(pre[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(pre[i..i + 8].try_into().expect("8 bytes"));
    if u32_at(8) != VERSION {
        return Err(format!("file version {} (this charm reads {VERSION})", u32_at(8)));
    }
    Ok((u64_at(12), u32_at(20), u64_at(24), u32_at(32)))
}

/// Reads a header within a file of `file_len` bytes; with the body's
/// length and CRC.
fn read_header(f: &mut std::fs::File, file_len: u64) -> Result<(Header, u64, u32), String> {
    let mut pre = [0u8; PREAMBLE];
    f.read_exact(&mut pre).map_err(|e| format!("reading: {e}"))?;
    let (hlen, hcrc, blen, bcrc) = preamble(&pre)?;
    if (PREAMBLE as u64).checked_add(hlen).and_then(|n| n.checked_add(blen)) != Some(file_len) {
        return Err("truncated or padded (lengths do not add up)".into());
    }
    let mut header = vec![0u8; hlen as usize];
    f.read_exact(&mut header).map_err(|e| format!("reading: {e}"))?;
    if crc32fast::hash(&header) != hcrc {
        return Err("header checksum mismatch".into());
    }
    let (header, _): (Header, usize) =
        bincode::serde::decode_from_slice(&header, bincode::config::standard()).map_err(|e| format!("header: {e}"))?;
    Ok((header, blen, bcrc))
}

/// Indexes the files of `dir` by their headers; unreadable ones are
/// reported and removed.
fn index(dir: &Path) -> std::io::Result<Vec<OnDisk>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        match path.extension().and_then(|x| x.to_str()) {
            Some("prefix") => {}
            Some("tmp") => {
                // A write cut short by a crash.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            _ => continue,
        }
        let read = || -> Result<OnDisk, String> {
            let meta = std::fs::metadata(&path).map_err(|e| e.to_string())?;
            let mut f = std::fs::File::open(&path).map_err(|e| e.to_string())?;
            let (header, _, _) = read_header(&mut f, meta.len())?;
            let used_at = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64);
            Ok(OnDisk {
                header,
                path: path.clone(),
                bytes: meta.len(),
                used_at,
            })
        };
        match read() {
            Ok(f) if !f.header.tokens.is_empty() => out.push(f),
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(why) => {
                tracing::warn!("prefix cache: {}: {why}; removed", path.display());
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    Ok(out)
}

/// Reads a whole file and checks it fits the model's cache layout.
fn read_file(path: &Path, fresh: &KvCache, vocab: usize) -> Result<Snapshot, String> {
    let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let (header, blen, bcrc) = read_header(&mut f, len)?;
    let tokens = header.tokens;
    let mut body = vec![0u8; blen as usize];
    f.read_exact(&mut body).map_err(|e| format!("reading: {e}"))?;
    if crc32fast::hash(&body) != bcrc {
        return Err("checksum mismatch".into());
    }
    type Body = (Vec<(usize, Vec<f32>)>, KvCache);
    let ((checkpoints, mut cache), _): (Body, usize) =
        bincode::serde::decode_from_slice(&body, bincode::config::standard()).map_err(|e| format!("body: {e}"))?;
    if !cache.fits(fresh) || cache.len() != tokens.len() || cache.rewinds() != header.rewinds {
        return Err("the cache does not fit this model".into());
    }
    let vocab_ok = checkpoints
        .iter()
        .all(|(at, l)| *at <= tokens.len() && l.len() == vocab);
    if !vocab_ok {
        return Err("bad checkpoints".into());
    }
    // Per-step scratch (sparse attention's selections) does not carry over.
    cache.truncate(cache.len());
    Ok(Snapshot {
        tokens,
        cache,
        checkpoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use charm_models::KvDtype;

    fn cache_of(tokens: usize) -> KvCache {
        let mut c = KvCache::new(2, 1, 4, KvDtype::F32);
        for p in 0..tokens {
            for l in &mut c.layers {
                let charm_models::LayerCache::Kv(kv) = l else {
                    unreachable!()
                };
                let row = [p as f32; 4];
                kv.push(&row, &row);
            }
        }
        c
    }

    fn opts(ram: u64, dir: Option<PathBuf>) -> PrefixOptions {
        PrefixOptions {
            ram_bytes: ram,
            dir,
            disk_bytes: 1 << 30,
            vocab: 2,
        }
    }

    #[test]
    fn reuse_takes_the_longest_prefix_short_of_the_last_token_unless_checkpointed() {
        let t = [1, 2, 3, 4];
        assert_eq!(reuse(&t, true, |_| false, &[1, 2, 3, 4]), (3, false));
        assert_eq!(reuse(&t, true, |n| n == 4, &[1, 2, 3, 4]), (4, true));
        assert_eq!(reuse(&t, true, |n| n == 2, &[1, 2]), (2, true));
        assert_eq!(reuse(&t, true, |_| false, &[1, 2, 9, 9]), (2, false));
        assert_eq!(reuse(&t, true, |_| false, &[1, 2, 3, 4, 5]), (4, false));
        // A recurrent state: only all of it, or nothing.
        assert_eq!(reuse(&t, false, |_| false, &[1, 2, 9]), (0, false));
        assert_eq!(reuse(&t, false, |n| n == 2, &[1, 2]), (0, false));
        assert_eq!(reuse(&t, false, |_| false, &[1, 2, 3, 4, 5]), (4, false));
        assert_eq!(reuse(&t, false, |n| n == 4, &[1, 2, 3, 4]), (4, true));
    }

    #[test]
    fn lookup_serves_prefixes_and_the_budget_evicts_the_least_recent() {
        let per = cache_of(10).bytes() as u64 + 40;
        let mut pc = PrefixCache::new(&opts(2 * per + per / 2, None), cache_of(0), "x").unwrap();
        let a: Vec<u32> = (0..10).collect();
        pc.insert(a.clone(), cache_of(10), vec![(10, vec![0.5; 3])]);
        let hit = pc.lookup(&a).unwrap();
        assert_eq!((hit.reused, hit.cache.len()), (10, 10));
        assert_eq!(hit.logits.as_deref(), Some(&[0.5f32; 3][..]));
        let mut longer = a.clone();
        longer.extend([7, 7]);
        let hit = pc.lookup(&longer).unwrap();
        assert_eq!((hit.reused, hit.logits.is_none()), (10, true));
        let hit = pc.lookup(&a[..6]).unwrap();
        assert_eq!((hit.reused, hit.cache.len()), (5, 5));
        assert!(pc.lookup(&[9, 9, 9]).is_none());

        // Two more entries: the budget holds two, the least recent goes.
        let b: Vec<u32> = (100..110).collect();
        let c: Vec<u32> = (200..210).collect();
        pc.insert(b.clone(), cache_of(10), Vec::new());
        pc.lookup(&a).unwrap(); // a is now more recent than b
        pc.insert(c.clone(), cache_of(10), Vec::new());
        let s = pc.stats();
        assert_eq!((s.entries, s.evictions), (2, 1));
        assert!(s.bytes <= s.budget_bytes);
        assert!(pc.lookup(&b).is_none(), "b was least recently used");
        assert!(pc.lookup(&a).is_some() && pc.lookup(&c).is_some());
    }

    #[test]
    fn an_extending_entry_replaces_the_one_it_extends() {
        let mut pc = PrefixCache::new(&opts(1 << 20, None), cache_of(0), "x").unwrap();
        let a: Vec<u32> = (0..6).collect();
        pc.insert(a.clone(), cache_of(6), vec![(6, vec![1.0])]);
        let b: Vec<u32> = (0..9).collect();
        pc.insert(b.clone(), cache_of(9), vec![(9, vec![2.0])]);
        assert_eq!(pc.stats().entries, 1);
        // a's checkpoint moved to b: the prompt `a` is still served whole.
        let hit = pc.lookup(&a).unwrap();
        assert_eq!((hit.reused, hit.logits), (6, Some(vec![1.0])));
        // A prefix of b adds only its checkpoint.
        pc.insert(b[..4].to_vec(), cache_of(4), vec![(4, vec![3.0])]);
        assert_eq!(pc.stats().entries, 1);
        assert_eq!(pc.lookup(&b[..4]).unwrap().logits, Some(vec![3.0]));
    }

    #[test]
    fn files_survive_a_restart_and_bad_ones_are_removed() {
        let root = std::env::temp_dir().join(format!("charm-prefix-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let a: Vec<u32> = (0..8).collect();
        {
            let mut pc = PrefixCache::new(&opts(1 << 20, Some(root.clone())), cache_of(0), "m").unwrap();
            pc.insert(a.clone(), cache_of(8), vec![(8, vec![4.0, 5.0])]);
            pc.flush();
        }
        let mut pc = PrefixCache::new(&opts(1 << 20, Some(root.clone())), cache_of(0), "m").unwrap();
        assert_eq!(pc.stats().disk_entries, 1);
        let hit = pc.lookup(&a).expect("the persisted entry");
        assert_eq!((hit.reused, hit.logits), (8, Some(vec![4.0, 5.0])));
        let bits = |c: &KvCache| bincode::serde::encode_to_vec(c, bincode::config::standard()).unwrap();
        assert_eq!(bits(&hit.cache), bits(&cache_of(8)));

        // Another model's directory holds nothing for this one.
        let other = PrefixCache::new(&opts(1 << 20, Some(root.clone())), cache_of(0), "other").unwrap();
        assert_eq!(other.stats().disk_entries, 0);

        // A flipped byte in the body: refused and removed on load.
        let file = std::fs::read_dir(root.join("m"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x40;
        std::fs::write(&file, &bytes).unwrap();
        let mut pc = PrefixCache::new(&opts(1 << 20, Some(root.clone())), cache_of(0), "m").unwrap();
        assert!(pc.lookup(&a).is_none());
        assert_eq!(pc.stats().bad_files, 1);
        pc.flush();
        assert!(!file.exists(), "the bad file is removed");

        // A file of another cache layout: refused.
        {
            let mut pc = PrefixCache::new(&opts(1 << 20, Some(root.clone())), cache_of(0), "m").unwrap();
            pc.insert(a.clone(), cache_of(8), Vec::new());
            pc.flush();
        }
        let wider = KvCache::new(2, 2, 4, KvDtype::F32);
        let mut pc = PrefixCache::new(&opts(1 << 20, Some(root.clone())), wider, "m").unwrap();
        assert!(pc.lookup(&a).is_none());
        assert_eq!(pc.stats().bad_files, 1);
        let _ = std::fs::remove_dir_all(&root);
    }
}
