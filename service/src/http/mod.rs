//! The HTTP API, on loopback by default: jobs, models, drives, metrics and
//! an event stream for Longhaul's own clients, and OpenAI-compatible
//! endpoints that run as high-priority jobs through the same queue.
//!
//! Every `/api` and `/v1` route needs the bearer token from the data dir. A
//! Host header that is not loopback is refused (a web page cannot reach the
//! service by rebinding its own name to 127.0.0.1), cross-origin requests
//! are allowed only from the desktop shell, and bodies are bounded.

pub mod admission;
pub mod anthropic;
pub mod api_types;
pub mod conn;
pub mod content;
pub mod drives;
pub mod error;
pub mod follow;
pub mod jobs;
pub mod models;
pub mod openai;
pub mod responses;
pub mod system;
pub mod tool_calls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use std::future::IntoFuture;

use tokio_stream::{Stream, StreamExt};
use tower_http::cors::CorsLayer;

use crate::events::{Event, Events, MetricsEvent};
use crate::model_facts::Known;
use crate::queue::{JobView, ModelEntry, NewJob, Queue, QueueError};
use crate::runner::{Runner, RunnerConfig};
use error::{ApiError, ApiResult};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Origins of the desktop shell's web view, the only cross-origin callers allowed.
pub const DESKTOP_ORIGINS: &[&str] = &["tauri://localhost", "http://tauri.localhost"];
/// Length of the bearer token, in random bytes (hex-encoded in the file).
const TOKEN_BYTES: usize = 32;
/// How often engine metrics are sampled and published.
const METRICS_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub addr: SocketAddr,
    /// Serve on a non-loopback address, and accept any Host header.
    pub allow_remote: bool,
    pub runner: RunnerConfig,
    /// A built web UI to serve at `/`, if present.
    pub ui_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    DataDir(#[from] crate::data_dir::DataDirError),
    #[error(
        "{addr} is not a loopback address; pass the explicit flag to serve beyond this machine"
    )]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The data dir's files.
pub fn token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("token")
}

pub fn queue_path(data_dir: &Path) -> PathBuf {
    data_dir.join("queue.sqlite")
}

/// Reads the bearer token, creating it (mode 0600) at first start.
pub fn load_or_create_token(data_dir: &Path) -> Result<String, ServeError> {
    let path = token_path(data_dir);
    let io = |source| ServeError::Io {
        path: path.clone(),
        source,
    };
    if let Ok(t) = std::fs::read_to_string(&path) {
        let t = t.trim().to_string();
        if !t.is_empty() {
            return Ok(t);
        }
    }
    let bytes: [u8; TOKEN_BYTES] = rand::random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = longhaul_engine::private::create(&path).map_err(io)?;
    std::io::Write::write_all(&mut file, token.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(token)
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub queue: Arc<Queue>,
    pub runner: Arc<Runner>,
    pub events: Events,
    token: Arc<str>,
    allow_remote: bool,
    metrics: Arc<Mutex<Option<MetricsEvent>>>,
    ui_dir: Option<PathBuf>,
    data_dir: PathBuf,
    address: String,
    pub packer: Arc<crate::packing::Packer>,
    /// Becomes true when the service begins to stop.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// The dashboard's history, kept across the night and restarts.
    pub history: Arc<Mutex<crate::history::History>>,
    /// What each local model's files say, until they change.
    pub facts: Arc<crate::model_facts::FactsCache>,
    /// The disks' health readings, kept across restarts.
    pub health: Arc<crate::health::HealthMonitor>,
}

impl AppState {
    /// Where this service listens, as `http://ADDR:PORT`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Ends `stream` when the service begins to stop: a graceful shutdown
    /// waits for every response to end, and an event stream never would.
    pub fn until_stopping<S>(&self, stream: S) -> impl Stream<Item = S::Item> + use<S>
    where
        S: Stream + Unpin + Send + 'static,
    {
        let stop = tokio_stream::wrappers::WatchStream::new(self.stopping.clone())
            .filter(|stopping| *stopping)
            .map(|_| None);
        // The stream's own end is a `None` too, or the merge would wait
        // for the stop signal forever.
        stream
            .map(Some)
            .chain(tokio_stream::once(None))
            .merge(stop)
            .take_while(Option::is_some)
            .filter_map(std::convert::identity)
    }

    /// Runs a queue operation off the async threads.
    pub async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Queue) -> Result<T, QueueError> + Send + 'static,
    ) -> ApiResult<T> {
        let queue = Arc::clone(&self.queue);
        tokio::task::spawn_blocking(move || f(&queue))
            .await
            .map_err(|e| ApiError::internal(format!("queue task failed: {e}")))?
            .map_err(ApiError::from)
    }

    /// A registered model and what its files say, with its tokenizer when
    /// `tokenizer` (read off the async threads, and only when they changed).
    pub async fn model_facts(&self, name: &str, tokenizer: bool) -> ApiResult<(ModelEntry, Known)> {
        let name = name.to_string();
        let model = self.blocking(move |q| q.model(&name)).await?;
        let known = self.known(model.clone(), tokenizer).await?;
        Ok((model, known))
    }

    /// What `model`'s files say (see [`Self::model_facts`]).
    pub async fn known(&self, model: ModelEntry, tokenizer: bool) -> ApiResult<Known> {
        let facts = Arc::clone(&self.facts);
        tokio::task::spawn_blocking(move || facts.known(&model, tokenizer))
            .await
            .map_err(|e| ApiError::internal(format!("reading the model's files failed: {e}")))
    }

    /// Adds a job and wakes the runner.
    pub async fn enqueue(&self, job: NewJob) -> ApiResult<JobView> {
        let view = self.blocking(move |q| q.submit(&job)).await?;
        self.runner.control.wake();
        self.runner.announce_queue();
        Ok(view)
    }

    /// Where packs made from the UI keep their manifests.
    pub fn packs_dir(&self) -> PathBuf {
        self.data_dir.join(PACKS_DIR)
    }

    pub fn latest_metrics(&self) -> Option<MetricsEvent> {
        self.metrics.lock().ok().and_then(|m| m.clone())
    }
}

/// JSON bodies whose errors come back in the API's error shape, naming the
/// field serde stumbled on.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_error(&rejection)),
        }
    }
}

fn body_too_large() -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        ..ApiError::bad_request(format!(
            "the request body is larger than the {} MiB limit",
            MAX_BODY_BYTES >> 20
        ))
    }
}

/// Refuses a body whose declared length is over the limit before reading
/// it; bodies without one are cut at the limit as extractors read them.
async fn limit_body(req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return body_too_large().into_response();
    }
    next.run(req).await
}

/// The API error for a body serde or the size limit refused, naming the
/// field at fault where there is one.
fn json_error(rejection: &JsonRejection) -> ApiError {
    let text = rejection.body_text();
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return body_too_large();
    }
    // serde names the path as `field: reason`, or the field in backquotes.
    let detail = text.split_once("target type: ").map_or("", |(_, d)| d);
    let param = match detail.split_once("unknown field `") {
        Some((_, rest)) => rest.split('`').next(),
        None => detail
            .split_once(": ")
            .map(|(path, _)| path)
            .filter(|p| *p != "." && !p.contains(' ')),
    };
    let param = param.map(|p| p.split('.').next().unwrap_or(p).to_string());
    match param {
        Some(p) => ApiError::bad_param(&p, text),
        None => ApiError::bad_request(text),
    }
}

/// A path parameter whose errors come back in the API's error shape.
pub struct ApiPath<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(rejection) => Err(ApiError::bad_param(
                "id",
                format!("{}: {}", parts.uri.path(), rejection.body_text()),
            )),
        }
    }
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The header Anthropic's clients carry their key in.
const ANTHROPIC_KEY_HEADER: &str = "x-api-key";

async fn require_token(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    // Anthropic's clients send the key as `x-api-key`.
    let api_key = req
        .headers()
        .get(ANTHROPIC_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let query = req
        .uri()
        .query()
        .filter(|_| headerless(&req))
        .and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("token="))
                .map(str::to_string)
        });
    let ok = [bearer, api_key, query]
        .into_iter()
        .flatten()
        .any(|t| same(t.as_bytes(), app.token.as_bytes()));
    if !ok {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

/// Whether a request may carry the token in its query: browsers'
/// EventSource and download links cannot set headers, so only the event
/// stream and a job's export (both `GET`, as documented) take it there.
fn headerless(req: &Request) -> bool {
    let path = req.uri().path();
    let job_export = path
        .strip_prefix("/api/jobs/")
        .and_then(|rest| rest.strip_suffix("/export"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
    req.method() == axum::http::Method::GET && (path == "/api/events" || job_export)
}

/// Whether a Host header names this machine: exactly `localhost`,
/// `127.0.0.1` or `[::1]`, with nothing after it but an optional `:PORT`
/// of digits. Anything looser lets a page on another name reach the
/// service by DNS rebinding.
pub fn is_loopback_host(host: &str) -> bool {
    let Some(port) = ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .find_map(|name| host.strip_prefix(name))
    else {
        return false;
    };
    match port.strip_prefix(':') {
        None => port.is_empty(),
        Some(digits) => {
            (1..=5).contains(&digits.len())
                && digits.bytes().all(|b| b.is_ascii_digit())
                && digits
                    .parse::<u32>()
                    .is_ok_and(|p| p <= u32::from(u16::MAX))
        }
    }
}

async fn check_host(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if !app.allow_remote {
        let mut hosts = req.headers().get_all(header::HOST).iter();
        let (first, second) = (hosts.next(), hosts.next());
        let host = first.and_then(|h| h.to_str().ok()).unwrap_or("");
        if second.is_some() {
            return ApiError::forbidden("a request names more than one Host").into_response();
        }
        if !is_loopback_host(host) {
            return ApiError::forbidden(format!(
                "Host `{host}` is not this machine; the service answers only to localhost"
            ))
            .into_response();
        }
    }
    next.run(req).await
}

async fn info(State(app): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "data_dir": app.data_dir,
        "address": app.address,
        "budget_bytes": app.runner.config().streaming.budget_bytes,
        "policy": app.runner.config().streaming.policy.to_string(),
        "cache_dtype": if app.runner.config().streaming.keep_stored_dtype { "stored" } else { "f32" },
        "together": app.runner.config().together,
    }))
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "service": "longhaul", "version": env!("CARGO_PKG_VERSION") }))
}

/// Shown at `/` when no built web UI is found.
async fn no_ui() -> Response {
    Html(concat!(
        "<!doctype html><meta charset=utf-8><title>Longhaul</title>",
        "<h1>Longhaul</h1><p>The service is running, but its web UI is not built here ",
        "(<code>cd ui && npm ci && npm run build</code>). The API is under <code>/api</code> ",
        "and <code>/v1</code> (OpenAI-compatible); the bearer token is in the data dir.</p>"
    ))
    .into_response()
}

pub fn router(app: AppState) -> Router {
    let api = Router::new()
        .route(
            "/api/models",
            get(models::list_models).post(models::add_model),
        )
        .route("/api/models/{name}", delete(models::remove_model))
        .route("/api/models/{name}/probe", post(models::probe))
        .route(
            "/api/packs",
            get(models::list_packs).post(models::start_pack),
        )
        .route("/api/jobs", get(jobs::list).post(jobs::submit))
        .route("/api/jobs/preview", post(jobs::preview))
        .route("/api/jobs/{id}", get(jobs::show).delete(jobs::delete))
        .route("/api/jobs/{id}/export", get(jobs::export))
        .route("/api/jobs/{id}/move", post(jobs::move_job))
        .route("/api/jobs/{id}/{action}", post(jobs::act))
        .route("/api/queue", get(jobs::queue_status))
        .route("/api/queue/{action}", post(jobs::queue_act))
        .route("/api/drives", get(drives::list_drives))
        .route("/api/drives/health", post(drives::refresh_health))
        .route("/api/heat/{model}", get(system::heat))
        .route("/api/info", get(info))
        .route("/api/metrics", get(system::metrics))
        .route("/api/metrics/history", get(system::metrics_history))
        .route(
            "/api/preferences",
            get(system::preferences).put(system::set_preferences),
        )
        .route("/api/events", get(system::events))
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token));
    let origins: Vec<HeaderValue> = DESKTOP_ORIGINS
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    let cors = CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static(ANTHROPIC_KEY_HEADER),
        ]);
    let ui = match app
        .ui_dir
        .clone()
        .filter(|d| d.join("index.html").is_file())
    {
        Some(dir) => Router::new().fallback_service(
            tower_http::services::ServeDir::new(&dir)
                .fallback(tower_http::services::ServeFile::new(dir.join("index.html"))),
        ),
        None => Router::new().route("/", get(no_ui)),
    };
    Router::new()
        .route("/api/health", get(health))
        .merge(api)
        .merge(ui)
        .layer(middleware::from_fn_with_state(app.clone(), check_host))
        .layer(cors)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(limit_body))
        .with_state(app)
}

/// Publishes engine metrics once a second while a model is loaded.
async fn sample_metrics(app: AppState) {
    let mut sampler: Option<(PathBuf, longhaul_engine::MetricsSampler)> = None;
    let mut tick = tokio::time::interval(METRICS_INTERVAL);
    loop {
        tick.tick().await;
        for id in app.runner.control.take_stopped() {
            mark_interruption(&app, id).await;
        }
        let Some((path, engine)) = app.runner.loaded.current() else {
            continue;
        };
        let stats = engine.stats();
        let engine_metrics = stats.as_ref().map(|s| {
            if sampler.as_ref().is_none_or(|(p, _)| *p != path) {
                sampler = Some((path.clone(), longhaul_engine::MetricsSampler::new(s)));
            }
            sampler.as_mut().map(|(_, m)| m.sample(s))
        });
        let budget = stats.map_or(0, |s| s.cache.budget_bytes);
        app.runner.loaded.observe_errors(Some(&engine));
        let event = MetricsEvent {
            model: path.display().to_string(),
            running_job: app.runner.control.running(),
            tokens_per_second: app.runner.tokens_per_second(),
            engine: engine_metrics.flatten(),
            budget_bytes: budget,
            prefix: engine.prefix_stats(),
        };
        if let Ok(mut m) = app.metrics.lock() {
            *m = Some(event.clone());
        }
        if let Ok(mut h) = app.history.lock() {
            h.record(&event, crate::queue::now_unix());
        }
        app.events.publish(Event::Metrics(Box::new(event)));
    }
}

/// Marks on the history's time axis that job `id` stopped running without
/// finishing: paused (by the user, the queue, a drive), failed or cut off.
async fn mark_interruption(app: &AppState, id: i64) {
    let Ok(job) = app.blocking(move |q| q.job(id)).await else {
        return;
    };
    let (kind, text) = match job.state {
        crate::queue::JobState::Paused => ("paused", job.pause_reason.unwrap_or_default()),
        crate::queue::JobState::Failed => ("failed", job.error.unwrap_or_default()),
        crate::queue::JobState::Interrupted => ("interrupted", String::new()),
        _ => return,
    };
    let t = crate::queue::now_unix();
    if let Ok(mut h) = app.history.lock() {
        h.mark(crate::history::Mark {
            t,
            job: id,
            kind: kind.into(),
            text: format!(
                "{}: {kind}{}",
                job.title,
                if text.is_empty() {
                    String::new()
                } else {
                    format!(" — {text}")
                }
            ),
        });
    }
}

/// Opens the data dir's queue (created private), tightens what is not, and
/// recovers the jobs the last service left running (see [`Queue::recover`]).
fn open_queue(data_dir: &crate::data_dir::DataDir) -> Result<Queue, ServeError> {
    let db = queue_path(data_dir.path());
    match std::fs::metadata(&db) {
        Err(_) => {
            // SQLite gives its WAL and shared-memory files the database's mode.
            crate::data_dir::write_private(&db, b"").map_err(|source| ServeError::Io {
                path: db.clone(),
                source,
            })?;
        }
        Ok(m) if m.len() == 0 && !db.with_extension("sqlite-wal").exists() => {
            tracing::warn!(
                "{} is empty (0 bytes): starting with an empty queue; if it held jobs, the file was truncated",
                db.display()
            );
        }
        Ok(_) => {}
    }
    // Files already there were tightened by the claim; new ones are private.
    let queue = Queue::open(&db)?;
    for path in &data_dir.tightened {
        tracing::warn!(
            "{} was readable by other users; it is now private to its owner",
            path.display()
        );
    }
    // The record a crashed service left is read before the handlers that
    // write the next one are installed.
    let crash = crate::runner::crash::take_last(data_dir.path());
    if let Err(e) = crate::runner::crash::install(data_dir.path()) {
        tracing::warn!(
            "cannot record crashes in {}: {e}",
            data_dir.path().display()
        );
    }
    let recovered = queue.recover(crash.as_ref())?;
    if !recovered.is_empty() {
        tracing::info!("{} interrupted job(s) will resume", recovered.len());
    }
    Ok(queue)
}

/// How long open requests may take to end once the service begins to stop.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// The data dir's folder of packs made through the service.
const PACKS_DIR: &str = "packs";
/// How long stopping waits for the runner to finish its job's step.
const RUNNER_STOP_LIMIT: Duration = Duration::from_secs(10);
/// How often stopping looks whether the runner has.
const RUNNER_STOP_POLL: Duration = Duration::from_millis(20);

/// Opens the data dir and queue, recovers interrupted jobs, starts the runner
/// and serves until `shutdown` resolves. `ready` gets the bound address.
pub async fn serve(
    config: ServeConfig,
    ready: impl FnOnce(SocketAddr, &str),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if !config.allow_remote && !config.addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback { addr: config.addr });
    }
    let mut data_dir = crate::data_dir::DataDir::claim(&config.data_dir)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let token = load_or_create_token(&config.data_dir)?;
    let queue = Arc::new(open_queue(&data_dir)?);
    let events = Events::default();
    let runner = Arc::new(Runner::new(
        Arc::clone(&queue),
        events.clone(),
        config.runner.clone(),
    ));
    let handle = runner.spawn().map_err(|source| ServeError::Io {
        path: config.data_dir.clone(),
        source,
    })?;
    crate::drive_watch::spawn(Arc::clone(&runner)).map_err(|source| ServeError::Io {
        path: config.data_dir.clone(),
        source,
    })?;
    let app = AppState {
        queue,
        runner: Arc::clone(&runner),
        events,
        token: Arc::from(token.as_str()),
        allow_remote: config.allow_remote,
        metrics: Arc::new(Mutex::new(None)),
        ui_dir: config.ui_dir.clone(),
        data_dir: config.data_dir.clone(),
        address: String::new(),
        packer: Arc::new(crate::packing::Packer::recover(
            &config.data_dir.join(PACKS_DIR),
        )),
        stopping: stop_rx.clone(),
        history: Arc::new(Mutex::new(crate::history::History::open(Some(
            config.data_dir.join(crate::history::HISTORY_FILE),
        )))),
        facts: Arc::default(),
        health: Arc::new(crate::health::HealthMonitor::open(&config.data_dir)),
    };
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: config.addr,
        source,
    })?;
    let app = AppState {
        address: format!("http://{addr}"),
        ..app
    };
    if let Err(e) = data_dir.set_address(&app.address) {
        tracing::warn!("{e}");
    }
    tokio::spawn(sample_metrics(app.clone()));
    tokio::spawn(drives::watch_health(app.clone()));
    let history = Arc::clone(&app.history);
    ready(addr, &token);
    let listener = conn::Guarded::new(listener, conn::Limits::default());
    let signal = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let served = axum::serve(listener, router(app))
        .with_graceful_shutdown(signal)
        .into_future();
    // Responses get a while to end once stopping begins; then the service stops anyway.
    let mut stopping = stop_rx;
    let drained = async move {
        let _ = stopping.wait_for(|s| *s).await;
        tokio::time::sleep(DRAIN_LIMIT).await;
    };
    let served = tokio::select! {
        served = served => served,
        () = drained => {
            tracing::warn!("requests still open {DRAIN_LIMIT:?} after the stop began; stopping anyway");
            Ok(())
        }
    };
    runner.control.shutdown();
    if let Ok(mut h) = history.lock() {
        h.flush();
    }
    // The runner stops at its next cancellation point; one stuck in a read
    // that never returns must not keep the service from stopping.
    // Polled rather than joined on a blocking thread: the async runtime
    // waits for its blocking threads when it ends, and would wait for a
    // stuck runner too.
    let began = std::time::Instant::now();
    while !handle.is_finished() && began.elapsed() < RUNNER_STOP_LIMIT {
        tokio::time::sleep(RUNNER_STOP_POLL).await;
    }
    if handle.is_finished() {
        let _ = handle.join();
    } else {
        tracing::warn!(
            "the runner had not stopped {RUNNER_STOP_LIMIT:?} after the stop began; stopping without it (its job resumes at the next start)"
        );
    }
    served.map_err(|source| ServeError::Io {
        path: config.data_dir,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_are_this_machine() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:7433",
            "localhost:1",
            "[::1]:80",
            "[::1]",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.com",
            "evil.com:7433",
            "192.168.1.2:7433",
            "localhost.evil.com",
            "",
            "[::1]evil.com",
            "localhost:evil.com",
            "127.0.0.1:7433@evil.com",
            "localhost:",
            "localhost:99999",
            "localhost:+80",
            "::1",
            "127.0.0.1.evil.com",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn the_token_is_created_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create_token(dir.path()).unwrap();
        let b = load_or_create_token(dir.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 2 * TOKEN_BYTES);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(token_path(dir.path()))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
