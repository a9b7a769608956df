-- The prompt as admitted: its token ids (u32, little-endian) when the
-- model's tokenizer was at hand, so the runner reads what was checked.
ALTER TABLE jobs ADD COLUMN prompt_ids BLOB;
