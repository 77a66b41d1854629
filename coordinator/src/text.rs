//! Text in and out: the model's `tokenizer.json` (tokenizers crate), its
//! chat template, and a streaming decoder that emits text only once it is
//! complete UTF-8.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::chat_template::{ChatTemplate, Message, TemplateError};

/// Tokenizer and chat template problems.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The model has no tokenizer (no `tokenizer.json`, or a GGUF file
    /// without `tokenizer.ggml.*` metadata).
    #[error("{}: no tokenizer found; this model has no tokenizer, pass --prompt-ids", path.display())]
    NoTokenizer { path: PathBuf },
    /// The model ships no chat template.
    #[error("{}: no chat_template (nor chat_template.jinja); this model cannot chat", dir.display())]
    NoTemplate { dir: PathBuf },
    /// A tokenizer file is malformed.
    #[error("{}: {reason}", path.display())]
    BadFile { path: PathBuf, reason: String },
    /// Encoding or decoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Rendering the chat template failed.
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// A model's tokenizer and (optional) chat template.
pub struct TextCodec {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    dir: PathBuf,
    /// The model's `bos_token` / `eos_token` text, as templates get them.
    bos_token: String,
    eos_token: String,
}

impl TextCodec {
    /// The text codec of a model path: a GGUF file's metadata, or a
    /// directory's tokenizer files ([`TextCodec::load`]).
    pub fn for_model(path: &Path) -> Result<Self, TextError> {
        if crate::engine::is_gguf(path) {
            let f = charm_common::gguf::GgufFile::open(path).map_err(|e| TextError::BadFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
            if f.meta("tokenizer.ggml.model").is_none() {
                return Err(TextError::NoTokenizer {
                    path: path.to_path_buf(),
                });
            }
            return Self::from_gguf(&f);
        }
        Self::load(path)
    }

    /// [`TextCodec::for_model`], with the chat template read from
    /// `template` instead of the model's when one is given
    /// (`--chat-template`).
    pub fn for_model_with(path: &Path, template: Option<&Path>) -> Result<Self, TextError> {
        let codec = Self::for_model(path)?;
        match template {
            None => Ok(codec),
            Some(t) => codec.with_template_file(t),
        }
    }

    /// The same tokenizer with the chat template in the file `path` (the
    /// template's text, as `chat_template.jinja` holds it).
    pub fn with_template_file(mut self, path: &Path) -> Result<Self, TextError> {
        let src = std::fs::read_to_string(path).map_err(|e| TextError::BadFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let template = ChatTemplate::new(&src, &self.bos_token, &self.eos_token).map_err(|e| TextError::BadFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        self.template = Some(template);
        Ok(self)
    }

    /// Loads `dir/tokenizer.json` (or Kimi's `dir/tiktoken.model`,
    /// [`crate::tiktoken`]) and the chat template from
    /// `dir/chat_template.jinja` or `dir/tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self, TextError> {
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = if tok_path.exists() {
            Tokenizer::from_file(&tok_path).map_err(|e| TextError::BadFile {
                path: tok_path.clone(),
                reason: e.to_string(),
            })?
        } else {
            let tiktoken = dir.join("tiktoken.model");
            let bad = |reason: String| TextError::BadFile {
                path: tiktoken.clone(),
                reason,
            };
            match crate::tiktoken::for_directory(dir).map_err(bad)? {
                Some(json) => json
                    .to_string()
                    .parse()
                    .map_err(|e: tokenizers::Error| bad(e.to_string()))?,
                None => return Err(TextError::NoTokenizer { path: tok_path }),
            }
        };
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = if cfg_path.exists() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| TextError::BadFile {
                path: cfg_path.clone(),
                reason: e.to_string(),
            })?;
            serde_json::from_str(&text).map_err(|e| TextError::BadFile {
                path: cfg_path.clone(),
                reason: format!("not valid JSON: {e}"),
            })?
        } else {
            Value::Null
        };
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            Some(std::fs::read_to_string(&jinja).map_err(|e| TextError::BadFile {
                path: jinja.clone(),
                reason: e.to_string(),
            })?)
        } else {
            template_from_config(&cfg)
        };
        let (bos_token, eos_token) = (token_string(&cfg, "bos_token"), token_string(&cfg, "eos_token"));
        let template = match source {
            Some(src) => Some(ChatTemplate::new(&src, &bos_token, &eos_token)?),
            None => None,
        };
        Ok(TextCodec {
            tokenizer,
            template,
            dir: dir.to_path_buf(),
            bos_token,
            eos_token,
        })
    }

    /// The tokenizer and chat template stored in a GGUF file's metadata.
    pub fn from_gguf(f: &charm_common::gguf::GgufFile) -> Result<Self, TextError> {
        let bad = |reason: String| TextError::BadFile {
            path: f.path().to_path_buf(),
            reason,
        };
        let json = crate::gguf_text::tokenizer_json(f).map_err(bad)?;
        let tokenizer: Tokenizer = json
            .to_string()
            .parse()
            .map_err(|e: tokenizers::Error| bad(format!("tokenizer metadata: {e}")))?;
        let bos_token = crate::gguf_text::token_text(f, "tokenizer.ggml.bos_token_id");
        let eos_token = crate::gguf_text::token_text(f, "tokenizer.ggml.eos_token_id");
        let template = match crate::gguf_text::chat_template(f) {
            Some(src) => Some(ChatTemplate::new(&src, &bos_token, &eos_token)?),
            None => None,
        };
        Ok(TextCodec {
            tokenizer,
            template,
            dir: f.path().to_path_buf(),
            bos_token,
            eos_token,
        })
    }

    /// The tokenizer, as `tokenizer.json` would hold it.
    pub fn tokenizer_json(&self) -> Result<String, TextError> {
        self.tokenizer
            .to_string(false)
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// Whether the model ships a chat template.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The chat template, if the model ships one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// `tokenizer(text)["input_ids"]`: with the tokenizer's special tokens
    /// (BOS and the like) added as its post-processor says.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.encode_with(text, true)
    }

    /// `text`'s ids without the tokenizer's added special tokens (as an
    /// answer's text continues a rendered prompt).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TextError> {
        self.encode_with(text, false)
    }

    fn encode_with(&self, text: &str, special: bool) -> Result<Vec<u32>, TextError> {
        Ok(self
            .tokenizer
            .encode(text, special)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec())
    }

    /// Decodes ids to text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::Tokenizer(e.to_string()))
    }

    /// The bytes each id stands for ([`crate::token_bytes`]): a token
    /// holding part of a character is not text on its own.
    pub fn token_bytes(&self, ids: &[u32]) -> Result<Vec<Vec<u8>>, TextError> {
        crate::token_bytes::token_bytes(&self.tokenizer, ids)
            .map_err(|id| TextError::Tokenizer(format!("token id {id} is outside the vocabulary")))
    }

    /// Renders `messages` through the chat template.
    pub fn render_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &[(&str, minijinja::Value)],
    ) -> Result<String, TextError> {
        let t = self
            .template
            .as_ref()
            .ok_or_else(|| TextError::NoTemplate { dir: self.dir.clone() })?;
        Ok(t.render(messages, add_generation_prompt, extra)?)
    }

    /// `apply_chat_template(messages, add_generation_prompt, tokenize=True)`:
    /// the rendered text tokenized without adding special tokens (the
    /// template already wrote them).
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &[(&str, minijinja::Value)],
    ) -> Result<Vec<u32>, TextError> {
        self.encode_chat_prefilled(messages, add_generation_prompt, extra, "")
    }

    /// [`TextCodec::encode_chat`] with `prefill` appended to the rendered
    /// text before tokenizing (the start of the assistant's answer, which
    /// the model then continues).
    pub fn encode_chat_prefilled(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &[(&str, minijinja::Value)],
        prefill: &str,
    ) -> Result<Vec<u32>, TextError> {
        let mut text = self.render_chat(messages, add_generation_prompt, extra)?;
        text.push_str(prefill);
        self.encode_with(&text, false)
    }

    /// A streaming decoder over this tokenizer (special tokens are not
    /// printed).
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            codec: self,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            skip_special_tokens: true,
        }
    }

    /// A streaming decoder that prints special tokens too (a harmony
    /// answer's `<|channel|>` / `<|message|>` markers are special tokens,
    /// and its reasoning, answer and calls are told apart by them).
    pub fn stream_keeping_special(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            skip_special_tokens: false,
            ..self.stream()
        }
    }
}

/// `chat_template` is a string, or a list of `{name, template}` (use "default").
fn template_from_config(cfg: &Value) -> Option<String> {
    match cfg.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

/// `bos_token` / `eos_token` as a string, or the `content` of an added-token object.
fn token_string(cfg: &Value, key: &str) -> String {
    match cfg.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or("").to_string(),
        _ => String::new(),
    }
}

/// Turns a growing id sequence into text pieces, holding back bytes that
/// do not yet form complete characters (a multi-byte character split
/// across tokens is printed once whole).
pub struct StreamDecoder<'a> {
    codec: &'a TextCodec,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl StreamDecoder<'_> {
    /// Adds one id; returns the newly completed text, if any. Special
    /// tokens are printed only by [`TextCodec::stream_keeping_special`]'s.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TextError> {
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let prefix = self
            .codec
            .decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = self.codec.decode(&self.ids[self.prefix_offset..], skip)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            let piece = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    /// Ends the stream: returns whatever was held back (an incomplete
    /// character at the very end decodes to U+FFFD, as whole decoding does).
    pub fn finish(&mut self) -> Result<Option<String>, TextError> {
        let skip = self.skip_special_tokens;
        let prefix = self
            .codec
            .decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = self.codec.decode(&self.ids[self.prefix_offset..], skip)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        match full.strip_prefix(&prefix) {
            Some(rest) if !rest.is_empty() => Ok(Some(rest.to_string())),
            _ => Ok(None),
        }
    }
}
