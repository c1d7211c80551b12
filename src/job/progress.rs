//! Training progress from output lines: step, epoch and the time progress last moved.
//!
//! Default patterns understand Keras/plain `Epoch 3/10`, `step 1200` / `global_step=300` /
//! `iter 50`, tqdm bars (`37%|███▋ | 370/1000 [00:10<00:17, 36.5it/s]`), PyTorch Lightning
//! (`Epoch 2: 45%|… 450/1000`) and Hugging Face Trainer logs (`{'loss': 0.5, …, 'epoch': 1.5}`
//! plus its tqdm bar). User patterns may name groups `step`, `total`, `epoch`, `epochs`; a user
//! pattern without those groups is a heartbeat: every match counts as progress.
//!
//! "Progress moved" means the (epoch, step) pair, or for heartbeat patterns the match, changed.
//! Everything here is pure: the caller passes the time of each line.

use regex::Regex;

use crate::model::job::cut;
pub use crate::model::job::{ProgressState, ProgressUpdate};

/// The default patterns, tried in order on every line (and every `\r`-separated segment).
pub const DEFAULT_PATTERNS: &[&str] = &[
    // PyTorch Lightning: `Epoch 2:  45%|████▌     | 450/1000 [...]`
    r"\bEpoch (?P<epoch>\d+):\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)",
    // tqdm (and the Hugging Face Trainer's bar): `37%|███▋ | 370/1000 [00:10<00:17, 36.5it/s]`
    r"\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)\s*\[",
    // Hugging Face Trainer log dict: `{'loss': 0.5, 'learning_rate': 1e-05, 'epoch': 1.5}`
    r#"\{.*['"]epoch['"]:\s*(?P<epoch>\d+(?:\.\d+)?)"#,
    // `Epoch 3/10`, `epoch 3 of 10`, `Epoch: 3`, `[epoch 3]`
    r"\b(?:[Ee]poch|EPOCH)\b[\s:=#\[]*(?P<epoch>\d+(?:\.\d+)?)(?:\s*(?:/|of)\s*(?P<epochs>\d+))?",
    // `step 1200`, `Step: 1200/5000`, `global_step=300`, `iter 50`, `iteration 50/100`
    r"\b(?:[Gg]lobal[_ ]?)?(?:[Ss]tep|STEP|[Ii]ter|ITER|[Ii]teration)\b[\s:=#\[]*(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?",
];

/// Longest line segment examined (longer ones are cut; progress lines are short).
const MAX_SEGMENT_BYTES: usize = 4096;

/// A compiled set of progress patterns.
#[derive(Debug, Clone)]
pub struct ProgressParser {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    regex: Regex,
    /// True when the pattern has none of the named groups: every match is a heartbeat.
    heartbeat: bool,
}

impl ProgressParser {
    /// Builds a parser from user patterns (tried first) and, when `defaults` is true, the
    /// default patterns. Errors name the bad pattern.
    pub fn new(user: &[String], defaults: bool) -> Result<ProgressParser, String> {
        let mut patterns = Vec::new();
        for p in user {
            patterns.push(Pattern::compile(p)?);
        }
        if defaults {
            for p in DEFAULT_PATTERNS {
                patterns.push(Pattern::compile(p)?);
            }
        }
        Ok(ProgressParser { patterns })
    }

    /// The parser with only the default patterns.
    pub fn defaults() -> ProgressParser {
        ProgressParser::new(&[], true).expect("default progress patterns compile")
    }

    /// Reads one line (without its terminator). Each field comes from the first pattern that
    /// gives it. Returns `None` when no pattern matched.
    pub fn parse(&self, line: &str) -> Option<ProgressUpdate> {
        let line = cut(line, MAX_SEGMENT_BYTES);
        let mut update = ProgressUpdate::default();
        for pattern in &self.patterns {
            let Some(caps) = pattern.regex.captures(line) else {
                continue;
            };
            if pattern.heartbeat {
                if update.heartbeat.is_none() {
                    update.heartbeat = caps.get(0).map(|m| m.as_str().to_string());
                }
                continue;
            }
            let int = |name: &str| caps.name(name).and_then(|m| m.as_str().parse::<i64>().ok());
            if update.step.is_none() {
                if let Some(step) = int("step") {
                    update.step = Some(step);
                    update.total_steps = int("total");
                }
            }
            if update.epoch.is_none() {
                if let Some(epoch) = caps
                    .name("epoch")
                    .and_then(|m| m.as_str().parse::<f64>().ok())
                {
                    update.epoch = Some(epoch);
                    update.total_epochs = int("epochs");
                }
            }
        }
        (!update.is_empty()).then_some(update)
    }
}

impl Pattern {
    fn compile(p: &str) -> Result<Pattern, String> {
        let regex = Regex::new(p).map_err(|e| format!("invalid progress pattern {p:?}: {e}"))?;
        let heartbeat = !regex
            .capture_names()
            .flatten()
            .any(|n| matches!(n, "step" | "epoch"));
        Ok(Pattern { regex, heartbeat })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> ProgressUpdate {
        ProgressParser::defaults()
            .parse(line)
            .unwrap_or_else(|| panic!("no progress in {line:?}"))
    }

    #[test]
    fn keras_epoch() {
        let u = parse("Epoch 3/10");
        assert_eq!(
            (u.epoch, u.total_epochs, u.step),
            (Some(3.0), Some(10), None)
        );
        let u = parse("epoch 4 of 12, loss 0.3");
        assert_eq!((u.epoch, u.total_epochs), (Some(4.0), Some(12)));
    }

    #[test]
    fn steps() {
        assert_eq!(parse("step 1200 loss=0.5").step, Some(1200));
        let u = parse("Step: 300/5000 | lr 1e-4");
        assert_eq!((u.step, u.total_steps), (Some(300), Some(5000)));
        assert_eq!(parse("global_step=42").step, Some(42));
        assert_eq!(parse("iter 77: loss 1.0").step, Some(77));
        assert_eq!(parse("[iteration 5/100]").step, Some(5));
        // Words that merely start like "step" are not steps.
        assert!(ProgressParser::defaults()
            .parse("steps_per_epoch is large")
            .is_none());
    }

    #[test]
    fn tqdm_bar() {
        let u = parse(" 37%|███▋      | 370/1000 [00:10<00:17, 36.5it/s]");
        assert_eq!((u.step, u.total_steps), (Some(370), Some(1000)));
    }

    #[test]
    fn lightning_bar() {
        let u =
            parse("Epoch 2:  45%|████▌     | 450/1000 [01:02<01:16,  7.21it/s, v_num=0, loss=0.3]");
        assert_eq!(
            (u.epoch, u.step, u.total_steps),
            (Some(2.0), Some(450), Some(1000))
        );
    }

    #[test]
    fn huggingface_trainer() {
        let u = parse("{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 4.5e-05, 'epoch': 1.5}");
        assert_eq!(u.epoch, Some(1.5));
        assert_eq!(u.step, None);
        let u = parse("  5%|▌         | 50/1000 [00:25<07:55,  2.00it/s]");
        assert_eq!((u.step, u.total_steps), (Some(50), Some(1000)));
    }

    #[test]
    fn unrelated_lines() {
        let p = ProgressParser::defaults();
        for line in [
            "Loading checkpoint shards",
            "Traceback (most recent call last):",
            "RuntimeError: CUDA out of memory.",
            "",
        ] {
            assert!(p.parse(line).is_none(), "{line:?}");
        }
    }

    #[test]
    fn user_patterns_first_and_heartbeats() {
        let p = ProgressParser::new(&[r"it=(?P<step>\d+)".into()], true).unwrap();
        assert_eq!(p.parse("it=9 step 3").unwrap().step, Some(9));
        let hb = ProgressParser::new(&["saved checkpoint".into()], false).unwrap();
        assert!(hb.parse("saved checkpoint 3").unwrap().heartbeat.is_some());
        assert!(hb.parse("step 3").is_none());
        assert!(ProgressParser::new(&["(".into()], true)
            .unwrap_err()
            .contains("invalid progress pattern"));
    }

    #[test]
    fn state_moves_only_on_change() {
        let p = ProgressParser::defaults();
        let mut s = ProgressState::default();
        assert_eq!(s.progress_age_s(5_000), None);
        let line = "step 10";
        assert!(s.apply(&p.parse(line).unwrap(), line, 1_000));
        assert!(!s.apply(&p.parse(line).unwrap(), line, 2_000));
        assert_eq!(s.progress_age_s(4_000), Some(3.0));
        let line = "Epoch 1/5 step 11";
        assert!(s.apply(&p.parse(line).unwrap(), line, 4_500));
        assert_eq!(s.describe(), "epoch 1/5, step 11");
        assert_eq!(s.updates, 2);
        assert_eq!(s.progress_age_s(5_000), Some(0.5));
    }
}
