//! Structured output: the request fields that constrain an answer, as each
//! API spells them, turned into a [`GrammarSpec`] (enforced by
//! [`crate::grammar`] on the engine thread).
//!
//! - OpenAI chat: `response_format` `{"type": "text"}`, `{"type":
//!   "json_object"}`, `{"type": "json_schema", "json_schema": {"name",
//!   "schema", "strict"}}`.
//! - OpenAI Responses: `text.format` `{"type": "json_schema", "name",
//!   "schema", "strict"}` (flat), `json_object`, `text`.
//! - Anthropic: `output_config.format` `{"type": "json_schema", "schema"}`
//!   (and the beta's top-level `output_format`).
//! - Every route (an extension, as llama.cpp's server has one): `grammar`,
//!   a Lark grammar in llguidance's dialect as a string, or `{"type":
//!   "lark" | "regex" | "json_schema", "definition" | "schema"}`. GBNF is
//!   not read (its rules are written `name ::= …`; Lark writes `name: …`).
//!
//! A schema is always enforced, `strict` or not: an answer that may not
//! parse is worth nothing to a program.

use serde_json::Value;

use super::error::ApiError;
use crate::grammar::GrammarSpec;

/// `response_format` of OpenAI chat completions.
pub fn response_format(v: Option<Value>) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "response_format";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |m: &str| ApiError::invalid_param(P, m.to_string());
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let Some(js) = v.get("json_schema").filter(|j| j.is_object()) else {
                return Err(bad("response_format of type json_schema needs a json_schema object"));
            };
            schema_of(js, P).map(Some)
        }
        Some(other) => Err(ApiError::invalid_param(
            P,
            format!("response_format type {other:?} is not supported (text, json_object, json_schema)"),
        )),
        None => Err(bad("response_format needs a type")),
    }
}

/// `text.format` of the Responses API (the schema's fields sit beside
/// `type`).
pub fn text_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "text.format";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => schema_of(v, P).map(Some),
        Some(other) => Err(ApiError::invalid_param(
            P,
            format!("text.format type {other:?} is not supported (text, json_object, json_schema)"),
        )),
        None => Err(ApiError::invalid_param(P, "text.format needs a type")),
    }
}

/// Anthropic's `output_config.format` (`P`: the field's name as sent; the
/// beta's top-level `output_format` too).
pub fn output_format(v: Option<Value>, p: &'static str) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("json_schema") => schema_of(&v, p).map(Some),
        Some(other) => Err(ApiError::invalid_param(
            p,
            format!("{p} type {other:?} is not supported (json_schema)"),
        )),
        None => Err(ApiError::invalid_param(p, format!("{p} needs a type"))),
    }
}

/// The `grammar` extension.
pub fn grammar(v: Option<Value>) -> Result<Option<GrammarSpec>, ApiError> {
    const P: &str = "grammar";
    let text = |s: String| -> Result<GrammarSpec, ApiError> {
        if s.contains("::=") {
            return Err(ApiError::invalid_param(
                P,
                "the grammar looks like GBNF (`name ::= ...`); charm reads Lark grammars in llguidance's \
                 dialect (`name: ...`, top rule `start`)",
            ));
        }
        Ok(GrammarSpec::Lark(s))
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => text(s).map(Some),
        Some(Value::Object(mut m)) => {
            let def = |m: &mut serde_json::Map<String, Value>| match m.remove("definition") {
                Some(Value::String(s)) => Ok(s),
                _ => Err(ApiError::invalid_param(P, "grammar.definition must be a string")),
            };
            match m.get("type").and_then(Value::as_str) {
                Some("lark") => text(def(&mut m)?).map(Some),
                Some("regex") => Ok(Some(GrammarSpec::Regex(def(&mut m)?))),
                Some("json_schema") => schema_of(&Value::Object(m), P).map(Some),
                _ => Err(ApiError::invalid_param(
                    P,
                    "grammar.type must be lark, regex or json_schema",
                )),
            }
        }
        Some(_) => Err(ApiError::invalid_param(
            P,
            "grammar must be a Lark grammar (a string) or an object with a type",
        )),
    }
}

/// The first of the request's constraints: a forced tool call's grammar
/// wins (its answer is a call, not text), then an explicit `grammar`, then
/// the API's format field. Several explicit ones at once are refused.
pub fn pick(
    forced_call: Option<GrammarSpec>,
    grammar: Option<GrammarSpec>,
    format: Option<(GrammarSpec, &'static str)>,
) -> Result<Option<(GrammarSpec, &'static str)>, ApiError> {
    if let (Some(_), Some((_, param))) = (&grammar, &format) {
        return Err(ApiError::invalid_param(
            "grammar",
            format!("grammar and {param} cannot both be given"),
        ));
    }
    Ok(forced_call
        .map(|g| (g, "tools"))
        .or(grammar.map(|g| (g, "grammar")))
        .or(format))
}

fn schema_of(v: &Value, param: &'static str) -> Result<GrammarSpec, ApiError> {
    match v.get("schema") {
        Some(s @ (Value::Object(_) | Value::Bool(_))) => Ok(GrammarSpec::JsonSchema(s.clone())),
        None | Some(Value::Null) => Ok(GrammarSpec::JsonObject),
        Some(_) => Err(ApiError::invalid_param(
            param,
            format!("{param}: schema must be a JSON schema object"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_response_formats() {
        assert_eq!(response_format(None).unwrap(), None);
        assert_eq!(response_format(Some(json!({"type": "text"}))).unwrap(), None);
        assert_eq!(
            response_format(Some(json!({"type": "json_object"}))).unwrap(),
            Some(GrammarSpec::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let f = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        assert_eq!(response_format(Some(f)).unwrap(), Some(GrammarSpec::JsonSchema(schema)));
        assert!(response_format(Some(json!({"type": "json_schema"}))).is_err());
        assert!(response_format(Some(json!({"type": "xml"}))).is_err());
        assert!(response_format(Some(json!({"type": "json_schema", "json_schema": {"schema": 3}}))).is_err());
    }

    #[test]
    fn responses_and_anthropic_formats() {
        let schema = json!({"type": "object"});
        let f = json!({"type": "json_schema", "name": "x", "schema": schema});
        assert_eq!(
            text_format(Some(&f)).unwrap(),
            Some(GrammarSpec::JsonSchema(schema.clone()))
        );
        let a = json!({"type": "json_schema", "schema": schema});
        assert_eq!(
            output_format(Some(a), "output_config.format").unwrap(),
            Some(GrammarSpec::JsonSchema(schema))
        );
        assert!(output_format(Some(json!({"type": "text"})), "output_format").is_err());
    }

    #[test]
    fn grammar_field() {
        assert_eq!(
            grammar(Some(json!("start: \"a\""))).unwrap(),
            Some(GrammarSpec::Lark("start: \"a\"".into()))
        );
        assert_eq!(
            grammar(Some(json!({"type": "regex", "definition": "[0-9]+"}))).unwrap(),
            Some(GrammarSpec::Regex("[0-9]+".into()))
        );
        let e = grammar(Some(json!("root ::= \"a\""))).unwrap_err();
        assert!(e.to_string().contains("GBNF"), "{e}");
        assert!(grammar(Some(json!(7))).is_err());
        assert!(grammar(Some(json!({"type": "ebnf", "definition": "x"}))).is_err());
    }

    #[test]
    fn a_forced_call_wins_and_two_explicit_constraints_are_refused() {
        let call = GrammarSpec::Lark("start: \"}\"".into());
        let got = pick(
            Some(call.clone()),
            None,
            Some((GrammarSpec::JsonObject, "response_format")),
        )
        .unwrap();
        assert_eq!(got, Some((call, "tools")));
        assert!(pick(
            None,
            Some(GrammarSpec::JsonObject),
            Some((GrammarSpec::JsonObject, "response_format"))
        )
        .is_err());
        assert_eq!(pick(None, None, None).unwrap(), None);
    }
}
