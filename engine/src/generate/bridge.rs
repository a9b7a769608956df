//! Guesses from a draft model with another tokenizer, carried as text.
//!
//! Small models that share a frontier model's tokenizer are rare (Kimi K3 has
//! none; deltafin pairs it with Qwen3-0.6B), so the guesses cannot pass as
//! token ids. The bridge decodes the verified sequence to text, lets the draft
//! model continue it in its own tokens, and encodes the continuation with the
//! target's tokenizer. The two tokenizers cut text in different places, which
//! matters at both ends of a guess:
//! - the start: the target's next token begins where its last one ended. The
//!   continuation is encoded after the text of the target's last
//!   [`ANCHOR_TOKENS`] tokens, so a tokenizer that treats the start of a text
//!   specially (a SentencePiece prefix space) sees the same neighbourhood; the
//!   guesses count only when that encoding gives those tokens back. When the
//!   continuation merges into them (the context ends in "hel", the draft adds
//!   "lo", the target has one token "hello"), the continuation is encoded on
//!   its own instead.
//! - the end: the draft's text stops anywhere, perhaps inside a word the
//!   target cuts as one token, so the last target token is dropped.
//!
//! Whatever the bridge guesses, verification keeps only what plain decoding
//! picks: a misaligned guess costs a rejected row, never a changed token.

use super::speculate::{DraftModel, Drafter};
use crate::tokenizer::{TextTokenizer, TokenizerError};

/// Kind of the bridge's guesses (see [`Drafter::propose`]).
pub const BRIDGED_KIND: usize = 6;
/// Target tokens re-encoded in front of a continuation.
pub const ANCHOR_TOKENS: usize = 4;
/// Draft tokens asked beyond the target tokens wanted: one target token is
/// always dropped at the end, and the draft's tokens may be shorter.
const EXTRA_DRAFT_TOKENS: usize = 2;

/// A draft model with its own tokenizer as a [`Drafter`] for a target model.
pub struct TextBridge<'m> {
    draft: DraftModel<'m>,
    draft_tokenizer: &'m TextTokenizer,
    target_tokenizer: &'m TextTokenizer,
}

impl<'m> TextBridge<'m> {
    pub fn new(
        draft: super::Session<'m>,
        draft_tokenizer: &'m TextTokenizer,
        target_tokenizer: &'m TextTokenizer,
    ) -> Self {
        Self {
            draft: DraftModel::new(draft),
            draft_tokenizer,
            target_tokenizer,
        }
    }

    fn try_propose(&mut self, context: &[u32], max: usize) -> Result<Vec<u32>, TokenizerError> {
        let text = self.target_tokenizer.decode_with_special(context)?;
        let draft_context = self.draft_tokenizer.encode(&text, false)?;
        if draft_context.is_empty() {
            return Ok(Vec::new());
        }
        let (draft_guesses, _) = self.draft.propose(&draft_context, max + EXTRA_DRAFT_TOKENS);
        if draft_guesses.is_empty() {
            return Ok(Vec::new());
        }
        let continuation = continuation(self.draft_tokenizer, &draft_context, &draft_guesses)?;
        let mut guesses = encode_after(self.target_tokenizer, context, &continuation)?;
        guesses.pop();
        guesses.truncate(max);
        Ok(guesses)
    }
}

impl Drafter for TextBridge<'_> {
    fn fixed_kind(&self) -> Option<usize> {
        Some(BRIDGED_KIND)
    }

    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, usize) {
        if context.is_empty() || max == 0 {
            return (Vec::new(), BRIDGED_KIND);
        }
        // A bridge that fails only costs its guesses: decoding goes on plainly.
        let guesses = self.try_propose(context, max).unwrap_or_default();
        (guesses, BRIDGED_KIND)
    }
}

/// The text `guesses` add after `context`, both in `tokenizer`'s ids. Decoded
/// after the context's last tokens, so a token that decodes differently at
/// the start of a text (a prefix space) reads as it does in place.
pub fn continuation(
    tokenizer: &TextTokenizer,
    context: &[u32],
    guesses: &[u32],
) -> Result<String, TokenizerError> {
    let anchor = &context[context.len().saturating_sub(ANCHOR_TOKENS)..];
    let before = tokenizer.decode_with_special(anchor)?;
    let all = tokenizer.decode_with_special(&[anchor, guesses].concat())?;
    match all.strip_prefix(&before) {
        Some(rest) => Ok(rest.to_string()),
        None => tokenizer.decode_with_special(guesses),
    }
}

/// `text` in `tokenizer`'s ids as it continues `context` (ids of the same
/// tokenizer): encoded after the context's last tokens when that gives them
/// back, otherwise on its own.
pub fn encode_after(
    tokenizer: &TextTokenizer,
    context: &[u32],
    text: &str,
) -> Result<Vec<u32>, TokenizerError> {
    let anchor = &context[context.len().saturating_sub(ANCHOR_TOKENS)..];
    let anchored = tokenizer.decode_with_special(anchor)? + text;
    let ids = tokenizer.encode(&anchored, false)?;
    match ids.strip_prefix(anchor) {
        Some(rest) => Ok(rest.to_vec()),
        None => tokenizer.encode(text, false),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn tokenizer(dir: &str) -> TextTokenizer {
        TextTokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)).unwrap()
    }

    fn passage() -> String {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe");
        let text = std::fs::read_to_string(dir.join("validation-sample.txt")).unwrap();
        text.chars().take(1500).collect()
    }

    /// Cut a passage's tokens at every point: the continuation's text comes
    /// back whole, and nearly always as the very tokens of the whole passage.
    #[test]
    fn a_continuation_encodes_after_its_context_as_in_the_whole_text() {
        for dir in [
            "../assets/longhaul-demo-moe",
            "tests/fixtures/qwen3_moe_recent",
        ] {
            let tok = tokenizer(dir);
            let ids = tok.encode(&passage(), false).unwrap();
            let mut same = 0;
            let cuts = 1..ids.len() - 1;
            for cut in cuts.clone() {
                let (context, rest) = ids.split_at(cut);
                let text = continuation(&tok, context, rest).unwrap();
                let full = tok.decode_with_special(&ids).unwrap();
                let head = tok.decode_with_special(context).unwrap();
                assert_eq!(format!("{head}{text}"), full, "{dir}: cut at {cut}");
                let again = encode_after(&tok, context, &text).unwrap();
                assert_eq!(tok.decode_with_special(&again).unwrap(), text);
                same += usize::from(again == rest);
            }
            let share = same as f64 / cuts.len() as f64;
            println!("{dir}: {same} of {} cuts give the same tokens", cuts.len());
            assert!(share >= 0.9, "{dir}: only {share:.2} of cuts line up");
        }
    }

    /// A continuation that merges into the context's last token ("hel" then
    /// "lo") is encoded on its own, from where the context's tokens end.
    #[test]
    fn a_continuation_that_merges_into_the_last_token_starts_at_the_boundary() {
        let tok = tokenizer("../assets/longhaul-demo-moe");
        let context = tok
            .encode("with open(path) as f: data = f.re", false)
            .unwrap();
        let merged = tok
            .encode("with open(path) as f: data = f.read()", false)
            .unwrap();
        assert!(
            !merged.starts_with(&context),
            "the example must merge across the cut"
        );
        let guesses = encode_after(&tok, &context, "ad()").unwrap();
        assert_eq!(tok.decode_with_special(&guesses).unwrap(), "ad()");
        assert_eq!(guesses, tok.encode("ad()", false).unwrap());
    }
}
