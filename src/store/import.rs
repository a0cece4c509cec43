//! The store's side of fan-out (`crate::fanout`): what the node that pulled
//! an image sends ([`Store::fanout_source`]), and how a node that receives it
//! publishes it like a pulled image ([`Store::import`]), after checking the
//! manifest against its digest and every byte of the squashfs against the
//! sender's sha256.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::catalog::LAST_USED;
use super::files::{MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES};
use super::{ImageMeta, Store, StoredImage};
use crate::fsutil::{sync_dir, write_synced, FileLock, TempEntry};
use crate::image::{ImageConfig, CONVERTER_VERSION};
use crate::registry::digest::HashingWriter;
use crate::registry::Digest;

/// A stored image as the fan-out sender describes it.
#[derive(Debug, Clone)]
pub struct FanoutSource {
    /// The image's `image.sqfs` in this store.
    pub squashfs: PathBuf,
    /// `sha256:...` of `image.sqfs`.
    pub squashfs_digest: String,
    /// Size of `image.sqfs` in bytes.
    pub squashfs_size: u64,
    /// The image's `meta.json`.
    pub meta: ImageMeta,
    /// The image's runtime config.
    pub config: ImageConfig,
    /// The image manifest, exact registry bytes (JSON, so UTF-8).
    pub manifest: String,
}

/// What a receiver was told about an image it is about to import.
#[derive(Debug, Clone, Copy)]
pub struct ImportRequest<'a> {
    /// `meta.json` as the sender has it.
    pub meta: &'a ImageMeta,
    /// The runtime config.
    pub config: &'a ImageConfig,
    /// The image manifest; its sha256 must be `meta.manifest_digest`.
    pub manifest: &'a str,
    /// `sha256:...` the squashfs must have.
    pub squashfs_digest: &'a str,
    /// The size the squashfs must have.
    pub squashfs_size: u64,
}

impl Store {
    /// Describes the stored image `digest` for sending: reads its metadata
    /// and hashes its squashfs (one read of the whole file).
    pub fn fanout_source(&self, digest: &str) -> Result<FanoutSource> {
        let parsed = Digest::parse(digest).map_err(anyhow::Error::msg)?;
        let meta = self
            .read_meta(&parsed)
            .with_context(|| format!("image {digest} has no readable meta.json in the store"))?;
        if meta.converter_version != CONVERTER_VERSION {
            bail!("image {digest} in the store was made by another converter version");
        }
        let read = |name: &str, limit: u64| {
            self.read_image_file(&parsed, name, limit)?
                .with_context(|| format!("image {digest} has no {name} in the store"))
        };
        let config: ImageConfig =
            serde_json::from_slice(&read("config.json", MAX_CONFIG_BYTES)?)
                .with_context(|| format!("the config.json of image {digest} is not valid JSON"))?;
        let manifest = String::from_utf8(read("manifest.json", MAX_MANIFEST_BYTES)?)
            .with_context(|| format!("the manifest.json of image {digest} is not UTF-8"))?;
        let squashfs = self.image_dir(&parsed).join("image.sqfs");
        let mut file = self.open_image_file(&parsed, "image.sqfs")?;
        let mut hasher = HashingWriter::new(io::sink());
        io::copy(&mut file, &mut hasher)
            .with_context(|| format!("cannot read {}", squashfs.display()))?;
        let (squashfs_digest, squashfs_size, _) = hasher.finish();
        Ok(FanoutSource {
            squashfs,
            squashfs_digest: squashfs_digest.to_string(),
            squashfs_size,
            meta,
            config,
            manifest,
        })
    }

    /// Publishes an image received from another node: checks the manifest
    /// against `meta.manifest_digest` and the converter version, copies
    /// `squashfs` into `tmp/` while hashing it, and publishes it only when
    /// size and sha256 are the ones announced. An image that is already in
    /// the store (another step imported or pulled it meanwhile) is returned
    /// as it is.
    pub fn import(&self, request: &ImportRequest, squashfs: File) -> Result<StoredImage> {
        let meta = request.meta;
        let digest = Digest::parse(&meta.manifest_digest).map_err(anyhow::Error::msg)?;
        if Digest::of_bytes(request.manifest.as_bytes()) != digest {
            bail!("the manifest sent does not have the digest {digest}");
        }
        if meta.converter_version != CONVERTER_VERSION {
            bail!(
                "the image was converted by converter version {}, this node has {}",
                meta.converter_version,
                CONVERTER_VERSION
            );
        }
        let lock_path = self.locks_dir().join(format!("{}.lock", digest.hex()));
        let _lock = FileLock::exclusive(&lock_path, || {})?;
        if let Some(found) = self.load(&digest)? {
            self.touch_last_used(&digest);
            return Ok(found);
        }
        // Root stages in a folder of its own, never in the pull user's tmp/.
        let staging = TempEntry::dir(
            &self.staging_dir()?,
            &format!("image-{}", digest.hex()),
            0o755,
        )?;
        let target = staging.path().join("image.sqfs");
        copy_verified(squashfs, &target, request)?;
        write_synced(
            &staging.path().join("config.json"),
            &serde_json::to_vec_pretty(request.config)?,
        )?;
        write_synced(
            &staging.path().join("manifest.json"),
            request.manifest.as_bytes(),
        )?;
        write_synced(
            &staging.path().join("meta.json"),
            &serde_json::to_vec_pretty(meta)?,
        )?;
        write_synced(&staging.path().join(LAST_USED), b"")?;
        sync_dir(staging.path())?;
        super::pull::publish(self, staging, &digest)?;
        self.load(&digest)?.with_context(|| {
            format!("image {digest} vanished from the store right after its import")
        })
    }
}

/// Copies `source` to the new file `target`, reading at most one byte more
/// than announced, and fails unless size and sha256 match.
fn copy_verified(source: File, target: &std::path::Path, request: &ImportRequest) -> Result<()> {
    let out = fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(target)
        .with_context(|| format!("cannot create {}", target.display()))?;
    let mut writer = HashingWriter::new(BufWriter::with_capacity(1 << 20, out));
    io::copy(&mut source.take(request.squashfs_size + 1), &mut writer)
        .with_context(|| format!("cannot copy the received squashfs to {}", target.display()))?;
    let (got, size, buffered) = writer.finish();
    if size != request.squashfs_size {
        bail!(
            "the received squashfs has {size} bytes, the sender announced {}",
            request.squashfs_size
        );
    }
    if got.as_str() != request.squashfs_digest {
        bail!(
            "the received squashfs has the digest {got}, the sender announced {}",
            request.squashfs_digest
        );
    }
    let out = buffered
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("cannot write {}", target.display()))?;
    out.sync_all()
        .with_context(|| format!("cannot sync {}", target.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta_for(manifest: &str) -> ImageMeta {
        ImageMeta {
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
            anonymous: true,
            origins: Vec::new(),
            user_file: false,
        }
    }

    fn source(dir: &std::path::Path, bytes: &[u8]) -> File {
        let path = dir.join("sent.sqfs");
        fs::write(&path, bytes).unwrap();
        File::open(path).unwrap()
    }

    #[test]
    fn import_checks_size_digest_and_manifest_then_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let manifest = r#"{"schemaVersion":2}"#;
        let meta = meta_for(manifest);
        let bytes = b"hsqs1234";
        let good = Digest::of_bytes(bytes).to_string();
        let config = ImageConfig::default();
        let request = ImportRequest {
            meta: &meta,
            config: &config,
            manifest,
            squashfs_digest: &good,
            squashfs_size: 8,
        };
        let tampered = source(dir.path(), b"hsqs1235");
        let e = store.import(&request, tampered).unwrap_err();
        assert!(format!("{e:#}").contains("digest"), "{e:#}");
        let longer = source(dir.path(), b"hsqs12345");
        let e = store.import(&request, longer).unwrap_err();
        assert!(format!("{e:#}").contains("9 bytes"), "{e:#}");
        assert!(store
            .lookup_digest(&meta.manifest_digest)
            .unwrap()
            .is_none());
        let bad_manifest = ImportRequest {
            manifest: r#"{"schemaVersion":3}"#,
            ..request
        };
        let e = store
            .import(&bad_manifest, source(dir.path(), bytes))
            .unwrap_err();
        assert!(format!("{e:#}").contains("manifest"), "{e:#}");

        let stored = store.import(&request, source(dir.path(), bytes)).unwrap();
        assert_eq!(fs::read(&stored.squashfs).unwrap(), bytes);
        let sent = store.fanout_source(&meta.manifest_digest).unwrap();
        assert_eq!(sent.squashfs_digest, good);
        assert_eq!(sent.squashfs_size, 8);
        assert_eq!(sent.manifest, manifest);
        assert_eq!(sent.meta, meta);
    }
}
