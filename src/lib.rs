//! gpuwatch: a GPU watchdog for unattended deep-learning training.
//!
//! Data flows one way: [`sampler`] → [`model::Snapshot`] → [`engine`] (windows → rules → alert
//! lifecycle) → [`model::AlertEvent`] → [`notify`] and [`action`]; the recorder is a side output.
//! The engine is a pure function of timestamped samples, which makes `replay` and `test` exact.
//! [`pipeline`] wires the live commands; `docs/architecture.md` is the map of the layers.

/// `eprintln!` that ignores a failed write: a terminal that went away (a closed ssh session, a
/// `| head` that ended) must not take down `run`, which would take the job's pipes with it.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod action;
pub mod alert;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod exporter;
pub mod import;
pub mod job;
pub mod model;
pub mod notify;
pub mod pipeline;
pub mod record;
pub mod report;
pub mod rules;
pub mod sampler;
pub mod silence;
pub mod sys;
pub mod top;
pub mod trace;
pub mod usage;
pub mod values;
pub mod window;
