//! The expert store of a charm container: experts live in `experts.bin`
//! on disk and are staged into a RAM cache with a byte budget exactly when
//! the router asks for them.
//!
//! Per layer step ([`ExpertStore::resolve`]):
//! 1. every wanted expert is checked to be held before anything changes;
//! 2. cached experts are hits; experts already being read (ahead, or for
//!    another request) are waited for; the rest are read now (one read per
//!    expert record);
//! 3. read-aheads for the predicted next layer are queued behind them;
//! 4. hits are computed while the reads are in flight, then each read is
//!    computed as it lands.
//!
//! Finished reads are verified (CRC-32) and cached by a completion thread
//! of the store's own, which hands each expert to every request waiting for
//! it. The store's lock guards bookkeeping only (cache, reads in flight,
//! counters): it is never held across a disk wait or an expert's compute,
//! so several coordinators sharing a worker run side by side, and counters
//! can be read at any time. Experts some running step needs are never
//! evicted to make room.
//!
//! Read-ahead measures its own payoff ([`PrefetchPolicy`]): steps with
//! and without it, interleaved, compared by what the steps they served
//! waited for reads; it stands down while it loses.
//!
//! Routing counts are recorded per expert; at the end of every request the
//! history is saved and the hottest experts (up to half the budget) are
//! pinned, so the store gets faster the more it is used.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use charm_common::container::{record_bias, record_weights, verify_record, Manifest, Quant, Record, RecordLayout};
use charm_common::Weight;
use charm_models::{ExpertError, ExpertStats, FfnBias, GluAct, SwiGlu};
use charm_proto::PrefetchHint;

use crate::cache::{ExpertCache, Key};
use crate::history::RoutingHistory;
use crate::io::{Backend, DiskReader, ReadDone, ReadRequest, ReaderOptions};
use crate::prefetch_policy::PrefetchPolicy;
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
    inner: Arc<Inner>,
    reader: DiskReader,
    /// Where finished reads go (the completion thread's channel).
    done: Mutex<Sender<ReadDone>>,
    /// Held while the routing history is written.
    saving: Mutex<()>,
    prefetch: bool,
    /// Warning to show the user (e.g. a history from another model).
    pub warning: Option<String>,
}

/// What the completion thread shares with the store.
struct Inner {
    path: PathBuf,
    quant: Quant,
    /// Each record's byte layout (one shared layout unless GGUF types vary by layer).
    layouts: HashMap<Key, RecordLayout>,
    records: HashMap<Key, Record>,
    /// How the experts gate (the manifest's `expert_glu_clamp`).
    act: GluAct,
    state: Mutex<State>,
}

/// An expert delivered to a waiting request (or why it could not be read).
type Delivery = (Key, Result<Arc<SwiGlu>, String>);

struct State {
    cache: ExpertCache,
    /// Reads issued and not yet received: why, and who waits for them.
    inflight: HashMap<Key, Inflight>,
    /// Read-ahead experts in the cache that no step has used yet.
    prefetched: HashSet<Key>,
    /// Experts a running step needs (never evicted), with how many steps
    /// need each.
    needed: HashMap<Key, usize>,
    protect: HashSet<Key>,
    history: RoutingHistory,
    stats: ExpertStats,
    /// The last prediction, checked when its layer runs.
    prediction: Option<(u16, HashSet<u32>)>,
    /// Whether reading ahead pays ([`PrefetchPolicy`]).
    policy: PrefetchPolicy,
}

struct Inflight {
    origin: Origin,
    waiters: Vec<Sender<Delivery>>,
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

/// How a container's experts gate: gpt-oss's clamped GLU when the
/// manifest names one, SwiGLU otherwise.
pub fn expert_act(manifest: &Manifest) -> GluAct {
    match manifest.expert_glu_clamp {
        Some([alpha, limit]) => GluAct::Clamped { alpha, limit },
        None => GluAct::Silu,
    }
}

/// A container record's expert: its projections, biases and gating.
pub fn expert_ffn(gate: Weight, up: Weight, down: Weight, bias: Option<[Vec<f32>; 3]>, act: GluAct) -> SwiGlu {
    let mut ffn = SwiGlu::new(gate, up, down);
    ffn.bias = bias.map(|[gate, up, down]| Box::new(FfnBias { gate, up, down }));
    ffn.act = act;
    ffn
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
        let inner = Arc::new(Inner {
            path,
            quant: manifest.quant,
            layouts,
            records,
            act: expert_act(manifest),
            state: Mutex::new(State {
                cache: ExpertCache::new(opts.cache_bytes),
                inflight: HashMap::new(),
                prefetched: HashSet::new(),
                policy: PrefetchPolicy::default(),
                needed: HashMap::new(),
                protect: HashSet::new(),
                history,
                stats: ExpertStats::default(),
                prediction: None,
            }),
        });
        let (tx, rx) = channel();
        let completer = inner.clone();
        std::thread::Builder::new()
            .name("charm-store-done".into())
            .spawn(move || completer.complete(rx))
            .map_err(|e| ExpertError::Read {
                layer: 0,
                expert: 0,
                message: format!("starting the read completion thread: {e}"),
            })?;
        let store = DiskStore {
            inner,
            reader,
            done: Mutex::new(tx),
            saving: Mutex::new(()),
            prefetch: opts.prefetch,
            warning,
        };
        // Warm start: pin and read ahead the hot set learned by earlier runs.
        let mut st = store.inner.lock();
        store.repin(&mut st);
        drop(st);
        Ok(store)
    }

    /// Which reader backend runs.
    pub fn backend(&self) -> Backend {
        self.reader.backend()
    }

    /// Bytes one cached expert costs (its padded record).
    pub fn expert_bytes(&self) -> u64 {
        self.inner.records.values().next().map_or(0, Record::padded_len)
    }

    /// Number of expert records.
    pub fn len(&self) -> usize {
        self.inner.records.len()
    }

    /// Whether the container has no experts.
    pub fn is_empty(&self) -> bool {
        self.inner.records.is_empty()
    }

    /// Whether the store holds a record for `layer`'s `expert`.
    pub fn holds(&self, layer: u16, expert: u32) -> bool {
        self.inner.records.contains_key(&(layer, expert))
    }

    /// Queues `reqs`; on failure nothing was queued.
    fn submit(&self, reqs: Vec<ReadRequest>) -> Result<(), ExpertError> {
        if reqs.is_empty() {
            return Ok(());
        }
        let first = key(reqs[0].tag);
        let tx = self.done.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.reader.submit(reqs, tx).map_err(|e| ExpertError::Read {
            layer: first.0,
            expert: first.1,
            message: e.to_string(),
        })
    }

    /// Reads `keys` (held, not cached, not in flight) with no one waiting.
    fn read_ahead(&self, st: &mut State, keys: Vec<Key>, origin: Origin) -> bool {
        let reqs: Vec<ReadRequest> = keys.iter().filter_map(|&k| self.inner.request(k)).collect();
        if self.submit(reqs).is_err() {
            return false;
        }
        for k in keys {
            st.inflight.insert(
                k,
                Inflight {
                    origin,
                    waiters: Vec::new(),
                },
            );
        }
        true
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
            .filter(|k| self.inner.records.contains_key(k))
            .take(room as usize)
            .collect();
        st.cache.set_pinned(hot.iter().copied());
        let missing: Vec<Key> = hot
            .into_iter()
            .filter(|k| !st.cache.contains(*k) && !st.inflight.contains_key(k))
            .collect();
        self.read_ahead(st, missing, Origin::Preload);
    }

    /// Marks `keys` as needed by a running step (or, with `done`, no longer).
    fn need(st: &mut State, keys: &[Key], done: bool) {
        for &k in keys {
            if done {
                if let Some(n) = st.needed.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        st.needed.remove(&k);
                        st.protect.remove(&k);
                    }
                }
            } else {
                *st.needed.entry(k).or_default() += 1;
                st.protect.insert(k);
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the bookkeeping consistent (entries are
        // immutable), so a panic elsewhere cannot change results: recover.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn request(&self, k: Key) -> Option<ReadRequest> {
        let r = self.records.get(&k)?;
        Some(ReadRequest {
            offset: r.offset,
            len: usize::try_from(r.padded_len()).ok()?,
            tag: tag(k),
        })
    }

    /// Turns a finished read into weights (checksum verified).
    fn decode(&self, k: Key, done: ReadDone) -> Result<(Arc<SwiGlu>, u64), ExpertError> {
        let buf = done.result.map_err(|e| ExpertError::Read {
            layer: k.0,
            expert: k.1,
            message: e.to_string(),
        })?;
        let (Some(record), Some(layout)) = (self.records.get(&k), self.layouts.get(&k)) else {
            return Err(ExpertError::MissingExpert {
                layer: k.0,
                expert: k.1,
            });
        };
        verify_record(&self.path, record, buf.as_slice())?;
        let bytes = buf.len() as u64;
        let bias = record_bias(buf.as_slice(), layout)?;
        let [gate, up, down] = record_weights(Arc::new(buf), layout, self.quant)?;
        Ok((Arc::new(expert_ffn(gate, up, down, bias, self.act)), bytes))
    }

    /// The completion thread: verifies and decodes each finished read
    /// (outside the lock), caches it unless that would evict an expert a
    /// running step needs, and hands it to every request waiting for it.
    /// Ends when the store and its reader are gone.
    fn complete(&self, rx: Receiver<ReadDone>) {
        while let Ok(done) = rx.recv() {
            let k = key(done.tag);
            let decoded = self.decode(k, done);
            let waiters = {
                let mut st = self.lock();
                let entry = st.inflight.remove(&k);
                if let Ok((ffn, bytes)) = &decoded {
                    st.stats.expert_bytes_read += bytes;
                    let State { cache, protect, .. } = &mut *st;
                    let mut evicted = Vec::new();
                    let cached = cache.insert_evicting(k, ffn.clone(), *bytes, protect, &mut evicted);
                    let read_ahead = entry
                        .as_ref()
                        .is_some_and(|e| e.origin == Origin::Prefetch && e.waiters.is_empty());
                    for v in evicted {
                        // A read-ahead that leaves unused was wasted; a
                        // victim of a read-ahead may come back as harm.
                        if st.prefetched.remove(&v) {
                            st.policy.wasted();
                        }
                        if read_ahead {
                            st.policy.evicted(v);
                        }
                    }
                    if cached && read_ahead {
                        st.prefetched.insert(k);
                    } else if read_ahead {
                        st.policy.wasted();
                    }
                    st.stats.cache_bytes = st.cache.used();
                }
                entry.map(|e| e.waiters).unwrap_or_default()
            };
            // A failed read-ahead with no one waiting is dropped; a demand
            // read retries it and reports the error if it persists.
            let delivery = decoded.map(|(ffn, _)| ffn).map_err(|e| e.to_string());
            for w in waiters {
                let _ = w.send((k, delivery.clone()));
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
        // Nothing changes unless every wanted expert is held (a partial
        // container, or an id out of range, is an error for this request).
        if let Some(&(e, _)) = wanted.iter().find(|&&(e, _)| !self.holds(layer, e)) {
            return Err(ExpertError::MissingExpert { layer, expert: e });
        }
        let keys: Vec<Key> = wanted.iter().map(|&(e, _)| (layer, e)).collect();
        let (tx, rx) = channel::<Delivery>();
        let mut hits: Ready = Vec::new();
        let mut waiting: HashMap<Key, usize> = HashMap::new();
        // Whether the read-ahead policy follows this step, and whether the
        // step chose a read-ahead (it had a prediction of the next layer).
        let measured;
        let mut chose = false;
        {
            let mut guard = self.inner.lock();
            let st = &mut *guard;
            measured = self.prefetch && st.cache.budget() > 0;
            if let Some((pl, predicted)) = st.prediction.take() {
                if pl == layer {
                    st.stats.predicted_total += wanted.len() as u64;
                    st.stats.predicted_correct += wanted.iter().filter(|(e, _)| predicted.contains(e)).count() as u64;
                }
            }
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
                match st.inflight.get_mut(&k) {
                    Some(f) => {
                        if f.origin == Origin::Prefetch {
                            st.stats.prefetch_hits += 1;
                            f.origin = Origin::Demand;
                        }
                        f.waiters.push(tx.clone());
                    }
                    None => {
                        st.policy.demand_read(k);
                        reads.push(k);
                    }
                }
                waiting.insert(k, i);
            }
            let reqs: Vec<ReadRequest> = reads.iter().filter_map(|&k| self.inner.request(k)).collect();
            // On failure nothing of ours was queued; reads of others we
            // joined will send to a channel that is gone, which is harmless.
            self.submit(reqs)?;
            for k in reads {
                st.inflight.insert(
                    k,
                    Inflight {
                        origin: Origin::Demand,
                        waiters: vec![tx.clone()],
                    },
                );
            }
            Self::need(st, &keys, false);

            // Read ahead the predicted next layer, behind this step's reads,
            // unless read-ahead is standing down (the prediction is still
            // checked then).
            if let (true, Some(h)) = (measured, next) {
                chose = true;
                if st.policy.allows() {
                    let ahead: Vec<Key> = h
                        .experts
                        .iter()
                        .map(|&e| (h.layer, e))
                        .filter(|&k| self.holds(k.0, k.1) && !st.cache.contains(k) && !st.inflight.contains_key(&k))
                        .collect();
                    let n = ahead.len() as u64;
                    if self.read_ahead(st, ahead, Origin::Prefetch) {
                        st.stats.prefetch_issued += n;
                    }
                }
                st.prediction = Some((h.layer, h.experts.iter().copied().collect()));
            }
        }
        drop(tx);

        // Compute what is cached while the reads are in flight (no lock).
        let result = (|| {
            if !hits.is_empty() {
                ready(hits);
            }
            let mut io_wait_ms = 0.0;
            while !waiting.is_empty() {
                let t = Instant::now();
                let got = rx.recv();
                io_wait_ms += t.elapsed().as_secs_f64() * 1e3;
                let (k, delivered) = got.map_err(|_| ExpertError::Read {
                    layer,
                    expert: waiting.keys().next().map_or(0, |k| k.1),
                    message: "the disk reader stopped".into(),
                })?;
                let Some(i) = waiting.remove(&k) else { continue };
                match delivered {
                    Ok(ffn) => ready(vec![(i, ffn)]),
                    Err(message) => {
                        return Err(ExpertError::Read {
                            layer: k.0,
                            expert: k.1,
                            message,
                        })
                    }
                }
            }
            Ok(io_wait_ms)
        })();
        let mut st = self.inner.lock();
        Self::need(&mut st, &keys, true);
        if let Ok(ms) = &result {
            st.stats.io_wait_ms += ms;
            if measured {
                st.policy.step(*ms, wanted.len() as u64, chose);
            }
        }
        st.stats.cache_bytes = st.cache.used();
        result.map(|_| ())
    }

    fn stats(&self) -> ExpertStats {
        let st = self.inner.lock();
        let mut s = st.stats.clone();
        s.cache_bytes = st.cache.used();
        s.prefetch_wasted = st.policy.total_wasted;
        s.prefetch_harm = st.policy.total_harm;
        s.prefetch_paused_steps = st.policy.paused_steps;
        s.prefetch_stand_downs = st.policy.stand_downs;
        s
    }

    fn end_request(&self) {
        // Saving writes a file: take a copy and write it outside the lock
        // (one save at a time).
        let _saving = self.saving.lock().unwrap_or_else(|p| p.into_inner());
        let history = self.inner.lock().history.clone();
        if let Err(e) = history.save() {
            tracing::warn!("saving routing history: {e}");
        }
        let mut st = self.inner.lock();
        self.repin(&mut st);
    }
}
