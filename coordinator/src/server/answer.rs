//! What the model wrote, as the APIs return it: reasoning first
//! ([`super::reasoning`]), then the answer's text and tool calls
//! ([`super::tools`]); or, for a harmony model (gpt-oss), its channel
//! messages ([`super::harmony`]). One streaming splitter serves every
//! route; the whole answer is the same splitter fed everything at once.

use super::harmony::HarmonySplit;
use super::reasoning::{Part, ThinkSplit};
use super::tools::{Piece, ToolCall, ToolPlan, ToolStream};

/// How a request's answer is split.
#[derive(Clone, Debug, Default)]
pub struct Shape {
    /// `Some(inside)`: the template writes `<think>` blocks, and the prompt
    /// left one open (`inside`) or not.
    pub think: Option<bool>,
    /// The template speaks harmony: the answer is channel messages, and
    /// `think` and the tools' syntax play no part in splitting it.
    pub harmony: bool,
    pub tools: Option<ToolPlan>,
}

/// An answer piece (never empty).
#[derive(Clone, Debug, PartialEq)]
pub enum Out {
    Reasoning(String),
    Text(String),
    Call(ToolCall),
}

/// Splits streamed text into reasoning, text and calls.
#[derive(Debug)]
pub struct AnswerStream {
    think: Option<ThinkSplit>,
    tools: Option<ToolStream>,
    harmony: Option<HarmonySplit>,
}

impl AnswerStream {
    pub fn new(shape: &Shape) -> Self {
        if shape.harmony {
            let (names, prefill) = shape
                .tools
                .as_ref()
                .map_or((&[][..], ""), |p| (&p.names[..], p.prefill.as_str()));
            return AnswerStream {
                think: None,
                tools: None,
                harmony: Some(HarmonySplit::new(names, prefill)),
            };
        }
        // A forced call's prefill already started the answer: no reasoning.
        let forced = shape.tools.as_ref().is_some_and(|p| !p.prefill.is_empty());
        AnswerStream {
            think: shape.think.filter(|_| !forced).map(ThinkSplit::new),
            tools: shape.tools.as_ref().map(ToolPlan::stream),
            harmony: None,
        }
    }

    /// Feeds text; returns what can no longer change.
    pub fn push(&mut self, text: &str) -> Vec<Out> {
        if let Some(h) = &mut self.harmony {
            return h.push(text);
        }
        let parts = match &mut self.think {
            None => vec![Part::Answer(text.to_string())],
            Some(t) => t.push(text),
        };
        self.route(parts, false)
    }

    /// The end of the text.
    pub fn finish(&mut self) -> Vec<Out> {
        if let Some(h) = &mut self.harmony {
            return h.finish();
        }
        let parts = self.think.as_mut().map(ThinkSplit::finish).unwrap_or_default();
        self.route(parts, true)
    }

    /// Calls parsed so far.
    pub fn calls(&self) -> usize {
        match &self.harmony {
            Some(h) => h.calls(),
            None => self.tools.as_ref().map_or(0, ToolStream::calls),
        }
    }

    /// Why call blocks were left in the text.
    pub fn warnings(&self) -> &[String] {
        match &self.harmony {
            Some(h) => h.warnings(),
            None => self.tools.as_ref().map_or(&[], ToolStream::warnings),
        }
    }

    fn route(&mut self, parts: Vec<Part>, last: bool) -> Vec<Out> {
        let mut out = Vec::new();
        for p in parts {
            match p {
                Part::Reasoning(r) => out.push(Out::Reasoning(r)),
                Part::Answer(a) => match &mut self.tools {
                    None => out.push(Out::Text(a)),
                    Some(t) => out.extend(t.push(&a).into_iter().map(from_piece)),
                },
            }
        }
        if last {
            if let Some(t) = &mut self.tools {
                out.extend(t.finish().into_iter().map(from_piece));
            }
        }
        out
    }
}

fn from_piece(p: Piece) -> Out {
    match p {
        Piece::Text(t) => Out::Text(t),
        Piece::Call(c) => Out::Call(c),
    }
}

/// A whole answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
    pub warnings: Vec<String>,
}

/// `text` split as [`AnswerStream`] splits it.
pub fn whole(shape: &Shape, text: &str) -> Answer {
    let mut s = AnswerStream::new(shape);
    let mut outs = s.push(text);
    outs.extend(s.finish());
    let mut a = Answer {
        warnings: s.warnings().to_vec(),
        ..Answer::default()
    };
    for o in outs {
        match o {
            Out::Reasoning(r) => a.reasoning.push_str(&r),
            Out::Text(t) => a.content.push_str(&t),
            Out::Call(c) => a.calls.push(c),
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::super::testing::plan;
    use super::super::tools::Choice;
    use super::*;

    #[test]
    fn reasoning_then_a_call() {
        let shape = Shape {
            think: Some(false),
            harmony: false,
            tools: Some(plan(&["get_weather"], Choice::Auto)),
        };
        let text = "<think>\nThe user wants weather. <tool_call> is the syntax.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let a = whole(&shape, text);
        assert_eq!(a.reasoning, "The user wants weather. <tool_call> is the syntax.");
        assert_eq!(a.content, "Let me check.");
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].name, "get_weather");
        assert!(
            a.warnings.is_empty(),
            "a tag inside the reasoning is not a call: {:?}",
            a.warnings
        );
    }

    #[test]
    fn a_forced_call_has_no_reasoning_and_a_model_without_thinking_keeps_its_tags() {
        let forced = Shape {
            think: Some(false),
            harmony: false,
            tools: Some(plan(&["get_weather"], Choice::Named("get_weather".into()))),
        };
        let a = whole(&forced, "{\"city\": \"Paris\"}}");
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.reasoning, "");
        let plain = whole(&Shape::default(), "<think>x</think>y");
        assert_eq!(plain.content, "<think>x</think>y");
    }

    #[test]
    fn a_harmony_answer_splits_by_channel() {
        let mut tools = plan(&["get_weather"], Choice::Auto);
        tools.syntax = super::super::tools::ToolSyntax::Harmony;
        let shape = Shape {
            think: None,
            harmony: true,
            tools: Some(tools),
        };
        let a = whole(
            &shape,
            "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary \
             to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        );
        assert_eq!(a.reasoning, "Weather needed.");
        assert_eq!(a.content, "");
        assert_eq!(a.calls.len(), 1, "{a:?}");
        assert_eq!(a.calls[0].arguments_json(), r#"{"city":"Paris"}"#);
        // Without tools a call is text, with a warning.
        let bare = Shape {
            harmony: true,
            ..Shape::default()
        };
        let a = whole(
            &bare,
            "<|channel|>commentary to=functions.get_weather<|message|>{}<|call|>",
        );
        assert!(a.calls.is_empty() && a.warnings.len() == 1, "{a:?}");
        let a = whole(&bare, "<|channel|>final<|message|>Paris.<|return|>");
        assert_eq!((a.reasoning.as_str(), a.content.as_str()), ("", "Paris."));
    }
}
