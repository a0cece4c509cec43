//! A site's enroot hooks (`hooks.d/*.sh` of `enroot_config_path`), run by
//! the privileged holder once the container's root is built and before the
//! user's mounts are locked, each as the job's user (never as root, exact
//! groups, `no_new_privs`), in its own process group, with a time limit,
//! with enroot's interface: `ENROOT_ROOTFS` (the root, visible in the
//! holder's mount namespace), `ENROOT_PID`, `ENROOT_ENVIRON` and
//! `ENROOT_MOUNTS` (files the hook may append `NAME=VALUE` and fstab lines
//! to). What they append is read back from descriptors the holder kept
//! (the user can write the files' content only) and parsed as untrusted
//! text: variables with enroot's environment rules, mounts with
//! [`crate::container::fstab`] (the rules of `mounts.d`), made with the
//! user's permissions like `--container-mounts`. A hook that fails or runs
//! past the limit fails the container with its name and the tail of its
//! standard error; its process group is killed in any case, and so is
//! what it left running outside the group (the holder is its subreaper).

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::container::fstab;
use crate::container::spec::{SiteHooks, UserIdentity};
use crate::container::usermount::UserMount;

/// The most bytes of a hook's appended environment or mounts file read.
const MAX_APPENDED: u64 = 1 << 20;

/// How long to wait before looking at a hook again once its standard
/// error is closed (it is ending, or closed it and runs on).
const HUNG_UP_WAIT: Duration = Duration::from_millis(5);

/// The most bytes of a hook's standard error kept for the message.
const STDERR_TAIL: usize = 2048;

/// What the hooks appended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Appended {
    /// Variables for every task (`NAME=VALUE`), in order.
    pub env: Vec<String>,
    /// Mounts, made as the user after the site's and the user's own.
    pub mounts: Vec<UserMount>,
    /// Lines left out, and why, for the user.
    pub notes: Vec<String>,
}

/// Runs `hooks` for the root at `rootfs` as `user`; `work` is a folder of
/// the holder's (root's, in its private mount namespace) for the two files.
pub fn run_all(
    hooks: &SiteHooks,
    rootfs: &Path,
    user: &UserIdentity,
    work: &Path,
) -> anyhow::Result<Appended> {
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(work)
        .with_context(|| format!("cannot create {} for the site hooks", work.display()))?;
    let environ_path = work.join("environ");
    let mounts_path = work.join("fstab");
    let environ = user_file(&environ_path, user)?;
    let mounts = user_file(&mounts_path, user)?;
    let _reaper = Reaper::start()?;
    for script in &hooks.scripts {
        let mut command = Command::new(script);
        command
            .env_clear()
            .envs(hooks.env.iter().filter_map(|e| e.split_once('=')))
            .env("ENROOT_ROOTFS", rootfs)
            .env("ENROOT_PID", std::process::id().to_string())
            .env("ENROOT_ENVIRON", &environ_path)
            .env("ENROOT_MOUNTS", &mounts_path)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        crate::privilege::run_as_user(&mut command, user.uid, user.gid, user.all_gids());
        let result = run_one(command, script, Duration::from_secs(hooks.timeout_s));
        // A hook's daemon that left its process group (setsid) is ours now.
        kill_orphans();
        result?;
    }
    let lookup_env = hooks.env.clone();
    let lookup = move |name: &str| {
        lookup_env
            .iter()
            .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
    };
    let mut appended = Appended {
        env: crate::image::carried::from_enroot_environment(&read_back(&environ)?),
        ..Appended::default()
    };
    let mut parsed = fstab::Parsed::default();
    fstab::parse(
        &read_back(&mounts)?,
        "ENROOT_MOUNTS",
        &lookup,
        &|path| path.exists(),
        &mut parsed,
    );
    appended.mounts = parsed.mounts;
    appended.notes = parsed.notes;
    if !parsed.left_to_berth.is_empty() {
        appended.notes.push(format!(
            "site hook mounts berth makes itself: {}",
            parsed.left_to_berth.join(", ")
        ));
    }
    Ok(appended)
}

/// The holder as the child subreaper while alive: what a hook leaves
/// running outside its process group (a `setsid` daemon) becomes the
/// holder's child when its parent ends, for [`kill_orphans`].
struct Reaper;

impl Reaper {
    fn start() -> anyhow::Result<Reaper> {
        // SAFETY: prctl with constant arguments changes only this process's flag.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error())
                .context("cannot make the holder the subreaper of the site hooks");
        }
        Ok(Reaper)
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // SAFETY: as in `start`.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) };
    }
}

/// Kills and reaps every child of the holder (between hooks it has none of
/// its own: the ones there are what hooks left), until none is left. A
/// child is not reaped before it is killed, so its pid cannot be reused.
fn kill_orphans() {
    let children = format!("/proc/self/task/{}/children", std::process::id());
    for _ in 0..1000 {
        let pids: Vec<i32> = std::fs::read_to_string(&children)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
        }
    }
}

/// Creates `path` (new, 0600) for `user` to write, keeping root's descriptor.
fn user_file(path: &Path, user: &UserIdentity) -> anyhow::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot create {} for the site hooks", path.display()))?;
    nix::unistd::fchown(
        file.as_raw_fd(),
        Some(user.uid.into()),
        Some(user.gid.into()),
    )
    .with_context(|| format!("cannot give {} to uid {}", path.display(), user.uid))?;
    Ok(file)
}

/// What a hook wrote into `file`, from the start, at most [`MAX_APPENDED`].
fn read_back(file: &File) -> anyhow::Result<String> {
    let mut bytes = vec![0u8; MAX_APPENDED as usize];
    let mut filled = 0;
    while filled < bytes.len() {
        let n = file
            .read_at(&mut bytes[filled..], filled as u64)
            .context("cannot read what the site hooks appended")?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    bytes.truncate(filled);
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Runs one hook to its end or to `limit`, reading its standard error
/// without a thread (the holder must stay single-threaded for its user
/// namespace); kills its process group afterwards.
fn run_one(mut command: Command, script: &Path, limit: Duration) -> anyhow::Result<()> {
    let name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| script.display().to_string());
    let mut child = command.spawn().with_context(|| {
        format!(
            "cannot start the site hook {name} ({}): it must be executable by the job's user \
                 and name an interpreter that exists in its #! line",
            script.display()
        )
    })?;
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut stderr = child.stderr.take().context("no stderr pipe")?;
    set_nonblocking(&stderr);
    let mut tail = Vec::new();
    let deadline = Instant::now() + limit;
    let status = loop {
        drain(&mut stderr, &mut tail);
        if let Some(status) = child.try_wait().context("waiting for a site hook")? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        wait_readable(&stderr, Duration::from_millis(100));
    };
    // Whatever the hook left running in its group goes with it.
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let status = match status {
        Some(status) => status,
        None => {
            let _ = child.wait();
            drain(&mut stderr, &mut tail);
            bail!(
                "site hook {name} did not finish within {} s and was killed{}",
                limit.as_secs(),
                tail_text(&tail)
            );
        }
    };
    drain(&mut stderr, &mut tail);
    if !status.success() {
        bail!("site hook {name} failed ({status}){}", tail_text(&tail));
    }
    Ok(())
}

fn set_nonblocking(file: &impl AsRawFd) {
    // SAFETY: fcntl on a descriptor we own, with constant flags.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

fn wait_readable(file: &impl AsRawFd, timeout: Duration) {
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut poll, 1, timeout.as_millis() as i32) };
    if ready > 0 && poll.revents & libc::POLLIN == 0 {
        // The pipe's writers are gone (POLLHUP): poll would not wait again,
        // and the hook is most likely ending; look again soon.
        std::thread::sleep(timeout.min(HUNG_UP_WAIT));
    }
}

/// Reads what is there now, keeping the last [`STDERR_TAIL`] bytes.
fn drain(pipe: &mut impl Read, tail: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buf) {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
    }
}

fn tail_text(tail: &[u8]) -> String {
    let text = String::from_utf8_lossy(tail);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!(": {}", lines[lines.len().saturating_sub(5)..].join(" | "))
    }
}
