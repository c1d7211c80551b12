//! Scanning the job's output: split bytes into lines, keep the last N lines, feed progress
//! patterns and remember crash markers (CUDA OOM, NCCL errors, Python tracebacks).
//!
//! Bytes arrive in arbitrary chunks; a line ends at `\n`. A `\r` inside a line (tqdm redrawing its
//! bar) splits it into segments: every segment is offered to the progress patterns, and the tail
//! keeps only the last one, which is what a terminal shows. Pure: the caller passes the time.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::progress::{ProgressParser, ProgressState};

/// Longest line kept (longer lines are cut with a marker); protects memory against binary output.
const MAX_LINE_BYTES: usize = 16 * 1024;

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output (or a followed log file).
    Stdout,
    /// Standard error.
    Stderr,
}

/// A crash marker seen in the output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// The line that carried it (trimmed, cut to 300 bytes).
    pub line: String,
    /// When it was seen, UTC ms.
    pub at_ms: i64,
}

/// Crash markers found so far (the last occurrence of each kind).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Markers {
    /// `CUDA out of memory`, `torch.OutOfMemoryError`, `CUDA error: out of memory`, …
    pub cuda_oom: Option<Marker>,
    /// `NCCL error`, `ncclSystemError`, NCCL watchdog timeouts, …
    pub nccl: Option<Marker>,
    /// `Traceback (most recent call last):`
    pub traceback: Option<Marker>,
    /// The last line that looks like a Python exception (`ValueError: …`) after a traceback.
    pub exception: Option<Marker>,
}

/// Line splitter, tail keeper, progress and marker scanner for one job.
#[derive(Debug)]
pub struct OutputScanner {
    parser: ProgressParser,
    tail_lines: usize,
    tail: VecDeque<String>,
    partial: [Vec<u8>; 2],
    /// Progress so far.
    pub progress: ProgressState,
    /// Crash markers so far.
    pub markers: Markers,
    /// Total lines seen.
    pub lines: u64,
}

impl OutputScanner {
    /// A scanner keeping `tail_lines` lines.
    pub fn new(parser: ProgressParser, tail_lines: usize) -> OutputScanner {
        OutputScanner {
            parser,
            tail_lines,
            tail: VecDeque::with_capacity(tail_lines.min(1024)),
            partial: [Vec::new(), Vec::new()],
            progress: ProgressState::default(),
            markers: Markers::default(),
            lines: 0,
        }
    }

    /// Feeds a chunk of bytes from `stream`, read at `now_ms`.
    pub fn feed(&mut self, stream: Stream, bytes: &[u8], now_ms: i64) {
        let idx = stream as usize;
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let mut line = std::mem::take(&mut self.partial[idx]);
            push_capped(&mut line, &rest[..nl]);
            self.line(&line, now_ms);
            rest = &rest[nl + 1..];
        }
        push_capped(&mut self.partial[idx], rest);
        // Offer an unterminated tqdm redraw to the progress patterns right away: the bar never
        // ends with `\n` until it finishes.
        if let Some(cr) = self.partial[idx].iter().rposition(|&b| b == b'\r') {
            let redraw = self.partial[idx][..cr].to_vec();
            self.partial[idx].drain(..=cr);
            if let Some(seg) = redraw.rsplit(|&b| b == b'\r').find(|s| !s.is_empty()) {
                let seg = String::from_utf8_lossy(seg).into_owned();
                self.progress_segment(&seg, now_ms);
            }
            // Keep the last complete redraw as the pending line's visible text.
            if self.partial[idx].is_empty() {
                if let Some(seg) = redraw.rsplit(|&b| b == b'\r').find(|s| !s.is_empty()) {
                    self.partial[idx] = seg.to_vec();
                    self.partial[idx].push(b'\r');
                }
            }
        }
    }

    /// Flushes unterminated lines (at the end of the job).
    pub fn finish(&mut self, now_ms: i64) {
        for idx in 0..2 {
            let line = std::mem::take(&mut self.partial[idx]);
            if !line.is_empty() {
                self.line(&line, now_ms);
            }
        }
    }

    /// The last lines, oldest first.
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    fn line(&mut self, raw: &[u8], now_ms: i64) {
        let text = String::from_utf8_lossy(raw);
        let text = text.strip_suffix('\r').unwrap_or(&text);
        self.lines += 1;
        let mut visible = "";
        for seg in text.split('\r') {
            if !seg.is_empty() {
                self.progress_segment(seg, now_ms);
                visible = seg;
            }
        }
        self.check_markers(visible, now_ms);
        if self.tail_lines > 0 {
            if self.tail.len() == self.tail_lines {
                self.tail.pop_front();
            }
            self.tail.push_back(visible.to_string());
        }
    }

    fn progress_segment(&mut self, seg: &str, now_ms: i64) {
        if let Some(update) = self.parser.parse(seg) {
            self.progress.apply(&update, seg, now_ms);
        }
    }

    fn check_markers(&mut self, line: &str, now_ms: i64) {
        // Launchers prefix each worker's lines (`[rank0]: `, torchrun's `[default0]:`).
        let line = strip_rank_prefix(line);
        let marker = || Marker {
            line: short(line.trim()),
            at_ms: now_ms,
        };
        if is_cuda_oom(line) {
            self.markers.cuda_oom = Some(marker());
        }
        if is_nccl_error(line) {
            self.markers.nccl = Some(marker());
        }
        if line.starts_with("Traceback (most recent call last)") {
            self.markers.traceback = Some(marker());
            self.markers.exception = None;
        } else if self.markers.traceback.is_some() && is_exception_line(line) {
            self.markers.exception = Some(marker());
        }
    }
}

/// `line` without a launcher's per-worker prefix: `[rank0]: `, `[default3]:`, `[1,0]<stderr>:`.
fn strip_rank_prefix(line: &str) -> &str {
    if !line.starts_with('[') {
        return line;
    }
    match line.find("]:").or_else(|| line.find(">:")) {
        Some(end) if end <= 40 => line[end + 2..]
            .strip_prefix(' ')
            .unwrap_or(&line[end + 2..]),
        _ => line,
    }
}

fn push_capped(buf: &mut Vec<u8>, bytes: &[u8]) {
    let room = MAX_LINE_BYTES.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

fn short(s: &str) -> String {
    if s.len() <= 300 {
        return s.to_string();
    }
    let mut end = 300;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// True for the messages PyTorch, TensorFlow, JAX and the CUDA runtime print on device OOM.
pub fn is_cuda_oom(line: &str) -> bool {
    const NEEDLES: &[&str] = &[
        "CUDA out of memory",
        "OutOfMemoryError",
        "CUDA error: out of memory",
        "cudaErrorMemoryAllocation",
        "CUBLAS_STATUS_ALLOC_FAILED",
        "CUDNN_STATUS_ALLOC_FAILED",
        "RESOURCE_EXHAUSTED: Out of memory",
        "OOM when allocating tensor",
    ];
    NEEDLES.iter().any(|n| line.contains(n))
}

/// True for NCCL failures: error codes, PyTorch's NCCL watchdog timeouts, aborted communicators.
pub fn is_nccl_error(line: &str) -> bool {
    const NEEDLES: &[&str] = &[
        "NCCL error",
        "ncclSystemError",
        "ncclInternalError",
        "ncclUnhandledCudaError",
        "ncclInvalidUsage",
        "ncclRemoteError",
        "DistBackendError",
        "Watchdog caught collective operation timeout",
        "NCCL communicator was aborted",
    ];
    NEEDLES.iter().any(|n| line.contains(n))
}

/// `ValueError: bad`, `torch.OutOfMemoryError: …`, `KeyboardInterrupt`.
fn is_exception_line(line: &str) -> bool {
    let head = line.split(':').next().unwrap_or("");
    !line.starts_with(' ')
        && !head.is_empty()
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && (head.ends_with("Error")
            || head.ends_with("Exception")
            || head.ends_with("Interrupt")
            || head.ends_with("Exit")
            || head.ends_with("Failure"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanner(n: usize) -> OutputScanner {
        OutputScanner::new(ProgressParser::defaults(), n)
    }

    #[test]
    fn lines_across_chunks_and_tail() {
        let mut s = scanner(2);
        s.feed(Stream::Stdout, b"one\ntw", 1);
        s.feed(Stream::Stdout, b"o\nthree", 2);
        assert_eq!(s.tail(), vec!["one", "two"]);
        s.finish(3);
        assert_eq!(s.tail(), vec!["two", "three"]);
        assert_eq!(s.lines, 3);
    }

    #[test]
    fn streams_do_not_mix_partial_lines() {
        let mut s = scanner(5);
        s.feed(Stream::Stdout, b"out-", 1);
        s.feed(Stream::Stderr, b"err\n", 1);
        s.feed(Stream::Stdout, b"line\n", 1);
        assert_eq!(s.tail(), vec!["err", "out-line"]);
    }

    #[test]
    fn tqdm_redraws() {
        let mut s = scanner(5);
        s.feed(
            Stream::Stderr,
            b"\r 10%|#         | 10/100 [00:01<00:09]\r 20%|##        | 20/100 [00:02<00:08]",
            1_000,
        );
        // The last complete redraw was offered to progress before any newline arrived.
        assert_eq!(s.progress.step, Some(10));
        s.feed(
            Stream::Stderr,
            b"\r 30%|###       | 30/100 [00:03<00:07]\n",
            2_000,
        );
        assert_eq!(s.progress.step, Some(30));
        assert_eq!(s.progress.total_steps, Some(100));
        assert_eq!(s.tail(), vec![" 30%|###       | 30/100 [00:03<00:07]"]);
    }

    #[test]
    fn crash_markers() {
        let mut s = scanner(3);
        let out = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n\
                   torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n";
        s.feed(Stream::Stderr, out.as_bytes(), 5);
        assert!(s.markers.cuda_oom.is_some());
        assert!(s.markers.traceback.is_some());
        assert!(s
            .markers
            .exception
            .as_ref()
            .unwrap()
            .line
            .starts_with("torch.OutOfMemoryError"));
        assert!(s.markers.nccl.is_none());
        s.feed(
            Stream::Stderr,
            b"[rank0]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout\n",
            6,
        );
        assert!(s.markers.nccl.is_some());
    }

    /// torchrun prefixes each rank's lines; a benign `NCCL WARN` (NCCL_DEBUG=WARN) is no NCCL
    /// error.
    #[test]
    fn prefixed_tracebacks_and_nccl_warnings() {
        let mut s = scanner(3);
        let out = "[rank0]: NCCL WARN some transport note\n\
                   [rank0]: Traceback (most recent call last):\n\
                   [rank0]:   File \"train.py\", line 3, in <module>\n\
                   [rank0]: ValueError: bad shape\n";
        s.feed(Stream::Stderr, out.as_bytes(), 5);
        assert!(s.markers.nccl.is_none());
        assert!(s.markers.traceback.is_some());
        assert_eq!(
            s.markers.exception.as_ref().map(|m| m.line.as_str()),
            Some("ValueError: bad shape")
        );
    }

    #[test]
    fn long_and_binary_lines_are_capped() {
        let mut s = scanner(1);
        s.feed(Stream::Stdout, &vec![b'x'; 100_000], 1);
        s.feed(Stream::Stdout, b"\xff\xfe\n", 1);
        assert_eq!(s.tail()[0].len(), MAX_LINE_BYTES);
    }
}
