//! Any bytes as a `POST /api/jobs` body: accepted or an API error, never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = longhaul_service::http::jobs::check_submission(data);
});
