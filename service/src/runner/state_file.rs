//! Saved attention state of answers in progress, one append-only file per
//! job, so a resumed job does not recompute the answer it had written: its
//! prompt is fed again in one pass (as the first time) and the answer's
//! attention rows are read back. Rows are appended and synced before the
//! output they belong to is committed; rows past the committed output (a
//! crash between the two) and a torn last record are cut off when read.
//! Each record carries the xxh3-128 of its rows, like the packs' expert
//! records: a state file changed on disk (8 flipped bytes once made a
//! resumed job finish with different text, without a word) is refused
//! from that record on, and what it held is computed again.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Bytes of a record's header: first answer token, token count, row bytes
/// (8 each), then the rows' xxh3-128 (16).
const HEADER: usize = 40;
/// Where the checksum sits in a record's header.
const CHECKSUM_AT: usize = 24;

/// The records of a state file that can be used, and why the rest cannot
/// when a record failed its checksum.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// (token count, rows) of each record, in order.
    pub records: Vec<(usize, Vec<u8>)>,
    pub refused: Option<String>,
}

pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn for_job(dir: &Path, id: i64) -> Self {
        Self {
            path: dir.join(format!("job-{id}.kv")),
        }
    }

    /// Appends the rows of answer tokens `from..from + count` and syncs them.
    pub fn append(&self, from: usize, count: usize, rows: &[u8]) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            crate::data_dir::create_private_dir(dir)?;
        }
        let mut f = crate::data_dir::private_options()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let mut record = Vec::with_capacity(HEADER + rows.len());
        record.extend_from_slice(&(from as u64).to_le_bytes());
        record.extend_from_slice(&(count as u64).to_le_bytes());
        record.extend_from_slice(&(rows.len() as u64).to_le_bytes());
        record.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(rows).to_le_bytes());
        record.extend_from_slice(rows);
        f.write_all(&record)?;
        f.sync_data()
    }

    /// Consecutive records from the first answer token that lie within the
    /// `committed` tokens and pass their checksums, in order; the file is
    /// cut to them.
    pub fn load(&self, committed: usize) -> Loaded {
        let Ok(mut f) = File::open(&self.path) else {
            return Loaded::default();
        };
        let mut bytes = Vec::new();
        if f.read_to_end(&mut bytes).is_err() {
            return Loaded::default();
        }
        let word = |at: usize| -> Option<usize> {
            let b: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
            usize::try_from(u64::from_le_bytes(b)).ok()
        };
        let (mut at, mut next, mut loaded) = (0usize, 0usize, Loaded::default());
        while let (Some(from), Some(count), Some(len)) = (word(at), word(at + 8), word(at + 16)) {
            let Some(rows) = (at + HEADER)
                .checked_add(len)
                .and_then(|end| bytes.get(at + HEADER..end))
            else {
                break;
            };
            let within = next.checked_add(count).is_some_and(|end| end <= committed);
            if from != next || !within {
                break;
            }
            let stored = bytes.get(at + CHECKSUM_AT..at + HEADER);
            if stored != Some(&xxhash_rust::xxh3::xxh3_128(rows).to_le_bytes()[..]) {
                loaded.refused = Some(format!(
                    "the saved attention state from answer token {from} fails its checksum"
                ));
                break;
            }
            loaded.records.push((count, rows.to_vec()));
            next += count;
            at += HEADER + len;
        }
        if at < bytes.len()
            && let Ok(f) = OpenOptions::new().write(true).open(&self.path)
        {
            let _ = f.set_len(at as u64);
        }
        loaded
    }

    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(l: &Loaded) -> Vec<usize> {
        l.records.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn records_past_the_committed_output_or_torn_are_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::for_job(dir.path(), 7);
        assert!(f.load(10).records.is_empty(), "no file yet");
        f.append(0, 3, b"aaa").unwrap();
        f.append(3, 4, b"bbbb").unwrap();
        f.append(7, 5, b"ccccc").unwrap();
        assert_eq!(
            f.load(20).records,
            vec![
                (3, b"aaa".to_vec()),
                (4, b"bbbb".to_vec()),
                (5, b"ccccc".to_vec())
            ]
        );
        // Only 8 tokens were committed: the third record goes, for good.
        assert_eq!(counts(&f.load(8)), [3, 4]);
        assert_eq!(counts(&f.load(20)), [3, 4]);
        // A torn record (crash mid-write) is dropped.
        let path = dir.path().join("job-7.kv");
        let mut raw = std::fs::read(&path).unwrap();
        raw.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, raw).unwrap();
        assert_eq!(counts(&f.load(20)), [3, 4]);
        f.append(7, 1, b"d").unwrap();
        assert_eq!(
            counts(&f.load(20)),
            [3, 4, 1],
            "appends continue after the cut"
        );
        assert_eq!(f.load(20).refused, None);
        f.remove();
        assert!(!path.exists());
    }

    #[test]
    fn a_changed_record_is_refused_from_there_on_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::for_job(dir.path(), 3);
        f.append(0, 2, b"aaaa").unwrap();
        f.append(2, 2, b"bbbb").unwrap();
        f.append(4, 2, b"cccc").unwrap();
        let path = dir.path().join("job-3.kv");
        let mut raw = std::fs::read(&path).unwrap();
        // A byte of the second record's rows.
        raw[2 * HEADER + 4 + 1] ^= 0x40;
        std::fs::write(&path, &raw).unwrap();
        let loaded = f.load(10);
        assert_eq!(counts(&loaded), [2]);
        let why = loaded.refused.unwrap_or_default();
        assert!(why.contains("token 2 fails its checksum"), "{why}");
        // A length that points past any file is a torn record, not a panic.
        let mut huge = vec![0u8; HEADER];
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&path, &huge).unwrap();
        assert_eq!(f.load(10), Loaded::default());
    }
}
