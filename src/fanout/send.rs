//! The first node's side: sign a statement, `sbcast` it (and the squashfs)
//! to the step's nodes as the job's user.

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::statement::{Offer, SignedStatement, SquashfsOffer, Statement, FORMAT};
use super::{SendRequest, SendWhat, StepFiles};
use crate::store::Store;

/// `sbcast` tries while some node lacks the job's folder (its step started
/// later than this node's pull ended).
const SBCAST_TRIES: u32 = 3;

/// What a send did, for the plugin's log.
#[derive(Debug, Clone)]
pub struct SendReport {
    /// What was sent, in words.
    pub what: String,
    /// Seconds spent hashing and signing.
    pub prepare_s: f64,
    /// Seconds spent in `sbcast`.
    pub sbcast_s: f64,
    /// Nodes `sbcast` could not write to, with Slurm's reason.
    pub failed: Vec<String>,
}

impl fmt::Display for SendReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent {} ({:.2} s to prepare, {:.2} s in sbcast)",
            self.what, self.prepare_s, self.sbcast_s
        )?;
        if !self.failed.is_empty() {
            write!(f, "; not received by: {}", self.failed.join("; "))?;
        }
        Ok(())
    }
}

/// Sends what `request` says to the step's nodes.
pub fn send(request: &SendRequest) -> Result<SendReport> {
    let started = Instant::now();
    let files = StepFiles::new(&request.fanout_dir, request.job, request.step);
    files.prepare(request.user)?;
    let mut failed = Vec::new();
    if let SendWhat::Intent { manifest_digest } = &request.what {
        // Unsigned: a forged intent only makes the user's own step wait.
        let out = files.outgoing("intent");
        write_new(&out, manifest_digest.as_bytes())?;
        let t = Instant::now();
        failed.extend(sbcast(request, &out, &files.intent())?);
        let _ = fs::remove_file(&out);
        let _ = fs::remove_file(files.intent());
        return Ok(SendReport {
            what: format!("the intent to fetch {manifest_digest}"),
            prepare_s: 0.0,
            sbcast_s: t.elapsed().as_secs_f64(),
            failed,
        });
    }
    let (offer, squashfs) = match &request.what {
        SendWhat::Image { manifest_digest } => {
            let store = Store::open_unswept(&request.store)?;
            let source = store.fanout_source(manifest_digest)?;
            let offer = Offer::Squashfs(Box::new(SquashfsOffer {
                squashfs_digest: source.squashfs_digest,
                squashfs_size: source.squashfs_size,
                meta: source.meta,
                config: source.config,
                manifest: source.manifest,
            }));
            let digest =
                crate::registry::Digest::parse(manifest_digest).map_err(anyhow::Error::msg)?;
            // The job's user cannot read the store: sbcast reads the file
            // through a descriptor root opened (the user may read this
            // image: this node checked it with the registry), from the
            // store root without following any link ([`Store::open_image_file`]).
            let file = store.open_image_file(&digest, "image.sqfs")?;
            (offer, Some((source.squashfs, file)))
        }
        SendWhat::Nothing { reason } => (
            Offer::Nothing {
                reason: reason.clone(),
            },
            None,
        ),
        SendWhat::Intent { .. } => unreachable!("handled above"),
    };
    let what = match &offer {
        Offer::Squashfs(offer) => {
            format!("the image's squashfs ({} bytes)", offer.squashfs_size)
        }
        Offer::Nothing { .. } => "a notice that no image follows".to_string(),
    };
    let statement = Statement {
        format: FORMAT,
        job: request.job,
        step: request.step,
        sender: request.sender.clone(),
        image: request.image.clone(),
        offer,
    };
    let nodes: Vec<u32> = (1..request.node_count).collect();
    let signed = SignedStatement::sign(&statement, &nodes)?;
    let out = files.outgoing("statement");
    write_new(&out, serde_json::to_string(&signed)?.as_bytes())?;
    let prepare_s = started.elapsed().as_secs_f64();
    let t = Instant::now();
    // The squashfs first: a receiver that sees the statement has it whole.
    if let Some((squashfs, file)) = squashfs {
        failed.extend(sbcast_file(request, &file, &squashfs, &files.squashfs())?);
    }
    failed.extend(sbcast(request, &out, &files.statement())?);
    let sbcast_s = t.elapsed().as_secs_f64();
    files.remove();
    Ok(SendReport {
        what,
        prepare_s,
        sbcast_s,
        failed,
    })
}

/// Writes a new file (never through a link: the folder is the user's) that
/// the user can read, for `sbcast`.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// [`sbcast`] of an open file: the child gets the descriptor (close-on-exec
/// cleared after fork) and reads `/proc/self/fd/N`.
fn sbcast_file(
    request: &SendRequest,
    file: &fs::File,
    shown: &Path,
    dest: &Path,
) -> Result<Vec<String>> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let source = PathBuf::from(format!("/proc/self/fd/{fd}"));
    sbcast_with(request, &source, dest, Some(fd))
        .with_context(|| format!("cannot send {}", shown.display()))
}

fn slurm_env<'a>(command: &'a mut Command, request: &SendRequest) -> &'a mut Command {
    command
        .env_clear()
        .env(
            "PATH",
            crate::slurm_commands::command_path(request.slurm_bin.as_deref()),
        )
        .current_dir("/")
        .stdin(Stdio::null());
    if let Some(conf) = &request.slurm_conf {
        command.env("SLURM_CONF", conf);
    }
    command
}

/// `sbcast -j JOB.STEP SOURCE DEST` as the job's user. A node whose job
/// folder did not exist yet gets another try a second later (nodes that
/// already have the file answer "File exists" then, which is fine).
/// Returns the nodes that did not get the file; fails when `sbcast` itself
/// could not run or reach Slurm.
fn sbcast(request: &SendRequest, source: &Path, dest: &Path) -> Result<Vec<String>> {
    sbcast_with(request, source, dest, None)
}

/// [`sbcast`]; `inherit` is a descriptor the child keeps across `exec`.
fn sbcast_with(
    request: &SendRequest,
    source: &Path,
    dest: &Path,
    inherit: Option<std::os::fd::RawFd>,
) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for attempt in 1..=SBCAST_TRIES {
        let mut command = Command::new("sbcast");
        command
            .arg("-j")
            .arg(format!("{}.{}", request.job, request.step))
            .arg(source)
            .arg(dest);
        slurm_env(&mut command, request);
        // The job's user, `no_new_privs`: sbcast needs no privilege of its own.
        let (uid, gid) = (request.user.uid, request.user.gid);
        crate::privilege::run_as_user(&mut command, uid, gid, vec![gid]);
        if let Some(fd) = inherit {
            // SAFETY: the closure only makes a raw fcntl system call (no
            // allocation), which is async-signal-safe after fork.
            unsafe {
                command.pre_exec(move || {
                    // SAFETY: fcntl on a descriptor this process owns.
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let output = command
            .output()
            .context("cannot run sbcast (is Slurm's client installed on this node?)")?;
        if output.status.success() {
            return Ok(Vec::new());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("REQUEST_FILE_BCAST"))
            .filter(|l| !(attempt > 1 && l.contains("File exists")))
            .collect();
        if errors.is_empty() && attempt > 1 {
            return Ok(Vec::new());
        }
        if errors.is_empty() {
            bail!("sbcast of {} failed: {}", source.display(), stderr.trim());
        }
        missing = errors.iter().map(|l| l.trim().to_string()).collect();
        let retry = errors
            .iter()
            .any(|l| l.contains("No such file or directory"));
        if !retry {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(missing)
}
