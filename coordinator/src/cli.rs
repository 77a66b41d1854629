//! The `coordinator` command line.
//!
//! ```text
//! coordinator --local --model DIR generate (--prompt TEXT | --prompt-ids 1,2,3) [--chat]
//!             [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]
//!             [--ignore-eos] [--json]
//! coordinator --local --model DIR chat
//! ```

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::chat_template::Message;
use crate::engine::{Engine, FinishReason, GenStats, GenerateParams};
use crate::sampler::SamplingParams;
use crate::text::TextCodec;

/// charm: Mixture-of-Experts models across the machines you own.
#[derive(Debug, Parser)]
#[command(name = "coordinator", version, about)]
pub struct Cli {
    /// Run every expert in this process (one machine).
    #[arg(long, global = true)]
    pub local: bool,
    /// Model directory (Hugging Face layout: config.json, safetensors, tokenizer.json).
    #[arg(long, global = true)]
    pub model: Option<PathBuf>,
    /// Compute threads (default: every core).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate a continuation of one prompt.
    Generate(GenerateArgs),
    /// Interactive chat in the terminal, streaming tokens.
    Chat(ChatArgs),
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
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Wrap --prompt as one user message through the model's chat template.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// System message.
    #[arg(long)]
    pub system: Option<String>,
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
    stats: &'a GenStats,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    if let Some(n) = cli.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global()
            .context("setting up compute threads")?;
    }
    let Some(dir) = cli.model.clone() else {
        bail!("--model DIR is required");
    };
    if !cli.local {
        bail!("cluster mode is not available yet; pass --local to run on this machine");
    }
    if !dir.is_dir() {
        bail!("{}: model directory not found", dir.display());
    }
    let engine = Engine::local(&dir).with_context(|| format!("loading {}", dir.display()))?;
    match cli.command {
        Command::Generate(args) => generate(&engine, &dir, args),
        Command::Chat(args) => chat(&engine, &dir, args),
    }
}

fn params(s: &SamplingArgs) -> Result<GenerateParams> {
    let seed = s.seed.unwrap_or_else(rand::random);
    let sampling = SamplingParams {
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        seed,
    };
    sampling.validate().map_err(anyhow::Error::msg)?;
    Ok(GenerateParams {
        max_tokens: s.max_tokens,
        sampling,
        ignore_eos: s.ignore_eos,
    })
}

fn generate(engine: &Engine, dir: &std::path::Path, args: GenerateArgs) -> Result<()> {
    let params = params(&args.sampling)?;
    // The tokenizer is optional when ids go in: a model without one prints ids.
    let codec = match (&args.prompt, TextCodec::load(dir)) {
        (Some(_), Err(e)) => return Err(e.into()),
        (_, Ok(c)) => Some(c),
        (None, Err(crate::text::TextError::NoTokenizer { .. })) => None,
        (None, Err(e)) => return Err(e.into()),
    };
    let prompt_ids: Vec<u32> = match (&args.prompt, &args.prompt_ids, &codec) {
        (Some(text), _, Some(codec)) if args.chat => {
            let mut msgs = Vec::new();
            if let Some(sys) = &args.system {
                msgs.push(Message::new("system", sys));
            }
            msgs.push(Message::new("user", text));
            codec.encode_chat(&msgs, true, &[])?
        }
        (Some(text), _, Some(codec)) => codec.encode(text)?,
        (None, Some(ids), _) => ids.clone(),
        _ => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty (no tokens)");
    }
    let mut session = engine.session();
    let mut stdout = std::io::stdout().lock();
    let mut stream = codec.as_ref().map(|c| c.stream());
    let mut io_err: Option<std::io::Error> = None;
    let gen = engine.generate(&mut session, &prompt_ids, &params, |id| {
        if args.json {
            return true;
        }
        let piece = match stream.as_mut() {
            Some(s) => s.push(id).ok().flatten(),
            None => Some(format!("{id} ")),
        };
        if let Some(p) = piece {
            if let Err(e) = stdout.write_all(p.as_bytes()).and_then(|_| stdout.flush()) {
                io_err = Some(e);
                return false;
            }
        }
        true
    })?;
    if let Some(e) = io_err {
        return Err(e).context("writing to stdout");
    }
    if !args.json {
        if let Some(rest) = stream.as_mut().map(|s| s.finish()).transpose()?.flatten() {
            stdout.write_all(rest.as_bytes())?;
        }
    }
    if args.json {
        let text = match &codec {
            Some(c) => c.decode(&gen.ids, true)?,
            None => String::new(),
        };
        let out = GenerateJson {
            prompt_ids: &prompt_ids,
            ids: &gen.ids,
            text,
            finish_reason: gen.finish_reason,
            seed: params.sampling.seed,
            stats: &gen.stats,
        };
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else {
        writeln!(stdout)?;
        eprintln!("{}", summary(&gen.stats));
    }
    Ok(())
}

fn summary(s: &GenStats) -> String {
    format!(
        "[{} prompt tokens, {} generated; ttft {:.0} ms, prefill {:.1} tok/s, decode {:.1} tok/s]",
        s.prompt_tokens, s.generated_tokens, s.ttft_ms, s.prefill_tok_s, s.decode_tok_s
    )
}

fn chat(engine: &Engine, dir: &std::path::Path, args: ChatArgs) -> Result<()> {
    let codec = TextCodec::load(dir)?;
    if !codec.has_template() {
        bail!(
            "{}: no chat template; use `generate --prompt` instead",
            dir.display()
        );
    }
    let params = params(&args.sampling)?;
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
        let mut stream = codec.stream();
        let mut out = std::io::stdout().lock();
        let gen = engine.generate(&mut session, &prompt, &params, |id| {
            if let Ok(Some(p)) = stream.push(id) {
                let _ = out.write_all(p.as_bytes());
                let _ = out.flush();
            }
            true
        })?;
        if let Some(rest) = stream.finish()? {
            out.write_all(rest.as_bytes())?;
        }
        writeln!(out)?;
        let reply = codec.decode(&gen.ids, true)?;
        messages.push(Message::new("assistant", &reply));
        eprintln!("{}", summary(&gen.stats));
    }
    Ok(())
}
