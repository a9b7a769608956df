-- Models the service can run: a local checkpoint or pack, or a remote
-- OpenAI-compatible endpoint.
CREATE TABLE models (
    name         TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('local', 'remote')),
    path         TEXT,
    url          TEXT,
    api_key      TEXT,
    remote_model TEXT,
    created_ms   INTEGER NOT NULL
);

CREATE TABLE jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    title         TEXT NOT NULL,
    model         TEXT NOT NULL,
    -- The request as submitted (prompt or messages, attachments, settings), JSON.
    request       TEXT NOT NULL,
    priority      INTEGER NOT NULL DEFAULT 0,
    -- Order among jobs of the same priority; reordering changes it.
    position      REAL NOT NULL,
    state         TEXT NOT NULL CHECK (state IN
                    ('queued', 'running', 'paused', 'interrupted', 'done', 'failed', 'cancelled')),
    origin        TEXT NOT NULL DEFAULT 'api',
    token_count   INTEGER NOT NULL DEFAULT 0,
    error         TEXT,
    pause_reason  TEXT,
    finish_reason TEXT,
    stats         TEXT,
    log           TEXT NOT NULL DEFAULT '',
    created_ms    INTEGER NOT NULL,
    started_ms    INTEGER,
    finished_ms   INTEGER,
    updated_ms    INTEGER NOT NULL
);
CREATE INDEX jobs_by_queue_order ON jobs (state, priority DESC, position);

-- Output, appended as it is produced: each chunk holds the token ids and
-- the text they made final. A job's output is its chunks in order.
CREATE TABLE chunks (
    job_id INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq    INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    text   TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
