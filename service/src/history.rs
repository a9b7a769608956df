//! The dashboard's history, kept by the service so that the night is still
//! there in the morning: a tab holds only what it saw while open, and a tab
//! opened at 8 am saw nothing of 2 am.
//!
//! Two tiers: one point a second for the last [`RECENT_POINTS`] seconds (the
//! live charts), and one point a minute — averages of its seconds — for
//! [`MINUTE_POINTS`] minutes (a week). Minute points are appended to
//! `metrics-history.jsonl` in the data dir as they close and once more when
//! the service stops; the file is rewritten to the newest week when it
//! holds twice that, so it stays under ~6 MB (a point is ~300 bytes with
//! four drives). A line cut short by a crash is skipped on reading.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::events::MetricsEvent;

/// One-second points kept: ten minutes.
pub const RECENT_POINTS: usize = 600;
/// One-minute points kept: a week.
pub const MINUTE_POINTS: usize = 7 * 24 * 60;
/// Seconds a minute point covers.
const MINUTE_SECONDS: f64 = 60.0;
/// The file in the data dir.
pub const HISTORY_FILE: &str = "metrics-history.jsonl";
/// Marks kept (pauses, faults, failures): a busy week's worth.
pub const MARKS_KEPT: usize = 1000;

/// What one interval saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Unix time at the end of the interval, in seconds.
    pub t: f64,
    /// Seconds the point covers.
    pub seconds: f64,
    pub drives: Vec<DrivePoint>,
    /// Cache hits over lookups in the interval (none: no lookups).
    pub hit_rate: Option<f64>,
    /// Share of the experts asked for that the pilot had predicted.
    pub recall: Option<f64>,
    pub tokens_per_second: Option<f64>,
    pub held_bytes: u64,
    pub budget_bytes: u64,
    pub running_job: Option<i64>,
}

/// Something that interrupted a task, drawn on the charts' time axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    pub t: f64,
    pub job: i64,
    /// `paused`, `failed` or `interrupted`.
    pub kind: String,
    pub text: String,
}

/// A line of the history file: a minute point or a mark.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Mark { mark: Mark },
    Point(Point),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrivePoint {
    pub path: String,
    pub mb_per_s: f64,
    pub busy_share: f64,
}

/// Counters the previous sample ended at, to turn totals into interval rates.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    hits: u64,
    misses: u64,
    demanded: u64,
    correct: u64,
}

#[derive(Debug)]
pub struct History {
    file: Option<PathBuf>,
    recent: VecDeque<Point>,
    minutes: VecDeque<Point>,
    marks: VecDeque<Mark>,
    /// Seconds of the minute not yet closed.
    open: Vec<Point>,
    last: Option<(String, Totals)>,
    /// Lines in the file, to know when to rewrite it.
    file_lines: usize,
}

impl History {
    /// The history kept in `file` (none: kept in memory only).
    pub fn open(file: Option<PathBuf>) -> Self {
        let (mut minutes, mut marks) = file.as_deref().map(read_lines).unwrap_or_default();
        let file_lines = minutes.len() + marks.len();
        while minutes.len() > MINUTE_POINTS {
            minutes.pop_front();
        }
        while marks.len() > MARKS_KEPT {
            marks.pop_front();
        }
        Self {
            file,
            recent: VecDeque::new(),
            minutes,
            marks,
            open: Vec::new(),
            last: None,
            file_lines,
        }
    }

    /// Records one metrics sample taken at unix time `t`.
    pub fn record(&mut self, event: &MetricsEvent, t: f64) {
        let point = self.point(event, t);
        self.recent.push_back(point.clone());
        while self.recent.len() > RECENT_POINTS {
            self.recent.pop_front();
        }
        let closes = self
            .open
            .first()
            .is_some_and(|first| t - first.t + first.seconds >= MINUTE_SECONDS);
        self.open.push(point);
        if closes {
            self.close_minute();
        }
    }

    /// Closes the minute in progress (the service is stopping).
    pub fn flush(&mut self) {
        if !self.open.is_empty() {
            self.close_minute();
        }
    }

    /// Records that task `job` was interrupted at unix time `t`.
    pub fn mark(&mut self, mark: Mark) {
        self.marks.push_back(mark.clone());
        while self.marks.len() > MARKS_KEPT {
            self.marks.pop_front();
        }
        if let Err(e) = self.append(&Line::Mark { mark }) {
            tracing::warn!("cannot keep the metrics history: {e}");
        }
    }

    pub fn marks(&self) -> impl Iterator<Item = &Mark> {
        self.marks.iter()
    }

    pub fn recent(&self) -> impl Iterator<Item = &Point> {
        self.recent.iter()
    }

    /// Minute points, and the minute in progress as one more.
    pub fn minutes(&self) -> Vec<Point> {
        let mut all: Vec<Point> = self.minutes.iter().cloned().collect();
        all.extend(average(&self.open));
        all
    }

    fn point(&mut self, event: &MetricsEvent, t: f64) -> Point {
        let engine = event.engine.as_ref();
        let totals = engine.map(|e| Totals {
            hits: e.cache.hits,
            misses: e.cache.misses,
            demanded: e.pilot.demanded,
            correct: e.pilot.correct,
        });
        // Rates need the previous totals of the same model.
        let before = self
            .last
            .as_ref()
            .filter(|(model, _)| *model == event.model)
            .map(|(_, t)| *t);
        if let Some(now) = totals {
            self.last = Some((event.model.clone(), now));
        }
        let share = |part: u64, whole: u64| (whole > 0).then(|| part as f64 / whole as f64);
        let (hit_rate, recall) = match (before, totals) {
            (Some(b), Some(n)) => (
                share(
                    n.hits.saturating_sub(b.hits),
                    (n.hits + n.misses).saturating_sub(b.hits + b.misses),
                ),
                share(
                    n.correct.saturating_sub(b.correct),
                    n.demanded.saturating_sub(b.demanded),
                ),
            ),
            _ => (None, None),
        };
        Point {
            t,
            seconds: engine.map_or(1.0, |e| e.interval_seconds),
            drives: engine
                .map(|e| {
                    e.drives
                        .iter()
                        .map(|d| DrivePoint {
                            path: d.path.display().to_string(),
                            mb_per_s: d.mb_per_s,
                            busy_share: d.busy_share,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            hit_rate,
            recall,
            tokens_per_second: event.tokens_per_second,
            held_bytes: engine.map_or(0, |e| e.cache.held_bytes),
            budget_bytes: event.budget_bytes,
            running_job: event.running_job,
        }
    }

    fn close_minute(&mut self) {
        let Some(minute) = average(&self.open) else {
            return;
        };
        self.open.clear();
        self.minutes.push_back(minute.clone());
        while self.minutes.len() > MINUTE_POINTS {
            self.minutes.pop_front();
        }
        if let Err(e) = self.append(&Line::Point(minute)) {
            tracing::warn!("cannot keep the metrics history: {e}");
        }
    }

    fn append(&mut self, line: &Line) -> std::io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        if self.file_lines >= 2 * (MINUTE_POINTS + MARKS_KEPT) {
            // Rewrite to what is kept, through a temporary file.
            let tmp = file.with_extension("jsonl.tmp");
            let mut text = String::new();
            let kept = self
                .marks
                .iter()
                .map(|m| Line::Mark { mark: m.clone() })
                .chain(self.minutes.iter().cloned().map(Line::Point));
            for l in kept {
                text.push_str(&serde_json::to_string(&l).map_err(std::io::Error::other)?);
                text.push('\n');
            }
            crate::data_dir::write_private(&tmp, text.as_bytes())?;
            std::fs::rename(&tmp, file)?;
            self.file_lines = self.minutes.len() + self.marks.len();
            return Ok(());
        }
        let mut line = serde_json::to_string(line).map_err(std::io::Error::other)?;
        line.push('\n');
        let mut f = open_private_append(file)?;
        f.write_all(line.as_bytes())?;
        self.file_lines += 1;
        Ok(())
    }
}

fn open_private_append(path: &Path) -> std::io::Result<std::fs::File> {
    crate::data_dir::private_options()
        .create(true)
        .append(true)
        .open(path)
}

/// The points and marks of a file; lines that do not parse (a crash cut
/// the last one short) are skipped.
fn read_lines(path: &Path) -> (VecDeque<Point>, VecDeque<Mark>) {
    let (mut points, mut marks) = (VecDeque::new(), VecDeque::new());
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Line>(l).ok())
    {
        match line {
            Line::Point(p) => points.push_back(p),
            Line::Mark { mark } => marks.push_back(mark),
        }
    }
    (points, marks)
}

/// One point standing for `points`: rates averaged over time, memory and
/// the running job as at the end.
fn average(points: &[Point]) -> Option<Point> {
    let last = points.last()?;
    let seconds: f64 = points.iter().map(|p| p.seconds).sum();
    let weighted = |f: &dyn Fn(&Point) -> Option<f64>| {
        let (sum, weight) = points
            .iter()
            .filter_map(|p| f(p).map(|v| (v * p.seconds, p.seconds)))
            .fold((0.0, 0.0), |(s, w), (v, x)| (s + v, w + x));
        (weight > 0.0).then(|| sum / weight)
    };
    let drives = last
        .drives
        .iter()
        .map(|d| {
            let of = |p: &Point| p.drives.iter().find(|x| x.path == d.path).cloned();
            DrivePoint {
                path: d.path.clone(),
                mb_per_s: weighted(&|p| of(p).map(|x| x.mb_per_s)).unwrap_or(0.0),
                busy_share: weighted(&|p| of(p).map(|x| x.busy_share)).unwrap_or(0.0),
            }
        })
        .collect();
    Some(Point {
        t: last.t,
        seconds,
        drives,
        hit_rate: weighted(&|p| p.hit_rate),
        recall: weighted(&|p| p.recall),
        tokens_per_second: weighted(&|p| p.tokens_per_second),
        held_bytes: last.held_bytes,
        budget_bytes: last.budget_bytes,
        running_job: last.running_job,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(tok: f64) -> MetricsEvent {
        MetricsEvent {
            model: "m".into(),
            running_job: Some(1),
            tokens_per_second: Some(tok),
            engine: None,
            budget_bytes: 10,
            prefix: None,
        }
    }

    #[test]
    fn seconds_become_minute_averages_that_outlive_the_service() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(HISTORY_FILE);
        let mut h = History::open(Some(file.clone()));
        for s in 0..90 {
            h.record(&event(if s < 30 { 1.0 } else { 4.0 }), 1000.0 + s as f64);
        }
        assert_eq!(h.recent().count(), 90);
        let closed = h.minutes();
        assert_eq!(closed.len(), 2, "one closed minute and the one in progress");
        // The first minute: 30 s at 1 tok/s and 30 s at 4.
        assert!(
            (closed[0].tokens_per_second.unwrap() - 2.5).abs() < 1e-9,
            "{closed:?}"
        );
        h.flush();
        drop(h);
        let reopened = History::open(Some(file.clone()));
        assert_eq!(
            reopened.minutes().len(),
            2,
            "both minutes were kept on disk"
        );
        assert_eq!(reopened.recent().count(), 0);
        // A line cut short by a crash is skipped.
        std::fs::write(
            &file,
            format!("{}\n{{\"t\": 1", std::fs::read_to_string(&file).unwrap()),
        )
        .unwrap();
        assert_eq!(History::open(Some(file)).minutes().len(), 2);
    }

    #[test]
    fn the_file_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(HISTORY_FILE);
        let mut h = History::open(Some(file.clone()));
        for m in 0..(2 * (MINUTE_POINTS + MARKS_KEPT) + 5) {
            h.record(&event(1.0), m as f64 * 60.0);
            h.flush();
        }
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        assert!(lines <= 2 * (MINUTE_POINTS + MARKS_KEPT), "{lines} lines");
        assert_eq!(History::open(Some(file)).minutes().len(), MINUTE_POINTS);
    }
}
