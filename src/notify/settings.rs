//! Notification configuration: the `[notify]`, `[[channel]]` and `[[route]]` sections as they are
//! written in `config.toml` (serde structs, defaults documented in `config.example.toml`), and
//! [`NotifySettings`], the validated form with durations parsed and secrets resolved from
//! inline values, environment variables or files. Errors name `file:line:column` and the
//! channel, never a secret's value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::channel::{self, Channel, Section};
use super::secret::{self, Secret};
use crate::model::Severity;
use crate::values::DurationSetting;

/// `[notify]`: global delivery settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotifySection {
    /// Default `group_wait` of routes: wait before the first message of a new group.
    pub group_wait: DurationSetting,
    /// Default `group_interval` of routes: how often a group may send an update.
    pub group_interval: DurationSetting,
    /// Default `repeat_interval` of routes: re-send an unchanged firing group this often.
    pub repeat_interval: DurationSetting,
    /// Default per-send timeout of channels (HTTP request or whole SMTP conversation).
    pub timeout: DurationSetting,
    /// First retry delay after a failed send; doubles per attempt.
    pub retry_initial: DurationSetting,
    /// Longest retry delay.
    pub retry_max: DurationSetting,
    /// A notification still undelivered after this long is moved to `outbox/dead/`.
    pub give_up_after: DurationSetting,
    /// Consecutive failed sends after which a channel counts as failing (`notifier_failing`).
    pub failing_after: u32,
    /// Quiet hours: non-critical messages are held and sent as one digest when they end.
    pub quiet_hours: Option<QuietHoursSection>,
    /// Per-channel rate limit for storms; `max = 0` disables it.
    pub rate_limit: RateLimitSection,
    /// Dead-man heartbeat URL pinged (HTTP GET) while the daemon is healthy.
    pub heartbeat_url: Option<String>,
    /// The heartbeat URL from this environment variable.
    pub heartbeat_url_env: Option<String>,
    /// The heartbeat URL from this file.
    pub heartbeat_url_file: Option<PathBuf>,
    /// How often to ping the heartbeat URL.
    pub heartbeat_interval: DurationSetting,
    /// Inhibition rules (`[[notify.inhibit]]`); default: `gpu_lost` mutes every other alert of
    /// the same GPU.
    pub inhibit: Vec<InhibitSection>,
}

/// `[[notify.inhibit]]`: while an alert matching `source` fires, alerts matching `target` with
/// equal values of the `equal` labels are not sent (an alert never inhibits itself).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InhibitSection {
    /// Label values the muting alert has.
    pub source: BTreeMap<String, String>,
    /// Label values the muted alerts have (empty: any).
    pub target: BTreeMap<String, String>,
    /// Labels that must be equal on both.
    pub equal: Vec<String>,
}

impl Default for InhibitSection {
    fn default() -> Self {
        InhibitSection {
            source: BTreeMap::new(),
            target: BTreeMap::new(),
            equal: vec!["hostname".into(), "gpu".into()],
        }
    }
}

/// The default inhibition: a lost GPU mutes everything else about that GPU.
pub fn default_inhibit() -> Vec<InhibitSection> {
    vec![InhibitSection {
        source: [("alertname".to_string(), "gpu_lost".to_string())].into(),
        target: BTreeMap::new(),
        equal: vec!["hostname".into(), "gpu".into()],
    }]
}

impl InhibitSection {
    /// Whether the alert with `fingerprint`/`labels` is muted by one of `active` (fingerprint,
    /// labels of firing alerts).
    pub fn mutes<'a>(
        &self,
        fingerprint: &str,
        labels: &BTreeMap<String, String>,
        mut active: impl Iterator<Item = (&'a String, &'a BTreeMap<String, String>)>,
    ) -> bool {
        let has = |want: &BTreeMap<String, String>, l: &BTreeMap<String, String>| {
            want.iter().all(|(k, v)| l.get(k) == Some(v))
        };
        if !has(&self.target, labels) {
            return false;
        }
        active.any(|(fp, src)| {
            fp != fingerprint
                && has(&self.source, src)
                && self.equal.iter().all(|k| src.get(k) == labels.get(k))
        })
    }
}

impl Default for NotifySection {
    fn default() -> Self {
        NotifySection {
            group_wait: DurationSetting::from_ms(30_000),
            group_interval: DurationSetting::from_ms(300_000),
            repeat_interval: DurationSetting::from_ms(14_400_000),
            timeout: DurationSetting::from_ms(10_000),
            retry_initial: DurationSetting::from_ms(1_000),
            retry_max: DurationSetting::from_ms(300_000),
            give_up_after: DurationSetting::from_ms(86_400_000),
            failing_after: 3,
            quiet_hours: None,
            rate_limit: RateLimitSection::default(),
            heartbeat_url: None,
            heartbeat_url_env: None,
            heartbeat_url_file: None,
            heartbeat_interval: DurationSetting::from_ms(60_000),
            inhibit: default_inhibit(),
        }
    }
}

/// `[notify.quiet_hours]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuietHoursSection {
    /// Start, `"HH:MM"`.
    pub start: String,
    /// End, `"HH:MM"` (may be before `start`: the window wraps midnight).
    pub end: String,
    /// `"local"` (default), `"UTC"` or a fixed offset like `"+08:00"`.
    #[serde(default = "default_timezone")]
    pub timezone: String,
}

fn default_timezone() -> String {
    "local".into()
}

/// `[notify.rate_limit]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitSection {
    /// At most this many messages per channel within `per` (0 = unlimited).
    pub max: u32,
    /// The window.
    pub per: DurationSetting,
}

impl Default for RateLimitSection {
    fn default() -> Self {
        RateLimitSection {
            max: 30,
            per: DurationSetting::from_ms(3_600_000),
        }
    }
}

/// `[[channel]]` as written: the whole table. The common keys (`name`, `type`,
/// `send_resolved`, `timeout`, `max_alerts`) are read by [`NotifySettings::from_config`]; the
/// rest belongs to the channel type, which parses it itself (see [`super::channel`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct ChannelSection {
    /// The table and its position in the file.
    pub table: Spanned<toml::Table>,
}

impl ChannelSection {
    /// The `name` value (empty when missing or not a string).
    pub fn name(&self) -> &str {
        self.table
            .get_ref()
            .get("name")
            .and_then(toml::Value::as_str)
            .unwrap_or_default()
    }
}

/// The keys every channel has.
#[derive(Debug, Clone, Deserialize)]
struct CommonSection {
    /// Unique name, used by routes.
    name: Spanned<String>,
    /// Channel type.
    #[serde(rename = "type")]
    kind: Spanned<String>,
    /// Send resolved notices (default true).
    send_resolved: Option<bool>,
    /// Per-send timeout (default `[notify] timeout`).
    timeout: Option<Spanned<DurationSetting>>,
    /// At most this many alerts per message (0 = all); the rest are counted as truncated.
    max_alerts: Option<usize>,
}

const COMMON_KEYS: &[&str] = &["name", "type", "send_resolved", "timeout", "max_alerts"];

/// `[[route]]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteSection {
    /// Match these severities (empty: any).
    pub severity: Vec<Severity>,
    /// Match these rule names (`alertname`; empty: any).
    pub rules: Vec<String>,
    /// Match these label values exactly.
    pub labels: BTreeMap<String, String>,
    /// Match these label values against regular expressions (whole value).
    pub labels_re: BTreeMap<String, String>,
    /// Deliver to these channels.
    pub channels: Vec<Spanned<String>>,
    /// Group alerts sharing these label values into one message; `["..."]` disables grouping.
    pub group_by: Option<Vec<String>>,
    /// Overrides `[notify] group_wait`.
    pub group_wait: Option<DurationSetting>,
    /// Overrides `[notify] group_interval`.
    pub group_interval: Option<DurationSetting>,
    /// Overrides `[notify] repeat_interval`.
    pub repeat_interval: Option<DurationSetting>,
    /// Keep matching later routes after this one matched (default false: first match wins).
    #[serde(rename = "continue")]
    pub continue_matching: bool,
}

// ---------------------------------------------------------------------------------------------
// Validated form.

/// A channel's `type`, as registered (see [`super::CHANNELS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelKind(pub &'static str);

impl ChannelKind {
    /// The `type` string.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

/// A validated channel.
#[derive(Debug, Clone)]
pub struct ChannelSpec {
    /// Name.
    pub name: String,
    /// Type.
    pub kind: ChannelKind,
    /// Send resolved notices.
    pub send_resolved: bool,
    /// Per-send timeout.
    pub timeout_ms: i64,
    /// Alerts per message (0 = all).
    pub max_alerts: usize,
    /// The channel type's own settings: renders requests, judges responses.
    pub channel: Arc<dyn Channel>,
}

impl ChannelSpec {
    /// Every secret of this channel (for redacting error text).
    pub fn secrets(&self) -> Vec<&Secret> {
        self.channel.secrets()
    }

    /// Replaces every secret of this channel in `text` with `***`.
    pub fn redact(&self, text: &str) -> String {
        self.secrets()
            .iter()
            .fold(text.to_string(), |acc, s| s.redact(&acc))
    }

    /// Cuts `alerts` to the channel's `max_alerts`; returns how many were left out.
    pub fn cap_alerts<T>(&self, alerts: &mut Vec<T>) -> usize {
        if self.max_alerts == 0 || alerts.len() <= self.max_alerts {
            return 0;
        }
        let cut = alerts.len() - self.max_alerts;
        alerts.truncate(self.max_alerts);
        cut
    }
}

/// A validated route.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// Severities matched (empty: any).
    pub severity: Vec<Severity>,
    /// Rule names matched (empty: any).
    pub rules: Vec<String>,
    /// Exact label matchers.
    pub labels: BTreeMap<String, String>,
    /// Regex label matchers (anchored).
    pub labels_re: Vec<(String, regex::Regex)>,
    /// Target channel names.
    pub channels: Vec<String>,
    /// Grouping labels; `None` = no grouping (one group per alert).
    pub group_by: Option<Vec<String>>,
    /// Wait before a new group's first message.
    pub group_wait_ms: i64,
    /// Minimum time between a group's messages.
    pub group_interval_ms: i64,
    /// Re-send an unchanged firing group this often.
    pub repeat_interval_ms: i64,
    /// Keep matching later routes.
    pub continue_matching: bool,
}

impl RouteSpec {
    /// Whether the alert with these properties matches this route.
    pub fn matches(
        &self,
        name: &str,
        severity: Severity,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        (self.severity.is_empty() || self.severity.contains(&severity))
            && (self.rules.is_empty() || self.rules.iter().any(|r| r == name))
            && self
                .labels
                .iter()
                .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
            && self
                .labels_re
                .iter()
                .all(|(k, re)| re.is_match(labels.get(k).map_or("", String::as_str)))
    }
}

/// Quiet hours, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuietHours {
    /// Start, minutes after midnight.
    pub start_min: u32,
    /// End, minutes after midnight.
    pub end_min: u32,
    /// Fixed UTC offset in minutes, or `None` for the local time zone.
    pub utc_offset_min: Option<i32>,
}

impl QuietHours {
    /// When the window that holds `now_ms` ends (UTC ms, a minute boundary); `now_ms` when it
    /// holds no window.
    pub fn end_after(&self, now_ms: i64) -> i64 {
        let mut t = now_ms;
        for _ in 0..=1440 {
            if !self.contains(t) {
                return t;
            }
            t = (t.div_euclid(60_000) + 1) * 60_000;
        }
        t
    }

    /// Whether `now_ms` (UTC) falls inside the window.
    pub fn contains(&self, now_ms: i64) -> bool {
        let offset_min = self
            .utc_offset_min
            .unwrap_or_else(|| local_offset_min(now_ms));
        let local_min = (now_ms.div_euclid(60_000) + i64::from(offset_min)).rem_euclid(1440);
        let (s, e) = (i64::from(self.start_min), i64::from(self.end_min));
        if s <= e {
            (s..e).contains(&local_min)
        } else {
            local_min >= s || local_min < e
        }
    }
}

fn local_offset_min(now_ms: i64) -> i32 {
    use chrono::{Local, Offset, TimeZone};
    match Local.timestamp_millis_opt(now_ms) {
        chrono::LocalResult::Single(t) | chrono::LocalResult::Ambiguous(t, _) => {
            t.offset().fix().local_minus_utc() / 60
        }
        chrono::LocalResult::None => 0,
    }
}

/// Retry and failure policy.
#[derive(Debug, Clone, Copy)]
pub struct DeliverySpec {
    /// First retry delay.
    pub retry_initial_ms: i64,
    /// Longest retry delay.
    pub retry_max_ms: i64,
    /// Give up (dead letter) after this long.
    pub give_up_after_ms: i64,
    /// Consecutive failures before `notifier_failing`.
    pub failing_after: u32,
}

impl DeliverySpec {
    /// Delay before attempt number `attempts + 1` after `attempts` failures (exponential).
    pub fn backoff_ms(&self, attempts: u32) -> i64 {
        let shift = attempts.saturating_sub(1).min(30);
        self.retry_initial_ms
            .saturating_mul(1i64 << shift)
            .min(self.retry_max_ms)
    }
}

/// Heartbeat settings.
#[derive(Debug, Clone)]
pub struct HeartbeatSpec {
    /// URL to GET.
    pub url: Secret,
    /// Ping period.
    pub interval_ms: i64,
}

/// Everything the dispatcher needs, validated.
#[derive(Debug, Clone)]
pub struct NotifySettings {
    /// Host name put in every message.
    pub hostname: String,
    /// Channels in file order.
    pub channels: Vec<ChannelSpec>,
    /// Routes in file order (a catch-all to every channel when none is configured).
    pub routes: Vec<RouteSpec>,
    /// Quiet hours.
    pub quiet_hours: Option<QuietHours>,
    /// Rate limit: (max messages, window ms) per channel.
    pub rate_limit: Option<(u32, i64)>,
    /// Retry policy.
    pub delivery: DeliverySpec,
    /// Heartbeat.
    pub heartbeat: Option<HeartbeatSpec>,
    /// Inhibition rules.
    pub inhibit: Vec<InhibitSection>,
}

/// What the notification settings are made from: the `[notify]`, `[[channel]]` and `[[route]]`
/// sections of one config file, with the file's text for positions (the config layer, above
/// this module, assembles it).
#[derive(Debug, Clone, Copy)]
pub struct NotifyConfig<'a> {
    /// `[notify]`.
    pub notify: &'a NotifySection,
    /// `[[channel]]`, in file order.
    pub channels: &'a [ChannelSection],
    /// `[[route]]`, in file order.
    pub routes: &'a [RouteSection],
    /// The host name messages carry.
    pub hostname: &'a str,
    /// Directory relative paths (secret files) resolve against.
    pub base_dir: &'a Path,
    /// The config file, for messages.
    pub path: &'a Path,
    /// The config file's text, for `line:column`.
    pub text: &'a str,
}

impl NotifySettings {
    /// Validates the notification sections, resolving secrets. Every problem is reported, one
    /// per line.
    pub fn from_config(config: &NotifyConfig<'_>) -> anyhow::Result<NotifySettings> {
        let mut errors = Vec::new();
        let ctx = Ctx {
            config: *config,
            lines: crate::values::LineIndex::new(config.text),
        };
        let n = config.notify;
        // Every duration but group_wait must be positive: a zero retry or timeout would hammer a
        // failing receiver (issue 11).
        let mut dur = |what: &str, d: DurationSetting| -> i64 {
            if d.ms == 0 && what != "group_wait" {
                let at = ctx.key(&format!("notify.{what}"));
                errors.push(format!("{at}: [notify] {what} must be longer than 0s"));
                return 1;
            }
            d.ms
        };
        let group_wait_ms = dur("group_wait", n.group_wait);
        let group_interval_ms = dur("group_interval", n.group_interval).max(1);
        let repeat_interval_ms = dur("repeat_interval", n.repeat_interval).max(1);
        let timeout_ms = dur("timeout", n.timeout).max(1);
        let delivery = DeliverySpec {
            retry_initial_ms: dur("retry_initial", n.retry_initial).max(1),
            retry_max_ms: dur("retry_max", n.retry_max).max(1),
            give_up_after_ms: dur("give_up_after", n.give_up_after).max(1),
            failing_after: n.failing_after.max(1),
        };
        let heartbeat_interval_ms = dur("heartbeat_interval", n.heartbeat_interval).max(1000);
        let rate_per_ms = dur("rate_limit.per", n.rate_limit.per).max(1);
        let rate_limit = (n.rate_limit.max > 0).then_some((n.rate_limit.max, rate_per_ms));
        let quiet_hours = match &n.quiet_hours {
            Some(q) => match parse_quiet_hours(q) {
                Ok(q) => Some(q),
                Err(e) => {
                    errors.push(format!(
                        "{}: [notify.quiet_hours] {e}",
                        ctx.key("notify.quiet_hours")
                    ));
                    None
                }
            },
            None => None,
        };
        let heartbeat_key = if n.heartbeat_url_env.is_some() {
            "notify.heartbeat_url_env"
        } else if n.heartbeat_url_file.is_some() {
            "notify.heartbeat_url_file"
        } else {
            "notify.heartbeat_url"
        };
        let heartbeat = match secret::resolve(
            "heartbeat_url",
            n.heartbeat_url.as_deref(),
            n.heartbeat_url_env.as_deref(),
            n.heartbeat_url_file.as_deref(),
            config.base_dir,
        ) {
            Ok(Some(url)) => match super::channel::check_url(url.expose()) {
                Ok(()) => Some(HeartbeatSpec {
                    url,
                    interval_ms: heartbeat_interval_ms,
                }),
                Err(e) => {
                    errors.push(format!(
                        "{}: [notify] heartbeat_url: {}",
                        ctx.key(heartbeat_key),
                        e.message.replace("`url` ", "")
                    ));
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                errors.push(format!("{}: [notify] {e}", ctx.key(heartbeat_key)));
                None
            }
        };

        let channels = ctx.channels(timeout_ms, &mut errors);
        let defaults = RouteDefaults {
            group_wait_ms,
            group_interval_ms,
            repeat_interval_ms,
        };
        let routes = ctx.routes(&defaults, &channels, &mut errors);
        if !errors.is_empty() {
            anyhow::bail!("{}", errors.join("\n"));
        }
        Ok(NotifySettings {
            hostname: config.hostname.to_string(),
            channels,
            routes,
            quiet_hours,
            rate_limit,
            delivery,
            heartbeat,
            inhibit: n.inhibit.clone(),
        })
    }

    /// The channel called `name`.
    pub fn channel(&self, name: &str) -> Option<&ChannelSpec> {
        self.channels.iter().find(|c| c.name == name)
    }
}

struct Ctx<'a> {
    config: NotifyConfig<'a>,
    lines: crate::values::LineIndex,
}

/// The `[notify]` grouping durations routes inherit.
#[derive(Clone, Copy)]
struct RouteDefaults {
    group_wait_ms: i64,
    group_interval_ms: i64,
    repeat_interval_ms: i64,
}

impl Ctx<'_> {
    /// Every `[[channel]]`, parsed by its type's registration; problems go to `errors`.
    fn channels(&self, timeout_ms: i64, errors: &mut Vec<String>) -> Vec<ChannelSpec> {
        let mut channels: Vec<ChannelSpec> = Vec::new();
        // Channel parsers see their table with positions into the file; a config built without
        // its text gets its tables re-serialized (errors then name only the file).
        let synthetic: String;
        let from_text =
            channel_tables(self.config.text).filter(|t| t.len() == self.config.channels.len());
        let positions = from_text.is_some();
        let tables = match from_text {
            Some(t) => t,
            None => {
                let doc: toml::Table = [(
                    "channel".to_string(),
                    toml::Value::Array(
                        self.config
                            .channels
                            .iter()
                            .map(|c| toml::Value::Table(c.table.get_ref().clone()))
                            .collect(),
                    ),
                )]
                .into_iter()
                .collect();
                synthetic = toml::to_string(&doc).unwrap_or_default();
                channel_tables(&synthetic).unwrap_or_default()
            }
        };
        let mut names = std::collections::HashSet::new();
        for table in tables {
            match build_channel(self, table, positions, timeout_ms) {
                Ok((spec, at)) => {
                    if names.insert(spec.name.clone()) {
                        channels.push(spec);
                    } else {
                        errors.push(format!("{at}: duplicate channel name {:?}", spec.name));
                    }
                }
                Err(e) => errors.push(e),
            }
        }

        channels
    }

    /// Every `[[route]]` (or one catch-all route to every channel when there is none); problems
    /// go to `errors`.
    fn routes(
        &self,
        defaults: &RouteDefaults,
        channels: &[ChannelSpec],
        errors: &mut Vec<String>,
    ) -> Vec<RouteSpec> {
        let RouteDefaults {
            group_wait_ms,
            group_interval_ms,
            repeat_interval_ms,
        } = *defaults;
        let mut routes = Vec::new();
        let declared: std::collections::HashSet<&str> =
            self.config.channels.iter().map(|c| c.name()).collect();
        for r in self.config.routes {
            let mut ok = true;
            for ch in &r.channels {
                if !declared.contains(ch.get_ref().as_str()) {
                    errors.push(format!(
                        "{}: route names unknown channel {:?}",
                        self.at(ch.span().start),
                        ch.get_ref()
                    ));
                    ok = false;
                }
            }
            let mut labels_re = Vec::new();
            for (k, v) in &r.labels_re {
                match regex::Regex::new(&format!("^(?:{v})$")) {
                    Ok(re) => labels_re.push((k.clone(), re)),
                    Err(e) => {
                        errors.push(format!("{}: route labels_re.{k}: {e}", self.file()));
                        ok = false;
                    }
                }
            }
            let rdur = |v: Option<DurationSetting>, default: i64| v.map_or(default, |d| d.ms);
            // A zero interval would send (or repeat) at every wake-up: a storm.
            for (key, v) in [
                ("group_interval", r.group_interval),
                ("repeat_interval", r.repeat_interval),
            ] {
                if v.is_some_and(|d| d.ms <= 0) {
                    let at = r
                        .channels
                        .first()
                        .map_or_else(|| self.file(), |c| self.at(c.span().start));
                    errors.push(format!("{at}: route {key} must be longer than 0"));
                    ok = false;
                }
            }
            let spec = RouteSpec {
                severity: r.severity.clone(),
                rules: r.rules.clone(),
                labels: r.labels.clone(),
                labels_re,
                channels: r.channels.iter().map(|c| c.get_ref().clone()).collect(),
                group_by: match &r.group_by {
                    Some(g) if g.iter().any(|l| l == "...") => None,
                    Some(g) => Some(g.clone()),
                    None => Some(vec!["alertname".into()]),
                },
                group_wait_ms: rdur(r.group_wait, group_wait_ms),
                group_interval_ms: rdur(r.group_interval, group_interval_ms).max(1),
                repeat_interval_ms: rdur(r.repeat_interval, repeat_interval_ms).max(1),
                continue_matching: r.continue_matching,
            };
            if ok {
                routes.push(spec);
            }
        }
        if self.config.routes.is_empty() && !channels.is_empty() {
            routes.push(RouteSpec {
                severity: Vec::new(),
                rules: Vec::new(),
                labels: BTreeMap::new(),
                labels_re: Vec::new(),
                channels: channels.iter().map(|c| c.name.clone()).collect(),
                group_by: Some(vec!["alertname".into()]),
                group_wait_ms,
                group_interval_ms,
                repeat_interval_ms,
                continue_matching: false,
            });
        }
        routes
    }

    fn file(&self) -> String {
        self.config.path.display().to_string()
    }

    fn at(&self, offset: usize) -> String {
        let (line, col) = self.lines.line_col(offset);
        format!("{}:{line}:{col}", self.file())
    }

    /// `file:line:column` of the value at dotted `key` (for an error: parses the file).
    fn key(&self, key: &str) -> String {
        let offset = toml::de::DeTable::parse(self.config.text)
            .map_or(0, |root| crate::values::key_offset(&root, key));
        self.at(offset)
    }
}

fn parse_hhmm(s: &str) -> Result<u32, String> {
    let (h, m) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected \"HH:MM\""))?;
    let h: u32 = h.parse().map_err(|_| format!("{s:?}: bad hour"))?;
    let m: u32 = m.parse().map_err(|_| format!("{s:?}: bad minute"))?;
    if h > 24 || m > 59 || (h == 24 && m > 0) {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(h * 60 + m)
}

fn parse_quiet_hours(q: &QuietHoursSection) -> Result<QuietHours, String> {
    let utc_offset_min = match q.timezone.as_str() {
        "local" | "Local" => None,
        "UTC" | "utc" | "Z" => Some(0),
        tz => {
            let (sign, rest) = match tz.as_bytes().first() {
                Some(b'+') => (1, &tz[1..]),
                Some(b'-') => (-1, &tz[1..]),
                _ => {
                    return Err(format!(
                        "timezone {tz:?}: use \"local\", \"UTC\" or \"+HH:MM\""
                    ))
                }
            };
            let m = i32::try_from(parse_hhmm(rest).map_err(|e| format!("timezone {e}"))?)
                .map_err(|_| "timezone out of range".to_string())?;
            Some(sign * m)
        }
    };
    Ok(QuietHours {
        start_min: parse_hhmm(&q.start).map_err(|e| format!("start {e}"))? % 1440,
        end_min: parse_hhmm(&q.end).map_err(|e| format!("end {e}"))? % 1440,
        utc_offset_min,
    })
}

/// The `[[channel]]` tables of a config document, with their spans.
fn channel_tables(text: &str) -> Option<Vec<Spanned<DeTable<'_>>>> {
    let doc = DeTable::parse(text).ok()?;
    let tables = doc
        .into_inner()
        .remove("channel")?
        .into_inner()
        .as_array()?
        .iter()
        .filter_map(|v| {
            let span = v.span();
            v.get_ref()
                .as_table()
                .map(|t| Spanned::new(span, t.clone()))
        })
        .collect();
    Some(tables)
}

/// Validates one channel: the common keys here, the rest by its type's parser.
fn build_channel(
    ctx: &Ctx<'_>,
    table: Spanned<DeTable<'_>>,
    positions: bool,
    default_timeout_ms: i64,
) -> Result<(ChannelSpec, String), String> {
    let span = table.span();
    let mut table = table.into_inner();
    let mut common = DeTable::new();
    for key in COMMON_KEYS {
        if let Some((k, v)) = table.remove_entry(*key) {
            common.insert(k, v);
        }
    }
    let start = span.start;
    let section_at = |offset: Option<usize>| {
        if positions {
            ctx.at(offset.unwrap_or(start))
        } else {
            ctx.file()
        }
    };
    let common: CommonSection = CommonSection::deserialize(toml::de::ValueDeserializer::from(
        Spanned::new(span.clone(), DeValue::Table(common)),
    ))
    .map_err(|e| {
        format!(
            "{}: channel: {}",
            section_at(e.span().map(|s| s.start)),
            channel::without_values(e.message())
        )
    })?;
    let name = common.name.get_ref().clone();
    let name_at = section_at(Some(common.name.span().start));
    let fail = |offset: Option<usize>, message: &str| {
        let at = offset.map_or_else(|| name_at.clone(), |o| section_at(Some(o)));
        format!("{at}: channel {name:?}: {message}")
    };
    let kind = common.kind.get_ref().as_str();
    let Some(registration) = channel::find(kind) else {
        return Err(fail(
            Some(common.kind.span().start),
            &format!("unknown type {kind:?} (one of {})", channel::type_names()),
        ));
    };
    let timeout_ms = match &common.timeout {
        Some(t) if t.get_ref().ms == 0 => {
            return Err(fail(Some(t.span().start), "timeout must be longer than 0s"));
        }
        Some(t) => t.get_ref().ms,
        None => default_timeout_ms,
    };
    let mut section = Section::new(table, span, positions, ctx.config.base_dir);
    let parsed = registration
        .parse(&mut section)
        .map_err(|e| fail(e.offset, &e.message))?;
    let spec = ChannelSpec {
        name,
        kind: ChannelKind(registration.type_name),
        send_resolved: common.send_resolved.unwrap_or(true),
        timeout_ms,
        max_alerts: common.max_alerts.unwrap_or(0),
        channel: Arc::from(parsed),
    };
    Ok((spec, name_at))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::channel::{Request, TlsMode};
    use super::super::testdata;
    use super::*;
    use crate::model::AlertStatus;

    fn render(spec: &ChannelSpec) -> Vec<Request> {
        let n = testdata::notification(vec![testdata::alert(1, AlertStatus::Firing)]);
        let env = channel::RenderEnv {
            now_ms: 1_796_224_800_500,
            nonce: "n".into(),
        };
        spec.channel.render(&n, &env).unwrap()
    }

    fn settings(text: &str) -> anyhow::Result<NotifySettings> {
        let config = crate::config::parse(text, Path::new("/etc/gpuwatch/config.toml"))?;
        config.notify_settings()
    }

    #[test]
    fn issue_example_config_is_valid() {
        let s = settings(
            r#"
[daemon]
interval = "1s"
state_dir = "/var/lib/gpuwatch"
rules = ["rules/"]

[[channel]]
name = "ops"
type = "webhook"
url = "http://127.0.0.1:9099/hook"

[[channel]]
name = "mail"
type = "email"
smtp = "127.0.0.1:2525"
tls = "none"
from = "gpuwatch@example.org"
to = ["oncall@example.org"]

[[route]]
severity = ["warning", "critical"]
channels = ["ops", "mail"]
group_by = ["alertname"]
group_wait = "0s"
repeat_interval = "4h"
"#,
        )
        .unwrap();
        assert_eq!(s.channels.len(), 2);
        let Request::Smtp(e) = &render(&s.channels[1])[0] else {
            panic!("email")
        };
        assert_eq!(
            (e.server.host.as_str(), e.server.port, e.server.tls),
            ("127.0.0.1", 2525, TlsMode::None)
        );
        let r = &s.routes[0];
        assert_eq!(r.group_wait_ms, 0);
        assert_eq!(r.group_interval_ms, 300_000);
        assert_eq!(r.repeat_interval_ms, 4 * 3_600_000);
        assert!(r.matches("x", Severity::Critical, &BTreeMap::new()));
        assert!(!r.matches("x", Severity::Info, &BTreeMap::new()));
    }

    #[test]
    fn errors_name_position_and_never_the_secret() {
        let err = settings(
            "[[channel]]\nname = \"mail\"\ntype = \"email\"\nsmtp = \"h:25\"\nfrom = \"a@b.c\"\nto = [\"x@y.z\"]\nusername = \"u\"\npassword_env = \"GPUWATCH_NO_SUCH_VAR\"\n\n[[route]]\nchannels = [\"nope\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("/etc/gpuwatch/config.toml:2:8: channel \"mail\""),
            "{err}"
        );
        assert!(err.contains("GPUWATCH_NO_SUCH_VAR is not set"), "{err}");
        assert!(
            err.contains(":11:13: route names unknown channel \"nope\""),
            "{err}"
        );

        let err = settings("[[channel]]\nname = \"x\"\ntype = \"pager\"\nurl = \"http://a\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("config.toml:3:8"), "{err}");

        let s = settings(
            "[[channel]]\nname = \"x\"\ntype = \"slack\"\nurl = \"https://hooks.slack.com/services/T/B/supersecret\"\n",
        )
        .unwrap();
        assert!(!format!("{s:?}").contains("supersecret"));
    }

    /// Issue 11: zero retry/timeout durations are errors at their position, not 1 ms; only
    /// http(s) URLs are accepted.
    #[test]
    fn zero_durations_and_non_http_urls_are_errors() {
        let err =
            settings("[notify]\nretry_initial = \"0s\"\nretry_max = \"0s\"\ntimeout = \"0s\"\n")
                .unwrap_err()
                .to_string();
        for (line, key) in [(2, "retry_initial"), (3, "retry_max"), (4, "timeout")] {
            assert!(
                err.contains(&format!(":{line}:"))
                    && err.contains(&format!("{key} must be longer than 0s")),
                "{key}: {err}"
            );
        }
        assert!(settings("[notify]\ngroup_wait = \"0s\"\n").is_ok());
        for url in ["ftp://example.org/hook", "file:///etc/passwd"] {
            let err = settings(&format!(
                "[[channel]]\nname = \"x\"\ntype = \"webhook\"\nurl = \"{url}\"\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("must be http:// or https://"), "{url}: {err}");
        }
    }

    #[test]
    fn example_config_parses_with_documented_defaults() {
        let text = include_str!("../../config.example.toml");
        let config = crate::config::parse(text, Path::new("config.example.toml")).unwrap();
        let s = config.notify_settings().unwrap();
        let d = NotifySection::default();
        assert_eq!(config.notify.group_interval, d.group_interval);
        assert_eq!(config.notify.timeout, d.timeout);
        assert_eq!(config.notify.retry_max, d.retry_max);
        assert_eq!(config.notify.failing_after, d.failing_after);
        assert_eq!(config.notify.rate_limit.max, d.rate_limit.max);
        assert_eq!(s.channels.len(), 2);
        assert_eq!(s.routes[0].channels, ["ops", "mail"]);
        assert_eq!(config.actions, crate::action::ActionsSection::default());
        assert_eq!(config.notify.inhibit, default_inhibit());
        assert_eq!(config.job, crate::job::JobSection::default());
    }

    #[test]
    fn telegram_and_alertmanager_urls() {
        let s = settings(
            "[[channel]]\nname = \"t\"\ntype = \"telegram\"\ntoken = \"123:abc\"\nchat_id = -100\nurl = \"http://127.0.0.1:1/\"\n[[channel]]\nname = \"am\"\ntype = \"alertmanager\"\nurl = \"http://am:9093/\"\n",
        )
        .unwrap();
        let Request::Http(tg) = &render(&s.channels[0])[0] else {
            panic!()
        };
        assert_eq!(tg.url.expose(), "http://127.0.0.1:1/bot123:abc/sendMessage");
        let body: serde_json::Value = serde_json::from_slice(&tg.body).unwrap();
        assert_eq!(body["chat_id"], -100);
        let Request::Http(am) = &render(&s.channels[1])[0] else {
            panic!()
        };
        assert_eq!(am.url.expose(), "http://am:9093/api/v2/alerts");
        assert_eq!(s.routes.len(), 1, "catch-all route");
    }

    #[test]
    fn channel_errors_point_at_the_key_or_value() {
        let err = |text: &str| settings(text).unwrap_err().to_string();
        let e = err("[[channel]]\nname = \"x\"\ntype = \"slack\"\nurl = \"http://a\"\nbogus = 1\n");
        assert!(
            e.contains("config.toml:5:1: channel \"x\": unknown field `bogus`"),
            "{e}"
        );
        let e = err("[[channel]]\nname = \"x\"\ntype = \"sms\"\nprovider = \"carrier-pigeon\"\n");
        assert!(
            e.contains("config.toml:4:12: channel \"x\": unknown provider \"carrier-pigeon\""),
            "{e}"
        );
        let e = err("[[channel]]\nname = \"x\"\ntype = \"sms\"\nprovider = \"twilio\"\naccount_sid = \"AC1\"\ntoken = \"t\"\nfrom = \"+1\"\nto = \"+2\"\n");
        assert!(
            e.contains("config.toml:8:6: channel \"x\": invalid type"),
            "{e}"
        );
        let e = err(
            "[[channel]]\nname = \"x\"\ntype = \"gotify\"\nurl = \"https://g\"\ntoken = 98765432\n",
        );
        assert!(
            e.contains("config.toml:5:9: channel \"x\": invalid type: integer, expected a string"),
            "{e}"
        );
        assert!(!e.contains("98765432"), "{e}");
        let e = err("[[channel]]\nname = \"x\"\ntype = \"matrix\"\nurl = \"https://hs\"\nroom = \"!r:hs\"\n");
        assert!(
            e.contains("config.toml:2:8: channel \"x\": `token` (or `token_env`, `token_file`) is required"),
            "{e}"
        );
        let e = err("[[channel]]\nname = \"x\"\ntype = \"gotify\"\nurl = \"https://g\"\ntoken = \"AbCdEfGh\"\ntimeout = \"soon\"\n");
        assert!(
            e.contains("config.toml:6:11: channel: invalid duration \"soon\""),
            "{e}"
        );
        assert!(!e.contains("AbCdEfGh"), "{e}");
    }

    #[test]
    fn every_new_type_parses() {
        let s = settings(
            "[[channel]]\nname = \"n\"\ntype = \"ntfy\"\nurl = \"https://ntfy.sh/t\"\n\
             [[channel]]\nname = \"p\"\ntype = \"pushover\"\ntoken = \"a\"\nuser = \"u\"\n\
             [[channel]]\nname = \"g\"\ntype = \"gotify\"\nurl = \"https://g\"\ntoken = \"t\"\n\
             [[channel]]\nname = \"m\"\ntype = \"matrix\"\nurl = \"https://hs\"\nroom = \"!r:hs\"\ntoken = \"t\"\n\
             [[channel]]\nname = \"s\"\ntype = \"sms\"\nprovider = \"twilio\"\naccount_sid = \"AC1\"\ntoken = \"t\"\nfrom = \"+1\"\nto = [\"+2\", \"+3\"]\n\
             [[channel]]\nname = \"a\"\ntype = \"sms\"\nprovider = \"aliyun\"\naccess_key_id = \"i\"\naccess_key_secret = \"k\"\nsign_name = \"s\"\ntemplate_code = \"SMS_1\"\nto = [\"13800000000\"]\n",
        )
        .unwrap();
        let kinds: Vec<_> = s.channels.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["ntfy", "pushover", "gotify", "matrix", "sms", "sms"]
        );
        assert_eq!(render(&s.channels[4]).len(), 2, "one SMS per recipient");
    }

    /// A route's zero interval is an error (it would send at every wake-up), named where the
    /// route is.
    #[test]
    fn a_zero_route_interval_is_an_error() {
        let e = settings(
            "[[channel]]\nname = \"ops\"\ntype = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n\n[[route]]\nchannels = [\"ops\"]\nrepeat_interval = \"0s\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("config.toml:7:") && e.contains("repeat_interval"),
            "{e}"
        );
    }

    /// A heartbeat URL that is no http(s) URL is an error at its key (every ping would fail).
    #[test]
    fn a_bad_heartbeat_url_is_an_error() {
        let e = settings("[notify]\nheartbeat_url = \"hc-ping.com/uuid\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.toml:2:") && e.contains("heartbeat_url"),
            "{e}"
        );
    }

    #[test]
    fn quiet_hours_wrap_midnight() {
        let q = parse_quiet_hours(&QuietHoursSection {
            start: "22:00".into(),
            end: "07:00".into(),
            timezone: "+02:00".into(),
        })
        .unwrap();
        let at = |h: i64, m: i64| (h * 60 + m) * 60_000;
        assert!(q.contains(at(20, 0))); // 22:00 local
        assert!(q.contains(at(4, 59))); // 06:59 local
        assert!(!q.contains(at(5, 0))); // 07:00 local
        assert!(!q.contains(at(12, 0)));
        assert_eq!(q.end_after(at(20, 0) + 1234), at(29, 0)); // 07:00 local, the next day
        assert_eq!(q.end_after(at(12, 0) + 5), at(12, 0) + 5, "outside: now");
    }

    #[test]
    fn backoff_doubles_up_to_max() {
        let d = DeliverySpec {
            retry_initial_ms: 1000,
            retry_max_ms: 5000,
            give_up_after_ms: 1,
            failing_after: 3,
        };
        assert_eq!(
            (1..=5).map(|a| d.backoff_ms(a)).collect::<Vec<_>>(),
            vec![1000, 2000, 4000, 5000, 5000]
        );
    }
}
