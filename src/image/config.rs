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
