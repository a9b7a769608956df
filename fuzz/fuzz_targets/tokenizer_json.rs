//! Any bytes as a model folder's tokenizer.json: a tokenizer or an error
//! naming the file, and a tokenizer encodes a text or refuses it with a
//! typed error (a pattern that gives up included), never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_engine::tokenizer::TextTokenizer;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let origin = Path::new("model");
    let Ok(tokenizer) = TextTokenizer::from_parts(origin, data, &Value::Null, None) else {
        return;
    };
    let _ = tokenizer.encode("Audit the storage layer <|im_end|> aaaa", true);
});
