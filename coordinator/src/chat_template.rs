//! Chat templates: the Jinja template a model ships in
//! `tokenizer_config.json` (`chat_template`) or `chat_template.jinja`,
//! rendered with minijinja the way transformers renders it
//! (`trim_blocks`, `lstrip_blocks`, loop controls, Python string methods,
//! `raise_exception`, a `tojson` that matches `json.dumps`, `strftime_now`,
//! lists in a `namespace` that change in place, `tools` / `documents` none
//! when a request has none, Jinja2's `iterable` and `length` on none and
//! undefined, `{% generation %}` blocks).
//!
//! A message's reasoning reaches the template as both `reasoning_content`
//! (Qwen3's, GLM's) and `thinking` (gpt-oss's harmony template), as
//! transformers hands it over.

mod namespace_list;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

/// One chat message, in the shape transformers' `apply_chat_template`
/// hands templates: `role`, `content`, and for tool use `tool_calls` (an
/// assistant's calls, `[{id, type: "function", function: {name,
/// arguments}}]` with `arguments` an object) or `tool_call_id` (a `tool`
/// message answering a call). Absent fields are absent in the template too
/// (undefined, not `none`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning (Qwen3's and GLM's templates read it
    /// as `reasoning_content`, gpt-oss's as `thinking`; both are set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        }
    }

    /// An assistant message with tool calls (`content` may be empty).
    pub fn assistant_calls(content: &str, calls: Vec<serde_json::Value>) -> Self {
        Message {
            tool_calls: Some(calls),
            ..Message::new("assistant", content)
        }
    }

    /// A `tool` message: the result of the call `tool_call_id`.
    pub fn tool_result(tool_call_id: &str, content: &str) -> Self {
        Message {
            tool_call_id: Some(tool_call_id.into()),
            ..Message::new("tool", content)
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Whether a tool-call-only assistant turn reaches the template as
    /// `content: none` (see [`ChatTemplate::render`]).
    null_content: bool,
}

/// Rendering failed (template syntax, or the template raised an exception).
#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are the strings the
    /// template may refer to.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        // Lists in a namespace take append / pop as in Python (Kimi K2's
        // templates queue call ids so).
        env.add_function("namespace", namespace_list::namespace);
        // def strftime_now(format): return datetime.now().strftime(format)
        // (charm's clock is UTC; a render's `strftime_now` variable wins).
        env.add_function("strftime_now", |format: String| -> Result<Value, Error> {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            strftime(now, &format).map(Value::from)
        });
        // Undefined has length 0 in Jinja2 (`tools|length` where no tools).
        env.add_filter("length", |v: Value| -> Result<Value, Error> {
            if v.is_undefined() {
                Ok(Value::from(0))
            } else {
                minijinja::filters::length(&v).map(Value::from)
            }
        });
        // None is no iterable in Python (minijinja iterates it as empty):
        // `tools is iterable and tools|length > 0` with tools = none.
        env.add_test("iterable", |v: Value| !v.is_none() && minijinja::tests::is_iterable(&v));
        env.add_template_owned("chat".to_string(), generation_blocks_as_ifs(source))
            .map_err(|e| TemplateError(e.to_string()))?;
        let mut t = ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            null_content: false,
        };
        t.null_content = t.takes_null_content();
        Ok(t)
    }

    /// Probes whether this template renders an assistant turn that only
    /// calls tools with `content: none` (as OpenAI clients send it, and as
    /// DeepSeek's template tests with `message['content'] is none`): it must
    /// render without error and without printing the none. Templates that
    /// run string tests on the content (Qwen3's `'</think>' in
    /// message.content`) fail on none, and get `""` instead.
    fn takes_null_content(&self) -> bool {
        // Arguments as JSON text: templates that paste them into their
        // own call syntax (DeepSeek's) take text; the others take either.
        let call = serde_json::json!({"id": "call_0", "type": "function",
            "function": {"name": "probe", "arguments": "{}"}});
        let msgs = [
            Message::new("user", "probe"),
            Message::assistant_calls("", vec![call]),
            Message::tool_result("call_0", "probe"),
        ];
        let with = |null: bool| self.render_as(&msgs, false, &[], null);
        match (with(true), with(false)) {
            (Ok(a), Ok(b)) => {
                let nones = |s: &str| s.matches("none").count() + s.matches("None").count();
                nones(&a) <= nones(&b)
            }
            (Ok(a), Err(_)) => !a.contains("none") && !a.contains("None"),
            _ => false,
        }
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (with the assistant prompt appended when
    /// `add_generation_prompt`). `extra` carries template switches such as
    /// `enable_thinking`. An assistant turn that only calls tools reaches
    /// the template as `content: none` when the template handles none, else
    /// as `""` (the probe at [`ChatTemplate::new`]).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &[(&str, Value)],
    ) -> Result<String, TemplateError> {
        self.render_as(messages, add_generation_prompt, extra, self.null_content)
    }

    fn render_as(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &[(&str, Value)],
        null_content: bool,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError(e.to_string()))?;
        let mut ctx: Vec<(&str, Value)> = vec![
            (
                "messages",
                Value::from_serialize(template_messages(messages, null_content)),
            ),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            // transformers passes both, None where a request has none.
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("bos_token", Value::from(self.bos_token.clone())),
            ("eos_token", Value::from(self.eos_token.clone())),
        ];
        ctx.extend(extra.iter().cloned());
        let ctx: Value = ctx.into_iter().collect::<std::collections::BTreeMap<_, _>>().into();
        tmpl.render(ctx).map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            TemplateError(msg)
        })
    }
}

/// `source` with transformers' `{% generation %}` … `{% endgeneration %}`
/// (which marks the assistant's tokens and renders its body as it is) as
/// `{% if true %}` … `{% endif %}`, whitespace control kept: minijinja has
/// no such tag.
fn generation_blocks_as_ifs(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        let Some(len) = rest[at..].find("%}") else { break };
        let tag = &rest[at..at + len + 2];
        let inner = &tag[2..tag.len() - 2];
        let (open_dash, inner) = inner.strip_prefix('-').map_or(("", inner), |i| ("-", i));
        let (close_dash, inner) = inner.strip_suffix('-').map_or(("", inner), |i| ("-", i));
        out.push_str(&rest[..at]);
        match inner.trim() {
            "generation" => out.push_str(&format!("{{%{open_dash} if true {close_dash}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open_dash} endif {close_dash}%}}")),
            _ => out.push_str(tag),
        }
        rest = &rest[at + len + 2..];
    }
    out.push_str(rest);
    out
}

/// `messages` as a template sees them: with `null_content`, an assistant
/// turn that only calls tools has `content: none`, as OpenAI clients send it
/// and transformers passes it on; reasoning is under both of its names.
fn template_messages(messages: &[Message], null_content: bool) -> Vec<serde_json::Value> {
    messages
        .iter()
        .map(|m| {
            let mut v = serde_json::to_value(m).unwrap_or_default();
            if null_content && m.tool_calls.is_some() && m.content.is_empty() {
                v["content"] = serde_json::Value::Null;
            }
            // message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            if let (Some(r), serde_json::Value::Object(fields)) = (&m.reasoning_content, &mut v) {
                fields.shift_insert(0, "thinking".into(), serde_json::Value::String(r.clone()));
            }
            v
        })
        .collect()
}

/// A `strftime_now` for a render's variables that formats the instant
/// `unix_secs` (UTC) instead of the current time: renders that must not
/// depend on the day (tests, reference fixtures).
pub fn strftime_at(unix_secs: i64) -> Value {
    Value::from_function(move |format: String| -> Result<Value, Error> {
        strftime(unix_secs, &format).map(Value::from)
    })
}

/// Python's `datetime.strftime(format)` for the UTC instant `unix_secs`,
/// with the directives chat templates use (`%Y %y %m %d %e %j %H %I %M %S
/// %p %A %a %B %b %%`, C locale); any other is an error.
fn strftime(unix_secs: i64, format: &str) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "strftime_now: a format ends in %",
            ));
        };
        match d {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:>2}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'A' => out.push_str(DAYS[weekday]),
            'a' => out.push_str(&DAYS[weekday][..3]),
            'B' => out.push_str(MONTHS[month as usize - 1]),
            'b' => out.push_str(&MONTHS[month as usize - 1][..3]),
            '%' => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: the directive %{other} is not supported"),
                ))
            }
        }
    }
    Ok(out)
}

/// (year, month 1..=12, day 1..=31) of the day `days` after 1970-01-01
/// (proleptic Gregorian; Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days from 1970-01-01 to (year, month, day) (the inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `tojson` as transformers defines it: `json.dumps(x,
/// ensure_ascii=ensure_ascii, indent=indent, separators=separators,
/// sort_keys=sort_keys)`, `ensure_ascii` false unless asked (MiniMax-M2's
/// template asks `tojson(ensure_ascii=False)`).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let bad = |m: String| Error::new(ErrorKind::InvalidOperation, m);
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let style = JsonStyle {
        indent,
        sort: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        separators: match separators {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => {
                let parts: Vec<String> = v
                    .try_iter()
                    .map_err(|_| bad("tojson: separators must be a pair of strings".into()))?
                    .map(|p| p.as_str().map(str::to_string))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("tojson: separators must be a pair of strings".into()))?;
                match <[String; 2]>::try_from(parts) {
                    Ok([item, key]) => Some((item, key)),
                    Err(_) => return Err(bad("tojson: separators must be a pair of strings".into())),
                }
            }
        },
    };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value).map_err(|e| bad(e.to_string()))?;
    let mut out = String::new();
    write_py_json(&json, &style, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// The `json.dumps` options chat templates use.
#[derive(Default)]
struct JsonStyle {
    indent: Option<usize>,
    sort: bool,
    /// `ensure_ascii`: non-ASCII characters as `\uXXXX`.
    ascii: bool,
    /// (item, key) separators; `None`: Python's defaults.
    separators: Option<(String, String)>,
}

/// `json.dumps(v, ensure_ascii=False)`: `", "` and `": "` separators, the
/// layout chat templates write JSON in.
pub fn py_json(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_py_json(v, &JsonStyle::default(), 0, &mut out);
    out
}

fn write_py_json(v: &serde_json::Value, style: &JsonStyle, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let (item_sep, key_sep) = match &style.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if style.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    match v {
        J::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_py_json(x, style, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(m) if !m.is_empty() => {
            out.push('{');
            let mut keys: Vec<&String> = m.keys().collect();
            if style.sort {
                keys.sort();
            }
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                push_json_string(k, style.ascii, out);
                out.push_str(key_sep);
                write_py_json(&m[k], style, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        J::String(s) => push_json_string(s, style.ascii, out),
        other => out.push_str(&serde_json::to_string(other).unwrap_or_default()),
    }
}

/// A JSON string as `json.dumps` writes it; with `ascii`, every non-ASCII
/// character as `\uXXXX` (UTF-16 units, lowercase hex).
fn push_json_string(s: &str, ascii: bool, out: &mut String) {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    if !ascii || quoted.is_ascii() {
        out.push_str(&quoted);
        return;
    }
    for c in quoted.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_with_generation_prompt_and_python_methods() {
        let src = "{% for m in messages %}<{{ m.role }}>{{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t.render(&[Message::new("user", "  hi  ")], true, &[]).unwrap();
        assert_eq!(out, "<user>hi\n<assistant>");
    }

    /// As transformers renders: `tools` and `documents` are none where a
    /// request has none, none is not iterable, undefined has length 0, and
    /// `{% generation %}`
    /// blocks render their body (LFM2.5's, Laguna's templates).
    #[test]
    fn renders_as_transformers_where_minijinja_differs() {
        let src = "{%- if tools is not none and tools|length > 0 %}[{{ tools|length }} tools]{% endif -%}\
                   {%- if tools is iterable and tools|length > 0 %}[iterable]{% endif -%}\
                   {%- if documents is none %}[no documents]{% endif -%}[{{ nothing|length }}]\
                   {%- for m in messages %}\n  {%- generation -%}\n  <{{ m.content }}>\n  {%- endgeneration %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msgs = [Message::new("user", "a"), Message::new("assistant", "b")];
        assert_eq!(t.render(&msgs, false, &[]).unwrap(), "[no documents][0]<a><b>");
        let tools = [("tools", Value::from_serialize(vec![serde_json::json!({"name": "f"})]))];
        assert_eq!(
            t.render(&msgs, false, &tools).unwrap(),
            "[1 tools][iterable][no documents][0]<a><b>"
        );
        assert_eq!(
            generation_blocks_as_ifs("{% generation %}x{%-endgeneration-%}{% if a %}{%- generation_x %}"),
            "{% if true %}x{%- endif -%}{% if a %}{%- generation_x %}"
        );
    }

    #[test]
    fn a_turn_that_only_calls_tools_has_no_content() {
        // DeepSeek-V3's test for a tool-call turn.
        let src = "{% for m in messages %}{% if m['content'] is none %}[calls {{ m['tool_calls'] | length }}]{% else %}[{{ m['content'] }}]{% endif %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let call = serde_json::json!({"type": "function", "function": {"name": "f", "arguments": "{}"}});
        let msgs = [
            Message::new("user", "hi"),
            Message::assistant_calls("", vec![call.clone()]),
            Message::assistant_calls("let me look", vec![call]),
        ];
        assert_eq!(t.render(&msgs, false, &[]).unwrap(), "[hi][calls 1][let me look]");
    }

    #[test]
    fn a_template_that_tests_the_content_string_gets_an_empty_one() {
        // Qwen3's assistant branch: `'</think>' in message.content` fails on none.
        let src =
            "{% for m in messages %}{% if '</think>' in m.content %}[think]{% endif %}[{{ m.content }}]{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let call = serde_json::json!({"type": "function", "function": {"name": "f", "arguments": "{}"}});
        let msgs = [Message::new("user", "hi"), Message::assistant_calls("", vec![call])];
        assert_eq!(t.render(&msgs, false, &[]).unwrap(), "[hi][]");
        // A template that prints the content as it is would print the none.
        let t = ChatTemplate::new("{% for m in messages %}[{{ m.content }}]{% endfor %}", "", "").unwrap();
        assert_eq!(t.render(&msgs, false, &[]).unwrap(), "[hi][]");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let e = t.render(&[], false, &[]).unwrap_err();
        assert!(e.to_string().contains("roles must alternate"), "{e}");
    }

    #[test]
    fn strftime_formats_utc_dates_like_python() {
        // datetime(2025, 8, 5, 12, 0, 0).strftime(...)
        let t = 1_754_395_200;
        assert_eq!(strftime(t, "%Y-%m-%d").unwrap(), "2025-08-05");
        assert_eq!(strftime(t, "%d %b %Y").unwrap(), "05 Aug 2025");
        assert_eq!(
            strftime(t, "%A %d %B %Y, %H:%M:%S %p %j %y %%").unwrap(),
            "Tuesday 05 August 2025, 12:00:00 PM 217 25 %"
        );
        assert_eq!(strftime(0, "%Y-%m-%d %a").unwrap(), "1970-01-01 Thu");
        // datetime(2024, 2, 29, 23, 59, 59); datetime(1969, 12, 31)
        assert_eq!(
            strftime(1_709_251_199, "%Y-%m-%d %H:%M:%S %j").unwrap(),
            "2024-02-29 23:59:59 060"
        );
        assert_eq!(strftime(-86_400, "%Y-%m-%d %A").unwrap(), "1969-12-31 Wednesday");
        assert!(strftime(t, "%Q").is_err());
        assert!(strftime(t, "50%").is_err());
        let tm = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
        assert_eq!(
            tm.render(&[], false, &[("strftime_now", strftime_at(t))]).unwrap(),
            "2025"
        );
        assert_eq!(tm.render(&[], false, &[]).unwrap().len(), 4, "the real clock's year");
    }

    #[test]
    fn reasoning_reaches_the_template_as_thinking_too() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.thinking }}|{{ m.reasoning_content }}|{{ 'thinking' in m }};{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let mut a = Message::new("assistant", "Paris.");
        a.reasoning_content = Some("hmm".into());
        let out = t.render(&[Message::new("user", "q"), a], false, &[]).unwrap();
        assert_eq!(out, "||False;hmm|hmm|True;");
    }

    #[test]
    fn tojson_takes_pythons_ensure_ascii_and_separators() {
        // json.dumps({"city": "Zürich", "e": "😀"}, ensure_ascii=True) and
        // json.dumps(..., separators=(",", ":")).
        let t = ChatTemplate::new(
            "{{ x | tojson(ensure_ascii=True) }}|{{ x | tojson(ensure_ascii=False) }}|{{ x | tojson(separators=(',', ':')) }}",
            "",
            "",
        )
        .unwrap();
        let x = Value::from_serialize(serde_json::json!({"city": "Zürich", "e": "😀"}));
        let out = t.render(&[], false, &[("x", x)]).unwrap();
        assert_eq!(
            out,
            "{\"city\": \"Z\\u00fcrich\", \"e\": \"\\ud83d\\ude00\"}|{\"city\": \"Zürich\", \"e\": \"😀\"}|{\"city\":\"Zürich\",\"e\":\"😀\"}"
        );
        let bad = ChatTemplate::new("{{ 1 | tojson(separators=3) }}", "", "").unwrap();
        assert!(bad.render(&[], false, &[]).is_err());
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "").unwrap();
        let x = Value::from_serialize(serde_json::json!({"name": "f", "args": [1, "é<"]}));
        let out = t.render(&[], false, &[("x", x)]).unwrap();
        assert_eq!(
            out,
            "{\"name\": \"f\", \"args\": [1, \"é<\"]}|{\n  \"name\": \"f\",\n  \"args\": [\n    1,\n    \"é<\"\n  ]\n}"
        );
    }
}
