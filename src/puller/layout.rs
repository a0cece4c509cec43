//! Who owns what in a node store: the store root and the named-container
//! area are root's; the image-content areas (`blobs/`, `images/`, `tmp/`,
//! `locks/`) belong to the pull user, who alone writes them. Ordinary users
//! can neither write nor read anything: the store root is mode 0711 (entered,
//! never listed: the pull user and the default fan-out folder `fanout/` need
//! to pass through it) and every content area 0700, so private images, their
//! blobs and `meta.json` stay out of reach.
//!
//! A store made by an older berth (everything root's, or folders 0755) is
//! adopted on first use: the content areas are handed to the pull user,
//! symlinks never followed, and the folders' modes tightened.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::fcntl::AtFlags;
use nix::unistd::{fchownat, Gid, Uid};

use super::PullUser;

/// The content areas the pull user owns, with their modes, parents first.
pub const CONTENT_DIRS: &[(&str, u32)] = &[
    ("blobs", 0o700),
    ("blobs/sha256", 0o700),
    ("images", 0o700),
    ("tmp", 0o700),
    ("locks", 0o700),
    // A shared store's pull leases and outdated images (`store_shared`).
    ("leases", 0o700),
    ("retired", 0o700),
];

pub use crate::store::ROOT_MODE;

/// Makes `root` a store the pull user can fill (as root): the root folder
/// root's, mode [`ROOT_MODE`]; the content areas the pull user's, mode 0700,
/// adopting (and tightening) those an older berth made. Returns the areas it
/// adopted.
pub fn prepare_store(root: &Path, user: &PullUser) -> Result<Vec<PathBuf>> {
    if !root.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(ROOT_MODE)
            .create(root)
            .with_context(|| {
                format!(
                    "cannot create the image store {}: check store_path and its parent",
                    root.display()
                )
            })?;
    }
    let meta = fs::symlink_metadata(root)
        .with_context(|| format!("cannot read the image store {}", root.display()))?;
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        bail!(
            "the image store {} is owned by uid {} with mode {:o}: it must be root's and \
             writable only by root (chown root: {0}; chmod 711 {0})",
            root.display(),
            meta.uid(),
            meta.mode() & 0o7777
        );
    }
    if !meta.is_dir() {
        bail!(
            "the image store {} is not a folder: check store_path",
            root.display()
        );
    }
    // Tightens a store made by an older berth (0755): users may pass, not list.
    if meta.mode() & 0o7777 != ROOT_MODE {
        fs::set_permissions(root, fs::Permissions::from_mode(ROOT_MODE))
            .with_context(|| format!("cannot set the mode of {}", root.display()))?;
    }
    check_reachable(root, user)?;
    let mut adopted = Vec::new();
    for (name, mode) in CONTENT_DIRS {
        let dir = root.join(name);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() || !m.is_dir() => bail!(
                "{} is not a folder: move it away so that berth can make the store's {name} area",
                dir.display()
            ),
            Ok(m) if m.uid() == user.uid && m.gid() == user.gid => {
                tighten(&dir, m.mode(), *mode)?;
            }
            Ok(m) => {
                chown_tree(&dir, user)?;
                tighten(&dir, m.mode(), *mode)?;
                adopted.push(dir.clone());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .mode(*mode)
                    .create(&dir)
                    .or_else(|e| if dir.is_dir() { Ok(()) } else { Err(e) })
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(*mode))
                    .with_context(|| format!("cannot set the mode of {}", dir.display()))?;
                chown(&dir, user)?;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
        }
    }
    Ok(adopted)
}

/// Sets `dir`'s mode to `mode` when it is not that already (`dir` is a
/// folder in root's store root, which only root can change, so the path
/// cannot have been swapped for a link).
fn tighten(dir: &Path, current: u32, mode: u32) -> Result<()> {
    if current & 0o7777 == mode {
        return Ok(());
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", dir.display()))
}

/// The uid owning `root`'s content areas when it is a pull-user store
/// (`images/` owned by someone other than root); `None` otherwise.
pub fn content_owner(root: &Path) -> Option<u32> {
    let meta = fs::symlink_metadata(root.join("images")).ok()?;
    (meta.is_dir() && meta.uid() != 0).then_some(meta.uid())
}

/// Fails, naming the folder, when the pull user cannot walk down to `root`
/// (the folders that exist are checked).
pub fn check_reachable(root: &Path, user: &PullUser) -> Result<()> {
    for dir in root.ancestors().filter(|d| d.exists()) {
        let meta = fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        let mode = meta.mode();
        let can_enter = if meta.uid() == user.uid {
            mode & 0o100 != 0
        } else if meta.gid() == user.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !can_enter {
            bail!(
                "the pull user {} cannot reach the image store {}: {} is mode {:o}; let \
                 others enter it (chmod o+x {2}) or choose another store_path",
                user.name,
                root.display(),
                dir.display(),
                mode & 0o7777
            );
        }
    }
    Ok(())
}

fn chown(path: &Path, user: &PullUser) -> Result<()> {
    fchownat(
        None,
        path,
        Some(Uid::from_raw(user.uid)),
        Some(Gid::from_raw(user.gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .with_context(|| {
        format!(
            "cannot give {} to the pull user {}",
            path.display(),
            user.name
        )
    })
}

/// Gives `dir` and everything below it to the pull user, never following a
/// symlink (the links themselves change owner).
fn chown_tree(dir: &Path, user: &PullUser) -> Result<()> {
    chown(dir, user)?;
    let entries = fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let kind = entry
            .file_type()
            .with_context(|| format!("cannot read {}", entry.path().display()))?;
        if kind.is_dir() {
            chown_tree(&entry.path(), user)?;
        } else if entry.file_name() != "image.sqfs" {
            // An image file stays root's: it may be mounted (see
            // seal), and its bytes must stay out of the pull user's reach.
            chown(&entry.path(), user)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nobody() -> PullUser {
        PullUser::lookup("nobody").unwrap()
    }

    /// A root-owned store of an older berth is adopted; links are not followed.
    #[test]
    fn old_root_stores_are_adopted() {
        if crate::test_support::skip_unless_root("old_root_stores_are_adopted") {
            return;
        }
        let base = tempfile::tempdir_in("/var/tmp").unwrap();
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let outside = base.path().join("outside");
        fs::write(&outside, "x").unwrap();
        let root = base.path().join("store");
        for (name, _) in CONTENT_DIRS {
            fs::create_dir_all(root.join(name)).unwrap();
        }
        fs::create_dir_all(root.join("containers/1000")).unwrap();
        fs::create_dir_all(root.join("images/abc")).unwrap();
        fs::write(root.join("images/abc/image.sqfs"), "hsqs").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("images/abc/link")).unwrap();
        let user = nobody();
        assert_eq!(content_owner(&root), None);
        let adopted = prepare_store(&root, &user).unwrap();
        assert_eq!(adopted.len(), CONTENT_DIRS.len() - 1, "{adopted:?}"); // blobs/sha256 came with blobs
        let image = fs::symlink_metadata(root.join("images/abc/image.sqfs")).unwrap();
        assert_eq!(
            image.uid(),
            0,
            "an image file stays root's (the hold seals it)"
        );
        for path in ["images", "images/abc", "tmp", "locks", "blobs/sha256"] {
            assert_eq!(
                fs::symlink_metadata(root.join(path)).unwrap().uid(),
                user.uid,
                "{path}"
            );
        }
        assert_eq!(
            fs::symlink_metadata(root.join("images/abc/link"))
                .unwrap()
                .uid(),
            user.uid
        );
        assert_eq!(
            fs::metadata(&outside).unwrap().uid(),
            0,
            "a symlink was followed"
        );
        assert_eq!(fs::metadata(&root).unwrap().uid(), 0);
        assert_eq!(fs::metadata(root.join("containers")).unwrap().uid(), 0);
        assert_eq!(content_owner(&root), Some(user.uid));
        // Once adopted, nothing more to do.
        assert!(prepare_store(&root, &user).unwrap().is_empty());
    }

    #[test]
    fn unreachable_and_foreign_stores_are_refused() {
        if crate::test_support::skip_unless_root("unreachable_and_foreign_stores_are_refused") {
            return;
        }
        let base = tempfile::tempdir_in("/var/tmp").unwrap();
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let e = prepare_store(&base.path().join("store"), &nobody()).unwrap_err();
        assert!(format!("{e:#}").contains("chmod o+x"), "{e:#}");
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let open = base.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare_store(&open, &nobody()).unwrap_err();
        assert!(format!("{e:#}").contains("chmod 711"), "{e:#}");
    }
}
