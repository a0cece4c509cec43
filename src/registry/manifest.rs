//! Manifests and indexes (Docker schema2 and OCI), and choosing this node's
//! platform from an index.

use serde::{Deserialize, Serialize};

use super::error::RegistryError;
use super::platform::Platform;

/// Docker v2 schema2 image manifest.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list (multi-platform).
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index (multi-platform).
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker schema1 manifest (deprecated, unsupported).
pub const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
/// Signed Docker schema1 manifest (deprecated, unsupported).
pub const DOCKER_SCHEMA1_SIGNED: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// The `Accept` header for manifest requests: every kind berth can read.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// A content descriptor: what a manifest or index points to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the target.
    #[serde(default)]
    pub media_type: String,
    /// Digest of the target, `sha256:<hex>`.
    pub digest: String,
    /// Size of the target in bytes.
    #[serde(default)]
    pub size: u64,
    /// Platform, for entries of an index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Where else the blob may be fetched from (non-distributable layers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

/// An image manifest (Docker schema2 or OCI): one config and ordered layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    #[serde(default)]
    pub schema_version: u32,
    /// Media type, when the manifest states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image configuration blob.
    pub config: Descriptor,
    /// Layer blobs, lowest first.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// An image index or Docker manifest list: manifests per platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    /// Always 2.
    #[serde(default)]
    pub schema_version: u32,
    /// Media type, when the index states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The platform manifests (or nested indexes).
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// What a manifest request returned, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manifest {
    /// A single-platform image manifest.
    Image(ImageManifest),
    /// A multi-platform index to choose from.
    Index(ImageIndex),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde_json::Value>,
    #[serde(default)]
    layers: Option<serde_json::Value>,
}

impl Manifest {
    /// Parses manifest bytes. `content_type` is the response's Content-Type; the
    /// `mediaType` field and the document's shape decide when it is missing or generic.
    /// `image` names the image in error messages.
    pub fn parse(
        bytes: &[u8],
        content_type: Option<&str>,
        image: &str,
    ) -> Result<Manifest, RegistryError> {
        let invalid = |detail: String| RegistryError::InvalidManifest {
            image: image.to_string(),
            detail,
        };
        let probe: Probe = serde_json::from_slice(bytes)
            .map_err(|e| invalid(format!("the manifest is not valid JSON: {e}")))?;
        let content_type = content_type
            .map(|c| c.split(';').next().unwrap_or("").trim().to_string())
            .filter(|c| !c.is_empty() && c != "application/json" && c != "text/plain");
        let media_type = probe.media_type.clone().or(content_type);
        if probe.schema_version == Some(1)
            || matches!(
                media_type.as_deref(),
                Some(DOCKER_SCHEMA1 | DOCKER_SCHEMA1_SIGNED)
            )
        {
            return Err(RegistryError::UnsupportedManifest {
                image: image.to_string(),
                media_type: media_type.unwrap_or_else(|| DOCKER_SCHEMA1.to_string()),
                hint: "this is a Docker schema1 manifest, which is deprecated and not supported; \
                       re-push the image with a current docker, podman, buildah or skopeo \
                       (they write schema2 or OCI manifests)"
                    .to_string(),
            });
        }
        let is_index = match media_type.as_deref() {
            Some(DOCKER_MANIFEST_LIST | OCI_INDEX) => true,
            Some(DOCKER_MANIFEST | OCI_MANIFEST) => false,
            Some(other) if probe.manifests.is_none() && probe.layers.is_none() => {
                return Err(RegistryError::UnsupportedManifest {
                    image: image.to_string(),
                    media_type: other.to_string(),
                    hint: "this is not a container image manifest (an artifact?)".to_string(),
                })
            }
            _ => probe.manifests.is_some() && probe.layers.is_none(),
        };
        if is_index {
            serde_json::from_slice(bytes)
                .map(Manifest::Index)
                .map_err(|e| invalid(format!("the image index is malformed: {e}")))
        } else {
            serde_json::from_slice(bytes)
                .map(Manifest::Image)
                .map_err(|e| invalid(format!("the image manifest is malformed: {e}")))
        }
    }
}

impl ImageIndex {
    /// Chooses the manifest for `wanted` (see [`Platform::match_rank`]); the error
    /// lists the platforms the index offers.
    pub fn select(&self, wanted: &Platform, image: &str) -> Result<&Descriptor, RegistryError> {
        self.manifests
            .iter()
            .filter_map(|d| {
                let platform = d.platform.as_ref()?;
                wanted.match_rank(platform).map(|rank| (rank, d))
            })
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, d)| d)
            .ok_or_else(|| {
                let mut available: Vec<String> = self
                    .manifests
                    .iter()
                    .filter_map(|d| d.platform.as_ref())
                    .filter(|p| p.os != "unknown")
                    .map(|p| p.to_string())
                    .collect();
                available.dedup();
                RegistryError::NoMatchingPlatform {
                    image: image.to_string(),
                    wanted: wanted.to_string(),
                    available,
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(arch: &str, variant: Option<&str>, digest: &str) -> serde_json::Value {
        let mut platform = serde_json::json!({"os": "linux", "architecture": arch});
        if let Some(v) = variant {
            platform["variant"] = v.into();
        }
        serde_json::json!({"mediaType": OCI_MANIFEST, "digest": digest, "size": 1, "platform": platform})
    }

    #[test]
    fn parses_kinds() {
        let m = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {"mediaType": "x", "digest": "sha256:aa", "size": 3},
            "layers": [{"mediaType": "y", "digest": "sha256:bb", "size": 4}]
        });
        let parsed = Manifest::parse(m.to_string().as_bytes(), None, "img").unwrap();
        assert!(matches!(parsed, Manifest::Image(ref i) if i.layers.len() == 1));

        // OCI manifests may omit mediaType; the Content-Type or the shape decides.
        let m = serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": "x", "digest": "sha256:aa", "size": 3},
            "layers": []
        });
        let parsed = Manifest::parse(m.to_string().as_bytes(), Some(OCI_MANIFEST), "img").unwrap();
        assert!(matches!(parsed, Manifest::Image(_)));
        let idx = serde_json::json!({"schemaVersion": 2, "manifests": [desc("amd64", None, "sha256:cc")]});
        let parsed = Manifest::parse(idx.to_string().as_bytes(), None, "img").unwrap();
        assert!(matches!(parsed, Manifest::Index(ref i) if i.manifests.len() == 1));
    }

    #[test]
    fn schema1_says_repush() {
        let m = serde_json::json!({"schemaVersion": 1, "name": "x", "fsLayers": []});
        let e = Manifest::parse(m.to_string().as_bytes(), Some(DOCKER_SCHEMA1_SIGNED), "img")
            .unwrap_err();
        assert!(e.to_string().contains("re-push"), "{e}");
    }

    #[test]
    fn selects_platform() {
        let idx: ImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "manifests": [
                desc("arm", Some("v6"), "sha256:01"),
                desc("arm", Some("v7"), "sha256:02"),
                desc("arm64", Some("v8"), "sha256:03"),
                desc("amd64", None, "sha256:04"),
                {"mediaType": OCI_MANIFEST, "digest": "sha256:05", "size": 1,
                 "platform": {"os": "unknown", "architecture": "unknown"}},
            ]
        }))
        .unwrap();
        let want = |arch: &str, v: Option<&str>| Platform {
            os: "linux".into(),
            architecture: arch.into(),
            variant: v.map(Into::into),
        };
        assert_eq!(
            idx.select(&want("amd64", None), "i").unwrap().digest,
            "sha256:04"
        );
        assert_eq!(
            idx.select(&want("arm64", Some("v8")), "i").unwrap().digest,
            "sha256:03"
        );
        assert_eq!(
            idx.select(&want("arm", Some("v7")), "i").unwrap().digest,
            "sha256:02"
        );
        let e = idx
            .select(&want("s390x", None), "i")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("linux/s390x") && e.contains("linux/arm64/v8") && !e.contains("unknown"),
            "{e}"
        );
    }
}
