//! The `coordinator` command line.
//!
//! ```text
//! coordinator --local --model DIR generate (--prompt TEXT | --prompt-ids 1,2,3) [--chat]
//!             [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]
//!             [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F] [--seed S]
//!             [--ignore-eos] [--json]
//! coordinator --local --model DIR chat
//! coordinator --local --model DIR (serve | web) [--host 127.0.0.1] [--port 8000] [--api-key-file F]
//!             [--queue-size N] [--max-body-bytes N]
//! coordinator --model DIR --cluster-key-file F [--workers HOST:PORT,...] generate|chat|serve ...
//! coordinator --model DIR --cluster-key-file F [--workers HOST:PORT,...] plan [--json]
//! coordinator keygen --out F
//! ```
//!
//! Without `--local`, experts run on workers (see [`crate::cluster`]):
//! those given by `--workers`, or found with mDNS.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::chat_template::Message;
use crate::engine::{Engine, EngineOptions, FinishReason, GenStats, GenerateParams, LoadInfo};
use crate::sampler::SamplingParams;
use crate::server::answer::{AnswerStream, Out, Shape};
use crate::server::harmony::is_harmony;
use crate::server::reasoning::{prompt_opens_inside, template_thinks};
use crate::server::think_budget::ThinkBudget;
use crate::text::TextCodec;
use charm_common::container::Quant;
use charm_models::KvDtype;
use charm_worker::io::Backend;

/// charm: Mixture-of-Experts models across the machines you own.
#[derive(Debug, Parser)]
#[command(name = "coordinator", version, about)]
pub struct Cli {
    /// Run every expert in this process (one machine).
    #[arg(long, global = true)]
    pub local: bool,
    /// Model: a Hugging Face directory, a charm container, or a .gguf file.
    #[arg(long, global = true)]
    pub model: Option<PathBuf>,
    /// Compute threads (default: every core).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// RAM budget for cached experts of a container, in GiB (0 = read every
    /// expert from disk every time; default: free memory after the dense part).
    #[arg(long, global = true)]
    pub expert_cache_gb: Option<f64>,
    /// Do not read the predicted next layer's experts ahead.
    #[arg(long, global = true)]
    pub no_prefetch: bool,
    /// Read experts with O_DIRECT, bypassing the page cache.
    #[arg(long, global = true)]
    pub direct_io: bool,
    /// Disk reader: auto (io_uring on Linux when available), io-uring, pread.
    #[arg(long, global = true, value_enum, default_value_t = IoChoice::Auto)]
    pub io: IoChoice,
    /// KV cache element type: f32 (exact, the default) or f16 (half the
    /// memory and the bytes read per token, as llama.cpp's default cache).
    #[arg(long, global = true, default_value = "f32")]
    pub kv_cache: String,
    /// Prompt rows per step: bounds activation memory on long prompts, and
    /// how long a prompt being read delays the requests decoding beside it
    /// (`serve`). The tokens do not depend on it.
    #[arg(long, global = true, default_value_t = crate::engine::DEFAULT_PREFILL_CHUNK as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_chunk: u64,
    /// Where learned routing history is kept (default: <model>/state).
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    /// A chat template (Jinja text, as `chat_template.jinja` holds it) used
    /// instead of the model's own, for `--chat`, `chat` and `serve`.
    #[arg(long, global = true, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Cluster mode (without --local): workers, key, discovery, timeouts.
    #[command(flatten)]
    pub cluster: crate::cluster::cli::ClusterArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// `--io` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IoChoice {
    Auto,
    IoUring,
    Pread,
}

/// `--quant` choices of `convert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantChoice {
    Bf16,
    Int8,
    Int4,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate a continuation of one prompt.
    Generate(GenerateArgs),
    /// Interactive chat in the terminal, streaming tokens.
    Chat(ChatArgs),
    /// Convert a Hugging Face directory into a charm container.
    Convert(ConvertArgs),
    /// Rebuild a dense GGUF model as a Mixture-of-Experts (sparse upcycling).
    Upcycle(UpcycleArgs),
    /// Serve the OpenAI and Anthropic APIs, /metrics and the dashboard over HTTP.
    Serve(crate::server::ServeArgs),
    /// `serve`, and open the dashboard in the browser.
    Web(crate::server::ServeArgs),
    /// Create a cluster key file (32 random bytes, hex, mode 0600).
    Keygen(crate::cluster::cli::KeygenArgs),
    /// Connect to the cluster's workers and print the expert placement.
    Plan(crate::cluster::cli::PlanArgs),
    /// Cut a container into partial copies, one per machine, by the placement plan.
    Split(SplitArgs),
}

#[derive(Debug, Args)]
pub struct SplitArgs {
    /// Output directory (must not exist): part-0, part-1, … inside.
    #[arg(long)]
    pub out: PathBuf,
    /// That many machines, whose RAM together holds every expert once.
    #[arg(long, conflicts_with = "ram_gb")]
    pub parts: Option<usize>,
    /// Each machine's RAM for the expert cache, in GiB (one value a machine):
    /// where it has room beyond its share, the hottest experts get replicas.
    #[arg(long, value_delimiter = ',')]
    pub ram_gb: Vec<f64>,
    /// Each machine's disk for its part, in GiB (one value a machine).
    #[arg(long, value_delimiter = ',')]
    pub disk_gb: Vec<f64>,
}

#[derive(Debug, Args)]
pub struct UpcycleArgs {
    /// Output Hugging Face directory (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// Experts per layer (0: export the dense model unchanged).
    #[arg(long, default_value_t = 4)]
    pub experts: usize,
    /// Experts chosen per token.
    #[arg(long, default_value_t = 2)]
    pub top_k: usize,
    /// Perturbation of each expert copy, relative to the weight's RMS.
    #[arg(long, default_value_t = 0.02)]
    pub noise: f32,
    /// Router weight scale (times 1/sqrt(hidden)).
    #[arg(long, default_value_t = 4.0)]
    pub router_gain: f32,
    /// Seed of the perturbations and the router.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Output container directory (must not exist).
    #[arg(long)]
    pub out: PathBuf,
    /// How routed experts are stored (a .gguf source, and a checkpoint whose
    /// experts are stored in GGML blocks such as gpt-oss's MXFP4, keep their
    /// own blocks: leave this out).
    #[arg(long, value_enum)]
    pub quant: Option<QuantChoice>,
    /// Columns per scale: int8 0 (= per row, default) or a divisor of the
    /// row length; int4 32 (default) or 64.
    #[arg(long)]
    pub group: Option<usize>,
}

/// Sampling and length flags shared by `generate` and `chat`.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Keep only tokens at least this fraction as likely as the most likely (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// transformers' repetition penalty over the prompt and the output (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token already generated (-2 to 2).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time it was generated (-2 to 2).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Seed of the sampler (default: random, printed with --json).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past end-of-sequence up to --max-tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids", required_unless_present_any = ["prompt_ids", "batch_file"])]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', conflicts_with = "batch_file")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Generate for every line of FILE at once (one prompt per non-empty
    /// line; comma-separated token ids with --batch-ids), stepped together
    /// so each layer's routed experts run once for all of them.
    #[arg(long, conflicts_with = "prompt")]
    pub batch_file: Option<PathBuf>,
    /// The lines of --batch-file are comma-separated token ids.
    #[arg(long, requires = "batch_file")]
    pub batch_ids: bool,
    /// Wrap each prompt as one user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Generate this many times in one process, each from an empty KV
    /// cache, one JSON object per run (with --json): the later runs find
    /// the experts the first one read still cached, so they give warm
    /// numbers; the ids are the same every run.
    #[arg(long, default_value_t = 1, requires = "json", conflicts_with = "batch_file")]
    pub repeat: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
    /// Close the model's reasoning after this many tokens (it then
    /// answers). Default: no cap.
    #[arg(long, value_name = "TOKENS")]
    pub reasoning_budget: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// The `--json` output of `generate`.
#[derive(Serialize)]
struct GenerateJson<'a> {
    prompt_ids: &'a [u32],
    ids: &'a [u32],
    text: String,
    finish_reason: FinishReason,
    seed: u64,
    /// Seconds from the start of loading to a model ready to take the
    /// prompt (weights made, workers connected).
    load_s: f64,
    /// The coordinator's peak resident memory at the end, in bytes (Linux).
    peak_rss_bytes: Option<u64>,
    stats: &'a GenStats,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .try_init();
    if let Some(n) = cli.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .context("setting up compute threads")?;
    }
    if let Command::Keygen(args) = &cli.command {
        return crate::cluster::cli::keygen(args);
    }
    let Some(dir) = cli.model.clone() else {
        bail!("--model DIR is required");
    };
    if !dir.is_dir() && !crate::engine::is_gguf(&dir) {
        if dir.is_file() {
            bail!("{}: not a model directory or a GGUF file", dir.display());
        }
        bail!("{}: model directory not found", dir.display());
    }
    if let Command::Convert(args) = &cli.command {
        return convert_cmd(&dir, args);
    }
    if let Command::Split(a) = &cli.command {
        return split_cmd(&dir, cli.state_dir.as_deref(), a);
    }
    if let Command::Upcycle(a) = &cli.command {
        let opts = crate::upcycle::UpcycleOptions {
            experts: a.experts,
            top_k: a.top_k,
            noise: a.noise,
            router_gain: a.router_gain,
            seed: a.seed,
        };
        crate::upcycle::upcycle(&dir, &a.out, &opts)?;
        eprintln!("wrote {}", a.out.display());
        return Ok(());
    }
    let opts = engine_options(&cli)?;
    if let Command::Plan(args) = &cli.command {
        if cli.local {
            bail!("`plan` describes a cluster; drop --local");
        }
        return crate::cluster::cli::plan(&dir, &cli.cluster, &opts, args);
    }
    let load_start = std::time::Instant::now();
    let (mut engine, info) = if cli.local {
        crate::load_bar::while_loading(&dir, || Engine::load(&dir, &opts))
            .with_context(|| format!("loading {}", dir.display()))?
    } else {
        let (model, service) = crate::cluster::cli::start(&dir, &cli.cluster, &opts)?;
        let mut engine = Engine::new(model, service);
        engine.prefetch = opts.prefetch;
        engine.pipeline = cli.cluster.pipeline;
        engine.model.kv_dtype = opts.kv_dtype;
        (engine, LoadInfo::default())
    };
    engine.prefill_chunk = cli.prefill_chunk as usize;
    let template = cli.chat_template.as_deref();
    if info.container {
        eprintln!("{}", start_line(&info));
    }
    match cli.command {
        Command::Generate(args) => generate(&engine, &dir, template, args, load_start.elapsed().as_secs_f64()),
        Command::Chat(args) => chat(&engine, &dir, template, args),
        Command::Serve(args) => Ok(crate::server::run_cli(
            engine, &info, &dir, template, &args, cli.local, false,
        )?),
        Command::Web(args) => Ok(crate::server::run_cli(
            engine, &info, &dir, template, &args, cli.local, true,
        )?),
        Command::Convert(_) | Command::Upcycle(_) | Command::Keygen(_) | Command::Plan(_) | Command::Split(_) => {
            unreachable!("handled above")
        }
    }
}

fn engine_options(cli: &Cli) -> Result<EngineOptions> {
    let expert_cache_bytes = match cli.expert_cache_gb {
        None => None,
        Some(gb) if gb.is_finite() && gb >= 0.0 => Some((gb * (1u64 << 30) as f64) as u64),
        Some(gb) => bail!("--expert-cache-gb must be 0 or more, got {gb}"),
    };
    Ok(EngineOptions {
        expert_cache_bytes,
        prefetch: !cli.no_prefetch,
        direct_io: cli.direct_io,
        io_backend: match cli.io {
            IoChoice::Auto => None,
            IoChoice::IoUring => Some(Backend::IoUring),
            IoChoice::Pread => Some(Backend::Pread),
        },
        state_dir: cli.state_dir.clone(),
        kv_dtype: cli
            .kv_cache
            .parse::<KvDtype>()
            .map_err(|e| anyhow::anyhow!("--kv-cache: {e}"))?,
    })
}

/// Bytes in the largest unit that keeps a number ≥ 1 (B, KiB, MiB, GiB).
fn human(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", units[u])
    }
}

/// The start-up line of a container run: budget, quantization, reader.
fn start_line(info: &LoadInfo) -> String {
    format!(
        "charm: {} container, expert cache {}{} for {} of experts, {} reads",
        info.quant.map_or("?", |q| q.name()),
        human(info.cache_bytes),
        if info.default_cache {
            " (free memory after the dense part)"
        } else {
            ""
        },
        human(info.all_expert_bytes),
        match info.backend {
            Some(Backend::IoUring) => "io_uring",
            _ => "pread",
        }
    )
}

fn split_cmd(dir: &std::path::Path, state_dir: Option<&std::path::Path>, a: &SplitArgs) -> Result<()> {
    let manifest = charm_common::container::Manifest::open(dir)
        .with_context(|| format!("{}: split takes a charm container", dir.display()))?;
    let all: u64 = manifest.records.iter().map(|r| r.padded_len()).sum();
    let gib = |what: &str, v: f64| -> Result<u64> {
        if v.is_finite() && v > 0.0 {
            Ok((v * (1u64 << 30) as f64) as u64)
        } else {
            bail!("--{what} values must be more than 0, got {v}")
        }
    };
    let ram: Vec<u64> = match (a.parts, a.ram_gb.is_empty()) {
        (Some(0), _) => bail!("--parts must be at least 1"),
        (Some(n), _) => vec![all.div_ceil(n as u64); n],
        (None, false) => a.ram_gb.iter().map(|&v| gib("ram-gb", v)).collect::<Result<_>>()?,
        (None, true) => bail!("give --parts N or --ram-gb R1,R2,... (one value a machine)"),
    };
    if !a.disk_gb.is_empty() && a.disk_gb.len() != ram.len() {
        bail!("--disk-gb has {} values for {} machines", a.disk_gb.len(), ram.len());
    }
    let machines: Vec<crate::split::Machine> = ram
        .iter()
        .enumerate()
        .map(|(i, &ram_bytes)| {
            Ok(crate::split::Machine {
                ram_bytes,
                disk_bytes: a.disk_gb.get(i).map(|&v| gib("disk-gb", v)).transpose()?,
            })
        })
        .collect::<Result<_>>()?;
    // The routing this model learned here, if any: replicas go to the hottest experts.
    let layers = manifest.records.iter().map(|r| r.layer as usize + 1).max().unwrap_or(0);
    let experts = manifest
        .records
        .iter()
        .map(|r| r.expert as usize + 1)
        .max()
        .unwrap_or(0);
    let heat = charm_worker::sysmem::state_file(dir, state_dir, "routing-history.json", Some(&manifest.fingerprint))
        .map(|p| {
            let (h, warning) = charm_worker::history::RoutingHistory::load(&p, &manifest.fingerprint, layers, experts);
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            h.counts
        })
        .unwrap_or_default();
    let parts = crate::split::split(dir, &a.out, &machines, &heat)?;
    for p in &parts {
        eprintln!(
            "{}: owns {} experts, {} replicas, {}",
            p.path.display(),
            p.owns,
            p.replicas,
            human(p.expert_bytes)
        );
    }
    Ok(())
}

fn convert_cmd(dir: &std::path::Path, args: &ConvertArgs) -> Result<()> {
    let gguf = crate::engine::is_gguf(dir);
    // Experts a checkpoint stores in GGML blocks (gpt-oss's MXFP4) are kept as they are.
    let stored = if gguf || charm_common::container::is_container(dir) {
        None
    } else {
        crate::convert::experts_stored_as(dir)?
    };
    let quant = match (args.quant, args.group) {
        (None, None) if gguf || stored.is_some() => Quant::Gguf,
        (Some(_), _) | (_, Some(_)) if gguf => {
            bail!("a .gguf source keeps its quantized blocks as they are; drop --quant and --group")
        }
        (Some(_), _) | (_, Some(_)) if stored.is_some() => bail!(
            "this checkpoint's experts are {}: they are kept as they are; drop --quant and --group",
            stored.map_or("", |t| t.name())
        ),
        (None, _) => bail!("--quant bf16|int8|int4 is required for a Hugging Face directory"),
        (Some(QuantChoice::Bf16), None) => Quant::Bf16,
        (Some(QuantChoice::Bf16), Some(_)) => bail!("--group applies to int8 and int4 only"),
        (Some(QuantChoice::Int8), g) => Quant::Int8 { group: g.unwrap_or(0) },
        (Some(QuantChoice::Int4), None) => Quant::Int4 { group: 32 },
        (Some(QuantChoice::Int4), Some(g)) if g == 32 || g == 64 => Quant::Int4 { group: g },
        (Some(QuantChoice::Int4), Some(g)) => bail!("int4 --group must be 32 or 64, got {g}"),
    };
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let s = crate::convert::convert(dir, &args.out, quant, progress)?;
    eprintln!(
        "wrote {}: {} experts ({}, {}), dense {}, fingerprint {}",
        s.out.display(),
        s.experts,
        human(s.expert_bytes),
        quant.name(),
        human(s.dense_bytes),
        &s.fingerprint[..16]
    );
    Ok(())
}

fn params(s: &SamplingArgs) -> Result<GenerateParams> {
    let seed = s.seed.unwrap_or_else(rand::random);
    let sampling = SamplingParams {
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        logit_bias: Vec::new(),
        seed,
    };
    sampling.validate().map_err(anyhow::Error::msg)?;
    Ok(GenerateParams {
        max_tokens: s.max_tokens,
        sampling,
        ignore_eos: s.ignore_eos,
    })
}

/// `text` as prompt ids: through the chat template as one user message
/// (after `system`) when `chat`.
fn encode_prompt(codec: &TextCodec, text: &str, chat: bool, system: Option<&str>) -> Result<Vec<u32>> {
    if !chat {
        return Ok(codec.encode(text)?);
    }
    let mut msgs = Vec::new();
    if let Some(sys) = system {
        msgs.push(Message::new("system", sys));
    }
    msgs.push(Message::new("user", text));
    Ok(codec.encode_chat(&msgs, true, &[])?)
}

fn generate(
    engine: &Engine,
    dir: &std::path::Path,
    template: Option<&std::path::Path>,
    args: GenerateArgs,
    load_s: f64,
) -> Result<()> {
    let params = params(&args.sampling)?;
    let needs_text = args.prompt.is_some() || (args.batch_file.is_some() && !args.batch_ids);
    if args.chat && !needs_text {
        bail!("--chat needs text prompts (--prompt, or --batch-file without --batch-ids)");
    }
    // The tokenizer is optional when ids go in: a model without one prints ids.
    let codec = match (needs_text, TextCodec::for_model_with(dir, template)) {
        (true, Err(crate::text::TextError::NoTokenizer { .. })) if args.batch_file.is_some() => {
            bail!(
                "{} has no tokenizer: give the prompts as token ids (--batch-ids)",
                dir.display()
            )
        }
        (true, Err(e)) => return Err(e.into()),
        (_, Ok(c)) => Some(c),
        (false, Err(crate::text::TextError::NoTokenizer { .. })) => None,
        (false, Err(e)) => return Err(e.into()),
    };
    if let Some(file) = &args.batch_file {
        return generate_batch(engine, codec.as_ref(), file, &args, &params);
    }
    let prompt_ids: Vec<u32> = match (&args.prompt, &args.prompt_ids, &codec) {
        (Some(text), _, Some(codec)) => encode_prompt(codec, text, args.chat, args.system.as_deref())?,
        (None, Some(ids), _) => ids.clone(),
        _ => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty (no tokens)");
    }
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    for _ in 0..args.repeat {
        generate_once(engine, codec.as_ref(), &prompt_ids, &params, &args, load_s)?;
    }
    Ok(())
}

/// One generation of `generate` (not `--batch-file`): streamed text, or one
/// JSON line with `--json`.
fn generate_once(
    engine: &Engine,
    codec: Option<&TextCodec>,
    prompt_ids: &[u32],
    params: &GenerateParams,
    args: &GenerateArgs,
    load_s: f64,
) -> Result<()> {
    let mut session = engine.session();
    // A chat answer in harmony channels (gpt-oss): reasoning on stderr, the answer on stdout.
    let mut harmony = codec
        .and_then(TextCodec::template)
        .filter(|t| args.chat && !args.json && is_harmony(t.source()))
        .map(|_| {
            AnswerPrint::new(&Shape {
                harmony: true,
                ..Shape::default()
            })
        });
    let mut stream = codec.map(|c| match harmony {
        Some(_) => c.stream_keeping_special(),
        None => c.stream(),
    });
    let mut stdout = std::io::stdout().lock();
    let mut io_err: Option<std::io::Error> = None;
    let gen = engine.generate(&mut session, prompt_ids, params, |id| {
        if args.json {
            return true;
        }
        let piece = match stream.as_mut() {
            Some(s) => s.push(id).ok().flatten(),
            None => Some(format!("{id} ")),
        };
        match (piece, harmony.as_mut()) {
            (Some(p), Some(h)) => h.push(&p),
            (Some(p), None) => {
                if let Err(e) = stdout.write_all(p.as_bytes()).and_then(|_| stdout.flush()) {
                    io_err = Some(e);
                    return false;
                }
            }
            (None, _) => {}
        }
        true
    })?;
    if let Some(e) = io_err {
        return Err(e).context("writing to stdout");
    }
    if !args.json {
        let rest = stream.as_mut().map(|s| s.finish()).transpose()?.flatten();
        match (rest, harmony.as_mut()) {
            (Some(r), Some(h)) => h.push(&r),
            (Some(r), None) => stdout.write_all(r.as_bytes())?,
            (None, _) => {}
        }
        if let Some(h) = harmony.as_mut() {
            h.finish();
        }
    }
    if args.json {
        let text = match codec {
            Some(c) => c.decode(&gen.ids, true)?,
            None => String::new(),
        };
        let out = GenerateJson {
            prompt_ids,
            ids: &gen.ids,
            text,
            finish_reason: gen.finish_reason,
            seed: params.sampling.seed,
            load_s,
            peak_rss_bytes: charm_common::memory::peak_rss(),
            stats: &gen.stats,
        };
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else {
        writeln!(stdout)?;
        eprintln!("{}", summary(&gen.stats));
    }
    Ok(())
}

/// The `--json` output of `generate --batch-file`.
#[derive(Serialize)]
struct BatchJson {
    sequences: Vec<BatchSeqJson>,
    seed: u64,
    stats: BatchStatsJson,
}

#[derive(Serialize)]
struct BatchSeqJson {
    prompt_ids: Vec<u32>,
    ids: Vec<u32>,
    text: String,
    finish_reason: FinishReason,
}

#[derive(Serialize)]
struct BatchStatsJson {
    prompt_tokens: usize,
    generated_tokens: usize,
    steps: usize,
    wall_ms: f64,
    tok_s: f64,
    #[serde(flatten)]
    experts: charm_models::ExpertStats,
    profile: crate::engine::PhaseTimes,
}

/// `generate --batch-file`: every prompt of the file at once.
fn generate_batch(
    engine: &Engine,
    codec: Option<&TextCodec>,
    file: &std::path::Path,
    args: &GenerateArgs,
    params: &GenerateParams,
) -> Result<()> {
    let body = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut prompts = Vec::new();
    for (n, line) in body.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let ids = match codec {
            Some(c) if !args.batch_ids => encode_prompt(c, line, args.chat, args.system.as_deref())?,
            _ => line
                .split(',')
                .map(|t| t.trim().parse::<u32>())
                .collect::<Result<Vec<u32>, _>>()
                .with_context(|| format!("{} line {}: not comma-separated token ids", file.display(), n + 1))?,
        };
        if ids.is_empty() {
            bail!("{} line {}: the prompt has no tokens", file.display(), n + 1);
        }
        prompts.push(ids);
    }
    if prompts.is_empty() {
        bail!("{} holds no prompt", file.display());
    }
    let batch = engine.generate_batch(&prompts, params)?;
    let text = |ids: &[u32]| -> Result<String> {
        Ok(match codec {
            Some(c) => c.decode(ids, true)?,
            None => ids.iter().map(|i| format!("{i} ")).collect(),
        })
    };
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let mut sequences = Vec::with_capacity(prompts.len());
        for (prompt, (ids, finish)) in prompts.iter().zip(&batch.sequences) {
            sequences.push(BatchSeqJson {
                prompt_ids: prompt.clone(),
                text: if codec.is_some() { text(ids)? } else { String::new() },
                ids: ids.clone(),
                finish_reason: *finish,
            });
        }
        let out = BatchJson {
            sequences,
            seed: params.sampling.seed,
            stats: BatchStatsJson {
                prompt_tokens: batch.prompt_tokens,
                generated_tokens: batch.generated_tokens,
                steps: batch.steps,
                wall_ms: batch.wall_ms,
                tok_s: batch.tok_s,
                experts: batch.experts.clone(),
                profile: batch.profile.clone(),
            },
        };
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else {
        for (i, (ids, finish)) in batch.sequences.iter().enumerate() {
            writeln!(stdout, "--- {} ({finish:?})\n{}", i + 1, text(ids)?)?;
        }
        eprintln!(
            "[{} prompts: {} prompt tokens, {} generated in {} steps, {:.0} ms; {:.1} tok/s together; {:.1} MiB of experts read]",
            prompts.len(),
            batch.prompt_tokens,
            batch.generated_tokens,
            batch.steps,
            batch.wall_ms,
            batch.tok_s,
            batch.experts.expert_bytes_read as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

fn summary(s: &GenStats) -> String {
    let mut line = format!(
        "[{} prompt tokens, {} generated; ttft {:.0} ms, prefill {:.1} tok/s, decode {:.1} tok/s",
        s.prompt_tokens, s.generated_tokens, s.ttft_ms, s.prefill_tok_s, s.decode_tok_s
    );
    let e = &s.experts;
    if e.expert_misses > 0 || e.expert_bytes_read > 0 || e.cache_bytes > 0 {
        let total = (e.expert_hits + e.expert_misses).max(1);
        line.push_str(&format!(
            "; experts {:.0}% hits, {:.1} MiB read, io wait {:.0} ms, prefetch {}/{} used ({:.0}% predicted), cache {:.1} MiB",
            100.0 * e.expert_hits as f64 / total as f64,
            e.expert_bytes_read as f64 / (1 << 20) as f64,
            e.io_wait_ms,
            e.prefetch_hits,
            e.prefetch_issued,
            100.0 * s.prefetch_accuracy,
            e.cache_bytes as f64 / (1 << 20) as f64
        ));
        if e.prefetch_stand_downs > 0 {
            line.push_str(&format!(
                "; read-ahead stood down {} times ({} layer steps: {} wasted, {} evictions read again)",
                e.prefetch_stand_downs, e.prefetch_paused_steps, e.prefetch_wasted, e.prefetch_harm
            ));
        }
    }
    if e.round_trips > 0 {
        line.push_str(&format!(
            "; network {} round trips, {:.1} KiB sent, {:.1} KiB received, {} workers",
            e.round_trips,
            e.network_bytes_sent as f64 / 1024.0,
            e.network_bytes_received as f64 / 1024.0,
            e.workers.iter().filter(|w| w.requests > 0).count()
        ));
    }
    line.push(']');
    line
}

/// An answer printed as it streams: the reasoning (a `<think>` block, or
/// harmony's `analysis` channel) on stderr, the answer on stdout (calls
/// are not printed: the CLI offers no tools); both kept for the
/// conversation.
struct AnswerPrint {
    split: AnswerStream,
    reasoning: String,
    answer: String,
}

impl AnswerPrint {
    fn new(shape: &Shape) -> Self {
        AnswerPrint {
            split: AnswerStream::new(shape),
            reasoning: String::new(),
            answer: String::new(),
        }
    }

    fn push(&mut self, text: &str) {
        let outs = self.split.push(text);
        self.show(outs);
    }

    fn finish(&mut self) {
        let outs = self.split.finish();
        self.show(outs);
    }

    fn show(&mut self, outs: Vec<Out>) {
        for o in outs {
            match o {
                Out::Reasoning(t) => {
                    eprint!("{t}");
                    self.reasoning.push_str(&t);
                }
                Out::Text(t) => {
                    print!("{t}");
                    self.answer.push_str(&t);
                }
                Out::Call(_) => {}
            }
        }
        let _ = std::io::stdout().flush();
    }
}

fn chat(engine: &Engine, dir: &std::path::Path, template: Option<&std::path::Path>, args: ChatArgs) -> Result<()> {
    let codec = TextCodec::for_model_with(dir, template)?;
    if !codec.has_template() {
        bail!("{}: no chat template; use `generate --prompt` instead", dir.display());
    }
    let params = params(&args.sampling)?;
    // Reasoning apart from the answer: `<think>` blocks, or gpt-oss's
    // harmony channels.
    let source = codec.template().map(|t| t.source()).unwrap_or_default();
    let harmony = is_harmony(source);
    let thinks = !harmony && template_thinks(source);
    let mut messages = Vec::new();
    if let Some(sys) = &args.system {
        messages.push(Message::new("system", sys));
    }
    let mut session = engine.session();
    eprintln!(
        "charm chat — {} (type /reset to start over, /exit or Ctrl-D to quit)",
        dir.display()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m: &Message| m.role == "system");
                session = engine.session();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", input));
        let prompt = codec.encode_chat(&messages, true, &[])?;
        let shape = Shape {
            think: thinks.then(|| prompt_opens_inside(&codec, &prompt)),
            harmony,
            tools: None,
        };
        let budget = match args.reasoning_budget {
            Some(n) => ThinkBudget::for_template(source, n, shape.think == Some(true), &codec)?,
            None => None,
        };
        let budget = std::cell::RefCell::new(budget);
        // The channel markers are special tokens: a harmony answer is
        // decoded with them.
        let mut stream = if harmony {
            codec.stream_keeping_special()
        } else {
            codec.stream()
        };
        let mut print = AnswerPrint::new(&shape);
        let gen = engine.generate_steered(
            &mut session,
            &prompt,
            &params,
            || budget.borrow_mut().as_mut().and_then(ThinkBudget::forced),
            |id, _| {
                // Every token counts, one that completes no character too.
                let piece = stream.push(id).ok().flatten().unwrap_or_default();
                if let Some(b) = budget.borrow_mut().as_mut() {
                    b.push(&piece);
                }
                print.push(&piece);
                true
            },
        )?;
        if let Some(rest) = stream.finish()? {
            print.push(&rest);
        }
        print.finish();
        println!();
        let mut reply = Message::new("assistant", print.answer.trim());
        reply.reasoning_content = (!print.reasoning.is_empty()).then_some(print.reasoning);
        messages.push(reply);
        eprintln!("{}", summary(&gen.stats));
    }
    Ok(())
}
