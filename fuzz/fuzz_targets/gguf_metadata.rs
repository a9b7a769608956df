//! A real GGUF file (the Qwen3-MoE fixture) with metadata values replaced
//! by fuzz bytes, read the whole way to a model spec: the GGUF metadata →
//! config.json → spec path gives a spec or an error naming the key, never
//! a panic or an allocation the file cannot back. The input is a list of
//! (key choice, value width, value bytes) records.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use longhaul_engine::import::ModelSource;
use longhaul_engine::weights::gguf::{GgufFile, GgufValue};

/// The seed file and, for each scalar metadata value, where it sits and
/// how wide it is.
struct Seed {
    bytes: Vec<u8>,
    scalars: Vec<(usize, usize)>,
}

fn seed() -> &'static Seed {
    static SEED: OnceLock<Seed> = OnceLock::new();
    SEED.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../engine/tests/fixtures/gguf/qwen3moe-f16.gguf");
        let bytes = std::fs::read(&path).expect("the GGUF fixture");
        let file = GgufFile::open(&path).expect("the GGUF fixture parses");
        let scalars = file
            .metadata
            .iter()
            .filter_map(|(key, value)| {
                let width = match value {
                    GgufValue::U32(_) | GgufValue::I32(_) | GgufValue::F32(_) => 4,
                    GgufValue::U64(_) | GgufValue::I64(_) | GgufValue::F64(_) => 8,
                    _ => return None,
                };
                // A key is followed by its u32 type tag, then the value.
                let at = bytes
                    .windows(key.len())
                    .position(|w| w == key.as_bytes())?
                    + key.len()
                    + 4;
                Some((at, width))
            })
            .collect();
        Seed { bytes, scalars }
    })
}

fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| std::env::temp_dir().join(format!("longhaul-fuzz-{}.gguf", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    let seed = seed();
    let mut bytes = seed.bytes.clone();
    for record in data.chunks_exact(9) {
        let (at, width) = seed.scalars[usize::from(record[0]) % seed.scalars.len()];
        bytes[at..at + width].copy_from_slice(&record[1..1 + width]);
    }
    if std::fs::write(scratch(), &bytes).is_err() {
        return;
    }
    let Ok(source) = ModelSource::open(scratch()) else {
        return;
    };
    if let Ok(spec) = source.spec() {
        let _ = spec.state_bytes();
        let _ = spec.decoder_names();
    }
});
