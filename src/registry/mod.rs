//! Registry client: the Docker Registry HTTP API v2 / OCI distribution API.
//!
//! Owns: manifests and indexes (with platform choice), blob downloads with
//! digest checks, authentication (anonymous, bearer tokens, basic) and
//! credentials files. Must not touch the store or the file system beyond
//! reading credentials and the submitting user's own token file
//! ([`token_file`]): callers hand in writers for blob content.

pub mod auth;
pub mod client;
pub mod credentials;
pub mod digest;
pub mod docker_config;
pub mod error;
#[cfg(test)]
pub(crate) mod fake;
pub mod manifest;
pub mod platform;
pub mod proxy;
pub mod retry;
pub mod token_file;
pub mod trust;

pub use client::{FetchedManifest, RegistryClient, RegistryOptions, ResolvedImage, Timeouts};
pub use credentials::{Credential, Credentials, EnrootCredentials, NoCredentials};
pub use digest::Digest;
pub use docker_config::{ChainedCredentials, DockerCredentials};
pub use error::RegistryError;
pub use manifest::{Descriptor, ImageIndex, ImageManifest, Manifest};
pub use platform::Platform;
pub use proxy::ProxySettings;
pub use retry::RetryPolicy;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_hostile;
