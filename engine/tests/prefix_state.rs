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
    let fixtures = common::fixtures_with("prefix_state");
    assert!(fixtures.len() >= 15, "{fixtures:?}");
    for dir in fixtures {
        let name = common::name(&dir);
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
