//! Tag -> digest once, at submission.
//!
//! srun, sbatch and salloc (local and allocator contexts: the user's own
//! process on the submit host, with the user's own registry credentials)
//! ask the registry once which digest `--container-image`'s tag names now,
//! and export the pinned reference to the job in [`PIN_VARIABLE`]. Every node
//! of every step then pulls `REPO:TAG@DIGEST` (the tag stays for display), so
//! a re-push of the tag while the job starts cannot split the nodes across two
//! images. Steps inside a batch job or an allocation inherit the variable:
//! the digest resolved at `sbatch` time is what they run unless they name
//! another image.
//!
//! Behind a token service, the bearer token is kept in the user's token
//! file ([`crate::registry::token_file`]) for their next submissions.
//!
//! References that already name a digest and squashfs files pass through
//! without any network request. When the registry cannot be reached from the
//! submit host (network, 5xx, token service), submission goes on with a
//! warning and the nodes resolve the tag themselves, as before; when the
//! registry answers that the image does not exist or may not be read, the
//! submission fails before anything is allocated.

use std::sync::Mutex;
use std::time::Duration;

use super::handle;
use super::options::JobOptions;
use crate::config::Config;
use crate::reference::{ImageRef, ImageSource};
use crate::registry::token_file::TokenFile;
use crate::registry::{RegistryClient, RegistryError, RegistryOptions, RetryPolicy, Timeouts};
pub use crate::step::pin::{for_step, pin_for, PIN_VARIABLE};

/// How long submission waits for the registry at most (connect, then each
/// read); two tries. A registry that does not answer in that time is treated
/// as unreachable: the nodes resolve the tag.
const SUBMIT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const SUBMIT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What submission did with `--container-image`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinning {
    /// A squashfs file, or a reference that names a digest: used as given.
    AsGiven,
    /// Resolved now: the pinned reference (tag kept for display).
    Resolved(String),
    /// Pinned when the job was submitted (found in the job environment).
    Inherited(String),
    /// The registry could not be asked: the nodes resolve the tag. The text
    /// says why.
    Deferred(String),
}

/// `image` pinned to `digest`, in a form that parses back to the same user,
/// registry, repository and tag.
fn pinned_text(image: &ImageRef, digest: &str) -> String {
    let pinned = image.with_digest(digest);
    match &image.user {
        Some(user) => {
            let tag = pinned
                .tag
                .as_deref()
                .map(|t| format!(":{t}"))
                .unwrap_or_default();
            format!(
                "{user}@{}#{}{tag}@{digest}",
                pinned.registry, pinned.repository
            )
        }
        None => ImageRef {
            user: None,
            ..pinned
        }
        .to_string(),
    }
}

/// Registry access for submission: the site's insecure registries and
/// mirrors, short timeouts, the user's own credentials (the defaults read
/// the environment of the submitting user).
fn submission_options(config: &Config) -> RegistryOptions {
    RegistryOptions {
        insecure_registries: config.insecure_registries.clone(),
        mirrors: config.mirrors.clone(),
        timeouts: Timeouts {
            connect: SUBMIT_CONNECT_TIMEOUT,
            read: SUBMIT_READ_TIMEOUT,
        },
        retry: RetryPolicy {
            attempts: 2,
            initial_delay: Duration::from_millis(250),
            max_total: Duration::from_secs(5),
        },
        proxy: config.proxy.clone(),
        ca_bundle: config.ca_bundle.clone(),
        // The user's tokens, reused by their next submissions.
        token_file: TokenFile::for_current_user(),
        ..RegistryOptions::default()
    }
}

/// Whether a registry failure says nothing about the image (the nodes may
/// still reach the registry): network, server errors, the token service.
fn is_transient(error: &anyhow::Error) -> bool {
    match error.downcast_ref::<RegistryError>() {
        Some(RegistryError::Unreachable { .. }) | Some(RegistryError::Auth { .. }) => true,
        Some(RegistryError::Http { status, .. }) => *status >= 500 || *status == 429,
        _ => false,
    }
}

/// Pins `image` at submission; `inherited` is the [`PIN_VARIABLE`] value
/// found in the environment (a step inside a job). Asks `resolve` for the
/// digest of a reference by tag; an error means the image cannot be used.
pub fn pin_at_submission(
    image: &str,
    inherited: Option<&str>,
    resolve: impl FnOnce(&ImageRef) -> anyhow::Result<String>,
) -> Result<Pinning, String> {
    let reference = match ImageSource::parse(image) {
        Ok(ImageSource::Registry(r)) if r.digest.is_none() => r,
        Ok(_) => return Ok(Pinning::AsGiven),
        Err(e) => return Err(format!("--container-image={image}: {e}")),
    };
    if let Some(pinned) = pin_for(image, inherited) {
        return Ok(Pinning::Inherited(pinned));
    }
    match resolve(&reference) {
        Ok(digest) => Ok(Pinning::Resolved(pinned_text(&reference, &digest))),
        Err(e) if is_transient(&e) => Ok(Pinning::Deferred(format!("{e:#}"))),
        Err(e) => Err(format!(
            "--container-image={image}: {e:#} (checked when the job was submitted, \
             with your own registry credentials)"
        )),
    }
}

/// The line `srun -v` shows about the pin. srun applies `-v` to its own log
/// only after `init_post_opt`, so the line waits for `local_user_init`.
static REPORT: Mutex<Option<String>> = Mutex::new(None);

/// srun, once its `-v` applies (`slurm_spank_local_user_init`): shows which
/// digest the step runs (`srun: berth: IMAGE resolved to sha256:...`).
pub fn report() {
    if let Some(line) = REPORT.lock().unwrap_or_else(|p| p.into_inner()).take() {
        handle::log_client_verbose(&line);
    }
}

/// srun, sbatch, salloc: pins the job's image and exports the pin to the job
/// (see the module doc). `srun -v` shows the digest ([`report`]).
pub fn at_submission(options: &JobOptions, config: &Config) -> Result<(), String> {
    let Some(image) = options.image.as_deref() else {
        return Ok(()); // a named container alone: nothing to pin
    };
    let inherited = std::env::var(PIN_VARIABLE).ok();
    let pinning = pin_at_submission(image, inherited.as_deref(), |reference| {
        let client = RegistryClient::new(&submission_options(config));
        Ok(client.top_digest(reference)?.to_string())
    })?;
    let digest_of = |pinned: &str| pinned.rsplit_once('@').map_or("", |(_, d)| d).to_string();
    let report = |line: String| {
        *REPORT.lock().unwrap_or_else(|p| p.into_inner()) = Some(line);
    };
    match pinning {
        Pinning::AsGiven => {}
        Pinning::Resolved(pinned) => {
            // srun, sbatch and salloc read no variable concurrently here:
            // init_post_opt runs before they start their threads of work.
            std::env::set_var(PIN_VARIABLE, format!("{image} {pinned}"));
            report(format!("{image} resolved to {}", digest_of(&pinned)));
        }
        Pinning::Inherited(pinned) => report(format!(
            "{image} resolved to {} (pinned when the job was submitted)",
            digest_of(&pinned)
        )),
        Pinning::Deferred(why) => handle::log_user(&format!(
            "warning: cannot pin {image} to a digest now ({why}); each node resolves \
             the tag when the step starts"
        )),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn never(_: &ImageRef) -> anyhow::Result<String> {
        panic!("no registry request expected")
    }

    #[test]
    fn files_and_digests_pass_through_without_a_request() {
        for image in [
            "/scratch/img.sqfs",
            "./img.sqfs",
            &format!("reg.example:5000/app@{D1}"),
            &format!("reg.example:5000/app:1@{D1}"),
        ] {
            assert_eq!(
                pin_at_submission(image, None, never),
                Ok(Pinning::AsGiven),
                "{image}"
            );
        }
    }

    #[test]
    fn tags_are_pinned_keeping_tag_and_user() {
        let ok = |_: &ImageRef| Ok(D1.to_string());
        let p = pin_at_submission("ubuntu", None, ok).unwrap();
        assert_eq!(
            p,
            Pinning::Resolved(format!("docker.io/library/ubuntu:latest@{D1}"))
        );
        let p = pin_at_submission("alice@nvcr.io#nvidia/pytorch:24.05", None, ok).unwrap();
        let Pinning::Resolved(pinned) = p else {
            panic!("{p:?}")
        };
        assert_eq!(pinned, format!("alice@nvcr.io#nvidia/pytorch:24.05@{D1}"));
        let back = ImageRef::parse(&pinned).unwrap();
        assert_eq!(back.user.as_deref(), Some("alice"));
        assert_eq!(back.tag.as_deref(), Some("24.05"));
        assert_eq!(back.digest.as_deref(), Some(D1));
        // A host docker-style parsing would not take for one stays enroot style.
        let p = pin_at_submission("myhost#app:2", None, ok).unwrap();
        assert_eq!(p, Pinning::Resolved(format!("myhost#app:2@{D1}")));
    }

    #[test]
    fn an_inherited_pin_for_the_same_text_is_reused() {
        let var = format!("busybox docker.io/library/busybox:latest@{D1}");
        let p = pin_at_submission("busybox", Some(&var), never).unwrap();
        assert_eq!(
            p,
            Pinning::Inherited(format!("docker.io/library/busybox:latest@{D1}"))
        );
        // Another image text resolves anew.
        let p = pin_at_submission("busybox:1", Some(&var), |_| Ok(D2.to_string())).unwrap();
        assert_eq!(
            p,
            Pinning::Resolved(format!("docker.io/library/busybox:1@{D2}"))
        );
    }

    #[test]
    fn a_pin_applies_only_to_its_own_text_and_repository() {
        let var = format!("app reg.example:5000/app:latest@{D1}");
        assert_eq!(
            for_step("app", Some(&var)),
            "app",
            "docker.io/library/app is not reg.example:5000/app"
        );
        let var = format!("reg.example:5000/app reg.example:5000/app:latest@{D1}");
        assert_eq!(
            for_step("reg.example:5000/app", Some(&var)),
            format!("reg.example:5000/app:latest@{D1}")
        );
        assert_eq!(
            for_step("reg.example:5000/other", Some(&var)),
            "reg.example:5000/other"
        );
        assert_eq!(
            for_step("reg.example:5000/app", None),
            "reg.example:5000/app"
        );
        let bad = "reg.example:5000/app reg.example:5000/app:latest";
        assert_eq!(
            for_step("reg.example:5000/app", Some(bad)),
            "reg.example:5000/app",
            "a pin without a digest is ignored"
        );
        let other_user = format!("a@reg.example:5000#app b@reg.example:5000#app@{D1}");
        assert_eq!(
            for_step("a@reg.example:5000#app", Some(&other_user)),
            "a@reg.example:5000#app"
        );
    }

    #[test]
    fn unreachable_registries_defer_and_missing_images_fail() {
        let unreachable = |_: &ImageRef| -> anyhow::Result<String> {
            Err(RegistryError::Unreachable {
                host: "reg.example".into(),
                detail: "connection refused".into(),
            }
            .into())
        };
        let p = pin_at_submission("reg.example/app", None, unreachable).unwrap();
        assert!(
            matches!(&p, Pinning::Deferred(why) if why.contains("connection refused")),
            "{p:?}"
        );
        let server = |_: &ImageRef| -> anyhow::Result<String> {
            Err(RegistryError::Http {
                url: "u".into(),
                status: 503,
                detail: String::new(),
            }
            .into())
        };
        assert!(matches!(
            pin_at_submission("reg.example/app", None, server),
            Ok(Pinning::Deferred(_))
        ));
        let missing = |_: &ImageRef| -> anyhow::Result<String> {
            Err(RegistryError::ManifestUnknown {
                image: "reg.example/app:latest".into(),
                registry: "reg.example".into(),
            }
            .into())
        };
        let e = pin_at_submission("reg.example/app", None, missing).unwrap_err();
        assert!(
            e.starts_with(
                "--container-image=reg.example/app: image reg.example/app:latest not found"
            ),
            "{e}"
        );
        let e = pin_at_submission("Bad Ref", None, never).unwrap_err();
        assert!(e.contains("--container-image=Bad Ref"), "{e}");
    }
}
