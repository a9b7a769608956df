//! The prefix cache's folder: one file per block, written whole under a
//! temporary name and renamed into place (a crash leaves the old file or
//! none, never half of one), each with a header naming its key and
//! positions and an xxh3-128 checksum of its bytes, checked on every read
//! like an expert record. Kept under a size limit by removing the least
//! recently used blocks; a read touches the file's modification time, so
//! the order survives restarts and is shared by every process using the
//! folder.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::{Address, BlockKey, PrefixError};

/// What a block file starts with: the format and its version.
const MAGIC: &[u8; 8] = b"LHPFX001";
/// Bytes of a block file's header: magic, key, first and end position,
/// payload length, payload checksum.
const HEADER: usize = 8 + 32 + 8 + 8 + 8 + 16;
/// Block files' name ending.
const EXTENSION: &str = "lhprefix";
/// A block being written, before it is renamed into place.
const PARTIAL: &str = "partial";

/// One block read back: the positions it covers and the state's bytes.
pub(super) struct DiskBlock {
    pub start: usize,
    pub end: usize,
    pub bytes: Vec<u8>,
}

struct Entry {
    address: Address,
    size: u64,
    used: SystemTime,
}

/// The folder and what is known to be in it.
pub(super) struct Folder {
    dir: PathBuf,
    limit: u64,
    entries: HashMap<BlockKey, Entry>,
    total: u64,
}

impl Folder {
    /// Opens (creating) `dir` and lists its blocks without reading them;
    /// blocks left half-written by a crash are removed.
    pub fn open(dir: &Path, limit: u64) -> Result<Self, PrefixError> {
        let io = |source| PrefixError::Io {
            path: dir.to_path_buf(),
            source,
        };
        crate::private::create_dir_all(dir).map_err(io)?;
        let mut folder = Self {
            dir: dir.to_path_buf(),
            limit,
            entries: HashMap::new(),
            total: 0,
        };
        for item in fs::read_dir(dir).map_err(io)? {
            let Ok(item) = item else { continue };
            let path = item.path();
            if path.extension().is_some_and(|e| e == PARTIAL) {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(address) = address_of(&path) else {
                continue;
            };
            if let Ok(meta) = item.metadata() {
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                folder.note(address, meta.len(), used);
            }
        }
        folder.evict(0);
        Ok(folder)
    }

    fn path(&self, a: &Address) -> PathBuf {
        let stem = match a.tail {
            None => a.key.hex(),
            Some((parent, len)) => format!("{}-{len}-{}", parent.hex(), a.key.hex()),
        };
        self.dir.join(format!("{stem}.{EXTENSION}"))
    }

    fn note(&mut self, address: Address, size: u64, used: SystemTime) {
        let entry = Entry {
            address,
            size,
            used,
        };
        if let Some(old) = self.entries.insert(address.key, entry) {
            self.total -= old.size;
        }
        self.total += size;
    }

    /// The tails the folder holds.
    pub fn tails(&self) -> impl Iterator<Item = Address> + '_ {
        self.entries
            .values()
            .map(|e| e.address)
            .filter(|a| a.tail.is_some())
    }

    fn forget(&mut self, key: &BlockKey) {
        if let Some(old) = self.entries.remove(key) {
            self.total -= old.size;
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, a: &Address) -> bool {
        self.entries.contains_key(&a.key) || self.path(a).is_file()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn bytes(&self) -> u64 {
        self.total
    }

    /// The block under `key`, checked whole; a block that fails its check
    /// is removed and reported, so it is computed again and rewritten.
    pub fn read(&mut self, a: &Address) -> Result<Option<DiskBlock>, PrefixError> {
        let key = &a.key;
        let path = self.path(a);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.forget(key);
                return Ok(None);
            }
            Err(source) => return Err(PrefixError::Io { path, source }),
        };
        let io = |source| PrefixError::Io {
            path: path.clone(),
            source,
        };
        let size = file.metadata().map_err(io)?.len();
        let block = read_block(&mut file, key, size).map_err(|e| match e {
            Bad::Io(source) => PrefixError::Io {
                path: path.clone(),
                source,
            },
            Bad::Corrupt(reason) => PrefixError::Corrupt {
                path: path.clone(),
                reason,
            },
        });
        match block {
            Ok(block) => {
                let now = SystemTime::now();
                // The order of use is the file's time: a failure to set it
                // only makes the block look older.
                let _ = file.set_modified(now);
                self.note(*a, size, now);
                Ok(Some(block))
            }
            Err(e) => {
                if matches!(e, PrefixError::Corrupt { .. }) {
                    let _ = fs::remove_file(&path);
                    self.forget(key);
                }
                Err(e)
            }
        }
    }

    /// Writes a block, then removes the least recently used ones until the
    /// folder is within its limit. A block larger than the limit is not
    /// kept. Returns the bytes written.
    pub fn write(
        &mut self,
        a: &Address,
        start: usize,
        end: usize,
        bytes: &[u8],
    ) -> Result<u64, PrefixError> {
        let key = &a.key;
        let size = (HEADER + bytes.len()) as u64;
        if size > self.limit {
            return Ok(0);
        }
        self.evict(size);
        let path = self.path(a);
        let partial = path.with_extension(PARTIAL);
        let io = |source| PrefixError::Io {
            path: partial.clone(),
            source,
        };
        let mut file = crate::private::create(&partial).map_err(io)?;
        file.write_all(&header(key, start, end, bytes))
            .map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        drop(file);
        fs::rename(&partial, &path).map_err(|source| PrefixError::Io {
            path: path.clone(),
            source,
        })?;
        self.note(*a, size, SystemTime::now());
        Ok(size)
    }

    /// Removes the least recently used blocks until `room` more bytes fit.
    fn evict(&mut self, room: u64) {
        if self.total + room <= self.limit {
            return;
        }
        let mut order: Vec<(SystemTime, Address)> =
            self.entries.values().map(|e| (e.used, e.address)).collect();
        order.sort_by_key(|(used, a)| (*used, a.key));
        for (_, a) in order {
            if self.total + room <= self.limit {
                break;
            }
            let _ = fs::remove_file(self.path(&a));
            self.forget(&a.key);
        }
    }
}

/// A block's file is named by its key; a tail's by the block it follows,
/// its length and its key, so tails can be listed without reading them.
fn address_of(path: &Path) -> Option<Address> {
    if path.extension()? != EXTENSION {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    let mut parts = stem.split('-');
    let address = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(key), None, None, None) => Address {
            key: BlockKey::from_hex(key)?,
            tail: None,
        },
        (Some(parent), Some(len), Some(key), None) => Address {
            key: BlockKey::from_hex(key)?,
            tail: Some((BlockKey::from_hex(parent)?, len.parse().ok()?)),
        },
        _ => return None,
    };
    Some(address)
}

fn header(key: &BlockKey, start: usize, end: usize, bytes: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&key.0);
    h.extend_from_slice(&(start as u64).to_le_bytes());
    h.extend_from_slice(&(end as u64).to_le_bytes());
    h.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    h.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(bytes).to_le_bytes());
    h
}

enum Bad {
    Io(std::io::Error),
    Corrupt(String),
}

impl From<std::io::Error> for Bad {
    fn from(e: std::io::Error) -> Self {
        Bad::Io(e)
    }
}

fn word(h: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Reads and checks a block file of `size` bytes: its header must name
/// `key`, its length must be the file's, and its bytes must match their
/// checksum. Nothing is allocated before the length is checked.
fn read_block(file: &mut File, key: &BlockKey, size: u64) -> Result<DiskBlock, Bad> {
    if size < HEADER as u64 {
        return Err(Bad::Corrupt(format!("{size} bytes, shorter than a header")));
    }
    let mut h = [0u8; HEADER];
    file.read_exact(&mut h)?;
    if &h[..8] != MAGIC {
        return Err(Bad::Corrupt("not a prefix block of this version".into()));
    }
    if h[8..40] != key.0 {
        return Err(Bad::Corrupt("its header names another block".into()));
    }
    let (start, end, len) = (word(&h, 40), word(&h, 48), word(&h, 56));
    if len != size - HEADER as u64 || end <= start {
        return Err(Bad::Corrupt(format!(
            "header says {len} bytes of positions {start}..{end}, the file holds {}",
            size - HEADER as u64
        )));
    }
    let (Ok(start), Ok(end), Ok(len)) = (
        usize::try_from(start),
        usize::try_from(end),
        usize::try_from(len),
    ) else {
        return Err(Bad::Corrupt("positions beyond this machine's reach".into()));
    };
    let mut bytes = vec![0u8; len];
    file.read_exact(&mut bytes)?;
    let mut sum = [0u8; 16];
    sum.copy_from_slice(&h[64..80]);
    if xxhash_rust::xxh3::xxh3_128(&bytes) != u128::from_le_bytes(sum) {
        return Err(Bad::Corrupt("its bytes do not match their checksum".into()));
    }
    Ok(DiskBlock { start, end, bytes })
}
