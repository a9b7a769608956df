//! What the service does differently on Linux and macOS, in one place:
//! where its data lives, how it holds off sleep while a task runs, and
//! whether SQLite must ask for a full flush. (Finding the disk under a
//! drive folder is `health::device`'s, one module per system, and the
//! engine has its own seam for reads and memory.)

use std::path::{Path, PathBuf};

/// The data dir under the home folder where `XDG_DATA_HOME` says nothing:
/// each system's place for an application's own data.
pub fn data_dir_in_home(home: &Path) -> PathBuf {
    if cfg!(target_os = "macos") {
        home.join("Library/Application Support/Longhaul")
    } else {
        home.join(".local/share/longhaul")
    }
}

/// The command that holds off idle sleep until this process (`pid`) exits
/// or the command is stopped: macOS's `caffeinate -i -w PID`, systemd's
/// `systemd-inhibit` elsewhere.
pub fn sleep_inhibitor(pid: &str) -> (&'static str, Vec<String>) {
    if cfg!(target_os = "macos") {
        // -i: no idle sleep; -w: until this process exits.
        ("caffeinate", vec!["-i".into(), "-w".into(), pid.into()])
    } else {
        let args = [
            "--what=idle:sleep",
            "--who=Longhaul",
            "--why=A task is running",
            "--mode=block",
            "sleep",
            "infinity",
        ];
        ("systemd-inhibit", args.map(String::from).to_vec())
    }
}

/// Whether SQLite must be told to flush with `F_FULLFSYNC`: macOS's
/// `fsync` does not flush the drive's own cache, so a commit could be lost
/// to a power cut after it returned.
pub const FULL_FSYNC: bool = cfg!(target_os = "macos");
