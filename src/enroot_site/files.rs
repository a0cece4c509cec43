//! Reading the site folder's files as root may: only a file that root owns
//! and no one else can write, in folders (up to `/`) that root owns and no
//! one else can write (root's sticky folders above it allowed), opened
//! without following a symlink.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The most bytes of one configuration file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Why a folder or file of the site configuration cannot be trusted, or
/// `None` when root owns it and no group or other can write it.
fn untrusted(meta: &std::fs::Metadata) -> Option<&'static str> {
    if meta.uid() != 0 {
        Some("it is not root's")
    } else if meta.mode() & 0o022 != 0 {
        Some("its group or others can write it")
    } else {
        None
    }
}

/// Whether `dir` and every folder above it are root's only; `Err(why)`
/// otherwise, `Ok(false)` when `dir` does not exist.
pub fn trusted_dir(dir: &Path) -> Result<bool, String> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("cannot look at {}: {e}", dir.display())),
    };
    if !meta.is_dir() {
        return Err(format!("{} is no folder (a symlink?)", dir.display()));
    }
    for folder in dir.ancestors() {
        let meta = std::fs::symlink_metadata(folder)
            .map_err(|e| format!("cannot look at {}: {e}", folder.display()))?;
        // Above the folder, root's sticky folders (/tmp) are fine: no one
        // else can rename or remove root's entries in them.
        let sticky_above = folder != dir && meta.uid() == 0 && meta.mode() & 0o1000 != 0;
        if let Some(why) = untrusted(&meta).filter(|_| !sticky_above) {
            return Err(format!("{} is not used: {why}", folder.display()));
        }
    }
    Ok(true)
}

/// The text of `path`, `Ok(None)` when it does not exist; refused unless it
/// is a regular file of root's that no one else can write.
pub fn read_trusted(path: &Path) -> Result<Option<String>, String> {
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    check_file(&file, path)?;
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

fn check_file(file: &File, path: &Path) -> Result<(), String> {
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot look at {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not used: no regular file", path.display()));
    }
    match untrusted(&meta) {
        Some(why) => Err(format!("{} is not used: {why}", path.display())),
        None => Ok(()),
    }
}

/// The entries of `dir` whose names end in `suffix`, sorted by name (as
/// enroot's shell glob lists them); none when `dir` is missing.
pub fn listed(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.ends_with(suffix) && !n.starts_with('.'))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}
