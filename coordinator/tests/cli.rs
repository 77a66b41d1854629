//! The `coordinator` command-line contract, run as a real process: JSON
//! shape, chat prompts, sampling reproducibility, EOS stops, and clear
//! one-line errors (never a panic) on bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures").join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

fn csv(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn coordinator(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .arg("--local")
        .arg("--model")
        .arg(dir)
        .args(args)
        .output()
        .expect("run coordinator")
}

fn json_run(dir: &Path, args: &[&str]) -> Value {
    let out = coordinator(dir, args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim().lines().count(), 1, "--json prints one line: {stdout}");
    serde_json::from_str(stdout.trim()).expect("stdout is one JSON object")
}

/// Asserts a failed run: non-zero exit, one `error:` line naming `needles`, no panic.
fn assert_clean_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one clear line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "error should name {n:?}: {stderr}");
    }
}

/// A writable copy of a fixture.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

#[test]
fn generate_json_has_the_contract_fields_and_reference_ids() {
    let r = reference("olmoe");
    let prompt = ids(&r["prompt_ids"]);
    let v = json_run(
        &fixture("olmoe"),
        &[
            "generate",
            "--prompt-ids",
            &csv(&prompt),
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ],
    );
    assert_eq!(ids(&v["prompt_ids"]), prompt);
    assert_eq!(ids(&v["ids"]), ids(&r["greedy_ids"]));
    assert_eq!(v["text"], "");
    assert_eq!(v["finish_reason"], "length");
    let s = &v["stats"];
    assert_eq!(s["prompt_tokens"], prompt.len());
    assert_eq!(s["generated_tokens"], 16);
    for k in ["ttft_ms", "prefill_tok_s", "decode_tok_s"] {
        assert!(s[k].as_f64().unwrap() > 0.0, "{k} = {}", s[k]);
    }
    // The profile's attention parts: each measured, together inside the
    // attention phase (which also holds the norms and residual adds).
    let p = &s["profile"];
    let parts = &p["attention_parts"];
    let mut sum = 0.0;
    for k in ["qkv_ms", "heads_ms", "o_proj_ms"] {
        let ms = parts[k]
            .as_f64()
            .unwrap_or_else(|| panic!("attention_parts.{k} missing: {p}"));
        assert!(ms > 0.0, "attention_parts.{k} = {ms}");
        sum += ms;
    }
    assert!(
        sum <= p["attention_ms"].as_f64().unwrap(),
        "parts {sum} ms > attention: {p}"
    );
    // Keys and values of every cached position (prompt + all but the last
    // generated token), each layer's kv_dim wide, in f32.
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("olmoe").join("config.json")).unwrap()).unwrap();
    let (layers, kv_heads, heads, hidden) = (
        cfg["num_hidden_layers"].as_u64().unwrap(),
        cfg.get("num_key_value_heads")
            .and_then(Value::as_u64)
            .unwrap_or(cfg["num_attention_heads"].as_u64().unwrap()),
        cfg["num_attention_heads"].as_u64().unwrap(),
        cfg["hidden_size"].as_u64().unwrap(),
    );
    let positions = (prompt.len() + 15) as u64;
    let want = positions * layers * 2 * kv_heads * (hidden / heads) * 4;
    assert_eq!(s["kv_cache_bytes"].as_u64(), Some(want));
}

#[test]
fn f16_kv_cache_flag_keeps_the_reference_ids() {
    // Measured in tests/gguf_parity.rs: the f16 cache moves this fixture's
    // logits by ~3e-3, well inside every greedy margin of the reference.
    let r = reference("olmoe");
    let args = [
        "generate",
        "--prompt-ids",
        &csv(&ids(&r["prompt_ids"])),
        "--max-tokens",
        "16",
    ];
    let f16 = json_run(
        &fixture("olmoe"),
        &[&["--kv-cache", "f16"], &args[..], &["--ignore-eos", "--json"]].concat(),
    );
    assert_eq!(ids(&f16["ids"]), ids(&r["greedy_ids"]));
    let f32 = json_run(&fixture("olmoe"), &[&args[..], &["--ignore-eos", "--json"]].concat());
    let bytes = |v: &Value| v["stats"]["kv_cache_bytes"].as_u64().unwrap();
    assert_eq!(2 * bytes(&f16), bytes(&f32));
}

#[test]
fn chat_flag_renders_the_template_and_generates_reference_ids() {
    let dir = fixture("qwen3moe-chat");
    assert!(
        dir.join("tokenizer.json").exists(),
        "run scripts/fetch_test_material.sh to fetch the Qwen3 tokenizer"
    );
    let r = reference("qwen3moe-chat");
    let v = json_run(
        &dir,
        &[
            "generate",
            "--prompt",
            "What is the capital of France?",
            "--chat",
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ],
    );
    assert_eq!(ids(&v["prompt_ids"]), ids(&r["prompt_ids"]));
    assert_eq!(ids(&v["ids"]), ids(&r["greedy_ids"]));
    assert!(!v["text"].as_str().unwrap().is_empty());
}

/// `chat` prints a reasoning model's reasoning on stderr and its answer
/// on stdout; `--reasoning-budget` closes the reasoning after that many
/// tokens so the model answers. Qwen3.5's template opens the `<think>`
/// block in the prompt; the random fixture never closes it itself.
#[test]
fn chat_keeps_reasoning_apart_and_caps_it() {
    let template = repo().join("tests/material/templates/Qwen3.5-4B.jinja");
    let run = |budget: Option<&str>| {
        let mut args = vec![
            std::ffi::OsStr::new("--chat-template"),
            template.as_os_str(),
            "chat".as_ref(),
            "--max-tokens".as_ref(),
            "12".as_ref(),
            "--ignore-eos".as_ref(),
        ];
        if let Some(n) = budget {
            args.extend([std::ffi::OsStr::new("--reasoning-budget"), std::ffi::OsStr::new(n)]);
        }
        chat_repl(&args, b"Why is the sky blue?\n/exit\n")
    };
    let (answer, log) = run(None);
    assert_eq!(answer.trim(), "", "all twelve tokens are reasoning: {answer:?}");
    assert!(log.contains("12 generated"), "{log}");
    let (capped, capped_log) = run(Some("3"));
    assert!(
        !capped.trim().is_empty(),
        "the model answers after its reasoning: {capped_log}"
    );
    assert!(!capped.contains("think>"), "{capped:?}");
    assert!(capped_log.contains("12 generated"), "{capped_log}");
}

#[test]
fn chat_template_flag_replaces_the_models_template() {
    let dir = fixture("qwen3moe-chat");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
    )
    .unwrap();
    let t = file.to_str().unwrap();
    let v = json_run(
        &dir,
        &[
            "--chat-template",
            t,
            "generate",
            "--prompt",
            "Hi",
            "--chat",
            "--max-tokens",
            "2",
            "--json",
        ],
    );
    let codec = charm_coordinator::TextCodec::load(&dir).unwrap();
    let prompt: Vec<u32> = ids(&v["prompt_ids"]).into_iter().map(|i| i as u32).collect();
    assert_eq!(codec.decode(&prompt, false).unwrap(), "[user] Hi\n[assistant]");
    // A file that is missing or not a template: one clear line naming it.
    std::fs::write(tmp.path().join("broken.jinja"), "{% for m in messages %}").unwrap();
    for name in ["none.jinja", "broken.jinja"] {
        let file = tmp.path().join(name);
        let out = coordinator(
            &dir,
            &[
                "--chat-template",
                file.to_str().unwrap(),
                "generate",
                "--prompt",
                "Hi",
                "--chat",
            ],
        );
        assert_clean_failure(&out, &[name]);
    }
}

#[test]
fn streaming_text_is_the_json_text() {
    let dir = fixture("qwen3moe-chat");
    let args = [
        "generate",
        "--prompt",
        "Hello there",
        "--max-tokens",
        "12",
        "--ignore-eos",
    ];
    let out = coordinator(&dir, &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let streamed = String::from_utf8(out.stdout).unwrap();
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v = json_run(&dir, &json_args);
    assert_eq!(streamed.strip_suffix('\n').unwrap(), v["text"].as_str().unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("12 generated"), "summary line: {stderr}");
}

#[test]
fn sampling_is_reproducible_with_a_seed() {
    let r = reference("mixtral");
    let p = csv(&ids(&r["prompt_ids"]));
    let run = |seed: &str| {
        ids(&json_run(
            &fixture("mixtral"),
            &[
                "generate",
                "--prompt-ids",
                &p,
                "--max-tokens",
                "24",
                "--ignore-eos",
                "--temperature",
                "1.5",
                "--top-p",
                "0.95",
                "--top-k",
                "50",
                "--seed",
                seed,
                "--json",
            ],
        )["ids"])
    };
    let a = run("7");
    assert_eq!(a, run("7"));
    assert_ne!(a, run("8"));
}

#[test]
fn penalties_steer_a_greedy_run() {
    let r = reference("mixtral");
    let p = csv(&ids(&r["prompt_ids"]));
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--prompt-ids",
            &p,
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        ids(&json_run(&fixture("mixtral"), &args)["ids"])
    };
    let greedy = run(&[]);
    assert_eq!(greedy, ids(&r["greedy_ids"])[..16]);
    // A frequency penalty of 2 outweighs a repeat the plain run makes;
    // a negative presence penalty (parsed as a number) favours repeats.
    assert!(
        greedy.iter().enumerate().any(|(i, t)| greedy[..i].contains(t)),
        "the fixture's greedy run repeats a token: {greedy:?}"
    );
    let fresh = run(&["--frequency-penalty", "2", "--repetition-penalty", "1.3"]);
    assert_ne!(fresh, greedy);
    let again = run(&["--presence-penalty", "-1.5"]);
    assert_ne!(again, fresh);
    assert_eq!(again, run(&["--presence-penalty", "-1.5"]));
}

#[test]
fn stops_at_eos_unless_told_to_ignore_it() {
    let r = reference("qwen2moe");
    let greedy = ids(&r["greedy_ids"]);
    let tmp = copy_fixture("qwen2moe");
    // Make the 4th greedy token the model's end-of-sequence id.
    std::fs::write(
        tmp.path().join("generation_config.json"),
        format!("{{\"eos_token_id\": [{}]}}", greedy[3]),
    )
    .unwrap();
    let p = csv(&ids(&r["prompt_ids"]));
    let v = json_run(
        tmp.path(),
        &["generate", "--prompt-ids", &p, "--max-tokens", "16", "--json"],
    );
    assert_eq!(ids(&v["ids"]), greedy[..4]);
    assert_eq!(v["finish_reason"], "stop");
    let v = json_run(
        tmp.path(),
        &[
            "generate",
            "--prompt-ids",
            &p,
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ],
    );
    assert_eq!(ids(&v["ids"]), greedy);
    let v = json_run(
        tmp.path(),
        &["generate", "--prompt-ids", &p, "--max-tokens", "2", "--json"],
    );
    assert_eq!(ids(&v["ids"]), greedy[..2]);
    assert_eq!(v["finish_reason"], "length");
}

/// `coordinator --local --model qwen3moe-chat ARGS` fed `input` on stdin:
/// its stdout and stderr (it must succeed).
fn chat_repl(args: &[&std::ffi::OsStr], input: &[u8]) -> (String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args(["--local", "--model"])
        .arg(fixture("qwen3moe-chat"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn chat_repl_answers_each_turn() {
    let args = ["chat", "--max-tokens", "5", "--ignore-eos"].map(std::ffi::OsStr::new);
    let (stdout, stderr) = chat_repl(&args, b"What is the capital of France?\nAnd of Italy?\n/exit\n");
    assert_eq!(stdout.lines().count(), 2, "one answer line per turn: {stdout:?}");
    assert_eq!(stderr.matches("5 generated").count(), 2, "{stderr}");
}

#[test]
fn worker_binary_reports_its_version() {
    let worker = Path::new(env!("CARGO_BIN_EXE_coordinator")).with_file_name("worker");
    if !worker.exists() {
        // Built by `cargo test --workspace`; a `-p charm-coordinator` run may not have it.
        return;
    }
    let out = Command::new(worker).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("worker "));
}

// ---- bad input: a clear error naming the file and tensor, never a panic ----

#[test]
fn missing_model_dir_and_missing_weights() {
    let out = coordinator(Path::new("/nonexistent/model"), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["/nonexistent/model", "not found"]);
    let tmp = copy_fixture("olmoe");
    std::fs::remove_file(tmp.path().join("model.safetensors")).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors"]);
    let tmp = copy_fixture("olmoe");
    std::fs::remove_file(tmp.path().join("config.json")).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["config.json"]);
}

#[test]
fn missing_shard_is_named() {
    let tmp = copy_fixture("qwen3moe");
    std::fs::remove_file(tmp.path().join("model-00002-of-00004.safetensors")).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model-00002-of-00004.safetensors"]);
}

#[test]
fn truncated_and_corrupt_safetensors() {
    let tmp = copy_fixture("olmoe");
    let path = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors", "not a valid safetensors file"]);

    std::fs::write(&path, &bytes[..5]).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors", "not a valid safetensors file"]);

    let mut corrupt = bytes.clone();
    corrupt[8..24].copy_from_slice(b"garbage!garbage!");
    std::fs::write(&path, &corrupt).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors", "not a valid safetensors file"]);

    let mut huge = bytes;
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, &huge).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors"]);
}

/// Rewrites the safetensors header of `path` with `edit` (same data bytes).
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

#[test]
fn unsupported_dtype_names_file_and_tensor() {
    let tmp = copy_fixture("olmoe");
    let path = tmp.path().join("model.safetensors");
    let name = "model.layers.1.self_attn.k_proj.weight";
    edit_header(&path, |h| h[name]["dtype"] = Value::from("I32"));
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors", name, "I32"]);
}

#[test]
fn shape_mismatch_names_file_and_tensor() {
    let tmp = copy_fixture("olmoe");
    let path = tmp.path().join("model.safetensors");
    let name = "model.layers.0.mlp.experts.3.up_proj.weight";
    // Same byte count, transposed shape.
    edit_header(&path, |h| {
        let shape: Vec<u64> = h[name]["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        h[name]["shape"] = Value::from(vec![shape[1], shape[0]]);
    });
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors", name, "shape"]);

    // A config that disagrees with the weights.
    let tmp = copy_fixture("mixtral");
    let cfg_path = tmp.path().join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["intermediate_size"] = Value::from(cfg["intermediate_size"].as_u64().unwrap() + 1);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["model.safetensors", "w1.weight", "shape"]);
}

#[test]
fn missing_tensor_is_named() {
    let tmp = copy_fixture("qwen2moe");
    let path = tmp.path().join("model.safetensors");
    let name = "model.layers.1.mlp.shared_expert_gate.weight";
    edit_header(&path, |h| {
        let v = h.remove(name).unwrap();
        h.insert("unused.renamed".into(), v);
    });
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &[name, "not found"]);
}

#[test]
fn unknown_architecture_is_named_with_the_supported_list() {
    let tmp = copy_fixture("olmoe");
    let cfg_path = tmp.path().join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["architectures"] = serde_json::json!(["GptNeoForWhatever"]);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(
        &out,
        &[
            "GptNeoForWhatever",
            "OlmoeForCausalLM",
            "Qwen3MoeForCausalLM",
            "MixtralForCausalLM",
            "Qwen2MoeForCausalLM",
        ],
    );
    std::fs::write(&cfg_path, "{ not json").unwrap();
    let out = coordinator(tmp.path(), &["generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["config.json", "not valid JSON"]);
}

#[test]
fn bad_requests_are_clear_errors() {
    let dir = fixture("olmoe");
    let out = coordinator(&dir, &["generate", "--prompt-ids", "5,99999"]);
    assert_clean_failure(&out, &["99999", "vocabulary"]);
    let out = coordinator(&dir, &["generate", "--prompt", "hello"]);
    assert_clean_failure(&out, &["tokenizer.json", "--prompt-ids"]);
    let out = coordinator(&dir, &["generate", "--prompt-ids", "1", "--top-p", "0"]);
    assert_clean_failure(&out, &["top-p"]);
    let out = coordinator(&dir, &["generate", "--prompt-ids", "1", "--temperature=-1"]);
    assert_clean_failure(&out, &["temperature"]);
    let out = coordinator(&dir, &["generate", "--prompt-ids", "1", "--min-p", "2"]);
    assert_clean_failure(&out, &["min-p"]);
    let out = coordinator(&dir, &["generate", "--prompt-ids", "1", "--frequency-penalty", "-3"]);
    assert_clean_failure(&out, &["frequency-penalty", "[-2, 2]"]);
    let out = Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args(["--model"])
        .arg(&dir)
        .args(["generate", "--prompt-ids", "1"])
        .output()
        .unwrap();
    assert_clean_failure(&out, &["--local"]);
    let out = coordinator(&dir, &["--kv-cache", "f8", "generate", "--prompt-ids", "1"]);
    assert_clean_failure(&out, &["f8", "f32 or f16"]);
    let long: Vec<u64> = (0..600).map(|i| 3 + i % 500).collect();
    let out = coordinator(&dir, &["generate", "--prompt-ids", &csv(&long), "--max-tokens", "1"]);
    assert_clean_failure(&out, &["context"]);
}

// ---- containers: convert, then run with a budget ----

fn convert_cli(src: &Path, out: &Path, quant: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .arg("--model")
        .arg(src)
        .args(["convert", "--out"])
        .arg(out)
        .args(["--quant", quant])
        .args(extra)
        .output()
        .expect("run coordinator convert")
}

#[test]
fn convert_then_generate_from_the_container_with_store_stats() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("mixtral-bf16");
    let o = convert_cli(&fixture("mixtral"), &out, "bf16", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("wrote"));
    let r = reference("mixtral");
    let p = csv(&ids(&r["prompt_ids"]));
    for cache in ["0", "0.0001", "4"] {
        let out_json = coordinator(
            &out,
            &[
                "--expert-cache-gb",
                cache,
                // A state dir per run: a later run would otherwise pin what
                // the earlier ones learned before its prompt (timing-dependent
                // prefill reads); that warm start has tests of its own.
                "--state-dir",
                tmp.path().join(format!("state-{cache}")).to_str().unwrap(),
                "generate",
                "--prompt-ids",
                &p,
                "--max-tokens",
                "16",
                "--ignore-eos",
                "--json",
            ],
        );
        assert!(
            out_json.status.success(),
            "{}",
            String::from_utf8_lossy(&out_json.stderr)
        );
        let v: Value = serde_json::from_slice(&out_json.stdout).unwrap();
        assert_eq!(ids(&v["ids"]), ids(&r["greedy_ids"]), "cache {cache}");
        let s = &v["stats"];
        for k in [
            "expert_hits",
            "expert_misses",
            "expert_bytes_read",
            "io_wait_ms",
            "prefetch_hits",
            "prefetch_issued",
            "prefetch_wasted",
            "prefetch_harm",
            "prefetch_paused_steps",
            "prefetch_stand_downs",
            "cache_bytes",
        ] {
            assert!(s[k].is_number(), "stats.{k} missing: {s}");
        }
        if cache == "0" {
            assert_eq!(s["expert_hits"], 0);
            assert_eq!(s["cache_bytes"], 0);
            assert!(s["expert_bytes_read"].as_u64().unwrap() > 0);
        }
        // The prompt's share of the reads, the load time and the peak RSS.
        let prefill_read = s["prefill_expert_bytes_read"]
            .as_u64()
            .expect("prefill_expert_bytes_read");
        assert!(prefill_read > 0 && prefill_read <= s["expert_bytes_read"].as_u64().unwrap());
        assert!(v["load_s"].as_f64().is_some_and(|t| t > 0.0), "load_s: {v}");
        if cfg!(target_os = "linux") {
            assert!(
                v["peak_rss_bytes"].as_u64().is_some_and(|b| b > 0),
                "peak_rss_bytes: {v}"
            );
        }
        let stderr = String::from_utf8_lossy(&out_json.stderr);
        assert!(
            stderr.contains("bf16 container, expert cache"),
            "start-up line: {stderr}"
        );
    }
    // --repeat: one JSON line per run in one process; the later run finds
    // every expert the first read still cached, and gives the same ids.
    let o = coordinator(
        &out,
        &[
            "--expert-cache-gb",
            "4",
            "--state-dir",
            tmp.path().join("state-repeat").to_str().unwrap(),
            "generate",
            "--prompt-ids",
            &p,
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
            "--repeat",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let runs: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    assert_eq!(ids(&runs[0]["ids"]), ids(&r["greedy_ids"]));
    assert_eq!(ids(&runs[1]["ids"]), ids(&r["greedy_ids"]));
    assert!(runs[0]["stats"]["expert_bytes_read"].as_u64().unwrap() > 0);
    assert_eq!(runs[1]["stats"]["expert_bytes_read"], 0, "warm: {}", runs[1]["stats"]);
    let o = coordinator(&out, &["generate", "--prompt-ids", &p, "--repeat", "2"]);
    assert!(!o.status.success(), "--repeat needs --json");
    // Without --json: streamed output and a one-line summary with the store's numbers.
    let o = coordinator(
        &out,
        &[
            "--expert-cache-gb",
            "0",
            "generate",
            "--prompt-ids",
            &p,
            "--max-tokens",
            "4",
        ],
    );
    assert!(o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("MiB read") && stderr.contains("hits"), "{stderr}");
}

#[test]
fn convert_refuses_bad_requests_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let o = convert_cli(&fixture("olmoe"), &out, "int4", &["--group", "48"]);
    assert_clean_failure(&o, &["--group", "32 or 64"]);
    let o = convert_cli(&fixture("olmoe"), &out, "bf16", &["--group", "32"]);
    assert_clean_failure(&o, &["--group"]);
    let o = convert_cli(&fixture("olmoe"), &out, "int8", &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = convert_cli(&fixture("olmoe"), &out, "int8", &[]);
    assert_clean_failure(&o, &["already exists"]);
    let o = convert_cli(&out, &tmp.path().join("again"), "int8", &[]);
    assert_clean_failure(&o, &["already a charm container"]);
    let o = coordinator(&out, &["--expert-cache-gb=-1", "generate", "--prompt-ids", "1"]);
    assert_clean_failure(&o, &["--expert-cache-gb"]);
}

/// `generate --batch-file`: every line's prompt at once, each getting the
/// reference ids it gets alone; a bad line is one clear error naming it.
#[test]
fn batch_file_generates_every_prompt_with_its_own_ids() {
    let r = reference("olmoe");
    let prompt = ids(&r["prompt_ids"]);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("prompts.txt");
    // The reference prompt, a shorter one, and a blank line (skipped).
    std::fs::write(&file, format!("{}\n\n{}\n", csv(&prompt), csv(&prompt[2..6]))).unwrap();
    let f = file.to_str().unwrap();
    let args = [
        "generate",
        "--batch-file",
        f,
        "--batch-ids",
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--json",
    ];
    let v = json_run(&fixture("olmoe"), &args);
    let seqs = v["sequences"].as_array().unwrap();
    assert_eq!(seqs.len(), 2);
    assert_eq!(ids(&seqs[0]["prompt_ids"]), prompt);
    assert_eq!(ids(&seqs[0]["ids"]), ids(&r["greedy_ids"]));
    assert_eq!(seqs[0]["finish_reason"], "length");
    let alone = json_run(
        &fixture("olmoe"),
        &[
            "generate",
            "--prompt-ids",
            &csv(&prompt[2..6]),
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--json",
        ],
    );
    assert_eq!(seqs[1]["ids"], alone["ids"]);
    let s = &v["stats"];
    assert_eq!(s["generated_tokens"], 32);
    assert_eq!(s["prompt_tokens"], prompt.len() + 4);
    assert!(s["tok_s"].as_f64().unwrap() > 0.0);
    assert!(s["expert_hits"].as_u64().unwrap() > 0);

    std::fs::write(&file, "1,2\n3,x\n").unwrap();
    let out = coordinator(&fixture("olmoe"), &args);
    assert_clean_failure(&out, &["line 2", "token ids"]);
    // Text lines need the model's tokenizer (the fixture has none).
    let out = coordinator(&fixture("olmoe"), &["generate", "--batch-file", f]);
    assert_clean_failure(&out, &["no tokenizer", "--batch-ids"]);
}
