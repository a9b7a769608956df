//! Decoding held to a given start: the answer must begin with one of a few
//! texts (a family's call opener up to a tool's name, when a request forces
//! a call). While it has not, every token whose text would leave the answer
//! off all of them is removed before the draw, so the model still chooses
//! among what is allowed by its own probabilities, and the choice is as
//! deterministic as unconstrained sampling. Reasoning before the answer is
//! left free, and so is whitespace before it.
//!
//! Token texts are the vocabulary's, special tokens spelled out (the call
//! markers are special tokens in most families); they are decoded once per
//! tokenizer. A step checks every token (Kimi's 163,840 in a few
//! milliseconds), only until the start is written: a few to a few dozen
//! steps.

/// The state of a start being held to.
pub(crate) struct Constraint<'t> {
    starts: &'t [String],
    texts: &'t [Option<String>],
    /// The answer written so far, leading whitespace left out.
    written: String,
    done: bool,
}

impl<'t> Constraint<'t> {
    /// Holds the answer to `starts` (none: free), with `texts[id]` the
    /// text of token `id` (none: the tokenizer cannot spell it).
    pub fn new(starts: &'t [String], texts: &'t [Option<String>]) -> Self {
        Self {
            starts,
            texts,
            written: String::new(),
            done: starts.is_empty(),
        }
    }

    /// Whether a start is still being held to.
    pub fn active(&self) -> bool {
        !self.done
    }

    /// Whether `text` after what was written keeps the answer on a start.
    fn allows(&self, text: &str) -> bool {
        let mut candidate = self.written.clone();
        candidate.push_str(text);
        let candidate = candidate.trim_start();
        candidate.is_empty()
            || self
                .starts
                .iter()
                .any(|s| s.starts_with(candidate) || candidate.starts_with(s.as_str()))
    }

    /// Removes from `logits` every token the start does not allow, but
    /// `also` (a token that opens reasoning, which may come first). When
    /// no token is allowed (a vocabulary that cannot spell the start), the
    /// constraint gives up and leaves the logits alone.
    pub fn mask(&mut self, logits: &mut [f32], also: Option<u32>) {
        let allowed: Vec<bool> = (0..logits.len())
            .map(|id| {
                Some(id as u32) == also
                    || self
                        .texts
                        .get(id)
                        .and_then(Option::as_deref)
                        .is_some_and(|t| self.allows(t))
            })
            .collect();
        if !allowed.iter().any(|&a| a) {
            tracing::warn!("no token can begin the forced start {:?}", self.starts);
            self.done = true;
            return;
        }
        for (l, ok) in logits.iter_mut().zip(allowed) {
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Notes answer text just written; the start is reached once it holds
    /// one whole.
    pub fn push(&mut self, answer: &str) {
        if self.done {
            return;
        }
        self.written.push_str(answer);
        let w = self.written.trim_start();
        if self.starts.iter().any(|s| w.starts_with(s.as_str())) {
            self.done = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts() -> Vec<Option<String>> {
        [
            "<tool_call>",
            "\n",
            "{\"",
            "name",
            "\":",
            " \"",
            "read",
            "_file",
            "write",
            "\"",
            "hi",
            "  ",
        ]
        .iter()
        .map(|s| Some(s.to_string()))
        .collect()
    }

    #[test]
    fn only_tokens_that_stay_on_a_start_survive_until_it_is_written() {
        let starts = vec!["<tool_call>\n{\"name\": \"read_file\"".to_string()];
        let texts = texts();
        let mut c = Constraint::new(&starts, &texts);
        let mut logits = vec![0.0; texts.len()];
        c.mask(&mut logits, None);
        let open: Vec<usize> = (0..texts.len())
            .filter(|&i| logits[i].is_finite())
            .collect();
        // The opener and whitespace (before the answer) only.
        assert_eq!(open, vec![0, 1, 11]);
        for piece in ["<tool_call>", "\n", "{\"", "name", "\":", " \"", "read"] {
            assert!(c.active());
            c.push(piece);
        }
        let mut logits = vec![0.0; texts.len()];
        c.mask(&mut logits, None);
        assert!(
            logits[7].is_finite() && !logits[8].is_finite(),
            "{logits:?}"
        );
        c.push("_file");
        c.push("\"");
        assert!(!c.active(), "the start is written: decoding is free");
    }

    #[test]
    fn no_start_is_free_and_an_unspellable_one_gives_up() {
        let texts = texts();
        assert!(!Constraint::new(&[], &texts).active());
        let starts = vec!["<minimax:tool_call>".to_string()];
        let mut c = Constraint::new(&starts, &texts);
        let mut logits = vec![1.0; texts.len()];
        c.mask(&mut logits, None);
        // Whitespace is allowed, so it does not give up yet.
        assert!(logits[1].is_finite() && !logits[0].is_finite());
        let mut c = Constraint::new(&starts, &texts[..1]);
        let mut logits = vec![1.0; 1];
        c.mask(&mut logits, None);
        assert!(!c.active() && logits[0] == 1.0);
    }
}
