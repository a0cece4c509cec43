//! The statement the step's first node sends with the squashfs: "image
//! manifest D, converter version V -> squashfs sha256 H, size S" (or "I send
//! nothing"), bound to one job step, with one root-made MUNGE credential per
//! receiving node over the statement's sha256.
//!
//! The file travels through `sbcast` as the job's user, so the user could
//! change it on the way: only the credential (which only root on a node of
//! the cluster can make, and only root can decode) makes it trustworthy.

use std::collections::BTreeMap;
use std::thread;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::munge;
use crate::image::ImageConfig;
use crate::registry::Digest;
use crate::store::ImageMeta;

/// The statement format this berth writes and reads.
pub const FORMAT: u32 = 1;

/// `munge` processes run at the same time when signing for many nodes.
const PARALLEL_SIGNERS: usize = 8;

/// What the first node says about one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    /// [`FORMAT`].
    pub format: u32,
    /// The job.
    pub job: u32,
    /// The step.
    pub step: u32,
    /// The sending node.
    pub sender: String,
    /// The image reference the step asked for, as given.
    pub image: String,
    /// What comes with it.
    pub offer: Offer,
}

/// What the sender sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Offer {
    /// The squashfs of the image, sent beside the statement.
    Squashfs(Box<SquashfsOffer>),
    /// Nothing: receivers pull from the registry at once.
    Nothing {
        /// Why (for the receivers' log).
        reason: String,
    },
}

/// The squashfs of an image and what a store needs beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SquashfsOffer {
    /// `sha256:...` of the squashfs.
    pub squashfs_digest: String,
    /// Its size in bytes.
    pub squashfs_size: u64,
    /// The image's `meta.json` (manifest digest, converter version, ...).
    pub meta: ImageMeta,
    /// The image's runtime config.
    pub config: ImageConfig,
    /// The image manifest (its sha256 is the manifest digest).
    pub manifest: String,
}

/// The file sent: the statement's JSON text and, per receiving node (by its
/// index in the step, `SLURM_NODEID`), a MUNGE credential whose payload is
/// [`payload`] for that node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignedStatement {
    /// The statement, as JSON text (hashed exactly as sent).
    pub statement: String,
    /// Node index in the step -> credential.
    pub credentials: BTreeMap<String, String>,
}

/// The payload of the credential for node index `node`: binds the node and
/// the statement's exact text. One credential per node, because munged
/// refuses to decode one credential twice (nodes may share a munged).
pub fn payload(node: u32, statement_text: &str) -> String {
    format!(
        "berth-fanout-{FORMAT} {node} {}",
        Digest::of_bytes(statement_text.as_bytes())
    )
}

impl SignedStatement {
    /// Signs `statement` for each of the node indexes `nodes` (as root: the
    /// credentials say uid 0).
    pub fn sign(statement: &Statement, nodes: &[u32]) -> Result<SignedStatement> {
        let text = serde_json::to_string(statement)?;
        let chunk = nodes.len().div_ceil(PARALLEL_SIGNERS).max(1);
        let signed: Result<Vec<Vec<(String, String)>>> = thread::scope(|s| {
            let workers: Vec<_> = nodes
                .chunks(chunk)
                .map(|part| {
                    let text = &text;
                    s.spawn(move || {
                        part.iter()
                            .map(|node| {
                                Ok((node.to_string(), munge::encode(&payload(*node, text))?))
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join()
                        .unwrap_or_else(|_| bail!("a signing thread panicked"))
                })
                .collect()
        });
        Ok(SignedStatement {
            statement: text,
            credentials: signed?.into_iter().flatten().collect(),
        })
    }

    /// The statement, once `node`'s credential decodes here with uid 0 and
    /// the payload for this node and this exact text.
    pub fn verify(&self, node: u32) -> Result<Statement> {
        let credential = self
            .credentials
            .get(&node.to_string())
            .with_context(|| format!("the statement has no credential for node index {node}"))?;
        let decoded = munge::decode(credential)?;
        check_decoded(&decoded, node, &self.statement)?;
        let statement: Statement =
            serde_json::from_str(&self.statement).context("the statement is not valid JSON")?;
        if statement.format != FORMAT {
            bail!(
                "the statement has format {}, this node reads {FORMAT}",
                statement.format
            );
        }
        Ok(statement)
    }
}

/// Checks a decoded credential: made by root, for this node and text.
fn check_decoded(decoded: &munge::Decoded, node: u32, text: &str) -> Result<()> {
    if decoded.uid != 0 {
        bail!(
            "the statement's credential was made by uid {}, not by root",
            decoded.uid
        );
    }
    if decoded.payload != payload(node, text) {
        bail!("the statement's credential is for another node or another statement");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_must_be_roots_and_match_node_and_text() {
        let text = r#"{"format":1}"#;
        let good = munge::Decoded {
            uid: 0,
            payload: payload(2, text),
        };
        check_decoded(&good, 2, text).unwrap();
        let e = check_decoded(&good, 3, text).unwrap_err();
        assert!(e.to_string().contains("another node"), "{e}");
        let e = check_decoded(&good, 2, r#"{"format":2}"#).unwrap_err();
        assert!(e.to_string().contains("another statement"), "{e}");
        let user = munge::Decoded { uid: 1001, ..good };
        let e = check_decoded(&user, 2, text).unwrap_err();
        assert!(e.to_string().contains("uid 1001"), "{e}");
    }

    #[test]
    fn offers_round_trip_as_json() {
        let statement = Statement {
            format: FORMAT,
            job: 7,
            step: 0,
            sender: "node1".into(),
            image: "reg:5000/a:1".into(),
            offer: Offer::Nothing {
                reason: "cached".into(),
            },
        };
        let text = serde_json::to_string(&statement).unwrap();
        assert!(text.contains(r#""kind":"nothing""#), "{text}");
        assert_eq!(serde_json::from_str::<Statement>(&text).unwrap(), statement);
    }
}
