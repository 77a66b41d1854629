//! The expert store of a charm container: experts live in `experts.bin`
//! on disk and are staged into a RAM cache with a byte budget exactly when
//! the router asks for them.
//!
//! Per layer step ([`ExpertStore::resolve`]):
//! 1. finished read-aheads are moved into the cache;
//! 2. cached experts are hits; experts already being read ahead are waited
//!    for; the rest are read now (one read per expert record);
//! 3. read-aheads for the predicted next layer are queued behind them;
//! 4. hits are computed while the reads are in flight, then each read is
//!    verified (CRC-32), computed and cached as it lands, protecting every
//!    expert this step needs from eviction.
//!
//! Routing counts are recorded per expert; at the end of every request the
//! history is saved and the hottest experts (up to half the budget) are
//! pinned, so the store gets faster the more it is used.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use charm_common::container::{record_weights, verify_record, Manifest, Quant, Record, RecordLayout};
use charm_models::{ExpertError, ExpertStats, SwiGlu};
use charm_proto::PrefetchHint;

use crate::cache::{ExpertCache, Key};
use crate::history::RoutingHistory;
use crate::io::{Backend, DiskReader, ReadDone, ReadRequest, ReaderOptions};
use crate::store::{ExpertStore, Ready};

/// Share of the cache budget the pinned hot set may fill.
pub const PIN_FRACTION: f64 = 0.5;

/// How to run a [`DiskStore`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// RAM budget for cached experts in bytes (0 = read every expert every time).
    pub cache_bytes: u64,
    /// Read the predicted next layer's experts ahead.
    pub prefetch: bool,
    /// Disk reader settings (backend, O_DIRECT).
    pub reader: ReaderOptions,
    /// Where the routing history lives (`None`: not persisted).
    pub history_path: Option<PathBuf>,
}

/// A container's experts behind a RAM cache.
pub struct DiskStore {
    path: PathBuf,
    quant: Quant,
    /// Each record's byte layout (one shared layout unless GGUF types vary by layer).
    layouts: HashMap<Key, RecordLayout>,
    records: HashMap<Key, Record>,
    reader: DiskReader,
    prefetch: bool,
    state: Mutex<State>,
    /// Warning to show the user (e.g. a history from another model).
    pub warning: Option<String>,
}

struct State {
    cache: ExpertCache,
    /// Reads issued and not yet received, and why they were issued.
    inflight: HashMap<Key, Origin>,
    /// Read-ahead experts in the cache that no step has used yet.
    prefetched: HashSet<Key>,
    tx: Sender<ReadDone>,
    rx: Receiver<ReadDone>,
    history: RoutingHistory,
    stats: ExpertStats,
    /// The last prediction, checked when its layer runs.
    prediction: Option<(u16, HashSet<u32>)>,
}

/// Why a read was issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A step needs the expert now.
    Demand,
    /// The one-layer-ahead prediction named it.
    Prefetch,
    /// Warm start of the pinned hot set.
    Preload,
}

fn tag(k: Key) -> u64 {
    ((k.0 as u64) << 32) | k.1 as u64
}

fn key(tag: u64) -> Key {
    ((tag >> 32) as u16, tag as u32)
}

impl DiskStore {
    /// Opens `dir/experts.bin` as described by `manifest`.
    pub fn open(dir: &Path, manifest: &Manifest, opts: &StoreOptions) -> Result<Self, ExpertError> {
        let path = dir.join(&manifest.experts_file);
        let reader = DiskReader::open(&path, &opts.reader).map_err(|e| ExpertError::Read {
            layer: 0,
            expert: 0,
            message: e.to_string(),
        })?;
        let layouts = manifest
            .records
            .iter()
            .map(|r| Ok(((r.layer, r.expert), manifest.layout(r)?)))
            .collect::<Result<HashMap<Key, RecordLayout>, ExpertError>>()?;
        let records: HashMap<Key, Record> = manifest
            .records
            .iter()
            .map(|r| ((r.layer, r.expert), r.clone()))
            .collect();
        let layers = records.keys().map(|k| k.0 as usize + 1).max().unwrap_or(0);
        let experts = records.keys().map(|k| k.1 as usize + 1).max().unwrap_or(0);
        let (history, warning) = match &opts.history_path {
            Some(p) => RoutingHistory::load(p, &manifest.fingerprint, layers, experts),
            None => (RoutingHistory::new(&manifest.fingerprint, layers, experts), None),
        };
        if let Some(w) = &warning {
            tracing::warn!("{w}");
        }
        let (tx, rx) = channel();
        let store = DiskStore {
            path,
            quant: manifest.quant,
            layouts,
            records,
            reader,
            prefetch: opts.prefetch,
            state: Mutex::new(State {
                cache: ExpertCache::new(opts.cache_bytes),
                inflight: HashMap::new(),
                prefetched: HashSet::new(),
                tx,
                rx,
                history,
                stats: ExpertStats::default(),
                prediction: None,
            }),
            warning,
        };
        // Warm start: pin and read ahead the hot set learned by earlier runs.
        let mut st = store.lock();
        store.repin(&mut st);
        Ok({
            drop(st);
            store
        })
    }

    /// Which reader backend runs.
    pub fn backend(&self) -> Backend {
        self.reader.backend()
    }

    /// Bytes one cached expert costs (its padded record).
    pub fn expert_bytes(&self) -> u64 {
        self.records.values().next().map_or(0, Record::padded_len)
    }

    /// Number of expert records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the container has no experts.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the cache inconsistent
        // in a way that changes results (entries are immutable), so recover.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn request(&self, k: Key) -> Result<ReadRequest, ExpertError> {
        let r = self.records.get(&k).ok_or(ExpertError::MissingExpert {
            layer: k.0,
            expert: k.1,
        })?;
        Ok(ReadRequest {
            offset: r.offset,
            len: r.padded_len() as usize,
            tag: tag(k),
        })
    }

    fn submit(&self, st: &State, reqs: Vec<ReadRequest>) -> Result<(), ExpertError> {
        if reqs.is_empty() {
            return Ok(());
        }
        let first = key(reqs[0].tag);
        self.reader.submit(reqs, st.tx.clone()).map_err(|e| ExpertError::Read {
            layer: first.0,
            expert: first.1,
            message: e.to_string(),
        })
    }

    /// Turns a finished read into weights (checksum verified).
    fn decode(&self, done: ReadDone) -> Result<(Key, Arc<SwiGlu>, u64), ExpertError> {
        let k = key(done.tag);
        let buf = done.result.map_err(|e| ExpertError::Read {
            layer: k.0,
            expert: k.1,
            message: e.to_string(),
        })?;
        let record = &self.records[&k];
        verify_record(&self.path, record, buf.as_slice())?;
        let bytes = buf.len() as u64;
        let [gate, up, down] = record_weights(Arc::new(buf), &self.layouts[&k], self.quant)?;
        Ok((k, Arc::new(SwiGlu { gate, up, down }), bytes))
    }

    /// Accounts for one finished read; caches it unless that would evict
    /// something in `protect`.
    fn receive(
        &self,
        st: &mut State,
        done: ReadDone,
        protect: &HashSet<Key>,
    ) -> Result<(Key, Arc<SwiGlu>), (Key, ExpertError)> {
        let k = key(done.tag);
        let was_prefetch = st.inflight.remove(&k) == Some(Origin::Prefetch);
        let (k, ffn, bytes) = self.decode(done).map_err(|e| (k, e))?;
        st.stats.expert_bytes_read += bytes;
        if st.cache.insert(k, ffn.clone(), bytes, protect) && was_prefetch && !protect.contains(&k) {
            st.prefetched.insert(k);
        }
        st.stats.cache_bytes = st.cache.used();
        Ok((k, ffn))
    }

    /// Moves finished read-aheads into the cache without waiting.
    fn drain(&self, st: &mut State, protect: &HashSet<Key>) {
        while let Ok(done) = st.rx.try_recv() {
            // A failed read-ahead is dropped; a demand read will retry it
            // and report the error if it persists.
            let _ = self.receive(st, done, protect);
        }
    }

    /// Pins the hottest experts (up to [`PIN_FRACTION`] of the budget) and
    /// reads ahead those not yet cached.
    fn repin(&self, st: &mut State) {
        let per = self.expert_bytes().max(1);
        let room = (st.cache.budget() as f64 * PIN_FRACTION) as u64 / per;
        let hot: Vec<Key> = st
            .history
            .hottest()
            .into_iter()
            .filter(|k| self.records.contains_key(k))
            .take(room as usize)
            .collect();
        st.cache.set_pinned(hot.iter().copied());
        let missing: Vec<Key> = hot
            .into_iter()
            .filter(|k| !st.cache.contains(*k) && !st.inflight.contains_key(k))
            .collect();
        let reqs: Vec<ReadRequest> = missing.iter().filter_map(|&k| self.request(k).ok()).collect();
        if self.submit(st, reqs).is_ok() {
            for k in missing {
                st.inflight.insert(k, Origin::Preload);
            }
        }
    }
}

impl ExpertStore for DiskStore {
    fn resolve(
        &self,
        layer: u16,
        wanted: &[(u32, u64)],
        next: Option<&PrefetchHint>,
        ready: &mut dyn FnMut(Ready),
    ) -> Result<(), ExpertError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let needed: HashSet<Key> = wanted.iter().map(|&(e, _)| (layer, e)).collect();
        self.drain(st, &needed);

        if let Some((pl, predicted)) = st.prediction.take() {
            if pl == layer {
                st.stats.predicted_total += wanted.len() as u64;
                st.stats.predicted_correct += wanted.iter().filter(|(e, _)| predicted.contains(e)).count() as u64;
            }
        }

        let mut hits: Ready = Vec::new();
        let mut waiting: HashMap<Key, usize> = HashMap::new();
        let mut reads = Vec::new();
        for (i, &(e, rows)) in wanted.iter().enumerate() {
            let k = (layer, e);
            st.history.record(layer, e, rows);
            if let Some(ffn) = st.cache.get(k) {
                st.stats.expert_hits += 1;
                if st.prefetched.remove(&k) {
                    st.stats.prefetch_hits += 1;
                }
                hits.push((i, ffn));
                continue;
            }
            st.stats.expert_misses += 1;
            match st.inflight.get(&k) {
                Some(Origin::Prefetch) => st.stats.prefetch_hits += 1,
                Some(_) => {}
                None => {
                    reads.push(self.request(k)?);
                    st.inflight.insert(k, Origin::Demand);
                }
            }
            waiting.insert(k, i);
        }
        self.submit(st, reads)?;

        // Read ahead the predicted next layer, behind this step's reads.
        if let (true, Some(h)) = (self.prefetch && st.cache.budget() > 0, next) {
            let mut ahead = Vec::new();
            for &e in &h.experts {
                let k = (h.layer, e);
                if !st.cache.contains(k) && !st.inflight.contains_key(&k) && self.records.contains_key(&k) {
                    ahead.push(k);
                }
            }
            let reqs: Vec<ReadRequest> = ahead.iter().filter_map(|&k| self.request(k).ok()).collect();
            if self.submit(st, reqs).is_ok() {
                st.stats.prefetch_issued += ahead.len() as u64;
                for k in ahead {
                    st.inflight.insert(k, Origin::Prefetch);
                }
            }
            st.prediction = Some((h.layer, h.experts.iter().copied().collect()));
        }

        // Compute what is cached while the reads are in flight.
        if !hits.is_empty() {
            ready(hits);
        }
        while !waiting.is_empty() {
            let t = Instant::now();
            let done = st.rx.recv().map_err(|_| ExpertError::Read {
                layer,
                expert: 0,
                message: "the disk reader stopped".into(),
            })?;
            st.stats.io_wait_ms += t.elapsed().as_secs_f64() * 1e3;
            match self.receive(st, done, &needed) {
                Ok((k, ffn)) => {
                    if let Some(i) = waiting.remove(&k) {
                        ready(vec![(i, ffn)]);
                    }
                }
                Err((k, e)) => {
                    if waiting.contains_key(&k) {
                        return Err(e);
                    }
                }
            }
        }
        st.stats.cache_bytes = st.cache.used();
        Ok(())
    }

    fn stats(&self) -> ExpertStats {
        let st = self.lock();
        let mut s = st.stats.clone();
        s.cache_bytes = st.cache.used();
        s
    }

    fn end_request(&self) {
        let mut st = self.lock();
        if let Err(e) = st.history.save() {
            tracing::warn!("saving routing history: {e}");
        }
        self.repin(&mut st);
    }
}
