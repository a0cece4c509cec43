//! Unit tests of [`super::seal`] and [`super::check_sealed`], as root in a
//! temp folder (the seal needs root's chown and lease rights).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::{check_sealed, seal, SealedFile, SEALED_MODE};
use crate::test_support::skip_unless_root;

/// A uid that stands for the pull user.
const PULL_UID: u32 = 4242;

/// A 0644 file of `PULL_UID` in `dir`, as the pull user publishes it.
fn published(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("image.sqfs");
    std::fs::write(&path, b"hsqs and some bytes").unwrap();
    std::os::unix::fs::chown(&path, Some(PULL_UID), Some(PULL_UID)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

fn read_only(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap()
}

fn owner_and_mode(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.uid(), meta.gid(), meta.mode() & 0o7777)
}

#[test]
fn without_a_writer_the_file_becomes_roots_and_read_only() {
    if skip_unless_root("without_a_writer_the_file_becomes_roots_and_read_only") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = published(dir.path());
    let file = read_only(&path);
    let sealed = seal(&file, &path, &[PULL_UID]).unwrap();
    assert_eq!(owner_and_mode(&path), (0, 0, SEALED_MODE));
    assert_eq!(sealed, SealedFile::of(&file).unwrap());
    check_sealed(&read_only(&path), &path, Some(sealed)).unwrap();
    // Sealing again (the next step) changes nothing and still proves it.
    assert_eq!(seal(&file, &path, &[PULL_UID]).unwrap(), sealed);
}

#[test]
fn a_writable_descriptor_from_before_makes_the_seal_fail() {
    if skip_unless_root("a_writable_descriptor_from_before_makes_the_seal_fail") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = published(dir.path());
    let writer = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let file = read_only(&path);
    let err = format!("{:#}", seal(&file, &path, &[PULL_UID]).unwrap_err());
    assert!(err.contains("still open for writing"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
    // The file is taken from its writer all the same: nobody opens it anew.
    assert_eq!(owner_and_mode(&path), (0, 0, SEALED_MODE));
    drop(writer);
    seal(&file, &path, &[PULL_UID]).unwrap();
}

#[test]
fn a_shared_writable_mapping_makes_the_seal_fail() {
    if skip_unless_root("a_shared_writable_mapping_makes_the_seal_fail") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = published(dir.path());
    let writer = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: a fresh shared mapping of one page of an open file; unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            writer.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    drop(writer); // only the mapping is left
    let file = read_only(&path);
    let err = format!("{:#}", seal(&file, &path, &[PULL_UID]).unwrap_err());
    assert!(err.contains("still open for writing"), "{err}");
    // SAFETY: the mapping made above, of that length, not used after this.
    assert_eq!(unsafe { libc::munmap(map, 4096) }, 0);
    seal(&file, &path, &[PULL_UID]).unwrap();
}

#[test]
fn only_a_regular_file_is_sealed() {
    if skip_unless_root("only_a_regular_file_is_sealed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("image.sqfs");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let file = read_only(&fifo);
    let err = format!("{:#}", seal(&file, &fifo, &[PULL_UID]).unwrap_err());
    assert!(err.contains("not a regular file"), "{err}");
    assert_eq!(owner_and_mode(&fifo).2, 0o644);
    let err = format!("{:#}", check_sealed(&file, &fifo, None).unwrap_err());
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn a_hard_link_is_neither_sealed_nor_mounted() {
    if skip_unless_root("a_hard_link_is_neither_sealed_nor_mounted") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = published(dir.path());
    let path = dir.path().join("linked.sqfs");
    std::fs::hard_link(&elsewhere, &path).unwrap();
    let file = read_only(&path);
    let err = format!("{:#}", seal(&file, &path, &[PULL_UID]).unwrap_err());
    assert!(err.contains("2 links"), "{err}");
    // Root changed nothing of the file the link points to.
    assert_eq!(owner_and_mode(&elsewhere), (PULL_UID, PULL_UID, 0o644));
}

#[test]
fn a_file_of_another_user_is_left_alone() {
    if skip_unless_root("a_file_of_another_user_is_left_alone") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = published(dir.path());
    let file = read_only(&path);
    let err = format!("{:#}", seal(&file, &path, &[PULL_UID + 1]).unwrap_err());
    assert!(err.contains("neither root nor"), "{err}");
    assert_eq!(owner_and_mode(&path), (PULL_UID, PULL_UID, 0o644));
}

#[test]
fn the_holder_refuses_what_is_not_sealed() {
    if skip_unless_root("the_holder_refuses_what_is_not_sealed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = published(dir.path());
    let file = read_only(&path);
    let err = format!("{:#}", check_sealed(&file, &path, None).unwrap_err());
    assert!(
        err.contains("not sealed") && err.contains("uid 4242"),
        "{err}"
    );
    let sealed = seal(&file, &path, &[PULL_UID]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = format!("{:#}", check_sealed(&file, &path, None).unwrap_err());
    assert!(err.contains("mode is 644"), "{err}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(SEALED_MODE)).unwrap();
    let other = SealedFile {
        ino: sealed.ino + 1,
        ..sealed
    };
    let err = format!("{:#}", check_sealed(&file, &path, Some(other)).unwrap_err());
    assert!(err.contains("not the file that was sealed"), "{err}");
    check_sealed(&file, &path, Some(sealed)).unwrap();
}
