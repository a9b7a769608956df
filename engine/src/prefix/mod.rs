//! A prefix cache: the model's state after each whole block of a prompt,
//! kept in RAM and in a folder on a drive, so a prompt that begins as an
//! earlier one did (an agent's next turn resends the whole conversation)
//! computes only what is new. At the tens of prompt tokens per second a
//! streamed frontier model reads, turn two of a 26,000-token session
//! otherwise waits as long as turn one.
//!
//! A block is [`BLOCK`] positions, the prompt chunk: the prompt is fed in
//! the same passes whether a prefix was restored or not. Each block's key
//! chains the previous one's with the block's token ids, starting from the
//! model's identity, so a key names the whole prefix up to the block's end
//! (sha-256: a prompt cannot be made to read another's state). A block
//! holds the state from its first position (attention rows, indexer keys,
//! compressed entries) plus every recurrent state as it stands at its end,
//! and is applied on the state of the blocks before it. Where a prompt or
//! an answer ends mid-block, a tail is kept too: the state from the last
//! kept block's end to there, found by that block's key and the tail's
//! length. An agent's next turn is the last turn's prompt, its answer and a
//! tool's result, so it restores the blocks and the tail and computes only
//! what was added (without tails it would recompute up to 511 positions
//! more: on a streamed frontier model, many seconds). The kernels are
//! batch-invariant, so the logits after a restored prefix are bitwise those
//! of computing it whole, whatever pass the rest is fed in.

mod disk;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::generate::{PROMPT_CHUNK, Session};
use crate::model::ModelError;

/// Positions per cached block: the prompt chunk, so restoring a prefix
/// leaves the rest of the prompt fed in the passes it would have had.
pub const BLOCK: usize = PROMPT_CHUNK;

/// Default bytes of blocks kept in RAM.
pub const DEFAULT_RAM_BYTES: u64 = 256 << 20;
/// Default bytes of blocks kept in the folder.
pub const DEFAULT_DISK_BYTES: u64 = 32 << 30;

/// Where and how much to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixSettings {
    /// The folder blocks are kept in across runs (none: RAM only).
    pub dir: Option<PathBuf>,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    #[error("prefix cache {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "prefix cache block {path} is damaged ({reason}); it was removed and will be computed again"
    )]
    Corrupt { path: PathBuf, reason: String },
}

/// What a prefix up to a block's end is addressed by.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct BlockKey([u8; 32]);

impl BlockKey {
    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }
}

/// Where an entry is found: a whole block by its key; a tail (the state
/// from a block's end to wherever a prompt or an answer ended) also by
/// the key of the block it follows and its length, so that the tails
/// after a block can be listed without knowing their tokens.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Address {
    pub key: BlockKey,
    pub tail: Option<(BlockKey, usize)>,
}

/// A model's identity as the cache sees it: what its state depends on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ModelKey([u8; 32]);

impl ModelKey {
    /// From bytes that identify the model's weights and configuration; the
    /// engine's version is part of it, so state computed by other kernels is
    /// never reused.
    pub fn new(identity: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(b"longhaul prefix cache\0");
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        h.update((BLOCK as u64).to_le_bytes());
        h.update(identity);
        Self(h.finalize().into())
    }

    /// The key of each whole block of `ids`, in order.
    pub fn block_keys(&self, ids: &[u32]) -> Vec<BlockKey> {
        let mut previous = self.root();
        ids.chunks_exact(BLOCK)
            .map(|block| {
                previous = chain(&previous, block);
                previous
            })
            .collect()
    }

    /// What the first block follows.
    fn root(&self) -> BlockKey {
        BlockKey(self.0)
    }
}

/// The key of `ids` following the prefix keyed `previous`.
fn chain(previous: &BlockKey, ids: &[u32]) -> BlockKey {
    let mut h = Sha256::new();
    h.update(previous.0);
    h.update((ids.len() as u64).to_le_bytes());
    for id in ids {
        h.update(id.to_le_bytes());
    }
    BlockKey(h.finalize().into())
}

/// The cache's counters and contents, read now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ts_rs::TS)]
pub struct PrefixStats {
    /// Prompts looked up.
    pub lookups: u64,
    /// Prompts that reused at least one block.
    pub hits: u64,
    /// Prompt positions taken from the cache rather than computed.
    pub reused_tokens: u64,
    pub read_ram_bytes: u64,
    pub read_disk_bytes: u64,
    pub written_bytes: u64,
    /// Blocks refused on read (damaged, or not fitting the model).
    pub refused: u64,
    /// Blocks and tails held in RAM, and their bytes.
    pub ram_blocks: u64,
    pub ram_bytes: u64,
    /// Blocks and tails held in the folder, and their bytes.
    pub disk_blocks: u64,
    pub disk_bytes: u64,
}

impl PrefixStats {
    /// Share of lookups that reused something.
    pub fn hit_rate(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            self.hits as f64 / self.lookups as f64
        }
    }
}

/// An entry as read: its first and end position, and the state's bytes.
type Held = (usize, usize, Arc<Vec<u8>>);

struct RamBlock {
    start: usize,
    end: usize,
    bytes: Arc<Vec<u8>>,
    used: u64,
}

#[derive(Default)]
struct Ram {
    blocks: HashMap<BlockKey, RamBlock>,
    bytes: u64,
    clock: u64,
}

impl Ram {
    fn get(&mut self, key: &BlockKey) -> Option<Held> {
        self.clock += 1;
        let now = self.clock;
        self.blocks.get_mut(key).map(|b| {
            b.used = now;
            (b.start, b.end, Arc::clone(&b.bytes))
        })
    }

    fn put(&mut self, key: BlockKey, start: usize, end: usize, bytes: Arc<Vec<u8>>, limit: u64) {
        let size = bytes.len() as u64;
        if size > limit || self.blocks.contains_key(&key) {
            return;
        }
        while self.bytes + size > limit {
            let Some(oldest) = self
                .blocks
                .iter()
                .min_by_key(|(_, b)| b.used)
                .map(|(k, _)| *k)
            else {
                break;
            };
            if let Some(b) = self.blocks.remove(&oldest) {
                self.bytes -= b.bytes.len() as u64;
            }
        }
        self.clock += 1;
        self.bytes += size;
        let used = self.clock;
        self.blocks.insert(
            key,
            RamBlock {
                start,
                end,
                bytes,
                used,
            },
        );
    }
}

struct Inner {
    ram: Ram,
    folder: Option<disk::Folder>,
    /// Lengths of the tails kept after each block, longest first to try;
    /// an entry whose tail is gone from both tiers is dropped when missed.
    tails: HashMap<BlockKey, BTreeSet<usize>>,
    stats: PrefixStats,
}

/// Blocks of prompt state, shared by every job, turn and model loaded in
/// this process (keys hold the model's identity), and by every process
/// using the same folder.
pub struct PrefixCache {
    ram_limit: u64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixCache")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Blocks restored into a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub positions: usize,
    pub bytes: u64,
    /// Why a cached block was not used, when one was not.
    pub refused: Option<String>,
}

impl PrefixCache {
    pub fn open(settings: &PrefixSettings) -> Result<Self, PrefixError> {
        let folder = match &settings.dir {
            Some(dir) => Some(disk::Folder::open(dir, settings.disk_bytes)?),
            None => None,
        };
        let mut tails: HashMap<BlockKey, BTreeSet<usize>> = HashMap::new();
        for a in folder.iter().flat_map(|f| f.tails()) {
            if let Some((parent, len)) = a.tail {
                tails.entry(parent).or_default().insert(len);
            }
        }
        Ok(Self {
            ram_limit: settings.ram_bytes,
            inner: Mutex::new(Inner {
                ram: Ram::default(),
                folder,
                tails,
                stats: PrefixStats::default(),
            }),
        })
    }

    /// Bytes of blocks kept in RAM at most.
    pub fn ram_limit(&self) -> u64 {
        self.ram_limit
    }

    /// The folder blocks are kept in, if any.
    pub fn dir(&self) -> Option<PathBuf> {
        self.lock().folder.as_ref().map(|f| f.dir().to_path_buf())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The counters and maps stay consistent at every await-free step, so
        // a panic elsewhere does not poison what they mean.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stats(&self) -> PrefixStats {
        let inner = self.lock();
        let mut s = inner.stats;
        s.ram_blocks = inner.ram.blocks.len() as u64;
        s.ram_bytes = inner.ram.bytes;
        if let Some(f) = &inner.folder {
            s.disk_blocks = f.len() as u64;
            s.disk_bytes = f.bytes();
        }
        s
    }

    /// The block under `key` (RAM first, then the folder, from which it is
    /// kept in RAM too), with the positions it covers.
    fn get(&self, a: &Address) -> Result<Option<Held>, PrefixError> {
        let key = &a.key;
        let mut inner = self.lock();
        if let Some(hit) = inner.ram.get(key) {
            inner.stats.read_ram_bytes += hit.2.len() as u64;
            return Ok(Some(hit));
        }
        let Some(folder) = inner.folder.as_mut() else {
            return Ok(None);
        };
        let Some(block) = folder.read(a)? else {
            return Ok(None);
        };
        let bytes = Arc::new(block.bytes);
        inner.stats.read_disk_bytes += bytes.len() as u64;
        let limit = self.ram_limit;
        inner
            .ram
            .put(*key, block.start, block.end, Arc::clone(&bytes), limit);
        Ok(Some((block.start, block.end, bytes)))
    }

    fn contains(&self, a: &Address) -> bool {
        let inner = self.lock();
        inner.ram.blocks.contains_key(&a.key)
            || inner.folder.as_ref().is_some_and(|f| f.contains(a))
    }

    fn put(&self, a: Address, start: usize, end: usize, bytes: Vec<u8>) {
        let mut inner = self.lock();
        if let Some(folder) = inner.folder.as_mut() {
            match folder.write(&a, start, end, &bytes) {
                Ok(n) => inner.stats.written_bytes += n,
                Err(e) => tracing::warn!("{e}"),
            }
        }
        if let Some((parent, len)) = a.tail {
            inner.tails.entry(parent).or_default().insert(len);
        }
        let limit = self.ram_limit;
        inner.ram.put(a.key, start, end, Arc::new(bytes), limit);
    }

    /// Restores into an empty `session` the longest run of cached blocks
    /// from the start of `prompt`, then the longest tail kept after the
    /// last of them, leaving at least the prompt's last token to be fed
    /// (its logits choose the answer's first token). An entry that cannot
    /// be read or does not fit ends the run: what follows is computed, and
    /// the reason is returned.
    pub fn restore(&self, model: &ModelKey, session: &mut Session<'_>, prompt: &[u32]) -> Restored {
        let usable = prompt.len().saturating_sub(1);
        let keys = model.block_keys(&prompt[..usable]);
        let mut done = Restored::default();
        let mut parent = model.root();
        for key in &keys {
            let a = Address {
                key: *key,
                tail: None,
            };
            match self.apply(&a, session, prompt, BLOCK) {
                Ok(Some(bytes)) => {
                    parent = *key;
                    done.bytes += bytes;
                }
                Ok(None) => break,
                Err(reason) => {
                    done.refused = Some(reason);
                    break;
                }
            }
        }
        let at = session.len();
        if done.refused.is_none() {
            let lens: Vec<usize> = self
                .lock()
                .tails
                .get(&parent)
                .map(|l| {
                    l.iter()
                        .rev()
                        .copied()
                        .filter(|&n| at + n <= usable)
                        .collect()
                })
                .unwrap_or_default();
            for len in lens {
                let key = chain(&parent, &prompt[at..at + len]);
                let a = Address {
                    key,
                    tail: Some((parent, len)),
                };
                match self.apply(&a, session, prompt, len) {
                    Ok(Some(bytes)) => {
                        done.bytes += bytes;
                        break;
                    }
                    Ok(None) => continue,
                    Err(reason) => {
                        done.refused = Some(reason);
                        break;
                    }
                }
            }
        }
        done.positions = session.len();
        let mut inner = self.lock();
        inner.stats.lookups += 1;
        if done.positions > 0 {
            inner.stats.hits += 1;
        }
        if done.refused.is_some() {
            inner.stats.refused += 1;
        }
        inner.stats.reused_tokens += done.positions as u64;
        done
    }

    /// Applies the entry at `a`, which should hold `len` positions from the
    /// session's length: its bytes if it was there, or why it was refused.
    fn apply(
        &self,
        a: &Address,
        session: &mut Session<'_>,
        prompt: &[u32],
        len: usize,
    ) -> Result<Option<u64>, String> {
        let at = session.len();
        let (start, end, bytes) = match self.get(a) {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                self.forget_tail(a);
                return Ok(None);
            }
            Err(e) => return Err(e.to_string()),
        };
        if start != at || end != at + len {
            return Err(format!(
                "a cached entry covers positions {start}..{end}, expected {at}..{}",
                at + len
            ));
        }
        match session.restore(&bytes, &prompt[at..]) {
            Ok(n) if n == len => Ok(Some(bytes.len() as u64)),
            Ok(n) => {
                // Applied but short: cut back to what came before it.
                let _ = session.truncate(at);
                Err(format!("a cached entry held {n} positions, not {len}"))
            }
            Err(e) => Err(format!("a cached entry was refused: {e}")),
        }
    }

    fn forget_tail(&self, a: &Address) {
        if let Some((parent, len)) = a.tail {
            let mut inner = self.lock();
            if let Some(lens) = inner.tails.get_mut(&parent) {
                lens.remove(&len);
            }
        }
    }

    /// Keeps the block ending at `session`'s length, when that is a block's
    /// end and the block is not kept already.
    pub fn keep(&self, model: &ModelKey, session: &Session<'_>) -> Result<(), ModelError> {
        let end = session.len();
        if end == 0 || !end.is_multiple_of(BLOCK) || session.ids().len() != end {
            return Ok(());
        }
        let Some(&key) = model.block_keys(session.ids()).last() else {
            return Ok(());
        };
        let a = Address { key, tail: None };
        if self.contains(&a) {
            return Ok(());
        }
        let bytes = session.snapshot_since(end - BLOCK)?;
        self.put(a, end - BLOCK, end, bytes);
        Ok(())
    }

    /// Keeps the state from the end of the longest run of kept blocks to
    /// `session`'s length (where a prompt or an answer ended), so the next
    /// prompt that goes on from there computes only what it adds: an
    /// agent's next turn is this one's prompt and answer and a tool's result.
    pub fn keep_tail(&self, model: &ModelKey, session: &Session<'_>) -> Result<(), ModelError> {
        let ids = session.ids();
        let end = session.len();
        if ids.len() != end {
            return Ok(());
        }
        let mut parent = model.root();
        let mut from = 0;
        for key in model.block_keys(ids) {
            if !self.contains(&Address { key, tail: None }) {
                break;
            }
            parent = key;
            from += BLOCK;
        }
        let len = end - from;
        if len == 0 {
            return Ok(());
        }
        let key = chain(&parent, &ids[from..]);
        let a = Address {
            key,
            tail: Some((parent, len)),
        };
        if self.contains(&a) {
            return Ok(());
        }
        let bytes = session.snapshot_since(from)?;
        self.put(a, from, end, bytes);
        Ok(())
    }
}

/// A cache and the model whose blocks a generation reads and keeps.
#[derive(Clone, Copy)]
pub struct PrefixUse<'a> {
    pub cache: &'a PrefixCache,
    pub model: &'a ModelKey,
}
