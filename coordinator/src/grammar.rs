//! Constrained decoding: a grammar masks the logits before each sample.
//!
//! The grammars are [llguidance]'s (JSON schemas, its Lark dialect, regular
//! expressions): it is the engine behind OpenAI-style structured output in
//! several servers, computes a 151k-vocabulary mask in tens of microseconds
//! from a token trie, and is MIT, pure Rust and well kept. charm builds the
//! trie once per model from the tokenizer it already has ([`Grammars`]);
//! each request gets its own [`Constraint`], which lives in the request's
//! sequence on the engine thread.
//!
//! A constrained step is: [`Constraint::mask`] sets every token the grammar
//! does not allow to `-inf` (the sampler never picks one, greedy or not),
//! the sampler picks, [`Constraint::accept`] advances the grammar. When the
//! grammar is complete only the model's end-of-sequence tokens stay
//! allowed, so the answer ends there; a grammar that can go on forever
//! (an unbounded string) ends at `max_tokens` like any answer.
//!
//! JSON is compiled with fixed separators (`", "`, `": "`) and no free
//! whitespace: the shape Python's `json.dumps` writes, which models are
//! trained on, and a random-weight model cannot loop on blank space.
//!
//! [llguidance]: https://github.com/guidance-ai/llguidance

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use thiserror::Error;

use crate::text::TextCodec;

/// Constrained decoding errors.
#[derive(Debug, Error)]
pub enum GrammarError {
    /// The tokenizer could not be turned into a token trie.
    #[error("constrained decoding is not available for this tokenizer: {0}")]
    Tokenizer(String),
    /// The request's grammar or schema does not compile.
    #[error("{0}")]
    Compile(String),
    /// The grammar reached a state it cannot leave (an internal error of the
    /// grammar engine: a masked sample cannot do this).
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}

/// What a request constrains its answer to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid for this JSON schema.
    JsonSchema(Value),
    /// llguidance's Lark dialect (`start` is the top rule).
    Lark(String),
    /// A regular expression the whole answer must match.
    Regex(String),
    /// `outer`, a Lark grammar in which `@answer` stands for `inner` (a
    /// chat format's frame around the request's own grammar: harmony's
    /// channels, [`crate::server::harmony::final_answer`]).
    Framed { outer: String, inner: Box<GrammarSpec> },
}

/// Longest grammar or schema accepted, in bytes of its text.
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

impl GrammarSpec {
    /// The llguidance grammar, with charm's JSON layout.
    fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        let size = self.size();
        if size > MAX_GRAMMAR_BYTES {
            return Err(GrammarError::Compile(format!(
                "the grammar is {size} bytes; at most {MAX_GRAMMAR_BYTES} are accepted"
            )));
        }
        Ok(match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(json_layout(json!({"type": "object"}))),
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Compile("the JSON schema must be an object".into()));
                }
                TopLevelGrammar::from_json_schema(json_layout(schema.clone()))
            }
            GrammarSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Framed { outer, inner } => {
                let mut top = TopLevelGrammar::from_lark(outer.clone());
                let mut inner = inner.top_level()?;
                match inner.grammars.first_mut() {
                    Some(g) => g.name = Some("answer".into()),
                    None => return Err(GrammarError::Compile("the framed grammar is empty".into())),
                }
                top.grammars.extend(inner.grammars);
                top
            }
        })
    }

    /// The bytes of the grammar's text (a JSON object's: none).
    fn size(&self) -> usize {
        match self {
            GrammarSpec::JsonObject => 0,
            GrammarSpec::JsonSchema(v) => v.to_string().len(),
            GrammarSpec::Lark(s) | GrammarSpec::Regex(s) => s.len(),
            GrammarSpec::Framed { outer, inner } => outer.len() + inner.size(),
        }
    }
}

/// A schema with charm's JSON layout (fixed separators, no free whitespace)
/// unless the schema sets its own `x-guidance` options.
pub fn json_layout(schema: Value) -> Value {
    match schema {
        Value::Object(mut m) => {
            m.entry("x-guidance").or_insert_with(
                || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
            );
            Value::Object(m)
        }
        // `true` / `false`: any value / none.
        other => other,
    }
}

/// A model's grammar compiler: the token trie of its vocabulary, built once.
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    /// The trie of `codec`'s vocabulary, padded to the model's `vocab_size`
    /// rows (ids past the tokenizer's are never allowed), with `eos` as the
    /// tokens that end a complete answer.
    pub fn new(codec: &TextCodec, vocab_size: usize, eos: &[u32]) -> Result<Self, GrammarError> {
        let bad = |e: String| GrammarError::Tokenizer(e);
        let json: Value = serde_json::from_str(&codec.tokenizer_json().map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| bad(e.to_string()))?;
        if words.len() > vocab_size {
            return Err(bad(format!(
                "the tokenizer has {} tokens, more than the model's {vocab_size} logits",
                words.len()
            )));
        }
        words.resize(vocab_size, Vec::new());
        let Some(&first_eos) = eos.first() else {
            return Err(bad("the model names no end-of-sequence token".into()));
        };
        if let Some(&e) = eos.iter().find(|&&e| e as usize >= vocab_size) {
            return Err(bad(format!("end-of-sequence id {e} is past the vocabulary")));
        }
        let trie = TokTrie::from(&TokRxInfo::new(vocab_size as u32, first_eos), &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| bad(e.to_string()))?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// A fresh constraint for one answer; a grammar that does not compile
    /// is an error that says why.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(spec.top_level()?)
            .map_err(|e| GrammarError::Compile(format!("the grammar does not compile: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(format!("the grammar does not compile: {e}")));
        }
        Ok(Constraint { matcher })
    }
}

/// One answer's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").finish_non_exhaustive()
    }
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to `-inf`.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Matcher(e.to_string()))?;
        // 32 tokens a word: bit i of word w allows token 32·w + i.
        let words = allowed.as_slice();
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            any |= bits != 0;
            if bits == u32::MAX {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if bits >> i & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if any {
            Ok(())
        } else {
            Err(GrammarError::Matcher("the grammar allows no token here".into()))
        }
    }

    /// Advances the grammar past a sampled token.
    pub fn accept(&mut self, id: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(id)
            .map_err(|e| GrammarError::Matcher(e.to_string()))
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_layout_keeps_a_schemas_own_options() {
        let s = json_layout(json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["whitespace_flexible"], json!(false));
        let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(json_layout(own.clone()), own);
        assert_eq!(json_layout(json!(true)), json!(true));
    }

    #[test]
    fn oversized_grammars_are_refused() {
        let big = GrammarSpec::Lark(format!("start: \"{}\"", "a".repeat(MAX_GRAMMAR_BYTES)));
        assert!(matches!(big.top_level(), Err(GrammarError::Compile(m)) if m.contains("at most")));
        assert!(GrammarSpec::JsonSchema(json!("string")).top_level().is_err());
    }
}
