//! A receiving node's side: wait (bounded) for the first node's statement,
//! check it, import the squashfs into the store.

use std::io::Read;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::statement::{Offer, SignedStatement, Statement};
use super::{open_received, ReceiveRequest, StepFiles, MAX_STATEMENT};
use crate::store::{ImportRequest, Store, StoredImage};

/// How often the files are looked for.
const POLL: Duration = Duration::from_millis(100);

/// How long a statement file may stay unreadable (`sbcast` writing it).
const PARTIAL_GRACE: Duration = Duration::from_secs(10);

/// Waits for the first node's statement and imports the squashfs it
/// announces. Every failure is an error for the plugin to fall back on.
pub fn receive(request: &ReceiveRequest) -> Result<StoredImage> {
    let started = Instant::now();
    let files = StepFiles::new(&request.fanout_dir, request.job, request.step);
    files.prepare(request.user)?;
    let result = wait_and_import(request, &files, started);
    files.remove();
    result
}

fn wait_and_import(
    request: &ReceiveRequest,
    files: &StepFiles,
    started: Instant,
) -> Result<StoredImage> {
    let statement = wait_for_statement(request, files, started)?;
    if statement.job != request.job
        || statement.step != request.step
        || statement.image != request.image
    {
        bail!(
            "the statement is for job {} step {} image {}, not for this step",
            statement.job,
            statement.step,
            statement.image
        );
    }
    let offer = match &statement.offer {
        Offer::Nothing { reason } => {
            bail!("{} sends no image: {reason}", statement.sender)
        }
        Offer::Squashfs(offer) => offer,
    };
    let meta = &offer.meta;
    if meta.manifest_digest != request.manifest_digest {
        bail!(
            "{} sends image {}, this node resolved {} (the tag moved?)",
            statement.sender,
            meta.manifest_digest,
            request.manifest_digest
        );
    }
    let (file, size) = open_received(&files.squashfs(), request.user)?.with_context(|| {
        format!(
            "{} announced the squashfs, but {} did not arrive",
            statement.sender,
            files.squashfs().display()
        )
    })?;
    if size != offer.squashfs_size {
        bail!(
            "{} has {size} bytes, {} announced {}",
            files.squashfs().display(),
            statement.sender,
            offer.squashfs_size
        );
    }
    let store = Store::open_unswept(&request.store)?;
    let import = ImportRequest {
        meta,
        config: &offer.config,
        manifest: &offer.manifest,
        squashfs_digest: &offer.squashfs_digest,
        squashfs_size: offer.squashfs_size,
    };
    store
        .import(&import, file)
        .with_context(|| format!("cannot import the squashfs sent by {}", statement.sender))
}

/// Polls for the signed statement: at most `intent_wait` until the intent or
/// the statement appears, at most `wait` in all.
fn wait_for_statement(
    request: &ReceiveRequest,
    files: &StepFiles,
    started: Instant,
) -> Result<Statement> {
    let mut first_seen: Option<Instant> = None;
    let mut intent_seen = false;
    loop {
        let waited = started.elapsed();
        if let Some((mut file, size)) = open_received(&files.statement(), request.user)? {
            if size > MAX_STATEMENT {
                bail!(
                    "{} is larger than {MAX_STATEMENT} bytes",
                    files.statement().display()
                );
            }
            let text = read_bounded(&mut file, MAX_STATEMENT)
                .with_context(|| format!("cannot read {}", files.statement().display()))?;
            match serde_json::from_str::<SignedStatement>(&text) {
                Ok(signed) => return signed.verify(request.node_id),
                Err(e) => {
                    // sbcast may still be writing it.
                    let seen = *first_seen.get_or_insert_with(Instant::now);
                    if seen.elapsed() > PARTIAL_GRACE {
                        bail!("{} is not a statement: {e}", files.statement().display());
                    }
                }
            }
        }
        if !intent_seen {
            if let Some((file, _)) = open_received(&files.intent(), request.user)? {
                let mut digest = String::new();
                file.take(200).read_to_string(&mut digest).ok();
                if !digest.is_empty() {
                    if digest.trim() != request.manifest_digest {
                        bail!(
                            "the first node fetches {}, this node resolved {} (the tag moved?)",
                            digest.trim(),
                            request.manifest_digest
                        );
                    }
                    intent_seen = true;
                }
            }
        }
        if !intent_seen && waited > request.intent_wait {
            bail!(
                "the first node did not say within {} s that it fetches the image \
                 (it had it already, or started late)",
                request.intent_wait.as_secs()
            );
        }
        if waited > request.wait {
            bail!(
                "no squashfs from the first node within {} s (fanout_wait)",
                request.wait.as_secs()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// Reads `reader` as text, at most `limit` bytes: the statement sits in
/// the user's folder, and the user may keep appending to it after the size
/// was checked.
fn read_bounded(reader: &mut impl Read, limit: u64) -> Result<String> {
    let mut text = String::new();
    reader.take(limit + 1).read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        bail!("it grew beyond {limit} bytes while it was read");
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement that never ends (the user appends while it is read)
    /// stops at the limit instead of filling memory.
    #[test]
    fn reads_stop_at_the_limit() {
        let mut endless = std::io::repeat(b'x');
        let e = read_bounded(&mut endless, 1024).unwrap_err();
        assert!(e.to_string().contains("beyond 1024 bytes"), "{e}");
        let mut short: &[u8] = b"{}";
        assert_eq!(read_bounded(&mut short, 1024).unwrap(), "{}");
        let mut exact: &[u8] = &[b'a'; 16];
        assert_eq!(read_bounded(&mut exact, 16).unwrap().len(), 16);
    }
}
