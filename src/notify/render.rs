//! Human-readable text shared by the channel renderers: the title line, one block per alert (GPU
//! identity, summary, values, start time), the processes on the affected GPUs and what to do next.
//! Pure functions of a [`Notification`]; chat renderers wrap this text in their JSON.
//!
//! Alert text carries text from outside (a job's output, command lines, user names): every
//! function here escapes control characters in it ([`crate::values::escape_control`]; newlines
//! and tabs stay where the layout has lines), so no message body carries terminal escapes;
//! chat renderers whose markup can make links escape that markup on top
//! ([`markdown_escape`], Slack's and the HTML channels' own escapes).

use std::fmt::Write as _;

use super::{rfc3339_ms, Notification, Reason};
use crate::model::{AlertEvent, AlertStatus, Severity};
use crate::values::{escape_control, escape_control_lines};

/// `[CRITICAL] XidCritical on node7: GPU 1` style title.
pub fn title(n: &Notification) -> String {
    let mut names: Vec<&str> = n.alerts.iter().map(|a| a.name.as_str()).collect();
    names.dedup();
    names.sort_unstable();
    names.dedup();
    let tag = match (n.reason, n.status) {
        (Reason::Test, _) => "TEST".to_string(),
        // RESOLVED only when every alert's condition cleared; ENDED when one ended otherwise
        // (its XIDs stopped while the GPU stays lost, its job ended)
        (_, AlertStatus::Resolved) if n.alerts.iter().any(AlertEvent::ended_otherwise) => {
            "ENDED".to_string()
        }
        (_, AlertStatus::Resolved) => "RESOLVED".to_string(),
        (_, AlertStatus::Firing) => n.severity().as_str().to_uppercase(),
    };
    let mut gpus: Vec<u32> = n.alerts.iter().filter_map(|a| a.gpu).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let where_ = match gpus.as_slice() {
        [] => String::new(),
        [g] => format!(": GPU {g}"),
        gs => format!(
            ": GPUs {}",
            gs.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ),
    };
    let names = if names.is_empty() {
        "gpuwatch".to_string()
    } else {
        names.join(", ")
    };
    let count = if n.alerts.len() > 1 {
        let firing = n.firing_count();
        let resolved = n.alerts.len() - firing;
        match (firing, resolved) {
            (f, 0) => format!(" ({f} firing)"),
            (0, r) => format!(" ({r} resolved)"),
            (f, r) => format!(" ({f} firing, {r} resolved)"),
        }
    } else {
        String::new()
    };
    let digest = if n.reason == Reason::Digest {
        "digest: "
    } else {
        ""
    };
    escape_control(&format!(
        "[{tag}] {digest}{names} on {}{where_}{count}",
        n.hostname
    ))
}

/// One-line GPU description: `GPU 1 (NVIDIA H100 80GB HBM3, GPU-…)`.
pub fn gpu_line(n: &Notification, a: &AlertEvent) -> Option<String> {
    let index = a.gpu?;
    let uuid = a
        .labels
        .get("uuid")
        .cloned()
        .or_else(|| n.device(index).map(|d| d.uuid.clone()))
        .unwrap_or_default();
    let name = n.device(index).map(|d| d.name.as_str()).unwrap_or("");
    let mut s = format!("GPU {index}");
    match (name.is_empty(), uuid.is_empty()) {
        (false, false) => {
            let _ = write!(s, " ({name}, {uuid})");
        }
        (false, true) => {
            let _ = write!(s, " ({name})");
        }
        (true, false) => {
            let _ = write!(s, " ({uuid})");
        }
        (true, true) => {}
    }
    Some(s)
}

/// The summary of an alert (annotation `summary`, else its name).
pub fn summary(a: &AlertEvent) -> String {
    // (an end for a reason other than a clearing: the reason first)
    a.told(
        a.annotations.get("summary").unwrap_or(&a.name),
        escape_control_lines,
    )
}

/// What to do next: the rule's `next_steps` annotation or a default by severity.
pub fn next_steps(a: &AlertEvent) -> String {
    if a.ended_otherwise() {
        let why = a
            .ended
            .as_ref()
            .and_then(crate::model::EndReason::describe)
            .unwrap_or_default();
        return match a.annotations.get("next_steps") {
            Some(steps) => format!("The alert ended ({why}), which is not a repair: {steps}"),
            None => format!("The alert ended ({why}); check that nothing is left to repair."),
        };
    }
    if let Some(steps) = a.annotations.get("next_steps") {
        if a.status == AlertStatus::Firing {
            return steps.clone();
        }
    }
    if a.status == AlertStatus::Resolved {
        return "Nothing: the condition cleared. Check the job's output if it was affected.".into();
    }
    match a.severity {
        Severity::Critical => "Act now: check the training job, `nvidia-smi -q` for this GPU and the \
            kernel log (`journalctl -k | grep -i xid`); drain or reboot the node if the GPU is gone."
            .into(),
        Severity::Warning => {
            "Look soon: run `gpuwatch status` and check the job before this gets worse.".into()
        }
        Severity::Info => "No action needed.".into(),
    }
}

/// Labels worth showing that are not already in the text (rule labels).
fn extra_labels(a: &AlertEvent) -> Vec<(String, String)> {
    const SHOWN: &[&str] = &["alertname", "severity", "gpu", "uuid", "hostname"];
    a.labels
        .iter()
        .filter(|(k, _)| !SHOWN.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// One field of an alert's block: (label, value).
pub fn alert_fields(n: &Notification, a: &AlertEvent) -> Vec<(&'static str, String)> {
    let mut f = Vec::new();
    f.push((
        "Status",
        format!("{} ({})", status_word(a), a.severity.as_str()),
    ));
    f.push(("Rule", a.name.clone()));
    if let Some(g) = gpu_line(n, a) {
        f.push(("GPU", g));
    }
    f.push(("Host", n.hostname.clone()));
    if let Some(v) = a.annotations.get("values") {
        f.push(("Values", v.clone()));
    }
    f.push(("Started", rfc3339_ms(a.starts_at_ms)));
    if let Some(end) = a.ends_at_ms {
        let word = if a.ended_otherwise() {
            "Ended"
        } else {
            "Resolved"
        };
        f.push((word, rfc3339_ms(end)));
    }
    if let Some(why) = a.ended.as_ref().and_then(crate::model::EndReason::describe) {
        f.push(("Why", why));
    }
    if let Some(d) = a.annotations.get("description") {
        f.push(("Details", d.clone()));
    }
    let extra = extra_labels(a);
    if !extra.is_empty() {
        f.push((
            "Labels",
            extra
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    f.push(("Next", next_steps(a)));
    f.into_iter()
        .map(|(k, v)| (k, escape_control_lines(&v)))
        .collect()
}

/// FIRING, RESOLVED (the condition cleared) or ENDED (for another reason).
fn status_word(a: &AlertEvent) -> &'static str {
    match a.state_word() {
        "STILL" => "FIRING",
        w => w,
    }
}

/// The process table lines (`pid user mem command`) for the GPUs in the message.
pub fn process_lines(n: &Notification) -> Vec<String> {
    let gpus: Vec<u32> = n.alerts.iter().filter_map(|a| a.gpu).collect();
    n.processes
        .iter()
        .filter(|p| gpus.is_empty() || gpus.contains(&p.gpu_index))
        .map(|p| {
            let mem = p
                .used_mem_bytes
                .map_or_else(|| "?".into(), |b| format!("{} MiB", b >> 20));
            let runtime = p
                .runtime_s
                .map_or_else(String::new, |s| format!(", up {}", human_secs(s)));
            escape_control(&format!(
                "GPU {} pid {} user {} mem {}{}: {}",
                p.gpu_index,
                p.pid,
                p.user.as_deref().unwrap_or("?"),
                mem,
                runtime,
                p.command.as_deref().unwrap_or("?")
            ))
        })
        .collect()
}

fn human_secs(s: f64) -> String {
    #[expect(clippy::cast_possible_truncation, reason = "display only")]
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// The whole message as plain text (email text part, chat channels).
pub fn text(n: &Notification) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", title(n));
    if let Some(note) = &n.note {
        let _ = writeln!(out, "{note}");
    }
    for a in &n.alerts {
        out.push('\n');
        let _ = writeln!(out, "{}", summary(a));
        for (k, v) in alert_fields(n, a) {
            let _ = writeln!(out, "  {k}: {v}");
        }
    }
    if n.truncated_alerts > 0 {
        let _ = writeln!(out, "\n(+{} more alerts not shown)", n.truncated_alerts);
    }
    let procs = process_lines(n);
    if !procs.is_empty() {
        let _ = writeln!(out, "\nProcesses:");
        for p in procs {
            let _ = writeln!(out, "  {p}");
        }
    }
    let _ = write!(out, "\n-- gpuwatch on {} (message {})", n.hostname, n.id);
    out
}

pub use crate::values::html_escape;

/// Escapes, with a backslash, the characters chat markdown (Discord; Teams' Adaptive Cards)
/// gives a meaning — `[text](url)` links, emphasis, code, spoilers, `<…>` mentions and links,
/// headings, quotes — so that text from outside shows as written and cannot make a link that
/// says one thing and goes elsewhere.
pub fn markdown_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(
            c,
            '\\' | '[' | ']' | '*' | '_' | '~' | '`' | '|' | '<' | '>' | '#'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

pub use crate::values::truncate_chars;

/// Cuts `s` to at most `max` bytes on a character boundary, ending in `…` when cut.
pub fn truncate_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    /// Issue 30 §1: an alert that ended for another reason than a clearing is not called
    /// resolved in a message: the title says ENDED, the status ENDED, and its summary gives
    /// the reason before what it had said; its firing next step is not offered as done.
    #[test]
    fn an_ended_alert_is_not_called_resolved() {
        let mut a = alert(1, AlertStatus::Resolved);
        a.ended = Some(crate::model::EndReason::GpuLost);
        let n = Notification {
            status: AlertStatus::Resolved,
            ..notification(vec![a.clone()])
        };
        assert!(title(&n).starts_with("[ENDED] "), "{}", title(&n));
        let body = text(&n);
        assert!(body.contains("Status: ENDED (critical)"), "{body}");
        assert!(body.contains("Why: its GPU is lost"), "{body}");
        assert!(
            summary(&a).starts_with("its GPU is lost")
                && summary(&a).ends_with("it said: GPU 1 reported XID 79 (fallen off the bus)"),
            "{}",
            summary(&a)
        );
        assert!(
            next_steps(&a).starts_with("The alert ended ("),
            "{}",
            next_steps(&a)
        );
        // A plain clearing stays RESOLVED.
        let n = Notification {
            status: AlertStatus::Resolved,
            ..notification(vec![alert(1, AlertStatus::Resolved)])
        };
        assert!(title(&n).starts_with("[RESOLVED] "), "{}", title(&n));
    }

    #[test]
    fn text_golden() {
        let n = notification(vec![alert(1, AlertStatus::Firing)]);
        let expected = "\
[CRITICAL] XidCritical on node7: GPU 1
\nGPU 1 reported XID 79 (fallen off the bus)
  Status: FIRING (critical)
  Rule: XidCritical
  GPU: GPU 1 (NVIDIA H100 80GB HBM3, GPU-00000001-aaaa-bbbb-cccc-dddddddddddd)
  Host: node7
  Values: xid=79
  Started: 2026-12-02T15:20:00.000Z
  Next: Drain the node and reboot it; reseat or RMA the GPU if it recurs.
\nProcesses:
  GPU 1 pid 4242 user alice mem 40960 MiB, up 2h1m: python train.py --lr 3e-4
\n-- gpuwatch on node7 (message 0123456789abcdef0123456789abcdef)";
        assert_eq!(text(&n), expected);
    }

    #[test]
    fn titles() {
        let n = notification(vec![
            alert(0, AlertStatus::Firing),
            alert(1, AlertStatus::Firing),
            alert(2, AlertStatus::Resolved),
        ]);
        assert_eq!(
            title(&n),
            "[CRITICAL] XidCritical on node7: GPUs 0,1,2 (2 firing, 1 resolved)"
        );
        let n = notification(vec![alert(3, AlertStatus::Resolved)]);
        assert_eq!(title(&n), "[RESOLVED] XidCritical on node7: GPU 3");
    }

    #[test]
    fn control_characters_from_outside_are_escaped() {
        let mut n = notification(vec![hostile_alert()]);
        n.processes[0].command = Some("python \u{1b}[2Jtrain.py".into());
        let t = text(&n);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert!(t.contains("job failed: \\u{1b}[31mboom"), "{t}");
        assert!(
            t.contains("  Details: last 2 lines:\n    | \\u{1b}]52;c;cm0gLXJmIH4=\\u{7}\n    | \\u{1b}[2J\\u{9b}0m"),
            "{t}"
        );
        assert!(t.contains(": python \\u{1b}[2Jtrain.py"), "{t}");
    }

    #[test]
    fn markdown_is_escaped() {
        assert_eq!(
            markdown_escape("[x](https://e.example/) *a* _b_ `c` ||d|| <@1> # e \\"),
            "\\[x\\](https://e.example/) \\*a\\* \\_b\\_ \\`c\\` \\|\\|d\\|\\| \\<@1\\> \\# e \\\\"
        );
        assert_eq!(markdown_escape("GPU 1 (H100)"), "GPU 1 (H100)");
    }

    #[test]
    fn truncation() {
        assert_eq!(truncate_chars("abcdef", 4), "abc…");
        assert_eq!(truncate_chars("abc", 4), "abc");
        assert_eq!(truncate_bytes("ééé", 5), "é…");
    }
}
