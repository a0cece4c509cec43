//! Images of a local container engine (`dockerd://IMAGE`, `podman://IMAGE`)
//! for a step: the engine is asked as the job's user, with their groups
//! (`no_new_privs` for docker; not for podman, whose rootless mode execs the
//! set-user-id `newuidmap` as in any of the user's tasks) (so
//! their right to the Docker socket, or their own podman storage, decides),
//! by its client's `save` verb; what it writes goes through a pipe straight
//! to `berth __import`, which runs as the pull user and converts the archive
//! into the node store ([`super::import`]). Root only connects the two: it
//! reads none of the engine's bytes, only the client's exit status and its
//! first lines of stderr for the message.

use anyhow::anyhow;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

use super::import::run_helper;
use super::{layout, ImportRequest, PullUser, Requester};
use crate::reference::{DaemonImage, Engine};
use crate::store::StoredImage;

/// The job's variables that say which engine to reach and where the user's
/// engine settings live; passed on to the client, nothing else is.
const ENGINE_VARIABLES: &[&str] = &[
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
];

/// The most bytes of the client's stderr kept for a message.
const MAX_STDERR: u64 = 8 << 10;

/// Imports `source` for `requester` into the node store named by
/// `request` (`request.name` is the image as the user wrote it): the
/// stored copy, or why not. Must run with root available (real uid 0).
pub fn import_daemon(
    request: &ImportRequest,
    source: &DaemonImage,
    requester: &Requester,
    show: &dyn Fn(&str),
) -> anyhow::Result<StoredImage> {
    let pull_user = PullUser::lookup(request.pull_user)?;
    crate::privilege::with_root(|| layout::prepare_store(request.store, &pull_user))?;
    let user = requester.user;
    let program = source.engine.program();
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| anyhow!("cannot make a pipe for {source}: {e:#}"))?;
    let mut command = Command::new(program);
    command
        .args(source.engine.save_args(&source.image))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &user.home)
        .env("USER", &user.name)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped());
    for (name, value) in requester
        .job_env
        .iter()
        .filter_map(|entry| entry.split_once('='))
    {
        if ENGINE_VARIABLES.contains(&name) && !value.is_empty() {
            command.env(name, value);
        }
    }
    match source.engine {
        Engine::Docker => {
            crate::privilege::run_as_user(&mut command, user.uid, user.gid, user.all_gids())
        }
        // Rootless podman maps the user's subordinate ids with the node's
        // set-user-id newuidmap, as it does in any of their tasks.
        Engine::Podman => crate::privilege::run_as_user_with_setuid_helpers(
            &mut command,
            user.uid,
            user.gid,
            user.all_gids(),
        ),
    }
    let mut client = crate::privilege::with_root(|| command.spawn()).map_err(|e| {
        anyhow!(
            "cannot run `{program} save` as {} for {source} (is {program} installed on this \
             node?): {e:#}",
            user.name
        )
    })?;
    // The write end now lives in the client only: its end is the stream's end.
    drop(command);
    let mut stderr = client.stderr.take().expect("stderr is piped");
    let said = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = (&mut stderr).take(MAX_STDERR).read_to_string(&mut text);
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
        text
    });
    let imported = run_helper(request, &pull_user, read_end.as_raw_fd(), show);
    drop(read_end);
    if imported.is_err() {
        // The import stopped early: a client still writing gets no reader.
        let _ = crate::privilege::with_root(|| client.kill());
    }
    let status = client.wait();
    let said = said.join().unwrap_or_default();
    match status {
        Ok(status) if status.success() => imported,
        Ok(status) if imported.is_err() && said.trim().is_empty() => Err(anyhow!(
            "{} (`{program} save` ended: {status})",
            imported.unwrap_err()
        )),
        Ok(status) => Err(anyhow!(
            "`{program} save` of {source} as {} failed ({status}): {}; check that the image \
             exists (`{program} images`) and that {} may use {program} on this node",
            user.name,
            said.trim().replace('\n', "; "),
            user.name
        )),
        Err(e) => Err(anyhow!(
            "cannot wait for `{program} save` of {source}: {e:#}"
        )),
    }
}
