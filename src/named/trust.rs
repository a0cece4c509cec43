//! Whether a folder or record under `runtime_path` may be believed.
//!
//! A running-step record tells root which process's descriptors to open and
//! join, so root reads only records that nobody but itself could have put
//! there: every folder from `runtime_path` down is a real folder (not a
//! symlink) of the expected owner (root in slurmstepd; the caller in a test
//! run as an ordinary user), writable by its owner only; the folders above
//! it are root's (or the caller's) and either writable by their owner only
//! or sticky (`/tmp`); a record is a regular file of the same owner,
//! opened without following a symlink or blocking on a FIFO, writable by
//! its owner only, and read up to [`MAX_RECORD`] bytes.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The largest record read (one holds a container spec: a few KiB).
pub const MAX_RECORD: u64 = 1 << 20;

/// Write bits for group and others.
const GROUP_OTHER_WRITE: u32 = 0o022;

/// The owner a trusted entry may have besides root: the caller.
fn expected_owner() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn owner_ok(uid: u32) -> bool {
    uid == 0 || uid == expected_owner()
}

/// The name of node `node`'s folder below the runtime folder: the node's
/// name, or `this-node` when it could not name a single folder.
pub fn node_folder_name(node: &str) -> &str {
    if node.is_empty() || node.contains('/') || node.starts_with('.') {
        "this-node"
    } else {
        node
    }
}

/// Checks the folders above `dir` (not `dir` itself): owned by root or the
/// caller, and writable only by their owner unless sticky.
pub fn check_ancestors(dir: &Path) -> Result<()> {
    for ancestor in dir.ancestors().skip(1) {
        if ancestor.as_os_str().is_empty() {
            continue;
        }
        let meta = match fs::metadata(ancestor) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot inspect {}", ancestor.display()))
            }
        };
        let sticky = meta.mode() & 0o1000 != 0;
        if !owner_ok(meta.uid()) || (meta.mode() & GROUP_OTHER_WRITE != 0 && !sticky) {
            bail!(
                "{} (above runtime_path {}) belongs to uid {} with mode {:o}: berth keeps \
                 running-container records below it only when every folder on the way is root's \
                 and writable by root only (or sticky, like /tmp); set runtime_path to a folder \
                 of root such as /run/berth",
                ancestor.display(),
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            );
        }
    }
    Ok(())
}

/// Checks that `dir` is a real folder of root (or the caller) that only its
/// owner can write; `Ok(false)` when it does not exist.
pub fn check_dir(dir: &Path) -> Result<bool> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", dir.display())),
    };
    if !meta.is_dir() || !owner_ok(meta.uid()) || meta.mode() & GROUP_OTHER_WRITE != 0 {
        bail!(
            "{} is not a folder of root that only root can write (a {}, uid {}, mode {:o}): \
             berth does not trust the running-container records there; remove it (berth \
             makes it again, mode 0700) or set runtime_path to a folder of root",
            dir.display(),
            kind(&meta),
            meta.uid(),
            meta.mode() & 0o7777
        );
    }
    Ok(true)
}

/// Reads the record at `path`: a regular file of root (or the caller) that
/// only its owner can write, at most [`MAX_RECORD`] bytes; `None` when it
/// is gone.
pub fn read_record(path: &Path) -> Result<Option<Vec<u8>>> {
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot open the running-container record {} (a symlink?): remove it",
                    path.display()
                )
            })
        }
    };
    let meta = file
        .metadata()
        .with_context(|| format!("cannot inspect {}", path.display()))?;
    if !meta.is_file() || !owner_ok(meta.uid()) || meta.mode() & GROUP_OTHER_WRITE != 0 {
        bail!(
            "the running-container record {} is not a file of root that only root can write \
             (a {}, uid {}, mode {:o}): berth refuses it; remove it",
            path.display(),
            kind(&meta),
            meta.uid(),
            meta.mode() & 0o7777
        );
    }
    let mut bytes = Vec::new();
    File::take(file, MAX_RECORD + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_RECORD {
        bail!(
            "the running-container record {} is larger than {MAX_RECORD} bytes: remove it",
            path.display()
        );
    }
    Ok(Some(bytes))
}

fn kind(meta: &fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "symlink"
    } else if t.is_dir() {
        "folder"
    } else if t.is_file() {
        "file"
    } else {
        "special file"
    }
}
