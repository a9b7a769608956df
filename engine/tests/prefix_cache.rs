//! The prefix cache: a prompt that begins as an earlier one did takes that
//! beginning's state from RAM or the cache's folder, and what follows is
//! bitwise what computing the whole prompt gives — logits and sampled
//! tokens — for every kind of state; damaged blocks are refused and
//! recomputed; the folder stays within its limit.

mod common;

use std::path::Path;
use std::sync::Arc;

use longhaul_engine::prefix::{BLOCK, ModelKey};
use longhaul_engine::{
    Engine, EngineOptions, Flow, GenerationSettings, PrefixCache, PrefixSettings, SamplingParams,
    Session,
};

fn settings(dir: &Path, ram_bytes: u64, disk_bytes: u64) -> PrefixSettings {
    PrefixSettings {
        dir: Some(dir.to_path_buf()),
        ram_bytes,
        disk_bytes,
    }
}

/// Two whole blocks and a ragged end, from a spread of token ids.
fn prompt(vocab: u32, salt: u32) -> Vec<u32> {
    (0..2 * BLOCK as u32 + 37)
        .map(|i| (i * 7919 + 13 + salt) % vocab)
        .collect()
}

/// A fixture for each kind of state: attention rows, linear attention's
/// running state (Kimi-Linear, Qwen3-Next), indexer keys (DeepSeek-V3.2),
/// compressed entries and their open windows (DeepSeek-V4).
const STATE_KINDS: [&str; 5] = [
    "qwen3_moe_released",
    "kimi_linear_released",
    "qwen3_next_released",
    "deepseek_v32_recent",
    "deepseek_v4_recent",
];

/// Feeds `ids` a block per pass, keeping each block in `cache` as a
/// generation does; returns the logits after the last.
fn feed_keeping(
    session: &mut Session<'_>,
    ids: &[u32],
    cache: &PrefixCache,
    key: &ModelKey,
) -> Vec<f32> {
    let mut logits = Vec::new();
    for chunk in ids.chunks(BLOCK) {
        logits = session.feed(chunk).unwrap();
        cache.keep(key, session).unwrap();
    }
    logits
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_cached_prefix_read_back_after_a_restart_gives_the_whole_prompts_logits() {
    for name in STATE_KINDS {
        let engine = Engine::open(&common::fixtures_dir().join(name)).unwrap();
        let prompt = prompt(engine.vocab_size() as u32, 0);
        let key = ModelKey::new(name.as_bytes());
        let tmp = tempfile::tempdir().unwrap();
        let cache = PrefixCache::open(&settings(tmp.path(), 1 << 30, 1 << 30)).unwrap();
        let mut whole = engine.session();
        let expected = feed_keeping(&mut whole, &prompt, &cache, &key);
        assert_eq!(
            cache.stats().disk_blocks,
            2,
            "{name}: the two whole blocks are kept"
        );
        drop(cache);

        // A new process: only the folder remains.
        let cache = PrefixCache::open(&settings(tmp.path(), 1 << 30, 1 << 30)).unwrap();
        let mut resumed = engine.session();
        let restored = cache.restore(&key, &mut resumed, &prompt);
        assert_eq!(restored.positions, 2 * BLOCK, "{name}: {restored:?}");
        let mut logits = Vec::new();
        for chunk in prompt[resumed.len()..].chunks(BLOCK) {
            logits = resumed.feed(chunk).unwrap();
        }
        assert_eq!(resumed.ids(), &prompt[..], "{name}");
        assert_eq!(
            bits(&logits),
            bits(&expected),
            "{name}: the cached prefix changed the logits"
        );
        let stats = cache.stats();
        assert_eq!(
            (stats.lookups, stats.hits, stats.reused_tokens),
            (1, 1, 2 * BLOCK as u64)
        );
        assert!(
            stats.read_disk_bytes > 0 && stats.read_ram_bytes == 0,
            "{stats:?}"
        );

        // Another model's key reads nothing.
        let mut other = engine.session();
        let none = cache.restore(&ModelKey::new(b"another model"), &mut other, &prompt);
        assert_eq!((none.positions, other.len()), (0, 0), "{name}");
    }
}

/// An agent's next turn: the first turn's prompt, its answer, then more.
/// It restores the blocks and the tail where the answer ended, feeds the
/// rest in a pass that does not start on a block's end, and the logits are
/// bitwise the whole conversation's.
#[test]
fn a_next_turn_goes_on_from_where_the_last_one_ended_bitwise() {
    for name in STATE_KINDS {
        let engine = Engine::open(&common::fixtures_dir().join(name)).unwrap();
        let vocab = engine.vocab_size() as u32;
        let conversation = prompt(vocab, 5);
        // The first turn ended 21 positions past the first block.
        let first_end = BLOCK + 21;
        let key = ModelKey::new(name.as_bytes());
        let tmp = tempfile::tempdir().unwrap();
        let cache = PrefixCache::open(&settings(tmp.path(), 0, 1 << 30)).unwrap();
        let mut turn = engine.session();
        feed_keeping(&mut turn, &conversation[..first_end], &cache, &key);
        cache.keep_tail(&key, &turn).unwrap();
        assert_eq!(cache.stats().disk_blocks, 2, "{name}: a block and a tail");

        let mut whole = engine.session();
        let mut expected = Vec::new();
        for chunk in conversation.chunks(BLOCK) {
            expected = whole.feed(chunk).unwrap();
        }
        let mut next = engine.session();
        let restored = cache.restore(&key, &mut next, &conversation);
        assert_eq!(restored.positions, first_end, "{name}: {restored:?}");
        let mut logits = Vec::new();
        let mut at = next.len();
        while at < conversation.len() {
            let end = ((at / BLOCK + 1) * BLOCK).min(conversation.len());
            logits = next.feed(&conversation[at..end]).unwrap();
            at = end;
        }
        assert_eq!(
            bits(&logits),
            bits(&expected),
            "{name}: the restored tail changed the logits"
        );
    }
}

#[test]
fn a_prompt_one_token_past_a_block_reuses_it_and_one_ending_on_it_leaves_the_last_token() {
    let engine = Engine::open(&common::fixtures_dir().join("qwen3_moe_released")).unwrap();
    let long = prompt(engine.vocab_size() as u32, 1);
    let key = ModelKey::new(b"m");
    let tmp = tempfile::tempdir().unwrap();
    let cache = PrefixCache::open(&settings(tmp.path(), 1 << 30, 1 << 30)).unwrap();
    let mut s = engine.session();
    s.feed(&long[..2 * BLOCK]).unwrap();
    // Fed in one pass of two blocks: only a block's end is kept.
    cache.keep(&key, &s).unwrap();
    assert_eq!(cache.stats().disk_blocks, 1);
    let mut a = engine.session();
    assert_eq!(cache.restore(&key, &mut a, &long[..2 * BLOCK]).positions, 0);
    let mut b = engine.session();
    assert_eq!(
        cache
            .restore(&key, &mut b, &long[..2 * BLOCK + 1])
            .positions,
        0
    );
    let mut first = engine.session();
    first.feed(&long[..BLOCK]).unwrap();
    cache.keep(&key, &first).unwrap();
    let mut c = engine.session();
    // The first block is there now, and with it the chain to the second.
    assert_eq!(
        cache
            .restore(&key, &mut c, &long[..2 * BLOCK + 1])
            .positions,
        2 * BLOCK
    );
    let mut d = engine.session();
    assert_eq!(
        cache.restore(&key, &mut d, &long[..2 * BLOCK]).positions,
        BLOCK
    );
}

#[test]
fn a_damaged_block_is_refused_removed_and_computed_again() {
    let engine = Engine::open(&common::fixtures_dir().join("qwen3_moe_released")).unwrap();
    let prompt = prompt(engine.vocab_size() as u32, 2);
    let key = ModelKey::new(b"m");
    let tmp = tempfile::tempdir().unwrap();
    let cache = PrefixCache::open(&settings(tmp.path(), 0, 1 << 30)).unwrap();
    let mut s = engine.session();
    feed_keeping(&mut s, &prompt, &cache, &key);
    // Flip one byte of the second block's state.
    let mut files: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    let second = files[1].clone();
    let mut bytes = std::fs::read(&second).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x40;
    std::fs::write(&second, bytes).unwrap();

    let mut r = engine.session();
    let restored = cache.restore(&key, &mut r, &prompt);
    assert_eq!(restored.positions, BLOCK, "the first block still serves");
    let reason = restored.refused.unwrap();
    assert!(reason.contains("checksum"), "{reason}");
    assert!(!second.exists(), "the damaged block is removed");
    assert_eq!(cache.stats().refused, 1);
    assert_eq!(r.len(), BLOCK);
}

#[test]
fn the_folder_keeps_within_its_limit_dropping_the_least_recently_used() {
    let engine = Engine::open(&common::fixtures_dir().join("qwen3_moe_released")).unwrap();
    let vocab = engine.vocab_size() as u32;
    let key = ModelKey::new(b"m");
    let tmp = tempfile::tempdir().unwrap();
    // Measure one block's file, then allow three.
    let probe = PrefixCache::open(&settings(&tmp.path().join("probe"), 0, 1 << 30)).unwrap();
    let mut s = engine.session();
    s.feed(&prompt(vocab, 9)[..BLOCK]).unwrap();
    probe.keep(&key, &s).unwrap();
    let one = probe.stats().disk_bytes;
    let limit = 3 * one + one / 2;
    let cache = PrefixCache::open(&settings(&tmp.path().join("c"), 0, limit)).unwrap();
    let prompts: Vec<Vec<u32>> = (10..13).map(|salt| prompt(vocab, salt)).collect();
    for p in &prompts {
        let mut s = engine.session();
        feed_keeping(&mut s, p, &cache, &key);
        // mtimes order the blocks: keep them apart.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let stats = cache.stats();
    assert!(stats.disk_bytes <= limit, "{stats:?} over {limit}");
    assert_eq!(stats.disk_blocks, 3);
    // The newest prompt is whole; the oldest lost its blocks.
    let mut newest = engine.session();
    assert_eq!(
        cache.restore(&key, &mut newest, &prompts[2]).positions,
        2 * BLOCK
    );
    let mut oldest = engine.session();
    assert_eq!(cache.restore(&key, &mut oldest, &prompts[0]).positions, 0);
}

/// Sampled generation through the engine: the second run reads the prefix
/// from the cache and chooses the same tokens, streamed from a pack too.
#[test]
fn an_engine_with_a_cache_answers_a_repeated_prompt_with_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = common::fixtures_dir().join("qwen3_moe_released");
    let pack = common::pack_on_two_drives(&fixture, tmp.path());
    for model in [fixture, pack] {
        let cache = Arc::new(
            PrefixCache::open(&settings(&tmp.path().join("prefix"), 1 << 30, 1 << 30)).unwrap(),
        );
        let options = EngineOptions {
            prefix: Some(Arc::clone(&cache)),
            ..EngineOptions::default()
        };
        let engine = Engine::open_with(&model, &options, &|_| {}).unwrap();
        let prompt = prompt(engine.vocab_size() as u32, 3);
        let settings = GenerationSettings {
            max_tokens: 12,
            sampling: SamplingParams {
                temperature: 0.9,
                top_k: None,
                top_p: 1.0,
                seed: 7,
                ..Default::default()
            },
            stop_strings: Vec::new(),
            eos_token_ids: Vec::new(),
            speculation: longhaul_engine::Speculation::Off,
            output: Default::default(),
            keep_special_tokens: false,
            answer_starts: Vec::new(),
        };
        let uncached = Engine::open(&model)
            .unwrap()
            .generate_resumed(&prompt, &[], &[], &settings, |_| Flow::Continue)
            .unwrap();
        let first = engine
            .generate_resumed(&prompt, &[], &[], &settings, |_| Flow::Continue)
            .unwrap();
        let second = engine
            .generate_resumed(&prompt, &[], &[], &settings, |_| Flow::Continue)
            .unwrap();
        assert_eq!(first.stats.prefix_positions, 0);
        assert_eq!(
            second.stats.prefix_positions,
            2 * BLOCK,
            "{:?}",
            second.stats
        );
        assert!(second.stats.prefix_bytes > 0);
        assert_eq!(first.tokens, uncached.tokens, "{}", model.display());
        assert_eq!(second.tokens, uncached.tokens, "{}", model.display());
        let stats = engine.prefix_stats().unwrap();
        assert_eq!((stats.lookups, stats.hits), (2, 1));

        // The next turn: this prompt, the answer as fed, and more. It goes
        // on from where the answer ended, and samples what a cold engine
        // samples.
        let fed = &second.tokens[..second.tokens.len() - 1];
        let mut next: Vec<u32> = prompt.iter().chain(fed).copied().collect();
        next.extend((0..40).map(|i| (i * 31 + 5) % engine.vocab_size() as u32));
        let cold = Engine::open(&model)
            .unwrap()
            .generate_resumed(&next, &[], &[], &settings, |_| Flow::Continue)
            .unwrap();
        let warm = engine
            .generate_resumed(&next, &[], &[], &settings, |_| Flow::Continue)
            .unwrap();
        assert_eq!(warm.stats.prefix_positions, prompt.len() + fed.len());
        assert_eq!(warm.tokens, cold.tokens, "{}", model.display());
    }
}
