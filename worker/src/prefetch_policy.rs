//! Whether reading ahead pays, measured as it runs.
//!
//! A read-ahead of the predicted next layer pays when a step then uses the
//! expert (a demand read saved). It costs when the expert leaves the cache
//! unused (its read took disk time from demand reads: **wasted**), and
//! when making room for it evicted an expert that a later step then had
//! to read again (**harm**: the victim is remembered until demanded or
//! forgotten). Over every [`WINDOW`] outcomes the policy compares the two
//! sides in expert reads: read-ahead stays on while `used > wasted + harm`,
//! and stands down otherwise. Standing down, it lets [`RETRY_STEPS`] layer
//! steps pass, then tries again (the routing, the cache pressure or the
//! prompt may have changed), measuring afresh.
//!
//! The decision changes only speed: an expert is computed from the same
//! bytes whether it was read ahead, read on demand or cached.

use std::collections::HashSet;

use crate::cache::Key;

/// Outcomes weighed per decision.
pub const WINDOW: u64 = 64;
/// Layer steps read-ahead stays off after it lost, before it is tried again.
pub const RETRY_STEPS: u64 = 512;
/// Evicted experts remembered for harm, at most.
const GHOSTS: usize = 4096;

/// The policy's state and counters.
#[derive(Debug)]
pub struct PrefetchPolicy {
    on: bool,
    used: u64,
    wasted: u64,
    harm: u64,
    /// Layer steps left before read-ahead is tried again.
    off_for: u64,
    /// Experts a read-ahead evicted, not demanded since.
    ghosts: HashSet<Key>,
    /// Totals since start.
    pub total_wasted: u64,
    pub total_harm: u64,
    pub paused_steps: u64,
    pub stand_downs: u64,
}

impl Default for PrefetchPolicy {
    fn default() -> Self {
        PrefetchPolicy {
            on: true,
            used: 0,
            wasted: 0,
            harm: 0,
            off_for: 0,
            ghosts: HashSet::new(),
            total_wasted: 0,
            total_harm: 0,
            paused_steps: 0,
            stand_downs: 0,
        }
    }
}

impl PrefetchPolicy {
    /// A layer step with a prediction: whether to read it ahead.
    pub fn allows(&mut self) -> bool {
        if self.on {
            return true;
        }
        self.paused_steps += 1;
        self.off_for = self.off_for.saturating_sub(1);
        if self.off_for == 0 {
            self.on = true;
        }
        self.on
    }

    /// Whether read-ahead is standing down now.
    pub fn paused(&self) -> bool {
        !self.on
    }

    /// A step used an expert that was read ahead.
    pub fn used(&mut self) {
        self.used += 1;
        self.settle();
    }

    /// An expert read ahead left the cache unused.
    pub fn wasted(&mut self) {
        self.wasted += 1;
        self.total_wasted += 1;
        self.settle();
    }

    /// A read-ahead's insert evicted `victim`.
    pub fn evicted(&mut self, victim: Key) {
        if self.ghosts.len() >= GHOSTS {
            self.ghosts.clear();
        }
        self.ghosts.insert(victim);
    }

    /// A step had to read `k` from disk: harm if a read-ahead evicted it.
    pub fn demand_read(&mut self, k: Key) {
        if self.ghosts.remove(&k) {
            self.harm += 1;
            self.total_harm += 1;
            self.settle();
        }
    }

    fn settle(&mut self) {
        if self.used + self.wasted + self.harm < WINDOW {
            return;
        }
        if self.on && self.used <= self.wasted + self.harm {
            self.on = false;
            self.off_for = RETRY_STEPS;
            self.stand_downs += 1;
            self.ghosts.clear();
        }
        self.used = 0;
        self.wasted = 0;
        self.harm = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_ahead_that_pays_stays_on() {
        let mut p = PrefetchPolicy::default();
        for _ in 0..1000 {
            assert!(p.allows());
            p.used();
            p.used();
            p.wasted();
        }
        assert_eq!(p.stand_downs, 0);
    }

    #[test]
    fn read_ahead_that_loses_stands_down_then_tries_again() {
        let mut p = PrefetchPolicy::default();
        // Each read-ahead is wasted and evicts an expert the next step reads again.
        for i in 0..(WINDOW as u32) {
            p.evicted((0, i));
            p.demand_read((0, i));
            p.wasted();
            if p.paused() {
                break;
            }
        }
        assert!(p.paused());
        assert_eq!(p.stand_downs, 1);
        assert!(p.total_harm > 0 && p.total_wasted > 0);
        for _ in 0..RETRY_STEPS - 1 {
            assert!(!p.allows());
        }
        assert!(p.allows(), "tried again after {RETRY_STEPS} steps");
        assert_eq!(p.paused_steps, RETRY_STEPS);
        // A demand read of an expert no read-ahead evicted is no harm.
        let harm = p.total_harm;
        p.demand_read((9, 9));
        assert_eq!(p.total_harm, harm);
    }

    #[test]
    fn a_tie_is_a_loss_and_the_ghosts_stay_bounded() {
        let mut p = PrefetchPolicy::default();
        for _ in 0..WINDOW / 2 {
            p.used();
            p.wasted();
        }
        assert!(p.paused(), "as many wasted as used: no gain for the disk time");
        for i in 0..(GHOSTS as u32 * 2) {
            p.evicted((1, i));
        }
        assert!(p.ghosts.len() <= GHOSTS);
    }
}
