//! `/api/models`: registering checkpoints, packs and remote servers.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use longhaul_engine::tools::{PackDetails, SamplingDefaults};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::{ApiJson, AppState};
use crate::model_facts::{ModelFacts, PackWeights};
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
            // A name where users keep models (the Hugging Face cache,
            // LM Studio, Ollama) becomes the folder or file it names.
            let places = longhaul_engine::tools::ModelPlaces::from_env();
            let path = longhaul_engine::tools::locate(&path.to_string_lossy(), &places)
                .map_err(|e| ApiError::bad_param("path", e.to_string()))?
                .path;
            if !path.join("config.json").is_file() && !longhaul_engine::tools::is_gguf(&path) {
                return Err(ApiError::bad_param(
                    "path",
                    format!(
                        "{} is not a model folder (no config.json) or a .gguf file: give a checkpoint, a pack or a GGUF file",
                        path.display()
                    ),
                ));
            }
            ModelKind::Local {
                path: std::fs::canonicalize(&path).unwrap_or(path),
            }
        }
        (None, Some(url)) => {
            if names_this_service(&url, app.address()) {
                return Err(ApiError::bad_param(
                    "url",
                    format!(
                        "{url} is this service itself: its jobs would wait behind the job that waits for them"
                    ),
                ));
            }
            ModelKind::Remote {
                url,
                api_key: body.api_key,
                remote_model: body.remote_model.unwrap_or_else(|| body.name.clone()),
            }
        }
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

/// Whether `url` names the service at `address` (`http://127.0.0.1:PORT`),
/// under any of the loopback names, with or without `/v1`.
fn names_this_service(url: &str, address: &str) -> bool {
    let Some(port) = address.rsplit(':').next() else {
        return false;
    };
    let url = url.trim_end_matches('/');
    let url = url.strip_suffix("/v1").unwrap_or(url);
    ["127.0.0.1", "localhost", "[::1]"]
        .iter()
        .any(|host| url == format!("http://{host}:{port}"))
}

/// A model as `GET /api/models` lists it: as registered, with what a
/// local model's files say.
#[derive(Debug, Serialize, ts_rs::TS)]
#[ts(rename = "Model")]
pub struct ModelListing {
    #[serde(flatten)]
    pub model: ModelEntry,
    /// How a local checkpoint asks to be sampled (its
    /// `generation_config.json`); null: greedy, or a remote model.
    pub sampling: Option<SamplingDefaults>,
    /// What a pack holds (absent for checkpoints and remote models).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub details: Option<PackDetails>,
    /// How a pack stores its weights (absent where `details` is).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    pub weights: Option<PackWeights>,
}

impl ModelListing {
    fn of(model: ModelEntry, facts: &ModelFacts) -> Self {
        let (details, weights) = facts.pack.clone().unzip();
        Self {
            model,
            sampling: facts.sampling,
            details,
            weights,
        }
    }
}

/// `GET /api/models`'s answer.
#[derive(Debug, Serialize)]
pub struct ModelList {
    pub models: Vec<ModelListing>,
}

pub async fn list_models(State(app): State<AppState>) -> ApiResult<Json<ModelList>> {
    let facts = Arc::clone(&app.facts);
    // Reading the files is blocking work: off the async threads, and only
    // for models whose files changed since they were last read (a 1 GiB
    // manifest once took 3.3 s and 1 GB on every listing).
    let models = app
        .blocking(move |q| {
            Ok(q.models()?
                .into_iter()
                .map(|m| {
                    let read = facts.of(&m);
                    ModelListing::of(m, &read)
                })
                .collect())
        })
        .await?;
    Ok(Json(ModelList { models }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    /// Also delete the pack's files: its folder and its extents on every drive.
    #[serde(default)]
    files: bool,
}

/// `DELETE /api/models/{name}`: unregisters the model; with `?files=true`,
/// a pack's files go too (refused while one of its tasks runs).
pub async fn remove_model(
    State(app): State<AppState>,
    Path(name): Path<String>,
    axum::extract::Query(query): axum::extract::Query<RemoveQuery>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let look = name.clone();
    let model = app.blocking(move |q| q.model(&look)).await?;
    let pack = match &model.kind {
        ModelKind::Local { path } if query.files => {
            if !longhaul_engine::tools::is_pack(path) {
                return Err(ApiError::bad_param(
                    "files",
                    format!(
                        "{} is not a pack: only a pack's files are deleted with it",
                        path.display()
                    ),
                ));
            }
            Some(path.clone())
        }
        _ => None,
    };
    if let Some(path) = &pack
        && app.runner.loaded.current().is_some_and(|(p, _)| p == *path)
        && app.runner.control.running().is_some()
    {
        return Err(ApiError::conflict(format!(
            "a task of {name} is running: pause or cancel it before deleting its pack"
        )));
    }
    app.blocking(move |q| q.remove_model(&name)).await?;
    if let ModelKind::Local { path } = &model.kind {
        app.facts.forget(path);
    }
    let Some(path) = pack else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    // Let go of the engine reading it before its files go.
    if app.runner.loaded.current().is_some_and(|(p, _)| p == path) {
        app.runner.loaded.replace(None);
    }
    let gone = tokio::task::spawn_blocking(move || longhaul_engine::tools::discard_pack(&path))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| {
            ApiError::internal(format!("the model is removed, but not all its files: {e}"))
        })?;
    Ok(Json(json!({ "removed_files": gone.files, "removed_bytes": gone.bytes })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackBody {
    /// The model name the finished pack is registered under.
    name: String,
    /// The checkpoint folder or GGUF file (its first part) to pack.
    source: PathBuf,
    /// Drive folders to stripe the experts over.
    drives: Vec<PathBuf>,
    /// `q8_0` or `q4k` to quantise the experts; absent keeps them as stored.
    experts: Option<String>,
}

/// `POST /api/packs`: packs a checkpoint across drives in the background.
pub async fn start_pack(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<PackBody>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let name = body.name.trim().to_string();
    if let Some(problem) = crate::queue::name_problem(&name) {
        return Err(ApiError::bad_param("name", problem));
    }
    let taken = name.clone();
    if app.blocking(move |q| q.model(&taken)).await.is_ok() {
        return Err(ApiError::bad_param(
            "name",
            format!("a model named `{name}` is already registered"),
        ));
    }
    if !body.source.join("config.json").is_file() && !longhaul_engine::tools::is_gguf(&body.source)
    {
        return Err(ApiError::bad_param(
            "source",
            format!(
                "{} is not a checkpoint folder (no config.json) or a .gguf file",
                body.source.display()
            ),
        ));
    }
    if body.drives.is_empty() {
        return Err(ApiError::bad_param(
            "drives",
            "choose at least one drive folder",
        ));
    }
    if let Some(d) = body.drives.iter().find(|d| !d.is_dir()) {
        return Err(ApiError::bad_param(
            "drives",
            format!("drive folder {} does not exist", d.display()),
        ));
    }
    let quantization = match body.experts.as_deref().filter(|e| !e.is_empty()) {
        None => None,
        Some(e) => Some(
            longhaul_engine::tools::Quantization::parse(e).ok_or_else(|| {
                ApiError::bad_param(
                    "experts",
                    format!("`{e}` is not a quantisation; use q8_0 or q4k"),
                )
            })?,
        ),
    };
    // Folders on one device pack, but striping over them buys nothing.
    let warnings = crate::devices::warnings(&body.drives);
    let out = app.packs_dir().join(&name);
    crate::packing::Packer::reserve(&name, &body.source, &out, &body.drives).map_err(
        |e| match e {
            crate::packing::ReserveError::Taken(_) => ApiError::conflict(e.to_string()),
            crate::packing::ReserveError::Io { .. } => ApiError::internal(e.to_string()),
        },
    )?;
    let task = app.packer.start(
        crate::packing::PackRequest {
            name,
            source: body.source,
            drives: body.drives,
            quantization,
        },
        out,
        app.queue.clone(),
    );
    let mut view = json!(task);
    view["warnings"] = json!(warnings);
    Ok((StatusCode::ACCEPTED, Json(view)))
}

/// `GET /api/packs`: packings started here, with their progress.
/// Bytes each drive is read for by a probe from the UI: enough for a
/// steady rate on an SSD (a few seconds at 2 GB/s), little on a slow disk.
const UI_PROBE_BYTES: u64 = 256 << 20;

/// `POST /api/models/{name}/probe`: measures the pack's drives now (when no
/// task runs: its reads would slow the task and skew the figures).
pub async fn probe(
    State(app): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> ApiResult<Json<Value>> {
    if app.runner.control.running().is_some() {
        return Err(ApiError::conflict(
            "a task is running: probe the drives when the queue is idle (or paused), so the reads neither slow it nor share the drives with it",
        ));
    }
    let model = app.blocking(move |q| q.model(&name)).await?;
    let ModelKind::Local { path } = model.kind else {
        return Err(ApiError::bad_param(
            "model",
            "a remote model has no drives here",
        ));
    };
    let report = tokio::task::spawn_blocking(move || {
        crate::probe::probe_pack(
            std::path::Path::new(&path),
            UI_PROBE_BYTES,
            longhaul_engine::tools::DEFAULT_QUEUE_DEPTH,
        )
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::bad_param("model", e.to_string()))?;
    Ok(Json(json!(report)))
}

pub async fn list_packs(State(app): State<AppState>) -> Json<Value> {
    Json(json!({ "packs": app.packer.list() }))
}
