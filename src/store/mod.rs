//! The node's content-addressed image store.
//!
//! Owns the store directory: layer blobs by digest, converted images by
//! manifest digest, temp files, locks. Must not parse layers or talk HTTP
//! itself: it drives [`crate::registry`] and [`crate::image`].
//!
//! Layout under the root ([`Store::default_root`]):
//!
//! ```text
//! blobs/sha256/<hex>          verified layer blobs (as downloaded, compressed)
//! images/<manifest-hex>/      one converted image, published by rename:
//!     image.sqfs              the root file system
//!     config.json             ImageConfig (env, entrypoint, ...)
//!     manifest.json           the image manifest, exact registry bytes
//!     meta.json               reference, platform, sizes, converter version
//!     last-used               its mtime: the last pull or use (for `gc`)
//! tmp/                        partial downloads and conversions (locked by their writer)
//! root-tmp/                   root's own staging (fan-out imports, `rmi`) in a node store
//! locks/<manifest-hex>.lock   flock per image while it is pulled
//! locks/store.lock            shared by downloading pulls, exclusive to remove blobs
//! ```
//!
//! A store shared by several nodes ([`shared`], `store_shared=1`) has the
//! file `shared-store` in its root, temp files in `tmp/<host>/`, pull
//! leases in `leases/<manifest-hex>.lease` instead of the per-image `flock`,
//! and `retired/` for outdated images it does not remove while other nodes
//! may use them.
//! In a node store the root (and `containers/`) is root's and the content
//! areas above belong to the pull user, who alone writes them
//! ([`crate::puller::layout`]); lock files are opened read-only so either side
//! can lock what the other made.
//!
//! A running container holds a shared `flock` on its `image.sqfs`
//! ([`Store::hold`]); `rmi` and `gc` never remove an image someone holds.
//!
//! An image made by another [`crate::image::CONVERTER_VERSION`] counts as
//! missing and is converted again. A pull by tag asks the registry for the
//! manifest first (cheap), so a user who cannot read an image in the registry
//! cannot start it from the store either. A pull pinned by digest of a stored
//! image fetched anonymously from the same repository needs no network; any
//! other stored image is handed out only after one of the repositories it
//! was downloaded from serves its manifest to the caller ([`origin`]).

mod archive;
mod board;
mod catalog;
mod files;
mod gc;
mod hold;
mod import;
mod inspect;
pub mod lease;
mod origin;
pub mod progress;
mod proof;
mod pull;
mod remove;
pub mod shared;
mod toolstream;
mod userfile;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::image::{ImageConfig, CONVERTER_VERSION};
use crate::reference::{ImageRef, ImageSource};
use crate::registry::{Digest, Platform, RegistryOptions};

pub use crate::fsutil::FileLock;
pub use catalog::ImageEntry;
pub use gc::{GcOptions, GcReport, Removed};
pub use hold::ImageHold;
pub use import::{FanoutSource, ImportRequest};
pub use inspect::{ConfigDetails, ImageDetails, LayerDetails};
pub use origin::ImageOrigin;
pub use progress::ProgressMode;
pub use remove::{BlobSweep, RemoveOutcome};
pub use shared::SharedSettings;
pub use userfile::user_file_key;

/// The first bytes of every squashfs file.
pub const SQUASHFS_MAGIC: &[u8; 4] = b"hsqs";

/// The mode of root's store folder: entered by everyone, listed by root
/// only (the pull user passes through it to its content areas).
pub const ROOT_MODE: u32 = 0o711;

/// A content-addressed image store rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// Set when the store is shared by several nodes.
    shared: Option<SharedSettings>,
}

/// An image ready to mount (also what `berth pull --json` prints for the plugin).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredImage {
    /// The squashfs file holding the root file system.
    pub squashfs: PathBuf,
    /// Runtime settings from the image (default for plain squashfs files).
    pub config: ImageConfig,
    /// Digest of the platform's image manifest; `None` for a squashfs file
    /// given by path.
    pub manifest_digest: Option<String>,
    /// The registry reference, pinned to the manifest digest; `None` for a
    /// squashfs file given by path.
    pub reference: Option<ImageRef>,
}

/// How to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Registry access (insecure registries, timeouts, credentials).
    pub registry: RegistryOptions,
    /// How to show progress on stderr.
    pub progress: ProgressMode,
    /// Only look: an image not in the store is [`NotInStore`], nothing is
    /// downloaded (the fan-out receivers ask this first).
    pub cached_only: bool,
    /// Use the store as one shared by several nodes (`store_shared`); a
    /// store marked shared is used so anyway.
    pub shared: Option<SharedSettings>,
    /// Largest flattened image a pull may write (decompression-bomb limit).
    pub max_image_bytes: u64,
    /// zstd level of the squashfs a pull writes.
    pub zstd_level: i32,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            registry: RegistryOptions::default(),
            progress: ProgressMode::default(),
            cached_only: false,
            shared: None,
            max_image_bytes: crate::image::DEFAULT_MAX_IMAGE_BYTES,
            zstd_level: crate::image::DEFAULT_ZSTD_LEVEL,
        }
    }
}

/// Marks the store at `root` as shared by several nodes (`store_shared`),
/// once; root does it for the pull user, who cannot write the store's root.
pub fn mark_shared_store(root: &Path) -> Result<()> {
    shared::mark(root)
}

/// Exit code of `berth pull --cached-only` for an image not in the store.
pub const NOT_IN_STORE_EXIT: u8 = 3;

/// A pull with [`PullOptions::cached_only`] found the image's manifest in the
/// registry but not the image in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotInStore {
    /// The reference asked for.
    pub image: String,
    /// Its manifest digest for this platform.
    pub manifest_digest: String,
}

impl std::fmt::Display for NotInStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}) is not in the store, and only the store was asked",
            self.image, self.manifest_digest
        )
    }
}

impl std::error::Error for NotInStore {}

/// `meta.json` of a stored image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageMeta {
    /// Registry host of the reference pulled.
    pub registry: String,
    /// Repository of the reference pulled.
    pub repository: String,
    /// Tag pulled, if any.
    #[serde(default)]
    pub tag: Option<String>,
    /// Digest of the image manifest.
    pub manifest_digest: String,
    /// Digest of the index the manifest was chosen from, if any.
    #[serde(default)]
    pub index_digest: Option<String>,
    /// Platform chosen from the index, if any.
    #[serde(default)]
    pub platform: Option<Platform>,
    /// Layer digests, lowest first.
    #[serde(default)]
    pub layers: Vec<String>,
    /// Sum of the (compressed) layer sizes.
    #[serde(default)]
    pub compressed_size: u64,
    /// Size of image.sqfs.
    #[serde(default)]
    pub squashfs_size: u64,
    /// The converter version that made image.sqfs.
    pub converter_version: u32,
    /// When it was converted (seconds since the epoch).
    #[serde(default)]
    pub created: u64,
    /// Whether it was fetched with no credential sent (readable by anyone):
    /// a repeat pull by digest then needs no network at all.
    #[serde(default)]
    pub anonymous: bool,
    /// The repositories the content was downloaded from (empty in a store
    /// of an older berth: then `registry`/`repository`/`anonymous`); see
    /// [`ImageMeta::origins`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<ImageOrigin>,
    /// A squashfs file a user gave, re-packed into the store
    /// ([`Store::import_user_file`]): no registry served it, so it is never
    /// handed out for a registry reference.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub user_file: bool,
}

impl ImageMeta {
    /// The reference this image was pulled as, pinned to its manifest digest.
    pub fn reference(&self) -> ImageRef {
        ImageRef {
            user: None,
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: self.tag.clone(),
            digest: Some(self.manifest_digest.clone()),
        }
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

impl Store {
    /// The default store: `/var/lib/berth` for root; otherwise
    /// `$XDG_CACHE_HOME/berth`, or `~/.cache/berth`.
    pub fn default_root() -> PathBuf {
        if is_root() {
            return PathBuf::from("/var/lib/berth");
        }
        match std::env::var_os("XDG_CACHE_HOME").filter(|v| Path::new(v).is_absolute()) {
            Some(cache) => PathBuf::from(cache).join("berth"),
            None => {
                let home = std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .or_else(|| {
                        nix::unistd::User::from_uid(nix::unistd::geteuid())
                            .ok()
                            .flatten()
                            .map(|u| u.dir)
                    })
                    .unwrap_or_else(|| PathBuf::from("/tmp"));
                home.join(".cache/berth")
            }
        }
    }

    /// Opens (creating if needed) the store at `root`, and removes temp files
    /// left by writers that are gone. The root is mode 0755 when made by root
    /// (a node store), 0700 otherwise (a user's private cache).
    pub fn open(root: impl AsRef<Path>) -> Result<Store> {
        let store = Store::open_unswept(root)?;
        crate::fsutil::sweep_temp(&store.tmp_dir())?;
        Ok(store)
    }

    /// Opens (creating if needed) the store at `root` as one shared by
    /// several nodes ([`shared`]), marking it so, and removes this host's
    /// temp files left by writers that are gone.
    pub fn open_shared(root: impl AsRef<Path>, settings: SharedSettings) -> Result<Store> {
        let root = root.as_ref();
        Store::open_unswept(root)?;
        shared::mark(root)?;
        let mut store = Store::open_unswept(root)?;
        store.shared = Some(settings);
        crate::fsutil::sweep_temp(&store.tmp_dir())?;
        Ok(store)
    }

    /// Whether several nodes share this store (see [`shared`]).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The store at `root` when it exists with every folder a lookup
    /// reads or a pull needs on this host; `None` otherwise. Creates
    /// nothing: root's own lookup must leave a store's making to the pull
    /// user (a folder root made there would be root's).
    pub fn open_existing(root: impl AsRef<Path>) -> Option<Store> {
        let root = root.as_ref().to_path_buf();
        let shared = shared::is_marked(&root).then(SharedSettings::default);
        let store = Store { root, shared };
        [
            store.root.join("blobs"),
            store.blobs_dir(),
            store.images_dir(),
            store.root.join("tmp"),
            store.tmp_dir(),
            store.locks_dir(),
        ]
        .iter()
        .all(|dir| dir.is_dir())
        .then_some(store)
    }

    /// Like [`Store::open`], but leaves temp files of dead writers for
    /// [`Store::gc`] to remove and report.
    pub fn open_unswept(root: impl AsRef<Path>) -> Result<Store> {
        let root = root.as_ref().to_path_buf();
        // Root's store may become a pull-user store (`puller::prepare_store`),
        // whose pull user must pass through the root; nobody else reads it.
        let root_mode = if is_root() { ROOT_MODE } else { 0o700 };
        let fix = |e: std::io::Error, p: &Path| {
            anyhow::Error::new(e).context(format!(
                "cannot create the image store directory {}: check that its parent exists \
                 and is writable, or choose another store location",
                p.display()
            ))
        };
        if !root.is_dir() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(root_mode)
                .create(&root)
                .map_err(|e| fix(e, &root))?;
            fs::set_permissions(&root, fs::Permissions::from_mode(root_mode))
                .with_context(|| format!("cannot set the mode of {}", root.display()))?;
        }
        if let Err(e) = fs::read_dir(root.join("images")) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                bail!(
                    "the image store {} is not yours: a node's store is readable only by root \
                     and berth's pull user (its images may be private); run this as root, or \
                     use a store of your own (leave out --store)",
                    root.display()
                );
            }
        }
        let shared = shared::is_marked(&root).then(SharedSettings::default);
        let store = Store { root, shared };
        for (dir, mode) in [
            (store.root.join("blobs"), 0o700),
            (store.blobs_dir(), 0o700),
            (store.images_dir(), 0o700),
            (store.root.join("tmp"), 0o700),
            (store.tmp_dir(), 0o700),
            (store.locks_dir(), 0o700),
        ] {
            if !dir.is_dir() {
                fs::DirBuilder::new()
                    .mode(mode)
                    .create(&dir)
                    .or_else(|e| if dir.is_dir() { Ok(()) } else { Err(e) })
                    .map_err(|e| fix(e, &dir))?;
            }
        }
        if store.shared.is_some() {
            let leases = store.leases_dir();
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&leases)
                .or_else(|e| if leases.is_dir() { Ok(()) } else { Err(e) })
                .map_err(|e| fix(e, &leases))?;
        }
        Ok(store)
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs/sha256")
    }

    fn images_dir(&self) -> PathBuf {
        self.root.join("images")
    }

    /// Temp files: `tmp/`, or this host's `tmp/<host>/` in a shared store.
    fn tmp_dir(&self) -> PathBuf {
        match self.shared {
            Some(_) => self.root.join("tmp").join(shared::host_key()),
            None => self.root.join("tmp"),
        }
    }

    /// Pull leases of a shared store.
    fn leases_dir(&self) -> PathBuf {
        self.root.join("leases")
    }

    /// Outdated images of a shared store, kept until `gc --min-age`.
    fn retired_dir(&self) -> PathBuf {
        self.root.join("retired")
    }

    fn locks_dir(&self) -> PathBuf {
        self.root.join("locks")
    }

    /// Where the blob `digest` lives once downloaded and verified.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs_dir().join(digest.hex())
    }

    /// The directory of the image whose manifest digest is `digest`.
    pub fn image_dir(&self, digest: &Digest) -> PathBuf {
        self.images_dir().join(digest.hex())
    }

    /// Pulls `image` for this machine's platform: asks the registry for the
    /// manifest, returns the stored image if it is there, else downloads and
    /// converts it. A failed pull leaves no partial or unverified file behind.
    pub fn pull(&self, image: &ImageRef, options: &PullOptions) -> Result<StoredImage> {
        pull::pull(self, image, options)
    }

    /// The stored image with manifest digest `digest`, if it is in the store
    /// (made by the current converter version).
    pub fn lookup_digest(&self, digest: &str) -> Result<Option<StoredImage>> {
        let digest = Digest::parse(digest).map_err(anyhow::Error::msg)?;
        self.load(&digest)
    }

    /// The stored image whose manifest digest, or index digest for this
    /// machine's platform, is `pinned`: its manifest digest and metadata.
    fn find_pinned(&self, pinned: &Digest) -> Result<Option<(Digest, ImageMeta)>> {
        if let Some(meta) = self.read_meta(pinned) {
            return Ok(Some((pinned.clone(), meta)));
        }
        let here = Platform::current();
        let entries = match fs::read_dir(self.images_dir()) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot list {}", self.images_dir().display()))
            }
        };
        for entry in entries.flatten() {
            let Ok(digest) =
                Digest::parse(&format!("sha256:{}", entry.file_name().to_string_lossy()))
            else {
                continue;
            };
            let Some(meta) = self.read_meta(&digest) else {
                continue;
            };
            let platform_ok = meta
                .platform
                .as_ref()
                .is_none_or(|p| p.os == here.os && p.architecture == here.architecture);
            if meta.index_digest.as_deref() == Some(pinned.as_str()) && platform_ok {
                return Ok(Some((digest, meta)));
            }
        }
        Ok(None)
    }

    /// Whether `image` is in the store (whoever pulled it): its digest
    /// under any repository name, or its tag of its repository.
    pub fn has_cached(&self, image: &ImageRef) -> bool {
        let Ok(entries) = fs::read_dir(self.images_dir()) else {
            return false;
        };
        entries.flatten().any(|entry| {
            let Ok(digest) =
                Digest::parse(&format!("sha256:{}", entry.file_name().to_string_lossy()))
            else {
                return false;
            };
            let Some(meta) = self.read_meta(&digest) else {
                return false;
            };
            match (&image.digest, &image.tag) {
                // A digest names the same bytes under any repository name.
                (Some(pinned), _) => {
                    *pinned == meta.manifest_digest || Some(pinned) == meta.index_digest.as_ref()
                }
                (None, tag) => meta.came_from(image) && *tag == meta.tag,
            }
        })
    }

    /// `meta.json` of the image `digest`, when present and readable.
    fn read_meta(&self, digest: &Digest) -> Option<ImageMeta> {
        let bytes = self
            .read_image_file(digest, "meta.json", files::MAX_META_BYTES)
            .ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Reads a stored image's metadata and config; `None` when absent or made
    /// by another converter version.
    fn load(&self, digest: &Digest) -> Result<Option<StoredImage>> {
        let dir = self.image_dir(digest);
        let meta_path = dir.join("meta.json");
        let meta: ImageMeta =
            match self.read_image_file(digest, "meta.json", files::MAX_META_BYTES)? {
                Some(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                    format!(
                        "stored image metadata {} is corrupt: remove {} and pull again",
                        meta_path.display(),
                        dir.display()
                    )
                })?,
                None => return Ok(None),
            };
        if meta.converter_version != CONVERTER_VERSION {
            return Ok(None);
        }
        let config_path = dir.join("config.json");
        let config: ImageConfig = self
            .read_image_file(digest, "config.json", files::MAX_CONFIG_BYTES)
            .and_then(|b| b.context("missing"))
            .and_then(|b| Ok(serde_json::from_slice(&b)?))
            .with_context(|| {
                format!(
                    "stored image config {} is unreadable: remove {} and pull again",
                    config_path.display(),
                    dir.display()
                )
            })?;
        let squashfs = dir.join("image.sqfs");
        if !squashfs.is_file() {
            bail!(
                "stored image {} has no image.sqfs: remove {} and pull again",
                digest,
                dir.display()
            );
        }
        Ok(Some(StoredImage {
            squashfs,
            config,
            manifest_digest: Some(meta.manifest_digest.clone()),
            reference: Some(meta.reference()),
        }))
    }

    /// A squashfs file given by path, after checking that it is a squashfs
    /// file. Opened by the caller's identity, non-blocking (a FIFO cannot
    /// stall the open), checked as [`Store::squashfs_file_from`] does. Its
    /// config is the one it carries ([`crate::image::carried`]), read as
    /// the caller unless that is root (root never parses a user's bytes:
    /// root's callers re-pack the file through the pull user instead).
    pub fn open_squashfs_file(path: &Path) -> Result<StoredImage> {
        let mut file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .with_context(|| {
                format!(
                    "cannot open squashfs image {}: check the path",
                    path.display()
                )
            })?;
        let mut image = Store::squashfs_file_from(path, &mut file)?;
        if !nix::unistd::geteuid().is_root() {
            let carried = userfile::read_carried_config(&image.squashfs);
            if !carried.notes.is_empty() {
                eprintln!("berth: {}: {}", path.display(), carried.notes.join("; "));
            }
            image.config = carried.config.unwrap_or_default();
        }
        Ok(image)
    }

    /// The squashfs file `path` that the caller has opened as `file`: what
    /// was opened (never the path again) must be a regular file starting
    /// with the squashfs magic. The image's path is the one the descriptor
    /// resolved to.
    pub fn squashfs_file_from(path: &Path, file: &mut fs::File) -> Result<StoredImage> {
        let meta = file
            .metadata()
            .with_context(|| format!("cannot stat squashfs image {}", path.display()))?;
        if !meta.is_file() {
            bail!(
                "{} is not a regular file (a FIFO, a device or a folder); give a squashfs file \
                 or an image reference",
                path.display()
            );
        }
        let head = file_head(file)
            .with_context(|| format!("cannot read squashfs image {}", path.display()))?;
        if !head.starts_with(SQUASHFS_MAGIC) && !archive::is_tar(&head) {
            bail!(
                "{} is not a squashfs image (it does not start with the squashfs magic 'hsqs') \
                 nor a tar archive (a docker or OCI archive); give a squashfs file (e.g. made by \
                 `--container-save` or `enroot import`), an archive (`docker save`, `skopeo copy ... \
                 oci-archive:FILE`) or an image reference",
                path.display()
            );
        }
        let link = format!("/proc/self/fd/{}", file.as_raw_fd());
        let squashfs =
            fs::read_link(&link).with_context(|| format!("cannot resolve {}", path.display()))?;
        Ok(StoredImage {
            squashfs,
            config: ImageConfig::default(),
            manifest_digest: None,
            reference: None,
        })
    }
}

/// What the CLI calls as its caller: a registry image is pulled into the
/// store at `store_root`; a squashfs file is checked and used in place; an
/// archive file, or a local engine's image (saved by the caller's own
/// `docker`/`podman`), is converted into the store.
pub fn pull_image(
    store_root: &Path,
    source: &ImageSource,
    options: &PullOptions,
) -> Result<StoredImage> {
    match source {
        ImageSource::Registry(image) => match options.shared {
            Some(settings) => Store::open_shared(store_root, settings)?.pull(image, options),
            None => Store::open(store_root)?.pull(image, options),
        },
        ImageSource::SquashfsFile(path) => {
            let image = Store::open_squashfs_file(path)?;
            let file = fs::File::open(&image.squashfs)
                .with_context(|| format!("cannot open {}", path.display()))?;
            if !archive::is_tar(&file_head(&file)?) {
                return Ok(image);
            }
            // An archive is converted by its user, into their own store.
            let store = match options.shared {
                Some(settings) => Store::open_shared(store_root, settings)?,
                None => Store::open(store_root)?,
            };
            store.import_user_file(file, &path.display().to_string(), options.max_image_bytes)
        }
        ImageSource::Daemon(source) => {
            // The caller's own engine, asked as the caller.
            let engine = source.engine;
            let mut command = std::process::Command::new(engine.program());
            command.args(engine.save_args(&source.image));
            let stream = toolstream::ToolStream::start(
                command,
                &format!("{} save of {source}", engine.program()),
                engine.program(),
            )?;
            Store::open(store_root)?.import_user_stream(
                stream,
                &source.to_string(),
                options.max_image_bytes,
            )
        }
    }
}

/// The first 512 bytes of `file` (fewer for a shorter file), read without
/// moving its offset: enough for the squashfs magic and a tar header.
pub fn file_head(file: &fs::File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut head = vec![0u8; 512];
    let mut filled = 0;
    while filled < head.len() {
        match file.read_at(&mut head[filled..], filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    head.truncate(filled);
    Ok(head)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_manage;
