//! Files root may read: only a file that root owns and no one else can
//! write, in folders (up to `/`) that root owns and no one else can write
//! (root's sticky folders above it allowed). enroot's site folder is read
//! without following a symlink ([`trusted_dir`], [`read_trusted`]); berth's
//! own configuration file may be a link, followed one step at a time with
//! every folder and link on the way checked ([`read_following_links`]).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

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

/// How many symlinks [`read_following_links`] follows at most (as the
/// kernel's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// The text of `path`, `Ok(None)` when it does not exist; refused unless
/// root could use it safely: every folder on the way is root's and writable
/// by no one else (root's sticky folders allowed: no one else can rename or
/// remove root's entries in them), every symlink on the way is root's (and
/// so lies in such a folder), and the file is a regular file of root's that
/// no one else can write (or `/dev/null`, read as empty). A relative `path`
/// starts at the current folder.
pub fn read_following_links(path: &Path) -> Result<Option<String>, String> {
    let absolute = match path.is_absolute() {
        true => path.to_path_buf(),
        false => std::env::current_dir()
            .map_err(|e| format!("cannot resolve {}: {e}", path.display()))?
            .join(path),
    };
    let Some(file) = resolve_checked(&absolute)? else {
        return Ok(None);
    };
    // `BERTH_CONFIG=/dev/null`: no settings (a device, not a file).
    if file == Path::new("/dev/null") {
        return Ok(Some(String::new()));
    }
    read_trusted(&file).map_err(|e| match file == absolute {
        true => e,
        false => format!("{e} (where {} leads)", path.display()),
    })
}

/// The real path of `path`, walked one component at a time from `/`, each
/// folder and link checked as [`read_following_links`] says; `Ok(None)`
/// when a component does not exist.
fn resolve_checked(path: &Path) -> Result<Option<PathBuf>, String> {
    let refused = |what: &Path, why: &str| {
        Err(match what == path {
            true => format!("{} is not used: {why}", path.display()),
            false => format!("{} is not used: {}: {why}", path.display(), what.display()),
        })
    };
    let mut pending: VecDeque<OsString> = components(path);
    let mut here = PathBuf::from("/");
    let root = std::fs::symlink_metadata(&here).map_err(|e| format!("cannot look at /: {e}"))?;
    if let Some(why) = untrusted_folder(&root) {
        return refused(&here, why);
    }
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            here.pop();
            continue;
        }
        let next = here.join(&name);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot look at {}: {e}", next.display())),
        };
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return refused(&next, "leads through too many symlinks");
            }
            if meta.uid() != 0 {
                return refused(&next, "is a symlink that is not root's");
            }
            let target = std::fs::read_link(&next)
                .map_err(|e| format!("cannot read the symlink {}: {e}", next.display()))?;
            if target.is_absolute() {
                here = PathBuf::from("/");
            }
            for part in components(&target).into_iter().rev() {
                pending.push_front(part);
            }
        } else if meta.is_dir() {
            if let Some(why) = untrusted_folder(&meta) {
                return refused(&next, why);
            }
            here = next;
        } else if pending.is_empty() {
            return Ok(Some(next));
        } else {
            return refused(&next, "is no folder");
        }
    }
    refused(&here, "is a folder, not a file")
}

/// The named components of `path` (`.` dropped, `..` kept).
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Why root may not go through this folder: not root's, or writable by a
/// group or others without being sticky.
fn untrusted_folder(meta: &std::fs::Metadata) -> Option<&'static str> {
    let sticky = meta.mode() & 0o1000 != 0;
    match untrusted(meta) {
        Some(_) if meta.uid() == 0 && sticky => None,
        Some(why) => Some(why),
        None => None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// A folder of root's (mode 0755) to build paths in; `None` unless root.
    fn root_folder() -> Option<tempfile::TempDir> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        set_mode(dir.path(), 0o755);
        Some(dir)
    }

    fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap();
        set_mode(path, mode);
    }

    const NOBODY: u32 = 65534;

    #[test]
    fn roots_file_is_read_directly_and_through_roots_links() {
        let Some(dir) = root_folder() else { return };
        let d = dir.path();
        write(&d.join("berth.conf"), "log_level=debug\n", 0o644);
        std::fs::create_dir(d.join("etc")).unwrap();
        symlink("../berth.conf", d.join("etc/relative")).unwrap();
        symlink(d.join("etc/relative"), d.join("absolute")).unwrap();
        for name in [
            "berth.conf",
            "etc/relative",
            "absolute",
            "etc/../berth.conf",
        ] {
            let text = read_following_links(&d.join(name)).unwrap();
            assert_eq!(text.as_deref(), Some("log_level=debug\n"), "{name}");
        }
        assert_eq!(read_following_links(&d.join("missing")).unwrap(), None);
        let empty = read_following_links(Path::new("/dev/null")).unwrap();
        assert_eq!(empty.as_deref(), Some(""));
        assert_eq!(
            read_following_links(&d.join("etc/missing/x")).unwrap(),
            None
        );
    }

    #[test]
    fn a_file_or_folder_someone_else_can_change_is_refused() {
        let Some(dir) = root_folder() else { return };
        let d = dir.path();
        let others = d.join("others.conf");
        write(&others, "x=1\n", 0o644);
        std::os::unix::fs::chown(&others, Some(NOBODY), None).unwrap();
        let e = read_following_links(&others).unwrap_err();
        assert!(e.contains("it is not root's"), "{e}");
        let group = d.join("group.conf");
        write(&group, "x=1\n", 0o664);
        let e = read_following_links(&group).unwrap_err();
        assert!(e.contains("its group or others can write it"), "{e}");
        // A folder anyone can write, also when a root's link leads there.
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        set_mode(&open, 0o777);
        write(&open.join("berth.conf"), "x=1\n", 0o644);
        symlink(open.join("berth.conf"), d.join("via-link")).unwrap();
        for path in [open.join("berth.conf"), d.join("via-link")] {
            let e = read_following_links(&path).unwrap_err();
            assert!(
                e.contains(&format!("{}: its group or others", open.display())),
                "{e}"
            );
        }
        // A folder of another user's.
        let theirs = d.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        write(&theirs.join("berth.conf"), "x=1\n", 0o644);
        std::os::unix::fs::chown(&theirs, Some(NOBODY), None).unwrap();
        let e = read_following_links(&theirs.join("berth.conf")).unwrap_err();
        assert!(e.contains("it is not root's"), "{e}");
    }

    #[test]
    fn in_a_sticky_folder_only_roots_entries_are_followed() {
        let Some(dir) = root_folder() else { return };
        let d = dir.path();
        let sticky = d.join("tmp");
        std::fs::create_dir(&sticky).unwrap();
        set_mode(&sticky, 0o1777);
        write(&sticky.join("berth.conf"), "x=1\n", 0o644);
        assert!(read_following_links(&sticky.join("berth.conf"))
            .unwrap()
            .is_some());
        // Another user's link there could be swapped at any time.
        let link = sticky.join("link.conf");
        symlink(sticky.join("berth.conf"), &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(NOBODY), None).unwrap();
        let e = read_following_links(&link).unwrap_err();
        assert!(e.contains("is a symlink that is not root's"), "{e}");
    }

    #[test]
    fn a_link_loop_or_a_folder_is_an_error() {
        let Some(dir) = root_folder() else { return };
        let d = dir.path();
        symlink(d.join("b"), d.join("a")).unwrap();
        symlink(d.join("a"), d.join("b")).unwrap();
        let e = read_following_links(&d.join("a")).unwrap_err();
        assert!(e.contains("too many symlinks"), "{e}");
        let e = read_following_links(d).unwrap_err();
        assert!(e.contains("is a folder, not a file"), "{e}");
    }
}
