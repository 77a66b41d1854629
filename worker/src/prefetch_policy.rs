//! Whether reading ahead pays, measured as it runs.
//!
//! Reading the predicted next layer ahead pays when the disk would
//! otherwise sit idle while experts compute; it loses when the disk is
//! already the bottleneck and its reads only add bytes: experts read ahead
//! that leave the cache unused (**wasted**), and evictions it caused that a
//! later step has to read again (**harm**). Which of the two happens
//! depends on the cache budget, the disk and the routing, so the policy
//! measures it instead of guessing: it runs [`EPOCH`] layer steps with
//! read-ahead and [`EPOCH`] without, compares what the steps waited for
//! reads per routed expert, keeps the better for [`SETTLE`] epochs, then
//! measures again (the routing, the cache pressure or the prompt may have
//! changed). Waiting is the store's whole cost: a read-ahead that saves a
//! demand read shortens it, and one that delays a demand read behind its
//! own lengthens it.
//!
//! Wasted reads and harm are counted too, for the stats.
//!
//! The decision changes only speed: an expert is computed from the same
//! bytes whether it was read ahead, read on demand or cached.

use std::collections::HashSet;

use crate::cache::Key;

/// Layer steps (with a prediction) per measured epoch.
pub const EPOCH: u64 = 64;
/// Epochs the better setting is kept before measuring again.
pub const SETTLE: u64 = 8;
/// Evicted experts remembered for harm, at most.
const GHOSTS: usize = 4096;

/// Where the policy is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Measuring with read-ahead on.
    MeasureOn,
    /// Measuring with it off, after `on` (wait per expert with it on).
    MeasureOff { on: f64 },
    /// Keeping a setting for `epochs_left` more epochs.
    Settled { on: bool, epochs_left: u64 },
}

/// The policy's state and counters.
#[derive(Debug)]
pub struct PrefetchPolicy {
    phase: Phase,
    /// The current epoch: layer steps, read waits (ms) and routed experts.
    steps: u64,
    wait_ms: f64,
    experts: u64,
    /// Experts a read-ahead evicted, not demanded since.
    ghosts: HashSet<Key>,
    /// Totals since start.
    pub total_wasted: u64,
    pub total_harm: u64,
    /// Layer steps at which read-ahead was off because it lost.
    pub paused_steps: u64,
    /// Times a measurement turned read-ahead off.
    pub stand_downs: u64,
}

impl Default for PrefetchPolicy {
    fn default() -> Self {
        PrefetchPolicy {
            phase: Phase::MeasureOn,
            steps: 0,
            wait_ms: 0.0,
            experts: 0,
            ghosts: HashSet::new(),
            total_wasted: 0,
            total_harm: 0,
            paused_steps: 0,
            stand_downs: 0,
        }
    }
}

impl PrefetchPolicy {
    /// Whether this layer step reads its prediction ahead.
    pub fn allows(&self) -> bool {
        match self.phase {
            Phase::MeasureOn => true,
            Phase::MeasureOff { .. } => false,
            Phase::Settled { on, .. } => on,
        }
    }

    /// Whether read-ahead is off because it lost the last measurement.
    pub fn paused(&self) -> bool {
        matches!(self.phase, Phase::Settled { on: false, .. })
    }

    /// A layer step with a prediction ended: it waited `wait_ms` for reads
    /// of its `experts` routed experts.
    pub fn step(&mut self, wait_ms: f64, experts: u64) {
        if self.paused() {
            self.paused_steps += 1;
        }
        self.steps += 1;
        self.wait_ms += wait_ms;
        self.experts += experts;
        if self.steps < EPOCH {
            return;
        }
        let per = self.wait_ms / self.experts.max(1) as f64;
        self.steps = 0;
        self.wait_ms = 0.0;
        self.experts = 0;
        self.phase = match self.phase {
            Phase::MeasureOn => Phase::MeasureOff { on: per },
            Phase::MeasureOff { on } => {
                // Read-ahead stays only if it made the steps wait less.
                let keep = on < per;
                if !keep {
                    self.stand_downs += 1;
                }
                Phase::Settled {
                    on: keep,
                    epochs_left: SETTLE,
                }
            }
            Phase::Settled { on, epochs_left } if epochs_left > 1 => Phase::Settled {
                on,
                epochs_left: epochs_left - 1,
            },
            Phase::Settled { .. } => Phase::MeasureOn,
        };
    }

    /// An expert read ahead left the cache unused.
    pub fn wasted(&mut self) {
        self.total_wasted += 1;
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
            self.total_harm += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one measurement (an epoch on, an epoch off) with these waits.
    fn measure(p: &mut PrefetchPolicy, wait_on: f64, wait_off: f64) {
        assert!(p.allows());
        for _ in 0..EPOCH {
            p.step(wait_on, 8);
        }
        assert!(!p.allows(), "the second epoch runs without read-ahead");
        for _ in 0..EPOCH {
            p.step(wait_off, 8);
        }
    }

    #[test]
    fn read_ahead_that_shortens_the_waits_stays_on() {
        let mut p = PrefetchPolicy::default();
        measure(&mut p, 1.0, 3.0);
        assert!(p.allows() && !p.paused());
        assert_eq!(p.stand_downs, 0);
    }

    #[test]
    fn read_ahead_that_lengthens_the_waits_stands_down_then_is_measured_again() {
        let mut p = PrefetchPolicy::default();
        measure(&mut p, 3.0, 2.0);
        assert!(p.paused() && !p.allows());
        assert_eq!(p.stand_downs, 1);
        for _ in 0..SETTLE * EPOCH {
            assert!(!p.allows());
            p.step(2.0, 8);
        }
        assert_eq!(p.paused_steps, SETTLE * EPOCH);
        // Measured again: this time it pays.
        measure(&mut p, 1.0, 2.0);
        assert!(p.allows());
        assert_eq!(p.stand_downs, 1);
    }

    #[test]
    fn waits_are_compared_per_routed_expert_and_a_tie_turns_it_off() {
        let mut p = PrefetchPolicy::default();
        // Twice the wait for twice the experts: the same per expert.
        for _ in 0..EPOCH {
            p.step(2.0, 16);
        }
        for _ in 0..EPOCH {
            p.step(1.0, 8);
        }
        assert!(p.paused(), "no gain for the bytes read ahead");
    }

    #[test]
    fn harm_is_a_demand_read_of_an_evicted_expert_and_ghosts_stay_bounded() {
        let mut p = PrefetchPolicy::default();
        p.evicted((0, 1));
        p.demand_read((0, 2));
        assert_eq!(p.total_harm, 0);
        p.demand_read((0, 1));
        p.demand_read((0, 1));
        assert_eq!(p.total_harm, 1);
        for i in 0..(GHOSTS as u32 * 2) {
            p.evicted((1, i));
        }
        assert!(p.ghosts.len() <= GHOSTS);
    }
}
