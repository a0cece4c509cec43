//! `berth`: pull images and run containers from the command line, on the same
//! core the Slurm plugin uses. Also the helper the plugin runs on compute nodes.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use berth::config::{parse_mirrors, Config};
use berth::container::spec::{parse_mounts, ContainerSpec, UserIdentity};
use berth::container::{holder_main, spawn_holder, Mode};
use berth::helper::PullSettings;
use berth::inject::{self, gpu::GpuRequest};
use berth::named::{check_name, NamedKey, NamedRoots, Scope};
use berth::puller::{self, CredentialSet};
use berth::reference::ImageSource;
use berth::registry::{ChainedCredentials, DockerCredentials, EnrootCredentials};
use berth::store::units::{format_size, format_utc, parse_size};
use berth::store::{
    pull_image, GcOptions, NotInStore, ProgressMode, PullOptions, RemoveOutcome, Store,
    NOT_IN_STORE_EXIT,
};

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "Run OCI images as squashfs containers, in and out of Slurm"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Pull an image into the store (a second pull of the same image downloads nothing).
    Pull {
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
    },
    /// Run a command inside an image.
    Run {
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
    },
    /// Check that this node has what berth needs, and say what to fix.
    Doctor {
        /// plugstack.conf to take berth's settings from (default: beside SLURM_CONF,
        /// else /etc/slurm/plugstack.conf; `include` lines are followed).
        #[arg(long)]
        plugstack: Option<PathBuf>,
        /// Also check that this registry (`host[:port]`) answers; repeatable.
        #[arg(long = "registry")]
        registries: Vec<String>,
        /// Warn when the store has less free space than this.
        #[arg(long, default_value = "20G", value_parser = parse_size_arg)]
        min_free: u64,
    },
    /// List the images in the store.
    Images {
        #[command(flatten)]
        store: StoreDir,
    },
    /// Print a stored image's digest, size, platform, config and layers as JSON.
    Inspect {
        /// A reference as pulled (`[REGISTRY#]IMAGE[:TAG]`) or a manifest digest
        /// (at least 6 leading hex digits).
        image: String,
        #[command(flatten)]
        store: StoreDir,
    },
    /// Remove images from the store (and blobs no other image uses); an image a
    /// running container uses is refused.
    Rmi {
        /// References as pulled, or manifest digests (at least 6 leading hex digits).
        #[arg(required = true)]
        images: Vec<String>,
        #[command(flatten)]
        store: StoreDir,
    },
    /// Remove temp files, unused blobs and outdated images; with --max-size, also
    /// least recently used images until the store fits (never one in use).
    Gc {
        /// Size budget for the store, e.g. 50G or 800M (powers of 1024).
        #[arg(long, value_parser = parse_size_arg)]
        max_size: Option<u64>,
        /// Only remove what was last used longer ago than this (e.g. 8d, 36h);
        /// required for a store shared by several nodes: set it above the
        /// longest job.
        #[arg(long, value_parser = parse_age_arg)]
        min_age: Option<std::time::Duration>,
        #[command(flatten)]
        store: StoreDir,
    },
    /// Named containers kept on this node (`srun --container-name`); root only.
    Containers {
        #[command(subcommand)]
        action: ContainersAction,
    },
    /// Internal: the pull helper (one request on stdin, one reply line on stdout).
    #[command(name = "__pull", hide = true)]
    PullHelper,
    /// Internal: the import helper (a user's squashfs file, as a descriptor).
    #[command(name = "__import", hide = true)]
    ImportHelper,
    /// Internal: the container setup helper (spoken to over fd 3).
    #[command(name = "__holder", hide = true)]
    Holder,
    /// Internal: fan-out of an image to a step's nodes (`send|receive JSON`).
    #[command(name = "__fanout", hide = true)]
    Fanout {
        /// `send` or `receive`, then the request as JSON.
        #[arg(num_args = 2)]
        args: Vec<std::ffi::OsString>,
    },
    /// Internal: look up the calling user's registry credentials for HOSTS
    /// and write them to stdout, for the puller (run as the job's user).
    #[command(name = "__credentials", hide = true)]
    Credentials {
        /// Only entries with this login (`user@registry#image`).
        #[arg(long)]
        login: Option<String>,
        /// Registry and token-service hosts (`host[:port]`).
        hosts: Vec<String>,
    },
    /// Internal: the `--container-save` helper (one JSON argument).
    #[command(name = "__save", hide = true)]
    Save {
        /// The save request, as JSON.
        request: std::ffi::OsString,
    },
}

#[derive(Subcommand)]
enum ContainersAction {
    /// List named containers: owner, scope, name, image, size of their changes.
    #[command(alias = "ls")]
    List {
        /// Only this user's (name or uid).
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        store: StoreDir,
    },
    /// Remove named containers (not while a step uses them).
    #[command(alias = "remove")]
    Rm {
        /// Container names.
        #[arg(required = true)]
        names: Vec<String>,
        /// Whose containers (name or uid; default: root's own).
        #[arg(long)]
        user: Option<String>,
        /// Containers of this job (scope `job`); without it, global ones.
        #[arg(long)]
        job: Option<u32>,
        #[command(flatten)]
        store: StoreDir,
    },
}

#[derive(clap::Args)]
struct StoreArgs {
    /// Image store folder (default: from the config file, else /var/lib/berth for
    /// root and ~/.cache/berth for others).
    #[arg(long)]
    store: Option<PathBuf>,
    /// A registry (`host[:port]`) to reach over plain HTTP; repeatable.
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    /// A pull-through mirror, `REGISTRY=MIRROR` (e.g. `docker.io=mirror.site:5000`):
    /// images of REGISTRY are asked from MIRROR first; repeatable.
    #[arg(long = "mirror")]
    mirrors: Vec<String>,
    /// Retries of a failed registry request (default: 3, or `registry_retries` of the config file).
    #[arg(long)]
    registry_retries: Option<u32>,
    /// Seconds a registry may stay silent (connecting, or between two reads)
    /// before a request is abandoned (default: 30 to connect, 60 per read, or
    /// `registry_timeout` of the config file).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3600))]
    registry_timeout: Option<u32>,
    /// Largest flattened image a pull may write, e.g. 512G (default: 256G, or
    /// `max_image_size` of the config file): a guard against decompression bombs.
    #[arg(long, value_parser = parse_size_arg)]
    max_image_size: Option<u64>,
    /// Progress on stderr: `auto` (bars on a terminal, else lines), `bars`, `lines`, `none`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "bars", "lines", "none"])]
    progress: String,
    /// The store is on a file system several nodes share: one node pulls each
    /// image, the others wait for it (default: `store_shared` of the config file).
    #[arg(long)]
    shared_store: bool,
    /// Shared store: seconds without a heartbeat after which another node's
    /// pull is taken over (default: `store_lease_timeout`, 30).
    #[arg(long, value_name = "SECONDS")]
    lease_timeout: Option<u64>,
    /// Shared store: seconds to wait at most for another node's live pull
    /// (default: `store_wait_timeout`, 1800).
    #[arg(long, value_name = "SECONDS")]
    wait_timeout: Option<u64>,
}

#[derive(clap::Args)]
struct StoreDir {
    /// Image store folder (default: from the config file, else /var/lib/berth for
    /// root and ~/.cache/berth for others).
    #[arg(long)]
    store: Option<PathBuf>,
}

impl StoreDir {
    fn root(&self) -> Result<PathBuf> {
        Ok(match &self.store {
            Some(root) => root.clone(),
            None => Config::for_cli()?.store_path,
        })
    }

    fn open(&self) -> Result<Store> {
        Store::open(self.root()?)
    }
}

fn parse_size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

fn parse_age_arg(text: &str) -> Result<std::time::Duration, String> {
    berth::store::units::parse_age(text).map_err(|e| e.to_string())
}

impl StoreArgs {
    fn resolve(&self, config: &Config) -> Result<(PathBuf, PullSettings, ProgressMode)> {
        let root = self
            .store
            .clone()
            .unwrap_or_else(|| config.store_path.clone());
        let mut settings = PullSettings::from_config(config);
        settings
            .insecure_registries
            .extend(self.insecure_registries.iter().cloned());
        // The command line's mirrors come first: they win over the config file's.
        let mut mirrors = Vec::new();
        for text in &self.mirrors {
            mirrors.extend(parse_mirrors(text).map_err(|e| anyhow::anyhow!("--mirror {e}"))?);
        }
        mirrors.append(&mut settings.mirrors);
        settings.mirrors = mirrors;
        settings.registry_retries = self.registry_retries.or(config.registry_retries);
        settings.registry_timeout = self.registry_timeout.or(config.registry_timeout);
        settings.max_image_size = self.max_image_size.unwrap_or(config.max_image_size);
        let progress = match self.progress.as_str() {
            "bars" => ProgressMode::Bars,
            "lines" => ProgressMode::Lines,
            "none" => ProgressMode::Off,
            _ => ProgressMode::auto(),
        };
        let seconds = |given: Option<u64>, default: std::time::Duration, flag: &str| match given {
            Some(0) => bail!("--{flag} 0: give at least 1 second"),
            Some(s) => Ok(s),
            None => Ok(default.as_secs()),
        };
        settings.shared = if self.shared_store || config.store_shared {
            Some((
                seconds(
                    self.lease_timeout,
                    config.store_lease_timeout,
                    "lease-timeout",
                )?,
                seconds(self.wait_timeout, config.store_wait_timeout, "wait-timeout")?,
            ))
        } else {
            None
        };
        Ok((root, settings, progress))
    }
}

/// `println!` that returns the error (with `?`) instead of panicking when
/// stdout is a closed pipe (`berth images | head`).
macro_rules! say {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*).context("cannot write to stdout")?
    };
}

/// Whether `e` is stdout closed under us (the reader went away: not a failure).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.root_cause()
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Commands::PullHelper => std::process::exit(puller::serve::serve_pull()),
        Commands::ImportHelper => std::process::exit(puller::import::serve_import()),
        Commands::Holder => holder_main(),
        Commands::Save { request } => {
            std::process::exit(berth::container::save::save_main(&[request]))
        }
        Commands::Fanout { args } => std::process::exit(berth::fanout::fanout_main(&args)),
        Commands::Containers { action } => named_containers(action),
        Commands::Credentials { login, hosts } => {
            let source = ChainedCredentials(vec![
                Arc::new(EnrootCredentials::from_env()),
                Arc::new(DockerCredentials::from_env()),
            ]);
            let set = CredentialSet::collect(&source, &hosts, login.as_deref());
            let mut out = std::io::stdout().lock();
            out.write_all(&set.encode())
                .and_then(|()| out.flush())
                .context("cannot write the credentials to the puller's pipe")?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Pull {
            image,
            store,
            json,
            cached_only,
        } => {
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
                            let answer =
                                serde_json::json!({ "not_in_store": missing.manifest_digest });
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
        Commands::Doctor {
            plugstack,
            registries,
            min_free,
        } => doctor(plugstack, registries, min_free),
        Commands::Images { store } => list_images(&store.open()?),
        Commands::Inspect { image, store } => inspect_image(&store.open()?, &image),
        Commands::Rmi { images, store } => remove_images(&store.open()?, &images),
        Commands::Gc {
            max_size,
            min_age,
            store,
        } => {
            // Unswept: gc removes and reports the temp files itself.
            collect_garbage(
                &Store::open_unswept(store.root()?)?,
                GcOptions { max_size, min_age },
            )
        }
        Commands::Run {
            mounts,
            workdir,
            gpus,
            mpi,
            devices,
            store,
            image,
            command,
        } => {
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
            let _hold = match stored.manifest_digest {
                Some(_) => Some(Store::open_unswept(&root)?.hold(&stored)?),
                None => None,
            };
            let mut mount_specs = Vec::new();
            for text in &mounts {
                mount_specs.extend(parse_mounts(text).with_context(|| format!("--mount {text}"))?);
            }
            let cwd = std::env::current_dir().context("cannot read the working directory")?;
            berth::container::spec::resolve_relative_sources(&mut mount_specs, &cwd);
            if let Some(dir) = &workdir {
                if !dir.starts_with('/') {
                    bail!("--workdir {dir}: must be an absolute path inside the container");
                }
            }
            let uid = nix::unistd::getuid().as_raw();
            let gid = nix::unistd::getgid().as_raw();
            let user = UserIdentity::lookup(uid, gid)
                .with_context(|| format!("cannot look up user {uid}"))?;
            let mut spec = ContainerSpec::new(stored.squashfs.clone(), stored.config.clone(), user);
            spec.mounts = mount_specs;
            spec.workdir = workdir;
            let gpus = match gpus {
                Some(text) => {
                    let request = GpuRequest::parse(&text).map_err(anyhow::Error::msg)?;
                    let node = inject::gpu::node_gpus(&config.inject.gpu_dev_root);
                    Some(inject::gpu::select(&node, &request).map_err(anyhow::Error::msg)?)
                }
                None => None,
            };
            let request = inject::Request {
                mpi,
                gpus,
                cdi_devices: devices,
            };
            spec.injection = inject::resolve(&config.inject, &request, &spec.image_config)
                .with_context(|| format!("cannot prepare what to inject into {source}"))?;
            spec.image_config
                .env
                .extend(spec.injection.env.iter().cloned());
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
    }
}

/// A pull from the command line. Root pulling into a store whose content
/// areas belong to the pull user (a node store the plugin prepared) runs the
/// pull as that user too, with root's credentials over a pipe, so the store
/// keeps one writer; any other pull runs in this process, as its caller.
fn cli_pull(
    root: &std::path::Path,
    source: &ImageSource,
    options: &PullOptions,
    settings: &PullSettings,
    config: &Config,
) -> Result<berth::store::StoredImage> {
    let image = match source {
        ImageSource::Registry(image) => image,
        ImageSource::SquashfsFile(path) if nix::unistd::geteuid().is_root() => {
            return import_as_root(root, path, settings, config)
        }
        ImageSource::SquashfsFile(_) => return pull_image(root, source, options),
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
    root: &std::path::Path,
    path: &std::path::Path,
    settings: &PullSettings,
    config: &Config,
) -> Result<berth::store::StoredImage> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("cannot open squashfs image {}", path.display()))?;
    Store::squashfs_file_from(path, &mut file)?;
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

/// `berth containers list|rm`.
fn named_containers(action: ContainersAction) -> Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "named containers live in the node store and belong to root: run `berth containers` \
             as root (ask your admin), or use container_scope=job so they go with the job"
        );
    }
    match action {
        ContainersAction::List { user, store } => {
            let uid = user.as_deref().map(uid_of).transpose()?;
            let roots = NamedRoots::new(&store.root()?);
            let list = roots.list(uid)?;
            say!(
                "{:<10} {:<12} {:<24} {:>9}  IMAGE",
                "USER",
                "SCOPE",
                "NAME",
                "CHANGES"
            );
            for root in list {
                let meta = &root.meta;
                let owner = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid))
                    .ok()
                    .flatten()
                    .map_or_else(|| meta.uid.to_string(), |u| u.name);
                let scope = match meta.scope {
                    Scope::Job(job) => format!("job {job}"),
                    Scope::Global => "global".to_string(),
                };
                say!(
                    "{owner:<10} {scope:<12} {:<24} {:>9}  {}",
                    meta.name,
                    format_size(root.changes_size()),
                    meta.image
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ContainersAction::Rm {
            names,
            user,
            job,
            store,
        } => {
            let uid = user.as_deref().map(uid_of).transpose()?.unwrap_or(0);
            let roots = NamedRoots::new(&store.root()?);
            let mut failed = false;
            for name in names {
                check_name(&name).map_err(anyhow::Error::msg)?;
                let key = NamedKey {
                    uid,
                    scope: job.map_or(Scope::Global, Scope::Job),
                    name,
                };
                let result = match roots.load(&key)? {
                    Some(root) => roots.remove(&root),
                    None => Err(anyhow::anyhow!(
                        "no named container {} of uid {uid} in {}",
                        key.describe(),
                        roots.base().display()
                    )),
                };
                match result {
                    Ok(()) => say!("removed {}", key.describe()),
                    Err(e) => {
                        eprintln!("error: {e:#}");
                        failed = true;
                    }
                }
            }
            Ok(if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

/// A user name or uid, as a uid.
fn uid_of(user: &str) -> Result<u32> {
    if let Ok(uid) = user.parse() {
        return Ok(uid);
    }
    nix::unistd::User::from_name(user)
        .with_context(|| format!("cannot look up user '{user}'"))?
        .map(|u| u.uid.as_raw())
        .with_context(|| format!("no user named '{user}' on this node"))
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

/// `berth images`: one line per stored image, most recently used first.
fn list_images(store: &Store) -> Result<ExitCode> {
    let images = store.images()?;
    let mut rows = vec![[
        "REFERENCE".to_string(),
        "DIGEST".to_string(),
        "SIZE".to_string(),
        "CREATED (UTC)".to_string(),
        "LAST USED (UTC)".to_string(),
    ]];
    for image in &images {
        let mut name = image.name();
        if !image.is_current() {
            name.push_str(" (outdated: pulled again on next use)");
        }
        let last_used = image
            .last_used
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        rows.push([
            name,
            image.digest.hex()[..12].to_string(),
            format_size(image.size),
            format_utc(image.meta.created),
            format_utc(last_used),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        say!("{}", line.join("  ").trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth inspect`: the image's details as pretty JSON.
fn inspect_image(store: &Store, query: &str) -> Result<ExitCode> {
    let found = store.find_images(query)?;
    if found.len() > 1 {
        let digests: Vec<String> = found.iter().map(|i| i.digest.to_string()).collect();
        bail!(
            "'{query}' names {} stored images ({}): give a digest",
            found.len(),
            digests.join(", ")
        );
    }
    let details = found[0].details()?;
    say!("{}", serde_json::to_string_pretty(&details)?);
    Ok(ExitCode::SUCCESS)
}

/// `berth rmi`: removes each named image; reports every failure and exits 1
/// if there was one.
fn remove_images(store: &Store, queries: &[String]) -> Result<ExitCode> {
    let mut failed = false;
    for query in queries {
        let found = match store.find_images(query) {
            Ok(found) => found,
            Err(e) => {
                eprintln!("error: {e:#}");
                failed = true;
                continue;
            }
        };
        for image in found {
            let name = format!("{} ({})", image.name(), image.digest);
            match store.remove_image(&image) {
                Ok(RemoveOutcome::Removed {
                    image_bytes,
                    blobs,
                    blobs_kept,
                }) => {
                    let freed = image_bytes + blobs.iter().map(|(_, b)| b).sum::<u64>();
                    say!(
                        "removed {name}: {} layer blobs, {} freed",
                        blobs.len(),
                        format_size(freed)
                    );
                    if let Some(note) = blobs_kept {
                        eprintln!("berth: {note}");
                    }
                }
                Ok(RemoveOutcome::InUse) => {
                    eprintln!(
                        "error: image {name} is in use by a running container; it stays \
                         until the container ends"
                    );
                    failed = true;
                }
                Ok(RemoveOutcome::Pulling) => {
                    eprintln!("error: image {name} is being pulled; try again when it is done");
                    failed = true;
                }
                Err(e) => {
                    eprintln!("error: cannot remove {name}: {e:#}");
                    failed = true;
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `berth gc`: prints each removal, what was kept in use, and the total freed.
fn collect_garbage(store: &Store, options: GcOptions) -> Result<ExitCode> {
    let report = store.gc(&options)?;
    for (what, bytes) in &report.removed {
        say!("removed {what} ({})", format_size(*bytes));
    }
    for name in &report.in_use {
        say!("kept {name}: in use");
    }
    for note in &report.notes {
        eprintln!("berth: {note}");
    }
    say!(
        "freed {}; the store takes {} (was {})",
        format_size(report.freed()),
        format_size(report.size_after),
        format_size(report.size_before)
    );
    Ok(ExitCode::SUCCESS)
}

/// `berth doctor`: the plugin's configuration (from plugstack.conf when it has
/// a berth line, else the CLI's), then every check; exit 1 on any failure.
fn doctor(plugstack: Option<PathBuf>, registries: Vec<String>, min_free: u64) -> Result<ExitCode> {
    use berth::doctor::{self, DoctorOptions, Level};
    let file = plugstack
        .clone()
        .unwrap_or_else(doctor::default_plugstack_file);
    let args = match doctor::plugstack_arguments(&file) {
        Ok(args) => args,
        Err(e) if plugstack.is_none() => {
            say!("note: {e:#}; checking the CLI configuration instead");
            None
        }
        Err(e) => return Err(e),
    };
    let config = match &args {
        Some(args) => {
            say!("plugin configuration from {}", file.display());
            let config = Config::from_plugstack_args(args)?;
            for note in &config.notes {
                say!("note: {note}");
            }
            config
        }
        None => Config::for_cli()?,
    };
    let mut options = DoctorOptions {
        registries,
        min_free_bytes: min_free,
    };
    for registry in &config.insecure_registries {
        if !options.registries.contains(registry) {
            options.registries.push(registry.clone());
        }
    }
    let findings = doctor::run_checks(&config, &options);
    for finding in &findings {
        say!("{finding}");
    }
    let failed = findings.iter().filter(|f| f.level == Level::Fail).count();
    if failed > 0 {
        say!("{failed} problem(s) to fix before berth can run containers on this node");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
