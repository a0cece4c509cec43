//! Layers -> one tar stream of the final file system, in one pass over each
//! layer's bytes, with no file extracted to disk.
//!
//! Layers are read top-down (the last layer first). An entry is written as
//! soon as it is read, unless a layer above already decided its path:
//!
//! - an upper entry at the same path wins (an upper directory only wins the
//!   directory's own metadata: lower children stay);
//! - an upper whiteout `.wh.NAME` hides NAME and its subtree;
//! - an upper `.wh..wh..opq` hides the lower children of its directory;
//! - an upper non-directory hides everything below its path;
//! - an upper entry below a path makes that path a directory: a lower
//!   non-directory there is hidden (as an overlay upper directory hides a
//!   lower file).
//!
//! What a layer decides is only applied to the layers below it once the layer
//! is read, so whiteouts never hide the same layer's entries. Whiteout files
//! never appear in the output. Memory holds paths, never file content: each
//! path once, as a name below its parent's (see [`paths`]), under 100 bytes a
//! path.
//!
//! Headers are preserved (type, mode bits including setuid/setgid/sticky,
//! owner, mtime, link names, device numbers, PAX records such as
//! `SCHILY.xattr.*`, long names). Directories that only exist because
//! something below them does are written at the end (mode 0755, root, mtime
//! 0); tar2sqfs accepts children before their parents and takes a parent's
//! metadata whenever its entry comes.
//!
//! Paths are pure bytes: leading `/` and `./` are stripped, entries with a
//! `..` component or a NUL byte are skipped with a warning, and symlinks are
//! never followed: nothing here touches the host file system.
//!
//! Hard links: a link whose target is written at its own path is written as
//! a link (the squashfs writer resolves links at the end, whatever their
//! order). When the target was hidden by an upper layer, the link keeps the
//! target's old content: written as soon as the link and its target are both
//! read when the target is small enough to be kept in memory (see
//! [`hidden`]), else deferred to the end, where only the layers holding such
//! targets are read again, up to the entries needed (several links to one
//! lost target share one copy through hard links). A link to a path its
//! own layer does not hold names the topmost lower layer's entry at that
//! path. Links to directories or to paths that never existed are skipped with
//! a warning. Limitations: a second entry for the same path in one layer is
//! skipped with a warning (the first is kept), and a whiteout between a link
//! and its lower-layer target is not taken into account.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;

use anyhow::{bail, Context, Result};
use tar::{Archive, Builder, EntryType, Header};

use super::layer::Layer;
use hidden::{HiddenFile, HiddenFiles};
use paths::{Local, Out, PathId, Paths, ROOT};

/// How many warnings are kept in full; the rest are only counted.
const MAX_WARNINGS: usize = 50;

/// Marks that the layers above the current one left at a path.
mod mark {
    /// `.wh.NAME`: the path and its subtree are gone.
    pub const WHITEOUT: u8 = 1;
    /// `.wh..wh..opq`: the lower children are gone.
    pub const OPAQUE: u8 = 2;
    /// A non-directory: the path and its subtree are taken.
    pub const NONDIR: u8 = 4;
    /// A directory entry: the path's own metadata is taken.
    pub const DIR: u8 = 8;
    /// A directory made by an entry below it: lower non-directories lose.
    pub const IMPLICIT: u8 = 16;
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

/// Where a hard link's content comes from.
#[derive(Debug, Clone)]
enum Source {
    /// An entry of the link's own layer: its ordinal, its path, and whether
    /// it is written at that path.
    Here {
        ordinal: u32,
        target: PathId,
        written: bool,
    },
    /// Whatever the lower layers hold at this path.
    Lower(PathId),
    /// Nothing usable: why.
    Broken(String),
}

/// A written hard link whose target is in a lower layer.
#[derive(Debug)]
struct LowerLink {
    layer: u32,
    path: PathId,
    target: PathId,
    found: Option<Found>,
}

/// The entry a [`LowerLink`] names.
#[derive(Debug, Clone)]
enum Found {
    Entry {
        layer: u32,
        ordinal: u32,
        path: PathId,
        written: bool,
    },
    Broken(String),
    /// Its content was written at the link from [`HiddenFiles`].
    Copied,
}

/// What [`write_flattened`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flattened {
    /// Tar entries written (extension headers not counted).
    pub entries: u64,
    /// File content bytes written.
    pub bytes: u64,
    /// Paths in the final tree (without the root).
    pub paths: usize,
    /// Layers read a second time for hard links to replaced files.
    pub reread_layers: usize,
    /// Entries skipped and why (unsafe paths, broken hard links, ...).
    pub warnings: Vec<String>,
}

/// Tar counters shared by the writers below.
#[derive(Debug, Default, Clone, Copy)]
struct EmitStats {
    entries: u64,
    bytes: u64,
}

/// Writes the final file system of `layers` (lowest first) as one tar stream
/// to `out`, reading each layer once from the top layer down (see the module
/// doc). `on_layer` is called with a layer's index before it is read.
pub fn write_flattened<W: Write>(
    layers: &[Layer],
    out: W,
    mut on_layer: impl FnMut(usize),
) -> Result<Flattened> {
    let mut f = Flattener {
        builder: Builder::new(out),
        paths: Paths::new(),
        chain: Vec::new(),
        links: HashMap::new(),
        hidden: HiddenFiles::default(),
        copies: BTreeMap::new(),
        lower_links: Vec::new(),
        wanted: HashMap::new(),
        stats: EmitStats::default(),
        warnings: Warnings::default(),
    };
    for (index, layer) in layers.iter().enumerate().rev() {
        on_layer(index);
        f.layer(index as u32, layer)?;
    }
    f.resolve_lower_links()?;
    let reread = f.write_copies(layers)?;
    f.write_implicit_dirs()?;
    f.builder.finish().context("cannot finish the tar stream")?;
    Ok(Flattened {
        entries: f.stats.entries,
        bytes: f.stats.bytes,
        paths: f.paths.out_count(),
        reread_layers: reread,
        warnings: f.warnings.into_vec(),
    })
}

/// What one entry is, for the merge.
enum Kind {
    Dir,
    NonDir,
    Link(Vec<u8>),
}

struct Flattener<W: Write> {
    builder: Builder<W>,
    /// Every path met, with the upper layers' marks, the current layer's,
    /// and what the output holds there.
    paths: Paths,
    /// The ancestors of the entry being read (root first).
    chain: Vec<PathId>,
    /// Sources of the current layer's hard links.
    links: HashMap<PathId, Source>,
    /// Hidden files of the current layer kept for hard links.
    hidden: HiddenFiles,
    /// Deferred copies: (layer, ordinal) of a hidden entry -> link paths
    /// that get its content (the first) or a hard link to the first.
    copies: BTreeMap<(u32, u32), Vec<PathId>>,
    lower_links: Vec<LowerLink>,
    /// Target path -> indexes into `lower_links` still looking for it.
    wanted: HashMap<PathId, Vec<usize>>,
    stats: EmitStats,
    warnings: Warnings,
}

/// How an entry's ancestors stand.
enum Ancestors {
    /// All present as directories (made implicit where needed).
    Open,
    /// An upper layer hides the entry through an ancestor.
    Hidden,
    /// The same layer has a non-directory at an ancestor: the entry is junk.
    Conflict(PathId),
}

impl<W: Write> Flattener<W> {
    fn layer(&mut self, index: u32, layer: &Layer) -> Result<()> {
        let name = layer.name().to_string();
        let mut archive = Archive::new(layer.open_tar_pipelined()?);
        let entries = archive
            .entries()
            .with_context(|| format!("cannot read layer {name} as a tar archive"))?;
        for (ordinal, entry) in entries.enumerate() {
            let mut entry = entry.with_context(|| {
                format!(
                    "layer {name} is not a valid tar archive (entry {ordinal}); the blob may be corrupt"
                )
            })?;
            let ordinal = u32::try_from(ordinal).context("layer has more than 2^32 entries")?;
            self.entry(index, &name, ordinal, &mut entry)
                .with_context(|| format!("cannot copy entry {ordinal} of layer {name}"))?;
        }
        self.paths.end_layer();
        self.links.clear();
        self.hidden.clear();
        Ok(())
    }

    fn entry<R: Read>(
        &mut self,
        layer: u32,
        name: &str,
        ordinal: u32,
        entry: &mut tar::Entry<R>,
    ) -> Result<()> {
        let etype = entry.header().entry_type();
        if etype == EntryType::XGlobalHeader {
            return Ok(());
        }
        let raw = entry.path_bytes().into_owned();
        if !is_supported(etype) {
            self.warnings.push(format!(
                "layer {name}: skipped {} (unsupported tar entry type {etype:?})",
                String::from_utf8_lossy(&raw),
            ));
            return Ok(());
        }
        let path = match normalize(&raw) {
            Ok(p) => p,
            Err(why) => {
                self.warnings.push(format!(
                    "layer {name}: skipped unsafe path {:?}: {why}",
                    String::from_utf8_lossy(&raw)
                ));
                return Ok(());
            }
        };
        let (parent, base) = split_parent(&path);
        if let Some(hidden) = base.strip_prefix(b".wh.") {
            if hidden == b".wh..opq" {
                let dir = self.paths.resolve(parent, &mut self.chain);
                self.paths.add_pending(dir, mark::OPAQUE);
            } else if hidden.starts_with(b".wh.") || hidden.is_empty() {
                // aufs bookkeeping (.wh..wh.plnk, ...) or a bare ".wh.": never shown.
            } else {
                let gone = self.paths.resolve(&join(parent, hidden), &mut self.chain);
                self.paths.add_pending(gone, mark::WHITEOUT);
            }
            return Ok(());
        }
        let kind = match etype {
            EntryType::Link => {
                let raw_target = entry.link_name_bytes().unwrap_or_default().into_owned();
                match normalize(&raw_target) {
                    Ok(target) if !target.is_empty() => Kind::Link(target),
                    _ => {
                        self.warnings.push(format!(
                            "layer {name}: skipped hard link {} to unsafe target {:?}",
                            show(&path),
                            String::from_utf8_lossy(&raw_target)
                        ));
                        return Ok(());
                    }
                }
            }
            EntryType::Directory => Kind::Dir,
            _ if path.is_empty() => {
                self.warnings.push(format!(
                    "layer {name}: skipped a non-directory entry for the root"
                ));
                return Ok(());
            }
            _ => Kind::NonDir,
        };
        let is_dir = matches!(kind, Kind::Dir);
        let id = self.paths.resolve(&path, &mut self.chain);
        let ancestors = self.open_ancestors();
        if let Ancestors::Conflict(at) = ancestors {
            self.warnings.push(format!(
                "layer {name}: skipped {}: the same layer has a non-directory at {}",
                show(&path),
                show(&self.paths.path(at))
            ));
            return Ok(());
        }
        let own = self.paths.upper(id);
        let visible = matches!(ancestors, Ancestors::Open)
            && own & (mark::WHITEOUT | mark::NONDIR | mark::DIR) == 0
            && (is_dir || own & mark::IMPLICIT == 0);
        let seen = self.paths.pending(id);
        if seen & (mark::DIR | mark::NONDIR) != 0 {
            if !(is_dir && seen & mark::DIR != 0) {
                self.warnings.push(format!(
                    "layer {name}: skipped a second entry for {} (the first is kept)",
                    show(&path)
                ));
            }
            return Ok(());
        }
        self.paths
            .add_pending(id, if is_dir { mark::DIR } else { mark::NONDIR });

        let this = match kind {
            Kind::Dir => {
                if visible {
                    let at: &[u8] = if path.is_empty() { b"." } else { &path };
                    let header = entry.header().clone();
                    let pax = pax_records(entry)?;
                    write_entry(&mut self.builder, header, &pax, at, entry, &mut self.stats)?;
                    self.paths.set_out(id, Out::Dir);
                }
                Local::Dir
            }
            Kind::NonDir => {
                if visible {
                    let header = entry.header().clone();
                    let pax = pax_records(entry)?;
                    write_entry(
                        &mut self.builder,
                        header,
                        &pax,
                        &path,
                        entry,
                        &mut self.stats,
                    )?;
                    self.paths.set_out(id, Out::NonDir);
                } else if HiddenFiles::wants(entry.header(), entry.size()) {
                    let header = entry.header().clone();
                    let pax = pax_records(entry)?;
                    let mut data = Vec::with_capacity(entry.size() as usize);
                    entry
                        .read_to_end(&mut data)
                        .context("cannot read the entry's data")?;
                    let file = HiddenFile { header, pax, data };
                    self.hidden.keep(ordinal, file);
                }
                Local::Entry {
                    ordinal,
                    written: visible,
                }
            }
            Kind::Link(target) => {
                let target = self.paths.resolve(&target, &mut Vec::new());
                let source = match self.paths.local(target) {
                    Local::Dir => Source::Broken(format!(
                        "its target {} is a directory",
                        show(&self.paths.path(target))
                    )),
                    Local::Entry { ordinal, written } => Source::Here {
                        ordinal,
                        target,
                        written,
                    },
                    Local::Link => self.links[&target].clone(),
                    Local::Nothing => Source::Lower(target),
                };
                if visible {
                    self.link(layer, id, &path, &source, entry)?;
                }
                self.links.insert(id, source);
                Local::Link
            }
        };
        self.paths.set_local(id, this);
        self.found_wanted(layer, id)
    }

    /// Checks the ancestors of the entry being read (`chain`, root first)
    /// against the upper layers' marks; marks those still open as
    /// directories of the output.
    fn open_ancestors(&mut self) -> Ancestors {
        for &ancestor in &self.chain {
            let marks = self.paths.upper(ancestor);
            if marks & (mark::WHITEOUT | mark::OPAQUE | mark::NONDIR) != 0 {
                return Ancestors::Hidden;
            }
            if ancestor == ROOT {
                continue;
            }
            if self.paths.pending(ancestor) & mark::NONDIR != 0 {
                return Ancestors::Conflict(ancestor);
            }
            self.paths.add_pending(ancestor, mark::IMPLICIT);
            if self.paths.out(ancestor) == Out::Nothing {
                self.paths.set_out(ancestor, Out::Implicit);
            }
        }
        Ancestors::Open
    }

    /// Writes (or defers) a visible hard link at `path` (whose id is `id`).
    fn link<R: Read>(
        &mut self,
        layer: u32,
        id: PathId,
        path: &[u8],
        source: &Source,
        entry: &mut tar::Entry<R>,
    ) -> Result<()> {
        match source {
            Source::Broken(why) => {
                self.warnings
                    .push(format!("skipped hard link {}: {why}", show(path)));
                return Ok(());
            }
            Source::Here {
                target,
                written: true,
                ..
            } => {
                let header = entry.header().clone();
                let pax = pax_records(entry)?;
                let target = self.paths.path(*target);
                write_hardlink(&mut self.builder, header, &pax, path, &target)?;
                self.stats.entries += 1;
            }
            Source::Here {
                ordinal: source, ..
            } => {
                if !self.copy_hidden(*source, id, path)? {
                    self.copies.entry((layer, *source)).or_default().push(id);
                }
            }
            Source::Lower(target) => {
                self.wanted
                    .entry(*target)
                    .or_default()
                    .push(self.lower_links.len());
                self.lower_links.push(LowerLink {
                    layer,
                    path: id,
                    target: *target,
                    found: None,
                });
            }
        }
        self.paths.set_out(id, Out::NonDir);
        Ok(())
    }

    /// Hands this layer's entry at `id` to links of upper layers naming it.
    fn found_wanted(&mut self, layer: u32, id: PathId) -> Result<()> {
        let Some(waiting) = self.wanted.get_mut(&id) else {
            return Ok(());
        };
        let links = &self.lower_links;
        let (now, later): (Vec<usize>, Vec<usize>) =
            waiting.iter().partition(|i| links[**i].layer > layer);
        if now.is_empty() {
            return Ok(());
        }
        *waiting = later;
        let found = match self.paths.local(id) {
            Local::Dir => Found::Broken(format!(
                "its target {} is a directory",
                show(&self.paths.path(id))
            )),
            Local::Entry { ordinal, written } => Found::Entry {
                layer,
                ordinal,
                path: id,
                written,
            },
            Local::Link => match &self.links[&id] {
                Source::Here {
                    ordinal,
                    target,
                    written,
                } => Found::Entry {
                    layer,
                    ordinal: *ordinal,
                    path: *target,
                    written: *written,
                },
                Source::Lower(_) => Found::Broken(format!(
                    "its target {} is a hard link to a lower layer again",
                    show(&self.paths.path(id))
                )),
                Source::Broken(why) => Found::Broken(why.clone()),
            },
            Local::Nothing => return Ok(()),
        };
        for i in now {
            let at = self.lower_links[i].path;
            let copied = match found {
                Found::Entry {
                    ordinal,
                    written: false,
                    ..
                } => self.copy_hidden(ordinal, at, &self.paths.path(at))?,
                _ => false,
            };
            self.lower_links[i].found = Some(if copied { Found::Copied } else { found.clone() });
        }
        Ok(())
    }

    /// Writes the content of the current layer's hidden entry `ordinal` at
    /// `path` (whose id is `at`) when [`HiddenFiles`] has it: the content
    /// itself the first time, a hard link to that first path after.
    /// Returns whether it did.
    fn copy_hidden(&mut self, ordinal: u32, at: PathId, path: &[u8]) -> Result<bool> {
        if let Some(first) = self.hidden.written_at(ordinal) {
            // The inode's metadata is the target's: the header is a stub.
            let mut header = Header::new_gnu();
            header.set_mode(0o644);
            let target = self.paths.path(first);
            write_hardlink(&mut self.builder, header, &[], path, &target)?;
            self.stats.entries += 1;
            return Ok(true);
        }
        let Some(file) = self.hidden.get(ordinal) else {
            return Ok(false);
        };
        let mut header = file.header.clone();
        header.set_entry_type(EntryType::Regular);
        header.set_size(file.data.len() as u64);
        append_pax(&mut self.builder, &file.pax)?;
        self.builder
            .append_data(&mut header, OsStr::from_bytes(path), file.data.as_slice())?;
        self.stats.entries += 1;
        self.stats.bytes += file.data.len() as u64;
        self.hidden.set_written_at(ordinal, at);
        Ok(true)
    }

    /// After the last layer: links to lower layers become links or copies.
    fn resolve_lower_links(&mut self) -> Result<()> {
        for link in std::mem::take(&mut self.lower_links) {
            match link.found {
                Some(Found::Entry {
                    written: true,
                    path,
                    ..
                }) => {
                    // The inode's metadata is the target's: the header is a stub.
                    let mut header = Header::new_gnu();
                    header.set_mode(0o644);
                    let at = self.paths.path(link.path);
                    let target = self.paths.path(path);
                    write_hardlink(&mut self.builder, header, &[], &at, &target)?;
                    self.stats.entries += 1;
                }
                Some(Found::Entry { layer, ordinal, .. }) => self
                    .copies
                    .entry((layer, ordinal))
                    .or_default()
                    .push(link.path),
                Some(Found::Copied) => {}
                Some(Found::Broken(why)) => {
                    self.paths.set_out(link.path, Out::Nothing);
                    self.warnings.push(format!(
                        "skipped hard link {}: {why}",
                        show(&self.paths.path(link.path))
                    ));
                }
                None => {
                    self.paths.set_out(link.path, Out::Nothing);
                    self.warnings.push(format!(
                        "skipped hard link {}: its target {} does not exist",
                        show(&self.paths.path(link.path)),
                        show(&self.paths.path(link.target))
                    ));
                }
            }
        }
        Ok(())
    }

    /// Writes the deferred copies: reads each layer that holds one again, up
    /// to its last needed entry. Returns how many layers were read again.
    fn write_copies(&mut self, layers: &[Layer]) -> Result<usize> {
        let copies = std::mem::take(&mut self.copies);
        let mut by_layer: BTreeMap<u32, BTreeMap<u32, Vec<Vec<u8>>>> = BTreeMap::new();
        for ((layer, ordinal), ids) in copies {
            let paths = ids.into_iter().map(|id| self.paths.path(id)).collect();
            by_layer.entry(layer).or_default().insert(ordinal, paths);
        }
        for (&index, wanted) in &by_layer {
            let layer = &layers[index as usize];
            let name = layer.name();
            let mut archive = Archive::new(layer.open_tar()?);
            let mut remaining = wanted.len();
            for (ordinal, entry) in archive
                .entries()
                .with_context(|| format!("cannot read layer {name} as a tar archive"))?
                .enumerate()
            {
                let mut entry = entry.with_context(|| {
                    format!("layer {name} is not a valid tar archive (entry {ordinal})")
                })?;
                let Some(paths) = wanted.get(&(ordinal as u32)) else {
                    continue;
                };
                let header = entry.header().clone();
                let pax = pax_records(&mut entry)?;
                let (first, rest) = paths.split_first().expect("a copy has a path");
                write_entry(
                    &mut self.builder,
                    header.clone(),
                    &pax,
                    first,
                    &mut entry,
                    &mut self.stats,
                )
                .with_context(|| format!("cannot copy entry {ordinal} of layer {name}"))?;
                for other in rest {
                    write_hardlink(&mut self.builder, header.clone(), &pax, other, first)?;
                    self.stats.entries += 1;
                }
                remaining -= 1;
                if remaining == 0 {
                    break;
                }
            }
            if remaining > 0 {
                bail!("layer {name} changed while it was converted ({remaining} entries missing)");
            }
        }
        Ok(by_layer.len())
    }

    /// Writes the directories that have no entry of their own.
    fn write_implicit_dirs(&mut self) -> Result<()> {
        let mut dirs: Vec<Vec<u8>> = self
            .paths
            .with_out(Out::Implicit)
            .map(|id| self.paths.path(id))
            .collect();
        dirs.sort();
        for dir in dirs {
            let mut header = Header::new_gnu();
            header.set_entry_type(EntryType::Directory);
            header.set_mode(0o755);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_size(0);
            self.builder
                .append_data(&mut header, OsStr::from_bytes(&dir), io::empty())?;
            self.stats.entries += 1;
        }
        Ok(())
    }
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

mod hidden;
mod paths;

#[cfg(test)]
mod tests;
