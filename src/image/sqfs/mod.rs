//! A streaming squashfs 4.0 writer: a tar stream in, a zstd-compressed
//! squashfs image out, in place of `tar2sqfs` (squashfs-tools-ng), with far
//! less memory per file.
//!
//! File data is compressed as it streams in (full blocks by worker threads,
//! tails packed into fragment blocks) and written straight to the image, in
//! order; only the tree stays in memory, compactly (see [`tree`]): 48 bytes
//! per name plus the name, up to 11 more for the lookup table while the tar
//! is read, and 20 for the final pass. At the end the inodes are written
//! in one pass (children before their directory, numbered as tar2sqfs
//! numbers them), then the directory, fragment, id and xattr tables, and the
//! superblock at the start.
//!
//! Layout: superblock (96 bytes), data and fragment blocks, inode table,
//! directory table, fragment table, id table, xattr tables; padded to 4 KiB.
//! No export table and no compressor options (the kernel needs neither).
//!
//! Semantics follow tar2sqfs: parents may come after their children (made
//! 0755 root:root mtime 0 until their entry comes), a later directory entry
//! updates a directory's metadata, hard links are resolved at the end
//! whatever their order, PAX `SCHILY.xattr.*` records become xattrs for the
//! `user.`, `trusted.` and `security.` prefixes.

mod builder;
mod data;
mod dirtable;
mod from_tar;
mod inode;
mod metablock;
mod order;
mod tables;
mod tree;

#[cfg(test)]
mod tests;

/// How to write the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterOptions {
    /// Compression threads.
    pub jobs: usize,
    /// zstd level of data and metadata blocks.
    pub zstd_level: i32,
    /// Data block size: a power of two from 4 KiB to 1 MiB.
    pub block_size: u32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            zstd_level: 3,
            block_size: 128 * 1024,
        }
    }
}

/// What a write did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Inodes in the image (hard links counted once).
    pub inodes: u64,
    /// Image size, padded to 4 KiB.
    pub image_size: u64,
    /// Full data blocks (sparse ones included).
    pub data_blocks: u64,
    /// Full data blocks that were all zeros, stored as holes.
    pub sparse_blocks: u64,
    /// Fragment blocks.
    pub fragments: u64,
    /// Tar entries used.
    pub entries: u64,
    /// File content bytes.
    pub bytes: u64,
    /// Distinct xattr sets.
    pub xattr_sets: u64,
    /// Distinct uids and gids.
    pub ids: u64,
    /// Most bytes the tree and the final pass's tables had allocated.
    pub metadata_bytes: u64,
    /// Entries or records skipped, and why.
    pub warnings: Vec<String>,
}

/// Writes the file system in the tar stream `tar` as a squashfs image to `out`.
pub fn write_from_tar(
    tar: impl std::io::Read,
    out: std::fs::File,
    options: &WriterOptions,
) -> anyhow::Result<WriteStats> {
    from_tar::write_from_tar(tar, out, options)
}
