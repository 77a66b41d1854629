//! The RAM cache of expert weights: a byte budget, a pinned hot set that is
//! never evicted, and least-recently-used eviction for the rest. Eviction
//! never touches the experts the current step needs (`protect`).
//!
//! The unpinned entries are also kept in use order (`lru`), so a use, an
//! insertion and each eviction cost `O(log n)` whatever the number of
//! experts (6,144 at 48 layers × 128): the victim is the first entry in
//! that order outside `protect` (a step's few experts), the same expert a
//! scan for the smallest `(last_used, key)` would find.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use charm_models::SwiGlu;

/// `(layer, expert)`.
pub type Key = (u16, u32);

struct Entry {
    ffn: Arc<SwiGlu>,
    bytes: u64,
    last_used: u64,
}

/// Cached experts within a byte budget.
pub struct ExpertCache {
    budget: u64,
    used: u64,
    clock: u64,
    entries: HashMap<Key, Entry>,
    pinned: HashSet<Key>,
    /// `(last_used, key)` of every unpinned entry, oldest first.
    lru: BTreeSet<(u64, Key)>,
}

impl ExpertCache {
    /// An empty cache holding at most `budget` bytes (0 = hold nothing).
    pub fn new(budget: u64) -> Self {
        ExpertCache {
            budget,
            used: 0,
            clock: 0,
            entries: HashMap::new(),
            pinned: HashSet::new(),
            lru: BTreeSet::new(),
        }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Experts held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` is held (does not count as a use).
    pub fn contains(&self, key: Key) -> bool {
        self.entries.contains_key(&key)
    }

    /// The expert, marking it most recently used.
    pub fn get(&mut self, key: Key) -> Option<Arc<SwiGlu>> {
        self.clock += 1;
        let e = self.entries.get_mut(&key)?;
        if self.lru.remove(&(e.last_used, key)) {
            self.lru.insert((self.clock, key));
        }
        e.last_used = self.clock;
        Some(e.ffn.clone())
    }

    /// Replaces the pinned set (pinned experts are never evicted).
    pub fn set_pinned(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.pinned = keys.into_iter().collect();
        let pinned = &self.pinned;
        self.lru = self
            .entries
            .iter()
            .filter(|(k, _)| !pinned.contains(k))
            .map(|(k, e)| (e.last_used, *k))
            .collect();
    }

    /// Whether `key` is pinned.
    pub fn is_pinned(&self, key: Key) -> bool {
        self.pinned.contains(&key)
    }

    /// Inserts an expert of `bytes`, evicting least-recently-used unpinned
    /// experts outside `protect` until it fits. Returns `false` (and holds
    /// nothing new) when it cannot fit.
    pub fn insert(&mut self, key: Key, ffn: Arc<SwiGlu>, bytes: u64, protect: &HashSet<Key>) -> bool {
        self.insert_evicting(key, ffn, bytes, protect, &mut Vec::new())
    }

    /// [`ExpertCache::insert`], adding the keys it evicted to `evicted`.
    pub fn insert_evicting(
        &mut self,
        key: Key,
        ffn: Arc<SwiGlu>,
        bytes: u64,
        protect: &HashSet<Key>,
        evicted: &mut Vec<Key>,
    ) -> bool {
        if self.entries.contains_key(&key) {
            return true;
        }
        if bytes > self.budget {
            return false;
        }
        while self.used + bytes > self.budget {
            let victim = self.lru.iter().find(|(_, k)| !protect.contains(k)).copied();
            match victim {
                Some((used, k)) => {
                    self.lru.remove(&(used, k));
                    let e = self.entries.remove(&k).expect("victim exists");
                    self.used -= e.bytes;
                    evicted.push(k);
                }
                None => return false,
            }
        }
        self.clock += 1;
        self.used += bytes;
        if !self.pinned.contains(&key) {
            self.lru.insert((self.clock, key));
        }
        self.entries.insert(
            key,
            Entry {
                ffn,
                bytes,
                last_used: self.clock,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use charm_common::Weight;

    fn ffn() -> Arc<SwiGlu> {
        let w = || Weight::from_f32(1, 1, vec![1.0]);
        Arc::new(SwiGlu::new(w(), w(), w()))
    }

    #[test]
    fn evicts_least_recently_used_but_never_pinned_or_protected() {
        let mut c = ExpertCache::new(300);
        let none = HashSet::new();
        assert!(c.insert((0, 0), ffn(), 100, &none));
        assert!(c.insert((0, 1), ffn(), 100, &none));
        assert!(c.insert((0, 2), ffn(), 100, &none));
        c.get((0, 0)); // (0,1) is now the oldest
        assert!(c.insert((0, 3), ffn(), 100, &none));
        assert!(!c.contains((0, 1)));
        c.set_pinned([(0, 2)]);
        let protect: HashSet<Key> = [(0, 0)].into();
        assert!(c.insert((0, 4), ffn(), 100, &protect)); // evicts (0,3): (0,2) pinned, (0,0) protected
        assert!(c.contains((0, 0)) && c.contains((0, 2)) && c.contains((0, 4)));
        assert_eq!(c.used(), 300);
        let all: HashSet<Key> = [(0, 0), (0, 4)].into();
        assert!(!c.insert((0, 5), ffn(), 100, &all)); // nothing evictable
        assert_eq!(c.len(), 3);
        assert!(!c.insert((0, 6), ffn(), 301, &none)); // larger than the budget
    }

    /// The cache before its use order was indexed: a scan for the smallest
    /// `(last_used, key)` among the evictable entries.
    struct Scan {
        budget: u64,
        used: u64,
        clock: u64,
        entries: HashMap<Key, (u64, u64)>,
        pinned: HashSet<Key>,
    }

    impl Scan {
        fn get(&mut self, key: Key) -> bool {
            self.clock += 1;
            let Some(e) = self.entries.get_mut(&key) else {
                return false;
            };
            e.1 = self.clock;
            true
        }

        fn insert(&mut self, key: Key, bytes: u64, protect: &HashSet<Key>, evicted: &mut Vec<Key>) -> bool {
            if self.entries.contains_key(&key) {
                return true;
            }
            if bytes > self.budget {
                return false;
            }
            while self.used + bytes > self.budget {
                let victim = self
                    .entries
                    .iter()
                    .filter(|(k, _)| !self.pinned.contains(k) && !protect.contains(k))
                    .min_by_key(|(k, e)| (e.1, **k))
                    .map(|(k, _)| *k);
                let Some(k) = victim else { return false };
                self.used -= self.entries.remove(&k).unwrap().0;
                evicted.push(k);
            }
            self.clock += 1;
            self.used += bytes;
            self.entries.insert(key, (bytes, self.clock));
            true
        }
    }

    #[test]
    fn evictions_match_a_scan_of_every_entry() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(26);
        let f = ffn();
        let mut c = ExpertCache::new(5_000);
        let mut s = Scan {
            budget: 5_000,
            used: 0,
            clock: 0,
            entries: HashMap::new(),
            pinned: HashSet::new(),
        };
        let key = |rng: &mut rand::rngs::StdRng| (rng.gen_range(0..4u16), rng.gen_range(0..24u32));
        for step in 0..20_000 {
            match rng.gen_range(0..10) {
                0..=3 => {
                    let k = key(&mut rng);
                    assert_eq!(c.get(k).is_some(), s.get(k), "step {step}");
                }
                4 if step % 50 == 0 => {
                    let pins: Vec<Key> = (0..rng.gen_range(0..6)).map(|_| key(&mut rng)).collect();
                    c.set_pinned(pins.iter().copied());
                    s.pinned = pins.into_iter().collect();
                }
                _ => {
                    let k = key(&mut rng);
                    let bytes = rng.gen_range(100..900);
                    let protect: HashSet<Key> = (0..rng.gen_range(0..4)).map(|_| key(&mut rng)).collect();
                    let (mut ec, mut es) = (Vec::new(), Vec::new());
                    let got = c.insert_evicting(k, f.clone(), bytes, &protect, &mut ec);
                    assert_eq!(got, s.insert(k, bytes, &protect, &mut es), "step {step}");
                    assert_eq!(ec, es, "step {step}: evicted");
                }
            }
            assert_eq!((c.used(), c.len()), (s.used, s.entries.len()), "step {step}");
        }
    }

    #[test]
    fn zero_budget_holds_nothing() {
        let mut c = ExpertCache::new(0);
        assert!(!c.insert((1, 1), ffn(), 1, &HashSet::new()));
        assert!(c.is_empty());
    }
}
