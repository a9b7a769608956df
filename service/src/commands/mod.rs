//! One module per subcommand.

pub mod bench;
mod bench_guess;
mod bench_together;
pub mod compare;
pub mod demo;
pub mod drives;
pub mod jobs;
pub mod logits;
pub mod models;
pub mod pack;
pub mod run;
pub mod serve;
pub mod size;
pub mod speculate;
pub mod synth;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use longhaul_engine::memory::{self, MemorySettings};
use longhaul_engine::{DEFAULT_PINNED_FRACTION, PolicySetting, StreamingOptions};
use longhaul_engine::{Engine, EngineOptions, LoadProgress, PrefixCache, PrefixSettings};
use size::SizeOrAuto;

/// The prefix cache's folder in a data dir, unless another is given.
pub const PREFIX_DIR: &str = "prefix";

/// Where the service keeps its data (for the service itself).
#[derive(clap::Args)]
pub struct DataDir {
    /// The service's data folder: queue database, token (default: the user's data dir, `longhaul`).
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
}

impl DataDir {
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }
}

/// Where the service keeps its data, and how to reach it (for its clients).
#[derive(clap::Args)]
pub struct DataDirArgs {
    #[command(flatten)]
    pub dir: DataDir,
    /// The service's URL (default: the one the running service wrote to the data dir).
    #[arg(long, global = true)]
    pub url: Option<String>,
}

impl DataDirArgs {
    pub fn data_dir(&self) -> PathBuf {
        self.dir.data_dir()
    }

    pub fn client(&self) -> anyhow::Result<longhaul_service::client::Client> {
        Ok(longhaul_service::client::Client::new(
            &self.data_dir(),
            self.url.as_deref(),
        )?)
    }
}

/// The data dir when none is given, from this process's environment.
pub fn default_data_dir() -> PathBuf {
    longhaul_service::client::default_data_dir(
        std::env::var_os("XDG_DATA_HOME"),
        std::env::var_os("HOME"),
    )
}

/// Positions of attention cache a memory plan leaves room for when the
/// command cannot know the context in advance (a served job, a run).
pub const PLANNED_CONTEXT_TOKENS: u64 = 8192;

/// How much memory a model may use: shared by every command that holds one.
#[derive(clap::Args, Clone)]
pub struct MemoryArgs {
    /// RAM for routed experts when the model is a pack (e.g. 0, 512M, 4G), or
    /// `auto`: what the memory limit (--mem) leaves after everything else.
    #[arg(long, value_parser = size::parse_size_or_auto, default_value = "1G")]
    pub budget: SizeOrAuto,
    /// Total memory for the process: resident weights, attention cache, read
    /// buffers and cached experts (e.g. 2G), or `auto` (the cgroup's limit,
    /// else 75% of RAM). The expert budget is derived from it unless --budget
    /// gives one, which is then checked to fit.
    #[arg(long, value_parser = size::parse_size_or_auto)]
    pub mem: Option<SizeOrAuto>,
}

impl MemoryArgs {
    /// Sets the budget and the memory limit in `options` for a context of
    /// `context_tokens` positions.
    pub fn apply(&self, options: &mut EngineOptions, context_tokens: u64) -> anyhow::Result<()> {
        let (budget, memory) = self.resolve(context_tokens)?;
        options.streaming.budget_bytes = budget;
        options.memory = memory;
        Ok(())
    }

    /// The budget to start from and the memory settings, if any.
    pub fn resolve(&self, context_tokens: u64) -> anyhow::Result<(u64, Option<MemorySettings>)> {
        let limit = |m: SizeOrAuto| -> anyhow::Result<u64> {
            match m {
                SizeOrAuto::Bytes(b) => Ok(b),
                SizeOrAuto::Auto => memory::default_limit_bytes()
                    .context("cannot tell how much memory this machine has; give --mem SIZE"),
            }
        };
        Ok(match (self.budget, self.mem) {
            (SizeOrAuto::Bytes(b), None) => (b, None),
            (budget, mem) => {
                let given = matches!(budget, SizeOrAuto::Bytes(_));
                let settings = MemorySettings {
                    limit_bytes: limit(mem.unwrap_or(SizeOrAuto::Auto))?,
                    context_tokens,
                    budget_given: given,
                };
                let b = match budget {
                    SizeOrAuto::Bytes(b) => b,
                    SizeOrAuto::Auto => 0,
                };
                (b, Some(settings))
            }
        })
    }
}

/// A `--model` argument as a path: a folder, pack or GGUF file as given,
/// or a model found by name where users keep them (`ORG/NAME` in the
/// Hugging Face cache or LM Studio's folder, `NAME[:TAG]` in Ollama's). Says
/// on stderr where a name was found.
pub fn model_path(arg: &str) -> Result<PathBuf, String> {
    let found =
        longhaul_engine::tools::locate(arg, &longhaul_engine::tools::ModelPlaces::from_env())
            .map_err(|e| e.to_string())?;
    if let Some(place) = &found.found_in {
        eprintln!("{arg}: {} ({place})", found.path.display());
    }
    Ok(found.path)
}

/// How to find and hold a model: shared by every command that takes one.
#[derive(clap::Args)]
pub struct ModelArgs {
    /// The model: a Hugging Face checkpoint folder, a pack, or a GGUF file
    /// (the first part of a split one); or a name: ORG/NAME in the Hugging
    /// Face cache or LM Studio's models, NAME[:TAG] in Ollama's.
    #[arg(long, value_parser = model_path)]
    pub model: PathBuf,
    #[command(flatten)]
    pub memory: MemoryArgs,
    /// Skip checking each expert record's checksum after reading it.
    #[arg(long)]
    pub no_verify_checksums: bool,
    #[command(flatten)]
    pub cache: CacheArgs,
}

/// Where prompts' state is kept for later prompts that begin the same way.
#[derive(clap::Args, Clone)]
pub struct PrefixArgs {
    /// The folder the prefix cache keeps prompt state in, on a drive with
    /// room (default: `prefix` in the data dir). Jobs, API calls, turns of a
    /// conversation and later runs all read it.
    #[arg(long, value_name = "DIR")]
    pub prefix_cache: Option<PathBuf>,
    /// Most bytes the prefix cache's folder holds; the least recently used
    /// blocks go first.
    #[arg(long, value_parser = size::parse_size, default_value_t = longhaul_engine::DEFAULT_PREFIX_DISK_BYTES)]
    pub prefix_cache_size: u64,
    /// Most bytes of prompt state held in RAM as well (counted in --mem).
    #[arg(long, value_parser = size::parse_size, default_value_t = longhaul_engine::DEFAULT_PREFIX_RAM_BYTES)]
    pub prefix_cache_ram: u64,
    /// Keep no prompt state: every prompt is computed whole.
    #[arg(long, conflicts_with = "prefix_cache")]
    pub no_prefix_cache: bool,
}

impl PrefixArgs {
    /// The cache these arguments ask for, its folder `default_dir` unless
    /// one was given.
    pub fn open(&self, default_dir: &Path) -> anyhow::Result<Option<Arc<PrefixCache>>> {
        if self.no_prefix_cache {
            return Ok(None);
        }
        let settings = PrefixSettings {
            dir: Some(
                self.prefix_cache
                    .clone()
                    .unwrap_or_else(|| default_dir.to_path_buf()),
            ),
            ram_bytes: self.prefix_cache_ram,
            disk_bytes: self.prefix_cache_size,
        };
        Ok(Some(Arc::new(PrefixCache::open(&settings)?)))
    }
}

/// How the expert cache of a pack is run.
#[derive(clap::Args, Clone)]
pub struct CacheArgs {
    /// Eviction policy for experts that are not pinned: `auto` (replayed on
    /// the pack's own routing trace and chosen from lru, lfu, lfu-decay:H,
    /// slru:P and arc, over one pool or /layer), or one of those.
    #[arg(long, default_value = "auto", value_parser = parse_policy)]
    pub policy: PolicySetting,
    /// Share of the budget pinned to the hottest experts of earlier runs (0 to 1).
    #[arg(long, default_value_t = DEFAULT_PINNED_FRACTION)]
    pub pinned_fraction: f64,
    /// Hold cached experts as stored in the pack (BF16/F16: twice the experts
    /// per budget of f32; kernels compute from them as they are) or widened to f32.
    #[arg(long, default_value = "stored", value_parser = ["stored", "f32"])]
    pub cache_dtype: String,
    /// Do not read the experts predicted for the next layer ahead of time.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Hold cached experts as weights even when the budget cannot hold them
    /// all, instead of keeping compressed records packed and restoring each hit.
    #[arg(long)]
    pub no_packed_cache: bool,
}

impl CacheArgs {
    pub fn apply(&self, options: &mut StreamingOptions) {
        options.policy = self.policy;
        options.pinned_fraction = self.pinned_fraction;
        options.keep_stored_dtype = self.cache_dtype == "stored";
        options.prefetch = !self.no_prefetch;
        options.pack_cache = !self.no_packed_cache;
    }
}

fn parse_policy(text: &str) -> Result<PolicySetting, String> {
    text.parse()
}

impl ModelArgs {
    pub fn open(&self) -> anyhow::Result<Engine> {
        self.open_with(|_| {})
    }

    fn options(&self) -> anyhow::Result<EngineOptions> {
        let mut options = EngineOptions::default();
        self.memory.apply(&mut options, PLANNED_CONTEXT_TOKENS)?;
        options.streaming.verify_checksums = !self.no_verify_checksums;
        self.cache.apply(&mut options.streaming);
        Ok(options)
    }

    /// Opens another model with the same budget and cache settings.
    pub fn open_with_path(&self, path: &Path) -> anyhow::Result<Engine> {
        open_model(path, &self.options()?)
    }

    /// Opens the model after `adjust` has had a say in the options.
    pub fn open_with(&self, adjust: impl FnOnce(&mut EngineOptions)) -> anyhow::Result<Engine> {
        let mut options = self.options()?;
        adjust(&mut options);
        open_model(&self.model, &options)
    }
}

/// Opens a model, saying on stderr what is being loaded and how long it took.
pub fn open_model(path: &Path, options: &EngineOptions) -> anyhow::Result<Engine> {
    eprintln!("loading {} …", path.display());
    let started = Instant::now();
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let engine = Engine::open_with(path, options, &|p: LoadProgress| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.loaded_bytes);
    });
    bar.finish_and_clear();
    let engine = engine.with_context(|| format!("cannot load the model at {}", path.display()))?;
    let info = engine.info();
    eprintln!(
        "loaded {} ({} layers, vocabulary {}) in {:.2} s",
        info.model_type,
        info.layers,
        info.vocab_size,
        started.elapsed().as_secs_f64()
    );
    if let Some(plan) = engine.memory_plan() {
        eprintln!("{plan}");
    }
    Ok(engine)
}
