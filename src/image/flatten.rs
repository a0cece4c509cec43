//! Layers -> one tar stream of the final file system, in two passes, with no
//! file extracted to disk.
//!
//! Pass 1 ([`plan`]) reads every layer's tar headers and computes, in memory,
//! which entry wins at each path: a later layer's entry replaces an earlier
//! one; whiteouts `.wh.NAME` delete NAME and its subtree from lower layers;
//! `.wh..wh..opq` hides the lower layers' children of its directory; an entry
//! whose parent became a non-directory in a later layer disappears. Whiteout
//! files never appear in the output.
//!
//! Pass 2 ([`write_tar`]) reads the layers again and writes only the winning
//! entries, headers preserved (type, mode bits including setuid/setgid/sticky,
//! owner, mtime, link names, device numbers, PAX records such as
//! `SCHILY.xattr.*`, long names), plus directories that only existed
//! implicitly (mode 0755, root, mtime 0).
//!
//! Paths are pure bytes: leading `/` and `./` are stripped, entries with a
//! `..` component or a NUL byte are skipped with a warning, and symlinks are
//! never followed: nothing here touches the host file system.
//!
//! Hard links are kept when their target is a winning entry (which the stream
//! always emits earlier). When the target was replaced or deleted by a later
//! layer, the link's path gets a copy of the target's content (several links
//! to the same lost target share one copy through hard links). Links to
//! directories or to paths that never existed are skipped with a warning.
//! Limitation: a hard link to a file of a lower layer that the same layer did
//! not include is resolved against the lower layers' current entry.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;

use anyhow::{bail, Context, Result};
use tar::{Archive, Builder, EntryType, Header};

use super::layer::Layer;

/// How many warnings a plan keeps in full; the rest are only counted.
const MAX_WARNINGS: usize = 50;

/// An entry of a layer: the layer's index and the entry's position in its tar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct EntryRef {
    layer: u32,
    ordinal: u32,
}

/// What pass 1 keeps of one tar entry.
#[derive(Debug)]
enum Item {
    /// A directory, file, symlink, device or fifo at `path`.
    Entry { path: Vec<u8>, dir: bool },
    /// A hard link at `path` to `target` (both normalised).
    Hardlink { path: Vec<u8>, target: Vec<u8> },
    /// `.wh.NAME`: delete `path` from lower layers.
    Whiteout(Vec<u8>),
    /// `.wh..wh..opq`: hide lower layers' children of `path`.
    Opaque(Vec<u8>),
}

/// Warnings with a cap on how many are stored.
#[derive(Debug, Default)]
struct Warnings {
    kept: Vec<String>,
    dropped: usize,
}

impl Warnings {
    fn push(&mut self, w: String) {
        if self.kept.len() < MAX_WARNINGS {
            self.kept.push(w);
        } else {
            self.dropped += 1;
        }
    }

    fn into_vec(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.kept
                .push(format!("... and {} more warnings", self.dropped));
        }
        self.kept
    }
}

/// Normalises a tar path: strips leading `/` and `./`, drops empty and `.`
/// components. Errors for `..` components and NUL bytes. The root is `b""`.
pub fn normalize(raw: &[u8]) -> Result<Vec<u8>, &'static str> {
    if raw.contains(&0) {
        return Err("it contains a NUL byte");
    }
    let mut out = Vec::with_capacity(raw.len());
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err("it has a '..' component"),
            c => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    Ok(out)
}

fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (b"", path),
    }
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn show(path: &[u8]) -> String {
    if path.is_empty() {
        "/".to_string()
    } else {
        format!("/{}", String::from_utf8_lossy(path))
    }
}

/// The kinds of tar entries that make it into the image.
fn is_supported(t: EntryType) -> bool {
    matches!(
        t,
        EntryType::Regular
            | EntryType::Continuous
            | EntryType::GNUSparse
            | EntryType::Symlink
            | EntryType::Link
            | EntryType::Char
            | EntryType::Block
            | EntryType::Fifo
            | EntryType::Directory
    )
}

/// Pass 1 for one layer: the items in tar order, with their ordinals.
fn scan_layer(layer: &Layer, warnings: &mut Warnings) -> Result<Vec<(u32, Item)>> {
    let name = layer.name();
    let mut archive = Archive::new(layer.open_tar()?);
    let mut items = Vec::new();
    let entries = archive
        .entries()
        .with_context(|| format!("cannot read layer {name} as a tar archive"))?;
    for (ordinal, entry) in entries.enumerate() {
        let entry = entry.with_context(|| {
            format!("layer {name} is not a valid tar archive (entry {ordinal}); the blob may be corrupt")
        })?;
        let ordinal = u32::try_from(ordinal).context("layer has more than 2^32 entries")?;
        let etype = entry.header().entry_type();
        if etype == EntryType::XGlobalHeader {
            continue;
        }
        let raw = entry.path_bytes();
        if !is_supported(etype) {
            warnings.push(format!(
                "layer {name}: skipped {} (unsupported tar entry type {:?})",
                String::from_utf8_lossy(&raw),
                etype
            ));
            continue;
        }
        let path = match normalize(&raw) {
            Ok(p) => p,
            Err(why) => {
                warnings.push(format!(
                    "layer {name}: skipped unsafe path {:?}: {why}",
                    String::from_utf8_lossy(&raw)
                ));
                continue;
            }
        };
        let (parent, base) = split_parent(&path);
        if let Some(hidden) = base.strip_prefix(b".wh.") {
            if hidden == b".wh..opq" {
                items.push((ordinal, Item::Opaque(parent.to_vec())));
            } else if hidden.starts_with(b".wh.") || hidden.is_empty() {
                // aufs bookkeeping (.wh..wh.plnk, ...) or a bare ".wh.": never shown.
            } else {
                items.push((ordinal, Item::Whiteout(join(parent, hidden))));
            }
            continue;
        }
        let item = match etype {
            EntryType::Link => {
                let raw_target = entry.link_name_bytes().unwrap_or_default();
                match normalize(&raw_target) {
                    Ok(target) if !target.is_empty() => Item::Hardlink { path, target },
                    _ => {
                        warnings.push(format!(
                            "layer {name}: skipped hard link {} to unsafe target {:?}",
                            show(&path),
                            String::from_utf8_lossy(&raw_target)
                        ));
                        continue;
                    }
                }
            }
            EntryType::Directory => Item::Entry { path, dir: true },
            _ if path.is_empty() => {
                warnings.push(format!(
                    "layer {name}: skipped a non-directory entry for the root"
                ));
                continue;
            }
            _ => Item::Entry { path, dir: false },
        };
        items.push((ordinal, item));
    }
    Ok(items)
}

/// The winning entry at a path.
#[derive(Debug, Clone, Copy)]
struct Winner {
    at: EntryRef,
    dir: bool,
}

/// The merged tree. A node without a winner is a directory that exists only
/// because something below it does.
#[derive(Debug, Default)]
struct Node {
    children: BTreeMap<Box<[u8]>, Node>,
    winner: Option<Winner>,
}

impl Node {
    fn is_dir(&self) -> bool {
        self.winner.is_none_or(|w| w.dir)
    }

    fn get(&self, path: &[u8]) -> Option<&Node> {
        if path.is_empty() {
            return Some(self);
        }
        path.split(|b| *b == b'/')
            .try_fold(self, |node, comp| node.children.get(comp))
    }

    fn get_mut(&mut self, path: &[u8]) -> Option<&mut Node> {
        if path.is_empty() {
            return Some(self);
        }
        path.split(|b| *b == b'/')
            .try_fold(self, |node, comp| node.children.get_mut(comp))
    }

    fn remove(&mut self, path: &[u8]) {
        let (parent, name) = split_parent(path);
        if let Some(p) = self.get_mut(parent) {
            p.children.remove(name);
        }
    }

    /// The node at `path`, creating missing parents as implicit directories and
    /// turning non-directory parents into implicit directories (as an overlay
    /// upper directory hides a lower file).
    fn make_path(&mut self, path: &[u8]) -> &mut Node {
        if path.is_empty() {
            return self;
        }
        let mut node = self;
        for comp in path.split(|b| *b == b'/') {
            if !node.is_dir() {
                node.winner = None;
                node.children.clear();
            }
            node = node.children.entry(comp.into()).or_default();
        }
        node
    }

    /// Calls `f` on every node but the root, parents before children.
    fn walk(&self, path: &mut Vec<u8>, f: &mut impl FnMut(&[u8], &Node)) {
        for (name, child) in &self.children {
            let len = path.len();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name);
            f(path, child);
            child.walk(path, f);
            path.truncate(len);
        }
    }
}

/// Where a hard link's content comes from.
#[derive(Debug, Clone)]
enum LinkSource {
    /// The (non-link) entry it shares content with, and that entry's path.
    Entry { at: EntryRef, path: Vec<u8> },
    /// Nothing usable: why.
    Broken(String),
}

/// What pass 2 does with one entry.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Action {
    emit: Emit,
    /// Copies of this entry at other paths (hard links whose target lost):
    /// the first holds the content, the others are hard links to the first.
    copies: Vec<Vec<u8>>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Emit {
    /// Not at its own path.
    #[default]
    No,
    /// As it is.
    AsIs,
    /// As a hard link to this (normalised) path.
    HardlinkTo(Vec<u8>),
}

/// The result of pass 1: what pass 2 writes.
#[derive(Debug, Default)]
pub struct Plan {
    actions: Vec<BTreeMap<u32, Action>>,
    implicit_dirs: Vec<Vec<u8>>,
    root: Option<EntryRef>,
    /// Entries skipped and why (unsafe paths, broken hard links, ...).
    pub warnings: Vec<String>,
    /// How many paths the final tree has (without the root).
    pub paths: usize,
}

impl Plan {
    /// Whether pass 2 needs to read layer `layer` at all.
    pub fn reads_layer(&self, layer: usize) -> bool {
        self.actions.get(layer).is_some_and(|a| !a.is_empty())
    }
}

/// Pass 1: reads every layer's headers (layers in parallel, up to `jobs` at a
/// time) and computes the final tree.
pub fn plan(layers: &[Layer], jobs: usize) -> Result<Plan> {
    let jobs = jobs.max(1);
    type Scanned = Result<(Vec<(u32, Item)>, Warnings)>;
    let mut scanned: Vec<Option<Scanned>> = (0..layers.len()).map(|_| None).collect();
    for (chunk_index, chunk) in layers.chunks(jobs).enumerate() {
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|layer| {
                    s.spawn(move || {
                        let mut w = Warnings::default();
                        scan_layer(layer, &mut w).map(|items| (items, w))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("layer scan panicked")))
                })
                .collect()
        });
        for (i, r) in results.into_iter().enumerate() {
            scanned[chunk_index * jobs + i] = Some(r);
        }
    }
    let mut merger = Merger::default();
    for (index, result) in scanned.into_iter().enumerate() {
        let (items, warnings) = result.unwrap_or_else(|| Ok(Default::default()))?;
        merger.warnings.kept.extend(warnings.kept);
        merger.warnings.dropped += warnings.dropped;
        merger.apply(index as u32, items);
    }
    Ok(merger.finish(layers.len()))
}

#[derive(Default)]
struct Merger {
    root: Node,
    links: HashMap<EntryRef, LinkSource>,
    warnings: Warnings,
}

impl Merger {
    fn apply(&mut self, layer: u32, items: Vec<(u32, Item)>) {
        // Whiteouts and opaque markers apply to lower layers only, wherever
        // they sit in this layer's tar: apply them first.
        for (_, item) in &items {
            match item {
                Item::Whiteout(path) => self.root.remove(path),
                Item::Opaque(path) => {
                    if let Some(node) = self.root.get_mut(path) {
                        node.children.clear();
                    }
                }
                _ => {}
            }
        }
        // This layer's entries so far, for hard links (a tar link names an
        // earlier entry of the same archive).
        let mut local: HashMap<Vec<u8>, Winner> = HashMap::new();
        for (ordinal, item) in items {
            let at = EntryRef { layer, ordinal };
            let (path, dir) = match item {
                Item::Entry { path, dir } => (path, dir),
                Item::Hardlink { path, target } => {
                    let source = self.link_source(&local, &target);
                    self.links.insert(at, source);
                    (path, false)
                }
                Item::Whiteout(_) | Item::Opaque(_) => continue,
            };
            let winner = Winner { at, dir };
            let node = self.root.make_path(&path);
            if !(dir && node.is_dir()) {
                // A non-directory replaces a subtree; a directory replacing a
                // non-directory starts empty.
                node.children.clear();
            }
            node.winner = Some(winner);
            local.insert(path, winner);
        }
    }

    fn link_source(&self, local: &HashMap<Vec<u8>, Winner>, target: &[u8]) -> LinkSource {
        let found = local
            .get(target)
            .copied()
            .or_else(|| self.root.get(target).and_then(|n| n.winner));
        match found {
            None => LinkSource::Broken(format!("its target {} does not exist", show(target))),
            Some(w) if w.dir => {
                LinkSource::Broken(format!("its target {} is a directory", show(target)))
            }
            Some(w) => match self.links.get(&w.at) {
                Some(chained) => chained.clone(),
                None => LinkSource::Entry {
                    at: w.at,
                    path: target.to_vec(),
                },
            },
        }
    }

    fn finish(mut self, layers: usize) -> Plan {
        let mut actions: Vec<BTreeMap<u32, Action>> = vec![BTreeMap::new(); layers];
        let mut winners = HashSet::new();
        let mut link_winners = Vec::new();
        let mut implicit_dirs = Vec::new();
        let mut paths = 0;
        self.root.walk(&mut Vec::new(), &mut |path, node| {
            paths += 1;
            match node.winner {
                None => implicit_dirs.push(path.to_vec()),
                Some(w) => {
                    winners.insert(w.at);
                    if self.links.contains_key(&w.at) {
                        link_winners.push((w.at, path.to_vec()));
                    } else {
                        actions[w.at.layer as usize]
                            .entry(w.at.ordinal)
                            .or_default()
                            .emit = Emit::AsIs;
                    }
                }
            }
        });
        let root = self.root.winner.map(|w| w.at);
        if let Some(at) = root {
            actions[at.layer as usize]
                .entry(at.ordinal)
                .or_default()
                .emit = Emit::AsIs;
        }
        link_winners.sort();
        for (at, path) in link_winners {
            match &self.links[&at] {
                LinkSource::Broken(why) => self
                    .warnings
                    .push(format!("skipped hard link {}: {why}", show(&path))),
                LinkSource::Entry {
                    at: source,
                    path: target,
                } => {
                    if winners.contains(source) {
                        actions[at.layer as usize]
                            .entry(at.ordinal)
                            .or_default()
                            .emit = Emit::HardlinkTo(target.clone());
                    } else {
                        actions[source.layer as usize]
                            .entry(source.ordinal)
                            .or_default()
                            .copies
                            .push(path);
                    }
                }
            }
        }
        Plan {
            actions,
            implicit_dirs,
            root,
            warnings: self.warnings.into_vec(),
            paths,
        }
    }
}

/// What pass 2 wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EmitStats {
    /// Tar entries written (extension headers not counted).
    pub entries: u64,
    /// File content bytes written.
    pub bytes: u64,
}

/// Pass 2: writes the winning entries of `layers` as one tar stream to `out`.
/// `layers` must be the same, in the same order, as given to [`plan`].
pub fn write_tar<W: Write>(plan: &Plan, layers: &[Layer], out: W) -> Result<EmitStats> {
    let mut builder = Builder::new(out);
    let mut stats = EmitStats::default();
    for (index, layer) in layers.iter().enumerate() {
        let actions = &plan.actions[index];
        if actions.is_empty() {
            continue;
        }
        let name = layer.name();
        let mut archive = Archive::new(layer.open_tar()?);
        let mut remaining = actions.len();
        for (ordinal, entry) in archive
            .entries()
            .with_context(|| format!("cannot read layer {name} as a tar archive"))?
            .enumerate()
        {
            let mut entry = entry.with_context(|| {
                format!("layer {name} is not a valid tar archive (entry {ordinal})")
            })?;
            let Some(action) = actions.get(&(ordinal as u32)) else {
                continue;
            };
            let is_root = plan.root
                == Some(EntryRef {
                    layer: index as u32,
                    ordinal: ordinal as u32,
                });
            emit_entry(&mut builder, &mut entry, action, is_root, &mut stats)
                .with_context(|| format!("cannot copy entry {ordinal} of layer {name}"))?;
            remaining -= 1;
            if remaining == 0 {
                break;
            }
        }
        if remaining > 0 {
            bail!("layer {name} changed between the two conversion passes ({remaining} entries missing)");
        }
    }
    for dir in &plan.implicit_dirs {
        let mut header = Header::new_gnu();
        header.set_entry_type(EntryType::Directory);
        header.set_mode(0o755);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(0);
        builder.append_data(&mut header, OsStr::from_bytes(dir), io::empty())?;
        stats.entries += 1;
    }
    builder.finish()?;
    Ok(stats)
}

/// PAX records to carry over: all but those the builder writes itself.
fn pax_records<R: Read>(entry: &mut tar::Entry<R>) -> Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    if let Some(exts) = entry.pax_extensions()? {
        for ext in exts {
            let ext = ext?;
            let Ok(key) = ext.key() else { continue };
            if matches!(key, "path" | "linkpath" | "size") || key.starts_with("GNU.sparse") {
                continue;
            }
            out.push((key.to_string(), ext.value_bytes().to_vec()));
        }
    }
    Ok(out)
}

fn emit_entry<W: Write, R: Read>(
    builder: &mut Builder<W>,
    entry: &mut tar::Entry<R>,
    action: &Action,
    is_root: bool,
    stats: &mut EmitStats,
) -> Result<()> {
    let path = normalize(&entry.path_bytes()).map_err(|e| anyhow::anyhow!("path changed: {e}"))?;
    let path: &[u8] = if is_root { b"." } else { &path };
    let pax = pax_records(entry)?;
    let header = entry.header().clone();
    match &action.emit {
        Emit::No => {}
        Emit::AsIs => {
            write_entry(builder, header.clone(), &pax, path, entry, stats)?;
        }
        Emit::HardlinkTo(target) => {
            write_hardlink(builder, header.clone(), &pax, path, target)?;
            stats.entries += 1;
        }
    }
    if let Some((first, rest)) = action.copies.split_first() {
        if action.emit == Emit::AsIs {
            bail!("internal error: an entry is both kept and copied");
        }
        write_entry(builder, header.clone(), &pax, first, entry, stats)?;
        for other in rest {
            write_hardlink(builder, header.clone(), &pax, other, first)?;
            stats.entries += 1;
        }
    }
    Ok(())
}

fn append_pax<W: Write>(builder: &mut Builder<W>, pax: &[(String, Vec<u8>)]) -> io::Result<()> {
    if pax.is_empty() {
        return Ok(());
    }
    builder.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
}

fn write_hardlink<W: Write>(
    builder: &mut Builder<W>,
    mut header: Header,
    pax: &[(String, Vec<u8>)],
    path: &[u8],
    target: &[u8],
) -> Result<()> {
    header.set_entry_type(EntryType::Link);
    header.set_size(0);
    append_pax(builder, pax)?;
    builder.append_link(
        &mut header,
        OsStr::from_bytes(path),
        OsStr::from_bytes(target),
    )?;
    Ok(())
}

fn write_entry<W: Write, R: Read>(
    builder: &mut Builder<W>,
    mut header: Header,
    pax: &[(String, Vec<u8>)],
    path: &[u8],
    entry: &mut tar::Entry<R>,
    stats: &mut EmitStats,
) -> Result<()> {
    let path = OsStr::from_bytes(path);
    match header.entry_type() {
        EntryType::Symlink => {
            let target = entry.link_name_bytes().unwrap_or_default().into_owned();
            header.set_size(0);
            append_pax(builder, pax)?;
            builder.append_link(&mut header, path, OsStr::from_bytes(&target))?;
        }
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
            let size = match header.as_gnu() {
                Some(gnu) if header.entry_type() == EntryType::GNUSparse => gnu.real_size()?,
                _ => entry.size(),
            };
            header.set_entry_type(EntryType::Regular);
            header.set_size(size);
            append_pax(builder, pax)?;
            let mut data = ExactReader {
                inner: entry,
                left: size,
            };
            builder.append_data(&mut header, path, &mut data)?;
            if data.left != 0 {
                bail!("the entry's data is shorter than its size");
            }
            stats.bytes += size;
        }
        _ => {
            header.set_size(0);
            append_pax(builder, pax)?;
            builder.append_data(&mut header, path, io::empty())?;
        }
    }
    stats.entries += 1;
    Ok(())
}

/// Reads at most `left` bytes, so a header's size and the data written agree.
struct ExactReader<'a, R> {
    inner: &'a mut R,
    left: u64,
}

impl<R: Read> Read for ExactReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let max = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        if max == 0 {
            return Ok(0);
        }
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
