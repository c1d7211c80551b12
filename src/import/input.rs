//! Bytes to lines: whatever encoding and compression a log arrived in. gzip (by its magic bytes,
//! so a `.gz` renamed to `.log` still reads), UTF-16 with a byte-order mark (what PowerShell's `>`
//! writes), a UTF-8 byte-order mark, CRLF line ends. A line that is not valid UTF-8 is read with
//! the bad bytes replaced (its cells then fail to parse and the line is skipped, not the file);
//! a line longer than [`MAX_LINE`] is cut there and reported as such, so a file without line
//! breaks never fills memory.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use anyhow::Context as _;

/// The longest line kept: a longer one (a binary file, a log that lost its newlines) is read in
/// pieces, each a malformed line.
pub const MAX_LINE: usize = 1 << 20;

/// The text encoding found at the start of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// UTF-8 (with or without a byte-order mark).
    Utf8,
    /// UTF-16, little-endian (`FF FE`).
    Utf16Le,
    /// UTF-16, big-endian (`FE FF`).
    Utf16Be,
}

/// One file's lines, in order, with their 1-based numbers.
pub struct Lines {
    input: Box<dyn BufRead + Send>,
    buf: Vec<u8>,
    line_no: usize,
    /// Whether the file was gzip-compressed.
    pub gzip: bool,
    /// The text encoding.
    pub encoding: Encoding,
    /// The previous read stopped at [`MAX_LINE`] inside a line.
    cut: bool,
}

/// What [`Lines::next_line`] read.
pub enum Line<'a> {
    /// A line (without its line end).
    Text(&'a str),
    /// A piece of a line longer than [`MAX_LINE`].
    TooLong,
}

impl Lines {
    /// Opens `path`, looking through gzip and byte-order marks.
    pub fn open(path: &Path) -> anyhow::Result<Lines> {
        let f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Lines::from_reader(Box::new(f)).with_context(|| format!("cannot read {}", path.display()))
    }

    /// Reads from any byte stream (a file, standard input, a test buffer).
    pub fn from_reader(raw: Box<dyn Read + Send>) -> std::io::Result<Lines> {
        let mut raw = BufReader::with_capacity(256 * 1024, raw);
        let gzip = raw.fill_buf()?.starts_with(&[0x1f, 0x8b]);
        let mut text: Box<dyn BufRead + Send> = if gzip {
            Box::new(BufReader::with_capacity(
                256 * 1024,
                flate2::read::MultiGzDecoder::new(raw),
            ))
        } else {
            Box::new(raw)
        };
        let head = text.fill_buf()?;
        let encoding = if head.starts_with(&[0xff, 0xfe]) {
            Encoding::Utf16Le
        } else if head.starts_with(&[0xfe, 0xff]) {
            Encoding::Utf16Be
        } else {
            Encoding::Utf8
        };
        if head.starts_with(&[0xef, 0xbb, 0xbf]) {
            text.consume(3);
        }
        let input: Box<dyn BufRead + Send> = match encoding {
            Encoding::Utf8 => text,
            e => {
                text.consume(2);
                Box::new(BufReader::with_capacity(
                    64 * 1024,
                    Utf16ToUtf8 {
                        inner: text,
                        big_endian: e == Encoding::Utf16Be,
                        pending: Vec::new(),
                    },
                ))
            }
        };
        Ok(Lines {
            input,
            buf: Vec::with_capacity(4096),
            line_no: 0,
            gzip,
            encoding,
            cut: false,
        })
    }

    /// The number of the line last read (1-based; 0 before the first).
    pub fn line_no(&self) -> usize {
        self.line_no
    }

    /// Reads the next line and its number; `None` at the end of the file. An I/O error (a truncated gzip
    /// stream, a failing disk) is returned as such: the caller decides whether it ends the read.
    pub fn next_line(&mut self) -> std::io::Result<Option<(usize, Line<'_>)>> {
        self.buf.clear();
        let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX);
        let n = self
            .input
            .by_ref()
            .take(limit)
            .read_until(b'\n', &mut self.buf)?;
        if n == 0 {
            return Ok(None);
        }
        // A line cut at MAX_LINE goes on in the next read, under the same number.
        let tail = self.cut;
        if !tail {
            self.line_no += 1;
        }
        let ended = self.buf.last() == Some(&b'\n');
        self.cut = !ended && self.buf.len() >= MAX_LINE;
        if self.cut || tail {
            return Ok(Some((self.line_no, Line::TooLong)));
        }
        if ended {
            self.buf.pop();
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
        }
        if std::str::from_utf8(&self.buf).is_err() {
            let fixed = String::from_utf8_lossy(&self.buf).into_owned();
            self.buf = fixed.into_bytes();
        }
        // Valid UTF-8 now (checked or replaced above): the second check is the price of no
        // `unsafe`, and cheap next to parsing.
        Ok(Some((
            self.line_no,
            Line::Text(std::str::from_utf8(&self.buf).unwrap_or_default()),
        )))
    }
}

/// Transcodes a UTF-16 byte stream to UTF-8 (unpaired surrogates become U+FFFD).
struct Utf16ToUtf8<R> {
    inner: R,
    big_endian: bool,
    /// UTF-8 bytes decoded but not yet handed out.
    pending: Vec<u8>,
}

impl<R: BufRead> Read for Utf16ToUtf8<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() {
            let chunk = self.inner.fill_buf()?;
            if chunk.is_empty() {
                return Ok(0);
            }
            // Whole code units only; keep a high surrogate with its partner when the chunk ends
            // between them (decode_utf16 would otherwise call it unpaired).
            let mut take = chunk.len() & !1;
            if take == 0 {
                // One odd byte before the end: read on (or drop it at the end of the file).
                let mut two = [0u8; 2];
                let n = self.inner.read(&mut two[..1])?;
                if n == 0 {
                    return Ok(0);
                }
                let more = self.inner.read(&mut two[1..])?;
                if more == 0 {
                    return Ok(0);
                }
                self.decode(&two);
                continue;
            }
            let last = if self.big_endian {
                u16::from_be_bytes([chunk[take - 2], chunk[take - 1]])
            } else {
                u16::from_le_bytes([chunk[take - 2], chunk[take - 1]])
            };
            if (0xd800..0xdc00).contains(&last) && take > 2 {
                take -= 2;
            }
            let units = chunk[..take].to_vec();
            self.inner.consume(take);
            self.decode(&units);
        }
        let n = out.len().min(self.pending.len());
        out[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
}

impl<R> Utf16ToUtf8<R> {
    fn decode(&mut self, bytes: &[u8]) {
        let big = self.big_endian;
        let units = bytes.chunks_exact(2).map(|b| {
            if big {
                u16::from_be_bytes([b[0], b[1]])
            } else {
                u16::from_le_bytes([b[0], b[1]])
            }
        });
        let mut tmp = [0u8; 4];
        for c in char::decode_utf16(units) {
            let c = c.unwrap_or(char::REPLACEMENT_CHARACTER);
            self.pending
                .extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(bytes: Vec<u8>) -> (Vec<String>, Encoding, bool) {
        let mut l = Lines::from_reader(Box::new(std::io::Cursor::new(bytes))).unwrap();
        let mut out = Vec::new();
        while let Some((_, line)) = l.next_line().unwrap() {
            out.push(match line {
                Line::Text(t) => t.to_string(),
                Line::TooLong => "<too long>".into(),
            });
        }
        (out, l.encoding, l.gzip)
    }

    #[test]
    fn utf16_crlf_and_bom() {
        let text = "timestamp, index\r\n2024/05/01 10:00:00.000, 0 °C\r\n";
        let le: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain(text.encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let (lines, enc, _) = lines_of(le);
        assert_eq!(enc, Encoding::Utf16Le);
        assert_eq!(lines, ["timestamp, index", "2024/05/01 10:00:00.000, 0 °C"]);
        let be: Vec<u8> = [0xfe, 0xff]
            .into_iter()
            .chain(text.encode_utf16().flat_map(u16::to_be_bytes))
            .collect();
        assert_eq!(lines_of(be).0, lines);
        let bom: Vec<u8> = [0xef, 0xbb, 0xbf].into_iter().chain(text.bytes()).collect();
        assert_eq!(lines_of(bom).0, lines);
    }

    #[test]
    fn gzip_by_magic_and_long_lines_cut() {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"a\nb\n").unwrap();
        let (lines, _, gzip) = lines_of(gz.finish().unwrap());
        assert!(gzip);
        assert_eq!(lines, ["a", "b"]);
        let mut long = b"x\n".to_vec();
        long.extend(std::iter::repeat_n(b'7', MAX_LINE + 10));
        long.extend(b"\ny\n");
        let mut l = Lines::from_reader(Box::new(std::io::Cursor::new(long))).unwrap();
        let mut seen = Vec::new();
        while let Some((no, line)) = l.next_line().unwrap() {
            let what = match line {
                Line::Text(t) => t.to_string(),
                Line::TooLong => "<too long>".into(),
            };
            seen.push((no, what));
        }
        assert_eq!(
            seen,
            [
                (1, "x".to_string()),
                (2, "<too long>".into()),
                (2, "<too long>".into()),
                (3, "y".into())
            ]
        );
    }

    #[test]
    fn bad_utf8_is_replaced_not_fatal() {
        let (lines, _, _) = lines_of(b"ok\n5\xe9 C\nnext\n".to_vec());
        assert_eq!(lines, ["ok", "5\u{fffd} C", "next"]);
    }
}
