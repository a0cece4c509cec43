//! How the store's own files are opened, by whoever opens them (root too).
//!
//! In a node store the content areas belong to the pull user, so root (the
//! fan-out sender, holds, `rmi`, `gc`, the fan-out receiver) must not use a
//! path there that the pull user could have turned into a link to
//! `/etc/shadow`, a device (`/dev/watchdog`) or a FIFO. Every image file is
//! opened from a descriptor of the store root (root's) through
//! [`RootDir::without_symlinks`]: no symlink anywhere on the path, the final
//! component opened `O_NOFOLLOW | O_NONBLOCK`, and what was opened must be a
//! regular file with one link, owned by root or by the owner of the content
//! area; reads are bounded. Root stages what it imports in `root-tmp/`, a
//! folder of its own, never in the pull user's `tmp/`.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

use super::Store;
use crate::fsutil::sweep_temp;
use crate::registry::Digest;
use crate::safepath::RootDir;

/// The most bytes of `meta.json` read.
pub const MAX_META_BYTES: u64 = 1 << 20;
/// The most bytes of `config.json` read (an image configuration is read up
/// to 32 MiB from the registry).
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// The most bytes of `manifest.json` read (as from the registry).
pub const MAX_MANIFEST_BYTES: u64 = 8 << 20;

/// Root's own staging folder in a node store.
const ROOT_TMP: &str = "root-tmp";

impl Store {
    /// The store root, for lookups that follow no symlink.
    fn files(&self) -> Result<RootDir> {
        RootDir::open(self.root())
            .and_then(|root| root.without_symlinks())
            .with_context(|| format!("cannot open the store {}", self.root().display()))
    }

    /// Who may own the store's files besides root: the owner of `images/`
    /// (the pull user in a node store) and this process.
    pub(super) fn file_owners(&self) -> Vec<u32> {
        let mut owners = vec![nix::unistd::geteuid().as_raw()];
        if let Ok(meta) = fs::symlink_metadata(self.images_dir()) {
            owners.push(meta.uid());
        }
        owners
    }

    /// `images/<hex>/name`, relative to the store root.
    fn image_file(digest: &Digest, name: &str) -> PathBuf {
        Path::new("images").join(digest.hex()).join(name)
    }

    /// Reads `name` of the stored image `digest` (at most `limit` bytes);
    /// `None` when it is not there.
    pub(super) fn read_image_file(
        &self,
        digest: &Digest,
        name: &str,
        limit: u64,
    ) -> Result<Option<Vec<u8>>> {
        let relative = Store::image_file(digest, name);
        self.files()?
            .read_regular(&relative, limit, &self.file_owners())
            .with_context(|| format!("cannot read {}", self.root().join(&relative).display()))
    }

    /// Opens `name` of the stored image `digest` for reading, checked as
    /// [`RootDir::open_regular`] checks it.
    pub fn open_image_file(&self, digest: &Digest, name: &str) -> Result<File> {
        let relative = Store::image_file(digest, name);
        self.files()?
            .open_regular(&relative, libc::O_RDONLY, 0, &self.file_owners())
            .with_context(|| format!("cannot open {}", self.root().join(&relative).display()))
    }

    /// Opens the squashfs file at `path` for reading: a store image's
    /// through [`Store::open_image_file`], any other (a file given by path)
    /// non-blocking and checked to be a regular file.
    pub(super) fn open_squashfs_at(&self, path: &Path) -> std::io::Result<File> {
        if let Ok(relative) = path.strip_prefix(self.root()) {
            let files = self.files().map_err(std::io::Error::other)?;
            return files.open_regular(relative, libc::O_RDONLY, 0, &self.file_owners());
        }
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not a regular file", path.display()),
            ));
        }
        Ok(file)
    }

    /// Sets the last use of the stored image `digest` to now (best effort;
    /// the file is made when missing, never through a link).
    pub(super) fn touch_last_used(&self, digest: &Digest) {
        let relative = Store::image_file(digest, super::catalog::LAST_USED);
        // Root (slurmstepd's own lookup) only touches a file the pull user
        // made: one root created would be root's, which the pull user could
        // not touch again. (openat2 refuses a mode without O_CREAT.)
        let (create, mode) = if super::is_root() {
            (0, 0)
        } else {
            (libc::O_CREAT, 0o644)
        };
        let opened = self.files().ok().and_then(|files| {
            files
                .open_regular(
                    &relative,
                    libc::O_WRONLY | create,
                    mode,
                    &self.file_owners(),
                )
                .ok()
        });
        if let Some(file) = opened {
            let _ = file.set_modified(SystemTime::now());
        }
    }

    /// Where this process stages new image folders: `tmp/` when this process
    /// owns it; else (root in a node store, whose `tmp/` is the pull user's)
    /// `root-tmp/`, root's own (mode 0700), swept of what dead writers left.
    pub(super) fn staging_dir(&self) -> Result<PathBuf> {
        let me = nix::unistd::geteuid().as_raw();
        let tmp = self.tmp_dir();
        if fs::symlink_metadata(&tmp).is_ok_and(|m| m.is_dir() && m.uid() == me) {
            return Ok(tmp);
        }
        let own = self.root().join(ROOT_TMP);
        match fs::DirBuilder::new().mode(0o700).create(&own) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", own.display())),
        }
        let meta = fs::symlink_metadata(&own)
            .with_context(|| format!("cannot inspect {}", own.display()))?;
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
            bail!(
                "{} is not a folder of uid {me} that only it can enter (mode 0700): remove it",
                own.display()
            );
        }
        sweep_temp(&own)?;
        Ok(own)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::image::{ImageConfig, CONVERTER_VERSION};
    use crate::store::{ImageMeta, ImportRequest};

    /// A store holding one imported image; its digest.
    fn store_with_image(dir: &Path) -> (Store, Digest) {
        let store = Store::open(dir.join("store")).unwrap();
        let manifest = r#"{"schemaVersion":2}"#;
        let meta = ImageMeta {
            registry: "reg.example:5000".into(),
            repository: "app".into(),
            tag: Some("1".into()),
            manifest_digest: Digest::of_bytes(manifest.as_bytes()).to_string(),
            index_digest: None,
            platform: None,
            layers: Vec::new(),
            compressed_size: 0,
            squashfs_size: 8,
            converter_version: CONVERTER_VERSION,
            created: 0,
            anonymous: false,
            origins: Vec::new(),
            user_file: false,
        };
        let bytes = b"hsqs1234";
        let source = dir.join("sent.sqfs");
        fs::write(&source, bytes).unwrap();
        let request = ImportRequest {
            meta: &meta,
            config: &ImageConfig::default(),
            manifest,
            squashfs_digest: &Digest::of_bytes(bytes).to_string(),
            squashfs_size: 8,
        };
        store.import(&request, File::open(source).unwrap()).unwrap();
        (store, Digest::parse(&meta.manifest_digest).unwrap())
    }

    /// Whatever the owner of the content areas puts in an image folder (a
    /// symlink or a hard link to a root-only file, a FIFO, a linked image
    /// folder), root reads nothing through it, never blocks, and creates
    /// nothing through a link.
    #[test]
    fn store_files_are_never_opened_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let (store, digest) = store_with_image(dir.path());
        let image_dir = store.image_dir(&digest);
        let secret = dir.path().join("secret");
        fs::write(&secret, b"root's secret").unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(store.fanout_source(&digest.to_string()).is_ok());

        // manifest.json: a symlink, then a hard link, to the secret.
        let manifest = image_dir.join("manifest.json");
        let kept = fs::read(&manifest).unwrap();
        fs::remove_file(&manifest).unwrap();
        symlink(&secret, &manifest).unwrap();
        let e = store.fanout_source(&digest.to_string()).unwrap_err();
        assert!(!format!("{e:#}").contains("root's secret"), "{e:#}");
        fs::remove_file(&manifest).unwrap();
        fs::hard_link(&secret, &manifest).unwrap();
        let e = store.fanout_source(&digest.to_string()).unwrap_err();
        assert!(format!("{e:#}").contains("hard links"), "{e:#}");
        fs::remove_file(&manifest).unwrap();
        fs::write(&manifest, kept).unwrap();

        // last-used: a dangling link is not followed to create its target.
        let last_used = image_dir.join(super::super::catalog::LAST_USED);
        fs::remove_file(&last_used).unwrap();
        let target = dir.path().join("created-through-a-link");
        symlink(&target, &last_used).unwrap();
        store.touch_last_used(&digest);
        assert!(!target.exists(), "root created a file through a link");

        // image.sqfs: a FIFO makes the hold fail at once, not block.
        let sqfs = image_dir.join("image.sqfs");
        fs::remove_file(&sqfs).unwrap();
        nix::unistd::mkfifo(&sqfs, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let stored = crate::store::StoredImage {
            squashfs: sqfs.clone(),
            config: ImageConfig::default(),
            manifest_digest: Some(digest.to_string()),
            reference: None,
        };
        let (tx, rx) = mpsc::channel();
        let held_store = Store::open_unswept(store.root()).unwrap();
        let held = stored.clone();
        std::thread::spawn(move || {
            let _ = tx.send(held_store.hold(&held).map(|_| ()).is_err());
        });
        let refused = rx.recv_timeout(Duration::from_secs(5));
        assert_eq!(refused, Ok(true), "the hold of a FIFO must fail at once");
        fs::remove_file(&sqfs).unwrap();
        symlink(&secret, &sqfs).unwrap();
        assert!(
            store.hold(&stored).is_err(),
            "a linked image.sqfs is refused"
        );

        // A linked image folder: nothing is read through it.
        let elsewhere = dir.path().join("elsewhere");
        fs::rename(&image_dir, &elsewhere).unwrap();
        symlink(&elsewhere, &image_dir).unwrap();
        assert!(store.read_meta(&digest).is_none());
        assert!(store.fanout_source(&digest.to_string()).is_err());
    }

    /// Root stages in a folder of its own when `tmp/` is another user's.
    #[test]
    fn root_stages_in_its_own_folder() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        assert_eq!(store.staging_dir().unwrap(), store.tmp_dir());
        std::os::unix::fs::chown(store.tmp_dir(), Some(4242), None).unwrap();
        let staging = store.staging_dir().unwrap();
        assert_eq!(staging, store.root().join(ROOT_TMP));
        let meta = fs::symlink_metadata(&staging).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
        fs::set_permissions(&staging, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(store.staging_dir().is_err(), "an open root-tmp/ is refused");
    }
}
