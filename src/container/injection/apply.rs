//! The holder's side of an [`Injection`]: run as root inside the holder's
//! private mount namespace, after the root file system is assembled and
//! before the host's `/proc`, `/sys` and `/dev` are bound into it.
//!
//! 1. MPI ABI check: each ABI-checked host library against the image's copy
//!    of the same soname (found through the image's own `/etc/ld.so.cache`).
//! 2. Binds: every library into [`LIB_DIR`] under its soname and over the
//!    image's copy; other files at their targets. Read-only.
//! 3. Loader: the host's static `ldconfig -r ROOT` rebuilds the image's cache
//!    with [`LIB_DIR`] first, run as the job's user (never as root: see
//!    [`super::ldconfig`]), before any host file system (`/proc` above all)
//!    is mounted in the root; the cache lands in the overlay's tmpfs layer.
//! 4. `/dev`: when devices are added or hidden, a tmpfs with binds of every
//!    host `/dev` entry except the hidden ones, plus the added devices.
//!
//! Steps 2 and 4 are plans ([`RootStep`]s): the holder makes them with the
//! one mount executor ([`crate::container::mounts::make_root_step`]) and
//! shows them in its mount table.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::abi;
use super::ldcache::LdCache;
use super::{HostLibrary, Injection, LIB_DIR};
use crate::container::mountplan::{Origin, RootStep};
use crate::container::safepath::RootDir;
use crate::container::spec::{MountKind, MountSpec, UserIdentity, UserMount};

/// Largest image `ld.so.cache` we read.
const CACHE_LIMIT: u64 = 64 << 20;
/// The loader configuration snippet that keeps [`LIB_DIR`] registered when
/// someone runs `ldconfig` inside the container.
const LD_CONF: &str = "/etc/ld.so.conf.d/000-berth.conf";

/// Steps 1 and 2: checks ABI and plans the binds of the libraries and
/// files (the holder makes them, then calls [`register_libraries`]).
/// Nothing for an injection without them.
pub fn plan_files(root: &RootDir, injection: &Injection) -> anyhow::Result<Vec<RootStep>> {
    if injection.libraries.is_empty() && injection.files.is_empty() {
        return Ok(Vec::new());
    }
    let cache = image_cache(root)?;
    check_mpi_abi(root, &cache, &injection.libraries)?;
    let mut steps = Vec::new();
    for library in &injection.libraries {
        let bind = |target: PathBuf| {
            RootStep::bind(
                MountSpec {
                    source: library.host_path.clone(),
                    target,
                    read_only: true,
                },
                Origin::Injected,
            )
        };
        steps.push(
            bind(Path::new(LIB_DIR).join(&library.soname)).failing_with(format!(
                "cannot inject {} ({})",
                library.soname, library.origin
            )),
        );
        if let Some(own) = cache.lookup(&library.soname) {
            if root.resolve(own).is_ok() {
                steps.push(bind(own.to_path_buf()).failing_with(format!(
                    "cannot put the host's {} over the image's {}",
                    library.soname,
                    own.display()
                )));
            }
        }
    }
    for file in &injection.files {
        steps.push(RootStep::bind(file.clone(), Origin::Injected));
    }
    Ok(steps)
}

/// The image's loader cache; empty when the image has none (musl, scratch).
fn image_cache(root: &RootDir) -> anyhow::Result<LdCache> {
    let bytes = root
        .read_file(Path::new("/etc/ld.so.cache"), CACHE_LIMIT)
        .context("cannot read /etc/ld.so.cache of the image")?;
    match bytes {
        Some(bytes) => LdCache::parse(&bytes).context("cannot parse /etc/ld.so.cache of the image"),
        None => Ok(LdCache::default()),
    }
}

/// The real file name (symlinks followed inside the root) of `path`.
fn real_file_name(root: &RootDir, path: &Path) -> anyhow::Result<String> {
    let fd: OwnedFd = root
        .resolve(path)
        .with_context(|| format!("cannot resolve {} in the image", path.display()))?;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .with_context(|| format!("cannot read where {} leads", path.display()))?;
    Ok(real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// Step 1 (see the module doc).
fn check_mpi_abi(root: &RootDir, cache: &LdCache, libraries: &[HostLibrary]) -> anyhow::Result<()> {
    let checked: Vec<&HostLibrary> = libraries.iter().filter(|l| l.abi.is_some()).collect();
    if checked.is_empty() {
        return Ok(());
    }
    let mut found = false;
    for library in &checked {
        let Some(own) = cache.lookup(&library.soname) else {
            continue;
        };
        found = true;
        let image_file = real_file_name(root, own)?;
        let host_file = file_name(&library.host_path);
        let policy = library.abi.expect("filtered on abi");
        abi::check(&host_file, &image_file, policy)
            .map_err(|e| anyhow::anyhow!("{} ({}): {e}", library.origin, library.soname))?;
    }
    if found {
        return Ok(());
    }
    let first = checked[0];
    let other_mpi = cache.entries().iter().find(|e| {
        abi::parse_library_name(&e.soname).is_some_and(|(stem, _)| abi::is_mpi_library(stem))
    });
    if let Some(other) = other_mpi {
        let image_file = real_file_name(root, &other.path)?;
        abi::check(
            &file_name(&first.host_path),
            &image_file,
            first.abi.expect("filtered"),
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", first.origin))?;
    }
    let wanted: Vec<&str> = checked.iter().map(|l| l.soname.as_str()).collect();
    bail!(
        "{}: the image has no {} in its loader cache, so there is no MPI to replace with the \
         host's: install an MPICH-ABI MPI (MPICH, Intel MPI, MVAPICH) in the image and build the \
         application against it, or run without --container-mpi",
        first.origin,
        wanted.join(" or ")
    )
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Step 3, once the libraries are bound: registers [`LIB_DIR`] with the
/// image's loader; `ldconfig` runs as `runner` (the job's user, see
/// [`super::ldconfig::runner_for`]) when the caller is root; `None` when
/// the caller is the user already. Nothing without injected libraries.
pub fn register_libraries(
    root: &RootDir,
    injection: &Injection,
    runner: Option<&UserIdentity>,
) -> anyhow::Result<()> {
    if injection.libraries.is_empty() {
        return Ok(());
    }
    if root.resolve(Path::new("/etc/ld.so.conf.d")).is_ok() {
        root.write_file(Path::new(LD_CONF), format!("{LIB_DIR}\n").as_bytes(), 0o644)
            .with_context(|| format!("cannot write {LD_CONF} in the container"))?;
    }
    super::ldconfig::rebuild_cache(root, &[Path::new(LIB_DIR)], runner)
}

/// Step 4: plans a `/dev` of the container's own, from `host_dev`: a tmpfs,
/// a bind (or the same link) of every host entry but the hidden ones, and
/// the added devices.
pub fn plan_dev(host_dev: &Path, injection: &Injection) -> anyhow::Result<Vec<RootStep>> {
    let dev = Path::new("/dev");
    let mut steps = vec![RootStep::Mount {
        mount: UserMount {
            kind: MountKind::Tmpfs,
            source: PathBuf::from("tmpfs"),
            target: dev.to_path_buf(),
            read_only: false,
            flags: Default::default(),
            tmpfs_options: vec!["mode=0755".to_string()],
        },
        origin: Origin::Dev,
        context: Some("cannot give the container a /dev of its own".into()),
    }];
    let mut entries: Vec<_> = std::fs::read_dir(host_dev)
        .with_context(|| format!("cannot list {}", host_dev.display()))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let source = entry.path();
        let target = dev.join(entry.file_name());
        if injection.hidden_devices.contains(&target) {
            continue;
        }
        let meta = match std::fs::symlink_metadata(&source) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // gone meanwhile
            Err(e) => return Err(e).with_context(|| format!("cannot stat {}", source.display())),
        };
        if meta.file_type().is_symlink() {
            let link = std::fs::read_link(&source)
                .with_context(|| format!("cannot read the link {}", source.display()))?;
            steps.push(RootStep::Symlink { target, link });
            continue;
        }
        steps.push(RootStep::bind(
            MountSpec {
                source,
                target,
                read_only: false,
            },
            Origin::Dev,
        ));
    }
    for device in &injection.devices {
        steps.push(
            RootStep::bind(device.clone(), Origin::Device)
                .failing_with(format!("cannot add device {}", device.source.display())),
        );
    }
    Ok(steps)
}
