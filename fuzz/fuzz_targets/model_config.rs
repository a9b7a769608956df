//! Any text as config.json: parsing must give a spec or an error, never a
//! panic; a parsed spec's state layout must be computable.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_engine::model::{ModelSpec, RawConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(raw) = RawConfig::parse(Path::new("config.json"), text) else {
        return;
    };
    if let Ok(spec) = ModelSpec::parse(&raw) {
        let _ = spec.state_bytes();
        let _ = spec.decoder_names();
    }
});
