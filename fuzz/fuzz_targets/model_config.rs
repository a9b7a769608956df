//! Any text as config.json: parsing must give a spec or an error, never a
//! panic; a parsed spec's rope tables must be computable.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_engine::model::{Architecture, ModelSpec, RawConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(raw) = RawConfig::parse(Path::new("config.json"), text) else {
        return;
    };
    if let Ok(spec) = ModelSpec::parse(&raw) {
        let (rope, dim) = match &spec.architecture {
            Architecture::Qwen3Moe(c) => (&c.rope, c.head_dim),
            Architecture::Mixtral(c) => (&c.rope, c.head_dim),
            Architecture::DeepseekV3(c) => (&c.rope, c.qk_rope_head_dim),
        };
        let _ = rope.frequencies(dim.min(4096));
    }
});
