//! Docker and OCI archive files (what `docker save`, `podman save` and
//! `skopeo copy ... docker-archive:|oci-archive:` write): a tar holding an
//! image's manifest, configuration and layer blobs.
//!
//! The archive's bytes are untrusted: this module runs as the pull user (the
//! import helper) or as the user themselves (the rootless CLI), on a copy in
//! the store's `tmp/`. The outer tar is only indexed, never unpacked: each
//! regular file's position and size is kept, so nothing of it is ever
//! written to a host path. A name with `..` or a leading `/`, a symbolic
//! link that leads out of the archive, a manifest or configuration larger
//! than [`MAX_JSON`], or more than [`MAX_ENTRIES`] entries are refused by
//! name. The layers are handed to the store's layer conversion as they are
//! (the same code that reads registry layers).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::image::{ImageConfig, Layer};
use crate::registry::manifest::Manifest;
use crate::registry::{Digest, Platform};

/// The largest manifest, index or configuration read from an archive.
pub const MAX_JSON: u64 = 4 << 20;

/// The most entries an archive may have.
pub const MAX_ENTRIES: usize = 100_000;

/// The most symbolic links followed to reach one blob.
const MAX_LINK_HOPS: usize = 8;

/// The most nested indexes followed in an OCI archive.
const MAX_INDEX_DEPTH: usize = 4;

/// Whether `head` (the first 512 bytes of a file) is a tar header: the
/// `ustar` magic at offset 257 (POSIX and GNU tar both write it).
pub fn is_tar(head: &[u8]) -> bool {
    head.len() >= 262 && &head[257..262] == b"ustar"
}

/// An image read from an archive: its configuration and its layers, lowest
/// first, each reading its slice of the archive file.
pub struct ArchiveImage {
    /// Env, WorkingDir, Entrypoint, Cmd, ... from the image configuration.
    pub config: ImageConfig,
    /// The layers, lowest first.
    pub layers: Vec<Layer>,
}

/// What one archive entry is.
#[derive(Debug, Clone)]
enum Entry {
    /// A regular file: where its bytes start in the archive, how many.
    File { offset: u64, size: u64 },
    /// A symbolic or hard link to another entry (a normalized archive path).
    Link(String),
}

/// The index of an archive's entries by normalized path.
struct Index {
    path: PathBuf,
    name: String,
    entries: HashMap<String, Entry>,
}

/// Reads the image in the archive at `path` (the store's copy; `name` is
/// the user's name for it in messages): docker-archive (`manifest.json`)
/// or OCI layout (`index.json`).
pub fn read(path: &Path, name: &str) -> Result<ArchiveImage> {
    let index = Index::build(path, name)?;
    if index.entries.contains_key("manifest.json") {
        index.docker_image()
    } else if index.entries.contains_key("index.json") {
        index.oci_image()
    } else {
        bail!(
            "{name} is a tar file but neither a docker archive (no manifest.json) nor an OCI \
             archive (no index.json): make it with `docker save`, `podman save` or `skopeo \
             copy ... docker-archive:FILE` / `oci-archive:FILE`"
        )
    }
}

/// `docker save`'s `manifest.json`: one entry per image.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    layers: Vec<String>,
}

impl Index {
    /// Indexes the tar at `path`.
    fn build(path: &Path, name: &str) -> Result<Index> {
        let file = File::open(path).with_context(|| format!("cannot open the copy of {name}"))?;
        let mut archive = tar::Archive::new(file);
        let mut entries = HashMap::new();
        let bad = |e: io::Error| anyhow::anyhow!("{name} is not a readable tar archive: {e}");
        for entry in archive.entries().map_err(bad)? {
            let entry = entry.map_err(bad)?;
            if entries.len() >= MAX_ENTRIES {
                bail!("{name} has more than {MAX_ENTRIES} entries: it is no image archive");
            }
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let key = normalize(&raw).with_context(|| {
                format!("{name}: refused archive entry '{}'", raw.escape_debug())
            })?;
            let kind = entry.header().entry_type();
            let value = if kind.is_file() {
                Entry::File {
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                }
            } else if kind.is_symlink() || kind.is_hard_link() {
                let target = entry
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let resolved = if kind.is_symlink() {
                    resolve_symlink(&key, &target)
                } else {
                    normalize(&target)
                };
                Entry::Link(resolved.with_context(|| {
                    format!(
                        "{name}: refused link '{}' -> '{}'",
                        raw.escape_debug(),
                        target.escape_debug()
                    )
                })?)
            } else {
                continue;
            };
            entries.insert(key, value);
        }
        Ok(Index {
            path: path.to_path_buf(),
            name: name.to_string(),
            entries,
        })
    }

    /// The file entry at `path`, following links within the archive.
    fn file(&self, path: &str) -> Result<(u64, u64)> {
        let mut key = normalize(path).with_context(|| {
            format!(
                "{}: refused archive path '{}'",
                self.name,
                path.escape_debug()
            )
        })?;
        for _ in 0..=MAX_LINK_HOPS {
            match self.entries.get(&key) {
                Some(Entry::File { offset, size }) => return Ok((*offset, *size)),
                Some(Entry::Link(target)) => key = target.clone(),
                None => bail!(
                    "{}: the archive names '{}', which it does not hold (a truncated or \
                     hand-made archive?): save the image again",
                    self.name,
                    path.escape_debug()
                ),
            }
        }
        bail!(
            "{}: '{}' is a chain of more than {MAX_LINK_HOPS} links",
            self.name,
            path.escape_debug()
        )
    }

    /// The bytes of a small file of the archive (at most [`MAX_JSON`]).
    fn small_file(&self, path: &str) -> Result<Vec<u8>> {
        let (offset, size) = self.file(path)?;
        if size > MAX_JSON {
            bail!(
                "{}: '{}' is {size} bytes, more than the {MAX_JSON} a manifest or image \
                 configuration may have: berth refuses it",
                self.name,
                path.escape_debug()
            );
        }
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(size).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// A layer reading the file at `path` of the archive.
    fn layer(&self, path: &str) -> Result<Layer> {
        let (offset, size) = self.file(path)?;
        let archive = self.path.clone();
        let label = format!("{} of {}", path, self.name);
        Ok(Layer::from_opener(label, move || {
            let mut file = File::open(&archive)?;
            file.seek(SeekFrom::Start(offset))?;
            Ok(Box::new(file.take(size)) as Box<dyn Read + Send>)
        }))
    }

    /// The image configuration at `path`.
    fn config(&self, path: &str) -> Result<ImageConfig> {
        let bytes = self.small_file(path)?;
        ImageConfig::from_oci_json(&bytes).with_context(|| {
            format!(
                "{}: the image configuration '{}' is not valid JSON",
                self.name,
                path.escape_debug()
            )
        })
    }

    /// A docker archive: `manifest.json` names the config and the layers.
    fn docker_image(&self) -> Result<ArchiveImage> {
        let bytes = self.small_file("manifest.json")?;
        let images: Vec<DockerEntry> = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{}: manifest.json is not a docker archive manifest",
                self.name
            )
        })?;
        let [image] = &images[..] else {
            bail!(
                "{} holds {} images; berth takes an archive of one image (`docker save IMAGE`)",
                self.name,
                images.len()
            );
        };
        let layers = image
            .layers
            .iter()
            .map(|l| self.layer(l))
            .collect::<Result<Vec<_>>>()?;
        Ok(ArchiveImage {
            config: self.config(&image.config)?,
            layers,
        })
    }

    /// An OCI archive: `index.json`, then the manifest for this machine.
    fn oci_image(&self) -> Result<ArchiveImage> {
        let mut bytes = self.small_file("index.json")?;
        let mut media_type: Option<String> = None;
        for _ in 0..MAX_INDEX_DEPTH {
            match Manifest::parse(&bytes, media_type.as_deref(), &self.name)
                .map_err(|e| anyhow::anyhow!("{}: {e}", self.name))?
            {
                Manifest::Image(manifest) => {
                    let layers = manifest
                        .layers
                        .iter()
                        .map(|l| self.layer(&blob_path(&l.digest, &self.name)?))
                        .collect::<Result<Vec<_>>>()?;
                    return Ok(ArchiveImage {
                        config: self.config(&blob_path(&manifest.config.digest, &self.name)?)?,
                        layers,
                    });
                }
                Manifest::Index(index) => {
                    let here = Platform::current();
                    let chosen = if index.manifests.len() == 1 {
                        index.manifests.first()
                    } else {
                        index
                            .manifests
                            .iter()
                            .filter_map(|d| {
                                d.platform
                                    .as_ref()
                                    .and_then(|p| here.match_rank(p))
                                    .map(|rank| (rank, d))
                            })
                            .min_by_key(|(rank, _)| *rank)
                            .map(|(_, d)| d)
                    };
                    let Some(chosen) = chosen else {
                        bail!(
                            "{}: the archive holds no image for this machine's platform",
                            self.name
                        );
                    };
                    media_type = Some(chosen.media_type.clone()).filter(|m| !m.is_empty());
                    bytes = self.small_file(&blob_path(&chosen.digest, &self.name)?)?;
                }
            }
        }
        bail!("{}: more than {MAX_INDEX_DEPTH} nested indexes", self.name)
    }
}

/// `blobs/ALG/HEX` for a digest named in an OCI archive.
fn blob_path(digest: &str, name: &str) -> Result<String> {
    let digest = Digest::parse(digest).map_err(|e| {
        anyhow::anyhow!(
            "{name}: refused blob digest '{}': {e}",
            digest.escape_debug()
        )
    })?;
    Ok(format!("blobs/sha256/{}", digest.hex()))
}

/// An archive path without `.` parts or slashes at either end; `..`, a
/// leading `/` and an empty path are refused.
fn normalize(raw: &str) -> Result<String> {
    if raw.starts_with('/') {
        bail!("an absolute path");
    }
    let mut parts = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => bail!("'..' leads out of the archive"),
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        bail!("an empty path");
    }
    Ok(parts.join("/"))
}

/// Where the symbolic link `link` (a normalized path) to `target` leads,
/// inside the archive; a target above the archive's top or absolute is refused.
fn resolve_symlink(link: &str, target: &str) -> Result<String> {
    if target.starts_with('/') {
        bail!("an absolute link target leaves the archive");
    }
    let mut parts: Vec<&str> = link.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    bail!("the link target leaves the archive");
                }
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        bail!("the link leads to the archive's top");
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests;
