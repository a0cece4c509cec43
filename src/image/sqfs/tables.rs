//! The id table, fragment table, xattr tables and the superblock.

use std::collections::HashMap;
use std::io::{self, Write};

use anyhow::{bail, Result};

use super::metablock::{write_indexed_table, Counting, MetaWriter, METABLOCK_SIZE};

/// The superblock's size; data starts right after it.
pub const SUPERBLOCK_SIZE: u64 = 96;

/// "No such table".
pub const NO_TABLE: u64 = u64::MAX;

/// Superblock flag: there are no xattrs.
pub const FLAG_NO_XATTRS: u16 = 0x0200;

/// Superblock flag: file tails are packed into fragments.
pub const FLAG_ALWAYS_FRAGMENTS: u16 = 0x0020;

/// Compression id of zstd.
pub const ZSTD: u16 = 6;

/// The squashfs 4.0 superblock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Superblock {
    /// Inodes (unique, hard links counted once).
    pub inode_count: u32,
    /// Creation time.
    pub mod_time: u32,
    /// Data block size.
    pub block_size: u32,
    /// Fragment blocks.
    pub fragment_count: u32,
    /// Superblock flags.
    pub flags: u16,
    /// Entries in the id table.
    pub id_count: u16,
    /// Reference of the root directory's inode.
    pub root_inode: u64,
    /// Image size without the padding.
    pub bytes_used: u64,
    /// Position of the id table's index.
    pub id_table_start: u64,
    /// Position of the xattr id table ([`NO_TABLE`] if none).
    pub xattr_id_table_start: u64,
    /// Position of the inode table.
    pub inode_table_start: u64,
    /// Position of the directory table.
    pub directory_table_start: u64,
    /// Position of the fragment table's index.
    pub fragment_table_start: u64,
}

impl Superblock {
    /// The 96 bytes on disk.
    pub fn to_bytes(&self) -> [u8; 96] {
        let mut b = Vec::with_capacity(96);
        b.extend_from_slice(&0x7371_7368u32.to_le_bytes());
        b.extend_from_slice(&self.inode_count.to_le_bytes());
        b.extend_from_slice(&self.mod_time.to_le_bytes());
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.fragment_count.to_le_bytes());
        b.extend_from_slice(&ZSTD.to_le_bytes());
        b.extend_from_slice(&(self.block_size.trailing_zeros() as u16).to_le_bytes());
        b.extend_from_slice(&self.flags.to_le_bytes());
        b.extend_from_slice(&self.id_count.to_le_bytes());
        b.extend_from_slice(&4u16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        for v in [
            self.root_inode,
            self.bytes_used,
            self.id_table_start,
            self.xattr_id_table_start,
            self.inode_table_start,
            self.directory_table_start,
            self.fragment_table_start,
            NO_TABLE,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.try_into().expect("96 bytes")
    }
}

/// The uids and gids in use, numbered as they are first seen.
#[derive(Default)]
pub struct IdTable {
    ids: Vec<u32>,
    index: HashMap<u32, u16>,
}

impl IdTable {
    /// The index of `id`, added if new.
    pub fn intern(&mut self, id: u32) -> Result<u16> {
        if let Some(&i) = self.index.get(&id) {
            return Ok(i);
        }
        if self.ids.len() > usize::from(u16::MAX) {
            bail!("more than 65536 distinct uids and gids (squashfs's limit)");
        }
        let i = self.ids.len() as u16;
        self.ids.push(id);
        self.index.insert(id, i);
        Ok(i)
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Writes the table; returns the position of its index.
    pub fn write<W: Write>(&self, out: &mut Counting<W>, level: i32) -> io::Result<u64> {
        let bytes: Vec<u8> = self.ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        write_indexed_table(out, &bytes, level)
    }
}

/// Writes the fragment table (entries of each fragment block's position and
/// stored size); returns the position of its index.
pub fn write_fragment_table<W: Write>(
    out: &mut Counting<W>,
    fragments: impl Iterator<Item = (u64, u32)>,
    level: i32,
) -> io::Result<u64> {
    let mut bytes = Vec::new();
    for (start, size) in fragments {
        bytes.extend_from_slice(&start.to_le_bytes());
        bytes.extend_from_slice(&size.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
    }
    write_indexed_table(out, &bytes, level)
}

/// The xattr prefix id of a full xattr name and the rest of the name:
/// `user.` 0, `trusted.` 1, `security.` 2.
pub fn xattr_prefix(name: &[u8]) -> Option<(u16, &[u8])> {
    [
        (b"user.".as_slice(), 0),
        (b"trusted.", 1),
        (b"security.", 2),
    ]
    .into_iter()
    .find_map(|(p, id)| name.strip_prefix(p).map(|rest| (id, rest)))
    .filter(|(_, rest)| !rest.is_empty() && rest.len() <= usize::from(u16::MAX))
}

/// Distinct xattr sets, each stored once, as their key/value bytes on disk.
#[derive(Default)]
pub struct XattrTable {
    sets: HashMap<Vec<u8>, (u32, u32)>,
}

impl XattrTable {
    /// The index of the set `pairs` ((prefix id, name without prefix,
    /// value)), added if new. The order of `pairs` does not matter.
    pub fn intern(&mut self, mut pairs: Vec<(u16, Vec<u8>, Vec<u8>)>) -> Result<u32> {
        pairs.sort();
        pairs.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        let mut bytes = Vec::new();
        for (kind, name, value) in &pairs {
            let value_len = u32::try_from(value.len())
                .ok()
                .filter(|&l| l < (1 << 30))
                .ok_or_else(|| anyhow::anyhow!("an xattr value is too large"))?;
            bytes.extend_from_slice(&kind.to_le_bytes());
            bytes.extend_from_slice(&(name.len() as u16).to_le_bytes());
            bytes.extend_from_slice(name);
            bytes.extend_from_slice(&value_len.to_le_bytes());
            bytes.extend_from_slice(value);
        }
        let next = self.sets.len() as u32;
        Ok(self
            .sets
            .entry(bytes)
            .or_insert((next, pairs.len() as u32))
            .0)
    }

    /// Number of distinct sets.
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Writes the key/value table and the xattr id table; returns the
    /// position of the xattr id table header.
    pub fn write<W: Write>(&self, out: &mut Counting<W>, level: i32) -> io::Result<u64> {
        let mut sets: Vec<(&[u8], u32, u32)> = self
            .sets
            .iter()
            .map(|(bytes, &(id, count))| (bytes.as_slice(), id, count))
            .collect();
        sets.sort_by_key(|s| s.1);
        let kv_start = out.position();
        let mut ids = Vec::with_capacity(sets.len() * 16);
        let mut mw = MetaWriter::new(&mut *out, level)?;
        for (bytes, _, count) in &sets {
            ids.extend_from_slice(&mw.reference().to_le_bytes());
            ids.extend_from_slice(&count.to_le_bytes());
            ids.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            mw.write(bytes)?;
        }
        mw.finish()?;
        let mut positions = Vec::new();
        for chunk in ids.chunks(METABLOCK_SIZE) {
            positions.push(out.position());
            let mut mw = MetaWriter::new(&mut *out, level)?;
            mw.write(chunk)?;
            mw.finish()?;
        }
        let table = out.position();
        out.write_all(&kv_start.to_le_bytes())?;
        out.write_all(&(sets.len() as u32).to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        for p in positions {
            out.write_all(&p.to_le_bytes())?;
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_layout() {
        let sb = Superblock {
            inode_count: 5,
            block_size: 131072,
            fragment_count: 1,
            id_count: 2,
            root_inode: 0x1234_0010,
            bytes_used: 4000,
            xattr_id_table_start: NO_TABLE,
            ..Superblock::default()
        };
        let b = sb.to_bytes();
        assert_eq!(&b[0..4], b"hsqs");
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 131072);
        assert_eq!(u16::from_le_bytes([b[20], b[21]]), 6);
        assert_eq!(u16::from_le_bytes([b[22], b[23]]), 17);
        assert_eq!(u16::from_le_bytes([b[26], b[27]]), 2);
        assert_eq!(u16::from_le_bytes([b[28], b[29]]), 4);
        assert_eq!(
            u64::from_le_bytes(b[32..40].try_into().unwrap()),
            0x1234_0010
        );
        assert_eq!(u64::from_le_bytes(b[40..48].try_into().unwrap()), 4000);
        assert_eq!(u64::from_le_bytes(b[88..96].try_into().unwrap()), NO_TABLE);
    }

    #[test]
    fn ids_and_xattr_sets_are_shared() {
        let mut ids = IdTable::default();
        assert_eq!(ids.intern(0).unwrap(), 0);
        assert_eq!(ids.intern(70_000).unwrap(), 1);
        assert_eq!(ids.intern(0).unwrap(), 0);
        let mut x = XattrTable::default();
        let a = x
            .intern(vec![
                (0, b"a".to_vec(), b"1".to_vec()),
                (2, b"capability".to_vec(), vec![1, 0]),
            ])
            .unwrap();
        let b = x
            .intern(vec![
                (2, b"capability".to_vec(), vec![1, 0]),
                (0, b"a".to_vec(), b"1".to_vec()),
            ])
            .unwrap();
        let c = x.intern(vec![(0, b"a".to_vec(), b"2".to_vec())]).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(x.len(), 2);
        assert_eq!(
            xattr_prefix(b"security.capability"),
            Some((2, &b"capability"[..]))
        );
        assert_eq!(xattr_prefix(b"system.posix_acl_access"), None);
        assert_eq!(xattr_prefix(b"user."), None);
    }

    #[test]
    fn indexed_tables_split_into_metablocks() {
        // 3000 ids: 12000 bytes, two metablocks.
        let mut ids = IdTable::default();
        for i in 0..3000 {
            ids.intern(i * 7).unwrap();
        }
        let mut out = Counting::new(Vec::new(), 1000);
        let index = ids.write(&mut out, 3).unwrap();
        let bytes = out.into_inner();
        let at = (index - 1000) as usize;
        assert_eq!(bytes.len(), at + 16);
        let first = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let second = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        assert_eq!(first, 1000);
        let header = u16::from_le_bytes([bytes[0], bytes[1]]);
        assert_eq!(second, 1000 + 2 + u64::from(header & 0x7fff));
    }
}
