//! What `gpuwatch top` shows, collected: per-GPU history (the last minutes of each charted
//! metric), the newest values and processes, the alerts (from the daemon or the local engine),
//! the watched jobs, and the view's own state (sort, selection, chart, pause). Updated from
//! snapshots and key presses; drawn by `top::view` (collect/render split: nothing here draws).

use std::collections::VecDeque;

use crate::model::{DeviceId, DeviceState, Metric, MetricValues, ProcSample, Snapshot};

/// Samples of history kept per GPU and metric (5 minutes at 1 s).
pub const HISTORY: usize = 300;

/// A metric the view charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    Util,
    Mem,
    Temp,
    Power,
    Clock,
}

impl Chart {
    pub const ALL: [Chart; 5] = [
        Chart::Util,
        Chart::Mem,
        Chart::Temp,
        Chart::Power,
        Chart::Clock,
    ];

    /// Title of the chart.
    pub fn title(self) -> &'static str {
        match self {
            Chart::Util => "utilization (%)",
            Chart::Mem => "memory used (% of total)",
            Chart::Temp => "temperature (°C)",
            Chart::Power => "power (W)",
            Chart::Clock => "SM clock (MHz)",
        }
    }

    /// The key that selects it in the chart view.
    pub fn key(self) -> char {
        match self {
            Chart::Util => 'u',
            Chart::Mem => 'm',
            Chart::Temp => 't',
            Chart::Power => 'p',
            Chart::Clock => 'c',
        }
    }

    /// The value charted from a sample.
    fn value(self, v: &MetricValues) -> Option<f64> {
        match self {
            Chart::Util => v.get(Metric::Util),
            Chart::Mem => match (v.get(Metric::MemUsed), v.get(Metric::MemTotal)) {
                (Some(u), Some(t)) if t > 0.0 => Some(100.0 * u / t),
                _ => None,
            },
            Chart::Temp => v.get(Metric::Temp),
            Chart::Power => v.get(Metric::Power),
            Chart::Clock => v.get(Metric::SmClock),
        }
    }
}

/// The order of the GPU rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Index,
    Util,
    Mem,
    Temp,
    Power,
}

impl Sort {
    fn next(self) -> Sort {
        match self {
            Sort::Index => Sort::Util,
            Sort::Util => Sort::Mem,
            Sort::Mem => Sort::Temp,
            Sort::Temp => Sort::Power,
            Sort::Power => Sort::Index,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sort::Index => "index",
            Sort::Util => "util",
            Sort::Mem => "memory",
            Sort::Temp => "temperature",
            Sort::Power => "power",
        }
    }
}

/// One GPU: identity, state, newest values, and the history of each charted metric (`None`
/// where a tick had no value: a gap stays a gap).
#[derive(Debug, Clone)]
pub struct GpuView {
    pub id: DeviceId,
    pub state: DeviceState,
    pub values: MetricValues,
    pub history: [VecDeque<Option<f64>>; 5],
}

impl GpuView {
    /// The history of `chart`.
    pub fn series(&self, chart: Chart) -> &VecDeque<Option<f64>> {
        let i = Chart::ALL.iter().position(|c| *c == chart).unwrap_or(0);
        &self.history[i]
    }
}

/// An alert as the view lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertView {
    pub name: String,
    pub severity: String,
    pub gpu: Option<u32>,
    /// `pending` or `firing`.
    pub state: String,
    pub summary: String,
    pub silenced: bool,
}

/// Where the alerts come from.
#[derive(Debug, Clone, PartialEq)]
pub enum AlertSource {
    /// The running daemon, through its control socket.
    Daemon,
    /// No daemon: the stock rules evaluated here (with why, when a daemon went away).
    Local(Option<String>),
}

/// A job watched by `gpuwatch run` (its status file in `state_dir/jobs/`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct JobView {
    pub pid: u32,
    pub command: String,
    pub progress: String,
    /// Seconds since progress moved, if it ever did.
    #[serde(default)]
    pub progress_age_s: Option<f64>,
    /// Seconds to the end at the recent pace, if known.
    #[serde(default)]
    pub eta_s: Option<f64>,
}

/// Everything the view shows and its own state.
#[derive(Debug, Clone)]
pub struct TopState {
    pub host: String,
    pub gpus: Vec<GpuView>,
    pub processes: Vec<ProcSample>,
    /// The MIG devices of the GPUs with MIG on, as of the newest snapshot.
    pub mig: Vec<crate::model::MigSample>,
    pub alerts: Vec<AlertView>,
    pub source: AlertSource,
    pub jobs: Vec<JobView>,
    /// Time of the newest snapshot shown, UTC ms.
    pub time_ms: Option<i64>,
    pub paused: bool,
    pub sort: Sort,
    /// Position of the selected row in the sorted order.
    pub selected: usize,
    /// The full-width chart of the selected GPU, when open.
    pub chart: Option<Chart>,
    pub help: bool,
    /// Sampling interval, for the header.
    pub interval_ms: i64,
}

/// What a key press asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Up,
    Down,
    Enter,
    Esc,
}

impl TopState {
    pub fn new(host: String, interval_ms: i64, source: AlertSource) -> TopState {
        TopState {
            host,
            gpus: Vec::new(),
            processes: Vec::new(),
            mig: Vec::new(),
            alerts: Vec::new(),
            source,
            jobs: Vec::new(),
            time_ms: None,
            paused: false,
            sort: Sort::Index,
            selected: 0,
            chart: None,
            help: false,
            interval_ms,
        }
    }

    /// Takes a snapshot (history grows even while paused; the view shows the paused frame).
    pub fn observe(&mut self, snap: &Snapshot) {
        for g in &snap.gpus {
            let pos = match self.gpus.iter().position(|v| v.id.index == g.id.index) {
                Some(p) => p,
                None => {
                    self.gpus.push(GpuView {
                        id: g.id.clone(),
                        state: g.state,
                        values: MetricValues::default(),
                        history: Default::default(),
                    });
                    self.gpus.sort_by_key(|v| v.id.index);
                    self.gpus
                        .iter()
                        .position(|v| v.id.index == g.id.index)
                        .unwrap_or(0)
                }
            };
            let view = &mut self.gpus[pos];
            if !g.id.uuid.is_empty() {
                view.id = g.id.clone();
            }
            view.state = g.state;
            view.values = g.values.clone();
            for (i, chart) in Chart::ALL.iter().enumerate() {
                let h = &mut view.history[i];
                h.push_back(if g.state == DeviceState::Ok {
                    chart.value(&g.values)
                } else {
                    None
                });
                while h.len() > HISTORY {
                    h.pop_front();
                }
            }
        }
        // A GPU this snapshot lacks (late at this tick: a gap) shows no values rather than its
        // last ones as current, and its charts get a gap.
        for view in &mut self.gpus {
            if snap.gpus.iter().any(|g| g.id.index == view.id.index) {
                continue;
            }
            view.values = MetricValues::default();
            for h in &mut view.history {
                h.push_back(None);
                while h.len() > HISTORY {
                    h.pop_front();
                }
            }
        }
        if let Some(p) = &snap.processes {
            self.processes.clone_from(p);
        }
        self.mig.clone_from(&snap.mig);
        self.time_ms = Some(snap.time_ms);
    }

    /// GPU positions in display order.
    pub fn order(&self) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.gpus.len()).collect();
        let key = |i: &usize| -> f64 {
            let v = &self.gpus[*i].values;
            let x = match self.sort {
                Sort::Index => return f64::from(self.gpus[*i].id.index),
                Sort::Util => v.get(Metric::Util),
                Sort::Mem => v.get(Metric::MemUsed),
                Sort::Temp => v.get(Metric::Temp),
                Sort::Power => v.get(Metric::Power),
            };
            // Highest first; GPUs without a value last.
            -x.unwrap_or(f64::NEG_INFINITY)
        };
        idx.sort_by(|a, b| key(a).total_cmp(&key(b)));
        idx
    }

    /// The selected GPU's position in `gpus`.
    pub fn selected_gpu(&self) -> Option<usize> {
        self.order().get(self.selected).copied()
    }

    /// Applies a key; returns false when the view should end.
    pub fn key(&mut self, key: Key) -> bool {
        let n = self.gpus.len();
        match key {
            Key::Char('q') => return false,
            Key::Esc if self.chart.is_none() && !self.help => return false,
            Key::Esc => {
                self.chart = None;
                self.help = false;
            }
            Key::Char('?' | 'h') => self.help = !self.help,
            Key::Char(' ') => self.paused = !self.paused,
            Key::Char('s') => self.sort = self.sort.next(),
            Key::Up | Key::Char('k') => self.selected = self.selected.saturating_sub(1),
            Key::Down | Key::Char('j') => {
                self.selected = (self.selected + 1).min(n.saturating_sub(1));
            }
            Key::Enter => {
                self.chart = match self.chart {
                    None => Some(Chart::Util),
                    Some(_) => None,
                };
            }
            Key::Char(c) => {
                if let Some(chart) = Chart::ALL.iter().find(|x| x.key() == c) {
                    self.chart = Some(*chart);
                }
            }
        }
        true
    }
}

/// Text sparkline of `values` in `width` cells between `lo` and `hi`: the history is cut into
/// `width` buckets (the newest at the right), each drawn at its maximum; a bucket without any
/// value is a blank (a gap stays a gap). ASCII uses ` .:-=+*#`.
pub fn sparkline(
    values: &VecDeque<Option<f64>>,
    width: usize,
    lo: f64,
    hi: f64,
    ascii: bool,
) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    const ASCII: [char; 8] = ['_', '.', ':', '-', '=', '+', '*', '#'];
    let levels = if ascii { &ASCII } else { &BARS };
    if width == 0 {
        return String::new();
    }
    let n = values.len();
    let mut out = String::with_capacity(width * 3);
    // Samples per cell; the cells used (fewer than `width` while the history is short, right
    // aligned). Buckets end at the newest sample, so only the oldest one may be partial.
    let per = n.div_ceil(width).max(1);
    let cells = n.div_ceil(per);
    for _ in cells..width {
        out.push(' ');
    }
    let span = (hi - lo).max(f64::EPSILON);
    let mut start = 0;
    for c in 0..cells {
        let take = if c == 0 { n - (cells - 1) * per } else { per };
        let max = values
            .iter()
            .skip(start)
            .take(take)
            .filter_map(|v| *v)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        out.push(match max {
            None => ' ',
            Some(v) => {
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "clamped to 0..=7"
                )]
                let i = (((v - lo) / span) * 7.0).round().clamp(0.0, 7.0) as usize;
                levels[i]
            }
        });
        start += take;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(v: &[Option<f64>]) -> VecDeque<Option<f64>> {
        v.iter().copied().collect()
    }

    #[test]
    fn sparkline_fills_from_the_right_and_keeps_gaps() {
        let s = sparkline(
            &series(&[Some(0.0), None, Some(100.0)]),
            5,
            0.0,
            100.0,
            false,
        );
        assert_eq!(s, "  ▁ █");
        let a = sparkline(
            &series(&[Some(0.0), None, Some(100.0)]),
            5,
            0.0,
            100.0,
            true,
        );
        assert_eq!(a, "  _ #");
        // 300 samples in 10 cells: 30 per cell, each at its maximum.
        let many: Vec<Option<f64>> = (0..300).map(|i| Some(f64::from(i) / 3.0)).collect();
        let s = sparkline(&series(&many), 10, 0.0, 100.0, false);
        assert_eq!(s.chars().count(), 10);
        assert!(s.ends_with('█'), "{s}");
        assert_eq!(sparkline(&series(&[]), 4, 0.0, 1.0, false), "    ");
    }

    #[test]
    fn keys_sort_select_chart_pause_and_quit() {
        let mut st = TopState::new("h".into(), 1000, AlertSource::Local(None));
        let mut snap = Snapshot {
            time_ms: 1,
            gpus: Vec::new(),
            processes: None,
            xids: Vec::new(),
            missing: Vec::new(),
            mig: Vec::new(),
            nvlink: Vec::new(),
            pods: Vec::new(),
        };
        for (i, u) in [10.0, 90.0, 50.0].iter().enumerate() {
            let mut values = MetricValues::default();
            values.set(Metric::Util, Some(*u));
            snap.gpus.push(crate::model::GpuSample {
                time_ms: 1,
                id: DeviceId {
                    index: u32::try_from(i).unwrap_or(0),
                    ..DeviceId::default()
                },
                state: DeviceState::Ok,
                values,
            });
        }
        st.observe(&snap);
        // GPU 1 late at the next tick: no values shown for it, a gap in its charts.
        let mut late = snap.clone();
        late.gpus.remove(1);
        let mut lagging = TopState::new("h".into(), 1000, AlertSource::Local(None));
        lagging.observe(&snap);
        lagging.observe(&late);
        assert_eq!(lagging.gpus[1].values.get(Metric::Util), None);
        assert_eq!(lagging.gpus[1].history[0].back(), Some(&None));
        assert_eq!(lagging.gpus[0].values.get(Metric::Util), Some(10.0));
        assert_eq!(st.order(), vec![0, 1, 2]);
        assert!(st.key(Key::Char('s')));
        assert_eq!(st.sort, Sort::Util);
        assert_eq!(st.order(), vec![1, 2, 0]);
        st.key(Key::Down);
        assert_eq!(st.selected_gpu(), Some(2));
        st.key(Key::Enter);
        assert_eq!(st.chart, Some(Chart::Util));
        st.key(Key::Char('t'));
        assert_eq!(st.chart, Some(Chart::Temp));
        assert!(st.key(Key::Esc));
        assert_eq!(st.chart, None);
        st.key(Key::Char(' '));
        assert!(st.paused);
        assert!(!st.key(Key::Char('q')));
        assert!(!st.key(Key::Esc));
    }
}
