//! Any conversation through the demo model's chat template: rendered text or
//! an error, never a panic. Bytes split at 0xFF into role, content, role, …
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use longhaul_engine::tokenizer::{ChatMessage, TextTokenizer};

fn tokenizer() -> &'static TextTokenizer {
    static T: OnceLock<TextTokenizer> = OnceLock::new();
    T.get_or_init(|| {
        TextTokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/longhaul-demo-moe"))
            .expect("the demo model's tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let parts: Vec<String> = data
        .split(|&b| b == 0xFF)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let messages: Vec<ChatMessage> = parts
        .chunks(2)
        .map(|c| ChatMessage::new(c[0].clone(), c.get(1).cloned().unwrap_or_default()))
        .collect();
    if let Ok(text) = tokenizer().render_chat(&messages, true) {
        let _ = tokenizer().encode(&text, false);
    }
});
