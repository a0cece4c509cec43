//! MUNGE credentials through the `munge` and `unmunge` programs: root on the
//! step's first node vouches for a fan-out statement, and each receiving
//! node's munged says who made the credential.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Programs run with this PATH (never the job's).
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// Encodes `payload` into a credential that only root may decode (the
/// credential's uid is the caller's: root when the plugin's helper runs it).
pub fn encode(payload: &str) -> Result<String> {
    let output = run("munge", &["--restrict-uid=0"], payload.as_bytes())?;
    let text = String::from_utf8(output).context("munge wrote a credential that is not text")?;
    Ok(text.trim().to_string())
}

/// What a decoded credential says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The uid of the process that made it.
    pub uid: u32,
    /// The payload.
    pub payload: String,
}

/// Decodes `credential` with this node's munged: fails when it is invalid,
/// expired, replayed, or not for the caller.
pub fn decode(credential: &str) -> Result<Decoded> {
    let output = run(
        "unmunge",
        &["--numeric", "--keys=STATUS,UID"],
        credential.as_bytes(),
    )?;
    let text = String::from_utf8(output).context("unmunge wrote something that is not text")?;
    parse_unmunge(&text)
}

/// Parses `unmunge --numeric --keys=STATUS,UID` output: metadata lines, an
/// empty line, the payload.
fn parse_unmunge(text: &str) -> Result<Decoded> {
    let (metadata, payload) = text
        .split_once("\n\n")
        .context("unmunge's output has no payload after its metadata")?;
    let value = |key: &str| {
        metadata.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let status = value("STATUS").context("unmunge's output has no STATUS")?;
    if status != "0" {
        bail!("unmunge says the credential is not valid (status {status})");
    }
    let uid = value("UID")
        .and_then(|u| u.parse().ok())
        .context("unmunge's output has no numeric UID")?;
    Ok(Decoded {
        uid,
        payload: payload.to_string(),
    })
}

/// Runs `program args` with `input` on stdin; its stdout, or its stderr as the error.
fn run(program: &str, args: &[&str], input: &[u8]) -> Result<Vec<u8>> {
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", PATH)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {program} (install munge on every node)"))?;
    let mut stdin = child.stdin.take().context("no stdin pipe")?;
    stdin
        .write_all(input)
        .with_context(|| format!("cannot write to {program}"))?;
    drop(stdin);
    let output = child
        .wait_with_output()
        .with_context(|| format!("cannot wait for {program}"))?;
    if !output.status.success() {
        bail!(
            "{program} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmunge_output_is_parsed() {
        let text = "STATUS:          0\nUID:             0\n\nberth-fanout-1 node2 sha256:ab";
        let decoded = parse_unmunge(text).unwrap();
        assert_eq!(decoded.uid, 0);
        assert_eq!(decoded.payload, "berth-fanout-1 node2 sha256:ab");
        let e = parse_unmunge("STATUS: 15\nUID: 0\n\nx").unwrap_err();
        assert!(format!("{e:#}").contains("status 15"), "{e:#}");
        assert!(parse_unmunge("STATUS: 0\n\nx").is_err());
        assert!(parse_unmunge("no payload").is_err());
    }

    /// With a running munged (the test cluster has one): root's credential
    /// decodes once, with uid 0 and the payload.
    #[test]
    fn round_trip_with_munged() {
        use crate::test_support::{skip_because, skip_unless_root};
        if skip_unless_root("round_trip_with_munged") {
            return;
        }
        let credential = match encode("berth-fanout-1 test") {
            Ok(credential) => credential,
            Err(e) => {
                skip_because(
                    "round_trip_with_munged",
                    &format!("munge failed ({e:#}): start munged"),
                );
                return;
            }
        };
        let decoded = decode(&credential).unwrap();
        assert_eq!(decoded.uid, 0);
        assert_eq!(decoded.payload, "berth-fanout-1 test");
        let e = decode(&credential).unwrap_err();
        assert!(
            format!("{e:#}").contains("unmunge"),
            "a replay must fail: {e:#}"
        );
    }
}
