//! `berth`: pull images and run containers from the command line, on the same
//! core the Slurm plugin uses. Also the helper the plugin runs on compute nodes.
//!
//! One module per verb, each with its clap arguments and its code; this file
//! holds the verb list and the exit-code policy.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// `println!` that returns the error (with `?`) instead of panicking when
/// stdout is a closed pipe (`berth images | head`).
macro_rules! say {
    ($($arg:tt)*) => {
        {
            use std::io::Write as _;
            use anyhow::Context as _;
            writeln!(std::io::stdout().lock(), $($arg)*).context("cannot write to stdout")?
        }
    };
}

mod containers;
mod doctor;
mod gc;
mod helpers;
mod images;
mod inspect;
mod pull;
mod rmi;
mod run;
mod store_args;

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
    Pull(pull::Args),
    /// Run a command inside an image.
    Run(run::Args),
    /// Check that this node has what berth needs, and say what to fix.
    Doctor(doctor::Args),
    /// List the images in the store.
    Images(images::Args),
    /// Print a stored image's digest, size, platform, config and layers as JSON.
    Inspect(inspect::Args),
    /// Remove images from the store (and blobs no other image uses); an image a
    /// running container uses is refused.
    Rmi(rmi::Args),
    /// Remove temp files, unused blobs and outdated images; with --max-size, also
    /// least recently used images until the store fits (never one in use).
    Gc(gc::Args),
    /// Named containers kept on this node (`srun --container-name`); root only.
    Containers {
        #[command(subcommand)]
        action: containers::Action,
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
    Fanout(helpers::FanoutArgs),
    /// Internal: look up the calling user's registry credentials for HOSTS
    /// and write them to stdout, for the puller (run as the job's user).
    #[command(name = "__credentials", hide = true)]
    Credentials(helpers::CredentialsArgs),
    /// Internal: the `--container-save` helper (one JSON argument).
    #[command(name = "__save", hide = true)]
    Save(helpers::SaveArgs),
}

/// Whether `e` is stdout closed under us (the reader went away: not a failure).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.root_cause()
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

fn main() -> ExitCode {
    // A Slurm task entering its container by exec (Slurm 23.11 and later):
    // before any argument parsing, so that the task starts as fast as it can.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == berth::container::ENTER_ARG)
    {
        berth::container::enter_main(&args[2..]);
    }
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Runs one verb.
fn dispatch(command: Commands) -> Result<ExitCode> {
    match command {
        Commands::Pull(args) => pull::run(args),
        Commands::Run(args) => run::run(args),
        Commands::Doctor(args) => doctor::run(args),
        Commands::Images(args) => images::run(args),
        Commands::Inspect(args) => inspect::run(args),
        Commands::Rmi(args) => rmi::run(args),
        Commands::Gc(args) => gc::run(args),
        Commands::Containers { action } => containers::run(action),
        Commands::PullHelper => helpers::pull(),
        Commands::ImportHelper => helpers::import(),
        Commands::Holder => helpers::holder(),
        Commands::Fanout(args) => helpers::fanout(args),
        Commands::Credentials(args) => helpers::credentials(args),
        Commands::Save(args) => helpers::save(args),
    }
}
