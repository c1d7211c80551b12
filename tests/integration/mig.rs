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

/// The PID nvml-sim gives the first rank of a scenario's training job (`pid = "job"`).
const FIRST_RANK: u64 = 4_195_001;

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
            FIRST_RANK
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
            "[daemon]\ninterval = \"1s\"\ngpm_interval = \"0s\"\nstate_dir = \"state\"\nrules = [{rules:?}]\nhostname = \"simhost\"\n\n\
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

/// The daemon on the `mig` scenario with the exporter on (kept alive by the returned guard and
/// directory), and its `/metrics` page once `ready` accepts it (within `limit`).
fn mig_metrics_page(
    limit: Duration,
    what: &str,
    ready: impl Fn(&str) -> bool,
) -> (tempfile::TempDir, super::notify::servers::Daemon, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(tmp.path(), Some(&format!("127.0.0.1:{port}")));
    let d = daemon("mig", &cfg, &tmp.path().join("log"), &[]);
    let (_, _, page) = wait_until(limit, what, || {
        get(port, "/metrics", "text/plain").filter(|r| ready(&r.2))
    });
    (tmp, d, page)
}

#[test]
fn metrics_carry_gpu_i_profile_and_gpu_i_id_per_mig_device() {
    let (_tmp, d, page) =
        mig_metrics_page(Duration::from_secs(30), "MIG devices in /metrics", |p| {
            p.contains("GPU_I_PROFILE")
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

/// The daemon's usage ledger on the `mig` scenario with its training ranks made this test
/// process (the daemon's parent, so `/proc` names the owner): this test process owns the first MIG
/// device of the A100 (1/7 of it), the H100's 3g.40gb (3/7) and the whole third GPU; the
/// processes it cannot see (`?`) the A100's six other 1g.10gb (6/7) and the H100's 2g.20gb
/// (2/7). Their GPU-hours stand 11 : 8.
#[test]
fn usage_counts_each_mig_device_for_its_share() {
    common::sim_lib();
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path(), None);
    let cfg_s = cfg.to_str().expect("utf-8");
    let scenario = common::scenario_with_parent("mig", tmp.path());
    let scenario = scenario.to_str().expect("utf-8");
    let mut real = common::command(&["--sim", scenario, "daemon", "--config", cfg_s], &[])
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

/// `record` of the `mig` scenario (clock frozen), written into `dir`: its path.
fn mig_recording(dir: &std::path::Path) -> std::path::PathBuf {
    let rec = sim(
        "mig",
        &["record", "--interval", "200ms", "--duration", "650ms"],
        &FROZEN,
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let file = dir.join("mig.csv");
    std::fs::write(&file, &rec.stdout).expect("write");
    file
}

/// The HTML page of `report`: under each GPU with MIG on, a table of its MIG devices (profile,
/// GPU/GI/CI, UUID, memory peak / total, processes seen), the A100's seven 1g.10gb included;
/// headless Chromium finds the same rows in the DOM. A recording of driver names with markup
/// makes a page with none of it.
#[test]
fn report_page_lists_each_mig_device_under_its_gpu() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = mig_recording(tmp.path());
    let page_path = tmp.path().join("report.html");
    let run = common::gpuwatch(
        &[
            "report",
            file.to_str().expect("utf-8"),
            "--out",
            page_path.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let page = std::fs::read_to_string(&page_path).expect("the page");
    let (header, rows) = csv_rows(&std::fs::read_to_string(&file).expect("the recording"));
    // the A100's section holds its seven 1g.10gb, each with its ids, UUID, memory and process
    let a100 = page
        .split("<section class=\"gpu\" id=\"gpu-0\"")
        .nth(1)
        .and_then(|s| s.split("</section>").next())
        .expect("GPU 0's section");
    assert!(
        a100.contains("MIG on: 7 MIG devices (7 × 1g.10gb)"),
        "{a100}"
    );
    let devices: Vec<&str> = a100.split("<tr class=\"mig-device\"").skip(1).collect();
    assert_eq!(devices.len(), 7, "{a100}");
    for (k, d) in devices.iter().enumerate() {
        let gi = 7 + k;
        assert!(
            d.contains(&format!("<td>1g.10gb</td><td>0/{gi}/0</td>")),
            "{d}"
        );
        let row = rows
            .iter()
            .find(|r| col(&header, r, "index") == format!("0/{gi}/0"))
            .expect("its CSV row");
        assert!(d.contains(col(&header, row, "uuid")), "{d}");
        assert!(d.contains(" / 9.5 GiB ("), "memory peak / total: {d}");
        let pid = col(&header, row, "processes")
            .split(':')
            .next()
            .expect("pid")
            .to_string();
        assert!(
            d.contains(&format!("<td>1: {pid}")),
            "the process on it: {d}"
        );
    }
    let h100 = page
        .split("<section class=\"gpu\" id=\"gpu-1\"")
        .nth(1)
        .and_then(|s| s.split("</section>").next())
        .expect("GPU 1's section");
    assert!(
        h100.contains("MIG on: 3 MIG devices (1 × 3g.40gb, 1 × 2g.20gb, 1 × 1g.10gb)"),
        "{h100}"
    );
    assert!(h100.contains("<td>1/13/0</td>"), "{h100}");
    assert!(h100.contains("<td>none</td>"), "the idle 1g.10gb: {h100}");
    let whole = page
        .split("<section class=\"gpu\" id=\"gpu-2\"")
        .nth(1)
        .and_then(|s| s.split("</section>").next())
        .expect("GPU 2's section");
    assert!(!whole.contains("class=\"mig\""), "MIG off: {whole}");

    if let Some(chrome) = common::installed(&["chromium", "chromium-browser", "google-chrome"]) {
        let dom = std::process::Command::new(&chrome)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
            ])
            .arg(format!(
                "--user-data-dir={}",
                tmp.path().join("chrome").display()
            ))
            .arg("--dump-dom")
            .arg(format!("file://{}", page_path.display()))
            .output()
            .expect("chromium --dump-dom");
        let dom = String::from_utf8_lossy(&dom.stdout);
        assert_eq!(
            dom.matches("class=\"mig-device\"").count(),
            10,
            "MIG device rows in the DOM: {dom:.3000}"
        );
        assert_eq!(dom.matches("id=\"gpu-0-mig\"").count(), 1);
    }

    // driver names with markup, quotes and escape sequences: escaped on the page
    let (_, hostile) = hostile_recording(tmp.path());
    let page_path = tmp.path().join("hostile.html");
    let run = common::gpuwatch(
        &[
            "report",
            hostile.to_str().expect("utf-8"),
            "--out",
            page_path.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let page = std::fs::read_to_string(&page_path).expect("the page");
    assert!(!page.contains("<script"), "{page}");
    assert_eq!(raw_controls(&page), Vec::<char>::new());
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the UUID, escaped: {page}"
    );
    assert!(page.contains("<td>0/7/0</td>"), "{page}");
}

/// `export --openmetrics` of a recording carries the MIG devices as the live page does
/// (`DCGM_FI_DEV_FB_USED`, `…_FREE`, `…_TOTAL` in MiB with `GPU_I_PROFILE` and `GPU_I_ID`), so a
/// backfilled log lines up with live data; promtool turns it into a block with one series per
/// MIG device.
#[test]
fn export_backfills_each_mig_device_as_the_live_page_names_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = mig_recording(tmp.path());
    let om = tmp.path().join("mig.om");
    let run = common::gpuwatch(
        &[
            "export",
            "--openmetrics",
            file.to_str().expect("utf-8"),
            "--hostname",
            "simhost",
            "--out",
            om.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let text = std::fs::read_to_string(&om).expect("the export");
    let (header, rows) = csv_rows(&std::fs::read_to_string(&file).expect("the recording"));
    let ticks = rows.len() / 13;
    for family in [
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_TOTAL",
    ] {
        let mig: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains("GPU_I_ID="))
            .collect();
        assert_eq!(
            mig.len(),
            10 * ticks,
            "{family}: 7 + 3 MIG devices a tick:\n{text}"
        );
        // each series' samples together, in time order
        let mut series: Vec<&str> = mig
            .iter()
            .map(|l| l.split_once('}').map_or(*l, |(s, _)| s))
            .collect();
        series.dedup();
        assert_eq!(series.len(), 10, "{family}: {series:?}");
    }
    // the labels of the live page: the GPU's, GPU_I_PROFILE and GPU_I_ID after modelName
    let a100 = rows
        .iter()
        .find(|r| col(&header, r, "index") == "0")
        .expect("the A100's row");
    let want = format!(
        "DCGM_FI_DEV_FB_USED{{gpu=\"0\",UUID=\"{}\",device=\"nvidia0\",modelName=\"NVIDIA A100-SXM4-80GB\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"7\",pci_bus_id=\"{}\",Hostname=\"simhost\",hostname=\"simhost\"}} ",
        col(&header, a100, "uuid"),
        col(&header, a100, "pci_bus_id"),
    );
    let first = text
        .lines()
        .find(|l| l.starts_with(&want))
        .unwrap_or_else(|| panic!("no {want}:\n{text}"));
    let used = rows
        .iter()
        .find(|r| col(&header, r, "index") == "0/7/0")
        .map(|r| col(&header, r, "mem_used").parse::<f64>().expect("bytes") / 1_048_576.0)
        .expect("0/7/0");
    let shown: f64 = first[want.len()..]
        .split(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a value");
    assert!(
        (shown - used).abs() < 1e-6,
        "MiB as dcgm-exporter: {first} vs {used}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("DCGM_FI_DEV_FB_TOTAL{")
            && l.contains("GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"1\"")),
        "{text}"
    );
    // no utilization for the GPUs with MIG on, as live
    let util: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .collect();
    assert!(util.iter().all(|l| l.contains("gpu=\"2\"")), "{util:?}");
    let Some(promtool) = common::installed(&["promtool"]) else {
        return;
    };
    let blocks = tmp.path().join("blocks");
    let out = std::process::Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&om)
        .arg(&blocks)
        .output()
        .expect("promtool tsdb create-blocks-from");
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::create_dir_all(blocks.join("wal")).expect("wal dir");
    let dump = std::process::Command::new(&promtool)
        .args(["tsdb", "dump"])
        .arg(&blocks)
        .output()
        .expect("promtool tsdb dump");
    let dump = String::from_utf8_lossy(&dump.stdout);
    let series: std::collections::BTreeSet<(String, String)> = dump
        .lines()
        .filter(|l| l.contains("__name__=\"DCGM_FI_DEV_FB_USED\""))
        .filter_map(|l| {
            let gpu = l.split("gpu=\"").nth(1)?.split('"').next()?;
            let gi = l.split("GPU_I_ID=\"").nth(1)?.split('"').next()?;
            Some((gpu.to_string(), gi.to_string()))
        })
        .collect();
    assert_eq!(
        series.len(),
        10,
        "one series per GPU instance: {dump:.3000}"
    );
    assert!(series.contains(&("0".into(), "13".into())), "{series:?}");
    assert!(series.contains(&("1".into(), "5".into())), "{series:?}");
}

/// GPM per GPU instance (`nvmlGpmMigSampleGet`, Hopper and later) in `status --json`: the
/// H100's GPU instances carry their own activity under `mig[].metrics` — the 3g.40gb and the
/// 2g.20gb run a process (SM active 85 % of the GPU's ~95 % utilization), the idle 1g.10gb reads
/// 0 — while the A100's (no GPM before Hopper) have none: `null`, never 0. The whole H100's SM
/// activity is its instances' weighted by compute slices. With the whole GPU's GPM refused by
/// the driver, the GPU's `sm_active` is `null` and its instances still read theirs.
#[test]
fn status_carries_the_gpm_metrics_of_each_gpu_instance() {
    let s = status();
    let gpus = s["gpus"].as_array().expect("gpus");
    for m in gpus[0]["mig"].as_array().expect("A100 mig") {
        let metrics = m["metrics"].as_object().expect("metrics");
        assert!(metrics.contains_key("sm_active"), "{m}");
        assert!(metrics.values().all(Value::is_null), "A100: no GPM: {m}");
    }
    let h100 = gpus[1]["mig"].as_array().expect("H100 mig");
    let sm = |k: usize| h100[k]["metrics"]["sm_active"].as_f64();
    let gr = |k: usize| h100[k]["metrics"]["gr_engine_active"].as_f64();
    for k in [0, 1] {
        let (sm, gr) = (sm(k).expect("sm_active"), gr(k).expect("gr_engine_active"));
        assert!((90.0..=100.0).contains(&gr), "{}", h100[k]);
        assert!((sm - 0.85 * gr).abs() < 1e-6, "{}", h100[k]);
        assert_eq!(
            h100[k]["metrics"]["pcie_tx_bytes"],
            Value::Null,
            "the GPU's"
        );
    }
    assert_eq!(h100[2]["profile"], "1g.10gb");
    assert_eq!(sm(2), Some(0.0), "the idle 1g.10gb");
    let whole = gpus[1]["metrics"]["sm_active"].as_f64().expect("H100 SM");
    let want = (3.0 * sm(0).expect("3g") + 2.0 * sm(1).expect("2g")) / 7.0;
    assert!((whole - want).abs() < 1e-6, "{whole} vs {want}");
    assert_eq!(gpus[0]["metrics"]["sm_active"], Value::Null);
    // the text table shows each H100 instance's SM activity
    let text = sim(
        "mig",
        &["status"],
        &[("NVML_SIM_TIME_SCALE", "0"), ("NVML_SIM_START_S", "100")],
    );
    assert_eq!(text.code, 0, "{}", text.stderr);
    let line = |gi: &str| {
        text.stdout
            .lines()
            .find(|l| l.contains(&format!(" {gi} ")) && l.contains("MIG "))
            .unwrap_or_else(|| panic!("{gi}: {}", text.stdout))
            .to_string()
    };
    assert!(line("1/13/0").contains("SM   0 %"), "{}", text.stdout);
    assert!(line("1/1/0").contains("SM  "), "{}", text.stdout);
    assert!(!line("0/7/0").contains("SM "), "{}", text.stdout);

    // the driver refuses the whole GPU's GPM: the GPUs' SM activity is absent, the instances'
    // stays
    let refused = sim(
        "mig",
        &["status", "--json"],
        &[
            ("NVML_SIM_TIME_SCALE", "0"),
            ("NVML_SIM_START_S", "100"),
            ("NVML_SIM_NOT_SUPPORTED", "nvmlGpmSampleGet"),
        ],
    )
    .json();
    let g = &refused["gpus"][1];
    assert_eq!(g["metrics"]["sm_active"], Value::Null, "{g}");
    assert_eq!(g["gpm"]["state"], "unsupported", "{g}");
    assert!(
        g["mig"][0]["metrics"]["sm_active"].as_f64().is_some(),
        "{g}"
    );
}

/// `/metrics`: each H100 GPU instance carries `DCGM_FI_PROF_SM_ACTIVE` (a ratio) with its GPU's
/// labels plus `GPU_I_PROFILE` and `GPU_I_ID`, as dcgm-exporter exports a GPU instance's
/// profiling fields; the A100's GPU instances have no profiling series at all (absent, never 0).
#[test]
fn metrics_carry_the_profiling_series_of_each_gpu_instance() {
    // a GPU instance's GPM needs two slow reads (the process cadence, 5 s)
    let (_tmp, d, page) = mig_metrics_page(
        Duration::from_secs(40),
        "GPU instances' DCGM_FI_PROF_SM_ACTIVE in /metrics",
        |p| {
            p.lines()
                .filter(|l| l.starts_with("DCGM_FI_PROF_SM_ACTIVE{") && l.contains("GPU_I_ID="))
                .count()
                == 3
        },
    );
    let sm: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_PROF_SM_ACTIVE{") && l.contains("GPU_I_ID="))
        .collect();
    assert!(
        sm.iter().all(|l| l.contains("gpu=\"1\"")),
        "the H100's GPU instances only: {sm:?}"
    );
    let value = |gi: &str, profile: &str| -> f64 {
        let l = sm
            .iter()
            .find(|l| l.contains(&format!("GPU_I_PROFILE=\"{profile}\",GPU_I_ID=\"{gi}\"")))
            .unwrap_or_else(|| panic!("GI {gi}: {sm:?}"));
        l.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("value")
    };
    let busy = value("1", "3g.40gb");
    assert!((0.6..=0.9).contains(&busy), "a ratio of ~0.81: {busy}");
    assert!(value("5", "2g.20gb") > 0.6);
    assert_eq!(value("13", "1g.10gb"), 0.0, "the idle 1g.10gb");
    // the A100 (no GPM) has no profiling series, neither per GPU instance nor for itself
    assert!(
        !page
            .lines()
            .any(|l| l.starts_with("DCGM_FI_PROF_") && l.contains("gpu=\"0\"")),
        "{page}"
    );
    // the H100 with MIG off keeps its own series, without GPU_I_ID
    assert!(page
        .lines()
        .any(|l| l.starts_with("DCGM_FI_PROF_SM_ACTIVE{")
            && l.contains("gpu=\"2\"")
            && !l.contains("GPU_I_ID")));
    // bandwidths are the GPU's: no GPU instance has PCIe bytes
    assert!(
        !page
            .lines()
            .any(|l| l.starts_with("DCGM_FI_PROF_PCIE_TX_BYTES{") && l.contains("GPU_I_ID")),
        "{page}"
    );
    let problems = super::exporter::promtool_problems(&page);
    assert!(problems.is_empty(), "promtool: {problems:?}\n{page}");
    drop(d);
}

/// `record` writes a GPU instance's GPM metrics into its MIG device's row (the H100's, once two
/// slow reads have been made; never on the A100's), `import` reads them back (the same rows),
/// and `report` averages them per MIG device.
#[test]
fn record_import_and_report_carry_the_gpm_metrics_of_gpu_instances() {
    let rec = sim(
        "mig",
        &[
            "record",
            "--interval",
            "200ms",
            "--duration",
            "1450ms",
            "--process-interval",
            "400ms",
        ],
        &[],
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let (header, rows) = csv_rows(&rec.stdout);
    let sm = |index: &str| -> Vec<String> {
        rows.iter()
            .filter(|r| col(&header, r, "index") == index)
            .map(|r| col(&header, r, "sm_active").to_string())
            .collect()
    };
    let busy = sm("1/1/0");
    assert!(
        busy.last()
            .is_some_and(|v| v.parse::<f64>().is_ok_and(|v| v > 50.0)),
        "{busy:?}"
    );
    assert!(
        sm("1/13/0").last().is_some_and(|v| v == "0"),
        "the idle 1g.10gb"
    );
    assert!(sm("0/7/0").iter().all(String::is_empty), "the A100: none");
    assert!(
        rows.iter()
            .filter(|r| col(&header, r, "index").starts_with("1/"))
            .all(|r| col(&header, r, "pcie_tx_bytes").is_empty()),
        "no bandwidths per GPU instance"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("mig-gpm.csv");
    std::fs::write(&file, &rec.stdout).expect("write");
    let file_s = file.to_str().expect("utf-8");
    let imported = common::gpuwatch(&["import", file_s], &[]);
    assert_eq!(imported.code, 0, "{}", imported.stderr);
    let (h2, rows2) = csv_rows(&imported.stdout);
    assert_eq!(h2, header);
    assert_eq!(rows2, rows, "import round trip");
    let report = common::gpuwatch(&["report", file_s], &[]);
    assert_eq!(report.code, 0, "{}", report.stderr);
    let line = report
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("MIG 3g.40gb 1/1/0:"))
        .unwrap_or_else(|| panic!("{}", report.stdout));
    assert!(line.contains("; SM active "), "{line}");
    assert!(
        report
            .stdout
            .lines()
            .filter(|l| l.trim_start().starts_with("MIG 1g.10gb 0/"))
            .all(|l| !l.contains("SM active")),
        "{}",
        report.stdout
    );
    let json = common::gpuwatch(&["report", "--json", file_s], &[]).json();
    let mig = json["mig"].as_array().expect("mig");
    let h = mig
        .iter()
        .find(|m| m["gpu"] == 1 && m["gpu_instance_id"] == 1)
        .expect("3g.40gb");
    assert!(
        h["sm_active_mean"].as_f64().is_some_and(|v| v > 50.0),
        "{h}"
    );
    let a = mig.iter().find(|m| m["gpu"] == 0).expect("an A100 slice");
    assert_eq!(a["sm_active_mean"], Value::Null, "{a}");
}
