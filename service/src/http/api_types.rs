//! The web UI's API types, generated from the types the service
//! serializes, so the UI cannot drift from what it is sent (hand-kept
//! copies had: the UI's `Job` lacked `updated_ms` and `pause_cause`).
//! `ui/src/api-types.ts` is this module's output; a test checks it is
//! current, and writes it when `LONGHAUL_WRITE_API_TYPES` is set.

use std::collections::BTreeMap;

use ts_rs::{Config, TS, TypeVisitor};

/// The generated file, from the workspace's root.
pub const API_TYPES_FILE: &str = "ui/src/api-types.ts";

/// What the generated file begins with.
const HEADER: &str = "// Generated from the service's Rust types (service/src/http/api_types.rs);\n// do not edit. After changing one of them: LONGHAUL_WRITE_API_TYPES=1 cargo test -p longhaul-service api_types\n";

/// Every declaration reached from the API's answers and events, by name.
struct Declarations {
    cfg: Config,
    by_name: BTreeMap<String, String>,
}

impl TypeVisitor for Declarations {
    fn visit<T: TS + 'static + ?Sized>(&mut self) {
        // Primitives and containers have no file of their own: they are
        // written inline, and what they hold is visited through them.
        if T::output_path().is_none() {
            return;
        }
        let name = T::ident(&self.cfg);
        if self.by_name.contains_key(&name) {
            return;
        }
        let docs = T::docs().unwrap_or_default();
        let decl = format!("{docs}export {}\n", T::decl(&self.cfg));
        self.by_name.insert(name, decl);
        T::visit_dependencies(self);
    }
}

/// The TypeScript of the API's types: the jobs, models, drives and
/// forecasts the UI reads, and the events it is sent, with every type they
/// hold, sorted by name. Integers are numbers: no figure the API sends
/// comes near 2^53.
pub fn typescript() -> String {
    let mut all = Declarations {
        cfg: Config::new().with_large_int("number"),
        by_name: BTreeMap::new(),
    };
    all.visit::<super::jobs::ShownJob>();
    all.visit::<crate::events::JobProgress>();
    all.visit::<crate::events::MetricsEvent>();
    all.visit::<super::models::ModelListing>();
    all.visit::<super::drives::DriveView>();
    all.visit::<crate::forecast::Forecast>();
    let mut out = String::from(HEADER);
    for decl in all.by_name.values() {
        out.push('\n');
        out.push_str(decl);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_types_are_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(API_TYPES_FILE);
        let generated = typescript();
        if std::env::var_os("LONGHAUL_WRITE_API_TYPES").is_some() {
            assert!(
                std::fs::write(&path, &generated).is_ok(),
                "cannot write {}",
                path.display()
            );
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{API_TYPES_FILE} is not what the service's types generate; write it again with LONGHAUL_WRITE_API_TYPES=1 cargo test -p longhaul-service api_types"
        );
    }
}
