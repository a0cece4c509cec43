//! Byte streams between two threads of one process as chunks over a bounded
//! channel: no pipe, no system call per write, and a stream that stops
//! without its end marker reads as an error, never as a shorter stream.

use std::io::{self, Read, Write};
use std::sync::mpsc::{Receiver, SyncSender};

/// Bytes per chunk.
pub const PIPE_CHUNK: usize = 1 << 20;
/// Chunks in flight between the two threads.
pub const PIPE_CHUNKS: usize = 4;

/// What goes over the channel: a chunk, an error, or (empty) the end.
pub type Chunk = io::Result<Vec<u8>>;

/// A bounded channel for [`ChunkWriter`] and [`ChunkReader`].
pub fn channel() -> (SyncSender<Chunk>, Receiver<Chunk>) {
    std::sync::mpsc::sync_channel(PIPE_CHUNKS)
}

/// The reading end: the bytes of the chunks in order, then end of file at
/// the end marker; an error when the other thread sent one, or went away
/// without the marker (`stopped` says who stopped, for the message).
pub struct ChunkReader {
    rx: Receiver<Chunk>,
    stopped: &'static str,
    chunk: Vec<u8>,
    pos: usize,
    done: bool,
}

impl ChunkReader {
    /// Reads what arrives on `rx`.
    pub fn new(rx: Receiver<Chunk>, stopped: &'static str) -> ChunkReader {
        ChunkReader {
            rx,
            stopped,
            chunk: Vec::new(),
            pos: 0,
            done: false,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(chunk)) if chunk.is_empty() => self.done = true,
                Ok(Ok(chunk)) => {
                    self.chunk = chunk;
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => {
                    self.done = true;
                    return Err(io::Error::other(self.stopped));
                }
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The writing end: bytes gathered into chunks of [`PIPE_CHUNK`]; the
/// stream ends only at [`ChunkWriter::finish`] (dropped before it, the
/// reader gets an error).
pub struct ChunkWriter {
    tx: SyncSender<Chunk>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    /// Writes to `tx`.
    pub fn new(tx: SyncSender<Chunk>) -> ChunkWriter {
        ChunkWriter {
            tx,
            buf: Vec::with_capacity(PIPE_CHUNK),
        }
    }

    fn send(&mut self, chunk: Vec<u8>) -> io::Result<()> {
        self.tx.send(Ok(chunk)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the reading thread stopped before the stream's end",
            )
        })
    }

    /// Sends what is left and the end marker.
    pub fn finish(mut self) -> io::Result<()> {
        self.flush()?;
        self.send(Vec::new())
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(PIPE_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&buf[..n]);
        if self.buf.len() == PIPE_CHUNK {
            let full = std::mem::replace(&mut self.buf, Vec::with_capacity(PIPE_CHUNK));
            self.send(full)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let part = std::mem::replace(&mut self.buf, Vec::with_capacity(PIPE_CHUNK));
        self.send(part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_in_order_and_end_at_the_marker() {
        let (tx, rx) = channel();
        let sender = std::thread::spawn(move || {
            let mut w = ChunkWriter::new(tx);
            for i in 0..3000u32 {
                w.write_all(&i.to_le_bytes().repeat(200)).unwrap();
            }
            w.finish().unwrap();
        });
        let mut got = Vec::new();
        ChunkReader::new(rx, "stopped")
            .read_to_end(&mut got)
            .unwrap();
        sender.join().unwrap();
        let want: Vec<u8> = (0..3000u32)
            .flat_map(|i| i.to_le_bytes().repeat(200))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_writer_gone_without_the_marker_is_an_error() {
        let (tx, rx) = channel();
        let mut w = ChunkWriter::new(tx);
        w.write_all(b"half a stream").unwrap();
        w.flush().unwrap();
        drop(w);
        let mut got = Vec::new();
        let err = ChunkReader::new(rx, "the writer stopped")
            .read_to_end(&mut got)
            .unwrap_err();
        assert_eq!(err.to_string(), "the writer stopped");
        assert_eq!(got, b"half a stream");
    }

    #[test]
    fn a_reader_gone_is_a_broken_pipe_for_the_writer() {
        let (tx, rx) = channel();
        drop(rx);
        let mut w = ChunkWriter::new(tx);
        let err = w.write_all(&vec![0; 2 * PIPE_CHUNK]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
