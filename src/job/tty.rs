//! Terminal job control for `gpuwatch run`: when gpuwatch is the terminal's foreground process
//! group, the job's group becomes the foreground (so it can read stdin, and Ctrl-C / Ctrl-Z reach
//! it directly), and gpuwatch takes the terminal back when the job stops or ends. When the job is
//! stopped (Ctrl-Z), gpuwatch stops itself so the shell sees a stopped job; on `fg` it hands the
//! terminal back to the job and continues it.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

/// The controlling terminal on stdin, when gpuwatch is its foreground group.
#[derive(Debug, Clone, Copy)]
pub struct Terminal {
    our_pgrp: libc::pid_t,
}

impl Terminal {
    /// `Some` when stdin is a terminal whose foreground group is ours.
    pub fn foreground() -> Option<Terminal> {
        // SAFETY: plain queries on fd 0 and our own process.
        unsafe {
            if libc::isatty(0) != 1 {
                return None;
            }
            let pgrp = libc::getpgrp();
            (libc::tcgetpgrp(0) == pgrp).then_some(Terminal { our_pgrp: pgrp })
        }
    }

    /// Makes `pgrp` the foreground group.
    pub fn give_to(self, pgrp: libc::pid_t) {
        set_foreground(pgrp);
    }

    /// Makes gpuwatch's group the foreground group again.
    pub fn take_back(self) {
        set_foreground(self.our_pgrp);
    }

    /// Takes the terminal back when the job's group `job_pgrp` has it, or when the group that
    /// has it is gone (the job exited, or failed to exec after it was given the terminal) — not
    /// when the shell gave it to something else meanwhile (gpuwatch was put in the background
    /// and an editor is in the foreground).
    pub fn take_back_from(self, job_pgrp: libc::pid_t) {
        // SAFETY: plain queries on fd 0 and a signal-0 probe of a process group.
        let (fg, gone) = unsafe {
            let fg = libc::tcgetpgrp(0);
            let gone = fg > 0
                && libc::kill(-fg, 0) != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            (fg, gone)
        };
        if fg == job_pgrp || gone {
            self.take_back();
        }
    }
}

/// `tcsetpgrp(0, pgrp)` with SIGTTOU blocked (a background caller would otherwise be stopped).
fn set_foreground(pgrp: libc::pid_t) {
    // SAFETY: signal mask manipulation of the calling thread and tcsetpgrp on fd 0.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        libc::tcsetpgrp(0, pgrp);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Puts the command in its own process group and, when `foreground`, makes that group the
/// terminal's foreground group before it execs (no window in which it could read the terminal
/// from the background).
pub fn own_group(cmd: &mut Command, foreground: bool) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if foreground {
                let mut block: libc::sigset_t = std::mem::zeroed();
                let mut old: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut block);
                libc::sigaddset(&mut block, libc::SIGTTOU);
                libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
                libc::tcsetpgrp(0, libc::getpid());
                libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            }
            Ok(())
        });
    }
}

/// Waits for child `pid` to end, handling stops: with a terminal, a stopped job stops gpuwatch
/// too and is continued in the foreground when gpuwatch is.
pub fn wait_child(pid: u32, terminal: Option<Terminal>) -> std::io::Result<ExitStatus> {
    let pid = pid as libc::pid_t;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if libc::WIFSTOPPED(status) {
            if let Some(t) = terminal {
                t.take_back();
                // SAFETY: stop ourselves; the shell continues us with `fg` / `bg`.
                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                // Continued: if we are in the foreground again, so is the job.
                if Terminal::foreground().is_some() {
                    t.give_to(pid);
                }
                // SAFETY: continue the job's group.
                unsafe { libc::kill(-pid, libc::SIGCONT) };
            }
            continue;
        }
        if let Some(t) = terminal {
            t.take_back_from(pid);
        }
        return Ok(ExitStatus::from_raw(status));
    }
}
