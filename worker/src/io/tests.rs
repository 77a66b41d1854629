//! Tests of [`DiskReader`] on both backends, with and without direct I/O.
//!
//! io_uring runs when this machine allows it; otherwise its cases are skipped
//! with a loud note on stderr. Direct I/O cases run in the first of the temp
//! dir and the target dir whose filesystem supports `O_DIRECT` (`open`
//! refusing with `EINVAL`, as tmpfs before Linux 6.6 does, is
//! [`IoError::DirectIoUnsupported`]), and are skipped with a note when
//! neither does. The seccomp fallback test is skipped when no filter can be
//! installed. In CI strict mode (`CHARM_CI=1`, or `CHARM_REQUIRE_IO_URING=1`
//! for io_uring alone) each of those skips is a failure instead.

use super::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

const FILE_LEN: usize = 3 << 20;
const TIMEOUT: Duration = Duration::from_secs(60);

/// CI strict mode (`CHARM_CI=1`): a missing capability fails the test
/// instead of skipping it.
fn ci_strict() -> bool {
    std::env::var("CHARM_CI").is_ok_and(|v| v == "1")
}

/// Whether io_uring is required (CI strict mode or `CHARM_REQUIRE_IO_URING=1`).
fn io_uring_required() -> bool {
    ci_strict() || std::env::var("CHARM_REQUIRE_IO_URING").is_ok_and(|v| v == "1")
}

/// splitmix64: deterministic pseudo-random numbers without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct TestFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
    bytes: Vec<u8>,
}

fn make_file_in(dir: &Path, len: usize, seed: u64) -> TestFile {
    let tmp = tempfile::Builder::new()
        .prefix("charm-io-test")
        .tempdir_in(dir)
        .expect("temp dir");
    let path = tmp.path().join("experts.bin");
    let mut rng = Rng(seed);
    let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    std::fs::write(&path, &bytes).expect("write test file");
    TestFile { _dir: tmp, path, bytes }
}

/// Where test files may go: the temp dir, then the target dir.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![std::env::temp_dir()];
    if let Some(deps) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        dirs.push(deps);
    }
    dirs
}

fn opts(backend: Backend, direct_io: bool) -> ReaderOptions {
    ReaderOptions {
        direct_io,
        backend: Some(backend),
        ..ReaderOptions::default()
    }
}

/// The backends this machine can run: pread always, io_uring when it works
/// here.
fn backends() -> Vec<Backend> {
    let file = make_file_in(&std::env::temp_dir(), 4096, 1);
    let mut out = vec![Backend::Pread];
    if cfg!(target_os = "linux") {
        match DiskReader::open(&file.path, &opts(Backend::IoUring, false)) {
            Ok(r) => {
                assert_eq!(r.backend(), Backend::IoUring);
                out.push(Backend::IoUring);
            }
            Err(e) => {
                assert!(matches!(e, IoError::UringUnavailable { .. }), "{e}");
                assert!(
                    !io_uring_required(),
                    "CHARM_CI=1 (or CHARM_REQUIRE_IO_URING=1) but io_uring cannot run here: {e}"
                );
                eprintln!("WARNING: skipping every io_uring case (CHARM_CI=1 would fail): {e}");
            }
        }
    }
    out
}

/// A fresh file of `len` bytes and a reader on it, or `None` (with a note)
/// when direct I/O is asked for and no candidate dir supports it.
fn setup(len: usize, seed: u64, o: &ReaderOptions) -> Option<(TestFile, DiskReader)> {
    let mut refusals = Vec::new();
    for dir in candidate_dirs() {
        let file = make_file_in(&dir, len, seed);
        match DiskReader::open(&file.path, o) {
            Ok(reader) => {
                assert_eq!(reader.file_len(), len as u64);
                assert_eq!(Some(reader.backend()), o.backend);
                return Some((file, reader));
            }
            Err(e @ IoError::DirectIoUnsupported { .. }) if o.direct_io => {
                let IoError::DirectIoUnsupported { source, .. } = &e else {
                    unreachable!()
                };
                #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
                assert_eq!(source.raw_os_error(), Some(libc::EINVAL), "{e}");
                let _ = source;
                let msg = e.to_string();
                assert!(msg.contains(&*file.path.to_string_lossy()), "{msg}");
                assert!(msg.contains("O_DIRECT"), "{msg}");
                refusals.push(msg);
            }
            Err(e) => panic!("opening {} with {o:?}: {e}", file.path.display()),
        }
    }
    assert!(
        !ci_strict(),
        "CHARM_CI=1 but no candidate dir supports O_DIRECT for {:?}: {}",
        o.backend,
        refusals.join("; ")
    );
    eprintln!(
        "WARNING: skipping {:?} with direct I/O (CHARM_CI=1 would fail): no candidate dir supports it: {}",
        o.backend,
        refusals.join("; ")
    );
    None
}

/// Every (backend, direct_io) combination this machine can run, with a
/// reader on a fresh `FILE_LEN`-byte file.
fn each_setup(mut tweak: impl FnMut(&mut ReaderOptions), mut test: impl FnMut(&TestFile, DiskReader)) {
    for backend in backends() {
        for direct in [false, true] {
            let mut o = opts(backend, direct);
            tweak(&mut o);
            if let Some((file, reader)) = setup(FILE_LEN, 42, &o) {
                eprintln!("running {backend:?}, direct_io={direct}");
                test(&file, reader);
            }
        }
    }
}

/// `n` requests inside `file_len`: 4096-aligned offsets and lengths, plus
/// (when `any_alignment`) arbitrary ones; a few are longer than `MAX_CHUNK`
/// and one is empty.
fn random_requests(rng: &mut Rng, n: usize, file_len: usize, any_alignment: bool, first_tag: u64) -> Vec<ReadRequest> {
    (0..n)
        .map(|i| {
            let tag = first_tag + i as u64;
            if i == 0 {
                return ReadRequest {
                    offset: 4096,
                    len: 0,
                    tag,
                };
            }
            let arbitrary = any_alignment && i % 2 == 1;
            let offset = if arbitrary && i % 4 == 1 {
                rng.below(file_len)
            } else {
                ALIGN * rng.below(file_len / ALIGN)
            };
            let room = file_len - offset;
            let len = if arbitrary {
                1 + rng.below(room.min(256 << 10))
            } else {
                ALIGN * (1 + rng.below((room / ALIGN).min(64)))
            };
            ReadRequest {
                offset: offset as u64,
                len,
                tag,
            }
        })
        .collect()
}

/// Exactly `n` completions, each tag once.
fn collect(rx: &Receiver<ReadDone>, n: usize) -> HashMap<u64, Result<AlignedBuf, IoError>> {
    let mut out = HashMap::new();
    for _ in 0..n {
        let done = rx.recv_timeout(TIMEOUT).expect("a completion within the timeout");
        assert!(out.insert(done.tag, done.result).is_none(), "tag {} twice", done.tag);
    }
    out
}

fn check_ok(file: &TestFile, reqs: &[ReadRequest], got: &HashMap<u64, Result<AlignedBuf, IoError>>) {
    for r in reqs {
        let buf = match &got[&r.tag] {
            Ok(buf) => buf,
            Err(e) => panic!("request {r:?}: {e}"),
        };
        let start = r.offset as usize;
        assert_eq!(buf.len(), r.len, "request {r:?}");
        assert!(
            buf.as_slice() == &file.bytes[start..start + r.len],
            "wrong bytes for {r:?}"
        );
    }
}

#[test]
fn random_reads_in_one_submit() {
    each_setup(
        |_| {},
        |file, reader| {
            let mut rng = Rng(7);
            let reqs = random_requests(&mut rng, 100, FILE_LEN, !reader.direct_io(), 0);
            let (tx, rx) = mpsc::channel();
            reader.submit(reqs.clone(), tx).unwrap();
            let got = collect(&rx, reqs.len());
            check_ok(file, &reqs, &got);
            assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        },
    );
}

#[test]
fn random_reads_in_concurrent_submits() {
    each_setup(
        |_| {},
        |file, reader| {
            let (tx, rx) = mpsc::channel();
            let all: Vec<ReadRequest> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4u64)
                    .map(|t| {
                        let (reader, tx) = (&reader, tx.clone());
                        s.spawn(move || {
                            let mut rng = Rng(100 + t);
                            let mut mine = Vec::new();
                            for b in 0..5u64 {
                                let reqs =
                                    random_requests(&mut rng, 10, FILE_LEN, !reader.direct_io(), t * 1000 + b * 10);
                                reader.submit(reqs.clone(), tx.clone()).unwrap();
                                mine.extend(reqs);
                            }
                            mine
                        })
                    })
                    .collect();
                handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
            });
            drop(tx);
            let got = collect(&rx, all.len());
            assert_eq!(all.len(), 200);
            check_ok(file, &all, &got);
        },
    );
}

#[test]
fn reads_past_end_of_file_fail_naming_the_file() {
    each_setup(
        |_| {},
        |file, reader| {
            let end = FILE_LEN as u64;
            let reqs = vec![
                ReadRequest {
                    offset: end - 4096,
                    len: 8192,
                    tag: 0,
                },
                ReadRequest {
                    offset: end + 4096,
                    len: 4096,
                    tag: 1,
                },
                ReadRequest {
                    offset: u64::MAX - 4095,
                    len: 8192,
                    tag: 2,
                },
                ReadRequest {
                    offset: end - 8192,
                    len: 8192,
                    tag: 3,
                },
                ReadRequest {
                    offset: end,
                    len: 0,
                    tag: 4,
                },
            ];
            let (tx, rx) = mpsc::channel();
            reader.submit(reqs.clone(), tx).unwrap();
            let got = collect(&rx, reqs.len());
            check_ok(file, &reqs[3..], &got);
            for r in &reqs[..3] {
                match &got[&r.tag] {
                    Err(
                        e @ IoError::UnexpectedEof {
                            path,
                            offset,
                            len,
                            file_len,
                        },
                    ) => {
                        assert_eq!((path, *offset, *len, *file_len), (&file.path, r.offset, r.len, end));
                        let msg = e.to_string();
                        assert!(msg.contains(&*file.path.to_string_lossy()), "{msg}");
                        assert!(msg.contains("end of file"), "{msg}");
                    }
                    other => panic!("{r:?}: expected UnexpectedEof, got {other:?}"),
                }
            }
        },
    );
}

#[test]
fn unpadded_file_under_direct_io_fails_only_its_last_record() {
    let len = FILE_LEN + 100;
    for backend in backends() {
        for direct in [false, true] {
            let Some((file, reader)) = setup(len, 9, &opts(backend, direct)) else {
                continue;
            };
            let last = FILE_LEN as u64;
            let (tx, rx) = mpsc::channel();
            let whole = ReadRequest {
                offset: 0,
                len: FILE_LEN,
                tag: 0,
            };
            let padded_last = ReadRequest {
                offset: last,
                len: 4096,
                tag: 1,
            };
            reader.submit(vec![whole, padded_last], tx.clone()).unwrap();
            let got = collect(&rx, 2);
            check_ok(&file, &[whole], &got);
            assert!(matches!(got[&1], Err(IoError::UnexpectedEof { file_len, .. }) if file_len == len as u64));
            if !direct {
                let exact_last = ReadRequest {
                    offset: last,
                    len: 100,
                    tag: 2,
                };
                reader.submit(vec![exact_last], tx).unwrap();
                check_ok(&file, &[exact_last], &collect(&rx, 1));
            }
        }
    }
}

#[test]
fn misaligned_request_under_direct_io_is_rejected_before_submitting() {
    each_setup(
        |_| {},
        |file, reader| {
            for (offset, len) in [(100, 4096), (4096, 100), (4096, 4097)] {
                let reqs = vec![
                    ReadRequest {
                        offset: 0,
                        len: 4096,
                        tag: 0,
                    },
                    ReadRequest { offset, len, tag: 1 },
                ];
                let (tx, rx) = mpsc::channel();
                let sent = reader.submit(reqs.clone(), tx);
                if reader.direct_io() {
                    match sent {
                        Err(e @ IoError::Misaligned { .. }) => {
                            let msg = e.to_string();
                            assert!(msg.contains(&*file.path.to_string_lossy()), "{msg}");
                            assert!(msg.contains("4096"), "{msg}");
                            assert_eq!(e.path(), file.path);
                        }
                        other => panic!("expected Misaligned, got {other:?}"),
                    }
                    // Nothing was queued: the only sender is already gone.
                    assert!(rx.recv_timeout(TIMEOUT).is_err());
                } else {
                    sent.unwrap();
                    check_ok(file, &reqs, &collect(&rx, 2));
                }
            }
        },
    );
}

#[test]
fn drop_with_reads_in_flight_completes_or_cancels_each() {
    each_setup(
        |o| {
            o.queue_depth = 16;
            o.threads = 2;
        },
        |file, reader| {
            let o = ReaderOptions {
                queue_depth: 16,
                threads: 2,
                ..opts(reader.backend(), reader.direct_io())
            };
            let mut rng = Rng(5);
            let reqs = random_requests(&mut rng, 300, FILE_LEN, false, 0);
            // Dropped at once, before the background thread may even have
            // seen the batch.
            let (tx, rx) = mpsc::channel();
            reader.submit(reqs.clone(), tx).unwrap();
            drop(reader);
            let got = collect(&rx, reqs.len());
            // Every sender is gone once the reader is.
            assert!(rx.recv_timeout(TIMEOUT).is_err());
            check_read_or_shut_down(file, &reqs, &got, "dropped at once");

            // Dropped once the first read has completed, with others under way.
            let reader = DiskReader::open(&file.path, &o).unwrap();
            let (tx, rx) = mpsc::channel();
            reader.submit(reqs[1..].to_vec(), tx).unwrap();
            let first = rx.recv_timeout(TIMEOUT).expect("a first completion");
            drop(reader);
            let mut got = collect(&rx, reqs.len() - 2);
            assert!(rx.recv_timeout(TIMEOUT).is_err());
            assert!(got.insert(first.tag, first.result).is_none());
            check_read_or_shut_down(file, &reqs[1..], &got, "dropped after a first read");
        },
    );
}

/// Each request was read correctly or failed with `ShutDown`.
fn check_read_or_shut_down(
    file: &TestFile,
    reqs: &[ReadRequest],
    got: &HashMap<u64, Result<AlignedBuf, IoError>>,
    when: &str,
) {
    let mut read = 0;
    for r in reqs {
        match &got[&r.tag] {
            Ok(_) => {
                check_ok(file, std::slice::from_ref(r), got);
                read += 1;
            }
            Err(IoError::ShutDown { path }) => assert_eq!(path, &file.path),
            Err(e) => panic!("{r:?}: {e}"),
        }
    }
    eprintln!("  {when}: {read} of {} read, the rest shut down", reqs.len());
}

#[test]
fn more_requests_than_queue_depth_all_complete() {
    each_setup(
        |o| {
            o.queue_depth = 8;
            o.threads = 2;
        },
        |file, reader| {
            let mut rng = Rng(11);
            let reqs = random_requests(&mut rng, 500, FILE_LEN, !reader.direct_io(), 0);
            let (tx, rx) = mpsc::channel();
            reader.submit(reqs.clone(), tx).unwrap();
            check_ok(file, &reqs, &collect(&rx, reqs.len()));
        },
    );
}

#[test]
fn file_shrunk_after_open_reports_end_of_file_at_read_time() {
    for backend in backends() {
        let (file, reader) = setup(FILE_LEN, 3, &opts(backend, false)).unwrap();
        let half = (FILE_LEN / 2) as u64;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file.path)
            .unwrap()
            .set_len(half)
            .unwrap();
        let reqs = vec![
            ReadRequest {
                offset: half - 4096,
                len: 200_000,
                tag: 0,
            },
            ReadRequest {
                offset: 0,
                len: 4096,
                tag: 1,
            },
        ];
        let (tx, rx) = mpsc::channel();
        reader.submit(reqs.clone(), tx).unwrap();
        let got = collect(&rx, 2);
        check_ok(&file, &reqs[1..], &got);
        match &got[&0] {
            Err(IoError::UnexpectedEof { file_len, offset, .. }) => {
                assert_eq!((*offset, *file_len), (half - 4096, half));
            }
            other => panic!("{backend:?}: expected UnexpectedEof, got {other:?}"),
        }
    }
}

#[test]
fn automatic_backend_prefers_io_uring_where_it_works() {
    let file = make_file_in(&std::env::temp_dir(), 8192, 2);
    let reader = DiskReader::open(&file.path, &ReaderOptions::default()).unwrap();
    let expected = if backends().contains(&Backend::IoUring) {
        Backend::IoUring
    } else {
        Backend::Pread
    };
    assert_eq!(reader.backend(), expected);
    eprintln!("automatic backend: {:?}", reader.backend());
    let (tx, rx) = mpsc::channel();
    reader.submit(vec![], tx.clone()).unwrap();
    let req = ReadRequest {
        offset: 4096,
        len: 4096,
        tag: 9,
    };
    reader.submit(vec![req], tx).unwrap();
    check_ok(&file, &[req], &collect(&rx, 1));
}

#[test]
fn open_failure_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.bin");
    for backend in [None, Some(Backend::Pread)] {
        let o = ReaderOptions {
            backend,
            ..ReaderOptions::default()
        };
        match DiskReader::open(&path, &o) {
            Err(e @ IoError::Open { .. }) => {
                assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
            }
            other => panic!("expected Open error, got {:?}", other.map(|r| r.backend())),
        }
    }
}

/// A filesystem that refuses `O_DIRECT` answers `open` with `EINVAL`
/// ("Invalid argument"); that, and only that, is `DirectIoUnsupported`
/// (procfs refuses it on every Linux, as tmpfs did before 6.6).
#[cfg(target_os = "linux")]
#[test]
fn direct_io_refused_by_the_filesystem_is_direct_io_unsupported() {
    let path = Path::new("/proc/self/status");
    for backend in backends() {
        match DiskReader::open(path, &opts(backend, true)) {
            Err(e @ IoError::DirectIoUnsupported { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("/proc/self/status") && msg.contains("O_DIRECT"), "{msg}");
                let IoError::DirectIoUnsupported { source, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(source.raw_os_error(), Some(libc::EINVAL), "{e}");
                assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput, "{e}");
            }
            other => panic!(
                "{backend:?}: expected DirectIoUnsupported, got {:?}",
                other.map(|r| r.backend())
            ),
        }
        // Without direct I/O the same file opens.
        DiskReader::open(path, &opts(backend, false)).unwrap();
    }
    // Another refusal at open is not mistaken for a missing O_DIRECT.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.bin");
    let err = DiskReader::open(&missing, &opts(Backend::Pread, true)).err();
    assert!(matches!(err, Some(IoError::Open { .. })), "{err:?}");
}

#[cfg(not(target_os = "linux"))]
#[test]
fn io_uring_is_refused_off_linux() {
    let file = make_file_in(&std::env::temp_dir(), 4096, 1);
    let err = DiskReader::open(&file.path, &opts(Backend::IoUring, false)).err();
    assert!(matches!(err, Some(IoError::UringUnavailable { .. })), "{err:?}");
}

#[test]
fn reader_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<DiskReader>();
    check::<ReadDone>();
}

/// A seccomp filter, as BPF instructions.
#[cfg(target_os = "linux")]
type Filter = Vec<libc::sock_filter>;

#[cfg(target_os = "linux")]
fn bpf(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Makes `io_uring_setup` fail with `EPERM`, as container runtimes and
/// `kernel.io_uring_disabled=2` do.
#[cfg(target_os = "linux")]
fn deny_io_uring() -> Filter {
    // seccomp_data.nr is at offset 0.
    vec![
        bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        bpf(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            libc::SYS_io_uring_setup as u32,
        ),
        bpf(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
        bpf(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Makes every `openat` with `O_DIRECT` fail with `EINVAL`, exactly as a
/// filesystem without direct I/O (tmpfs before Linux 6.6) answers.
#[cfg(target_os = "linux")]
fn deny_o_direct() -> Filter {
    // seccomp_data: nr at 0, args[] from 16; openat's flags are args[2],
    // whose low 32 bits lie at 32 (little-endian) or 36 (big-endian).
    let flags = if cfg!(target_endian = "little") { 32 } else { 36 };
    vec![
        bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        bpf(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            3,
            libc::SYS_openat as u32,
        ),
        bpf(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, flags),
        bpf(
            libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
            0,
            1,
            libc::O_DIRECT as u32,
        ),
        bpf(
            libc::BPF_RET | libc::BPF_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::EINVAL as u32,
        ),
        bpf(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Runs the test `name` (of this module) alone in a child process of this
/// test binary under `filter`, with `env` set (`None`: removed). `Err` when
/// the filter cannot be installed here.
#[cfg(target_os = "linux")]
fn run_under_seccomp(
    name: &str,
    filter: Filter,
    env: &[(&str, Option<&str>)],
) -> std::io::Result<std::process::Output> {
    use std::os::unix::process::CommandExt;
    let name = module_path!().split_once("::").map_or("", |(_, m)| m).to_owned() + "::" + name;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", &name, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    // SAFETY: the hook only makes two system calls (async-signal-safe) on
    // data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output()
}

/// [`run_under_seccomp`], or `None` (with a loud note; a failure under
/// `CHARM_CI=1`) when no seccomp filter can be installed here.
#[cfg(target_os = "linux")]
fn child_under_seccomp(what: &str, name: &str, filter: Filter, env: &[(&str, Option<&str>)]) -> Option<(bool, String)> {
    match run_under_seccomp(name, filter, env) {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            Some((out.status.success(), text))
        }
        Err(e) => {
            assert!(!ci_strict(), "CHARM_CI=1 but no seccomp filter can be installed: {e}");
            eprintln!("WARNING: skipping {what} (CHARM_CI=1 would fail): cannot install a seccomp filter: {e}");
            None
        }
    }
}

/// Runs this test again in a child process whose seccomp filter makes
/// `io_uring_setup` fail with `EPERM`; the child checks that the automatic
/// choice falls back to pread and that asking for io_uring says why not.
#[cfg(target_os = "linux")]
#[test]
fn falls_back_to_pread_when_io_uring_is_denied() {
    const CHILD: &str = "CHARM_IO_TEST_URING_DENIED";
    if std::env::var_os(CHILD).is_some() {
        let file = make_file_in(&std::env::temp_dir(), 3 * ALIGN, 4);
        let reader = DiskReader::open(&file.path, &ReaderOptions::default()).unwrap();
        assert_eq!(reader.backend(), Backend::Pread);
        let (tx, rx) = mpsc::channel();
        let req = ReadRequest {
            offset: 4096,
            len: 8000,
            tag: 1,
        };
        reader.submit(vec![req], tx).unwrap();
        check_ok(&file, &[req], &collect(&rx, 1));
        match DiskReader::open(&file.path, &opts(Backend::IoUring, false)) {
            Err(e @ IoError::UringUnavailable { .. }) => {
                assert!(e.to_string().contains(&*file.path.to_string_lossy()), "{e}");
                let IoError::UringUnavailable { source, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(source.raw_os_error(), Some(libc::EPERM), "{e}");
            }
            other => panic!("expected UringUnavailable, got {:?}", other.map(|r| r.backend())),
        }
        println!("fallback checked under seccomp");
        return;
    }
    let Some((ok, out)) = child_under_seccomp(
        "the fallback test",
        "falls_back_to_pread_when_io_uring_is_denied",
        deny_io_uring(),
        &[(CHILD, Some("1"))],
    ) else {
        return;
    };
    assert!(
        ok && out.contains("fallback checked under seccomp"),
        "child failed:\n{out}"
    );
    eprintln!("child with io_uring_setup denied: fell back to pread");
}

/// Where io_uring is denied, the io_uring cases skip loudly for a developer
/// but fail under `CHARM_CI=1` (and under `CHARM_REQUIRE_IO_URING=1`).
#[cfg(target_os = "linux")]
#[test]
fn ci_strict_mode_fails_instead_of_skipping_io_uring() {
    let test = "random_reads_in_one_submit";
    let run =
        |env: &[(&str, Option<&str>)]| child_under_seccomp("the io_uring strict-mode test", test, deny_io_uring(), env);
    let relaxed = [("CHARM_CI", None), ("CHARM_REQUIRE_IO_URING", None)];
    let Some((ok, out)) = run(&relaxed) else { return };
    assert!(ok, "without CHARM_CI the io_uring cases skip:\n{out}");
    assert!(out.contains("WARNING: skipping every io_uring case"), "{out}");
    for strict in [
        [("CHARM_CI", Some("1")), ("CHARM_REQUIRE_IO_URING", None)],
        [("CHARM_CI", None), ("CHARM_REQUIRE_IO_URING", Some("1"))],
    ] {
        let (ok, out) = run(&strict).expect("the filter installed a moment ago");
        assert!(!ok, "{strict:?}: io_uring denied must fail the test:\n{out}");
        assert!(out.contains("io_uring cannot run here"), "{out}");
    }
}

/// Where every filesystem refuses `O_DIRECT` (`EINVAL` at open), the direct
/// I/O cases skip loudly for a developer but fail under `CHARM_CI=1`.
#[cfg(target_os = "linux")]
#[test]
fn ci_strict_mode_fails_instead_of_skipping_direct_io() {
    let test = "random_reads_in_one_submit";
    let run =
        |env: &[(&str, Option<&str>)]| child_under_seccomp("the O_DIRECT strict-mode test", test, deny_o_direct(), env);
    let Some((ok, out)) = run(&[("CHARM_CI", None)]) else {
        return;
    };
    assert!(ok, "without CHARM_CI the direct I/O cases skip:\n{out}");
    assert!(
        out.contains("WARNING: skipping") && out.contains("with direct I/O"),
        "{out}"
    );
    assert!(out.contains("Invalid argument"), "the refusal is EINVAL: {out}");
    assert!(
        out.contains("direct_io=false") && !out.contains("direct_io=true"),
        "{out}"
    );
    let (ok, out) = run(&[("CHARM_CI", Some("1"))]).expect("the filter installed a moment ago");
    assert!(!ok, "O_DIRECT refused everywhere must fail under CHARM_CI=1:\n{out}");
    assert!(
        out.contains("CHARM_CI=1 but no candidate dir supports O_DIRECT"),
        "{out}"
    );
}
