//! `berth inspect`: everything the store knows about one image, as JSON.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use super::catalog::{epoch_secs, ImageEntry};
use crate::image::ImageConfig;
use crate::registry::{Manifest, Platform};

/// The description of a stored image that `berth inspect` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageDetails {
    /// `registry/repository:tag` as pulled.
    pub reference: String,
    /// Manifest digest.
    pub digest: String,
    /// The index the manifest was chosen from, if any.
    pub index_digest: Option<String>,
    /// Platform chosen from the index (`null` for a single-platform image).
    pub platform: Option<Platform>,
    /// Bytes the image takes in the store (its folder, blobs not counted).
    pub size: u64,
    /// Sum of the compressed layer sizes.
    pub compressed_size: u64,
    /// The squashfs file to mount.
    pub squashfs: PathBuf,
    /// Conversion time, seconds since the epoch.
    pub created: u64,
    /// Last pull or use, seconds since the epoch.
    pub last_used: u64,
    /// The converter version that made the squashfs file.
    pub converter_version: u32,
    /// Runtime settings from the image configuration.
    pub config: ConfigDetails,
    /// Layers, lowest first.
    pub layers: Vec<LayerDetails>,
}

/// The image configuration, named as in the OCI image config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ConfigDetails {
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    /// `ENTRYPOINT`.
    pub entrypoint: Option<Vec<String>>,
    /// `CMD`.
    pub cmd: Option<Vec<String>>,
    /// `WORKDIR`.
    pub working_dir: Option<String>,
    /// `USER`.
    pub user: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// One layer of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerDetails {
    /// Blob digest.
    pub digest: String,
    /// Compressed size in bytes.
    pub size: u64,
    /// Media type (empty when the manifest gave none).
    pub media_type: String,
}

impl From<ImageConfig> for ConfigDetails {
    fn from(c: ImageConfig) -> ConfigDetails {
        ConfigDetails {
            env: c.env,
            entrypoint: c.entrypoint,
            cmd: c.cmd,
            working_dir: c.working_dir,
            user: c.user,
            labels: c.labels,
        }
    }
}

impl ImageEntry {
    /// Reads the image's config and manifest from its folder.
    pub fn details(&self) -> Result<ImageDetails> {
        let broken = |file: &str| {
            format!(
                "cannot read {} of image {}: remove it with `berth rmi {}` and pull again",
                self.dir.join(file).display(),
                self.name(),
                self.digest
            )
        };
        let config: ImageConfig = fs::read(self.dir.join("config.json"))
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(serde_json::from_slice(&b)?))
            .with_context(|| broken("config.json"))?;
        let manifest_bytes =
            fs::read(self.dir.join("manifest.json")).with_context(|| broken("manifest.json"))?;
        let layers = match Manifest::parse(&manifest_bytes, None, &self.name())
            .with_context(|| broken("manifest.json"))?
        {
            Manifest::Image(m) => m
                .layers
                .into_iter()
                .map(|l| LayerDetails {
                    digest: l.digest,
                    size: l.size,
                    media_type: l.media_type,
                })
                .collect(),
            Manifest::Index(_) => anyhow::bail!(
                "{}: is an index, not an image manifest",
                broken("manifest.json")
            ),
        };
        Ok(ImageDetails {
            reference: self.name(),
            digest: self.digest.to_string(),
            index_digest: self.meta.index_digest.clone(),
            platform: self.meta.platform.clone(),
            size: self.size,
            compressed_size: self.meta.compressed_size,
            squashfs: self.squashfs(),
            created: self.meta.created,
            last_used: epoch_secs(self.last_used),
            converter_version: self.meta.converter_version,
            config: config.into(),
            layers,
        })
    }
}
