//! The `p` object of `scope: "process"` rules: one GPU process with its owner, command, GPU
//! memory and runtime. Unknown values are `()` (no data).
//!
//! `p.pid`, `p.user`, `p.uid`, `p.name` (executable base name), `p.cmdline`, `p.mem` (GPU memory
//! used, bytes), `p.gpu` (index), `p.runtime` (seconds), `p.container`, `p.kind`
//! (`compute`/`graphics`); on a GPU with MIG on, the MIG device it runs on: `p.mig` (a map, as
//! `gpu.mig` lists them), `p.mig_profile`, `p.mig_uuid` (`()` otherwise). The GPU's metric
//! series (`p.gpu_series`) and the MIG device are added by the rules engine, which owns the
//! windows.

use std::sync::Arc;

use rhai::{Dynamic, Engine};

use super::read_fields as read;
use crate::model::{ProcKind, ProcSample};

/// A by-value handle on one GPU process.
#[derive(Debug, Clone)]
pub struct ProcessHandle {
    /// The process as sampled.
    pub proc_: Arc<ProcSample>,
    /// The rules engine's `gpu` handle of its GPU (`p.gpu_series`), `()` when not set.
    pub gpu_series: Dynamic,
    /// The MIG device it runs on (`p.mig`), when its GPU has MIG on.
    pub mig: Option<Arc<crate::model::MigSample>>,
}

impl ProcessHandle {
    /// A handle on `p`.
    pub fn new(p: ProcSample) -> ProcessHandle {
        ProcessHandle {
            proc_: Arc::new(p),
            gpu_series: Dynamic::UNIT,
            mig: None,
        }
    }
}

/// The process fields a process-scope evaluation can read, one bit each (the MIG device is
/// compared whether read or not: it is part of an evaluation's name).
const PID: u16 = 1;
const USER: u16 = 2;
const UID: u16 = 4;
const COMMAND: u16 = 8;
const MEM: u16 = 16;
const GPU: u16 = 32;
const GPU_UUID: u16 = 64;
const RUNTIME: u16 = 128;
const CONTAINER: u16 = 256;
const KIND: u16 = 512;

/// Stops tracing: the fields the evaluation read.
pub(crate) fn finish_trace() -> ProcFields {
    ProcFields(super::finish_fields_trace())
}

/// The process fields one process-scope evaluation read. Such an evaluation is a function of
/// them, its MIG device and the GPU inputs it read (`gpu::Trace`), so while those read the same
/// its result can be reused: a process list refreshed every few seconds changes every process's
/// runtime, which a memory-quota check never reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcFields(u16);

impl ProcFields {
    /// Whether `a` and `b` agree on every field read (floats bit for bit).
    pub fn same(self, a: &ProcSample, b: &ProcSample) -> bool {
        let r = self.0;
        let on = |f: u16| r & f != 0;
        (!on(PID) || a.pid == b.pid)
            && (!on(USER) || a.user == b.user)
            && (!on(UID) || a.uid == b.uid)
            && (!on(COMMAND) || a.command == b.command)
            && (!on(MEM) || a.used_mem_bytes == b.used_mem_bytes)
            && (!on(GPU) || a.gpu_index == b.gpu_index)
            && (!on(GPU_UUID) || a.gpu_uuid == b.gpu_uuid)
            && (!on(RUNTIME) || a.runtime_s.map(f64::to_bits) == b.runtime_s.map(f64::to_bits))
            && (!on(CONTAINER) || a.container == b.container)
            && (!on(KIND) || a.kind == b.kind)
    }
}

fn opt_str(v: Option<&String>) -> Dynamic {
    v.map_or(Dynamic::UNIT, |s| Dynamic::from(s.clone()))
}

/// The executable's base name from a command line (`/usr/bin/python3 train.py` → `python3`).
pub fn process_name(command: &str) -> &str {
    let first = command.split_whitespace().next().unwrap_or("");
    first.rsplit('/').next().unwrap_or(first)
}

/// Registers the `Process` type and its properties.
pub fn register(engine: &mut Engine) {
    engine.register_type_with_name::<ProcessHandle>("Process");
    engine.register_get("pid", |p: &mut ProcessHandle| {
        read(PID);
        i64::from(p.proc_.pid)
    });
    engine.register_get("user", |p: &mut ProcessHandle| {
        read(USER);
        opt_str(p.proc_.user.as_ref())
    });
    engine.register_get("uid", |p: &mut ProcessHandle| {
        read(UID);
        p.proc_
            .uid
            .map_or(Dynamic::UNIT, |u| Dynamic::from_int(i64::from(u)))
    });
    engine.register_get("name", |p: &mut ProcessHandle| {
        read(COMMAND);
        p.proc_.command.as_deref().map_or(Dynamic::UNIT, |c| {
            Dynamic::from(process_name(c).to_string())
        })
    });
    engine.register_get("cmdline", |p: &mut ProcessHandle| {
        read(COMMAND);
        opt_str(p.proc_.command.as_ref())
    });
    engine.register_get("mem", |p: &mut ProcessHandle| {
        read(MEM);
        #[expect(
            clippy::cast_precision_loss,
            reason = "bytes fit f64 exactly below 2^53"
        )]
        p.proc_
            .used_mem_bytes
            .map_or(Dynamic::UNIT, |b| Dynamic::from_float(b as f64))
    });
    engine.register_get("gpu", |p: &mut ProcessHandle| {
        read(GPU);
        i64::from(p.proc_.gpu_index)
    });
    engine.register_get("gpu_uuid", |p: &mut ProcessHandle| {
        read(GPU_UUID);
        p.proc_.gpu_uuid.clone()
    });
    engine.register_get("runtime", |p: &mut ProcessHandle| {
        read(RUNTIME);
        p.proc_.runtime_s.map_or(Dynamic::UNIT, Dynamic::from_float)
    });
    engine.register_get("container", |p: &mut ProcessHandle| {
        read(CONTAINER);
        opt_str(p.proc_.container.as_ref())
    });
    engine.register_get("kind", |p: &mut ProcessHandle| {
        read(KIND);
        match p.proc_.kind {
            ProcKind::Compute => "compute".to_string(),
            ProcKind::Graphics => "graphics".to_string(),
        }
    });
    engine.register_get("gpu_series", |p: &mut ProcessHandle| p.gpu_series.clone());
    engine.register_get("mig", |p: &mut ProcessHandle| {
        p.mig
            .as_deref()
            .map_or(Dynamic::UNIT, super::gpu::mig_device)
    });
    engine.register_get("mig_profile", |p: &mut ProcessHandle| {
        opt_str(p.mig.as_ref().and_then(|m| m.profile.as_ref()))
    });
    engine.register_get("mig_uuid", |p: &mut ProcessHandle| {
        p.mig
            .as_ref()
            .map_or(Dynamic::UNIT, |m| Dynamic::from(m.uuid.clone()))
    });
    engine.register_fn("to_string", |p: &mut ProcessHandle| {
        read(PID | USER | COMMAND);
        format!(
            "pid {} ({}: {})",
            p.proc_.pid,
            p.proc_.user.as_deref().unwrap_or("?"),
            p.proc_.command.as_deref().unwrap_or("?")
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(script: &str, p: ProcSample) -> Dynamic {
        let mut engine = Engine::new();
        register(&mut engine);
        let mut scope = rhai::Scope::new();
        scope.push("p", ProcessHandle::new(p));
        engine
            .eval_with_scope::<Dynamic>(&mut scope, script)
            .unwrap()
    }

    fn sample() -> ProcSample {
        ProcSample {
            pid: 4242,
            gpu_index: 1,
            gpu_uuid: "GPU-1".into(),
            used_mem_bytes: Some(30 << 30),
            kind: ProcKind::Compute,
            uid: Some(1001),
            user: Some("alice".into()),
            command: Some("/usr/bin/python3 train.py --bs 64".into()),
            container: None,
            runtime_s: Some(7200.0),
            start_ticks: None,
        }
    }

    #[test]
    fn properties() {
        assert_eq!(eval("p.pid", sample()).as_int().unwrap(), 4242);
        assert_eq!(eval("p.name", sample()).into_string().unwrap(), "python3");
        assert_eq!(eval("p.user", sample()).into_string().unwrap(), "alice");
        assert_eq!(
            eval("p.mem", sample()).as_float().unwrap(),
            (30u64 << 30) as f64
        );
        assert_eq!(eval("p.gpu", sample()).as_int().unwrap(), 1);
        assert_eq!(eval("p.runtime", sample()).as_float().unwrap(), 7200.0);
        assert!(eval("p.container", sample()).is_unit());
        assert_eq!(eval("p.kind", sample()).into_string().unwrap(), "compute");
        let mut unknown = sample();
        unknown.used_mem_bytes = None;
        unknown.command = None;
        assert!(eval("p.mem", unknown.clone()).is_unit());
        assert!(eval("p.name", unknown).is_unit());
        assert!(eval("p.mig", sample()).is_unit());
        assert!(eval("p.mig_profile", sample()).is_unit());
    }

    #[test]
    fn mig_device_of_a_process() {
        let mut engine = Engine::new();
        register(&mut engine);
        let mut h = ProcessHandle::new(sample());
        h.mig = Some(Arc::new(crate::model::MigSample {
            gpu_uuid: "GPU-1".into(),
            uuid: "MIG-abc".into(),
            mem_used_bytes: Some(3 << 30),
            mem_total_bytes: Some(9728 << 20),
            pids: vec![4242],
            ..crate::model::MigSample::one_g(1, 2)
        }));
        let mut scope = rhai::Scope::new();
        scope.push("p", h);
        let r = engine
            .eval_with_scope::<Dynamic>(
                &mut scope,
                r#"`${p.mig_profile} ${p.mig_uuid} ${p.mig.address} ${p.mig.slices} ${p.mig.mem_total}`"#,
            )
            .unwrap();
        assert_eq!(
            r.into_string().unwrap(),
            "1g.10gb MIG-abc 1/9/0 1 10200547328.0"
        );
    }
}
