//! How much memory this process can still take: the OS's `MemAvailable`,
//! capped by the room left under the process's memory cgroup limit (a
//! container, `systemd-run -p MemoryMax=`, a benchmark's limit). Sizing a
//! copy or a cache by the machine's free memory alone inside a smaller
//! limit gets the process killed (a 8.8 GB GGUF repacked inside a 4 GiB
//! group was).

/// Bytes the process can take without swapping or meeting its cgroup
/// limit: `MemAvailable` (Linux; half of RAM on macOS) and, under a memory
/// cgroup limit, at most the limit less the group's anonymous memory (its
/// page cache is reclaimable, so it does not count).
pub fn available() -> Option<u64> {
    let os = os_available();
    match (os, cgroup_room()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether model files of `len` bytes in all are mapped with their page
/// tables made at open (`MAP_POPULATE`, which llama.cpp asks for by
/// default): the first prompt then meets no page fault in the weights it
/// reads in place (F32 / BF16 / F16 rows; 512-token BF16 prefill of the
/// OLMoE-shaped bench GGUF 252 → 265 tok/s, for 0.2 s more at open). Only
/// when they take at most half of the memory the process can take now
/// ([`available`]): larger files are read as they are used, never all at
/// open. `CHARM_POPULATE=0` / `=1` forces it off / on.
pub fn populate_policy(len: u64) -> bool {
    match std::env::var("CHARM_POPULATE").as_deref() {
        Ok("0") => return false,
        Ok("1") => return true,
        _ => {}
    }
    available().is_some_and(|a| len <= a / 2)
}

/// This process's peak resident memory (`VmHWM` of `/proc/self/status`),
/// in bytes; `None` where the file does not exist (macOS) or lacks it.
pub fn peak_rss() -> Option<u64> {
    kib_field(&std::fs::read_to_string("/proc/self/status").ok()?, "VmHWM:")
}

/// A `/proc/*/status`-style field given in kB, in bytes.
fn kib_field(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let mut fields = line.split_whitespace().skip(1);
    let kb: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        None | Some("kB") => kb.checked_mul(1024),
        Some(_) => None,
    }
}

fn os_available() -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        return mem_available(&text);
    }
    let out = std::process::Command::new("sysctl")
        .args(["-n", "hw.memsize"])
        .output()
        .ok()?;
    let total: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some(total / 2)
}

/// `MemAvailable` in bytes from `/proc/meminfo`-format text, or `None` when
/// the line is missing or malformed (any text is accepted: nothing is cut
/// by byte index, and the value is multiplied with overflow checked).
pub fn mem_available(meminfo: &str) -> Option<u64> {
    kib_field(meminfo, "MemAvailable:")
}

/// The room under this process's memory cgroup limit, or `None` without
/// one (no cgroup, no limit, or files that do not read).
fn cgroup_room() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let group = memory_cgroup(&own)?;
    let read = |file: &str| std::fs::read_to_string(group.dir().join(file)).ok();
    let stat = read("memory.stat").unwrap_or_default();
    match group {
        MemoryCgroup::V1(_) => room(&read("memory.limit_in_bytes")?, &stat, &["total_rss", "rss"]),
        MemoryCgroup::V2(_) => room(&read("memory.max")?, &stat, &["anon"]),
    }
}

/// A process's memory cgroup: its path under the v1 `memory` hierarchy or
/// the v2 unified one.
#[derive(Debug, PartialEq)]
pub enum MemoryCgroup {
    V1(String),
    V2(String),
}

impl MemoryCgroup {
    /// Its directory under `/sys/fs/cgroup`.
    pub fn dir(&self) -> std::path::PathBuf {
        let (root, path) = match self {
            MemoryCgroup::V1(p) => ("/sys/fs/cgroup/memory", p),
            MemoryCgroup::V2(p) => ("/sys/fs/cgroup", p),
        };
        std::path::Path::new(root).join(path.trim_start_matches('/'))
    }
}

/// The memory cgroup named in `/proc/self/cgroup`-format text: the v1 line
/// whose controllers include `memory`, else the v2 line (`0::PATH`).
pub fn memory_cgroup(proc_cgroup: &str) -> Option<MemoryCgroup> {
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return Some(MemoryCgroup::V1(path.to_string()));
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(MemoryCgroup::V2(path.to_string()));
        }
    }
    v2
}

/// The room under a limit (`limit` the contents of `memory.limit_in_bytes`
/// or `memory.max`): the limit less the first of `anon_keys` found in
/// `stat` (a `memory.stat`), or `None` when there is no limit (`max`, or a
/// v1 limit of 2^62 or more, the kernel's "none").
pub fn room(limit: &str, stat: &str, anon_keys: &[&str]) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok()?;
    if limit >= 1 << 62 {
        return None;
    }
    let anon = anon_keys
        .iter()
        .find_map(|k| {
            stat.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    Some(limit.saturating_sub(anon))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_is_found_in_either_hierarchy() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";
        assert_eq!(memory_cgroup(v1), Some(MemoryCgroup::V1("/process_api/abc".into())));
        assert_eq!(
            MemoryCgroup::V1("/process_api/abc".into()).dir(),
            std::path::PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
        );
        let v1_joined = "3:cpu,memory:/bench\n";
        assert_eq!(memory_cgroup(v1_joined), Some(MemoryCgroup::V1("/bench".into())));
        let v2 = "0::/user.slice/run-1.scope\n";
        assert_eq!(
            memory_cgroup(v2),
            Some(MemoryCgroup::V2("/user.slice/run-1.scope".into()))
        );
        assert_eq!(
            MemoryCgroup::V2("/".into()).dir(),
            std::path::PathBuf::from("/sys/fs/cgroup")
        );
        assert_eq!(memory_cgroup("garbage\n\n1:cpu:/\n"), None);
    }

    #[test]
    fn peak_rss_reads_vmhwm_in_kib() {
        let status = "Name:\tcoordinator\nVmPeak:\t  9000 kB\nVmHWM:\t  2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(kib_field(status, "VmHWM:"), Some(2048 * 1024));
        assert_eq!(kib_field("VmHWM:\t12 MB\n", "VmHWM:"), None);
        assert_eq!(kib_field("VmHWM:\tmany kB\n", "VmHWM:"), None);
        assert_eq!(kib_field("", "VmHWM:"), None);
        if cfg!(target_os = "linux") {
            assert!(peak_rss().is_some_and(|b| b > 0));
        }
    }

    #[test]
    fn room_is_the_limit_less_anonymous_memory() {
        let v1_stat = "cache 500\nrss 100\ntotal_cache 900\ntotal_rss 300\n";
        assert_eq!(
            room("4294967296\n", v1_stat, &["total_rss", "rss"]),
            Some(4294967296 - 300)
        );
        assert_eq!(room("9223372036854771712\n", v1_stat, &["total_rss", "rss"]), None);
        let v2_stat = "anon 1000\nfile 5000\nanon_thp 0\n";
        assert_eq!(room("8000\n", v2_stat, &["anon"]), Some(7000));
        assert_eq!(room("max\n", v2_stat, &["anon"]), None);
        assert_eq!(room("100\n", "anon 1000\n", &["anon"]), Some(0));
        assert_eq!(room("100\n", "", &["anon"]), Some(100));
        assert_eq!(room("ünïcode", "", &["anon"]), None);
    }

    #[test]
    fn mem_available_reads_meminfo() {
        let text = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   16000000 kB\n";
        assert_eq!(mem_available(text), Some(16_000_000 * 1024));
        for bad in ["", "MemAvailable:", "MemAvailable: é€ kB", "MemAvailable: -5 kB"] {
            assert_eq!(mem_available(bad), None, "{bad:?}");
        }
        assert_eq!(mem_available("MemAvailable: 18446744073709551615 kB"), None);
    }
}
