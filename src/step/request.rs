//! The step's `--container-*` options resolved once: every value parsed
//! (the image reference, the mounts, the namespaces, the kept variable
//! names, the container name), the plugstack's defaults applied where they
//! are known at this point. Each error names its option and the value as
//! written. What the step does after this reads the typed values, never the
//! text again. (The writable, home and remap-root defaults come from the
//! site's enroot.conf, which the spec reads: they stay `Option` here.)

use anyhow::anyhow;

use super::options::{env_names, JobOptions};
use crate::config::Config;
use crate::container::spec::Namespace;
use crate::container::usermount::{parse_mounts, UserMount};
use crate::named::ContainerName;
use crate::reference::ImageSource;

/// An option's value as the user wrote it (for messages) and parsed.
#[derive(Debug, Clone)]
pub struct Given<T> {
    /// The text as given.
    pub text: String,
    /// What it means.
    pub value: T,
}

impl<T> std::fmt::Display for Given<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// An image as the user (or a named container's record) wrote it, parsed.
pub type RequestedImage = Given<ImageSource>;

impl RequestedImage {
    /// Parses `text` as `--container-image` takes it.
    pub fn parse(text: &str) -> anyhow::Result<RequestedImage> {
        given(text, "--container-image", |t| {
            ImageSource::parse(t).map_err(|e| e.to_string())
        })
    }
}

/// The step's options, typed.
#[derive(Debug, Clone)]
pub struct StepRequest {
    /// `--container-image`, pinned to the digest submission resolved.
    pub image: Option<RequestedImage>,
    /// `--container-mounts`.
    pub mounts: Option<Given<Vec<UserMount>>>,
    /// `--container-workdir`.
    pub workdir: Option<String>,
    /// `--container-env`: the variables whose job value wins over the image's.
    pub keep_env: Vec<String>,
    /// `--container-unshare`.
    pub unshare: Option<Given<Vec<Namespace>>>,
    /// `--container-writable` (true) or `--container-readonly` (false).
    pub writable: Option<bool>,
    /// `--[no-]container-mount-home`.
    pub mount_home: Option<bool>,
    /// `--[no-]container-remap-root`.
    pub remap_root: Option<bool>,
    /// Whether the image ENTRYPOINT runs: `--[no-]container-entrypoint`,
    /// else the plugstack's `execute_entrypoint`.
    pub entrypoint: bool,
    /// `--container-entrypoint-log`: show the entrypoint's output.
    pub entrypoint_log: bool,
    /// `--container-name`.
    pub name: Option<ContainerName>,
    /// `--container-save`, as written (made absolute against the job's
    /// working directory by the step).
    pub save: Option<String>,
    /// `--container-mpi`: the host MPI profile to inject.
    pub mpi: Option<String>,
}

impl StepRequest {
    /// Resolves the raw `options` (the image already pinned) with the
    /// plugstack's defaults in `config`.
    pub fn resolve(options: &JobOptions, config: &Config) -> anyhow::Result<StepRequest> {
        let image = match &options.image {
            Some(text) => Some(RequestedImage::parse(text)?),
            None => None,
        };
        let mounts = match &options.mounts {
            Some(text) => Some(given(text, "--container-mounts", |t| {
                parse_mounts(t).map_err(|e| e.to_string())
            })?),
            None => None,
        };
        let keep_env = match &options.env {
            Some(text) => {
                given(text, "--container-env", |t| {
                    env_names(t).map_err(|e| format!("{e:#}"))
                })?
                .value
            }
            None => Vec::new(),
        };
        let unshare = match &options.unshare {
            Some(text) => Some(given(text, "--container-unshare", Namespace::parse_list)?),
            None => None,
        };
        let name = match &options.name {
            Some(text) => Some(given(text, "--container-name", ContainerName::parse)?.value),
            None => None,
        };
        Ok(StepRequest {
            image,
            mounts,
            workdir: options.workdir.clone(),
            keep_env,
            unshare,
            writable: options.writable,
            mount_home: options.mount_home,
            remap_root: options.remap_root,
            entrypoint: options.entrypoint.unwrap_or(config.execute_entrypoint),
            entrypoint_log: options.entrypoint_log == Some(true),
            name,
            save: options.save.clone(),
            mpi: options.mpi.clone(),
        })
    }

    /// The image as written, for messages (`None`: a `--container-name`
    /// alone).
    pub fn image_text(&self) -> Option<&str> {
        self.image.as_ref().map(|image| image.text.as_str())
    }
}

/// `text` parsed by `parse`; the error names `option` and the value.
fn given<T>(
    text: &str,
    option: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> anyhow::Result<Given<T>> {
    let value = parse(text).map_err(|reason| anyhow!("{option}={text}: {reason}"))?;
    Ok(Given {
        text: text.to_string(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_is_parsed_once_and_defaults_applied() {
        let config = Config {
            execute_entrypoint: true,
            ..Config::default()
        };
        let options = JobOptions {
            image: Some("ubuntu:22.04".into()),
            mounts: Some("/a:/b:ro".into()),
            env: Some("A,B_2".into()),
            unshare: Some("ipc".into()),
            name: Some("box".into()),
            ..Default::default()
        };
        let request = StepRequest::resolve(&options, &config).unwrap();
        assert!(matches!(
            request.image.as_ref().unwrap().value,
            ImageSource::Registry(_)
        ));
        assert_eq!(request.image_text(), Some("ubuntu:22.04"));
        assert_eq!(request.mounts.as_ref().unwrap().value.len(), 1);
        assert_eq!(request.keep_env, ["A", "B_2"]);
        assert_eq!(request.unshare.as_ref().unwrap().text, "ipc");
        assert!(request.name.is_some());
        assert!(request.entrypoint, "execute_entrypoint applies");
        assert!(!request.entrypoint_log);
        let off = JobOptions {
            entrypoint: Some(false),
            ..options
        };
        assert!(!StepRequest::resolve(&off, &config).unwrap().entrypoint);
    }

    #[test]
    fn each_error_names_its_option_and_value() {
        let config = Config::default();
        for (options, start) in [
            (
                JobOptions {
                    image: Some("Bad Ref".into()),
                    ..Default::default()
                },
                "--container-image=Bad Ref: ",
            ),
            (
                JobOptions {
                    mounts: Some("/a:relative".into()),
                    ..Default::default()
                },
                "--container-mounts=/a:relative: ",
            ),
            (
                JobOptions {
                    env: Some("A,".into()),
                    ..Default::default()
                },
                "--container-env=A,: ",
            ),
            (
                JobOptions {
                    unshare: Some("bogus".into()),
                    ..Default::default()
                },
                "--container-unshare=bogus: ",
            ),
            (
                JobOptions {
                    name: Some("a/b".into()),
                    ..Default::default()
                },
                "--container-name=a/b: ",
            ),
        ] {
            let e = format!("{:#}", StepRequest::resolve(&options, &config).unwrap_err());
            assert!(e.starts_with(start), "{e}");
        }
    }
}
