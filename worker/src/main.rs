//! The `worker` binary: serves this machine's copy of a model's experts to
//! coordinators over QUIC. Parses flags, starts the server
//! ([`charm_worker::server::run`]), prints one clear line on error.
//!
//! ```text
//! worker --model DIR --cluster-key-file F [--listen ADDR:PORT] [--expert-cache-gb X]
//!        [--no-mdns] [--mdns-loopback] [--max-connections N] [--state-dir D] [--threads N]
//! ```
//!
//! The first line on stdout is `listening on ADDR:PORT` (the real port when
//! `--listen` asked for port 0); the log goes to stderr (`RUST_LOG` sets
//! the level, `info` by default).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use charm_worker::io::{Backend, ReaderOptions};
use charm_worker::net::handshake::short;
use charm_worker::net::mdns::Advertisement;
use charm_worker::net::served::{ServeOptions, Served};
use charm_worker::net::{tls, ClusterKey};
use charm_worker::server::{self, ServerOptions};
use clap::Parser;

/// charm worker: serves a model's routed experts to coordinators.
#[derive(Debug, Parser)]
#[command(name = "worker", version, about)]
struct Cli {
    /// Model directory: a Hugging Face directory or a charm container
    /// (full, or a partial one listing only some experts).
    #[arg(long)]
    model: PathBuf,
    /// Cluster key file (from `coordinator keygen`); coordinators must hold the same key.
    #[arg(long)]
    cluster_key_file: PathBuf,
    /// Address and UDP port to listen on.
    #[arg(long, default_value = "0.0.0.0:7411")]
    listen: SocketAddr,
    /// RAM budget for a container's cached experts, in GiB (default: free
    /// memory less a tenth).
    #[arg(long)]
    expert_cache_gb: Option<f64>,
    /// Do not advertise this worker with mDNS.
    #[arg(long)]
    no_mdns: bool,
    /// Advertise on the loopback interface only (single-machine trials, tests).
    #[arg(long)]
    mdns_loopback: bool,
    /// Coordinators served at once.
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Where the routing history is kept (default: <model>/state when writable).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Compute threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Do not read the predicted next layer's experts ahead (containers).
    #[arg(long)]
    no_prefetch: bool,
    /// Read a container's experts with O_DIRECT, bypassing the page cache.
    #[arg(long)]
    direct_io: bool,
    /// Disk reader: auto (io_uring on Linux when available), io-uring, pread.
    #[arg(long, value_enum, default_value_t = IoChoice::Auto)]
    io: IoChoice,
}

/// `--io` choices (as `coordinator --io`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum IoChoice {
    Auto,
    IoUring,
    Pread,
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {}", charm_common::error::one_line(e.chain()));
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .try_init();
    if let Some(n) = cli.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .context("setting up compute threads")?;
    }
    if !cli.model.is_dir() {
        bail!("{}: model directory not found", cli.model.display());
    }
    let cache_bytes = match cli.expert_cache_gb {
        None => None,
        Some(gb) if gb.is_finite() && gb >= 0.0 => Some((gb * (1u64 << 30) as f64) as u64),
        Some(gb) => bail!("--expert-cache-gb must be 0 or more, got {gb}"),
    };
    let key = ClusterKey::load(&cli.cluster_key_file)?;
    let served = Served::open(
        &cli.model,
        &ServeOptions {
            cache_bytes,
            state_dir: cli.state_dir.clone(),
            no_prefetch: cli.no_prefetch,
            reader: ReaderOptions {
                direct_io: cli.direct_io,
                backend: match cli.io {
                    IoChoice::Auto => None,
                    IoChoice::IoUring => Some(Backend::IoUring),
                    IoChoice::Pread => Some(Backend::Pread),
                },
                ..ReaderOptions::default()
            },
        },
    )
    .with_context(|| format!("loading {}", cli.model.display()))?;
    let served = Arc::new(served);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the network runtime")?;
    rt.block_on(async move {
        let endpoint = tls::server_endpoint(cli.listen)?;
        let addr = endpoint.local_addr().context("reading the bound address")?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
        drop(out);
        let h = served.hello_ref();
        eprintln!(
            "worker: {} — {} of {} experts ({}), cache {:.2} GiB, fingerprint {}…",
            cli.model.display(),
            h.holdings.count(),
            h.num_experts as u64 * h.holdings.layers.len() as u64,
            h.format,
            h.cache_bytes as f64 / (1u64 << 30) as f64,
            short(&h.fingerprint)
        );
        let _advert = if cli.no_mdns {
            None
        } else {
            match Advertisement::start(addr, &h.fingerprint, cli.mdns_loopback) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!("not advertised with mDNS ({e}); coordinators can still use --workers {addr}");
                    None
                }
            }
        };
        let mut opts = ServerOptions::new(key);
        opts.max_connections = cli.max_connections.max(1);
        server::run(endpoint, served, opts, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
        Ok(())
    })
}
