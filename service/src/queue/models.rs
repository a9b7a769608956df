//! Registered models: a name for a local checkpoint or pack, or for a model
//! served by a remote OpenAI-compatible endpoint.

use std::path::PathBuf;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::{QueueError, now_ms, sql};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelKind {
    /// A checkpoint folder or a pack on this machine.
    Local { path: PathBuf },
    /// An OpenAI-compatible server (vLLM, SGLang, llama.cpp, another Longhaul).
    Remote {
        url: String,
        /// Bearer token; never shown by the API.
        #[serde(default, skip_serializing)]
        #[ts(skip)]
        api_key: Option<String>,
        /// The model name the server knows it by.
        remote_model: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct ModelEntry {
    pub name: String,
    #[serde(flatten)]
    pub kind: ModelKind,
    #[serde(default)]
    pub created_ms: i64,
}

/// Longest model name accepted.
const MAX_NAME: usize = 128;

/// What is wrong with a model name, if anything. A name becomes a path
/// (a pack's folder, a URL segment), so it holds no slashes and does not
/// begin with a dot (`..` would climb out of the packs folder).
pub fn name_problem(name: &str) -> Option<String> {
    let trimmed = name.trim();
    let bad = trimmed.is_empty()
        || trimmed.len() > MAX_NAME
        || trimmed.chars().any(char::is_control)
        || trimmed.contains(['/', '\\'])
        || trimmed.starts_with('.');
    bad.then(|| {
        format!(
            "model name `{name}` must be 1 to {MAX_NAME} printable characters, without `/` or `\\` and not starting with `.`"
        )
    })
}

pub(super) fn insert(conn: &Connection, entry: &ModelEntry) -> Result<(), QueueError> {
    if let Some(problem) = name_problem(&entry.name) {
        return Err(QueueError::Invalid(problem));
    }
    let name = entry.name.trim();
    let (kind, path, url, key, remote) = match &entry.kind {
        ModelKind::Local { path } => (
            "local",
            Some(path.to_string_lossy().into_owned()),
            None,
            None,
            None,
        ),
        ModelKind::Remote {
            url,
            api_key,
            remote_model,
        } => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(QueueError::Invalid(format!(
                    "remote URL `{url}` must start with http:// or https://"
                )));
            }
            (
                "remote",
                None,
                Some(url.trim_end_matches('/').to_string()),
                api_key.clone(),
                Some(remote_model.clone()),
            )
        }
    };
    let exists: bool = conn
        .query_row("SELECT 1 FROM models WHERE name = ?1", [name], |_| Ok(true))
        .optional()
        .map_err(sql("looking up the model"))?
        .unwrap_or(false);
    if exists {
        return Err(QueueError::Invalid(format!(
            "a model named `{name}` is already registered"
        )));
    }
    conn.execute(
        "INSERT INTO models (name, kind, path, url, api_key, remote_model, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![name, kind, path, url, key, remote, now_ms()],
    )
    .map_err(sql("registering the model"))?;
    Ok(())
}

pub(super) fn remove(conn: &Connection, name: &str) -> Result<(), QueueError> {
    let n = conn
        .execute("DELETE FROM models WHERE name = ?1", [name])
        .map_err(sql("removing the model"))?;
    if n == 0 {
        return Err(QueueError::NoSuchModel(name.to_string()));
    }
    Ok(())
}

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ModelEntry> {
    let kind: String = r.get(1)?;
    let kind = if kind == "remote" {
        ModelKind::Remote {
            url: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
            api_key: r.get(4)?,
            remote_model: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
        }
    } else {
        ModelKind::Local {
            path: PathBuf::from(r.get::<_, Option<String>>(2)?.unwrap_or_default()),
        }
    };
    Ok(ModelEntry {
        name: r.get(0)?,
        kind,
        created_ms: r.get(6)?,
    })
}

const COLUMNS: &str = "name, kind, path, url, api_key, remote_model, created_ms";

pub(super) fn list(conn: &Connection) -> Result<Vec<ModelEntry>, QueueError> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM models ORDER BY name"))
        .map_err(sql("listing models"))?;
    stmt.query_map([], from_row)
        .and_then(|rows| rows.collect())
        .map_err(sql("listing models"))
}

pub(super) fn get(conn: &Connection, name: &str) -> Result<ModelEntry, QueueError> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM models WHERE name = ?1"),
        [name],
        from_row,
    )
    .optional()
    .map_err(sql("looking up the model"))?
    .ok_or_else(|| QueueError::NoSuchModel(name.to_string()))
}
