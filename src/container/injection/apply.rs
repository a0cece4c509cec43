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
//!    host `/dev` entry except the hidden ones, plus the added devices (a
//!    folder with a hidden entry inside gets a tmpfs of its own, the same way).
//! 5. `/sys`, once the host's is bound: tmpfs masks over the folders shown
//!    only in part (InfiniBand classes), with some host files and links put
//!    back.
//!
//! Steps 2, 4 and 5 are plans ([`RootStep`]s): the holder makes them with the
//! one mount executor ([`crate::container::mounts::make_root_step`]) and
//! shows them in its mount table.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::abi;
use super::ldcache::LdCache;
use super::{HostLibrary, Injection, LIB_DIR};
use crate::container::mountplan::{Origin, RootStep};
use crate::container::safepath::RootDir;
use crate::container::spec::{MountFlags, MountKind, MountSpec, UserIdentity, UserMount};

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
/// the added devices. A host folder with a hidden entry inside
/// (`/dev/infiniband/uverbs1`) gets a tmpfs of its own too, filled the same
/// way, instead of a bind.
pub fn plan_dev(host_dev: &Path, injection: &Injection) -> anyhow::Result<Vec<RootStep>> {
    let dev = Path::new("/dev");
    let mut steps = vec![tmpfs_step(
        dev,
        0o755,
        Origin::Dev,
        "cannot give the container a /dev of its own".into(),
    )];
    plan_dev_folder(host_dev, dev, &injection.hidden_devices, &mut steps)?;
    for device in &injection.devices {
        steps.push(
            RootStep::bind(device.clone(), Origin::Device)
                .failing_with(format!("cannot add device {}", device.source.display())),
        );
    }
    Ok(steps)
}

/// The steps that put every entry of the host folder `host` at `target`
/// (a fresh tmpfs) but the `hidden` ones: binds, links, and for a folder
/// with a hidden entry inside, a tmpfs of its own filled the same way.
fn plan_dev_folder(
    host: &Path,
    target: &Path,
    hidden: &[PathBuf],
    steps: &mut Vec<RootStep>,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(host)
        .with_context(|| format!("cannot list {}", host.display()))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let source = entry.path();
        let target = target.join(entry.file_name());
        if hidden.contains(&target) {
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
            steps.push(RootStep::Symlink {
                target,
                link,
                origin: Origin::Dev,
            });
            continue;
        }
        if meta.is_dir() && hidden.iter().any(|h| h.starts_with(&target)) {
            let context = format!(
                "cannot give the container a {} of its own",
                target.display()
            );
            steps.push(tmpfs_step(
                &target,
                meta.mode() & 0o7777,
                Origin::Dev,
                context,
            ));
            plan_dev_folder(&source, &target, hidden, steps)?;
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
    Ok(())
}

/// A fresh tmpfs of `mode` at `target` (nosuid, nodev), failing with
/// `context`.
fn tmpfs_step(target: &Path, mode: u32, origin: Origin, context: String) -> RootStep {
    RootStep::Mount {
        mount: UserMount {
            kind: MountKind::Tmpfs,
            source: PathBuf::from("tmpfs"),
            target: target.to_path_buf(),
            read_only: false,
            flags: Default::default(),
            tmpfs_options: vec![format!("mode={mode:04o}")],
        },
        origin,
        context: Some(context),
    }
}

/// Step 5, once the host's `/sys` is bound: plans the masks over the
/// [`super::SysMask`] folders (an empty tmpfs, mode 0755, nosuid, nodev, noexec),
/// then the host files bound back read-only and the links made again in
/// each. Nothing when the injection masks nothing.
pub fn plan_sys(injection: &Injection) -> Vec<RootStep> {
    let mut steps = Vec::new();
    for mask in &injection.sys_masks {
        let context = format!("cannot hide the host's {}", mask.folder.display());
        let mut tmpfs = tmpfs_step(&mask.folder, 0o755, Origin::Sys, context);
        if let RootStep::Mount { mount, .. } = &mut tmpfs {
            mount.flags = MountFlags {
                nosuid: true,
                nodev: true,
                noexec: true,
                ..MountFlags::default()
            };
        }
        steps.push(tmpfs);
        for file in &mask.files {
            let mut mount = UserMount::from(file.clone());
            mount.flags = MountFlags {
                nosuid: true,
                nodev: true,
                noexec: true,
                ..MountFlags::default()
            };
            steps.push(RootStep::Mount {
                mount,
                origin: Origin::Sys,
                context: Some(format!(
                    "cannot bind {} back into the container",
                    file.source.display()
                )),
            });
        }
        for link in &mask.links {
            steps.push(RootStep::Symlink {
                target: mask.folder.join(&link.name),
                link: link.points_to.clone(),
                origin: Origin::Sys,
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::injection::{SysLink, SysMask};

    /// A stand-in host `/dev`: plain files for the nodes, a link, a folder
    /// without hidden entries (`pts`) and `infiniband`.
    fn host_dev() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for folder in ["pts", "infiniband"] {
            std::fs::create_dir(root.join(folder)).unwrap();
        }
        for node in [
            "null",
            "nvidia0",
            "nvidia1",
            "pts/ptmx",
            "infiniband/rdma_cm",
            "infiniband/umad0",
            "infiniband/uverbs0",
            "infiniband/uverbs1",
        ] {
            std::fs::write(root.join(node), "").unwrap();
        }
        std::fs::set_permissions(
            root.join("infiniband"),
            std::os::unix::fs::PermissionsExt::from_mode(0o750),
        )
        .unwrap();
        std::os::unix::fs::symlink("/proc/self/fd", root.join("fd")).unwrap();
        dir
    }

    /// The steps as mount table lines, the host folder shown as `HOST`.
    fn lines(steps: &[RootStep], host: &Path) -> Vec<String> {
        let host = host.display().to_string();
        steps
            .iter()
            .map(|s| s.table_line().replace(&host, "HOST"))
            .collect()
    }

    fn hiding(paths: &[&str]) -> Injection {
        Injection {
            hidden_devices: paths.iter().map(PathBuf::from).collect(),
            ..Injection::default()
        }
    }

    #[test]
    fn a_hidden_top_level_entry_is_left_out_of_the_own_dev() {
        let dev = host_dev();
        let steps = plan_dev(dev.path(), &hiding(&["/dev/nvidia1"])).unwrap();
        assert_eq!(
            lines(&steps, dev.path()),
            vec![
                "tmpfs /dev tmpfs rw,mode=0755 # dev",
                "/proc/self/fd /dev/fd symlink - # dev",
                "HOST/infiniband /dev/infiniband bind rw # dev",
                "HOST/null /dev/null bind rw # dev",
                "HOST/nvidia0 /dev/nvidia0 bind rw # dev",
                "HOST/pts /dev/pts bind rw # dev",
            ]
        );
    }

    #[test]
    fn a_hidden_entry_in_a_folder_gives_that_folder_a_tmpfs_of_its_own() {
        let dev = host_dev();
        let injection = hiding(&["/dev/infiniband/uverbs0", "/dev/infiniband/umad0"]);
        let steps = plan_dev(dev.path(), &injection).unwrap();
        assert_eq!(
            lines(&steps, dev.path()),
            vec![
                "tmpfs /dev tmpfs rw,mode=0755 # dev",
                "/proc/self/fd /dev/fd symlink - # dev",
                "tmpfs /dev/infiniband tmpfs rw,mode=0750 # dev",
                "HOST/infiniband/rdma_cm /dev/infiniband/rdma_cm bind rw # dev",
                "HOST/infiniband/uverbs1 /dev/infiniband/uverbs1 bind rw # dev",
                "HOST/null /dev/null bind rw # dev",
                "HOST/nvidia0 /dev/nvidia0 bind rw # dev",
                "HOST/nvidia1 /dev/nvidia1 bind rw # dev",
                "HOST/pts /dev/pts bind rw # dev",
            ]
        );
    }

    #[test]
    fn masks_come_first_then_files_and_links() {
        let folder = PathBuf::from("/sys/class/infiniband_verbs");
        let injection = Injection {
            sys_masks: vec![SysMask {
                folder: folder.clone(),
                files: vec![MountSpec {
                    source: folder.join("abi_version"),
                    target: folder.join("abi_version"),
                    read_only: true,
                }],
                links: vec![SysLink {
                    name: "uverbs1".into(),
                    points_to: "/sys/devices/pci0000:00/0000:81:00.0/infiniband_verbs/uverbs1"
                        .into(),
                }],
            }],
            ..Injection::default()
        };
        assert!(!injection.is_empty());
        assert!(!injection.needs_own_dev());
        let steps = plan_sys(&injection);
        assert_eq!(
            lines(&steps, Path::new("/nowhere")),
            vec![
                "tmpfs /sys/class/infiniband_verbs tmpfs rw,nosuid,nodev,noexec,mode=0755 # sys",
                "/sys/class/infiniband_verbs/abi_version /sys/class/infiniband_verbs/abi_version \
                 bind ro,nosuid,nodev,noexec # sys",
                "/sys/devices/pci0000:00/0000:81:00.0/infiniband_verbs/uverbs1 \
                 /sys/class/infiniband_verbs/uverbs1 symlink - # sys",
            ]
        );
        assert!(plan_sys(&Injection::default()).is_empty());
    }

    #[test]
    fn sys_masks_travel_in_the_spec_and_extend() {
        let mut injection = Injection::default();
        let mut other = Injection::default();
        other.sys_masks.push(SysMask {
            folder: "/sys/class/infiniband".into(),
            files: Vec::new(),
            links: Vec::new(),
        });
        injection.extend(other.clone());
        assert_eq!(injection.sys_masks, other.sys_masks);
        let text = serde_json::to_string(&injection).unwrap();
        let back: Injection = serde_json::from_str(&text).unwrap();
        assert_eq!(back, injection);
        // A spec without the field (an older berth's) still reads.
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value.as_object_mut().unwrap().remove("sys_masks");
        let old: Injection = serde_json::from_value(value).unwrap();
        assert!(old.sys_masks.is_empty());
    }
}
