//! Collecting the file system: entries go into the tree (file data straight
//! to the data writer), hard links are resolved and inodes numbered at the
//! end, and then every table is written after the data.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};

use anyhow::{anyhow, bail, Context, Result};

use super::data::{DataWriter, Positions};
use super::dirtable::{write_listing, Entry};
use super::inode::{self, Header};
use super::metablock::{Counting, MetaWriter};
use super::order;
use super::tables::{self, IdTable, Superblock, XattrTable, NO_TABLE, SUPERBLOCK_SIZE};
use super::tree::{split_path, Kind, Meta, Tree, NONE, ROOT};
use super::{WriteStats, WriterOptions};

/// Metadata of an entry as the tar header gives it.
#[derive(Debug, Clone, Default)]
pub struct EntryMeta {
    /// Permission bits (the file type bits are ignored).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time.
    pub mtime: u32,
    /// Xattrs: (prefix id, name without prefix, value).
    pub xattrs: Vec<(u16, Vec<u8>, Vec<u8>)>,
}

/// Builds one image.
pub struct Builder {
    tree: Tree,
    ids: IdTable,
    xattrs: XattrTable,
    data: DataWriter,
    block_size: u32,
    level: i32,
    /// Statistics so far.
    pub stats: WriteStats,
}

impl Builder {
    /// A builder writing to `out`.
    pub fn new(out: File, options: &WriterOptions) -> Result<Self> {
        let bs = options.block_size;
        if !bs.is_power_of_two() || !(4096..=1 << 20).contains(&bs) {
            bail!("the block size must be a power of two from 4 KiB to 1 MiB, not {bs}");
        }
        let mut ids = IdTable::default();
        let root_meta = Meta {
            mode: 0o755,
            uid_idx: ids.intern(0)?,
            gid_idx: ids.intern(0)?,
            mtime: 0,
            xattr: NONE,
        };
        let mut out = out;
        out.seek(SeekFrom::Start(SUPERBLOCK_SIZE))
            .context("cannot seek in the image")?;
        let data = DataWriter::new(out, SUPERBLOCK_SIZE, bs, options.jobs, options.zstd_level)?;
        Ok(Builder {
            tree: Tree::new(root_meta),
            ids,
            xattrs: XattrTable::default(),
            data,
            block_size: bs,
            level: options.zstd_level,
            stats: WriteStats::default(),
        })
    }

    fn meta(&mut self, m: EntryMeta) -> Result<Meta> {
        Ok(Meta {
            mode: (m.mode & 0o7777) as u16,
            uid_idx: self.ids.intern(m.uid)?,
            gid_idx: self.ids.intern(m.gid)?,
            mtime: m.mtime,
            xattr: if m.xattrs.is_empty() {
                NONE
            } else {
                self.xattrs.intern(m.xattrs)?
            },
        })
    }

    /// Adds `path` as a node of `kind`: missing parents are made (0755,
    /// root-owned, mtime 0); a directory that exists takes the new metadata.
    fn insert(&mut self, path: &[u8], kind: Kind, meta: EntryMeta) -> Result<u32> {
        self.stats.entries += 1;
        let meta = self.meta(meta)?;
        let comps = split_path(path)?;
        let Some((last, parents)) = comps.split_last() else {
            if kind != Kind::Dir {
                bail!("the root of the image must be a directory");
            }
            self.tree.nodes[ROOT].set_meta(meta);
            return Ok(ROOT);
        };
        let mut dir = ROOT;
        for (i, c) in parents.iter().enumerate() {
            dir = match self.tree.child(dir, c) {
                Some(id) if self.tree.nodes[id].kind == Kind::Dir => id,
                Some(_) => bail!(
                    "{} is not a directory",
                    String::from_utf8_lossy(&parents[..=i].join(&b'/'))
                ),
                None => {
                    let implicit = Meta {
                        mode: 0o755,
                        uid_idx: self.ids.intern(0)?,
                        gid_idx: self.ids.intern(0)?,
                        mtime: 0,
                        xattr: NONE,
                    };
                    self.tree.add_child(dir, c, Kind::Dir, implicit)?
                }
            };
        }
        match self.tree.child(dir, last) {
            Some(id) if kind == Kind::Dir && self.tree.nodes[id].kind == Kind::Dir => {
                self.tree.nodes[id].set_meta(meta);
                Ok(id)
            }
            Some(_) => bail!("the path is in the tar twice"),
            None => self.tree.add_child(dir, last, kind, meta),
        }
    }

    /// Adds a directory.
    pub fn add_dir(&mut self, path: &[u8], meta: EntryMeta) -> Result<()> {
        self.insert(path, Kind::Dir, meta).map(drop)
    }

    /// Adds a regular file of `size` bytes, read from `content`.
    pub fn add_file(
        &mut self,
        path: &[u8],
        meta: EntryMeta,
        content: &mut impl Read,
        size: u64,
    ) -> Result<()> {
        let id = self.insert(path, Kind::File, meta)?;
        let d = self.data.add_file(content, size)?;
        self.stats.bytes += size;
        let n = &mut self.tree.nodes[id];
        n.a = size as u32;
        n.b = (size >> 32) as u32;
        n.c = d.first_unit;
        n.d = d.fragment;
        n.e = d.fragment_offset;
        Ok(())
    }

    /// Adds a symbolic link to `target`.
    pub fn add_symlink(&mut self, path: &[u8], meta: EntryMeta, target: &[u8]) -> Result<()> {
        if target.is_empty() || target.len() > 4095 || target.contains(&0) {
            bail!("a symlink target must be 1 to 4095 bytes without NUL");
        }
        let id = self.insert(path, Kind::Symlink, meta)?;
        let off = self.tree.arena.push(target)?;
        let n = &mut self.tree.nodes[id];
        n.a = off;
        n.b = target.len() as u32;
        Ok(())
    }

    /// Adds a block (`block`) or character device.
    pub fn add_device(
        &mut self,
        path: &[u8],
        meta: EntryMeta,
        block: bool,
        major: u32,
        minor: u32,
    ) -> Result<()> {
        let kind = if block { Kind::BlockDev } else { Kind::CharDev };
        let id = self.insert(path, kind, meta)?;
        self.tree.nodes[id].a = inode::encode_rdev(major, minor);
        Ok(())
    }

    /// Adds a fifo, or a socket (`socket`).
    pub fn add_ipc(&mut self, path: &[u8], meta: EntryMeta, socket: bool) -> Result<()> {
        let kind = if socket { Kind::Socket } else { Kind::Fifo };
        self.insert(path, kind, meta).map(drop)
    }

    /// Adds a hard link to `target` (a path in the tar, resolved at the end).
    pub fn add_hardlink(&mut self, path: &[u8], target: &[u8]) -> Result<()> {
        let normal = split_path(target)
            .with_context(|| format!("hard link target {}", String::from_utf8_lossy(target)))?
            .join(&b'/');
        let id = self.insert(path, Kind::HardLink, EntryMeta::default())?;
        let off = self.tree.arena.push(&normal)?;
        let n = &mut self.tree.nodes[id];
        n.a = off;
        n.b = normal.len() as u32;
        Ok(())
    }

    fn path_of(&self, id: u32) -> String {
        path_of(&self.tree, id)
    }

    /// Points every hard link at the inode it names and counts the names.
    fn resolve_hardlinks(&mut self) -> Result<()> {
        for id in 1..self.tree.nodes.len() as u32 {
            if self.tree.nodes[id].kind != Kind::HardLink {
                continue;
            }
            let mut t = id;
            for _ in 0..=64 {
                let n = self.tree.nodes[t];
                if n.kind != Kind::HardLink {
                    break;
                }
                let target = self.tree.arena.get(n.a, n.b as usize);
                let found = split_path(target)
                    .ok()
                    .and_then(|comps| self.tree.find(comps.iter().copied()));
                t = found.ok_or_else(|| {
                    anyhow!(
                        "hard link {}: its target {} is not in the tar",
                        self.path_of(id),
                        String::from_utf8_lossy(target)
                    )
                })?;
            }
            match self.tree.nodes[t].kind {
                Kind::HardLink => bail!("hard link {}: a loop of hard links", self.path_of(id)),
                Kind::Dir => bail!("hard link {}: its target is a directory", self.path_of(id)),
                _ => {}
            }
            self.tree.nodes[id].c = t;
            self.tree.nodes[t].nlink += 1;
        }
        Ok(())
    }

    /// Resolves hard links, writes the inode, directory, fragment, id and
    /// xattr tables and the superblock, and pads the image to 4 KiB.
    pub fn finish(mut self) -> Result<WriteStats> {
        self.resolve_hardlinks()?;
        let mut metadata_bytes = self.tree.heap_bytes();
        self.tree.drop_lookup();
        let data = self.data.finish()?;
        let mut stats = self.stats;
        stats.data_blocks = data.data_blocks;
        stats.sparse_blocks = data.sparse_blocks;
        stats.fragments = data.fragment_units.len() as u64;
        let positions = Positions::new(SUPERBLOCK_SIZE, data.sizes);
        let children = order::sort_children(&mut self.tree);
        let tree = &self.tree;
        let nodes = tree.nodes.len();
        let kids = |d: u32| order::children_range(tree, d);
        let (order, number) = order::inode_order(tree, &children);
        let inode_count = u32::try_from(order.len()).map_err(|_| anyhow!("too many inodes"))?;
        metadata_bytes = metadata_bytes.max(
            tree.nodes.heap_bytes()
                + tree.arena.heap_bytes()
                + (children.capacity() + number.capacity() + order.capacity()) * 4
                + nodes * 8,
        );

        // Inodes in that order, each directory's listing just before its inode.
        let mut out = Counting::new(BufWriter::with_capacity(1 << 20, data.file), data.end);
        let inode_table_start = out.position();
        let mut refs = vec![0u64; nodes];
        let mut im = MetaWriter::new(&mut out, self.level)?;
        let mut dm = MetaWriter::new(Vec::new(), self.level)?;
        let mut buf = Vec::with_capacity(256);
        let mut entries = Vec::new();
        let bs = u64::from(self.block_size);
        for &id in &order {
            let n = tree.nodes[id];
            let h = Header {
                mode: n.mode,
                uid_idx: n.uid_idx,
                gid_idx: n.gid_idx,
                mtime: n.mtime,
                number: number[id as usize],
            };
            buf.clear();
            match n.kind {
                Kind::Dir => {
                    entries.clear();
                    let mut subdirs = 0u32;
                    for &c in &children[kids(id)] {
                        let t = if tree.nodes[c].kind == Kind::HardLink {
                            tree.nodes[c].c
                        } else {
                            c
                        };
                        let kind = tree.nodes[t].kind;
                        subdirs += u32::from(kind == Kind::Dir);
                        entries.push(Entry {
                            name: tree.name(c),
                            inode_ref: refs[t as usize],
                            number: number[t as usize],
                            basic_type: kind.basic_type(),
                        });
                    }
                    let listing = write_listing(&mut dm, &entries)?;
                    let dir = inode::Dir {
                        start_block: u32::try_from(listing.start_block)
                            .map_err(|_| anyhow!("the directory table is over 4 GiB"))?,
                        offset: listing.offset,
                        file_size: u32::try_from(listing.size + 3)
                            .map_err(|_| anyhow!("directory {} is too large", path_of(tree, id)))?,
                        nlink: 2 + subdirs,
                        parent: if id == ROOT {
                            inode_count + 1
                        } else {
                            number[n.parent as usize]
                        },
                        xattr: n.xattr,
                    };
                    inode::dir(&mut buf, &h, &dir, &listing.index, listing.index_count);
                }
                Kind::File => {
                    let size = n.file_size();
                    let blocks = (size / bs) as usize;
                    let sizes = positions.sizes(n.c, blocks);
                    let sparse = sizes.iter().filter(|&&s| s == 0).count() as u64 * bs;
                    let file = inode::RegFile {
                        start: if blocks > 0 {
                            positions.position(n.c)
                        } else {
                            0
                        },
                        size,
                        sparse,
                        nlink: n.nlink,
                        fragment: n.d,
                        fragment_offset: n.e,
                        xattr: n.xattr,
                    };
                    inode::file(&mut buf, &h, &file, sizes);
                }
                Kind::Symlink => {
                    let target = tree.arena.get(n.a, n.b as usize);
                    inode::symlink(&mut buf, &h, n.nlink, target, n.xattr);
                }
                Kind::BlockDev | Kind::CharDev => {
                    inode::device(&mut buf, &h, n.kind.basic_type(), n.nlink, n.a, n.xattr);
                }
                Kind::Fifo | Kind::Socket => {
                    inode::ipc(&mut buf, &h, n.kind.basic_type(), n.nlink, n.xattr);
                }
                Kind::HardLink => unreachable!("hard links have no inode"),
            }
            refs[id as usize] = im.reference();
            im.write(&buf)?;
        }
        let root_inode = refs[ROOT as usize];
        im.finish()?;
        let (dir_table, _) = dm.finish()?;
        drop(refs);
        drop(children);
        drop(order);
        drop(number);

        let directory_table_start = out.position();
        out.write_all(&dir_table)?;
        drop(dir_table);
        let fragment_table_start = tables::write_fragment_table(
            &mut out,
            data.fragment_units
                .iter()
                .map(|&u| (positions.position(u), positions.size(u))),
            self.level,
        )?;
        let id_table_start = self.ids.write(&mut out, self.level)?;
        let xattr_id_table_start = if self.xattrs.is_empty() {
            NO_TABLE
        } else {
            self.xattrs.write(&mut out, self.level)?
        };
        let bytes_used = out.position();
        let padded = bytes_used.div_ceil(4096) * 4096;
        out.write_all(&vec![0; (padded - bytes_used) as usize])?;
        let mut file = out
            .into_inner()
            .into_inner()
            .map_err(|e| e.into_error())
            .context("cannot write the image's tables")?;
        let sb = Superblock {
            inode_count,
            mod_time: 0,
            block_size: self.block_size,
            fragment_count: stats.fragments as u32,
            flags: tables::FLAG_ALWAYS_FRAGMENTS
                | if self.xattrs.is_empty() {
                    tables::FLAG_NO_XATTRS
                } else {
                    0
                },
            id_count: self.ids.len() as u16,
            root_inode,
            bytes_used,
            id_table_start,
            xattr_id_table_start,
            inode_table_start,
            directory_table_start,
            fragment_table_start,
        };
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&sb.to_bytes())?;
        file.flush()?;
        stats.inodes = u64::from(inode_count);
        stats.image_size = padded;
        stats.xattr_sets = self.xattrs.len() as u64;
        stats.ids = self.ids.len() as u64;
        stats.metadata_bytes = metadata_bytes as u64;
        Ok(stats)
    }
}

/// A node's path, for messages.
fn path_of(tree: &Tree, mut id: u32) -> String {
    let mut parts = Vec::new();
    while id != ROOT {
        parts.push(String::from_utf8_lossy(tree.name(id)).into_owned());
        id = tree.nodes[id].parent;
    }
    parts.reverse();
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}
