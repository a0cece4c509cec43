//! Files that users give (`--container-image=/path/x.sqsh`, a
//! `--container-save` output given back, a docker or OCI archive `x.tar`,
//! what `docker save` / `podman save` wrote for `dockerd://` / `podman://`):
//! re-packed once into the store, so that the kernel's squashfs driver only
//! ever parses bytes berth's own converter wrote ([`Store::import_user_file`],
//! [`Store::import_user_stream`]).
//!
//! The caller (the pull helper, as the pull user) holds a descriptor of the
//! user's file and cannot open the file by path. The bytes are hashed; the
//! image's key is a sha256 of that digest under a label of its own
//! ([`user_file_key`]), so no registry manifest can ever name it. A key
//! already in the store costs one read of the file. Otherwise the file is
//! copied into `tmp/` (hashing again: the copy must be the bytes hashed),
//! `sqfs2tar` (squashfs-tools-ng, the one parser of the user's bytes, run
//! as the pull user) turns the copy into a tar stream, and the store's layer
//! conversion turns that into `image.sqfs`, published like a pulled image
//! with `meta.json` saying it came from a file ([`ImageMeta::user_file`]).
//! An archive (a tar, by its first bytes) is read by [`super::archive`]
//! instead: its layers go through the same conversion, and its image
//! configuration (Env, WorkingDir, Entrypoint, Cmd) is kept in `config.json`.
//!
//! The image configuration a squashfs file carries in its root (berth's
//! JSON of a `--container-save`, or enroot's `/etc/environment` and
//! `/etc/rc`: see [`image::carried`]) is read from the copy with
//! `rdsquashfs --cat`, also as the pull user, and stored as the image's
//! `config.json`.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use super::catalog::LAST_USED;
use super::toolstream::ToolStream;
use super::{archive, ImageMeta, Store, StoredImage, SQUASHFS_MAGIC};
use crate::fsutil::{sync_dir, write_synced, FileLock, TempEntry};
use crate::image::{self, Layer, SquashfsOptions, CONVERTER_VERSION};
use crate::registry::digest::HashingWriter;
use crate::registry::Digest;

/// The squashfs-to-tar tool of squashfs-tools-ng.
const SQFS2TAR: &str = "sqfs2tar";

/// The squashfs reader of squashfs-tools-ng (for single files).
const RDSQUASHFS: &str = "rdsquashfs";

/// The label hashed with a file's digest into its image key (squashfs
/// images and archives alike: one file's bytes are one or the other; v2:
/// the image configuration a squashfs file carries is read).
const KEY_LABEL: &str = "berth user squashfs file v2";

/// The most bytes of one carried configuration file read.
const MAX_CARRIED_BYTES: usize = 1 << 20;

/// What to install for [`SQFS2TAR`].
const SQFS2TAR_PACKAGE: &str = "squashfs-tools-ng";

/// The store key of a user's file whose bytes have the sha256 `file`:
/// sha256 of a label and that digest, which no registry manifest has.
pub fn user_file_key(file: &Digest) -> Digest {
    Digest::of_bytes(format!("{KEY_LABEL}\n{file}\n").as_bytes())
}

impl Store {
    /// Re-packs the user's file open as `file` (named `name` in messages):
    /// a squashfs image or a docker/OCI archive, into the store, once:
    /// returns the stored copy. A file that is neither fails with a message
    /// naming `name`, and leaves the store as it was.
    pub fn import_user_file(
        &self,
        mut file: File,
        name: &str,
        max_image_bytes: u64,
    ) -> Result<StoredImage> {
        let file_digest = hash_from_start(&mut file, name, io::sink())?.0;
        let key = user_file_key(&file_digest);
        let _lock = self.import_lock(&key, name)?;
        if let Some(found) = self.load(&key)? {
            self.touch_last_used(&key);
            return Ok(found);
        }
        eprintln!("berth: importing {name} into the image store (once per content)");
        let (copy_entry, copy) = TempEntry::file(&self.tmp_dir(), &format!("file-{}", key.hex()))?;
        let (copied, size, _) = hash_from_start(&mut file, name, BufWriter::new(copy))?;
        if copied != file_digest {
            bail!("{name} changed while berth imported it: start the job again once it is written");
        }
        self.convert_copy(&copy_entry, &key, &file_digest, size, name, max_image_bytes)
    }

    /// Like [`Store::import_user_file`] for an archive read once from
    /// `stream` (what `docker save` or `podman save` wrote), at most
    /// `max_image_bytes` of it: copied into `tmp/` first, then imported
    /// under the key of the copy's bytes.
    pub fn import_user_stream(
        &self,
        stream: impl Read,
        name: &str,
        max_image_bytes: u64,
    ) -> Result<StoredImage> {
        eprintln!("berth: importing {name} into the image store");
        let (copy_entry, copy) = TempEntry::file(&self.tmp_dir(), "stream")?;
        let mut hasher = HashingWriter::new(BufWriter::new(copy));
        io::copy(&mut stream.take(max_image_bytes + 1), &mut hasher)
            .with_context(|| format!("cannot read {name}"))?;
        let (file_digest, size, mut out) = hasher.finish();
        out.flush()
            .with_context(|| format!("cannot copy {name} into the image store"))?;
        drop(out);
        if size > max_image_bytes {
            bail!(
                "{name} is larger than max_image_size ({max_image_bytes} bytes): berth refuses \
                 it (ask your admin to raise max_image_size)"
            );
        }
        let key = user_file_key(&file_digest);
        let _lock = self.import_lock(&key, name)?;
        if let Some(found) = self.load(&key)? {
            self.touch_last_used(&key);
            return Ok(found);
        }
        self.convert_copy(&copy_entry, &key, &file_digest, size, name, max_image_bytes)
    }

    /// The lock that one import of `key` holds.
    fn import_lock(&self, key: &Digest, name: &str) -> Result<FileLock> {
        let lock_path = self.locks_dir().join(format!("{}.lock", key.hex()));
        FileLock::exclusive(&lock_path, || {
            eprintln!("berth: waiting for another import of {name}")
        })
    }

    /// Converts the copy in `copy` (a squashfs image or an archive, told by
    /// its first bytes) into `image.sqfs` and publishes it under `key`.
    fn convert_copy(
        &self,
        copy: &TempEntry,
        key: &Digest,
        file_digest: &Digest,
        size: u64,
        name: &str,
        max_image_bytes: u64,
    ) -> Result<StoredImage> {
        let copy_path = copy.path().to_path_buf();
        let head = File::open(&copy_path)
            .and_then(|f| super::file_head(&f))
            .with_context(|| format!("cannot read the copy of {name}"))?;
        let (layers, config, config_from) = if head.starts_with(SQUASHFS_MAGIC) {
            let carried = read_carried_config(&copy_path);
            if !carried.notes.is_empty() {
                eprintln!("berth: {name}: {}", carried.notes.join("; "));
            }
            let config_from = match carried.source {
                Some(path) => format!("with the image configuration of its {path}"),
                None => "with no image configuration in it (defaults)".to_string(),
            };
            let label = name.to_string();
            let layer = Layer::from_opener(name, move || {
                let mut command = Command::new(SQFS2TAR);
                // Keep the root folder's metadata; refuse what tar cannot hold.
                command
                    .args(["--root-becomes", ".", "--no-skip"])
                    .arg(&copy_path);
                ToolStream::start(command, &format!("{SQFS2TAR} of {label}"), SQFS2TAR_PACKAGE)
                    .map(|t| Box::new(t) as Box<dyn Read + Send>)
            });
            (vec![layer], carried.config.unwrap_or_default(), config_from)
        } else if archive::is_tar(&head) {
            let image = archive::read(&copy_path, name)?;
            let from = "with the archive's image configuration".to_string();
            (image.layers, image.config, from)
        } else {
            bail!(
                "cannot import {name}: it is neither a squashfs image nor a docker or OCI \
                 archive; give one of those, or an image reference"
            );
        };
        let staging = TempEntry::dir(&self.tmp_dir(), &format!("image-{}", key.hex()), 0o755)?;
        let sqfs = staging.path().join("image.sqfs");
        let options = SquashfsOptions {
            max_bytes: max_image_bytes,
            ..SquashfsOptions::default()
        };
        let stats = image::convert(&layers, &sqfs, &options).with_context(|| {
            format!(
                "cannot import {name}: berth cannot read it as an image (truncated, corrupt, \
                 or made by an unsupported tool); make it again (`--container-save`, `enroot \
                 import`, `enroot export`, `docker save`) or give an image reference"
            )
        })?;
        let meta = ImageMeta {
            registry: String::new(),
            repository: String::new(),
            tag: None,
            manifest_digest: key.to_string(),
            index_digest: None,
            platform: None,
            layers: vec![file_digest.to_string()],
            compressed_size: size,
            squashfs_size: stats.image_size,
            converter_version: CONVERTER_VERSION,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            anonymous: false,
            origins: Vec::new(),
            user_file: true,
        };
        write_synced(
            &staging.path().join("config.json"),
            &serde_json::to_vec_pretty(&config)?,
        )?;
        write_synced(
            &staging.path().join("meta.json"),
            &serde_json::to_vec_pretty(&meta)?,
        )?;
        write_synced(&staging.path().join(LAST_USED), b"")?;
        sync_dir(staging.path())?;
        super::pull::publish(self, staging, key)?;
        eprintln!(
            "berth: imported {name} ({} MB) as {key}, {config_from}",
            stats.image_size >> 20
        );
        self.load(key)?
            .with_context(|| format!("the import of {name} vanished from the store"))
    }
}

/// The image configuration the squashfs file at `path` carries in its root
/// ([`image::carried`]). Reads a user's bytes: run as the pull user or as
/// the user, never as root.
pub fn read_carried_config(path: &Path) -> image::carried::Found {
    image::carried::read(|inside| cat_file(path, inside))
}

/// The bytes of the regular file `inside` of the squashfs file at `path`
/// (at most [`MAX_CARRIED_BYTES`]); `None` when it is missing, no regular
/// file, larger, or the tool fails.
fn cat_file(path: &Path, inside: &str) -> Option<Vec<u8>> {
    let mut child = Command::new(RDSQUASHFS)
        .arg("--cat")
        .arg(inside)
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut bytes = Vec::new();
    let read = child.stdout.take().map(|out| {
        out.take(MAX_CARRIED_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
    });
    let whole = matches!(read, Some(Ok(_))) && bytes.len() <= MAX_CARRIED_BYTES;
    if !whole {
        let _ = child.kill();
    }
    let status = child.wait().ok()?;
    (whole && status.success()).then_some(bytes)
}

/// Reads `file` from its start to its end into `out`, hashing: the digest,
/// the size and `out`, flushed.
fn hash_from_start<W: io::Write>(file: &mut File, name: &str, out: W) -> Result<(Digest, u64, W)> {
    file.seek(SeekFrom::Start(0))
        .with_context(|| format!("cannot read {name}"))?;
    let mut hasher = HashingWriter::new(out);
    io::copy(file, &mut hasher).with_context(|| format!("cannot read {name}"))?;
    let (digest, size, mut out) = hasher.finish();
    out.flush()
        .with_context(|| format!("cannot copy {name} into the image store"))?;
    Ok((digest, size, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ImageConfig;

    #[test]
    fn keys_of_user_files_are_no_digest_of_the_bytes() {
        let digest = Digest::of_bytes(b"hsqs");
        let key = user_file_key(&digest);
        assert_ne!(key, digest);
        assert_eq!(key, user_file_key(&Digest::of_bytes(b"hsqs")));
    }

    #[test]
    fn a_garbage_file_is_refused_by_name_and_leaves_the_store_as_it_was() {
        if which_sqfs2tar().is_none() {
            assert!(
                std::env::var_os("BERTH_REQUIRE_CLUSTER").is_none(),
                "sqfs2tar is missing"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let path = dir.path().join("x.sqsh");
        std::fs::write(&path, b"hsqs and then garbage, not a superblock").unwrap();
        let e = store
            .import_user_file(File::open(&path).unwrap(), "/home/u/x.sqsh", 1 << 30)
            .unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("/home/u/x.sqsh"), "{text}");
        assert!(text.contains("sqfs2tar"), "{text}");
        let left = |sub: &str| {
            std::fs::read_dir(dir.path().join("store").join(sub)).map_or(0, |d| d.count())
        };
        assert_eq!(left("images"), 0);
        assert_eq!(left("tmp"), 0);
    }

    /// A squashfs file in `dir` whose root carries berth's JSON naming
    /// `/carried`, and enroot's files naming `/enroot`; `None` without
    /// gensquashfs.
    fn carrying_file(dir: &Path, with_berths: bool) -> Option<std::path::PathBuf> {
        let root = dir.join("root");
        std::fs::create_dir_all(root.join(".berth")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        if with_berths {
            std::fs::write(
                root.join(".berth/image-config.json"),
                br#"{"config":{"Env":["PATH=/carried/bin"],"WorkingDir":"/carried"}}"#,
            )
            .unwrap();
        }
        std::fs::write(root.join("etc/environment"), b"PATH=/enroot/bin\n").unwrap();
        std::fs::write(
            root.join("etc/rc"),
            b"cd \"/enroot\" && unset OLDPWD || exit 1\nexec '/e' \"$@\"\nexec '/e' 'c'\n",
        )
        .unwrap();
        let file = dir.join(format!("carrying-{with_berths}.sqfs"));
        let made = Command::new("gensquashfs")
            .arg("--pack-dir")
            .arg(&root)
            .args(["--quiet", "--force"])
            .arg(&file)
            .status()
            .ok()?
            .success();
        std::fs::remove_dir_all(&root).unwrap();
        made.then_some(file)
    }

    #[test]
    fn an_import_keeps_the_config_the_file_carries() {
        let dir = tempfile::tempdir().unwrap();
        let (Some(file), Some(())) = (carrying_file(dir.path(), false), which_sqfs2tar()) else {
            assert!(std::env::var_os("BERTH_REQUIRE_CLUSTER").is_none());
            return;
        };
        let found = read_carried_config(&file);
        assert_eq!(found.source, Some(image::carried::ENROOT_RC));
        let store = Store::open(dir.path().join("store")).unwrap();
        let stored = store
            .import_user_file(File::open(&file).unwrap(), "/home/u/x.sqsh", 1 << 30)
            .unwrap();
        assert_eq!(stored.config.env, ["PATH=/enroot/bin"]);
        assert_eq!(stored.config.working_dir.as_deref(), Some("/enroot"));
        assert_eq!(stored.config.entrypoint, Some(vec!["/e".to_string()]));
        assert_eq!(stored.config.cmd, Some(vec!["c".to_string()]));
    }

    #[test]
    fn root_never_reads_the_config_of_a_file_used_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let Some(file) = carrying_file(dir.path(), true) else {
            assert!(std::env::var_os("BERTH_REQUIRE_CLUSTER").is_none());
            return;
        };
        assert_eq!(
            read_carried_config(&file).source,
            Some(image::carried::BERTH_CONFIG)
        );
        let image = Store::open_squashfs_file(&file).unwrap();
        if nix::unistd::geteuid().is_root() {
            // Root's callers re-pack the file through the pull user instead.
            assert_eq!(image.config, ImageConfig::default());
        } else {
            assert_eq!(image.config.env, ["PATH=/carried/bin"]);
            assert_eq!(image.config.working_dir.as_deref(), Some("/carried"));
        }
    }

    fn which_sqfs2tar() -> Option<()> {
        Command::new(SQFS2TAR)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| ())
    }
}
