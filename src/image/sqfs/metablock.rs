//! Metadata blocks: the 8 KiB units the inode, directory and lookup tables
//! are made of, each stored as a u16 header (the stored length, with bit 15
//! set when the block is stored uncompressed) followed by the block.

use std::io::{self, Write};

/// Uncompressed size of a metadata block.
pub const METABLOCK_SIZE: usize = 8192;

/// Bit 15 of a metadata block header: the block is stored uncompressed.
const UNCOMPRESSED: u16 = 0x8000;

/// A sink that counts the bytes written through it.
pub struct Counting<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Counting<W> {
    /// Wraps `inner`, counting from `start` (where it writes in its file).
    pub fn new(inner: W, start: u64) -> Self {
        Counting {
            inner,
            written: start,
        }
    }

    /// Bytes written so far, plus the start it was made with.
    pub fn position(&self) -> u64 {
        self.written
    }

    /// The wrapped sink.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a stream of metadata into metadata blocks, compressed with zstd
/// where that makes them smaller.
pub struct MetaWriter<W: Write> {
    out: W,
    /// Bytes written to `out` (the position of the next block relative to
    /// the table's start).
    written: u64,
    /// The current block, less than [`METABLOCK_SIZE`] bytes.
    block: Vec<u8>,
    compressor: zstd::bulk::Compressor<'static>,
    scratch: Vec<u8>,
}

impl<W: Write> MetaWriter<W> {
    /// A writer into `out`, compressing at zstd `level`.
    pub fn new(out: W, level: i32) -> io::Result<Self> {
        Ok(MetaWriter {
            out,
            written: 0,
            block: Vec::with_capacity(METABLOCK_SIZE),
            compressor: zstd::bulk::Compressor::new(level)?,
            scratch: Vec::with_capacity(METABLOCK_SIZE),
        })
    }

    /// Where the next byte goes: (the current block's start relative to the
    /// table's start, the offset inside the uncompressed block).
    pub fn position(&self) -> (u64, u16) {
        (self.written, self.block.len() as u16)
    }

    /// The position as a squashfs reference: `block << 16 | offset`.
    pub fn reference(&self) -> u64 {
        let (block, offset) = self.position();
        (block << 16) | u64::from(offset)
    }

    /// Appends `data`, which may span block boundaries.
    pub fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let room = METABLOCK_SIZE - self.block.len();
            let n = room.min(data.len());
            self.block.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.block.len() == METABLOCK_SIZE {
                self.flush_block()?;
            }
        }
        Ok(())
    }

    /// Writes the current block, if it holds anything.
    pub fn flush_block(&mut self) -> io::Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        self.scratch.clear();
        let compressed = self
            .compressor
            .compress_to_buffer(&self.block, &mut self.scratch)
            .is_ok_and(|n| n < self.block.len());
        let (header, body) = if compressed {
            (self.scratch.len() as u16, &self.scratch)
        } else {
            (self.block.len() as u16 | UNCOMPRESSED, &self.block)
        };
        self.out.write_all(&header.to_le_bytes())?;
        self.out.write_all(body)?;
        self.written += 2 + body.len() as u64;
        self.block.clear();
        Ok(())
    }

    /// Writes the last, partial block and returns the sink and the bytes
    /// written to it.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        self.flush_block()?;
        Ok((self.out, self.written))
    }
}

/// Writes `entries` (fixed-size table entries, packed) as metadata blocks
/// to `out` at file position `out.position()`, then the u64 index of the
/// blocks' file positions. Returns the file position of the index, which the
/// superblock points to.
pub fn write_indexed_table<W: Write>(
    out: &mut Counting<W>,
    entries: &[u8],
    level: i32,
) -> io::Result<u64> {
    let mut positions = Vec::new();
    for chunk in entries.chunks(METABLOCK_SIZE) {
        positions.push(out.position());
        let mut mw = MetaWriter::new(&mut *out, level)?;
        mw.write(chunk)?;
        mw.finish()?;
    }
    let index = out.position();
    for p in positions {
        out.write_all(&p.to_le_bytes())?;
    }
    Ok(index)
}
