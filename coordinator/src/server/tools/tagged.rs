//! Tool-call syntaxes that write each argument between tags, its value bare
//! (a string as it stands, anything else as JSON):
//!
//! - GLM-4.5 / 4.6 / 4.7: `<tool_call>NAME` + per argument
//!   `<arg_key>K</arg_key><arg_value>V</arg_value>` + `</tool_call>`, with
//!   or without newlines between the parts.
//! - Qwen3.5 / Qwen3.6 and Qwen3-Coder (their templates:
//!   `'<tool_call>\n<function=' + tool_call.name + '>\n'`, per argument
//!   `'<parameter=' + args_name + '>\n'` + the value + `'\n</parameter>\n'`,
//!   then `'</function>\n</tool_call>'`).
//!
//! - MiniMax-M2: `<minimax:tool_call>` + per call `<invoke name="NAME">` +
//!   per argument `<parameter name="K">V</parameter>` + `</invoke>`, then
//!   `</minimax:tool_call>` (its template: `v | tojson if v is not string
//!   else v`).
//!
//! - DeepSeek-V3.2's DSML: `<｜DSML｜function_calls>` + per call
//!   `<｜DSML｜invoke name="NAME">` + per argument `<｜DSML｜parameter
//!   name="K" string="true|false">V</｜DSML｜parameter>` + `</｜DSML｜invoke>`,
//!   then `</｜DSML｜function_calls>`; `string="true"` marks a bare string,
//!   `"false"` JSON (its template: `val | tojson` when `val` is no string).
//!
//! A value is the tool schema's string when the schema says string, else
//! JSON when it parses, else `True` / `False` as booleans (how a Python
//! template writes them), else the text.

use serde_json::{json, Map, Value};

use super::{ToolCall, ToolDef};
use crate::grammar::{json_layout, GrammarSpec};

/// GLM's argument tags.
pub mod glm {
    pub const KEY: &str = "<arg_key>";
    pub const KEY_END: &str = "</arg_key>";
    pub const VALUE: &str = "<arg_value>";
    pub const VALUE_END: &str = "</arg_value>";
}

/// Qwen3.5's and Qwen3-Coder's tags.
pub mod qwen_xml {
    pub const FUNCTION: &str = "<function=";
    pub const FUNCTION_END: &str = "</function>";
    pub const PARAMETER: &str = "<parameter=";
    pub const PARAMETER_END: &str = "</parameter>";

    /// Whether a chat template writes calls this way.
    pub fn is_qwen_xml(template: &str) -> bool {
        template.contains("<tool_call>") && template.contains(FUNCTION) && template.contains(PARAMETER)
    }
}

/// MiniMax-M2's tags.
pub mod minimax {
    pub const CALLS: &str = "<minimax:tool_call>";
    pub const CALLS_END: &str = "</minimax:tool_call>";
    pub const INVOKE: &str = "<invoke name=";
    pub const INVOKE_END: &str = "</invoke>";
    pub const PARAMETER: &str = "<parameter name=";
    pub const PARAMETER_END: &str = "</parameter>";
}

/// DeepSeek-V3.2's DSML tags.
pub mod dsml {
    /// What the template names its tags by.
    pub const MARK: &str = "｜DSML｜";
    pub const CALLS: &str = "<｜DSML｜function_calls>";
    pub const CALLS_END: &str = "</｜DSML｜function_calls>";
    pub const INVOKE: &str = "<｜DSML｜invoke name=";
    pub const INVOKE_END: &str = "</｜DSML｜invoke>";
    pub const PARAMETER: &str = "<｜DSML｜parameter name=";
    pub const PARAMETER_END: &str = "</｜DSML｜parameter>";
}

/// How one tagged syntax spells a call, as the grammar writes it.
struct Tags {
    /// After the function's name.
    after_name: &'static str,
    /// Before an argument's name.
    key_open: &'static str,
    /// Between an argument's name and its value.
    key_close: &'static str,
    /// Between the name and a value that is not a string, where the
    /// syntax marks the difference (DSML's `string="false"`).
    key_close_json: Option<&'static str>,
    /// After a value.
    value_close: &'static str,
    /// An argument name where the schema names none (Lark regex).
    key_pattern: &'static str,
    /// After the last argument.
    call_end: &'static str,
}

const GLM_TAGS: Tags = Tags {
    after_name: "\n",
    key_open: glm::KEY,
    key_close: "</arg_key>\n<arg_value>",
    key_close_json: None,
    value_close: "</arg_value>\n",
    key_pattern: "/[^<]+/",
    call_end: "</tool_call>",
};

const QWEN_XML_TAGS: Tags = Tags {
    after_name: ">\n",
    key_open: qwen_xml::PARAMETER,
    key_close: ">\n",
    key_close_json: None,
    value_close: "\n</parameter>\n",
    key_pattern: "/[^>\\n]+/",
    call_end: "</function>\n</tool_call>",
};

const MINIMAX_TAGS: Tags = Tags {
    after_name: "\">\n",
    key_open: "<parameter name=\"",
    key_close: "\">",
    key_close_json: None,
    value_close: "</parameter>\n",
    key_pattern: "/[^\"\\n]+/",
    call_end: "</invoke>\n</minimax:tool_call>",
};

const DSML_TAGS: Tags = Tags {
    after_name: "\">\n",
    key_open: "<｜DSML｜parameter name=\"",
    key_close: "\" string=\"true\">",
    key_close_json: Some("\" string=\"false\">"),
    value_close: "</｜DSML｜parameter>\n",
    key_pattern: "/[^\"\\n]+/",
    call_end: "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
};

/// An argument's value as written bare (see the module's rule).
fn bare_value(tool: &str, key: &str, text: &str, strings: &[(String, String)]) -> Value {
    if strings.iter().any(|(t, k)| t == tool && k == key) {
        return Value::String(text.to_string());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => v,
        Err(_) => match text.trim() {
            "True" => Value::Bool(true),
            "False" => Value::Bool(false),
            _ => Value::String(text.to_string()),
        },
    }
}

/// A function name: non-empty, no blanks.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(format!("no single function name before the arguments ({name:?})"));
    }
    Ok(())
}

/// The arguments after a call's name, each opening with `open`: `read`
/// takes the text after that tag and gives the argument's name (trimmed),
/// its value and the text after the argument. Blank space between
/// arguments is allowed; a name given twice is an error.
fn read_arguments<'t>(
    mut rest: &'t str,
    open: &str,
    read: impl Fn(&'t str) -> Result<(&'t str, Value, &'t str), String>,
) -> Result<Map<String, Value>, String> {
    let mut arguments = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Ok(arguments);
        }
        let after = rest
            .strip_prefix(open)
            .ok_or_else(|| format!("text where {open} should be: {rest:?}"))?;
        let (key, value, after) = read(after)?;
        if arguments.insert(key.to_string(), value).is_some() {
            return Err(format!("the argument {key:?} is given twice"));
        }
        rest = after;
    }
}

/// GLM: `NAME` + `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs,
/// blank space between the parts allowed (GLM-4.5 writes newlines, 4.7
/// none).
pub fn parse_glm_block(inner: &str, strings: &[(String, String)]) -> Result<ToolCall, String> {
    use glm::{KEY, KEY_END, VALUE, VALUE_END};
    let (name, rest) = match inner.find(KEY) {
        Some(i) => (inner[..i].trim(), &inner[i..]),
        None => (inner.trim(), ""),
    };
    check_name(name)?;
    let arguments = read_arguments(rest, KEY, |after| {
        let (key, after) = after.split_once(KEY_END).ok_or_else(|| format!("an unclosed {KEY}"))?;
        let key = key.trim();
        let after = after
            .trim_start()
            .strip_prefix(VALUE)
            .ok_or_else(|| format!("{key:?} has no {VALUE}"))?;
        let (value, after) = after
            .split_once(VALUE_END)
            .ok_or_else(|| format!("an unclosed {VALUE}"))?;
        Ok((key, bare_value(name, key, value, strings), after))
    })?;
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// Qwen3.5 / Qwen3-Coder: `<function=NAME>` + `<parameter=K>\nV\n</parameter>`
/// per argument + `</function>` (one newline each side of a value belongs
/// to the tags; a `</function>` cut off at the end of an answer is allowed).
pub fn parse_qwen_xml_block(inner: &str, strings: &[(String, String)]) -> Result<ToolCall, String> {
    use qwen_xml::{FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END};
    let rest = inner
        .trim()
        .strip_prefix(FUNCTION)
        .ok_or_else(|| format!("no {FUNCTION}NAME> opening the call"))?;
    let (name, rest) = rest.split_once('>').ok_or_else(|| format!("an unclosed {FUNCTION}"))?;
    let name = name.trim();
    check_name(name)?;
    let rest = rest.trim_end();
    let rest = rest.strip_suffix(FUNCTION_END).unwrap_or(rest);
    let arguments = read_arguments(rest, PARAMETER, |after| {
        let (key, after) = after
            .split_once('>')
            .ok_or_else(|| format!("an unclosed {PARAMETER}"))?;
        let key = key.trim();
        let (value, after) = after
            .split_once(PARAMETER_END)
            .ok_or_else(|| format!("{key:?} has no {PARAMETER_END}"))?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        Ok((key, bare_value(name, key, value, strings), after))
    })?;
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// MiniMax-M2, the text after `<invoke name=`: `"NAME">` + per argument
/// `<parameter name="K">V</parameter>`, blank space between the parts
/// allowed.
pub fn parse_minimax_block(inner: &str, strings: &[(String, String)]) -> Result<ToolCall, String> {
    use minimax::{PARAMETER, PARAMETER_END};
    let (name, rest) = quoted_head(inner).ok_or_else(|| "no \"NAME\"> after <invoke name=".to_string())?;
    check_name(name)?;
    let arguments = read_arguments(rest, PARAMETER, |after| {
        let (key, after) = quoted_head(after).ok_or_else(|| format!("an unclosed {PARAMETER}"))?;
        let key = key.trim();
        let (value, after) = after
            .split_once(PARAMETER_END)
            .ok_or_else(|| format!("{key:?} has no {PARAMETER_END}"))?;
        Ok((key, bare_value(name, key, value, strings), after))
    })?;
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// `"NAME">REST` (blank space around allowed) → (`NAME`, `REST`).
fn quoted_head(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start().strip_prefix('"')?;
    let (name, rest) = s.split_once('"')?;
    let rest = rest.trim_start().strip_prefix('>')?;
    Some((name, rest))
}

/// DeepSeek-V3.2, the text after `<｜DSML｜invoke name=`: `"NAME">` + per
/// argument `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`
/// (`string="false"`: V is JSON; without the attribute, the module's rule).
pub fn parse_dsml_block(inner: &str, strings: &[(String, String)]) -> Result<ToolCall, String> {
    use dsml::{PARAMETER, PARAMETER_END};
    let (name, rest) = quoted_head(inner).ok_or_else(|| "no \"NAME\"> after <｜DSML｜invoke name=".to_string())?;
    check_name(name)?;
    let arguments = read_arguments(rest, PARAMETER, |after| {
        let after = after
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("an unquoted name after {PARAMETER}"))?;
        let (key, after) = after
            .split_once('"')
            .ok_or_else(|| format!("an unclosed {PARAMETER}"))?;
        let key = key.trim();
        let (attrs, after) = after
            .split_once('>')
            .ok_or_else(|| format!("an unclosed {PARAMETER}"))?;
        let (value, after) = after
            .split_once(PARAMETER_END)
            .ok_or_else(|| format!("{key:?} has no {PARAMETER_END}"))?;
        let attrs: String = attrs.chars().filter(|c| !c.is_whitespace()).collect();
        let v = match attrs.as_str() {
            "string=\"true\"" => Value::String(value.to_string()),
            "string=\"false\"" => serde_json::from_str(value)
                .map_err(|e| format!("{key:?} is marked string=\"false\" but is no JSON ({e})"))?,
            "" => bare_value(name, key, value, strings),
            other => return Err(format!("{key:?} has attributes {other:?}")),
        };
        Ok((key, v, after))
    })?;
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// DeepSeek-V3.2's forced call after its prefill ([`tagged_grammar`]).
pub fn dsml_grammar(tools: &[ToolDef], name: Option<&str>) -> GrammarSpec {
    tagged_grammar(&DSML_TAGS, tools, name)
}

/// MiniMax-M2's forced call after its prefill ([`tagged_grammar`]).
pub fn minimax_grammar(tools: &[ToolDef], name: Option<&str>) -> GrammarSpec {
    tagged_grammar(&MINIMAX_TAGS, tools, name)
}

/// GLM's forced call after its prefill ([`tagged_grammar`]).
pub fn glm_grammar(tools: &[ToolDef], name: Option<&str>) -> GrammarSpec {
    tagged_grammar(&GLM_TAGS, tools, name)
}

/// Qwen3.5's forced call after its prefill ([`tagged_grammar`]).
pub fn qwen_xml_grammar(tools: &[ToolDef], name: Option<&str>) -> GrammarSpec {
    tagged_grammar(&QWEN_XML_TAGS, tools, name)
}

/// A forced call after its prefill: the name (when any tool may be
/// called), then the schema's properties as tagged key / value pairs in
/// their order (required ones always, the others optionally): string
/// values bare (an enum's values, or text without `<`, up to `maxLength`),
/// others as JSON for their schema; then the call's end. A tool without
/// declared properties takes any keys with bare values.
fn tagged_grammar(tags: &Tags, tools: &[ToolDef], name: Option<&str>) -> GrammarSpec {
    let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut rules = Vec::new();
    let body = |i: usize, t: &ToolDef, rules: &mut Vec<String>| -> String {
        let schema = t.parameters.clone().unwrap_or_else(|| json!({"type": "object"}));
        let props = schema.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(props) = props.filter(|p| !p.is_empty()) else {
            return format!(
                "({} {} {} /[^<]*/ {})*",
                lit(tags.key_open),
                tags.key_pattern,
                lit(tags.key_close),
                lit(tags.value_close)
            );
        };
        let mut parts = Vec::new();
        for (j, (key, ps)) in props.iter().enumerate() {
            let (value, is_string) = match (
                ps.get("enum").and_then(Value::as_array),
                ps.get("type").and_then(Value::as_str),
            ) {
                (Some(e), _) if e.iter().all(Value::is_string) => (
                    e.iter()
                        .map(|v| lit(v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(" | "),
                    true,
                ),
                (_, Some("string")) => match ps.get("maxLength").and_then(Value::as_u64) {
                    Some(n) => (format!("/[^<]{{0,{n}}}/"), true),
                    None => ("/[^<]*/".to_string(), true),
                },
                _ => (format!("%json {}", json_layout(ps.clone())), false),
            };
            let close = match tags.key_close_json {
                Some(json_close) if !is_string => json_close,
                _ => tags.key_close,
            };
            let rule = format!("t{i}p{j}");
            rules.push(format!(
                "{rule}: {} ({value}) {}",
                lit(&format!("{}{key}{close}", tags.key_open)),
                lit(tags.value_close)
            ));
            parts.push(if required.contains(&key.as_str()) {
                rule
            } else {
                format!("{rule}?")
            });
        }
        parts.join(" ")
    };
    let start = match name {
        Some(n) => {
            let i = tools.iter().position(|t| t.name == n);
            let b = i.map_or_else(String::new, |i| body(i, &tools[i], &mut rules));
            format!("start: {b} {}", lit(tags.call_end))
        }
        None => {
            let alts: Vec<String> = tools
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    format!(
                        "({} {} {})",
                        lit(&format!("{}{}", t.name, tags.after_name)),
                        body(i, t, &mut rules),
                        lit(tags.call_end)
                    )
                })
                .collect();
            format!("start: {}", alts.join(" | "))
        }
    };
    let mut g = start;
    for r in rules {
        g.push('\n');
        g.push_str(&r);
    }
    g.push('\n');
    GrammarSpec::Lark(g)
}
