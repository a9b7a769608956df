//! One module per subcommand.

pub mod logits;
pub mod run;

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use longhaul_engine::{Engine, LoadProgress};

/// Opens a model, saying on stderr what is being loaded and how long it took.
pub fn open_model(path: &Path) -> anyhow::Result<Engine> {
    eprintln!("loading {} …", path.display());
    let started = Instant::now();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let engine = Engine::open_with_progress(path, &|p: LoadProgress| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.loaded_bytes);
    });
    bar.finish_and_clear();
    let engine = engine.with_context(|| format!("cannot load the model at {}", path.display()))?;
    eprintln!(
        "loaded {} ({} layers, vocabulary {}) in {:.2} s",
        engine.spec().model_type,
        engine.spec().common().num_layers,
        engine.vocab_size(),
        started.elapsed().as_secs_f64()
    );
    Ok(engine)
}
