//! `berth inspect`: one stored image's details.

use std::process::ExitCode;

use anyhow::{bail, Result};

use crate::store_args::StoreDir;

/// The arguments of `berth inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// A reference as pulled (`[REGISTRY#]IMAGE[:TAG]`) or a manifest digest
    /// (at least 6 leading hex digits).
    image: String,
    #[command(flatten)]
    store: StoreDir,
}

/// `berth inspect`: the image's details as pretty JSON.
pub fn run(args: Args) -> Result<ExitCode> {
    let store = args.store.open()?;
    let query = &args.image;
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
