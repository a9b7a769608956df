//! `--speculate` for `run` and `bench`: which drafter guesses ahead.

use std::path::PathBuf;

use anyhow::Context;
use longhaul_engine::{
    DraftModel, Engine, Flow, Generation, GenerationSettings, Piece, Speculation, TextBridge,
};

/// How a command guesses ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpeculateArg {
    Off,
    /// Prompt lookup (`auto` is this, as in the service).
    Lookup,
    /// A draft model's folder or pack.
    Draft(PathBuf),
}

pub fn parse_speculate(text: &str) -> Result<SpeculateArg, String> {
    match text {
        "off" => Ok(SpeculateArg::Off),
        "auto" | "lookup" => Ok(SpeculateArg::Lookup),
        _ => match text.strip_prefix("draft:") {
            Some(path) if !path.is_empty() => Ok(SpeculateArg::Draft(PathBuf::from(path))),
            _ => Err(format!("`{text}`: use auto, off, lookup or draft:PATH")),
        },
    }
}

impl SpeculateArg {
    /// What `GenerationSettings::speculation` says (a draft model is given
    /// to the generation separately).
    pub fn speculation(&self) -> Speculation {
        match self {
            Self::Lookup => Speculation::Lookup,
            Self::Off | Self::Draft(_) => Speculation::Off,
        }
    }
}

/// Generates `prompt` with `engine`, guessing as `arg` says. A draft model
/// with the target's tokenizer guesses token ids; one with another tokenizer
/// guesses through text (said on stderr).
pub fn generate(
    engine: &Engine,
    prompt: &[u32],
    settings: &GenerationSettings,
    arg: &SpeculateArg,
    on_piece: impl FnMut(Piece<'_>) -> Flow,
) -> anyhow::Result<Generation> {
    let SpeculateArg::Draft(path) = arg else {
        return Ok(engine.generate_resumed(prompt, &[], &[], settings, on_piece)?);
    };
    let draft = Engine::open(path)
        .with_context(|| format!("cannot open the draft model at {}", path.display()))?;
    let target_tokens = engine
        .tokenizer()
        .context("cannot read the model's tokenizer")?;
    let draft_tokens = draft.tokenizer().with_context(|| {
        format!(
            "cannot read the draft model's tokenizer at {}",
            path.display()
        )
    })?;
    let generation = if draft_tokens.same_vocabulary(target_tokens) {
        let mut drafter = DraftModel::new(draft.session());
        engine.generate_drafted(prompt, settings, &mut drafter, on_piece)?
    } else {
        eprintln!(
            "the draft model has another tokenizer ({} tokens, the model {}): its guesses travel as text",
            draft.vocab_size(),
            engine.vocab_size()
        );
        let mut drafter = TextBridge::new(draft.session(), draft_tokens, target_tokens);
        engine.generate_drafted(prompt, settings, &mut drafter, on_piece)?
    };
    Ok(generation)
}
