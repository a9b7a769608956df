//! One module per subcommand.

pub mod logits;
pub mod run;

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use longhaul_engine::Engine;

/// Opens a model, saying on stderr what is being loaded and how long it took.
pub fn open_model(path: &Path) -> anyhow::Result<Engine> {
    eprintln!("loading {} …", path.display());
    let started = Instant::now();
    let engine = Engine::open(path)
        .with_context(|| format!("cannot load the model at {}", path.display()))?;
    eprintln!(
        "loaded {} ({} layers, vocabulary {}) in {:.2} s",
        engine.spec().model_type,
        engine.spec().common().num_layers,
        engine.vocab_size(),
        started.elapsed().as_secs_f64()
    );
    Ok(engine)
}
