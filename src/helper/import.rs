//! The import request: a squashfs file a user gave, re-packed into the store
//! by the pull helper (`berth __import`, as the pull user). Root opens the
//! file with the user's identity and hands the helper the descriptor
//! (inherited, its number in the request): the helper never opens the
//! user's path. The request is one line of JSON on stdin; the reply is a
//! [`super::PullReply`] line on stdout.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::protocol::MAX_REQUEST_BYTES;

/// The hidden subcommand that serves one [`ImportJob`].
pub const IMPORT_ARG: &str = "__import";

/// One import, as the plugin (or root's CLI) asks the helper for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportJob {
    /// The store folder.
    pub store: PathBuf,
    /// The user's file as they named it (for messages only; never opened).
    pub name: String,
    /// The inherited descriptor of the user's file (open for reading).
    pub file_fd: i32,
    /// Largest re-packed image, in bytes.
    pub max_image_size: u64,
    /// A store shared by several nodes: `(lease timeout, wait timeout)` in seconds.
    pub shared: Option<(u64, u64)>,
}

impl ImportJob {
    /// The request as it goes on the pipe: one line.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(self).expect("an ImportJob always serializes");
        bytes.push(b'\n');
        bytes
    }

    /// Reads a request line from `input`.
    pub fn read_from(input: impl Read) -> Result<ImportJob> {
        let mut bytes = Vec::new();
        input
            .take(MAX_REQUEST_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .context("cannot read the import request from stdin")?;
        let end = bytes
            .iter()
            .position(|b| *b == b'\n')
            .context("the import request on stdin has no line end within 64 KiB")?;
        serde_json::from_slice(&bytes[..end]).context(
            "the import request on stdin is unreadable (are the plugin and the berth helper of \
             one version? check helper_path)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_one_line_and_reads_back() {
        let job = ImportJob {
            store: "/s".into(),
            name: "/home/u/x.sqsh".into(),
            file_fd: 7,
            max_image_size: 1 << 30,
            shared: None,
        };
        let wire = job.encode();
        assert_eq!(wire.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(ImportJob::read_from(&wire[..]).unwrap(), job);
        let e = ImportJob::read_from(&b"{\"store\":\"/s\",\"bogus\":1}\n"[..]).unwrap_err();
        assert!(format!("{e:#}").contains("one version"), "{e:#}");
        assert!(ImportJob::read_from(&b"no line end"[..]).is_err());
    }
}
