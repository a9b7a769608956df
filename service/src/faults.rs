//! Failure points that tests switch on, so failure paths run in CI and not
//! only by hand. `LONGHAUL_FAULTS` holds comma-separated `name=value`
//! entries; unset (as for every user), each point costs one lookup in an
//! empty list.
//!
//! - `abort-job=ID`: the service aborts (SIGABRT) when it starts job ID, as
//!   an allocation failure would.

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
