//! Any byte string as a GGUF file: its metadata and tensor table, or an
//! error naming what is wrong, never a panic or an allocation sized by the
//! input.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_engine::weights::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::parse(Path::new("model.gguf"), data, data.len() as u64) {
        for t in &f.tensors {
            assert!(t.offset + t.len.unwrap_or(0) <= data.len() as u64);
        }
    }
});
