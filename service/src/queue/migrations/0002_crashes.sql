-- Crashes of the service in a row while it ran the job (kills do not count):
-- past a limit the job is failed instead of resumed into the next crash.
ALTER TABLE jobs ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
