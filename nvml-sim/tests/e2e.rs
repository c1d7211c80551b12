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
        .env_remove("NVML_SIM_NOT_SUPPORTED");
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
        "frozen" => check_frozen(),
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
    let parent = std::os::unix::process::parent_id();
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
        let procs = d.running_compute_processes().unwrap();
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0].pid, parent);
        // the process follows the GPU's memory signal (which moves a little between calls)
        assert!(matches!(procs[0].used_gpu_memory,
            UsedGpuMemory::Used(b) if b.abs_diff(mem.used) < 1024 * 1024 * 1024));
        assert!(d.running_graphics_processes().unwrap().is_empty());
        assert!(d.mps_running_compute_processes().unwrap().is_empty());
        let pu = d.process_utilization_stats(None).unwrap();
        assert_eq!(pu.len(), 1);
        assert_eq!(pu[0].pid, parent);
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

fn check_every_scenario() {
    let nvml = nvml();
    let n = nvml.device_count().unwrap();
    for i in 0..n {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        d.name().unwrap();
        d.memory_info().unwrap();
        d.utilization_rates().unwrap();
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

// ---------------------------------------------------------------------------------------------
// Parent tests

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
                &[("NVML_SIM_SCENARIO", name), ("NVML_SIM_START_S", start)],
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
    let parent = std::process::id().to_string();
    assert!(json.contains(&format!("\"pid\": {parent}")), "{json}");
    let plain = run(&["-m", "gpustat", "-a"]);
    assert_eq!(plain.matches("H100").count(), 8, "{plain}");
    let top = run(&["-m", "nvitop", "--once"]);
    assert_eq!(top.matches("H100 80GB HBM3").count(), 8, "{top}");
    assert!(!top.contains("ERROR"), "{top}");
    let _ = std::fs::remove_dir_all(&dir);
}
