//! Content digests (`sha256:<hex>`): checking their form, computing them, and a
//! writer that hashes what passes through it.

use std::fmt;
use std::io::{self, Write};

use sha2::{Digest as _, Sha256};

/// A validated `sha256:<64 lowercase hex>` digest.
///
/// Validation matters: the hex part becomes a file name in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses a digest; only sha256 is supported (the algorithm every registry uses).
    pub fn parse(s: &str) -> Result<Digest, String> {
        match s.split_once(':') {
            Some(("sha256", hex))
                if hex.len() == 64
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                Ok(Digest(s.to_string()))
            }
            Some((algo, _)) if algo != "sha256" => Err(format!(
                "digest '{s}' uses algorithm '{algo}'; berth supports only sha256 digests"
            )),
            _ => Err(format!(
                "'{s}' is not a valid digest (expected sha256:<64 lowercase hex digits>)"
            )),
        }
    }

    /// The sha256 digest of `bytes`.
    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex(&Sha256::digest(bytes))))
    }

    /// The hex part (no algorithm prefix), safe to use as a file name.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The full `sha256:<hex>` form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A writer that passes bytes on to `inner` while computing their sha256 and count.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Returns the digest and byte count of everything written, and the inner writer.
    pub fn finish(self) -> (Digest, u64, W) {
        let digest = Digest(format!("sha256:{}", hex(&self.hasher.finalize())));
        (digest, self.written, self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_compute() {
        let d = Digest::of_bytes(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        assert_eq!(d.hex().len(), 64);
        assert!(Digest::parse("sha256:../../etc/passwd").is_err());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
        assert!(Digest::parse(&format!("sha512:{}", "a".repeat(128)))
            .unwrap_err()
            .contains("only sha256"));
    }

    #[test]
    fn hashing_writer() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"hello ").unwrap();
        w.write_all(b"world").unwrap();
        let (d, n, inner) = w.finish();
        assert_eq!(n, 11);
        assert_eq!(inner, b"hello world");
        assert_eq!(d, Digest::of_bytes(b"hello world"));
    }
}
