//! Where a stored image came from, and who may have it from the store.
//!
//! A stored image is content whose manifest digest some registry served.
//! Its `meta.json` records the repositories its content was downloaded
//! from ([`ImageOrigin`]). A name the requester gives (`evil.example/x@D`)
//! proves nothing: any server can answer 200 to a `HEAD`. So the store
//! hands an image out only when one of its own origins lets this user read
//! it now: a `GET` of the manifest `D` there (through the origin's mirror
//! first, when one is configured), with the user's credentials for that
//! registry, whose bytes hash to `D`. An image recorded with several origins
//! is for a user allowed by any of them: each served the same bytes. The
//! one path without network: the image was downloaded anonymously from the
//! very repository requested.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::ImageMeta;
use crate::reference::ImageRef;
use crate::registry::{Digest, RegistryClient, RegistryError};

/// One repository a stored image's content was downloaded from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageOrigin {
    /// Registry host.
    pub registry: String,
    /// Repository path.
    pub repository: String,
    /// Whether the download sent no credential (anyone could read it then).
    pub anonymous: bool,
}

impl ImageOrigin {
    /// Whether `image` names this repository.
    pub fn is_repository_of(&self, image: &ImageRef) -> bool {
        self.registry == image.registry && self.repository == image.repository
    }

    /// This origin's reference to `digest`, with the login of `image`.
    fn reference(&self, image: &ImageRef, digest: &Digest) -> ImageRef {
        ImageRef {
            user: image.user.clone(),
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: None,
            digest: Some(digest.to_string()),
        }
    }
}

impl ImageMeta {
    /// The repositories this image came from: those recorded, or (a store
    /// made before berth recorded them) the one it was pulled as.
    pub fn origins(&self) -> Vec<ImageOrigin> {
        if !self.origins.is_empty() {
            return self.origins.clone();
        }
        vec![ImageOrigin {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            anonymous: self.anonymous,
        }]
    }

    /// Whether `image`'s repository is one this image came from.
    pub fn came_from(&self, image: &ImageRef) -> bool {
        self.origins().iter().any(|o| o.is_repository_of(image))
    }
}

/// Whether the stored image `meta` may be handed out for `image` with no
/// network: it was downloaded anonymously from that very repository.
pub fn public_here(meta: &ImageMeta, image: &ImageRef) -> bool {
    meta.origins()
        .iter()
        .any(|o| o.anonymous && o.is_repository_of(image))
}

/// Checks that one of `meta`'s origins serves the manifest `digest` to this
/// client (the requesting user's credentials) now. The first origin that
/// does ends the check; when none does, the error is the first definite
/// refusal (denied, unknown), else the first error.
pub fn check_access(
    client: &RegistryClient,
    meta: &ImageMeta,
    image: &ImageRef,
    digest: &Digest,
) -> Result<()> {
    let mut first: Option<anyhow::Error> = None;
    for origin in meta.origins() {
        let at = origin.reference(image, digest);
        let Err(e) = client.check_manifest(&at, digest) else {
            return Ok(());
        };
        if first
            .as_ref()
            .is_none_or(|kept| !definite(kept) && definite(&e))
        {
            first = Some(e);
        }
    }
    Err(first.unwrap_or_else(|| anyhow::anyhow!("the stored image {digest} records no origin")))
}

/// An answer of the registry itself (refused, unknown, other bytes), not a
/// failure to reach it.
fn definite(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<RegistryError>(),
        Some(
            RegistryError::Denied { .. }
                | RegistryError::ManifestUnknown { .. }
                | RegistryError::DigestMismatch { .. }
        )
    )
}
