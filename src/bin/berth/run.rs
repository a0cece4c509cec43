//! `berth run`: a command inside an image, with the user's mounts, GPUs, an
//! MPI profile and CDI devices, through the same holder as the plugin.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use berth::config::Config;
use berth::container::spec::{parse_mounts, UserIdentity};
use berth::container::{spawn_holder, Mode};
use berth::inject::{self, gpu::GpuRequest};
use berth::reference::ImageSource;
use berth::step::spec::{image_spec, ImageSpec, SpecError};
use berth::store::{ProgressMode, Store};

use crate::pull::cli_pull;
use crate::store_args::StoreArgs;

/// The arguments of `berth run`.
#[derive(clap::Args)]
pub struct Args {
    /// Bind mounts, `SRC[:DST[:ro]]`, comma-separated or repeated.
    #[arg(long = "mount", short = 'm')]
    mounts: Vec<String>,
    /// Working directory inside the container (default: the image's WorkingDir).
    #[arg(long)]
    workdir: Option<String>,
    /// GPUs to give the container: all, a count (2), or indices (0,2).
    #[arg(long)]
    gpus: Option<String>,
    /// Host MPI profile to inject (a file NAME.conf in the site's inject_dir).
    #[arg(long)]
    mpi: Option<String>,
    /// CDI device to add (vendor.com/class=name), repeatable.
    #[arg(long = "device")]
    devices: Vec<String>,
    #[command(flatten)]
    store: StoreArgs,
    /// Image reference or squashfs file.
    image: String,
    /// Command and arguments (default: a shell).
    #[arg(last = true)]
    command: Vec<String>,
}

/// `berth run`: pulls the image, starts the container and exits with the
/// command's status.
pub fn run(args: Args) -> Result<ExitCode> {
    let Args {
        mounts,
        workdir,
        gpus,
        mpi,
        devices,
        store,
        image,
        command,
    } = args;
    let config = Config::for_cli()?;
    let source = ImageSource::parse(&image)?;
    let (root, settings, mut progress) = store.resolve(&config)?;
    if store.progress == "auto" {
        progress = ProgressMode::Off;
    }
    let options = settings.pull_options(progress, false);
    let stored = cli_pull(&root, &source, &options, &settings, &config)
        .with_context(|| format!("cannot pull {source}"))?;
    // Keeps `berth rmi`/`gc` off the image while the container runs.
    let hold = match stored.manifest_digest {
        Some(_) => Some(Store::open_unswept(&root)?.hold(&stored)?),
        None => None,
    };
    let mut mount_specs = Vec::new();
    for text in &mounts {
        mount_specs.extend(parse_mounts(text).with_context(|| format!("--mount {text}"))?);
    }
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    if let Some(dir) = &workdir {
        if !dir.starts_with('/') {
            bail!("--workdir {dir}: must be an absolute path inside the container");
        }
    }
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let user =
        UserIdentity::lookup(uid, gid).with_context(|| format!("cannot look up user {uid}"))?;
    let gpus = match gpus {
        Some(text) => {
            let request = GpuRequest::parse(&text).map_err(anyhow::Error::msg)?;
            let node = inject::gpu::node_gpus(&config.inject.gpu_dev_root);
            Some(inject::gpu::select(&node, &request).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    // The same start as the plugin's steps: image, user, mounts, workdir,
    // the sealed copy of a held store image, what to inject.
    let spec = image_spec(ImageSpec {
        stored: &stored,
        hold: hold.as_ref(),
        user,
        mounts: mount_specs,
        site_mounts: Vec::new(),
        site_env: Vec::new(),
        cwd: Some(&cwd),
        workdir,
        inject: &config.inject,
        request: inject::Request {
            mpi,
            gpus,
            cdi_devices: devices,
            // The container gets this process's environment, so its
            // MELLANOX_VISIBLE_DEVICES too; no remap-root here.
            mellanox_visible_devices: std::env::var(inject::infiniband::VARIABLE).ok(),
            root_inside: uid == 0,
        },
    })
    .map_err(|e| match e {
        SpecError::Inject(e) => e.context(format!("cannot prepare what to inject into {source}")),
        other => anyhow::anyhow!("--mount: {other}"),
    })?;
    let mode = if uid == 0 {
        Mode::Privileged
    } else {
        Mode::Unprivileged
    };
    let helper = std::env::current_exe().context("cannot find the berth executable")?;
    let container = spawn_holder(&helper, &spec, mode)?;
    for warning in container.warnings() {
        eprintln!("berth: warning: {warning}");
    }
    let argv = if command.is_empty() {
        vec!["/bin/sh".to_string()]
    } else {
        command
    };
    let env = container.env(std::env::vars());
    let status = container.run(&argv, &env)?;
    Ok(ExitCode::from(exit_code(status)))
}

/// Shell-style exit code: the command's, or 128+signal.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        _ => 1,
    }
}
