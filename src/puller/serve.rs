//! `berth __pull`: the pull helper's side ([`crate::helper::protocol`]). Reads one [`PullJob`] (and the
//! credentials after it) from stdin, pulls with exactly its settings (no
//! config file is read), and writes one [`PullReply`] line to stdout.

use std::io::Write;

use super::CredentialSet;
use crate::helper::{ErrorKind, HelperError, PullJob, PullReply};
use crate::reference::ImageSource;
use crate::store::{pull_image, NotInStore, ProgressMode};

/// Serves one pull request from stdin; returns the exit code (0 when the
/// reply is the image or "not in store", 1 for an error reply).
pub fn serve_pull() -> i32 {
    // Nobody but root may read this process's memory: it holds the
    // requesting user's credentials.
    // SAFETY: prctl(PR_SET_DUMPABLE) only changes a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // Whoever attached before that still reads it: refuse to go on.
    let request = CredentialSet::refuse_if_traced()
        .and_then(|()| PullJob::read_from(std::io::stdin().lock()));
    let reply = match request {
        Ok((job, credentials)) => pull(&job, &credentials),
        Err(e) => PullReply::Error(HelperError {
            kind: ErrorKind::Request,
            message: format!("{e:#}"),
        }),
    };
    let code = i32::from(matches!(reply, PullReply::Error(_)));
    let mut out = std::io::stdout().lock();
    if out
        .write_all(reply.to_line().as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        return 1;
    }
    code
}

/// Runs `job` with the credentials read from `credentials`.
fn pull(job: &PullJob, credentials: &[u8]) -> PullReply {
    let fail = |kind, message: String| {
        let message = if message.contains(&job.image) {
            message
        } else {
            format!("cannot pull image '{}': {message}", job.image)
        };
        PullReply::Error(HelperError { kind, message })
    };
    let source = match ImageSource::parse(&job.image) {
        // The pull user fetches from registries only: it never opens a
        // user's path nor asks a user's container engine.
        Ok(source @ ImageSource::Registry(_)) => source,
        Ok(_) => {
            return fail(
                ErrorKind::Request,
                "the pull helper takes registry images only (files and local engines' images \
                 come through `berth __import`)"
                    .to_string(),
            )
        }
        Err(e) => return fail(ErrorKind::Request, format!("{e:#}")),
    };
    let progress = if job.progress_lines {
        ProgressMode::Lines
    } else {
        ProgressMode::Off
    };
    let mut options = job.settings.pull_options(progress, job.cached_only);
    match CredentialSet::read_from(credentials) {
        Ok(set) => options.registry.credentials = set.into_source(),
        Err(e) => return fail(ErrorKind::Request, format!("{e:#}")),
    }
    match pull_image(&job.store, &source, &options) {
        Ok(stored) => PullReply::Ok(Box::new(stored)),
        Err(e) => match e.downcast_ref::<NotInStore>() {
            Some(missing) => PullReply::NotInStore(missing.manifest_digest.clone()),
            None => fail(ErrorKind::of(&e), format!("{e:#}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pull_user_takes_registry_images_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.tar");
        std::fs::write(&file, b"any").unwrap();
        for image in [file.display().to_string(), "dockerd://busybox".to_string()] {
            let job = PullJob {
                image: image.clone(),
                store: dir.path().join("store"),
                cached_only: false,
                progress_lines: false,
                settings: crate::helper::PullSettings::from_config(
                    &crate::config::Config::default(),
                ),
            };
            match pull(&job, b"") {
                PullReply::Error(e) => {
                    assert_eq!(e.kind, ErrorKind::Request, "{image}");
                    assert!(e.message.contains("registry images only"), "{}", e.message);
                }
                _ => panic!("{image}: the pull helper took it"),
            }
        }
    }
}
