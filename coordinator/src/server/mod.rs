//! `coordinator serve` / `coordinator web`: an OpenAI- and
//! Anthropic-compatible HTTP API, Prometheus metrics and a live dashboard,
//! in front of one engine thread.
//!
//! # Layout
//! - this file: options, start-up checks (bind address, API key), the
//!   router, authentication, `/health`, `/metrics`, `/v1/models`, and what
//!   both APIs share (tokenizing in the background, queueing a job).
//! - [`conn`]: the accept loop, the connection cap and the per-connection
//!   timeouts (slow heads and bodies, idle keep-alive, stalled reads).
//! - [`queue`]: the bounded FIFO in front of the engine thread (429 when full).
//! - [`scheduler`]: the engine thread: continuous batching of up to
//!   `--max-batch` requests, the prefix cache, detokenization and stop
//!   strings per token.
//! - [`openai`]: the OpenAI API (`/v1/chat/completions`, `/v1/completions`).
//! - [`anthropic`]: the Anthropic API (`/v1/messages`,
//!   `/v1/messages/count_tokens`).
//! - [`tokenize`]: `/tokenize` and `/detokenize` (llama-server's and
//!   vLLM's shapes).
//! - [`sampling`]: a request's sampling fields, filled from the model's
//!   recommended settings where it leaves them out.
//! - [`origin`]: which web pages' origins are answered (403 otherwise), and
//!   their CORS headers.
//! - [`stop`]: cutting text exactly before a stop string.
//! - [`tools`]: tool definitions and choices, and parsing the model's tool
//!   calls back out of its text (whole or streamed) in its family's syntax
//!   (the tagged ones in `tools/tagged.rs`).
//! - [`reasoning`], [`answer`], [`harmony`]: an answer split into reasoning,
//!   text and calls (`<think>` blocks, or gpt-oss's harmony channels).
//! - [`think_budget`]: a cap on the reasoning's tokens (the engine thread
//!   writes the end of the reasoning once it is spent).
//! - [`logprobs`]: log-probabilities of sampled tokens.
//! - [`metrics`]: counters and histograms in the Prometheus text format.
//! - [`dashboard`]: the page (from `coordinator/assets/`, inside the
//!   binary), its snapshot and its live SSE feed.
//! - [`sse`]: streaming responses.
//! - [`error`]: errors in each API's JSON shape.
//!
//! Only `/`, `/assets/*` and `/health` answer without the API key (they
//! carry no data); every other route needs `Authorization: Bearer KEY` or
//! `x-api-key: KEY` when a key is set.

pub mod answer;
pub mod anthropic;
pub mod conn;
pub mod dashboard;
pub mod error;
pub mod harmony;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod origin;
pub mod queue;
pub mod reasoning;
pub mod responses;
pub mod sampling;
pub mod scheduler;
pub mod sse;
pub mod stop;
pub mod structured;
pub mod systemone;
pub mod think_budget;
pub mod tokenize;
pub mod tools;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use charm_models::ExpertService;
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use self::dashboard::Board;
use self::error::{ApiError, ErrorKind, Flavor};
use self::metrics::{Live, Metrics, Workers};
use self::queue::{Event, Job, Queue, Slot};
use self::scheduler::Shared;
use self::think_budget::ThinkBudget;
use crate::chat_template::Message;
use crate::engine::{Engine, GenerateParams, LoadInfo};
use crate::grammar::{Constraint, GrammarSpec, Grammars};
use crate::prefix_cache::{model_fingerprint, PrefixCache, PrefixError, PrefixOptions, PrefixStats};
use crate::text::{TextCodec, TextError};
use charm_models::KvCache;

/// Requests that may wait for the engine by default.
pub const DEFAULT_QUEUE_SIZE: usize = 16;
/// Largest request body by default (1 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// HTTP connections served at once by default; more are answered 503.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Time for a request head by default, in milliseconds.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Time for a request body by default, in milliseconds.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 30_000;
/// Time a kept-alive connection may sit idle (or a response stay unread)
/// by default, in milliseconds.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Most requests in one running batch when `--max-batch` is not given
/// (fewer when the KV caches of that many would not fit in memory).
pub const MAX_AUTO_BATCH: usize = 8;
/// The RAM budget of the prefix cache when none is given: an eighth of
/// the memory available at start, at most this much.
pub const MAX_AUTO_PREFIX_BYTES: u64 = 8 << 30;
/// The disk budget of a prefix cache directory by default (4 GiB).
pub const DEFAULT_PREFIX_DISK_MB: u64 = 4096;
/// Most stop strings per request (OpenAI allows 4; Anthropic documents no
/// limit).
pub const MAX_STOP_SEQUENCES: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// The worker label of `--local`: the experts run in this process.
pub const IN_PROCESS: &str = "in-process";
/// The label of cluster mode's aggregate (`worker` in the dashboard's JSON);
/// `/metrics` and the dashboard's `workers` list report each remote worker
/// under its own address.
pub const CLUSTER: &str = "cluster";

/// Flags of `serve` and `web`.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to bind. Anything but a loopback address needs --api-key-file.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// File holding the API key clients must send (`Authorization: Bearer KEY`
    /// or `x-api-key: KEY`).
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// Requests that may wait for the engine; more get 429.
    #[arg(long, default_value_t = DEFAULT_QUEUE_SIZE)]
    pub queue_size: usize,
    /// Largest request body in bytes; larger gets 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// HTTP connections served at once; more are answered 503 and closed.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// A request head must arrive within this many milliseconds of the
    /// connection (or, kept alive, of its first byte); else it is closed.
    #[arg(long, default_value_t = DEFAULT_HEADER_TIMEOUT_MS)]
    pub header_timeout_ms: u64,
    /// A request body must arrive within this many milliseconds of its head.
    #[arg(long, default_value_t = DEFAULT_BODY_TIMEOUT_MS)]
    pub body_timeout_ms: u64,
    /// Close a kept-alive connection idle this many milliseconds, or one
    /// whose client reads nothing of its response for as long.
    #[arg(long, default_value_t = DEFAULT_IDLE_TIMEOUT_MS)]
    pub idle_timeout_ms: u64,
    /// Requests generated at once (each step runs them together and reads
    /// each layer's experts once for all). Default: as many KV caches of
    /// 4096 positions as fit in a quarter of the available memory, at most 8.
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// RAM for the prefix cache in MiB: finished requests' caches, so a
    /// prompt that starts like an earlier one computes only what is new
    /// (0: off). Default: an eighth of the available memory, at most 8 GiB.
    #[arg(long)]
    pub prefix_cache_mb: Option<u64>,
    /// Also keep prefix cache entries in this directory, so a restarted
    /// server finds them.
    #[arg(long)]
    pub prefix_cache_dir: Option<PathBuf>,
    /// Disk budget of --prefix-cache-dir in MiB.
    #[arg(long, default_value_t = DEFAULT_PREFIX_DISK_MB)]
    pub prefix_cache_disk_mb: u64,
    /// Also answer web pages from this origin (`https://chat.example.com`;
    /// `*`: any; repeatable). The server's own pages and pages served from
    /// localhost are always answered; other origins get 403.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Close every chat answer's reasoning after this many tokens (the
    /// model then answers); a request's own budget
    /// (`thinking.budget_tokens`, `thinking_token_budget`) wins. Default:
    /// no cap.
    #[arg(long, value_name = "TOKENS")]
    pub reasoning_budget: Option<usize>,
}

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding elsewhere than loopback without a key would open the model
    /// to the network.
    #[error("refusing to bind {host} without --api-key-file: only loopback addresses (127.0.0.1, ::1, localhost) may be served without an API key")]
    KeyRequired { host: String },
    /// The key file could not be read or is empty.
    #[error("{}: {reason}", path.display())]
    KeyFile { path: PathBuf, reason: String },
    /// The key file is open to other users (as ssh refuses a private key).
    #[error("{}: the API key file is accessible by group or others (mode {mode:03o}); run `chmod 600 {}`", path.display(), path.display())]
    KeyFileMode { path: PathBuf, mode: u32 },
    /// `--host` does not resolve.
    #[error("--host {host}: {reason}")]
    BadHost { host: String, reason: String },
    /// The model has no tokenizer (the APIs speak text).
    #[error("{}: not found; serving needs the model's tokenizer", path.display())]
    NoTokenizer { path: PathBuf },
    /// The tokenizer or chat template is malformed.
    #[error(transparent)]
    Text(#[from] TextError),
    /// `--queue-size` is 0.
    #[error("--queue-size must be at least 1")]
    QueueSize,
    /// `--max-connections` is 0 or beyond what the server can count.
    #[error("--max-connections must be between 1 and {max}, got {got}")]
    MaxConnections { got: usize, max: usize },
    /// A connection timeout is 0.
    #[error("{flag} must be at least 1 ms")]
    Timeout { flag: &'static str },
    /// `--max-batch` is 0.
    #[error("--max-batch must be at least 1")]
    MaxBatch,
    /// A `--cors-origin` is not an origin.
    #[error("{0}")]
    CorsOrigin(String),
    /// The model file recommends sampling settings out of range.
    #[error("the model's recommended sampling settings ({settings}): {reason}")]
    SamplingDefaults { settings: String, reason: String },
    /// The prefix cache's directory cannot be used.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// Binding, or starting a thread or the runtime, failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Everything the server needs besides the engine.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Clients must send this key (None: no authentication).
    pub api_key: Option<String>,
    pub queue_size: usize,
    pub max_body_bytes: usize,
    /// HTTP connections served at once; more are answered 503.
    pub max_connections: usize,
    /// From accept (or a kept-alive request's first byte) to a complete head.
    pub header_read_timeout: Duration,
    /// From a request's head to the end of its body.
    pub body_read_timeout: Duration,
    /// A kept-alive connection idle this long is closed, and so is one
    /// whose client reads nothing of its response for as long.
    pub idle_timeout: Duration,
    /// The model directory or GGUF file (its name is the model id).
    pub model_dir: PathBuf,
    /// Who runs the experts: `in-process` (`--local`) or `cluster`.
    pub worker: String,
    /// Requests generated at once (None: from the memory available).
    pub max_batch: Option<usize>,
    /// RAM budget of the prefix cache in bytes (None: from the memory
    /// available; 0: off).
    pub prefix_cache_bytes: Option<u64>,
    /// Where prefix cache entries persist, if anywhere.
    pub prefix_cache_dir: Option<PathBuf>,
    /// Byte budget of `prefix_cache_dir`.
    pub prefix_cache_disk_bytes: u64,
    /// Origins trusted besides the server's own and loopback's.
    pub origins: origin::Origins,
    /// A chat template file used instead of the model's (`--chat-template`).
    pub chat_template: Option<PathBuf>,
    /// The reasoning budget of requests that set none (`--reasoning-budget`).
    pub reasoning_budget: Option<usize>,
}

impl ServerConfig {
    /// Defaults for `model_dir`: 127.0.0.1, a free port, no key.
    pub fn new(model_dir: &Path) -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 0,
            api_key: None,
            queue_size: DEFAULT_QUEUE_SIZE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: Duration::from_millis(DEFAULT_HEADER_TIMEOUT_MS),
            body_read_timeout: Duration::from_millis(DEFAULT_BODY_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            model_dir: model_dir.to_path_buf(),
            worker: IN_PROCESS.into(),
            max_batch: None,
            prefix_cache_bytes: None,
            prefix_cache_dir: None,
            prefix_cache_disk_bytes: DEFAULT_PREFIX_DISK_MB << 20,
            origins: origin::Origins::default(),
            chat_template: None,
            reasoning_budget: None,
        }
    }

    /// From the command line (reads the key file); `local`: the experts run
    /// in this process.
    pub fn from_args(model_dir: &Path, args: &ServeArgs, local: bool) -> Result<Self, ServeError> {
        let api_key = match &args.api_key_file {
            None => None,
            Some(path) => Some(read_key_file(path)?),
        };
        let ms = |flag: &'static str, v: u64| {
            if v == 0 {
                Err(ServeError::Timeout { flag })
            } else {
                Ok(Duration::from_millis(v))
            }
        };
        Ok(ServerConfig {
            host: args.host.clone(),
            port: args.port,
            api_key,
            queue_size: args.queue_size,
            max_body_bytes: args.max_body_bytes,
            max_connections: args.max_connections,
            header_read_timeout: ms("--header-timeout-ms", args.header_timeout_ms)?,
            body_read_timeout: ms("--body-timeout-ms", args.body_timeout_ms)?,
            idle_timeout: ms("--idle-timeout-ms", args.idle_timeout_ms)?,
            model_dir: model_dir.to_path_buf(),
            worker: if local { IN_PROCESS } else { CLUSTER }.into(),
            max_batch: args.max_batch,
            prefix_cache_bytes: args.prefix_cache_mb.map(|mb| mb.saturating_mul(1 << 20)),
            prefix_cache_dir: args.prefix_cache_dir.clone(),
            prefix_cache_disk_bytes: args.prefix_cache_disk_mb.saturating_mul(1 << 20),
            origins: origin::Origins::parse(&args.cors_origins).map_err(ServeError::CorsOrigin)?,
            chat_template: None,
            reasoning_budget: args.reasoning_budget,
        })
    }

    fn limits(&self) -> conn::Limits {
        conn::Limits {
            max_connections: self.max_connections,
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// Memory the OS can give now (8 GiB when it cannot say).
fn available_memory() -> u64 {
    charm_worker::sysmem::available_memory().unwrap_or(8 << 30)
}

/// Requests generated at once by default: as many sequence caches of
/// 4096 positions (or the model's context, when shorter) as fit in a
/// quarter of `available` bytes, between 1 and [`MAX_AUTO_BATCH`].
fn auto_max_batch(fresh: &KvCache, engine: &Engine, available: u64) -> usize {
    let positions = engine.config().max_position_embeddings.min(4096) as u64;
    let per_seq =
        (fresh.bytes_per_position() as u64 * positions + fresh.bytes() as u64 + fresh.sliding_bytes() as u64).max(1);
    ((available / 4) / per_seq).clamp(1, MAX_AUTO_BATCH as u64) as usize
}

/// The key in `path`, trimmed. Refuses a file that group or others may
/// read or write (Unix), and an empty key.
pub fn read_key_file(path: &Path) -> Result<String, ServeError> {
    use std::io::Read;
    let fail = |e: std::io::Error| ServeError::KeyFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut file = std::fs::File::open(path).map_err(fail)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file.metadata().map_err(fail)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(ServeError::KeyFileMode {
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(fail)?;
    let key = text.trim();
    if key.is_empty() {
        return Err(ServeError::KeyFile {
            path: path.to_path_buf(),
            reason: "the key file is empty".into(),
        });
    }
    Ok(key.to_string())
}

/// What the API and the dashboard say about the model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelInfo {
    /// The model directory's name.
    pub id: String,
    /// The directory as given, and canonicalized (both accepted as `model`).
    pub path: String,
    #[serde(skip)]
    canonical: Option<PathBuf>,
    pub family: &'static str,
    pub layers: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    pub top_k: usize,
    pub vocab: usize,
    pub moe_layers: Vec<bool>,
    pub context: usize,
    /// Where the routed experts live: `ram` (memory-mapped Hugging Face
    /// files), `disk` (a container streamed through the RAM cache) or
    /// `remote` (cluster workers).
    pub placement: &'static str,
    /// RAM budget of the expert cache (containers only).
    pub cache_budget_bytes: Option<u64>,
    pub created: u64,
    /// The ids that end an answer.
    #[serde(skip)]
    pub eos_token_ids: Vec<u32>,
    /// The model's recommended sampling settings (for omitted fields).
    #[serde(skip)]
    pub sampling: charm_models::SamplingDefaults,
}

impl ModelInfo {
    fn new(engine: &Engine, info: &LoadInfo, dir: &Path, worker: &str) -> Self {
        let cfg = engine.config();
        let full = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        // A directory's name, or a GGUF file's name without `.gguf`.
        let name = if full.is_file() {
            full.file_stem()
        } else {
            full.file_name()
        };
        let id = name.map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        ModelInfo {
            id,
            path: dir.display().to_string(),
            canonical: dir.canonicalize().ok(),
            family: cfg.family.architecture(),
            layers: cfg.num_layers,
            experts: cfg.num_experts,
            top_k: cfg.top_k,
            vocab: cfg.vocab_size,
            moe_layers: cfg.moe_layers.clone(),
            context: cfg.max_position_embeddings,
            placement: match (worker, info.container) {
                (IN_PROCESS, true) => "disk",
                (IN_PROCESS, false) => "ram",
                _ => "remote",
            },
            cache_budget_bytes: info.container.then_some(info.cache_bytes),
            created: unix_now(),
            eos_token_ids: cfg.eos_token_ids.clone(),
            sampling: cfg.sampling.clone(),
        }
    }

    /// Routed experts over all MoE layers (all owned by the one worker).
    pub fn routed_experts(&self) -> usize {
        self.moe_layers.iter().filter(|m| **m).count() * self.experts
    }

    /// Whether `name` names this model: its id, its path as given, or the
    /// same directory by another path.
    pub fn matches(&self, name: &str) -> bool {
        if name == self.id || name == self.path {
            return true;
        }
        let p = Path::new(name);
        p.is_absolute()
            && p.canonicalize()
                .ok()
                .is_some_and(|c| Some(&c) == self.canonical.as_ref())
    }
}

/// State shared by every handler.
pub struct AppState {
    pub config: ServerConfig,
    pub model: ModelInfo,
    pub codec: Arc<TextCodec>,
    pub queue: Queue,
    /// Requests generated at once.
    pub max_batch: usize,
    /// The prefix cache's counters, as the engine thread last left them.
    pub prefix: Arc<Mutex<PrefixStats>>,
    pub metrics: Arc<Metrics>,
    pub board: Arc<Board>,
    pub experts: Arc<dyn ExpertService>,
    pub started: Instant,
    /// The grammar compiler, built on the first constrained request (a
    /// large vocabulary's trie takes a moment); the error says why the
    /// tokenizer cannot be used.
    pub grammars: std::sync::OnceLock<Result<Arc<Grammars>, String>>,
    /// Responses API answers kept for `previous_response_id`.
    pub responses: responses::Store,
}

/// A running server: its address, and a handle that stops it when dropped.
pub struct Server {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Ends once the HTTP side is gone and the running requests have left
    /// (their clients are gone too), after the prefix cache's last write.
    engine: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Binds `config.host:config.port` and serves `engine` on a background
    /// thread. Refuses a non-loopback address without an API key.
    pub fn start(mut engine: Engine, info: &LoadInfo, config: ServerConfig) -> Result<Server, ServeError> {
        if config.queue_size == 0 {
            return Err(ServeError::QueueSize);
        }
        if config.max_batch == Some(0) {
            return Err(ServeError::MaxBatch);
        }
        let max = tokio::sync::Semaphore::MAX_PERMITS;
        if config.max_connections == 0 || config.max_connections > max {
            return Err(ServeError::MaxConnections {
                got: config.max_connections,
                max,
            });
        }
        for (flag, t) in [
            ("--header-timeout-ms", config.header_read_timeout),
            ("--body-timeout-ms", config.body_read_timeout),
            ("--idle-timeout-ms", config.idle_timeout),
        ] {
            if t.is_zero() {
                return Err(ServeError::Timeout { flag });
            }
        }
        let addrs = resolve(&config.host, config.port)?;
        if config.api_key.is_none() && addrs.iter().any(|a| !a.ip().is_loopback()) {
            return Err(ServeError::KeyRequired {
                host: config.host.clone(),
            });
        }
        let codec = match TextCodec::for_model_with(&config.model_dir, config.chat_template.as_deref()) {
            Err(TextError::NoTokenizer { path }) => return Err(ServeError::NoTokenizer { path }),
            r => Arc::new(r?),
        };
        let listener = std::net::TcpListener::bind(&addrs[..]).map_err(|e| ServeError::Io {
            what: format!("binding {}:{}", config.host, config.port),
            source: e,
        })?;
        let addr = listener.local_addr().map_err(|e| io("reading the bound address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("configuring the socket", e))?;

        let model = ModelInfo::new(&engine, info, &config.model_dir, &config.worker);
        if let Err(e) = sampling::SamplingFields::default().resolve(&model.sampling, model.vocab, 0) {
            return Err(ServeError::SamplingDefaults {
                settings: model.sampling.describe(),
                reason: e.message,
            });
        }
        let board = Arc::new(Board::new(model.layers, model.experts));
        engine.set_observer(board.clone());
        let experts = engine.expert_service().clone();
        let metrics = Arc::new(Metrics::default());
        let fresh = engine.model.new_cache();
        let available = available_memory();
        let max_batch = config
            .max_batch
            .unwrap_or_else(|| auto_max_batch(&fresh, &engine, available));
        let prefix = PrefixCache::new(
            &PrefixOptions {
                ram_bytes: config
                    .prefix_cache_bytes
                    .unwrap_or_else(|| (available / 8).min(MAX_AUTO_PREFIX_BYTES)),
                dir: config.prefix_cache_dir.clone(),
                disk_bytes: config.prefix_cache_disk_bytes,
                vocab: engine.config().vocab_size,
            },
            fresh.clone(),
            &model_fingerprint(&config.model_dir, &fresh),
        )?;
        let prefix_stats = Arc::new(Mutex::new(prefix.stats()));
        let shared = Shared {
            codec: codec.clone(),
            metrics: metrics.clone(),
            board: board.clone(),
            running: Arc::new(AtomicUsize::new(0)),
            prefix: prefix_stats.clone(),
        };
        let (queue, engine_thread) = Queue::start(engine, shared, config.queue_size, max_batch, prefix)
            .map_err(|e| io("starting the engine thread", e))?;
        let state = Arc::new(AppState {
            config,
            model,
            codec,
            queue,
            max_batch,
            prefix: prefix_stats,
            metrics,
            board,
            experts,
            started: Instant::now(),
            grammars: std::sync::OnceLock::new(),
            responses: responses::Store::default(),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("charm-http")
            .enable_all()
            .build()
            .map_err(|e| io("starting the HTTP runtime", e))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("charm-serve".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("serving: {e}");
                            return;
                        }
                    };
                    let limits = state.config.limits();
                    let app = router(state);
                    tokio::select! {
                        _ = conn::serve(listener, app, limits) => {}
                        _ = rx => {}
                    }
                });
                // Open streams end here; their jobs see closed channels and stop.
                runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            })
            .map_err(|e| io("starting the server thread", e))?;
        Ok(Server {
            addr,
            shutdown: Some(tx),
            thread: Some(thread),
            engine: Some(engine_thread),
        })
    }

    /// The bound address (the real port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Blocks until the server stops (it runs until the process ends).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.engine.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.engine.take() {
            let _ = t.join();
        }
    }
}

fn io(what: &str, source: std::io::Error) -> ServeError {
    ServeError::Io {
        what: what.into(),
        source,
    }
}

fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, ServeError> {
    let bad = |reason: String| ServeError::BadHost {
        host: host.into(),
        reason,
    };
    // A bare IPv6 address needs no brackets on the command line.
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => (host, port)
            .to_socket_addrs()
            .map_err(|e| bad(e.to_string()))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(bad("resolves to no address".into()));
    }
    Ok(addrs)
}

/// `serve` / `web` from the command line: start, print the address, open
/// the browser for `web`, serve until the process is stopped.
pub fn run_cli(
    engine: Engine,
    info: &LoadInfo,
    dir: &Path,
    chat_template: Option<&Path>,
    args: &ServeArgs,
    local: bool,
    open: bool,
) -> Result<(), ServeError> {
    let mut config = ServerConfig::from_args(dir, args, local)?;
    config.chat_template = chat_template.map(Path::to_path_buf);
    let defaults = engine.config().sampling.clone();
    let server = Server::start(engine, info, config)?;
    let url = server.url();
    eprintln!("listening on {url} (dashboard {url}/, OpenAI and Anthropic APIs under {url}/v1)");
    if !defaults.is_empty() {
        eprintln!(
            "sampling defaults from the model, for requests that leave them out: {}",
            defaults.describe()
        );
    }
    if open {
        open_browser(&url);
    }
    server.wait();
    Ok(())
}

/// Opens `url` with the desktop's opener; prints the URL when that fails.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    let spawned = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match spawned {
        Ok(mut child) => {
            let url = url.to_string();
            std::thread::spawn(move || {
                if !child.wait().is_ok_and(|s| s.success()) {
                    eprintln!("could not open a browser ({opener} failed); open {url} yourself");
                }
            });
        }
        Err(e) => eprintln!("could not open a browser ({opener}: {e}); open {url} yourself"),
    }
}

fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    Router::new()
        .route("/", get(dashboard::index))
        .route("/assets/dashboard.js", get(dashboard::script))
        .route("/assets/dashboard.css", get(dashboard::style))
        .route("/health", get(health))
        .route("/metrics", get(prometheus))
        .route("/api/state", get(dashboard::state))
        .route("/api/events", get(dashboard::events))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/systemone", post(systemone::decide))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Routes answered without the API key.
fn is_public(path: &str) -> bool {
    path == "/" || path == "/health" || path.starts_with("/assets/")
}

/// The route label of a path for `charm_http_requests_total` (never the raw
/// path, so the label set stays bounded).
fn route_label(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/health" => "/health",
        "/metrics" => "/metrics",
        "/api/state" => "/api/state",
        "/api/events" => "/api/events",
        "/v1/models" => "/v1/models",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/messages" => "/v1/messages",
        "/v1/messages/count_tokens" => "/v1/messages/count_tokens",
        "/v1/responses" => "/v1/responses",
        "/v1/systemone" => "/v1/systemone",
        "/tokenize" => "/tokenize",
        "/detokenize" => "/detokenize",
        p if p.starts_with("/v1/responses/") => "/v1/responses/{id}",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        p if p.starts_with("/assets/") => "/assets",
        _ => "other",
    }
}

/// Web pages' origins ([`origin`]), authentication and request counting,
/// around every route.
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let origin = origin::origin_of(req.headers());
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(o) = &origin {
        let resp = if !st.config.origins.allows(o, host) {
            Some(
                ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "requests from web pages at {o} are not accepted; start the server with --cors-origin {o} to allow them"
                    ),
                )
                .flavor(Flavor::for_path(&path))
                .into_response(),
            )
        } else if origin::is_preflight(req.method(), req.headers()) {
            Some(origin::preflight(o, req.headers()))
        } else {
            None
        };
        if let Some(resp) = resp {
            st.metrics.http(route_label(&path), resp.status().as_u16());
            return resp;
        }
    }
    let mut resp = match &st.config.api_key {
        Some(key) if !is_public(&path) && !authorized(req.headers(), key) => {
            let (kind, msg) = (
                ErrorKind::Authentication,
                "missing or wrong API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
            );
            ApiError::new(kind, msg).flavor(Flavor::for_path(&path)).into_response()
        }
        _ => next.run(req).await,
    };
    if let Some(o) = &origin {
        origin::allow(resp.headers_mut(), o);
    }
    st.metrics.http(route_label(&path), resp.status().as_u16());
    resp
}

/// Whether the headers carry `key` (compared in constant time, whatever
/// either length).
fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
    [bearer, x_api_key]
        .into_iter()
        .flatten()
        .any(|k| same_key(k.as_bytes(), key.as_bytes()))
}

/// Whether `a` and `b` are equal, in time that depends on neither their
/// contents nor their lengths: their SHA-256 digests are compared in
/// constant time (equal digests: equal keys).
fn same_key(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.as_slice().ct_eq(b.as_slice()).into()
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::new(ErrorKind::NotFound, format!("no route {} {path}", req.method()))
        .flavor(Flavor::for_path(path))
        .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path();
    ApiError::new(
        ErrorKind::MethodNotAllowed,
        format!("{} is not allowed on {path}", req.method()),
    )
    .flavor(Flavor::for_path(path))
    .into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "model": st.model.id,
            "queued": st.queue.queued(),
            "running": st.queue.running(),
            "max_batch": st.max_batch,
        }),
    )
}

async fn prometheus(State(st): State<Arc<AppState>>) -> Response {
    let experts = st.experts.stats();
    let workers = if st.config.worker == IN_PROCESS {
        Workers::InProcess {
            experts: st.model.routed_experts(),
            wait_s: st.metrics.experts_wait_s(),
        }
    } else {
        Workers::Remote(&experts.workers)
    };
    let prefix = st.prefix.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let text = st.metrics.render(&Live {
        queued: st.queue.queued(),
        running: st.queue.running(),
        max_batch: st.max_batch,
        prefix: &prefix,
        experts: &experts,
        workers,
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}

/// OpenAI's model object, with the context length under the names vLLM
/// (`max_model_len`) and OpenRouter-style clients (`context_length`) read.
fn model_object(m: &ModelInfo) -> serde_json::Value {
    json!({"id": m.id, "object": "model", "created": m.created, "owned_by": "charm",
           "max_model_len": m.context, "context_length": m.context})
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model_object(&st.model)]}),
    )
}

async fn model(State(st): State<Arc<AppState>>, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    if st.model.matches(&id) {
        json_response(StatusCode::OK, &model_object(&st.model))
    } else {
        unknown_model(&st.model, &id).into_response()
    }
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes());
    let mut resp = (status, bytes).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn unknown_model(m: &ModelInfo, name: &str) -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        format!("model {name:?} is not served here; this server serves {:?}", m.id),
    )
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The tool-call syntax for the model's chat template: its own where charm
/// knows it, else the generic shape; `None` without a chat template.
fn tool_syntax(st: &AppState) -> Option<tools::ToolSyntax> {
    st.codec.template().map(|t| tools::ToolSyntax::for_template(t.source()))
}

/// Whether the model's chat template speaks harmony (gpt-oss): its chat
/// answers are decoded with their channel markers and split by channel.
pub(crate) fn speaks_harmony(st: &AppState) -> bool {
    st.codec.template().is_some_and(|t| harmony::is_harmony(t.source()))
}

/// A random id with `prefix` (`chatcmpl-…`, `msg_…`).
fn new_id(prefix: &str) -> String {
    format!("{prefix}{:024x}", rand::random::<u128>() >> 32)
}

/// The body as JSON of type `T`: 413 over the limit, 400 when malformed.
fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
    max: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorKind::TooLarge,
                format!("the request body is over the limit of {max} bytes"),
            )
        } else {
            ApiError::invalid(format!("reading the request body: {e}"))
        }
    })?;
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&bytes)).map_err(body_error)
}

/// A body's JSON already read, as `T` (errors as [`parse_body`]'s).
fn parse_value<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(body_error)
}

/// The error names the field at fault (`messages[0].content`) where the
/// JSON is well-formed but a value has the wrong shape.
fn body_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    match path.as_str() {
        "." | "" => ApiError::invalid(format!("invalid JSON body: {}", e.inner())),
        _ => ApiError::invalid(format!("invalid JSON body: {path}: {}", e.inner())),
    }
}

/// What both APIs ask of the engine, before tokenization.
pub(crate) struct Ask {
    pub api: &'static str,
    pub id: String,
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub max_tokens: Option<u64>,
    /// The length field's name in this API (`max_tokens`, `max_output_tokens`).
    pub max_tokens_param: &'static str,
    pub sampling: sampling::SamplingFields,
    /// Generate `max_tokens` whatever end-of-sequence tokens come (an
    /// extension of the OpenAI routes, for benchmarks).
    pub ignore_eos: bool,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// The stop field's name in this API (`stop`, `stop_sequences`).
    pub stop_param: &'static str,
    pub logprobs: Option<usize>,
    /// Tools for the chat template (`tools=`; empty: not passed).
    pub tools: Vec<serde_json::Value>,
    /// Further template variables (`enable_thinking`, a request's
    /// `chat_template_kwargs`).
    pub template_kwargs: Vec<(String, serde_json::Value)>,
    /// Text appended after the assistant prompt (a forced tool call's start).
    pub prefill: String,
    /// What the answer is constrained to (`grammar_param`: the field that
    /// asked, for errors).
    pub grammar: Option<(GrammarSpec, &'static str)>,
    /// The most tokens the answer's reasoning may take ([`think_budget`]).
    pub think_budget: Option<usize>,
}

/// A prompt as the client gave it.
pub(crate) enum PromptInput {
    /// Messages through the chat template, assistant prompt appended.
    Chat(Vec<Message>),
    /// Raw text, tokenized with the tokenizer's special tokens.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// A queued job's event stream, with what the handler needs to answer.
pub(crate) struct Ticket {
    pub events: mpsc::UnboundedReceiver<Event>,
    pub prompt_tokens: usize,
    pub created: u64,
    /// The rendered prompt left a `<think>` block open.
    pub opens_reasoning: bool,
}

/// How a chat answer splits: by harmony channels, or at `<think>` blocks
/// ([`thinking`]), with `tools`' calls parsed out.
pub(crate) fn answer_shape(st: &AppState, ticket: &Ticket, tools: Option<tools::ToolPlan>) -> answer::Shape {
    answer::Shape {
        think: thinking(st, ticket),
        harmony: speaks_harmony(st),
        tools,
    }
}

/// How a chat answer's reasoning splits: `None` when the model's template
/// writes no `<think>` blocks, else whether the answer starts inside one.
pub(crate) fn thinking(st: &AppState, ticket: &Ticket) -> Option<bool> {
    st.codec
        .template()
        .is_some_and(|t| reasoning::template_thinks(t.source()))
        .then_some(ticket.opens_reasoning)
}

/// Checks the model and the fields, reserves a place in the queue (429 when
/// full, before any tokenizing), tokenizes (off the async threads) and
/// queues. 400/404/429 come back as errors.
pub(crate) async fn submit(st: &Arc<AppState>, ask: Ask) -> Result<Ticket, ApiError> {
    check_target(st, ask.model.as_deref(), &ask.prompt)?;
    check_stops(&ask.stop, ask.stop_param)?;
    if ask.max_tokens == Some(0) {
        let name = ask.max_tokens_param;
        return Err(ApiError::invalid_param(name, format!("{name} must be at least 1")));
    }
    let sampling = ask.sampling.resolve(
        &st.model.sampling,
        st.model.vocab,
        ask.seed.unwrap_or_else(rand::random),
    )?;
    // The place is held while the prompt is tokenized: a full queue costs
    // no tokenizing, and a request that got this far is never refused after.
    let slot = reserve(st)?;
    let chat = matches!(ask.prompt, PromptInput::Chat(_));
    // A forced call's prefill starts the answer after any block the
    // template opened: the answer is the call, not reasoning.
    let prefilled = !ask.prefill.is_empty();
    let prompt = prompt_ids(st, ask.prompt, ask.tools, ask.prefill, ask.template_kwargs).await?;
    // Harmony's channels and Kimi K2's call markers are special tokens.
    let keep_special = chat && tool_syntax(st).is_some_and(tools::ToolSyntax::keeps_special_tokens);
    let opens_reasoning = chat && !prefilled && reasoning::prompt_opens_inside(&st.codec, &prompt);
    // A harmony chat answer (gpt-oss) is held to the request's grammar
    // in its final message, after any reasoning: the frame around it is
    // harmony's. (A forced call's prefill has already begun its message.)
    let harmony_chat = chat && !prefilled && speaks_harmony(st);
    let constraint = match ask.grammar {
        None => None,
        Some((spec, param)) if harmony_chat => Some(constrain(st, harmony::final_answer(spec), param).await?),
        Some((spec, param)) => Some(constrain(st, spec, param).await?),
    };
    // A grammar asked of an answer whose prompt opened the reasoning
    // (Qwen3.5's template, thinking on) waits for the reasoning to end:
    // from the first token it would hold the reasoning to the grammar and
    // leave the answer empty. The reasoning is then watched even without
    // a budget.
    let grammar_after_reasoning = constraint.is_some() && opens_reasoning;
    let budget = ask
        .think_budget
        .or(st.config.reasoning_budget)
        .or(grammar_after_reasoning.then_some(usize::MAX));
    let think_budget = match budget {
        Some(budget) if chat => budget_for(st, budget, opens_reasoning)?,
        _ => None,
    };
    let context = st.model.context;
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty (no tokens)"));
    }
    if prompt.len() >= context {
        return Err(ApiError::invalid(format!(
            "the prompt has {} tokens; this model's context is {context} tokens",
            prompt.len()
        )));
    }
    let max_tokens = match ask.max_tokens {
        Some(n) => n.min((context - prompt.len()) as u64) as usize,
        None => context - prompt.len(),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_tokens = prompt.len();
    slot.send(Job {
        id: ask.id,
        api: ask.api,
        prompt,
        params: GenerateParams {
            max_tokens,
            sampling,
            ignore_eos: ask.ignore_eos,
        },
        stop: ask.stop,
        logprobs: ask.logprobs,
        constraint,
        think_budget,
        grammar_after_reasoning,
        keep_special,
        score: None,
        events: tx,
        arrived: Instant::now(),
    });
    Ok(Ticket {
        events: rx,
        prompt_tokens,
        created: unix_now(),
        opens_reasoning,
    })
}

/// A chat answer's reasoning cap ([`ThinkBudget::for_template`]).
fn budget_for(st: &AppState, budget: usize, inside: bool) -> Result<Option<ThinkBudget>, ApiError> {
    let Some(source) = st.codec.template().map(|t| t.source()) else {
        return Ok(None);
    };
    ThinkBudget::for_template(source, budget, inside, &st.codec)
        .map_err(|e| ApiError::new(ErrorKind::Server, format!("tokenizing the end of the reasoning: {e}")))
}

/// The request names this server's model (or none), and chat messages
/// have a chat template to go through.
pub(crate) fn check_target(st: &AppState, model: Option<&str>, prompt: &PromptInput) -> Result<(), ApiError> {
    if let Some(name) = model {
        if !st.model.matches(name) {
            return Err(unknown_model(&st.model, name));
        }
    }
    if matches!(prompt, PromptInput::Chat(_)) && !st.codec.has_template() {
        return Err(ApiError::invalid(
            "this model has no chat template; use /v1/completions with a prompt",
        ));
    }
    Ok(())
}

/// A prompt's token ids: chat messages through the chat template (with
/// `tools`, the template variables and the assistant-side `prefill`), text
/// through the tokenizer (off the async threads).
pub(crate) async fn prompt_ids(
    st: &Arc<AppState>,
    prompt: PromptInput,
    tools: Vec<serde_json::Value>,
    prefill: String,
    kwargs: Vec<(String, serde_json::Value)>,
) -> Result<Vec<u32>, ApiError> {
    let codec = st.codec.clone();
    match prompt {
        PromptInput::Ids(ids) => Ok(ids),
        PromptInput::Text(text) => tokenize(codec, move |c| c.encode(&text)).await,
        PromptInput::Chat(messages) => {
            tokenize(codec, move |c| {
                let mut extra: Vec<(&str, minijinja::Value)> = kwargs
                    .iter()
                    .map(|(k, v)| (k.as_str(), minijinja::Value::from_serialize(v)))
                    .collect();
                if !tools.is_empty() {
                    extra.push(("tools", minijinja::Value::from_serialize(&tools)));
                }
                c.encode_chat_prefilled(&messages, true, &extra, &prefill)
            })
            .await
        }
    }
}

/// The model's grammar compiler, built once (off the async threads).
pub(crate) async fn grammars(st: &Arc<AppState>) -> Result<Arc<Grammars>, ApiError> {
    if let Some(g) = st.grammars.get() {
        return g.clone().map_err(ApiError::invalid);
    }
    let s = st.clone();
    let built = tokio::task::spawn_blocking(move || {
        s.grammars
            .get_or_init(|| {
                Grammars::new(&s.codec, s.model.vocab, &s.model.eos_token_ids)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Server, format!("building the grammar compiler: {e}")))?;
    built.map_err(ApiError::invalid)
}

/// `spec` compiled for one answer (400 naming `param` when it does not
/// compile).
async fn constrain(st: &Arc<AppState>, spec: GrammarSpec, param: &'static str) -> Result<Constraint, ApiError> {
    let g = grammars(st).await?;
    tokio::task::spawn_blocking(move || g.compile(&spec))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Server, format!("compiling the grammar: {e}")))?
        .map_err(|e| ApiError::invalid_param(param, e.to_string()))
}

/// A place in the queue, or 429 with `Retry-After`.
fn reserve(st: &AppState) -> Result<Slot, ApiError> {
    st.queue.reserve().map_err(|_| {
        let mut e = ApiError::new(
            ErrorKind::RateLimit,
            format!(
                "the queue is full ({} requests waiting); retry later",
                st.queue.capacity()
            ),
        );
        e.retry_after = Some(retry_after(st));
        e
    })
}

/// At most [`MAX_STOP_SEQUENCES`] stop strings of at most
/// [`MAX_STOP_BYTES`] bytes each (`param`: the field's name).
fn check_stops(stops: &[String], param: &'static str) -> Result<(), ApiError> {
    if stops.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "{param} has {} entries; at most {MAX_STOP_SEQUENCES} are allowed",
                stops.len()
            ),
        ));
    }
    if let Some((i, s)) = stops.iter().enumerate().find(|(_, s)| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "{param}[{i}] is {} bytes long; each may be at most {MAX_STOP_BYTES} bytes",
                s.len()
            ),
        ));
    }
    Ok(())
}

/// Seconds until a queue slot is likely free: a slot frees when the
/// running request ends, so the mean duration of recent requests (at least 1).
fn retry_after(st: &AppState) -> u64 {
    st.board.mean_duration_s().unwrap_or(1.0).ceil().max(1.0) as u64
}

async fn tokenize(
    codec: Arc<TextCodec>,
    f: impl FnOnce(&TextCodec) -> Result<Vec<u32>, TextError> + Send + 'static,
) -> Result<Vec<u32>, ApiError> {
    match tokio::task::spawn_blocking(move || f(&codec)).await {
        Ok(Ok(ids)) => Ok(ids),
        Ok(Err(TextError::Template(e))) => Err(ApiError::invalid(e.to_string())),
        Ok(Err(e)) => Err(ApiError::new(ErrorKind::Server, e.to_string())),
        Err(e) => Err(ApiError::new(ErrorKind::Server, format!("tokenizing: {e}"))),
    }
}

/// A stop field: a string or a list of strings.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub(crate) enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// What the handlers' tests share: a job's event stream made by hand (the
/// model's text without a model), a runtime, and reading responses back.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::engine::FinishReason;
    use queue::Summary;

    /// A ticket whose engine "generated" `pieces`, then ended with `finish`.
    pub fn ticket(pieces: &[&str], finish: FinishReason) -> Ticket {
        let (tx, rx) = mpsc::unbounded_channel();
        for p in pieces {
            tx.send(Event::Delta {
                text: p.to_string(),
                tokens: Vec::new(),
            })
            .unwrap();
        }
        tx.send(Event::Done(Box::new(Summary {
            finish,
            stop_sequence: None,
            prompt_tokens: 5,
            cached_tokens: 0,
            completion_tokens: pieces.len(),
            stats: Default::default(),
        })))
        .unwrap();
        Ticket {
            events: rx,
            prompt_tokens: 5,
            created: 0,
            opens_reasoning: false,
        }
    }

    /// Runs `f` on a one-thread runtime (spawned stream writers included).
    pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// The whole body of `resp` as text.
    pub async fn body(resp: Response) -> String {
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// SSE frames: (event name, data as JSON; `[DONE]` as a JSON string).
    pub fn sse(body: &str) -> Vec<(Option<String>, serde_json::Value)> {
        body.split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let mut name = None;
                let mut data = String::new();
                for line in f.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        name = Some(e.to_string());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                let v = serde_json::from_str(&data).unwrap_or(serde_json::Value::String(data));
                (name, v)
            })
            .collect()
    }

    /// A text codec over a one-word tokenizer (the handlers only need one
    /// for log-probabilities).
    pub fn codec() -> Arc<TextCodec> {
        let dir = tempfile::tempdir().unwrap();
        let tok = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}
        });
        std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
        Arc::new(TextCodec::load(dir.path()).unwrap())
    }

    /// Tools `names` offered with `choice` (Hermes syntax).
    pub fn plan(names: &[&str], choice: tools::Choice) -> tools::ToolPlan {
        let defs = names
            .iter()
            .map(|n| tools::ToolDef {
                name: n.to_string(),
                description: None,
                parameters: Some(json!({"type": "object"})),
            })
            .collect();
        tools::plan(Some(tools::ToolSyntax::Hermes), defs, choice, "tools", "tool_choice")
            .unwrap()
            .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_needs_the_whole_key_and_nothing_more() {
        assert!(same_key(b"sekrit-key", b"sekrit-key"));
        for other in [
            &b""[..],
            b"s",
            b"sekrit-ke",
            b"sekrit-key2",
            b"sekrit-kez",
            b"SEKRIT-KEY",
        ] {
            assert!(!same_key(other, b"sekrit-key"), "{other:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn key_file_open_to_others_or_empty_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.key");
        let write = |text: &str, mode: u32| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("k-1\n", 0o600);
        assert_eq!(read_key_file(&path).unwrap(), "k-1");
        write("k-1\n", 0o400);
        assert_eq!(read_key_file(&path).unwrap(), "k-1");
        for mode in [0o644, 0o640, 0o604, 0o660, 0o602] {
            write("k-1\n", mode);
            match read_key_file(&path) {
                Err(e @ ServeError::KeyFileMode { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains(&format!("chmod 600 {}", path.display())), "{msg}");
                    assert!(msg.contains(&format!("{mode:03o}")), "{msg}");
                }
                other => panic!("mode {mode:o}: {other:?}"),
            }
        }
        write(" \n", 0o600);
        assert!(matches!(read_key_file(&path), Err(ServeError::KeyFile { .. })));
    }
}
