//! The portable backend: worker threads pulling requests from one shared
//! channel and reading each with positional reads until it is full.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::{deliver, AlignedBuf, FileCtx, IoError, ReadDone, ReadRequest, MAX_CHUNK};

struct Job {
    req: ReadRequest,
    done: Sender<ReadDone>,
}

pub(super) struct PreadPool {
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    shutting_down: Arc<AtomicBool>,
}

impl PreadPool {
    pub(super) fn start(ctx: Arc<FileCtx>, threads: usize) -> std::io::Result<PreadPool> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut pool = PreadPool {
            tx: Some(tx),
            threads: Vec::new(),
            shutting_down: Arc::new(AtomicBool::new(false)),
        };
        for i in 0..threads.max(1) {
            let (ctx, rx, stop) = (ctx.clone(), rx.clone(), pool.shutting_down.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("charm-pread-{i}"))
                .spawn(move || worker(&ctx, &rx, &stop));
            // On failure, dropping `pool` stops and joins the threads
            // already started.
            pool.threads.push(spawned?);
        }
        Ok(pool)
    }

    /// `Err(())` when the workers are gone.
    pub(super) fn submit(&self, reqs: Vec<ReadRequest>, done: Sender<ReadDone>) -> Result<(), ()> {
        let tx = self.tx.as_ref().ok_or(())?;
        for req in reqs {
            let job = Job {
                req,
                done: done.clone(),
            };
            tx.send(job).map_err(|_| ())?;
        }
        Ok(())
    }
}

impl Drop for PreadPool {
    fn drop(&mut self) {
        // Jobs still queued complete with `ShutDown`; reads under way finish.
        self.shutting_down.store(true, Ordering::Release);
        drop(self.tx.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker(ctx: &FileCtx, rx: &Mutex<Receiver<Job>>, shutting_down: &AtomicBool) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            rx.recv()
        };
        let Ok(Job { req, done }) = job else {
            return; // channel closed and drained
        };
        let result = if shutting_down.load(Ordering::Acquire) {
            Err(ctx.shut_down())
        } else {
            read_request(ctx, &req)
        };
        deliver(&done, req.tag, result);
    }
}

/// Read all of `req` with blocking positional reads.
pub(super) fn read_request(ctx: &FileCtx, req: &ReadRequest) -> Result<AlignedBuf, IoError> {
    ctx.check_bounds(req)?;
    let mut buf = AlignedBuf::for_read(req.len);
    let mut filled = 0;
    while filled < req.len {
        let end = req.len.min(filled + MAX_CHUNK);
        let offset = req.offset + filled as u64;
        match read_at(&ctx.file, &mut buf.as_mut_slice()[filled..end], offset) {
            Ok(0) => return Err(ctx.eof(req, offset)),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ctx.read_error(req, e)),
        }
    }
    Ok(buf)
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}
