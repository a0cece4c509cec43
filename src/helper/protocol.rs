//! The typed messages between the plugin and its pull helper (`berth __pull`).
//!
//! The request is one line of JSON on the helper's stdin, followed on the
//! same pipe by the user's credentials as `berth __credentials` wrote them
//! (passed on unread: only the helper, as the pull user, parses them). It
//! carries every setting the pull uses, resolved by the plugin: the helper
//! reads no config file, so it pulls with exactly the plugin's settings.
//! The reply is one line of JSON on stdout; progress goes to stderr.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::registry::{ProxySettings, RegistryError, RegistryOptions, RetryPolicy, Timeouts};
use crate::store::{ProgressMode, PullOptions, SharedSettings, StoredImage};

/// The hidden subcommand that serves one [`PullJob`].
pub const PULL_ARG: &str = "__pull";

/// The most bytes a request line may have.
pub const MAX_REQUEST_BYTES: usize = 64 << 10;

/// The most bytes read from stdin in all (the credentials after the request
/// line have a smaller limit of their own, checked where they are parsed).
pub const MAX_INPUT_BYTES: u64 = 1 << 20;

/// One pull, as the plugin (or root's CLI) asks the helper for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullJob {
    /// The image reference, as the user wrote it (or pinned).
    pub image: String,
    /// The store folder.
    pub store: PathBuf,
    /// Only look in the store: an image not there is [`PullReply::NotInStore`].
    pub cached_only: bool,
    /// Plain progress lines on stderr (else none).
    pub progress_lines: bool,
    /// The resolved settings of the pull.
    pub settings: PullSettings,
}

/// The settings of a pull that come from the site configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullSettings {
    /// Registries reached over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Pull-through mirrors, `(registry, mirror)`.
    pub mirrors: Vec<(String, String)>,
    /// Retries of a failed registry request (`None`: the built-in default).
    pub registry_retries: Option<u32>,
    /// Seconds a registry may stay silent (`None`: the built-in timeouts).
    pub registry_timeout: Option<u32>,
    /// Largest flattened image, in bytes.
    pub max_image_size: u64,
    /// zstd level of the squashfs (absent from an older plugin's request).
    #[serde(default = "default_squashfs_level")]
    pub squashfs_level: i32,
    /// A store shared by several nodes: `(lease timeout, wait timeout)` in seconds.
    pub shared: Option<(u64, u64)>,
    /// Proxies for registry requests (the helper's environment is cleared).
    pub proxy: ProxySettings,
    /// A site CA bundle trusted beside the system's store.
    pub ca_bundle: Option<PathBuf>,
}

fn default_squashfs_level() -> i32 {
    crate::image::DEFAULT_ZSTD_LEVEL
}

impl PullSettings {
    /// The pull settings of `config`.
    pub fn from_config(config: &Config) -> PullSettings {
        PullSettings {
            insecure_registries: config.insecure_registries.clone(),
            mirrors: config.mirrors.clone(),
            registry_retries: config.registry_retries,
            registry_timeout: config.registry_timeout,
            max_image_size: config.max_image_size,
            squashfs_level: config.squashfs_level,
            shared: config
                .shared_settings()
                .map(|s| (s.lease_timeout.as_secs(), s.wait_timeout.as_secs())),
            proxy: config.proxy.clone(),
            ca_bundle: config.ca_bundle.clone(),
        }
    }

    /// The store's pull options for these settings (credentials: the
    /// defaults of [`RegistryOptions`], to be replaced by the caller's).
    pub fn pull_options(&self, progress: ProgressMode, cached_only: bool) -> PullOptions {
        let mut retry = RetryPolicy::default();
        if let Some(n) = self.registry_retries {
            retry.attempts = n + 1;
        }
        let timeouts = match self.registry_timeout {
            Some(seconds) => {
                let limit = Duration::from_secs(u64::from(seconds));
                Timeouts {
                    connect: limit,
                    read: limit,
                }
            }
            None => Timeouts::default(),
        };
        PullOptions {
            shared: self.shared.map(|(lease, wait)| SharedSettings {
                lease_timeout: Duration::from_secs(lease),
                wait_timeout: Duration::from_secs(wait),
            }),
            registry: RegistryOptions {
                insecure_registries: self.insecure_registries.clone(),
                mirrors: self.mirrors.clone(),
                retry,
                timeouts,
                proxy: self.proxy.clone(),
                ca_bundle: self.ca_bundle.clone(),
                ..RegistryOptions::default()
            },
            progress,
            cached_only,
            max_image_bytes: self.max_image_size,
            zstd_level: self.squashfs_level,
        }
    }
}

/// The helper's answer, one line on its stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum PullReply {
    /// The image, in the store.
    Ok(Box<StoredImage>),
    /// `cached_only`: not in the store; its manifest digest.
    NotInStore(String),
    /// The pull failed.
    Error(HelperError),
}

/// A failure a helper reports: what kind, and the message for the user
/// (which names the image and what to do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// The message for the user.
    pub message: String,
}

/// Kinds of helper failures a caller may tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request could not be read (a plugin and helper of different versions?).
    Request,
    /// The registry has no such image or tag.
    NotFound,
    /// The registry refused the credentials (or their absence).
    Denied,
    /// Any other registry failure (unreachable, HTTP errors, bad content).
    Registry,
    /// Anything else (store, conversion, disk).
    Other,
}

impl ErrorKind {
    /// The kind of `error`, from the registry error inside it, if any.
    pub fn of(error: &anyhow::Error) -> ErrorKind {
        match error
            .chain()
            .find_map(|e| e.downcast_ref::<RegistryError>())
        {
            Some(RegistryError::ManifestUnknown { .. }) => ErrorKind::NotFound,
            Some(RegistryError::Denied { .. }) => ErrorKind::Denied,
            Some(_) => ErrorKind::Registry,
            None => ErrorKind::Other,
        }
    }
}

impl PullReply {
    /// The reply as one line (with its newline).
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|e| {
            format!(r#"{{"error":{{"kind":"other","message":"cannot encode the reply: {e}"}}}}"#)
        });
        line.push('\n');
        line
    }

    /// Reads the reply from a helper's stdout: its last non-empty line.
    pub fn parse(stdout: &[u8]) -> Result<PullReply> {
        let text = String::from_utf8_lossy(stdout);
        let Some(line) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
            bail!("the helper gave no reply");
        };
        serde_json::from_str(line).context("the helper's reply is unreadable")
    }
}

impl PullJob {
    /// The request as it goes on the pipe: one line, then `credentials`.
    pub fn encode(&self, credentials: &[u8]) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(self).expect("a PullJob always serializes");
        bytes.push(b'\n');
        bytes.extend_from_slice(credentials);
        bytes
    }

    /// Reads a request from `input`: the request line and the bytes after it
    /// (the credentials).
    pub fn read_from(input: impl Read) -> Result<(PullJob, Vec<u8>)> {
        let mut bytes = Vec::new();
        input
            .take(MAX_INPUT_BYTES)
            .read_to_end(&mut bytes)
            .context("cannot read the pull request from stdin")?;
        let end = bytes
            .iter()
            .position(|b| *b == b'\n')
            .filter(|at| *at <= MAX_REQUEST_BYTES)
            .context("the pull request on stdin has no line end within 64 KiB")?;
        let job = serde_json::from_slice(&bytes[..end]).context(
            "the pull request on stdin is unreadable (are the plugin and the berth helper of \
             one version? check helper_path)",
        )?;
        Ok((job, bytes.split_off(end + 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_carries_the_settings_and_the_credentials_after_it() {
        let config = Config {
            insecure_registries: vec!["r:5000".into()],
            store_shared: true,
            registry_retries: Some(2),
            ..Config::default()
        };
        let job = PullJob {
            image: "r:5000/a:b".into(),
            store: "/s".into(),
            cached_only: true,
            progress_lines: true,
            settings: PullSettings::from_config(&config),
        };
        let wire = job.encode(b"{\"sources\":\"x\",\n\"credentials\":[]}");
        let (read, rest) = PullJob::read_from(&wire[..]).unwrap();
        assert_eq!(read, job);
        assert_eq!(rest, b"{\"sources\":\"x\",\n\"credentials\":[]}");
        let options = read
            .settings
            .pull_options(ProgressMode::Lines, read.cached_only);
        assert_eq!(options.registry.insecure_registries, ["r:5000"]);
        assert_eq!(options.registry.retry.attempts, 3);
        assert!(options.shared.is_some() && options.cached_only);
        assert_eq!(options.zstd_level, crate::image::DEFAULT_ZSTD_LEVEL);
        let level_one = PullSettings::from_config(&Config {
            squashfs_level: 1,
            ..Config::default()
        });
        assert_eq!(
            level_one.pull_options(ProgressMode::Off, false).zstd_level,
            1
        );
        // A request of an older plugin (no level) gets the default level.
        let mut old: serde_json::Value = serde_json::to_value(&level_one).unwrap();
        old.as_object_mut().unwrap().remove("squashfs_level");
        let old: PullSettings = serde_json::from_value(old).unwrap();
        assert_eq!(old.squashfs_level, crate::image::DEFAULT_ZSTD_LEVEL);
        // A key the helper does not know is refused, not ignored.
        let e = PullJob::read_from(&b"{\"image\":\"x\",\"bogus\":1}\n"[..]).unwrap_err();
        assert!(format!("{e:#}").contains("one version"), "{e:#}");
        assert!(PullJob::read_from(&b"no line end"[..]).is_err());
    }

    #[test]
    fn replies_are_one_line_and_read_back() {
        let line = PullReply::Error(HelperError {
            kind: ErrorKind::Denied,
            message: "no\naccess".into(),
        })
        .to_line();
        assert_eq!(line.matches('\n').count(), 1, "{line}");
        assert!(line.starts_with(r#"{"error":{"kind":"denied""#), "{line}");
        let stdout = format!("noise\n{line}");
        match PullReply::parse(stdout.as_bytes()).unwrap() {
            PullReply::Error(e) => assert_eq!(e.message, "no\naccess"),
            other => panic!("{other:?}"),
        }
        assert!(PullReply::parse(b"").is_err());
        let missing = PullReply::NotInStore("sha256:aa".into()).to_line();
        assert_eq!(missing, "{\"not_in_store\":\"sha256:aa\"}\n");
    }

    #[test]
    fn error_kinds_come_from_registry_errors() {
        let denied = anyhow::Error::new(RegistryError::Denied {
            image: "i".into(),
            registry: "r".into(),
            status: 401,
            credentials: "c".into(),
        })
        .context("cannot pull i");
        assert_eq!(ErrorKind::of(&denied), ErrorKind::Denied);
        assert_eq!(
            ErrorKind::of(&anyhow::anyhow!("disk full")),
            ErrorKind::Other
        );
    }
}
