//! Longhaul's job service: a durable SQLite queue of long-form tasks, the
//! runner that works through it with one loaded model, and the HTTP API the
//! CLI, the web UI and OpenAI-compatible clients talk to.

pub mod attach;
pub mod client;
pub mod data_dir;
pub mod devices;
pub mod drive_errors;
pub mod drive_watch;
pub mod events;
pub mod fault_retry;
pub mod faults;
pub mod forecast;
pub mod health;
pub mod history;
pub mod http;
pub mod install;
pub mod model_facts;
pub mod packing;
pub mod platform;
pub mod probe;
pub mod queue;
pub mod runner;
pub mod supervisor;
