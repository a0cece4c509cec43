//! `berth`: pull images and run containers from the command line, on the same
//! core the Slurm plugin uses. Also the helper the plugin runs on compute nodes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use berth::config::Config;
use berth::container::spec::{parse_mounts, ContainerSpec, UserIdentity};
use berth::container::{holder_main, spawn_holder, Mode};
use berth::reference::ImageSource;
use berth::registry::RegistryOptions;
use berth::store::{pull_image, PullOptions};

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
    },
    /// Run a command inside an image.
    Run {
        /// Bind mounts, `SRC[:DST[:ro]]`, comma-separated or repeated.
        #[arg(long = "mount", short = 'm')]
        mounts: Vec<String>,
        /// Working directory inside the container (default: the image's WorkingDir).
        #[arg(long)]
        workdir: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
        /// Image reference or squashfs file.
        image: String,
        /// Command and arguments (default: a shell).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Internal: the container setup helper (spoken to over fd 3).
    #[command(name = "__holder", hide = true)]
    Holder,
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
}

impl StoreArgs {
    fn resolve(&self, config: &Config) -> (PathBuf, PullOptions) {
        let root = self
            .store
            .clone()
            .unwrap_or_else(|| config.store_path.clone());
        let mut insecure = config.insecure_registries.clone();
        insecure.extend(self.insecure_registries.iter().cloned());
        let options = PullOptions {
            registry: RegistryOptions {
                insecure_registries: insecure,
                ..RegistryOptions::default()
            },
            progress: false,
        };
        (root, options)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Commands::Holder => holder_main(),
        Commands::Pull { image, store, json } => {
            let config = Config::for_cli()?;
            let source = ImageSource::parse(&image)?;
            let (root, mut options) = store.resolve(&config);
            options.progress = !json;
            let stored = pull_image(&root, &source, &options)
                .with_context(|| format!("cannot pull {source}"))?;
            if json {
                println!("{}", serde_json::to_string(&stored)?);
            } else {
                let digest = stored.manifest_digest.as_deref().unwrap_or("-");
                println!("{digest} {}", stored.squashfs.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Commands::Run {
            mounts,
            workdir,
            store,
            image,
            command,
        } => {
            let config = Config::for_cli()?;
            let source = ImageSource::parse(&image)?;
            let (root, options) = store.resolve(&config);
            let stored = pull_image(&root, &source, &options)
                .with_context(|| format!("cannot pull {source}"))?;
            let mut mount_specs = Vec::new();
            for text in &mounts {
                mount_specs.extend(parse_mounts(text).with_context(|| format!("--mount {text}"))?);
            }
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
            let mode = if uid == 0 {
                Mode::Privileged
            } else {
                Mode::Unprivileged
            };
            let helper = std::env::current_exe().context("cannot find the berth executable")?;
            let container = spawn_holder(&helper, &spec, mode)?;
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

/// Shell-style exit code: the command's, or 128+signal.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        _ => 1,
    }
}
