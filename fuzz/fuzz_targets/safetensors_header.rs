//! Any byte string as the start of a safetensors file: parsing must either
//! succeed with offsets inside the data section or fail with an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_engine::weights::safetensors::{MAX_HEADER_BYTES, parse_header};

fuzz_target!(|data: &[u8]| {
    let Some((prefix, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let n = u64::from_le_bytes(*prefix);
    if n > MAX_HEADER_BYTES || n > rest.len() as u64 {
        return;
    }
    let (header, body) = rest.split_at(n as usize);
    if let Ok(tensors) = parse_header(header, body.len() as u64) {
        for t in tensors.values() {
            assert!(t.offset + t.len <= body.len() as u64);
        }
    }
});
