//! Tool calling through the model's own chat template.
//!
//! Both APIs turn their tool definitions into the shape transformers'
//! `apply_chat_template(messages, tools=...)` hands a template
//! (`{"type": "function", "function": {name, description, parameters}}`),
//! and their tool calls and results into assistant `tool_calls` and `tool`
//! messages ([`crate::chat_template::Message`]). What the model writes back
//! is parsed here in its family's own call syntax ([`ToolSyntax`], detected
//! from the template's source), whole or streamed ([`ToolStream`]).
//!
//! A block that is not a valid call (not JSON, no name, arguments that are
//! not an object, a tool that was not offered) is never turned into a call:
//! it stays in the text, verbatim, and a warning says why.
//!
//! `tool_choice` "required" / a named tool prefills the assistant turn with
//! the start of a call ([`ToolSyntax::prefill`]) and constrains the rest
//! ([`ToolSyntax::forced_grammar`]): the model writes a tool's name (one of
//! those offered) and arguments valid for that tool's schema, and the
//! answer ends with the call. The whole text (prefill included) is parsed
//! as usual.

use serde_json::{json, Map, Value};

mod tagged;

use super::error::ApiError;
use super::harmony;
use crate::chat_template::Message;
use crate::grammar::{json_layout, GrammarSpec};
pub use tagged::{dsml, glm, minimax, qwen_xml};
use tagged::{
    dsml_grammar, glm_grammar, minimax_grammar, parse_dsml_block, parse_glm_block, parse_minimax_block,
    parse_qwen_xml_block, qwen_xml_grammar,
};

/// Longest tool name accepted (OpenAI's and Anthropic's limit).
pub const MAX_TOOL_NAME: usize = 64;

/// A model family's tool-call syntax, as its chat template writes calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": NAME, "arguments": {…}}\n</tool_call>`, one
    /// block per call (Qwen2.5, Qwen3, Hermes): the template declares the
    /// tools in a `<tools>` system section and wraps results in
    /// `<tool_response>`.
    Hermes,
    /// The same blocks for a template that knows no tools: charm writes the
    /// tools into the system message, calls into the assistant's text and
    /// results into user turns ([`generic_conversation`]), so any chat
    /// model can be offered tools (as the demo model is).
    Generic,
    /// DeepSeek-V3 / R1's own tokens: `<｜tool▁calls▁begin｜>`, then per
    /// call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` + a json fence
    /// with the arguments + `<｜tool▁call▁end｜>`, then
    /// `<｜tool▁calls▁end｜>`. The template renders earlier calls (their
    /// arguments as JSON text) and results itself but not the tools, so
    /// charm writes them into the system message ([`deepseek_conversation`]).
    DeepSeek,
    /// DeepSeek-V3.1's: the same tokens without the type and the fence,
    /// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`; its
    /// template renders earlier calls (arguments through `tojson`, so as
    /// objects) and results but not the tools.
    DeepSeekV31,
    /// GLM-4.5 / 4.6 / 4.7's `<tool_call>NAME` + one `<arg_key>K</arg_key>`
    /// `<arg_value>V</arg_value>` pair per argument + `</tool_call>` (blank
    /// lines between the parts or not): a value is JSON, or the text as it
    /// stands where it is no JSON or the tool's schema makes it a string.
    /// The template renders the tools, earlier calls and results itself.
    Glm,
    /// Qwen3.5 / Qwen3.6's and Qwen3-Coder's `<tool_call>\n<function=NAME>\n`,
    /// then one `<parameter=K>\nV\n</parameter>\n` per argument, then
    /// `</function>\n</tool_call>` (values bare, as GLM's; see [`tagged`]).
    /// The template renders the tools, earlier calls and results itself.
    QwenXml,
    /// MiniMax-M2's `<minimax:tool_call>`, then per call `<invoke
    /// name="NAME">`, one `<parameter name="K">V</parameter>` per argument
    /// and `</invoke>`, then `</minimax:tool_call>` (values bare; see
    /// [`tagged`]). The template renders the tools, earlier calls and
    /// results itself.
    MiniMax,
    /// DeepSeek-V3.2's DSML: `<｜DSML｜function_calls>`, then per call
    /// `<｜DSML｜invoke name="NAME">`, one `<｜DSML｜parameter name="K"
    /// string="true|false">V</｜DSML｜parameter>` per argument and
    /// `</｜DSML｜invoke>`, then `</｜DSML｜function_calls>` (see [`tagged`]).
    /// The template renders the tools, earlier calls and results itself.
    Dsml,
    /// Kimi K2's `<|tool_calls_section_begin|>`, then per call
    /// `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>`,
    /// the JSON arguments and `<|tool_call_end|>`, then
    /// `<|tool_calls_section_end|>`. The markers are special tokens of
    /// Kimi's tokenizer, so answers are decoded with special tokens kept
    /// ([`ToolSyntax::keeps_special_tokens`]). The template renders the
    /// tools, earlier calls and results itself.
    Kimi,
    /// gpt-oss's harmony: a `commentary` message to `functions.NAME`, its
    /// header `<|channel|>commentary to=functions.NAME <|constrain|>json`,
    /// then `<|message|>`, the JSON arguments and `<|call|>`. Answers are
    /// split by [`super::harmony::HarmonySplit`], which also makes the
    /// calls; the template renders the tools, one call per assistant
    /// message and the results itself ([`super::harmony::conversation`]).
    Harmony,
}

/// DeepSeek's tool-call tokens (added tokens, not special: they decode as
/// text).
pub mod deepseek {
    pub const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
    pub const CALLS_END: &str = "<｜tool▁calls▁end｜>";
    pub const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
    pub const CALL_END: &str = "<｜tool▁call▁end｜>";
    pub const SEP: &str = "<｜tool▁sep｜>";
}

/// Kimi K2's tool-call markers (special tokens of its tokenizer).
pub mod kimi {
    pub const SECTION: &str = "<|tool_calls_section_begin|>";
    pub const SECTION_END: &str = "<|tool_calls_section_end|>";
    pub const CALL_BEGIN: &str = "<|tool_call_begin|>";
    pub const ARGUMENTS: &str = "<|tool_call_argument_begin|>";
    pub const CALL_END: &str = "<|tool_call_end|>";
    /// What a call's id starts with (`functions.NAME:INDEX`).
    pub const FUNCTIONS: &str = "functions.";
}

impl ToolSyntax {
    /// The syntax a chat template's source uses for tool calls, if charm
    /// knows it (other families can add theirs here).
    pub fn detect(template: &str) -> Option<ToolSyntax> {
        if harmony::is_harmony(template) {
            Some(ToolSyntax::Harmony)
        } else if template.contains(kimi::CALL_BEGIN) {
            Some(ToolSyntax::Kimi)
        } else if template.contains(deepseek::CALL_BEGIN) {
            // V3 / R1 fence their arguments; V3.1 writes them bare.
            Some(if template.contains("```json") {
                ToolSyntax::DeepSeek
            } else {
                ToolSyntax::DeepSeekV31
            })
        } else if template.contains(glm::KEY) && template.contains("<tool_call>") {
            Some(ToolSyntax::Glm)
        } else if template.contains(dsml::MARK) {
            Some(ToolSyntax::Dsml)
        } else if template.contains(minimax::CALLS) {
            Some(ToolSyntax::MiniMax)
        } else if qwen_xml::is_qwen_xml(template) {
            Some(ToolSyntax::QwenXml)
        } else {
            (template.contains("<tool_call>") && template.contains("tools")).then_some(ToolSyntax::Hermes)
        }
    }

    /// The syntax for a chat template: its own, else [`ToolSyntax::Generic`].
    pub fn for_template(template: &str) -> ToolSyntax {
        Self::detect(template).unwrap_or(ToolSyntax::Generic)
    }

    /// Whether the syntax's markers are special tokens, so that answers
    /// must be decoded with special tokens kept for calls to be found
    /// (harmony's channels, Kimi K2's call markers).
    pub fn keeps_special_tokens(self) -> bool {
        matches!(self, ToolSyntax::Harmony | ToolSyntax::Kimi)
    }

    fn open(self) -> &'static str {
        match self {
            ToolSyntax::Hermes | ToolSyntax::Generic | ToolSyntax::Glm | ToolSyntax::QwenXml => "<tool_call>",
            ToolSyntax::DeepSeek | ToolSyntax::DeepSeekV31 => deepseek::CALL_BEGIN,
            ToolSyntax::MiniMax => minimax::INVOKE,
            ToolSyntax::Dsml => dsml::INVOKE,
            ToolSyntax::Kimi => kimi::CALL_BEGIN,
            ToolSyntax::Harmony => "to=functions.",
        }
    }

    fn close(self) -> &'static str {
        match self {
            ToolSyntax::Hermes | ToolSyntax::Generic | ToolSyntax::Glm | ToolSyntax::QwenXml => "</tool_call>",
            ToolSyntax::DeepSeek | ToolSyntax::DeepSeekV31 => deepseek::CALL_END,
            ToolSyntax::MiniMax => minimax::INVOKE_END,
            ToolSyntax::Dsml => dsml::INVOKE_END,
            ToolSyntax::Kimi => kimi::CALL_END,
            ToolSyntax::Harmony => harmony::CALL,
        }
    }

    /// Markers around a run of calls, dropped from the text.
    fn frame(self) -> &'static [&'static str] {
        match self {
            ToolSyntax::Hermes | ToolSyntax::Generic | ToolSyntax::Glm | ToolSyntax::QwenXml | ToolSyntax::Harmony => {
                &[]
            }
            ToolSyntax::DeepSeek | ToolSyntax::DeepSeekV31 => &[deepseek::CALLS_BEGIN, deepseek::CALLS_END],
            ToolSyntax::MiniMax => &[minimax::CALLS, minimax::CALLS_END],
            ToolSyntax::Dsml => &[dsml::CALLS, dsml::CALLS_END],
            ToolSyntax::Kimi => &[kimi::SECTION, kimi::SECTION_END],
        }
    }

    /// The start of the assistant's answer that makes the model call a tool:
    /// `Some(name)`: that tool (the model continues with the arguments);
    /// `None`: any tool (the model continues with the name).
    pub fn prefill(self, name: Option<&str>) -> String {
        use deepseek::{CALLS_BEGIN, CALL_BEGIN, SEP};
        match (self, name) {
            (ToolSyntax::DeepSeek, Some(n)) => format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}{n}\n```json\n"),
            (ToolSyntax::DeepSeek, None) => format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}"),
            (ToolSyntax::DeepSeekV31, Some(n)) => format!("{CALLS_BEGIN}{CALL_BEGIN}{n}{SEP}"),
            (ToolSyntax::DeepSeekV31, None) => format!("{CALLS_BEGIN}{CALL_BEGIN}"),
            (ToolSyntax::Glm, Some(n)) => format!("<tool_call>{n}\n"),
            (ToolSyntax::Glm, None) => "<tool_call>".to_string(),
            (ToolSyntax::QwenXml, Some(n)) => format!("<tool_call>\n{}{n}>\n", qwen_xml::FUNCTION),
            (ToolSyntax::QwenXml, None) => format!("<tool_call>\n{}", qwen_xml::FUNCTION),
            (ToolSyntax::MiniMax, Some(n)) => format!("{}\n{}\"{n}\">\n", minimax::CALLS, minimax::INVOKE),
            (ToolSyntax::MiniMax, None) => format!("{}\n{}\"", minimax::CALLS, minimax::INVOKE),
            (ToolSyntax::Dsml, Some(n)) => format!("\n\n{}\n{}\"{n}\">\n", dsml::CALLS, dsml::INVOKE),
            (ToolSyntax::Dsml, None) => format!("\n\n{}\n{}\"", dsml::CALLS, dsml::INVOKE),
            (ToolSyntax::Kimi, Some(n)) => format!(
                "{}{}{}{n}:0{}",
                kimi::SECTION,
                kimi::CALL_BEGIN,
                kimi::FUNCTIONS,
                kimi::ARGUMENTS
            ),
            (ToolSyntax::Kimi, None) => format!("{}{}{}", kimi::SECTION, kimi::CALL_BEGIN, kimi::FUNCTIONS),
            (ToolSyntax::Harmony, Some(n)) => format!(
                "{}commentary to={}{n} {}json{}",
                harmony::CHANNEL,
                harmony::FUNCTIONS,
                harmony::CONSTRAIN,
                harmony::MESSAGE
            ),
            (ToolSyntax::Harmony, None) => format!("{}commentary to={}", harmony::CHANNEL, harmony::FUNCTIONS),
            (_, Some(n)) => format!("<tool_call>\n{{\"name\": \"{n}\", \"arguments\": "),
            (_, None) => "<tool_call>\n{\"name\": \"".to_string(),
        }
    }

    /// The grammar of what follows [`ToolSyntax::prefill`]`(name)`: the
    /// rest of one call to `name` (or to any of `tools`), its arguments
    /// valid for the tool's schema, closed where the call's JSON closes.
    pub fn forced_grammar(self, tools: &[ToolDef], name: Option<&str>) -> GrammarSpec {
        match self {
            ToolSyntax::Glm => return glm_grammar(tools, name),
            ToolSyntax::QwenXml => return qwen_xml_grammar(tools, name),
            ToolSyntax::MiniMax => return minimax_grammar(tools, name),
            ToolSyntax::Dsml => return dsml_grammar(tools, name),
            ToolSyntax::Harmony => return harmony_grammar(tools, name),
            _ => {}
        }
        let args = |t: &ToolDef| {
            let schema = t.parameters.clone().unwrap_or_else(|| json!({"type": "object"}));
            format!("%json {}", json_layout(schema))
        };
        match name {
            Some(n) => {
                let t = tools.iter().find(|t| t.name == n);
                let body = t.map_or_else(|| "%json {\"type\": \"object\"}".to_string(), args);
                // What closes the call after its arguments.
                let end = match self {
                    ToolSyntax::DeepSeek => "\"\\n```\"",
                    ToolSyntax::DeepSeekV31 | ToolSyntax::Kimi => "",
                    _ => "\"}\"",
                };
                GrammarSpec::Lark(format!("start: {body} {end}\n"))
            }
            None => {
                let alternatives: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
                let mut g = format!("start: {}\n", alternatives.join(" | "));
                for (i, t) in tools.iter().enumerate() {
                    // Names are letters, digits, '_', '-', '.' ([`check_name`]).
                    g.push_str(&match self {
                        ToolSyntax::DeepSeek => {
                            format!("call{i}: \"{}\\n```json\\n\" {} \"\\n```\"\n", t.name, args(t))
                        }
                        ToolSyntax::DeepSeekV31 => {
                            format!("call{i}: \"{}{}\" {}\n", t.name, deepseek::SEP, args(t))
                        }
                        // The marker is a special token, written bare in
                        // llguidance's Lark.
                        ToolSyntax::Kimi => format!("call{i}: \"{}:0\" {} {}\n", t.name, kimi::ARGUMENTS, args(t)),
                        _ => format!("call{i}: \"{}\\\", \\\"arguments\\\": \" {} \"}}\"\n", t.name, args(t)),
                    });
                }
                GrammarSpec::Lark(g)
            }
        }
    }

    /// One block's inner text as a call (`strings`: the (tool, argument)
    /// pairs whose schema is a string, for syntaxes that write values bare).
    fn parse_block(self, inner: &str, strings: &[(String, String)]) -> Result<ToolCall, String> {
        match self {
            ToolSyntax::DeepSeek => return parse_deepseek_block(inner),
            ToolSyntax::DeepSeekV31 => return parse_deepseek_v31_block(inner),
            ToolSyntax::Kimi => return parse_kimi_block(inner),
            ToolSyntax::Glm => return parse_glm_block(inner, strings),
            ToolSyntax::QwenXml => return parse_qwen_xml_block(inner, strings),
            ToolSyntax::MiniMax => return parse_minimax_block(inner, strings),
            ToolSyntax::Dsml => return parse_dsml_block(inner, strings),
            ToolSyntax::Harmony => return parse_harmony_block(inner),
            _ => {}
        }
        let v: Value = serde_json::from_str(inner.trim()).map_err(|e| format!("not valid JSON ({e})"))?;
        let Value::Object(mut obj) = v else {
            return Err("not a JSON object".into());
        };
        let name = match obj.remove("name") {
            Some(Value::String(n)) if !n.is_empty() => n,
            Some(_) => return Err("\"name\" is not a non-empty string".into()),
            None => return Err("no \"name\"".into()),
        };
        let arguments = match obj.remove("arguments") {
            None => Map::new(),
            Some(Value::Object(m)) => m,
            // Some models write the arguments as a JSON string.
            Some(Value::String(s)) => match serde_json::from_str(&s) {
                Ok(Value::Object(m)) => m,
                _ => return Err("\"arguments\" is a string that is not a JSON object".into()),
            },
            Some(_) => return Err("\"arguments\" is not an object".into()),
        };
        Ok(ToolCall { name, arguments })
    }
}

/// A harmony call's text after `to=functions.` up to `<|call|>`:
/// `NAME[ <|constrain|>json]<|message|>ARGS`.
fn parse_harmony_block(inner: &str) -> Result<ToolCall, String> {
    let (head, args) = inner
        .split_once(harmony::MESSAGE)
        .ok_or_else(|| format!("no {}", harmony::MESSAGE))?;
    let name = head
        .split(|c: char| c.is_whitespace() || c == '<')
        .next()
        .unwrap_or_default();
    if name.is_empty() {
        return Err("no function name".into());
    }
    let arguments = match serde_json::from_str::<Value>(args.trim()) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err("the arguments are not a JSON object".into()),
        Err(e) => return Err(format!("the arguments are not valid JSON ({e})")),
    };
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// A forced harmony call after its prefill: the arguments for `name`'s
/// schema (the prefill ends at `<|message|>`), or, for any tool, one of
/// the names, the header's end (special tokens, written bare in
/// llguidance's Lark) and that tool's arguments. The answer then ends at
/// an end-of-sequence token (`<|call|>`).
fn harmony_grammar(tools: &[ToolDef], name: Option<&str>) -> GrammarSpec {
    let args = |t: Option<&ToolDef>| {
        let schema = t
            .and_then(|t| t.parameters.clone())
            .unwrap_or_else(|| json!({"type": "object"}));
        format!("%json {}", json_layout(schema))
    };
    match name {
        Some(n) => GrammarSpec::Lark(format!("start: {}\n", args(tools.iter().find(|t| t.name == n)))),
        None => {
            let alternatives: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
            let mut g = format!("start: {}\n", alternatives.join(" | "));
            for (i, t) in tools.iter().enumerate() {
                // Names are letters, digits, '_', '-', '.' ([`check_name`]).
                g.push_str(&format!(
                    "call{i}: \"{} \" {} \"json\" {} {}\n",
                    t.name,
                    harmony::CONSTRAIN,
                    harmony::MESSAGE,
                    args(Some(t))
                ));
            }
            GrammarSpec::Lark(g)
        }
    }
}

/// `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` (the closing fence may be
/// missing at the end of a cut answer).
fn parse_deepseek_block(inner: &str) -> Result<ToolCall, String> {
    let Some((kind, rest)) = inner.split_once(deepseek::SEP) else {
        return Err(format!("no {}", deepseek::SEP));
    };
    if kind.trim() != "function" {
        return Err(format!("a call of type {:?}, not function", kind.trim()));
    }
    let (name, body) = rest.split_once('\n').unwrap_or((rest, ""));
    let name = name.trim();
    if name.is_empty() {
        return Err("no function name".into());
    }
    Ok(ToolCall {
        name: name.to_string(),
        arguments: fenced_json_arguments(body)?,
    })
}

/// A JSON object of arguments, a json fence around it (or a closing fence
/// cut off at the end of an answer) allowed.
fn fenced_json_arguments(body: &str) -> Result<Map<String, Value>, String> {
    let body = body.trim();
    let body = body
        .strip_prefix("```json")
        .or_else(|| body.strip_prefix("```"))
        .unwrap_or(body);
    let body = body.trim_end().strip_suffix("```").unwrap_or(body);
    match serde_json::from_str::<Value>(body.trim()) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("the arguments are not a JSON object".into()),
        Err(e) => Err(format!("the arguments are not valid JSON ({e})")),
    }
}

/// DeepSeek-V3.1's `NAME<｜tool▁sep｜>ARGS` (a json fence around the
/// arguments tolerated).
fn parse_deepseek_v31_block(inner: &str) -> Result<ToolCall, String> {
    let (name, body) = inner
        .split_once(deepseek::SEP)
        .ok_or_else(|| format!("no {}", deepseek::SEP))?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("no single function name before {} ({name:?})", deepseek::SEP));
    }
    Ok(ToolCall {
        name: name.to_string(),
        arguments: fenced_json_arguments(body)?,
    })
}

/// Kimi K2's `functions.NAME:INDEX<|tool_call_argument_begin|>ARGS` (the
/// `functions.` prefix and the index tolerated missing).
fn parse_kimi_block(inner: &str) -> Result<ToolCall, String> {
    let (id, body) = inner
        .split_once(kimi::ARGUMENTS)
        .ok_or_else(|| format!("no {}", kimi::ARGUMENTS))?;
    let id = id.trim();
    let id = id.strip_prefix(kimi::FUNCTIONS).unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((name, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => id,
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("no single function name before {} ({id:?})", kimi::ARGUMENTS));
    }
    Ok(ToolCall {
        name: name.to_string(),
        arguments: fenced_json_arguments(body)?,
    })
}

/// A call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// The arguments as a JSON string (OpenAI's `function.arguments`).
    pub fn arguments_json(&self) -> String {
        serde_json::to_string(&self.arguments).unwrap_or_else(|_| "{}".into())
    }
}

/// A piece of parsed output.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text outside calls (never empty).
    Text(String),
    Call(ToolCall),
}

/// Parses streamed text into text and calls. Text that may still become
/// the start of a call block is held back, and so is a call block until it
/// closes; whitespace between text and a call is dropped. Feeding the whole
/// text at once ([`parse`]) gives the same pieces, merged.
#[derive(Debug)]
pub struct ToolStream {
    syntax: ToolSyntax,
    /// Tools the model may call; a call of any other is left as text.
    names: Vec<String>,
    /// Text not yet released (a possible opening tag, or an open block's inside).
    buf: String,
    in_block: bool,
    /// Trailing whitespace of released text, held until it is known
    /// whether a call follows (then it is dropped).
    ws: String,
    /// Whitespace right after a call is dropped.
    after_call: bool,
    calls: usize,
    warnings: Vec<String>,
    /// (tool, argument) pairs whose schema is a string.
    strings: Vec<(String, String)>,
}

impl ToolStream {
    /// A parser for `syntax` that accepts calls of `names`.
    pub fn new(syntax: ToolSyntax, names: &[String]) -> Self {
        ToolStream {
            strings: Vec::new(),
            syntax,
            names: names.to_vec(),
            buf: String::new(),
            in_block: false,
            ws: String::new(),
            after_call: false,
            calls: 0,
            warnings: Vec::new(),
        }
    }

    /// The tools' schemas (as templates get them): arguments declared as
    /// strings stay strings in syntaxes that write values bare.
    pub fn with_schemas(mut self, rendered: &[Value]) -> Self {
        for t in rendered {
            let f = &t["function"];
            let (Some(name), Some(props)) = (f["name"].as_str(), f["parameters"]["properties"].as_object()) else {
                continue;
            };
            for (k, v) in props {
                if v.get("type").and_then(Value::as_str) == Some("string") {
                    self.strings.push((name.to_string(), k.clone()));
                }
            }
        }
        self
    }

    /// Calls parsed so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Why blocks were left as text (one line each).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Adds text; returns what it released.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        let (open, close) = (self.syntax.open(), self.syntax.close());
        loop {
            if self.in_block {
                let Some(at) = self.buf.find(close) else { break };
                let inner: String = self.buf[..at].to_string();
                self.buf.drain(..at + close.len());
                self.in_block = false;
                let raw = format!("{open}{inner}{close}");
                self.block(&inner, raw, &mut out);
            } else if let Some(at) = self.buf.find(open) {
                let before: String = self.buf[..at].to_string();
                self.buf.drain(..at + open.len());
                self.in_block = true;
                self.text(&before, &mut out);
            } else {
                // Held: what may be the start of a call or of a frame marker
                // (dropped only when whole).
                let hold = std::iter::once(open)
                    .chain(self.syntax.frame().iter().copied())
                    .map(|tag| held_prefix(&self.buf, tag))
                    .max()
                    .unwrap_or(0);
                let cut = self.buf.len() - hold;
                let before: String = self.buf.drain(..cut).collect();
                self.text(&before, &mut out);
                break;
            }
        }
        out
    }

    /// The end of the text: an unclosed block is parsed as it stands (a
    /// call when its JSON is whole), held text is released.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if self.in_block {
            self.in_block = false;
            let raw = format!("{}{rest}", self.syntax.open());
            self.block(&rest, raw, &mut out);
        } else {
            self.text(&rest, &mut out);
        }
        // Trailing whitespace matters to a plain answer, not around calls.
        let ws = std::mem::take(&mut self.ws);
        if self.calls == 0 && !ws.is_empty() {
            push_text(&mut out, ws);
        }
        out
    }

    fn text(&mut self, t: &str, out: &mut Vec<Piece>) {
        let framed;
        let mut t = t;
        if self.syntax.frame().iter().any(|m| t.contains(m)) {
            framed = self
                .syntax
                .frame()
                .iter()
                .fold(t.to_string(), |acc, m| acc.replace(m, ""));
            t = &framed;
        }
        if self.after_call {
            t = t.trim_start();
            if t.is_empty() {
                return;
            }
            self.after_call = false;
        }
        if t.is_empty() {
            return;
        }
        let mut s = std::mem::take(&mut self.ws);
        s.push_str(t);
        let body = s.trim_end().len();
        self.ws = s[body..].to_string();
        s.truncate(body);
        if !s.is_empty() {
            push_text(out, s);
        }
    }

    fn block(&mut self, inner: &str, raw: String, out: &mut Vec<Piece>) {
        let parsed = self.syntax.parse_block(inner, &self.strings).and_then(|c| {
            if self.names.contains(&c.name) {
                Ok(c)
            } else {
                Err(format!("calls {:?}, which is not among the tools offered", c.name))
            }
        });
        match parsed {
            Ok(call) => {
                self.ws.clear();
                self.after_call = true;
                self.calls += 1;
                out.push(Piece::Call(call));
            }
            Err(why) => {
                self.warnings
                    .push(format!("a {} block was left in the text: {why}", self.syntax.open()));
                self.text(&raw, out);
            }
        }
    }
}

fn push_text(out: &mut Vec<Piece>, s: String) {
    if let Some(Piece::Text(last)) = out.last_mut() {
        last.push_str(&s);
    } else {
        out.push(Piece::Text(s));
    }
}

/// Bytes at the end of `s` that are a proper prefix of `tag`.
fn held_prefix(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| k <= s.len() && tag.is_char_boundary(k) && s.ends_with(&tag[..k]))
        .unwrap_or(0)
}

/// Generated text, parsed whole.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    /// The text outside calls (the whole text when there are none).
    pub content: String,
    pub calls: Vec<ToolCall>,
    pub warnings: Vec<String>,
}

/// Parses a whole text.
pub fn parse(syntax: ToolSyntax, names: &[String], text: &str) -> Parsed {
    let mut s = ToolStream::new(syntax, names);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    collect(s.warnings, pieces)
}

fn collect(warnings: Vec<String>, pieces: Vec<Piece>) -> Parsed {
    let mut p = Parsed {
        warnings,
        ..Default::default()
    };
    for piece in pieces {
        match piece {
            Piece::Text(t) => p.content.push_str(&t),
            Piece::Call(c) => p.calls.push(c),
        }
    }
    p
}

// ---- requests ------------------------------------------------------------------

/// A tool the client offers.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON schema (an object).
    pub parameters: Option<Value>,
}

/// A request's `tools` list (empty when absent or null).
pub fn tool_list(v: Option<Value>) -> Result<Vec<Value>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err("tools must be a list".into()),
    }
}

impl ToolDef {
    /// The `name`, `description` and schema (`schema_key`; `None` when
    /// absent unless `schema_required`) of one tool definition, whose path in
    /// the request is `at` (for messages).
    pub fn from_fields(
        fields: &mut Map<String, Value>,
        at: &str,
        schema_key: &str,
        schema_required: bool,
    ) -> Result<ToolDef, String> {
        let name = match fields.remove("name") {
            Some(Value::String(n)) => n,
            Some(_) => return Err(format!("{at}.name is not a string")),
            None => return Err(format!("{at}.name is missing")),
        };
        check_name(&name).map_err(|why| format!("{at}.name {name:?} {why}"))?;
        let description = match fields.remove("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d),
            Some(_) => return Err(format!("{at}.description is not a string")),
        };
        let parameters = match fields.remove(schema_key) {
            Some(p @ Value::Object(_)) => Some(p),
            None | Some(Value::Null) if !schema_required => None,
            None => return Err(format!("{at}.{schema_key} is missing")),
            Some(_) => return Err(format!("{at}.{schema_key} must be a JSON schema object")),
        };
        Ok(ToolDef {
            name,
            description,
            parameters,
        })
    }

    /// The definition as templates get it (OpenAI's function-tool shape).
    pub fn rendered(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            f.insert("description".into(), json!(d));
        }
        if let Some(p) = &self.parameters {
            f.insert("parameters".into(), p.clone());
        }
        json!({"type": "function", "function": f})
    }
}

/// Whether (and which) tool the model must call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The model decides (the default).
    Auto,
    /// No tools: they are not shown to the model.
    None,
    /// Some tool (OpenAI `required`, Anthropic `any`).
    Required,
    /// This tool.
    Named(String),
}

impl Choice {
    /// The OpenAI words (chat completions and Responses): `auto`, `none`,
    /// `required`.
    pub fn from_word(word: &str) -> Option<Choice> {
        match word {
            "auto" => Some(Choice::Auto),
            "none" => Some(Choice::None),
            "required" => Some(Choice::Required),
            _ => None,
        }
    }
}

/// Checks a tool name: 1 to [`MAX_TOOL_NAME`] letters, digits, `_`, `-`
/// or `.` (it is written into JSON and the call prefill as it is).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.len() > MAX_TOOL_NAME {
        return Err(format!(
            "is {} bytes long; at most {MAX_TOOL_NAME} are allowed",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "has the character {c:?}; only letters, digits, '_', '-' and '.' are allowed"
        ));
    }
    Ok(())
}

/// What a request's tools make of its prompt and its answer.
#[derive(Clone, Debug)]
pub struct ToolPlan {
    pub syntax: ToolSyntax,
    /// The tools as the template gets them.
    pub rendered: Vec<Value>,
    /// Names the model may call.
    pub names: Vec<String>,
    /// The start of the answer (empty unless a call is forced).
    pub prefill: String,
    /// What the model may write after the prefill (a forced call only).
    pub grammar: Option<GrammarSpec>,
}

impl ToolPlan {
    /// The answer parsed (`text`: what the model generated after the prefill).
    pub fn parse(&self, text: &str) -> Parsed {
        let mut s = self.stream();
        let mut pieces = s.push(text);
        pieces.extend(s.finish());
        collect(s.warnings, pieces)
    }

    /// A streaming parser, already fed the prefill.
    pub fn stream(&self) -> ToolStream {
        let mut s = ToolStream::new(self.syntax, &self.names).with_schemas(&self.rendered);
        let none = s.push(&self.prefill);
        debug_assert!(none.is_empty(), "a prefill opens a call block");
        s
    }
}

/// The plan for `tools` and `choice` (`tools_param` / `choice_param`: the
/// fields' names in this API): `None` when no tools are rendered (none
/// given, or `choice` is [`Choice::None`]). 400 for duplicate names, a
/// forced choice without tools or naming an unknown tool, and tools (not
/// turned off by [`Choice::None`]) for a model without a chat template
/// (`syntax` None; a template without tools of its own gets
/// [`ToolSyntax::Generic`]).
pub fn plan(
    syntax: Option<ToolSyntax>,
    tools: Vec<ToolDef>,
    choice: Choice,
    tools_param: &'static str,
    choice_param: &'static str,
) -> Result<Option<ToolPlan>, ApiError> {
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(ApiError::invalid_param(
                tools_param,
                format!("{tools_param}[{i}]: the tool name {:?} is used twice", t.name),
            ));
        }
    }
    if tools.is_empty() {
        return match choice {
            Choice::Required | Choice::Named(_) => Err(ApiError::invalid_param(
                choice_param,
                format!("{choice_param} forces a tool call, but no {tools_param} are given"),
            )),
            Choice::Auto | Choice::None => Ok(None),
        };
    }
    if choice == Choice::None {
        // Not shown to the model (any template will do).
        return Ok(None);
    }
    let Some(syntax) = syntax else {
        return Err(ApiError::invalid_param(
            tools_param,
            "this model has no chat template, so it has no tool-call syntax; tools are not supported for it",
        ));
    };
    let (prefill, grammar) = match &choice {
        Choice::None | Choice::Auto => (String::new(), None),
        Choice::Required => (syntax.prefill(None), Some(syntax.forced_grammar(&tools, None))),
        Choice::Named(n) => {
            if !tools.iter().any(|t| t.name == *n) {
                return Err(ApiError::invalid_param(
                    choice_param,
                    format!("{choice_param} names the tool {n:?}, which is not among {tools_param}"),
                ));
            }
            (syntax.prefill(Some(n)), Some(syntax.forced_grammar(&tools, Some(n))))
        }
    };
    Ok(Some(ToolPlan {
        syntax,
        rendered: tools.iter().map(ToolDef::rendered).collect(),
        names: tools.into_iter().map(|t| t.name).collect(),
        prefill,
        grammar,
    }))
}

/// The conversation and the template's `tools` variable for `syntax`: a
/// template with its own tool syntax gets both as they are; for
/// [`ToolSyntax::Generic`] they are written into the messages
/// ([`generic_conversation`]) and no `tools` variable is passed.
pub fn prepare(
    syntax: Option<ToolSyntax>,
    plan: Option<&ToolPlan>,
    messages: Vec<Message>,
) -> (Vec<Message>, Vec<Value>) {
    let rendered = plan.map(|p| p.rendered.clone()).unwrap_or_default();
    match syntax {
        Some(ToolSyntax::Generic) => (generic_conversation(messages, &rendered), Vec::new()),
        Some(ToolSyntax::DeepSeek) => (deepseek_conversation(messages, &rendered), Vec::new()),
        Some(ToolSyntax::DeepSeekV31) => (deepseek_v31_conversation(messages, &rendered), Vec::new()),
        Some(ToolSyntax::Harmony) => (harmony::conversation(messages), rendered),
        _ => (messages, rendered),
    }
}

/// Appends `section` to the conversation's system message, or starts the
/// conversation with one that holds it.
fn add_system_section(messages: &mut Vec<Message>, section: &str) {
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            first.content.push_str("\n\n");
            first.content.push_str(section);
        }
        _ => messages.insert(0, Message::new("system", section)),
    }
}

/// A conversation for DeepSeek's template: each call's arguments as JSON
/// text (the template writes them as they are), and the tools (which the
/// template does not render) in a section of the system message that shows
/// the call syntax.
pub fn deepseek_conversation(messages: Vec<Message>, rendered: &[Value]) -> Vec<Message> {
    use deepseek::{CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP};
    let mut out: Vec<Message> = messages
        .into_iter()
        .map(|mut m| {
            if let Some(calls) = &mut m.tool_calls {
                for c in calls.iter_mut() {
                    let args = crate::chat_template::py_json(&c["function"]["arguments"]);
                    c["function"]["arguments"] = Value::String(args);
                }
            }
            m
        })
        .collect();
    if !rendered.is_empty() {
        let how = format!(
            "To call functions, answer with {CALLS_BEGIN}, then for each call \
             {CALL_BEGIN}function{SEP}<function name>\n```json\n{{<arguments>}}\n```{CALL_END}, then {CALLS_END}."
        );
        add_system_section(&mut out, &deepseek_tools_section(rendered, &how));
    }
    out
}

/// The tools section DeepSeek's templates do not write: each tool's JSON,
/// then `how` to call them.
fn deepseek_tools_section(rendered: &[Value], how: &str) -> String {
    let mut section =
        String::from("## Tools\n\nYou can call these functions; their arguments follow the JSON schemas given:");
    for t in rendered {
        section.push('\n');
        section.push_str(&crate::chat_template::py_json(t));
    }
    section.push_str("\n\n");
    section.push_str(how);
    section
}

/// A conversation for DeepSeek-V3.1's template: calls as they are (it
/// writes their arguments through `tojson`), and the tools in a section of
/// the system message that shows V3.1's call syntax.
pub fn deepseek_v31_conversation(messages: Vec<Message>, rendered: &[Value]) -> Vec<Message> {
    use deepseek::{CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP};
    let mut out = messages;
    if !rendered.is_empty() {
        let how = format!(
            "To call functions, answer with {CALLS_BEGIN}, then for each call \
             {CALL_BEGIN}<function name>{SEP}{{<arguments as JSON>}}{CALL_END} (calls one after \
             another, nothing between them), then {CALLS_END}."
        );
        add_system_section(&mut out, &deepseek_tools_section(rendered, &how));
    }
    out
}

/// A conversation with tools for a template that knows none: the tools
/// (`rendered`, as templates get them) in a section of the system message
/// (one is added when the conversation has none), each assistant call as a
/// `<tool_call>` block after the turn's text, and each run of tool results
/// as one user turn of `<tool_response>` blocks.
pub fn generic_conversation(messages: Vec<Message>, rendered: &[Value]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        if let Some(calls) = &m.tool_calls {
            let mut text = m.content.clone();
            for c in calls {
                let call = json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]});
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&format!(
                    "<tool_call>\n{}\n</tool_call>",
                    crate::chat_template::py_json(&call)
                ));
            }
            let mut a = Message::new("assistant", &text);
            a.reasoning_content = m.reasoning_content;
            out.push(a);
        } else if m.tool_call_id.is_some() {
            let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
            match out.last_mut() {
                Some(last) if last.role == "user" && last.content.starts_with("<tool_response>") => {
                    last.content.push('\n');
                    last.content.push_str(&block);
                }
                _ => out.push(Message::new("user", &block)),
            }
        } else {
            out.push(m);
        }
    }
    if !rendered.is_empty() {
        let mut section = String::from(
            "# Tools\n\nYou can call these functions; their arguments follow the JSON schemas given:\n<tools>",
        );
        for t in rendered {
            section.push('\n');
            section.push_str(&crate::chat_template::py_json(t));
        }
        section.push_str(
            "\n</tools>\n\nTo call functions, answer with one block per call, each a JSON object with the \
             function's name and its arguments:\n<tool_call>\n{\"name\": \"<function name>\", \"arguments\": \
             {<arguments>}}\n</tool_call>\nEach result comes back in a <tool_response> block.",
        );
        add_system_section(&mut out, &section);
    }
    out
}

/// 400 when the conversation holds tool calls or results but the model's
/// has no chat template (`syntax` None: they would be dropped silently).
pub fn check_history(syntax: Option<ToolSyntax>, messages: &[Message], param: &'static str) -> Result<(), ApiError> {
    if syntax.is_none()
        && messages
            .iter()
            .any(|m| m.tool_calls.is_some() || m.tool_call_id.is_some())
    {
        return Err(ApiError::invalid_param(
            param,
            "the conversation has tool calls or tool results, but this model's chat template has no \
             tool support",
        ));
    }
    Ok(())
}

/// Tracks which call ids a tool result may answer: those of the latest
/// assistant message with calls, until another kind of message comes.
#[derive(Debug, Default)]
pub struct CallIds {
    open: Option<Vec<String>>,
}

impl CallIds {
    /// An assistant message with calls `ids`.
    pub fn calls(&mut self, ids: Vec<String>) {
        self.open = Some(ids);
    }

    /// Any message that is neither a call nor a result.
    pub fn other(&mut self) {
        self.open = None;
    }

    /// A result for `id`; `Err` says what is wrong.
    pub fn result(&self, id: &str) -> Result<(), String> {
        match &self.open {
            None => Err("a tool result must follow an assistant message with tool calls".into()),
            Some(ids) if !ids.iter().any(|i| i == id) => Err(format!(
                "answers the tool call {id:?}, which the preceding assistant message did not make"
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: ToolSyntax = ToolSyntax::Hermes;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "search".into()]
    }

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.as_object().unwrap().clone(),
        }
    }

    #[test]
    fn detects_the_hermes_syntax_from_the_template() {
        let qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools> <tool_call>\n{%- endif %}";
        assert_eq!(ToolSyntax::detect(qwen), Some(H));
        assert_eq!(ToolSyntax::detect("{{ messages[0].content }}"), None);
    }

    #[test]
    fn one_call_with_text_around() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let p = parse(H, &names(), text);
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.calls, vec![call("get_weather", json!({"city": "Paris"}))]);
        assert!(p.warnings.is_empty());
        assert_eq!(p.calls[0].arguments_json(), r#"{"city":"Paris"}"#);
    }

    #[test]
    fn parallel_calls_and_text_after() {
        let text = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a\", \"n\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>\nDone.\n";
        let p = parse(H, &names(), text);
        assert_eq!(p.content, "Done.");
        assert_eq!(
            p.calls,
            vec![
                call("search", json!({"q": "a", "n": 2})),
                call("get_weather", json!({}))
            ]
        );
        // Argument order is kept.
        assert_eq!(p.calls[0].arguments_json(), r#"{"q":"a","n":2}"#);
    }

    #[test]
    fn plain_text_is_untouched() {
        for text in ["", " hi there \n", "a < b and <tool", "x\n\n"] {
            let p = parse(H, &names(), text);
            assert_eq!(p.content, text);
            assert!(p.calls.is_empty());
        }
    }

    #[test]
    fn malformed_blocks_stay_in_the_text_with_a_warning() {
        let cases = [
            (
                "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": }\n</tool_call>",
                "not valid JSON",
            ),
            ("<tool_call>\n{\"arguments\": {}}\n</tool_call>", "no \"name\""),
            ("<tool_call>\n[1, 2]\n</tool_call>", "not a JSON object"),
            (
                "<tool_call>\n{\"name\": \"search\", \"arguments\": 3}\n</tool_call>",
                "not an object",
            ),
            (
                "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
                "not among the tools",
            ),
            (
                "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\"",
                "not valid JSON",
            ),
        ];
        for (text, why) in cases {
            let t = format!("Before. {text}");
            let p = parse(H, &names(), &t);
            assert_eq!(p.content, t, "the text is kept verbatim");
            assert!(p.calls.is_empty());
            assert_eq!(p.warnings.len(), 1);
            assert!(p.warnings[0].contains(why), "{why}: {:?}", p.warnings);
        }
    }

    #[test]
    fn a_bad_block_next_to_a_good_one() {
        let text = "<tool_call>\nnope\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
        let p = parse(H, &names(), text);
        assert_eq!(p.content, "<tool_call>\nnope\n</tool_call>");
        assert_eq!(p.calls, vec![call("search", json!({"q": "x"}))]);
        assert_eq!(p.warnings.len(), 1);
    }

    #[test]
    fn an_unclosed_block_at_the_end_is_a_call_when_its_json_is_whole() {
        let p = parse(
            H,
            &names(),
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n",
        );
        assert_eq!(p.calls, vec![call("search", json!({"q": "x"}))]);
        assert_eq!(p.content, "");
    }

    #[test]
    fn string_arguments_are_accepted_when_they_hold_an_object() {
        let p = parse(
            H,
            &names(),
            "<tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>",
        );
        assert_eq!(p.calls, vec![call("search", json!({"q": 1}))]);
    }

    /// Feeding `text` split at every byte position gives the same result as
    /// whole, and never releases text that belongs to a call.
    #[test]
    fn streaming_holds_back_possible_tags_and_matches_whole_parsing() {
        let text = "Sure. <tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"été\"}}\n</tool_call>\n<tool_call>bad</tool_call> tail <tool";
        let whole = parse(H, &names(), text);
        assert_eq!(whole.calls.len(), 1);
        assert_eq!(whole.content, "Sure.<tool_call>bad</tool_call> tail <tool");
        for size in 1..8 {
            let mut s = ToolStream::new(H, &names());
            let mut pieces = Vec::new();
            let mut rest = text;
            while !rest.is_empty() {
                let mut n = size.min(rest.len());
                while !rest.is_char_boundary(n) {
                    n += 1;
                }
                let (a, b) = rest.split_at(n);
                for p in s.push(a) {
                    if let Piece::Text(t) = &p {
                        assert!(!t.contains("{\"name\""), "call text leaked: {t:?}");
                    }
                    pieces.push(p);
                }
                rest = b;
            }
            pieces.extend(s.finish());
            let mut content = String::new();
            let mut calls = Vec::new();
            for p in pieces {
                match p {
                    Piece::Text(t) => content.push_str(&t),
                    Piece::Call(c) => calls.push(c),
                }
            }
            assert_eq!(content, whole.content, "chunk size {size}");
            assert_eq!(calls, whole.calls, "chunk size {size}");
        }
    }

    #[test]
    fn a_tag_prefix_is_held_until_it_cannot_be_a_tag() {
        let mut s = ToolStream::new(H, &names());
        assert_eq!(s.push("a <tool"), vec![Piece::Text("a".into())]);
        assert_eq!(s.push("box"), vec![Piece::Text(" <toolbox".into())]);
        assert_eq!(s.push("<tool_call>{\"name\": \"search\""), vec![]);
        assert_eq!(
            s.push(", \"arguments\": {}}</tool_call>"),
            vec![Piece::Call(call("search", json!({})))]
        );
        assert_eq!(s.finish(), vec![]);
    }

    #[test]
    fn prefills_continue_into_a_call() {
        let named = ToolSyntax::Hermes.prefill(Some("search"));
        assert_eq!(named, "<tool_call>\n{\"name\": \"search\", \"arguments\": ");
        let p = parse(H, &names(), &format!("{named}{{\"q\": \"x\"}}}}\n</tool_call>"));
        assert_eq!(p.calls, vec![call("search", json!({"q": "x"}))]);
        let any = ToolSyntax::Hermes.prefill(None);
        let p = parse(
            H,
            &names(),
            &format!("{any}get_weather\", \"arguments\": {{}}}}\n</tool_call>"),
        );
        assert_eq!(p.calls, vec![call("get_weather", json!({}))]);
    }

    fn def(name: &str) -> ToolDef {
        ToolDef {
            name: name.into(),
            description: Some("d".into()),
            parameters: Some(json!({"type": "object", "properties": {}})),
        }
    }

    #[test]
    fn plans() {
        let p = plan(Some(H), vec![def("a"), def("b")], Choice::Auto, "tools", "tool_choice")
            .unwrap()
            .unwrap();
        assert_eq!(p.prefill, "");
        assert_eq!(
            p.rendered[0],
            json!({"type": "function", "function": {"name": "a", "description": "d", "parameters": {"type": "object", "properties": {}}}})
        );
        let p = plan(
            Some(H),
            vec![def("a")],
            Choice::Named("a".into()),
            "tools",
            "tool_choice",
        )
        .unwrap()
        .unwrap();
        assert!(p.prefill.ends_with("\"arguments\": "));
        assert!(plan(Some(H), vec![def("a")], Choice::None, "tools", "tool_choice")
            .unwrap()
            .is_none());
        assert!(plan(None, vec![], Choice::Auto, "tools", "tool_choice")
            .unwrap()
            .is_none());
        for (syntax, tools, choice, needle) in [
            (Some(H), vec![def("a"), def("a")], Choice::Auto, "used twice"),
            (Some(H), vec![], Choice::Required, "no tools"),
            (Some(H), vec![def("a")], Choice::Named("b".into()), "\"b\""),
            (None, vec![def("a")], Choice::Auto, "no chat template"),
        ] {
            let e = plan(syntax, tools, choice, "tools", "tool_choice").unwrap_err();
            assert!(e.message.contains(needle), "{needle}: {}", e.message);
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("get_weather-2.v1").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\"b").is_err());
        assert!(check_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn results_must_answer_the_preceding_calls() {
        let mut ids = CallIds::default();
        assert!(ids.result("c1").is_err());
        ids.calls(vec!["c1".into(), "c2".into()]);
        assert!(ids.result("c2").is_ok());
        assert!(ids.result("c3").is_err());
        ids.other();
        assert!(ids.result("c1").is_err());
    }

    #[test]
    fn a_template_without_tools_gets_the_generic_conversation() {
        assert_eq!(ToolSyntax::for_template("{{ m.content }}"), ToolSyntax::Generic);
        let tools = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})];
        let call = json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}});
        let msgs = vec![
            Message::new("user", "hi"),
            Message::assistant_calls("Let me look.", vec![call]),
            Message::tool_result("c1", "42"),
            Message::tool_result("c1", "43"),
        ];
        let out = generic_conversation(msgs, &tools);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].role, "system");
        assert!(out[0]
            .content
            .contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\""));
        assert_eq!(out[1], Message::new("user", "hi"));
        assert_eq!(
            out[2],
            Message::new(
                "assistant",
                "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
            )
        );
        assert_eq!(
            out[3],
            Message::new(
                "user",
                "<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response>"
            )
        );
        assert!(out.iter().all(|m| m.tool_calls.is_none() && m.tool_call_id.is_none()));
        // An existing system message takes the section.
        let out = generic_conversation(
            vec![Message::new("system", "Be kind."), Message::new("user", "hi")],
            &tools,
        );
        assert_eq!(out.len(), 2);
        assert!(out[0].content.starts_with("Be kind.\n\n# Tools"));
        // The generic answer parses like Hermes.
        let p = parse(
            ToolSyntax::Generic,
            &["f".into()],
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        );
        assert_eq!(p.calls.len(), 1);
    }

    #[test]
    fn deepseek_calls_parse_whole_and_streamed() {
        use super::deepseek::*;
        let names = vec!["get_weather".to_string(), "clock".to_string()];
        let text = format!(
            "Checking.{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{{\"city\": \"Paris\"}}\n```{CALL_END}\n\
             {CALL_BEGIN}function{SEP}clock\n```json\n{{}}\n```{CALL_END}{CALLS_END}"
        );
        let whole = parse(ToolSyntax::DeepSeek, &names, &text);
        assert_eq!(whole.content, "Checking.");
        assert_eq!(whole.calls.len(), 2, "{whole:?}");
        assert_eq!(whole.calls[0].arguments_json(), r#"{"city":"Paris"}"#);
        assert_eq!(whole.calls[1].name, "clock");
        assert!(whole.warnings.is_empty(), "{:?}", whole.warnings);
        // Token by token (each marker is one token), the same pieces.
        let mut st = ToolStream::new(ToolSyntax::DeepSeek, &names);
        let mut pieces = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let n = [CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP]
                .iter()
                .find(|m| rest.starts_with(**m))
                .map_or_else(|| rest.chars().next().unwrap().len_utf8(), |m| m.len());
            pieces.extend(st.push(&rest[..n]));
            rest = &rest[n..];
        }
        pieces.extend(st.finish());
        let calls: Vec<&ToolCall> = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Call(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0], &whole.calls[0]);
        let text: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "Checking.");
        // A forced call cut after its arguments (no closing fence) is whole.
        let forced = format!(
            "{}{{\"city\": \"Lima\"}}\n```",
            ToolSyntax::DeepSeek.prefill(Some("get_weather"))
        );
        let p = parse(ToolSyntax::DeepSeek, &names, &forced);
        assert_eq!(p.calls.len(), 1, "{p:?}");
        assert_eq!(p.content, "");
        // Not JSON: left as text with a warning.
        let bad = format!("{CALLS_BEGIN}{CALL_BEGIN}function{SEP}clock\n```json\nnope\n```{CALL_END}{CALLS_END}");
        let p = parse(ToolSyntax::DeepSeek, &names, &bad);
        assert!(p.calls.is_empty() && p.warnings[0].contains("not valid JSON"), "{p:?}");
    }

    #[test]
    fn deepseek_conversations_carry_arguments_as_text_and_the_tools_in_the_system_message() {
        let tools = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})];
        let call = json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}});
        let out = deepseek_conversation(
            vec![Message::new("user", "hi"), Message::assistant_calls("", vec![call])],
            &tools,
        );
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains(super::deepseek::CALL_BEGIN));
        assert_eq!(
            out[2].tool_calls.as_ref().unwrap()[0]["function"]["arguments"],
            json!("{\"x\": 1}")
        );
        assert_eq!(
            ToolSyntax::DeepSeek.forced_grammar(&[], Some("f")),
            GrammarSpec::Lark("start: %json {\"type\": \"object\"} \"\\n```\"\n".into())
        );
    }

    #[test]
    fn glm_calls_parse_with_or_without_newlines_and_keep_string_arguments_strings() {
        let names = vec!["get_weather".to_string()];
        let text = "Let me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n\
                    <arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
        let p = parse(ToolSyntax::Glm, &names, text);
        assert_eq!(p.content, "Let me look.");
        assert_eq!(p.calls[0].arguments_json(), r#"{"city":"Paris","days":3}"#);
        let tight = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Lima</arg_value></tool_call>";
        assert_eq!(
            parse(ToolSyntax::Glm, &names, tight).calls[0].arguments["city"],
            json!("Lima")
        );
        // A string argument that looks like JSON stays a string when its schema says so.
        let zip = "<tool_call>get_weather<arg_key>zip</arg_key><arg_value>75001</arg_value></tool_call>";
        assert_eq!(
            parse(ToolSyntax::Glm, &names, zip).calls[0].arguments["zip"],
            json!(75001)
        );
        let rendered = vec![json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"zip": {"type": "string"}}}}})];
        let mut st = ToolStream::new(ToolSyntax::Glm, &names).with_schemas(&rendered);
        let mut pieces = st.push(zip);
        pieces.extend(st.finish());
        assert_eq!(pieces, vec![Piece::Call(call("get_weather", json!({"zip": "75001"})))]);
        // Malformed: text where a key should be, a key twice, no name.
        for bad in [
            "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>junk</tool_call>",
            "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2</arg_value></tool_call>",
            "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
        ] {
            let p = parse(ToolSyntax::Glm, &["f".into()], bad);
            assert!(p.calls.is_empty() && !p.warnings.is_empty(), "{bad}: {p:?}");
        }
        assert_eq!(ToolSyntax::Glm.prefill(Some("f")), "<tool_call>f\n");
    }

    #[test]
    fn qwen_xml_calls_parse_whole_and_streamed_with_values_typed_by_schema() {
        let names = vec!["get_weather".to_string(), "run".to_string()];
        let template = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>\\n' }}";
        assert_eq!(ToolSyntax::detect(template), Some(ToolSyntax::QwenXml));
        let text = "Let me look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
                    <parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>";
        let p = parse(ToolSyntax::QwenXml, &names, text);
        assert_eq!(p.content, "Let me look.");
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(
            p.calls,
            vec![call("get_weather", json!({"city": "Paris", "days": 3, "metric": true}))]
        );
        // A multi-line value with '<' keeps its inner newlines; a string
        // argument that looks like JSON stays a string when its schema says so.
        let code = "<tool_call>\n<function=run>\n<parameter=code>\nif a < b:\n    print(1)\n</parameter>\n\
                    <parameter=zip>\n75001\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>";
        let rendered = vec![json!({"type": "function", "function": {"name": "run",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "zip": {"type": "string"}}}}})];
        let mut st = ToolStream::new(ToolSyntax::QwenXml, &names).with_schemas(&rendered);
        let mut pieces = Vec::new();
        for chunk in code.as_bytes().chunks(7) {
            pieces.extend(st.push(std::str::from_utf8(chunk).unwrap()));
        }
        pieces.extend(st.finish());
        assert_eq!(
            pieces,
            vec![
                Piece::Call(call("run", json!({"code": "if a < b:\n    print(1)", "zip": "75001"}))),
                Piece::Call(call("get_weather", json!({}))),
            ]
        );
        // Malformed: no function tag, text where a parameter should be, a
        // parameter twice, an unclosed parameter.
        for bad in [
            "<tool_call>\n{\"name\": \"run\"}\n</tool_call>",
            "<tool_call>\n<function=run>\njunk\n</function>\n</tool_call>",
            "<tool_call>\n<function=run>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=run>\n<parameter=a>\n1\n</function>\n</tool_call>",
        ] {
            let p = parse(ToolSyntax::QwenXml, &names, bad);
            assert!(p.calls.is_empty() && !p.warnings.is_empty(), "{bad}: {p:?}");
        }
        let q = ToolSyntax::QwenXml;
        assert_eq!(q.prefill(Some("run")), "<tool_call>\n<function=run>\n");
        assert_eq!(q.prefill(None), "<tool_call>\n<function=");
        let tool = ToolDef {
            name: "get_weather".into(),
            description: None,
            parameters: Some(json!({"type": "object", "required": ["city"],
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}})),
        };
        let GrammarSpec::Lark(g) = q.forced_grammar(std::slice::from_ref(&tool), Some("get_weather")) else {
            panic!("a Lark grammar")
        };
        assert!(
            g.starts_with("start: t0p0 t0p1? \"</function>\\n</tool_call>\"\nt0p0: \"<parameter=city>\\n\" (/[^<]*/) \"\\n</parameter>\\n\""),
            "{g}"
        );
        let GrammarSpec::Lark(any) = q.forced_grammar(&[tool, def("run")], None) else {
            panic!("a Lark grammar")
        };
        assert!(any.starts_with("start: (\"get_weather>\\n\" t0p0 t0p1? \"</function>\\n</tool_call>\") | (\"run>\\n\" (\"<parameter=\" /[^>\\n]+/"), "{any}");
    }

    #[test]
    fn deepseek_v31_calls_have_no_type_and_no_fence() {
        use deepseek::{CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP};
        let v3 = format!("{{{{'{CALL_BEGIN}' + tool['type'] + '{SEP}' + name + '\\n```json\\n'}}}}");
        let v31 = format!("{{{{'{CALL_BEGIN}' + tool['function']['name'] + '{SEP}' + args | tojson}}}}");
        assert_eq!(ToolSyntax::detect(&v3), Some(ToolSyntax::DeepSeek));
        assert_eq!(ToolSyntax::detect(&v31), Some(ToolSyntax::DeepSeekV31));
        let d = ToolSyntax::DeepSeekV31;
        let names = vec!["get_weather".to_string(), "run".to_string()];
        let text = format!(
            "Checking.{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{\"city\": \"Paris\"}}{CALL_END}\
             {CALL_BEGIN}run{SEP}{{}}{CALL_END}{CALLS_END}"
        );
        let p = parse(d, &names, &text);
        assert_eq!(p.content, "Checking.");
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(
            p.calls,
            vec![call("get_weather", json!({"city": "Paris"})), call("run", json!({}))]
        );
        // The prefill of a forced call, and an answer cut after its JSON.
        assert_eq!(d.prefill(Some("run")), format!("{CALLS_BEGIN}{CALL_BEGIN}run{SEP}"));
        let forced = format!("{}{{\"x\": 1}}", d.prefill(Some("run")));
        assert_eq!(parse(d, &names, &forced).calls, vec![call("run", json!({"x": 1}))]);
        for bad in [
            format!("{CALL_BEGIN}get_weather{{}}{CALL_END}"),
            format!("{CALL_BEGIN}get_weather{SEP}[1]{CALL_END}"),
            format!("{CALL_BEGIN}{SEP}{{}}{CALL_END}"),
        ] {
            let p = parse(d, &names, &bad);
            assert!(p.calls.is_empty() && !p.warnings.is_empty(), "{bad}: {p:?}");
        }
        let GrammarSpec::Lark(g) = d.forced_grammar(&[def("run")], None) else {
            panic!("a Lark grammar")
        };
        assert!(
            g.starts_with(&format!("start: call0\ncall0: \"run{SEP}\" %json")),
            "{g}"
        );
        let conv = deepseek_v31_conversation(vec![Message::new("user", "hi")], &[def("run").rendered()]);
        assert_eq!(conv[0].role, "system");
        assert!(
            conv[0].content.contains(&format!("{CALL_BEGIN}<function name>{SEP}")),
            "{}",
            conv[0].content
        );
    }

    #[test]
    fn kimi_calls_take_their_name_from_the_call_id() {
        use kimi::{ARGUMENTS, CALL_BEGIN, CALL_END, SECTION, SECTION_END};
        let template = format!("{{{{'{CALL_BEGIN}' + formatted_id + '{ARGUMENTS}'}}}}");
        assert_eq!(ToolSyntax::detect(&template), Some(ToolSyntax::Kimi));
        let k = ToolSyntax::Kimi;
        assert!(k.keeps_special_tokens() && !ToolSyntax::QwenXml.keeps_special_tokens());
        let names = vec!["get_weather".to_string(), "run.v2".to_string()];
        let text = format!(
            "Let me check.{SECTION}{CALL_BEGIN}functions.get_weather:0{ARGUMENTS}{{\"city\": \"Paris\"}}{CALL_END}\
             {CALL_BEGIN}functions.run.v2:1{ARGUMENTS}{{}}{CALL_END}{SECTION_END}"
        );
        let whole = parse(k, &names, &text);
        assert_eq!(whole.content, "Let me check.");
        assert!(whole.warnings.is_empty(), "{:?}", whole.warnings);
        assert_eq!(
            whole.calls,
            vec![call("get_weather", json!({"city": "Paris"})), call("run.v2", json!({}))]
        );
        // Streamed a few bytes at a time (markers split across pieces), the
        // same pieces.
        let mut s = ToolStream::new(k, &names);
        let mut pieces = Vec::new();
        let bytes = text.as_bytes();
        let mut at = 0;
        while at < bytes.len() {
            let mut end = (at + 5).min(bytes.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            pieces.extend(s.push(&text[at..end]));
            at = end;
        }
        pieces.extend(s.finish());
        assert_eq!(collect(Vec::new(), pieces), whole);
        // The prefill of a forced call, and an answer cut after its JSON.
        assert_eq!(
            k.prefill(Some("run.v2")),
            format!("{SECTION}{CALL_BEGIN}functions.run.v2:0{ARGUMENTS}")
        );
        let forced = format!("{}{{\"x\": 1}}", k.prefill(Some("run.v2")));
        assert_eq!(parse(k, &names, &forced).calls, vec![call("run.v2", json!({"x": 1}))]);
        for bad in [
            format!("{CALL_BEGIN}functions.get_weather:0{{}}{CALL_END}"),
            format!("{CALL_BEGIN}functions.get_weather:0{ARGUMENTS}[1]{CALL_END}"),
            format!("{CALL_BEGIN}functions.:0{ARGUMENTS}{{}}{CALL_END}"),
            format!("{CALL_BEGIN}functions.search:0{ARGUMENTS}{{}}{CALL_END}"),
        ] {
            let p = parse(k, &names, &bad);
            assert!(p.calls.is_empty() && !p.warnings.is_empty(), "{bad}: {p:?}");
        }
        let GrammarSpec::Lark(g) = k.forced_grammar(&[def("run")], None) else {
            panic!("a Lark grammar")
        };
        assert!(
            g.starts_with(&format!("start: call0\ncall0: \"run:0\" {ARGUMENTS} %json")),
            "{g}"
        );
    }

    #[test]
    fn dsml_calls_type_their_values_by_the_string_attribute() {
        use dsml::{CALLS, CALLS_END, INVOKE, INVOKE_END, PARAMETER, PARAMETER_END};
        let d = ToolSyntax::Dsml;
        assert_eq!(ToolSyntax::detect("{%- set dsml_token = '｜DSML｜' -%}"), Some(d));
        let names = vec!["get_weather".to_string()];
        let text = format!(
            "Looking.\n\n{CALLS}\n{INVOKE}\"get_weather\">\n\
             {PARAMETER}\"city\" string=\"true\">75001{PARAMETER_END}\n\
             {PARAMETER}\"days\" string=\"false\">[1, 2]{PARAMETER_END}\n{INVOKE_END}\n{CALLS_END}"
        );
        let p = parse(d, &names, &text);
        assert_eq!(p.content, "Looking.");
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(
            p.calls,
            vec![call("get_weather", json!({"city": "75001", "days": [1, 2]}))]
        );
        let mut st = ToolStream::new(d, &names);
        let mut pieces = Vec::new();
        for chunk in text.chars().collect::<Vec<_>>().chunks(3) {
            pieces.extend(st.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(st.finish());
        assert_eq!(collect(st.warnings().to_vec(), pieces), p);
        for bad in [
            format!("{CALLS}{INVOKE}\"get_weather\">{PARAMETER}\"x\" string=\"false\">not json{PARAMETER_END}{INVOKE_END}{CALLS_END}"),
            format!("{CALLS}{INVOKE}\"get_weather\">{PARAMETER}\"x\" kind=\"y\">1{PARAMETER_END}{INVOKE_END}{CALLS_END}"),
            format!("{CALLS}{INVOKE}get_weather>{INVOKE_END}{CALLS_END}"),
        ] {
            let p = parse(d, &names, &bad);
            assert!(p.calls.is_empty() && !p.warnings.is_empty(), "{bad}: {p:?}");
        }
        let tool = ToolDef {
            name: "get_weather".into(),
            description: None,
            parameters: Some(json!({"type": "object", "required": ["city"],
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}})),
        };
        let GrammarSpec::Lark(g) = d.forced_grammar(&[tool], Some("get_weather")) else {
            panic!("a Lark grammar")
        };
        assert!(
            g.contains(&format!(
                "t0p0: \"{PARAMETER}\\\"city\\\" string=\\\"true\\\">\" (/[^<]*/)"
            )),
            "{g}"
        );
        assert!(
            g.contains(&format!(
                "t0p1: \"{PARAMETER}\\\"days\\\" string=\\\"false\\\">\" (%json"
            )),
            "{g}"
        );
    }

    #[test]
    fn minimax_calls_parse_several_to_a_block_and_force_through_invoke() {
        let names = vec!["get_weather".to_string(), "run".to_string()];
        let m = ToolSyntax::MiniMax;
        let text = "Checking.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n\
                    <parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n\
                    <invoke name=\"run\"><parameter name=\"code\">a < b</parameter></invoke>\n</minimax:tool_call>";
        let p = parse(m, &names, text);
        assert_eq!(p.content, "Checking.");
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", json!({"city": "Paris", "days": 3})),
                call("run", json!({"code": "a < b"})),
            ]
        );
        let mut st = ToolStream::new(m, &names);
        let mut pieces = Vec::new();
        for chunk in text.as_bytes().chunks(5) {
            pieces.extend(st.push(std::str::from_utf8(chunk).unwrap()));
        }
        pieces.extend(st.finish());
        let streamed = collect(st.warnings().to_vec(), pieces);
        assert_eq!(streamed, p, "streamed in pieces: the frame markers never leak");
        for bad in [
            "<minimax:tool_call>\n<invoke name=get_weather></invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"run\">junk</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"run\"><parameter name=\"a\">1</invoke>\n</minimax:tool_call>",
        ] {
            let p = parse(m, &names, bad);
            assert!(p.calls.is_empty() && !p.warnings.is_empty(), "{bad}: {p:?}");
        }
        assert_eq!(m.prefill(Some("run")), "<minimax:tool_call>\n<invoke name=\"run\">\n");
        let GrammarSpec::Lark(g) = m.forced_grammar(&[def("run")], None) else {
            panic!("a Lark grammar")
        };
        assert!(
            g.starts_with("start: (\"run\\\">\\n\" (\"<parameter name=\\\"\""),
            "{g}"
        );
        assert!(g.contains("\"</invoke>\\n</minimax:tool_call>\")"), "{g}");
    }

    #[test]
    fn harmony_is_detected_and_forces_calls_through_its_header() {
        let gpt_oss = "{{- '<|start|>assistant to=functions.' + name + '<|channel|>commentary json<|message|>' }}<tool_call>tools";
        assert_eq!(ToolSyntax::detect(gpt_oss), Some(ToolSyntax::Harmony));
        let h = ToolSyntax::Harmony;
        assert_eq!(
            h.prefill(Some("get_weather")),
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        );
        assert_eq!(h.prefill(None), "<|channel|>commentary to=functions.");
        assert_eq!(
            h.forced_grammar(&[def("a")], Some("a")),
            GrammarSpec::Lark(format!(
                "start: %json {}\n",
                json_layout(json!({"type": "object", "properties": {}}))
            ))
        );
        let GrammarSpec::Lark(any) = h.forced_grammar(&[def("a"), def("b")], None) else {
            panic!("a Lark grammar")
        };
        assert!(
            any.starts_with("start: call0 | call1\ncall0: \"a \" <|constrain|> \"json\" <|message|> %json"),
            "{any}"
        );
        // The ToolStream view of a call's text (the split itself is HarmonySplit's).
        let p = parse(
            h,
            &["f".into()],
            "to=functions.f <|constrain|>json<|message|>{\"x\": 1}<|call|>",
        );
        assert_eq!(p.calls, vec![call("f", json!({"x": 1}))]);
        assert!(parse(h, &["f".into()], "to=functions.f<|message|>nope<|call|>")
            .calls
            .is_empty());
    }
}
