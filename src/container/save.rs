//! `--container-save`: a container's root file system, the image with the
//! changes kept in an on-disk upper folder, packed into a squashfs file that
//! the user owns and can run again with `--container-image=PATH`.
//!
//! The helper (`berth __save REQUEST`, full root) works in a private mount
//! namespace: the image on a loop device, a read-only overlay of the upper
//! folder on top of it (the kernel applies the whiteouts), then `gensquashfs`
//! packs that tree. An upper folder written through a mapped image (its
//! files the user's, see [`crate::container::idmap`]) is mounted with the
//! mapping undone, so the saved image is root's like any other. The output is created and renamed into place with the
//! user's ids, so the user's own permissions decide where it may go; root
//! only reads. Everything mounted vanishes with the helper.
//!
//! The image configuration travels in the file: a top layer of root's own
//! (on the helper's tmpfs) adds berth's JSON and enroot's `/etc/environment`
//! and `/etc/rc` ([`crate::image::carried`]), so the saved file runs like
//! the image under berth and under enroot. That layer's `/`, `/etc` and
//! `/.berth` copy the container's owner, mode and times, so nothing else
//! changes.

use std::ffi::OsString;
use std::fs::{File, FileTimes, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::container::holder::enter_private_staging;
use crate::container::idmap::{IdSwap, MappingNamespace};
use crate::container::loopdev::LoopDevice;
use crate::container::mounts;
use crate::container::spec::UserIdentity;
use crate::image::carried;
use crate::image::squashfs::SquashfsOptions;
use crate::image::ImageConfig;
use crate::seal::SealedFile;

/// The first argument that makes the `berth` binary run [`save_main`].
pub const SAVE_ARG: &str = "__save";

/// The squashfs packer of squashfs-tools-ng.
const GENSQUASHFS: &str = "gensquashfs";

/// What to save, and where, for whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveRequest {
    /// The image the container was made from.
    pub squashfs: PathBuf,
    /// The overlay's upper folder with the container's changes.
    pub upper: PathBuf,
    /// The file to write (absolute).
    pub output: PathBuf,
    /// The user the file is written as.
    pub uid: u32,
    /// Their primary group.
    pub gid: u32,
    /// All their groups.
    pub groups: Vec<u32>,
    /// Who opens `squashfs` (see `ContainerSpec::image_reader`); `None`:
    /// the user above.
    #[serde(default)]
    pub image_reader: Option<UserIdentity>,
    /// The store image file root sealed for the step (see
    /// `ContainerSpec::sealed_image`); a store image is read only sealed.
    #[serde(default)]
    pub sealed_image: Option<SealedFile>,
    /// The image's configuration, written into the saved file.
    #[serde(default)]
    pub config: ImageConfig,
}

/// Checks, as the calling user, that `output` can be written: an absolute
/// path whose folder exists and is writable, and that is not a folder itself.
/// Run with the user's effective ids (slurmstepd's `user_init`).
pub fn check_output(output: &Path) -> Result<(), String> {
    let parent = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| format!("'{}' has no folder", output.display()))?;
    if output.is_dir() {
        return Err(format!(
            "'{}' is a folder; give a file name, e.g. {}/image.sqfs",
            output.display(),
            output.display()
        ));
    }
    if !parent.is_dir() {
        return Err(format!(
            "folder {} does not exist on this node; create it first",
            parent.display()
        ));
    }
    if !effective_can_write(parent) {
        return Err(format!(
            "you cannot write to folder {}; choose a folder of yours",
            parent.display()
        ));
    }
    Ok(())
}

/// faccessat with the effective ids (access(2) checks the real ones).
fn effective_can_write(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; faccessat only reads it.
    unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        ) == 0
    }
}

/// Entry point of the helper (`berth __save REQUEST_JSON`); returns the exit code.
pub fn save_main(args: &[OsString]) -> i32 {
    let result = (|| -> Result<()> {
        let [json] = args else {
            bail!("'{SAVE_ARG}' is internal: berth starts it itself with one JSON argument");
        };
        let request: SaveRequest =
            serde_json::from_str(&json.to_string_lossy()).context("unreadable save request")?;
        save(&request)
    })();
    match result {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("{err:#}");
            1
        }
    }
}

/// Packs the image plus `request.upper` into `request.output` (see the module).
pub fn save(request: &SaveRequest) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("saving a container root needs root (the plugin runs it as root)");
    }
    let staging = enter_private_staging()?;
    mounts::mount_tmpfs(staging)?;
    let lower = staging.join("lower");
    let mapped_upper = staging.join("upper");
    let merged = staging.join("merged");
    let config_layer = staging.join("config");
    let root = staging.join("root");
    for dir in [&lower, &mapped_upper, &merged, &config_layer, &root] {
        std::fs::create_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    {
        let reader = UserIdentity {
            uid: request.uid,
            gid: request.gid,
            groups: request.groups.clone(),
            name: format!("uid {}", request.uid),
            home: String::new(),
            shell: String::new(),
            group_names: Default::default(),
        };
        let device = match (&request.image_reader, request.sealed_image) {
            (None, None) => LoopDevice::attach_read_only(&request.squashfs, &reader)?,
            (pull_user, sealed) => LoopDevice::attach_store_image(
                &request.squashfs,
                pull_user.as_ref().unwrap_or(&reader),
                sealed,
            )?,
        };
        mounts::mount_squashfs(device.path(), &request.squashfs, &lower)?;
    }
    let upper = match upper_swap(request)? {
        Some(swap) => {
            map_upper(&request.upper, &mapped_upper, swap)?;
            &mapped_upper
        }
        None => &request.upper,
    };
    mounts::mount_overlay_read_only(&[upper, &lower], &merged)?;
    for note in write_config_layer(&request.config, &merged, &config_layer)? {
        eprintln!("berth: --container-save: {note}");
    }
    mounts::mount_overlay_read_only(&[&config_layer, upper, &lower], &root)?;

    let temp = temp_path(&request.output);
    let file = as_user(request, || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)
    })
    .with_context(|| format!("cannot create {} as uid {}", temp.display(), request.uid))?;
    let packed = pack(&root, &file);
    drop(file);
    let placed = packed.and_then(|()| {
        as_user(request, || std::fs::rename(&temp, &request.output)).with_context(|| {
            format!(
                "cannot rename {} to {}",
                temp.display(),
                request.output.display()
            )
        })
    });
    if placed.is_err() {
        let _ = as_user(request, || std::fs::remove_file(&temp));
    }
    placed
}

/// Writes into `layer` (root's, empty) the files that carry `config`
/// ([`carried::files`]), as a layer over the container's tree `merged`:
/// the layer's `/` and each folder it makes copy owner, mode and times of
/// that folder in `merged`. A file whose folder is no folder in `merged` (a
/// symlink the user made) is left out, with a note. Returns the notes.
fn write_config_layer(config: &ImageConfig, merged: &Path, layer: &Path) -> Result<Vec<String>> {
    let (files, mut notes) = carried::files(config);
    copy_folder_metadata(merged, layer)?;
    for file in files {
        let inside = Path::new(file.path.trim_start_matches('/'));
        let folder = inside.parent().unwrap_or(Path::new(""));
        let target = layer.join(inside);
        if !folder.as_os_str().is_empty() && !layer.join(folder).is_dir() {
            match std::fs::symlink_metadata(merged.join(folder)) {
                Ok(meta) if meta.is_dir() => {
                    std::fs::create_dir(layer.join(folder))?;
                    copy_folder_metadata(&merged.join(folder), &layer.join(folder))?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir(layer.join(folder))?;
                }
                _ => {
                    notes.push(format!(
                        "/{} is no folder in the container: {} left out of the saved image",
                        folder.display(),
                        file.path
                    ));
                    continue;
                }
            }
        }
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&target)
            .with_context(|| format!("cannot create {}", target.display()))?;
        std::io::Write::write_all(&mut out, &file.bytes)
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    Ok(notes)
}

/// Gives the folder `to` the owner, mode and times of the folder `from`.
fn copy_folder_metadata(from: &Path, to: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(from)
        .with_context(|| format!("cannot look at {}", from.display()))?;
    std::os::unix::fs::chown(to, Some(meta.uid()), Some(meta.gid()))
        .with_context(|| format!("cannot set the owner of {}", to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
        .with_context(|| format!("cannot set the mode of {}", to.display()))?;
    let times = FileTimes::new()
        .set_accessed(meta.accessed()?)
        .set_modified(meta.modified()?);
    File::open(to)
        .and_then(|dir| dir.set_times(times))
        .with_context(|| format!("cannot set the times of {}", to.display()))
}

/// The id swap the container's upper folder was written with (see
/// [`crate::container::idmap`]), when its image was mapped.
fn upper_swap(request: &SaveRequest) -> Result<Option<IdSwap>> {
    let Some(overlay_dir) = request.upper.parent() else {
        return Ok(None);
    };
    Ok(IdSwap::recorded(overlay_dir)?.filter(|swap| !swap.is_identity()))
}

/// Mounts `upper` on `target` with `swap` undone: the user's files become
/// root's again, as in the image, and the image's other owners stay theirs.
fn map_upper(upper: &Path, target: &Path, swap: IdSwap) -> Result<()> {
    let namespace = MappingNamespace::swapping(swap)
        .context("cannot create a user namespace for the id mapping")?;
    mounts::bind_idmapped(upper, target, namespace.fd()).with_context(|| {
        format!(
            "cannot map uid {} back to root in the saved image: no idmapped mount of {} \
             (its file system must support idmapped mounts)",
            swap.uid,
            upper.display()
        )
    })
}

/// `.NAME.berth-save-PID` next to `output`.
fn temp_path(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    output.with_file_name(format!(".{name}.berth-save-{}", std::process::id()))
}

/// Runs gensquashfs on `root`, writing into `file` (reopened through /proc,
/// so gensquashfs, root, writes the file the user created). No
/// `--one-file-system`: the overlay reports its files with the device of the
/// layer they come from, and nothing else is mounted below `root`.
fn pack(root: &Path, file: &File) -> Result<()> {
    let options = SquashfsOptions::default();
    let mut command = Command::new(GENSQUASHFS);
    command
        .args(["--pack-dir"])
        .arg(root)
        .args(["--keep-time", "--quiet", "--force"])
        .args(["--compressor", &options.compressor]);
    if let Some(extra) = &options.compressor_options {
        command.args(["--comp-extra", extra]);
    }
    command
        .args(["--num-jobs", &options.jobs.max(1).to_string()])
        .arg(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            file.as_raw_fd()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let output = command.output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!(
                "cannot run {GENSQUASHFS}: it is not installed; install squashfs-tools-ng"
            )
        } else {
            anyhow::anyhow!("cannot run {GENSQUASHFS}: {e}")
        }
    })?;
    if !output.status.success() {
        bail!(
            "{GENSQUASHFS} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `f` with the effective uid, gid and groups of the request's user,
/// then takes root back. The helper is single-threaded, so the switch
/// covers everything `f` does.
fn as_user<T>(request: &SaveRequest, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    crate::privilege::as_effective_user(request.uid, request.gid, &request.groups, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_checks_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_output(dir.path()).unwrap_err();
        assert!(e.contains("is a folder"), "{e}");
        let e = check_output(&dir.path().join("missing/x.sqfs")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        assert!(check_output(&dir.path().join("x.sqfs")).is_ok());
    }

    #[test]
    fn temp_sits_next_to_the_output() {
        let temp = temp_path(Path::new("/a/b/img.sqfs"));
        assert_eq!(temp.parent(), Some(Path::new("/a/b")));
        assert!(temp
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".img.sqfs.berth-save-"));
    }
}
