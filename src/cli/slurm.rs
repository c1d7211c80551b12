//! `gpuwatch slurm prolog`: Slurm's `Prolog` (run by slurmd as root before a job starts on the
//! node) checks the job's GPUs with `doctor`'s checks and refuses the job when one is unfit.
//!
//! The job's GPUs are `SLURM_JOB_GPUS` (the indices Slurm allocated, as in gres.conf's
//! `/dev/nvidiaN`: NVML's order on a standard install), else `CUDA_VISIBLE_DEVICES`. A job
//! without GPUs passes without NVML being opened. A finding about one of its GPUs that makes a
//! node unfit (see [`super::doctor::unfit`]; a missing GPU counts for every GPU job, since the
//! indices then shift) refuses it: the node is drained with the finding as the reason
//! (`gpuwatch: prolog job N …`, unless someone else drained it) and the exit code is 1, on which
//! Slurm requeues the job elsewhere. Exit 0 otherwise.
//!
//! `gpuwatch slurm epilog` (Slurm's `Epilog`, after a job ended on the node) writes the job's
//! GPU summary: the run report (utilization, memory peak, energy, diagnosis, alerts) of its span
//! on its GPUs, from the daemon's recording (`[recording]`). The GPUs are `SLURM_JOB_GPUS`,
//! `CUDA_VISIBLE_DEVICES`, else those its processes were seen on (`state_dir/slurm-jobs.json`,
//! from their cgroups); the span starts at the job's `StartTime` (`scontrol show job`). The
//! summary is kept in `state_dir/jobs/JOBID.json` (`gpuwatch job JOBID` prints it) and written
//! to `gpuwatch-job-JOBID.txt` in the job's working directory as the job's user (`--to
//! work-dir`), or as compact JSON into the accounting database's AdminComment (`--to
//! admin-comment`). It always exits 0: a failing epilog drains the node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::report::batch::JobSummary;

use super::GlobalArgs;

/// Arguments of `slurm`.
#[derive(Debug, clap::Args)]
pub struct SlurmArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: SlurmAction,
}

/// `slurm` actions.
#[derive(Debug, clap::Subcommand)]
pub enum SlurmAction {
    /// As Slurm's Prolog: refuse the job (exit 1, node drained with the reason) when one of its
    /// GPUs is unfit.
    Prolog(PrologArgs),
    /// As Slurm's Epilog: the job's GPU summary (utilization, memory peak, energy, diagnosis)
    /// from the daemon's recording, into state_dir/jobs/, the job's working directory and its
    /// AdminComment. Always exits 0 (a failing epilog drains the node).
    Epilog(EpilogArgs),
    /// (internal) Standard input into a regular file: what the epilog runs as the job's user.
    #[command(hide = true)]
    WriteFile {
        /// The file.
        path: PathBuf,
    },
}

/// Where `slurm epilog` writes the summary besides `state_dir/jobs/JOBID.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EpilogTo {
    /// `gpuwatch-job-JOBID.txt` in the job's working directory, written as the job's user.
    WorkDir,
    /// The job's `AdminComment` in Slurm's accounting database (needs slurmdbd): one line of
    /// JSON, at most 1000 bytes (`sacct -j JOBID -o AdminComment%1000`).
    AdminComment,
    /// Neither.
    None,
}

/// Arguments of `slurm epilog`.
#[derive(Debug, clap::Args)]
pub struct EpilogArgs {
    /// Configuration file: `[recording]` (where the daemon records), `[actions.drain]`
    /// (scontrol), the state directory.
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where the summary goes (repeatable) besides state_dir/jobs/JOBID.json.
    #[arg(long = "to", value_enum, default_values_t = [EpilogTo::WorkDir])]
    pub to: Vec<EpilogTo>,
    /// Also mail the summary to the job's user, `$SLURM_JOB_USER@DOMAIN`, through every e-mail
    /// channel of the config (its server and sender).
    #[arg(long, value_name = "DOMAIN")]
    pub mail_domain: Option<String>,
    /// Print the summary; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// (internal) Make and save the summary, print it as JSON: what the epilog runs as the
    /// state directory's owner.
    #[arg(long, hide = true)]
    pub summary_only: bool,
}

/// Arguments of `job`.
#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// The Slurm job id.
    #[arg(value_name = "JOBID")]
    pub job: String,
    /// Configuration file (the state directory, the recording).
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `slurm prolog`.
#[derive(Debug, clap::Args)]
pub struct PrologArgs {
    /// Configuration file: `[actions.drain]` (node name, scontrol) and the expected GPUs.
    #[arg(long, value_name = "FILE", env = "GPUWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Say what would be done; drain nothing (the exit code is the same).
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `slurm`.
pub fn slurm(global: &GlobalArgs, args: &SlurmArgs) -> anyhow::Result<i32> {
    match &args.action {
        // gpuwatch's own fault (a panic included) never fails a job nor drains the node
        SlurmAction::Prolog(a) => {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prolog(global, a))) {
                Ok(r) => r,
                Err(_) => {
                    eprintln!("gpuwatch: the prolog failed (a bug in gpuwatch); the job goes on");
                    Ok(0)
                }
            }
        }
        SlurmAction::Epilog(a) => {
            let job = std::env::var("SLURM_JOB_ID").unwrap_or_default();
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| epilog(a, &job)));
            let ok = matches!(run, Ok(Ok(())));
            match run {
                Ok(Ok(())) => {}
                // (on stderr: slurmd logs it; the exit stays 0)
                Ok(Err(e)) => eprintln!("gpuwatch: no GPU summary for job {job}: {e:#}"),
                Err(_) => eprintln!("gpuwatch: no GPU summary for job {job}: a bug in gpuwatch"),
            }
            if a.summary_only && !ok {
                return Ok(1);
            }
            Ok(0)
        }
        SlurmAction::WriteFile { path } => {
            write_file(path)?;
            Ok(0)
        }
    }
}

/// The job's GPU indices from `SLURM_JOB_GPUS`, else `CUDA_VISIBLE_DEVICES` (plain indices
/// only; UUIDs and MIG names are matched by `doctor` itself).
fn job_gpus(slurm: Option<&str>, cuda: Option<&str>) -> Option<Vec<u32>> {
    let list = slurm.or(cuda)?.trim();
    if list.is_empty() {
        return None;
    }
    Some(
        list.split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
    )
}

fn prolog(global: &GlobalArgs, a: &PrologArgs) -> anyhow::Result<i32> {
    use crate::action::drain::{prolog_reason, reason_line, PROLOG_REASON};
    let job = std::env::var("SLURM_JOB_ID").unwrap_or_else(|_| "?".into());
    let Some(gpus) = job_gpus(
        std::env::var("SLURM_JOB_GPUS").ok().as_deref(),
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    ) else {
        return Ok(0);
    };
    // gpuwatch's own config mistake must not take the node out (a failing prolog drains it)
    let config = match super::doctor::load_config(a.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpuwatch: job {job} not checked: {e:#}");
            return Ok(0);
        }
    };
    let hand = super::doctor::SlurmHand::new(global, config.as_ref(), a.dry_run);
    let findings = match super::doctor::examine_with(global, config.as_ref()) {
        Ok(f) => f,
        Err(crate::sampler::SamplerError::NoDriver { .. }) => {
            eprintln!(
                "gpuwatch: job {job} asks for GPUs {gpus:?}, but this node has no NVIDIA driver"
            );
            return Ok(0);
        }
        Err(e) => {
            let why = format!("NVML does not start: {e}");
            eprintln!("gpuwatch: job {job} refused: {why}");
            hand.drain(
                &reason_line(&format!("{PROLOG_REASON} job {job} {why}")),
                prolog_reason,
            );
            return Ok(1);
        }
    };
    let refusing: Vec<_> = findings
        .iter()
        .filter(|f| super::doctor::unfit(f) && f.gpu.is_none_or(|g| gpus.contains(&g)))
        .collect();
    let Some(first) = refusing.first() else {
        return Ok(0);
    };
    // (on stderr: slurmd logs it)
    eprintln!("gpuwatch: job {job} refused: {}", first.line());
    hand.drain(
        &super::doctor::unfit_reason(&format!("{PROLOG_REASON} job {job}"), &refusing),
        prolog_reason,
    );
    Ok(1)
}

/// The longest `AdminComment` the epilog writes.
const ADMIN_COMMENT_BYTES: usize = 1000;

/// How long the summary (reading the recording) may take, and writing one file as the user.
const SUMMARY_LIMIT: Duration = Duration::from_secs(60);
const WRITE_LIMIT: Duration = Duration::from_secs(10);

/// The directory of the saved summaries in a state directory.
fn jobs_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("jobs")
}

/// A Slurm job id as the scheduler gives it to prologs and epilogs (`SLURM_JOB_ID`: the raw
/// numeric id, also for array tasks and het job components): digits only, so it is a file
/// name too.
fn job_id_ok(job: &str) -> bool {
    !job.is_empty() && job.len() <= 20 && job.bytes().all(|b| b.is_ascii_digit())
}

/// The variables of the epilog's environment (empty ones as absent).
fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// `slurm epilog`. Root (slurmd) never reads or writes in a directory another user controls:
/// the summary is made, and saved in the state directory, by a child running as the state
/// directory's owner (`--summary-only`, the daemon's user); the work-directory copy is written
/// by a child running as the job's user. Both are held to a time limit.
fn epilog(a: &EpilogArgs, job: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    anyhow::ensure!(job_id_ok(job), "SLURM_JOB_ID {job:?} is not a job id");
    let config = super::doctor::load_config(a.config.as_deref())?
        .unwrap_or_else(crate::config::Config::builtin);
    if a.summary_only {
        let summary = summary_of(&config, job)?;
        if let Some(s) = &summary {
            save_summary(&config, s)?;
        }
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let summary = if root && !a.dry_run {
        let state = config.state_dir();
        let owner = std::fs::metadata(&state)
            .with_context(|| format!("the state directory {}", state.display()))?;
        use std::os::unix::fs::MetadataExt as _;
        let mut cmd = Command::new(std::env::current_exe().context("gpuwatch's own path")?);
        cmd.args(["slurm", "epilog", "--summary-only"]);
        if let Some(c) = &a.config {
            cmd.arg("--config").arg(std::path::absolute(c)?);
        }
        let out = run_as(
            cmd,
            Identity::of(owner.uid(), owner.gid()),
            &[],
            SUMMARY_LIMIT,
        )
        .map_err(|e| anyhow::anyhow!("the summary (as uid {}): {e}", owner.uid()))?;
        serde_json::from_slice::<Option<JobSummary>>(&out).context("the summary's answer")?
    } else {
        let s = summary_of(&config, job)?;
        if let (Some(s), false) = (&s, a.dry_run) {
            save_summary(&config, s)?;
        }
        s
    };
    // a job without GPUs gets no GPU summary
    let Some(summary) = summary else {
        return Ok(());
    };
    if a.dry_run {
        print!("{}", summary.text());
        println!("AdminComment: {}", admin_comment(&summary));
        return Ok(());
    }
    let nodes: u32 = env("SLURM_JOB_NUM_NODES")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    for to in &a.to {
        match to {
            EpilogTo::WorkDir => {
                // a job without numbers leaves nothing in the user's directory
                if summary.run.is_none() {
                    continue;
                }
                if let Err(e) = to_work_dir(&config, &summary, nodes) {
                    eprintln!("gpuwatch: job {job}: {e}");
                }
            }
            EpilogTo::AdminComment => {
                if nodes > 1 {
                    eprintln!(
                        "gpuwatch: job {job}: on {nodes} nodes: no AdminComment (one node's summary would replace another's)"
                    );
                    continue;
                }
                // an array task is named by its array's id and its index: the array's own id
                // would select every task
                let id = match (env("SLURM_ARRAY_JOB_ID"), env("SLURM_ARRAY_TASK_ID")) {
                    (Some(array), Some(task)) => format!("{array}_{task}"),
                    _ => job.to_string(),
                };
                let line = admin_comment(&summary);
                let drain = &config.actions.drain;
                if let Err(e) = crate::action::drain::set_admin_comment(drain, &id, &line) {
                    eprintln!("gpuwatch: job {job}: AdminComment: {e}");
                }
            }
            EpilogTo::None => {}
        }
    }
    if let (Some(domain), Some(_)) = (&a.mail_domain, &summary.run) {
        if let Err(e) = mail_user(&config, &summary, domain) {
            eprintln!("gpuwatch: job {job}: mail: {e}");
        }
    }
    Ok(())
}

/// Mails the summary to `$SLURM_JOB_USER@domain` through each e-mail channel of `config`.
fn mail_user(
    config: &crate::config::Config,
    summary: &JobSummary,
    domain: &str,
) -> anyhow::Result<()> {
    let user = env("SLURM_JOB_USER").ok_or_else(|| anyhow::anyhow!("no SLURM_JOB_USER"))?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'+'))
    };
    anyhow::ensure!(
        ok(&user) && ok(domain),
        "{user}@{domain} is not an address gpuwatch writes"
    );
    let to = format!("{user}@{domain}");
    let settings = config.notify_settings()?;
    use crate::notify::channel::ChannelType as _;
    let channels: Vec<_> = settings
        .channels
        .iter()
        .filter(|c| c.kind.as_str() == crate::notify::email::Email::TYPE)
        .collect();
    anyhow::ensure!(
        !channels.is_empty(),
        "no e-mail channel in {}",
        config.path.display()
    );
    let subject = format!("GPU summary of job {} on {}", summary.job, summary.node);
    let text = summary.text();
    let transport = crate::notify::transport::Transport::new()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // the first channel that takes it
    let sent = channels.iter().any(|spec| {
        match rt.block_on(transport.send_letter(spec, &to, &subject, &text)) {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "gpuwatch: job {}: mail to {to} through {:?}: {}",
                    summary.job, spec.name, e.message
                );
                false
            }
        }
    });
    anyhow::ensure!(sent, "not sent to {to}");
    Ok(())
}

/// The summary as the AdminComment holds it: `GW1:` and the compact JSON gzipped and in base64
/// (sacctmgr turns quotes into backticks, so JSON would not survive; jobstats does the same
/// with `JS1:`), at most [`ADMIN_COMMENT_BYTES`].
pub fn admin_comment(summary: &JobSummary) -> String {
    use base64::Engine as _;
    let encode = |json: &str| {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let _ = gz.write_all(json.as_bytes());
        let bytes = gz.finish().unwrap_or_default();
        format!(
            "{ADMIN_COMMENT_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    };
    let mut limit = 4 * ADMIN_COMMENT_BYTES;
    loop {
        let line = encode(&summary.compact(limit));
        if line.len() <= ADMIN_COMMENT_BYTES || limit <= 200 {
            return line;
        }
        limit = limit * 3 / 4;
    }
}

/// What starts an AdminComment gpuwatch wrote.
pub const ADMIN_COMMENT_PREFIX: &str = "GW1:";

/// The compact JSON of an AdminComment gpuwatch wrote.
pub fn decode_admin_comment(text: &str) -> Option<String> {
    use base64::Engine as _;
    use std::io::Read as _;
    let b64 = text.trim().strip_prefix(ADMIN_COMMENT_PREFIX)?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let mut json = String::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(1 << 20)
        .read_to_string(&mut json)
        .ok()?;
    Some(json)
}

/// `gpuwatch-job-JOBID.txt` (`gpuwatch-job-JOBID-NODE.txt` for a job on several nodes, whose
/// work directory is usually shared) in the job's working directory, written as the job's user.
fn to_work_dir(
    config: &crate::config::Config,
    summary: &JobSummary,
    nodes: u32,
) -> Result<(), String> {
    let job = &summary.job;
    let work = env("SLURM_JOB_WORK_DIR")
        .or_else(|| squeue_field(config, job, "%Z"))
        .ok_or("no working directory known")?;
    // the user from slurmd's environment only, never from text a user could shape
    let uid: u32 = env("SLURM_JOB_UID")
        .and_then(|u| u.parse().ok())
        .ok_or("no SLURM_JOB_UID")?;
    let gid: u32 = env("SLURM_JOB_GID")
        .and_then(|g| g.parse().ok())
        .or_else(|| crate::sys::user_gid(uid))
        .ok_or("no SLURM_JOB_GID")?;
    let name = if nodes > 1 {
        format!("gpuwatch-job-{job}-{}.txt", summary.node)
    } else {
        format!("gpuwatch-job-{job}.txt")
    };
    let file = Path::new(&work).join(name);
    let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    cmd.args(["slurm", "write-file"]).arg(&file);
    run_as(
        cmd,
        Identity::of(uid, gid),
        summary.text().as_bytes(),
        WRITE_LIMIT,
    )
    .map(|_| ())
    .map_err(|e| format!("{}: {e}", file.display()))
}

/// `squeue -h -t all -j JOB -o FORMAT`: one field of the job, beside `scontrol`; each field
/// asked alone, so no text of the job's (its name, its paths) can pass for another field.
fn squeue_field(config: &crate::config::Config, job: &str, format: &str) -> Option<String> {
    let args = ["-h", "-t", "all", "-j", job, "-o", format];
    let out = crate::action::drain::slurm_tool(&config.actions.drain, "squeue", &args).ok()?;
    let line = out.lines().next()?.trim().to_string();
    (!line.is_empty() && line != "N/A").then_some(line)
}

/// The job's GPU summary from the recording; `None` for a job without GPUs.
fn summary_of(config: &crate::config::Config, job: &str) -> anyhow::Result<Option<JobSummary>> {
    use anyhow::Context as _;
    let seen = crate::usage::JobsSeen::load(&config.state_dir())
        .jobs
        .remove(job);
    // Slurm's GPU indices are gres.conf's /dev/nvidiaN: the device minor numbers
    let (gpus, gpus_from) = match (env("SLURM_JOB_GPUS"), env("CUDA_VISIBLE_DEVICES"), &seen) {
        (Some(g), _, _) => (job_gpus(Some(&g), None), GpusFrom::Minors("SLURM_JOB_GPUS")),
        (None, Some(g), _) => (
            job_gpus(None, Some(&g)),
            GpusFrom::Minors("CUDA_VISIBLE_DEVICES"),
        ),
        (None, None, Some(s)) => (
            Some(s.gpus.iter().copied().collect()),
            GpusFrom::Indices("processes seen"),
        ),
        (None, None, None) => (None, GpusFrom::Indices("")),
    };
    let Some(mut gpus) = gpus.filter(|g| !g.is_empty()) else {
        return Ok(None);
    };
    gpus.sort_unstable();
    gpus.dedup();
    let end_ms = crate::sys::now_ms();
    let start_ms = env("SLURM_JOB_START_TIME")
        .and_then(|t| t.trim().parse::<i64>().ok())
        .map(|s| s * 1000)
        .or_else(|| squeue_field(config, job, "%S").and_then(|t| slurm_time_ms(&t)))
        .or_else(|| seen.as_ref().map(|s| s.first_ms))
        .context("no start time: not in the environment, not from squeue, and no process of the job was seen")?;
    let node = config.actions.drain.node_name(&config.hostname());
    Ok(Some(summarize(
        config,
        job,
        env("SLURM_JOB_USER"),
        node,
        (start_ms, end_ms),
        (gpus, gpus_from),
    )))
}

/// Saves a summary in `state_dir/jobs/` (made 0700 when missing) and prunes the old ones.
fn save_summary(config: &crate::config::Config, summary: &JobSummary) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let dir = jobs_dir(&config.state_dir());
    crate::sys::create_private_dir(&dir)?;
    let path = dir.join(format!("{}.json", summary.job));
    crate::sys::write_atomic(&path, &serde_json::to_vec_pretty(summary)?)
        .with_context(|| format!("writing {}", path.display()))?;
    prune_summaries(&dir, summary.end_ms);
    Ok(())
}

/// How the job's GPUs are named: by device minor (`/dev/nvidiaN`, Slurm's GRES indices) or by
/// NVML index (the processes seen); the text says where they come from.
#[derive(Debug, Clone, Copy)]
enum GpusFrom {
    Minors(&'static str),
    Indices(&'static str),
}

impl GpusFrom {
    fn says(self) -> &'static str {
        match self {
            GpusFrom::Minors(s) | GpusFrom::Indices(s) => s,
        }
    }

    /// Whether GPU `id` is one of `gpus`.
    fn has(self, gpus: &[u32], id: &crate::model::DeviceId) -> bool {
        match self {
            GpusFrom::Minors(_) => gpus.contains(&id.minor.unwrap_or(id.index)),
            GpusFrom::Indices(_) => gpus.contains(&id.index),
        }
    }
}

/// A user to run a child as: ids and supplementary groups.
struct Identity {
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
}

impl Identity {
    /// `uid` with primary group `gid` and the groups the system's group database gives its name.
    fn of(uid: u32, gid: u32) -> Identity {
        let groups = crate::sys::user_name(uid)
            .map(|n| crate::sys::user_groups(&n, gid))
            .unwrap_or_else(|| vec![gid]);
        Identity { uid, gid, groups }
    }
}

/// Runs `cmd` as `who` (its groups, then its gid, then its uid), in a process group of its own,
/// with `input` on its standard input: its standard output (at most 16 MiB), or why it failed.
/// Past `limit` the whole group is killed.
fn run_as(
    mut cmd: Command,
    who: Identity,
    input: &[u8],
    limit: Duration,
) -> Result<Vec<u8>, String> {
    use std::io::{Read as _, Write as _};
    use std::os::unix::process::CommandExt as _;
    let Identity { uid, gid, groups } = who;
    cmd.process_group(0)
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec only async-signal-safe calls (setgroups, setgid, setuid) on
    // memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
    let pid = child.id();
    let mut stdin = child.stdin.take();
    let data = input.to_vec();
    std::thread::spawn(move || {
        if let Some(i) = stdin.as_mut() {
            let _ = i.write_all(&data);
        }
    });
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let (done, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut o = Vec::new();
        if let Some(s) = out.as_mut() {
            let _ = s.take(16 << 20).read_to_end(&mut o);
        }
        let mut e = Vec::new();
        if let Some(s) = err.as_mut() {
            let _ = s.take(64 << 10).read_to_end(&mut e);
        }
        let _ = done.send((o, e));
    });
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if std::time::Instant::now() >= deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let Some(status) = status else {
        // SAFETY: kill has no memory preconditions; the group is the child's own.
        unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        let _ = child.wait();
        return Err(format!("took longer than {} s: stopped", limit.as_secs()));
    };
    let (o, e) = output
        .recv_timeout(Duration::from_secs(1))
        .unwrap_or_default();
    if status.success() {
        Ok(o)
    } else {
        Err(String::from_utf8_lossy(&e).trim().to_string())
    }
}

/// `slurm write-file PATH` (run as the job's user): standard input (at most 1 MiB) into PATH, a
/// regular file made 0600 or truncated. A link, a FIFO or a device there is refused, never
/// followed nor waited on.
fn write_file(path: &Path) -> anyhow::Result<()> {
    use std::io::Read as _;
    let mut text = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut text)?;
    write_regular(path, &text)
}

/// `text` into `path`, a regular file (see [`write_file`]).
fn write_regular(path: &Path, text: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("{}", path.display()))?;
    anyhow::ensure!(
        f.metadata()?.file_type().is_file(),
        "{} is not a regular file",
        path.display()
    );
    f.set_len(0)?;
    f.write_all(text)?;
    Ok(())
}

/// A Slurm time (`2026-12-06T16:40:01`, local time as scontrol prints it) in UTC ms.
fn slurm_time_ms(t: &str) -> Option<i64> {
    use chrono::TimeZone as _;
    let naive = chrono::NaiveDateTime::parse_from_str(t.trim(), "%Y-%m-%dT%H:%M:%S").ok()?;
    chrono::Local
        .from_local_datetime(&naive)
        .earliest()
        .map(|d| d.timestamp_millis())
}

/// The summary of `job`'s span on `gpus` from the daemon's recording.
fn summarize(
    config: &crate::config::Config,
    job: &str,
    user: Option<String>,
    node: String,
    (start_ms, end_ms): (i64, i64),
    (gpus, gpus_from): (Vec<u32>, GpusFrom),
) -> JobSummary {
    let mut summary = JobSummary {
        job: job.to_string(),
        user,
        node,
        start_ms,
        end_ms,
        gpus,
        gpus_from: gpus_from.says().to_string(),
        run: None,
        missing: None,
    };
    let dir = config.recording_dir();
    if !config.recording.enabled {
        summary.missing = Some(format!(
            "the daemon does not record ([recording] enabled = false in {})",
            config.path.display()
        ));
        return summary;
    }
    // a file last written before the job started holds nothing of it
    let since = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(start_ms - 5_000).unwrap_or(0));
    let files: Vec<PathBuf> = crate::record::recording_files(&dir)
        .into_iter()
        .filter(|(_, written)| *written >= since)
        .map(|(p, _)| p)
        .collect();
    if files.is_empty() {
        summary.missing = Some(format!(
            "nothing recorded in {} since the job started",
            dir.display()
        ));
        return summary;
    }
    let keep = summary.gpus.clone();
    // every file opened before any is read: a rotation meanwhile renames, it does not swap
    let opened: Vec<anyhow::Result<crate::import::Importer>> = files
        .iter()
        .map(|f| crate::import::Importer::open(f, &crate::import::ImportOptions::default()))
        .collect();
    let ticks = opened.into_iter().flat_map(|opened| {
        let ticks: Box<dyn Iterator<Item = anyhow::Result<crate::import::Imported>>> = match opened
        {
            Ok(i) => Box::new(crate::import::read_ahead_assembled(i)),
            Err(e) => Box::new(std::iter::once(Err(e))),
        };
        ticks
    });
    // The process list in force when the job's first tick comes: a recording's ticks say
    // "unchanged" until a list changes.
    let mut in_force: Option<Vec<crate::model::ProcSample>> = None;
    let ticks = ticks.filter_map(move |t| match t {
        Ok(mut t) => {
            let s = &mut t.snapshot;
            if s.time_ms < start_ms || s.time_ms > end_ms {
                if let Some(p) = s.processes.take() {
                    in_force = Some(p);
                }
                return None;
            }
            if let Some(p) = in_force.take() {
                s.processes.get_or_insert(p);
            }
            s.gpus.retain(|g| gpus_from.has(&keep, &g.id));
            let indices: Vec<u32> = s.gpus.iter().map(|g| g.id.index).collect();
            if let Some(p) = &mut s.processes {
                p.retain(|p| indices.contains(&p.gpu_index));
            }
            s.xids.retain(|x| indices.contains(&x.gpu_index));
            s.mig.retain(|m| indices.contains(&m.gpu_index));
            s.nvlink.retain(|n| indices.contains(&n.gpu));
            s.pods.retain(|p| indices.contains(&p.gpu_index));
            s.missing.clear();
            Some(Ok(t))
        }
        Err(e) => Some(Err(e)),
    });
    let sources = files.iter().map(|f| f.display().to_string()).collect();
    match super::report::build_from(sources, ticks, &[], config) {
        Ok(r) if r.summary.ticks > 0 => summary.run = Some(r.summary),
        Ok(_) => {
            summary.missing = Some(format!(
                "no sample of GPU {} in {} during the job",
                crate::report::gpu_list(&summary.gpus),
                dir.display()
            ));
        }
        Err(e) => summary.missing = Some(format!("{e:#}")),
    }
    summary
}

/// The compact summary of `job` in its AdminComment (`sacct -n -X -j JOB -o AdminComment%4000`,
/// `sacct` beside `scontrol`), when gpuwatch wrote one.
fn sacct_admin_comment(config: &crate::config::Config, job: &str) -> Option<String> {
    let args = ["-n", "-X", "-j", job, "-o", "AdminComment%4000"];
    let out = crate::action::drain::slurm_tool(&config.actions.drain, "sacct", &args).ok()?;
    out.lines().find_map(decode_admin_comment)
}

/// Removes summaries older than 35 days.
fn prune_summaries(dir: &Path, now_ms: i64) {
    let cutoff = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(now_ms - 35 * 86_400_000).unwrap_or(0));
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        // only the summaries themselves: regular files named JOBID.json, never through a link
        let name = e.file_name();
        let ours = name
            .to_str()
            .and_then(|n| n.strip_suffix(".json"))
            .is_some_and(job_id_ok);
        let old = std::fs::symlink_metadata(e.path())
            .is_ok_and(|m| m.file_type().is_file() && m.modified().is_ok_and(|t| t < cutoff));
        if ours && old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Runs `job`: the summary the epilog saved, else one made now from the recording over the
/// span the job's processes were seen.
pub fn job(a: &JobArgs) -> anyhow::Result<i32> {
    use anyhow::Context as _;
    anyhow::ensure!(job_id_ok(&a.job), "{:?} is not a Slurm job id", a.job);
    let config = super::doctor::load_config(a.config.as_deref())?
        .unwrap_or_else(crate::config::Config::builtin);
    let state = config.state_dir();
    let path = jobs_dir(&state).join(format!("{}.json", a.job));
    let summary: JobSummary = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).with_context(|| format!("{}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(seen) = crate::usage::JobsSeen::load(&state).jobs.remove(&a.job) else {
                // another node's job: its AdminComment in the accounting database
                if let Some(json) = sacct_admin_comment(&config, &a.job) {
                    let v: serde_json::Value = serde_json::from_str(&json)?;
                    println!("{}", serde_json::to_string_pretty(&v)?);
                    return Ok(0);
                }
                anyhow::bail!(
                    "no summary of job {} in {} (`gpuwatch slurm epilog` writes one when a job ends), no process of it seen in {}, and no AdminComment of gpuwatch's in sacct",
                    a.job,
                    jobs_dir(&state).display(),
                    crate::usage::JobsSeen::path(&state).display()
                );
            };
            let node = config.actions.drain.node_name(&config.hostname());
            summarize(
                &config,
                &a.job,
                None,
                node,
                (seen.first_ms - 5_000, seen.last_ms + 5_000),
                (
                    seen.gpus.iter().copied().collect(),
                    GpusFrom::Indices("processes seen"),
                ),
            )
        }
        Err(e) => return Err(e).with_context(|| format!("{}", path.display())),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.text());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobs_gpus_come_from_slurm_first() {
        assert_eq!(job_gpus(Some("0,3"), Some("5")), Some(vec![0, 3]));
        assert_eq!(job_gpus(None, Some("2,1")), Some(vec![2, 1]));
        assert_eq!(job_gpus(Some(""), None), None);
        assert_eq!(job_gpus(None, None), None);
    }

    #[test]
    fn job_ids_are_file_names_and_slurm_times_are_local() {
        assert!(job_id_ok("77") && job_id_ok("4294967294"));
        for bad in ["", "../x", "7 7", "a", "77_3", "12+1", &"9".repeat(21)] {
            assert!(!job_id_ok(bad), "{bad:?}");
        }
        let ms = slurm_time_ms("2026-12-06T16:40:01").unwrap();
        let back = chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .with_timezone(&chrono::Local);
        assert_eq!(
            back.format("%Y-%m-%dT%H:%M:%S").to_string(),
            "2026-12-06T16:40:01"
        );
        assert_eq!(slurm_time_ms("Unknown"), None);
    }

    #[test]
    fn the_admin_comment_survives_sacctmgr_and_fits() {
        let summary: JobSummary = serde_json::from_value(serde_json::json!({
            "job": "77", "user": "ann", "node": "gpu07", "start_ms": 0, "end_ms": 60_000,
            "gpus": [0], "gpus_from": "SLURM_JOB_GPUS", "run": null,
            "missing": "x".repeat(5000)
        }))
        .unwrap();
        let line = admin_comment(&summary);
        assert!(line.starts_with(ADMIN_COMMENT_PREFIX) && line.len() <= ADMIN_COMMENT_BYTES);
        // no character sacctmgr rewrites (quotes) or splits on (spaces)
        assert!(!line.contains(['"', '\'', ' ', '`']), "{line}");
        let json: serde_json::Value =
            serde_json::from_str(&decode_admin_comment(&line).unwrap()).unwrap();
        assert_eq!(json["job"], "77");
        assert_eq!(decode_admin_comment("{\"job\":1}"), None);
    }

    #[test]
    fn write_file_refuses_links_and_fifos_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write_regular(&link, b"x").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(
            write_regular(&fifo, b"x").is_err(),
            "a FIFO without a reader is refused at once"
        );
        let file = dir.path().join("summary.txt");
        write_regular(&file, b"long text").unwrap();
        write_regular(&file, b"short").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "short");
    }
}
