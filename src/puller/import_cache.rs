//! Root's record of the user files already imported into a node store, so
//! that a repeated start of the same file costs an `fstat`, not a read of
//! the whole file to hash it.
//!
//! An entry `STORE/userfiles/STAMP` holds the import's answer (the stored
//! image) for the file whose `fstat` gave STAMP: device, inode, size, and
//! the modification and change times to the nanosecond. Writing a file
//! changes its change time, which its owner cannot set back, so another
//! content gets another stamp. What could fool it: a write in the same
//! timestamp tick as the `fstat` taken before the import (the import then
//! hashed the newer bytes, which is why the stamp is taken again after the
//! import and recorded only when it did not move), or root setting the
//! clock back. The kernel stays safe either way: only re-packed bytes are
//! ever mounted; the worst is a stale image of the user's own file.
//!
//! The folder is root's (mode 0700) in the root-owned store root, so
//! neither users nor the pull user can add or change entries. Entries whose
//! image is gone are dropped when found and swept at each new import. Not
//! used for shared stores: device and inode numbers differ between nodes.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::store::StoredImage;

/// The folder of the entries, in the store root.
const FOLDER: &str = "userfiles";

/// The first part of every entry name: bumped when imports answer
/// differently for the same file (2: the image configuration the file
/// carries), so that older answers are no longer found.
const STAMP_VERSION: &str = "2";

/// The most bytes of an entry read.
const MAX_ENTRY_BYTES: u64 = 64 << 10;

/// What `fstat` says of a user's file, as an entry name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp(String);

impl FileStamp {
    /// The stamp of the open `file`; `None` when it cannot be taken.
    pub fn of(file: &File) -> Option<FileStamp> {
        let m = file.metadata().ok()?;
        Some(FileStamp(format!(
            "{STAMP_VERSION}-{:x}-{:x}-{:x}-{}.{:09}-{}.{:09}",
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec()
        )))
    }
}

/// The image recorded for `stamp` in `store`, when its `image.sqfs` is
/// still there. Run as root.
pub fn lookup(store: &Path, stamp: &FileStamp) -> Option<StoredImage> {
    let entry = folder(store)?.join(&stamp.0);
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&entry)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != 0 {
        return None;
    }
    let mut text = Vec::new();
    (&mut file)
        .take(MAX_ENTRY_BYTES)
        .read_to_end(&mut text)
        .ok()?;
    let stored: StoredImage = match serde_json::from_slice(&text) {
        Ok(stored) => stored,
        Err(_) => {
            let _ = std::fs::remove_file(&entry);
            return None;
        }
    };
    if !is_store_image(store, &stored) {
        let _ = std::fs::remove_file(&entry);
        return None;
    }
    Some(stored)
}

/// Records `stored` as the import of the file stamped `stamp`, and drops
/// entries whose image is gone. Failures are ignored: the next start
/// imports (hashes) again. Run as root.
pub fn record(store: &Path, stamp: &FileStamp, stored: &StoredImage) {
    let Some(folder) = folder_made(store) else {
        return;
    };
    sweep(store, &folder);
    let Ok(text) = serde_json::to_vec(stored) else {
        return;
    };
    let temp = folder.join(format!(".{}.{}", stamp.0, std::process::id()));
    let written = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &text));
    if written.is_err() || std::fs::rename(&temp, folder.join(&stamp.0)).is_err() {
        let _ = std::fs::remove_file(&temp);
    }
}

/// Whether `stored` names an `images/*/image.sqfs` of `store` that exists.
fn is_store_image(store: &Path, stored: &StoredImage) -> bool {
    let images = store.join("images");
    stored.manifest_digest.is_some()
        && stored.squashfs.parent().and_then(Path::parent) == Some(images.as_path())
        && stored.squashfs.file_name() == Some("image.sqfs".as_ref())
        && stored.squashfs.is_file()
}

/// Removes the entries of `folder` whose image is gone.
fn sweep(store: &Path, folder: &Path) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let stamp = FileStamp(name.to_string_lossy().into_owned());
        // lookup drops what no longer names an image.
        let _ = lookup(store, &stamp);
    }
}

/// The entries' folder when it exists as a real folder of root's, only
/// root's.
fn folder(store: &Path) -> Option<PathBuf> {
    let path = store.join(FOLDER);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    (meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o077 == 0).then_some(path)
}

/// [`folder`], made first when missing.
fn folder_made(store: &Path) -> Option<PathBuf> {
    let path = store.join(FOLDER);
    if std::fs::symlink_metadata(&path).is_err() {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&path);
    }
    folder(store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::config::ImageConfig;

    fn stored_in(store: &Path, key: &str) -> StoredImage {
        let dir = store.join("images").join(key);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("image.sqfs"), b"hsqs").unwrap();
        StoredImage {
            squashfs: dir.join("image.sqfs"),
            config: ImageConfig::default(),
            manifest_digest: Some(format!("sha256:{key}")),
            reference: None,
        }
    }

    #[test]
    fn a_recorded_file_is_found_until_it_or_its_image_changes() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (the folder must be root's)");
            return;
        }
        let store = tempfile::tempdir().unwrap();
        let user_file = store.path().join("user.sqsh");
        std::fs::write(&user_file, b"one").unwrap();
        let stamp = FileStamp::of(&File::open(&user_file).unwrap()).unwrap();
        assert_eq!(lookup(store.path(), &stamp), None);
        let stored = stored_in(store.path(), "aa");
        record(store.path(), &stamp, &stored);
        assert_eq!(lookup(store.path(), &stamp), Some(stored.clone()));
        // Another content of the file: another stamp.
        std::fs::write(&user_file, b"second").unwrap();
        let changed = FileStamp::of(&File::open(&user_file).unwrap()).unwrap();
        assert_ne!(changed, stamp);
        assert_eq!(lookup(store.path(), &changed), None);
        // The image went (gc): the entry goes too.
        std::fs::remove_dir_all(store.path().join("images/aa")).unwrap();
        assert_eq!(lookup(store.path(), &stamp), None);
        assert!(!store.path().join(FOLDER).join(&stamp.0).exists());
    }

    #[test]
    fn entries_outside_a_root_only_folder_are_not_believed() {
        let store = tempfile::tempdir().unwrap();
        let stored = stored_in(store.path(), "bb");
        let stamp = FileStamp("1-2-3-4.000000000-5.000000000".into());
        let dir = store.path().join(FOLDER);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(&stamp.0), serde_json::to_vec(&stored).unwrap()).unwrap();
        // A folder others may read or enter (here 0755) is not root's alone.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert_eq!(lookup(store.path(), &stamp), None);
        // An entry naming a file outside the store's images is dropped.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let outside = StoredImage {
            squashfs: PathBuf::from("/etc/passwd"),
            ..stored
        };
        std::fs::write(dir.join(&stamp.0), serde_json::to_vec(&outside).unwrap()).unwrap();
        assert_eq!(lookup(store.path(), &stamp), None);
    }
}
