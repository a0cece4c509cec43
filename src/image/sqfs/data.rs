//! File data: full blocks compressed independently, file tails packed into
//! fragment blocks, compressed by worker threads and written to the image in
//! the order they were handed in, as the results come.
//!
//! Data blocks and fragment blocks share one sequence of "units"; the writer
//! thread records each unit's stored size (bit 24 set: stored uncompressed,
//! 0: a sparse all-zero block, not written), and positions come from prefix
//! sums at the end. At most `2 * jobs + 2` units are in flight (read, queued,
//! being compressed or waiting for an earlier one to be written), so memory
//! does not grow with file content.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};

use super::tree::NONE;

/// Bit 24 of a stored block size: the block is stored uncompressed.
pub const BLOCK_UNCOMPRESSED: u32 = 1 << 24;

/// Where a file's data went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileData {
    /// Unit of the first full block (the rest follow it).
    pub first_unit: u32,
    /// Fragment block index of the tail, or [`NONE`].
    pub fragment: u32,
    /// Offset of the tail in the fragment block.
    pub fragment_offset: u32,
}

/// What the data writer wrote, for the tables.
pub struct DataResult {
    /// The image file, positioned after the data.
    pub file: File,
    /// Stored size of each unit.
    pub sizes: Vec<u32>,
    /// Unit of each fragment block.
    pub fragment_units: Vec<u32>,
    /// File position after the last unit.
    pub end: u64,
    /// Full blocks (sparse ones included).
    pub data_blocks: u64,
    /// Full blocks that were all zeros.
    pub sparse_blocks: u64,
}

struct Job {
    unit: u32,
    data: Vec<u8>,
}

struct Done {
    unit: u32,
    data: Vec<u8>,
    stored: u32,
}

/// [`Done::stored`] of a unit whose compression panicked: the writer thread
/// stops with an error (the unit's bytes are lost), so nothing waits for it.
const LOST: u32 = u32::MAX;

struct Written {
    file: File,
    sizes: Vec<u32>,
    end: u64,
}

/// Compresses and writes file data.
pub struct DataWriter {
    block_size: usize,
    jobs: Option<Sender<Job>>,
    results: Option<Sender<Done>>,
    credits: Receiver<()>,
    workers: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<Result<Written>>>,
    next_unit: u32,
    fragment: Vec<u8>,
    fragment_units: Vec<u32>,
    data_blocks: u64,
    sparse_blocks: u64,
}

impl DataWriter {
    /// Starts `jobs` compression threads at zstd `level` and a thread that
    /// writes to `file` from position `start` on.
    pub fn new(file: File, start: u64, block_size: u32, jobs: usize, level: i32) -> Result<Self> {
        let jobs = jobs.max(1);
        let in_flight = 2 * jobs + 2;
        let (credit_tx, credits) = mpsc::sync_channel(in_flight);
        for _ in 0..in_flight {
            credit_tx.send(()).expect("the receiver is here");
        }
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let mut workers = Vec::with_capacity(jobs);
        for _ in 0..jobs {
            let mut compressor =
                zstd::bulk::Compressor::new(level).context("cannot set up the zstd compressor")?;
            let job_rx = Arc::clone(&job_rx);
            let done_tx = done_tx.clone();
            workers.push(std::thread::spawn(move || loop {
                let job = job_rx.lock().map(|rx| rx.recv());
                let Ok(Ok(job)) = job else { break };
                let unit = job.unit;
                let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    compress(&mut compressor, job)
                }))
                .unwrap_or(Done {
                    unit,
                    data: Vec::new(),
                    stored: LOST,
                });
                if done_tx.send(done).is_err() {
                    break;
                }
            }));
        }
        let writer = std::thread::spawn(move || write_in_order(file, start, done_rx, credit_tx));
        Ok(DataWriter {
            block_size: block_size as usize,
            jobs: Some(job_tx),
            results: Some(done_tx),
            credits,
            workers,
            writer: Some(writer),
            next_unit: 0,
            fragment: Vec::new(),
            fragment_units: Vec::new(),
            data_blocks: 0,
            sparse_blocks: 0,
        })
    }

    /// Reads a file of `size` bytes from `r` and hands its blocks on.
    pub fn add_file(&mut self, r: &mut impl Read, size: u64) -> Result<FileData> {
        let bs = self.block_size as u64;
        let first_unit = self.next_unit;
        for _ in 0..size / bs {
            let mut block = vec![0; self.block_size];
            r.read_exact(&mut block)
                .context("cannot read the file's data")?;
            self.data_blocks += 1;
            if block.iter().all(|&b| b == 0) {
                self.sparse_blocks += 1;
                self.submit(Vec::new(), true)?;
            } else {
                self.submit(block, false)?;
            }
        }
        let tail = (size % bs) as usize;
        if tail == 0 {
            return Ok(FileData {
                first_unit,
                fragment: NONE,
                fragment_offset: 0,
            });
        }
        if self.fragment.len() + tail > self.block_size {
            self.flush_fragment()?;
        }
        if self.fragment.capacity() == 0 {
            self.fragment.reserve_exact(self.block_size);
        }
        let offset = self.fragment.len();
        self.fragment.resize(offset + tail, 0);
        r.read_exact(&mut self.fragment[offset..])
            .context("cannot read the file's data")?;
        Ok(FileData {
            first_unit,
            fragment: u32::try_from(self.fragment_units.len())
                .ok()
                .filter(|&f| f < NONE)
                .ok_or_else(|| anyhow!("too many fragment blocks"))?,
            fragment_offset: offset as u32,
        })
    }

    fn flush_fragment(&mut self) -> Result<()> {
        if self.fragment.is_empty() {
            return Ok(());
        }
        let block = std::mem::take(&mut self.fragment);
        self.fragment_units.push(self.next_unit);
        self.submit(block, false)
    }

    /// Queues `data` as the next unit (a sparse one is only recorded).
    fn submit(&mut self, data: Vec<u8>, sparse: bool) -> Result<()> {
        if self.credits.recv().is_err() {
            return Err(self.writer_error());
        }
        let unit = self.next_unit;
        self.next_unit = unit
            .checked_add(1)
            .filter(|&u| u < NONE)
            .ok_or_else(|| anyhow!("too many data blocks"))?;
        let sent = if sparse {
            let done = Done {
                unit,
                data,
                stored: 0,
            };
            self.results.as_ref().expect("running").send(done).is_ok()
        } else {
            self.jobs
                .as_ref()
                .expect("running")
                .send(Job { unit, data })
                .is_ok()
        };
        if sent {
            Ok(())
        } else {
            Err(self.writer_error())
        }
    }

    /// The writer thread's error, once it has stopped.
    fn writer_error(&mut self) -> anyhow::Error {
        self.jobs = None;
        self.results = None;
        match self.writer.take().map(|w| w.join()) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => anyhow!("the image writer thread panicked"),
            _ => anyhow!("the image writer thread stopped"),
        }
    }

    /// Writes the last fragment block, waits for all units to be written.
    pub fn finish(mut self) -> Result<DataResult> {
        self.flush_fragment()?;
        self.jobs = None;
        self.results = None;
        for w in self.workers.drain(..) {
            w.join()
                .map_err(|_| anyhow!("a compression thread panicked"))?;
        }
        let written = match self.writer.take().map(|w| w.join()) {
            Some(Ok(r)) => r?,
            _ => return Err(anyhow!("the image writer thread panicked")),
        };
        debug_assert_eq!(written.sizes.len(), self.next_unit as usize);
        Ok(DataResult {
            file: written.file,
            sizes: written.sizes,
            fragment_units: self.fragment_units,
            end: written.end,
            data_blocks: self.data_blocks,
            sparse_blocks: self.sparse_blocks,
        })
    }
}

/// Compresses one unit; one that does not get smaller is stored as it is.
fn compress(compressor: &mut zstd::bulk::Compressor<'static>, job: Job) -> Done {
    let mut out = Vec::with_capacity(job.data.len());
    match compressor.compress_to_buffer(&job.data, &mut out) {
        Ok(n) if n < job.data.len() => Done {
            unit: job.unit,
            data: out,
            stored: n as u32,
        },
        _ => Done {
            unit: job.unit,
            stored: job.data.len() as u32 | BLOCK_UNCOMPRESSED,
            data: job.data,
        },
    }
}

/// Writes units to `file` in unit order as they arrive, giving a credit
/// back for each.
fn write_in_order(
    file: File,
    start: u64,
    done: Receiver<Done>,
    credits: SyncSender<()>,
) -> Result<Written> {
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut pending = BTreeMap::new();
    let mut sizes = Vec::new();
    let mut end = start;
    for d in done {
        if d.stored == LOST {
            return Err(anyhow!(
                "compressing data block {} failed (a compression thread panicked)",
                d.unit
            ));
        }
        pending.insert(d.unit, d);
        while let Some(d) = pending.remove(&(sizes.len() as u32)) {
            out.write_all(&d.data)
                .context("cannot write a data block to the image")?;
            end += d.data.len() as u64;
            sizes.push(d.stored);
            let _ = credits.send(());
        }
    }
    if !pending.is_empty() {
        return Err(anyhow!(
            "a data block was lost (a compression thread stopped)"
        ));
    }
    let file = out
        .into_inner()
        .map_err(|e| e.into_error())
        .context("cannot write data blocks to the image")?;
    Ok(Written { file, sizes, end })
}

/// Units between the positions [`Positions`] keeps.
const SAMPLE: usize = 64;

/// File positions of the units: one u64 kept every [`SAMPLE`] units, the
/// rest summed from the sizes.
pub struct Positions {
    samples: Vec<u64>,
    sizes: Vec<u32>,
}

impl Positions {
    /// Positions of units of `sizes`, the first at `start`.
    pub fn new(start: u64, sizes: Vec<u32>) -> Self {
        let mut samples = Vec::with_capacity(sizes.len() / SAMPLE + 1);
        let mut p = start;
        for (i, &s) in sizes.iter().enumerate() {
            if i.is_multiple_of(SAMPLE) {
                samples.push(p);
            }
            p += u64::from(s & !BLOCK_UNCOMPRESSED);
        }
        if sizes.len().is_multiple_of(SAMPLE) {
            samples.push(p);
        }
        Positions { samples, sizes }
    }

    /// Where unit `unit` starts (`unit` may be one past the last).
    pub fn position(&self, unit: u32) -> u64 {
        let unit = unit as usize;
        let base = unit / SAMPLE;
        self.samples[base]
            + self.sizes[base * SAMPLE..unit]
                .iter()
                .map(|&s| u64::from(s & !BLOCK_UNCOMPRESSED))
                .sum::<u64>()
    }

    /// Stored sizes of `count` units from `first`.
    pub fn sizes(&self, first: u32, count: usize) -> &[u32] {
        &self.sizes[first as usize..first as usize + count]
    }

    /// Stored size of one unit.
    pub fn size(&self, unit: u32) -> u32 {
        self.sizes[unit as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_prefix_sums_without_the_flag() {
        let sizes: Vec<u32> = (0..200u32)
            .map(|i| {
                if i % 3 == 0 {
                    100 | BLOCK_UNCOMPRESSED
                } else {
                    i
                }
            })
            .collect();
        let p = Positions::new(96, sizes.clone());
        let mut expect = 96u64;
        for (i, s) in sizes.iter().enumerate() {
            assert_eq!(p.position(i as u32), expect, "unit {i}");
            expect += u64::from(s & !BLOCK_UNCOMPRESSED);
        }
        assert_eq!(p.position(200), expect);
        let p = Positions::new(96, vec![5; 64]);
        assert_eq!(p.position(64), 96 + 320);
    }

    #[test]
    fn blocks_keep_their_order_and_zeros_are_sparse() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("d")).unwrap();
        let mut w = DataWriter::new(file, 0, 4096, 3, 3).unwrap();
        let mut content = Vec::new();
        for i in 0..50u32 {
            // Incompressible pseudo-random blocks, every 7th all zeros.
            let mut x = i.wrapping_mul(2654435761) | 1;
            let block: Vec<u8> = (0..4096)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if i % 7 == 0 {
                        0
                    } else {
                        x as u8
                    }
                })
                .collect();
            content.extend_from_slice(&block);
        }
        content.extend_from_slice(b"tail");
        let f = w
            .add_file(&mut content.as_slice(), content.len() as u64)
            .unwrap();
        assert_eq!(f.first_unit, 0);
        assert_eq!(f.fragment, 0);
        let r = w.finish().unwrap();
        assert_eq!(r.sizes.len(), 51);
        assert_eq!(r.sparse_blocks, 8);
        let written = std::fs::read(dir.path().join("d")).unwrap();
        let mut expect = Vec::new();
        for (i, block) in content[..50 * 4096].chunks(4096).enumerate() {
            if i % 7 == 0 {
                assert_eq!(r.sizes[i], 0);
            } else {
                assert_eq!(r.sizes[i], 4096 | BLOCK_UNCOMPRESSED);
                expect.extend_from_slice(block);
            }
        }
        let frag = &written[expect.len()..];
        assert_eq!(&written[..expect.len()], &expect[..]);
        let tail = if r.sizes[50] & BLOCK_UNCOMPRESSED != 0 {
            frag.to_vec()
        } else {
            zstd::bulk::decompress(frag, 4096).unwrap()
        };
        assert_eq!(tail, b"tail");
    }
}
