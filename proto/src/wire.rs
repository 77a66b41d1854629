//! The messages of the cluster protocol: what a coordinator and a worker say
//! to each other over one QUIC connection (`docs/protocol.md` has the whole
//! conversation).
//!
//! 1. coordinator → worker [`Auth`]: its proof of the cluster key and the
//!    fingerprint of the model it runs;
//! 2. worker → coordinator [`Auth`] (its own proof), then [`Hello`]: what it
//!    holds, its cache and its measured speeds;
//! 3. then one QUIC stream per exchange: [`RunExperts`] → [`ExpertsOut`] (or
//!    [`WireError`]); `EndRequest` → [`WorkerStats`]; and the one-way
//!    [`Prefetch`].
//!
//! Every message is checked by [`Message::validate`] after decoding, so a
//! hostile peer's lengths and indices are an error, never a panic.

use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::expert::{ExpertBatch, ExpertOutputs, PrefetchHint};

/// Bytes of an authentication proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Longest model fingerprint accepted (a hex SHA-256 with a short prefix fits).
pub const MAX_FINGERPRINT_LEN: usize = 128;
/// Longest free text (software name, format, error message) accepted.
pub const MAX_TEXT_LEN: usize = 4096;
/// Most decoder layers a model may have.
pub const MAX_LAYERS: u32 = 4096;
/// Most routed experts a layer may have.
pub const MAX_EXPERTS: u32 = 1 << 20;
/// Widest activation row accepted.
pub const MAX_HIDDEN: u32 = 1 << 18;

/// The tag byte of a frame: which message follows. Pinned by tests; never
/// renumber a tag, add new ones instead (and bump the protocol version when
/// an old peer could not understand the conversation any more).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Tag {
    Auth = 1,
    Hello = 2,
    RunExperts = 3,
    ExpertsOut = 4,
    Prefetch = 5,
    EndRequest = 6,
    Stats = 7,
    Error = 8,
}

impl Tag {
    /// Every tag, in numeric order.
    pub const ALL: [Tag; 8] = [
        Tag::Auth,
        Tag::Hello,
        Tag::RunExperts,
        Tag::ExpertsOut,
        Tag::Prefetch,
        Tag::EndRequest,
        Tag::Stats,
        Tag::Error,
    ];

    /// The tag with this byte value.
    pub fn from_u8(b: u8) -> Option<Tag> {
        Tag::ALL.into_iter().find(|t| *t as u8 == b)
    }

    /// The message name, for errors and logs.
    pub fn name(self) -> &'static str {
        match self {
            Tag::Auth => "Auth",
            Tag::Hello => "Hello",
            Tag::RunExperts => "RunExperts",
            Tag::ExpertsOut => "ExpertsOut",
            Tag::Prefetch => "Prefetch",
            Tag::EndRequest => "EndRequest",
            Tag::Stats => "Stats",
            Tag::Error => "Error",
        }
    }
}

/// One message of the cluster protocol.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// Proof of the cluster key, both directions, before anything else.
    Auth(Auth),
    /// Worker → coordinator after authentication: what the worker holds.
    Hello(Hello),
    /// Coordinator → worker: one layer step's share of routed work.
    RunExperts(RunExperts),
    /// Worker → coordinator: the per-expert outputs of a [`RunExperts`].
    ExpertsOut(ExpertsOut),
    /// Coordinator → worker, one-way: read these experts ahead.
    Prefetch(Prefetch),
    /// Coordinator → worker: a generation request ended (the worker saves
    /// its routing history and re-pins its hot set); answered by `Stats`.
    EndRequest,
    /// Worker → coordinator: the worker's counters since it started.
    Stats(WorkerStats),
    /// Either direction: the request (or the connection) failed.
    Error(WireError),
}

impl Message {
    /// The frame tag of this message.
    pub fn tag(&self) -> Tag {
        match self {
            Message::Auth(_) => Tag::Auth,
            Message::Hello(_) => Tag::Hello,
            Message::RunExperts(_) => Tag::RunExperts,
            Message::ExpertsOut(_) => Tag::ExpertsOut,
            Message::Prefetch(_) => Tag::Prefetch,
            Message::EndRequest => Tag::EndRequest,
            Message::Stats(_) => Tag::Stats,
            Message::Error(_) => Tag::Error,
        }
    }

    /// Checks every length, index and number a peer could get wrong.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Message::Auth(a) => check_text("fingerprint", &a.fingerprint, MAX_FINGERPRINT_LEN),
            Message::Hello(h) => h.validate(),
            Message::RunExperts(r) => {
                if r.batch.hidden > MAX_HIDDEN {
                    return Err(format!("row width {} exceeds {MAX_HIDDEN}", r.batch.hidden));
                }
                r.batch.validate().map_err(|e| e.to_string())?;
                if let Some(h) = &r.batch.next {
                    check_sorted_unique("prefetch hint", &h.experts)?;
                }
                Ok(())
            }
            Message::ExpertsOut(o) => check_number("worker_ms", o.worker_ms as f64),
            Message::Prefetch(p) => check_sorted_unique("prefetch hint", &p.hint.experts),
            Message::EndRequest => Ok(()),
            Message::Stats(s) => check_number("io_wait_ms", s.io_wait_ms),
            Message::Error(e) => check_text("error message", &e.message, MAX_TEXT_LEN),
        }
    }
}

/// Which side of a connection a proof belongs to. Each side's proof covers
/// its role, so a peer cannot answer a proof by reflecting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Coordinator,
    Worker,
}

/// Proof that the sender holds the cluster key, bound to this TLS session:
/// `HMAC-SHA256(key, "charm-auth-v1" ‖ role ‖ TLS exporter secret)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Auth {
    pub role: Role,
    pub proof: [u8; PROOF_LEN],
    /// Fingerprint of the model the sender runs (the coordinator's lets a
    /// worker holding another model refuse at once, saying so).
    #[serde(deserialize_with = "bounded_text")]
    pub fingerprint: String,
}

/// What a worker holds and how fast it is, sent once after authentication.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Program and version, e.g. `charm-worker 0.1.0`.
    #[serde(deserialize_with = "bounded_text")]
    pub software: String,
    /// The version of the bits the worker's kernels compute
    /// (`charm_common::ARITHMETIC`): a coordinator takes only workers that
    /// compute as it does.
    pub arithmetic: u32,
    /// Model fingerprint: a container's manifest fingerprint, or one
    /// computed from a Hugging Face directory.
    #[serde(deserialize_with = "bounded_text")]
    pub fingerprint: String,
    /// Decoder layers of the model.
    pub num_layers: u32,
    /// Routed experts per MoE layer.
    pub num_experts: u32,
    /// Activation row width.
    pub hidden: u32,
    /// The experts whose weights the worker has on its disk.
    pub holdings: Holdings,
    /// How the experts are stored, e.g. `safetensors bf16` or `container int4`.
    #[serde(deserialize_with = "bounded_text")]
    pub format: String,
    /// Bytes one expert occupies in the worker's cache.
    pub expert_bytes: u64,
    /// RAM budget for cached experts, in bytes.
    pub cache_bytes: u64,
    /// Read bandwidth of the expert files, measured at start (bytes/s).
    pub disk_bytes_per_s: f64,
    /// Expert FFN rows computed per second, measured at start.
    pub expert_rows_per_s: f64,
    /// Largest frame the worker accepts (bytes of payload).
    pub max_frame: u32,
    /// The worker's counters now: the baseline later `Stats` are measured
    /// from (a worker may have served other coordinators before).
    pub stats: WorkerStats,
}

impl Hello {
    fn validate(&self) -> Result<(), String> {
        check_text("software", &self.software, MAX_TEXT_LEN)?;
        check_text("fingerprint", &self.fingerprint, MAX_FINGERPRINT_LEN)?;
        check_text("format", &self.format, MAX_TEXT_LEN)?;
        if self.num_layers > MAX_LAYERS {
            return Err(format!("{} layers exceed {MAX_LAYERS}", self.num_layers));
        }
        if self.num_experts > MAX_EXPERTS {
            return Err(format!("{} experts exceed {MAX_EXPERTS}", self.num_experts));
        }
        if self.hidden == 0 || self.hidden > MAX_HIDDEN {
            return Err(format!("row width {} outside 1..={MAX_HIDDEN}", self.hidden));
        }
        check_number("disk_bytes_per_s", self.disk_bytes_per_s)?;
        check_number("expert_rows_per_s", self.expert_rows_per_s)?;
        check_number("io_wait_ms", self.stats.io_wait_ms)?;
        self.holdings.validate(self.num_layers, self.num_experts)
    }
}

/// Which experts a worker holds: per layer, sorted half-open ranges of
/// expert ids. A full copy of the model is one range per MoE layer; a
/// partial copy (only some layers' or experts' files) lists what is there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holdings {
    /// Sorted by layer, each layer at most once.
    pub layers: Vec<LayerHolding>,
}

/// The experts held of one layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerHolding {
    pub layer: u16,
    /// Sorted, non-empty, non-overlapping, non-adjacent ranges.
    pub ranges: Vec<ExpertRange>,
}

/// Experts `start..end` of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertRange {
    pub start: u32,
    pub end: u32,
}

impl Holdings {
    /// Compact ranges for any set of `(layer, expert)` pairs.
    pub fn from_experts(experts: impl IntoIterator<Item = (u16, u32)>) -> Holdings {
        let mut all: Vec<(u16, u32)> = experts.into_iter().collect();
        all.sort_unstable();
        all.dedup();
        let mut layers: Vec<LayerHolding> = Vec::new();
        for (l, e) in all {
            match layers.last_mut() {
                Some(h) if h.layer == l => match h.ranges.last_mut() {
                    Some(r) if r.end == e => r.end = e + 1,
                    _ => h.ranges.push(ExpertRange { start: e, end: e + 1 }),
                },
                _ => layers.push(LayerHolding {
                    layer: l,
                    ranges: vec![ExpertRange { start: e, end: e + 1 }],
                }),
            }
        }
        Holdings { layers }
    }

    /// Whether `(layer, expert)` is held.
    pub fn contains(&self, layer: u16, expert: u32) -> bool {
        let Ok(i) = self.layers.binary_search_by_key(&layer, |h| h.layer) else {
            return false;
        };
        let ranges = &self.layers[i].ranges;
        let j = ranges.partition_point(|r| r.end <= expert);
        ranges.get(j).is_some_and(|r| r.start <= expert)
    }

    /// Number of experts held.
    pub fn count(&self) -> u64 {
        self.layers
            .iter()
            .flat_map(|h| &h.ranges)
            .map(|r| (r.end - r.start) as u64)
            .sum()
    }

    /// Every held `(layer, expert)`, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        self.layers.iter().flat_map(|h| {
            h.ranges
                .iter()
                .flat_map(move |r| (r.start..r.end).map(move |e| (h.layer, e)))
        })
    }

    /// Checks order and bounds against a model of `num_layers × num_experts`.
    pub fn validate(&self, num_layers: u32, num_experts: u32) -> Result<(), String> {
        let mut prev_layer: Option<u16> = None;
        for h in &self.layers {
            if prev_layer.is_some_and(|p| p >= h.layer) {
                return Err(format!("holdings: layer {} out of order", h.layer));
            }
            prev_layer = Some(h.layer);
            if h.layer as u32 >= num_layers {
                return Err(format!("holdings: layer {} of a {num_layers}-layer model", h.layer));
            }
            let mut prev_end: Option<u32> = None;
            for r in &h.ranges {
                if r.start >= r.end || r.end > num_experts {
                    return Err(format!(
                        "holdings: layer {} range {}..{} is empty or beyond {num_experts} experts",
                        h.layer, r.start, r.end
                    ));
                }
                if prev_end.is_some_and(|p| p >= r.start) {
                    return Err(format!(
                        "holdings: layer {} ranges overlap or are out of order at {}",
                        h.layer, r.start
                    ));
                }
                prev_end = Some(r.end);
            }
        }
        Ok(())
    }
}

/// One layer step's share of routed work for one worker: the rows its
/// experts need (each row once), each expert's row list and gate weights,
/// and the prediction of its next-layer experts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunExperts {
    /// The coordinator's request counter (echoed, for matching and logs).
    pub step: u64,
    pub batch: ExpertBatch,
}

/// The answer to a [`RunExperts`]: one output per group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpertsOut {
    /// Echoes [`RunExperts::step`].
    pub step: u64,
    pub outputs: ExpertOutputs,
    /// Time the worker spent on the request (store and compute), in ms.
    pub worker_ms: f32,
}

/// Read ahead `hint` (sent to a worker that owns predicted experts but has
/// no work in the current layer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prefetch {
    /// The layer the coordinator is running now.
    pub layer: u16,
    pub hint: PrefetchHint,
}

/// A worker's counters since it started: requests served and its expert
/// store's hits, misses, reads and prefetches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// `RunExperts` requests answered.
    pub requests: u64,
    /// Expert groups computed.
    pub experts_served: u64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_bytes_read: u64,
    pub io_wait_ms: f64,
    pub prefetch_hits: u64,
    pub prefetch_issued: u64,
    /// Bytes of experts in the worker's RAM cache now.
    pub cache_bytes: u64,
    pub predicted_correct: u64,
    pub predicted_total: u64,
    /// The read-ahead policy's cost and decisions: experts read ahead and
    /// never used, evictions a read-ahead caused that a later step read
    /// again, layer steps read-ahead stood down for, and times a
    /// measurement turned it off.
    pub prefetch_wasted: u64,
    pub prefetch_harm: u64,
    pub prefetch_paused_steps: u64,
    pub prefetch_stand_downs: u64,
}

/// Why a request or a connection failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    pub kind: ErrorKind,
    /// One line for a person.
    #[serde(deserialize_with = "bounded_text")]
    pub message: String,
}

/// The kinds of failure a peer reports. Each has a QUIC application close
/// code ([`ErrorKind::code`]), pinned by tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The peer did not prove it holds the cluster key.
    Unauthenticated,
    /// The peer runs or holds another model (fingerprint or shape differs).
    WrongModel,
    /// A frame could not be decoded or failed validation.
    Malformed,
    /// A frame was longer than the receiver accepts.
    TooLarge,
    /// A frame carried a protocol version this side does not speak.
    UnsupportedVersion,
    /// The worker is at its connection limit.
    Busy,
    /// The worker could not run the request (missing expert, disk error).
    Failed,
    /// The peer did not finish the handshake in time.
    Timeout,
}

impl ErrorKind {
    /// The QUIC application error code a connection closed for this reason
    /// carries (0 is a normal close).
    pub fn code(self) -> u32 {
        match self {
            ErrorKind::Unauthenticated => 1,
            ErrorKind::WrongModel => 2,
            ErrorKind::Malformed => 3,
            ErrorKind::TooLarge => 4,
            ErrorKind::UnsupportedVersion => 5,
            ErrorKind::Busy => 6,
            ErrorKind::Failed => 7,
            ErrorKind::Timeout => 8,
        }
    }
}

/// Deserializes a string no longer than [`MAX_TEXT_LEN`], checking the
/// length the decoder borrowed from the payload before copying it (a frame
/// cannot make the receiver allocate what its length field claims).
fn bounded_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Text;
    impl Visitor<'_> for Text {
        type Value = String;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a string of at most {MAX_TEXT_LEN} bytes")
        }

        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<String, E> {
            if s.len() > MAX_TEXT_LEN {
                return Err(E::custom(format!("text of {} bytes exceeds {MAX_TEXT_LEN}", s.len())));
            }
            Ok(s.to_owned())
        }
    }
    d.deserialize_str(Text)
}

fn check_text(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!("{what} of {} bytes exceeds {max}", s.len()));
    }
    Ok(())
}

fn check_number(what: &str, v: f64) -> Result<(), String> {
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{what} is {v}, not a finite non-negative number"));
    }
    Ok(())
}

fn check_sorted_unique(what: &str, xs: &[u32]) -> Result<(), String> {
    match xs.windows(2).find(|w| w[0] >= w[1]) {
        Some(w) => Err(format!("{what}: experts not sorted and unique at {}", w[1])),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdings_compact_and_answer() {
        let h = Holdings::from_experts([(1, 5), (0, 0), (0, 1), (0, 2), (0, 7), (1, 4), (0, 1)]);
        assert_eq!(h.layers.len(), 2);
        assert_eq!(
            h.layers[0].ranges,
            vec![ExpertRange { start: 0, end: 3 }, ExpertRange { start: 7, end: 8 }]
        );
        assert_eq!(h.layers[1].ranges, vec![ExpertRange { start: 4, end: 6 }]);
        assert_eq!(h.count(), 6);
        assert!(h.contains(0, 2) && h.contains(0, 7) && h.contains(1, 4));
        assert!(!h.contains(0, 3) && !h.contains(1, 6) && !h.contains(2, 0));
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            vec![(0, 0), (0, 1), (0, 2), (0, 7), (1, 4), (1, 5)]
        );
        assert_eq!(h.validate(2, 8), Ok(()));
        assert!(h.validate(1, 8).unwrap_err().contains("layer 1"));
        assert!(h.validate(2, 7).unwrap_err().contains("beyond 7"));
    }

    #[test]
    fn bad_holdings_are_refused() {
        let r = |start, end| ExpertRange { start, end };
        let overlapping = Holdings {
            layers: vec![LayerHolding {
                layer: 0,
                ranges: vec![r(0, 4), r(3, 6)],
            }],
        };
        assert!(overlapping.validate(1, 8).unwrap_err().contains("overlap"));
        let empty = Holdings {
            layers: vec![LayerHolding {
                layer: 0,
                ranges: vec![r(2, 2)],
            }],
        };
        assert!(empty.validate(1, 8).unwrap_err().contains("empty"));
        let unordered = Holdings {
            layers: vec![
                LayerHolding {
                    layer: 1,
                    ranges: vec![r(0, 1)],
                },
                LayerHolding {
                    layer: 0,
                    ranges: vec![r(0, 1)],
                },
            ],
        };
        assert!(unordered.validate(2, 8).unwrap_err().contains("out of order"));
    }

    #[test]
    fn tags_round_trip() {
        for t in Tag::ALL {
            assert_eq!(Tag::from_u8(t as u8), Some(t));
        }
        assert_eq!(Tag::from_u8(0), None);
        assert_eq!(Tag::from_u8(9), None);
    }
}
