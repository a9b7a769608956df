//! The packed on-disk layout: a manifest, a resident file with everything that
//! stays in RAM, and routed-expert records striped over several drives.

pub mod compress;
pub mod details;
mod discard;
pub mod encoding;
mod layout;
pub mod manifest;
mod plan;
pub mod verify;
mod writer;

use std::path::PathBuf;

pub use discard::{Discarded, discard_pack, discard_unfinished};
pub use layout::{ExpertTensors, Part};
pub use manifest::{MANIFEST_FILE, Manifest};
pub use writer::{
    DEFAULT_ALIGNMENT, DEFAULT_EXTENT_FILE_BYTES, DEFAULT_SPLIT_THRESHOLD, PackOptions, PackPhase,
    PackProgress, PackSummary, pack_matches_source, write_pack,
};

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error(
        "{path}: the resident weights do not match the pack's checksum ({found_size} bytes, xxh3 {found}; the manifest says {size} bytes, xxh3 {expected}); the file is damaged: repack the model"
    )]
    ResidentCorrupt {
        path: PathBuf,
        size: u64,
        expected: String,
        found_size: u64,
        found: String,
    },
    #[error("{0}")]
    Options(String),
    #[error("source checkpoint: {0}")]
    Source(String),
    #[error("internal error: {0}")]
    Internal(&'static str),
}

/// Whether `path` is a finished pack folder.
pub fn is_pack(path: &std::path::Path) -> bool {
    path.join(MANIFEST_FILE).is_file()
}
