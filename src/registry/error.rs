//! Registry errors, by kind, each with a message that says what to do.
//!
//! Callers get these inside `anyhow::Error` and can `downcast_ref::<RegistryError>()`
//! to tell, say, "not found" from "unreachable".

use std::fmt;

/// Why talking to a registry failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// Connection refused, DNS failure, timeout, TLS failure or a dropped connection.
    Unreachable {
        /// The registry (or redirect target) host.
        host: String,
        /// What the network layer said.
        detail: String,
    },
    /// 404 for a manifest: no such image or tag.
    ManifestUnknown {
        /// The image as the user wrote it (canonical form).
        image: String,
        /// The registry host.
        registry: String,
    },
    /// 404 for a blob the manifest names.
    BlobUnknown {
        /// The blob digest.
        digest: String,
        /// The image.
        image: String,
        /// The registry host.
        registry: String,
    },
    /// 401/403 after authenticating (or with no credentials to offer).
    Denied {
        /// The image.
        image: String,
        /// The registry host.
        registry: String,
        /// The HTTP status.
        status: u16,
        /// Where credentials come from, for the hint.
        credentials: String,
    },
    /// Any other HTTP error status.
    Http {
        /// The URL requested (no credentials in it).
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the response body.
        detail: String,
    },
    /// Content did not match its digest or size.
    DigestMismatch {
        /// What was checked, e.g. `blob` or `manifest`.
        what: String,
        /// The digest expected.
        expected: String,
        /// What was received (digest and/or size).
        actual: String,
        /// The registry host.
        registry: String,
    },
    /// A manifest berth cannot use (schema1, artifacts).
    UnsupportedManifest {
        /// The image.
        image: String,
        /// Its media type.
        media_type: String,
        /// What to do about it.
        hint: String,
    },
    /// A manifest that does not parse.
    InvalidManifest {
        /// The image.
        image: String,
        /// What is wrong.
        detail: String,
    },
    /// An index without a manifest for this machine.
    NoMatchingPlatform {
        /// The image.
        image: String,
        /// This machine's platform.
        wanted: String,
        /// The platforms the index offers.
        available: Vec<String>,
    },
    /// The registry's authentication challenge or token answer could not be used.
    Auth {
        /// The registry host.
        registry: String,
        /// What went wrong.
        detail: String,
    },
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::Unreachable { host, detail } => write!(
                f,
                "registry {host} cannot be reached ({detail}): check the registry name, \
                 the network and proxy settings, or try again later"
            ),
            RegistryError::ManifestUnknown { image, registry } => write!(
                f,
                "image {image} not found in registry {registry}: check the name and tag"
            ),
            RegistryError::BlobUnknown {
                digest,
                image,
                registry,
            } => write!(
                f,
                "blob {digest} of image {image} not found in registry {registry}: the image \
                 is incomplete in the registry; re-push it"
            ),
            RegistryError::Denied {
                image,
                registry,
                status,
                credentials,
            } => write!(
                f,
                "access denied to image {image} by registry {registry} (HTTP {status}): \
                 check the image name and the credentials for {registry} in {credentials}"
            ),
            RegistryError::Http {
                url,
                status,
                detail,
            } => {
                write!(f, "registry request {url} failed with HTTP {status}")?;
                if !detail.is_empty() {
                    write!(f, ": {detail}")?;
                }
                Ok(())
            }
            RegistryError::DigestMismatch {
                what,
                expected,
                actual,
                registry,
            } => write!(
                f,
                "{what} {expected} from registry {registry} does not match its digest \
                 (got {actual}): the download was corrupted or the registry serves wrong \
                 content; try again, and report it to the registry's operators if it persists"
            ),
            RegistryError::UnsupportedManifest {
                image,
                media_type,
                hint,
            } => write!(
                f,
                "image {image} has an unsupported manifest ({media_type}): {hint}"
            ),
            RegistryError::InvalidManifest { image, detail } => {
                write!(f, "image {image} has an invalid manifest: {detail}")
            }
            RegistryError::NoMatchingPlatform {
                image,
                wanted,
                available,
            } => {
                write!(
                    f,
                    "image {image} has no variant for this machine ({wanted}); "
                )?;
                if available.is_empty() {
                    write!(f, "its index lists no platforms")
                } else {
                    write!(f, "it offers: {}", available.join(", "))
                }
            }
            RegistryError::Auth { registry, detail } => write!(
                f,
                "authentication with registry {registry} failed: {detail}"
            ),
        }
    }
}

impl std::error::Error for RegistryError {}
