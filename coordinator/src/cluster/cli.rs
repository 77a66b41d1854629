//! The command line of cluster mode: its flags, `coordinator keygen`,
//! `coordinator plan`, and the engine whose experts run on workers.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use charm_worker::net::fingerprint::model_fingerprint;
use charm_worker::net::handshake::short;
use charm_worker::net::ClusterKey;
use clap::Args;
use serde::Serialize;

use super::placement::{render, ModelShape, PerToken, WorkerPlan};
use super::service::{ClusterOptions, ClusterService, LocalBuilder};
use crate::engine::{load_model, Engine, EngineOptions};

/// Flags of cluster mode (every command that runs a model without `--local`).
#[derive(Clone, Debug, Default, Args)]
pub struct ClusterArgs {
    /// Workers to use, HOST:PORT,... (default: find them with mDNS).
    #[arg(long, global = true, value_delimiter = ',')]
    pub workers: Option<Vec<String>>,
    /// Cluster key file (create one with `coordinator keygen --out F`).
    #[arg(long, global = true)]
    pub cluster_key_file: Option<PathBuf>,
    /// Do not look for workers with mDNS.
    #[arg(long, global = true)]
    pub no_mdns: bool,
    /// Look for workers on the loopback interface only (single-machine trials, tests).
    #[arg(long, global = true)]
    pub mdns_loopback: bool,
    /// Wait until this many workers are connected before starting.
    #[arg(long, global = true, default_value_t = 1)]
    pub min_workers: usize,
    /// Longest wait for --min-workers, in seconds.
    #[arg(long, global = true, default_value_t = 10.0)]
    pub discovery_timeout_s: f64,
    /// Re-send a request to another holder when its worker has not answered
    /// within this many milliseconds (that worker is then dropped).
    #[arg(long, global = true, default_value_t = 10_000)]
    pub worker_timeout_ms: u64,
    /// Never compute experts on the coordinator: fail when no worker holds one.
    #[arg(long, global = true)]
    pub no_local_experts: bool,
    /// Run a step of several sequences (a batch, or `serve`'s requests) as
    /// two halves at once, so one half's attention overlaps the other's
    /// round trips to the workers; the halves do not share expert reads.
    #[arg(long, global = true)]
    pub pipeline: bool,
}

/// `coordinator keygen`.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the new key (must not exist; written with mode 0600).
    #[arg(long)]
    pub out: PathBuf,
}

/// `coordinator plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Writes a new cluster key.
pub fn keygen(args: &KeygenArgs) -> Result<()> {
    ClusterKey::write_new(&args.out)?;
    eprintln!(
        "wrote a new cluster key to {} (mode 0600); give every worker and coordinator of the cluster a copy (--cluster-key-file)",
        args.out.display()
    );
    Ok(())
}

/// A started cluster service for the model in `dir`, with the model's dense part.
pub fn start(
    dir: &Path,
    args: &ClusterArgs,
    opts: &EngineOptions,
) -> Result<(charm_models::Model, Arc<ClusterService>)> {
    let Some(key_file) = &args.cluster_key_file else {
        bail!(
            "cluster mode needs --cluster-key-file F (create one with `coordinator keygen --out F`); \
             or pass --local to run every expert on this machine"
        );
    };
    if !dir.is_dir() {
        bail!(
            "{}: cluster mode serves a Hugging Face directory or a charm container",
            dir.display()
        );
    }
    let key = ClusterKey::load(key_file)?;
    let workers = resolve(args.workers.as_deref().unwrap_or_default())?;
    let mdns = match (&args.workers, args.no_mdns) {
        (Some(_), _) => None,
        (None, false) => Some(args.mdns_loopback),
        (None, true) => bail!("no workers: give --workers HOST:PORT,... or let mDNS find them (drop --no-mdns)"),
    };
    if args.min_workers == 0 {
        bail!("--min-workers must be at least 1");
    }
    if !args.discovery_timeout_s.is_finite() || args.discovery_timeout_s < 0.0 {
        bail!("--discovery-timeout-s must be 0 or more");
    }
    let (model, _) = crate::load_bar::while_loading(dir, || load_model(dir))
        .with_context(|| format!("loading {}", dir.display()))?;
    let fingerprint = model_fingerprint(dir).with_context(|| format!("fingerprinting {}", dir.display()))?;
    let cfg = &model.cfg;
    let shape = ModelShape {
        num_layers: cfg.num_layers,
        moe_layers: (0..cfg.num_layers)
            .filter(|&l| cfg.is_moe_layer(l))
            .map(|l| l as u16)
            .collect(),
        num_experts: cfg.num_experts as u32,
        top_k: cfg.top_k,
        hidden: cfg.hidden_size as u32,
    };
    let local: Option<LocalBuilder> = if args.no_local_experts {
        None
    } else {
        let (dir, opts) = (dir.to_path_buf(), opts.clone());
        Some(Box::new(move || {
            tracing::warn!("running experts on the coordinator ({})", dir.display());
            Engine::load(&dir, &opts)
                .map(|(e, _)| e.expert_service().clone())
                .map_err(|e| format!("loading the coordinator's own experts: {e}"))
        }))
    };
    let service = ClusterService::start(ClusterOptions {
        key,
        fingerprint: fingerprint.clone(),
        shape,
        workers,
        mdns,
        request_timeout: Duration::from_millis(args.worker_timeout_ms.max(1)),
        local,
    })?;
    let n = service.wait_for_workers(args.min_workers, Duration::from_secs_f64(args.discovery_timeout_s))?;
    eprintln!(
        "charm: cluster of {n} worker{} for {} (fingerprint {}…): {}",
        if n == 1 { "" } else { "s" },
        dir.display(),
        short(&fingerprint),
        service
            .workers()
            .iter()
            .map(SocketAddr::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok((model, Arc::new(service)))
}

/// `HOST:PORT` entries to socket addresses (first address of each).
fn resolve(specs: &[String]) -> Result<Vec<SocketAddr>> {
    specs
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .to_socket_addrs()
                .with_context(|| format!("--workers {s}: not HOST:PORT or does not resolve"))?
                .next()
                .with_context(|| format!("--workers {s}: resolves to no address"))
        })
        .collect()
}

#[derive(Serialize)]
struct PlanJson<'a> {
    workers: &'a [WorkerPlan],
    /// `[layer, expert]` pairs no worker holds.
    uncovered: Vec<[u32; 2]>,
    per_token: &'a PerToken,
}

/// `coordinator plan`: connects, places, prints.
pub fn plan(dir: &Path, args: &ClusterArgs, opts: &EngineOptions, plan_args: &PlanArgs) -> Result<()> {
    let (_, service) = start(dir, args, opts)?;
    let plan = service.placement();
    if plan_args.json {
        let out = PlanJson {
            workers: &plan.workers,
            uncovered: plan.uncovered.iter().map(|&(l, e)| [l as u32, e]).collect(),
            per_token: &plan.per_token,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        print!("{}", render(&plan, service.shape()));
    }
    Ok(())
}
