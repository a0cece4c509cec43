//! slurmstepd: pull the image, create one container per step and node, and join
//! every local task to it.
//!
//! `user_init` runs once per step in slurmstepd (uid 0, euid = the user): it
//! runs the `berth` helper to pull the image and to build the container, then
//! keeps the container's namespace handles. Each task, forked from slurmstepd,
//! inherits those handles and joins them in `task_init`. When slurmstepd lets go
//! at `exit` and the tasks are gone, the kernel tears every mount down.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::ffi;
use super::handle::{self, Spank};
use super::named_step::NamedUse;
use super::options::{self, env_names, JobOptions};
use crate::config::Config;
use crate::container::entrypoint::EntrypointRun;
use crate::container::env::JOB_LOCALE_VARIABLES;
use crate::container::save::{check_output, SaveRequest, SAVE_ARG};
use crate::container::spec::{
    parse_mounts, resolve_relative_sources, ContainerSpec, MountKind, MountSpec, Namespace,
    UserIdentity,
};
use crate::container::{spawn_holder, task_env, Container, Mode};
use crate::helper::PullSettings;
use crate::image::ImageConfig;
use crate::named::{ContainerName, NamedRoots};
use crate::privilege::with_root;
use crate::puller::{Answer, CredentialsFrom, PullRequest, Requester};
use crate::reference::ImageSource;
use crate::store::{ImageHold, Store, StoredImage};

/// The container of this step on this node, created in `user_init`.
static CONTAINER: Mutex<Option<StepContainer>> = Mutex::new(None);

/// What tasks need to join the step's container.
pub(super) struct StepContainer {
    pub(super) container: Container,
    /// `--container-env`: variables whose job value wins over the image's.
    pub(super) keep_job_env: Vec<String>,
    /// Keeps `berth rmi` and `berth gc` off the image while the step runs.
    pub(super) image_hold: Option<ImageHold>,
    /// A named container's record and hold, released with the container.
    pub(super) named: Option<NamedUse>,
    /// `--container-save`: done after the last local task.
    pub(super) save: Option<PendingSave>,
}

/// A `--container-save` to do when the step's tasks are done.
pub(super) struct PendingSave {
    pub(super) request: SaveRequest,
    /// The on-disk upper folder of an unnamed step, removed after the save.
    pub(super) scratch: Option<PathBuf>,
}

/// How many of this node's tasks have exited (the last one saves).
static TASKS_EXITED: AtomicU32 = AtomicU32::new(0);

/// What every kind of step needs to build its container.
pub(super) struct StepContext<'a> {
    pub(super) config: &'a Config,
    pub(super) options: JobOptions,
    pub(super) store: PathBuf,
    /// Where this node's own state lives (named containers, save scratch):
    /// the store, or its `nodes/NODE` folder when the store is shared.
    pub(super) node_state: PathBuf,
    /// This node's name.
    pub(super) node: String,
    pub(super) job: u32,
    pub(super) step: u32,
    pub(super) user: UserIdentity,
    pub(super) job_env: Vec<String>,
    /// `--container-save`, resolved and checked.
    pub(super) save_to: Option<PathBuf>,
    /// The batch step's script, bound read-only at its own path.
    pub(super) batch_script: Option<MountSpec>,
    /// This step's place in a fan-out, when the image may come from its first node.
    pub(super) fanout: Option<super::fanout::FanoutStep>,
    /// `srun -v`: show this node's setup timings to the user.
    pub(super) verbose: bool,
    /// The site's TaskProlog (slurm.conf), run on the host before each task
    /// joins ([`super::task_prolog`]).
    pub(super) task_prolog: Option<PathBuf>,
}

impl StepContext<'_> {
    /// The job's user, for whom images are pulled (with their credentials).
    pub(super) fn requester(&self) -> Requester<'_> {
        Requester {
            user: &self.user,
            job_env: &self.job_env,
        }
    }
}

/// Why `user_init` could not make the container. Slurm 22.05's srun exits 0
/// when `user_init` fails (the launch fails, no task runs), so the failure is
/// reported there and raised again in each task's `task_init`, which makes
/// the tasks (and so srun) fail with a non-zero exit code.
static SETUP_FAILED: Mutex<bool> = Mutex::new(false);

/// The site's TaskProlog when this step's tasks run in a container: each
/// task runs it on the host before it joins ([`super::task_prolog`]).
static TASK_PROLOG: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Whether a step runs in a container: never the extern step; the batch
/// step only with sbatch support (`sbatch_support`, on by default).
fn wants_container(step: u32, options: &JobOptions, config: &Config) -> bool {
    (options.image.is_some() || options.name.is_some())
        && step != ffi::SLURM_EXTERN_CONT
        && (step != ffi::SLURM_BATCH_SCRIPT || config.sbatch_support)
}

/// The batch script, bound read-only at its own path so that the batch step
/// can run it inside the container.
fn batch_script_bind(spank: &Spank) -> Result<MountSpec, String> {
    let argv = spank.job_argv().map_err(|e| e.to_string())?;
    let script = argv
        .first()
        .filter(|path| path.starts_with('/'))
        .ok_or_else(|| {
            format!("cannot find the batch script of this job (its command line is {argv:?})")
        })?;
    Ok(MountSpec {
        source: script.into(),
        target: script.into(),
        read_only: true,
    })
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
    // Here, not in init_post_opt: the job's environment is readable now.
    options::settle_writable_flags(|name| spank.getenv(name), false)?;
    let mut options = options::current();
    if let Some(image) = options.image.take() {
        let pin = spank.getenv(super::resolve::PIN_VARIABLE);
        options.image = Some(super::resolve::for_step(&image, pin.as_deref()));
    }
    let step = spank.step_id().map_err(|e| e.to_string())?;
    if !wants_container(step, &options, config) {
        return Ok(());
    }
    let started = Instant::now();
    let job = spank.job_id().map_err(|e| e.to_string())?;
    handle::log_debug(&format!("job {job} step {step}: options {options:?}"));

    let node = node_name(spank);
    let uid = spank.uid().map_err(|e| e.to_string())?;
    let gid = spank.gid().map_err(|e| e.to_string())?;
    let mut user = UserIdentity::lookup(uid, gid)
        .map_err(|e| format!("cannot look up user {uid} on this node: {e}"))?;
    if let Ok(groups) = spank.supplementary_gids() {
        if !groups.is_empty() {
            user.groups = groups;
        }
    }
    let save_to = match &options.save {
        Some(path) => Some(save_target(spank, path)?),
        None => None,
    };
    let batch_script = if step == ffi::SLURM_BATCH_SCRIPT {
        Some(batch_script_bind(spank)?)
    } else {
        None
    };
    let fanout = super::fanout::FanoutStep::of(spank, config)?;
    let task_prolog = super::task_prolog::site_prolog()?;
    let ctx = StepContext {
        config,
        batch_script,
        fanout,
        store: config.store_path_for_node(&node),
        node_state: config.node_state_path(&node),
        node,
        job,
        step,
        user,
        job_env: spank.job_env().map_err(|e| e.to_string())?,
        save_to,
        options,
        verbose: super::timings::step_is_verbose(spank.getenv("SRUN_DEBUG").as_deref()),
        task_prolog,
    };
    if ctx.verbose {
        super::timings::report_join_as(&ctx.node);
    }
    // A scancel or time limit during the setup stops it (Slurm signals
    // nothing before the tasks exist).
    let nodes = spank.node_count().unwrap_or(1);
    let watch = super::cancel_watch::CancelWatch::start(job, nodes, config.cancel_check);
    let started_container = match &ctx.options.name {
        Some(value) => {
            let name = ContainerName::parse(value)
                .map_err(|e| format!("--container-name={value}: {e}"))?;
            super::named_step::start(&ctx, &name)
        }
        None => start_unnamed(&ctx),
    };
    drop(watch);
    let (step_container, what) =
        started_container.map_err(|e| match crate::interrupt::requested() {
            Some(reason) => format!("container setup stopped: {reason}"),
            None => e,
        })?;
    *CONTAINER.lock().unwrap_or_else(|p| p.into_inner()) = Some(step_container);
    *TASK_PROLOG.lock().unwrap_or_else(|p| p.into_inner()) = ctx.task_prolog.clone();
    handle::log_info(&format!(
        "job {job} step {step}: container {what} in {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3,
    ));
    Ok(())
}

/// An unnamed step: pull, build, and (with `--container-save`) keep the
/// changes in a scratch folder on disk to save them at the end. Returns the
/// container and the image it runs, for the log.
fn start_unnamed(ctx: &StepContext) -> Result<(StepContainer, String), String> {
    let image = ctx.options.image.clone().unwrap_or_default();
    handle::log_verbose(&format!(
        "job {} step {}: pulling {image} into {}",
        ctx.job,
        ctx.step,
        ctx.store.display()
    ));
    let pull_started = Instant::now();
    let (stored, image_hold) = super::fanout::pull_and_hold(ctx, &image)?;
    let pulled = pull_started.elapsed();
    let mut spec = build_spec(ctx, &stored, image_hold.as_ref())?;
    let mut save = None;
    if let Some(output) = &ctx.save_to {
        let scratch = with_root(|| {
            NamedRoots::new(&ctx.node_state).save_scratch(ctx.user.uid, ctx.job, ctx.step)
        })
        .map_err(|e| format!("--container-save: {e:#}"))?;
        spec.upper_dir = Some(scratch.clone());
        save = Some(PendingSave {
            request: save_request(&spec, &scratch, output),
            scratch: Some(scratch),
        });
    }
    // spawn_holder takes root for the mounts and the id maps itself.
    let mount_started = Instant::now();
    let container = spawn_holder(&ctx.config.helper_path, &spec, Mode::Privileged)
        .map_err(|e| format!("cannot start the container for image '{image}': {e:#}"))?;
    let mounted = mount_started.elapsed();
    let lookup = super::timings::take_lookup();
    if ctx.verbose {
        let shown = stored
            .reference
            .as_ref()
            .map_or_else(|| image.clone(), ToString::to_string);
        handle::log_user(&super::timings::setup_line(
            &ctx.node, &shown, lookup, pulled, mounted,
        ));
    }
    report_entrypoint(ctx, &container);
    report_warnings(ctx, &container);
    // Other steps of the job may join it as `--container-name=JOB.STEP`.
    let named = super::named_step::publish_unnamed(ctx, &container, &spec)
        .map_err(|e| handle::log_error(&e))
        .ok();
    let step = StepContainer {
        container,
        keep_job_env: keep_job_env(&ctx.options)?,
        image_hold,
        named,
        save,
    };
    let what = format!(
        "for image {image} ({}) ready ({})",
        stored.manifest_digest.as_deref().unwrap_or("squashfs file"),
        super::timings::stages(lookup, pulled, mounted)
    );
    Ok((step, what))
}

/// What to save for a container built from `spec` whose changes live in
/// `overlay_dir/upper`.
pub(super) fn save_request(spec: &ContainerSpec, overlay_dir: &Path, output: &Path) -> SaveRequest {
    SaveRequest {
        squashfs: spec.squashfs.clone(),
        upper: overlay_dir.join("upper"),
        output: output.to_path_buf(),
        uid: spec.user.uid,
        gid: spec.user.gid,
        groups: spec.user.all_gids(),
        image_reader: spec.image_reader.clone(),
        sealed_image: spec.sealed_image,
        config: spec.image_config.clone(),
    }
}

/// `--container-save=PATH` made absolute (a relative PATH is taken from the
/// job's working directory) and checked with the user's permissions.
fn save_target(spank: &Spank, path: &str) -> Result<PathBuf, String> {
    let path = Path::new(path);
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        // slurmstepd runs user_init in the job's working directory.
        let cwd = std::env::current_dir()
            .ok()
            .map(|d| d.to_string_lossy().into_owned())
            .or_else(|| spank.getenv("PWD"))
            .filter(|d| d.starts_with('/'))
            .ok_or_else(|| {
                format!(
                    "--container-save={}: a relative path, but the job's working directory is \
                 unknown; give an absolute path",
                    path.display()
                )
            })?;
        Path::new(&cwd).join(path)
    };
    check_output(&absolute).map_err(|e| format!("--container-save={}: {e}", path.display()))?;
    Ok(absolute)
}

/// The container spec of this step for `stored` (held by `hold`): the user,
/// the options, the PMI folders.
pub(super) fn build_spec(
    ctx: &StepContext,
    stored: &StoredImage,
    hold: Option<&ImageHold>,
) -> Result<ContainerSpec, String> {
    let options = &ctx.options;
    let mut mounts = match &options.mounts {
        Some(text) => parse_mounts(text).map_err(|e| format!("--container-mounts: {e}"))?,
        None => Vec::new(),
    };
    if mounts
        .iter()
        .any(|m| m.kind == MountKind::Bind && m.source.is_relative())
    {
        // slurmstepd runs user_init in the job's working directory.
        let cwd = std::env::current_dir().map_err(|e| {
            format!("--container-mounts: a relative source, but the job's working directory is unknown ({e}); give absolute paths")
        })?;
        resolve_relative_sources(&mut mounts, &cwd);
    }
    let mut spec = ContainerSpec::new(
        stored.squashfs.clone(),
        stored.config.clone(),
        ctx.user.clone(),
    );
    if stored.manifest_digest.is_some() {
        // A store image: ordinary users cannot read the store, the pull user can.
        spec.image_reader =
            Some(crate::puller::PullUser::lookup(&ctx.config.pull_user)?.identity());
        spec.sealed_image = hold.and_then(ImageHold::sealed);
    }
    // enroot's site configuration: defaults, site mounts first, variables.
    let site = crate::enroot_site::EnrootSite::load(
        &ctx.config.enroot_config_path,
        &|name| job_var(&ctx.job_env, name).map(str::to_string),
        &|path| path.exists(),
    );
    if let Some(line) = site.summary(&ctx.config.enroot_config_path) {
        handle::log_info(&format!("job {} step {}: {line}", ctx.job, ctx.step));
    }
    spec.mounts = site.mounts.into_iter().chain(mounts).collect();
    spec.image_config.env.extend(site.env);
    spec.workdir = options.workdir.clone();
    spec.extra_binds = super::pmi_dirs::PmiDirs {
        job_env: &ctx.job_env,
        server_tmpdir: std::env::var("PMIX_SERVER_TMPDIR").ok(),
        tmp_fs: super::pmi_dirs::tmp_fs(&ctx.node),
        uid: ctx.user.uid,
        job: ctx.job,
        step: ctx.step,
    }
    .binds();
    spec.extra_binds.extend(ctx.batch_script.clone());
    // job_container/tmpfs: the job's private /tmp and /dev/shm.
    spec.job_namespace = crate::container::jobns::find(ctx.job);
    if let Some(prolog) = &ctx.task_prolog {
        spec.extra_binds
            .push(super::task_prolog::container_bind(prolog, &ctx.node_state)?);
    }
    let defaults = site.defaults;
    spec.writable = options
        .writable
        .or(defaults.rootfs_writable)
        .unwrap_or(true);
    spec.mount_home = options.mount_home.or(defaults.mount_home).unwrap_or(false);
    spec.remap_root = options.remap_root.or(defaults.remap_root).unwrap_or(false);
    if let Some(list) = &options.unshare {
        spec.unshare =
            Namespace::parse_list(list).map_err(|e| format!("--container-unshare={list}: {e}"))?;
    }
    let request = crate::inject::Request {
        mpi: options.mpi.clone(),
        gpus: crate::inject::gpu::step_gpus(|name| job_var(&ctx.job_env, name)),
        cdi_devices: Vec::new(),
    };
    let image = options.image.as_deref().unwrap_or("of the named container");
    spec.injection = crate::inject::resolve(&ctx.config.inject, &request, &spec.image_config)
        .map_err(|e| format!("image '{image}': {e:#}"))?;
    spec.image_config
        .env
        .extend(spec.injection.env.iter().cloned());
    if !spec.injection.is_empty() {
        handle::log_info(&format!(
            "job {} step {}: injected: {}",
            ctx.job,
            ctx.step,
            spec.injection.summary.join(", ")
        ));
    }
    if runs_entrypoint(options, ctx.config) {
        spec.entrypoint = entrypoint_run(&stored.config, &ctx.job_env, &keep_job_env(options)?);
    }
    Ok(spec)
}

/// The value of `name` in the job environment `env` (`NAME=VALUE` entries).
fn job_var<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

/// Shows the holder's warnings (an image that could not be idmapped) on
/// srun's stderr, one line each, with the node's name.
pub(super) fn report_warnings(ctx: &StepContext, container: &Container) {
    for warning in container.warnings() {
        handle::log_user(&format!("{}: warning: {warning}", ctx.node));
    }
}

/// Logs what the image ENTRYPOINT did at creation and, with
/// `--container-entrypoint-log`, shows its output to the user.
pub(super) fn report_entrypoint(ctx: &StepContext, container: &Container) {
    let Some(outcome) = container.entrypoint_outcome() else {
        return;
    };
    let (job, step) = (ctx.job, ctx.step);
    handle::log_verbose(&format!(
        "job {job} step {step}: the image ENTRYPOINT ran: {} variables set, {} removed",
        outcome.set.len(),
        outcome.unset.len()
    ));
    let names: Vec<&str> = outcome.set.iter().map(|(n, _)| n.as_str()).collect();
    handle::log_debug(&format!(
        "job {job} step {step}: ENTRYPOINT set {names:?}, removed {:?}",
        outcome.unset
    ));
    if ctx.options.entrypoint_log == Some(true) {
        show_entrypoint_log(container);
    }
}

/// The variables whose job value wins over the image's (and the
/// ENTRYPOINT's): `--container-env`'s names. They are also the only job
/// variables the ENTRYPOINT sees, and the only way the job's locale
/// ([`JOB_LOCALE_VARIABLES`]) gets in.
pub(super) fn keep_job_env(options: &JobOptions) -> Result<Vec<String>, String> {
    match &options.env {
        Some(list) => env_names(list).map_err(|e| format!("--container-env={list}: {e}")),
        None => Ok(Vec::new()),
    }
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
    // Slurm would run the site's TaskProlog inside the container, after this
    // callback: run it here on the host instead, before the task joins.
    let prolog = TASK_PROLOG
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let prolog_actions = match &prolog {
        Some(path) => match super::task_prolog::run_on_host(spank, path) {
            Ok(actions) => actions,
            Err(failure) => {
                // End the task with the script's status, as Slurm does for
                // a task without a container (it would exit 1 after an
                // error here); the node stays in service either way.
                handle::log_error(&failure.message);
                // SAFETY: this is the task's own process, forked from
                // slurmstepd and about to exec; Slurm itself leaves it with
                // _exit after a failed callback or TaskProlog.
                unsafe { libc::_exit(failure.status) }
            }
        },
        None => Vec::new(),
    };
    let join_started = Instant::now();
    step.container
        .join()
        .map_err(|e| format!("cannot enter the container: {e:#}"))?;
    if spank.local_task_id().is_ok_and(|id| id == 0) {
        let joined = join_started.elapsed();
        if let (Ok(job), Ok(step)) = (spank.job_id(), spank.step_id()) {
            handle::log_info(&format!(
                "job {job} step {step}: first task joined the container in {:.1} ms",
                joined.as_secs_f64() * 1e3
            ));
        }
        if let Some(node) = super::timings::join_report() {
            handle::log_user(&super::timings::join_line(&node, joined));
        }
    }
    let keeps =
        |name: &str| step.keep_job_env.iter().any(|n| n == name) && spank.getenv(name).is_some();
    // The job's locale stays outside unless --container-env names it (as
    // with pyxis): the image may lack that locale.
    for locale in JOB_LOCALE_VARIABLES {
        if !step.keep_job_env.iter().any(|n| n == locale) && spank.getenv(locale).is_some() {
            spank.unsetenv(locale).map_err(|e| e.to_string())?;
        }
    }
    for (name, value) in step.container.env(std::iter::empty()) {
        if keeps(&name) {
            continue;
        }
        spank.setenv(&name, &value).map_err(|e| e.to_string())?;
    }
    if let Some(outcome) = step.container.entrypoint_outcome() {
        for (name, value) in outcome.set.iter().filter(|(name, _)| !keeps(name)) {
            spank.setenv(name, value).map_err(|e| e.to_string())?;
        }
        for name in outcome.unset.iter().filter(|name| !keeps(name)) {
            spank.unsetenv(name).map_err(|e| e.to_string())?;
        }
    }
    // enroot's PMIx and PyTorch hooks, per task (Slurm's MPI plugin set
    // this task's PMIX_* before this callback).
    let task_value = |name: &str| spank.getenv(name);
    let hooks = crate::container::taskhooks::pmix_mca_env(task_value)
        .into_iter()
        .chain(crate::container::taskhooks::pytorch_env(task_value));
    for (name, value) in hooks {
        spank.setenv(&name, &value).map_err(|e| e.to_string())?;
    }
    super::task_prolog::apply(spank, &prolog_actions)
}

/// Whether the image ENTRYPOINT runs: `--[no-]container-entrypoint` (or its
/// variables), else the plugstack's `execute_entrypoint`.
fn runs_entrypoint(options: &JobOptions, config: &Config) -> bool {
    options.entrypoint.unwrap_or(config.execute_entrypoint)
}

/// The image ENTRYPOINT to run at container start, with the image's `Env`
/// and the job's value of the `--container-env` names (as with pyxis, the
/// rest of the job's environment stays out); `None` when the image has none.
fn entrypoint_run(
    image: &ImageConfig,
    job_env: &[String],
    keep_job_env: &[String],
) -> Option<EntrypointRun> {
    let command = image.entrypoint.clone().filter(|c| !c.is_empty())?;
    let kept = job_env
        .iter()
        .filter_map(|entry| entry.split_once('='))
        .filter(|(name, _)| keep_job_env.iter().any(|n| n == name))
        .map(|(k, v)| (k.to_string(), v.to_string()));
    let mut env = task_env(std::iter::empty(), image);
    for (name, value) in kept {
        match env.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => env.push((name, value)),
        }
    }
    Some(EntrypointRun { command, env })
}

/// Shows the entrypoint's output to the user (`--container-entrypoint-log`).
fn show_entrypoint_log(container: &Container) {
    let Some(outcome) = container.entrypoint_outcome() else {
        return;
    };
    for line in outcome.log.lines() {
        handle::log_user(&format!("entrypoint: {line}"));
    }
}

/// After each local task: the last one lets go of the container and, with
/// `--container-save`, saves its root file system.
pub fn task_exit(spank: &Spank) -> Result<(), String> {
    let exited = TASKS_EXITED.fetch_add(1, Ordering::SeqCst) + 1;
    let tasks = spank.local_task_count().map_err(|e| e.to_string())?;
    if exited < tasks {
        return Ok(());
    }
    let Some(step) = CONTAINER.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return Ok(());
    };
    let StepContainer {
        container,
        image_hold,
        named,
        save,
        ..
    } = step;
    // The namespaces go first: the saved tree must not change any more.
    drop(container);
    drop(named);
    let result = match &save {
        Some(save) => save_root(spank, &save.request),
        None => Ok(()),
    };
    if let Some(scratch) = save.and_then(|s| s.scratch) {
        let _ = with_root(|| std::fs::remove_dir_all(&scratch));
    }
    drop(image_hold);
    result
}

/// Runs the save helper (full root; it writes the file as the user).
fn save_root(spank: &Spank, request: &SaveRequest) -> Result<(), String> {
    let started = Instant::now();
    let json = serde_json::to_string(request).map_err(|e| e.to_string())?;
    let helper = &super::plugin::config().helper_path;
    let mut command = Command::new(helper);
    command
        .arg(SAVE_ARG)
        .arg(json)
        .stdin(Stdio::null())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    crate::privilege::run_as_full_root(&mut command);
    let output = with_root(|| command.output()).map_err(|e| {
        format!(
            "--container-save: cannot run the berth helper {}: {e}",
            helper.display()
        )
    })?;
    let node = node_name(spank);
    if !output.status.success() {
        return Err(format!(
            "--container-save: could not save the container to {} on {node}: {}",
            request.output.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        if let Some(note) = line.strip_prefix("berth: ") {
            handle::log_user(note);
        }
    }
    handle::log_info(&format!(
        "saved the container to {} on {node} in {:.1} s",
        request.output.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Lets go of the container's namespaces (if the tasks did not already).
pub fn exit() {
    CONTAINER.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// This node's name, for `%n` in `store_path` and for messages: the host's
/// short name. Not `SLURMD_NODENAME` from the job environment: before the
/// tasks start it is whatever the submitting process had, e.g. the batch
/// node's name in every step an sbatch script launches.
fn node_name(spank: &Spank) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    match host.split('.').next() {
        Some(short) if !short.is_empty() => short.to_string(),
        _ => spank.getenv("SLURMD_NODENAME").unwrap_or_default(),
    }
}

/// Pulls the image and takes a shared hold on it for the step. `berth gc` may
/// remove an image between the pull and the hold: then pull once more.
pub(super) fn pull_and_hold(
    config: &Config,
    store: &Path,
    image: &str,
    requester: &Requester,
) -> Result<(StoredImage, Option<ImageHold>), String> {
    let stored = pull(config, store, image, requester)?;
    hold(config, store, image, stored, requester)
}

/// Takes a shared hold on a pulled image for the step; pulls once more when
/// `berth gc` removed it in between.
pub(super) fn hold(
    config: &Config,
    store: &Path,
    image: &str,
    mut stored: StoredImage,
    requester: &Requester,
) -> Result<(StoredImage, Option<ImageHold>), String> {
    if stored.manifest_digest.is_none() {
        return Ok((stored, None)); // a squashfs file given by path, not in the store
    }
    let open = || with_root(|| Store::open_unswept(store)).map_err(|e| format!("{e:#}"));
    let hold = match with_root(|| open()?.hold(&stored).map_err(|e| format!("{e:#}"))) {
        Ok(hold) => hold,
        Err(_) => {
            stored = pull(config, store, image, requester)?;
            with_root(|| open()?.hold(&stored).map_err(|e| format!("{e:#}")))?
        }
    };
    Ok((stored, Some(hold)))
}

/// Gets `image` for the step: a squashfs file given by path is checked with
/// the user's own permissions; a registry image is pulled into the node
/// store as the pull user with the user's credentials ([`crate::puller`]).
/// Called with the user's effective ids (`user_init`).
pub(super) fn pull(
    config: &Config,
    store: &Path,
    image: &str,
    requester: &Requester,
) -> Result<StoredImage, String> {
    match run_pull(config, store, image, requester, false)? {
        Answer::Stored(stored) => Ok(*stored),
        Answer::NotInStore(digest) => Err(format!(
            "the berth helper did not pull '{image}' ({digest}) into the store"
        )),
    }
}

/// A squashfs file the user gave by path, opened with the user's identity
/// (also where slurmstepd runs this as root: a named container),
/// non-blocking, and checked on the descriptor (a regular file: a FIFO or
/// a device fails at once). Refused when it lies in the node store (whose
/// images only the registry's access check hands out): by the path as
/// written, and by the path the opened file resolved to. Then re-packed
/// into the store by the pull user ([`crate::puller::import_file`]): the
/// step mounts the store's copy, never the user's file.
fn user_squashfs(
    config: &Config,
    store: &Path,
    path: &Path,
    user: &UserIdentity,
) -> Result<StoredImage, String> {
    let canonical_store = with_root(|| std::fs::canonicalize(store)).ok();
    let in_store = |p: &Path| {
        let p = lexically_normal(p);
        p.starts_with(store) || canonical_store.as_ref().is_some_and(|c| p.starts_with(c))
    };
    let refused = || {
        format!(
            "--container-image={}: the file is inside the node's image store {}, whose \
             images are handed out only by reference (the registry decides who may read \
             them): give the image's reference (e.g. docker://REGISTRY#REPO:TAG) instead",
            path.display(),
            store.display()
        )
    };
    if in_store(path) {
        return Err(refused());
    }
    let mut file = crate::container::loopdev::open_as(path, user)
        .map_err(|e| format!("cannot open squashfs image {}: {e}", path.display()))?;
    let checked = Store::squashfs_file_from(path, &mut file).map_err(|e| format!("{e:#}"))?;
    if in_store(&checked.squashfs) {
        return Err(refused());
    }
    // The kernel never parses the user's bytes: the pull user re-packs them
    // into the store (once per content), and the step mounts that copy.
    let request = crate::puller::ImportRequest {
        helper: &config.helper_path,
        store,
        pull_user: &config.pull_user,
        name: path,
        max_image_size: config.max_image_size,
        shared: PullSettings::from_config(config).shared,
    };
    let node = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let show = |line: &str| handle::log_user(&format!("{node}: {line}"));
    crate::puller::import_file(&request, &file, &show)
}

/// An image of a local container engine, saved as the user and converted
/// by the pull user ([`crate::puller::import_daemon`]).
fn daemon_image(
    config: &Config,
    store: &Path,
    source: &crate::reference::DaemonImage,
    requester: &Requester,
) -> Result<StoredImage, String> {
    let name = PathBuf::from(source.to_string());
    let request = crate::puller::ImportRequest {
        helper: &config.helper_path,
        store,
        pull_user: &config.pull_user,
        name: &name,
        max_image_size: config.max_image_size,
        shared: PullSettings::from_config(config).shared,
    };
    let node = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let show = |line: &str| handle::log_user(&format!("{node}: {line}"));
    crate::puller::import_daemon(&request, source, requester, &show)
}

/// `path` without `.` and `..` components (taken lexically; `/..` is `/`).
fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// [`pull`]; with `cached_only`, only looks in the store (after asking the
/// registry for the manifest, as every pull does).
pub(super) fn run_pull(
    config: &Config,
    store: &Path,
    image: &str,
    requester: &Requester,
    cached_only: bool,
) -> Result<Answer, String> {
    let reference = match ImageSource::parse(image).map_err(|e| format!("{e:#}"))? {
        ImageSource::SquashfsFile(path) => {
            return user_squashfs(config, store, &path, requester.user)
                .map(|stored| Answer::Stored(Box::new(stored)))
        }
        ImageSource::Daemon(source) => {
            return daemon_image(config, store, &source, requester)
                .map(|stored| Answer::Stored(Box::new(stored)))
        }
        ImageSource::Registry(reference) => reference,
    };
    let node = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Progress lines reach the user while the pull runs (one per node every
    // few seconds), and the final "pulled" line when the image was fetched.
    let show = |line: &str| handle::log_user(line);
    let request = PullRequest {
        helper: &config.helper_path,
        store,
        image: &reference,
        pull_user: &config.pull_user,
        settings: PullSettings::from_config(config),
        progress_lines: true,
        cached_only,
        forward: Some((format!("{node}: {image}"), &show)),
    };
    let pulled = crate::puller::pull(&request, CredentialsFrom::User(requester))?;
    super::timings::record_helper_output(&pulled.stderr);
    super::timings::helper_notes(&pulled.stderr)
        .iter()
        .for_each(|note| handle::log_user(note));
    Ok(pulled.answer)
}
