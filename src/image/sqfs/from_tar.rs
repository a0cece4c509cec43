//! Reading a tar stream into the [`Builder`]: entry types, numeric owners,
//! PAX overrides (uid, gid, mtime) and `SCHILY.xattr.` records.

use std::io::Read;

use anyhow::{Context, Result};
use tar::EntryType;

use super::builder::{Builder, EntryMeta};
use super::tables::xattr_prefix;
use super::{WriteStats, WriterOptions};

/// Most warnings kept in [`WriteStats::warnings`] (the rest are counted).
const MAX_WARNINGS: usize = 100;

/// See [`super::write_from_tar`].
pub fn write_from_tar(
    tar: impl Read,
    out: std::fs::File,
    options: &WriterOptions,
) -> Result<WriteStats> {
    let mut builder = Builder::new(out, options)?;
    let mut archive = tar::Archive::new(tar);
    let mut warnings = Vec::new();
    let mut more_warnings = 0usize;
    let mut warn = |w: String| {
        if warnings.len() < MAX_WARNINGS {
            warnings.push(w);
        } else {
            more_warnings += 1;
        }
    };
    for (i, entry) in archive
        .entries()
        .context("cannot read the tar")?
        .enumerate()
    {
        let mut entry = entry.with_context(|| format!("cannot read tar entry {}", i + 1))?;
        let path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&path).into_owned();
        add_entry(&mut builder, &mut entry, &path, &mut warn)
            .with_context(|| format!("tar entry {} ({shown})", i + 1))?;
    }
    let mut stats = builder.finish()?;
    stats.warnings = warnings;
    if more_warnings > 0 {
        stats
            .warnings
            .push(format!("{more_warnings} more warnings"));
    }
    Ok(stats)
}

/// A numeric header field's value; a blank one (only NULs and spaces, as
/// some tools leave fields they do not set) is 0, as tar2sqfs reads it.
fn blank_is_zero(raw: &[u8], parsed: std::io::Result<u64>) -> std::io::Result<u64> {
    if raw.iter().all(|b| *b == 0 || *b == b' ') {
        Ok(0)
    } else {
        parsed
    }
}

/// The entry's metadata: the header's, with PAX records over it.
fn entry_meta<R: Read>(
    entry: &mut tar::Entry<R>,
    warn: &mut impl FnMut(String),
) -> Result<EntryMeta> {
    let h = entry.header();
    let old = h.as_old();
    let mut meta = EntryMeta {
        mode: blank_is_zero(&old.mode, h.mode().map(u64::from)).context("bad mode")? as u32,
        uid: clamp_u32(blank_is_zero(&old.uid, h.uid()).context("bad uid")?),
        gid: clamp_u32(blank_is_zero(&old.gid, h.gid()).context("bad gid")?),
        mtime: clamp_u32(blank_is_zero(&old.mtime, h.mtime()).context("bad mtime")?),
        xattrs: Vec::new(),
    };
    let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
    if let Some(pax) = entry.pax_extensions().context("bad PAX records")? {
        for ext in pax {
            let ext = ext.context("bad PAX record")?;
            let key = ext.key_bytes();
            let value = ext.value_bytes();
            let number = || {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.split('.').next())
                    .and_then(|v| v.parse::<i64>().ok())
                    .map(|v| v.clamp(0, i64::from(u32::MAX)) as u32)
            };
            match key {
                b"uid" => meta.uid = number().context("bad PAX uid")?,
                b"gid" => meta.gid = number().context("bad PAX gid")?,
                b"mtime" => meta.mtime = number().context("bad PAX mtime")?,
                _ => {
                    if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                        match xattr_prefix(name) {
                            Some((kind, rest)) => meta.xattrs.push((kind, rest.to_vec(), value.to_vec())),
                            None => warn(format!(
                                "{path}: xattr {} skipped (squashfs stores user., trusted. and security. only)",
                                String::from_utf8_lossy(name)
                            )),
                        }
                    }
                }
            }
        }
    }
    Ok(meta)
}

fn clamp_u32(v: u64) -> u32 {
    v.min(u64::from(u32::MAX)) as u32
}

fn add_entry<R: Read>(
    builder: &mut Builder,
    entry: &mut tar::Entry<R>,
    path: &[u8],
    warn: &mut impl FnMut(String),
) -> Result<()> {
    let kind = entry.header().entry_type();
    match kind {
        EntryType::XGlobalHeader
        | EntryType::XHeader
        | EntryType::GNULongName
        | EntryType::GNULongLink => {
            return Ok(());
        }
        _ => {}
    }
    let meta = entry_meta(entry, warn)?;
    match kind {
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
            let size = entry.size();
            builder.add_file(path, meta, entry, size)
        }
        EntryType::Directory => builder.add_dir(path, meta),
        EntryType::Symlink => {
            let target = entry
                .link_name_bytes()
                .context("a symlink without a target")?;
            builder.add_symlink(path, meta, &target)
        }
        EntryType::Link => {
            let target = entry
                .link_name_bytes()
                .context("a hard link without a target")?;
            builder.add_hardlink(path, &target)
        }
        EntryType::Char | EntryType::Block => {
            let h = entry.header();
            let major = h.device_major().context("bad device major")?.unwrap_or(0);
            let minor = h.device_minor().context("bad device minor")?.unwrap_or(0);
            builder.add_device(path, meta, kind == EntryType::Block, major, minor)
        }
        EntryType::Fifo => builder.add_ipc(path, meta, false),
        other => {
            warn(format!(
                "{}: tar entry type {:?} skipped",
                String::from_utf8_lossy(path),
                other
            ));
            Ok(())
        }
    }
}
