//! Reads glibc's loader cache (`/etc/ld.so.cache`, the file `ldconfig -p`
//! prints): which file the loader picks for a soname, on the host or inside a
//! container's root.
//!
//! Only the format glibc has written since 2.32 by default (`glibc-ld.so.cache1.1`,
//! alone or after the old `ld.so-1.7.0` table) is read; entries of other
//! architectures than ours are skipped.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The magic string and version that open the new cache format.
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// Size of the new format's header.
const HEADER_LEN: usize = 48;
/// Size of one entry of the new format.
const ENTRY_LEN: usize = 24;
/// `FLAG_ELF_LIBC6`: a glibc ELF library.
const FLAG_ELF_LIBC6: u32 = 0x0003;
/// The architecture bits glibc sets for libraries of this machine.
#[cfg(target_arch = "x86_64")]
const NATIVE_ARCH: u32 = 0x0300;
#[cfg(target_arch = "aarch64")]
const NATIVE_ARCH: u32 = 0x0a00;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const NATIVE_ARCH: u32 = 0x0000;

/// One library the cache knows: its soname and the path the loader opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The soname (`libcuda.so.1`).
    pub soname: String,
    /// The path the loader opens for it.
    pub path: PathBuf,
}

/// The libraries of this machine's architecture in a loader cache, in the
/// cache's order (the loader's preference order for equal sonames).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LdCache {
    entries: Vec<CacheEntry>,
}

impl LdCache {
    /// Reads and parses the cache file at `path` (a host path).
    pub fn read(path: &Path) -> anyhow::Result<LdCache> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read the loader cache {}", path.display()))?;
        LdCache::parse(&bytes)
            .with_context(|| format!("cannot parse the loader cache {}", path.display()))
    }

    /// Parses the bytes of a cache file.
    pub fn parse(bytes: &[u8]) -> anyhow::Result<LdCache> {
        let Some(start) = find(bytes, NEW_MAGIC) else {
            bail!("no glibc-ld.so.cache1.1 table (only the new format of glibc 2.32 and later is read)");
        };
        let table = &bytes[start..];
        if table.len() < HEADER_LEN {
            bail!("the cache header is truncated");
        }
        let nlibs = u32_at(table, 20)? as usize;
        let mut entries = Vec::with_capacity(nlibs.min(1 << 16));
        for index in 0..nlibs {
            let at = HEADER_LEN + index * ENTRY_LEN;
            let flags = u32_at(table, at)?;
            let key = u32_at(table, at + 4)? as usize;
            let value = u32_at(table, at + 8)? as usize;
            if flags & 0xff != FLAG_ELF_LIBC6 || flags & 0xff00 != NATIVE_ARCH {
                continue;
            }
            entries.push(CacheEntry {
                soname: c_string_at(table, key)?,
                path: PathBuf::from(c_string_at(table, value)?),
            });
        }
        Ok(LdCache { entries })
    }

    /// The path the loader would open for `soname`, if the cache has it.
    pub fn lookup(&self, soname: &str) -> Option<&Path> {
        self.entries
            .iter()
            .find(|entry| entry.soname == soname)
            .map(|entry| entry.path.as_path())
    }

    /// Every entry, in cache order.
    pub fn entries(&self) -> &[CacheEntry] {
        &self.entries
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn u32_at(bytes: &[u8], at: usize) -> anyhow::Result<u32> {
    let slice = bytes
        .get(at..at + 4)
        .with_context(|| format!("truncated at byte {at}"))?;
    Ok(u32::from_ne_bytes(slice.try_into().expect("4 bytes")))
}

fn c_string_at(bytes: &[u8], at: usize) -> anyhow::Result<String> {
    let tail = bytes
        .get(at..)
        .with_context(|| format!("string offset {at} is past the end"))?;
    let len = tail
        .iter()
        .position(|&b| b == 0)
        .with_context(|| format!("string at offset {at} has no end"))?;
    Ok(String::from_utf8_lossy(&tail[..len]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's own cache read by us and printed by `ldconfig -p` agree.
    #[test]
    fn host_cache_matches_ldconfig_p() {
        let ours = LdCache::read(Path::new("/etc/ld.so.cache")).unwrap();
        let output = std::process::Command::new("/sbin/ldconfig")
            .arg("-p")
            .output()
            .unwrap();
        let text = String::from_utf8(output.stdout).unwrap();
        let arch = if cfg!(target_arch = "x86_64") {
            "x86-64"
        } else {
            "AArch64"
        };
        let theirs: Vec<(String, PathBuf)> = text
            .lines()
            .filter(|line| line.contains(&format!("libc6,{arch}")))
            .filter_map(|line| {
                let (left, path) = line.split_once(" => ")?;
                let soname = left.trim().split(' ').next()?.to_string();
                Some((soname, PathBuf::from(path.trim())))
            })
            .collect();
        assert!(theirs.len() > 10, "ldconfig -p printed too little: {text}");
        let mine: Vec<(String, PathBuf)> = ours
            .entries()
            .iter()
            .map(|e| (e.soname.clone(), e.path.clone()))
            .collect();
        assert_eq!(mine, theirs);
        assert!(ours.lookup("libc.so.6").is_some());
        assert!(ours.lookup("libnot-there.so.9").is_none());
    }

    #[test]
    fn refuses_garbage() {
        assert!(LdCache::parse(b"ld.so-1.7.0\0\0\0\0\0").is_err());
        let mut truncated = NEW_MAGIC.to_vec();
        truncated.extend_from_slice(&[1, 0, 0, 0]);
        assert!(LdCache::parse(&truncated).is_err());
    }
}
