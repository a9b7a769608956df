//! Opening the queue's SQLite database: pragmas set and read back, and the
//! schema brought up to date by migrations embedded in the binary.
//!
//! SQLite ignores a pragma it does not know without a word, so every pragma
//! is read back and compared; a database that cannot give the durability
//! the queue promises is refused rather than used.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::QueueError;

/// Migrations in order; the database's `user_version` counts those applied.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/0001_init.sql"),
    include_str!("migrations/0002_crashes.sql"),
    include_str!("migrations/0003_reasoning.sql"),
    include_str!("migrations/0004_admitted.sql"),
    include_str!("migrations/0005_pause_cause.sql"),
];

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A pragma and the value it must read back as.
struct Pragma {
    name: &'static str,
    set: &'static str,
    expect: &'static str,
}

const PRAGMAS: &[Pragma] = &[
    // Readers never block the writer, and a commit is one append.
    Pragma {
        name: "journal_mode",
        set: "WAL",
        expect: "wal",
    },
    // Every commit reaches the disk before it returns: output survives a power cut.
    Pragma {
        name: "synchronous",
        set: "FULL",
        expect: "2",
    },
    Pragma {
        name: "foreign_keys",
        set: "ON",
        expect: "1",
    },
];

/// Commits flushed past the drive's own cache where `fsync` stops short of
/// it (see [`crate::platform::FULL_FSYNC`]).
const FULL_FSYNC: Pragma = Pragma {
    name: "fullfsync",
    set: "ON",
    expect: "1",
};

/// Opens (creating if needed) the database at `path`, checks its pragmas and
/// applies pending migrations.
pub fn open(path: &Path) -> Result<Connection, QueueError> {
    let sql = |source| QueueError::Sql {
        context: format!("opening {}", path.display()),
        source,
    };
    let conn = Connection::open(path).map_err(sql)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql)?;
    let full = crate::platform::FULL_FSYNC.then_some(&FULL_FSYNC);
    for p in PRAGMAS.iter().chain(full) {
        conn.pragma_update(None, p.name, p.set).map_err(sql)?;
        let got = read_pragma(&conn, p.name).map_err(sql)?;
        if got != p.expect {
            return Err(QueueError::Pragma {
                name: p.name,
                expected: p.expect,
                got,
            });
        }
    }
    migrate(&conn)?;
    Ok(conn)
}

/// A pragma's current value as text.
pub fn read_pragma(conn: &Connection, name: &str) -> rusqlite::Result<String> {
    conn.query_row(&format!("PRAGMA {name}"), [], |row| {
        let v: rusqlite::types::Value = row.get(0)?;
        Ok(match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t.to_lowercase(),
            other => format!("{other:?}"),
        })
    })
}

fn migrate(conn: &Connection) -> Result<(), QueueError> {
    let sql = |context: String| move |source| QueueError::Sql { context, source };
    let version: usize = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql("reading the schema version".into()))?;
    if version > MIGRATIONS.len() {
        return Err(QueueError::TooNew {
            version,
            known: MIGRATIONS.len(),
        });
    }
    for (i, migration) in MIGRATIONS.iter().enumerate().skip(version) {
        let n = i + 1;
        // The migration and its version bump commit together or not at all.
        let batch = format!("BEGIN IMMEDIATE;\n{migration}\nPRAGMA user_version = {n};\nCOMMIT;");
        if let Err(e) = conn.execute_batch(&batch) {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(sql(format!("applying migration {n}"))(e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pragmas_read_back_as_set_and_migrations_apply_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.sqlite");
        let conn = open(&path).unwrap();
        assert_eq!(read_pragma(&conn, "journal_mode").unwrap(), "wal");
        assert_eq!(read_pragma(&conn, "synchronous").unwrap(), "2");
        assert_eq!(read_pragma(&conn, "foreign_keys").unwrap(), "1");
        assert_eq!(
            read_pragma(&conn, "user_version").unwrap(),
            MIGRATIONS.len().to_string()
        );
        drop(conn);
        // Reopening finds the schema current and applies nothing again.
        let conn = open(&path).unwrap();
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('jobs', 'chunks', 'models')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 3);
    }

    #[test]
    fn a_database_from_a_newer_longhaul_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.sqlite");
        drop(open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let err = open(&path).unwrap_err().to_string();
        assert!(err.contains("99"), "{err}");
    }
}
