//! `berth rmi`: images out of the store.

use std::process::ExitCode;

use anyhow::Result;

use berth::store::RemoveOutcome;
use berth::units::format_size;

use crate::store_args::StoreDir;

/// The arguments of `berth rmi`.
#[derive(clap::Args)]
pub struct Args {
    /// References as pulled, or manifest digests (at least 6 leading hex digits).
    #[arg(required = true)]
    images: Vec<String>,
    #[command(flatten)]
    store: StoreDir,
}

/// `berth rmi`: removes each named image; reports every failure and exits 1
/// if there was one.
pub fn run(args: Args) -> Result<ExitCode> {
    let store = args.store.open()?;
    let mut failed = false;
    for query in &args.images {
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
