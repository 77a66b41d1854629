//! The Linux backend: one io_uring owned by a dedicated thread.
//!
//! [`UringReader::submit`] sends a batch over a channel to the ring thread.
//! The thread loop: take what the channel holds (blocking on it only when
//! nothing is in flight), start pending requests while fewer than
//! `queue_depth` are in flight (the rest stay queued), `submit_and_wait(1)`,
//! then reap completions: a full read is delivered, a short one is
//! re-submitted for its remainder, an error or end of file is delivered as
//! such.
//!
//! While reads are in flight the thread sleeps in `submit_and_wait`, so a
//! batch submitted then is started when the next read completes (at most
//! one read's latency later), not at once.
//!
//! Every in-flight read owns a slot holding its buffer; the slot index is
//! the SQE's `user_data`. See [`Ring::push_read`] for why the kernel never
//! writes into freed memory.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use io_uring::{opcode, types, IoUring, Probe};

use super::{deliver, pread, AlignedBuf, FileCtx, ReadDone, ReadRequest, MAX_CHUNK};

/// Upper bound on `queue_depth`.
const MAX_DEPTH: u32 = 4096;

struct Batch {
    reqs: Vec<ReadRequest>,
    done: Sender<ReadDone>,
}

pub(super) struct UringReader {
    tx: Option<Sender<Batch>>,
    thread: Option<JoinHandle<()>>,
}

impl UringReader {
    /// Set up a ring of `queue_depth` entries and its thread.
    ///
    /// The outer `Err` means io_uring is unusable here (no syscall, denied,
    /// no `IORING_OP_READ`, out of locked memory, ...): the caller may fall
    /// back to pread. The inner `Err` means the thread could not be spawned.
    pub(super) fn start(ctx: Arc<FileCtx>, queue_depth: u32) -> io::Result<io::Result<UringReader>> {
        let depth = queue_depth.clamp(1, MAX_DEPTH);
        let ring = IoUring::new(depth.next_power_of_two())?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Read::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel's io_uring has no IORING_OP_READ (needs Linux 5.6)",
            ));
        }
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("charm-io-uring".into())
            .spawn(move || Ring::new(ring, ctx, depth as usize).run(rx));
        Ok(spawned.map(|thread| UringReader {
            tx: Some(tx),
            thread: Some(thread),
        }))
    }

    /// `Err(())` when the ring thread is gone.
    pub(super) fn submit(&self, reqs: Vec<ReadRequest>, done: Sender<ReadDone>) -> Result<(), ()> {
        let tx = self.tx.as_ref().ok_or(())?;
        tx.send(Batch { reqs, done }).map_err(|_| ())
    }
}

impl Drop for UringReader {
    fn drop(&mut self) {
        // Closing the channel tells the thread to fail what it has not
        // started with `ShutDown`, wait for what is in flight, and exit.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A read handed to the kernel.
struct InFlight {
    req: ReadRequest,
    done: Sender<ReadDone>,
    buf: AlignedBuf,
    /// Bytes of `buf` already read.
    filled: usize,
}

/// The in-flight reads by slot (= SQE `user_data`).
struct Slots {
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
}

impl Drop for Slots {
    fn drop(&mut self) {
        // Only reached with occupied slots if the ring thread unwinds from a
        // panic: the kernel may still write into those buffers, so leak them
        // rather than free them.
        for slot in &mut self.slots {
            if let Some(InFlight { buf, .. }) = slot.take() {
                std::mem::forget(buf);
            }
        }
    }
}

struct Ring {
    ring: IoUring,
    ctx: Arc<FileCtx>,
    depth: usize,
    in_flight: usize,
    slots: Slots,
    pending: VecDeque<(ReadRequest, Sender<ReadDone>)>,
}

fn is_transient(errno: i32) -> bool {
    errno == libc::EINTR || errno == libc::EAGAIN || errno == libc::EBUSY
}

impl Ring {
    fn new(ring: IoUring, ctx: Arc<FileCtx>, depth: usize) -> Ring {
        Ring {
            ring,
            ctx,
            depth,
            in_flight: 0,
            slots: Slots {
                slots: (0..depth).map(|_| None).collect(),
                free: (0..depth).rev().collect(),
            },
            pending: VecDeque::new(),
        }
    }

    fn enqueue(&mut self, batch: Batch) {
        let Batch { reqs, done } = batch;
        self.pending.extend(reqs.into_iter().map(|r| (r, done.clone())));
    }

    fn run(mut self, rx: Receiver<Batch>) {
        let mut open = true;
        let mut cqes: Vec<(u64, i32)> = Vec::with_capacity(self.depth);
        loop {
            if open && self.in_flight == 0 && self.pending.is_empty() {
                match rx.recv() {
                    Ok(batch) => self.enqueue(batch),
                    Err(_) => open = false,
                }
            }
            while open {
                match rx.try_recv() {
                    Ok(batch) => self.enqueue(batch),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if !open {
                for (req, done) in self.pending.drain(..) {
                    deliver(&done, req.tag, Err(self.ctx.shut_down()));
                }
                if self.in_flight == 0 {
                    return;
                }
            }
            while self.in_flight < self.depth {
                let Some((req, done)) = self.pending.pop_front() else {
                    break;
                };
                self.start(req, done);
            }
            if self.in_flight == 0 {
                continue;
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                if !e.raw_os_error().is_some_and(is_transient) {
                    return self.degrade(e, rx);
                }
                // Interrupted or busy: reap whatever is there and go round.
            }
            cqes.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
            for (slot, res) in cqes.drain(..) {
                self.complete(slot as usize, res);
            }
        }
    }

    /// Hand `req` to the kernel (or answer it at once if it needs no read).
    fn start(&mut self, req: ReadRequest, done: Sender<ReadDone>) {
        if let Err(e) = self.ctx.check_bounds(&req) {
            return deliver(&done, req.tag, Err(e));
        }
        if req.len == 0 {
            return deliver(&done, req.tag, Ok(AlignedBuf::new_zeroed(0)));
        }
        let slot = self
            .slots
            .free
            .pop()
            .expect("a free slot while fewer than depth reads are in flight");
        self.slots.slots[slot] = Some(InFlight {
            req,
            done,
            buf: AlignedBuf::for_read(req.len),
            filled: 0,
        });
        self.in_flight += 1;
        self.push_read(slot);
    }

    /// Queue an SQE reading the rest of `slot`'s request (at most
    /// `MAX_CHUNK` bytes) into the rest of its buffer.
    fn push_read(&mut self, slot: usize) {
        let f = self.slots.slots[slot].as_mut().expect("push_read on an occupied slot");
        let len = (f.req.len - f.filled).min(MAX_CHUNK);
        // SAFETY: `filled < req.len <= capacity`, so the pointer stays
        // inside the allocation.
        let ptr = unsafe { f.buf.as_mut_ptr().add(f.filled) };
        let entry = opcode::Read::new(types::Fd(self.ctx.file.as_raw_fd()), ptr, len as u32)
            .offset(f.req.offset + f.filled as u64)
            .build()
            .user_data(slot as u64);
        // SAFETY: the kernel will write up to `len` bytes at `ptr`, which is
        // inside `f.buf` (`filled + len <= req.len <= capacity`), using the
        // descriptor of `ctx.file`. Both outlive the operation:
        // - The buffer's heap allocation does not move when the `InFlight`
        //   holding it moves, and it stays in `slots[slot]`, unread and
        //   unfreed, until the CQE carrying this slot's `user_data` has been
        //   reaped: a slot is vacated only by `take`, which only `complete`
        //   calls, for that CQE. Each slot has at most one SQE outstanding
        //   (this is called for a freshly filled slot, or after reaping the
        //   slot's previous CQE), so that CQE is this operation's.
        // - The thread leaves `run` normally only with nothing in flight.
        //   `degrade` (a fatal ring error) and `Slots::drop` (unwinding)
        //   leak the buffers of reads that may still be in the kernel.
        // - `ctx` (and so the file) is owned by this thread's `Ring`, which
        //   lives as long as the ring.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // Cannot happen: between two submissions at most `depth` SQEs
            // are pushed (one per occupied slot) and the ring holds at least
            // `depth`. Make room anyway rather than lose the read.
            let _ = self.ring.submit();
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }.expect("room in the submission queue after submitting it");
        }
    }

    /// Vacate `slot`, giving back its read.
    fn take(&mut self, slot: usize) -> InFlight {
        let f = self.slots.slots[slot]
            .take()
            .expect("a completion for an occupied slot");
        self.slots.free.push(slot);
        self.in_flight -= 1;
        f
    }

    fn complete(&mut self, slot: usize, res: i32) {
        let f = self.slots.slots[slot]
            .as_mut()
            .expect("a completion for an occupied slot");
        match res {
            n if n > 0 => {
                f.filled += n as usize;
                if f.filled < f.req.len {
                    // A short read (or a chunk of a long one): read the rest.
                    return self.push_read(slot);
                }
                let f = self.take(slot);
                deliver(&f.done, f.req.tag, Ok(f.buf));
            }
            0 => {
                let f = self.take(slot);
                let at = f.req.offset + f.filled as u64;
                deliver(&f.done, f.req.tag, Err(self.ctx.eof(&f.req, at)));
            }
            n if n == -libc::EINTR || n == -libc::EAGAIN => self.push_read(slot),
            n => {
                let f = self.take(slot);
                let e = io::Error::from_raw_os_error(-n);
                deliver(&f.done, f.req.tag, Err(self.ctx.read_error(&f.req, e)));
            }
        }
    }

    /// The ring failed for good (`io_uring_enter` returned a non-transient
    /// error): leak the buffers the kernel may still own, and serve every
    /// read, those in flight included, with blocking reads on this thread.
    fn degrade(mut self, _error: io::Error, rx: Receiver<Batch>) {
        let ctx = self.ctx.clone();
        for slot in 0..self.depth {
            if self.slots.slots[slot].is_some() {
                let InFlight { req, done, buf, .. } = self.take(slot);
                std::mem::forget(buf);
                deliver(&done, req.tag, pread::read_request(&ctx, &req));
            }
        }
        for (req, done) in self.pending.drain(..) {
            deliver(&done, req.tag, pread::read_request(&ctx, &req));
        }
        for Batch { reqs, done } in rx {
            for req in reqs {
                deliver(&done, req.tag, pread::read_request(&ctx, &req));
            }
        }
    }
}
