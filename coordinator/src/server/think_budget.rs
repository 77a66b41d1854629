//! A cap on a chat answer's reasoning: after `budget` tokens inside the
//! reasoning the engine writes the end of the reasoning itself, and the
//! model goes on with its answer.
//!
//! Requests set it with Anthropic's `thinking.budget_tokens` or the
//! `thinking_token_budget` field of the OpenAI routes (vLLM's name). The
//! reasoning is what the answer splitters call reasoning: a `<think>`
//! block at the start of the answer (or the block the prompt left open,
//! [`super::reasoning`]), or harmony's `analysis` channel
//! ([`super::harmony`]). A token counts when the text before it ended
//! inside the reasoning (the closing tag itself counts, the opening one
//! does not). Once `budget` tokens have counted and the reasoning is still
//! open, the next tokens are not sampled but the ones that close it, as
//! the model's template writes them:
//!
//! - `<think>` blocks: `"\n</think>\n\n"` (Qwen3's, GLM's and DeepSeek-R1's
//!   templates write a finished block so),
//! - harmony: `<|end|><|start|>assistant<|channel|>final<|message|>` (the
//!   analysis message ends and the final one begins).
//!
//! They are output tokens like the rest (counted in usage, streamed, with
//! log-probabilities when asked), fed to the model as if it had sampled
//! them, and the closing happens at most once. An answer whose reasoning
//! ends within its budget, or that has none, is exactly the answer it is
//! without one. The forcing depends only on the sequence's own text, so a
//! capped answer is the same alone or batched with others.

use super::harmony::{self, HarmonySplit};
use super::reasoning::{self, ThinkSplit};
use crate::text::{TextCodec, TextError};

/// The text that closes a `<think>` block.
pub const THINK_CLOSE: &str = "\n</think>\n\n";
/// The text that ends a harmony analysis message and opens the final one.
pub const HARMONY_CLOSE: &str = "<|end|><|start|>assistant<|channel|>final<|message|>";

/// A request's budget as a count of tokens (a budget past the address
/// space is no cap).
pub fn budget_tokens(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Which reasoning the answer's text is read for.
#[derive(Debug)]
enum Watch {
    Think(ThinkSplit),
    Harmony(HarmonySplit),
}

impl Watch {
    fn in_reasoning(&self) -> bool {
        match self {
            Watch::Think(s) => s.in_reasoning(),
            Watch::Harmony(s) => s.in_reasoning(),
        }
    }

    fn push(&mut self, text: &str) {
        match self {
            Watch::Think(s) => {
                s.push(text);
            }
            Watch::Harmony(s) => {
                s.push(text);
            }
        }
    }
}

/// One answer's reasoning budget (lives in its job on the engine thread).
#[derive(Debug)]
pub struct ThinkBudget {
    budget: usize,
    /// Tokens that counted so far.
    used: usize,
    watch: Watch,
    /// The ids that close the reasoning.
    close: Vec<u32>,
    /// How many of `close` were written; `None` until the budget ran out.
    written: Option<usize>,
}

impl ThinkBudget {
    /// A budget for a model whose reasoning is a `<think>` block; `inside`:
    /// the prompt left the block open. `close`: [`THINK_CLOSE`]'s ids.
    pub fn think(budget: usize, inside: bool, close: Vec<u32>) -> Self {
        Self::new(budget, Watch::Think(ThinkSplit::new(inside)), close)
    }

    /// A budget for a harmony model (gpt-oss). `close`: [`HARMONY_CLOSE`]'s
    /// ids (special tokens).
    pub fn harmony(budget: usize, close: Vec<u32>) -> Self {
        Self::new(budget, Watch::Harmony(HarmonySplit::new(&[], "")), close)
    }

    /// The budget for an answer through the chat template `source`, its
    /// closing tokenized by `codec`; `inside`: the prompt left a `<think>`
    /// block open. `None` for a template that writes no reasoning (there
    /// is nothing to cap).
    pub fn for_template(
        source: &str,
        budget: usize,
        inside: bool,
        codec: &TextCodec,
    ) -> Result<Option<Self>, TextError> {
        if harmony::is_harmony(source) {
            return Ok(Some(Self::harmony(budget, codec.encode_plain(HARMONY_CLOSE)?)));
        }
        if !reasoning::template_thinks(source) {
            return Ok(None);
        }
        Ok(Some(Self::think(budget, inside, codec.encode_plain(THINK_CLOSE)?)))
    }

    fn new(budget: usize, watch: Watch, close: Vec<u32>) -> Self {
        ThinkBudget {
            budget,
            used: 0,
            watch,
            close,
            written: None,
        }
    }

    /// The id to write next instead of sampling one, while the budget's
    /// closing is being written.
    pub fn forced(&mut self) -> Option<u32> {
        if self.written.is_none() && self.used >= self.budget && self.watch.in_reasoning() {
            self.written = Some(0);
        }
        let n = self.written.as_mut()?;
        let id = self.close.get(*n).copied()?;
        *n += 1;
        Some(id)
    }

    /// The text of the token just generated (sampled or forced).
    pub fn push(&mut self, text: &str) {
        if self.watch.in_reasoning() {
            self.used += 1;
        }
        self.watch.push(text);
    }

    /// Whether the text so far ended inside the reasoning.
    pub fn in_reasoning(&self) -> bool {
        self.watch.in_reasoning()
    }

    /// Tokens counted as reasoning so far.
    pub fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `tokens` (texts; `None` where the model would sample) through
    /// a budget: the texts written, with forced closing ids as `<id>`.
    fn run(mut b: ThinkBudget, tokens: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        let mut model = tokens.iter();
        loop {
            let text = match b.forced() {
                Some(id) => format!("<{id}>"),
                None => match model.next() {
                    Some(t) => t.to_string(),
                    None => return out,
                },
            };
            // The forced ids' texts, as the decoder gives them.
            let decoded = match text.as_str() {
                "<1>" => "\n".to_string(),
                "<2>" => "</think>".to_string(),
                "<3>" => "\n\n".to_string(),
                "<10>" => "<|end|>".to_string(),
                "<11>" => "<|start|>assistant".to_string(),
                "<12>" => "<|channel|>final<|message|>".to_string(),
                t => t.to_string(),
            };
            b.push(&decoded);
            out.push(text);
        }
    }

    fn think(budget: usize, inside: bool) -> ThinkBudget {
        ThinkBudget::think(budget, inside, vec![1, 2, 3])
    }

    #[test]
    fn a_block_the_model_opens_is_closed_after_its_budget() {
        let got = run(think(3, false), &["<think>", "a", "b", "c", "d", "e"]);
        // `<think>` does not count; a, b, c do; then the close, then the model again.
        assert_eq!(got, ["<think>", "a", "b", "c", "<1>", "<2>", "<3>", "d", "e"]);
    }

    #[test]
    fn a_block_the_prompt_opens_counts_from_the_first_token() {
        let got = run(think(2, true), &["a", "b", "c"]);
        assert_eq!(got, ["a", "b", "<1>", "<2>", "<3>", "c"]);
        // A budget of 0 closes it before anything is sampled.
        let got = run(think(0, true), &["a"]);
        assert_eq!(got, ["<1>", "<2>", "<3>", "a"]);
    }

    #[test]
    fn reasoning_within_its_budget_and_no_reasoning_are_left_alone() {
        let toks = ["<think>", "a", "</think>", "\n\n", "x", "y", "z"];
        assert_eq!(run(think(3, false), &toks), toks);
        let toks = ["plain", " answer", " <think>", " later", " a", " b", " c"];
        assert_eq!(run(think(1, false), &toks), toks);
    }

    #[test]
    fn the_closing_is_written_once() {
        // After the forced close the model reopens a block: it is answer text now.
        let got = run(think(1, false), &["<think>", "a", "<think>", "b", "c"]);
        assert_eq!(got, ["<think>", "a", "<1>", "<2>", "<3>", "<think>", "b", "c"]);
    }

    #[test]
    fn a_tag_split_over_tokens_is_read_whole() {
        let got = run(think(2, false), &["<th", "ink>", "a", "b", "</th", "ink>", "x"]);
        assert_eq!(got, ["<th", "ink>", "a", "b", "<1>", "<2>", "<3>", "</th", "ink>", "x"]);
    }

    #[test]
    fn harmony_analysis_is_closed_into_the_final_channel() {
        let b = ThinkBudget::harmony(2, vec![10, 11, 12]);
        let got = run(b, &["<|channel|>", "analysis", "<|message|>", "a", "b", "c", "x"]);
        assert_eq!(
            got,
            [
                "<|channel|>",
                "analysis",
                "<|message|>",
                "a",
                "b",
                "<10>",
                "<11>",
                "<12>",
                "c",
                "x"
            ]
        );
        // A final answer without analysis is left alone.
        let toks = ["<|channel|>", "final", "<|message|>", "a", "b", "c"];
        assert_eq!(run(ThinkBudget::harmony(0, vec![10, 11, 12]), &toks), toks);
    }

    #[test]
    fn counts_only_reasoning_tokens() {
        let mut b = think(10, false);
        for t in ["<think>", "a", "b", "</think>", "x", "y"] {
            assert_eq!(b.forced(), None);
            b.push(t);
        }
        assert_eq!(b.used(), 3, "a, b and the closing tag");
    }
}
