//! Failure points that tests switch on, so failure paths run in CI and not
//! only by hand. `LONGHAUL_FAULTS` holds comma-separated `name=value`
//! entries; unset (as for every user), each point costs one lookup in an
//! empty list.
//!
//! - `abort-job=ID`: the service aborts (SIGABRT) when it starts job ID, as
//!   an allocation failure would.
//! - `db-full-while=PATH`: every write to the queue's database fails as on
//!   a full disk (SQLITE_FULL) while a file exists at PATH.
//! - `token-delay-ms=N`: the runner waits N ms per produced chunk of output
//!   (slow decoding, so tests can act while a job runs).
//! - `store-eio-while=PATH`: every drive read fails with EIO while a file
//!   exists at PATH (checked every [`WATCH_INTERVAL`]).
//! - `store-delay-ms=N`: every drive read first waits N ms (a slow drive).
//! - `attach-eio=NAME`: reading an attachment whose file name is NAME fails
//!   with EIO.
//! - `prompt-delay-ms=N`: the runner waits N ms at each report of prompt
//!   reading (a long prompt, so its phase can be seen and photographed).
//! - `prompt-report-ms=N`: a stream says how far the prompt has been read
//!   at most every N ms (instead of every few seconds), so a test watches
//!   several reports of a prompt read in a second or two.
//! - `remote-stall-ms=N`: a remote model's stream that makes no progress
//!   for N ms is a fault (instead of the default few minutes).
//! - `pack-delay-ms=N`: a pack written through the service waits N ms at
//!   each progress report (a slow pack, so its phases can be watched).
//! - `pack-enospc-after=BYTES`: a pack written through the service fails
//!   as on a full drive once it has written BYTES of experts.

use std::sync::OnceLock;

/// The environment variable that switches failure points on.
pub const FAULTS_ENV: &str = "LONGHAUL_FAULTS";

fn faults() -> &'static [(String, String)] {
    static FAULTS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    FAULTS.get_or_init(|| parse(&std::env::var(FAULTS_ENV).unwrap_or_default()))
}

fn parse(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|entry| entry.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Aborts the process if `abort-job` names `id`.
pub fn on_job_start(id: i64) {
    let id = id.to_string();
    if faults().iter().any(|(k, v)| k == "abort-job" && *v == id) {
        tracing::error!("fault point abort-job={id}: aborting");
        std::process::abort();
    }
}

fn value(name: &str) -> Option<&'static str> {
    faults()
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The error a full disk gives, while `db-full-while`'s file exists.
pub fn disk_full() -> Option<rusqlite::Error> {
    let path = value("db-full-while")?;
    std::path::Path::new(path).exists().then(|| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        )
    })
}

/// How often `store-eio-while`'s file is looked for.
pub const WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// The drive-read faults `store-eio-while` and `store-delay-ms` ask for
/// (`None` when neither is set: reads pay nothing).
pub fn store_faults() -> Option<std::sync::Arc<longhaul_engine::tools::StoreFaults>> {
    let eio = value("store-eio-while");
    let delay = value("store-delay-ms").and_then(|v| v.parse::<u64>().ok());
    if eio.is_none() && delay.is_none() {
        return None;
    }
    let faults = std::sync::Arc::new(longhaul_engine::tools::StoreFaults::default());
    if let Some(ms) = delay {
        faults.set_delay(std::time::Duration::from_millis(ms));
    }
    if let Some(path) = eio {
        let watched = std::sync::Arc::clone(&faults);
        let spawned = std::thread::Builder::new()
            .name("longhaul-fault-watch".into())
            .spawn(move || {
                loop {
                    watched.set_io_error(std::path::Path::new(path).exists());
                    std::thread::sleep(WATCH_INTERVAL);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("fault point store-eio-while cannot be watched: {e}");
        }
    }
    Some(faults)
}

/// The error `attach-eio` asks for when reading attachment `path`.
pub fn attachment_read(path: &std::path::Path) -> Option<std::io::Error> {
    let name = value("attach-eio")?;
    (path.file_name().and_then(|n| n.to_str()) == Some(name))
        .then(|| std::io::Error::from_raw_os_error(libc::EIO))
}

/// Waits as `token-delay-ms` asks, once per produced chunk.
pub fn on_output() {
    if let Some(ms) = value("token-delay-ms").and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// How long a remote stream may go without progress, when
/// `remote-stall-ms` sets it (tests: seconds, not minutes).
pub fn remote_stall() -> Option<std::time::Duration> {
    value("remote-stall-ms")
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis)
}

/// Waits as `prompt-delay-ms` asks, once per report of prompt reading.
pub fn on_prompt_progress() {
    if let Some(ms) = value("prompt-delay-ms").and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// How often a stream reports prompt reading, when `prompt-report-ms`
/// sets it.
pub fn prompt_report() -> Option<std::time::Duration> {
    value("prompt-report-ms")
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis)
}

/// Waits as `pack-delay-ms` asks, once per packing progress report.
pub fn on_pack_progress() {
    if let Some(ms) = value("pack-delay-ms").and_then(|v| v.parse().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Where `pack-enospc-after` makes a pack's drives full.
pub fn pack_room() -> Option<u64> {
    value("pack-enospc-after").and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn entries_are_name_value_pairs() {
        let parsed = super::parse("abort-job=3, other = x,junk");
        assert_eq!(
            parsed,
            vec![
                ("abort-job".to_string(), "3".to_string()),
                ("other".to_string(), "x".to_string())
            ]
        );
        assert!(super::parse("").is_empty());
    }
}
