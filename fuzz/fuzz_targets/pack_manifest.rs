//! Any text as a pack manifest: a manifest or an error naming the file,
//! never a panic or an allocation sized by the input.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_engine::pack::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Manifest::parse(Path::new("longhaul-pack.json"), text);
    }
});
