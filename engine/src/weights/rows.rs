//! One tensor's rows read from its file as they are asked for (the token
//! embedding of a pack; see `crate::model::layers::embedding` for why).
//!
//! The tensor is found by content, not by name: of the file's tensors of the
//! same shape and type, the one whose bytes equal the matrix loaded from it.
//! Families name their embedding differently (`embed_tokens`,
//! `word_embeddings`, `embed`) and the LM head has the same shape, so only
//! the bytes tell them apart. Every row is hashed while the loaded copy is
//! still in RAM (it was checked with the whole file), and each read row must
//! match its hash: a file changed after loading is an error, never different
//! numbers.

use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use super::{RowOrder, SafetensorsFile, TensorInfo, WeightsError, matrix_format};
use crate::kernels::Matrix;
use crate::model::layers::embedding::EmbeddingRows;

/// Bytes compared at a time while looking for the tensor.
const COMPARE_CHUNK_BYTES: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RowsError {
    #[error("row {row} of `{tensor}`: {source}")]
    Read {
        tensor: String,
        row: usize,
        #[source]
        source: Box<WeightsError>,
    },
    #[error(
        "{path}: row {row} of `{tensor}` differs from what was checked when the model was loaded; the file changed since"
    )]
    Changed {
        path: PathBuf,
        tensor: String,
        row: usize,
    },
    #[error("`{tensor}` has rows of {cols}; asked for {found}")]
    Width {
        tensor: String,
        cols: usize,
        found: usize,
    },
    #[error("token id {row} is outside `{tensor}`'s {rows} rows")]
    OutOfRange {
        tensor: String,
        row: usize,
        rows: usize,
    },
}

/// A tensor's rows, read from its file one at a time.
pub struct FileRows {
    file: SafetensorsFile,
    name: String,
    info: TensorInfo,
    cols: usize,
    row_bytes: usize,
    format: crate::kernels::Format,
    /// xxh3-64 of every row as loaded.
    hashes: Vec<u64>,
}

impl FileRows {
    /// The tensor of `path` holding exactly `held`'s bytes, if there is one.
    pub fn find(path: &Path, held: &Matrix) -> Result<Option<Self>, WeightsError> {
        let file = SafetensorsFile::open(path)?;
        let want = held.stored_bytes();
        let candidates: Vec<(String, TensorInfo)> = file
            .tensors()
            .iter()
            .filter(|(_, t)| {
                t.len == want
                    && t.rows == RowOrder::Stored
                    && t.shape == [held.rows(), held.cols()]
                    && matrix_format(t.dtype) == Some(held.format())
            })
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        for (name, info) in candidates {
            if same_bytes(&file, &info, held.stored())? {
                let hashes = held
                    .stored()
                    .chunks_exact(held.row_bytes().max(1))
                    .map(xxh3_64)
                    .collect();
                return Ok(Some(Self {
                    file,
                    name,
                    info,
                    cols: held.cols(),
                    row_bytes: held.row_bytes(),
                    format: held.format(),
                    hashes,
                }));
            }
        }
        Ok(None)
    }

    /// The name the tensor has in its file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The width of a row.
    pub fn cols(&self) -> usize {
        self.cols
    }
}

fn same_bytes(
    file: &SafetensorsFile,
    info: &TensorInfo,
    held: &[u8],
) -> Result<bool, WeightsError> {
    let mut at = 0u64;
    while at < info.len {
        let len = COMPARE_CHUNK_BYTES.min(info.len - at);
        let stored = file.read_range(info, at, len)?;
        if stored[..] != held[at as usize..(at + len) as usize] {
            return Ok(false);
        }
        at += len;
    }
    Ok(true)
}

impl EmbeddingRows for FileRows {
    fn row_into(&self, id: usize, out: &mut [f32]) -> Result<(), RowsError> {
        if out.len() != self.cols {
            return Err(RowsError::Width {
                tensor: self.name.clone(),
                cols: self.cols,
                found: out.len(),
            });
        }
        let Some(&hash) = self.hashes.get(id) else {
            return Err(RowsError::OutOfRange {
                tensor: self.name.clone(),
                row: id,
                rows: self.hashes.len(),
            });
        };
        let row_bytes = self.row_bytes as u64;
        let bytes = self
            .file
            .read_range(&self.info, id as u64 * row_bytes, row_bytes)
            .map_err(|source| RowsError::Read {
                tensor: self.name.clone(),
                row: id,
                source: Box::new(source),
            })?;
        if xxh3_64(&bytes) != hash {
            return Err(RowsError::Changed {
                path: self.file.path().to_path_buf(),
                tensor: self.name.clone(),
                row: id,
            });
        }
        crate::kernels::format::decode_row(self.format, &bytes, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Format;
    use crate::weights::safetensors::{TensorEntry, header_bytes};

    const ROWS: usize = 6;
    const COLS: usize = 4;

    fn halves(seed: u16) -> Vec<u8> {
        (0..(ROWS * COLS) as u16)
            .flat_map(|i| half::f16::from_f32(f32::from(i * seed) / 7.0).to_le_bytes())
            .collect()
    }

    /// A file with an embedding and a head of the same shape, the head first.
    fn write(dir: &Path) -> (PathBuf, Vec<u8>, Vec<u8>) {
        let (embed, head) = (halves(3), halves(5));
        let len = embed.len() as u64;
        let shape = [ROWS, COLS];
        let entries = [
            TensorEntry {
                name: "lm_head.weight",
                dtype: "F16",
                shape: &shape,
                len,
            },
            TensorEntry {
                name: "model.word_embeddings.weight",
                dtype: "F16",
                shape: &shape,
                len,
            },
        ];
        let mut bytes = header_bytes(&entries);
        bytes.extend(&head);
        bytes.extend(&embed);
        let path = dir.join("resident.safetensors");
        std::fs::write(&path, bytes).unwrap();
        (path, embed, head)
    }

    #[test]
    fn rows_come_from_the_tensor_with_the_held_bytes_and_equal_the_held_rows() {
        let dir = tempfile::tempdir().unwrap();
        let (path, embed, _) = write(dir.path());
        let held = Matrix::from_bytes(ROWS, COLS, Format::F16, &embed).unwrap();
        let rows = FileRows::find(&path, &held)
            .unwrap()
            .expect("the embedding is found");
        assert_eq!(rows.name(), "model.word_embeddings.weight");
        for id in 0..ROWS {
            let (mut want, mut got) = ([0f32; COLS], [0f32; COLS]);
            held.row_into(id, &mut want).unwrap();
            rows.row_into(id, &mut got).unwrap();
            assert_eq!(want.map(f32::to_bits), got.map(f32::to_bits), "row {id}");
        }
        let mut out = [0f32; COLS];
        assert!(matches!(
            rows.row_into(ROWS, &mut out),
            Err(RowsError::OutOfRange { row: ROWS, .. })
        ));
    }

    #[test]
    fn a_matrix_the_file_does_not_hold_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _, _) = write(dir.path());
        let other = Matrix::from_bytes(ROWS, COLS, Format::F16, &halves(11)).unwrap();
        assert!(FileRows::find(&path, &other).unwrap().is_none());
        let narrower = Matrix::from_bytes(ROWS * 2, COLS / 2, Format::F16, &halves(3)).unwrap();
        assert!(
            FileRows::find(&path, &narrower).unwrap().is_none(),
            "same bytes, other shape"
        );
    }

    #[test]
    fn a_row_changed_after_loading_is_an_error_not_other_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let (path, embed, head) = write(dir.path());
        let held = Matrix::from_bytes(ROWS, COLS, Format::F16, &embed).unwrap();
        let rows = FileRows::find(&path, &held).unwrap().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let row2 = bytes.len() - embed.len() + 2 * COLS * 2;
        bytes[row2] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let mut out = [0f32; COLS];
        let err = rows.row_into(2, &mut out).unwrap_err();
        assert!(matches!(err, RowsError::Changed { row: 2, .. }), "{err}");
        rows.row_into(1, &mut out).unwrap();
        assert_ne!(embed, head);
    }
}
