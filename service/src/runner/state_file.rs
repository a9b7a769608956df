//! Saved attention state of answers in progress, one append-only file per
//! job, so a resumed job does not recompute the answer it had written: its
//! prompt is fed again in one pass (as the first time) and the answer's
//! attention rows are read back. Rows are appended and synced before the
//! output they belong to is committed; rows past the committed output (a
//! crash between the two) and a torn last record are cut off when read.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Bytes of a record's header: first answer token, token count, row bytes.
const HEADER: usize = 24;

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
        record.extend_from_slice(rows);
        f.write_all(&record)?;
        f.sync_data()
    }

    /// (token count, rows) of consecutive records from the first answer
    /// token that lie within the `committed` tokens, in order; the file is
    /// cut to them.
    pub fn load(&self, committed: usize) -> Vec<(usize, Vec<u8>)> {
        let Ok(mut f) = File::open(&self.path) else {
            return Vec::new();
        };
        let mut bytes = Vec::new();
        if f.read_to_end(&mut bytes).is_err() {
            return Vec::new();
        }
        let word = |at: usize| -> Option<usize> {
            let b: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
            usize::try_from(u64::from_le_bytes(b)).ok()
        };
        let (mut at, mut next, mut out) = (0usize, 0usize, Vec::new());
        while let (Some(from), Some(count), Some(len)) = (word(at), word(at + 8), word(at + 16)) {
            let Some(rows) = bytes.get(at + HEADER..at + HEADER + len) else {
                break;
            };
            if from != next || next + count > committed {
                break;
            }
            out.push((count, rows.to_vec()));
            next += count;
            at += HEADER + len;
        }
        if at < bytes.len()
            && let Ok(f) = OpenOptions::new().write(true).open(&self.path)
        {
            let _ = f.set_len(at as u64);
        }
        out
    }

    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_past_the_committed_output_or_torn_are_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::for_job(dir.path(), 7);
        assert!(f.load(10).is_empty(), "no file yet");
        f.append(0, 3, b"aaa").unwrap();
        f.append(3, 4, b"bbbb").unwrap();
        f.append(7, 5, b"ccccc").unwrap();
        assert_eq!(
            f.load(20),
            vec![
                (3, b"aaa".to_vec()),
                (4, b"bbbb".to_vec()),
                (5, b"ccccc".to_vec())
            ]
        );
        // Only 8 tokens were committed: the third record goes, for good.
        assert_eq!(f.load(8), vec![(3, b"aaa".to_vec()), (4, b"bbbb".to_vec())]);
        assert_eq!(f.load(20).len(), 2);
        // A torn record (crash mid-write) is dropped.
        let path = dir.path().join("job-7.kv");
        let mut raw = std::fs::read(&path).unwrap();
        raw.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, raw).unwrap();
        assert_eq!(f.load(20).len(), 2);
        f.append(7, 1, b"d").unwrap();
        assert_eq!(f.load(20).len(), 3, "appends continue after the cut");
        f.remove();
        assert!(!path.exists());
    }
}
