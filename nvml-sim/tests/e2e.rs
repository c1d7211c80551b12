//! End-to-end tests: the built `libnvml_sim.so` loaded through the real `nvml-wrapper` (and the
//! raw `nvml-wrapper-sys` bindings for protocol details), one child process per check because
//! the library's state is per process.
//!
//! The parent test re-runs this test binary with `NVML_SIM_E2E_CHECK=<name>` and the scenario
//! environment; the `child` test then runs that check and prints `CHECK OK`.

// Test code: a failed unwrap is a failed check.
#![allow(clippy::unwrap_used)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, MemoryLocation, PcieUtilCounter, RetirementCause, Sampling,
    TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;

/// Builds the cdylib once (cargo test does not build it) and returns its path.
fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = std::env::current_exe().expect("test exe path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>")
            .to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "nvml-sim"]);
        if profile_dir.file_name() == Some(OsStr::new("release")) {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "cargo build -p nvml-sim failed");
        let lib = profile_dir.join("libnvml_sim.so");
        assert!(lib.exists(), "{} missing", lib.display());
        lib
    })
}

/// Runs `check` in a child process with `envs`; returns its output.
fn run_check(check: &str, envs: &[(&str, &str)]) -> Output {
    let lib = library();
    let mut cmd = Command::new(std::env::current_exe().expect("test exe"));
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("NVML_SIM_E2E_CHECK", check)
        .env("NVML_SIM_E2E_LIB", lib)
        .env_remove("NVML_SIM_SCENARIO")
        .env_remove("NVML_SIM_TIME_SCALE")
        .env_remove("NVML_SIM_START_S")
        .env_remove("NVML_SIM_CONTROL")
        .env_remove("NVML_SIM_DEBUG")
        .env_remove("NVML_SIM_NOT_SUPPORTED")
        .env_remove("NVML_SIM_LATENCY")
        .env_remove("NVML_SIM_HANG")
        .env_remove("NVML_SIM_HIDE")
        .env_remove("NVML_SIM_KMSG")
        .env_remove("NVML_SIM_SYSFS");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run child")
}

fn assert_check(check: &str, envs: &[(&str, &str)]) -> Output {
    let out = run_check(check, envs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("CHECK OK"),
        "check {check} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    out
}

fn nvml() -> Nvml {
    let lib = std::env::var_os("NVML_SIM_E2E_LIB").expect("lib path");
    Nvml::builder()
        .lib_path(&lib)
        .init()
        .expect("init the simulated NVML")
}

fn field(samples: &[Result<FieldValueSample, NvmlError>], id: u32) -> Result<u64, String> {
    let s = samples
        .iter()
        .flatten()
        .find(|s| s.field.0 == id)
        .ok_or_else(|| format!("field {id} missing"))?;
    match &s.value {
        Ok(SampleValue::U32(v)) => Ok(u64::from(*v)),
        Ok(SampleValue::U64(v)) => Ok(*v),
        Ok(other) => Err(format!("field {id}: unexpected {other:?}")),
        Err(e) => Err(format!("field {id}: {e}")),
    }
}

/// Entry point of the child process.
#[test]
fn child() {
    let Ok(check) = std::env::var("NVML_SIM_E2E_CHECK") else {
        return;
    };
    match check.as_str() {
        "healthy" => check_healthy(),
        "xid79" => check_xid79(),
        "ecc" => check_ecc(),
        "faults" => check_faults(),
        "control" => check_control(),
        "raw" => check_raw(),
        "retired" => check_retired(),
        "init_fails" => {
            let lib = std::env::var_os("NVML_SIM_E2E_LIB").expect("lib path");
            let err = Nvml::builder()
                .lib_path(&lib)
                .init()
                .expect_err("init must fail");
            println!("init error: {err}");
        }
        "every_scenario" => check_every_scenario(),
        "mig" => check_mig(),
        "frozen" => check_frozen(),
        "latency" => check_latency(),
        "hang" => check_hang(),
        "hang_forever" => check_hang_forever(),
        "kmsg" => check_kmsg(),
        "fields" => check_new_fields(),
        "hidden" => check_hidden(),
        "doctor" => check_doctor(),
        "gpm" => check_gpm(),
        other => panic!("unknown check {other}"),
    }
    println!("CHECK OK");
}

fn check_healthy() {
    let nvml = nvml();
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.54.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    assert_eq!(nvml.device_count().unwrap(), 8);
    let mut uuids = Vec::new();
    for i in 0..8u32 {
        let d = nvml.device_by_index(i).unwrap();
        assert_eq!(d.name().unwrap(), "NVIDIA H100 80GB HBM3");
        assert_eq!(d.index().unwrap(), i);
        assert_eq!(d.minor_number().unwrap(), i);
        let uuid = d.uuid().unwrap();
        assert!(uuid.starts_with("GPU-"));
        uuids.push(uuid.clone());
        let pci = d.pci_info().unwrap();
        assert!(pci.bus_id.starts_with("00000000:"), "{}", pci.bus_id);
        assert_eq!(pci.pci_device_id, 0x2330_10DE);
        assert_eq!(
            nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(),
            i
        );
        assert_eq!(
            nvml.device_by_pci_bus_id(pci.bus_id.as_str())
                .unwrap()
                .index()
                .unwrap(),
            i
        );
        assert!(!d.serial().unwrap().is_empty());
        let mem = d.memory_info().unwrap();
        assert_eq!(mem.total, 81559 * 1024 * 1024);
        assert!(mem.used > 55_000 * 1024 * 1024 && mem.used < 70_000 * 1024 * 1024);
        assert_eq!(mem.used + mem.free + mem.reserved, mem.total);
        let util = d.utilization_rates().unwrap();
        assert!((90..=100).contains(&util.gpu), "{}", util.gpu);
        let temp = d.temperature(TemperatureSensor::Gpu).unwrap();
        assert!((55..=70).contains(&temp), "{temp}");
        assert_eq!(
            d.temperature_threshold(TemperatureThreshold::Shutdown)
                .unwrap(),
            92
        );
        let power = d.power_usage().unwrap();
        assert!((550_000..=650_000).contains(&power), "{power}");
        assert_eq!(d.enforced_power_limit().unwrap(), 700_000);
        assert_eq!(d.power_management_limit().unwrap(), 700_000);
        assert_eq!(d.power_management_limit_default().unwrap(), 700_000);
        let c = d.power_management_limit_constraints().unwrap();
        assert_eq!((c.min_limit, c.max_limit), (200_000, 700_000));
        assert_eq!(d.clock_info(Clock::SM).unwrap(), 1980);
        assert_eq!(d.max_clock_info(Clock::SM).unwrap(), 1980);
        assert_eq!(d.clock_info(Clock::Memory).unwrap(), 2619);
        assert!(d.current_throttle_reasons().unwrap().is_empty());
        assert!(!d.supported_throttle_reasons().unwrap().is_empty());
        assert!(d.is_ecc_enabled().unwrap().currently_enabled);
        assert_eq!(
            d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .unwrap(),
            0
        );
        assert_eq!(
            d.memory_error_counter(
                MemoryError::Corrected,
                EccCounter::Aggregate,
                MemoryLocation::Device
            )
            .unwrap(),
            0
        );
        assert!(matches!(d.fan_speed(0), Err(NvmlError::NotSupported)));
        assert!(d.pcie_throughput(PcieUtilCounter::Receive).unwrap() > 0);
        assert_eq!(d.pcie_replay_counter().unwrap(), 0);
        assert_eq!(d.encoder_utilization().unwrap().utilization, 0);
        assert_eq!(d.decoder_utilization().unwrap().utilization, 0);
        assert!(matches!(
            d.retired_pages(RetirementCause::DoubleBitEccError),
            Err(NvmlError::NotSupported)
        ));
        assert!(!d.mig_is_mig_device_handle().unwrap());
        // one rank of a training job per GPU, at a PID no kernel hands out, named by NVML
        let rank = 4_195_001 + i;
        let procs = d.running_compute_processes().unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0].pid, rank);
        assert_eq!(nvml.sys_process_name(rank, 64).unwrap(), "python train.py");
        // the process follows the GPU's memory signal (which moves a little between calls)
        assert!(matches!(procs[0].used_gpu_memory,
            UsedGpuMemory::Used(b) if b.abs_diff(mem.used) < 1024 * 1024 * 1024));
        assert!(d.running_graphics_processes().unwrap().is_empty());
        assert!(d.mps_running_compute_processes().unwrap().is_empty());
        let pu = d.process_utilization_stats(None).unwrap();
        assert_eq!(pu.len(), 1);
        assert_eq!(pu[0].pid, rank);
        let fields = d
            .field_values_for(&[
                FieldId(82),
                FieldId(3),
                FieldId(4),
                FieldId(94),
                FieldId(142),
                FieldId(143),
                FieldId(144),
                FieldId(145),
                FieldId(29),
                FieldId(1000),
            ])
            .unwrap();
        assert!((60..=80).contains(&field(&fields, 82).unwrap()));
        for id in [3, 4, 94, 142, 143, 144, 145] {
            assert_eq!(field(&fields, id).unwrap(), 0, "field {id}");
        }
        let retired = fields.iter().flatten().find(|f| f.field.0 == 29).unwrap();
        assert!(matches!(retired.value, Err(NvmlError::NotSupported)));
        let events = d.supported_event_types().unwrap();
        assert!(events.contains(EventTypes::CRITICAL_XID_ERROR));
    }
    // driver sample buffer: a first read returns samples, re-reading from the newest is NOT_FOUND
    let d0 = nvml.device_by_index(0).unwrap();
    let samples = d0.samples(Sampling::GpuUtilization, None).unwrap();
    assert!(!samples.is_empty());
    for s in &samples {
        assert!(
            matches!(s.value, SampleValue::U32(v) if (90..=100).contains(&v)),
            "{s:?}"
        );
    }
    let newest = samples.iter().map(|s| s.timestamp).max().unwrap();
    assert!(matches!(
        d0.samples(Sampling::GpuUtilization, newest),
        Err(NvmlError::NotFound)
    ));
    let mut sorted = uuids.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), 8);
    // energy is monotonic and grows by about power × time
    let d = nvml.device_by_index(0).unwrap();
    let e0 = d.total_energy_consumption().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let e1 = d.total_energy_consumption().unwrap();
    assert!(e1 > e0 + 50_000 && e1 < e0 + 200_000, "{e0} -> {e1}");
    // no events in healthy: wait times out
    let set = nvml.create_event_set().unwrap();
    let set = d
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    let start = Instant::now();
    assert!(matches!(set.wait(100), Err(NvmlError::Timeout)));
    assert!(start.elapsed() >= Duration::from_millis(90));
    drop(set);
    assert!(matches!(
        nvml.device_by_index(8),
        Err(NvmlError::InvalidArg)
    ));
    nvml.shutdown().unwrap();
}

fn check_xid79() {
    // NVML_SIM_TIME_SCALE=60: t = 30 s arrives after 0.5 s
    let nvml = nvml();
    let devices: Vec<_> = (0..8).map(|i| nvml.device_by_index(i).unwrap()).collect();
    let mut set = nvml.create_event_set().unwrap();
    for d in &devices {
        set = d
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .unwrap();
    }
    assert!(devices[3].utilization_rates().is_ok());
    let start = Instant::now();
    let ev = set.wait(10_000).unwrap();
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert!(ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
    assert_eq!(
        ev.event_data,
        Some(nvml_wrapper::enums::event::XidError::Value(79))
    );
    // SAFETY: comparing handle values only
    assert_eq!(unsafe { ev.device.handle() }, unsafe {
        devices[3].handle()
    });
    // GPU 3 is lost from now on; the others keep answering
    assert!(matches!(
        devices[3].utilization_rates(),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(devices[3].memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(nvml.device_by_index(3), Err(NvmlError::GpuLost)));
    for (i, d) in devices.iter().enumerate().filter(|(i, _)| *i != 3) {
        assert!(d.utilization_rates().is_ok(), "gpu {i}");
        assert!(nvml.device_by_index(i as u32).is_ok());
    }
    assert_eq!(nvml.device_count().unwrap(), 8);
    // delivered once
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
}

fn check_ecc() {
    // NVML_SIM_START_S=130: every ECC event of ecc-errors has happened
    let nvml = nvml();
    let d = nvml.device_by_index(2).unwrap();
    assert_eq!(
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .unwrap(),
        10
    );
    assert_eq!(
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        1
    );
    let fields = d
        .field_values_for(&[
            FieldId(3),
            FieldId(4),
            FieldId(142),
            FieldId(143),
            FieldId(144),
            FieldId(145),
        ])
        .unwrap();
    assert_eq!(field(&fields, 3).unwrap(), 10);
    assert_eq!(field(&fields, 4).unwrap(), 1);
    assert_eq!(field(&fields, 142).unwrap(), 0);
    assert_eq!(field(&fields, 143).unwrap(), 1);
    assert_eq!(field(&fields, 144).unwrap(), 1);
    assert_eq!(field(&fields, 145).unwrap(), 0);
    let other = nvml.device_by_index(1).unwrap();
    assert_eq!(
        other
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .unwrap(),
        0
    );
}

fn check_faults() {
    let nvml = nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    assert!(d0.power_usage().is_ok());
    assert!(matches!(d1.power_usage(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        d0.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NoPermission)
    ));
    let start = Instant::now();
    d0.utilization_rates().unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(50),
        "latency not injected"
    );
    // NVML_SIM_NOT_SUPPORTED
    assert!(matches!(
        d0.clock_info(Clock::SM),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(d0.fan_speed(0), Err(NvmlError::NotSupported)));
    assert!(matches!(d1.fan_speed(1), Err(NvmlError::NotSupported)));
    assert_eq!(d1.num_fans().unwrap(), 2);
}

fn check_control() {
    let path = std::env::var("NVML_SIM_CONTROL").unwrap();
    let me = std::process::id();
    std::fs::write(
        &path,
        format!("[[process]]\ngpu = 0\npid = {me}\nused_memory_mib = 2048\n"),
    )
    .unwrap();
    let nvml = nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    let procs = d0.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1, "{procs:?}");
    assert_eq!(procs[0].pid, me);
    assert!(matches!(procs[0].used_gpu_memory, UsedGpuMemory::Used(b) if b == 2048 * 1024 * 1024));
    assert!(d1.running_compute_processes().unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(150));
    std::fs::write(
        &path,
        "[[process]]\ngpu = 1\npid = \"self\"\n\n[[process]]\ngpu = 1\npid = 1\nused_memory_mib = 1\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert!(d0.running_compute_processes().unwrap().is_empty());
    let procs = d1.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 2);
    assert_eq!(procs[0].pid, me);
    assert!(matches!(
        procs[0].used_gpu_memory,
        UsedGpuMemory::Unavailable
    ));
    std::thread::sleep(Duration::from_millis(150));
    std::fs::write(&path, "").unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert!(d1.running_compute_processes().unwrap().is_empty());
}

fn check_retired() {
    let nvml = nvml();
    let d = nvml.device_by_index(0).unwrap();
    let pages = d.retired_pages(RetirementCause::DoubleBitEccError).unwrap();
    assert_eq!(pages.len(), 2);
    assert_eq!(pages[0].address, 0x1000);
    assert!(d
        .retired_pages(RetirementCause::MultipleSingleBitEccErrors)
        .unwrap()
        .is_empty());
    assert!(d.are_pages_pending_retired().unwrap());
    let fields = d.field_values_for(&[FieldId(30), FieldId(142)]).unwrap();
    assert_eq!(field(&fields, 30).unwrap(), 2);
    let remap = fields.iter().flatten().find(|f| f.field.0 == 142).unwrap();
    assert!(matches!(remap.value, Err(NvmlError::NotSupported)));
    assert!(d.current_throttle_reasons().unwrap().bits() == 0x44);
}

fn check_frozen() {
    // NVML_SIM_TIME_SCALE=0: every process sees the same values at the same scenario time
    let nvml = nvml();
    let d = nvml.device_by_index(0).unwrap();
    let first = (
        d.utilization_rates().unwrap().gpu,
        d.memory_info().unwrap().used,
        d.power_usage().unwrap(),
        d.total_energy_consumption().unwrap(),
    );
    std::thread::sleep(Duration::from_millis(30));
    let second = (
        d.utilization_rates().unwrap().gpu,
        d.memory_info().unwrap().used,
        d.power_usage().unwrap(),
        d.total_energy_consumption().unwrap(),
    );
    assert_eq!(first, second);
    println!("VALUES {first:?}");
}

/// `NVML_SIM_E2E_EXPECT`: `defaults`, `off` or `override` (see `latency_*` tests).
fn check_latency() {
    let expect = std::env::var("NVML_SIM_E2E_EXPECT").unwrap();
    let timed = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed()
    };
    let mut nvml = None;
    let init = timed(&mut || nvml = Some(self::nvml()));
    let nvml = nvml.unwrap();
    let d = nvml.device_by_index(0).unwrap();
    let pcie = timed(&mut || {
        d.pcie_throughput(PcieUtilCounter::Send).unwrap();
    });
    let mem = timed(&mut || {
        d.memory_info().unwrap();
    });
    let util = timed(&mut || {
        d.utilization_rates().unwrap();
    });
    println!("init {init:?} pcie {pcie:?} memory {mem:?} util {util:?}");
    let ms = Duration::from_millis;
    match expect.as_str() {
        "defaults" => {
            // measured on an H200 (see the README's Real-driver behaviour)
            assert!(init >= ms(8), "init {init:?}");
            assert!(pcie >= ms(20), "pcie {pcie:?}");
            assert!(mem < ms(5), "memory {mem:?}");
            let energy = timed(&mut || {
                d.total_energy_consumption().unwrap();
            });
            assert!(energy >= ms(3), "energy {energy:?}");
            let energy_field = timed(&mut || {
                d.field_values_for(&[FieldId(83)]).unwrap();
            });
            assert!(energy_field >= ms(3), "energy field {energy_field:?}");
            let cheap_fields = timed(&mut || {
                d.field_values_for(&[FieldId(1), FieldId(2)]).unwrap();
            });
            assert!(cheap_fields < ms(2), "cheap fields {cheap_fields:?}");
            let procs = timed(&mut || {
                d.running_compute_processes().unwrap();
            });
            assert!(procs >= ms(3), "processes {procs:?}");
        }
        "off" => {
            assert!(init < ms(100), "init {init:?}");
            assert!(pcie < ms(5), "pcie {pcie:?}");
        }
        "override" => {
            // env: PcieThroughput=2ms and MemoryInfo_v2=30ms; scenario: UtilizationRates 25ms
            assert!(pcie < ms(15), "pcie {pcie:?}");
            assert!(mem >= ms(30), "memory {mem:?}");
            assert!(util >= ms(25), "util {util:?}");
            assert!(init >= ms(8), "init {init:?}");
        }
        other => panic!("unknown expectation {other}"),
    }
}

/// Scenario: hang on GPU 1 from t = 0 for 1.5 s.
fn check_hang() {
    let nvml = nvml();
    let start = Instant::now();
    std::thread::scope(|scope| {
        let hung = scope.spawn(|| {
            let d = nvml.device_by_index(1).unwrap();
            d.name().unwrap();
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        let d0 = nvml.device_by_index(0).unwrap();
        d0.name().unwrap();
        d0.memory_info().unwrap();
        assert_eq!(nvml.device_count().unwrap(), 2);
        let quick = t0.elapsed();
        assert!(quick < Duration::from_millis(300), "gpu 0 took {quick:?}");
        let waited = hung.join().unwrap();
        assert!(
            waited >= Duration::from_millis(1400),
            "gpu 1 took {waited:?}"
        );
    });
    // over: GPU 1 answers at once
    let t1 = Instant::now();
    nvml.device_by_index(1).unwrap().name().unwrap();
    assert!(t1.elapsed() < Duration::from_millis(300));
}

/// `NVML_SIM_HANG=gpu=2,at_s=1`: GPU 2 wedged for ever from t = 1 s.
fn check_hang_forever() {
    let nvml: &'static Nvml = Box::leak(Box::new(nvml()));
    let devices: Vec<_> = (0..4).map(|i| nvml.device_by_index(i).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(1200));
    let (tx, rx) = std::sync::mpsc::channel();
    // abandoned: the process exits with this thread still blocked in the library
    std::thread::spawn(move || {
        let hung = nvml.device_by_index(2);
        let _ = hung.map(|d| d.name());
        let _ = tx.send(());
    });
    let t0 = Instant::now();
    for i in [0, 1, 3] {
        devices[i].name().unwrap();
        devices[i].utilization_rates().unwrap();
        assert_eq!(
            nvml.device_by_index(i as u32).unwrap().index().unwrap(),
            i as u32
        );
    }
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert!(t0.elapsed() < Duration::from_millis(500));
    assert!(
        rx.recv_timeout(Duration::from_secs(2)).is_err(),
        "the call on the wedged GPU returned"
    );
    println!("WEDGED");
}

/// `NVML_SIM_KMSG` with XIDs at 0.3 s; GPU 0's XID has `nvml = false`.
fn check_kmsg() {
    let nvml = nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let set = nvml.create_event_set().unwrap();
    let set = d0
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    // the XID on GPU 0 goes to the kernel log only
    assert!(matches!(set.wait(800), Err(NvmlError::Timeout)));
    std::thread::sleep(Duration::from_millis(300));
}

/// Fields 197/198 (PCIe bytes) and 230 (recovery action).
fn check_new_fields() {
    let nvml = nvml();
    let d0 = nvml.device_by_index(0).unwrap();
    let d1 = nvml.device_by_index(1).unwrap();
    let ids = [FieldId(197), FieldId(198), FieldId(230)];
    let a = d0.field_values_for(&ids).unwrap();
    // START_S = 10: 10 s at 100 / 200 KB/s
    let tx = field(&a, 197).unwrap();
    let rx = field(&a, 198).unwrap();
    assert!((1_024_000..1_100_000).contains(&tx), "{tx}");
    assert!((2_048_000..2_200_000).contains(&rx), "{rx}");
    assert_eq!(field(&a, 230).unwrap(), 1, "gpu_reset from the event");
    std::thread::sleep(Duration::from_millis(200));
    let b = d0.field_values_for(&ids).unwrap();
    assert!(field(&b, 197).unwrap() > tx);
    let c = d1.field_values_for(&ids).unwrap();
    for id in [197, 198, 230] {
        let f = c.iter().flatten().find(|f| f.field.0 == id).unwrap();
        assert!(
            matches!(f.value, Err(NvmlError::NotSupported)),
            "field {id}"
        );
    }
}

/// `NVML_SIM_HIDE=1` on three GPUs; `NVML_SIM_E2E_HIDDEN_UUID` is GPU 1's uuid.
fn check_hidden() {
    let nvml = nvml();
    assert_eq!(nvml.device_count().unwrap(), 2);
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(d1.index().unwrap(), 1);
    assert_eq!(d1.pci_info().unwrap().bus_id, "00000000:3A:00.0");
    assert!(matches!(
        nvml.device_by_index(2),
        Err(NvmlError::InvalidArg)
    ));
    let uuid = std::env::var("NVML_SIM_E2E_HIDDEN_UUID").unwrap();
    assert!(matches!(
        nvml.device_by_uuid(uuid.as_str()),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_pci_bus_id("00000000:2A:00.0"),
        Err(NvmlError::NotFound)
    ));
}

/// Link, applications clocks, locked clocks and ECC pending mode on GPU 0.
fn check_doctor() {
    let nvml = nvml();
    let d = nvml.device_by_index(0).unwrap();
    assert_eq!(d.current_pcie_link_gen().unwrap(), 3);
    assert_eq!(d.max_pcie_link_gen().unwrap(), 4);
    assert_eq!(d.current_pcie_link_width().unwrap(), 8);
    assert_eq!(d.max_pcie_link_width().unwrap(), 16);
    assert_eq!(d.applications_clock(Clock::SM).unwrap(), 1500);
    assert_eq!(d.default_applications_clock(Clock::SM).unwrap(), 1980);
    assert_eq!(d.applications_clock(Clock::Memory).unwrap(), 2619);
    assert_eq!(d.clock_info(Clock::SM).unwrap(), 1400);
    assert!(d
        .current_throttle_reasons()
        .unwrap()
        .contains(nvml_wrapper::bitmasks::device::ThrottleReasons::APPLICATIONS_CLOCKS_SETTING));
    let ecc = d.is_ecc_enabled().unwrap();
    assert!(ecc.currently_enabled && !ecc.pending_enabled);
    assert!(d.is_in_persistent_mode().unwrap());
    assert_eq!(d.enforced_power_limit().unwrap(), 500_000);
    assert_eq!(d.power_management_limit_default().unwrap(), 700_000);
    // not in nvml-wrapper: the raw symbol
    let lib = std::ffi::CString::new(std::env::var("NVML_SIM_E2E_LIB").unwrap()).unwrap();
    let sym = std::ffi::CString::new("nvmlDeviceGetGpuMaxPcieLinkGeneration").unwrap();
    // SAFETY: our own library, already loaded; the symbol has this signature.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!h.is_null());
        let f = libc::dlsym(h, sym.as_ptr());
        assert!(!f.is_null());
        let f: extern "C" fn(nvml_wrapper_sys::bindings::nvmlDevice_t, *mut u32) -> u32 =
            std::mem::transmute(f);
        let mut gen = 0u32;
        assert_eq!(f(d.handle(), &mut gen), 0);
        assert_eq!(gen, 5);
    }
    // GPU 1: defaults follow the max
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(d1.current_pcie_link_gen().unwrap(), 5);
    assert_eq!(d1.max_pcie_link_gen().unwrap(), 5);
    assert!(d1.is_ecc_enabled().unwrap().pending_enabled);
}

fn check_every_scenario() {
    let nvml = nvml();
    let n = nvml.device_count().unwrap();
    for i in 0..n {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        d.name().unwrap();
        d.memory_info().unwrap();
        // a GPU split into MIG devices has no utilization, as on real drivers
        if d.mig_mode().is_ok_and(|m| m.current == 1) {
            assert!(matches!(
                d.utilization_rates(),
                Err(NvmlError::NotSupported)
            ));
        } else {
            d.utilization_rates().unwrap();
        }
        d.power_usage().unwrap();
        d.temperature(TemperatureSensor::Gpu).unwrap();
        d.running_compute_processes().unwrap();
        d.total_energy_consumption().unwrap();
        d.current_throttle_reasons().unwrap();
    }
}

/// Protocol details below nvml-wrapper: uninitialized, refcount, version mismatch, size probes.
fn check_raw() {
    use nvml_wrapper_sys::bindings::*;
    let lib_path = std::env::var_os("NVML_SIM_E2E_LIB").unwrap();
    // SAFETY: loading our own library; symbols match the bindings.
    let lib = unsafe { NvmlLib::new(lib_path) }.unwrap();
    unsafe {
        let mut count = 0u32;
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(&mut count),
            1,
            "UNINITIALIZED before init"
        );
        assert_eq!(lib.nvmlShutdown(), 1);
        assert_eq!(lib.nvmlInitWithFlags(0), 0);
        assert_eq!(lib.nvmlInit_v2(), 0);
        assert_eq!(lib.nvmlShutdown(), 0);
        assert_eq!(
            lib.nvmlDeviceGetCount_v2(&mut count),
            0,
            "still initialised once"
        );
        assert_eq!(count, 8);
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlDeviceGetHandleByIndex_v2(0, &mut dev), 0);
        let mut mem: nvmlMemory_v2_t = std::mem::zeroed();
        assert_eq!(
            lib.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem),
            25,
            "version mismatch"
        );
        mem.version = 40 | (2 << 24);
        assert_eq!(lib.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem), 0);
        let mut n = 0u32;
        assert_eq!(
            lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut n, std::ptr::null_mut()),
            7,
            "size probe"
        );
        assert_eq!(n, 1);
        let mut name = [0i8; 4];
        assert_eq!(lib.nvmlDeviceGetName(dev, name.as_mut_ptr(), 4), 7);
        let bogus = 0x10 as nvmlDevice_t;
        assert_eq!(lib.nvmlDeviceGetName(bogus, name.as_mut_ptr(), 4), 2);
        let msg = std::ffi::CStr::from_ptr(lib.nvmlErrorString(15));
        assert_eq!(msg.to_str().unwrap(), "GPU is lost");
        let mut driver_model = 0u32;
        assert_eq!(
            lib.nvmlDeviceGetDriverModel_v2(dev, &mut driver_model, &mut driver_model),
            3
        );
        let mut temp = nvmlTemperature_t {
            version: 12 | (1 << 24),
            sensorType: 0,
            temperature: 0,
        };
        assert_eq!(lib.nvmlDeviceGetTemperatureV(dev, &mut temp), 0);
        assert!(temp.temperature > 40);
        assert_eq!(lib.nvmlShutdown(), 0);
        assert_eq!(lib.nvmlDeviceGetCount_v2(&mut count), 1);
        assert_eq!(lib.nvmlShutdown(), 1);
    }
}

/// GPM through nvml-wrapper and raw: GPU 0 an H100 (SM active 12 % of a busy GPU), GPU 1 an
/// A100 (no GPM), GPU 2 an H100 whose GPM is held by another client (IN_USE), GPU 3 an H100.
fn check_gpm() {
    use nvml_wrapper::enums::gpm::GpmMetricId as Id;
    use nvml_wrapper::gpm::gpm_metrics_get;
    let nvml = nvml();
    let d: Vec<_> = (0..4).map(|i| nvml.device_by_index(i).unwrap()).collect();
    assert!(d[0].gpm_support().unwrap());
    assert!(!d[1].gpm_support().unwrap(), "an A100 has no GPM");
    assert!(matches!(d[1].gpm_sample(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        d[1].gpm_streaming_enabled(),
        Err(NvmlError::NotSupported)
    ));
    assert!(!d[0].gpm_streaming_enabled().unwrap());
    let first = d[0].gpm_sample().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let second = d[0].gpm_sample().unwrap();
    assert!(
        t.elapsed() >= Duration::from_micros(190),
        "a GPM sample costs ~200 µs: {:?}",
        t.elapsed()
    );
    let ids = [
        Id::SmUtil,
        Id::GraphicsUtil,
        Id::AnyTensorUtil,
        Id::Nvdec7Util,
        Id::PcieTxPerSec,
        Id::NvlinkTotalTxPerSec,
    ];
    let got = gpm_metrics_get(&nvml, &first, &second, &ids).unwrap();
    let v = |i: usize| got[i].as_ref().unwrap().value;
    assert_eq!(v(0), 12.0, "SM active");
    assert_eq!(v(1), 80.0, "graphics engine active = utilization");
    assert_eq!(v(2), 6.0, "tensor active = half of SM active by default");
    assert!(
        matches!(got[3], Err(NvmlError::NotSupported)),
        "an H100 has 7 NVDECs"
    );
    assert!(
        (v(4) - 80.0 * 5000.0 / 1024.0).abs() < 1e-6,
        "PCIe TX MiB/s"
    );
    assert!(
        (v(5) - 80.0 * 20_000.0 / 1024.0).abs() < 1e-6,
        "NVLink TX MiB/s"
    );
    let info = &got[0].as_ref().unwrap().metric_info;
    assert_eq!((info.short_name.as_str(), info.unit.as_str()), ("SM", "%"));
    // GPM held by another client
    assert!(matches!(d[2].gpm_sample(), Err(NvmlError::InUse)));
    // samples of two GPUs
    let other = d[3].gpm_sample().unwrap();
    assert!(matches!(
        gpm_metrics_get(&nvml, &first, &other, &ids),
        Err(NvmlError::InvalidArg)
    ));
    drop((first, second, other));
    // raw: versions, a freed sample, a sample never filled
    use nvml_wrapper_sys::bindings::*;
    let lib = nvml.lib();
    // SAFETY: calls into our own library with valid pointers.
    unsafe {
        let dev = d[0].handle();
        let mut support = nvmlGpmSupport_t {
            version: 0,
            isSupportedDevice: 7,
        };
        assert_eq!(lib.nvmlGpmQueryDeviceSupport(dev, &mut support), 25);
        let mut a: nvmlGpmSample_t = std::ptr::null_mut();
        let mut b: nvmlGpmSample_t = std::ptr::null_mut();
        assert_eq!(lib.nvmlGpmSampleAlloc(&mut a), 0);
        assert_eq!(lib.nvmlGpmSampleAlloc(&mut b), 0);
        assert!(!a.is_null() && a != b);
        let mut req: Box<nvmlGpmMetricsGet_t> = Box::new(std::mem::zeroed());
        req.version = 1;
        req.numMetrics = 1;
        req.sample1 = a;
        req.sample2 = b;
        req.metrics[0].metricId = 2;
        assert_eq!(lib.nvmlGpmMetricsGet(&mut *req), 2, "samples never filled");
        assert_eq!(lib.nvmlGpmSampleGet(dev, a), 0);
        assert_eq!(lib.nvmlGpmSampleGet(dev, b), 0);
        req.version = 2;
        assert_eq!(lib.nvmlGpmMetricsGet(&mut *req), 25);
        req.version = 1;
        assert_eq!(lib.nvmlGpmMetricsGet(&mut *req), 0);
        assert_eq!(req.metrics[0].nvmlReturn, 0);
        assert_eq!(req.metrics[0].value, 12.0);
        assert_eq!(lib.nvmlGpmSampleFree(a), 0);
        assert_eq!(lib.nvmlGpmSampleFree(a), 2, "freed twice");
        assert_eq!(lib.nvmlGpmMetricsGet(&mut *req), 2, "a freed sample");
        assert_eq!(lib.nvmlGpmSampleFree(b), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Parent tests

#[test]
fn gpm_samples_and_metrics() {
    let path = temp_file(
        "gpm.toml",
        r#"
[devices]
count = 4
[devices.metrics]
gpu_util_pct = 80
[[device]]
index = 0
[device.metrics]
sm_active_pct = 12
[[device]]
index = 1
name = "NVIDIA A100-SXM4-80GB"
[[fault]]
function = "nvmlGpmSampleGet"
error = "IN_USE"
gpus = [2]
"#,
    );
    assert_check("gpm", &[("NVML_SIM_SCENARIO", path.to_str().unwrap())]);
}

#[test]
fn healthy_through_nvml_wrapper() {
    assert_check("healthy", &[("NVML_SIM_SCENARIO", "healthy")]);
}

#[test]
fn default_scenario_is_healthy() {
    assert_check("healthy", &[]);
}

#[test]
fn xid_79_delivers_event_then_gpu_is_lost() {
    assert_check(
        "xid79",
        &[
            ("NVML_SIM_SCENARIO", "xid-79"),
            ("NVML_SIM_TIME_SCALE", "60"),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
}

#[test]
fn ecc_errors_counts_and_remapped_rows() {
    assert_check(
        "ecc",
        &[
            ("NVML_SIM_SCENARIO", "ecc-errors"),
            ("NVML_SIM_START_S", "130"),
        ],
    );
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvml-sim-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn fault_injection() {
    let path = temp_file(
        "faults.toml",
        r#"
[devices]
count = 2
num_fans = 2
[[fault]]
function = "nvmlDeviceGetPowerUsage"
error = "NOT_SUPPORTED"
gpus = [1]
[[fault]]
function = "nvmlDeviceGetTemperature"
error = 4
[[fault]]
function = "nvmlDeviceGetUtilizationRates"
latency_ms = 60
"#,
    );
    assert_check(
        "faults",
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            (
                "NVML_SIM_NOT_SUPPORTED",
                "nvmlDeviceGetClockInfo, nvmlDeviceGetFanSpeed_v2",
            ),
        ],
    );
}

#[test]
fn page_retirement_device() {
    let path = temp_file(
        "retired.toml",
        r#"
[devices]
count = 1
name = "Tesla V100-SXM2-32GB"
memory_repair = "page_retirement"
[[event]]
at_s = 0
gpu = 0
kind = "retired_page"
cause = "dbe"
address = 4096
[[event]]
at_s = 0
gpu = 0
kind = "retired_page"
cause = "dbe"
address = 8192
pending = true
[[event]]
at_s = 0
gpu = 0
kind = "clock_event_reasons"
reasons = ["hw_thermal_slowdown", "sw_power_cap"]
"#,
    );
    assert_check("retired", &[("NVML_SIM_SCENARIO", path.to_str().unwrap())]);
}

#[test]
fn control_file_places_real_processes() {
    let path = temp_file("control.toml", "");
    let scenario = temp_file("two.toml", "[devices]\ncount = 2\n");
    assert_check(
        "control",
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_CONTROL", path.to_str().unwrap()),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn frozen_clock_gives_every_process_the_same_values() {
    let env = [
        ("NVML_SIM_SCENARIO", "overnight"),
        ("NVML_SIM_TIME_SCALE", "0"),
        ("NVML_SIM_START_S", "42.5"),
        ("NVML_SIM_LATENCY", "0"),
    ];
    let values = |out: Output| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.split_once("VALUES").map(|(_, v)| v.to_string()))
            .unwrap()
    };
    let a = values(assert_check("frozen", &env));
    let b = values(assert_check("frozen", &env));
    assert_eq!(a, b);
}

#[test]
fn raw_protocol() {
    assert_check("raw", &[]);
}

#[test]
fn malformed_scenario_fails_init_with_one_clear_line() {
    let path = temp_file(
        "bad.toml",
        "[devices]\ncount = 2\n\n[devices.metrics]\npower_w = { type = \"sqare\" }\n",
    );
    let out = assert_check(
        "init_fails",
        &[("NVML_SIM_SCENARIO", path.to_str().unwrap())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("nvml-sim")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let expected = format!(
        "nvml-sim: error: {}:5:11: unknown signal type `sqare`",
        path.display()
    );
    assert!(lines[0].starts_with(&expected), "{}", lines[0]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("init error: "), "{stdout}");
}

#[test]
fn unknown_scenario_name_fails_init() {
    let out = assert_check("init_fails", &[("NVML_SIM_SCENARIO", "no-such-thing")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no such shipped scenario"), "{stderr}");
}

#[test]
fn every_shipped_scenario_through_nvml_wrapper() {
    for (name, _) in nvml_sim::shipped::SHIPPED {
        for start in ["0", "700"] {
            assert_check(
                "every_scenario",
                &[
                    ("NVML_SIM_SCENARIO", name),
                    ("NVML_SIM_START_S", start),
                    ("NVML_SIM_LATENCY", "0"),
                ],
            );
        }
    }
}

#[test]
fn debug_log_names_each_call() {
    let out = assert_check("raw", &[("NVML_SIM_DEBUG", "1")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nvmlDeviceGetName(gpu 0) -> 7 INSUFFICIENT_SIZE"),
        "{stderr}"
    );
    assert!(
        stderr.contains("nvmlInitWithFlags() -> 0 SUCCESS"),
        "{stderr}"
    );
}

#[test]
fn latency_defaults_are_on() {
    assert_check("latency", &[("NVML_SIM_E2E_EXPECT", "defaults")]);
}

#[test]
fn latency_off_and_overrides() {
    assert_check(
        "latency",
        &[("NVML_SIM_E2E_EXPECT", "off"), ("NVML_SIM_LATENCY", "0")],
    );
    let path = temp_file(
        "latency.toml",
        "[latency]\nnvmlDeviceGetUtilizationRates = \"25ms\"\nnvmlDeviceGetMemoryInfo_v2 = 1\n",
    );
    assert_check(
        "latency",
        &[
            ("NVML_SIM_E2E_EXPECT", "override"),
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            (
                "NVML_SIM_LATENCY",
                "nvmlDeviceGetPcieThroughput=2ms,nvmlDeviceGetMemoryInfo_v2=30ms",
            ),
        ],
    );
    let out = assert_check("init_fails", &[("NVML_SIM_LATENCY", "nvmlInit=soon")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nvml-sim: error: NVML_SIM_LATENCY=nvmlInit=soon: "),
        "{stderr}"
    );
    let bad = temp_file("badlatency.toml", "[latency]\nnvmlInit = \"2 days\"\n");
    let out = assert_check(
        "init_fails",
        &[("NVML_SIM_SCENARIO", bad.to_str().unwrap())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("nvml-sim: error: {}:2:12: ", bad.display())),
        "{stderr}"
    );
}

#[test]
fn hang_blocks_one_gpu_for_a_while() {
    let path = temp_file(
        "hang.toml",
        "hang = { at_s = 0, gpu = 1, function = \"*\", for_s = 1.5 }\n[devices]\ncount = 2\n",
    );
    assert_check(
        "hang",
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
}

#[test]
fn hang_forever_from_the_environment() {
    let path = temp_file("four.toml", "[devices]\ncount = 4\n");
    let out = assert_check(
        "hang_forever",
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_HANG", "gpu=2,at_s=1,function=*"),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("WEDGED"));
}

#[test]
fn kernel_log_lines_for_xids_and_loss() {
    let log = temp_file("kmsg.log", "");
    std::fs::remove_file(&log).unwrap();
    let path = temp_file(
        "kmsg.toml",
        r#"
[devices]
count = 3
[[process]]
gpu = 1
pid = "self"
[[event]]
at_s = 0.3
gpu = 0
kind = "xid"
code = 13
nvml = false
kmsg = "quoted"
pid = 4321
process_name = "trainer"
[[event]]
at_s = 0.4
gpu = 1
kind = "xid"
code = 79
[[event]]
at_s = 0.4
gpu = 1
kind = "lost"
[[event]]
at_s = 0.5
gpu = 2
kind = "xid"
code = 31
kmsg = "off"
[[event]]
at_s = 0.5
gpu = 2
kind = "kmsg"
text = "NVRM: A GPU crash dump has been created."
"#,
    );
    let out = assert_check(
        "kmsg",
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_KMSG", log.to_str().unwrap()),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let msg = |l: &str| l.split_once(";").unwrap().1.to_string();
    assert_eq!(
        msg(lines[0]),
        "NVRM: Xid (PCI:0000:18:00): 13, pid='4321', name='trainer', 'Graphics Engine Exception'"
    );
    // GPU 1's process is the check process: its pid and command name
    let child_line = msg(lines[1]);
    assert!(
        child_line.starts_with("NVRM: Xid (PCI:0000:2a:00): 79, pid=")
            && child_line.ends_with(", GPU has fallen off the bus."),
        "{child_line}"
    );
    assert!(!child_line.contains("pid=0,"), "{child_line}");
    assert_eq!(
        msg(lines[2]),
        "NVRM: GPU at PCI:0000:2a:00.0 has fallen off the bus."
    );
    assert_eq!(msg(lines[3]), "NVRM: A GPU crash dump has been created.");
    let mut last_seq = 0;
    for l in &lines {
        let (head, _) = l.split_once(';').unwrap();
        let parts: Vec<&str> = head.split(',').collect();
        assert_eq!(parts.len(), 4, "{l}");
        assert!(parts[0] == "3" || parts[0] == "4", "{l}");
        let seq: u64 = parts[1].parse().unwrap();
        assert!(seq > last_seq);
        last_seq = seq;
        let us: u64 = parts[2].parse().unwrap();
        assert!((1_000_000_000..1_010_000_000).contains(&us), "{l}");
        assert_eq!(parts[3], "-");
    }
    drop(out);
}

#[test]
fn pcie_byte_counters_and_recovery_action_fields() {
    let path = temp_file(
        "fields.toml",
        r#"
start_s = 10
[devices]
count = 2
[devices.metrics]
pcie_tx_kb_s = 100
pcie_rx_kb_s = 200
[[device]]
index = 1
pcie_byte_counters = false
[[event]]
at_s = 5
gpu = 0
kind = "recovery_action"
action = "gpu_reset"
"#,
    );
    assert_check(
        "fields",
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
}

#[test]
fn hidden_gpus_and_fake_sysfs() {
    let scenario = temp_file("three.toml", "[devices]\ncount = 3\n");
    let parsed = nvml_sim::scenario::load_file(&scenario).unwrap();
    let sysfs = std::env::temp_dir().join(format!("nvml-sim-e2e-sysfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&sysfs);
    assert_check(
        "hidden",
        &[
            ("NVML_SIM_SCENARIO", scenario.to_str().unwrap()),
            ("NVML_SIM_HIDE", "1"),
            ("NVML_SIM_SYSFS", sysfs.to_str().unwrap()),
            ("NVML_SIM_E2E_HIDDEN_UUID", &parsed.devices[1].uuid),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
    let devices = sysfs.join("bus/pci/devices");
    for name in ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"] {
        let vendor = std::fs::read_to_string(devices.join(name).join("vendor")).unwrap();
        assert_eq!(vendor, "0x10de\n", "{name}");
        let speed = std::fs::read_to_string(devices.join(name).join("current_link_speed")).unwrap();
        assert_eq!(speed, "32.0 GT/s PCIe\n");
    }
    assert_eq!(
        std::fs::read_to_string(devices.join("0000:18:00.1/class")).unwrap(),
        "0x040300\n"
    );
    assert_eq!(
        std::fs::read_to_string(devices.join("0000:00:1f.6/vendor")).unwrap(),
        "0x8086\n"
    );
    let _ = std::fs::remove_dir_all(&sysfs);
}

#[test]
fn doctor_state_link_clocks_ecc() {
    let path = temp_file(
        "doctor.toml",
        r#"
[devices]
count = 2
power_limit_w = 500
power_default_limit_w = 700
[[device]]
index = 0
pcie_slot_max_gen = 4
pcie_link_gen = 3
pcie_link_width = 8
app_sm_clock_mhz = 1500
locked_sm_clock_mhz = 1400
ecc_pending_enabled = false
[device.metrics]
gpu_util_pct = 90
"#,
    );
    assert_check(
        "doctor",
        &[
            ("NVML_SIM_SCENARIO", path.to_str().unwrap()),
            ("NVML_SIM_LATENCY", "0"),
        ],
    );
}

/// Every symbol nvml-wrapper (for gpuwatch's methods), gpustat and nvitop look up
/// (nvml-facts.md §2–3, and `LD_DEBUG=symbols` runs of gpustat/nvitop).
const REQUIRED_SYMBOLS: &[&str] = &[
    // init / system
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetProcessName",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2",
    "nvmlDeviceGetHandleBySerial",
    // identity
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDriverModel",
    "nvmlDeviceGetDriverModel_v2",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    // metrics
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetClock",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetDetailedEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetDefaultApplicationsClock",
    "nvmlDeviceGetSamples",
    // processes
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetProcessUtilization",
    // events, GPM
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetWait_v2",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
    "nvmlGpmSampleFree",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlGpmQueryIfStreamingEnabled",
    "nvmlGpmSetStreamingEnabled",
    "nvmlGpmMigSampleGet",
];

#[test]
fn exports_every_symbol_clients_look_up_and_not_the_nvitop_trap() {
    let lib = std::ffi::CString::new(library().to_str().unwrap()).unwrap();
    // SAFETY: dlopen/dlsym/dlclose on our own library with valid C strings.
    unsafe {
        let handle = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!handle.is_null(), "dlopen failed");
        let missing: Vec<&str> = REQUIRED_SYMBOLS
            .iter()
            .copied()
            .filter(|name| {
                let c = std::ffi::CString::new(*name).unwrap();
                libc::dlsym(handle, c.as_ptr()).is_null()
            })
            .collect();
        assert!(missing.is_empty(), "missing exports: {missing:?}");
        for trap in [
            "nvmlDeviceGetConfComputeMemSizeInfo",
            "nvmlInternalGetExportTable",
        ] {
            let c = std::ffi::CString::new(trap).unwrap();
            assert!(
                libc::dlsym(handle, c.as_ptr()).is_null(),
                "{trap} must not be exported"
            );
        }
        libc::dlclose(handle);
    }
}

/// gpustat and nvitop (pynvml) against the library, when `NVML_SIM_PYTHONPATH` names a folder
/// with them (`pip install --target DIR nvidia-ml-py gpustat nvitop`); skipped otherwise.
#[test]
fn python_peers_read_the_library_without_errors() {
    let Some(pythonpath) = std::env::var_os("NVML_SIM_PYTHONPATH") else {
        eprintln!("skipped: set NVML_SIM_PYTHONPATH to a pip --target folder with gpustat, nvitop");
        return;
    };
    let dir = std::env::temp_dir().join(format!("nvml-sim-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libnvidia-ml.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(library(), &link).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("python3")
            .args(args)
            .env("PYTHONPATH", &pythonpath)
            .env("LD_LIBRARY_PATH", &dir)
            .env("NVML_SIM_SCENARIO", "overnight")
            .env_remove("NVML_SIM_TIME_SCALE")
            .env_remove("NVML_SIM_START_S")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}\n{stdout}\n{stderr}");
        assert!(
            stderr.trim().is_empty(),
            "{args:?} wrote to stderr:\n{stderr}"
        );
        stdout
    };
    let json = run(&["-m", "gpustat", "--json"]);
    assert_eq!(
        json.matches("\"NVIDIA H100 80GB HBM3\"").count(),
        8,
        "{json}"
    );
    assert!(json.contains("\"driver_version\": \"550.54.15\""), "{json}");
    // the training job's ranks (`pid = "job"`) are no host process: gpustat, listing what
    // psutil finds, lists none of them
    assert_eq!(json.matches("\"processes\": []").count(), 8, "{json}");
    let plain = run(&["-m", "gpustat", "-a"]);
    assert_eq!(plain.matches("H100").count(), 8, "{plain}");
    let top = run(&["-m", "nvitop", "--once"]);
    assert_eq!(top.matches("H100 80GB HBM3").count(), 8, "{top}");
    assert!(!top.contains("ERROR"), "{top}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mig_devices_through_nvml_wrapper() {
    assert_check(
        "mig",
        &[
            ("NVML_SIM_SCENARIO", "mig"),
            ("NVML_SIM_LATENCY", "0"),
            ("NVML_SIM_TIME_SCALE", "0"),
            ("NVML_SIM_START_S", "100"),
        ],
    );
}

/// The `mig` scenario through nvml-wrapper's MIG methods and the raw calls it does not wrap.
fn check_mig() {
    use nvml_wrapper_sys::bindings::*;
    const MIB: u64 = 1024 * 1024;
    let nvml = nvml();
    let lib = nvml.lib();
    assert_eq!(nvml.device_count().unwrap(), 3);
    let a100 = nvml.device_by_index(0).unwrap();
    assert_eq!(a100.name().unwrap(), "NVIDIA A100-SXM4-80GB");
    let mode = a100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(a100.mig_device_count().unwrap(), 7);
    assert!(!a100.mig_is_mig_device_handle().unwrap());
    assert!(matches!(
        a100.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        a100.process_utilization_stats(0),
        Err(NvmlError::NotSupported)
    ));
    let all = a100.running_compute_processes().unwrap();
    assert_eq!(
        all.len(),
        7,
        "the GPU lists the processes of every MIG device"
    );
    let mut used = 0;
    let mut uuids = Vec::new();
    for k in 0..7u32 {
        let m = a100.mig_device_by_index(k).unwrap();
        assert!(m.mig_is_mig_device_handle().unwrap());
        assert_eq!(m.name().unwrap(), "NVIDIA A100-SXM4-80GB MIG 1g.10gb");
        let uuid = m.uuid().unwrap();
        assert!(uuid.starts_with("MIG-") && uuid.len() == 40, "{uuid}");
        let mem = m.memory_info().unwrap();
        assert_eq!(mem.total, 9728 * MIB);
        assert!(
            mem.used >= 3000 * MIB && mem.used <= 9000 * MIB,
            "{}",
            mem.used
        );
        assert_eq!(mem.used + mem.free, mem.total);
        used += mem.used;
        let procs = m.running_compute_processes().unwrap();
        assert_eq!(procs.len(), 1);
        // a training rank on the first, inference servers on the others
        let (pid, name) = if k == 0 {
            (4_195_001, "python train.py")
        } else {
            (4_194_400 + k, "python serve.py")
        };
        assert_eq!(procs[0].pid, pid);
        assert_eq!(nvml.sys_process_name(pid, 64).unwrap(), name);
        assert_eq!(procs[0].gpu_instance_id, Some(7 + k));
        assert_eq!(procs[0].compute_instance_id, Some(0));
        assert!(matches!(
            procs[0].used_gpu_memory,
            UsedGpuMemory::Used(b) if b == mem.used
        ));
        assert!(all.iter().any(|p| p.gpu_instance_id == Some(7 + k)));
        assert_eq!(
            m.mig_parent_device().unwrap().uuid().unwrap(),
            a100.uuid().unwrap()
        );
        assert!(matches!(
            m.temperature(TemperatureSensor::Gpu),
            Err(NvmlError::NotSupported)
        ));
        // BAR1 as nvidia-smi's MIG table shows it (nvitop reads it per MIG device): a 1g.10gb's
        // share of the GPU's 128 GiB, less 1 MiB; 4 MiB used with a process on it
        let bar1 = m.bar1_memory_info().unwrap();
        assert_eq!((bar1.total, bar1.used), (16_383 * MIB, 4 * MIB));
        // not wrapped by nvml-wrapper: the instance ids
        let (mut gi, mut ci) = (0u32, 0u32);
        unsafe {
            assert_eq!(lib.nvmlDeviceGetGpuInstanceId(m.handle(), &mut gi), 0);
            assert_eq!(lib.nvmlDeviceGetComputeInstanceId(m.handle(), &mut ci), 0);
        }
        assert_eq!((gi, ci), (7 + k, 0));
        let again = nvml.device_by_uuid(uuid.as_str()).unwrap();
        assert!(again.mig_is_mig_device_handle().unwrap());
        assert_eq!(again.uuid().unwrap(), uuid);
        uuids.push(uuid);
    }
    uuids.dedup();
    assert_eq!(uuids.len(), 7);
    let whole = a100.memory_info().unwrap();
    assert_eq!(
        whole.used, used,
        "the GPU's used memory is its MIG devices'"
    );
    assert!(matches!(
        a100.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
    let mut gi: u32 = 0;
    unsafe {
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceId(a100.handle(), &mut gi),
            3,
            "not a MIG device"
        );
    }

    // H100: 3g.40gb + 2g.20gb + 1g.10gb; placements and profile names through GPU instances
    let h100 = nvml.device_by_index(1).unwrap();
    let names: Vec<String> = (0..3)
        .map(|k| h100.mig_device_by_index(k).unwrap().name().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
            "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        ]
    );
    let bar1 = |k: u32| {
        let b = h100
            .mig_device_by_index(k)
            .unwrap()
            .bar1_memory_info()
            .unwrap();
        (b.total / MIB, b.used / MIB)
    };
    assert_eq!(
        (bar1(0), bar1(2)),
        ((65_535, 4), (16_383, 0)),
        "the 3g.40gb's 4 of 8 memory slices; the idle 1g.10gb uses none"
    );
    assert!(matches!(
        h100.mig_device_by_index(3),
        Err(NvmlError::NotFound)
    ));
    let idle = h100.mig_device_by_index(2).unwrap();
    assert!(idle.running_compute_processes().unwrap().is_empty());
    assert_eq!(idle.memory_info().unwrap().used, 0);
    unsafe {
        for (gi_id, start, size, profile_id) in [(1, 0, 4, 9), (5, 4, 2, 14), (13, 6, 1, 19)] {
            let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
            assert_eq!(
                lib.nvmlDeviceGetGpuInstanceById(h100.handle(), gi_id, &mut gi),
                0
            );
            let mut info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
            assert_eq!(lib.nvmlGpuInstanceGetInfo(gi, &mut info), 0);
            assert_eq!(info.device, h100.handle());
            assert_eq!(
                (
                    info.id,
                    info.placement.start,
                    info.placement.size,
                    info.profileId
                ),
                (gi_id, start, size, profile_id)
            );
        }
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceById(h100.handle(), 2, &mut gi),
            6
        );
        let mut p: nvmlGpuInstanceProfileInfo_v2_t = std::mem::zeroed();
        p.version = 152 | (2 << 24);
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceProfileInfoV(
                h100.handle(),
                NVML_GPU_INSTANCE_PROFILE_3_SLICE,
                &mut p
            ),
            0
        );
        let name = std::ffi::CStr::from_ptr(p.name.as_ptr()).to_str().unwrap();
        assert_eq!(
            (name, p.id, p.sliceCount, p.memorySizeMB),
            ("MIG 3g.40gb", 9, 3, 40448)
        );
        p.version = 1;
        assert_eq!(
            lib.nvmlDeviceGetGpuInstanceProfileInfoV(h100.handle(), 2, &mut p),
            25
        );
    }
    let info = h100
        .profile_info(NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        .unwrap();
    assert_eq!((info.id, info.memory_size_mb), (19, 9984));

    // GPM per GPU instance (`nvmlGpmMigSampleGet`; Hopper: the H100 only)
    {
        use nvml_wrapper::enums::gpm::GpmMetricId as Id;
        use nvml_wrapper::gpm::gpm_metrics_get;
        let ids = [Id::SmUtil, Id::GraphicsUtil, Id::PcieTxPerSec];
        let per_gi = |gi: u32| {
            let a = h100.gpm_mig_sample(gi).unwrap();
            let b = h100.gpm_mig_sample(gi).unwrap();
            gpm_metrics_get(&nvml, &a, &b, &ids).unwrap()
        };
        // the 3g.40gb runs a process: the GPU's ~95 % utilization, SM active 85 % of it
        let busy = per_gi(1);
        let gr = busy[1].as_ref().unwrap().value;
        assert!((90.0..=100.0).contains(&gr), "{gr}");
        let sm = busy[0].as_ref().unwrap().value;
        assert!((sm - 0.85 * gr).abs() < 1e-9, "{sm} {gr}");
        assert!(
            matches!(busy[2], Err(NvmlError::NotSupported)),
            "PCIe is the GPU's, not an instance's"
        );
        // the idle 1g.10gb reads 0
        let idle = per_gi(13);
        assert_eq!(idle[0].as_ref().unwrap().value, 0.0);
        // a GPU instance the GPU lacks; GPM on an A100 (none); MIG off; a MIG device handle
        assert!(matches!(h100.gpm_mig_sample(2), Err(NvmlError::InvalidArg)));
        assert!(matches!(
            a100.gpm_mig_sample(7),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(
            nvml.device_by_index(2).unwrap().gpm_mig_sample(1),
            Err(NvmlError::NotSupported)
        ));
        assert!(matches!(
            h100.mig_device_by_index(0).unwrap().gpm_mig_sample(1),
            Err(NvmlError::NotSupported)
        ));
        // two instances' samples, or an instance's and the GPU's, do not make a metric
        let a = h100.gpm_mig_sample(1).unwrap();
        let b = h100.gpm_mig_sample(5).unwrap();
        let whole = h100.gpm_sample().unwrap();
        assert!(matches!(
            gpm_metrics_get(&nvml, &a, &b, &ids),
            Err(NvmlError::InvalidArg)
        ));
        assert!(matches!(
            gpm_metrics_get(&nvml, &a, &whole, &ids),
            Err(NvmlError::InvalidArg)
        ));
        // the whole GPU with MIG on: its instances weighted by their compute slices
        let whole2 = h100.gpm_sample().unwrap();
        let gpu = gpm_metrics_get(&nvml, &whole, &whole2, &ids).unwrap();
        let two = per_gi(5)[0].as_ref().unwrap().value;
        let want = 3.0 / 7.0 * sm + 2.0 / 7.0 * two;
        let got = gpu[0].as_ref().unwrap().value;
        assert!((got - want).abs() < 1e-9, "{got} {want}");
    }

    // GPU 2: MIG off
    let plain = nvml.device_by_index(2).unwrap();
    let mode = plain.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (0, 0));
    assert!(matches!(
        plain.mig_device_by_index(0),
        Err(NvmlError::NotFound)
    ));
    plain.utilization_rates().unwrap();
    let procs = plain.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].gpu_instance_id, None);
    assert!(matches!(
        nvml.device_by_uuid("MIG-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));
}
