//! The kill policy: `[actions.kill]` and the pure decision whether a process may be signalled.
//!
//! [`KillPolicy::decide`] looks only at [`TargetFacts`] (gathered from `/proc` and the GPU process list by
//! [`gather_facts`]) and [`SelfFacts`]; the ladder calls it again before every step.
//! Refusals, in order: the process is gone or was replaced, its PID cannot be mapped into our
//! namespace, it is PID 1, gpuwatch itself or its parent, it is not on a GPU, its owner is unknown,
//! root (unless `allow_root`), a system account (uid < `min_uid`), a protected user or command, a
//! user not in `allow_users`, a command matching none of `allow_commands`, a PID namespace's init
//! (a container's PID 1) whose namespace holds a process any of these protect — its death kills
//! them all —, or the kill rate limit. A process group is signalled whole only when every member
//! (and the namespace of any member that is a namespace init) passes the same checks.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use serde::Deserialize;

use super::pidns::PidMapper;
use super::settings::{DurationSetting, RegexSetting};

/// `[actions.kill]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct KillSection {
    /// Only log and notify what would be done (default true).
    pub dry_run: bool,
    /// Users whose processes may be killed; `"*"` means any user who passes the other checks.
    /// Empty (the default) means nobody.
    pub allow_users: Vec<String>,
    /// Command-line regexes; when non-empty a process must match one.
    pub allow_commands: Vec<RegexSetting>,
    /// Users never touched (wins over `allow_users`).
    pub protect_users: Vec<String>,
    /// Command-line regexes never touched.
    pub protect_commands: Vec<RegexSetting>,
    /// Allow killing root's processes (default false).
    pub allow_root: bool,
    /// Lowest uid that may be killed (default 1000: system accounts are protected).
    pub min_uid: u32,
    /// Time between the warning and SIGTERM (default 5m).
    pub grace: DurationSetting,
    /// Time between SIGTERM and SIGKILL (default 30s).
    pub term_timeout: DurationSetting,
    /// Most SIGTERMs in any hour (default 10); further kills are refused.
    pub max_kills_per_hour: u32,
    /// Audit log path (default `<daemon.state_dir>/kill-audit.jsonl`).
    pub audit_log: Option<PathBuf>,
    /// Mount of the host's `/proc` when gpuwatch runs in a container.
    pub host_proc: Option<PathBuf>,
}

impl Default for KillSection {
    fn default() -> Self {
        KillSection {
            dry_run: true,
            allow_users: Vec::new(),
            allow_commands: Vec::new(),
            protect_users: Vec::new(),
            protect_commands: Vec::new(),
            allow_root: false,
            min_uid: 1000,
            grace: DurationSetting::from_ms(300_000),
            term_timeout: DurationSetting::from_ms(30_000),
            max_kills_per_hour: 10,
            audit_log: None,
            host_proc: None,
        }
    }
}

/// Everything known about a kill target at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetFacts {
    /// PID as NVML reports it.
    pub host_pid: u32,
    /// PID in our namespace, or why it could not be mapped.
    pub pid: Result<u32, String>,
    /// Whether the process exists (and is not a zombie).
    pub alive: bool,
    /// Start time in clock ticks (identity across PID reuse).
    pub start_ticks: Option<u64>,
    /// Owner uid.
    pub uid: Option<u32>,
    /// Owner name.
    pub user: Option<String>,
    /// Command line, arguments joined by spaces.
    pub command: Option<String>,
    /// Process group.
    pub pgid: Option<u32>,
    /// The GPU it is on according to the latest process list (`None`: not on a GPU).
    pub gpu: Option<u32>,
    /// When the process is PID 1 of a PID namespace below ours: the other processes its death
    /// takes with it (that namespace's and those of the namespaces nested in it), or why they
    /// could not all be read. `None`: no namespace init.
    pub namespace: Option<Result<Vec<MemberFacts>, String>>,
}

/// Who a process is, for the owner checks of a process a signal would reach besides the target.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemberFacts {
    /// PID in our namespace.
    pub pid: u32,
    /// Owner uid (`None`: unknown).
    pub uid: Option<u32>,
    /// Owner name.
    pub user: Option<String>,
    /// Command line, arguments joined by spaces.
    pub command: String,
}

impl MemberFacts {
    /// Reads them from `/proc` (`None`: the process is gone).
    pub fn read(pid: u32) -> Option<MemberFacts> {
        let uid = crate::sys::read_uid(pid)?;
        Some(MemberFacts {
            pid,
            uid: Some(uid),
            user: user_name(uid),
            command: crate::sys::read_cmdline(pid)
                .map(|a| a.join(" "))
                .unwrap_or_default(),
        })
    }
}

/// The members of the PID namespace whose init is `pid` (see [`TargetFacts::namespace`]).
pub fn namespace_facts(pid: u32) -> Option<Result<Vec<MemberFacts>, String>> {
    match super::pidns::namespace_members(pid) {
        Ok(None) => None,
        Ok(Some(pids)) => Some(Ok(pids.into_iter().filter_map(MemberFacts::read).collect())),
        Err(e) => Some(Err(e)),
    }
}

impl Default for TargetFacts {
    fn default() -> Self {
        TargetFacts {
            host_pid: 0,
            pid: Err("not looked up".into()),
            alive: false,
            start_ticks: None,
            uid: None,
            user: None,
            command: None,
            pgid: None,
            gpu: None,
            namespace: None,
        }
    }
}

impl Default for SelfFacts {
    fn default() -> Self {
        SelfFacts::current()
    }
}

/// gpuwatch's own identity, never to be signalled.
#[derive(Debug, Clone, PartialEq)]
pub struct SelfFacts {
    /// Our PID.
    pub pid: u32,
    /// Our parent's PID.
    pub ppid: u32,
    /// Our process group.
    pub pgid: u32,
    /// Our parent's process group.
    pub parent_pgid: Option<u32>,
}

impl SelfFacts {
    /// Reads them for this process.
    pub fn current() -> SelfFacts {
        let pid = std::process::id();
        let own = crate::sys::read_stat(pid);
        let ppid = own.map_or(0, |s| s.ppid);
        SelfFacts {
            pid,
            ppid,
            pgid: own.map_or(0, |s| s.pgid),
            parent_pgid: crate::sys::read_stat(ppid).map(|s| s.pgid),
        }
    }
}

/// Why the policy said no.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The process no longer exists.
    Gone,
    /// The PID now belongs to another process.
    Replaced,
    /// Its host PID cannot be mapped into gpuwatch's PID namespace.
    Unmapped(String),
    /// PID 1, gpuwatch or gpuwatch's parent.
    Protected(&'static str),
    /// Not in the current GPU process list.
    NotOnGpu,
    /// `/proc` did not say who owns it.
    UnknownOwner,
    /// Root without `allow_root`.
    Root,
    /// uid below `min_uid`.
    SystemAccount(u32),
    /// In `protect_users`.
    ProtectedUser(String),
    /// Matches a `protect_commands` pattern.
    ProtectedCommand(String),
    /// Not in `allow_users`.
    UserNotAllowed(String),
    /// Matches no `allow_commands` pattern.
    CommandNotAllowed,
    /// `max_kills_per_hour` reached.
    RateLimited(u32),
    /// PID 1 of a PID namespace: its death kills every process of the namespace, and this one
    /// there is protected.
    Namespace {
        /// The namespace's init (the target).
        init: u32,
        /// The protected member.
        member: u32,
        /// Why the member is protected.
        why: Box<Refusal>,
    },
    /// PID 1 of a PID namespace whose members could not all be read.
    NamespaceUnread(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Gone => write!(f, "the process no longer exists"),
            Refusal::Replaced => write!(f, "the PID now belongs to a different process"),
            Refusal::Unmapped(r) => write!(f, "cannot map the host PID: {r}"),
            Refusal::Protected(what) => write!(f, "never kills {what}"),
            Refusal::NotOnGpu => write!(f, "the process is not on a GPU"),
            Refusal::UnknownOwner => write!(f, "the process owner is unknown"),
            Refusal::Root => write!(
                f,
                "the process belongs to root (actions.kill.allow_root is false)"
            ),
            Refusal::SystemAccount(uid) => {
                write!(
                    f,
                    "uid {uid} is a system account (below actions.kill.min_uid)"
                )
            }
            Refusal::ProtectedUser(u) => write!(f, "user {u} is in actions.kill.protect_users"),
            Refusal::ProtectedCommand(p) => {
                write!(f, "the command matches actions.kill.protect_commands {p:?}")
            }
            Refusal::UserNotAllowed(u) => write!(f, "user {u} is not in actions.kill.allow_users"),
            Refusal::CommandNotAllowed => {
                write!(
                    f,
                    "the command matches no actions.kill.allow_commands pattern"
                )
            }
            Refusal::Namespace { init, member, why } => write!(
                f,
                "pid {init} is PID 1 of its own PID namespace (a container), and its death kills \
                 every process in it, including pid {member}: {why}"
            ),
            Refusal::NamespaceUnread(e) => write!(
                f,
                "the process is PID 1 of its own PID namespace (a container), and its death kills \
                 every process in it; {e}"
            ),
            Refusal::RateLimited(n) => {
                write!(
                    f,
                    "rate limit: {n} kills in the last hour (actions.kill.max_kills_per_hour)"
                )
            }
        }
    }
}

/// What an approved signal goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalTarget {
    /// The whole process group (`kill(-pgid)`): every member passed the policy's owner checks.
    Group(u32),
    /// Only this process (its group is shared with gpuwatch, its parent or init).
    Process(u32),
    /// Only this process: a member of its group is one the policy protects.
    ProcessOnly {
        /// The vetted process.
        pid: u32,
        /// Its process group.
        group: u32,
        /// A member the policy refused.
        protected: u32,
    },
}

impl std::fmt::Display for SignalTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignalTarget::Group(g) => write!(f, "group {g}"),
            SignalTarget::Process(p) => write!(f, "pid {p}"),
            SignalTarget::ProcessOnly {
                pid,
                group,
                protected,
            } => write!(
                f,
                "pid {pid} only (group {group} has pid {protected}, which the policy protects)"
            ),
        }
    }
}

/// The compiled policy.
#[derive(Debug, Clone)]
pub struct KillPolicy {
    /// The settings.
    pub section: KillSection,
    /// Which `[actions.kill]` this is (1 at start, +1 at every reload); in every audit record.
    pub version: u64,
    recent_kills_ms: VecDeque<i64>,
}

impl KillPolicy {
    /// A policy from its section.
    pub fn new(section: KillSection) -> KillPolicy {
        KillPolicy {
            section,
            version: 1,
            recent_kills_ms: VecDeque::new(),
        }
    }

    /// True in dry-run mode.
    pub fn dry_run(&self) -> bool {
        self.section.dry_run
    }

    /// Records a SIGTERM at `now_ms` for the rate limit.
    pub fn note_kill(&mut self, now_ms: i64) {
        self.recent_kills_ms.push_back(now_ms);
    }

    fn kills_in_last_hour(&mut self, now_ms: i64) -> u32 {
        while self
            .recent_kills_ms
            .front()
            .is_some_and(|&t| now_ms - t >= 3_600_000)
        {
            self.recent_kills_ms.pop_front();
        }
        u32::try_from(self.recent_kills_ms.len()).unwrap_or(u32::MAX)
    }

    /// Decides whether `target` may be signalled now; `expected_start` is the start time recorded
    /// when the ladder began (PID reuse guard), `counting` says whether this step counts toward
    /// the rate limit (SIGTERM does).
    pub fn decide(
        &mut self,
        target: &TargetFacts,
        me: &SelfFacts,
        expected_start: Option<u64>,
        counting: bool,
        now_ms: i64,
    ) -> Result<SignalTarget, Refusal> {
        let pid = target.pid.clone().map_err(Refusal::Unmapped)?;
        if !target.alive {
            return Err(Refusal::Gone);
        }
        if expected_start.is_some() && target.start_ticks != expected_start {
            return Err(Refusal::Replaced);
        }
        if pid <= 1 {
            return Err(Refusal::Protected("PID 1 (init)"));
        }
        if pid == me.pid {
            return Err(Refusal::Protected("gpuwatch itself"));
        }
        if pid == me.ppid {
            return Err(Refusal::Protected("gpuwatch's parent"));
        }
        if target.gpu.is_none() {
            return Err(Refusal::NotOnGpu);
        }
        if let Some(refusal) = self.owner_refusal(
            target.uid,
            target.user.as_deref(),
            target.command.as_deref().unwrap_or(""),
        ) {
            return Err(refusal);
        }
        // A namespace init is a group the kernel ends with it: every member must pass.
        match &target.namespace {
            None => {}
            Some(Err(e)) => return Err(Refusal::NamespaceUnread(e.clone())),
            Some(Ok(members)) => {
                if let Some((member, why)) = self.members_refusal(members, me) {
                    return Err(Refusal::Namespace {
                        init: pid,
                        member,
                        why: Box::new(why),
                    });
                }
            }
        }
        let s = &self.section;
        let max_kills = s.max_kills_per_hour;
        if counting {
            let n = self.kills_in_last_hour(now_ms);
            if n >= max_kills {
                return Err(Refusal::RateLimited(n));
            }
        }
        let group_is_safe = target.pgid.is_some_and(|g| {
            g > 1 && g != me.pgid && Some(g) != me.parent_pgid && g != me.pid && g != me.ppid
        });
        Ok(match target.pgid {
            Some(g) if group_is_safe => self.vet_group(g, pid, me),
            _ => SignalTarget::Process(pid),
        })
    }

    /// Why the policy protects a process with this owner and command line, if it does: root
    /// unless allowed, system accounts, protected users and commands, users and commands not
    /// allowed.
    fn owner_refusal(
        &self,
        uid: Option<u32>,
        user: Option<&str>,
        command: &str,
    ) -> Option<Refusal> {
        let Some(uid) = uid else {
            return Some(Refusal::UnknownOwner);
        };
        let s = &self.section;
        if uid == 0 {
            if !s.allow_root {
                return Some(Refusal::Root);
            }
        } else if uid < s.min_uid {
            return Some(Refusal::SystemAccount(uid));
        }
        let uid_text = uid.to_string();
        if let Some(p) = s
            .protect_users
            .iter()
            .find(|p| Some(p.as_str()) == user || **p == uid_text)
        {
            return Some(Refusal::ProtectedUser(p.clone()));
        }
        // A name that cannot be looked up (a container without the host's users, a directory
        // service outage) cannot be told apart from a protected one.
        if user.is_none() && !s.protect_users.is_empty() {
            return Some(Refusal::UnknownOwner);
        }
        let user = user.map_or(uid_text, str::to_string);
        if let Some(p) = s.protect_commands.iter().find(|p| p.0.is_match(command)) {
            return Some(Refusal::ProtectedCommand(p.as_str().to_string()));
        }
        if !s.allow_users.iter().any(|u| u == "*" || *u == user) {
            return Some(Refusal::UserNotAllowed(user));
        }
        if !s.allow_commands.is_empty() && !s.allow_commands.iter().any(|p| p.0.is_match(command)) {
            return Some(Refusal::CommandNotAllowed);
        }
        None
    }

    /// The first of `members` (processes a signal would reach besides the target) that the
    /// policy protects, and why.
    fn members_refusal(&self, members: &[MemberFacts], me: &SelfFacts) -> Option<(u32, Refusal)> {
        members.iter().find_map(|m| {
            let refusal = if m.pid == me.pid {
                Some(Refusal::Protected("gpuwatch itself"))
            } else if m.pid == me.ppid {
                Some(Refusal::Protected("gpuwatch's parent"))
            } else {
                self.owner_refusal(m.uid, m.user.as_deref(), &m.command)
            };
            refusal.map(|r| (m.pid, r))
        })
    }

    /// The whole group `g` when every member passes the owner checks (a signal to the group
    /// reaches them all, and the namespace of any member that is a PID namespace's init);
    /// otherwise only the vetted `pid`.
    fn vet_group(&self, g: u32, pid: u32, me: &SelfFacts) -> SignalTarget {
        for member in crate::sys::process_group(g) {
            if member == pid {
                continue;
            }
            // A member that exited meanwhile is no longer reached by the signal.
            let Some(facts) = MemberFacts::read(member) else {
                continue;
            };
            let refusal = self
                .owner_refusal(facts.uid, facts.user.as_deref(), &facts.command)
                .or_else(|| match namespace_facts(member) {
                    None => None,
                    Some(Err(e)) => Some(Refusal::NamespaceUnread(e)),
                    Some(Ok(members)) => {
                        self.members_refusal(&members, me)
                            .map(|(m, why)| Refusal::Namespace {
                                init: member,
                                member: m,
                                why: Box::new(why),
                            })
                    }
                });
            if let Some(refusal) = refusal {
                tracing::warn!(
                    "process group {g} of pid {pid} has pid {member} ({refusal}): signalling pid {pid} only"
                );
                return SignalTarget::ProcessOnly {
                    pid,
                    group: g,
                    protected: member,
                };
            }
        }
        SignalTarget::Group(g)
    }
}

/// Reads the facts about host PID `host_pid`; `gpu_of` maps host PIDs on a GPU to their GPU.
pub fn gather_facts(
    target: super::pidns::Pid,
    mapper: &PidMapper,
    gpu_of: &HashMap<u32, u32>,
) -> TargetFacts {
    // A watched job's PID is ours already; its GPU is found under its host PID.
    let (pid, host_pid) = match target {
        super::pidns::Pid::Host(h) => (mapper.map(h), Some(h)),
        super::pidns::Pid::Local(l) => (Ok(l), mapper.host_of(l)),
    };
    let mut facts = TargetFacts {
        host_pid: host_pid.unwrap_or(target.number()),
        pid: pid.clone(),
        gpu: host_pid.and_then(|h| gpu_of.get(&h).copied()),
        ..TargetFacts::default()
    };
    let Ok(pid) = pid else {
        return facts;
    };
    if let Some(st) = crate::sys::read_stat(pid) {
        facts.alive = !matches!(st.state, 'Z' | 'X');
        facts.start_ticks = Some(st.start_ticks);
        facts.pgid = Some(st.pgid);
    }
    facts.uid = crate::sys::read_uid(pid);
    facts.user = facts.uid.and_then(user_name);
    facts.command = crate::sys::read_cmdline(pid).map(|a| a.join(" "));
    if facts.alive {
        facts.namespace = namespace_facts(pid);
    }
    facts
}

pub use crate::sys::user_name;

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> SelfFacts {
        SelfFacts {
            pid: 100,
            ppid: 99,
            pgid: 99,
            parent_pgid: Some(98),
        }
    }

    fn target() -> TargetFacts {
        TargetFacts {
            host_pid: 5000,
            pid: Ok(5000),
            alive: true,
            start_ticks: Some(7),
            uid: Some(1001),
            user: Some("alice".into()),
            command: Some("python train.py --lr 3e-4".into()),
            pgid: Some(5000),
            gpu: Some(0),
            namespace: None,
        }
    }

    fn policy(f: impl FnOnce(&mut KillSection)) -> KillPolicy {
        let mut s = KillSection {
            allow_users: vec!["alice".into()],
            ..KillSection::default()
        };
        f(&mut s);
        KillPolicy::new(s)
    }

    fn decide(p: &mut KillPolicy, t: &TargetFacts) -> Result<SignalTarget, Refusal> {
        p.decide(t, &me(), Some(7), true, 0)
    }

    /// A protected user is protected by name or uid, and an owner whose name cannot be looked
    /// up is not killed while any user is protected.
    #[test]
    fn protected_users_hold_without_a_name() {
        let policy = KillPolicy::new(KillSection {
            allow_users: vec!["*".into()],
            protect_users: vec!["bob".into(), "4242".into()],
            ..KillSection::default()
        });
        let refusal = |uid, user| policy.owner_refusal(Some(uid), user, "python train.py");
        assert_eq!(refusal(2000, Some("alice")), None);
        assert!(matches!(
            refusal(2001, Some("bob")),
            Some(Refusal::ProtectedUser(_))
        ));
        assert!(matches!(
            refusal(4242, None),
            Some(Refusal::ProtectedUser(_))
        ));
        assert_eq!(refusal(2002, None), Some(Refusal::UnknownOwner));
        let open = KillPolicy::new(KillSection {
            allow_users: vec!["*".into()],
            ..KillSection::default()
        });
        assert_eq!(open.owner_refusal(Some(2002), None, "python"), None);
    }

    #[test]
    fn defaults_are_safe() {
        let s = KillSection::default();
        assert!(s.dry_run);
        assert!(!s.allow_root);
        assert_eq!(s.min_uid, 1000);
        // Nobody is allowed until allow_users says so.
        let mut p = KillPolicy::new(s);
        assert_eq!(
            decide(&mut p, &target()),
            Err(Refusal::UserNotAllowed("alice".into()))
        );
    }

    #[test]
    fn allowed_target_gets_its_group() {
        let mut p = policy(|_| {});
        assert_eq!(decide(&mut p, &target()), Ok(SignalTarget::Group(5000)));
        let mut p = policy(|s| s.allow_users = vec!["*".into()]);
        assert_eq!(decide(&mut p, &target()), Ok(SignalTarget::Group(5000)));
    }

    /// A container's PID 1 takes its whole namespace with it: every member must pass, a
    /// member that cannot be read refuses too.
    #[test]
    fn a_namespace_init_is_killed_only_when_every_member_may_be() {
        let mut p = policy(|_| {});
        let member = |pid, uid, user: &str| MemberFacts {
            pid,
            uid: Some(uid),
            user: Some(user.into()),
            command: "python worker.py".into(),
        };
        let mut t = target();
        t.namespace = Some(Ok(vec![member(5001, 1001, "alice")]));
        assert_eq!(decide(&mut p, &t), Ok(SignalTarget::Group(5000)));
        t.namespace = Some(Ok(vec![
            member(5001, 1001, "alice"),
            member(5002, 0, "root"),
        ]));
        let refusal = decide(&mut p, &t).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::Namespace {
                init: 5000,
                member: 5002,
                why: Box::new(Refusal::Root)
            }
        );
        assert!(
            refusal.to_string().contains("including pid 5002"),
            "{refusal}"
        );
        t.namespace = Some(Ok(vec![member(100, 1001, "alice")]));
        assert!(matches!(
            decide(&mut p, &t),
            Err(Refusal::Namespace { member: 100, .. })
        ));
        t.namespace = Some(Err("cannot read pid 5003".into()));
        assert_eq!(
            decide(&mut p, &t),
            Err(Refusal::NamespaceUnread("cannot read pid 5003".into()))
        );
    }

    #[test]
    fn shared_group_signals_only_the_process() {
        let mut p = policy(|_| {});
        let mut t = target();
        t.pgid = Some(99); // gpuwatch's own group
        assert_eq!(decide(&mut p, &t), Ok(SignalTarget::Process(5000)));
        t.pgid = Some(98); // the parent's group
        assert_eq!(decide(&mut p, &t), Ok(SignalTarget::Process(5000)));
    }

    #[test]
    fn refusals() {
        let mut p = policy(|s| {
            s.protect_users = vec!["bob".into()];
            s.protect_commands = vec![RegexSetting::new("jupyter").unwrap()];
            s.allow_users.push("bob".into());
            s.allow_users.push("carol".into());
        });
        type Edit = Box<dyn Fn(&mut TargetFacts)>;
        let cases: Vec<(Edit, Refusal)> = vec![
            (Box::new(|t| t.alive = false), Refusal::Gone),
            (Box::new(|t| t.start_ticks = Some(8)), Refusal::Replaced),
            (
                Box::new(|t| t.pid = Err("ns".into())),
                Refusal::Unmapped("ns".into()),
            ),
            (
                Box::new(|t| t.pid = Ok(1)),
                Refusal::Protected("PID 1 (init)"),
            ),
            (
                Box::new(|t| t.pid = Ok(100)),
                Refusal::Protected("gpuwatch itself"),
            ),
            (
                Box::new(|t| t.pid = Ok(99)),
                Refusal::Protected("gpuwatch's parent"),
            ),
            (Box::new(|t| t.gpu = None), Refusal::NotOnGpu),
            (Box::new(|t| t.uid = None), Refusal::UnknownOwner),
            (Box::new(|t| t.uid = Some(0)), Refusal::Root),
            (Box::new(|t| t.uid = Some(999)), Refusal::SystemAccount(999)),
            (
                Box::new(|t| t.user = Some("bob".into())),
                Refusal::ProtectedUser("bob".into()),
            ),
            (
                Box::new(|t| t.command = Some("jupyter lab".into())),
                Refusal::ProtectedCommand("jupyter".into()),
            ),
            (
                Box::new(|t| t.user = Some("dave".into())),
                Refusal::UserNotAllowed("dave".into()),
            ),
        ];
        for (edit, want) in cases {
            let mut t = target();
            edit(&mut t);
            assert_eq!(decide(&mut p, &t), Err(want.clone()), "{want}");
        }
    }

    #[test]
    fn root_and_commands_when_allowed() {
        let mut p = policy(|s| {
            s.allow_root = true;
            s.allow_users = vec!["root".into()];
            s.allow_commands = vec![RegexSetting::new(r"^python\b").unwrap()];
        });
        let mut t = target();
        t.uid = Some(0);
        t.user = Some("root".into());
        assert!(decide(&mut p, &t).is_ok());
        t.command = Some("bash run.sh".into());
        assert_eq!(decide(&mut p, &t), Err(Refusal::CommandNotAllowed));
    }

    #[test]
    fn rate_limit() {
        let mut p = policy(|s| s.max_kills_per_hour = 2);
        p.note_kill(0);
        p.note_kill(1000);
        assert_eq!(
            p.decide(&target(), &me(), Some(7), true, 2000),
            Err(Refusal::RateLimited(2))
        );
        // Warnings do not count; an hour later the window is empty again.
        assert!(p.decide(&target(), &me(), Some(7), false, 2000).is_ok());
        assert!(p.decide(&target(), &me(), Some(7), true, 3_601_001).is_ok());
    }

    /// Inside a container with `actions.kill.host_proc`, a job `run` watches is known by its
    /// own (local) PID: it is not mapped as a host PID, and its GPU is found under its host PID.
    #[test]
    fn a_local_job_pid_is_not_mapped_as_a_host_pid() {
        use super::super::pidns::Pid;
        let me = std::process::id();
        let start = crate::sys::read_stat(me).unwrap().start_ticks;
        // The host's /proc as a container sees it: we are host PID 9999 at depth 1.
        let host = tempfile::tempdir().unwrap();
        let entry = host.path().join("9999");
        std::fs::create_dir_all(entry.join("ns")).unwrap();
        std::fs::write(
            entry.join("status"),
            format!("Name:\tpython\nNSpid:\t9999\t{me}\n"),
        )
        .unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
        std::fs::write(entry.join("stat"), stat).unwrap();
        std::os::unix::fs::symlink("/proc/self/ns/pid", entry.join("ns/pid")).unwrap();
        let mapper = PidMapper::HostProc {
            root: host.path().to_path_buf(),
            depth: 1,
        };
        assert_eq!(mapper.host_of(me), Some(9999));
        let gpu_of = HashMap::from([(9999, 3)]);
        let f = gather_facts(Pid::Local(me), &mapper, &gpu_of);
        assert_eq!(f.pid, Ok(me));
        assert_eq!(f.host_pid, 9999);
        assert_eq!(f.gpu, Some(3));
        assert_eq!(f.start_ticks, Some(start));
        // Taken for a host PID it is unknown to the host's /proc.
        assert!(gather_facts(Pid::Host(me), &mapper, &gpu_of).pid.is_err());
    }

    #[test]
    fn facts_of_a_real_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let gpu_of = HashMap::from([(pid, 0)]);
        let f = gather_facts(
            super::super::pidns::Pid::Host(pid),
            &PidMapper::Identity,
            &gpu_of,
        );
        assert!(f.alive);
        assert_eq!(f.uid, Some(unsafe { libc::getuid() }));
        assert_eq!(f.command.as_deref(), Some("sleep 5"));
        assert_eq!(f.gpu, Some(0));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            !gather_facts(
                super::super::pidns::Pid::Host(pid),
                &PidMapper::Identity,
                &gpu_of
            )
            .alive
        );
    }
}
