//! System One decisions: `POST /v1/systemone` answers typed questions about
//! one state by scoring each option's tokens — never by generating.
//!
//! Request: `model`, `state` (text, or any JSON value, shown as JSON),
//! `instructions` (optional; replaces the default system text), and
//! `questions`, each with an `id` (optional), its `question` and a `type`:
//! - `choice`: one of `labels` (2 to [`MAX_OPTIONS`] distinct strings);
//! - `noul`: a yes/no question (options `yes`, `no`);
//! - `score`: a level, `levels` N (2 to 10: options `1` … `N`) or its own
//!   `labels`; the answer also carries `expected`, the probability-weighted
//!   level (1-based).
//!
//! Each question is a chat turn: the system message holds the instructions
//! and the state, the user message the question and its options, and
//! thinking is off (`enable_thinking=false` for templates that read it).
//! An option's score is the model's teacher-forced log-probability of its
//! tokens after the assistant prompt, and of the answer ending there (any
//! end-of-sequence token) — so an option that is the start of another (`1`
//! and `10`) is told apart. The options' probabilities are the softmax of
//! those scores (they sum to 1). `confidence` is `1 − H(p) / ln(n)`: 1 when
//! one option takes all the probability, 0 when all are equally likely.
//!
//! The state's tokens are computed once for all the questions (and kept in
//! the prefix cache, so a later request about the same state starts after
//! it): every question's prompt shares them, then each question's own
//! tokens continue a copy of that cache, and each option a copy of the
//! question's. The scores are those of [`crate::Engine::forward`] on the
//! whole sequence (the one rule: a cache copy changes no bit). The request
//! runs on the engine thread between two steps of the running batch.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::{ApiError, ErrorKind};
use super::queue::Job;
use super::{json_response, new_id, parse_body, reserve, unix_now, unknown_model, AppState};
use crate::chat_template::{py_json, Message};
use crate::engine::{Engine, GenerateParams};
use crate::text::TextCodec;
use charm_models::{KvCache, ModelError};
use tokio::sync::oneshot;

/// Most questions in one request.
pub const MAX_QUESTIONS: usize = 32;
/// Most options of one question.
pub const MAX_OPTIONS: usize = 64;
/// Longest option label, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;

const DEFAULT_INSTRUCTIONS: &str =
    "You make quick decisions about the state below. Answer each question with exactly one of its options, \
     nothing else.";

#[derive(Debug, Deserialize)]
struct DecideRequest {
    #[serde(default)]
    model: Option<String>,
    state: Value,
    #[serde(default)]
    instructions: Option<String>,
    questions: Vec<QuestionIn>,
}

#[derive(Debug, Deserialize)]
struct QuestionIn {
    #[serde(default)]
    id: Option<String>,
    #[serde(rename = "type")]
    kind: String,
    question: String,
    #[serde(default)]
    labels: Option<Vec<String>>,
    #[serde(default)]
    levels: Option<u32>,
}

/// A question as the engine thread scores it.
#[derive(Clone, Debug)]
pub struct ScoreQuestion {
    /// The whole prompt (the job's shared prefix first).
    pub prompt: Vec<u32>,
    /// Each option's tokens.
    pub options: Vec<Vec<u32>>,
}

/// What a scoring job asks of the engine thread, and where its answer goes.
#[derive(Debug)]
pub struct ScoreJob {
    pub questions: Vec<ScoreQuestion>,
    pub reply: Option<oneshot::Sender<Result<Scored, ModelError>>>,
}

/// A scoring job's result: per question, per option; and the prompt tokens
/// the prefix cache served.
#[derive(Debug)]
pub struct Scored {
    pub scores: Scores,
    pub cached_tokens: usize,
}

/// One question's result: each option's score (log-probability of its
/// tokens and of the end after them).
pub type Scores = Vec<Vec<f64>>;

/// `log Σ exp(logits[ids])` against the log-normalizer of `logits`.
fn logprob_of(logits: &[f32], ids: &[u32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let p: f64 = ids
        .iter()
        .filter_map(|&i| logits.get(i as usize))
        .map(|&x| (x as f64 - max).exp())
        .sum();
    (p / z).ln()
}

/// An option's score after `logits` (the prompt's last row) with `cache`
/// holding the prompt: Σ log p(token) over its tokens, + log p(end).
pub fn option_score(
    engine: &Engine,
    cache: &KvCache,
    logits: &[f32],
    option: &[u32],
    eos: &[u32],
) -> Result<f64, ModelError> {
    let vocab = logits.len();
    let mut c = cache.clone();
    let rows = engine.forward(option, &mut c, true)?;
    let mut score = logprob_of(logits, &option[..1]);
    for (t, &id) in option.iter().enumerate().skip(1) {
        score += logprob_of(&rows[(t - 1) * vocab..t * vocab], &[id]);
    }
    let last = option.len() - 1;
    Ok(score + logprob_of(&rows[last * vocab..(last + 1) * vocab], eos))
}

/// Scores every option of every question: the shared prefix (`shared`
/// tokens, already in `cache` up to `cache.len()`) once, each question's
/// rest (never empty, [`shared_prefix`]) on a copy. Returns the scores, the
/// shared prefix's cache and its last logits (when it computed any).
pub fn score(
    engine: &Engine,
    shared: &[u32],
    mut cache: KvCache,
    job: &ScoreJob,
) -> Result<(Scores, KvCache, Option<Vec<f32>>), ModelError> {
    let eos = &engine.config().eos_token_ids;
    let chunk = engine.prefill_chunk.max(1);
    let mut shared_logits = None;
    for c in shared[cache.len()..].chunks(chunk) {
        shared_logits = Some(engine.forward(c, &mut cache, false)?);
    }
    let mut out = Vec::with_capacity(job.questions.len());
    for q in &job.questions {
        let mut qc = cache.clone();
        let mut ql = Vec::new();
        for c in q.prompt[shared.len()..].chunks(chunk) {
            ql = engine.forward(c, &mut qc, false)?;
        }
        let scores = q
            .options
            .iter()
            .map(|o| option_score(engine, &qc, &ql, o, eos))
            .collect::<Result<Vec<f64>, _>>()?;
        out.push(scores);
    }
    Ok((out, cache, shared_logits))
}

/// Probabilities (softmax of the scores) and the confidence `1 − H/ln n`.
pub fn probabilities(scores: &[f64]) -> (Vec<f64>, f64) {
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let z: f64 = e.iter().sum();
    let p: Vec<f64> = e.iter().map(|x| x / z).collect();
    let h: f64 = p.iter().filter(|&&x| x > 0.0).map(|x| -x * x.ln()).sum();
    let n = p.len() as f64;
    (p, (1.0 - h / n.ln()).clamp(0.0, 1.0))
}

/// A question's options, checked.
fn options_of(q: &QuestionIn, at: &str) -> Result<Vec<String>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("questions", m);
    let labels = match (q.kind.as_str(), &q.labels, q.levels) {
        ("noul", None, None) => vec!["yes".to_string(), "no".to_string()],
        ("noul", _, _) => {
            return Err(bad(format!(
                "{at}: a noul question has the options yes and no; give no labels"
            )))
        }
        ("choice", Some(l), None) => l.clone(),
        ("choice", _, _) => return Err(bad(format!("{at}: a choice question needs labels (and no levels)"))),
        ("score", None, Some(n)) if (2..=10).contains(&n) => (1..=n).map(|i| i.to_string()).collect(),
        ("score", None, Some(n)) => return Err(bad(format!("{at}.levels is {n}; 2 to 10 levels are allowed"))),
        ("score", Some(l), None) => l.clone(),
        ("score", _, _) => {
            return Err(bad(format!(
                "{at}: a score question needs levels or labels (one of them)"
            )))
        }
        (k, _, _) => return Err(bad(format!("{at}.type {k:?} is not choice, noul or score"))),
    };
    if labels.len() < 2 || labels.len() > MAX_OPTIONS {
        return Err(bad(format!(
            "{at}: {} options; 2 to {MAX_OPTIONS} are allowed",
            labels.len()
        )));
    }
    for (i, l) in labels.iter().enumerate() {
        if l.trim().is_empty() || l.len() > MAX_LABEL_BYTES {
            return Err(bad(format!(
                "{at}.labels[{i}] must be 1 to {MAX_LABEL_BYTES} bytes of text"
            )));
        }
        if labels[..i].contains(l) {
            return Err(bad(format!("{at}.labels[{i}] {l:?} is given twice")));
        }
    }
    Ok(labels)
}

/// The chat messages of one question.
pub fn question_messages(instructions: &str, state: &str, question: &str, options: &[String]) -> Vec<Message> {
    vec![
        Message::new("system", &format!("{instructions}\n\nState:\n{state}")),
        Message::new("user", &format!("{question}\nOptions: {}", options.join(", "))),
    ]
}

/// Tokenizes every question and option (on a blocking thread).
fn tokenize(
    codec: &TextCodec,
    instructions: &str,
    state: &str,
    questions: &[(String, Vec<String>)],
) -> Result<ScoreJob, ApiError> {
    let off = [("enable_thinking", minijinja::Value::from(false))];
    let mut out = Vec::with_capacity(questions.len());
    for (question, options) in questions {
        let msgs = question_messages(instructions, state, question, options);
        let prompt = codec
            .encode_chat(&msgs, true, &off)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        let mut opts = Vec::with_capacity(options.len());
        for o in options {
            let ids = codec
                .encode_plain(o)
                .map_err(|e| ApiError::new(ErrorKind::Server, e.to_string()))?;
            if ids.is_empty() {
                return Err(ApiError::invalid_param(
                    "questions",
                    format!("the option {o:?} has no tokens"),
                ));
            }
            opts.push(ids);
        }
        out.push(ScoreQuestion { prompt, options: opts });
    }
    Ok(ScoreJob {
        questions: out,
        reply: None,
    })
}

/// The longest token prefix every question's prompt shares.
pub fn shared_prefix(job: &ScoreJob) -> Vec<u32> {
    let first = &job.questions[0].prompt;
    let n = job.questions.iter().fold(first.len(), |n, q| {
        n.min(first.iter().zip(&q.prompt).take_while(|(a, b)| a == b).count())
    });
    // Each question keeps at least its last token to compute.
    let n = job.questions.iter().fold(n, |n, q| n.min(q.prompt.len() - 1));
    first[..n].to_vec()
}

/// `POST /v1/systemone`.
pub async fn decide(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match decide_inner(st, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn decide_inner(st: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: DecideRequest = parse_body(body, st.config.max_body_bytes)?;
    if let Some(name) = req.model.as_deref() {
        if !st.model.matches(name) {
            return Err(unknown_model(&st.model, name));
        }
    }
    if !st.codec.has_template() {
        return Err(ApiError::invalid(
            "this model has no chat template; System One needs one",
        ));
    }
    if req.questions.is_empty() || req.questions.len() > MAX_QUESTIONS {
        return Err(ApiError::invalid_param(
            "questions",
            format!("{} questions; 1 to {MAX_QUESTIONS} are allowed", req.questions.len()),
        ));
    }
    let state = match &req.state {
        Value::String(s) => s.clone(),
        Value::Null => return Err(ApiError::invalid_param("state", "state is required")),
        v => py_json(v),
    };
    let mut asked = Vec::with_capacity(req.questions.len());
    for (i, q) in req.questions.iter().enumerate() {
        let at = format!("questions[{i}]");
        if q.question.trim().is_empty() {
            return Err(ApiError::invalid_param("questions", format!("{at}.question is empty")));
        }
        asked.push((q.question.clone(), options_of(q, &at)?));
    }
    let instructions = req
        .instructions
        .clone()
        .unwrap_or_else(|| DEFAULT_INSTRUCTIONS.to_string());
    let slot = reserve(&st)?;
    let codec = st.codec.clone();
    let qs = asked.clone();
    let mut job = tokio::task::spawn_blocking(move || tokenize(&codec, &instructions, &state, &qs))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Server, format!("tokenizing: {e}")))??;
    let longest = job
        .questions
        .iter()
        .map(|q| q.prompt.len() + q.options.iter().map(Vec::len).max().unwrap_or(0))
        .max();
    if longest.unwrap_or(0) >= st.model.context {
        return Err(ApiError::invalid(format!(
            "a question with its state is {} tokens; this model's context is {} tokens",
            longest.unwrap_or(0),
            st.model.context
        )));
    }
    let shared = shared_prefix(&job);
    let total: usize = shared.len()
        + job
            .questions
            .iter()
            .map(|q| q.prompt.len() - shared.len() + q.options.iter().map(Vec::len).sum::<usize>())
            .sum::<usize>();
    let id = new_id("s1-");
    // The event channel only tells the engine thread whether the client is
    // still there; the scores come back on their own channel.
    let (tx, _events) = tokio::sync::mpsc::unbounded_channel();
    let (reply, scored) = oneshot::channel();
    job.reply = Some(reply);
    slot.send(Job {
        id: id.clone(),
        api: "systemone",
        prompt: shared,
        params: GenerateParams {
            max_tokens: 0,
            sampling: Default::default(),
            ignore_eos: false,
        },
        stop: Vec::new(),
        logprobs: None,
        constraint: None,
        think_budget: None,
        grammar_after_reasoning: false,
        keep_special: false,
        score: Some(job),
        events: tx,
        arrived: std::time::Instant::now(),
    });
    let (scores, cached) = match scored.await {
        Ok(Ok(s)) => (s.scores, s.cached_tokens),
        Ok(Err(e)) => {
            let kind = if matches!(e, ModelError::BadInput(_)) {
                ErrorKind::InvalidRequest
            } else {
                ErrorKind::Server
            };
            return Err(ApiError::new(kind, e.to_string()));
        }
        Err(_) => return Err(ApiError::new(ErrorKind::Server, "the engine stopped")),
    };
    let answers: Vec<Value> = req
        .questions
        .iter()
        .zip(&asked)
        .zip(&scores)
        .enumerate()
        .map(|(i, ((q, (_, labels)), s))| {
            let (p, confidence) = probabilities(s);
            let best = (0..p.len()).fold(0, |b, j| if p[j] > p[b] { j } else { b });
            let mut a = json!({
                "id": q.id.clone().unwrap_or_else(|| format!("q{i}")),
                "type": q.kind,
                "answer": labels[best],
                "confidence": confidence,
                "probabilities": labels.iter().zip(&p).map(|(l, p)| json!({"label": l, "probability": p})).collect::<Vec<_>>(),
                "logprobs": s,
            });
            if q.kind == "score" {
                a["expected"] = json!(p.iter().enumerate().map(|(j, p)| (j + 1) as f64 * p).sum::<f64>());
            }
            a
        })
        .collect();
    let body = json!({
        "id": id,
        "object": "systemone.decision",
        "created": unix_now(),
        "model": st.model.id,
        "answers": answers,
        "usage": {"prompt_tokens": total, "cached_tokens": cached},
    });
    Ok(json_response(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_sum_to_one_and_confidence_spans_zero_to_one() {
        let (p, c) = probabilities(&[-1.0, -1.0, -1.0]);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(c.abs() < 1e-12, "uniform: no confidence");
        let (p, c) = probabilities(&[0.0, -800.0]);
        assert!((p[0] - 1.0).abs() < 1e-12 && c > 0.999_999);
        let (p, _) = probabilities(&[(0.75f64).ln(), (0.25f64).ln()]);
        assert!((p[0] - 0.75).abs() < 1e-12);
    }

    #[test]
    fn options_by_type_and_bad_ones() {
        let q = |kind: &str, labels: Option<Vec<&str>>, levels: Option<u32>| QuestionIn {
            id: None,
            kind: kind.into(),
            question: "?".into(),
            labels: labels.map(|l| l.into_iter().map(String::from).collect()),
            levels,
        };
        assert_eq!(options_of(&q("noul", None, None), "q").unwrap(), ["yes", "no"]);
        assert_eq!(options_of(&q("score", None, Some(3)), "q").unwrap(), ["1", "2", "3"]);
        assert_eq!(
            options_of(&q("choice", Some(vec!["a", "b"]), None), "q").unwrap(),
            ["a", "b"]
        );
        for (bad, why) in [
            (q("choice", None, None), "needs labels"),
            (q("choice", Some(vec!["a"]), None), "2 to"),
            (q("choice", Some(vec!["a", "a"]), None), "twice"),
            (q("choice", Some(vec!["a", " "]), None), "bytes of text"),
            (q("score", None, Some(11)), "2 to 10"),
            (q("noul", Some(vec!["y", "n"]), None), "give no labels"),
            (q("vote", None, None), "not choice"),
        ] {
            let e = options_of(&bad, "q").unwrap_err();
            assert!(e.message.contains(why), "{why}: {}", e.message);
        }
    }

    #[test]
    fn the_shared_prefix_leaves_each_question_a_token() {
        let job = |prompts: &[&[u32]]| ScoreJob {
            questions: prompts
                .iter()
                .map(|p| ScoreQuestion {
                    prompt: p.to_vec(),
                    options: vec![vec![1]],
                })
                .collect(),
            reply: None,
        };
        assert_eq!(shared_prefix(&job(&[&[1, 2, 3, 4], &[1, 2, 5]])), [1, 2]);
        assert_eq!(shared_prefix(&job(&[&[1, 2, 3]])), [1, 2]);
        assert_eq!(shared_prefix(&job(&[&[1, 2, 3], &[1, 2, 3]])), [1, 2]);
    }
}
