//! `berth gc`: temp files, unused blobs and outdated images out of the store.

use std::process::ExitCode;

use anyhow::Result;

use berth::store::{GcOptions, Store};
use berth::units::format_size;

use crate::store_args::{parse_age_arg, parse_size_arg, StoreDir};

/// The arguments of `berth gc`.
#[derive(clap::Args)]
pub struct Args {
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
}

/// `berth gc`: prints each removal, what was kept in use, and the total freed.
pub fn run(args: Args) -> Result<ExitCode> {
    // Unswept: gc removes and reports the temp files itself.
    let store = Store::open_unswept(args.store.root()?)?;
    let options = GcOptions {
        max_size: args.max_size,
        min_age: args.min_age,
    };
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
