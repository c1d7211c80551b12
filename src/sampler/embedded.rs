//! The simulated NVML library (`nvml-sim`) carried inside the executable (release builds; see
//! `build.rs`), so `--sim` works from any install — `cargo install`, the wheel, the .deb — with
//! no second file beside the executable. It is written to an anonymous memory file
//! (`memfd_create`) and loaded from there like any library: the real loader, the real symbol
//! table, the same path through nvml-wrapper as a driver's library.

use std::path::PathBuf;

#[cfg(gpuwatch_embedded_sim)]
static LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libnvml_sim.so"));
#[cfg(not(gpuwatch_embedded_sim))]
static LIBRARY: &[u8] = &[];

/// Whether this build carries the simulated library.
pub fn is_embedded() -> bool {
    !LIBRARY.is_empty()
}

/// A path the embedded library can be loaded from (`/proc/self/fd/N` of a memory file made
/// once per process and kept open); `None` when this build carries none.
pub fn path() -> std::io::Result<Option<PathBuf>> {
    static MADE: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    if !is_embedded() {
        return Ok(None);
    }
    MADE.get_or_init(|| write_memfd().map_err(|e| e.to_string()))
        .clone()
        .map(Some)
        .map_err(std::io::Error::other)
}

fn write_memfd() -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::fd::{FromRawFd as _, IntoRawFd as _};
    // SAFETY: a NUL-terminated name and flags; returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"libnvml_sim.so".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned to us and is owned by nothing else.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(LIBRARY)?;
    // Kept open for the life of the process (the loader may map it again).
    let fd = file.into_raw_fd();
    Ok(PathBuf::from(format!("/proc/self/fd/{fd}")))
}
