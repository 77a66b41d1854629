//! Keeps a rayon pool's threads awake through one piece of work.
//!
//! rayon puts a thread with nothing to steal to sleep after a few dozen
//! yields (tens of microseconds), and the next parallel loop has to wake it
//! again. A decode step runs about six short parallel loops per layer, and a
//! thread that finishes its part of one a little early is asleep before the
//! next begins: the engine counted 24 voluntary context switches per decoded
//! token, each a wake-up on the critical path (on a VM, tens of
//! microseconds). [`run_warm`] runs a piece of work while every other thread
//! of the pool polls for jobs instead of sleeping. Which thread computes a
//! job never changes a bit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a thread polls without finding a job before it leaves the work
/// to rayon's own sleep: long enough to bridge the serial stretches between
/// a step's parallel loops, short enough that a thread that somehow polls
/// on top of a job it must return to (see [`stay_awake`]) holds it up by
/// little.
const MAX_IDLE: Duration = Duration::from_micros(500);

/// Runs `f` on a thread of the current rayon pool (as `rayon::scope`
/// does) while the pool's other threads stay awake, polling for jobs,
/// until `f` returns.
pub fn run_warm<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            let done = &done;
            s.spawn(move |_| stay_awake(done, owner));
        }
        let r = f();
        done.store(true, Ordering::Release);
        r
    })
}

/// Runs the pool's jobs as they come until `done` is set or none came for
/// [`MAX_IDLE`]. The thread running `f` returns at once if it picks this
/// job up itself (it would otherwise poll on top of its own work).
fn stay_awake(done: &AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner {
        return;
    }
    let mut last_job = Instant::now();
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => last_job = Instant::now(),
            _ => {
                if last_job.elapsed() > MAX_IDLE {
                    return;
                }
                // Lets any other runnable thread of this core go first (a
                // worker process on the same box, say); returns at once
                // when there is none.
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn work_runs_to_the_same_result_and_the_helpers_leave() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let xs: Vec<u64> = (0..10_000).collect();
        let want: u64 = xs.iter().map(|x| x * x).sum();
        for _ in 0..50 {
            let got = pool.install(|| run_warm(|| xs.par_iter().map(|x| x * x).sum::<u64>()));
            assert_eq!(got, want);
        }
        // Nested use and a serial stretch longer than MAX_IDLE both finish.
        let got = pool.install(|| {
            run_warm(|| {
                let a: u64 = run_warm(|| xs.par_iter().sum());
                std::thread::sleep(MAX_IDLE * 3);
                a + xs.par_iter().map(|x| x * x).sum::<u64>()
            })
        });
        assert_eq!(got, want + xs.iter().sum::<u64>());
    }

    #[test]
    fn a_panic_in_the_work_reaches_the_caller() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| run_warm(|| -> u32 { panic!("boom") }))
        }));
        assert!(r.is_err());
    }
}
