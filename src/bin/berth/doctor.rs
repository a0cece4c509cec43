//! `berth doctor`: checks that this node has what berth needs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use berth::config::Config;
use berth::doctor::{self, DoctorOptions, Level};

use crate::store_args::parse_size_arg;

/// The arguments of `berth doctor`.
#[derive(clap::Args)]
pub struct Args {
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
}

/// `berth doctor`: the plugin's configuration (from plugstack.conf when it has
/// a berth line, else the CLI's), then every check; exit 1 on any failure.
pub fn run(args: Args) -> Result<ExitCode> {
    let Args {
        plugstack,
        registries,
        min_free,
    } = args;
    let file = plugstack
        .clone()
        .unwrap_or_else(doctor::default_plugstack_file);
    let plugstack_args = match doctor::plugstack_arguments(&file) {
        Ok(args) => args,
        Err(e) if plugstack.is_none() => {
            say!("note: {e:#}; checking the CLI configuration instead");
            None
        }
        Err(e) => return Err(e),
    };
    let config = match &plugstack_args {
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
