//! SMS — the message people still read first at night — through Twilio's Messages API
//! (`provider = "twilio"`, [`Twilio`]) or Alibaba Cloud SMS (`provider = "aliyun"`, [`Aliyun`]).
//!
//! The text is one compact line, `[CRIT] node7: XidCritical GPU 3 (+2 more) - GPU 3 reported XID
//! 79`, cut to fit one SMS segment: 160 characters when every character is in the GSM 03.38
//! alphabet (the extension characters `^{}\[~]|€` count two), otherwise 70 UTF-16 code units
//! (UCS-2, e.g. any Chinese character). Cutting never splits a character and ends in `...`
//! (GSM) or `…` (UCS-2).

mod aliyun;
mod twilio;

use super::channel::{Channel, ChannelType, RenderEnv, Request, Response, Section, SectionError};
use super::render::summary;
use super::secret::Secret;
use super::transport::SendError;
use super::{Notification, Reason};
use crate::model::{AlertEvent, AlertStatus, Severity};

pub use aliyun::Aliyun;
pub use twilio::Twilio;

/// The `sms` channel: one of the providers.
#[derive(Debug)]
pub enum Sms {
    /// Twilio Messages API.
    Twilio(Twilio),
    /// Alibaba Cloud SMS `SendSms`.
    Aliyun(Aliyun),
}

impl ChannelType for Sms {
    const TYPE: &'static str = "sms";

    fn parse(section: &mut Section<'_>) -> Result<Self, SectionError> {
        let provider = section
            .take_string("provider")?
            .ok_or("`provider` (twilio | aliyun) is required")?;
        match provider.get_ref().as_str() {
            "twilio" => Twilio::parse(section).map(Sms::Twilio),
            "aliyun" => Aliyun::parse(section).map(Sms::Aliyun),
            other => Err(section.error_at(
                provider.span().start,
                format!("unknown provider {other:?} (twilio | aliyun)"),
            )),
        }
    }
}

impl Channel for Sms {
    fn secrets(&self) -> Vec<&Secret> {
        match self {
            Sms::Twilio(p) => p.secrets(),
            Sms::Aliyun(p) => p.secrets(),
        }
    }

    fn render(&self, n: &Notification, env: &RenderEnv) -> Result<Vec<Request>, String> {
        match self {
            Sms::Twilio(p) => p.render(n, env),
            Sms::Aliyun(p) => p.render(n, env),
        }
    }

    fn judge(&self, r: &Response) -> Result<(), SendError> {
        match self {
            Sms::Twilio(p) => p.judge(r),
            Sms::Aliyun(p) => p.judge(r),
        }
    }
}

/// Recipients: at least one, each `+` and digits (E.164) or plain digits (Aliyun's mainland
/// numbers).
fn check_numbers(to: &[String]) -> Result<(), SectionError> {
    if to.is_empty() {
        return Err("`to` needs at least one phone number".into());
    }
    for number in to {
        let digits = number.strip_prefix('+').unwrap_or(number);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("`to`: {number:?} is not a phone number (+ and digits)").into());
        }
    }
    Ok(())
}

/// The one-line text, cut to one segment.
pub fn short_text(n: &Notification) -> String {
    fit_segment(&short_line(n))
}

/// The one-line text, whole.
fn short_line(n: &Notification) -> String {
    let tag = match (n.reason, n.status, n.severity()) {
        (Reason::Test, _, _) => "TEST",
        (_, AlertStatus::Resolved, _) if n.alerts.iter().any(AlertEvent::ended_otherwise) => {
            "ENDED"
        }
        (_, AlertStatus::Resolved, _) => "OK",
        (_, _, Severity::Critical) => "CRIT",
        (_, _, Severity::Warning) => "WARN",
        (_, _, Severity::Info) => "INFO",
    };
    let first = n
        .alerts
        .iter()
        .find(|a| a.status == n.status)
        .or(n.alerts.first());
    let mut line = format!("[{tag}] {}:", n.hostname);
    match first {
        Some(a) => {
            line.push(' ');
            line.push_str(&a.name);
            if let Some(g) = a.gpu {
                line.push_str(&format!(" GPU {g}"));
            }
        }
        None => line.push_str(" gpuwatch"),
    }
    let more = n.alerts.len().saturating_sub(1) + n.truncated_alerts;
    if more > 0 {
        line.push_str(&format!(" (+{more} more)"));
    }
    let detail = match first {
        Some(a) => Some(summary(a)).filter(|s| *s != a.name),
        None => n.note.clone(),
    };
    if let Some(d) = detail {
        line.push_str(" - ");
        line.push_str(&d);
    }
    let line: Vec<&str> = line.split_whitespace().collect();
    line.join(" ")
}

/// `s` cut to at most `max` characters (Unicode scalar values), ending in `…` when cut (a
/// separator left dangling at the cut, ` -`, goes).
pub fn fit_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let kept: String = s.chars().take(max.saturating_sub(1)).collect();
    let kept = kept.trim_end_matches(|c: char| c.is_whitespace() || c == '-');
    format!("{kept}…")
}

/// GSM 03.38 basic character set (one septet each; ESC left out).
const GSM_BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?\
¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà";
/// GSM 03.38 extension table (ESC + one septet each).
const GSM_EXTENSION: &str = "\u{c}^{}\\[~]|€";

/// Septets `c` takes in GSM-7, or `None` when it needs UCS-2.
fn gsm_septets(c: char) -> Option<usize> {
    if GSM_BASIC.contains(c) {
        Some(1)
    } else if GSM_EXTENSION.contains(c) {
        Some(2)
    } else {
        None
    }
}

/// Whether `s` fits GSM-7, and its length in that encoding's units (septets or UTF-16 units).
pub fn sms_units(s: &str) -> (bool, usize) {
    let gsm: Option<usize> = s.chars().map(gsm_septets).sum();
    match gsm {
        Some(n) => (true, n),
        None => (false, s.chars().map(char::len_utf16).sum()),
    }
}

/// `s` cut to one segment: 160 GSM-7 septets, or 70 UCS-2 units when a character needs UCS-2.
pub fn fit_segment(s: &str) -> String {
    let (gsm, units) = sms_units(s);
    let (limit, ellipsis) = if gsm { (160, "...") } else { (70, "…") };
    if units <= limit {
        return s.to_string();
    }
    let cost = |c: char| {
        if gsm {
            gsm_septets(c).unwrap_or(2)
        } else {
            c.len_utf16()
        }
    };
    let budget = limit - ellipsis.chars().map(cost).sum::<usize>();
    let mut used = 0;
    let mut out = String::new();
    for c in s.chars() {
        used += cost(c);
        if used > budget {
            break;
        }
        out.push(c);
    }
    let out = out.trim_end();
    format!("{out}{ellipsis}")
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::*;

    #[test]
    fn short_text_is_one_compact_line() {
        let n = notification(vec![
            alert(3, AlertStatus::Firing),
            alert(4, AlertStatus::Firing),
            alert(5, AlertStatus::Firing),
        ]);
        assert_eq!(
            short_text(&n),
            "[CRIT] node7: XidCritical GPU 3 (+2 more) - GPU 3 reported XID 79 (fallen off the bus)"
        );
        let n = notification(vec![alert(1, AlertStatus::Resolved)]);
        assert!(short_text(&n).starts_with("[OK] node7: XidCritical GPU 1 - "));
    }

    #[test]
    fn gsm_text_fits_160_septets() {
        let mut n = notification(vec![alert(1, AlertStatus::Firing)]);
        n.alerts[0]
            .annotations
            .insert("summary".into(), "x".repeat(300));
        let t = short_text(&n);
        assert_eq!(sms_units(&t), (true, 160));
        assert!(t.ends_with("..."), "{t}");
        // Extension characters count two.
        let t = fit_segment(&"{".repeat(100));
        assert_eq!(sms_units(&t), (true, 159));
    }

    #[test]
    fn chinese_text_fits_70_units_without_splitting_a_character() {
        let mut n = notification(vec![alert(1, AlertStatus::Firing)]);
        n.hostname = "训练节点七".into();
        n.alerts[0].annotations.insert(
            "summary".into(),
            "显卡掉线，请立即排查并重启节点。".repeat(5),
        );
        let t = short_text(&n);
        let (gsm, units) = sms_units(&t);
        assert!(!gsm);
        assert!(units <= 70, "{units}: {t}");
        assert!(t.ends_with('…'), "{t}");
        assert!(
            t.starts_with("[CRIT] 训练节点七: XidCritical GPU 1 - 显卡掉线"),
            "{t}"
        );
        // Characters outside the BMP take two UTF-16 units and are never split.
        let t = fit_segment(&"🔥".repeat(50));
        assert_eq!(sms_units(&t), (false, 69));
        assert_eq!(t.chars().filter(|c| *c == '🔥').count(), 34);
    }

    #[test]
    fn fit_chars_counts_characters() {
        assert_eq!(fit_chars("abc", 3), "abc");
        assert_eq!(fit_chars("abcd", 3), "ab…");
        assert_eq!(fit_chars("显卡掉线了", 4), "显卡掉…");
        assert_eq!(fit_chars("ab cd", 4), "ab…");
        assert_eq!(fit_chars("ab - cd", 6), "ab…");
        assert_eq!(fit_chars("🔥🔥🔥", 2).chars().count(), 2);
    }

    #[test]
    fn short_texts_are_left_alone() {
        assert_eq!(fit_segment("ok"), "ok");
        assert_eq!(fit_segment("显卡"), "显卡");
    }
}
