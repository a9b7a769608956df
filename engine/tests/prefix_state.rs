//! What a prefix cache rests on: the state after a prompt's first blocks,
//! saved and restored into a fresh session, then the rest of the prompt fed,
//! gives bitwise the logits of feeding the whole prompt — for every kind of
//! state (attention rows, linear attention's running state, indexer keys,
//! compressed entries and their open windows).

mod common;

use longhaul_engine::Engine;

/// Blocks a cached prefix is kept in: the engine's prompt chunk.
const BLOCK: usize = longhaul_engine::PROMPT_CHUNK;

#[test]
fn a_restored_prefix_continues_bitwise_as_the_whole_prompt() {
    for name in [
        "qwen3_moe_released",
        "minimax_m2_released",
        "kimi_linear_released",
        "qwen3_next_released",
        "glm_moe_dsa_released",
        "deepseek_v32_recent",
        "deepseek_v4_recent",
        // A sliding window on its last layers.
        "dots1_recent",
        "hunyuan_v1_moe_released",
        "ernie4_5_moe_released",
        // Chunked layers and a temperature by absolute position.
        "llama4_recent",
        // Each layer type with its own rope and head count.
        "step3p7_saved",
        "bailing_hybrid_released",
        "longcat_flash_recent",
        // k-pool index keys and gate rows beside KDA state.
        "glm5_next_saved",
    ] {
        let dir = common::fixtures_dir().join(name);
        let engine = Engine::open(&dir).unwrap();
        let vocab = engine.vocab_size() as u32;
        // Two whole blocks and a ragged end, from a spread of token ids.
        let prompt: Vec<u32> = (0..2 * BLOCK as u32 + 37)
            .map(|i| (i * 7919 + 13) % vocab)
            .collect();
        let mut whole = engine.session();
        let mut expected = Vec::new();
        for chunk in prompt.chunks(BLOCK) {
            expected = whole.feed(chunk).unwrap();
        }
        for cached in [BLOCK, 2 * BLOCK] {
            // The prefix as a cache would hold it: block by block.
            let mut source = engine.session();
            let mut blocks = Vec::new();
            for chunk in prompt[..cached].chunks(BLOCK) {
                let start = source.len();
                source.feed(chunk).unwrap();
                blocks.push(source.snapshot_since(start).unwrap());
            }
            let mut resumed = engine.session();
            for bytes in &blocks {
                let at = resumed.len();
                assert_eq!(
                    resumed.restore(bytes, &prompt[at..]).unwrap(),
                    BLOCK,
                    "{name}"
                );
            }
            let mut logits = Vec::new();
            for chunk in prompt[cached..].chunks(BLOCK) {
                logits = resumed.feed(chunk).unwrap();
            }
            assert_eq!(resumed.ids(), &prompt[..], "{name}");
            let same = logits
                .iter()
                .zip(&expected)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same && logits.len() == expected.len(),
                "{name}: {cached} cached tokens changed the logits"
            );
        }
    }
}
