//! Whether reading ahead pays, measured as it runs.
//!
//! Reading the predicted next layer ahead pays when the disk would
//! otherwise sit idle while experts compute; it loses when the disk is
//! already the bottleneck and its reads only add bytes: experts read ahead
//! that leave the cache unused (**wasted**), and evictions it caused that a
//! later step has to read again (**harm**). Which of the two happens
//! depends on the cache budget, the disk and the routing, so the policy
//! measures it instead of guessing: for a measurement, each layer step's
//! read-ahead is on or off by a fixed pseudo-random draw, and what the
//! *next* step waited for reads (the step a read-ahead serves or delays) is
//! credited to that choice, per routed expert, until each arm has [`EPOCH`]
//! steps. The better arm is kept for [`SETTLE`] epochs, then measured again
//! (the routing, the cache pressure or the prompt may have changed). Waiting
//! is the store's whole cost: a read-ahead that saves a demand read shortens
//! it, and one that delays a demand read behind its own lengthens it.
//!
//! The arms are interleaved, not run one after the other, because the
//! waits fall on their own as a cache warms (a prefill reads nearly every
//! expert it meets, the decode after it mostly hits): an arm measured after
//! the other would look cheaper whatever it did. At real size (48 layers)
//! that bias turned a read-ahead that was 88 % accurate, and evicted
//! nothing, off for most of a decode. The draw is not the layer's parity
//! either: with an even layer count, alternating steps would give the same
//! layers the same arm every token.
//!
//! Wasted reads and harm are counted too, for the stats.
//!
//! The decision changes only speed: an expert is computed from the same
//! bytes whether it was read ahead, read on demand or cached.

use std::collections::HashSet;

use crate::cache::Key;

/// Layer steps (with a prediction) per arm of a measurement.
pub const EPOCH: u64 = 64;
/// Epochs the better setting is kept before measuring again.
pub const SETTLE: u64 = 8;
/// Evicted experts remembered for harm, at most.
const GHOSTS: usize = 4096;

/// Waits credited to one arm of a measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Arm {
    steps: u64,
    wait_ms: f64,
    experts: u64,
}

impl Arm {
    fn add(&mut self, wait_ms: f64, experts: u64) {
        self.steps += 1;
        self.wait_ms += wait_ms;
        self.experts += experts;
    }

    /// Milliseconds waited per routed expert.
    fn per_expert(&self) -> f64 {
        self.wait_ms / self.experts.max(1) as f64
    }
}

/// Where the policy is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Measuring: the steps credited to read-ahead on and off so far.
    Measure { on: Arm, off: Arm },
    /// Keeping a setting for `steps_left` more layer steps.
    Settled { on: bool, steps_left: u64 },
}

/// The policy's state and counters.
#[derive(Debug)]
pub struct PrefetchPolicy {
    phase: Phase,
    /// The arm the coming step's read-ahead is in (drawn for each step).
    next_on: bool,
    /// The arm of the read-ahead that served the step now running, if that
    /// read-ahead was part of the measurement.
    serving: Option<bool>,
    /// The draw's state (xorshift64, fixed seed: the same sequence every run).
    rng: u64,
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
        let mut p = PrefetchPolicy {
            phase: Phase::Measure {
                on: Arm::default(),
                off: Arm::default(),
            },
            next_on: true,
            serving: None,
            rng: 0x9E37_79B9_7F4A_7C15,
            ghosts: HashSet::new(),
            total_wasted: 0,
            total_harm: 0,
            paused_steps: 0,
            stand_downs: 0,
        };
        p.next_on = p.draw();
        p
    }
}

impl PrefetchPolicy {
    fn draw(&mut self) -> bool {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng >> 63 == 1
    }

    /// Whether this layer step reads its prediction ahead.
    pub fn allows(&self) -> bool {
        match self.phase {
            Phase::Measure { .. } => self.next_on,
            Phase::Settled { on, .. } => on,
        }
    }

    /// Whether read-ahead is off because it lost the last measurement.
    pub fn paused(&self) -> bool {
        matches!(self.phase, Phase::Settled { on: false, .. })
    }

    /// A layer step ended: it waited `wait_ms` for reads of its `experts`
    /// routed experts; `chose` when it had a prediction of the next layer
    /// and so chose, by [`Self::allows`], whether to read it ahead.
    pub fn step(&mut self, wait_ms: f64, experts: u64, chose: bool) {
        // This step's wait belongs to the read-ahead that ran into it.
        if let (Phase::Measure { on, off }, Some(arm)) = (&mut self.phase, self.serving.take()) {
            if arm { on } else { off }.add(wait_ms, experts);
        }
        if !chose {
            return;
        }
        if self.paused() {
            self.paused_steps += 1;
        }
        match &mut self.phase {
            Phase::Measure { on, off } => {
                if on.steps >= EPOCH && off.steps >= EPOCH {
                    // Read-ahead stays only if it made the steps wait less.
                    let keep = on.per_expert() < off.per_expert();
                    if !keep {
                        self.stand_downs += 1;
                    }
                    self.phase = Phase::Settled {
                        on: keep,
                        steps_left: SETTLE * EPOCH,
                    };
                    return;
                }
                // The read-ahead just chosen serves the next step.
                self.serving = Some(self.next_on);
                self.next_on = self.draw();
            }
            Phase::Settled { steps_left, .. } => {
                *steps_left -= 1;
                if *steps_left == 0 {
                    self.phase = Phase::Measure {
                        on: Arm::default(),
                        off: Arm::default(),
                    };
                    self.next_on = self.draw();
                }
            }
        }
    }

    /// Layer steps (each with a prediction) that a fresh policy's first
    /// measurement takes: the arms are drawn, so it is at least
    /// `2 × EPOCH`, and always the same (the draw's seed is fixed).
    pub fn first_measurement_steps() -> u64 {
        let mut p = PrefetchPolicy::default();
        let mut steps = 0;
        while matches!(p.phase, Phase::Measure { .. }) {
            p.step(0.0, 1, true);
            steps += 1;
        }
        steps
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

    /// Runs one measurement: each step waits `wait_on` when a read-ahead
    /// ran into it and `wait_off` when none did, until the policy settles.
    /// Returns the steps it took.
    fn measure(p: &mut PrefetchPolicy, wait_on: f64, wait_off: f64) -> u64 {
        let mut served = None;
        let mut steps = 0;
        while matches!(p.phase, Phase::Measure { .. }) {
            let wait = match served {
                Some(true) => wait_on,
                Some(false) => wait_off,
                None => 0.0,
            };
            served = Some(p.allows());
            p.step(wait, 8, true);
            steps += 1;
            assert!(steps < 100 * EPOCH, "a measurement ends");
        }
        steps
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
            p.step(2.0, 8, true);
        }
        assert_eq!(p.paused_steps, SETTLE * EPOCH);
        // Measured again: this time it pays.
        measure(&mut p, 1.0, 2.0);
        assert!(p.allows());
        assert_eq!(p.stand_downs, 1);
    }

    #[test]
    fn the_arms_are_interleaved_so_a_warming_cache_favours_neither() {
        // Waits that fall step by step whatever read-ahead does (a cache
        // warming up), with read-ahead saving a tenth of them: measured one
        // arm after the other the later arm would win; interleaved, the
        // saving shows.
        let mut p = PrefetchPolicy::default();
        let mut served = None;
        let mut on_steps = 0;
        for i in 0..10 * EPOCH {
            if !matches!(p.phase, Phase::Measure { .. }) {
                break;
            }
            let base = 100.0 / (1.0 + i as f64);
            let wait = if served == Some(true) { 0.9 * base } else { base };
            served = Some(p.allows());
            on_steps += u64::from(p.allows());
            p.step(wait, 8, true);
        }
        assert!(!p.paused() && p.allows(), "read-ahead that saves waits stays on");
        assert!((EPOCH..3 * EPOCH).contains(&on_steps), "both arms drawn: {on_steps} on");
        // And the draw is not the step's parity (with an even layer count
        // that would tie each layer to one arm).
        let mut q = PrefetchPolicy::default();
        let draws: Vec<bool> = (0..64).map(|_| q.draw()).collect();
        let parity_like = draws.iter().enumerate().all(|(i, &d)| d == (i % 2 == 0))
            || draws.iter().enumerate().all(|(i, &d)| d == (i % 2 == 1));
        assert!(!parity_like);
    }

    #[test]
    fn a_step_without_a_prediction_is_credited_but_chooses_nothing() {
        let mut p = PrefetchPolicy::default();
        let first = p.allows();
        p.step(0.0, 8, true);
        // The next step (the last layer: nothing to predict) is the one the
        // read-ahead served: its wait is credited to that arm.
        p.step(5.0, 8, false);
        let Phase::Measure { on, off } = p.phase else {
            panic!("still measuring")
        };
        let credited = if first { on } else { off };
        assert_eq!((credited.steps, credited.wait_ms), (1, 5.0));
        // The step after it had no read-ahead of the measurement: not credited.
        p.step(7.0, 8, true);
        let Phase::Measure { on: on2, off: off2 } = p.phase else {
            panic!("still measuring")
        };
        assert_eq!(on2.steps + off2.steps, 1);
    }

    #[test]
    fn waits_are_compared_per_routed_expert_and_a_tie_turns_it_off() {
        let mut p = PrefetchPolicy::default();
        // Twice the wait for twice the experts with read-ahead: the same per expert.
        let mut served = None;
        while matches!(p.phase, Phase::Measure { .. }) {
            let (wait, experts) = if served == Some(true) { (2.0, 16) } else { (1.0, 8) };
            served = Some(p.allows());
            p.step(wait, experts, true);
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
