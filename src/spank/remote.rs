//! slurmstepd: pull the image, create one container per step and node, and join
//! every local task to it.
//!
//! `user_init` runs once per step in slurmstepd (uid 0, euid = the user): it
//! runs the `berth` helper to pull the image and to build the container, then
//! keeps the container's namespace handles. Each task, forked from slurmstepd,
//! inherits those handles and joins them in `task_init`. When slurmstepd lets go
//! at `exit` and the tasks are gone, the kernel tears every mount down.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use super::ffi;
use super::handle::{self, Spank};
use super::options::{self, env_names, JobOptions};
use crate::config::Config;
use crate::container::spec::{parse_mounts, ContainerSpec, MountSpec, Namespace, UserIdentity};
use crate::container::{spawn_holder, Container, Mode};
use crate::privilege::with_root;
use crate::store::{ImageHold, Store, StoredImage};

/// The container of this step on this node, created in `user_init`.
static CONTAINER: Mutex<Option<StepContainer>> = Mutex::new(None);

/// What tasks need to join the step's container.
struct StepContainer {
    container: Container,
    /// `--container-env`: variables whose job value wins over the image's.
    keep_job_env: Vec<String>,
    /// Keeps `berth rmi` and `berth gc` off the image while the step runs.
    _image_hold: Option<ImageHold>,
}

/// Why `user_init` could not make the container. Slurm 22.05's srun exits 0
/// when `user_init` fails (the launch fails, no task runs), so the failure is
/// reported there and raised again in each task's `task_init`, which makes
/// the tasks (and so srun) fail with a non-zero exit code.
static SETUP_FAILED: Mutex<bool> = Mutex::new(false);

/// Environment variables whose folders the PMIx and PMI2 clients need to see.
const PMI_DIR_VARIABLES: &[&str] = &[
    "PMIX_SERVER_TMPDIR",
    "PMIX_SYSTEM_TMPDIR",
    "SLURM_PMIX_TMPDIR",
    "TMPDIR",
];

/// Whether this step runs in a container (never the extern step; the batch
/// step comes with sbatch support).
fn wants_container(spank: &Spank, options: &JobOptions) -> Result<bool, String> {
    if options.image.is_none() {
        return Ok(false);
    }
    let step = spank.step_id().map_err(|e| e.to_string())?;
    Ok(step != ffi::SLURM_EXTERN_CONT && step != ffi::SLURM_BATCH_SCRIPT)
}

/// Checks the options again in slurmstepd (srun already did).
pub fn init_post_opt(_spank: &Spank) -> Result<(), String> {
    super::local::check_options(&options::current())
}

/// Pulls the image and creates the container for this step on this node. A
/// failure is logged (srun shows it) and failed again in every task.
pub fn user_init(spank: &Spank, config: &Config) -> Result<(), String> {
    if let Err(message) = create_container(spank, config) {
        handle::log_error(&message);
        *SETUP_FAILED.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }
    Ok(())
}

fn create_container(spank: &Spank, config: &Config) -> Result<(), String> {
    let options = options::current();
    if !wants_container(spank, &options)? {
        return Ok(());
    }
    let image = options.image.clone().unwrap_or_default();
    let started = Instant::now();
    let job = spank.job_id().map_err(|e| e.to_string())?;
    let step = spank.step_id().map_err(|e| e.to_string())?;

    let node = spank
        .getenv("SLURMD_NODENAME")
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .map(|h| h.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let store = config.store_path_for_node(&node);
    let (stored, image_hold) = with_root(|| pull_and_hold(config, &store, &image))?;
    let pulled = started.elapsed();

    let uid = spank.uid().map_err(|e| e.to_string())?;
    let gid = spank.gid().map_err(|e| e.to_string())?;
    let mut user = UserIdentity::lookup(uid, gid)
        .map_err(|e| format!("cannot look up user {uid} on this node: {e}"))?;
    if let Ok(groups) = spank.supplementary_gids() {
        if !groups.is_empty() {
            user.groups = groups;
        }
    }
    let mounts = match &options.mounts {
        Some(text) => parse_mounts(text).map_err(|e| format!("--container-mounts: {e}"))?,
        None => Vec::new(),
    };
    let job_env = spank.job_env().map_err(|e| e.to_string())?;
    let mut spec = ContainerSpec::new(stored.squashfs.clone(), stored.config.clone(), user);
    spec.mounts = mounts;
    spec.workdir = options.workdir.clone();
    spec.extra_binds = pmi_binds(&job_env);
    spec.writable = options.writable.unwrap_or(true);
    spec.mount_home = options.mount_home.unwrap_or(false);
    spec.remap_root = options.remap_root.unwrap_or(false);
    if let Some(list) = &options.unshare {
        spec.unshare =
            Namespace::parse_list(list).map_err(|e| format!("--container-unshare={list}: {e}"))?;
    }
    let keep_job_env = match &options.env {
        Some(list) => env_names(list).map_err(|e| format!("--container-env={list}: {e}"))?,
        None => Vec::new(),
    };
    // spawn_holder takes root for the mounts and the id maps itself.
    let container = spawn_holder(&config.helper_path, &spec, Mode::Privileged)
        .map_err(|e| format!("cannot start the container for image '{image}': {e:#}"))?;
    *CONTAINER.lock().unwrap_or_else(|p| p.into_inner()) = Some(StepContainer {
        container,
        keep_job_env,
        _image_hold: image_hold,
    });
    handle::log_info(&format!(
        "job {job} step {step}: image {image} ({}) ready in {:.0} ms (pull/lookup {:.0} ms)",
        stored.manifest_digest.as_deref().unwrap_or("squashfs file"),
        started.elapsed().as_secs_f64() * 1e3,
        pulled.as_secs_f64() * 1e3,
    ));
    Ok(())
}

/// Joins the calling task to the step's container and applies the image env.
pub fn task_init(spank: &Spank) -> Result<(), String> {
    if *SETUP_FAILED.lock().unwrap_or_else(|p| p.into_inner()) {
        return Err("the container could not be set up on this node (see the error above)".into());
    }
    let guard = CONTAINER.lock().unwrap_or_else(|p| p.into_inner());
    let Some(step) = guard.as_ref() else {
        return Ok(());
    };
    step.container
        .join()
        .map_err(|e| format!("cannot enter the container: {e:#}"))?;
    for (name, value) in step.container.env(std::iter::empty()) {
        if step.keep_job_env.contains(&name) && spank.getenv(&name).is_some() {
            continue;
        }
        spank.setenv(&name, &value).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Lets go of the container's namespaces.
pub fn exit() {
    CONTAINER.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// Folders named by PMI variables of the job that must be visible inside.
fn pmi_binds(job_env: &[String]) -> Vec<MountSpec> {
    let mut binds: Vec<MountSpec> = Vec::new();
    for entry in job_env {
        let Some((name, value)) = entry.split_once('=') else {
            continue;
        };
        if !PMI_DIR_VARIABLES.contains(&name) || !value.starts_with('/') {
            continue;
        }
        let path = Path::new(value);
        if path.starts_with("/tmp") || !path.is_dir() || binds.iter().any(|b| b.source == path) {
            continue;
        }
        binds.push(MountSpec {
            source: path.to_path_buf(),
            target: path.to_path_buf(),
            read_only: false,
        });
    }
    binds
}

/// Pulls the image and takes a shared hold on it for the step. `berth gc` may
/// remove an image between the pull and the hold: then pull once more.
fn pull_and_hold(
    config: &Config,
    store: &Path,
    image: &str,
) -> Result<(StoredImage, Option<ImageHold>), String> {
    let mut stored = pull(config, store, image)?;
    if stored.manifest_digest.is_none() {
        return Ok((stored, None)); // a squashfs file given by path, not in the store
    }
    let open = || Store::open_unswept(store).map_err(|e| format!("{e:#}"));
    let hold = match open()?.hold(&stored) {
        Ok(hold) => hold,
        Err(_) => {
            stored = pull(config, store, image)?;
            open()?.hold(&stored).map_err(|e| format!("{e:#}"))?
        }
    };
    Ok((stored, Some(hold)))
}

/// Runs `berth pull --json` (as root, into the node store) and reads its answer.
fn pull(config: &Config, store: &Path, image: &str) -> Result<StoredImage, String> {
    let mut command = Command::new(&config.helper_path);
    command.arg("pull").arg("--json").arg("--store").arg(store);
    for registry in &config.insecure_registries {
        command.arg("--insecure-registry").arg(registry);
    }
    for (registry, mirror) in &config.mirrors {
        command.arg("--mirror").arg(format!("{registry}={mirror}"));
    }
    if let Some(n) = config.registry_retries {
        command.arg("--registry-retries").arg(n.to_string());
    }
    command.arg("--progress").arg("lines");
    command.arg("--").arg(image);
    command
        .stdin(Stdio::null())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    crate::privilege::run_as_full_root(&mut command);
    let output = command.output().map_err(|e| {
        format!(
            "cannot run the berth helper {}: {e} (check helper_path in plugstack.conf)",
            config.helper_path.display()
        )
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        // The helper's message already names the image and what to do.
        let message = stderr.trim().trim_start_matches("error: ");
        return Err(message.to_string());
    }
    // One short line for the user when the image was fetched (not when cached).
    let stderr = String::from_utf8_lossy(&output.stderr);
    if let Some(done) = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("berth: pulled "))
    {
        let node = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        handle::log_user(&format!(
            "{node}: {image}: {}",
            done.trim_start_matches("berth: ")
        ));
    }
    serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("the berth helper gave an unreadable answer for '{image}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmi_binds_keep_existing_dirs_outside_tmp() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let env = vec![
            format!("PMIX_SERVER_TMPDIR={}", dir.path().display()),
            "PMIX_SYSTEM_TMPDIR=/tmp".to_string(),
            "OTHER=/etc".to_string(),
            "TMPDIR=/nonexistent/x".to_string(),
        ];
        let binds = pmi_binds(&env);
        assert_eq!(binds.len(), 1);
        assert_eq!(binds[0].source, dir.path());
    }
}
