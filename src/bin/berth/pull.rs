//! `berth pull`: an image into the store; also the pull that `berth run`
//! makes first.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};

use berth::config::Config;
use berth::helper::PullSettings;
use berth::puller;
use berth::reference::ImageSource;
use berth::store::{
    pull_image, NotInStore, ProgressMode, PullOptions, StoredImage, NOT_IN_STORE_EXIT,
};

use crate::store_args::StoreArgs;

/// The arguments of `berth pull`.
#[derive(clap::Args)]
pub struct Args {
    /// `[REGISTRY#]IMAGE[:TAG][@DIGEST]`, `REGISTRY/IMAGE:TAG` or `docker://...`
    image: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Print the stored image as JSON on stdout (used by the Slurm plugin).
    #[arg(long)]
    json: bool,
    /// Download nothing: an image not in the store exits with code 3 (with
    /// --json, `{"not_in_store":"sha256:..."}` on stdout).
    #[arg(long)]
    cached_only: bool,
}

/// `berth pull`: prints the stored image (digest and squashfs path, or JSON).
pub fn run(args: Args) -> Result<ExitCode> {
    let Args {
        image,
        store,
        json,
        cached_only,
    } = args;
    let config = Config::for_cli()?;
    let source = ImageSource::parse(&image)?;
    let (root, settings, mut progress) = store.resolve(&config)?;
    if json && store.progress == "auto" {
        progress = ProgressMode::Off;
    }
    let options = settings.pull_options(progress, cached_only);
    let stored = match cli_pull(&root, &source, &options, &settings, &config) {
        Ok(stored) => stored,
        Err(e) => match e.downcast_ref::<NotInStore>() {
            Some(missing) => {
                if json {
                    let answer = serde_json::json!({ "not_in_store": missing.manifest_digest });
                    println!("{answer}");
                } else {
                    eprintln!("berth: {missing}");
                }
                return Ok(ExitCode::from(NOT_IN_STORE_EXIT));
            }
            None => return Err(e.context(format!("cannot pull {source}"))),
        },
    };
    if json {
        println!("{}", serde_json::to_string(&stored)?);
    } else {
        let digest = stored.manifest_digest.as_deref().unwrap_or("-");
        println!("{digest} {}", stored.squashfs.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// A pull from the command line. Root pulling into a store whose content
/// areas belong to the pull user (a node store the plugin prepared) runs the
/// pull as that user too, with root's credentials over a pipe, so the store
/// keeps one writer; any other pull runs in this process, as its caller.
pub fn cli_pull(
    root: &Path,
    source: &ImageSource,
    options: &PullOptions,
    settings: &PullSettings,
    config: &Config,
) -> Result<StoredImage> {
    let image = match source {
        ImageSource::Registry(image) => image,
        ImageSource::SquashfsFile(path) if nix::unistd::geteuid().is_root() => {
            return import_as_root(root, path, settings, config)
        }
        ImageSource::SquashfsFile(_) => return pull_image(root, source, options),
        ImageSource::Daemon(daemon) if nix::unistd::geteuid().is_root() => {
            return daemon_as_root(root, daemon, settings, config)
        }
        ImageSource::Daemon(_) => return pull_image(root, source, options),
    };
    let owner = puller::content_owner(root);
    if !nix::unistd::geteuid().is_root() || owner.is_none() {
        return pull_image(root, source, options);
    }
    let helper = std::env::current_exe().context("cannot find the berth executable")?;
    let request = puller::PullRequest {
        helper: &helper,
        store: root,
        image,
        pull_user: &config.pull_user,
        settings: settings.clone(),
        progress_lines: options.progress != ProgressMode::Off,
        cached_only: options.cached_only,
        forward: None,
    };
    let pulled = puller::pull(
        &request,
        puller::CredentialsFrom::Here(options.registry.credentials.as_ref()),
    )
    .map_err(anyhow::Error::msg)?;
    eprint!("{}", pulled.stderr);
    match pulled.answer {
        puller::Answer::Stored(stored) => Ok(*stored),
        puller::Answer::NotInStore(manifest_digest) => Err(NotInStore {
            image: image.to_string(),
            manifest_digest,
        }
        .into()),
    }
}

/// A squashfs file given to root's `berth run`: re-packed into the store by
/// the pull user, as the plugin does (the kernel never mounts a file that
/// someone other than berth's converter wrote).
fn import_as_root(
    root: &Path,
    path: &Path,
    settings: &PullSettings,
    config: &Config,
) -> Result<StoredImage> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("cannot open squashfs image {}", path.display()))?;
    berth::store::Store::squashfs_file_from(path, &mut file)?;
    let helper = std::env::current_exe().context("cannot find the berth executable")?;
    let request = puller::ImportRequest {
        helper: &helper,
        store: root,
        pull_user: &config.pull_user,
        name: path,
        max_image_size: settings.max_image_size,
        shared: settings.shared,
    };
    puller::import_file(&request, &file, &|line| eprintln!("berth: {line}"))
        .map_err(anyhow::Error::msg)
}

/// A local engine's image given to root's `berth pull`/`run`: saved by
/// root's client, converted by the pull user, as the plugin does for a
/// job's user (root never parses what the engine wrote).
fn daemon_as_root(
    root: &Path,
    source: &berth::reference::DaemonImage,
    settings: &PullSettings,
    config: &Config,
) -> Result<StoredImage> {
    let helper = std::env::current_exe().context("cannot find the berth executable")?;
    let name = std::path::PathBuf::from(source.to_string());
    let request = puller::ImportRequest {
        helper: &helper,
        store: root,
        pull_user: &config.pull_user,
        name: &name,
        max_image_size: settings.max_image_size,
        shared: settings.shared,
    };
    let user = berth::container::spec::UserIdentity::lookup(0, 0)?;
    let job_env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    let requester = puller::Requester {
        user: &user,
        job_env: &job_env,
    };
    puller::import_daemon(&request, source, &requester, &|line| {
        eprintln!("berth: {line}")
    })
    .map_err(anyhow::Error::msg)
}
