//! The `job` object job rules see: `job.step`, `job.epoch`, `job.progress_age()`, `job.pid`,
//! `job.command`, `job.gpus` (the engine's `gpu` objects of the GPUs the job is on), the pace
//! (`job.fraction`, `job.target`, `job.eta()`, `job.deadline_in()`, `job.clock_in(s)`), and how
//! the job ended.
//!
//! Values that are not known (no progress line seen yet, the job still running) are `()`, the
//! rules engine's "no data", so comparisons with them do not fire. Registered into the rules
//! engine with `register`.

use std::sync::Arc;

use rhai::{Dynamic, Engine};

use crate::model::job::{CrashClass, JobExit, JobSample};

/// A by-value handle on one job sample (cheap to clone).
#[derive(Debug, Clone)]
pub struct JobHandle {
    /// The sample.
    pub sample: Arc<JobSample>,
    /// GPU indices the job's processes are on (empty when unknown).
    pub gpus: Arc<Vec<u32>>,
    /// The rules engine's `gpu` handles of those GPUs (`job.gpus`), set by the engine.
    pub gpu_handles: rhai::Array,
}

impl JobHandle {
    /// A handle on `sample`, which is on `gpus`.
    pub fn new(sample: JobSample, gpus: Vec<u32>) -> JobHandle {
        JobHandle {
            sample: Arc::new(sample),
            gpus: Arc::new(gpus),
            gpu_handles: rhai::Array::new(),
        }
    }
}

fn opt_int(v: Option<i64>) -> Dynamic {
    v.map_or(Dynamic::UNIT, Dynamic::from_int)
}

fn opt_float(v: Option<f64>) -> Dynamic {
    v.map_or(Dynamic::UNIT, Dynamic::from_float)
}

/// Registers the `Job` type and its properties.
pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<JobHandle>("Job");
    engine.register_get("pid", |j: &mut JobHandle| i64::from(j.sample.pid));
    engine.register_get("command", |j: &mut JobHandle| j.sample.command.clone());
    engine.register_get("step", |j: &mut JobHandle| opt_int(j.sample.progress.step));
    engine.register_get("total_steps", |j: &mut JobHandle| {
        opt_int(j.sample.progress.total_steps)
    });
    engine.register_get("epoch", |j: &mut JobHandle| {
        opt_float(j.sample.progress.epoch)
    });
    engine.register_get("total_epochs", |j: &mut JobHandle| {
        opt_int(j.sample.progress.total_epochs)
    });
    engine.register_get("progress", |j: &mut JobHandle| j.sample.progress.describe());
    engine.register_get("has_progress", |j: &mut JobHandle| {
        j.sample.progress.last_progress_ms.is_some()
    });
    engine.register_fn("progress_age", |j: &mut JobHandle| {
        opt_float(j.sample.progress_age_s())
    });
    engine.register_fn("eta", |j: &mut JobHandle| opt_float(j.sample.eta_s()));
    engine.register_fn("deadline_in", |j: &mut JobHandle| {
        opt_float(j.sample.deadline_in_s())
    });
    engine.register_get("fraction", |j: &mut JobHandle| {
        opt_float(j.sample.progress.fraction())
    });
    engine.register_get("target", |j: &mut JobHandle| {
        j.sample
            .progress
            .target()
            .map_or(Dynamic::UNIT, Dynamic::from)
    });
    // `job.clock_in(s)`: the local time `HH:MM` s seconds from the sample.
    engine.register_fn("clock_in", |j: &mut JobHandle, s: f64| {
        j.sample.clock(j.sample.time_ms + (s * 1000.0) as i64)
    });
    engine.register_get("alive", |j: &mut JobHandle| j.sample.alive);
    engine.register_get("ended", |j: &mut JobHandle| j.sample.exit.is_some());
    engine.register_get("runtime", |j: &mut JobHandle| {
        (j.sample.time_ms - j.sample.started_at_ms).max(0) as f64 / 1000.0
    });
    engine.register_get("exit_code", |j: &mut JobHandle| match j.sample.exit {
        Some(JobExit::Exited { code }) => Dynamic::from_int(i64::from(code)),
        _ => Dynamic::UNIT,
    });
    engine.register_get("signal", |j: &mut JobHandle| match j.sample.exit {
        Some(JobExit::Signaled { signal, .. }) => Dynamic::from_int(i64::from(signal)),
        _ => Dynamic::UNIT,
    });
    engine.register_get("crash_class", |j: &mut JobHandle| {
        j.sample.crash_class.map_or(Dynamic::UNIT, |c| {
            Dynamic::from(
                serde_json::to_value(c)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            )
        })
    });
    engine.register_get("failed", |j: &mut JobHandle| {
        j.sample.crash_class.is_some_and(CrashClass::is_failure)
    });
    engine.register_get("gpu_indices", |j: &mut JobHandle| {
        j.gpus
            .iter()
            .map(|&g| Dynamic::from_int(i64::from(g)))
            .collect::<rhai::Array>()
    });
    engine.register_get("gpus", |j: &mut JobHandle| j.gpu_handles.clone());
    // `seconds("10m")` → 600.0: compare ages and runtimes with duration parameters.
    engine.register_fn(
        "seconds",
        |d: Dynamic| -> Result<f64, Box<rhai::EvalAltResult>> {
            if let Some(s) = d.read_lock::<rhai::ImmutableString>() {
                return crate::values::parse_duration_ms(&s)
                    .map(|ms| ms as f64 / 1000.0)
                    .map_err(Into::into);
            }
            d.as_float()
                .or_else(|_| d.as_int().map(|i| i as f64))
                .map_err(|t| {
                    format!("seconds(): expected a duration such as \"5m\", got {t}").into()
                })
        },
    );
    engine.register_fn("to_string", |j: &mut JobHandle| {
        format!("job {} ({})", j.sample.pid, j.sample.progress.describe())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::ProgressState;

    fn sample() -> JobSample {
        JobSample {
            time_ms: 100_000,
            pid: 42,
            start_ticks: None,
            command: "python train.py".into(),
            started_at_ms: 10_000,
            progress: {
                let mut p = ProgressState::default();
                let u = crate::model::job::ProgressUpdate {
                    step: Some(1200),
                    epoch: Some(3.0),
                    ..Default::default()
                };
                p.apply(&u, "epoch 3 step 1200", 40_000);
                p
            },
            alive: true,
            exit: None,
            crash_class: None,
            pids: vec![42],
            deadline_ms: None,
            utc_offset_s: 0,
            tail: Vec::new(),
        }
    }

    fn eval(script: &str, s: JobSample) -> Dynamic {
        let mut engine = Engine::new();
        register(&mut engine);
        let mut scope = rhai::Scope::new();
        scope.push("job", JobHandle::new(s, vec![0, 1]));
        engine
            .eval_with_scope::<Dynamic>(&mut scope, script)
            .unwrap()
    }

    #[test]
    fn properties() {
        assert_eq!(eval("job.step", sample()).as_int().unwrap(), 1200);
        assert_eq!(eval("job.epoch", sample()).as_float().unwrap(), 3.0);
        assert_eq!(
            eval("job.progress_age()", sample()).as_float().unwrap(),
            60.0
        );
        assert_eq!(eval("job.runtime", sample()).as_float().unwrap(), 90.0);
        assert_eq!(eval("job.pid", sample()).as_int().unwrap(), 42);
        assert!(eval("job.command", sample())
            .into_string()
            .unwrap()
            .contains("train"));
        assert!(eval("job.alive && !job.ended", sample()).as_bool().unwrap());
        assert!(eval("job.exit_code", sample()).is_unit());
        assert_eq!(eval("job.gpu_indices.len()", sample()).as_int().unwrap(), 2);
        assert_eq!(
            eval(r#"seconds("10m")"#, sample()).as_float().unwrap(),
            600.0
        );
        assert_eq!(eval("seconds(90)", sample()).as_float().unwrap(), 90.0);
        let mut none = sample();
        none.progress = ProgressState::default();
        assert!(eval("job.progress_age()", none.clone()).is_unit());
        assert!(eval("job.step", none).is_unit());
    }

    #[test]
    fn ended_job() {
        let mut s = sample();
        s.alive = false;
        s.exit = Some(JobExit::Exited { code: 1 });
        s.crash_class = Some(CrashClass::CudaOom);
        assert_eq!(eval("job.exit_code", s.clone()).as_int().unwrap(), 1);
        assert_eq!(
            eval("job.crash_class", s.clone()).into_string().unwrap(),
            "cuda_oom"
        );
        assert!(eval("job.failed", s).as_bool().unwrap());
    }
}
