//! Routing history: how often each expert was routed to, measured on this
//! user's own requests, persisted next to the model so the pinned hot set
//! improves with use. A history written for another model (fingerprint
//! mismatch) is ignored with a warning.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Per-expert routing counts of one model.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RoutingHistory {
    /// Fingerprint of the model the counts belong to.
    pub fingerprint: String,
    /// `counts[layer][expert]`: rows routed to that expert.
    pub counts: Vec<Vec<u64>>,
    #[serde(skip)]
    path: Option<PathBuf>,
}

impl RoutingHistory {
    /// Empty counts for `layers × experts`.
    pub fn new(fingerprint: &str, layers: usize, experts: usize) -> Self {
        RoutingHistory {
            fingerprint: fingerprint.to_string(),
            counts: vec![vec![0; experts]; layers],
            path: None,
        }
    }

    /// Loads `path` if it exists and belongs to this model; otherwise
    /// starts empty. The second value is a warning to show the user.
    pub fn load(path: &Path, fingerprint: &str, layers: usize, experts: usize) -> (Self, Option<String>) {
        let mut fresh = Self::new(fingerprint, layers, experts);
        fresh.path = Some(path.to_path_buf());
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (fresh, None),
            Err(e) => {
                return (
                    fresh,
                    Some(format!(
                        "{}: cannot read the routing history ({e}); ignoring it",
                        path.display()
                    )),
                )
            }
        };
        // serde_json refuses invalid UTF-8, truncated and malformed input
        // with an error, never a panic.
        match serde_json::from_slice::<RoutingHistory>(&bytes) {
            Ok(h) if h.fingerprint != fingerprint => (
                fresh,
                Some(format!(
                    "{}: routing history is for another model (fingerprint {}); ignoring it",
                    path.display(),
                    short_for_message(&h.fingerprint)
                )),
            ),
            Ok(h) if h.counts.len() != layers || h.counts.iter().any(|l| l.len() != experts) => (
                fresh,
                Some(format!(
                    "{}: routing history has the wrong shape; ignoring it",
                    path.display()
                )),
            ),
            Ok(mut h) => {
                h.path = Some(path.to_path_buf());
                (h, None)
            }
            Err(e) => (
                fresh,
                Some(format!(
                    "{}: unreadable routing history ({e}); ignoring it",
                    path.display()
                )),
            ),
        }
    }

    /// Counts `rows` routed to `(layer, expert)`.
    pub fn record(&mut self, layer: u16, expert: u32, rows: u64) {
        if let Some(c) = self
            .counts
            .get_mut(layer as usize)
            .and_then(|l| l.get_mut(expert as usize))
        {
            *c = c.saturating_add(rows);
        }
    }

    /// Experts ever routed to, most routed first (ties: lower layer, then
    /// lower expert).
    pub fn hottest(&self) -> Vec<(u16, u32)> {
        let mut v: Vec<(u64, u16, u32)> = self
            .counts
            .iter()
            .enumerate()
            .flat_map(|(l, row)| row.iter().enumerate().map(move |(e, &c)| (c, l as u16, e as u32)))
            .filter(|&(c, _, _)| c > 0)
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        v.into_iter().map(|(_, l, e)| (l, e)).collect()
    }

    /// Writes the history atomically (temporary file, then rename).
    pub fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(self).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, path)
    }
}

/// The first 12 characters of an untrusted fingerprint, escaped (no
/// control characters reach the log), with `…` when cut.
fn short_for_message(fingerprint: &str) -> String {
    let mut out: String = fingerprint.chars().take(12).flat_map(char::escape_debug).collect();
    if fingerprint.chars().nth(12).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_models() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/routing-history.json");
        let (mut h, warn) = RoutingHistory::load(&path, "abc", 2, 4);
        assert!(warn.is_none());
        h.record(1, 3, 5);
        h.record(0, 2, 7);
        h.record(9, 9, 1); // out of range: ignored
        h.save().unwrap();
        let (back, warn) = RoutingHistory::load(&path, "abc", 2, 4);
        assert!(warn.is_none());
        assert_eq!(back.hottest(), vec![(0, 2), (1, 3)]);
        let (other, warn) = RoutingHistory::load(&path, "xyz", 2, 4);
        assert!(warn.unwrap().contains("another model"));
        assert!(other.hottest().is_empty());
        std::fs::write(&path, "{ nope").unwrap();
        let (_, warn) = RoutingHistory::load(&path, "abc", 2, 4);
        assert!(warn.unwrap().contains("unreadable"));
    }

    /// A history whose fingerprint has multi-byte characters around byte 12
    /// (where the message used to cut it by byte index) is ignored with a
    /// warning, never a panic.
    #[test]
    fn foreign_history_with_multibyte_fingerprint_warns_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routing-history.json");
        for fp in [
            "abcdefghijké€xyz",
            "ééééééé",
            "€",
            "日本語のフィンガープリント",
            "a\nb\u{1b}[31m",
        ] {
            let h = RoutingHistory {
                fingerprint: fp.to_string(),
                counts: vec![vec![1; 4]; 2],
                path: None,
            };
            std::fs::write(&path, serde_json::to_vec(&h).unwrap()).unwrap();
            let (got, warn) = RoutingHistory::load(&path, "abc", 2, 4);
            let warn = warn.expect("a warning");
            assert!(warn.contains("another model"), "{warn}");
            assert!(!warn.contains('\n') && !warn.contains('\u{1b}'), "{warn:?}");
            assert!(got.hottest().is_empty());
        }
        assert_eq!(short_for_message("abcdefghijké€xyz"), "abcdefghijké…");
        assert_eq!(short_for_message("abc"), "abc");
    }

    /// Truncated, non-UTF-8 or hostile history files are ignored with a
    /// warning; the counts start empty.
    #[test]
    fn corrupt_history_files_are_ignored_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routing-history.json");
        let good = serde_json::to_vec(&RoutingHistory::new("abc", 2, 4)).unwrap();
        let cases: Vec<Vec<u8>> = vec![
            good[..good.len() / 2].to_vec(),
            b"{\"fingerprint\":\"ab\xff\xfe\",\"counts\":[]}".to_vec(),
            "{\"fingerprint\":\"é".as_bytes().to_vec(),
            b"\xe2\x82".to_vec(),
            b"{\"fingerprint\":\"abc\",\"counts\":[[1,2,3,-4],[0,0,0,0]]}".to_vec(),
            b"{\"fingerprint\":\"abc\",\"counts\":[[1,2,3,4]]}".to_vec(),
            b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".repeat(100),
            Vec::new(),
        ];
        for bytes in cases {
            std::fs::write(&path, &bytes).unwrap();
            let (h, warn) = RoutingHistory::load(&path, "abc", 2, 4);
            assert!(warn.is_some(), "no warning for {:?}", String::from_utf8_lossy(&bytes));
            assert_eq!(h.counts, vec![vec![0; 4]; 2]);
        }
        // A directory where the file should be: unreadable, so a warning too.
        let (_, warn) = RoutingHistory::load(dir.path(), "abc", 2, 4);
        assert!(warn.unwrap().contains("cannot read"));
    }

    #[test]
    fn counts_saturate_instead_of_overflowing() {
        let mut h = RoutingHistory::new("abc", 1, 1);
        h.record(0, 0, u64::MAX - 1);
        h.record(0, 0, 5);
        assert_eq!(h.counts[0][0], u64::MAX);
    }
}
