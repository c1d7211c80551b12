//! Issue 26 §2, MIG, on nvml-sim's `mig` scenario (an A100 80GB split 7 × 1g.10gb, an H100 split
//! 3g.40gb + 2g.20gb + 1g.10gb, an H100 with MIG off): `status` lists every MIG device with its
//! memory and the process on it, `devices` maps `CUDA_VISIBLE_DEVICES=MIG-…` (and the legacy
//! `MIG-GPU-…/GI/CI`), `/metrics` carries dcgm-exporter's `GPU_I_PROFILE` / `GPU_I_ID`,
//! `record` writes a row per MIG device that `import` and `report` read back, and the daemon's
//! usage ledger counts each MIG device for its share of the GPU.

use std::time::Duration;

use serde_json::Value;

use super::common::{self, col, csv_rows, sim};
use super::daemon::daemon;
use super::exporter::get;
use super::notify::servers::{free_port, wait_until};

/// `status --json` with the scenario clock frozen at 100 s.
fn status() -> Value {
    sim(
        "mig",
        &["status", "--json"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "100")],
    )
    .json()
}

fn parent_pid() -> u64 {
    u64::from(std::process::id())
}

#[test]
fn status_lists_seven_1g_mig_devices_with_memory_and_processes() {
    let s = status();
    let gpus = s["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 3);
    let a100 = &gpus[0];
    assert_eq!(a100["name"], "NVIDIA A100-SXM4-80GB");
    // no utilization on a GPU with MIG on: absent, never 0
    assert_eq!(a100["metrics"]["util"], Value::Null, "{a100}");
    let mig = a100["mig"].as_array().expect("mig");
    assert_eq!(mig.len(), 7, "{a100}");
    let procs = a100["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 7);
    let mut sum = 0;
    for (k, m) in mig.iter().enumerate() {
        assert_eq!(m["profile"], "1g.10gb");
        assert_eq!(m["index"], k);
        assert_eq!(m["gpu_instance_id"], 7 + k);
        assert_eq!(m["compute_instance_id"], 0);
        assert_eq!(m["placement"]["start"], k);
        assert!(m["uuid"].as_str().is_some_and(|u| u.starts_with("MIG-")));
        assert_eq!(m["memory_total_bytes"], 9728_u64 << 20);
        let used = m["memory_used_bytes"].as_u64().expect("used");
        assert!((3000_u64 << 20..9000 << 20).contains(&used), "{m}");
        sum += used;
        // the process on it, with its memory and the MIG device's UUID
        let pids = m["processes"].as_array().expect("pids");
        assert_eq!(pids.len(), 1, "{m}");
        let want = if k == 0 {
            parent_pid()
        } else {
            4_194_400 + k as u64
        };
        assert_eq!(pids[0], want);
        let p = procs.iter().find(|p| p["pid"] == want).expect("process");
        assert_eq!(p["mig_uuid"], m["uuid"]);
        assert_eq!(p["used_memory_bytes"], used);
    }
    assert_eq!(
        a100["metrics"]["mem_used"], sum,
        "the GPU's memory is its MIG devices'"
    );
    let h100: Vec<&str> = gpus[1]["mig"]
        .as_array()
        .expect("mig")
        .iter()
        .map(|m| m["profile"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(h100, ["3g.40gb", "2g.20gb", "1g.10gb"]);
    assert_eq!(gpus[1]["mig"][2]["processes"], Value::Array(vec![]));
    assert_eq!(gpus[2]["mig"], Value::Array(vec![]));
    assert!(
        gpus[2]["metrics"]["util"].as_f64().is_some(),
        "MIG off: utilization"
    );

    let table = sim(
        "mig",
        &["status"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "100")],
    );
    assert_eq!(table.code, 0, "{}", table.stderr);
    let t = &table.stdout;
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| l.contains("MIG 1g.10gb  0/"))
        .collect();
    assert_eq!(rows.len(), 7, "{t}");
    for (k, r) in rows.iter().enumerate() {
        let m = &mig[k];
        let used = m["memory_used_bytes"].as_u64().unwrap_or(0) >> 20;
        assert!(r.contains(&format!("0/{}/0", 7 + k)), "{r}");
        assert!(r.contains(&format!("{used} / 9728 MiB")), "{r}");
        assert!(r.contains(m["uuid"].as_str().unwrap_or("?")), "{r}");
    }
    // each MIG device's process right under it
    let lines: Vec<&str> = t.lines().collect();
    for r in &rows {
        let at = lines.iter().position(|l| l == r).expect("row");
        assert!(lines[at + 1].contains("└ pid"), "{t}");
    }
    assert!(t.contains("MIG 3g.40gb  1/1/0"), "{t}");
    assert!(t.contains("(no process)"), "the idle 1g.10gb: {t}");
}

#[test]
fn devices_maps_mig_uuids_and_legacy_ids() {
    let all = sim("mig", &["devices", "--json"], &[]).json();
    let a100 = &all["devices"][0];
    assert_eq!(a100["mig"].as_array().map(Vec::len), Some(7), "{all}");
    assert_eq!(all["devices"][2]["mig"], Value::Array(vec![]));
    let target = &a100["mig"][3];
    let uuid = target["uuid"].as_str().expect("uuid").to_string();
    let gpu_uuid = a100["uuid"].as_str().expect("uuid").to_string();
    assert_eq!(target["legacy_id"], format!("MIG-{gpu_uuid}/10/0"));

    for spec in [uuid.clone(), format!("MIG-{gpu_uuid}/10/0")] {
        let d = sim(
            "mig",
            &["devices", "--json"],
            &[("CUDA_VISIBLE_DEVICES", &spec)],
        )
        .json();
        let c = &d["cuda_visible_devices"];
        let visible = c["visible"].as_array().expect("visible");
        assert_eq!(visible.len(), 1, "{c}");
        assert_eq!(visible[0]["cuda"], 0);
        assert_eq!(visible[0]["index"], 0);
        assert_eq!(visible[0]["mig"]["uuid"], uuid.as_str(), "{c}");
        assert_eq!(visible[0]["mig"]["gpu_instance_id"], 10);
        assert_eq!(visible[0]["mig"]["profile"], "1g.10gb");
        assert_eq!(c["stopped_at"], Value::Null);
    }

    // A CUDA process runs on one MIG device: the second is skipped; GPU 2 is a whole GPU.
    let h100 = all["devices"][1]["mig"][0]["uuid"].as_str().expect("uuid");
    let spec = format!("{uuid},{h100},2,MIG-ffffffff");
    let d = sim(
        "mig",
        &["devices", "--json"],
        &[("CUDA_VISIBLE_DEVICES", &spec)],
    )
    .json();
    let c = &d["cuda_visible_devices"];
    let idx: Vec<u64> = c["visible"]
        .as_array()
        .expect("visible")
        .iter()
        .map(|v| v["index"].as_u64().unwrap_or(99))
        .collect();
    assert_eq!(idx, vec![0, 2], "{c}");
    assert_eq!(c["visible"][1]["mig"], Value::Null);
    assert_eq!(c["ignored"][0]["entry"], h100);
    assert_eq!(c["stopped_at"]["entry"], "MIG-ffffffff");

    let text = sim("mig", &["devices"], &[("CUDA_VISIBLE_DEVICES", &uuid)]).stdout;
    assert!(
        text.contains(&format!(
            "cuda:0 = MIG 1g.10gb 0/10/0 on NVML index 0  {uuid}"
        )),
        "{text}"
    );
    assert!(text.contains("(MIG on: 7 MIG devices)"), "{text}");
    let unset = sim("mig", &["devices"], &[]).stdout;
    assert!(unset.contains("CUDA_VISIBLE_DEVICES=MIG-<UUID>"), "{unset}");
}

fn config(dir: &std::path::Path, listen: Option<&str>) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    let exporter = listen.map_or_else(String::new, |l| format!("\n[exporter]\nlisten = \"{l}\"\n"));
    std::fs::write(
        &path,
        format!(
            "[daemon]\ninterval = \"1s\"\nstate_dir = \"state\"\nrules = [{rules:?}]\nhostname = \"simhost\"\n\n\
             [digest]\nschedule = \"daily\"\n{exporter}",
            rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("rules")
                .display()
                .to_string(),
        ),
    )
    .expect("config");
    path
}

#[test]
fn metrics_carry_gpu_i_profile_and_gpu_i_id_per_mig_device() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), Some(&format!("127.0.0.1:{port}")));
    let d = daemon("mig", &cfg, &tmp.path().join("log"), &[]);
    let (_, _, page) = wait_until(Duration::from_secs(30), "MIG devices in /metrics", || {
        get(port, "/metrics", "text/plain").filter(|r| r.2.contains("GPU_I_PROFILE"))
    });
    let fb_used: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_FB_USED{") && l.contains("GPU_I_ID="))
        .collect();
    assert_eq!(fb_used.len(), 10, "7 + 3 MIG devices:\n{page}");
    let a100: Vec<&&str> = fb_used
        .iter()
        .filter(|l| l.contains("gpu=\"0\"") && l.contains("GPU_I_PROFILE=\"1g.10gb\""))
        .collect();
    assert_eq!(a100.len(), 7, "{page}");
    for gi in 7..14 {
        assert!(
            a100.iter()
                .any(|l| l.contains(&format!("GPU_I_ID=\"{gi}\""))),
            "GI {gi}: {page}"
        );
    }
    assert!(
        page.contains("GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"1\""),
        "{page}"
    );
    // MiB, as dcgm-exporter: the 3g.40gb holds 30000 MiB
    let h100 = fb_used
        .iter()
        .find(|l| l.contains("GPU_I_PROFILE=\"3g.40gb\""))
        .expect("3g.40gb");
    assert!(h100.ends_with(" 30000"), "{h100}");
    assert!(page.contains("DCGM_FI_DEV_FB_TOTAL{") && page.contains("GPU_I_ID=\"13\""));
    // the GPUs with MIG on have no utilization series; the one with MIG off has
    let util: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .collect();
    assert_eq!(util.len(), 1, "{util:?}");
    assert!(util[0].contains("gpu=\"2\""), "{util:?}");
    assert_eq!(
        page.lines()
            .filter(|l| l.starts_with("gpuwatch_mig_device_info{"))
            .count(),
        10
    );
    assert!(
        page.lines()
            .any(|l| l.starts_with("gpuwatch_gpu_process_memory_bytes{")
                && l.contains("gpu=\"0\"")
                && l.contains("gpu_i_id=\"7\"")),
        "process series name their MIG device: {page}"
    );
    // dcgm-exporter's own names are kept for its dashboards; nothing else may be flagged.
    let problems = super::exporter::promtool_problems(&page);
    assert!(problems.is_empty(), "promtool: {problems:?}\n{page}");
    drop(d);
}

#[test]
fn record_writes_a_row_per_mig_device_that_import_and_report_read_back() {
    // the scenario clock frozen: a process's memory and its MIG device's are read apart
    let rec = sim(
        "mig",
        &["record", "--interval", "200ms", "--duration", "650ms"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "100")],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (header, rows) = csv_rows(&rec.stdout);
    // per tick: 3 GPU rows + 7 + 3 MIG device rows
    assert_eq!(rows.len() % 13, 0, "{}", rec.stdout);
    let ticks = rows.len() / 13;
    assert!((3..=4).contains(&ticks), "{ticks} ticks");
    let tick = &rows[..13];
    let index: Vec<&str> = tick.iter().map(|r| col(&header, r, "index")).collect();
    assert_eq!(
        index,
        [
            "0", "0/7/0", "0/8/0", "0/9/0", "0/10/0", "0/11/0", "0/12/0", "0/13/0", "1", "1/1/0",
            "1/5/0", "1/13/0", "2"
        ]
    );
    let m = &tick[1];
    assert!(col(&header, m, "uuid").starts_with("MIG-"));
    assert_eq!(col(&header, m, "name"), "NVIDIA A100-SXM4-80GB MIG 1g.10gb");
    assert_eq!(col(&header, m, "mem_total"), (9728_u64 << 20).to_string());
    assert_eq!(col(&header, m, "util"), "", "no utilization per MIG device");
    assert_eq!(col(&header, m, "temp"), "");
    let used = col(&header, m, "mem_used");
    assert!(
        col(&header, m, "processes").ends_with(&format!(":{used}")),
        "{m:?}"
    );
    assert_eq!(col(&header, &tick[11], "processes"), "", "the idle 1g.10gb");

    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("mig.csv");
    std::fs::write(&file, &rec.stdout).expect("write");
    let file_s = file.to_str().expect("utf-8");
    // import writes the same rows back
    let imported = common::gpuwatch(&["import", file_s], &[]);
    assert_eq!(imported.code, 0, "{}", imported.stderr);
    let (h2, rows2) = csv_rows(&imported.stdout);
    assert_eq!(h2, header);
    assert_eq!(rows2, rows, "import round trip");
    // report lists the MIG devices
    let report = common::gpuwatch(&["report", file_s], &[]);
    assert_eq!(report.code, 0, "{}", report.stderr);
    let lines: Vec<&str> = report
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("MIG 1g.10gb 0/"))
        .collect();
    assert_eq!(lines.len(), 7, "{}", report.stdout);
    assert!(
        lines.iter().all(|l| l.contains("of 9.5 GiB; 1 process")),
        "{lines:?}"
    );
    assert!(
        report
            .stdout
            .contains("MIG 1g.10gb 1/13/0: memory peak 0.0 GiB of 9.8 GiB; 0 processes"),
        "{}",
        report.stdout
    );
    let json = common::gpuwatch(&["report", "--json", file_s], &[]).json();
    let mig = json["mig"].as_array().expect("mig");
    assert_eq!(mig.len(), 10, "{json}");
    assert_eq!(mig[0]["profile"], "1g.10gb");
    assert_eq!(mig[0]["processes"], 1);
}

/// The daemon's usage ledger on the `mig` scenario: this test process owns the first MIG
/// device of the A100 (1/7 of it), the H100's 3g.40gb (3/7) and the whole third GPU; the
/// processes it cannot see (`?`) the A100's six other 1g.10gb (6/7) and the H100's 2g.20gb
/// (2/7). Their GPU-hours stand 11 : 8.
#[test]
fn usage_counts_each_mig_device_for_its_share() {
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path(), None);
    let cfg_s = cfg.to_str().expect("utf-8");
    let mut real = common::command(&["--sim", "mig", "daemon", "--config", cfg_s], &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("daemon");
    std::thread::sleep(Duration::from_secs(8));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(real.id() as i32, libc::SIGTERM) };
    assert!(real.wait().expect("daemon").success());
    let v = common::gpuwatch(
        &["digest", "--since", "7d", "--json", "--config", cfg_s],
        &[],
    )
    .json();
    let owners = v["owners"].as_array().expect("owners");
    let hours = |user: &str| {
        owners
            .iter()
            .filter(|o| o["user"] == user)
            .filter_map(|o| o["gpu_hours"].as_f64())
            .sum::<f64>()
    };
    let me = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .expect("id")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .to_string();
    let (mine, unseen) = (hours(&me), hours("?"));
    assert!(mine > 0.0 && unseen > 0.0, "{v}");
    let ratio = mine / unseen;
    assert!((ratio - 11.0 / 8.0).abs() < 0.05, "{ratio}: {v}");
    // ~7 s of 19/7 GPUs
    assert!((0.002..0.01).contains(&(mine + unseen)), "{v}");
}

/// A tmux server of this test's own, killed when dropped.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("tmux")
            .args(["-L", &self.0, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

/// `gpuwatch top` in a real terminal: a line under each GPU with MIG on names its MIG devices
/// (GPU instance, profile, memory used), and the processes show `GPU/GI`.
#[test]
fn top_lists_mig_devices_under_their_gpu() {
    if common::installed(&["tmux"]).is_none() {
        return;
    }
    common::sim_lib();
    let tmux = Tmux(format!("gpuwatch-mig-{}", std::process::id()));
    let line = format!(
        "env -u GPUWATCH_CONFIG -u GPUWATCH_LOG -u NVML_SIM_TIME_SCALE HOME={home} {exe} --sim mig top; sleep 600",
        home = common::test_home().display(),
        exe = common::gpuwatch_exe().display(),
    );
    tmux.run(&["new-session", "-d", "-x", "160", "-y", "40", &line]);
    let screen = wait_until(Duration::from_secs(30), "MIG devices in top", || {
        let s = tmux.run(&["capture-pane", "-p"]);
        (s.contains("MIG  1:3g.40gb") && s.contains(" 0/7 ")).then_some(s)
    });
    let a100 = screen
        .lines()
        .find(|l| l.starts_with("   MIG  7:1g.10gb"))
        .unwrap_or_else(|| panic!("{screen}"));
    assert!(a100.contains("13:1g.10gb"), "{screen}");
    assert!(
        screen.contains("MIG  1:3g.40gb 29.3G  5:2g.20gb 11.7G  13:1g.10gb 0.0G"),
        "{screen}"
    );
    tmux.run(&["send-keys", "q"]);
}

/// A scenario whose driver names carry escape sequences, a clipboard write (OSC 52), a bell,
/// quotes, markup and line breaks: the GPU's name and a MIG device's UUID.
const HOSTILE: &str = r#"name = "hostile-names"
[devices]
count = 2
name = "NVIDIA H100 \u001b[2J\u001b]52;c;SGk=\u0007 \"q'<b>x</b>\nfake{a=\"b\"}"
mig_capable = true
[devices.metrics]
gpu_util_pct = 50
[[device]]
index = 0
mig = [ { profile = "1g.10gb", uuid = "MIG-\u001b[31mRED\n\"}<script>alert(1)</script>,x" }, { profile = "2g.20gb", uuid = "MIG-a\"b\\c\td\re" } ]
[[device]]
index = 1
mig = ["3g.40gb"]
[[process]]
gpu = 0
mig = 0
pid = 4194400
used_memory_mib = 2000
"#;

/// Control characters other than the line breaks a text output is made of.
fn raw_controls(s: &str) -> Vec<char> {
    s.chars().filter(|c| c.is_control() && *c != '\n').collect()
}

const FROZEN: [(&str, &str); 2] = [("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "100")];

/// Writes [`HOSTILE`] into `dir` and returns its path.
fn hostile_scenario(dir: &std::path::Path) -> String {
    let scenario = dir.join("hostile.toml");
    std::fs::write(&scenario, HOSTILE).expect("scenario");
    scenario.to_str().expect("utf-8").to_string()
}

/// `record` of [`HOSTILE`], checked to be one line per row, and the file it was written to.
fn hostile_recording(dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let scenario = hostile_scenario(dir);
    let rec = sim(
        &scenario,
        &["record", "--interval", "200ms", "--duration", "450ms"],
        &FROZEN,
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let file = dir.join("hostile.csv");
    std::fs::write(&file, &rec.stdout).expect("write");
    (rec.stdout, file)
}

#[test]
fn devices_shows_driver_names_with_their_control_characters_escaped() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let scenario = hostile_scenario(tmp.path());
    let scenario = scenario.as_str();
    let frozen = FROZEN;

    // `devices` printed the GPU's name and the MIG device's UUID raw (ESC, OSC 52, BEL, CR)
    for env in [None, Some("MIG-a\"b"), Some("0,1")] {
        let mut envs = frozen.to_vec();
        if let Some(v) = env {
            envs.push(("CUDA_VISIBLE_DEVICES", v));
        }
        let d = sim(scenario, &["devices"], &envs);
        assert_eq!(d.code, 0, "{}", d.stderr);
        assert!(d.stdout.contains("MIG 1g.10gb 0/7/0"), "{}", d.stdout);
        assert_eq!(
            raw_controls(&d.stdout),
            Vec::<char>::new(),
            "{env:?}: {}",
            d.stdout
        );
        assert!(d.stdout.contains(r"MIG-\u{1b}[31mRED\n"), "{}", d.stdout);
    }
    // … and `--json` keeps them exact
    let j = sim(scenario, &["devices", "--json"], &frozen).json();
    assert_eq!(
        j["devices"][0]["mig"][0]["uuid"],
        "MIG-\u{1b}[31mRED\n\"}<script>alert(1)</script>,x"
    );
}

#[test]
fn a_recording_of_driver_names_with_line_breaks_reads_back() {
    // `record` wrote the line breaks into quoted cells: every line-based reader, `import` and
    // `report` included, then found "no samples in the log"
    let tmp = tempfile::tempdir().expect("tempdir");
    let (text, file) = hostile_recording(tmp.path());
    assert_eq!(raw_controls(&text), Vec::<char>::new(), "{text}");
    let (header, rows) = csv_rows(&text);
    assert!(rows.len() >= 5, "{text}");
    let index: Vec<&str> = rows[..5].iter().map(|r| col(&header, r, "index")).collect();
    assert_eq!(index, ["0", "0/7/0", "0/4/0", "1", "1/1/0"]);
    assert!(col(&header, &rows[1], "uuid").starts_with(r"MIG-\u{1b}[31mRED\n"));
    let file_s = file.to_str().expect("utf-8");
    let imported = common::gpuwatch(&["import", file_s], &[]);
    assert_eq!(imported.code, 0, "{}", imported.stderr);
    assert_eq!(csv_rows(&imported.stdout).1, rows, "import round trip");
    let report = common::gpuwatch(&["report", file_s], &[]);
    assert_eq!(report.code, 0, "{}", report.stderr);
    assert!(
        report
            .stdout
            .contains("MIG 2g.20gb 0/4/0: memory peak 0.0 GiB"),
        "{}",
        report.stdout
    );
}

#[test]
fn report_takes_no_profile_from_a_crafted_mig_name() {
    // a recording whose MIG name carries markup and an escape sequence after the profile:
    // `report` printed it as the profile, ESC and all
    let rec = sim(
        "mig",
        &["record", "--interval", "200ms", "--duration", "450ms"],
        &FROZEN,
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("crafted.csv");
    let file_s = file.to_str().expect("utf-8");
    let evil = rec.stdout.replace(
        "MIG 2g.20gb",
        "MIG 2g.20gb<b>\u{1b}[2J\u{1b}]52;c;SGk=\u{7}",
    );
    std::fs::write(&file, evil).expect("write");
    let report = common::gpuwatch(&["report", file_s], &[]);
    assert_eq!(report.code, 0, "{}", report.stderr);
    assert_eq!(
        raw_controls(&report.stdout),
        Vec::<char>::new(),
        "{}",
        report.stdout
    );
    assert!(
        report.stdout.contains("MIG ? 1/5/0: memory peak 11.7 GiB"),
        "an unreadable profile is unknown: {}",
        report.stdout
    );
}
