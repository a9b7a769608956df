-- Why a paused job is held, as a value (user, queue, drive_missing,
-- read_fault, storage) beside the reason shown to people. Jobs paused
-- before are given the cause their reason's wording meant.
ALTER TABLE jobs ADD COLUMN pause_cause TEXT;
UPDATE jobs SET pause_cause = CASE
    WHEN pause_reason = 'paused by the user' THEN 'user'
    WHEN pause_reason = 'the queue was paused' THEN 'queue'
    WHEN pause_reason LIKE 'drive missing: %' THEN 'drive_missing'
    WHEN pause_reason LIKE 'storage fault: %' THEN 'read_fault'
    ELSE 'storage'
END
WHERE pause_reason IS NOT NULL;
