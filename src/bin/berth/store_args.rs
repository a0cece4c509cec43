//! The store and registry flags several verbs share (`--store`,
//! `--insecure-registry`, `--mirror`, ...), and their value parsers.

use std::path::PathBuf;

use anyhow::{bail, Result};

use berth::config::{parse_mirrors, Config};
use berth::helper::PullSettings;
use berth::store::{ProgressMode, Store};
use berth::units::parse_size;

/// The flags of a verb that pulls (`pull`, `run`).
#[derive(clap::Args)]
pub struct StoreArgs {
    /// Image store folder (default: from the config file, else /var/lib/berth for
    /// root and ~/.cache/berth for others).
    #[arg(long)]
    store: Option<PathBuf>,
    /// A registry (`host[:port]`) to reach over plain HTTP; repeatable.
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    /// A pull-through mirror, `REGISTRY=MIRROR` (e.g. `docker.io=mirror.site:5000`):
    /// images of REGISTRY are asked from MIRROR first; repeatable.
    #[arg(long = "mirror")]
    mirrors: Vec<String>,
    /// Retries of a failed registry request (default: 3, or `registry_retries` of the config file).
    #[arg(long)]
    registry_retries: Option<u32>,
    /// Seconds a registry may stay silent (connecting, or between two reads)
    /// before a request is abandoned (default: 30 to connect, 60 per read, or
    /// `registry_timeout` of the config file).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3600))]
    registry_timeout: Option<u32>,
    /// Largest flattened image a pull may write, e.g. 512G (default: 256G, or
    /// `max_image_size` of the config file): a guard against decompression bombs.
    #[arg(long, value_parser = parse_size_arg)]
    max_image_size: Option<u64>,
    /// zstd level of the squashfs a registry pull writes, 1 to 19 (default: 3,
    /// or `squashfs_level` of the config file): lower converts faster into a
    /// larger file.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=19))]
    squashfs_level: Option<i32>,
    /// Progress on stderr: `auto` (bars on a terminal, else lines), `bars`, `lines`, `none`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "bars", "lines", "none"])]
    pub progress: String,
    /// The store is on a file system several nodes share: one node pulls each
    /// image, the others wait for it (default: `store_shared` of the config file).
    #[arg(long)]
    shared_store: bool,
    /// Shared store: seconds without a heartbeat after which another node's
    /// pull is taken over (default: `store_lease_timeout`, 30).
    #[arg(long, value_name = "SECONDS")]
    lease_timeout: Option<u64>,
    /// Shared store: seconds to wait at most for another node's live pull
    /// (default: `store_wait_timeout`, 1800).
    #[arg(long, value_name = "SECONDS")]
    wait_timeout: Option<u64>,
}

/// The `--store` flag alone, for the verbs that only read or clean the store.
#[derive(clap::Args)]
pub struct StoreDir {
    /// Image store folder (default: from the config file, else /var/lib/berth for
    /// root and ~/.cache/berth for others).
    #[arg(long)]
    store: Option<PathBuf>,
}

impl StoreDir {
    /// The store folder: `--store`, else the configuration's.
    pub fn root(&self) -> Result<PathBuf> {
        Ok(match &self.store {
            Some(root) => root.clone(),
            None => Config::for_cli()?.store_path,
        })
    }

    /// Opens the store (sweeping what dead pulls left).
    pub fn open(&self) -> Result<Store> {
        Store::open(self.root()?)
    }
}

/// Parses a size flag (`512G`, `800M`).
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

/// Parses an age flag (`8d`, `36h`).
pub fn parse_age_arg(text: &str) -> Result<std::time::Duration, String> {
    berth::units::parse_age(text).map_err(|e| e.to_string())
}

impl StoreArgs {
    /// The store folder, the pull settings (the config file's, then the
    /// flags') and the progress display.
    pub fn resolve(&self, config: &Config) -> Result<(PathBuf, PullSettings, ProgressMode)> {
        let root = self
            .store
            .clone()
            .unwrap_or_else(|| config.store_path.clone());
        let mut settings = PullSettings::from_config(config);
        settings
            .insecure_registries
            .extend(self.insecure_registries.iter().cloned());
        // The command line's mirrors come first: they win over the config file's.
        let mut mirrors = Vec::new();
        for text in &self.mirrors {
            mirrors.extend(parse_mirrors(text).map_err(|e| anyhow::anyhow!("--mirror {e}"))?);
        }
        mirrors.append(&mut settings.mirrors);
        settings.mirrors = mirrors;
        settings.registry_retries = self.registry_retries.or(config.registry_retries);
        settings.registry_timeout = self.registry_timeout.or(config.registry_timeout);
        settings.max_image_size = self.max_image_size.unwrap_or(config.max_image_size);
        settings.squashfs_level = self.squashfs_level.unwrap_or(config.squashfs_level);
        let progress = match self.progress.as_str() {
            "bars" => ProgressMode::Bars,
            "lines" => ProgressMode::Lines,
            "none" => ProgressMode::Off,
            _ => ProgressMode::auto(),
        };
        let seconds = |given: Option<u64>, default: std::time::Duration, flag: &str| match given {
            Some(0) => bail!("--{flag} 0: give at least 1 second"),
            Some(s) => Ok(s),
            None => Ok(default.as_secs()),
        };
        settings.shared = if self.shared_store || config.store_shared {
            Some((
                seconds(
                    self.lease_timeout,
                    config.store_lease_timeout,
                    "lease-timeout",
                )?,
                seconds(self.wait_timeout, config.store_wait_timeout, "wait-timeout")?,
            ))
        } else {
            None
        };
        Ok((root, settings, progress))
    }
}
