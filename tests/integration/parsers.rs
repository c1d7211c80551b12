//! Property tests over every parser that reads user input: the config file, rule files, trace
//! logs (gpuwatch CSV and nvidia-smi CSV), nvml-sim scenario files and durations. Inputs are valid documents mutated at
//! random (deleted ranges, inserted tokens, control characters, non-ASCII text, duplicated and
//! swapped lines) with a fixed seed, so a failure names a reproducible case. The properties:
//! nothing panics, and every error carries a position (`file:line:column`, line and column ≥ 1,
//! the line within the document).

#![allow(clippy::unwrap_used)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// A small deterministic random source (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Tokens worth inserting: structure of TOML, CSV, rhai and durations, numbers at the edges,
/// control characters and non-ASCII text.
const TOKENS: &[&str] = &[
    "[",
    "]",
    "[[",
    "]]",
    "=",
    "\"",
    "'",
    ",",
    ";",
    "#",
    "{",
    "}",
    "(",
    ")",
    "\n",
    "\r\n",
    "\t",
    "\u{1b}[31m",
    "\0",
    "\u{feff}",
    "é",
    "温度",
    "🔥",
    " ",
    "-",
    "+",
    ".",
    "0",
    "-1",
    "1e400",
    "NaN",
    "inf",
    "18446744073709551616",
    "9999999999999999999999",
    "0s",
    "5m",
    "1h",
    "90s",
    "100ms",
    "24h",
    "1sec",
    "true",
    "false",
    "[daemon]",
    "[notify]",
    "[[channel]]",
    "[[route]]",
    "interval",
    "state_dir",
    "type",
    "url",
    "name",
    "channels",
    "rule(",
    "#{",
    "check",
    "|gpu|",
    "gpu.temp.max(\"1m\")",
    "let",
    "fn",
    "loop",
    "timestamp",
    "index",
    "[N/A]",
    "[GPU is lost]",
    "2026/12/02 15:00:00.000",
    "2026-12-02T15:00:00Z",
];

fn mutate(rng: &mut Rng, base: &str) -> String {
    let mut s: Vec<char> = base.chars().collect();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !s.is_empty() => {
                let a = rng.below(s.len());
                let b = (a + 1 + rng.below(12)).min(s.len());
                s.drain(a..b);
            }
            1 | 2 => {
                let at = rng.below(s.len() + 1);
                let t: Vec<char> = rng.pick(TOKENS).chars().collect();
                s.splice(at..at, t);
            }
            3 if !s.is_empty() => {
                let at = rng.below(s.len());
                s[at] = char::from_u32(rng.below(0x3000) as u32).unwrap_or('?');
            }
            _ => {
                let text: String = s.iter().collect();
                let mut lines: Vec<&str> = text.split('\n').collect();
                if lines.len() > 1 {
                    let (a, b) = (rng.below(lines.len()), rng.below(lines.len()));
                    if rng.below(2) == 0 {
                        lines.swap(a, b);
                    } else {
                        let dup = lines[a];
                        lines.insert(b, dup);
                    }
                }
                s = lines.join("\n").chars().collect();
            }
        }
    }
    s.into_iter().collect()
}

/// Runs `f` on `cases` mutations of each base; a panic fails with the input that caused it.
fn each_case(seed: u64, cases: usize, bases: &[String], mut f: impl FnMut(&str)) {
    let mut rng = Rng(seed);
    for k in 0..cases {
        let base = &bases[k % bases.len()];
        let input = mutate(&mut rng, base);
        if catch_unwind(AssertUnwindSafe(|| f(&input))).is_err() {
            panic!("case {k} (seed {seed}) panicked on input:\n{input:?}");
        }
    }
}

/// `file:line:column: message` with the file named and line/column within the text.
fn has_position(message: &str, file: &str, text: &str) -> bool {
    let Some(rest) = message.split(file).nth(1) else {
        return false;
    };
    let mut parts = rest.trim_start_matches(':').splitn(3, ':');
    let line: usize = parts.next().and_then(|l| l.parse().ok()).unwrap_or(0);
    let col: usize = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    line >= 1 && col >= 1 && line <= text.split('\n').count() + 1
}

fn repo(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn config_parser_never_panics_and_errors_have_positions() {
    let bases = vec![repo("config.example.toml")];
    let path = Path::new("/etc/gpuwatch/config.toml");
    let mut failed = 0;
    each_case(1, 400, &bases, |text| {
        if let Err(errors) = gpuwatch::config::parse(text, path) {
            failed += 1;
            assert!(!errors.is_empty());
            for e in errors.iter() {
                let line_ok = e.line >= 1 && e.line <= text.split('\n').count() + 1;
                assert!(line_ok && e.column >= 1, "{e} for input {text:?}");
            }
        }
    });
    assert!(failed > 40, "only {failed} of 400 mutations were rejected");
}

#[test]
fn rule_loader_never_panics_and_errors_have_positions() {
    let bases: Vec<String> = [
        "xid_error",
        "ecc_uncorrected",
        "periodic_idle",
        "gpu_memory_quota",
    ]
    .iter()
    .map(|r| repo(&format!("rules/{r}.rhai")))
    .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r.rhai");
    let name = file.display().to_string();
    let mut failed = 0;
    each_case(2, 150, &bases, |text| {
        std::fs::write(&file, text).unwrap();
        let config = gpuwatch::rules::RulesConfig::default();
        if let Err(errors) = gpuwatch::rules::RuleSet::load(std::slice::from_ref(&file), &config) {
            failed += 1;
            for e in &errors {
                let m = e.to_string();
                assert!(has_position(&m, &name, text), "{m} for input {text:?}");
            }
        }
    });
    assert!(failed > 15, "only {failed} of 150 mutations were rejected");
}

#[test]
fn trace_readers_never_panic_and_errors_have_positions() {
    let smi = "timestamp, index, name, utilization.gpu [%], memory.used [MiB], power.draw [W], temperature.gpu, clocks_throttle_reasons.active, pstate\n\
               2026/12/02 15:00:00.101, 0, NVIDIA H100, 87 %, 1024 MiB, 300.50 W, 60, 0x0000000000000004, P0\n\
               2026/12/02 15:00:00.105, 1, NVIDIA H100, 0 %, 0 MiB, [N/A], 40, 0x0000000000000000, P8\n\
               2026/12/02 15:00:01.101, 0, NVIDIA H100, 90 %, 1024 MiB, 301.00 W, 61, 0x0000000000000004, P0\n\
               2026/12/02 15:00:01.104, 1, NVIDIA H100, [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost]\n";
    let own = {
        let mut header = String::from("timestamp,index,uuid,name,pci_bus_id,minor,state");
        for d in gpuwatch::model::METRICS {
            header.push(',');
            header.push_str(d.key);
        }
        header.push_str(",xids,processes\n");
        let cells = vec!["5"; gpuwatch::model::METRICS.len()].join(",");
        format!(
            "{header}2026-12-02T15:00:00.000Z,0,GPU-0,H100,00000000:18:00.0,0,ok,{cells},79,4242:1024\n\
             2026-12-02T15:00:01.000Z,0,GPU-0,H100,00000000:18:00.0,0,lost,{cells},,\n"
        )
    };
    let mut bases = vec![smi.to_string(), own];
    let logs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logs");
    for f in [
        "smi-table.log",
        "date-separator-table.log",
        "date-separator-csv.log",
        "home-made-iso.csv",
        "home-made-semicolon.csv",
        "dmon-dt.log",
        "script-rows.log",
        "script-bars.log",
        "script-progress.log",
    ] {
        bases.push(std::fs::read_to_string(logs.join(f)).unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("log.csv");
    let name = file.display().to_string();
    let (mut failed, mut skipping) = (0, 0);
    each_case(3, 600, &bases, |text| {
        std::fs::write(&file, text).unwrap();
        // A malformed line is skipped and counted; only a file that cannot be read as any log
        // (or whose times cannot be known) is an error, and the error names its place.
        let result = gpuwatch::import::Importer::open(&file, &Default::default()).and_then(|r| {
            let stats = r.stats();
            r.collect::<anyhow::Result<Vec<_>>>().map(|_| stats)
        });
        match result {
            Err(e) => {
                failed += 1;
                let m = e.to_string();
                assert!(has_position(&m, &name, text), "{m} for input {text:?}");
            }
            Ok(stats) => {
                if stats.skipped.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                    skipping += 1;
                    for (line, why) in stats.first_skipped() {
                        assert!(line >= 1 && !why.is_empty(), "{line}: {why}");
                    }
                }
            }
        }
    });
    assert!(
        failed + skipping > 60,
        "only {failed} of 600 mutations were refused and {skipping} skipped lines"
    );
}

#[test]
fn scenario_parser_never_panics_and_errors_have_positions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("nvml-sim/scenarios");
    let mut bases: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    bases.sort();
    let mut failed = 0;
    each_case(5, 300, &bases, |text| {
        if let Err(e) = nvml_sim::scenario::parse(text, "s.toml", None) {
            failed += 1;
            let m = e.to_string();
            assert!(has_position(&m, "s.toml", text), "{m} for input {text:?}");
        }
    });
    assert!(failed > 30, "only {failed} of 300 mutations were rejected");
}

#[test]
fn durations_never_panic() {
    let bases: Vec<String> = ["90s", "5m", "1h", "100ms", "24h", "1.5h"]
        .iter()
        .map(ToString::to_string)
        .collect();
    each_case(4, 2000, &bases, |text| {
        if let Ok(ms) = gpuwatch::values::parse_duration_ms(text) {
            assert!(ms >= 0, "{text:?} → {ms}");
        }
    });
}
