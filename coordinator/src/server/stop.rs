//! Stop sequences over streamed text.
//!
//! Text arrives in pieces (one per completed token, see
//! [`crate::text::StreamDecoder`]). A stop string may span several pieces,
//! or end in the middle of one. [`StopMatcher`] cuts the output exactly
//! before the earliest stop string and holds back any tail that could still
//! become the start of one, so nothing after a stop string is ever emitted.

/// Watches streamed text for stop strings.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted (a possible stop-string prefix).
    pending: String,
    /// The stop string that ended the text, once one did.
    hit: Option<String>,
}

/// What one piece released.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Release {
    /// Text that is certainly output (never followed by a stop string).
    pub text: String,
    /// Set when a stop string completed: the text is cut before it.
    pub stopped: Option<String>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Default::default()
        }
    }

    /// The stop string that ended the text, if any.
    pub fn hit(&self) -> Option<&str> {
        self.hit.as_deref()
    }

    /// Adds a piece of text; returns what can be emitted now. After a stop
    /// string was found, every further piece releases nothing.
    pub fn push(&mut self, piece: &str) -> Release {
        if self.hit.is_some() {
            return Release::default();
        }
        self.pending.push_str(piece);
        // The earliest stop string wins; at equal positions the first listed.
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = found {
            let stop = stop.clone();
            let text = self.pending[..at].to_string();
            self.pending.clear();
            self.hit = Some(stop.clone());
            return Release {
                text,
                stopped: Some(stop),
            };
        }
        let hold = self.held_tail();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Release { text, stopped: None }
    }

    /// The end of the text: releases whatever was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that are a proper prefix of a stop
    /// string (the longest such tail, on character boundaries).
    fn held_tail(&self) -> usize {
        let p = &self.pending;
        let mut hold = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if k > hold && k <= p.len() && p.is_char_boundary(p.len() - k) && p.ends_with(&s[..k]) {
                    hold = k;
                }
            }
        }
        hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = Vec::new();
        for p in pieces {
            let r = m.push(p);
            out.push(r.text);
            if r.stopped.is_some() {
                return (out, r.stopped);
            }
        }
        out.push(m.finish());
        (out, None)
    }

    #[test]
    fn no_stop_passes_text_through_unchanged() {
        let (out, hit) = run(&[], &["ab", "c", ""]);
        assert_eq!(out.concat(), "abc");
        assert_eq!(out[0], "ab", "nothing is held back without stop strings");
        assert_eq!(hit, None);
    }

    #[test]
    fn cut_before_a_stop_string_spanning_pieces() {
        let (out, hit) = run(&["STOP"], &["hello S", "TO", "P and more"]);
        assert_eq!(out, vec!["hello ", "", ""]);
        assert_eq!(hit.as_deref(), Some("STOP"));
    }

    #[test]
    fn cut_when_the_stop_string_ends_inside_a_piece() {
        let (out, hit) = run(&["end"], &["the e", "ndless road"]);
        assert_eq!(out.concat(), "the ");
        assert_eq!(hit.as_deref(), Some("end"));
    }

    #[test]
    fn a_false_start_is_released_once_it_cannot_match() {
        let (out, hit) = run(&["STOP"], &["a ST", "ARt", "!"]);
        assert_eq!(out, vec!["a ", "STARt", "!", ""]);
        assert_eq!(hit, None);
    }

    #[test]
    fn the_held_tail_is_released_at_the_end() {
        let (out, hit) = run(&["xyz"], &["abc x", "y"]);
        assert_eq!(out, vec!["abc ", "", "xy"]);
        assert_eq!(hit, None);
    }

    #[test]
    fn earliest_of_several_stop_strings_wins() {
        let (out, hit) = run(&["world", "lo"], &["hello world"]);
        assert_eq!(out.concat(), "hel");
        assert_eq!(hit.as_deref(), Some("lo"));
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        let (out, hit) = run(&["éz"], &["café", "!", "éz"]);
        assert_eq!(out, vec!["caf", "é!", ""]);
        assert_eq!(hit.as_deref(), Some("éz"));
    }

    #[test]
    fn nothing_after_a_stop_is_released() {
        let mut m = StopMatcher::new(&[".".to_string()]);
        assert_eq!(m.push("a.b").text, "a");
        assert_eq!(m.push("more"), Release::default());
        assert_eq!(m.finish(), "");
        assert_eq!(m.hit(), Some("."));
    }
}
