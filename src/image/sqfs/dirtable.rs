//! Directory table encoding: a directory's listing is runs of entries, each
//! run under a header naming the inode metablock and the base inode number
//! its entries are relative to.
//!
//! A new run starts after 256 entries, when the inode metablock changes,
//! when an inode number is more than 32767 from the run's base, or when the
//! run would cross the end of a directory metablock (as squashfs-tools-ng
//! does, so listings and their sizes come out the same). Directories of 256
//! entries or more get an index of their runs in the inode (the kernel uses
//! it to skip ahead in lookups).

use std::io::{self, Write};

use super::metablock::{MetaWriter, METABLOCK_SIZE};

/// Entries in one run at most.
const MAX_RUN: usize = 256;

/// Directories with this many entries get an index.
pub const INDEX_THRESHOLD: usize = 256;

/// One entry of a listing.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// The name, 1..=256 bytes.
    pub name: &'a [u8],
    /// The inode's reference (metablock << 16 | offset).
    pub inode_ref: u64,
    /// The inode's number.
    pub number: u32,
    /// The basic inode type.
    pub basic_type: u16,
}

/// Where a listing went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Metablock of its start, relative to the directory table.
    pub start_block: u64,
    /// Offset of its start in that metablock.
    pub offset: u16,
    /// Bytes of the listing (the inode's file_size is this + 3).
    pub size: u64,
    /// The directory index (packed entries), empty under the threshold.
    pub index: Vec<u8>,
    /// Entries in `index`.
    pub index_count: u16,
}

/// How many entries from `entries[0]` on go under one header written at
/// offset `offset` of a metablock.
fn run_length(offset: u16, entries: &[Entry]) -> usize {
    let first = &entries[0];
    let mut size = (offset as usize + 12) % METABLOCK_SIZE;
    let mut count = 0;
    for e in entries {
        if e.inode_ref >> 16 != first.inode_ref >> 16 {
            break;
        }
        let diff = i64::from(e.number) - i64::from(first.number);
        if !(-32767..=32767).contains(&diff) {
            break;
        }
        size += 8 + e.name.len();
        if count > 0 && size > METABLOCK_SIZE {
            break;
        }
        count += 1;
        if count == MAX_RUN {
            break;
        }
    }
    count
}

/// Writes the listing of `entries` (sorted by name) to `dm`.
pub fn write_listing<W: Write>(dm: &mut MetaWriter<W>, entries: &[Entry]) -> io::Result<Listing> {
    let (start_block, offset) = dm.position();
    let mut size = 0u64;
    let mut index = Vec::new();
    let mut index_count = 0u16;
    let mut rest = entries;
    let mut buf = Vec::with_capacity(12 + 8 + 256);
    while !rest.is_empty() {
        let (block, off) = dm.position();
        let n = run_length(off, rest);
        let first = &rest[0];
        if entries.len() >= INDEX_THRESHOLD && index_count < u16::MAX {
            index.extend_from_slice(&(size as u32).to_le_bytes());
            index.extend_from_slice(&(block as u32).to_le_bytes());
            index.extend_from_slice(&(first.name.len() as u32 - 1).to_le_bytes());
            index.extend_from_slice(first.name);
            index_count += 1;
        }
        buf.clear();
        buf.extend_from_slice(&(n as u32 - 1).to_le_bytes());
        buf.extend_from_slice(&((first.inode_ref >> 16) as u32).to_le_bytes());
        buf.extend_from_slice(&first.number.to_le_bytes());
        dm.write(&buf)?;
        size += 12;
        for e in &rest[..n] {
            buf.clear();
            buf.extend_from_slice(&(e.inode_ref as u16).to_le_bytes());
            let diff = (i64::from(e.number) - i64::from(first.number)) as i16;
            buf.extend_from_slice(&diff.to_le_bytes());
            buf.extend_from_slice(&e.basic_type.to_le_bytes());
            buf.extend_from_slice(&(e.name.len() as u16 - 1).to_le_bytes());
            buf.extend_from_slice(e.name);
            dm.write(&buf)?;
            size += buf.len() as u64;
        }
        rest = &rest[n..];
    }
    Ok(Listing {
        start_block,
        offset,
        size,
        index,
        index_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("f{i:04}").into_bytes()).collect()
    }

    fn headers(listing: &[u8]) -> Vec<(u32, u32, u32)> {
        let mut out = Vec::new();
        let mut p = 0;
        while p < listing.len() {
            let w = |o: usize| u32::from_le_bytes(listing[p + o..p + o + 4].try_into().unwrap());
            let (count, start, base) = (w(0) + 1, w(4), w(8));
            out.push((count, start, base));
            p += 12;
            for _ in 0..count {
                let len = u16::from_le_bytes([listing[p + 6], listing[p + 7]]) as usize + 1;
                p += 8 + len;
            }
        }
        out
    }

    fn listing_of(entries: &[Entry]) -> (Listing, Vec<u8>) {
        let mut plain = Vec::new();
        let l = write_plain(&mut PlainSink(&mut plain), entries);
        (l, plain)
    }

    struct PlainSink<'a>(&'a mut Vec<u8>);

    /// The listing's bytes, uncompressed (same encoder, metablocks unpacked).
    fn write_plain(sink: &mut PlainSink, entries: &[Entry]) -> Listing {
        let mut dm = MetaWriter::new(Vec::new(), 3).unwrap();
        let l = write_listing(&mut dm, entries).unwrap();
        let (stream, _) = dm.finish().unwrap();
        let mut p = 0;
        while p < stream.len() {
            let h = u16::from_le_bytes([stream[p], stream[p + 1]]);
            let len = (h & 0x7fff) as usize;
            let body = &stream[p + 2..p + 2 + len];
            if h & 0x8000 != 0 {
                sink.0.extend_from_slice(body);
            } else {
                sink.0
                    .extend_from_slice(&zstd::bulk::decompress(body, METABLOCK_SIZE).unwrap());
            }
            p += 2 + len;
        }
        l
    }

    #[test]
    fn a_new_header_after_256_entries() {
        let names = names(600);
        let entries: Vec<Entry> = names
            .iter()
            .enumerate()
            .map(|(i, n)| Entry {
                name: n,
                inode_ref: (i as u64 * 20) % 8000,
                number: i as u32 + 1,
                basic_type: 2,
            })
            .collect();
        let (l, plain) = listing_of(&entries);
        assert_eq!(l.size as usize, plain.len());
        assert_eq!(
            headers(&plain),
            vec![(256, 0, 1), (256, 0, 257), (88, 0, 513)]
        );
        assert_eq!(l.index_count, 3);
        assert_eq!(l.size, 3 * 12 + 600 * (8 + 5));
    }

    #[test]
    fn a_new_header_when_the_inode_metablock_changes_or_numbers_jump() {
        let names = names(6);
        let refs = [
            0u64,
            8,
            100 << 16,
            (100 << 16) | 4,
            (100 << 16) | 8,
            (100 << 16) | 12,
        ];
        let numbers = [1u32, 2, 3, 4, 40_000, 40_001];
        let entries: Vec<Entry> = (0..6)
            .map(|i| Entry {
                name: &names[i],
                inode_ref: refs[i],
                number: numbers[i],
                basic_type: 1,
            })
            .collect();
        let (l, plain) = listing_of(&entries);
        assert_eq!(
            headers(&plain),
            vec![(2, 0, 1), (2, 100, 3), (2, 100, 40_000)]
        );
        assert_eq!(l.index_count, 0);
        // Entry fields: offset in the inode metablock, number delta, type, len - 1.
        let e = &plain[12 + 13..12 + 26];
        assert_eq!(&e[..8], &[8, 0, 1, 0, 1, 0, 4, 0]);
    }

    #[test]
    fn an_empty_directory_has_an_empty_listing() {
        let (l, plain) = listing_of(&[]);
        assert_eq!(l.size, 0);
        assert!(plain.is_empty());
    }
}
