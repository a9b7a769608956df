//! Watching the drives of the running job's pack. A drive that disappears
//! (unplugged, unmounted) pauses the job at once with that reason, before a
//! read fails on it; when the drive is back the job resumes by itself. The folders are checked rather than watched through
//! file-system notifications, because an unmount or a vanished USB device
//! does not reliably notify a watcher of a folder on it, while a check of
//! the folder always tells.
//!
//! The running job's drives are checked every [`CHECK_INTERVAL`] (250 ms:
//! a drive pulled or made unreadable mid-job paused it within 0.2 s in
//! `tools/campaign/faults.py`, where checks every 2 s took 1.1–1.7 s, as
//! extent files already open kept reading). Each
//! check opens one folder per drive; the pack's drive list is read from its
//! manifest once and again only when the manifest changes. Each round also
//! retries the jobs paused on their drives ([`crate::fault_retry`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::queue::{ModelKind, PauseCause};
use crate::runner::Runner;

/// How often the running job's drive folders are checked.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// Start of the pause reason this watcher writes.
const MISSING: &str = "drive missing: ";
const UNREADABLE: &str = "drive unreadable: ";

/// The drive folders of each pack, with the manifest's length and mtime
/// they were read at.
#[derive(Default)]
struct Drives {
    known: HashMap<PathBuf, (u64, Option<SystemTime>, Vec<PathBuf>)>,
}

impl Drives {
    /// Drive folders of the local pack registered as `model`, if it is one.
    fn of(&mut self, runner: &Runner, model: &str) -> Vec<PathBuf> {
        let Ok(entry) = runner.queue.model(model) else {
            return Vec::new();
        };
        let ModelKind::Local { path } = entry.kind else {
            return Vec::new();
        };
        let manifest = path.join(longhaul_engine::tools::MANIFEST_FILE);
        let Ok(meta) = std::fs::metadata(&manifest) else {
            return Vec::new();
        };
        let stamp = (meta.len(), meta.modified().ok());
        if let Some((len, modified, drives)) = self.known.get(&path)
            && (*len, *modified) == stamp
        {
            return drives.clone();
        }
        let drives = longhaul_engine::tools::Manifest::read(&path)
            .map(|m| m.drives)
            .unwrap_or_default();
        self.known.insert(path, (stamp.0, stamp.1, drives.clone()));
        drives
    }
}

/// Pauses each running job a drive of whose pack is gone.
fn check_running(runner: &Runner, drives: &mut Drives) {
    for id in runner.control.running_jobs() {
        // Four times a second: the model alone, not the job and its output.
        let Ok(model) = runner.queue.model_of(id) else {
            continue;
        };
        let Some(reason) = drives
            .of(runner, &model)
            .iter()
            .find_map(|d| drive_problem(d))
        else {
            continue;
        };
        if runner
            .queue
            .pause(id, PauseCause::DriveMissing, &reason)
            .is_ok()
        {
            runner.control.stop_job(id);
            let _ = runner.queue.log(id, &format!("paused: {reason}"));
            runner.announce_queue();
        }
    }
}

/// What is wrong with drive folder `path`, if anything: gone (unplugged,
/// unmounted) or there but unreadable, which are told apart (an unreadable
/// drive was once reported as unplugged).
fn drive_problem(path: &Path) -> Option<String> {
    match std::fs::read_dir(path) {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "{MISSING}{} is not there (unplugged or unmounted?)",
            path.display()
        )),
        Err(e) => Some(format!(
            "{UNREADABLE}{} cannot be read ({e})",
            path.display()
        )),
    }
}

/// Checks the drives, and retries the jobs paused on them, for as long as
/// the runner lives.
pub fn spawn(runner: Arc<Runner>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("longhaul-drive-watch".into())
        .spawn(move || {
            let mut drives = Drives::default();
            let mut retries = crate::fault_retry::Retries::default();
            loop {
                std::thread::sleep(CHECK_INTERVAL);
                check_running(&runner, &mut drives);
                retries.tick(&runner, &mut |model| {
                    drives
                        .of(&runner, model)
                        .iter()
                        .all(|d| drive_problem(d).is_none())
                });
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drive_that_is_gone_and_one_that_cannot_be_read_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(drive_problem(dir.path()), None);
        let gone = drive_problem(&dir.path().join("gone")).unwrap_or_default();
        assert!(gone.contains("is not there"), "{gone}");
        // A folder no one can open (a symlink loop: root reads through modes).
        let looped = dir.path().join("loop");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        let unreadable = drive_problem(&looped).unwrap_or_default();
        assert!(unreadable.contains("cannot be read"), "{unreadable}");
    }
}
