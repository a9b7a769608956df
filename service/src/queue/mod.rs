//! The durable job queue: jobs, their output and the registered models in one
//! SQLite database with a single writer.
//!
//! Each state change is one function and one transaction that reads the
//! current state, checks the move against [`JobState::after`] and writes the
//! new one, so an illegal move changes nothing. Output is appended in chunks
//! (token ids plus the text they made final) and only while the job is
//! running, so a runner that lost its job to a pause or cancel cannot write
//! after it.

pub mod db;
pub mod job;
pub mod models;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::runner::crash::Crash;

/// Crashes in a row after which a job is failed rather than resumed.
pub const MAX_CRASHES: u32 = 3;

pub use job::{
    DriveBytes, ForcedCall, Input, JobState, JobStats, JobView, Message, NewJob, Output,
    PauseCause, PromptInput, Request, Settings, Speculate, SpeculationTally, Transition,
    now_seconds, now_unix,
};
pub use models::{ModelEntry, ModelKind, name_problem};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("database error while {context}: {source}")]
    Sql {
        context: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "PRAGMA {name} reads back as `{got}`, expected `{expected}`; this file system cannot give the durability the queue needs"
    )]
    Pragma {
        name: &'static str,
        expected: &'static str,
        got: String,
    },
    #[error(
        "the database has schema version {version}, newer than this Longhaul knows ({known}); use a newer Longhaul"
    )]
    TooNew { version: usize, known: usize },
    #[error("no job {0}")]
    NoSuchJob(i64),
    #[error("job {id} is {from}; it cannot {transition}")]
    Illegal {
        id: i64,
        from: &'static str,
        transition: &'static str,
    },
    #[error("no model named `{0}`; register it first")]
    NoSuchModel(String),
    #[error("{0}")]
    Invalid(String),
    #[error("job {id}: stored {what} is unreadable: {reason}")]
    Corrupt {
        id: i64,
        what: &'static str,
        reason: String,
    },
    #[error("the queue's lock was poisoned by an earlier panic")]
    Poisoned,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `map_err` helper naming what was being done.
impl QueueError {
    /// The data dir could not be written or read: a full disk, an I/O
    /// error, a file system gone read-only. It passes when the disk heals.
    pub fn is_storage_fault(&self) -> bool {
        use rusqlite::ErrorCode as C;
        matches!(
            self,
            QueueError::Sql {
                source: rusqlite::Error::SqliteFailure(e, _),
                ..
            } if matches!(e.code, C::DiskFull | C::SystemIoFailure | C::CannotOpen | C::ReadOnly)
        )
    }
}

fn sql(context: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> QueueError {
    let context = context.into();
    move |source| QueueError::Sql { context, source }
}

/// Output committed so far: ids, the answer and the reasoning apart.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reasoning: String,
}

/// A job the runner can take: what to run and the output committed so far.
#[derive(Debug, Clone)]
pub struct Runnable {
    pub id: i64,
    pub model: String,
    pub request: Request,
    /// The prompt's token ids as admitted (see [`NewJob::prompt_ids`]).
    pub prompt_ids: Option<Vec<u32>>,
    pub committed_tokens: Vec<u32>,
    pub committed_text: String,
    /// Bytes of reasoning committed, apart from the text.
    pub committed_reasoning_len: usize,
    /// Tokens committed (equal to `committed_tokens.len()` for local models;
    /// remote servers report counts, not ids).
    pub committed_count: usize,
    /// Set when the job ran before (interrupted or paused and resumed).
    pub resumed: bool,
    pub stats: Option<JobStats>,
    /// Times in a row the service crashed while it ran: such a job runs alone.
    pub crashes: u32,
}

/// A job paused on a failing read or a missing drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrivePause {
    pub id: i64,
    pub model: String,
    pub cause: PauseCause,
    pub reason: Option<String>,
}

pub struct Queue {
    conn: Mutex<Connection>,
}

const JOB_COLUMNS: &str = "id, title, model, request, priority, state, origin, token_count, \
     error, pause_reason, finish_reason, stats, log, created_ms, started_ms, finished_ms, updated_ms, \
     pause_cause";

impl Queue {
    /// Opens the queue database at `path` (created if missing).
    pub fn open(path: &Path) -> Result<Self, QueueError> {
        Ok(Self {
            conn: Mutex::new(db::open(path)?),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Connection>, QueueError> {
        self.conn.lock().map_err(|_| QueueError::Poisoned)
    }

    /// Runs `f` in one immediate (write-locking) transaction.
    fn write<T>(
        &self,
        what: &str,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        if let Some(source) = crate::faults::disk_full() {
            return Err(QueueError::Sql {
                context: format!("starting to {what}"),
                source,
            });
        }
        let mut conn = self.lock()?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(format!("starting to {what}")))?;
        let out = f(&tx)?;
        tx.commit().map_err(sql(format!("committing {what}")))?;
        Ok(out)
    }

    pub fn submit(&self, job: &NewJob) -> Result<JobView, QueueError> {
        if job.title.trim().is_empty() {
            return Err(QueueError::Invalid("the title is empty".into()));
        }
        let request = serde_json::to_string(&job.request)
            .map_err(|e| QueueError::Invalid(format!("request cannot be stored: {e}")))?;
        let prompt_ids = job.prompt_ids.as_deref().map(id_bytes);
        let id = self.write("submit a job", |tx| {
            models::get(tx, &job.model)?;
            let position: f64 = tx
                .query_row("SELECT COALESCE(MAX(position), 0) + 1 FROM jobs", [], |r| {
                    r.get(0)
                })
                .map_err(sql("placing the job"))?;
            let now = now_ms();
            tx.execute(
                "INSERT INTO jobs (title, model, request, priority, position, state, origin, created_ms, updated_ms, prompt_ids)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?7, ?8)",
                params![job.title, job.model, request, job.priority, position, job.origin, now, prompt_ids],
            )
            .map_err(sql("inserting the job"))?;
            Ok(tx.last_insert_rowid())
        })?;
        self.job(id)
    }

    /// Moves job `id` by `t`, refusing moves the state machine does not allow.
    fn transition(
        tx: &Transaction<'_>,
        id: i64,
        t: Transition,
    ) -> Result<(JobState, JobState), QueueError> {
        let from = state_of(tx, id)?;
        let to = from.after(t).ok_or(QueueError::Illegal {
            id,
            from: from.as_str(),
            transition: t.as_str(),
        })?;
        tx.execute(
            "UPDATE jobs SET state = ?2, updated_ms = ?3 WHERE id = ?1",
            params![id, to.as_str(), now_ms()],
        )
        .map_err(sql(format!("moving job {id} to {}", to.as_str())))?;
        Ok((from, to))
    }

    /// The next job to run: interrupted ones first (they hold a model's
    /// half-written answer), then by priority, then queue order. A model
    /// with a job paused on a failing read or a missing drive is held: its
    /// other jobs wait rather than start onto the same drives and pause in
    /// turn, until that job is retried and runs, or is cancelled.
    pub fn next_runnable(&self) -> Result<Option<Runnable>, QueueError> {
        let conn = self.lock()?;
        let id: Option<i64> = conn
            .query_row(
                "SELECT id FROM jobs WHERE state IN ('interrupted', 'queued')
                 AND model NOT IN (SELECT model FROM jobs WHERE state = 'paused'
                                   AND pause_cause IN ('read_fault', 'drive_missing'))
                 ORDER BY state = 'interrupted' DESC, priority DESC, position LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("finding the next job"))?;
        drop(conn);
        id.map(|id| self.runnable(id)).transpose()
    }

    fn runnable(&self, id: i64) -> Result<Runnable, QueueError> {
        let view = self.job(id)?;
        let committed = self.committed_parts(id)?;
        let prompt_ids = self.prompt_ids(id)?;
        let crashes: u32 = self
            .lock()?
            .query_row("SELECT crashes FROM jobs WHERE id = ?1", [id], |r| r.get(0))
            .map_err(sql("reading a job's crashes"))?;
        Ok(Runnable {
            id,
            model: view.model,
            request: view.request,
            prompt_ids,
            resumed: view.started_ms.is_some(),
            committed_count: view.tokens,
            committed_tokens: committed.tokens,
            committed_text: committed.text,
            committed_reasoning_len: committed.reasoning.len(),
            stats: view.stats,
            crashes,
        })
    }

    /// Marks job `id` running; a job that ran before counts a resume, at
    /// once, so a crash later in the run does not forget it.
    pub fn start(&self, id: i64) -> Result<(), QueueError> {
        self.write("start a job", |tx| {
            Self::transition(tx, id, Transition::Start)?;
            let (started, stats): (Option<i64>, Option<String>) = tx
                .query_row(
                    "SELECT started_ms, stats FROM jobs WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .map_err(sql("reading a job's statistics"))?;
            if started.is_some() {
                let mut stats: JobStats = stats
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or_default();
                stats.resumes += 1;
                write_stats(tx, id, &stats)?;
            }
            tx.execute(
                "UPDATE jobs SET started_ms = COALESCE(started_ms, ?2), pause_reason = NULL WHERE id = ?1",
                params![id, now_ms()],
            )
            .map_err(sql("stamping the start"))?;
            Ok(())
        })
    }

    /// Appends output to a running job. Refused once the job is no longer
    /// running, which tells the runner to stop.
    /// `count` is the number of tokens the output holds: `tokens.len()` when
    /// the ids are known, or what a remote server reported.
    pub fn commit(&self, id: i64, output: &Output<'_>) -> Result<(), QueueError> {
        self.commit_with_stats(id, output, None)
    }

    /// [`Queue::commit`], recording the run's statistics so far in the same
    /// transaction (wall time survives a crash up to the last commit).
    pub fn commit_with_stats(
        &self,
        id: i64,
        output: &Output<'_>,
        stats: Option<&JobStats>,
    ) -> Result<(), QueueError> {
        self.write("commit output", |tx| {
            if let Some(stats) = stats {
                write_stats(tx, id, stats)?;
            }
            let state = state_of(tx, id)?;
            if state != JobState::Running {
                return Err(QueueError::Illegal {
                    id,
                    from: state.as_str(),
                    transition: "take more output",
                });
            }
            append_chunk(tx, id, output)
        })
    }

    /// Ends a running job: done, with its last output and statistics.
    pub fn finish(
        &self,
        id: i64,
        output: &Output<'_>,
        reason: &str,
        stats: &JobStats,
    ) -> Result<(), QueueError> {
        self.write("finish a job", |tx| {
            if !output.is_empty() {
                append_chunk(tx, id, output)?;
            }
            Self::transition(tx, id, Transition::Finish)?;
            set_end(tx, id, Some(reason), None, stats)
        })
    }

    /// Ends a running job as failed, keeping its output.
    pub fn fail(&self, id: i64, error: &str, stats: &JobStats) -> Result<(), QueueError> {
        self.write("fail a job", |tx| {
            Self::transition(tx, id, Transition::Fail)?;
            set_end(tx, id, None, Some(error), stats)
        })
    }

    /// Records statistics of a job that stopped without ending (paused).
    pub fn save_stats(&self, id: i64, stats: &JobStats) -> Result<(), QueueError> {
        self.write("save statistics", |tx| write_stats(tx, id, stats))
    }

    pub fn cancel(&self, id: i64) -> Result<JobState, QueueError> {
        self.write("cancel a job", |tx| {
            let (from, _) = Self::transition(tx, id, Transition::Cancel)?;
            tx.execute(
                "UPDATE jobs SET finished_ms = ?2 WHERE id = ?1",
                params![id, now_ms()],
            )
            .map_err(sql("stamping the end"))?;
            Ok(from)
        })
    }

    /// Pauses a job (waiting or running) with a reason shown to the user.
    pub fn pause(&self, id: i64, cause: PauseCause, reason: &str) -> Result<JobState, QueueError> {
        self.write("pause a job", |tx| {
            let (from, _) = Self::transition(tx, id, Transition::Pause)?;
            tx.execute(
                "UPDATE jobs SET pause_reason = ?2, pause_cause = ?3 WHERE id = ?1",
                params![id, reason, cause.as_str()],
            )
            .map_err(sql("recording the pause reason"))?;
            Ok(from)
        })
    }

    /// Changes the reason shown for a paused job.
    pub fn set_pause_reason(&self, id: i64, reason: &str) -> Result<(), QueueError> {
        self.write("update the pause reason", |tx| {
            let state = state_of(tx, id)?;
            if state != JobState::Paused {
                return Err(QueueError::Illegal {
                    id,
                    from: state.as_str(),
                    transition: "change its pause reason",
                });
            }
            tx.execute(
                "UPDATE jobs SET pause_reason = ?2, updated_ms = ?3 WHERE id = ?1",
                params![id, reason, now_ms()],
            )
            .map_err(sql("updating the pause reason"))?;
            Ok(())
        })
    }

    pub fn resume(&self, id: i64) -> Result<(), QueueError> {
        self.write("resume a job", |tx| Self::resume_in(tx, id))
    }

    fn resume_in(tx: &Transaction, id: i64) -> Result<(), QueueError> {
        Self::transition(tx, id, Transition::Resume)?;
        tx.execute(
            "UPDATE jobs SET pause_reason = NULL, pause_cause = NULL WHERE id = ?1",
            params![id],
        )
        .map_err(sql("clearing the pause reason"))?;
        Ok(())
    }

    /// Resumes every paused job, whatever paused it; returns their ids.
    pub fn resume_all(&self) -> Result<Vec<i64>, QueueError> {
        self.write("resume every paused job", |tx| {
            let ids: Vec<i64> = {
                let mut stmt = tx
                    .prepare("SELECT id FROM jobs WHERE state = 'paused' ORDER BY id")
                    .map_err(sql("finding paused jobs"))?;
                stmt.query_map([], |r| r.get(0))
                    .and_then(|rows| rows.collect())
                    .map_err(sql("finding paused jobs"))?
            };
            for &id in &ids {
                Self::resume_in(tx, id)?;
            }
            Ok(ids)
        })
    }

    /// At start: jobs left running by a stopped service become interrupted,
    /// except one that crashed the service [`MAX_CRASHES`] times in a row,
    /// which fails. Returns the interrupted jobs' ids.
    pub fn recover(&self, crash: Option<&Crash>) -> Result<Vec<i64>, QueueError> {
        self.write("recover interrupted jobs", |tx| {
            let running: Vec<(i64, u32)> = {
                let mut stmt = tx
                    .prepare("SELECT id, crashes FROM jobs WHERE state = 'running'")
                    .map_err(sql("finding running jobs"))?;
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .and_then(|rows| rows.collect())
                    .map_err(sql("finding running jobs"))?
            };
            let mut interrupted = Vec::new();
            for (id, crashes) in running {
                let Some(crash) = crash.filter(|c| c.jobs.contains(&id)) else {
                    set_crashes(tx, id, 0)?;
                    Self::transition(tx, id, Transition::Interrupt)?;
                    append_log(tx, id, "interrupted: the service stopped while it ran")?;
                    interrupted.push(id);
                    continue;
                };
                let crashes = crashes + 1;
                set_crashes(tx, id, crashes)?;
                let what = format!("the service crashed ({}) while it ran this job", crash.signal);
                if crashes >= MAX_CRASHES {
                    let error = format!(
                        "{what}, {crashes} times in a row; it is not resumed again, so the queue can go on"
                    );
                    append_log(tx, id, &format!("failed: {error}"))?;
                    Self::transition(tx, id, Transition::Fail)?;
                    tx.execute(
                        "UPDATE jobs SET error = ?2, finished_ms = ?3 WHERE id = ?1",
                        params![id, error, now_ms()],
                    )
                    .map_err(sql("recording the end"))?;
                } else {
                    append_log(
                        tx,
                        id,
                        &format!("interrupted: {what} (crash {crashes} of at most {MAX_CRASHES} in a row)"),
                    )?;
                    Self::transition(tx, id, Transition::Interrupt)?;
                    interrupted.push(id);
                }
            }
            Ok(interrupted)
        })
    }

    /// Ids of the jobs waiting to run, in the order they will run.
    /// Jobs paused on a failing read or a missing drive, which are retried
    /// by themselves, oldest first.
    pub fn paused_on_drives(&self) -> Result<Vec<DrivePause>, QueueError> {
        let conn = self.lock()?;
        let mut stmt = conn
            .prepare(
                "SELECT id, model, pause_cause, pause_reason FROM jobs WHERE state = 'paused'
                 AND pause_cause IN ('read_fault', 'drive_missing') ORDER BY id",
            )
            .map_err(sql("finding jobs paused on their drives"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<String>>(3)?,
                ))
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(sql("finding jobs paused on their drives"))?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, model, cause, reason)| {
                PauseCause::parse(&cause).map(|cause| DrivePause {
                    id,
                    model,
                    cause,
                    reason,
                })
            })
            .collect())
    }

    pub fn waiting(&self) -> Result<Vec<i64>, QueueError> {
        waiting_order(&*self.lock()?)
    }

    /// Drops a running job's output, for a backend that must start over.
    pub fn discard_output(&self, id: i64) -> Result<(), QueueError> {
        self.write("discard output", |tx| {
            tx.execute("DELETE FROM chunks WHERE job_id = ?1", [id])
                .map_err(sql("discarding output"))?;
            tx.execute(
                "UPDATE jobs SET token_count = 0, updated_ms = ?2 WHERE id = ?1",
                params![id, now_ms()],
            )
            .map_err(sql("discarding output"))?;
            Ok(())
        })
    }

    /// Deletes an ended job (done, failed or cancelled) with its output;
    /// a job that may still run must be cancelled first.
    pub fn delete(&self, id: i64) -> Result<(), QueueError> {
        self.write("delete a job", |tx| {
            let state = state_of(tx, id)?;
            if !state.is_final() {
                return Err(QueueError::Illegal {
                    id,
                    from: state.as_str(),
                    transition: "delete (cancel it first)",
                });
            }
            tx.execute("DELETE FROM chunks WHERE job_id = ?1", [id])
                .map_err(sql("deleting output"))?;
            tx.execute("DELETE FROM jobs WHERE id = ?1", [id])
                .map_err(sql("deleting a job"))?;
            Ok(())
        })
    }

    /// Adds a line to a job's log.
    pub fn log(&self, id: i64, line: &str) -> Result<(), QueueError> {
        self.write("write the job log", |tx| append_log(tx, id, line))
    }

    /// Moves a waiting job to `index` (0-based) among the waiting jobs of
    /// its priority.
    pub fn reorder(&self, id: i64, index: usize) -> Result<(), QueueError> {
        self.write("reorder the queue", |tx| {
            let state = state_of(tx, id)?;
            if !matches!(state, JobState::Queued | JobState::Paused) {
                return Err(QueueError::Illegal {
                    id,
                    from: state.as_str(),
                    transition: "move in the queue",
                });
            }
            let priority: i64 = tx
                .query_row("SELECT priority FROM jobs WHERE id = ?1", [id], |r| {
                    r.get(0)
                })
                .map_err(sql("reading the priority"))?;
            let others: Vec<f64> = {
                let mut stmt = tx
                    .prepare(
                        "SELECT position FROM jobs WHERE state IN ('queued', 'paused')
                         AND priority = ?1 AND id != ?2 ORDER BY position",
                    )
                    .map_err(sql("reading the queue"))?;
                stmt.query_map(params![priority, id], |r| r.get(0))
                    .and_then(|rows| rows.collect())
                    .map_err(sql("reading the queue"))?
            };
            let index = index.min(others.len());
            let position = match (index.checked_sub(1).map(|i| others[i]), others.get(index)) {
                (None, None) => 1.0,
                (None, Some(&next)) => next - 1.0,
                (Some(prev), None) => prev + 1.0,
                (Some(prev), Some(&next)) => (prev + next) / 2.0,
            };
            tx.execute(
                "UPDATE jobs SET position = ?2, updated_ms = ?3 WHERE id = ?1",
                params![id, position, now_ms()],
            )
            .map_err(sql("moving the job"))?;
            Ok(())
        })
    }

    /// Token ids and text committed so far.
    pub fn committed(&self, id: i64) -> Result<(Vec<u32>, String), QueueError> {
        self.committed_parts(id).map(|c| (c.tokens, c.text))
    }

    /// The prompt's token ids as admitted, when they were.
    pub fn prompt_ids(&self, id: i64) -> Result<Option<Vec<u32>>, QueueError> {
        let bytes: Option<Vec<u8>> = self
            .lock()?
            .query_row("SELECT prompt_ids FROM jobs WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql("reading the admitted prompt"))?
            .ok_or(QueueError::NoSuchJob(id))?;
        bytes.map(|b| ids_of(id, "admitted prompt", &b)).transpose()
    }

    /// Token ids, answer and reasoning committed so far.
    pub fn committed_parts(&self, id: i64) -> Result<Committed, QueueError> {
        let conn = self.lock()?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT tokens, text, reasoning FROM chunks WHERE job_id = ?1 ORDER BY seq",
            )
            .map_err(sql("reading output"))?;
        let rows = stmt
            .query_map([id], |r| {
                Ok((
                    r.get::<_, Vec<u8>>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(sql("reading output"))?;
        let (mut tokens, mut text, mut reasoning) = (Vec::new(), String::new(), String::new());
        for row in rows {
            let (bytes, t, r) = row.map_err(sql("reading output"))?;
            reasoning.push_str(&r);
            tokens.extend(ids_of(id, "token ids", &bytes)?);
            text.push_str(&t);
        }
        Ok(Committed {
            tokens,
            text,
            reasoning,
        })
    }

    /// One job with its output.
    /// The model job `id` runs on, without reading the rest of the job
    /// (its output may be long).
    pub fn model_of(&self, id: i64) -> Result<String, QueueError> {
        let conn = self.lock()?;
        conn.query_row("SELECT model FROM jobs WHERE id = ?1", [id], |r| r.get(0))
            .optional()
            .map_err(sql("reading a job's model"))?
            .ok_or(QueueError::NoSuchJob(id))
    }

    pub fn job(&self, id: i64) -> Result<JobView, QueueError> {
        let mut view = {
            let conn = self.lock()?;
            let mut stmt = conn
                .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"))
                .map_err(sql("reading a job"))?;
            let raw = stmt
                .query_row([id], RawJob::from_row)
                .optional()
                .map_err(sql("reading a job"))?
                .ok_or(QueueError::NoSuchJob(id))?;
            let mut view = raw.into_view()?;
            view.queue_position = queue_position(&conn, &view)?;
            view
        };
        let committed = self.committed_parts(id)?;
        view.output = Some(committed.text);
        view.reasoning = Some(committed.reasoning).filter(|r| !r.is_empty());
        Ok(view)
    }

    /// Every job, newest first, without output.
    pub fn list(&self) -> Result<Vec<JobView>, QueueError> {
        let conn = self.lock()?;
        let mut stmt = conn
            .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY id DESC"))
            .map_err(sql("listing jobs"))?;
        let raws: Vec<RawJob> = stmt
            .query_map([], RawJob::from_row)
            .and_then(|rows| rows.collect())
            .map_err(sql("listing jobs"))?;
        let waiting = waiting_order(&conn)?;
        raws.into_iter()
            .map(|raw| {
                let mut v = raw.into_view()?;
                v.queue_position = waiting.iter().position(|&w| w == v.id).map(|p| p + 1);
                Ok(v)
            })
            .collect()
    }

    pub fn add_model(&self, entry: &ModelEntry) -> Result<(), QueueError> {
        self.write("register a model", |tx| models::insert(tx, entry))
    }

    pub fn remove_model(&self, name: &str) -> Result<(), QueueError> {
        self.write("remove a model", |tx| models::remove(tx, name))
    }

    pub fn models(&self) -> Result<Vec<ModelEntry>, QueueError> {
        models::list(&*self.lock()?)
    }

    pub fn model(&self, name: &str) -> Result<ModelEntry, QueueError> {
        models::get(&*self.lock()?, name)
    }

    /// `PRAGMA integrity_check`'s verdict (`ok` when sound).
    pub fn integrity_check(&self) -> Result<String, QueueError> {
        self.lock()?
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(sql("checking integrity"))
    }
}

fn state_of(conn: &Connection, id: i64) -> Result<JobState, QueueError> {
    let s: Option<String> = conn
        .query_row("SELECT state FROM jobs WHERE id = ?1", [id], |r| r.get(0))
        .optional()
        .map_err(sql("reading a job's state"))?;
    let s = s.ok_or(QueueError::NoSuchJob(id))?;
    JobState::parse(&s).ok_or(QueueError::Corrupt {
        id,
        what: "state",
        reason: s,
    })
}

/// Token ids as the database keeps them: u32, little-endian.
fn id_bytes(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Token ids back from [`id_bytes`]; a length that is not whole ids is
/// reported as job `id`'s `what` being corrupt.
fn ids_of(id: i64, what: &'static str, bytes: &[u8]) -> Result<Vec<u32>, QueueError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(QueueError::Corrupt {
            id,
            what,
            reason: format!("{} bytes are not whole token ids", bytes.len()),
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn append_chunk(tx: &Transaction<'_>, id: i64, output: &Output<'_>) -> Result<(), QueueError> {
    let bytes = id_bytes(output.tokens);
    tx.execute(
        "INSERT INTO chunks (job_id, seq, tokens, text, reasoning)
         VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM chunks WHERE job_id = ?1), ?2, ?3, ?4)",
        params![id, bytes, output.text, output.reasoning],
    )
    .map_err(sql("appending output"))?;
    tx.execute(
        "UPDATE jobs SET token_count = token_count + ?2, updated_ms = ?3 WHERE id = ?1",
        params![id, output.count as i64, now_ms()],
    )
    .map_err(sql("counting output"))?;
    Ok(())
}

fn write_stats(tx: &Transaction<'_>, id: i64, stats: &JobStats) -> Result<(), QueueError> {
    let stats = serde_json::to_string(stats).unwrap_or_default();
    tx.execute(
        "UPDATE jobs SET stats = ?2 WHERE id = ?1",
        params![id, stats],
    )
    .map_err(sql("recording statistics"))?;
    Ok(())
}

fn set_crashes(tx: &Transaction<'_>, id: i64, crashes: u32) -> Result<(), QueueError> {
    tx.execute(
        "UPDATE jobs SET crashes = ?2 WHERE id = ?1",
        params![id, crashes],
    )
    .map_err(sql("counting crashes"))?;
    Ok(())
}

fn append_log(tx: &Transaction<'_>, id: i64, line: &str) -> Result<(), QueueError> {
    tx.execute(
        "UPDATE jobs SET log = log || ?2 || char(10) WHERE id = ?1",
        params![id, line],
    )
    .map_err(sql("writing the job log"))?;
    Ok(())
}

fn set_end(
    tx: &Transaction<'_>,
    id: i64,
    reason: Option<&str>,
    error: Option<&str>,
    stats: &JobStats,
) -> Result<(), QueueError> {
    let stats = serde_json::to_string(stats).unwrap_or_default();
    tx.execute(
        "UPDATE jobs SET finish_reason = ?2, error = ?3, stats = ?4, finished_ms = ?5 WHERE id = ?1",
        params![id, reason, error, stats, now_ms()],
    )
    .map_err(sql("recording the end"))?;
    Ok(())
}

/// Ids of jobs waiting to run, in the order they will run.
fn waiting_order(conn: &Connection) -> Result<Vec<i64>, QueueError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id FROM jobs WHERE state IN ('interrupted', 'queued')
             ORDER BY state = 'interrupted' DESC, priority DESC, position",
        )
        .map_err(sql("reading the queue"))?;
    stmt.query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .map_err(sql("reading the queue"))
}

fn queue_position(conn: &Connection, view: &JobView) -> Result<Option<usize>, QueueError> {
    if !matches!(view.state, JobState::Queued | JobState::Interrupted) {
        return Ok(None);
    }
    Ok(waiting_order(conn)?
        .iter()
        .position(|&w| w == view.id)
        .map(|p| p + 1))
}

/// A `jobs` row as read.
struct RawJob {
    id: i64,
    title: String,
    model: String,
    request: String,
    priority: i64,
    state: String,
    origin: String,
    token_count: i64,
    error: Option<String>,
    pause_reason: Option<String>,
    finish_reason: Option<String>,
    stats: Option<String>,
    log: String,
    created_ms: i64,
    started_ms: Option<i64>,
    finished_ms: Option<i64>,
    updated_ms: i64,
    pause_cause: Option<String>,
}

impl RawJob {
    fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: r.get(0)?,
            title: r.get(1)?,
            model: r.get(2)?,
            request: r.get(3)?,
            priority: r.get(4)?,
            state: r.get(5)?,
            origin: r.get(6)?,
            token_count: r.get(7)?,
            error: r.get(8)?,
            pause_reason: r.get(9)?,
            finish_reason: r.get(10)?,
            stats: r.get(11)?,
            log: r.get(12)?,
            created_ms: r.get(13)?,
            started_ms: r.get(14)?,
            finished_ms: r.get(15)?,
            updated_ms: r.get(16)?,
            pause_cause: r.get(17)?,
        })
    }

    fn into_view(self) -> Result<JobView, QueueError> {
        let id = self.id;
        let corrupt = |what: &'static str| {
            move |e: serde_json::Error| QueueError::Corrupt {
                id,
                what,
                reason: e.to_string(),
            }
        };
        Ok(JobView {
            id,
            state: JobState::parse(&self.state).ok_or(QueueError::Corrupt {
                id,
                what: "state",
                reason: self.state.clone(),
            })?,
            title: self.title,
            model: self.model,
            priority: self.priority,
            queue_position: None,
            origin: self.origin,
            request: serde_json::from_str(&self.request).map_err(corrupt("request"))?,
            output: None,
            reasoning: None,
            tokens: self.token_count.max(0) as usize,
            stats: self
                .stats
                .as_deref()
                .map(serde_json::from_str)
                .transpose()
                .map_err(corrupt("statistics"))?,
            error: self.error,
            pause_reason: self.pause_reason,
            pause_cause: self
                .pause_cause
                .map(|c| {
                    PauseCause::parse(&c).ok_or(QueueError::Corrupt {
                        id,
                        what: "pause cause",
                        reason: c,
                    })
                })
                .transpose()?,
            finish_reason: self.finish_reason,
            log: self.log,
            created_ms: self.created_ms,
            started_ms: self.started_ms,
            finished_ms: self.finished_ms,
            updated_ms: self.updated_ms,
        })
    }
}

#[cfg(test)]
mod tests;
