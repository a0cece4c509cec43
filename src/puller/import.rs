//! Re-packing a user's file (a squashfs image or an archive) into the node
//! store as the pull user
//! ([`import_file`], root's side) and serving that request (`berth
//! __import`, [`serve_import`], the pull user's side). See
//! [`crate::helper::import`] for the request and `crate::store` for the
//! conversion.

use anyhow::anyhow;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{import_cache, layout, PullUser};
use crate::helper::{runner, ErrorKind, HelperError, ImportJob, PullReply, RunAs, IMPORT_ARG};
use crate::store::{SharedSettings, Store, StoredImage};

/// One import for [`import_file`].
pub struct ImportRequest<'a> {
    /// The `berth` binary.
    pub helper: &'a Path,
    /// The node store.
    pub store: &'a Path,
    /// `pull_user`.
    pub pull_user: &'a str,
    /// The user's file as they named it (messages only).
    pub name: &'a Path,
    /// Largest re-packed image, in bytes.
    pub max_image_size: u64,
    /// A store shared by several nodes: `(lease timeout, wait timeout)` in seconds.
    pub shared: Option<(u64, u64)>,
}

/// Re-packs the user's file, open as `file` (opened with the user's
/// identity and checked to be a regular squashfs file by the caller), into
/// the node store: `berth __import` runs as the pull user and reads the
/// file only through the descriptor it inherits. Must run with root
/// available (real uid 0). The stored copy is what the step mounts. The
/// helper's `berth: ...` lines (importing, imported) go to `show`.
pub fn import_file(
    request: &ImportRequest,
    file: &File,
    show: &dyn Fn(&str),
) -> anyhow::Result<StoredImage> {
    let pull_user = PullUser::lookup(request.pull_user)?;
    crate::privilege::with_root(|| layout::prepare_store(request.store, &pull_user))?;
    // A file imported before, unchanged since: its copy, without reading it.
    let stamp = match request.shared {
        None => import_cache::FileStamp::of(file),
        Some(_) => None,
    };
    if let Some(stored) = stamp
        .as_ref()
        .and_then(|s| crate::privilege::with_root(|| import_cache::lookup(request.store, s)))
    {
        return Ok(stored);
    }
    let stored = run_helper(request, &pull_user, file.as_raw_fd(), show)?;
    // Recorded only when the file did not change while it was imported.
    if let Some(stamp) = stamp.filter(|s| import_cache::FileStamp::of(file).as_ref() == Some(s)) {
        crate::privilege::with_root(|| import_cache::record(request.store, &stamp, &stored));
    }
    Ok(stored)
}

/// Runs `berth __import` as the pull user on the descriptor `fd` (a user's
/// file, or the read end of a pipe from their engine's `save`), which it
/// inherits; checks that the image it answers lies in the store.
pub(super) fn run_helper(
    request: &ImportRequest,
    pull_user: &PullUser,
    fd: RawFd,
    show: &dyn Fn(&str),
) -> anyhow::Result<StoredImage> {
    let name = request.name.display().to_string();
    let job = ImportJob {
        store: request.store.to_path_buf(),
        name: name.clone(),
        file_fd: fd,
        max_image_size: request.max_image_size,
        shared: request.shared,
    };
    let input = job.encode();
    let mut command = Command::new(request.helper);
    command
        .arg(IMPORT_ARG)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .current_dir("/");
    // SAFETY: fcntl(2) on a descriptor this process holds open is
    // async-signal-safe; it only makes the child's copy survive execve.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let run_as = RunAs::User {
        uid: pull_user.uid,
        gid: pull_user.gid,
        groups: Vec::new(),
    };
    let options = runner::Options {
        input: &input,
        ..runner::Options::default()
    };
    let output = runner::run(&mut command, run_as, options).map_err(|e| match e.kind() {
        std::io::ErrorKind::Interrupted => anyhow!("stopped the import of {name}: {e:#}"),
        _ => anyhow!(
            "cannot run the berth helper {} as the pull user {} to import {name}: {e:#}",
            request.helper.display(),
            pull_user.name
        ),
    })?;
    for line in output
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("berth: "))
    {
        show(line);
    }
    let stored = match PullReply::parse(&output.stdout) {
        Ok(PullReply::Ok(stored)) => *stored,
        Ok(PullReply::Error(error)) => return Err(anyhow::Error::msg(error.message)),
        _ => {
            return Err(anyhow!(
                "the import of {name} on this node failed ({}) before it finished; nothing \
                 was stored (its last message: {})",
                output.status,
                output.stderr.lines().last().unwrap_or("none").trim()
            ))
        }
    };
    // Whatever the helper says, only an image folder of this store is mounted.
    let images = request.store.join("images");
    let in_images = stored.squashfs.parent().and_then(Path::parent) == Some(images.as_path())
        && stored.squashfs.file_name() == Some("image.sqfs".as_ref());
    if !in_images || stored.manifest_digest.is_none() {
        return Err(anyhow!(
            "the import helper answered {} for {name}, not an image of the store {}",
            stored.squashfs.display(),
            request.store.display()
        ));
    }
    Ok(stored)
}

/// Serves one import request from stdin (`berth __import`); returns the
/// exit code (0 for the image, 1 for an error reply).
pub fn serve_import() -> i32 {
    let reply = match ImportJob::read_from(std::io::stdin().lock()) {
        Ok(job) => import(&job),
        Err(e) => PullReply::Error(HelperError {
            kind: ErrorKind::Request,
            message: format!("{e:#}"),
        }),
    };
    let code = i32::from(matches!(reply, PullReply::Error(_)));
    let mut out = std::io::stdout().lock();
    if out
        .write_all(reply.to_line().as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        return 1;
    }
    code
}

/// Runs `job` on the descriptor it names.
fn import(job: &ImportJob) -> PullReply {
    let fail = |message: String| {
        PullReply::Error(HelperError {
            kind: ErrorKind::Other,
            message,
        })
    };
    if job.file_fd < 3 {
        return fail(format!(
            "the import of {} names no file descriptor",
            job.name
        ));
    }
    // SAFETY: the descriptor was left open for this process by its parent
    // for this one use; nothing else here owns or closes it.
    let file = unsafe { File::from_raw_fd(job.file_fd) };
    // A regular file is a user's file; a pipe carries what the user's
    // container engine saved (only root hands descriptors to this helper).
    let stream = match file.metadata() {
        Ok(meta) if meta.is_file() => false,
        Ok(meta) if meta.file_type().is_fifo() => true,
        _ => {
            return fail(format!(
                "{}: the descriptor given is neither a regular file nor a pipe",
                job.name
            ))
        }
    };
    let store = match job.shared {
        Some((lease, wait)) => Store::open_shared(
            &job.store,
            SharedSettings {
                lease_timeout: Duration::from_secs(lease),
                wait_timeout: Duration::from_secs(wait),
            },
        ),
        None => Store::open(&job.store),
    };
    let imported = store.and_then(|s| match stream {
        true => s.import_user_stream(file, &job.name, job.max_image_size),
        false => s.import_user_file(file, &job.name, job.max_image_size),
    });
    match imported {
        Ok(stored) => PullReply::Ok(Box::new(stored)),
        Err(e) => fail(format!("{e:#}")),
    }
}
