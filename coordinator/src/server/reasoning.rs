//! Reasoning kept apart from the answer.
//!
//! Thinking models write their reasoning between `<think>` and `</think>`
//! before the answer (Qwen3, QwQ, DeepSeek-R1, GLM-4.5+, MiniMax-M2); some
//! templates open the block in the prompt, so the answer starts inside it
//! and only `</think>` comes ([`opens_inside`]). The reasoning goes to
//! OpenAI-style servers' `reasoning_content`, Anthropic `thinking` blocks
//! and the Responses API's `reasoning` items; the rest is the answer, and
//! tool calls are looked for there only.
//!
//! Only a block at the very start of the answer (after blank space) is
//! reasoning; a `<think>` later in the answer is the answer's text. Blank
//! space around the reasoning and between it and the answer is dropped, as
//! the templates drop it when they render an earlier turn; an answer
//! without reasoning is left exactly as written. Streamed or
//! whole, the split is the same: text that may still be the start of a tag
//! (or blank space that may end the reasoning) is held back.
//!
//! Requests switch thinking with `enable_thinking`, the variable Qwen3's
//! and GLM's templates read: `chat_template_kwargs` (as vLLM and
//! llama.cpp's server take it), OpenAI's `reasoning_effort` (`"none"`:
//! off), Anthropic's `thinking` (`disabled`: off) and the Responses API's
//! `reasoning.effort` ([`template_kwargs`]). A harmony template (gpt-oss)
//! takes the effort itself as `reasoning_effort` ([`harmony_effort`]);
//! its answers are split by channel ([`super::harmony`]), not here.

use serde_json::Value;

use super::error::ApiError;

/// The tags of a `<think>` block.
pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a chat template writes thinking blocks (its source mentions
/// either tag).
pub fn template_thinks(source: &str) -> bool {
    source.contains(OPEN) || source.contains(CLOSE)
}

/// Whether a rendered prompt's tail leaves a `<think>` block open (the
/// answer starts inside the reasoning).
pub fn opens_inside(prompt_tail: &str) -> bool {
    match (prompt_tail.rfind(OPEN), prompt_tail.rfind(CLOSE)) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Whether a rendered prompt's ids leave a `<think>` block open (its last
/// 16 tokens, decoded, hold the tags that matter).
pub fn prompt_opens_inside(codec: &crate::text::TextCodec, prompt: &[u32]) -> bool {
    let tail = &prompt[prompt.len().saturating_sub(16)..];
    opens_inside(&codec.decode(tail, false).unwrap_or_default())
}

/// Template variables a request sets: its `chat_template_kwargs` (`param`)
/// and `enable_thinking` (from the API's own switch; it wins). 400 for
/// names the server sets itself, names that are no identifiers, or more
/// than 32 of them.
pub fn template_kwargs(
    kwargs: Option<Value>,
    enable_thinking: Option<bool>,
    param: &'static str,
) -> Result<Vec<(String, Value)>, ApiError> {
    const RESERVED: [&str; 6] = [
        "messages",
        "tools",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "strftime_now",
    ];
    let mut out: Vec<(String, Value)> = match kwargs {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m.into_iter().collect(),
        Some(_) => return Err(ApiError::invalid_param(param, format!("{param} must be an object"))),
    };
    if out.len() > 32 {
        return Err(ApiError::invalid_param(
            param,
            format!("{param} has more than 32 entries"),
        ));
    }
    for (k, _) in &out {
        let ident = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident || RESERVED.contains(&k.as_str()) {
            return Err(ApiError::invalid_param(
                param,
                format!("{param}: {k:?} cannot be set (the server sets {RESERVED:?}; names are identifiers)"),
            ));
        }
    }
    if let Some(on) = enable_thinking {
        out.retain(|(k, _)| k != "enable_thinking");
        out.push(("enable_thinking".into(), Value::Bool(on)));
    }
    Ok(out)
}

/// For a harmony template (`harmony`), the request's reasoning `effort`
/// (already checked by [`effort_switch`]) as the template's
/// `reasoning_effort` ([`super::harmony::effort`]), unless the request's
/// `chat_template_kwargs` set it.
pub fn harmony_effort(kwargs: &mut Vec<(String, Value)>, harmony: bool, effort: Option<&str>) {
    let Some(effort) = effort.filter(|_| harmony) else {
        return;
    };
    if !kwargs.iter().any(|(k, _)| k == "reasoning_effort") {
        kwargs.push((
            "reasoning_effort".into(),
            Value::String(super::harmony::effort(effort).into()),
        ));
    }
}

/// An OpenAI reasoning effort as the `enable_thinking` switch (`param`:
/// the field, for the 400): `none` turns thinking off, the others leave it
/// on, no effort leaves the template's default.
pub fn effort_switch(effort: Option<&str>, param: &'static str) -> Result<Option<bool>, ApiError> {
    match effort {
        None => Ok(None),
        Some("none") => Ok(Some(false)),
        Some("minimal" | "low" | "medium" | "high" | "xhigh") => Ok(Some(true)),
        Some(other) => Err(ApiError::invalid_param(
            param,
            format!("{param} {other:?} is not one of none, minimal, low, medium, high, xhigh"),
        )),
    }
}

/// A piece of the split text (never empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but blank space yet: a `<think>` may still open.
    Start,
    Reasoning,
    /// Reasoning closed, only blank space since.
    AfterClose,
    Answer,
}

/// Splits streamed answer text into reasoning and answer.
#[derive(Debug)]
pub struct ThinkSplit {
    state: State,
    held: String,
    /// Reasoning was sent (blank space inside it is kept from then on).
    reasoned: bool,
}

impl ThinkSplit {
    /// `inside`: the prompt left a block open.
    pub fn new(inside: bool) -> Self {
        ThinkSplit {
            state: if inside { State::Reasoning } else { State::Start },
            held: String::new(),
            reasoned: false,
        }
    }

    /// Whether the text so far ended inside the reasoning.
    pub fn in_reasoning(&self) -> bool {
        self.state == State::Reasoning
    }

    /// Feeds text; returns what can no longer change.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        return out;
                    }
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Reasoning;
                    } else if OPEN.starts_with(t) {
                        return out; // maybe the start of `<think>`
                    } else {
                        // No reasoning: the answer as written, blank space included.
                        self.state = State::Answer;
                    }
                }
                State::Reasoning => {
                    if !self.reasoned {
                        self.held = self.held.trim_start().to_string();
                    }
                    if let Some(i) = self.held.find(CLOSE) {
                        let r = self.held[..i].trim_end().to_string();
                        self.held = self.held[i + CLOSE.len()..].to_string();
                        self.emit_reasoning(r, &mut out);
                        self.state = State::AfterClose;
                        continue;
                    }
                    // Hold a possible partial `</think>` and trailing blank space.
                    let keep = held_tail(&self.held, CLOSE);
                    let cut = self.held[..self.held.len() - keep].trim_end().len();
                    let r: String = self.held.drain(..cut).collect();
                    self.emit_reasoning(r, &mut out);
                    return out;
                }
                State::AfterClose => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = t.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    if !self.held.is_empty() {
                        out.push(Part::Answer(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the text: whatever was held.
    pub fn finish(&mut self) -> Vec<Part> {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Start | State::Answer => {
                if held.is_empty() {
                    Vec::new()
                } else {
                    vec![Part::Answer(held)]
                }
            }
            State::Reasoning => {
                let mut out = Vec::new();
                self.emit_reasoning(held.trim().to_string(), &mut out);
                out
            }
            State::AfterClose => Vec::new(),
        }
    }

    fn emit_reasoning(&mut self, r: String, out: &mut Vec<Part>) {
        if !r.is_empty() {
            self.reasoned = true;
            out.push(Part::Reasoning(r));
        }
    }
}

/// Bytes at the end of `s` that may be the start of `tag`, plus the blank
/// space before them.
fn held_tail(s: &str, tag: &str) -> usize {
    let partial = (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0);
    let before = &s[..s.len() - partial];
    partial + (before.len() - before.trim_end().len())
}

/// The whole text split at once: (reasoning, answer).
pub fn split(inside: bool, text: &str) -> (String, String) {
    let mut s = ThinkSplit::new(inside);
    let mut parts = s.push(text);
    parts.extend(s.finish());
    join(parts)
}

/// Parts joined: (reasoning, answer).
fn join(parts: Vec<Part>) -> (String, String) {
    let (mut r, mut a) = (String::new(), String::new());
    for p in parts {
        match p {
            Part::Reasoning(t) => r.push_str(&t),
            Part::Answer(t) => a.push_str(&t),
        }
    }
    (r, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_block_is_reasoning() {
        assert_eq!(
            split(false, "<think>\nLet me see.\n</think>\n\nParis."),
            ("Let me see.".into(), "Paris.".into())
        );
        assert_eq!(split(false, "Paris."), ("".into(), "Paris.".into()));
        assert_eq!(split(false, " Paris. "), ("".into(), " Paris. ".into()));
        assert_eq!(split(false, "\n"), ("".into(), "\n".into()));
        assert_eq!(
            split(false, "<think>\n\n</think>\n\nParis."),
            ("".into(), "Paris.".into())
        );
    }

    #[test]
    fn a_prompt_that_opens_the_block_starts_inside() {
        assert!(opens_inside("<|im_start|>assistant\n<think>\n"));
        assert!(!opens_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!opens_inside("<|im_start|>assistant\n"));
        assert_eq!(split(true, "hmm, 2+2\n</think>\n4"), ("hmm, 2+2".into(), "4".into()));
    }

    #[test]
    fn a_later_think_tag_is_answer_text_and_an_unclosed_block_is_all_reasoning() {
        assert_eq!(
            split(false, "Use <think> tags."),
            ("".into(), "Use <think> tags.".into())
        );
        assert_eq!(
            split(false, "<think>a</think>b <think>c</think>"),
            ("a".into(), "b <think>c</think>".into())
        );
        assert_eq!(split(false, "<think>still going"), ("still going".into(), "".into()));
    }

    #[test]
    fn streaming_in_any_cut_gives_the_whole_split() {
        let text = "  <think>\nstep one\n\nstep two </think>\n\nThe answer: <b>yes</b>";
        let whole = split(false, text);
        for size in 1..=text.len() {
            let mut s = ThinkSplit::new(false);
            let mut parts = Vec::new();
            let mut i = 0;
            while i < text.len() {
                let mut j = (i + size).min(text.len());
                while !text.is_char_boundary(j) {
                    j += 1;
                }
                parts.extend(s.push(&text[i..j]));
                i = j;
            }
            parts.extend(s.finish());
            assert_eq!(join(parts), whole, "pieces of {size} bytes");
        }
        assert_eq!(whole, ("step one\n\nstep two".into(), "The answer: <b>yes</b>".into()));
    }
}
