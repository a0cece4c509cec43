//! The container spec of a step: what every container of berth starts from
//! ([`image_spec`], also `berth run`'s), and what a Slurm step adds to it
//! ([`build_spec`]: the PMI folders, the batch script, the job's namespace,
//! the TaskProlog stand-in, the options' flags, the ENTRYPOINT).

use anyhow::anyhow;
use std::path::{Path, PathBuf};

use super::context::StepContext;
use crate::container::entrypoint::EntrypointRun;
use crate::container::save::SaveRequest;
use crate::container::spec::{
    resolve_relative_sources, ContainerSpec, MountKind, UserIdentity, UserMount,
};
use crate::container::task_env;
use crate::image::ImageConfig;
use crate::inject::InjectConfig;
use crate::store::{ImageHold, StoredImage};

/// What any container is built from: the image, the user, their mounts and
/// working directory, and what to inject.
pub struct ImageSpec<'a> {
    /// The image, pulled (or a user's file, imported).
    pub stored: &'a StoredImage,
    /// The hold on a store image, whose sealed copy the holder mounts.
    pub hold: Option<&'a ImageHold>,
    /// Whom the container runs as.
    pub user: UserIdentity,
    /// The user's mounts, as parsed (relative sources not yet resolved).
    pub mounts: Vec<UserMount>,
    /// The site's mounts (enroot's `mounts.d`), made before the user's.
    pub site_mounts: Vec<UserMount>,
    /// The site's variables (enroot's `environ.d`), over the image's `Env`
    /// and under the injection's.
    pub site_env: Vec<String>,
    /// Where relative mount sources are taken from; `None`: unknown.
    pub cwd: Option<&'a Path>,
    /// The working directory inside the container (default: the image's).
    pub workdir: Option<String>,
    /// The site's injection settings.
    pub inject: &'a InjectConfig,
    /// What this container asks to get injected.
    pub request: crate::inject::Request,
}

/// Why [`image_spec`] failed: each front end names the option at fault.
#[derive(Debug)]
pub enum SpecError {
    /// A relative mount source while the working directory is unknown.
    RelativeMount,
    /// What to inject could not be prepared.
    Inject(anyhow::Error),
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecError::RelativeMount => write!(
                f,
                "a relative source, but the working directory is unknown; give absolute paths"
            ),
            SpecError::Inject(e) => write!(f, "{e:#}"),
        }
    }
}

/// The spec every container of berth starts from, in the plugin and in
/// `berth run`: the image with its config, the user, the mounts (relative
/// sources taken from `cwd`), the working directory, the sealed copy of a
/// held store image, and the injection (its variables added to the image's).
pub fn image_spec(input: ImageSpec) -> Result<ContainerSpec, SpecError> {
    let ImageSpec {
        stored,
        hold,
        user,
        mut mounts,
        site_mounts,
        site_env,
        cwd,
        workdir,
        inject,
        request,
    } = input;
    if mounts
        .iter()
        .any(|m| m.kind == MountKind::Bind && m.source.is_relative())
    {
        resolve_relative_sources(&mut mounts, cwd.ok_or(SpecError::RelativeMount)?);
    }
    let mut spec = ContainerSpec::new(stored.squashfs.clone(), stored.config.clone(), user);
    spec.mounts = site_mounts.into_iter().chain(mounts).collect();
    spec.image_config.env.extend(site_env);
    spec.workdir = workdir;
    // Root's hold sealed a store image: the holder mounts only that file.
    spec.sealed_image = hold.and_then(ImageHold::sealed);
    spec.injection =
        crate::inject::resolve(inject, &request, &spec.image_config).map_err(SpecError::Inject)?;
    spec.image_config
        .env
        .extend(spec.injection.env.iter().cloned());
    Ok(spec)
}

/// The container spec of this step for `stored` (held by `hold`): the user,
/// the options, the PMI folders.
pub fn build_spec(
    ctx: &StepContext,
    stored: &StoredImage,
    hold: Option<&ImageHold>,
) -> anyhow::Result<ContainerSpec> {
    let request = &ctx.request;
    let mounts = request
        .mounts
        .as_ref()
        .map(|given| given.value.clone())
        .unwrap_or_default();
    let image = request.image_text().unwrap_or("of the named container");
    // enroot's site configuration: defaults, site mounts first, variables.
    let site = crate::enroot_site::EnrootSite::load(
        &ctx.config.enroot_config_path,
        &|name| job_var(&ctx.job_env, name).map(str::to_string),
        &|path| path.exists(),
    );
    let remap_root = request
        .remap_root
        .or(site.defaults.remap_root)
        .unwrap_or(false);
    let inject = crate::inject::Request {
        mpi: request.mpi.clone(),
        gpus: crate::inject::gpu::step_gpus(|name| job_var(&ctx.job_env, name)),
        cdi_devices: Vec::new(),
        mellanox_visible_devices: job_var(&ctx.job_env, crate::inject::infiniband::VARIABLE)
            .map(str::to_string),
        root_inside: remap_root || ctx.user.uid == 0,
    };
    if let Some(line) = site.summary(&ctx.config.enroot_config_path) {
        ctx.report
            .info(&format!("job {} step {}: {line}", ctx.job, ctx.step));
    }
    let mut spec = image_spec(ImageSpec {
        stored,
        hold,
        user: ctx.user.clone(),
        mounts,
        site_mounts: site.mounts,
        site_env: site.env,
        cwd: ctx.cwd.as_deref(),
        workdir: request.workdir.clone(),
        inject: &ctx.config.inject,
        request: inject,
    })
    .map_err(|e| match e {
        // slurmstepd runs user_init in the job's working directory.
        SpecError::RelativeMount => anyhow!(
            "--container-mounts: a relative source, but the job's working directory is \
             unknown; give absolute paths"
        ),
        SpecError::Inject(e) => anyhow!("image '{image}': {e:#}"),
    })?;
    if stored.manifest_digest.is_some() {
        // A store image: ordinary users cannot read the store, the pull user can.
        spec.image_reader =
            Some(crate::puller::PullUser::lookup(&ctx.config.pull_user)?.identity());
    }
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
    if site.hooks.has_bundled(crate::enroot_site::hooks::LOCALTIME) {
        spec.host_zone = crate::enroot_site::localtime::host_zone(Path::new(
            crate::enroot_site::localtime::HOST_LOCALTIME,
        ))?;
    }
    if site.hooks.has_bundled(crate::enroot_site::hooks::SHARP) {
        let image_env = spec.image_config.env.clone();
        let lookup = |name: &str| {
            job_var(&ctx.job_env, name)
                .or_else(|| job_var(&image_env, name))
                .map(str::to_string)
        };
        spec.image_config
            .env
            .extend(crate::enroot_site::sharp::variables(&lookup));
    }
    let defaults = site.defaults;
    spec.writable = request
        .writable
        .or(defaults.rootfs_writable)
        .unwrap_or(true);
    spec.mount_home = request.mount_home.or(defaults.mount_home).unwrap_or(false);
    spec.remap_root = remap_root;
    if !site.hooks.scripts.is_empty() {
        spec.site_hooks = Some(crate::container::spec::SiteHooks {
            scripts: site.hooks.scripts,
            env: hook_env(&site.settings, &ctx.job_env, &spec),
            timeout_s: ctx.config.enroot_hook_timeout.as_secs(),
        });
    }
    if let Some(list) = &request.unshare {
        spec.unshare = list.value.clone();
    }
    if !spec.injection.is_empty() {
        ctx.report.info(&format!(
            "job {} step {}: injected: {}",
            ctx.job,
            ctx.step,
            spec.injection.summary.join(", ")
        ));
    }
    if request.entrypoint {
        spec.entrypoint = entrypoint_run(&stored.config, &ctx.job_env, &request.keep_env);
    }
    Ok(spec)
}

/// The environment of the site's hooks, as enroot gives it: its settings
/// from `enroot.conf` under the job's environment (enroot's environment
/// wins over its files), and the three container settings pyxis passes as
/// `ENROOT_MOUNT_HOME`, `ENROOT_REMAP_ROOT`, `ENROOT_ROOTFS_WRITABLE`
/// (`y` when on, unset when off), taken from `spec`.
pub(super) fn hook_env(
    settings: &[String],
    job_env: &[String],
    spec: &ContainerSpec,
) -> Vec<String> {
    let flags = [
        ("ENROOT_MOUNT_HOME", spec.mount_home),
        ("ENROOT_REMAP_ROOT", spec.remap_root),
        ("ENROOT_ROOTFS_WRITABLE", spec.writable),
    ];
    let name_of = |entry: &str| entry.split_once('=').map(|(n, _)| n.to_string());
    let mut env: Vec<String> = Vec::new();
    for entry in settings.iter().chain(job_env) {
        if let Some(name) = name_of(entry) {
            env.retain(|e| name_of(e).as_deref() != Some(name.as_str()));
            env.push(entry.clone());
        }
    }
    env.retain(|e| !flags.iter().any(|(n, _)| name_of(e).as_deref() == Some(*n)));
    env.extend(
        flags
            .iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| format!("{name}=y")),
    );
    env
}

/// What to save for a container built from `spec` whose changes live in
/// `overlay_dir/upper`.
pub fn save_request(spec: &ContainerSpec, overlay_dir: &Path, output: &Path) -> SaveRequest {
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

/// The value of `name` in the job environment `env` (`NAME=VALUE` entries).
fn job_var<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
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

/// `--container-save=PATH` made absolute (a relative PATH is taken from the
/// job's working directory `cwd`) and checked with the user's permissions.
pub fn save_target(path: &str, cwd: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = Path::new(path);
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        let cwd = cwd.ok_or_else(|| {
            anyhow!(
                "--container-save={}: a relative path, but the job's working directory is \
                 unknown; give an absolute path",
                path.display()
            )
        })?;
        cwd.join(path)
    };
    crate::container::save::check_output(&absolute)
        .map_err(|e| anyhow!("--container-save={}: {e:#}", path.display()))?;
    Ok(absolute)
}
