//! The operating system, once: the wall clock, the thread CPU clock and names, the host name,
//! the user database, `/proc/PID/stat` and `cmdline`, durable atomic writes, and the FNV-1a hash
//! behind every fingerprint.
//!
//! The bottom layer with `model` and `values`: it imports nothing from the crate. The engine never
//! calls the clock or any I/O here; the rules' time budget reads only [`thread_cpu_ns`].

use std::io::Write;
use std::path::Path;

pub mod deadman;
pub mod output;
pub mod podresources;
pub mod watch;

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A faster clock for playing a simulated scenario (`--sim … --speed N`): from `start_ms`, time
/// runs `speed` times faster than the wall clock.
static SPEED: std::sync::OnceLock<(i64, f64)> = std::sync::OnceLock::new();

/// Makes [`now_ms`] run `speed` times faster than the wall clock from now on, for the whole
/// process (a simulated night told in minutes: sampling, rules, holds and notification timing
/// all follow it). Only the first call counts; call it at start, before any thread reads the
/// clock.
pub fn set_clock_speed(speed: f64) {
    let _ = SPEED.set((wall_ms(), speed));
}

/// How much faster than the wall clock [`now_ms`] runs (1 unless [`set_clock_speed`]).
pub fn clock_speed() -> f64 {
    SPEED.get().map_or(1.0, |(_, s)| *s)
}

/// The shortest wall-clock time between ticks a command keeps under `--speed` (a tick of eight
/// simulated GPUs takes about a millisecond of wall time, and a schedule much finer than the
/// scheduler's own granularity is not kept).
pub const MIN_WALL_TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// How long `interval` of the clock ([`now_ms`]) lasts on the wall clock: itself, or
/// `interval / speed` under `--speed` (a 1 s interval at `--speed 30` is 1/30 s: every command
/// samples at its interval in simulated time). An error naming the numbers when that is
/// shorter than [`MIN_WALL_TICK`]; `setting` names where the interval is set.
pub fn wall_interval(
    interval: std::time::Duration,
    setting: &str,
) -> Result<std::time::Duration, String> {
    let speed = clock_speed();
    if speed <= 1.0 {
        return Ok(interval.max(MIN_WALL_TICK));
    }
    let wall = interval.div_f64(speed);
    if wall >= MIN_WALL_TICK {
        return Ok(wall);
    }
    // as a setting is written: `36s`, `250ms`
    let written = |ms: u128| {
        if ms % 1000 == 0 {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    };
    let least = MIN_WALL_TICK.mul_f64(speed).as_millis();
    Err(format!(
        "at --speed {speed}, an interval of {} passes in {:.2} ms of wall time, shorter than \
         the {} ms a tick needs: set {setting} to {} or more, or use a lower --speed",
        written(interval.as_millis()),
        wall.as_secs_f64() * 1000.0,
        MIN_WALL_TICK.as_millis(),
        written(least),
    ))
}

/// The time in UTC milliseconds since the Unix epoch: the wall clock, or the faster clock of a
/// simulated scenario played with `--speed`.
pub fn now_ms() -> i64 {
    let wall = wall_ms();
    match SPEED.get() {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_precision_loss,
            reason = "milliseconds since the start, well within f64's exact range"
        )]
        Some((start, speed)) => start + ((wall - start) as f64 * speed) as i64,
        None => wall,
    }
}

/// Milliseconds on the monotonic clock (`CLOCK_MONOTONIC`, [`std::time::Instant`]) since an
/// arbitrary origin in this process, running [`clock_speed`] times faster like [`now_ms`]. For
/// waits that must last what they say (a kill's grace): a step of the wall clock (NTP, a manual
/// date change) neither cuts them short nor stretches them; time the machine spends suspended
/// does not count. Only differences of two readings mean anything.
pub fn monotonic_ms() -> i64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = ORIGIN
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis();
    let ms = i64::try_from(elapsed).unwrap_or(i64::MAX);
    match SPEED.get() {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_precision_loss,
            reason = "milliseconds since the start, well within f64's exact range"
        )]
        Some((_, speed)) => (ms as f64 * speed) as i64,
        None => ms,
    }
}

/// The monotonic clock (`CLOCK_MONOTONIC`, which `Instant` reads) in µs, from its coarse
/// variant where the kernel ticks at least every 4 ms (`HZ` ≥ 250): the time of the last
/// kernel tick, at a fraction of a fine reading's cost. The sampler stamps the start of every
/// NVML call with it (`sampler::worker`): durations measured from it are at most 4 ms too
/// long, which its split time (25 ms) and call timeouts (seconds) leave room for. With a slower
/// tick, the fine clock.
pub fn coarse_monotonic_us() -> i64 {
    static CLOCK: std::sync::OnceLock<libc::clockid_t> = std::sync::OnceLock::new();
    let clock = *CLOCK.get_or_init(|| {
        let mut res = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `res` is a valid timespec for the call to fill.
        let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) } == 0;
        if ok && res.tv_sec == 0 && res.tv_nsec <= 4_000_000 {
            libc::CLOCK_MONOTONIC_COARSE
        } else {
            libc::CLOCK_MONOTONIC
        }
    });
    // (a failed reading — never seen — falls back to the fine clock, not to 0, which would
    // make every call in progress look blocked since boot)
    clock_micros(clock).unwrap_or_else(|| monotonic_us(std::time::Instant::now()))
}

/// Clock `clock`'s reading; `None` when the kernel refuses it.
fn read_clock(clock: libc::clockid_t) -> Option<libc::timespec> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter for the call.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then_some(ts)
}

/// Clock `clock` in µs.
fn clock_micros(clock: libc::clockid_t) -> Option<i64> {
    let ts = read_clock(clock)?;
    // (`time_t` and `c_long` are i64 on the targets gpuwatch builds for: x86-64, aarch64)
    Some(
        ts.tv_sec
            .saturating_mul(1_000_000)
            .saturating_add(ts.tv_nsec / 1_000),
    )
}

/// An `Instant` and the monotonic clock's reading at that moment (µs), taken together once:
/// any `Instant` converts to the clock's µs from it (see [`monotonic_us`]).
fn anchor() -> (std::time::Instant, i64) {
    static ANCHOR: std::sync::OnceLock<(std::time::Instant, i64)> = std::sync::OnceLock::new();
    *ANCHOR.get_or_init(|| {
        (
            std::time::Instant::now(),
            // (`Instant::now` reads the same clock and cannot fail either)
            clock_micros(libc::CLOCK_MONOTONIC).unwrap_or(0),
        )
    })
}

/// `t` on the monotonic clock, in µs (as [`coarse_monotonic_us`] gives).
pub fn monotonic_us(t: std::time::Instant) -> i64 {
    let (at, us) = anchor();
    let since = |a: std::time::Instant, b: std::time::Instant| {
        i64::try_from(a.saturating_duration_since(b).as_micros()).unwrap_or(i64::MAX)
    };
    us.saturating_add(since(t, at)).saturating_sub(since(at, t))
}

/// Renames the calling thread as `top -H`, `ps -L` and `/proc/PID/task/TID/comm` show it (the
/// kernel keeps 15 bytes): for a thread whose job changes, e.g. the sampling loop and its
/// watchdog trading places. (Rust's own `thread::current().name()` keeps the name it started
/// with.)
pub fn name_thread(name: &str) {
    if let Ok(c) = std::ffi::CString::new(name) {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string (at most 16 bytes are copied) that
        // outlives the call.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, c.as_ptr(), 0, 0, 0);
        }
    }
}

/// CPU time the calling thread has used, ns (`CLOCK_THREAD_CPUTIME_ID`); 0 if unavailable.
pub fn thread_cpu_ns() -> u64 {
    let Some(ts) = read_clock(libc::CLOCK_THREAD_CPUTIME_ID) else {
        return 0;
    };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    euid() == 0
}

/// Whether `path` (not following a symbolic link) is owned by this process's user and
/// writable by no one else.
pub fn owned_private(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == euid() && m.mode() & 0o022 == 0)
}

/// A per-user base directory of the XDG spec: `$VAR` when it is an absolute path, else
/// `$HOME/UNDER_HOME` (`.config`, `.cache`, `.local/state`); `None` without either.
pub fn xdg_home(var: &str, under_home: &str) -> Option<std::path::PathBuf> {
    if let Some(x) = std::env::var_os(var).filter(|x| Path::new(x).is_absolute()) {
        return Some(x.into());
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(&h).join(under_home))
}

/// This host's name (`gethostname`), or `localhost`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success or
    // truncates, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// `f` of `uid`'s entry in the system's user database (NSS, so LDAP users work).
fn with_passwd<T>(uid: u32, f: impl FnOnce(&libc::passwd) -> Option<T>) -> Option<T> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: a zeroed passwd is a valid out-parameter for getpwuid_r.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; getpwuid_r writes at most `buf.len()` bytes
    // into `buf` and points the strings of `pwd` into it; `buf` outlives the use of `pwd`.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    f(&pwd)
}

/// The name of `uid` from the system's user database (NSS, so LDAP users work).
pub fn user_name(uid: u32) -> Option<String> {
    with_passwd(uid, |pwd| {
        if pwd.pw_name.is_null() {
            return None;
        }
        // SAFETY: pw_name points into the buffer with_passwd keeps alive for this call,
        // NUL-terminated by getpwuid_r.
        let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
        Some(name.to_string_lossy().into_owned())
    })
}

/// The primary group of `uid` from the system's user database.
pub fn user_gid(uid: u32) -> Option<u32> {
    with_passwd(uid, |pwd| Some(pwd.pw_gid))
}

/// The groups of user `name` with primary group `gid` (getgrouplist): what a login gives it.
/// `[gid]` when the database cannot tell.
pub fn user_groups(name: &str, gid: u32) -> Vec<libc::gid_t> {
    let Ok(cname) = std::ffi::CString::new(name) else {
        return vec![gid];
    };
    let mut n: libc::c_int = 64;
    for _ in 0..4 {
        let mut groups: Vec<libc::gid_t> = vec![0; usize::try_from(n).unwrap_or(64)];
        let mut count = n;
        // SAFETY: `groups` holds `count` entries; getgrouplist writes at most that many and
        // sets `count` to the number found (or needed, when it returns -1).
        let rc =
            unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(usize::try_from(count).unwrap_or(0));
            return groups;
        }
        n = count.max(n * 2);
    }
    vec![gid]
}

/// The id of group `name` from the system's group database (NSS).
pub fn group_id(name: &str) -> Option<u32> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: a zeroed group is a valid out-parameter for getgrnam_r.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; getgrnam_r writes at most `buf.len()` bytes
    // into `buf`; only the gid (a plain integer) is read afterwards.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(grp.gr_gid)
}

/// The fields of `/proc/PID/stat` gpuwatch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Parent PID.
    pub ppid: u32,
    /// Process group.
    pub pgid: u32,
    /// Start time in clock ticks since boot (field 22; identifies the process across PID
    /// reuse).
    pub start_ticks: u64,
    /// Field 52 `exit_code` (raw wait status), readable for zombies by permitted readers.
    pub exit_code: Option<i32>,
}

/// Parses a `/proc/PID/stat` line. The command (field 2) is in parentheses and may itself
/// contain spaces and parentheses, so fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state); field N is f[N - 3].
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgid: f.get(2)?.parse().ok()?,
        start_ticks: f.get(19)?.parse().ok()?,
        exit_code: f.get(49).and_then(|s| s.parse().ok()),
    })
}

/// Reads `/proc/PID/stat`.
pub fn read_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The arguments in the bytes of a `/proc/PID/cmdline` (NUL-separated); `None` when there are
/// none (kernel threads, zombies).
pub fn parse_cmdline(raw: &[u8]) -> Option<Vec<String>> {
    let args: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!args.is_empty()).then_some(args)
}

/// The command line of `pid` as arguments.
pub fn read_cmdline(pid: u32) -> Option<Vec<String>> {
    parse_cmdline(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?)
}

/// Creates `dir` and any missing parents with mode 0700 (state, outbox, audit: they hold
/// command lines, alert text and, in undelivered messages, what receivers were sent). An
/// existing directory is left as it is.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// [`create_private_dir`] for a directory of gpuwatch's own inside its state directory (`runs/`,
/// `baselines/`): one that exists with a wider mode (made by an older gpuwatch, which left them
/// 0755, or by hand) is narrowed to 0700 when this user owns it. What is inside is then out of
/// other users' reach whatever its own modes.
pub fn create_private_subdir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    create_private_dir(dir)?;
    let meta = std::fs::metadata(dir)?;
    if meta.mode() & 0o077 != 0 && meta.uid() == euid() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The real uid from the text of `/proc/PID/status` (`Uid:\treal\teffective\t…`).
pub fn parse_status_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The real uid of `pid`.
pub fn read_uid(pid: u32) -> Option<u32> {
    parse_status_uid(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// The start time (clock ticks since boot) of `pid` while it runs (not a zombie): with the pid,
/// the process's identity across PID reuse.
pub fn live_start_ticks(pid: u32) -> Option<u64> {
    read_stat(pid)
        .filter(|s| !matches!(s.state, 'Z' | 'X'))
        .map(|s| s.start_ticks)
}

/// Ends this process by `signal`, the way a shell's child ends when the signal kills it: its
/// parent's `wait` sees a death by that signal (a shell's `$?` is 128 + `signal`, Python's
/// `returncode` is `-signal`), not an exit code. Standard output and error are flushed, core
/// dumps are turned off (a core would be of this process, not of what died), the default
/// disposition is restored and the signal unblocked, then raised. Returns only when the
/// signal's default action does not end a process (`SIGCHLD`, `SIGCONT`, the stop signals): the
/// caller then exits with 128 + `signal`.
pub fn die_of_signal(signal: i32) {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: prctl, setrlimit, sigaction, pthread_sigmask and raise with valid arguments; the
    // structures are fully initialised.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(signal, &dfl, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
}

/// Every live process in process group `pgid`.
pub fn process_group(pgid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            read_stat(*pid).is_some_and(|s| s.pgid == pgid && !matches!(s.state, 'Z' | 'X'))
        })
        .collect();
    out.sort_unstable();
    out
}

/// Writes `bytes` to `path` atomically and durably: a temporary file (mode 0600) in the same
/// directory, fsync, rename over `path`, then an fsync of the directory ([`sync_dir`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent_dir(path).join(format!(".{name}.{}.tmp", std::process::id()));
    let file = (|| {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        Ok(f)
    })();
    match file {
        Ok(f) => commit_temp(&f, &tmp, path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The directory `path` is in (`.` for a bare name): where its rename is synced.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Puts the temporary file `tmp`, written through `file`, in place of `path` durably: fsync,
/// rename over `path`, then an fsync of the directory ([`sync_dir`]). When that fails `tmp` is
/// removed (a partial temp file would only take more of a full disk) and `path` is as it was.
/// The last step of [`write_atomic`] and of a streamed [`output::Output`].
pub fn commit_temp(file: &std::fs::File, tmp: &Path, path: &Path) -> std::io::Result<()> {
    if let Err(e) = file.sync_all().and_then(|()| std::fs::rename(tmp, path)) {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    sync_dir(parent_dir(path))
}

/// Fsyncs a directory so a rename or removal in it is durable. A filesystem that cannot sync
/// directories (`EINVAL`) is not an error.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::File::open(dir)?.sync_all() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

/// Whether gpuwatch can keep state in `dir`: an existing writable directory, or one that can
/// be created (its nearest existing ancestor is a writable directory). The reason when not.
pub fn usable_dir(dir: &Path) -> Result<(), String> {
    let writable = |p: &Path| {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
        unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
    };
    if dir.exists() {
        if !dir.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        if !writable(dir) {
            return Err(format!("{} is not writable", dir.display()));
        }
        return Ok(());
    }
    let mut parent = dir.parent();
    while let Some(p) = parent {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        if p.exists() {
            if !p.is_dir() {
                return Err(format!(
                    "{} cannot be created: {} is not a directory",
                    dir.display(),
                    p.display()
                ));
            }
            if !writable(p) {
                return Err(format!(
                    "{} cannot be created: {} is not writable",
                    dir.display(),
                    p.display()
                ));
            }
            return Ok(());
        }
        parent = p.parent();
    }
    Ok(())
}

/// FNV-1a 64 over `bytes`, as 16 hex digits: stable across runs, builds and platforms.
pub fn fnv1a64_hex(bytes: impl IntoIterator<Item = u8>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_parentheses_in_the_command() {
        let line = "42 (we) ird) S 1 42 42 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            (s.state, s.ppid, s.pgid, s.start_ticks),
            ('S', 1, 42, 12345)
        );
        assert_eq!(s.exit_code, None);
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        assert!(read_stat(me).is_some());
        assert!(read_cmdline(me).is_some_and(|a| !a.is_empty()));
        assert!(!hostname().is_empty());
        let a = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0 && thread_cpu_ns() >= a);
    }

    #[test]
    fn state_dir_problems_are_named() {
        let dir = tempfile::tempdir().unwrap();
        assert!(usable_dir(&dir.path().join("a/b/c")).is_ok());
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(usable_dir(&file).unwrap_err().contains("not a directory"));
        assert!(usable_dir(&file.join("state"))
            .unwrap_err()
            .contains("cannot be created"));
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a64_hex(*b""), "cbf29ce484222325");
        assert_eq!(fnv1a64_hex(*b"a"), "af63dc4c8601ec8c");
    }

    /// Issue 25 §4: a state subdirectory left 0755 is narrowed to 0700 when used again.
    #[test]
    fn a_wide_state_subdirectory_is_narrowed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("state/runs");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        create_private_subdir(&runs).unwrap();
        assert_eq!(mode(&runs), 0o700);
        std::fs::set_permissions(&runs, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_subdir(&runs).unwrap();
        assert_eq!(mode(&runs), 0o700);
    }

    #[test]
    fn state_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state/outbox");
        create_private_dir(&state).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.path().join("state")), 0o700);
        assert_eq!(mode(&state), 0o700);
        let f = state.join("n.json");
        write_atomic(&f, b"{}").unwrap();
        assert_eq!(mode(&f), 0o600);
    }

    #[test]
    fn atomic_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
