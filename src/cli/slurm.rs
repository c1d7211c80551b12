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
    /// Print the summary; write nothing.
    #[arg(long)]
    pub dry_run: bool,
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
        SlurmAction::Prolog(a) => prolog(global, a),
        SlurmAction::Epilog(a) => {
            let job = std::env::var("SLURM_JOB_ID").unwrap_or_default();
            if let Err(e) = epilog(a, &job) {
                // (on stderr: slurmd logs it; the exit stays 0)
                eprintln!("gpuwatch: no GPU summary for job {job}: {e:#}");
            }
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

/// The directory of the saved summaries in a state directory.
fn jobs_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("jobs")
}

/// A job id as a file name: digits, `_` and `+` (array and het jobs) only.
fn job_id_ok(job: &str) -> bool {
    !job.is_empty()
        && job.len() <= 32
        && job
            .chars()
            .all(|c| c.is_ascii_digit() || c == '_' || c == '+')
}

fn epilog(a: &EpilogArgs, job: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    anyhow::ensure!(job_id_ok(job), "SLURM_JOB_ID {job:?} is not a job id");
    let config = super::doctor::load_config(a.config.as_deref())?
        .unwrap_or_else(crate::config::Config::builtin);
    let drain = &config.actions.drain;
    let fields = match crate::action::drain::show_job(drain, job) {
        Ok(line) => crate::action::drain::oneliner_fields(&line),
        Err(e) => {
            eprintln!("gpuwatch: job {job}: {e}; its start is taken from the processes seen");
            Default::default()
        }
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let seen = crate::usage::JobsSeen::load(&config.state_dir())
        .jobs
        .remove(job);
    let (gpus, gpus_from) = match (env("SLURM_JOB_GPUS"), env("CUDA_VISIBLE_DEVICES"), &seen) {
        (Some(g), _, _) => (job_gpus(Some(&g), None), "SLURM_JOB_GPUS"),
        (None, Some(g), _) => (job_gpus(None, Some(&g)), "CUDA_VISIBLE_DEVICES"),
        (None, None, Some(s)) => (Some(s.gpus.iter().copied().collect()), "processes seen"),
        (None, None, None) => (None, ""),
    };
    let Some(mut gpus) = gpus.filter(|g| !g.is_empty()) else {
        // a job without GPUs gets no GPU summary
        return Ok(());
    };
    gpus.sort_unstable();
    gpus.dedup();
    let end_ms = crate::sys::now_ms();
    let start_ms = fields
        .get("StartTime")
        .and_then(|t| slurm_time_ms(t))
        .or_else(|| seen.as_ref().map(|s| s.first_ms))
        .context("no start time: `scontrol show job` failed and no process of the job was seen")?;
    let node = drain.node_name(&config.hostname());
    let user = env("SLURM_JOB_USER").or_else(|| {
        fields
            .get("UserId")
            .map(|u| u.split('(').next().unwrap_or(u).to_string())
    });
    let summary = summarize(
        &config,
        job,
        user,
        node,
        (start_ms, end_ms),
        gpus,
        gpus_from,
    );
    if a.dry_run {
        print!("{}", summary.text());
        println!("AdminComment: {}", summary.compact(ADMIN_COMMENT_BYTES));
        return Ok(());
    }
    let dir = jobs_dir(&config.state_dir());
    crate::sys::create_private_dir(&dir)?;
    let path = dir.join(format!("{job}.json"));
    crate::sys::write_atomic(&path, &serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("writing {}", path.display()))?;
    prune_summaries(&dir, end_ms);
    for to in &a.to {
        match to {
            EpilogTo::WorkDir => {
                let Some(work) =
                    env("SLURM_JOB_WORK_DIR").or_else(|| fields.get("WorkDir").cloned())
                else {
                    eprintln!(
                        "gpuwatch: job {job}: no working directory known; its summary is in {}",
                        path.display()
                    );
                    continue;
                };
                let uid = env("SLURM_JOB_UID")
                    .and_then(|u| u.parse().ok())
                    .or_else(|| {
                        fields
                            .get("UserId")
                            .and_then(|u| u.split_once('(')?.1.trim_end_matches(')').parse().ok())
                    });
                let gid = env("SLURM_JOB_GID")
                    .and_then(|g| g.parse().ok())
                    .or_else(|| {
                        fields
                            .get("GroupId")
                            .and_then(|g| g.split_once('(')?.1.trim_end_matches(')').parse().ok())
                    });
                let (Some(uid), Some(gid)) = (uid, gid) else {
                    eprintln!("gpuwatch: job {job}: its user is unknown; not writing into {work}");
                    continue;
                };
                let file = Path::new(&work).join(format!("gpuwatch-job-{job}.txt"));
                if let Err(e) = write_as(uid, gid, &file, summary.text().as_bytes()) {
                    eprintln!("gpuwatch: job {job}: {}: {e}", file.display());
                }
            }
            EpilogTo::AdminComment => {
                let line = summary.compact(ADMIN_COMMENT_BYTES);
                if let Err(e) = crate::action::drain::set_admin_comment(drain, job, &line) {
                    eprintln!("gpuwatch: job {job}: AdminComment: {e}");
                }
            }
            EpilogTo::None => {}
        }
    }
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
    gpus: Vec<u32>,
    gpus_from: &str,
) -> crate::report::batch::JobSummary {
    let mut summary = crate::report::batch::JobSummary {
        job: job.to_string(),
        user,
        node,
        start_ms,
        end_ms,
        gpus,
        gpus_from: gpus_from.to_string(),
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
    let ticks = files.clone().into_iter().flat_map(move |f| {
        let opened = crate::import::Importer::open(&f, &crate::import::ImportOptions::default());
        let ticks: Box<dyn Iterator<Item = anyhow::Result<crate::import::Imported>>> = match opened
        {
            Ok(i) => Box::new(crate::import::read_ahead(i)),
            Err(e) => Box::new(std::iter::once(Err(e))),
        };
        ticks
    });
    let ticks = ticks.filter_map(move |t| match t {
        Ok(mut t) => {
            let s = &mut t.snapshot;
            if s.time_ms < start_ms || s.time_ms > end_ms {
                return None;
            }
            s.gpus.retain(|g| keep.contains(&g.id.index));
            if let Some(p) = &mut s.processes {
                p.retain(|p| keep.contains(&p.gpu_index));
            }
            s.xids.retain(|x| keep.contains(&x.gpu_index));
            s.mig.retain(|m| keep.contains(&m.gpu_index));
            s.nvlink.retain(|n| keep.contains(&n.gpu));
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

/// Writes `bytes` to `path` as `uid`:`gid` (a child process with that identity and no
/// supplementary groups): a path in a user's directory is the user's to name, links included,
/// and root must not follow them.
fn write_as(uid: u32, gid: u32, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::process::CommandExt as _;
    let mut child = std::process::Command::new("/bin/sh")
        .args(["-c", "umask 077 && cat > \"$1\"", "sh"])
        .arg(path)
        .uid(uid)
        .gid(gid)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(bytes)?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// Removes summaries older than 35 days.
fn prune_summaries(dir: &Path, now_ms: i64) {
    let cutoff = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(now_ms - 35 * 86_400_000).unwrap_or(0));
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|m| m < cutoff)
        {
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
    let summary: crate::report::batch::JobSummary = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).with_context(|| format!("{}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(seen) = crate::usage::JobsSeen::load(&state).jobs.remove(&a.job) else {
                anyhow::bail!(
                    "no summary of job {} in {} (`gpuwatch slurm epilog` writes one when a job ends) and no process of it seen in {}",
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
                seen.gpus.iter().copied().collect(),
                "processes seen",
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
        assert!(job_id_ok("77") && job_id_ok("77_3") && job_id_ok("12+1"));
        for bad in ["", "../x", "7 7", "a", &"9".repeat(33)] {
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
}
