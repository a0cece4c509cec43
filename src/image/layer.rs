//! Layer blobs as tar streams: where they come from and how they are decompressed.
//!
//! Compression is detected from the first bytes, not from the media type
//! (registries and tools get media types wrong): gzip, zstd, or plain tar.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use flate2::read::MultiGzDecoder;

use super::chunks::{self, ChunkReader, PIPE_CHUNK};

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip (`1f 8b`).
    Gzip,
    /// zstd (`28 b5 2f fd`).
    Zstd,
    /// Anything else is read as an uncompressed tar.
    None,
}

/// Tells the compression from the first bytes of a blob.
pub fn detect(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Wraps `reader` (a layer blob) into a reader of the tar stream inside it.
pub fn decompress<'a>(
    reader: impl Read + Send + 'a,
    name: &str,
) -> Result<Box<dyn Read + Send + 'a>> {
    let mut reader = BufReader::with_capacity(256 * 1024, reader);
    let head = reader
        .fill_buf()
        .with_context(|| format!("cannot read layer {name}"))?;
    match detect(head) {
        Compression::Gzip => Ok(Box::new(MultiGzDecoder::new(reader))),
        Compression::None => Ok(Box::new(reader)),
        // Reads every frame, as zstd(1) does for concatenated files.
        Compression::Zstd => Ok(Box::new(
            zstd::stream::read::Decoder::with_buffer(reader)
                .with_context(|| format!("cannot start decompressing zstd layer {name}"))?,
        )),
    }
}

type Opener = dyn Fn() -> io::Result<Box<dyn Read + Send>> + Send + Sync;

/// One layer of an image: a name for messages (its digest) and a way to read
/// its blob from the start (the conversion reads it once, and again only for
/// hard links to files a later layer replaced).
#[derive(Clone)]
pub struct Layer {
    name: String,
    open: Arc<Opener>,
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layer").field("name", &self.name).finish()
    }
}

impl Layer {
    /// A layer stored in a file (compressed or not).
    pub fn from_file(path: PathBuf, name: impl Into<String>) -> Layer {
        Layer {
            name: name.into(),
            open: Arc::new(move || {
                File::open(&path)
                    .map(|f| Box::new(f) as Box<dyn Read + Send>)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
            }),
        }
    }

    /// A layer read through `open`, called each time the layer is read (it
    /// may wait, e.g. for the layer's download to finish).
    pub fn from_opener(
        name: impl Into<String>,
        open: impl Fn() -> io::Result<Box<dyn Read + Send>> + Send + Sync + 'static,
    ) -> Layer {
        Layer {
            name: name.into(),
            open: Arc::new(open),
        }
    }

    /// A layer held in memory (compressed or not); handy for tests.
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>, name: impl Into<String>) -> Layer {
        let bytes: Arc<[u8]> = bytes.into();
        Layer {
            name: name.into(),
            open: Arc::new(move || {
                Ok(Box::new(io::Cursor::new(Arc::clone(&bytes))) as Box<dyn Read + Send>)
            }),
        }
    }

    /// The name used in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens the layer's tar stream, decompressed.
    pub fn open_tar(&self) -> Result<Box<dyn Read + Send>> {
        let raw = (self.open)().with_context(|| format!("cannot open layer {}", self.name))?;
        decompress(raw, &self.name)
    }

    /// Like [`Layer::open_tar`], but reading and decompressing run on a
    /// thread of their own, [`chunks::PIPE_CHUNKS`] chunks of [`PIPE_CHUNK`] bytes
    /// ahead of the reader: decompression and what the reader does with the
    /// tar (parse, copy into tar2sqfs) use two cores.
    pub fn open_tar_pipelined(&self) -> Result<Box<dyn Read + Send>> {
        let mut tar = self.open_tar()?;
        let (tx, rx) = chunks::channel();
        let name = self.name.clone();
        std::thread::Builder::new()
            .name("berth-unpack".to_string())
            .spawn(move || loop {
                let mut chunk = vec![0u8; PIPE_CHUNK];
                let mut filled = 0;
                let result = loop {
                    match tar.read(&mut chunk[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == chunk.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                chunk.truncate(filled);
                let at_end = filled < PIPE_CHUNK;
                // A send fails when the reader went away (it failed or stopped early): stop too.
                if filled > 0 && tx.send(Ok(chunk)).is_err() {
                    return;
                }
                if let Err(e) = result {
                    let _ = tx.send(Err(e));
                    return;
                }
                if at_end {
                    // An empty chunk marks the end of the stream.
                    let _ = tx.send(Ok(Vec::new()));
                    return;
                }
            })
            .with_context(|| format!("cannot start a thread to decompress layer {name}"))?;
        Ok(Box::new(ChunkReader::new(
            rx,
            "the thread decompressing the layer stopped unexpectedly",
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn detects_by_magic() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"hello").unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(detect(&gz), Compression::Gzip);
        let mut out = String::new();
        Layer::from_bytes(gz, "l")
            .open_tar()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "hello");
        let mut out = String::new();
        Layer::from_bytes(b"plain".to_vec(), "l")
            .open_tar()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "plain");
        // zstd, two frames back to back (as appending writers make).
        let mut zst = zstd::stream::encode_all(&b"hel"[..], 3).unwrap();
        zst.extend(zstd::stream::encode_all(&b"lo"[..], 3).unwrap());
        assert_eq!(detect(&zst), Compression::Zstd);
        let mut out = String::new();
        Layer::from_bytes(zst, "l")
            .open_tar()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(out, "hello");
        // Corrupt zstd fails while reading, naming nothing worse than an I/O error.
        let mut bad = Layer::from_bytes(vec![0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0], "sha256:z")
            .open_tar()
            .unwrap();
        assert!(bad.read_to_end(&mut Vec::new()).is_err());
    }
}
