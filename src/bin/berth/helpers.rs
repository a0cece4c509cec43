//! The hidden verbs the plugin runs on compute nodes (`__pull`, `__holder`,
//! `__fanout`, `__credentials`, `__save`): each hands over to the library.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};

use berth::puller::CredentialSet;
use berth::registry::{ChainedCredentials, DockerCredentials, EnrootCredentials};

/// The arguments of `berth __fanout`.
#[derive(clap::Args)]
pub struct FanoutArgs {
    /// `send` or `receive`, then the request as JSON.
    #[arg(num_args = 2)]
    args: Vec<std::ffi::OsString>,
}

/// The arguments of `berth __credentials`.
#[derive(clap::Args)]
pub struct CredentialsArgs {
    /// Only entries with this login (`user@registry#image`).
    #[arg(long)]
    login: Option<String>,
    /// Registry and token-service hosts (`host[:port]`).
    hosts: Vec<String>,
}

/// The arguments of `berth __save`.
#[derive(clap::Args)]
pub struct SaveArgs {
    /// The save request, as JSON.
    request: std::ffi::OsString,
}

/// `berth __pull`: the pull helper (one request on stdin, one reply line on stdout).
pub fn pull() -> Result<ExitCode> {
    std::process::exit(berth::puller::serve::serve_pull())
}

/// `berth __import`: the import helper (a user's squashfs file, as a
/// descriptor; one request on stdin, one reply line on stdout).
pub fn import() -> Result<ExitCode> {
    std::process::exit(berth::puller::import::serve_import())
}

/// `berth __holder`: the container setup helper (spoken to over fd 3).
pub fn holder() -> Result<ExitCode> {
    berth::container::holder_main()
}

/// `berth __fanout send|receive JSON`.
pub fn fanout(args: FanoutArgs) -> Result<ExitCode> {
    std::process::exit(berth::fanout::fanout_main(&args.args))
}

/// `berth __save JSON`.
pub fn save(args: SaveArgs) -> Result<ExitCode> {
    std::process::exit(berth::container::save::save_main(&[args.request]))
}

/// `berth __credentials`: the calling user's registry credentials for the
/// hosts, written to stdout for the puller.
pub fn credentials(args: CredentialsArgs) -> Result<ExitCode> {
    let source = ChainedCredentials(vec![
        Arc::new(EnrootCredentials::from_env()),
        Arc::new(DockerCredentials::from_env()),
    ]);
    let set = CredentialSet::collect(&source, &args.hosts, args.login.as_deref());
    let mut out = std::io::stdout().lock();
    out.write_all(&set.encode())
        .and_then(|()| out.flush())
        .context("cannot write the credentials to the puller's pipe")?;
    Ok(ExitCode::SUCCESS)
}
