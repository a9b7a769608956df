//! Any text as a model folder's chat template, rendering a short
//! conversation: a prompt or an error (fuel, syntax, a raised exception),
//! never a panic and never memory past what the fuel allows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_engine::tokenizer::{ChatMessage, ChatTemplate};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let messages = [
        ChatMessage::new("system", "You audit code."),
        ChatMessage::new("user", "Look at main.rs"),
        ChatMessage::new("assistant", "It is fine."),
    ];
    let _ = ChatTemplate::new(text).render(&messages, &Default::default(), None, None);
});
