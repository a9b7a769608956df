//! The token embedding: held in RAM, or read a row per token from where it
//! is stored.
//!
//! Decoding needs one embedding row per token, yet an untied embedding held
//! whole takes `vocab × hidden` of the memory the expert cache could use:
//! 62.5 MiB of a 2 GiB limit on a 32k-vocabulary model with hidden 1024
//! (4 % more experts in the budget), 2.2 GiB on a Kimi-K2-shaped model
//! (163,840 × 7,168 at BF16). A row read costs one small read per token.
//! Where the LM head shares the embedding (tied), every row is needed for
//! every token and the embedding stays held.
//!
//! Model code sees rows through [`EmbeddingRows`] only; the reads live with
//! the weights (see `crate::weights::rows`).

use crate::kernels::Matrix;
use crate::model::ModelError;
use crate::weights::RowsError;

/// Rows of an embedding kept elsewhere, each checked as it is read.
pub trait EmbeddingRows: Send + Sync {
    /// Row `id` in f32 (`out` is the embedding's width long).
    fn row_into(&self, id: usize, out: &mut [f32]) -> Result<(), RowsError>;
}

pub enum Embedding {
    /// `[vocab, hidden]` at its stored width.
    Held(Matrix),
    /// Read a row at a time.
    Read {
        cols: usize,
        rows: Box<dyn EmbeddingRows>,
    },
}

impl Embedding {
    /// The width of a row (the model's hidden size).
    pub fn cols(&self) -> usize {
        match self {
            Self::Held(m) => m.cols(),
            Self::Read { cols, .. } => *cols,
        }
    }

    /// Row `id` in f32.
    pub fn row_into(&self, id: usize, out: &mut [f32]) -> Result<(), ModelError> {
        match self {
            Self::Held(m) => Ok(m.row_into(id, out)?),
            Self::Read { rows, .. } => Ok(rows.row_into(id, out)?),
        }
    }

    /// The held matrix, when nothing else shares its storage: replacing it
    /// then gives its bytes back.
    pub fn held_alone(&self) -> Option<&Matrix> {
        match self {
            Self::Held(m) if m.owns_storage() => Some(m),
            _ => None,
        }
    }
}
