//! Disk reads of expert records that overlap with compute.
//!
//! A [`DiskReader`] reads one file. [`DiskReader::submit`] hands it a batch
//! of [`ReadRequest`]s and returns at once; each request completes on a
//! background thread and its [`ReadDone`] (the caller's `tag` and a
//! [`AlignedBuf`] holding exactly the requested bytes, or an [`IoError`]) is
//! sent on the `Sender` given with the batch, in completion order. Every
//! accepted request gets exactly one `ReadDone`.
//!
//! # Backends
//! - [`Backend::IoUring`] (Linux): one ring owned by a dedicated thread that
//!   keeps up to `queue_depth` reads in flight.
//! - [`Backend::Pread`] (everywhere): `threads` worker threads doing
//!   positional reads (`pread`).
//!
//! With [`ReaderOptions::backend`] `None`, Linux tries io_uring (ring
//! creation plus a probe that `IORING_OP_READ` is supported, kernel 5.6+) and
//! falls back to the pread pool when that fails for any reason (`ENOSYS` on
//! old kernels, `EPERM` under seccomp or `kernel.io_uring_disabled`,
//! `ENOMEM` from a locked-memory limit, ...); other systems use pread.
//! [`DiskReader::backend`] tells which one runs. Asking for `IoUring`
//! explicitly fails with [`IoError::UringUnavailable`] instead of falling
//! back.
//!
//! # Direct I/O
//! With [`ReaderOptions::direct_io`] the file is opened with `O_DIRECT`
//! (Linux, Android, FreeBSD) or gets `F_NOCACHE` (macOS), bypassing the page
//! cache. If the filesystem refuses (`EINVAL` at open, e.g. tmpfs before
//! Linux 6.6, or some FUSE filesystems) `open` returns
//! [`IoError::DirectIoUnsupported`]. Every request's offset and length must
//! then be multiples of 4096: `submit` checks the whole batch first and
//! rejects it with [`IoError::Misaligned`], submitting nothing.
//!
//! # End of file
//! A request must lie entirely inside the file (as long as it was at
//! `open`); one that does not completes with [`IoError::UnexpectedEof`]
//! without reading. A read that meets end of file early anyway (the file
//! shrank) completes with the same error. There are no partial buffers: a
//! successful `ReadDone` always holds `len` bytes. Consequently, under direct
//! I/O, files must be **padded to a multiple of 4096 bytes** so that the
//! final record's read, rounded up to 4096, stays inside the file; an
//! unpadded file's last record fails with `UnexpectedEof`, which names the
//! offset, length and file length.

mod aligned;
mod pread;
#[cfg(target_os = "linux")]
mod uring;

pub use aligned::{AlignedBuf, ALIGN};

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// The largest single read handed to the kernel; longer requests are read
/// in pieces (the same path that handles short reads). Small under test so
/// the remainder path is exercised.
const MAX_CHUNK: usize = if cfg!(test) { 64 * 1024 } else { 1 << 30 };

/// Which mechanism a [`DiskReader`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// One io_uring owned by a dedicated thread (Linux only).
    IoUring,
    /// A pool of threads doing positional reads.
    Pread,
}

/// How to open a [`DiskReader`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderOptions {
    /// Bypass the page cache (`O_DIRECT` / `F_NOCACHE`); requests must then
    /// be 4096-aligned in offset and length.
    pub direct_io: bool,
    /// `None`: io_uring when available, else pread.
    pub backend: Option<Backend>,
    /// io_uring: most reads in flight at once (at least 1, at most 4096).
    pub queue_depth: u32,
    /// pread: number of worker threads (at least 1).
    pub threads: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            direct_io: false,
            backend: None,
            queue_depth: 64,
            threads: 4,
        }
    }
}

/// Read `len` bytes at `offset`; `tag` comes back in the [`ReadDone`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    pub offset: u64,
    pub len: usize,
    pub tag: u64,
}

/// A completed request: exactly `len` bytes, or why not.
#[derive(Debug)]
pub struct ReadDone {
    pub tag: u64,
    pub result: Result<AlignedBuf, IoError>,
}

/// What went wrong; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("opening {}: {source}", path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error(
        "opening {} for direct I/O: O_DIRECT is not supported for this file ({source}); \
         open it without direct I/O or keep it on a filesystem that supports O_DIRECT",
        path.display()
    )]
    DirectIoUnsupported { path: PathBuf, source: std::io::Error },
    #[error("opening {} with io_uring: io_uring is unavailable here ({source})", path.display())]
    UringUnavailable { path: PathBuf, source: std::io::Error },
    #[error("starting the reader threads for {}: {source}", path.display())]
    Spawn { path: PathBuf, source: std::io::Error },
    #[error("reading {} bytes at offset {offset} of {}: {source}", len, path.display())]
    Read {
        path: PathBuf,
        offset: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error(
        "reading {} bytes at offset {offset} of {}: unexpected end of file \
         (the file is {file_len} bytes long; with direct I/O files must be padded to 4096 bytes)",
        len,
        path.display()
    )]
    UnexpectedEof {
        path: PathBuf,
        offset: u64,
        len: usize,
        /// The file's length: as at `open`, or where the read met end of
        /// file when the file shrank since.
        file_len: u64,
    },
    #[error(
        "reading {} bytes at offset {offset} of {}: direct I/O needs offsets and lengths \
         that are multiples of 4096",
        len,
        path.display()
    )]
    Misaligned { path: PathBuf, offset: u64, len: usize },
    #[error("reading {}: the reader has shut down", path.display())]
    ShutDown { path: PathBuf },
}

impl IoError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            IoError::Open { path, .. }
            | IoError::DirectIoUnsupported { path, .. }
            | IoError::UringUnavailable { path, .. }
            | IoError::Spawn { path, .. }
            | IoError::Read { path, .. }
            | IoError::UnexpectedEof { path, .. }
            | IoError::Misaligned { path, .. }
            | IoError::ShutDown { path } => path,
        }
    }
}

/// What the backends share about the file.
struct FileCtx {
    path: PathBuf,
    file: File,
    file_len: u64,
}

impl FileCtx {
    /// `UnexpectedEof` unless `req` lies inside the file.
    fn check_bounds(&self, req: &ReadRequest) -> Result<(), IoError> {
        let inside = req
            .offset
            .checked_add(req.len as u64)
            .is_some_and(|end| end <= self.file_len);
        if inside {
            Ok(())
        } else {
            Err(self.eof(req, self.file_len))
        }
    }

    fn eof(&self, req: &ReadRequest, file_len: u64) -> IoError {
        IoError::UnexpectedEof {
            path: self.path.clone(),
            offset: req.offset,
            len: req.len,
            file_len,
        }
    }

    fn read_error(&self, req: &ReadRequest, source: std::io::Error) -> IoError {
        IoError::Read {
            path: self.path.clone(),
            offset: req.offset,
            len: req.len,
            source,
        }
    }

    fn shut_down(&self) -> IoError {
        IoError::ShutDown {
            path: self.path.clone(),
        }
    }
}

/// Deliver a result; a caller that stopped listening is not an error.
fn deliver(done: &Sender<ReadDone>, tag: u64, result: Result<AlignedBuf, IoError>) {
    let _ = done.send(ReadDone { tag, result });
}

enum Inner {
    #[cfg(target_os = "linux")]
    Uring(uring::UringReader),
    Pread(pread::PreadPool),
}

/// Reads one file. Requests complete on a background thread and are
/// delivered on the `Sender` given with them, in completion order.
///
/// Dropping the reader waits for the reads already handed to the kernel
/// (their `ReadDone`s are still delivered) and completes requests not yet
/// started with [`IoError::ShutDown`]; it never leaves the kernel writing
/// into freed memory.
pub struct DiskReader {
    ctx: Arc<FileCtx>,
    direct_io: bool,
    backend: Backend,
    inner: Inner,
}

impl DiskReader {
    /// Open `path` for reading with `opts` (see the module docs for backend
    /// selection and direct I/O).
    pub fn open(path: &Path, opts: &ReaderOptions) -> Result<DiskReader, IoError> {
        let file = open_file(path, opts.direct_io)?;
        let file_len = file
            .metadata()
            .map_err(|source| IoError::Open {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        let ctx = Arc::new(FileCtx {
            path: path.to_path_buf(),
            file,
            file_len,
        });
        let spawn_error = |source| IoError::Spawn {
            path: path.to_path_buf(),
            source,
        };
        let pread = |ctx: Arc<FileCtx>| {
            pread::PreadPool::start(ctx, opts.threads)
                .map(Inner::Pread)
                .map_err(spawn_error)
        };
        let (backend, inner) = match opts.backend {
            Some(Backend::Pread) => (Backend::Pread, pread(ctx.clone())?),
            #[cfg(target_os = "linux")]
            Some(Backend::IoUring) | None => match uring::UringReader::start(ctx.clone(), opts.queue_depth) {
                Ok(Ok(reader)) => (Backend::IoUring, Inner::Uring(reader)),
                Ok(Err(spawn)) => return Err(spawn_error(spawn)),
                Err(unavailable) if opts.backend.is_some() => {
                    return Err(IoError::UringUnavailable {
                        path: path.to_path_buf(),
                        source: unavailable,
                    })
                }
                Err(_) => (Backend::Pread, pread(ctx.clone())?),
            },
            #[cfg(not(target_os = "linux"))]
            Some(Backend::IoUring) => {
                return Err(IoError::UringUnavailable {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(std::io::ErrorKind::Unsupported, "io_uring exists only on Linux"),
                })
            }
            #[cfg(not(target_os = "linux"))]
            None => (Backend::Pread, pread(ctx.clone())?),
        };
        Ok(DiskReader {
            ctx,
            direct_io: opts.direct_io,
            backend,
            inner,
        })
    }

    /// The mechanism in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether the file was opened for direct I/O.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// The file's length at `open`.
    pub fn file_len(&self) -> u64 {
        self.ctx.file_len
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.ctx.path
    }

    /// Queue `reqs`; each one's [`ReadDone`] is sent on `done` when it
    /// completes. Returns without waiting for any read.
    ///
    /// Under direct I/O the whole batch is checked first: a request whose
    /// offset or length is not a multiple of 4096 makes `submit` return
    /// [`IoError::Misaligned`] with nothing queued. Requests past end of file
    /// are accepted and complete with [`IoError::UnexpectedEof`].
    /// [`IoError::ShutDown`] means the background thread is gone.
    pub fn submit(&self, reqs: Vec<ReadRequest>, done: Sender<ReadDone>) -> Result<(), IoError> {
        if self.direct_io {
            let align = ALIGN as u64;
            if let Some(bad) = reqs.iter().find(|r| r.offset % align != 0 || r.len % ALIGN != 0) {
                return Err(IoError::Misaligned {
                    path: self.ctx.path.clone(),
                    offset: bad.offset,
                    len: bad.len,
                });
            }
        }
        if reqs.is_empty() {
            return Ok(());
        }
        let sent = match &self.inner {
            #[cfg(target_os = "linux")]
            Inner::Uring(r) => r.submit(reqs, done),
            Inner::Pread(p) => p.submit(reqs, done),
        };
        sent.map_err(|()| self.ctx.shut_down())
    }
}

/// Open read-only, with `O_DIRECT` / `F_NOCACHE` when asked.
fn open_file(path: &Path, direct: bool) -> Result<File, IoError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(path).map_err(|source| {
        #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
        if direct && source.raw_os_error() == Some(libc::EINVAL) {
            return IoError::DirectIoUnsupported {
                path: path.to_path_buf(),
                source,
            };
        }
        IoError::Open {
            path: path.to_path_buf(),
            source,
        }
    })?;
    #[cfg(target_os = "macos")]
    if direct {
        use std::os::fd::AsRawFd;
        // SAFETY: plain fcntl on a descriptor this function owns.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
            return Err(IoError::DirectIoUnsupported {
                path: path.to_path_buf(),
                source: std::io::Error::last_os_error(),
            });
        }
    }
    #[cfg(not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "macos"
    )))]
    if direct {
        return Err(IoError::DirectIoUnsupported {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::Unsupported, "no direct I/O on this platform"),
        });
    }
    Ok(file)
}

#[cfg(test)]
mod tests;
