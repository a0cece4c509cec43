//! Images kept by a local container engine: `dockerd://IMAGE[:TAG]` (the
//! Docker daemon) and `podman://IMAGE[:TAG]` (the user's podman storage), as
//! enroot takes them. The name is passed to the engine's `save` verb as one
//! argument after `--`; it may hold only what enroot accepts (letters,
//! digits, `/ . _ : -`) and may not start with `-`.

use std::fmt;

/// Which local engine keeps the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The Docker daemon, asked with the `docker` client.
    Docker,
    /// Podman (the user's own storage, or their podman service).
    Podman,
}

impl Engine {
    /// The scheme users write before the image name.
    pub fn scheme(self) -> &'static str {
        match self {
            Engine::Docker => "dockerd://",
            Engine::Podman => "podman://",
        }
    }

    /// The client program that talks to the engine.
    pub fn program(self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Podman => "podman",
        }
    }

    /// The arguments that write the image `image` as a docker archive on stdout.
    pub fn save_args(self, image: &str) -> Vec<String> {
        let mut args = vec!["save".to_string()];
        if self == Engine::Podman {
            args.push("--format=docker-archive".to_string());
        }
        args.push("--".to_string());
        args.push(image.to_string());
        args
    }
}

/// An image of a local engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonImage {
    /// Which engine.
    pub engine: Engine,
    /// The image's name as the engine knows it (`ubuntu:24.04`, `localhost/x`).
    pub image: String,
}

impl DaemonImage {
    /// Parses `dockerd://IMAGE[:TAG]` or `podman://IMAGE[:TAG]`; `None` when
    /// `input` has neither scheme, else the image or why it is refused.
    pub fn parse(input: &str) -> Option<Result<DaemonImage, String>> {
        let (engine, image) = [Engine::Docker, Engine::Podman]
            .into_iter()
            .find_map(|e| input.strip_prefix(e.scheme()).map(|rest| (e, rest)))?;
        let allowed = |c: char| c.is_ascii_alphanumeric() || "/._:-".contains(c);
        Some(if image.is_empty() {
            Err(format!("no image name after {}", engine.scheme()))
        } else if image.starts_with('-') {
            Err("an image name cannot start with '-'".to_string())
        } else if !image.chars().all(allowed) {
            Err(format!(
                "{} takes IMAGE[:TAG] of letters, digits and / . _ : - only",
                engine.scheme()
            ))
        } else {
            Ok(DaemonImage {
                engine,
                image: image.to_string(),
            })
        })
    }
}

impl fmt::Display for DaemonImage {
    /// As the user wrote it: `dockerd://IMAGE[:TAG]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.engine.scheme(), self.image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_engines_parse_and_print_back() {
        let d = DaemonImage::parse("dockerd://ubuntu:24.04")
            .unwrap()
            .unwrap();
        assert_eq!(d.engine, Engine::Docker);
        assert_eq!(d.image, "ubuntu:24.04");
        assert_eq!(d.to_string(), "dockerd://ubuntu:24.04");
        let p = DaemonImage::parse("podman://localhost/x").unwrap().unwrap();
        assert_eq!(p.engine, Engine::Podman);
        assert_eq!(
            Engine::Podman.save_args("localhost/x"),
            ["save", "--format=docker-archive", "--", "localhost/x"]
        );
        assert!(DaemonImage::parse("docker://ubuntu").is_none());
    }

    #[test]
    fn names_that_could_be_options_or_odd_are_refused() {
        for bad in [
            "dockerd://",
            "dockerd://-o/etc/x",
            "podman://a b",
            "podman://a;b",
            "dockerd://a@sha256:x",
        ] {
            assert!(DaemonImage::parse(bad).unwrap().is_err(), "{bad}");
        }
    }
}
