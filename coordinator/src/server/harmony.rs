//! gpt-oss's harmony format: an answer is a run of channel messages.
//!
//! The prompt ends in `<|start|>assistant`, and the model writes messages
//! such as
//!
//! ```text
//! <|channel|>analysis<|message|>reasoning…<|end|>
//! <|start|>assistant<|channel|>final<|message|>the answer…<|return|>
//! ```
//!
//! or, to call a tool (the answer ends there: `<|call|>` is an
//! end-of-sequence token),
//!
//! ```text
//! <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
//! ```
//!
//! (the recipient may also stand before the channel, as the template
//! renders earlier calls). [`HarmonySplit`] turns the text into reasoning
//! (the `analysis` channel), answer text (`final`, and `commentary` without
//! a recipient: a preamble for the user) and tool calls (a message to
//! `functions.NAME`, its body the JSON arguments). The markers are special
//! tokens, so the server decodes a harmony model's chat answers with
//! special tokens kept (the other models' are decoded without).
//!
//! Text that does not follow the format is answer text as written (an
//! answer without any marker comes back unchanged); a message to a tool
//! that was not offered (or to a built-in tool such as `browser.search`),
//! or with arguments that are no JSON object, stays in the text verbatim
//! with a warning, as the other call syntaxes' bad blocks do ([`super::tools`]);
//! a message from another role (a tool result the model made up) is
//! dropped with a warning. Nothing here panics on any input.
//!
//! Earlier turns go to the template the way it reads them
//! ([`conversation`]): reasoning as `thinking`, one call per assistant
//! message, each tool result right after its call.

use serde_json::{Map, Value};

use super::answer::Out;
use super::tools::ToolCall;
use crate::chat_template::Message;
use crate::grammar::GrammarSpec;

/// Opens a message (its role follows).
pub const START: &str = "<|start|>";
/// Names the channel (`analysis`, `commentary`, `final`).
pub const CHANNEL: &str = "<|channel|>";
/// Ends the header; the body follows.
pub const MESSAGE: &str = "<|message|>";
/// Ends a message that more messages follow.
pub const END: &str = "<|end|>";
/// Ends the answer (an end-of-sequence token).
pub const RETURN: &str = "<|return|>";
/// Ends a tool call and the answer (an end-of-sequence token).
pub const CALL: &str = "<|call|>";
/// Names the body's format in a call's header (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";
/// The tokenizer's end of text (an end-of-sequence token too).
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// The recipient prefix of function calls.
pub const FUNCTIONS: &str = "functions.";

/// Markers that end a message's body (`START`: the model left out `<|end|>`).
const BODY_ENDS: [&str; 5] = [END, RETURN, CALL, END_OF_TEXT, START];
/// Every marker the split looks for.
const MARKERS: [&str; 8] = [START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN, END_OF_TEXT];
/// Longest header accepted (role, channel, recipient and format are short).
const MAX_HEADER: usize = 256;

/// Whether a chat template writes harmony (gpt-oss's).
pub fn is_harmony(template: &str) -> bool {
    template.contains(CHANNEL) && template.contains(MESSAGE)
}

/// A request's grammar for a harmony answer: an optional `analysis`
/// message (free text), then the `final` message, whose body is `answer`.
/// Held to `answer` from the first token, a harmony model would write its
/// answer with no channel header and no reasoning; framed so, it reasons
/// first, as it was trained to, and a reasoning budget's closing
/// ([`super::think_budget::HARMONY_CLOSE`]) is the frame's own text. (The
/// special tokens are written bare in llguidance's Lark.)
pub fn final_answer(answer: GrammarSpec) -> GrammarSpec {
    let outer = format!(
        "start: analysis? {CHANNEL} \"final\" {MESSAGE} @answer\n\
         analysis: {CHANNEL} \"analysis\" {MESSAGE} /(?s:.*)/ {END} {START} \"assistant\"\n"
    );
    GrammarSpec::Framed {
        outer,
        inner: Box::new(answer),
    }
}

/// The template's `reasoning_effort` for an OpenAI effort: gpt-oss knows
/// `low`, `medium` and `high`; `minimal` and `none` (reasoning cannot be
/// turned off) are `low`, `xhigh` is `high`.
pub fn effort(openai: &str) -> &'static str {
    match openai {
        "high" | "xhigh" => "high",
        "medium" => "medium",
        _ => "low",
    }
}

/// A message header.
#[derive(Debug, Default, PartialEq)]
struct Header {
    role: String,
    channel: String,
    recipient: Option<String>,
}

/// What a message's body is.
#[derive(Debug)]
enum Body {
    Reasoning,
    Text,
    /// A message to `recipient` (`functions.NAME` or another tool); the
    /// body is collected, and so is the message's raw text (for a call that
    /// is left in the text).
    Call {
        recipient: String,
        raw: String,
        args: String,
    },
    /// Another role's message: dropped.
    Dropped,
}

#[derive(Debug)]
enum State {
    /// Reading a header up to `<|message|>`; `after_start`: it follows a
    /// `<|start|>` and so begins with the role (the first message's role
    /// is the prompt's `assistant`).
    Header {
        after_start: bool,
    },
    Body(Body),
    /// Between messages: text here is no message, and is answer text.
    Between,
}

/// Splits a harmony answer, streamed or whole, into reasoning, text and
/// calls (as [`Out`] pieces). Text that may still be the start of a marker
/// is held back; a call is released once its message ends.
#[derive(Debug)]
pub struct HarmonySplit {
    state: State,
    buf: String,
    /// Functions the model may call.
    names: Vec<String>,
    calls: usize,
    warnings: Vec<String>,
}

impl HarmonySplit {
    /// A split that accepts calls of `names`, already fed `prefill` (the
    /// start of a forced call, which releases nothing).
    pub fn new(names: &[String], prefill: &str) -> Self {
        let mut s = HarmonySplit {
            state: State::Header { after_start: false },
            buf: String::new(),
            names: names.to_vec(),
            calls: 0,
            warnings: Vec::new(),
        };
        let released = s.push(prefill);
        debug_assert!(released.is_empty(), "a prefill is a header");
        s
    }

    /// Whether the text so far ended inside an `analysis` message.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Body(Body::Reasoning))
    }

    /// Calls parsed so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Why messages were left in the text or dropped (one line each).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Feeds text; returns what can no longer change.
    pub fn push(&mut self, text: &str) -> Vec<Out> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match std::mem::replace(&mut self.state, State::Between) {
                State::Header { after_start } => self.header(after_start, &mut out),
                State::Body(body) => self.body(body, &mut out),
                State::Between => self.between(&mut out),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The end of the text: a message cut short is released as it stands
    /// (a call when its arguments are whole JSON).
    pub fn finish(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Between) {
            // A header that never reached its body says nothing, unless it
            // is no header at all.
            State::Header { after_start } => {
                let role = "assistant";
                if after_start && !(rest.starts_with(role) || role.starts_with(rest.as_str())) {
                    push_out(&mut out, Out::Text(format!("{START}{rest}")));
                }
            }
            State::Body(Body::Reasoning) => push_out(&mut out, Out::Reasoning(rest)),
            State::Body(Body::Text) => push_out(&mut out, Out::Text(rest)),
            State::Body(Body::Call {
                recipient,
                raw,
                mut args,
            }) => {
                args.push_str(&rest);
                self.call(&recipient, raw + &rest, &args, &mut out);
            }
            State::Body(Body::Dropped) => {}
            State::Between => push_out(&mut out, Out::Text(strip_ends(&rest))),
        }
        out
    }

    /// Reads a header; `false` when more text is needed. A header that
    /// cannot be one leaves its text to [`State::Between`] (as answer text).
    fn header(&mut self, after_start: bool, out: &mut Vec<Out>) -> bool {
        let found = self.buf.find(MESSAGE);
        // Without `<|message|>` yet, a possible partial marker at the end is no evidence.
        let head_end = found.unwrap_or(self.buf.len() - held_tail(&self.buf));
        if could_be_header(&self.buf[..head_end], after_start) {
            let Some(i) = found else {
                self.state = State::Header { after_start };
                return false;
            };
            match parse_header(&self.buf[..i], after_start) {
                Ok(h) => {
                    let head: String = self.buf.drain(..i + MESSAGE.len()).collect();
                    let lead = if after_start { START } else { "" };
                    self.state = State::Body(self.body_kind(h, format!("{lead}{head}")));
                    return true;
                }
                Err(why) => self.warnings.push(format!(
                    "a harmony header was left in the text: {why}: {:?}",
                    &self.buf[..i]
                )),
            }
        }
        if after_start {
            push_out(out, Out::Text(START.to_string()));
        }
        self.state = State::Between;
        true
    }

    fn body_kind(&mut self, h: Header, raw: String) -> Body {
        if h.role != "assistant" {
            self.warnings.push(format!(
                "a harmony message from {:?} (not the assistant) was dropped",
                h.role
            ));
            return Body::Dropped;
        }
        match h.recipient {
            Some(recipient) => Body::Call {
                recipient,
                raw,
                args: String::new(),
            },
            None if h.channel == "analysis" => Body::Reasoning,
            None => Body::Text,
        }
    }

    /// Reads a body; `false` when more text is needed.
    fn body(&mut self, body: Body, out: &mut Vec<Out>) -> bool {
        let end = BODY_ENDS
            .iter()
            .filter_map(|m| self.buf.find(m).map(|i| (i, *m)))
            .min_by_key(|&(i, _)| i);
        let Some((i, marker)) = end else {
            // Stream what cannot be the start of a marker.
            let keep = held_tail(&self.buf);
            let cut = self.buf.len() - keep;
            match body {
                Body::Reasoning => push_out(out, Out::Reasoning(self.buf.drain(..cut).collect())),
                Body::Text => push_out(out, Out::Text(self.buf.drain(..cut).collect())),
                Body::Dropped => {
                    self.buf.drain(..cut);
                }
                Body::Call { .. } => {}
            }
            self.state = State::Body(body);
            return false;
        };
        let content: String = self.buf.drain(..i + marker.len()).collect();
        let content = &content[..i];
        match body {
            Body::Reasoning => push_out(out, Out::Reasoning(content.to_string())),
            Body::Text => push_out(out, Out::Text(content.to_string())),
            Body::Call {
                recipient,
                raw,
                mut args,
            } => {
                args.push_str(content);
                let ending = if marker == START { "" } else { marker };
                self.call(&recipient, format!("{raw}{content}{ending}"), &args, out);
            }
            Body::Dropped => {}
        }
        self.state = if marker == START {
            State::Header { after_start: true }
        } else {
            State::Between
        };
        true
    }

    /// Between messages; `false` when more text is needed.
    fn between(&mut self, out: &mut Vec<Out>) -> bool {
        if let Some(i) = self.buf.find(START) {
            let before: String = self.buf.drain(..i + START.len()).collect();
            push_out(out, Out::Text(strip_ends(&before[..i])));
            self.state = State::Header { after_start: true };
            return true;
        }
        let keep = held_tail(&self.buf);
        let cut = self.buf.len() - keep;
        let text: String = self.buf.drain(..cut).collect();
        push_out(out, Out::Text(strip_ends(&text)));
        self.state = State::Between;
        false
    }

    /// A message to `recipient` with body `args`: a call, or its `raw`
    /// text with a warning.
    fn call(&mut self, recipient: &str, raw: String, args: &str, out: &mut Vec<Out>) {
        match self.parse_call(recipient, args) {
            Ok(call) => {
                self.calls += 1;
                out.push(Out::Call(call));
            }
            Err(why) => {
                self.warnings
                    .push(format!("a harmony tool call was left in the text: {why}"));
                push_out(out, Out::Text(raw));
            }
        }
    }

    fn parse_call(&self, recipient: &str, args: &str) -> Result<ToolCall, String> {
        let Some(name) = recipient.strip_prefix(FUNCTIONS) else {
            return Err(format!("it is addressed to {recipient:?}, not to a function"));
        };
        if !self.names.iter().any(|n| n == name) {
            return Err(format!("calls {name:?}, which is not among the tools offered"));
        }
        let arguments = match args.trim() {
            "" => Map::new(),
            a => match serde_json::from_str::<Value>(a) {
                Ok(Value::Object(m)) => m,
                // Arguments written as a JSON string holding the object.
                Ok(Value::String(s)) => match serde_json::from_str(&s) {
                    Ok(Value::Object(m)) => m,
                    _ => return Err("the arguments are a string that is not a JSON object".into()),
                },
                Ok(_) => return Err("the arguments are not a JSON object".into()),
                Err(e) => return Err(format!("the arguments are not valid JSON ({e})")),
            },
        };
        Ok(ToolCall {
            name: name.to_string(),
            arguments,
        })
    }
}

/// Appends a piece, merging it into the last one of its kind; empty text
/// is dropped.
fn push_out(out: &mut Vec<Out>, piece: Out) {
    match (out.last_mut(), piece) {
        (_, Out::Text(t) | Out::Reasoning(t)) if t.is_empty() => {}
        (Some(Out::Text(last)), Out::Text(t)) => last.push_str(&t),
        (Some(Out::Reasoning(last)), Out::Reasoning(t)) => last.push_str(&t),
        (_, piece) => out.push(piece),
    }
}

/// Text between messages without the markers that end one (an answer that
/// is plain text still ends in `<|return|>`).
fn strip_ends(text: &str) -> String {
    [END, RETURN, CALL, END_OF_TEXT]
        .iter()
        .fold(text.to_string(), |t, m| t.replace(m, ""))
}

/// Bytes at the end of `s` that may be the start of a marker.
fn held_tail(s: &str) -> usize {
    let longest = MARKERS.iter().map(|m| m.len()).max().unwrap_or(0);
    let from = s.len().saturating_sub(longest - 1);
    (from..s.len())
        .filter(|&i| s.is_char_boundary(i))
        .find(|&i| MARKERS.iter().any(|m| m.len() > s.len() - i && m.starts_with(&s[i..])))
        .map_or(0, |i| s.len() - i)
}

/// Whether `s` (no `<|message|>` yet) may still become a header: one line,
/// short, no marker that ends or opens a message, and for the first
/// message starting like one (a channel or a recipient).
fn could_be_header(s: &str, after_start: bool) -> bool {
    if s.len() > MAX_HEADER || s.contains('\n') || BODY_ENDS.iter().any(|m| s.contains(m)) {
        return false;
    }
    if after_start {
        return true;
    }
    [CHANNEL, " to="]
        .iter()
        .any(|lead| s.starts_with(lead) || lead.starts_with(s))
}

/// Parses a header: `[ROLE][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>FORMAT| FORMAT]`
/// (the role only `after_start`; otherwise it is the prompt's `assistant`).
fn parse_header(text: &str, after_start: bool) -> Result<Header, String> {
    // The markers as words of their own.
    let spaced = text
        .replace(CHANNEL, &format!(" {CHANNEL} "))
        .replace(CONSTRAIN, &format!(" {CONSTRAIN} "));
    let mut words = spaced.split_whitespace();
    let mut h = Header {
        role: "assistant".into(),
        ..Header::default()
    };
    if after_start {
        match words.next() {
            Some(role) if !role.starts_with("<|") && !role.starts_with("to=") => h.role = role.to_string(),
            _ => return Err("no role".into()),
        }
    }
    let mut format = false;
    while let Some(w) = words.next() {
        if w == CHANNEL {
            match words.next() {
                Some(c) if h.channel.is_empty() && !c.contains("<|") && !c.starts_with("to=") => {
                    h.channel = c.to_string()
                }
                _ => return Err("a channel marker without one channel name".into()),
            }
        } else if w == CONSTRAIN {
            match words.next() {
                Some(f) if !format && !f.contains("<|") => format = true,
                _ => return Err("a constrain marker without one format".into()),
            }
        } else if let Some(r) = w.strip_prefix("to=") {
            if r.is_empty() || h.recipient.is_some() || r.contains("<|") {
                return Err("a recipient that is empty, doubled or holds a marker".into());
            }
            h.recipient = Some(r.to_string());
        } else if !format && !w.contains("<|") && !h.channel.is_empty() {
            // A bare format after the channel (`commentary json`).
            format = true;
        } else {
            return Err(format!("an unexpected word {w:?}"));
        }
    }
    if h.channel.is_empty() {
        return Err("no channel".into());
    }
    Ok(h)
}

/// The conversation as the gpt-oss template reads it: it renders one call
/// per assistant message and names each tool result after the latest
/// call, so a turn with several calls becomes one message per call, each
/// followed by its results; and it refuses a call turn with both text and
/// reasoning, so such a turn keeps its reasoning (the model's own analysis
/// before the call) and drops the text.
pub fn conversation(messages: Vec<Message>) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len());
    let mut rest = messages.into_iter().peekable();
    while let Some(mut m) = rest.next() {
        let Some(calls) = m.tool_calls.take() else {
            out.push(m);
            continue;
        };
        if m.reasoning_content.as_deref().is_some_and(|r| !r.is_empty()) {
            m.content.clear();
        }
        let mut results = Vec::new();
        while let Some(r) = rest.next_if(|r| r.role == "tool") {
            results.push(r);
        }
        let id_of = |c: &Value| c.get("id").and_then(Value::as_str).map(str::to_string);
        for (i, call) in calls.iter().enumerate() {
            let mut a = if i == 0 {
                m.clone()
            } else {
                Message::new("assistant", "")
            };
            a.tool_calls = Some(vec![call.clone()]);
            out.push(a);
            let id = id_of(call);
            let (mine, others): (Vec<Message>, Vec<Message>) =
                results.into_iter().partition(|r| id.is_some() && r.tool_call_id == id);
            out.extend(mine);
            results = others;
        }
        // Results that answer no call here keep their place after the calls.
        out.extend(results);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "clock".into()]
    }

    /// The pieces joined: (reasoning, text, calls as (name, arguments JSON)).
    fn join(pieces: Vec<Out>) -> (String, String, Vec<(String, String)>) {
        let (mut r, mut t, mut c) = (String::new(), String::new(), Vec::new());
        for p in pieces {
            match p {
                Out::Reasoning(x) => r.push_str(&x),
                Out::Text(x) => t.push_str(&x),
                Out::Call(call) => c.push((call.name.clone(), call.arguments_json())),
            }
        }
        (r, t, c)
    }

    fn whole(text: &str) -> (String, String, Vec<(String, String)>, Vec<String>) {
        let mut s = HarmonySplit::new(&names(), "");
        let mut pieces = s.push(text);
        pieces.extend(s.finish());
        let (r, t, c) = join(pieces);
        (r, t, c, s.warnings().to_vec())
    }

    /// `text` fed in pieces of `size` bytes (on character boundaries).
    fn streamed(text: &str, size: usize) -> (String, String, Vec<(String, String)>) {
        let mut s = HarmonySplit::new(&names(), "");
        let mut pieces = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + size).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            pieces.extend(s.push(&text[i..j]));
            i = j;
        }
        pieces.extend(s.finish());
        join(pieces)
    }

    const ANSWER: &str = "<|channel|>analysis<|message|>User asks capital. Paris.<|end|>\
                          <|start|>assistant<|channel|>final<|message|>Paris is the capital.<|return|>";
    const CALL_TEXT: &str = "<|channel|>analysis<|message|>Need weather.<|end|>\
                             <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";

    #[test]
    fn analysis_is_reasoning_and_final_is_the_answer() {
        let (r, t, c, w) = whole(ANSWER);
        assert_eq!(r, "User asks capital. Paris.");
        assert_eq!(t, "Paris is the capital.");
        assert!(c.is_empty() && w.is_empty(), "{c:?} {w:?}");
        // Without the closing token (the engine stopped at max_tokens).
        let cut = &ANSWER[..ANSWER.len() - RETURN.len() - 3];
        assert_eq!(whole(cut).1, "Paris is the capit");
        // Cut inside the reasoning.
        let (r, t, _, _) = whole("<|channel|>analysis<|message|>Thinking ab");
        assert_eq!((r.as_str(), t.as_str()), ("Thinking ab", ""));
    }

    #[test]
    fn a_commentary_message_to_a_function_is_a_call() {
        let (r, t, c, w) = whole(CALL_TEXT);
        assert_eq!(r, "Need weather.");
        assert_eq!(t, "");
        assert_eq!(c, vec![("get_weather".to_string(), r#"{"city":"Paris"}"#.to_string())]);
        assert!(w.is_empty(), "{w:?}");
        // The recipient before the channel, a bare format, no arguments.
        let (_, t, c, w) =
            whole("<|start|>assistant to=functions.clock<|channel|>commentary json<|message|>{}<|call|>");
        assert_eq!((t.as_str(), c.len(), w.len()), ("", 1, 0), "{c:?} {w:?}");
        assert_eq!(c[0], ("clock".to_string(), "{}".to_string()));
        // A preamble for the user, then the call.
        let (_, t, c, _) = whole(
            "<|channel|>commentary<|message|>Checking the weather.<|end|>\
             <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Lima\"}<|call|>",
        );
        assert_eq!(t, "Checking the weather.");
        assert_eq!(c[0].1, r#"{"city":"Lima"}"#);
    }

    #[test]
    fn a_forced_call_continues_its_prefill() {
        let prefill = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
        let mut s = HarmonySplit::new(&names(), prefill);
        let mut pieces = s.push("{\"city\": \"Oslo\"}");
        assert!(pieces.is_empty(), "a call is released when its message ends");
        pieces.extend(s.finish());
        let (r, t, c) = join(pieces);
        assert_eq!((r.as_str(), t.as_str()), ("", ""));
        assert_eq!(c, vec![("get_weather".to_string(), r#"{"city":"Oslo"}"#.to_string())]);
    }

    #[test]
    fn bad_calls_stay_in_the_text_with_a_warning() {
        let cases = [
            (
                "<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>",
                "not among",
            ),
            (
                "<|channel|>commentary to=functions.clock <|constrain|>json<|message|>{\"a\": <|call|>",
                "not valid JSON",
            ),
            (
                "<|channel|>commentary to=functions.clock<|message|>[1]<|call|>",
                "not a JSON object",
            ),
            (
                "<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>",
                "not to a function",
            ),
        ];
        for (text, why) in cases {
            let (r, t, c, w) = whole(text);
            assert!(c.is_empty() && r.is_empty(), "{text}");
            assert_eq!(t, text, "the message is kept verbatim");
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(w[0].contains(why), "{why}: {w:?}");
        }
    }

    #[test]
    fn text_that_is_not_harmony_is_the_answer_as_written() {
        for text in [
            "Paris.",
            "  Paris.\n",
            "",
            "a <|b",
            "<|chan",
            "<| weird |> text",
            "Paris.<|return|>",
        ] {
            let (r, t, c, _) = whole(text);
            let expected = text.replace(RETURN, "");
            let expected = if text == "<|chan" { String::new() } else { expected };
            assert_eq!(
                (r.as_str(), t.as_str(), c.len()),
                ("", expected.as_str(), 0),
                "{text:?}"
            );
        }
        // Malformed headers: kept as text, later messages still split.
        let (r, t, _, w) =
            whole("<|channel|><|message|>x<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>");
        assert_eq!(r, "");
        assert_eq!(t, "<|channel|><|message|>xok");
        assert_eq!(w.len(), 1);
        let (_, t, _, _) = whole("<|channel|>final\nno message marker");
        assert_eq!(t, "<|channel|>final\nno message marker");
        // A made-up tool result is dropped.
        let (r, t, c, w) = whole(
            "<|channel|>final<|message|>A<|end|><|start|>functions.clock to=assistant<|channel|>commentary<|message|>\"12:00\"<|end|>",
        );
        assert_eq!((r.as_str(), t.as_str(), c.len(), w.len()), ("", "A", 0, 1));
        // A message the model did not close before the next one.
        let (r, t, _, _) = whole("<|channel|>analysis<|message|>hmm<|start|>assistant<|channel|>final<|message|>yes");
        assert_eq!((r.as_str(), t.as_str()), ("hmm", "yes"));
    }

    #[test]
    fn streaming_in_any_cut_gives_the_whole_split() {
        let texts = [
            ANSWER.to_string(),
            CALL_TEXT.to_string(),
            "<|channel|>analysis<|message|>é ü 你好 <|end|><|start|>assistant<|channel|>final<|message|>a<|b <|endx 🙂<|return|>".to_string(),
            "no harmony at all <|start|>assistant<|channel|>final<|message|>then some".to_string(),
        ];
        for text in &texts {
            let (r, t, c, _) = whole(text);
            for size in 1..=text.len().min(40) {
                assert_eq!(
                    streamed(text, size),
                    (r.clone(), t.clone(), c.clone()),
                    "{size} bytes: {text}"
                );
            }
        }
        assert_eq!(whole(&texts[2]).1, "a<|b <|endx 🙂");
    }

    #[test]
    fn reasoning_streams_before_the_message_ends() {
        let mut s = HarmonySplit::new(&names(), "");
        assert_eq!(s.push("<|channel|>analy"), vec![]);
        assert_eq!(s.push("sis<|message|>Let me"), vec![Out::Reasoning("Let me".into())]);
        assert_eq!(s.push(" think<|e"), vec![Out::Reasoning(" think".into())]);
        assert_eq!(
            s.push("nd|><|start|>assistant<|channel|>final<|message|>Hi"),
            vec![Out::Text("Hi".into())]
        );
        assert_eq!(s.push("<|return|>"), vec![]);
        assert_eq!(s.finish(), vec![]);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let alphabet = [
            "<|",
            "|>",
            "<|start|>",
            "<|channel|>",
            "<|message|>",
            "<|end|>",
            "<|call|>",
            "<|constrain|>",
            " to=functions.clock",
            "analysis",
            "final",
            "commentary",
            "{}",
            "é",
            "\n",
            " ",
            "x",
            "<",
            "|",
            "assistant",
        ];
        let mut seed = 0x9e37_79b9_u64;
        for _ in 0..2000 {
            let mut text = String::new();
            for _ in 0..(seed % 24) {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                text.push_str(alphabet[(seed >> 33) as usize % alphabet.len()]);
            }
            let (r, t, c, _) = whole(&text);
            assert_eq!(streamed(&text, 3), (r, t, c), "{text:?}");
        }
    }

    #[test]
    fn headers_parse_in_both_orders() {
        let h = parse_header("<|channel|>commentary to=functions.f <|constrain|>json", false).unwrap();
        assert_eq!(
            (h.channel.as_str(), h.recipient.as_deref()),
            ("commentary", Some("functions.f"))
        );
        let h = parse_header("assistant to=functions.f<|channel|>commentary json", true).unwrap();
        assert_eq!(
            (h.role.as_str(), h.recipient.as_deref()),
            ("assistant", Some("functions.f"))
        );
        for bad in [
            "",
            "to=x",
            "<|channel|>",
            "<|channel|>a b c",
            "<|channel|>a to= ",
            "<|channel|>a<|channel|>b",
        ] {
            assert!(parse_header(bad, false).is_err(), "{bad:?}");
        }
        assert!(
            parse_header("<|channel|>final", true).is_err(),
            "a role comes first after <|start|>"
        );
    }

    #[test]
    fn calls_are_one_per_message_each_followed_by_its_results() {
        let call =
            |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": {}}});
        let mut a = Message::assistant_calls("Let me look.", vec![call("c1", "get_weather"), call("c2", "clock")]);
        a.reasoning_content = Some("Two tools.".into());
        let msgs = vec![
            Message::new("user", "hi"),
            a,
            Message::tool_result("c2", "noon"),
            Message::tool_result("c1", "sunny"),
            Message::new("user", "thanks"),
        ];
        let out = conversation(msgs);
        let shape: Vec<(String, String, Option<String>)> = out
            .iter()
            .map(|m| {
                let name = m
                    .tool_calls
                    .as_ref()
                    .map(|c| c[0]["function"]["name"].as_str().unwrap().to_string());
                (m.role.clone(), m.content.clone(), name.or(m.tool_call_id.clone()))
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                ("user".into(), "hi".into(), None),
                ("assistant".into(), "".into(), Some("get_weather".into())),
                ("tool".into(), "sunny".into(), Some("c1".into())),
                ("assistant".into(), "".into(), Some("clock".into())),
                ("tool".into(), "noon".into(), Some("c2".into())),
                ("user".into(), "thanks".into(), None),
            ]
        );
        assert_eq!(out[1].reasoning_content.as_deref(), Some("Two tools."));
        assert_eq!(out[3].reasoning_content, None);
        // Text without reasoning is kept (the template shows it as the analysis).
        let out = conversation(vec![Message::assistant_calls("Looking.", vec![call("c1", "clock")])]);
        assert_eq!(out[0].content, "Looking.");
    }

    #[test]
    fn efforts_map_to_the_three_gpt_oss_knows() {
        assert_eq!(
            ["none", "minimal", "low", "medium", "high", "xhigh"].map(effort),
            ["low", "low", "low", "medium", "high", "high"]
        );
        assert!(is_harmony("{{- '<|start|>assistant<|channel|>final<|message|>' }}"));
        assert!(!is_harmony("<|im_start|>assistant\n<think>"));
    }
}
