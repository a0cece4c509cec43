//! Rebuilds a container's loader cache with the host's `ldconfig`, without
//! privilege (issue 18, hole 15).
//!
//! `ldconfig -r ROOT` reads a tree the image controls: its `ld.so.conf` and
//! `include`s, every library's ELF header, its symlinks. So it never runs as
//! root. The holder (root) makes a scratch folder in the container root owned
//! by the job's user (by `nobody` for root's own jobs), and runs `ldconfig`
//! as that user (uid, gid, groups, `no_new_privs`) with the cache written
//! into that folder. Without `CAP_SYS_CHROOT` `ldconfig` resolves every path
//! inside ROOT itself, with the user's own permissions: it reads only what the
//! user may read and writes only the scratch folder. Root then copies the
//! cache's bytes (unparsed) to `/etc/ld.so.cache` inside the root, replacing
//! whatever the image had there (a symlink is replaced, never followed), and
//! removes the folder.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::container::safepath::RootDir;
use crate::container::spec::UserIdentity;

/// The host's `ldconfig` (static in glibc distributions).
pub const LDCONFIG: &str = "/sbin/ldconfig";
/// Largest loader cache we copy.
const CACHE_LIMIT: u64 = 64 << 20;
/// uid and gid `ldconfig` runs as for root's own jobs.
const NOBODY: u32 = 65534;

/// Who `ldconfig` runs as: the job's user, or `nobody` for uid 0.
pub fn runner_for(user: &UserIdentity) -> UserIdentity {
    if user.uid != 0 {
        return user.clone();
    }
    UserIdentity {
        uid: NOBODY,
        gid: NOBODY,
        groups: vec![NOBODY],
        name: "nobody".to_string(),
        home: "/".to_string(),
        shell: "/bin/false".to_string(),
        group_names: Default::default(),
    }
}

/// Runs `ldconfig -X -r ROOT DIRS...` and installs the cache it built as
/// `/etc/ld.so.cache` of `root`. With `runner` (a holder that is root),
/// `ldconfig` runs as that user; without (the unprivileged holder, already
/// the user), as the caller.
pub fn rebuild_cache(
    root: &RootDir,
    dirs: &[&Path],
    runner: Option<&UserIdentity>,
) -> anyhow::Result<()> {
    let scratch = Scratch::create(root, runner)?;
    let cache_inside = Path::new("/").join(&scratch.name).join("ld.so.cache");
    let mut command = Command::new(LDCONFIG);
    command
        .arg("-X")
        .arg("-r")
        .arg(root.path())
        .arg("-C")
        .arg(&cache_inside)
        .args(dirs)
        .env_clear()
        .current_dir("/");
    if let Some(user) = runner {
        let (uid, gid, groups) = (user.uid, user.gid, user.all_gids());
        // SAFETY: the closure makes raw system calls only (no allocation,
        // no locks), which is safe between fork and exec.
        unsafe {
            command.pre_exec(move || crate::privilege::become_user(uid, gid, &groups));
        }
    }
    let output = command
        .output()
        .with_context(|| format!("cannot run {LDCONFIG}"))?;
    if !output.status.success() {
        bail!(
            "{LDCONFIG} -r {} (run as {}) could not register the injected libraries in the \
             image's loader cache: {}",
            root.path().display(),
            runner.map_or("you".to_string(), |u| u.name.clone()),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let cache = root
        .read_file(&cache_inside, CACHE_LIMIT)
        .with_context(|| format!("cannot read the cache {LDCONFIG} wrote"))?
        .with_context(|| format!("{LDCONFIG} wrote no cache"))?;
    root.write_file(Path::new("/etc/ld.so.cache"), &cache, 0o644)
        .context("cannot write /etc/ld.so.cache in the container")?;
    drop(scratch);
    Ok(())
}

/// The runner's scratch folder at the top of the container root, removed
/// when dropped.
struct Scratch {
    /// The container root (`O_PATH`).
    top: OwnedFd,
    /// The folder itself, opened without following links when it was made:
    /// what the runner renames or links later cannot redirect its cleanup.
    dir: OwnedFd,
    /// Its name in the container root.
    name: PathBuf,
}

impl Scratch {
    /// Creates `/.berth-ldconfig-PID` (never an existing entry), mode 0700,
    /// owned by `runner`.
    fn create(root: &RootDir, runner: Option<&UserIdentity>) -> anyhow::Result<Scratch> {
        let top = root
            .resolve(Path::new("/"))
            .context("cannot open the container root")?;
        let name = PathBuf::from(format!(".berth-ldconfig-{}", std::process::id()));
        mkdirat(
            Some(top.as_raw_fd()),
            &name,
            Mode::from_bits_truncate(0o700),
        )
        .with_context(|| format!("cannot create /{} in the container root", name.display()))?;
        let raw = openat(
            Some(top.as_raw_fd()),
            &name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("cannot open /{} in the container root", name.display()))?;
        // SAFETY: `raw` was just returned by openat and nothing else owns it.
        let dir = unsafe { OwnedFd::from_raw_fd(raw) };
        let scratch = Scratch { top, dir, name };
        if let Some(user) = runner {
            nix::unistd::fchown(
                scratch.dir.as_raw_fd(),
                Some(user.uid.into()),
                Some(user.gid.into()),
            )
            .with_context(|| format!("cannot give /{} to {}", scratch.name.display(), user.name))?;
        }
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for file in ["ld.so.cache", "ld.so.cache~"] {
            let _ = unlinkat(Some(self.dir.as_raw_fd()), file, UnlinkatFlags::NoRemoveDir);
        }
        let _ = unlinkat(
            Some(self.top.as_raw_fd()),
            &self.name,
            UnlinkatFlags::RemoveDir,
        );
    }
}
