//! The image's paths as a tree of interned names, with the flattener's
//! per-path state packed beside each one.
//!
//! An image of a million files has a million paths, most of them long
//! (`usr/lib/python3/dist-packages/...`). Kept as one owned byte string per
//! path in several hash maps they cost a few hundred bytes each; here a path
//! is a node (its parent's id and its own name's place in one byte arena, 20
//! bytes) found through one table of 64-bit name hashes (about 16 to 32 bytes
//! a path), and each name is stored once however many paths lie below it.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};

/// A path's id: its index in [`Paths`]; the root is [`ROOT`].
pub(super) type PathId = u32;

/// The root (`b""`).
pub(super) const ROOT: PathId = 0;

/// What the output holds at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Out {
    /// Nothing (yet, or no more).
    Nothing,
    /// A directory with no entry of its own (written at the end).
    Implicit,
    /// A directory entry.
    Dir,
    /// A non-directory.
    NonDir,
}

/// What the layer being read holds at a path, for hard links naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Local {
    /// Nothing.
    Nothing,
    /// A directory.
    Dir,
    /// A non-directory entry: its tar ordinal and whether it was written.
    Entry { ordinal: u32, written: bool },
    /// A hard link: its source is kept by the flattener.
    Link,
}

/// One path: where its name lies in the arena, and the flattener's state.
#[derive(Debug, Clone, Copy)]
struct Node {
    parent: PathId,
    name_start: u32,
    name_len: u32,
    /// Marks the layers above the current one left here.
    upper: u8,
    /// Marks of the current layer (moved to `upper` when it ends).
    pending: u8,
    out: Out,
    local: Local,
}

/// A hasher for keys that already are hashes.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The tree of every path the flattener has met, with its state.
pub(super) struct Paths {
    nodes: Vec<Node>,
    names: Vec<u8>,
    /// Hash of (parent, name) -> the path with that hash.
    by_hash: HashMap<u64, PathId, BuildHasherDefault<PassThrough>>,
    /// Paths whose hash another path already had (rare: 64-bit collisions).
    collided: HashMap<(PathId, Vec<u8>), PathId>,
    hasher: RandomState,
    /// Bits of the hash kept: all but in tests, which make every hash collide.
    hash_mask: u64,
    /// Paths whose `pending` or `local` the current layer set.
    touched: Vec<PathId>,
}

impl Paths {
    /// A tree holding only the root.
    pub(super) fn new() -> Paths {
        Paths {
            nodes: vec![Node {
                parent: ROOT,
                name_start: 0,
                name_len: 0,
                upper: 0,
                pending: 0,
                out: Out::Nothing,
                local: Local::Nothing,
            }],
            names: Vec::new(),
            by_hash: HashMap::default(),
            collided: HashMap::new(),
            hasher: RandomState::new(),
            hash_mask: u64::MAX,
            touched: Vec::new(),
        }
    }

    fn name(&self, id: PathId) -> &[u8] {
        let node = &self.nodes[id as usize];
        &self.names[node.name_start as usize..(node.name_start + node.name_len) as usize]
    }

    fn hash(&self, parent: PathId, name: &[u8]) -> u64 {
        self.hasher.hash_one((parent, name)) & self.hash_mask
    }

    /// The child `name` of `parent`, if met before.
    pub(super) fn child(&self, parent: PathId, name: &[u8]) -> Option<PathId> {
        let hash = self.hash(parent, name);
        let id = *self.by_hash.get(&hash)?;
        if self.nodes[id as usize].parent == parent && self.name(id) == name {
            return Some(id);
        }
        self.collided.get(&(parent, name.to_vec())).copied()
    }

    /// The child `name` of `parent`, made when new.
    pub(super) fn child_or_new(&mut self, parent: PathId, name: &[u8]) -> PathId {
        if let Some(id) = self.child(parent, name) {
            return id;
        }
        let id = PathId::try_from(self.nodes.len()).expect("fewer than 2^32 paths");
        let name_start = u32::try_from(self.names.len()).expect("less than 4 GiB of names");
        self.names.extend_from_slice(name);
        self.nodes.push(Node {
            parent,
            name_start,
            name_len: name.len() as u32,
            upper: 0,
            pending: 0,
            out: Out::Nothing,
            local: Local::Nothing,
        });
        let hash = self.hash(parent, name);
        match self.by_hash.entry(hash) {
            Entry::Vacant(slot) => {
                slot.insert(id);
            }
            Entry::Occupied(_) => {
                self.collided.insert((parent, name.to_vec()), id);
            }
        }
        id
    }

    /// The id of the normalised `path` (see [`super::normalize`]), made
    /// with its ancestors when new; `chain` gets the ancestors' ids, root
    /// first (the root included, the path itself not).
    pub(super) fn resolve(&mut self, path: &[u8], chain: &mut Vec<PathId>) -> PathId {
        chain.clear();
        let mut id = ROOT;
        if path.is_empty() {
            return id;
        }
        for name in path.split(|b| *b == b'/') {
            chain.push(id);
            id = self.child_or_new(id, name);
        }
        id
    }

    /// The id of the normalised `path`, if met before.
    #[cfg(test)]
    pub(super) fn find(&self, path: &[u8]) -> Option<PathId> {
        if path.is_empty() {
            return Some(ROOT);
        }
        path.split(|b| *b == b'/')
            .try_fold(ROOT, |id, name| self.child(id, name))
    }

    /// The normalised path of `id` (`b""` for the root).
    pub(super) fn path(&self, id: PathId) -> Vec<u8> {
        let mut ids = Vec::new();
        let mut at = id;
        while at != ROOT {
            ids.push(at);
            at = self.nodes[at as usize].parent;
        }
        let mut out = Vec::new();
        for (i, id) in ids.iter().rev().enumerate() {
            if i > 0 {
                out.push(b'/');
            }
            out.extend_from_slice(self.name(*id));
        }
        out
    }

    /// Marks the layers above the current one left at `id`.
    pub(super) fn upper(&self, id: PathId) -> u8 {
        self.nodes[id as usize].upper
    }

    /// Marks the current layer left at `id`.
    pub(super) fn pending(&self, id: PathId) -> u8 {
        self.nodes[id as usize].pending
    }

    /// Adds `marks` to the current layer's marks at `id`.
    pub(super) fn add_pending(&mut self, id: PathId, marks: u8) {
        let node = &mut self.nodes[id as usize];
        if node.pending == 0 && node.local == Local::Nothing {
            self.touched.push(id);
        }
        node.pending |= marks;
    }

    /// What the current layer holds at `id`.
    pub(super) fn local(&self, id: PathId) -> Local {
        self.nodes[id as usize].local
    }

    /// Records what the current layer holds at `id`.
    pub(super) fn set_local(&mut self, id: PathId, local: Local) {
        let node = &mut self.nodes[id as usize];
        if node.pending == 0 && node.local == Local::Nothing {
            self.touched.push(id);
        }
        node.local = local;
    }

    /// Ends the current layer: its marks apply to the layers below, and
    /// what it held is forgotten.
    pub(super) fn end_layer(&mut self) {
        for id in std::mem::take(&mut self.touched) {
            let node = &mut self.nodes[id as usize];
            node.upper |= node.pending;
            node.pending = 0;
            node.local = Local::Nothing;
        }
    }

    /// What the output holds at `id`.
    pub(super) fn out(&self, id: PathId) -> Out {
        self.nodes[id as usize].out
    }

    /// Records what the output holds at `id`.
    pub(super) fn set_out(&mut self, id: PathId, out: Out) {
        self.nodes[id as usize].out = out;
    }

    /// The paths the output holds, root excluded.
    pub(super) fn out_count(&self) -> usize {
        self.nodes[1..]
            .iter()
            .filter(|n| n.out != Out::Nothing)
            .count()
    }

    /// The ids of the paths where the output holds `out`.
    pub(super) fn with_out(&self, out: Out) -> impl Iterator<Item = PathId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(move |(_, n)| n.out == out)
            .map(|(i, _)| i as PathId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_and_share_their_ancestors() {
        let mut paths = Paths::new();
        let mut chain = Vec::new();
        let a = paths.resolve(b"usr/lib/a.so", &mut chain);
        assert_eq!(chain.len(), 3);
        assert_eq!(chain[0], ROOT);
        let b = paths.resolve(b"usr/lib/b.so", &mut chain);
        assert_ne!(a, b);
        assert_eq!(paths.path(a), b"usr/lib/a.so");
        assert_eq!(paths.path(b), b"usr/lib/b.so");
        assert_eq!(paths.path(ROOT), b"");
        assert_eq!(paths.find(b"usr/lib"), Some(chain[2]));
        assert_eq!(paths.find(b"usr/lib/c.so"), None);
        assert_eq!(paths.find(b""), Some(ROOT));
        // usr, lib, a.so, b.so: names stored once.
        assert_eq!(paths.names, b"usrliba.sob.so");
    }

    #[test]
    fn a_layer_s_marks_apply_below_it_only_after_it_ends() {
        let mut paths = Paths::new();
        let mut chain = Vec::new();
        let id = paths.resolve(b"etc/passwd", &mut chain);
        paths.add_pending(id, 4);
        paths.set_local(
            id,
            Local::Entry {
                ordinal: 7,
                written: true,
            },
        );
        assert_eq!(paths.upper(id), 0);
        paths.end_layer();
        assert_eq!(paths.upper(id), 4);
        assert_eq!(paths.pending(id), 0);
        assert_eq!(paths.local(id), Local::Nothing);
    }

    #[test]
    fn colliding_hashes_keep_paths_apart() {
        let mut paths = Paths::new();
        paths.hash_mask = 0;
        let mut chain = Vec::new();
        let ids: Vec<PathId> = [&b"a/x"[..], b"a/y", b"b/x", b"b"]
            .iter()
            .map(|p| paths.resolve(p, &mut chain))
            .collect();
        assert_eq!(paths.by_hash.len(), 1);
        assert_eq!(paths.collided.len(), 4);
        for (id, p) in ids.iter().zip([&b"a/x"[..], b"a/y", b"b/x", b"b"]) {
            assert_eq!(paths.find(p), Some(*id));
            assert_eq!(paths.path(*id), p);
        }
        assert_eq!(paths.find(b"a/z"), None);
        assert_eq!(paths.find(b"c"), None);
    }
}
