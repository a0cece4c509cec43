//! The download board: which layer blobs have arrived, shared between the
//! download threads and the conversion that reads them.
//!
//! The conversion does not wait for a whole blob: while a layer downloads,
//! [`Board::open`] gives a reader that follows the growing temp file and waits
//! for more bytes, so the top layer is converted while it arrives and the
//! blob's fsync is never in the conversion's way. Bytes read this way are not
//! yet verified; the pull publishes nothing unless every blob's digest checks,
//! so a bad blob only costs the conversion. A download that has to start over
//! after its reader consumed bytes makes that reader fail with
//! [`RESTARTED`]; the pull then converts again from the finished blobs.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The error text of a reader whose download started over.
pub const RESTARTED: &str = "the layer's download started over while it was being converted";

/// Where one layer's download stands.
#[derive(Default)]
enum Slot {
    /// Not started yet.
    #[default]
    Waiting,
    /// Arriving in `file`: `written` bytes so far; `complete` once the
    /// download ended with a matching digest.
    Growing {
        file: Arc<File>,
        written: u64,
        complete: bool,
        attempt: u32,
    },
    /// Published in the store at `path`; `attempt` is the download attempt
    /// that wrote it (`None`: found in the store).
    Stored { path: PathBuf, attempt: Option<u32> },
    /// The download failed.
    Failed,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    /// The first download error.
    error: Option<anyhow::Error>,
    /// The conversion gave up.
    aborted: bool,
    /// Readers may follow a growing file (false: wait for [`Slot::Stored`]).
    streaming: bool,
    /// A reader lost its download to a restart.
    restarted: bool,
}

/// Which layer downloads are done, for the conversion waiting on them.
pub(super) struct Board {
    state: Mutex<State>,
    changed: Condvar,
}

impl Board {
    /// A board for `n` layers; readers follow growing downloads.
    pub(super) fn new(n: usize) -> Board {
        let mut slots = Vec::with_capacity(n);
        slots.resize_with(n, Slot::default);
        Board {
            state: Mutex::new(State {
                slots,
                streaming: true,
                ..State::default()
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Layer `i` starts (again) to arrive in `file`; returns the attempt number.
    pub(super) fn begin(&self, i: usize, file: Arc<File>) -> u32 {
        let mut g = self.lock();
        let attempt = match &g.slots[i] {
            Slot::Growing { attempt, .. } => attempt + 1,
            _ => 0,
        };
        g.slots[i] = Slot::Growing {
            file,
            written: 0,
            complete: false,
            attempt,
        };
        self.changed.notify_all();
        attempt
    }

    /// `written` bytes of layer `i` are in its file now.
    pub(super) fn grew(&self, i: usize, written: u64) {
        let mut g = self.lock();
        if let Slot::Growing { written: w, .. } = &mut g.slots[i] {
            *w = written;
        }
        self.changed.notify_all();
    }

    /// Layer `i` arrived whole and its digest checks.
    pub(super) fn complete(&self, i: usize) {
        let mut g = self.lock();
        if let Slot::Growing { complete, .. } = &mut g.slots[i] {
            *complete = true;
        }
        self.changed.notify_all();
    }

    /// Layer `i` is in the store at `path` (downloaded or found there).
    pub(super) fn stored(&self, i: usize, path: PathBuf) {
        let mut g = self.lock();
        let attempt = match &g.slots[i] {
            Slot::Growing { attempt, .. } => Some(*attempt),
            _ => None,
        };
        g.slots[i] = Slot::Stored { path, attempt };
        self.changed.notify_all();
    }

    /// Layer `i` failed with `error`.
    pub(super) fn fail(&self, i: usize, error: anyhow::Error) {
        let mut g = self.lock();
        g.slots[i] = Slot::Failed;
        g.error.get_or_insert(error);
        self.changed.notify_all();
    }

    /// Stops waiters (the conversion failed).
    pub(super) fn abort(&self) {
        self.lock().aborted = true;
        self.changed.notify_all();
    }

    /// From now on readers wait for stored blobs (a second conversion after
    /// a restarted download).
    pub(super) fn stop_streaming(&self) {
        let mut g = self.lock();
        g.streaming = false;
        g.aborted = false;
        self.changed.notify_all();
    }

    /// Whether a reader lost its download to a restart.
    pub(super) fn restarted(&self) -> bool {
        self.lock().restarted
    }

    /// Waits until every layer is stored or one failed.
    pub(super) fn wait_all(&self) {
        let mut g = self.lock();
        while g.error.is_none() && g.slots.iter().any(|s| !matches!(s, Slot::Stored { .. })) {
            g = self.wait(g);
        }
    }

    /// Whether a download failed.
    pub(super) fn failed(&self) -> bool {
        self.lock().error.is_some()
    }

    /// The first download error.
    pub(super) fn take_error(&self) -> Option<anyhow::Error> {
        self.lock().error.take()
    }

    /// A reader of layer `i`: the stored blob, or the download in progress.
    pub(super) fn open(self: &Arc<Self>, i: usize) -> io::Result<Box<dyn Read + Send>> {
        let mut g = self.lock();
        loop {
            if g.error.is_some() || g.aborted || matches!(g.slots[i], Slot::Failed) {
                return Err(io::Error::other("a layer download failed"));
            }
            match &g.slots[i] {
                Slot::Stored { path, .. } => {
                    let path = path.clone();
                    drop(g);
                    let file = File::open(&path).map_err(|e| {
                        io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                    })?;
                    return Ok(Box::new(file));
                }
                Slot::Growing { file, attempt, .. } if g.streaming => {
                    return Ok(Box::new(GrowingReader {
                        board: Arc::clone(self),
                        index: i,
                        file: Arc::clone(file),
                        attempt: *attempt,
                        pos: 0,
                    }));
                }
                _ => g = self.wait(g),
            }
        }
    }
}

/// Reads a layer's temp file while its download writes it.
struct GrowingReader {
    board: Arc<Board>,
    index: usize,
    file: Arc<File>,
    attempt: u32,
    pos: u64,
}

impl Read for GrowingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let board = Arc::clone(&self.board);
        let mut g = board.lock();
        let available = loop {
            if g.error.is_some() || g.aborted {
                return Err(io::Error::other("a layer download failed"));
            }
            match &g.slots[self.index] {
                Slot::Growing {
                    written,
                    complete,
                    attempt,
                    ..
                } if *attempt == self.attempt => {
                    if *written > self.pos {
                        break *written - self.pos;
                    }
                    if *complete {
                        return Ok(0);
                    }
                }
                // Published by this attempt: every byte is in the file.
                Slot::Stored { attempt, .. } if *attempt == Some(self.attempt) => {
                    let len = self.file.metadata()?.len();
                    if len <= self.pos {
                        return Ok(0);
                    }
                    break len - self.pos;
                }
                // A new attempt before this reader read anything: follow it.
                Slot::Growing { file, attempt, .. } if self.pos == 0 => {
                    self.file = Arc::clone(file);
                    self.attempt = *attempt;
                    continue;
                }
                Slot::Waiting | Slot::Growing { .. } | Slot::Stored { .. } | Slot::Failed => {
                    g.restarted = true;
                    return Err(io::Error::other(RESTARTED));
                }
            }
            g = board.wait(g);
        };
        drop(g);
        let want = buf
            .len()
            .min(usize::try_from(available).unwrap_or(usize::MAX));
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_file() -> (tempfile::NamedTempFile, Arc<File>) {
        let t = tempfile::NamedTempFile::new().unwrap();
        let f = Arc::new(t.reopen().unwrap());
        (t, f)
    }

    #[test]
    fn reader_follows_a_growing_file_to_its_end() {
        let board = Arc::new(Board::new(1));
        let (t, file) = temp_file();
        board.begin(0, Arc::clone(&file));
        let mut reader = board.open(0).unwrap();
        let writer = {
            let board = Arc::clone(&board);
            let mut w = t.reopen().unwrap();
            std::thread::spawn(move || {
                for k in 0..50u32 {
                    w.write_all(&k.to_le_bytes().repeat(1000)).unwrap();
                    board.grew(0, u64::from(k + 1) * 4000);
                }
                board.complete(0);
            })
        };
        let mut all = Vec::new();
        reader.read_to_end(&mut all).unwrap();
        writer.join().unwrap();
        assert_eq!(all.len(), 200_000);
        assert_eq!(&all[196_000..196_004], &49u32.to_le_bytes());
    }

    #[test]
    fn restart_fails_a_reader_that_consumed_bytes() {
        let board = Arc::new(Board::new(1));
        let (t, file) = temp_file();
        board.begin(0, Arc::clone(&file));
        t.reopen().unwrap().write_all(b"abcd").unwrap();
        board.grew(0, 4);
        let mut reader = board.open(0).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(reader.read(&mut buf).unwrap(), 4);
        board.begin(0, file);
        let err = reader.read(&mut buf).unwrap_err();
        assert!(err.to_string().contains(RESTARTED));
        assert!(board.restarted());
    }

    #[test]
    fn a_reader_that_read_nothing_follows_a_restart() {
        let board = Arc::new(Board::new(1));
        let (_t1, first) = temp_file();
        board.begin(0, first);
        let mut reader = board.open(0).unwrap();
        let (t2, second) = temp_file();
        board.begin(0, Arc::clone(&second));
        t2.reopen().unwrap().write_all(b"new").unwrap();
        board.grew(0, 3);
        board.complete(0);
        let mut s = String::new();
        reader.read_to_string(&mut s).unwrap();
        assert_eq!(s, "new");
        assert!(!board.restarted());
    }

    #[test]
    fn a_failed_download_stops_readers_and_waiters() {
        let board = Arc::new(Board::new(2));
        let waiter = {
            let board = Arc::clone(&board);
            std::thread::spawn(move || board.open(1).err().map(|e| e.to_string()))
        };
        board.fail(0, anyhow::anyhow!("boom"));
        assert!(waiter.join().unwrap().unwrap().contains("failed"));
        assert_eq!(board.take_error().unwrap().to_string(), "boom");
    }

    #[test]
    fn without_streaming_readers_wait_for_the_stored_blob() {
        let board = Arc::new(Board::new(1));
        board.stop_streaming();
        let (t, file) = temp_file();
        board.begin(0, file);
        let waiter = {
            let board = Arc::clone(&board);
            std::thread::spawn(move || {
                let mut s = String::new();
                board.open(0).unwrap().read_to_string(&mut s).unwrap();
                s
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::fs::write(t.path(), b"stored").unwrap();
        board.stored(0, t.path().to_path_buf());
        assert_eq!(waiter.join().unwrap(), "stored");
    }
}
