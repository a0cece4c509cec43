//! Running the credentials helper as the user and the puller as the pull user.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::creds::{hosts_for, CredentialSet, MAX_WIRE_BYTES};
use super::{layout, PullUser};
use crate::container::spec::UserIdentity;
use crate::reference::ImageRef;
use crate::registry::Credentials;
use crate::store::{StoredImage, NOT_IN_STORE_EXIT};

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
    /// Plain-HTTP registries.
    pub insecure_registries: &'a [String],
    /// Pull-through mirrors.
    pub mirrors: &'a [(String, String)],
    /// Registry retries (`None`: the built-in default).
    pub registry_retries: Option<u32>,
    /// Largest flattened image, in bytes.
    pub max_image_size: u64,
    /// `--progress` of the puller (`lines` for the plugin).
    pub progress: &'a str,
    /// Only look in the store (`--cached-only`): an image not there is
    /// [`Answer::NotInStore`], nothing is downloaded.
    pub cached_only: bool,
    /// More `berth pull` arguments (shared store, registry timeout).
    pub extra_args: Vec<String>,
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
pub fn pull(request: &PullRequest, from: CredentialsFrom) -> Result<Pulled, String> {
    let pull_user = PullUser::lookup(request.pull_user)?;
    let shared = request.extra_args.iter().any(|a| a == "--shared-store");
    let adopted = crate::privilege::with_root(|| {
        let adopted = layout::prepare_store(request.store, &pull_user)?;
        // The marker sits in the root's own folder, which only root writes.
        if shared {
            crate::store::mark_shared_store(request.store)?;
        }
        Ok::<_, anyhow::Error>(adopted)
    })
    .map_err(|e| format!("{e:#}"))?;
    for dir in adopted {
        eprintln!(
            "berth: gave {} (made by an older berth as root) to the pull user {}",
            dir.display(),
            pull_user.name
        );
    }
    let hosts = hosts_for(request.image, request.mirrors);
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
) -> Result<Vec<u8>, String> {
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
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for entry in requester.job_env {
        if let Some((name, value)) = entry.split_once('=') {
            if CREDENTIAL_VARIABLES.contains(&name) && !value.is_empty() {
                command.env(name, value);
            }
        }
    }
    crate::privilege::run_as_user(&mut command, user.uid, user.gid, user.all_gids());
    let child = crate::privilege::with_root(|| command.spawn()).map_err(|e| {
        format!(
            "cannot run the berth helper {} as {} to read their registry credentials: {e}",
            helper.display(),
            user.name
        )
    })?;
    let (status, stdout, stderr) = wait_bounded(child, CREDENTIALS_TIMEOUT).map_err(|e| {
        format!(
            "reading the registry credentials of {} failed: {e} (a docker credential helper \
             that does not answer?)",
            user.name
        )
    })?;
    // Warnings about the user's own files (never secrets) go to the user.
    for line in String::from_utf8_lossy(&stderr).lines().take(10) {
        eprintln!("{line}");
    }
    if !status.success() {
        return Err(format!(
            "reading the registry credentials of {} failed ({status}): {}",
            user.name,
            String::from_utf8_lossy(&stderr).trim()
        ));
    }
    Ok(stdout)
}

/// Waits for `child` at most `limit` (then kills it), reading its output.
fn wait_bounded(
    mut child: Child,
    limit: Duration,
) -> std::io::Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>)> {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (status, out, err) = std::thread::scope(|s| {
        let out = s.spawn(move || {
            let mut bytes = Vec::new();
            if let Some(pipe) = stdout.as_mut() {
                let _ = pipe.take(MAX_WIRE_BYTES + 1).read_to_end(&mut bytes);
            }
            bytes
        });
        let err = s.spawn(move || {
            let mut bytes = Vec::new();
            if let Some(pipe) = stderr.as_mut() {
                let _ = pipe.take(64 << 10).read_to_end(&mut bytes);
            }
            bytes
        });
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) if started.elapsed() > limit => {
                    let _ = crate::privilege::with_root(|| child.kill());
                    let _ = child.wait();
                    break Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer in {} s", limit.as_secs()),
                    ));
                }
                Ok(None) if crate::interrupt::requested().is_some() => {
                    let _ = crate::privilege::with_root(|| child.kill());
                    let _ = child.wait();
                    let reason = crate::interrupt::requested().unwrap_or_default();
                    break Err(crate::interrupt::interrupted_error(&reason));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => break Err(e),
            }
        };
        (
            status,
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        )
    });
    Ok((status?, out, err))
}

/// Runs `berth pull --json --credentials-stdin` as the pull user and reads
/// its answer.
fn run_puller(
    request: &PullRequest,
    user: &PullUser,
    credentials: &[u8],
) -> Result<Pulled, String> {
    let mut command = Command::new(request.helper);
    command
        .arg("pull")
        .arg("--json")
        .arg("--credentials-stdin")
        .arg("--store")
        .arg(request.store)
        .arg("--max-image-size")
        .arg(request.max_image_size.to_string());
    for registry in request.insecure_registries {
        command.arg("--insecure-registry").arg(registry);
    }
    for (registry, mirror) in request.mirrors {
        command.arg("--mirror").arg(format!("{registry}={mirror}"));
    }
    if let Some(n) = request.registry_retries {
        command.arg("--registry-retries").arg(n.to_string());
    }
    if request.cached_only {
        command.arg("--cached-only");
    }
    command.args(&request.extra_args);
    command.arg("--progress").arg(request.progress);
    command.arg("--").arg(request.image.to_string());
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    crate::privilege::run_as_user(&mut command, user.uid, user.gid, Vec::new());
    let mut child = crate::privilege::with_root(|| command.spawn()).map_err(|e| {
        format!(
            "cannot run the berth helper {} as the pull user {}: {e} (check helper_path in \
             plugstack.conf, and that {1} may execute it)",
            request.helper.display(),
            user.name
        )
    })?;
    let stdin = child.stdin.take();
    let (label, show): (String, &dyn Fn(&str)) = match &request.forward {
        Some((label, show)) => (label.clone(), *show),
        None => (String::new(), &|_: &str| {}),
    };
    let output = std::thread::scope(|s| {
        s.spawn(move || {
            if let Some(mut pipe) = stdin {
                // A puller that died early closes the pipe: its stderr says why.
                let _ = pipe.write_all(credentials);
            }
        });
        super::output::wait_forwarding(child, &label, show)
    })
    .map_err(|e| {
        if e.kind() == std::io::ErrorKind::Interrupted {
            return format!("stopped the pull of '{}': {e}", request.image);
        }
        format!("the berth helper (pull) failed: {e}")
    })?;
    let image = request.image.to_string();
    if request.cached_only && output.status.code() == Some(NOT_IN_STORE_EXIT.into()) {
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| {
            format!("the berth helper gave an unreadable answer for '{image}': {e}")
        })?;
        let digest = answer["not_in_store"]
            .as_str()
            .ok_or_else(|| format!("the berth helper gave an unreadable answer for '{image}'"))?;
        return Ok(Pulled {
            answer: Answer::NotInStore(digest.to_string()),
            stderr: output.stderr,
        });
    }
    if !output.status.success() {
        return Err(pull_failure(&image, output.status, &output.stderr));
    }
    let stored = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("the berth helper gave an unreadable answer for '{image}': {e}"))?;
    Ok(Pulled {
        answer: Answer::Stored(Box::new(stored)),
        stderr: output.stderr,
    })
}

/// What to tell the user when `berth pull` failed: its error (which names the
/// image and what to do) without its progress lines, or how it ended when it
/// said nothing (killed).
fn pull_failure(image: &str, status: std::process::ExitStatus, stderr: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    // Progress lines come first; the error (possibly several lines) is last,
    // from the first line that starts with `error: `.
    let error = stderr
        .match_indices("error: ")
        .find(|(at, _)| *at == 0 || stderr[..*at].ends_with('\n'))
        .map_or("", |(at, _)| stderr[at + "error: ".len()..].trim());
    if !error.is_empty() {
        if error.contains(image) {
            return error.to_string();
        }
        return format!("cannot pull image '{image}': {error}");
    }
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
    fn pull_failures_show_the_error_or_how_the_pull_ended() {
        use std::os::unix::process::ExitStatusExt;
        let output =
            |raw: i32, stderr: &str| (std::process::ExitStatus::from_raw(raw), stderr.to_string());
        let failed = output(
            1 << 8,
            "berth: resolving x\nberth: layer sha256:aa fetched\nerror: cannot fetch x: HTTP 500\n",
        );
        assert_eq!(
            pull_failure("x", failed.0, &failed.1),
            "cannot fetch x: HTTP 500"
        );
        let nested = output(1 << 8, "error: registry r down (io error: refused)\n");
        assert_eq!(
            pull_failure("img", nested.0, &nested.1),
            "cannot pull image 'img': registry r down (io error: refused)"
        );
        let killed = output(9, "berth: resolving x\n");
        let message = pull_failure("x", killed.0, &killed.1);
        assert!(
            message.contains("killed by signal 9 (SIGKILL)")
                && message.contains("'x'")
                && message.contains("berth: resolving x"),
            "{message}"
        );
    }
}
