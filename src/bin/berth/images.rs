//! `berth images`: the images in the store.

use std::process::ExitCode;

use anyhow::Result;

use berth::units::{format_size, format_utc};

use crate::store_args::StoreDir;

/// The arguments of `berth images`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    store: StoreDir,
}

/// `berth images`: one line per stored image, most recently used first.
pub fn run(args: Args) -> Result<ExitCode> {
    let store = args.store.open()?;
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
