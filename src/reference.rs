//! Image references: what a user writes after `--container-image` or `berth pull`.
//!
//! Accepted forms (pyxis/enroot and docker styles):
//! - `[USER@][REGISTRY#]IMAGE[:TAG][@DIGEST]` (enroot style, `#` ends the registry),
//! - `registry.example:5000/ns/image:tag` (docker style: the first path part is a
//!   registry only if it contains `.` or `:` or is `localhost`),
//! - either of those behind a `docker://` prefix,
//! - a path to a file, starting with `/` or `.`: a squashfs image, or a
//!   docker or OCI archive (a tar, told apart by its first bytes),
//! - `dockerd://IMAGE[:TAG]` or `podman://IMAGE[:TAG]`: an image of a local
//!   engine ([`daemon`]).
//!
//! Docker Hub defaults apply: `ubuntu` is `docker.io/library/ubuntu:latest`.

use std::fmt;
use std::path::PathBuf;

pub mod daemon;

pub use daemon::{DaemonImage, Engine};

/// The registry name users write for Docker Hub.
pub const DOCKER_HUB: &str = "docker.io";
/// The host that actually serves Docker Hub's distribution API.
pub const DOCKER_HUB_API_HOST: &str = "registry-1.docker.io";

/// Where a container's root file system comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// An image in an OCI/Docker registry.
    Registry(ImageRef),
    /// A file on disk: a squashfs image, or a docker or OCI archive.
    SquashfsFile(PathBuf),
    /// An image kept by a local engine (`dockerd://`, `podman://`).
    Daemon(DaemonImage),
}

/// A parsed registry image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ImageRef {
    /// Optional user name for credentials (`USER@` in enroot syntax).
    pub user: Option<String>,
    /// Registry host with optional port, e.g. `nvcr.io` or `localhost:5000`.
    pub registry: String,
    /// Repository path, e.g. `library/ubuntu` or `nvidia/pytorch`.
    pub repository: String,
    /// Tag; `latest` when neither tag nor digest was given.
    pub tag: Option<String>,
    /// Digest (`sha256:<hex>`), when pinned.
    pub digest: Option<String>,
}

/// Why a reference could not be parsed; the message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceError {
    /// The text that was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for ReferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid image reference '{}': {} (expected [REGISTRY#]IMAGE[:TAG][@DIGEST], \
             REGISTRY/IMAGE[:TAG], dockerd://IMAGE[:TAG], podman://IMAGE[:TAG], or a path to \
             a squashfs or archive file starting with / or .)",
            self.input.escape_debug(),
            self.reason
        )
    }
}

impl std::error::Error for ReferenceError {}

impl ImageSource {
    /// Parses what the user wrote.
    pub fn parse(input: &str) -> Result<ImageSource, ReferenceError> {
        let fail = |reason: &str| ReferenceError {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        if input.is_empty() {
            return Err(fail("it is empty"));
        }
        if input.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(fail("it contains whitespace or control characters"));
        }
        if input.starts_with('/') || input.starts_with('.') {
            return Ok(ImageSource::SquashfsFile(PathBuf::from(input)));
        }
        if let Some(daemon) = DaemonImage::parse(input) {
            return daemon.map(ImageSource::Daemon).map_err(|e| fail(&e));
        }
        ImageRef::parse(input).map(ImageSource::Registry)
    }
}

impl ImageRef {
    /// Parses a registry reference (not a file path).
    pub fn parse(input: &str) -> Result<ImageRef, ReferenceError> {
        let fail = |reason: String| ReferenceError {
            input: input.to_string(),
            reason,
        };
        let rest = input.strip_prefix("docker://").unwrap_or(input);
        if rest.is_empty() {
            return Err(fail("no image name".into()));
        }

        // Enroot style: everything before the first '#' is `[USER@]REGISTRY`.
        let (user, registry, name) = match rest.split_once('#') {
            Some((left, name)) => {
                let (user, registry) = match left.split_once('@') {
                    Some((user, registry)) => (Some(user.to_string()), registry),
                    None => (None, left),
                };
                if registry.is_empty() {
                    return Err(fail("empty registry before '#'".into()));
                }
                if user.as_deref() == Some("") {
                    return Err(fail("empty user name before '@'".into()));
                }
                (user, Some(registry.to_string()), name)
            }
            None => (None, None, rest),
        };
        let (name, digest) = match name.split_once('@') {
            Some((name, digest)) => (name, Some(digest.to_string())),
            None => (name, None),
        };
        // Docker style: the first path part is a registry only if it looks like a host.
        let (registry, path) = match registry {
            Some(registry) => (registry, name),
            None => match name.split_once('/') {
                Some((first, path)) if looks_like_registry(first) => (first.to_string(), path),
                _ => (DOCKER_HUB.to_string(), name),
            },
        };
        if registry.contains('/') || registry.contains('#') {
            return Err(fail(format!("registry '{registry}' is not a host[:port]")));
        }
        validate_registry(&registry).map_err(fail)?;

        // Tag: after the last ':' of the last path component.
        let (repo, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag.to_string())),
            _ => (path, None),
        };
        if repo.is_empty() {
            return Err(fail("no image name".into()));
        }
        let repository = if registry == DOCKER_HUB && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo.to_string()
        };
        validate_repository(&repository).map_err(fail)?;
        if let Some(tag) = &tag {
            validate_tag(tag).map_err(fail)?;
        }
        if let Some(digest) = &digest {
            validate_digest(digest).map_err(fail)?;
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Ok(ImageRef {
            user,
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The host to contact for the distribution API (Docker Hub's API host differs).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API_HOST
        } else {
            &self.registry
        }
    }

    /// What to ask the registry for: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// The same image pinned to `digest` (the tag is kept for display).
    pub fn with_digest(&self, digest: &str) -> ImageRef {
        ImageRef {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }
}

/// Whether the first part of a docker-style name is a registry host rather than
/// part of a Docker Hub repository.
fn looks_like_registry(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost"
}

impl fmt::Display for ImageRef {
    /// Prints the canonical docker-style form, e.g. `docker.io/library/ubuntu:latest`.
    /// A registry that docker-style parsing would not take for a host (`myhost`, as
    /// in `myhost#img`) is printed enroot-style, `myhost#img:latest`, so the
    /// printed form always parses back to the same image.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = if looks_like_registry(&self.registry) {
            '/'
        } else {
            '#'
        };
        write!(f, "{}{sep}{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl fmt::Display for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageSource::Registry(r) => r.fmt(f),
            ImageSource::SquashfsFile(p) => write!(f, "{}", p.display()),
            ImageSource::Daemon(d) => d.fmt(f),
        }
    }
}

fn validate_registry(registry: &str) -> Result<(), String> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (registry, None),
    };
    // Dot-separated labels, each non-empty and neither starting nor ending with
    // '-' (so no leading '.', which would read as a file path when printed).
    let label_ok = |label: &str| {
        !label.is_empty()
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if !host.split('.').all(label_ok) {
        return Err(format!("registry host '{host}' is not a valid host name"));
    }
    if let Some(port) = port {
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("registry port '{port}' is not a port number"));
        }
    }
    Ok(())
}

fn validate_repository(repo: &str) -> Result<(), String> {
    if repo.len() > 255 {
        return Err("image name is longer than 255 characters".into());
    }
    for component in repo.split('/') {
        let ok = !component.is_empty()
            && component
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && component.starts_with(|c: char| c.is_ascii_alphanumeric())
            && component.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok {
            return Err(format!(
                "image name component '{component}' must be lowercase letters, digits and \
                 separators (. _ -), starting and ending with a letter or digit"
            ));
        }
    }
    Ok(())
}

fn validate_tag(tag: &str) -> Result<(), String> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag '{tag}' must be 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
        ))
    }
}

fn validate_digest(digest: &str) -> Result<(), String> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 && hex.bytes().all(is_lower_hex) => Ok(()),
        Some(("sha512", hex)) if hex.len() == 128 && hex.bytes().all(is_lower_hex) => Ok(()),
        _ => Err(format!(
            "digest '{digest}' must be sha256:<64 lowercase hex digits> (or sha512:<128>)"
        )),
    }
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(s: &str) -> ImageRef {
        match ImageSource::parse(s).unwrap() {
            ImageSource::Registry(r) => r,
            other => panic!("not a registry ref: {other:?}"),
        }
    }

    #[test]
    fn docker_hub_defaults() {
        let r = reg("ubuntu");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "library/ubuntu");
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.to_string(), "docker.io/library/ubuntu:latest");
        assert_eq!(reg("nvidia/cuda:12.4").repository, "nvidia/cuda");
    }

    /// Found by `cargo fuzz run reference` (input `ghcr/repo@sh#a2`): a registry
    /// without '.', ':' or "localhost" was printed docker-style, which parses
    /// back as a Docker Hub repository.
    #[test]
    fn display_round_trips_for_bare_registry_names() {
        let r = reg("ghcr/repo@sh#a2");
        assert_eq!(r.registry, "sh");
        assert_eq!(r.to_string(), "sh#a2:latest");
        let again = reg(&r.to_string());
        assert_eq!(again, ImageRef { user: None, ..r });
        for s in [
            "ubuntu",
            "nvcr.io#nvidia/pytorch:24.05-py3",
            "localhost#img",
            "myhost:5000#a/b",
        ] {
            let r = reg(s);
            assert_eq!(reg(&r.to_string()), ImageRef { user: None, ..r }, "{s}");
        }
        assert_eq!(
            reg("nvcr.io#nvidia/cuda").to_string(),
            "nvcr.io/nvidia/cuda:latest"
        );
    }

    /// Found by `cargo fuzz run reference` (input `docker://.ia/pcaa`): a registry
    /// host with an empty label was accepted and printed as `.ia/pcaa:latest`,
    /// which reads as a squashfs file path.
    #[test]
    fn registry_hosts_need_non_empty_labels() {
        for bad in [
            "docker://.ia/pcaa",
            ".ia#pcaa",
            "a..b#img",
            "ia.#img",
            "-x.io/img",
            "x-.io:5000/img",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad} was accepted");
        }
        assert_eq!(
            reg("my-reg.example.com:5000/a/b").registry,
            "my-reg.example.com:5000"
        );
    }

    #[test]
    fn enroot_style() {
        let r = reg("nvcr.io#nvidia/pytorch:24.05-py3");
        assert_eq!(r.registry, "nvcr.io");
        assert_eq!(r.repository, "nvidia/pytorch");
        assert_eq!(r.tag.as_deref(), Some("24.05-py3"));
        let r = reg("alice@localhost:5000#ns/img");
        assert_eq!(r.user.as_deref(), Some("alice"));
        assert_eq!(r.registry, "localhost:5000");
        assert_eq!(r.repository, "ns/img");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = reg(&format!("bob@nvcr.io#nvidia/cuda@{d}"));
        assert_eq!(r.user.as_deref(), Some("bob"));
        assert_eq!(r.digest.as_deref(), Some(d.as_str()));
        assert_eq!(r.tag, None);
    }

    #[test]
    fn docker_style_and_prefix() {
        let r = reg("docker://registry.example:5000/ns/image:tag");
        assert_eq!(r.registry, "registry.example:5000");
        assert_eq!(r.repository, "ns/image");
        assert_eq!(r.tag.as_deref(), Some("tag"));
        let r = reg("localhost/img");
        assert_eq!(r.registry, "localhost");
        // First part without '.' or ':' is a Docker Hub namespace.
        let r = reg("myorg/img:1");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.repository, "myorg/img");
    }

    #[test]
    fn digests() {
        let d = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let r = reg(&format!("10.0.0.1:5000/x/y:t@{d}"));
        assert_eq!(r.tag.as_deref(), Some("t"));
        assert_eq!(r.digest.as_deref(), Some(d.as_str()));
        assert_eq!(r.manifest_reference(), d);
        assert!(ImageSource::parse("ubuntu@sha256:abc").is_err());
    }

    #[test]
    fn files() {
        assert_eq!(
            ImageSource::parse("/scratch/img.sqsh").unwrap(),
            ImageSource::SquashfsFile("/scratch/img.sqsh".into())
        );
        assert!(matches!(
            ImageSource::parse("./img.sqsh").unwrap(),
            ImageSource::SquashfsFile(_)
        ));
    }

    #[test]
    fn local_engines() {
        assert!(matches!(
            ImageSource::parse("dockerd://ubuntu:24.04").unwrap(),
            ImageSource::Daemon(DaemonImage {
                engine: Engine::Docker,
                ..
            })
        ));
        let e = ImageSource::parse("podman://-x").unwrap_err().to_string();
        assert!(e.contains("cannot start with '-'"), "{e}");
    }

    #[test]
    fn errors_name_the_problem() {
        for bad in [
            "",
            "Ubuntu",
            "ubuntu:",
            "ubuntu:-x",
            "#ubuntu",
            "reg:99999/x",
            "a b",
            "docker://",
            "x//y",
        ] {
            let e = ImageSource::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("invalid image reference"),
                "{bad}: {e}"
            );
        }
        let e = ImageSource::parse("Ubuntu").unwrap_err();
        assert!(e.reason.contains("Ubuntu"));
    }
}
