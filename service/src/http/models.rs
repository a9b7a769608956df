//! `/api/models`: registering checkpoints, packs and remote servers.

use std::path::PathBuf;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::{ApiJson, AppState};
use crate::queue::{ModelEntry, ModelKind};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelBody {
    name: String,
    /// A checkpoint folder or pack on this machine…
    path: Option<PathBuf>,
    /// …or a remote OpenAI-compatible endpoint.
    url: Option<String>,
    api_key: Option<String>,
    remote_model: Option<String>,
}

pub async fn add_model(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<ModelBody>,
) -> ApiResult<(StatusCode, Json<ModelEntry>)> {
    let kind = match (body.path, body.url) {
        (Some(path), None) => {
            if !path.join("config.json").is_file() {
                return Err(ApiError::bad_param(
                    "path",
                    format!(
                        "{} is not a model folder (no config.json): give a checkpoint or a pack",
                        path.display()
                    ),
                ));
            }
            ModelKind::Local {
                path: std::fs::canonicalize(&path).unwrap_or(path),
            }
        }
        (None, Some(url)) => ModelKind::Remote {
            url,
            api_key: body.api_key,
            remote_model: body.remote_model.unwrap_or_else(|| body.name.clone()),
        },
        _ => {
            return Err(ApiError::bad_request(
                "give either `path` (a checkpoint or pack here) or `url` (a remote server)",
            ));
        }
    };
    let entry = ModelEntry {
        name: body.name.trim().to_string(),
        kind,
        created_ms: 0,
    };
    let stored = entry.clone();
    app.blocking(move |q| q.add_model(&stored)).await?;
    let name = entry.name.clone();
    Ok((
        StatusCode::CREATED,
        Json(app.blocking(move |q| q.model(&name)).await?),
    ))
}

pub async fn list_models(State(app): State<AppState>) -> ApiResult<Json<Value>> {
    let models = app.blocking(|q| q.models()).await?;
    Ok(Json(json!({ "models": models })))
}

pub async fn remove_model(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    app.blocking(move |q| q.remove_model(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
