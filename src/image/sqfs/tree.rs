//! The compact in-memory file tree: nodes in chunked vectors (no large
//! reallocation when they grow), names in one byte arena, and children found
//! by a hash of (parent id, name) in a table of u32 node ids.
//!
//! A node costs [`Node`]'s 48 bytes, its name's bytes, and 5.3 to 10.7
//! bytes (u32 slots, 3/8 to 3/4 full) of lookup table while the tree is
//! built.

use anyhow::{bail, Result};

/// "None" for u32 indexes (fragment, xattr, chains).
pub const NONE: u32 = u32::MAX;

/// The root directory's node id.
pub const ROOT: u32 = 0;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link (target in the arena).
    Symlink,
    /// A block device.
    BlockDev,
    /// A character device.
    CharDev,
    /// A named pipe.
    Fifo,
    /// A socket.
    Socket,
    /// A hard link: another name for the node it resolves to.
    HardLink,
}

impl Kind {
    /// The squashfs basic inode type.
    pub fn basic_type(self) -> u16 {
        use super::inode::types;
        match self {
            Kind::Dir => types::DIR,
            Kind::File | Kind::HardLink => types::FILE,
            Kind::Symlink => types::SYMLINK,
            Kind::BlockDev => types::BLKDEV,
            Kind::CharDev => types::CHRDEV,
            Kind::Fifo => types::FIFO,
            Kind::Socket => types::SOCKET,
        }
    }
}

/// Metadata every inode has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    /// Permission bits, incl. setuid, setgid and sticky.
    pub mode: u16,
    /// Index of the owner in the id table.
    pub uid_idx: u16,
    /// Index of the group in the id table.
    pub gid_idx: u16,
    /// Modification time (seconds since the epoch).
    pub mtime: u32,
    /// Index of the xattr set, or [`NONE`].
    pub xattr: u32,
}

/// One name in the tree. The `a`..`d` fields depend on the kind:
/// - file: `a`/`b` = size (low/high 32 bits), `c` = first data block's
///   sequence number, `d` = fragment index ([`NONE`] if none); the fragment
///   offset is in `e`;
/// - symlink: `a` = target's arena offset, `b` = its length;
/// - device: `a` = rdev (squashfs encoding);
/// - hard link: `a` = target path's arena offset, `b` = its length, `c` =
///   resolved node id;
/// - directory, at the end: `a` = first child in the sorted child list, `b` =
///   child count.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    /// Parent node id (the root is its own parent).
    pub parent: u32,
    /// Name's arena offset.
    pub name_off: u32,
    /// Name's length - 1 (names are 1..=256 bytes).
    pub name_len_m1: u8,
    /// What the node is.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u16,
    /// Owner's id table index.
    pub uid_idx: u16,
    /// Group's id table index.
    pub gid_idx: u16,
    /// Modification time.
    pub mtime: u32,
    /// Xattr set index or [`NONE`].
    pub xattr: u32,
    /// Names of the inode (1 + hard links to it).
    pub nlink: u32,
    /// Kind-specific, see the type's doc.
    pub a: u32,
    /// Kind-specific.
    pub b: u32,
    /// Kind-specific.
    pub c: u32,
    /// Kind-specific.
    pub d: u32,
    /// Kind-specific.
    pub e: u32,
}

impl Node {
    fn blank(parent: u32, name_off: u32, name_len_m1: u8, kind: Kind, meta: Meta) -> Node {
        let mut n = Node {
            parent,
            name_off,
            name_len_m1,
            kind,
            mode: 0,
            uid_idx: 0,
            gid_idx: 0,
            mtime: 0,
            xattr: NONE,
            nlink: 1,
            a: 0,
            b: 0,
            c: 0,
            d: NONE,
            e: 0,
        };
        n.set_meta(meta);
        n
    }

    /// Replaces the inode metadata.
    pub fn set_meta(&mut self, m: Meta) {
        self.mode = m.mode;
        self.uid_idx = m.uid_idx;
        self.gid_idx = m.gid_idx;
        self.mtime = m.mtime;
        self.xattr = m.xattr;
    }

    /// A file's size.
    pub fn file_size(&self) -> u64 {
        u64::from(self.a) | (u64::from(self.b) << 32)
    }
}

const CHUNK_LOG: u32 = 14;
const CHUNK: usize = 1 << CHUNK_LOG;
const ARENA_CHUNK: usize = 1 << 20;

/// A vector in fixed chunks: growing it never copies what it holds.
pub struct ChunkVec<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> ChunkVec<T> {
    fn new() -> Self {
        ChunkVec {
            chunks: Vec::new(),
            len: 0,
        }
    }

    fn push(&mut self, v: T) {
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks.last_mut().expect("a chunk").push(v);
        self.len += 1;
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.len() * CHUNK * std::mem::size_of::<T>()
    }
}

impl<T> std::ops::Index<u32> for ChunkVec<T> {
    type Output = T;
    fn index(&self, i: u32) -> &T {
        &self.chunks[(i >> CHUNK_LOG) as usize][i as usize & (CHUNK - 1)]
    }
}

impl<T> std::ops::IndexMut<u32> for ChunkVec<T> {
    fn index_mut(&mut self, i: u32) -> &mut T {
        &mut self.chunks[(i >> CHUNK_LOG) as usize][i as usize & (CHUNK - 1)]
    }
}

/// Byte strings in 1 MiB chunks, addressed by a u32 offset; a string never
/// spans chunks.
pub struct Arena {
    chunks: Vec<Vec<u8>>,
}

impl Arena {
    fn new() -> Self {
        Arena { chunks: Vec::new() }
    }

    /// Stores `s` and returns its offset.
    pub fn push(&mut self, s: &[u8]) -> Result<u32> {
        if s.len() > ARENA_CHUNK {
            bail!("a name or link target of {} bytes is too long", s.len());
        }
        let need_new = self
            .chunks
            .last()
            .is_none_or(|c| c.len() + s.len() > ARENA_CHUNK);
        if need_new {
            if self.chunks.len() >= (1 << (32 - 20)) {
                bail!("more than 4 GiB of names and link targets");
            }
            self.chunks.push(Vec::with_capacity(ARENA_CHUNK));
        }
        let index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[index];
        let off = (index * ARENA_CHUNK + chunk.len()) as u32;
        chunk.extend_from_slice(s);
        Ok(off)
    }

    /// The `len` bytes at `off`.
    pub fn get(&self, off: u32, len: usize) -> &[u8] {
        let chunk = &self.chunks[off as usize / ARENA_CHUNK];
        let start = off as usize % ARENA_CHUNK;
        &chunk[start..start + len]
    }

    /// Bytes allocated.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.len() * ARENA_CHUNK
    }
}

/// The hash of (parent, name): FNV-1a, then a 64-bit finaliser.
fn key(parent: u32, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in parent.to_le_bytes().iter().chain(name) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// The file tree.
pub struct Tree {
    /// All nodes; [`ROOT`] first.
    pub nodes: ChunkVec<Node>,
    /// Names and link targets.
    pub arena: Arena,
    /// Open-addressing hash table of node ids (by the hash of their parent
    /// and name), linear probing, a power of two long, at most 3/4 full.
    slots: Vec<u32>,
    /// Ids in `slots`.
    used: usize,
}

impl Tree {
    /// A tree with only the root directory, which has `meta`.
    pub fn new(meta: Meta) -> Self {
        let mut nodes = ChunkVec::new();
        nodes.push(Node::blank(ROOT, 0, 0, Kind::Dir, meta));
        Tree {
            nodes,
            arena: Arena::new(),
            slots: Vec::new(),
            used: 0,
        }
    }

    /// A node's name (empty for the root).
    pub fn name(&self, id: u32) -> &[u8] {
        if id == ROOT {
            return b"";
        }
        let n = &self.nodes[id];
        self.arena.get(n.name_off, n.name_len_m1 as usize + 1)
    }

    /// The child of `parent` called `name`.
    pub fn child(&self, parent: u32, name: &[u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = key(parent, name) as usize & mask;
        loop {
            let id = self.slots[i];
            if id == NONE {
                return None;
            }
            if self.nodes[id].parent == parent && self.name(id) == name {
                return Some(id);
            }
            i = (i + 1) & mask;
        }
    }

    /// Puts `id`, whose key is `k`, into the table, growing it first if
    /// it would be over 3/4 full.
    fn index(&mut self, id: u32, k: u64) {
        if (self.used + 1) * 4 > self.slots.len() * 3 {
            let size = (self.slots.len() * 2).max(1024);
            self.slots = vec![NONE; size];
            for other in 1..id {
                let n = &self.nodes[other];
                let k = key(n.parent, self.name(other));
                self.place(other, k);
            }
        }
        self.place(id, k);
        self.used = id as usize;
    }

    fn place(&mut self, id: u32, k: u64) {
        let mask = self.slots.len() - 1;
        let mut i = k as usize & mask;
        while self.slots[i] != NONE {
            i = (i + 1) & mask;
        }
        self.slots[i] = id;
    }

    /// Adds a child `name` of `parent` (which must not have one of that
    /// name) and returns its id.
    pub fn add_child(&mut self, parent: u32, name: &[u8], kind: Kind, meta: Meta) -> Result<u32> {
        if name.is_empty() || name.len() > 256 {
            bail!("a name must be 1 to 256 bytes, not {}", name.len());
        }
        let id = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&id| id < NONE)
            .ok_or_else(|| anyhow::anyhow!("too many files"))?;
        let name_off = self.arena.push(name)?;
        let k = key(parent, name);
        self.nodes.push(Node::blank(
            parent,
            name_off,
            (name.len() - 1) as u8,
            kind,
            meta,
        ));
        self.index(id, k);
        Ok(id)
    }

    /// The node at the path `components` (from the root), if any.
    pub fn find<'a>(&self, components: impl IntoIterator<Item = &'a [u8]>) -> Option<u32> {
        let mut id = ROOT;
        for c in components {
            id = self.child(id, c)?;
        }
        Some(id)
    }

    /// Drops the lookup table (after the last lookup).
    pub fn drop_lookup(&mut self) {
        self.slots = Vec::new();
    }

    /// Bytes the tree has allocated.
    pub fn heap_bytes(&self) -> usize {
        self.nodes.heap_bytes() + self.arena.heap_bytes() + self.slots.capacity() * 4
    }
}

/// Splits a tar path into its components: no leading `/` or `./`, `.`
/// components and empty ones (from `//` or a trailing `/`) dropped; `..`
/// and NUL bytes are refused.
pub fn split_path(path: &[u8]) -> Result<Vec<&[u8]>> {
    if path.contains(&0) {
        bail!("the path contains a NUL byte");
    }
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => bail!("the path has a '..' component"),
            c if c.len() > 256 => bail!("a path component is longer than 256 bytes"),
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_found_by_parent_and_name() {
        let mut t = Tree::new(Meta::default());
        let a = t.add_child(ROOT, b"a", Kind::Dir, Meta::default()).unwrap();
        let b = t.add_child(a, b"b", Kind::File, Meta::default()).unwrap();
        let b2 = t
            .add_child(ROOT, b"b", Kind::File, Meta::default())
            .unwrap();
        assert_eq!(t.child(ROOT, b"a"), Some(a));
        assert_eq!(t.child(a, b"b"), Some(b));
        assert_eq!(t.child(ROOT, b"b"), Some(b2));
        assert_eq!(t.child(b, b"b"), None);
        assert_eq!(t.find([&b"a"[..], b"b"]), Some(b));
        assert_eq!(t.name(b), b"b");
        assert!(
            std::mem::size_of::<Node>() <= 48,
            "{}",
            std::mem::size_of::<Node>()
        );
    }

    #[test]
    fn many_nodes_cross_chunks() {
        let mut t = Tree::new(Meta::default());
        for i in 0..40_000u32 {
            t.add_child(
                ROOT,
                format!("n{i}").as_bytes(),
                Kind::File,
                Meta::default(),
            )
            .unwrap();
        }
        assert_eq!(
            t.child(ROOT, b"n39999").map(|id| t.name(id).to_vec()),
            Some(b"n39999".to_vec())
        );
        assert_eq!(t.child(ROOT, b"n40000"), None);
    }

    #[test]
    fn paths_are_normalised_and_dotdot_refused() {
        assert_eq!(split_path(b"./a//b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert!(split_path(b".").unwrap().is_empty());
        assert!(split_path(b"/a").unwrap() == vec![&b"a"[..]]);
        assert!(split_path(b"a/../b").is_err());
        assert!(split_path(b"a\0b").is_err());
    }
}
