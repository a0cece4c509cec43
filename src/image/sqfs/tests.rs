//! End-to-end tests: tars built with the `tar` crate are written as images
//! by [`write_from_tar`] and by `tar2sqfs`, and the two are compared with
//! `unsquashfs` (listings, extracted trees) and, as root, with the kernel
//! (stat of every path, contents and xattrs of the loop-mounted images).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::*;
use crate::image::squashfs::tar2sqfs_available;

const MTIME: u64 = 1_700_000_000;

/// A tar built entry by entry.
struct Tar {
    b: tar::Builder<Vec<u8>>,
    /// Expected content of each regular file (hard links included).
    files: BTreeMap<String, Vec<u8>>,
}

fn header(kind: EntryType, mode: u32, uid: u64, gid: u64, mtime: u64, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(gid);
    h.set_mtime(mtime);
    h.set_size(size);
    h
}

impl Tar {
    fn new() -> Self {
        Tar {
            b: tar::Builder::new(Vec::new()),
            files: BTreeMap::new(),
        }
    }

    fn dir(&mut self, path: &str, mode: u32, uid: u64, gid: u64, mtime: u64) {
        let mut h = header(EntryType::Directory, mode, uid, gid, mtime, 0);
        self.b.append_data(&mut h, path, std::io::empty()).unwrap();
    }

    fn file_owned(&mut self, path: &str, mode: u32, uid: u64, gid: u64, content: &[u8]) {
        let mut h = header(
            EntryType::Regular,
            mode,
            uid,
            gid,
            MTIME,
            content.len() as u64,
        );
        self.b.append_data(&mut h, path, content).unwrap();
        self.files.insert(path.to_string(), content.to_vec());
    }

    fn file(&mut self, path: &str, content: &[u8]) {
        self.file_owned(path, 0o644, 0, 0, content);
    }

    fn symlink(&mut self, path: &str, target: &str) {
        let mut h = header(EntryType::Symlink, 0o777, 0, 0, MTIME, 0);
        self.b.append_link(&mut h, path, target).unwrap();
    }

    /// A hard link; `content` is the target's, for the expected files.
    fn hardlink(&mut self, path: &str, target: &str, content: &[u8]) {
        let mut h = header(EntryType::Link, 0o644, 0, 0, MTIME, 0);
        self.b.append_link(&mut h, path, target).unwrap();
        self.files.insert(path.to_string(), content.to_vec());
    }

    fn device(&mut self, path: &str, kind: EntryType, major: u32, minor: u32) {
        let mut h = header(kind, 0o660, 0, 6, MTIME, 0);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        self.b.append_data(&mut h, path, std::io::empty()).unwrap();
    }

    /// PAX records for the next entry.
    fn pax(&mut self, records: &[(&str, &[u8])]) {
        let mut data = Vec::new();
        for (k, v) in records {
            let body = 1 + k.len() + 1 + v.len() + 1;
            let mut len = body + 1;
            while body + len.to_string().len() != len {
                len = body + len.to_string().len();
            }
            data.extend_from_slice(format!("{len} {k}=").as_bytes());
            data.extend_from_slice(v);
            data.push(b'\n');
        }
        let mut h = Header::new_ustar();
        h.set_entry_type(EntryType::XHeader);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        self.b
            .append_data(&mut h, "PaxHeader", data.as_slice())
            .unwrap();
    }

    fn finish(self) -> (Vec<u8>, BTreeMap<String, Vec<u8>>) {
        (self.b.into_inner().unwrap(), self.files)
    }
}

/// Appends an entry whose path is given as raw bytes (the builder refuses
/// `..`), with no checks.
fn raw_entry(tar: &mut Vec<u8>, name: &[u8], kind: EntryType, content: &[u8]) {
    let mut h = header(kind, 0o644, 0, 0, MTIME, content.len() as u64);
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_cksum();
    tar.extend_from_slice(h.as_bytes());
    tar.extend_from_slice(content);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
}

/// Deterministic bytes that compress somewhat.
fn text(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b"etaoin shrdlu\n"[(x % 14) as usize]
        })
        .collect()
}

/// Deterministic bytes that do not compress.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn options() -> WriterOptions {
    WriterOptions {
        jobs: 2,
        ..WriterOptions::default()
    }
}

/// Berth's image of `tar` in `dir`.
fn write_berth(tar: &[u8], dir: &Path) -> (PathBuf, WriteStats) {
    write_berth_with(tar, dir, &options())
}

fn write_berth_with(tar: &[u8], dir: &Path, options: &WriterOptions) -> (PathBuf, WriteStats) {
    let path = dir.join("berth.sqfs");
    let stats = write_from_tar(tar, File::create(&path).unwrap(), options).unwrap();
    (path, stats)
}

/// tar2sqfs's image of `tar` in `dir`.
fn write_reference(tar: &[u8], dir: &Path, block_size: u32) -> PathBuf {
    let path = dir.join("tar2sqfs.sqfs");
    let mut child = Command::new("tar2sqfs")
        .args(["-q", "-f", "-c", "zstd", "-X", "level=3", "-j", "2"])
        .args(["-b", &block_size.to_string()])
        .arg(&path)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(tar).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "tar2sqfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn unsquashfs(args: &[&str], image: &Path) -> String {
    let out = Command::new("unsquashfs")
        .args(args)
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "unsquashfs {args:?} {}: {}{}",
        image.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What a path in an extracted or mounted tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    kind: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    rdev: u64,
    mtime: i64,
    content: Option<String>,
    target: Option<PathBuf>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Every path under `root` (relative, "" for the root). `mounted`: the
/// kernel's view (xattrs read, directory sizes and links kept); otherwise an
/// unsquashfs extraction (those depend on the local file system).
fn walk(root: &Path, mounted: bool) -> BTreeMap<PathBuf, Stat> {
    let mut out = BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let path = root.join(&rel);
        let m = std::fs::symlink_metadata(&path).unwrap();
        let kind = m.mode() & libc::S_IFMT;
        let is_dir = m.is_dir();
        let mut s = Stat {
            kind,
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            size: if is_dir && !mounted { 0 } else { m.size() },
            nlink: if is_dir && !mounted { 0 } else { m.nlink() },
            rdev: m.rdev(),
            mtime: m.mtime(),
            content: None,
            target: None,
            xattrs: if mounted {
                xattrs(&path)
            } else {
                BTreeMap::new()
            },
        };
        if m.is_file() {
            s.content = Some(sha(&std::fs::read(&path).unwrap()));
        } else if m.file_type().is_symlink() {
            s.target = Some(std::fs::read_link(&path).unwrap());
            if !mounted {
                s.mtime = 0;
            }
        } else if is_dir {
            for e in std::fs::read_dir(&path).unwrap() {
                todo.push(rel.join(e.unwrap().file_name()));
            }
        }
        out.insert(rel, s);
    }
    out
}

/// The xattrs of `path` (not following a symlink).
fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 64 * 1024];
    // SAFETY: `c` is a NUL-terminated path and `names` is writable for its
    // length; llistxattr writes at most that many bytes.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        // An image without xattrs supports none.
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP),
            "llistxattr {}: {e}",
            path.display()
        );
        return BTreeMap::new();
    }
    let mut out = BTreeMap::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cname = std::ffi::CString::new(name).unwrap();
        let mut value = vec![0u8; 64 * 1024];
        // SAFETY: both strings are NUL-terminated and `value` is writable
        // for its length; lgetxattr writes at most that many bytes.
        let v = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(
            v >= 0,
            "lgetxattr {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        value.truncate(v as usize);
        out.insert(name.to_vec(), value);
    }
    out
}

/// A loop mount of an image, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn new(image: &Path, at: &Path) -> Option<Mount> {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "squashfs", "-o", "loop,ro"])
            .arg(image)
            .arg(at)
            .output()
            .unwrap();
        if out.status.success() {
            Some(Mount(at.to_path_buf()))
        } else {
            eprintln!(
                "cannot loop-mount {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let status = Command::new("umount").arg(&self.0).status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("cannot unmount {}", self.0.display());
        }
    }
}

/// Checks berth's image of `tar` against tar2sqfs's and against `files`:
/// listings, extracted trees and file contents, and as root the kernel's
/// view of both. Returns berth's stats and the kernel's view of its image
/// (None when not checked).
fn check(
    tar: &[u8],
    files: &BTreeMap<String, Vec<u8>>,
    test: &str,
) -> (WriteStats, Option<BTreeMap<PathBuf, Stat>>) {
    check_with(tar, files, test, &options())
}

/// [`check`] with other options (tar2sqfs gets the same block size).
fn check_with(
    tar: &[u8],
    files: &BTreeMap<String, Vec<u8>>,
    test: &str,
    options: &WriterOptions,
) -> (WriteStats, Option<BTreeMap<PathBuf, Stat>>) {
    let dir = tempfile::tempdir().unwrap();
    let (image, stats) = write_berth_with(tar, dir.path(), options);
    let size = std::fs::metadata(&image).unwrap().len();
    assert_eq!(size % 4096, 0);
    assert_eq!(size, stats.image_size);

    // Extraction: the tar's bytes and modes.
    let ours = dir.path().join("ours");
    unsquashfs(&["-q", "-no-xattrs", "-d", ours.to_str().unwrap()], &image);
    let extracted = walk(&ours, false);
    for (path, content) in files {
        let got = std::fs::read(ours.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(got == *content, "{path}: content differs");
        assert!(extracted[Path::new(path)].content.is_some());
    }

    if !tar2sqfs_available()
        && crate::test_support::skip_because(test, "no tar2sqfs to compare with")
    {
        return (stats, None);
    }
    let reference = write_reference(tar, dir.path(), options.block_size);
    let listing = |img: &Path| unsquashfs(&["-lln", "-d", "root"], img);
    let (a, b) = (listing(&image), listing(&reference));
    if a != b {
        let diff: Vec<String> = a
            .lines()
            .zip(b.lines())
            .filter(|(x, y)| x != y)
            .take(10)
            .map(|(x, y)| format!("berth:    {x}\ntar2sqfs: {y}"))
            .collect();
        panic!(
            "listings differ ({} vs {} lines):\n{}",
            a.lines().count(),
            b.lines().count(),
            diff.join("\n")
        );
    }
    let theirs = dir.path().join("theirs");
    unsquashfs(
        &["-q", "-no-xattrs", "-d", theirs.to_str().unwrap()],
        &reference,
    );
    assert_eq!(extracted, walk(&theirs, false));

    if !nix::unistd::geteuid().is_root() {
        eprintln!("{test}: not root, images not mounted");
        return (stats, None);
    }
    let Some(m1) = Mount::new(&image, &dir.path().join("m-ours")) else {
        return (stats, None);
    };
    let Some(m2) = Mount::new(&reference, &dir.path().join("m-theirs")) else {
        return (stats, None);
    };
    let (k1, k2) = (walk(&m1.0, true), walk(&m2.0, true));
    // A directory's link count is 2 + its subdirectories (tar2sqfs counts
    // every child instead): checked on its own, then left out.
    for (path, s) in &k1 {
        if s.kind == libc::S_IFDIR {
            let subdirs = k1
                .iter()
                .filter(|(p, c)| {
                    p.parent() == Some(path) && !p.as_os_str().is_empty() && c.kind == libc::S_IFDIR
                })
                .count() as u64;
            assert_eq!(s.nlink, 2 + subdirs, "link count of {}", path.display());
        }
    }
    let no_dir_links = |k: &BTreeMap<PathBuf, Stat>| -> BTreeMap<PathBuf, Stat> {
        k.iter()
            .map(|(p, s)| {
                let mut s = s.clone();
                if s.kind == libc::S_IFDIR {
                    s.nlink = 0;
                }
                (p.clone(), s)
            })
            .collect()
    };
    let (n1, n2) = (no_dir_links(&k1), no_dir_links(&k2));
    for (path, s) in &n1 {
        assert_eq!(Some(s), n2.get(path), "kernel's stat of {}", path.display());
    }
    assert_eq!(k1.len(), k2.len());
    for (path, content) in files {
        assert!(
            std::fs::read(m1.0.join(path)).unwrap() == *content,
            "{path}: mounted content differs"
        );
    }
    (stats, Some(k1))
}

const BS: usize = 131072;

#[test]
fn a_tree_of_every_kind_matches_tar2sqfs() {
    let mut t = Tar::new();
    t.dir(".", 0o755, 0, 0, 1_600_000_000);
    // Deep.
    let deep: Vec<String> = (0..40).map(|i| format!("d{i}")).collect();
    t.file(&format!("deep/{}/leaf", deep.join("/")), b"leaf\n");
    // A directory of 600 entries (several runs and inode metablocks).
    for i in 0..600 {
        t.file(&format!("many/f{i:03}"), format!("{i}\n").as_bytes());
    }
    // Sizes around the block size.
    let one_block = text(1, BS);
    let three_and_tail = text(2, 3 * BS + 1000);
    let mut zero_block = noise(3, BS);
    zero_block.extend(vec![0; BS]);
    zero_block.extend(noise(4, BS + 10));
    let incompressible = noise(5, BS + 5000);
    t.file("files/empty", b"");
    t.file("files/one_block", &one_block);
    t.file("files/three_and_tail", &three_and_tail);
    t.file("files/zero_block", &zero_block);
    t.file("files/all_zero", &vec![0; 2 * BS]);
    t.file("files/incompressible", &incompressible);
    // Hard links: before the target, after it, from another directory.
    let later = text(6, 5000);
    t.hardlink("links/early", "files/later_target", &later);
    t.file("files/later_target", &later);
    t.hardlink("links/late", "files/three_and_tail", &three_and_tail);
    t.hardlink("links/other_dir", "many/f001", b"1\n");
    t.hardlink("many/f001_again", "many/f001", b"1\n");
    // Symlinks.
    t.symlink("sym/short", "../files/empty");
    t.symlink("sym/long", &format!("{}/target", "a".repeat(300)));
    // Devices and a fifo.
    t.device("dev/null", EntryType::Char, 1, 3);
    t.device("dev/sda", EntryType::Block, 8, 0);
    t.device("dev/big", EntryType::Char, 259, 0x12345);
    let mut h = header(EntryType::Fifo, 0o600, 7, 8, MTIME, 0);
    t.b.append_data(&mut h, "dev/fifo", std::io::empty())
        .unwrap();
    // Modes.
    t.file_owned("modes/suid", 0o4755, 0, 0, b"#!/bin/sh\n");
    t.dir("modes/sgid", 0o2755, 0, 50, MTIME);
    t.dir("modes/sticky", 0o1777, 0, 0, MTIME);
    t.file_owned("modes/none", 0o000, 0, 0, b"x");
    // Many ids, over 65535 and over one id metablock (2048 ids).
    for i in 0..1100u64 {
        t.file_owned(&format!("ids/u{i}"), 0o640, 100_000 + i, 70_000 + i, b"");
    }
    // Xattrs: a capability, a shared set, a directory's, a skipped prefix.
    let cap: &[u8] = &[
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    t.pax(&[
        ("SCHILY.xattr.security.capability", cap),
        ("SCHILY.xattr.user.a", b"1"),
    ]);
    t.file("x/cap", b"cap");
    for name in ["x/shared1", "x/shared2"] {
        t.pax(&[
            ("SCHILY.xattr.user.mime", b"text/plain"),
            ("SCHILY.xattr.trusted.t", b"value"),
        ]);
        t.file(name, name.as_bytes());
    }
    t.pax(&[("SCHILY.xattr.user.d", b"dir")]);
    t.dir("x/dir", 0o755, 0, 0, MTIME);
    t.pax(&[
        ("SCHILY.xattr.system.foo", b"no"),
        ("SCHILY.xattr.user.ok", b"yes"),
    ]);
    t.file("x/skipped", b"s");
    // Parents after their children, and never.
    t.file("late/child/file", b"late");
    t.dir("late/child", 0o700, 5, 6, 1_234_567_890);
    t.dir("late", 0o750, 0, 0, 1_234_567_891);
    t.file("implicit/a/b/file", b"implicit");
    // A 255-byte name.
    t.file(&format!("names/{}", "n".repeat(255)), b"long name");
    let (tar, files) = t.finish();

    let (stats, mounted) = check(&tar, &files, "a_tree_of_every_kind_matches_tar2sqfs");
    assert_eq!(stats.sparse_blocks, 3);
    assert_eq!(stats.xattr_sets, 4);
    assert_eq!(stats.ids, 6 + 2 * 1100);
    assert_eq!(stats.warnings.len(), 1, "{:?}", stats.warnings);
    assert!(
        stats.warnings[0].contains("system.foo"),
        "{:?}",
        stats.warnings
    );
    // Hard links are one inode: 4 link names less than the entries, plus
    // the implicit directories and the root.
    let Some(k) = mounted else { return };
    let st = |p: &str| k[Path::new(p)].clone();
    assert_eq!(st("files/three_and_tail").nlink, 2);
    assert_eq!(st("many/f001").nlink, 3);
    assert_eq!(st("files/later_target").nlink, 2);
    assert_eq!(st("dev/big").rdev, libc::makedev(259, 0x12345));
    assert_eq!(st("dev/sda").kind, libc::S_IFBLK);
    assert_eq!(st("modes/suid").mode, 0o4755);
    assert_eq!(st("modes/sticky").mode, 0o1777);
    assert_eq!(st("ids/u1099").uid, 101_099);
    assert_eq!(st("ids/u1099").gid, 71_099);
    assert_eq!(
        (
            st("late/child").mode,
            st("late/child").uid,
            st("late/child").mtime
        ),
        (0o700, 5, 1_234_567_890)
    );
    assert_eq!((st("implicit/a").mode, st("implicit/a").mtime), (0o755, 0));
    assert_eq!(st("").mtime, 1_600_000_000);
    assert_eq!(st("many").nlink, 2);
    assert_eq!(st("").nlink, 2 + 12);
    let x = st("x/cap").xattrs;
    assert_eq!(x[&b"security.capability".to_vec()], cap);
    assert_eq!(x[&b"user.a".to_vec()], b"1");
    assert_eq!(st("x/shared2").xattrs, st("x/shared1").xattrs);
    assert_eq!(st("x/shared1").xattrs.len(), 2);
    assert_eq!(st("x/dir").xattrs[&b"user.d".to_vec()], b"dir");
    assert_eq!(
        st("x/skipped").xattrs.keys().collect::<Vec<_>>(),
        vec![&b"user.ok".to_vec()]
    );
    assert_eq!(st("sym/long").target.unwrap().as_os_str().len(), 307);
}

/// Many files in few directories: inodes over many metablocks, listings
/// split where the inode metablock changes.
#[test]
fn thousands_of_files_match_tar2sqfs() {
    let mut t = Tar::new();
    for d in 0..5 {
        for i in 0..1500 {
            let content = text(d * 10_000 + i, (i % 300) as usize);
            t.file(&format!("d{d}/file_with_a_longer_name_{i:05}"), &content);
        }
    }
    let (tar, files) = t.finish();
    let (stats, _) = check(&tar, &files, "thousands_of_files_match_tar2sqfs");
    assert_eq!(stats.inodes, 7500 + 6);
    assert!(stats.fragments > 5, "{stats:?}");
}

fn error_of(tar: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = File::create(dir.path().join("x.sqfs")).unwrap();
    format!("{:#}", write_from_tar(tar, f, &options()).unwrap_err())
}

#[test]
fn dotdot_nul_duplicates_and_dangling_links_are_refused() {
    let mut tar = Vec::new();
    raw_entry(&mut tar, b"a/../../etc/passwd", EntryType::Regular, b"x");
    let e = error_of(&tar);
    assert!(e.contains("a/../../etc/passwd") && e.contains(".."), "{e}");

    let mut t = Tar::new();
    t.file("a", b"1");
    t.file("a", b"2");
    let e = error_of(&t.finish().0);
    assert!(e.contains("(a)") && e.contains("twice"), "{e}");

    let mut t = Tar::new();
    t.file("f", b"1");
    t.file("f/g", b"2");
    let e = error_of(&t.finish().0);
    assert!(e.contains("f/g") && e.contains("not a directory"), "{e}");

    let mut t = Tar::new();
    t.hardlink("l", "missing", b"");
    let e = error_of(&t.finish().0);
    assert!(e.contains("hard link l") && e.contains("missing"), "{e}");

    let mut t = Tar::new();
    t.dir("d", 0o755, 0, 0, MTIME);
    t.hardlink("l", "d", b"");
    let e = error_of(&t.finish().0);
    assert!(e.contains("directory"), "{e}");

    // A NUL in a PAX path.
    let mut t = Tar::new();
    t.pax(&[("path", b"a\0b")]);
    t.file("placeholder", b"");
    let e = error_of(&t.finish().0);
    assert!(e.contains("NUL"), "{e}");
}

/// A chain of hard links (a link to a link) ends at the file.
#[test]
fn hard_link_chains_resolve() {
    let mut t = Tar::new();
    t.hardlink("c", "b", b"data");
    t.hardlink("b", "a", b"data");
    t.file("a", b"data");
    let (tar, files) = t.finish();
    let dir = tempfile::tempdir().unwrap();
    let (image, stats) = write_berth(&tar, dir.path());
    assert_eq!(stats.inodes, 2);
    let out = dir.path().join("x");
    unsquashfs(&["-q", "-no-xattrs", "-d", out.to_str().unwrap()], &image);
    for (p, c) in &files {
        assert_eq!(&std::fs::read(out.join(p)).unwrap(), c);
    }
    assert_eq!(std::fs::metadata(out.join("c")).unwrap().nlink(), 3);
}

fn vm_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

const MEMORY_FILES: u64 = 200_000;

/// Run by `memory_grows_with_files_only` in a process of its own: streams
/// [`MEMORY_FILES`] small files through a pipe into the writer and prints
/// how far the peak RSS grew.
#[test]
#[ignore]
fn memory_child() {
    if std::env::var_os("BERTH_SQFS_MEMORY_CHILD").is_none() {
        return;
    }
    // BERTH_SQFS_MEMORY_FILES: another count, to measure by hand.
    let files: u64 = std::env::var("BERTH_SQFS_MEMORY_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MEMORY_FILES);
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    let before = vm_kib("VmRSS:");
    let generator = std::thread::spawn(move || {
        let mut b = tar::Builder::new(std::io::BufWriter::new(writer));
        let content = text(9, 4096);
        for i in 0..files {
            let len = 50 + (i % 200) as usize;
            let mut h = header(EntryType::Regular, 0o644, 0, 0, MTIME, len as u64);
            let path = format!("dir{:04}/file_{i:07}", i / 1000);
            b.append_data(&mut h, path, &content[(i % 3000) as usize..][..len])
                .unwrap();
        }
        b.into_inner().unwrap().flush().unwrap();
    });
    let f = File::create(dir.path().join("m.sqfs")).unwrap();
    let stats = write_from_tar(reader, f, &options()).unwrap();
    generator.join().unwrap();
    let peak = vm_kib("VmHWM:");
    assert_eq!(stats.inodes, files + files.div_ceil(1000) + 1);
    println!(
        "MEMORY growth_kib={} metadata_bytes={}",
        peak.saturating_sub(before),
        stats.metadata_bytes
    );
}

/// The writer's memory for 200,000 files: its own count of the tree and
/// final-pass tables, and the peak RSS growth of a process that does only
/// that.
#[test]
fn memory_grows_with_files_only() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "image::sqfs::tests::memory_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BERTH_SQFS_MEMORY_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("MEMORY ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no MEMORY line in {stdout}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    };
    let (growth, metadata) = (field("growth_kib") * 1024, field("metadata_bytes"));
    eprintln!("200k files: peak RSS growth {growth} bytes, tree and tables {metadata} bytes");
    // Per file: a 48-byte node and a 12-byte name, then up to 11 bytes of
    // lookup table while the tar is read or 20 bytes of final-pass tables
    // (children, numbers, order, references); chunked storage adds at most a
    // 1 MiB name chunk and a 768 KiB node chunk.
    let per_file = 48 + 12 + 20;
    assert!(
        metadata <= MEMORY_FILES * per_file + (2 << 20),
        "{metadata}"
    );
    // RSS: that and fixed costs: zstd contexts (two workers, two metadata
    // writers), up to 6 blocks in flight and their compressed copies, 1 MiB
    // write buffers, the compressed directory table, allocator slack.
    let bound = MEMORY_FILES * per_file + (24 << 20);
    assert!(
        growth <= bound,
        "peak RSS grew {growth} bytes, over {bound}"
    );
}

/// Measures a large tar:
/// `BERTH_SQFS_BENCH_TAR=f.tar [BERTH_SQFS_BENCH_LEVEL=1] cargo test --release --lib bench_write_from_tar -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_write_from_tar() {
    let Some(tar) = std::env::var_os("BERTH_SQFS_BENCH_TAR") else {
        eprintln!("set BERTH_SQFS_BENCH_TAR to a tar file");
        return;
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = std::env::var_os("BERTH_SQFS_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("bench.sqfs"));
    let start = std::time::Instant::now();
    let input = std::io::BufReader::with_capacity(1 << 20, File::open(&tar).unwrap());
    // BERTH_SQFS_BENCH_LEVEL: another zstd level, to weigh time against size.
    let mut options = WriterOptions::default();
    if let Some(level) = std::env::var("BERTH_SQFS_BENCH_LEVEL")
        .ok()
        .and_then(|l| l.parse().ok())
    {
        options.zstd_level = level;
    }
    let stats = write_from_tar(input, File::create(&out).unwrap(), &options).unwrap();
    eprintln!("{:.2?}: {stats:?}", start.elapsed());
    eprintln!("peak RSS {} KiB", vm_kib("VmHWM:"));
}

/// An empty tar is an image of an empty root directory.
#[test]
fn an_empty_tar_is_an_empty_root() {
    let (tar, files) = Tar::new().finish();
    let (stats, mounted) = check(&tar, &files, "an_empty_tar_is_an_empty_root");
    assert_eq!(
        (stats.inodes, stats.fragments, stats.data_blocks),
        (1, 0, 0)
    );
    if let Some(k) = mounted {
        assert_eq!(k.len(), 1);
        assert_eq!(k[Path::new("")].mode, 0o755);
    }
}

/// A tar cut short in a file's data is an error naming the entry.
#[test]
fn a_truncated_tar_is_an_error() {
    let mut t = Tar::new();
    t.file("big", &text(1, 3 * BS));
    let (mut tar, _) = t.finish();
    tar.truncate(512 + BS + 100);
    let e = error_of(&tar);
    assert!(e.contains("(big)") && e.contains("cannot read"), "{e}");
}

/// Another block size: a 4 KiB block image reads back the same.
#[test]
fn small_blocks_read_back() {
    let mut t = Tar::new();
    t.file("a", &text(1, 4096 * 3 + 17));
    t.file("b", &vec![0; 8192]);
    t.file("c", &noise(2, 4096));
    let (tar, files) = t.finish();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("small.sqfs");
    let options = WriterOptions {
        block_size: 4096,
        jobs: 3,
        zstd_level: 1,
    };
    let stats = write_from_tar(tar.as_slice(), File::create(&image).unwrap(), &options).unwrap();
    assert_eq!(
        (stats.data_blocks, stats.sparse_blocks, stats.fragments),
        (6, 2, 1)
    );
    let out = dir.path().join("x");
    unsquashfs(&["-q", "-no-xattrs", "-d", out.to_str().unwrap()], &image);
    for (p, c) in &files {
        assert!(&std::fs::read(out.join(p)).unwrap() == c, "{p}");
    }
    assert!(unsquashfs(&["-stat"], &image).contains("Block size 4096"));
}

/// With 4 KiB blocks, 600 tails of 3000 bytes fill 600 fragment blocks (two
/// metablocks of fragment table), and 600 distinct xattr sets two
/// metablocks of xattr id table.
#[test]
fn many_fragments_and_xattr_sets() {
    let mut t = Tar::new();
    for i in 0..600u64 {
        let value = format!("value {i}");
        t.pax(&[("SCHILY.xattr.user.n", value.as_bytes())]);
        t.file(
            &format!("f{i:03}"),
            &text(i, 3000 + (i as usize % 7) * 4096),
        );
    }
    let (tar, files) = t.finish();
    let options = WriterOptions {
        block_size: 4096,
        ..options()
    };
    let (stats, mounted) = check_with(&tar, &files, "many_fragments_and_xattr_sets", &options);
    assert_eq!((stats.fragments, stats.xattr_sets), (600, 600));
    if let Some(k) = mounted {
        for i in 0..600 {
            let x = &k[Path::new(&format!("f{i:03}"))].xattrs;
            assert_eq!(x[&b"user.n".to_vec()], format!("value {i}").as_bytes());
        }
    }
}
