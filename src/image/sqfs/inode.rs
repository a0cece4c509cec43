//! Inode encoding: the common header and each type's body, basic or
//! extended, appended to a byte buffer.

/// Inode types (basic; extended = basic + 7).
pub mod types {
    /// Directory.
    pub const DIR: u16 = 1;
    /// Regular file.
    pub const FILE: u16 = 2;
    /// Symbolic link.
    pub const SYMLINK: u16 = 3;
    /// Block device.
    pub const BLKDEV: u16 = 4;
    /// Character device.
    pub const CHRDEV: u16 = 5;
    /// Named pipe.
    pub const FIFO: u16 = 6;
    /// Socket.
    pub const SOCKET: u16 = 7;
    /// Extended type = basic + this.
    pub const EXTENDED: u16 = 7;
}

/// "No xattrs" / "no fragment".
pub const NONE: u32 = u32::MAX;

/// The header every inode starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Permission bits.
    pub mode: u16,
    /// Owner's id table index.
    pub uid_idx: u16,
    /// Group's id table index.
    pub gid_idx: u16,
    /// Modification time.
    pub mtime: u32,
    /// Inode number, 1..=inode_count.
    pub number: u32,
}

fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn header(out: &mut Vec<u8>, kind: u16, h: &Header) {
    put16(out, kind);
    put16(out, h.mode & 0o7777);
    put16(out, h.uid_idx);
    put16(out, h.gid_idx);
    put32(out, h.mtime);
    put32(out, h.number);
}

/// The device number as squashfs (and the kernel's `new_encode_dev`) stores it.
pub fn encode_rdev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// A directory inode's fields.
#[derive(Debug, Clone, Copy)]
pub struct Dir {
    /// Listing's metablock, relative to the directory table's start.
    pub start_block: u32,
    /// Listing's offset in that metablock.
    pub offset: u16,
    /// Listing bytes + 3.
    pub file_size: u32,
    /// 2 + child directories.
    pub nlink: u32,
    /// Parent's inode number (inode_count + 1 for the root).
    pub parent: u32,
    /// Xattr set or [`NONE`].
    pub xattr: u32,
}

/// Appends a directory inode. `index` (its entries, packed, `index_count`
/// of them) makes it extended, as do xattrs and a listing over 64 KiB.
pub fn dir(out: &mut Vec<u8>, h: &Header, d: &Dir, index: &[u8], index_count: u16) {
    let extended = d.xattr != NONE || d.file_size > 0xFFFF || index_count > 0;
    if extended {
        header(out, types::DIR + types::EXTENDED, h);
        put32(out, d.nlink);
        put32(out, d.file_size);
        put32(out, d.start_block);
        put32(out, d.parent);
        put16(out, index_count);
        put16(out, d.offset);
        put32(out, d.xattr);
        out.extend_from_slice(index);
    } else {
        header(out, types::DIR, h);
        put32(out, d.start_block);
        put32(out, d.nlink);
        put16(out, d.file_size as u16);
        put16(out, d.offset);
        put32(out, d.parent);
    }
}

/// A regular file inode's fields.
#[derive(Debug, Clone, Copy)]
pub struct RegFile {
    /// Position of the first block in the image.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// Bytes in sparse (all-zero, not stored) blocks.
    pub sparse: u64,
    /// Names of the file.
    pub nlink: u32,
    /// Fragment block of the tail or [`NONE`].
    pub fragment: u32,
    /// Tail's offset in the fragment block.
    pub fragment_offset: u32,
    /// Xattr set or [`NONE`].
    pub xattr: u32,
}

/// Appends a file inode with its block sizes; extended when a field needs it.
pub fn file(out: &mut Vec<u8>, h: &Header, f: &RegFile, block_sizes: &[u32]) {
    let extended = f.start > u64::from(u32::MAX)
        || f.size > u64::from(u32::MAX)
        || f.nlink > 1
        || f.sparse > 0
        || f.xattr != NONE;
    if extended {
        header(out, types::FILE + types::EXTENDED, h);
        put64(out, f.start);
        put64(out, f.size);
        put64(out, f.sparse);
        put32(out, f.nlink);
        put32(out, f.fragment);
        put32(out, f.fragment_offset);
        put32(out, f.xattr);
    } else {
        header(out, types::FILE, h);
        put32(out, f.start as u32);
        put32(out, f.fragment);
        put32(out, f.fragment_offset);
        put32(out, f.size as u32);
    }
    for &s in block_sizes {
        put32(out, s);
    }
}

/// Appends a symlink inode.
pub fn symlink(out: &mut Vec<u8>, h: &Header, nlink: u32, target: &[u8], xattr: u32) {
    let kind = if xattr != NONE {
        types::SYMLINK + types::EXTENDED
    } else {
        types::SYMLINK
    };
    header(out, kind, h);
    put32(out, nlink);
    put32(out, target.len() as u32);
    out.extend_from_slice(target);
    if xattr != NONE {
        put32(out, xattr);
    }
}

/// Appends a device inode (`basic_type` [`types::BLKDEV`] or [`types::CHRDEV`]).
pub fn device(out: &mut Vec<u8>, h: &Header, basic_type: u16, nlink: u32, rdev: u32, xattr: u32) {
    let kind = basic_type + if xattr != NONE { types::EXTENDED } else { 0 };
    header(out, kind, h);
    put32(out, nlink);
    put32(out, rdev);
    if xattr != NONE {
        put32(out, xattr);
    }
}

/// Appends a fifo or socket inode (`basic_type` [`types::FIFO`] or [`types::SOCKET`]).
pub fn ipc(out: &mut Vec<u8>, h: &Header, basic_type: u16, nlink: u32, xattr: u32) {
    let kind = basic_type + if xattr != NONE { types::EXTENDED } else { 0 };
    header(out, kind, h);
    put32(out, nlink);
    if xattr != NONE {
        put32(out, xattr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Header = Header {
        mode: 0o104755,
        uid_idx: 1,
        gid_idx: 2,
        mtime: 3,
        number: 4,
    };

    #[test]
    fn rdev_is_encoded_as_the_kernel_decodes_it() {
        assert_eq!(encode_rdev(8, 1), 0x801);
        assert_eq!(encode_rdev(1, 3), 0x103);
        let rdev = encode_rdev(259, 0x12345);
        // The kernel's new_decode_dev.
        assert_eq!((rdev & 0xfff00) >> 8, 259);
        assert_eq!((rdev & 0xff) | ((rdev >> 12) & 0xfff00), 0x12345);
    }

    #[test]
    fn header_keeps_permission_bits_only() {
        let mut out = Vec::new();
        ipc(&mut out, &H, types::FIFO, 1, NONE);
        assert_eq!(out.len(), 20);
        assert_eq!(&out[..4], &[6, 0, 0xED, 0x09]);
        assert_eq!(&out[16..20], &1u32.to_le_bytes());
    }

    #[test]
    fn files_become_extended_when_needed() {
        let basic = RegFile {
            start: 96,
            size: 10,
            sparse: 0,
            nlink: 1,
            fragment: 0,
            fragment_offset: 5,
            xattr: NONE,
        };
        let mut out = Vec::new();
        file(&mut out, &H, &basic, &[7]);
        assert_eq!(out.len(), 16 + 16 + 4);
        assert_eq!(out[0], 2);
        for f in [
            RegFile { nlink: 2, ..basic },
            RegFile {
                size: 1 << 32,
                ..basic
            },
            RegFile {
                start: 1 << 32,
                ..basic
            },
            RegFile { sparse: 1, ..basic },
            RegFile { xattr: 0, ..basic },
        ] {
            let mut out = Vec::new();
            file(&mut out, &H, &f, &[]);
            assert_eq!(out.len(), 16 + 40);
            assert_eq!(out[0], 9);
        }
    }

    #[test]
    fn dirs_and_symlinks_encode_their_fields() {
        let d = Dir {
            start_block: 10,
            offset: 20,
            file_size: 3,
            nlink: 2,
            parent: 9,
            xattr: NONE,
        };
        let mut out = Vec::new();
        dir(&mut out, &H, &d, &[], 0);
        assert_eq!(out.len(), 32);
        assert_eq!(out[0], 1);
        assert_eq!(&out[16..20], &10u32.to_le_bytes());
        assert_eq!(&out[20..24], &2u32.to_le_bytes());
        assert_eq!(&out[24..26], &3u16.to_le_bytes());
        let mut out = Vec::new();
        dir(
            &mut out,
            &H,
            &Dir {
                file_size: 70_000,
                ..d
            },
            &[],
            0,
        );
        assert_eq!(out.len(), 40);
        assert_eq!(out[0], 8);
        let mut out = Vec::new();
        symlink(&mut out, &H, 1, b"target", 5);
        assert_eq!(out.len(), 16 + 8 + 6 + 4);
        assert_eq!(out[0], 10);
        let mut out = Vec::new();
        device(&mut out, &H, types::CHRDEV, 1, 0x103, NONE);
        assert_eq!(&out[20..24], &0x103u32.to_le_bytes());
    }
}
