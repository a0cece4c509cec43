//! Running the credentials helper as the user and the puller as the pull user.

use anyhow::anyhow;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::creds::{hosts_for, CredentialSet, MAX_WIRE_BYTES};
use super::{layout, PullUser};
use crate::container::spec::UserIdentity;
use crate::helper::{runner, PullJob, PullReply, PullSettings, RunAs, PULL_ARG};
use crate::reference::ImageRef;
use crate::registry::Credentials;
use crate::store::StoredImage;

/// The hidden subcommand that looks up credentials as the user.
pub const CREDENTIALS_ARG: &str = "__credentials";

/// How long the user's credential lookup (files, docker credential helpers) may take.
const CREDENTIALS_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment variables of the job that say where the user's
/// credentials are (and where docker credential helpers are found).
const CREDENTIAL_VARIABLES: &[&str] = &[
    "HOME",
    "PATH",
    "DOCKER_CONFIG",
    "ENROOT_CONFIG_PATH",
    "XDG_CONFIG_HOME",
];

/// The user a pull is for.
#[derive(Debug)]
pub struct Requester<'a> {
    /// Their identity (uid, gid, groups, home).
    pub user: &'a UserIdentity,
    /// Their job's environment, `NAME=value` (only the credential
    /// locations are passed on).
    pub job_env: &'a [String],
}

/// Where the credentials of a pull come from.
pub enum CredentialsFrom<'a> {
    /// `berth __credentials` run as this user, with their job's locations.
    User(&'a Requester<'a>),
    /// Looked up by the calling process itself (root's own CLI pull).
    Here(&'a dyn Credentials),
}

/// Where a forwarded progress line goes (the user's srun output).
pub type ShowLine<'a> = &'a dyn Fn(&str);

/// One pull for [`pull`].
pub struct PullRequest<'a> {
    /// The `berth` binary.
    pub helper: &'a Path,
    /// The node store.
    pub store: &'a Path,
    /// The image reference.
    pub image: &'a ImageRef,
    /// `pull_user`.
    pub pull_user: &'a str,
    /// The resolved settings of the pull (the helper reads no config file).
    pub settings: PullSettings,
    /// Plain progress lines on the puller's stderr (else none).
    pub progress_lines: bool,
    /// Only look in the store: an image not there is
    /// [`Answer::NotInStore`], nothing is downloaded.
    pub cached_only: bool,
    /// Passes progress lines on while the pull runs: a label (`NODE: IMAGE`)
    /// and where to show them.
    pub forward: Option<(String, ShowLine<'a>)>,
}

/// What the puller answered.
#[derive(Debug)]
pub enum Answer {
    /// The image, in the store.
    Stored(Box<StoredImage>),
    /// `cached_only`: not in the store; its manifest digest.
    NotInStore(String),
}

/// What a pull gave.
#[derive(Debug)]
pub struct Pulled {
    /// The stored image, or that it is not in the store.
    pub answer: Answer,
    /// The puller's stderr (progress lines, warnings).
    pub stderr: String,
}

/// Pulls `request.image` into the node store as the pull user, with the
/// credentials `from` gives. Must run with root available (real uid 0).
/// Errors are one message for the user (the puller's names the image).
pub fn pull(request: &PullRequest, from: CredentialsFrom) -> anyhow::Result<Pulled> {
    let pull_user = PullUser::lookup(request.pull_user)?;
    let shared = request.settings.shared.is_some();
    let adopted = crate::privilege::with_root(|| {
        let adopted = layout::prepare_store(request.store, &pull_user)?;
        // The marker sits in the root's own folder, which only root writes.
        if shared {
            crate::store::mark_shared_store(request.store)?;
        }
        Ok::<_, anyhow::Error>(adopted)
    })?;
    for dir in adopted {
        eprintln!(
            "berth: gave {} (made by an older berth as root) to the pull user {}",
            dir.display(),
            pull_user.name
        );
    }
    let hosts = hosts_for(request.image, &request.settings.mirrors);
    let login = request.image.user.as_deref();
    let credentials = match from {
        CredentialsFrom::User(requester) => {
            user_credentials(request.helper, requester, &hosts, login)?
        }
        CredentialsFrom::Here(source) => CredentialSet::collect(source, &hosts, login).encode(),
    };
    run_puller(request, &pull_user, &credentials)
}

/// Runs `berth __credentials` as the requesting user; returns what it wrote
/// (passed on unread: only the puller parses it).
fn user_credentials(
    helper: &Path,
    requester: &Requester,
    hosts: &[String],
    login: Option<&str>,
) -> anyhow::Result<Vec<u8>> {
    let user = requester.user;
    let mut command = Command::new(helper);
    command.arg(CREDENTIALS_ARG);
    if let Some(login) = login {
        command.arg("--login").arg(login);
    }
    command.arg("--").args(hosts);
    command
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &user.home)
        .current_dir("/");
    for entry in requester.job_env {
        if let Some((name, value)) = entry.split_once('=') {
            if CREDENTIAL_VARIABLES.contains(&name) && !value.is_empty() {
                command.env(name, value);
            }
        }
    }
    let run_as = RunAs::User {
        uid: user.uid,
        gid: user.gid,
        groups: user.all_gids(),
    };
    let options = runner::Options {
        limit: Some(CREDENTIALS_TIMEOUT),
        max_stdout: MAX_WIRE_BYTES + 1,
        ..runner::Options::default()
    };
    let finished = runner::run(&mut command, run_as, options).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted => anyhow!(
            "reading the registry credentials of {} failed: {e:#} (a docker credential helper \
             that does not answer?)",
            user.name
        ),
        _ => anyhow!(
            "cannot run the berth helper {} as {} to read their registry credentials: {e:#}",
            helper.display(),
            user.name
        ),
    })?;
    let (status, stdout, stderr) = (finished.status, finished.stdout, finished.stderr);
    // Warnings about the user's own files (never secrets) go to the user.
    for line in stderr.lines().take(10) {
        eprintln!("{line}");
    }
    if !status.success() {
        return Err(anyhow!(
            "reading the registry credentials of {} failed ({status}): {}",
            user.name,
            stderr.trim()
        ));
    }
    Ok(stdout)
}

/// Runs `berth __pull` as the pull user with the request (and the
/// credentials after it) on its stdin, and reads its reply line.
fn run_puller(
    request: &PullRequest,
    user: &PullUser,
    credentials: &[u8],
) -> anyhow::Result<Pulled> {
    let image = request.image.to_string();
    let job = PullJob {
        image: image.clone(),
        store: request.store.to_path_buf(),
        cached_only: request.cached_only,
        progress_lines: request.progress_lines,
        settings: request.settings.clone(),
    };
    let input = job.encode(credentials);
    let mut command = Command::new(request.helper);
    command
        .arg(PULL_ARG)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .current_dir("/");
    let run_as = RunAs::User {
        uid: user.uid,
        gid: user.gid,
        groups: Vec::new(),
    };
    let forward = request
        .forward
        .as_ref()
        .map(|(label, show)| (label.as_str(), *show));
    let options = runner::Options {
        input: &input,
        forward,
        ..runner::Options::default()
    };
    let output = runner::run(&mut command, run_as, options).map_err(|e| match e.kind() {
        std::io::ErrorKind::Interrupted => anyhow!("stopped the pull of '{image}': {e:#}"),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => anyhow!(
            "cannot run the berth helper {} as the pull user {}: {e:#} (check helper_path in \
             plugstack.conf, and that {1} may execute it)",
            request.helper.display(),
            user.name
        ),
        _ => anyhow!("the berth helper (pull) failed: {e:#}"),
    })?;
    let answer = match PullReply::parse(&output.stdout) {
        Ok(PullReply::Ok(stored)) => Answer::Stored(stored),
        Ok(PullReply::NotInStore(digest)) => Answer::NotInStore(digest),
        Ok(PullReply::Error(error)) => return Err(anyhow::Error::msg(error.message)),
        Err(_) => {
            return Err(anyhow::Error::msg(pull_failure(
                &image,
                output.status,
                &output.stderr,
            )))
        }
    };
    Ok(Pulled {
        answer,
        stderr: output.stderr,
    })
}

/// What to tell the user when the pull helper ended without a reply
/// (killed, or crashed): how it ended, and its last line on stderr.
fn pull_failure(image: &str, status: std::process::ExitStatus, stderr: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match status.signal() {
        Some(signal) => format!(
            "was killed by signal {signal} ({})",
            nix::sys::signal::Signal::try_from(signal).map_or("unknown", |s| s.as_str())
        ),
        None => format!("failed with {status}"),
    };
    format!(
        "the pull of image '{image}' on this node {how} before it finished; nothing was \
         stored, the next step pulls it again{}",
        match stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(last) => format!(" (its last message: {})", last.trim()),
            None => String::new(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_without_a_reply_says_how_it_ended() {
        use std::os::unix::process::ExitStatusExt;
        let killed = std::process::ExitStatus::from_raw(9);
        let message = pull_failure("x", killed, "berth: resolving x\n");
        assert!(
            message.contains("killed by signal 9 (SIGKILL)")
                && message.contains("'x'")
                && message.contains("berth: resolving x"),
            "{message}"
        );
        let failed = std::process::ExitStatus::from_raw(1 << 8);
        let message = pull_failure("x", failed, "");
        assert!(message.contains("failed with exit status: 1"), "{message}");
    }
}
