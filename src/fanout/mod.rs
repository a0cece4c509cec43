//! Fan-out: one registry pull per multi-node step (`fanout=sbcast`).
//!
//! The step's first node (`SLURM_NODEID` 0) pulls and converts the image as
//! usual, then sends the squashfs to the step's nodes with `sbcast` (Slurm's
//! own tree over slurmd, authenticated by Slurm's credentials), run as the
//! job's user. Beside it goes a [`statement::SignedStatement`]: "image D,
//! converter V -> squashfs sha256 H, size S", vouched for by root with one
//! MUNGE credential per node. A receiving node checks the credential, copies
//! the squashfs into its store's `tmp/` while hashing it, and publishes it
//! like a pulled image ([`crate::store::Store::import`]). Every failure on a
//! receiver (timeout, bad credential, bad hash) ends in its own registry
//! pull, decided by the plugin (`crate::spank`), never here.
//!
//! Files live per node in `FANOUT_DIR/job-JOB/` (`fanout_dir`, default
//! `STORE/fanout`: one path, the same on every node, because `sbcast` writes
//! one path; the job folder is owned by the job's user, mode 0700, because
//! `sbcast` writes as the user), named after the step:
//! `STEP.intent` (the first node is fetching D; unsigned, it only makes
//! receivers wait), `STEP.statement`, `STEP.sqfs`. The job epilog removes
//! the folder ([`remove_job`]).

mod cleanup;
pub mod munge;
mod receive;
mod send;
pub mod statement;

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use cleanup::{Cleanup, CLEANUP_WAIT};
pub use receive::receive;
pub use send::{send, SendReport};

/// The hidden helper command: `berth __fanout send|receive REQUEST_JSON`.
pub const FANOUT_ARG: &str = "__fanout";

/// The largest statement file read (a statement with credentials for
/// thousands of nodes is a few MiB).
const MAX_STATEMENT: u64 = 64 << 20;

/// What the first node sends, and to which step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendRequest {
    /// This node's store.
    pub store: PathBuf,
    /// The fan-out folder (`fanout_dir`).
    pub fanout_dir: PathBuf,
    /// The job and step.
    pub job: u32,
    /// The step.
    pub step: u32,
    /// The job's user, who runs `sbcast`.
    pub user: JobUser,
    /// This node.
    pub sender: String,
    /// The image reference, as the step gave it.
    pub image: String,
    /// The step's node count (receivers are the indexes 1 to count - 1).
    pub node_count: u32,
    /// Slurm's configuration file, for `sbcast`.
    pub slurm_conf: Option<PathBuf>,
    /// The folder of Slurm's commands beside slurmstepd, searched first
    /// for `sbcast` (none: the system's PATH only).
    #[serde(default)]
    pub slurm_bin: Option<PathBuf>,
    /// What to send.
    pub what: SendWhat,
}

/// What [`SendRequest`] sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SendWhat {
    /// "I am fetching this manifest digest": receivers wait for the squashfs.
    Intent {
        /// The manifest digest being fetched.
        manifest_digest: String,
    },
    /// The stored image with this manifest digest.
    Image {
        /// Its manifest digest.
        manifest_digest: String,
    },
    /// Nothing (the pull failed): receivers pull themselves.
    Nothing {
        /// Why.
        reason: String,
    },
}

/// What a receiving node waits for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReceiveRequest {
    /// This node's store.
    pub store: PathBuf,
    /// The fan-out folder (`fanout_dir`).
    pub fanout_dir: PathBuf,
    /// The job.
    pub job: u32,
    /// The step.
    pub step: u32,
    /// The job's user (who owns the files `sbcast` writes).
    pub user: JobUser,
    /// This node's index in the step (to find its credential).
    pub node_id: u32,
    /// The image reference, as the step gave it.
    pub image: String,
    /// The manifest digest this node resolved and lacks.
    pub manifest_digest: String,
    /// How long to wait for the first node to say it fetches the image.
    pub intent_wait: Duration,
    /// How long to wait in all for the squashfs.
    pub wait: Duration,
}

/// The job's user, as `sbcast` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUser {
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
}

/// The fan-out files of one step on one node.
#[derive(Debug, Clone)]
pub struct StepFiles {
    dir: PathBuf,
    step: u32,
}

impl StepFiles {
    /// The files of `job`'s step `step` under the fan-out folder `fanout_dir`.
    pub fn new(fanout_dir: &Path, job: u32, step: u32) -> StepFiles {
        StepFiles {
            dir: job_dir(fanout_dir, job),
            step,
        }
    }

    fn path(&self, suffix: &str) -> PathBuf {
        self.dir.join(format!("{}.{suffix}", self.step))
    }

    /// Where `sbcast` puts the squashfs.
    pub fn squashfs(&self) -> PathBuf {
        self.path("sqfs")
    }

    /// Where `sbcast` puts the signed statement.
    pub fn statement(&self) -> PathBuf {
        self.path("statement")
    }

    /// Where `sbcast` puts the intent.
    pub fn intent(&self) -> PathBuf {
        self.path("intent")
    }

    /// The sender's outgoing copy of a file it sends (`sbcast` also writes
    /// to the sender itself, so the source needs another name).
    fn outgoing(&self, what: &str) -> PathBuf {
        self.path(&format!("{what}.out"))
    }

    /// Creates the fan-out folder (root's, 0755) and the job's folder in it,
    /// owned by the user and mode 0700, or checks the ones there: the
    /// fan-out folder must be root's and writable by root only (else a user
    /// could swap the job folder for a link), the job folder a real folder of
    /// the user.
    pub fn prepare(&self, user: JobUser) -> Result<()> {
        let parent = self
            .dir
            .parent()
            .context("the fan-out folder has no parent")?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let meta = fs::symlink_metadata(parent)
            .with_context(|| format!("cannot inspect {}", parent.display()))?;
        if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
            bail!(
                "{} must be a folder of root that only root can write to (fanout_dir): \
                 remove it, berth creates it",
                parent.display()
            );
        }
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {
                std::os::unix::fs::chown(&self.dir, Some(user.uid), Some(user.gid)).with_context(
                    || format!("cannot give {} to the job's user", self.dir.display()),
                )?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {}", self.dir.display()))
            }
        }
        let meta = fs::symlink_metadata(&self.dir)
            .with_context(|| format!("cannot inspect {}", self.dir.display()))?;
        if !meta.is_dir() || meta.uid() != user.uid {
            bail!(
                "{} is not a folder of uid {}: remove it",
                self.dir.display(),
                user.uid
            );
        }
        Ok(())
    }

    /// Removes this step's files (best effort: the epilog removes the folder).
    pub fn remove(&self) {
        for path in [self.squashfs(), self.statement(), self.intent()] {
            let _ = fs::remove_file(path);
        }
        for what in ["statement", "intent"] {
            let _ = fs::remove_file(self.outgoing(what));
        }
    }
}

/// `FANOUT_DIR/job-JOB`.
pub fn job_dir(fanout_dir: &Path, job: u32) -> PathBuf {
    fanout_dir.join(format!("job-{job}"))
}

/// Removes a job's fan-out folder on this node (the job epilog). Never
/// fails and never blocks the epilog for long: mounts the user left inside
/// are detached, no link is followed, no mount crossed, and what could not
/// be removed is in the report ([`cleanup`]). A fan-out folder that is not
/// root's (or that others can write) is left alone.
pub fn remove_job(fanout_dir: &Path, job: u32) -> Cleanup {
    let dir = job_dir(fanout_dir, job);
    match fs::symlink_metadata(fanout_dir) {
        Ok(meta) if meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o022 == 0 => {}
        Ok(_) => {
            return Cleanup {
                found: true,
                left: vec![format!(
                    "{} is not a folder of root that only root can write: left {} alone",
                    fanout_dir.display(),
                    dir.display()
                )],
                ..Cleanup::default()
            }
        }
        Err(_) => return Cleanup::default(),
    }
    cleanup::remove_job_dir(&dir, CLEANUP_WAIT)
}

/// Opens a file that the job's user wrote through `sbcast`, without
/// following a symlink or blocking on a FIFO: it must be a regular file of
/// that user. Returns `None` when it is not there (yet).
fn open_received(path: &Path, user: JobUser) -> Result<Option<(fs::File, u64)>> {
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
    };
    let meta = file
        .metadata()
        .with_context(|| format!("cannot inspect {}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!("{} is not a regular file", path.display());
    }
    if meta.uid() != user.uid {
        bail!(
            "{} belongs to uid {}, not to the job's user {}",
            path.display(),
            meta.uid(),
            user.uid
        );
    }
    Ok(Some((file, meta.len())))
}

/// Enters `job`'s mount namespace of `job_container/tmpfs` when this node
/// has one: slurmd writes `sbcast`'s files from inside it (its own `/tmp` and
/// `/dev/shm`), while slurmstepd, and so this helper, starts outside it. The
/// fan-out folder must be read and prepared where `sbcast` writes, or a
/// `fanout_dir` under `/tmp` is two folders and no node ever hears from the
/// first. The helper is still single-threaded here, as `setns` demands.
fn enter_job_namespace(job: u32) -> Result<()> {
    match crate::container::jobns::find(job) {
        Some(namespace) => crate::container::jobns::enter(&namespace)
            .context("the fan-out helper must see the job's /tmp, where sbcast writes"),
        None => Ok(()),
    }
}

/// Entry point of `berth __fanout send|receive REQUEST_JSON`; returns the
/// exit code. `receive` prints the stored image as JSON on stdout.
pub fn fanout_main(args: &[std::ffi::OsString]) -> i32 {
    let result = (|| -> Result<()> {
        if !nix::unistd::geteuid().is_root() {
            bail!("'{FANOUT_ARG}' needs root (the plugin runs it as root)");
        }
        let [verb, json] = args else {
            bail!("'{FANOUT_ARG}' is internal: berth starts it itself with `send|receive JSON`");
        };
        let json = json.to_string_lossy();
        match verb.to_str() {
            Some("send") => {
                let request: SendRequest =
                    serde_json::from_str(&json).context("unreadable fan-out send request")?;
                enter_job_namespace(request.job)?;
                let report = send(&request)?;
                eprintln!("{report}");
                Ok(())
            }
            Some("receive") => {
                let request: ReceiveRequest =
                    serde_json::from_str(&json).context("unreadable fan-out receive request")?;
                enter_job_namespace(request.job)?;
                let stored = receive(&request)?;
                println!("{}", serde_json::to_string(&stored)?);
                Ok(())
            }
            _ => bail!("'{FANOUT_ARG}': expected `send` or `receive`, got {verb:?}"),
        }
    })();
    match result {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("{err:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_files_must_be_the_users_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let me = JobUser {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        };
        assert!(open_received(&dir.path().join("absent"), me)
            .unwrap()
            .is_none());
        let file = dir.path().join("f");
        fs::write(&file, b"abc").unwrap();
        let (_, size) = open_received(&file, me).unwrap().unwrap();
        assert_eq!(size, 3);
        let other = JobUser {
            uid: me.uid + 1,
            ..me
        };
        let e = open_received(&file, other).unwrap_err();
        assert!(format!("{e:#}").contains("not to the job's user"), "{e:#}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(
            open_received(&link, me).is_err(),
            "a symlink is not followed"
        );
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = open_received(&dir.path().join("fifo"), me).unwrap_err();
        assert!(format!("{e:#}").contains("not a regular file"), "{e:#}");
    }

    #[test]
    fn step_files_are_per_job_and_step() {
        let files = StepFiles::new(Path::new("/s"), 12, 3);
        assert_eq!(files.squashfs(), Path::new("/s/job-12/3.sqfs"));
        assert_eq!(files.statement(), Path::new("/s/job-12/3.statement"));
        assert_eq!(
            files.outgoing("statement"),
            Path::new("/s/job-12/3.statement.out")
        );
    }
}
