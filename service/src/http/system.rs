//! `/api/metrics` and `/api/events`: what the dashboards draw; and the
//! preferences the desktop app and the web UI share.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::{Stream, StreamExt};

use super::AppState;
use super::error::ApiResult;
use crate::queue::ModelKind;

/// How often an idle event stream sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub async fn metrics(State(app): State<AppState>) -> Json<Value> {
    Json(json!({
        "metrics": app.latest_metrics(),
        "queue_paused": app.runner.control.queue_paused(),
        "running_job": app.runner.control.running(),
        "event_subscribers": app.events.subscribers(),
    }))
}

/// Preferences the desktop app and the web UI share, kept in the data dir.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Preferences {
    /// The desktop app says when a task finishes or fails (on by default).
    pub notify_when_done: bool,
}

impl Default for Preferences {
    fn default() -> Self {
        Self {
            notify_when_done: true,
        }
    }
}

/// The file in the data dir.
const PREFERENCES_FILE: &str = "preferences.json";

fn read_preferences(data_dir: &std::path::Path) -> Preferences {
    std::fs::read_to_string(data_dir.join(PREFERENCES_FILE))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// `GET /api/preferences`.
pub async fn preferences(State(app): State<AppState>) -> Json<Preferences> {
    Json(read_preferences(&app.data_dir))
}

/// `PUT /api/preferences`: replaces them (absent fields take defaults).
pub async fn set_preferences(
    State(app): State<AppState>,
    super::ApiJson(p): super::ApiJson<Preferences>,
) -> super::error::ApiResult<Json<Preferences>> {
    let text = serde_json::to_vec_pretty(&p)
        .map_err(|e| super::error::ApiError::internal(e.to_string()))?;
    let path = app.data_dir.join(PREFERENCES_FILE);
    crate::data_dir::write_private(&path, &text).map_err(|e| {
        super::error::ApiError::internal(format!("cannot write {}: {e}", path.display()))
    })?;
    Ok(Json(p))
}

/// `GET /api/metrics/history`: the last ten minutes a second at a time, the
/// last week a minute at a time, and what interrupted tasks (see
/// [`crate::history`]).
pub async fn metrics_history(State(app): State<AppState>) -> Json<Value> {
    let Ok(h) = app.history.lock() else {
        return Json(json!({ "recent": [], "minutes": [], "marks": [] }));
    };
    let recent: Vec<_> = h.recent().cloned().collect();
    let marks: Vec<_> = h.marks().cloned().collect();
    Json(json!({ "recent": recent, "minutes": h.minutes(), "marks": marks }))
}

/// Server-sent events: `job`, `queue` and `metrics` events as JSON.
pub async fn events(
    State(app): State<AppState>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let stream = event_stream(app.events.subscribe())
        .map(|(name, data)| Ok(SseEvent::default().event(name).data(data.to_string())));
    Sse::new(app.until_stopping(Box::pin(stream))).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// (name, data) of each event for one subscriber: a `resync` first and
/// wherever it fell behind, then every event in order (see [`crate::events`]).
pub fn event_stream(
    rx: tokio::sync::broadcast::Receiver<crate::events::Event>,
) -> impl Stream<Item = (&'static str, Value)> {
    use crate::events::Event;
    use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
    let first = tokio_stream::once(("resync", json!({ "reason": "connected" })));
    let rest = BroadcastStream::new(rx).filter_map(|item| match item {
        Err(BroadcastStreamRecvError::Lagged(missed)) => Some((
            "resync",
            json!({ "reason": "fell behind", "missed": missed }),
        )),
        Ok(event) => {
            let name = match &event {
                Event::Job(_) => "job",
                Event::Queue(_) => "queue",
                Event::Metrics(_) => "metrics",
            };
            Some((name, serde_json::to_value(&event).ok()?))
        }
    });
    first.chain(rest)
}

/// `GET /api/heat/{model}`: the pack's heat histogram as a layers × experts matrix.
pub async fn heat(
    State(app): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> ApiResult<Json<Value>> {
    let model = app.blocking(move |q| q.model(&name)).await?;
    let ModelKind::Local { path } = model.kind else {
        return Err(super::error::ApiError::bad_param(
            "model",
            "a remote model keeps no heat histogram here",
        ));
    };
    let result = tokio::task::spawn_blocking(move || {
        let Ok(manifest) = longhaul_engine::tools::Manifest::read(&path) else {
            // A checkpoint held in RAM streams nothing, so it has no heat.
            return json!({ "layers": [], "experts": 0, "heat": [] });
        };
        let heat = longhaul_engine::tools::HeatMap::load(&path);
        let values: std::collections::HashMap<(usize, usize), f64> =
            heat.hottest().into_iter().collect();
        let layers: Vec<usize> = manifest.experts.layers.iter().map(|l| l.layer).collect();
        let experts = manifest
            .experts
            .layers
            .iter()
            .map(|l| l.records.len())
            .max()
            .unwrap_or(0);
        let rows: Vec<Vec<f64>> = if values.is_empty() {
            Vec::new()
        } else {
            layers
                .iter()
                .map(|&l| {
                    (0..experts)
                        .map(|e| values.get(&(l, e)).copied().unwrap_or(0.0))
                        .collect()
                })
                .collect()
        };
        let layers = if rows.is_empty() { Vec::new() } else { layers };
        json!({ "layers": layers, "experts": experts, "heat": rows })
    })
    .await
    .map_err(|e| super::error::ApiError::internal(e.to_string()))?;
    Ok(Json(result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, Events, QueueOrder};

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_to_resync_never_left_with_a_gap() {
        let events = Events::with_backlog(4);
        let stream = event_stream(events.subscribe());
        for i in 0..10 {
            events.publish(Event::Queue(QueueOrder { waiting: vec![i] }));
        }
        drop(events);
        let got: Vec<(&str, Value)> = stream.collect().await;
        let names: Vec<&str> = got.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            ["resync", "resync", "queue", "queue", "queue", "queue"]
        );
        assert_eq!(got[0].1["reason"], "connected");
        assert_eq!(got[1].1["missed"], 6);
        // After the resync, every later event in order.
        let waiting: Vec<&Value> = got[2..].iter().map(|(_, v)| &v["waiting"][0]).collect();
        assert_eq!(waiting, [6, 7, 8, 9]);
    }
}
