-- The model's reasoning (its thinking before the answer), kept apart from
-- the answer in each committed chunk.
ALTER TABLE chunks ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
