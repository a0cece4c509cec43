//! The parts of an OCI image configuration the runtime uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Runtime settings an image carries (`config` of the OCI image configuration).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=VALUE` entries, in image order.
    #[serde(default)]
    pub env: Vec<String>,
    /// Default working directory inside the container.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `ENTRYPOINT`, when set.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// `CMD`, when set.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// `USER`, when set.
    #[serde(default)]
    pub user: Option<String>,
    /// Image labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl ImageConfig {
    /// The image environment as `(name, value)` pairs; malformed entries are skipped.
    pub fn env_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env.iter().filter_map(|kv| kv.split_once('='))
    }
}

/// The parts of an OCI/Docker image configuration blob that berth reads.
#[derive(Debug, Default, Deserialize)]
struct OciConfigBlob {
    #[serde(default)]
    config: Option<OciRuntimeConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct OciRuntimeConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

impl ImageConfig {
    /// Reads the runtime settings from an image configuration blob (the JSON
    /// the manifest's `config` descriptor points to). Empty strings count as unset.
    pub fn from_oci_json(bytes: &[u8]) -> Result<ImageConfig, serde_json::Error> {
        let blob: OciConfigBlob = serde_json::from_slice(bytes)?;
        let c = blob.config.unwrap_or_default();
        let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
        Ok(ImageConfig {
            env: c.env.unwrap_or_default(),
            working_dir: non_empty(c.working_dir),
            entrypoint: c.entrypoint,
            cmd: c.cmd,
            user: non_empty(c.user),
            labels: c.labels.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_oci_config() {
        let blob = br#"{"architecture":"amd64","os":"linux",
            "config":{"Env":["PATH=/usr/bin","A=b=c"],"WorkingDir":"","Entrypoint":null,
                      "Cmd":["bash"],"User":"1000:1000","Labels":{"k":"v"}},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        let c = ImageConfig::from_oci_json(blob).unwrap();
        assert_eq!(c.env, ["PATH=/usr/bin", "A=b=c"]);
        assert_eq!(c.working_dir, None);
        assert_eq!(c.entrypoint, None);
        assert_eq!(c.cmd, Some(vec!["bash".to_string()]));
        assert_eq!(c.user.as_deref(), Some("1000:1000"));
        assert_eq!(c.labels["k"], "v");
        assert_eq!(c.env_pairs().nth(1), Some(("A", "b=c")));
        assert_eq!(
            ImageConfig::from_oci_json(b"{}").unwrap(),
            ImageConfig::default()
        );
    }
}
