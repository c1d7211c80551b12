//! Actions taken on alerts besides notifying: stopping runaway GPU processes under a strict
//! policy, and running user commands.
//!
//! * [`policy`]: `[actions.kill]` and the pure decision whether a process may be signalled.
//! * [`ladder`]: warning → grace → SIGTERM (process group) → wait → SIGKILL, re-checking the
//!   policy before each step; dry-run by default.
//! * [`audit`]: the append-only JSON-lines audit log of every decision.
//! * [`pidns`]: mapping NVML's host PIDs into gpuwatch's PID namespace.
//! * [`drain`]: `[actions.drain]`, draining this node in Slurm on hardware faults.
//! * [`exec`]: `[[actions.exec]]`, a command run with the alert in its environment and on stdin.
//! * [`forensics`]: `[actions.forensics]`, the evidence bundle (py-spy stacks, output, GPUs,
//!   process tree) collected when a watched job hangs.
//! * [`settings`]: config value types that validate while parsing (regexes, durations).

pub mod audit;
pub mod drain;
pub mod exec;
pub mod forensics;
pub mod ladder;
pub mod pidns;
pub mod policy;
pub mod runner;
pub mod settings;
pub mod taint;

use serde::Deserialize;

pub use audit::{AuditDecision, AuditLog, AuditRecord};
pub use exec::{run_exec, ExecOutcome, ExecSection};
pub use ladder::{KillManager, KillRequest};
pub use pidns::PidMapper;
pub use policy::{KillPolicy, KillSection, Refusal, SelfFacts, SignalTarget, TargetFacts};
pub use runner::ActionRunner;

/// `[actions]` in the config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ActionsSection {
    /// `[actions.kill]`: the kill policy.
    pub kill: KillSection,
    /// `[[actions.exec]]`: commands run for alerts.
    pub exec: Vec<ExecSection>,
    /// `[actions.forensics]`: hang forensics for watched jobs.
    pub forensics: forensics::ForensicsSection,
    /// `[actions.drain]`: draining this node in Slurm.
    pub drain: drain::DrainSection,
    /// `[actions.taint]`: tainting this node in Kubernetes.
    pub taint: taint::TaintSection,
}

impl ActionsSection {
    /// Checks what serde could not: every problem, at its `actions.*` key.
    pub fn validate(&self) -> Vec<crate::values::Problem> {
        use crate::values::Problem;
        let mut problems = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (i, e) in self.exec.iter().enumerate() {
            if let Err(m) = e.validate() {
                problems.push(Problem::at(format!("actions.exec.{i}.command"), m));
            }
            if e.name.is_empty() {
                problems.push(Problem::at(
                    format!("actions.exec.{i}"),
                    "exec entry needs a `name`",
                ));
            } else if !names.insert(e.name.as_str()) {
                problems.push(Problem::at(
                    format!("actions.exec.{i}.name"),
                    format!("duplicate exec name {:?}", e.name),
                ));
            }
        }
        if self.kill.term_timeout.ms <= 0 {
            problems.push(Problem::at(
                "actions.kill.term_timeout",
                "term_timeout must be positive",
            ));
        }
        if self.kill.grace.ms < 0 {
            problems.push(Problem::at(
                "actions.kill.grace",
                "grace must not be negative",
            ));
        }
        problems.extend(self.forensics.validate());
        problems.extend(self.drain.validate());
        problems.extend(self.taint.validate());
        problems
    }

    /// Names of the `[[actions.exec]]` entries.
    pub fn exec_names(&self) -> Vec<&str> {
        self.exec.iter().map(|e| e.name.as_str()).collect()
    }

    /// The audit log path: `audit_log`, or `kill-audit.jsonl` in `state_dir`.
    pub fn audit_log_path(&self, state_dir: &std::path::Path) -> std::path::PathBuf {
        self.kill
            .audit_log
            .clone()
            .unwrap_or_else(|| state_dir.join("kill-audit.jsonl"))
    }
}

/// A stable hex fingerprint of some strings (FNV-1a 64, fields separated by NUL).
pub fn fingerprint(parts: &[&str]) -> String {
    crate::sys::fnv1a64_hex(
        parts
            .iter()
            .flat_map(|p| p.bytes().chain(std::iter::once(0))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_sections_parse_with_safe_defaults() {
        let cfg = crate::config::parse("", std::path::Path::new("c.toml")).unwrap();
        assert!(cfg.actions.kill.dry_run);
        assert!(cfg.actions.exec.is_empty());
        let text = r#"
[actions.kill]
dry_run = false
allow_users = ["alice"]
allow_commands = ["^python"]
grace = "2m"
term_timeout = "10s"
audit_log = "/var/log/gpuwatch/kill.jsonl"

[[actions.exec]]
name = "checkpoint"
command = ["/usr/local/bin/ckpt", "--now"]
timeout = "1m"
"#;
        let cfg = crate::config::parse(text, std::path::Path::new("c.toml")).unwrap();
        let k = &cfg.actions.kill;
        assert!(!k.dry_run);
        assert_eq!((k.grace.ms, k.term_timeout.ms), (120_000, 10_000));
        assert_eq!(k.min_uid, 1000);
        assert_eq!(cfg.actions.exec[0].timeout.ms, 60_000);
        assert!(cfg.actions.validate().is_empty());
    }

    #[test]
    fn config_errors_point_into_the_file() {
        let text = "[actions.kill]\nallow_commands = [\"(\"]\n";
        let err = crate::config::parse(text, std::path::Path::new("c.toml")).unwrap_err();
        assert_eq!((err[0].line, err[0].column), (2, 18), "{err}");
        assert!(err[0].message.contains("invalid regex"), "{err}");
        let text = "[actions.kill]\ngrace = \"5 parsecs\"\n";
        let err = crate::config::parse(text, std::path::Path::new("c.toml")).unwrap_err();
        assert_eq!(err[0].line, 2, "{err}");
        let text = "[actions.kill]\nkill_everyone = true\n";
        assert!(crate::config::parse(text, std::path::Path::new("c.toml")).is_err());
    }

    #[test]
    fn fingerprints_are_stable() {
        assert_eq!(fingerprint(&["a", "b"]), fingerprint(&["a", "b"]));
        assert_ne!(fingerprint(&["ab", ""]), fingerprint(&["a", "b"]));
    }
}
