//! One validated configuration: each broken config is rejected by `check`, `daemon` and `run`
//! with the same `file:line:column: message` lines; several problems are reported at once.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use crate::common;

/// (what is wrong, config text, the line:column and a piece of the message every command must
/// print).
const BROKEN: &[(&str, &str, &str, &str)] = &[
    (
        "interval below 100 ms",
        "[daemon]\ninterval = \"5ms\"\n",
        "2:12",
        "shortest interval, 100ms",
    ),
    (
        "a duration in a grammar other commands reject",
        "[daemon]\ninterval = \"1sec\"\n",
        "2:12",
        "invalid duration unit",
    ),
    (
        "a misspelt key",
        "[daemon]\nintervall = \"1s\"\n",
        "2:1",
        "did you mean `interval`?",
    ),
    (
        "a misspelt section",
        "[deamon]\ninterval = \"1s\"\n",
        "1:2",
        "did you mean `daemon`?",
    ),
    (
        "[job] checks run for every command",
        "[job]\ntick = \"1ms\"\n",
        "2:8",
        "tick must be at least 10ms",
    ),
    (
        "[actions] checks run for every command",
        "[actions.kill]\nterm_timeout = \"0s\"\n",
        "2:16",
        "term_timeout must be positive",
    ),
    (
        "duplicate exec names",
        "[[actions.exec]]\nname = \"a\"\ncommand = [\"true\"]\n\n[[actions.exec]]\nname = \"a\"\ncommand = [\"true\"]\n",
        "6:8",
        "duplicate exec name",
    ),
    (
        "a state directory that cannot be created (its parent is a file)",
        "[daemon]\nstate_dir = \"broken.toml/state\"\n",
        "2:13",
        "cannot be created",
    ),
    (
        "a rule directory that does not exist",
        "[rules]\ndirs = [\"no-such-rules\"]\n",
        "2:9",
        "no such rule file or directory",
    ),
    (
        "a rule budget out of range",
        "[rules]\nbudget = \"1m\"\n",
        "2:10",
        "out of range",
    ),
    (
        "a route to a channel that does not exist",
        "[[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n\n[[route]]\nchannels = [\"opps\"]\n",
        "7:13",
        "opps",
    ),
];

fn write_config(dir: &Path, body: &str) -> PathBuf {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let path = dir.join("broken.toml");
    // The rule directory and state dir are valid; only `body` is broken.
    let text = if body.starts_with("[daemon]") {
        body.replacen(
            "[daemon]\n",
            &format!("[daemon]\nrules = [{:?}]\n", rules.display().to_string()),
            1,
        )
    } else {
        format!(
            "{body}\n[daemon]\nrules = [{:?}]\nstate_dir = \"state\"\n",
            rules.display().to_string()
        )
    };
    std::fs::write(&path, text).unwrap();
    path
}

/// The stderr lines naming the config file.
fn config_lines(stderr: &str, path: &Path) -> Vec<String> {
    let p = path.display().to_string();
    stderr
        .lines()
        .filter(|l| l.starts_with(&p))
        .map(str::to_string)
        .collect()
}

#[test]
fn check_daemon_and_run_reject_each_broken_config_with_the_same_error() {
    common::sim_lib();
    for (what, body, at, message) in BROKEN {
        let dir = tempfile::tempdir().unwrap();
        let path = write_config(dir.path(), body);
        let p = path.to_str().unwrap();
        // The daemon line shifts by one where the [daemon] section got a `rules` line inserted.
        let check = common::gpuwatch(&["check", "--config", p], &[]);
        let daemon = common::sim("healthy", &["daemon", "--config", p], &[]);
        let run = common::sim("healthy", &["run", "--config", p, "--", "true"], &[]);
        let expected = config_lines(&check.stderr, &path);
        assert_eq!(check.code, 1, "{what}: check accepted it\n{}", check.stderr);
        assert!(
            expected.iter().any(|l| l.contains(message)),
            "{what}: check said\n{}",
            check.stderr
        );
        let shifted = if body.starts_with("[daemon]") {
            let (l, c) = at.split_once(':').unwrap();
            format!("{}:{c}", l.parse::<usize>().unwrap() + 1)
        } else {
            (*at).to_string()
        };
        assert!(
            expected
                .iter()
                .any(|l| l.starts_with(&format!("{p}:{shifted}: "))),
            "{what}: expected {p}:{shifted}: …, check said\n{}",
            check.stderr
        );
        for (cmd, out) in [("daemon", &daemon), ("run", &run)] {
            assert_eq!(out.code, 1, "{what}: {cmd} accepted it\n{}", out.stderr);
            assert_eq!(
                config_lines(&out.stderr, &path),
                expected,
                "{what}: {cmd} and check disagree\n{cmd}: {}\ncheck: {}",
                out.stderr,
                check.stderr
            );
        }
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "[job]\ntick = \"1ms\"\n\n[rules]\nbudget = \"1m\"\n\n[actions.kill]\nterm_timeout = \"0s\"\n",
    );
    let check = common::gpuwatch(&["check", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(check.code, 1);
    let lines = config_lines(&check.stderr, &path);
    assert_eq!(lines.len(), 3, "{}", check.stderr);
    assert!(lines[0].contains(":2:8: "), "{lines:?}");
    assert!(lines[1].contains(":5:10: "), "{lines:?}");
    assert!(lines[2].contains(":8:16: "), "{lines:?}");
}

#[test]
fn an_exec_action_must_name_a_configured_entry() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(
        rules.join("hot.rhai"),
        "rule(#{\n    name: \"hot\",\n    action: \"exec:checkpont\",\n    check: |gpu| gpu.temp.last() > 80.0,\n});\n",
    )
    .unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\nrules = [{:?}]\nstate_dir = \"state\"\n\n[[actions.exec]]\nname = \"checkpoint\"\ncommand = [\"true\"]\n",
            rules.display().to_string()
        ),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let check = common::gpuwatch(&["check", "--config", p], &[]);
    assert_eq!(check.code, 1, "{}", check.stderr);
    assert!(
        check.stderr.contains("hot.rhai:1:1: rule `hot`: action \"exec:checkpont\" names no [[actions.exec]] entry; did you mean \"exec:checkpoint\"?"),
        "{}",
        check.stderr
    );
    let run = common::sim("healthy", &["run", "--config", p, "--", "true"], &[]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("exec:checkpont"), "{}", run.stderr);
}
