//! Path operations inside a folder that someone else controls (an image's
//! root file system, a folder of the pull user or of the job's user) that
//! they cannot turn against the host. (Base layer: the container, the store
//! and fan-out all use it; `crate::container::safepath` names it too.)
//!
//! Every lookup goes through `openat2(2)` with `RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS` relative to an `O_PATH` descriptor of the root, so
//! `..` and absolute symlinks (`/etc -> /host/etc`, `passwd -> ../../../etc/shadow`)
//! resolve inside the root, never outside it. Files and directories are created
//! with `mkdirat`/`openat` on the resolved parent, and mounts go onto the
//! resolved descriptor (`move_mount`, see [`crate::container::mounts`]).
//!
//! Two rules keep writes inside the root: a dangling symlink on a path we must
//! create is replaced by the directory or file we need, and [`RootDir::write_file`]
//! replaces the final component (rename over it) instead of following it.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// What to create at a path that does not exist yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory (mode 0755 before umask).
    Dir,
    /// An empty regular file (mode 0644 before umask).
    File,
}

/// An open root directory that paths are resolved in.
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    path: PathBuf,
    /// `RESOLVE_*` bits added to every lookup.
    resolve: u64,
    /// The (uid, gid) given to what this root creates; `None`: the caller's.
    new_owner: Option<(u32, u32)>,
}

impl RootDir {
    /// Opens `path` (a host path) as the root to resolve in.
    pub fn open(path: &Path) -> io::Result<RootDir> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(path)?;
        Ok(RootDir {
            fd: file.into(),
            path: path.to_path_buf(),
            resolve: 0,
            new_owner: None,
        })
    }

    /// This root, with lookups that never cross a mount point
    /// (`RESOLVE_NO_XDEV`): what root creates for its own binds must be
    /// reached through the image's own file system, never through a host
    /// folder bound in before (`/tmp`, `/dev`), where a user's symlink
    /// could send it.
    pub fn on_one_mount(&self) -> io::Result<RootDir> {
        Ok(RootDir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
            resolve: self.resolve | libc::RESOLVE_NO_XDEV,
            new_owner: self.new_owner,
        })
    }

    /// This root, with lookups that follow no symlink at all
    /// (`RESOLVE_NO_SYMLINKS`), inside the root or not: for root working in
    /// a folder another user can change (the pull user's store areas), where
    /// a link could point at `/etc/shadow` or a device.
    pub fn without_symlinks(&self) -> io::Result<RootDir> {
        Ok(RootDir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
            resolve: self.resolve | libc::RESOLVE_NO_SYMLINKS,
            new_owner: self.new_owner,
        })
    }

    /// Opens the regular file at `path` inside the root with `flags` (e.g.
    /// `O_RDONLY`, or `O_WRONLY | O_CREAT` with `mode`), non-blocking and
    /// without following a final symlink, and checks what it opened: a
    /// regular file with one link (a hard link to a file elsewhere, such as
    /// `/etc/shadow`, is refused), owned by root or by one of `owners`.
    pub fn open_regular(
        &self,
        path: &Path,
        flags: i32,
        mode: u32,
        owners: &[u32],
    ) -> io::Result<File> {
        let parts = components(path)?;
        let flags = flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = openat2_with(
            self.fd.as_fd(),
            &join_parts(&parts),
            flags,
            mode,
            self.resolve,
        )?;
        let stat = fstat(fd.as_raw_fd())?;
        let refuse = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", self.path.join(path).display()),
            )
        };
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(refuse("not a regular file".into()));
        }
        if stat.st_nlink > 1 {
            return Err(refuse(format!("has {} hard links", stat.st_nlink)));
        }
        if stat.st_uid != 0 && !owners.contains(&stat.st_uid) {
            return Err(refuse(format!("belongs to uid {}", stat.st_uid)));
        }
        Ok(File::from(fd))
    }

    /// Reads the regular file at `path` inside the root as
    /// [`RootDir::open_regular`] opens it, up to `limit` bytes (more is an
    /// error); `None` when it does not exist.
    pub fn read_regular(
        &self,
        path: &Path,
        limit: u64,
        owners: &[u32],
    ) -> io::Result<Option<Vec<u8>>> {
        let file = match self.open_regular(path, libc::O_RDONLY, 0, owners) {
            Ok(file) => file,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(err) => return Err(err),
        };
        let mut contents = Vec::new();
        file.take(limit + 1).read_to_end(&mut contents)?;
        if contents.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: larger than {limit} bytes",
                    self.path.join(path).display()
                ),
            ));
        }
        Ok(Some(contents))
    }

    /// The same root, giving every file and directory it creates from now on
    /// (by [`RootDir::write_file`] and the `ensure` calls) this owner.
    pub fn owning_new_entries(self, uid: u32, gid: u32) -> RootDir {
        RootDir {
            new_owner: Some((uid, gid)),
            ..self
        }
    }

    /// The host path this root was opened from (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An `O_PATH` descriptor of `path` inside the root, following symlinks
    /// inside the root.
    pub fn resolve(&self, path: &Path) -> io::Result<OwnedFd> {
        self.resolve_parts(&components(path)?)
    }

    /// Reads the regular file at `path` inside the root; `None` when it does not
    /// exist. Fails on anything but a regular file (a FIFO cannot block us) and
    /// on files larger than `limit` bytes.
    pub fn read_file(&self, path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
        let parts = components(path)?;
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
        let fd = match openat2_in_root(self.fd.as_fd(), &join_parts(&parts), flags, self.resolve) {
            Ok(fd) => fd,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(err) => return Err(err),
        };
        let stat = fstat(fd.as_raw_fd())?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a regular file",
            ));
        }
        let mut contents = Vec::new();
        File::from(fd).take(limit + 1).read_to_end(&mut contents)?;
        if contents.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("larger than {limit} bytes"),
            ));
        }
        Ok(Some(contents))
    }

    /// Writes `contents` to `path` inside the root, creating missing parent
    /// directories. The file is written under a temporary name and renamed over
    /// `path`, so a symlink at `path` is replaced, never followed.
    pub fn write_file(&self, path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let file_mode = Mode::from_bits_truncate(mode);
        self.replace(path, |dir, tmp_name| {
            let raw = nix::fcntl::openat(Some(dir), tmp_name, flags, file_mode)?;
            // SAFETY: `raw` was just returned by openat and is owned by nobody else.
            let mut file = unsafe { File::from_raw_fd(raw) };
            file.write_all(contents)
                .and_then(|()| self.give_owner(raw))
                .and_then(|()| nix::sys::stat::fchmod(raw, file_mode).map_err(io::Error::from))
        })
    }

    /// Makes `path` inside the root a symbolic link to `link`, creating
    /// missing parent directories. The link is made under a temporary name
    /// and renamed over `path`, so whatever is at `path` (a file, a link)
    /// is replaced, never followed.
    pub fn write_symlink(&self, path: &Path, link: &Path) -> io::Result<()> {
        self.replace(path, |dir, tmp_name| {
            nix::unistd::symlinkat(link, Some(dir), tmp_name)?;
            self.give_owner_of_link(dir, tmp_name)
        })
    }

    /// Replaces `path` inside the root (creating missing parent
    /// directories) with what `make` creates in the parent directory under
    /// a temporary name (a leftover of that name is removed first), renamed
    /// over `path`; on failure the temporary entry is removed.
    fn replace(
        &self,
        path: &Path,
        make: impl Fn(RawFd, &OsStr) -> io::Result<()>,
    ) -> io::Result<()> {
        let parts = components(path)?;
        let Some((name, parent)) = parts.split_last() else {
            return Err(invalid_input("cannot replace the root directory itself"));
        };
        let dir = self.ensure_parts(parent, Kind::Dir)?;
        let dir = dir.as_raw_fd();
        let mut tmp_name = b".".to_vec();
        tmp_name.extend_from_slice(name.as_bytes());
        tmp_name.extend_from_slice(format!(".berth-{}", std::process::id()).as_bytes());
        let tmp_name = OsStr::from_bytes(&tmp_name);
        let made = match make(dir, tmp_name) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                unlinkat(Some(dir), tmp_name, UnlinkatFlags::NoRemoveDir)?;
                make(dir, tmp_name)
            }
            other => other,
        };
        let placed = made.and_then(|()| {
            nix::fcntl::renameat(Some(dir), tmp_name, Some(dir), *name).map_err(io::Error::from)
        });
        if placed.is_err() {
            let _ = unlinkat(Some(dir), tmp_name, UnlinkatFlags::NoRemoveDir);
        }
        placed
    }

    /// Makes sure `path` exists inside the root (creating it and its missing
    /// parents as directories) and returns an `O_PATH` descriptor of it.
    pub fn ensure_dir(&self, path: &Path) -> io::Result<OwnedFd> {
        self.ensure_parts(&components(path)?, Kind::Dir)
    }

    /// Makes sure `path` exists inside the root (creating an empty file, and
    /// missing parents as directories) and returns an `O_PATH` descriptor of it.
    pub fn ensure_file(&self, path: &Path) -> io::Result<OwnedFd> {
        self.ensure_parts(&components(path)?, Kind::File)
    }

    /// [`RootDir::ensure_dir`] or [`RootDir::ensure_file`], by `kind`.
    pub fn ensure(&self, path: &Path, kind: Kind) -> io::Result<OwnedFd> {
        self.ensure_parts(&components(path)?, kind)
    }

    fn resolve_parts(&self, parts: &[&OsStr]) -> io::Result<OwnedFd> {
        openat2_in_root(
            self.fd.as_fd(),
            &join_parts(parts),
            libc::O_PATH,
            self.resolve,
        )
    }

    fn ensure_parts(&self, parts: &[&OsStr], kind: Kind) -> io::Result<OwnedFd> {
        match self.resolve_parts(parts) {
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
            other => return other,
        }
        let Some((name, parent)) = parts.split_last() else {
            // The root itself always resolves; ENOENT here means it vanished.
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        let dir = self.ensure_parts(parent, Kind::Dir)?;
        let created = match create_at(dir.as_fd(), name, kind) {
            Err(Errno::EEXIST) if is_symlink_at(dir.as_fd(), name) => {
                // A dangling symlink (it did not resolve above): replace it.
                unlinkat(Some(dir.as_raw_fd()), *name, UnlinkatFlags::NoRemoveDir)?;
                create_at(dir.as_fd(), name, kind)?;
                true
            }
            Err(Errno::EEXIST) => false,
            Ok(()) => true,
            Err(err) => return Err(err.into()),
        };
        if created {
            if let Some((uid, gid)) = self.new_owner {
                // What was just made in `dir`, not followed if a link.
                nix::unistd::fchownat(
                    Some(dir.as_raw_fd()),
                    *name,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )?;
            }
        }
        self.resolve_parts(parts)
    }

    /// fchown of a descriptor to [`RootDir::owning_new_entries`]'s owner.
    fn give_owner(&self, fd: RawFd) -> io::Result<()> {
        match self.new_owner {
            Some((uid, gid)) => nix::unistd::fchown(
                fd,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .map_err(io::Error::from),
            None => Ok(()),
        }
    }

    /// [`RootDir::give_owner`] for the symbolic link `name` in `dir` (the
    /// link itself, not what it names).
    fn give_owner_of_link(&self, dir: RawFd, name: &OsStr) -> io::Result<()> {
        match self.new_owner {
            Some((uid, gid)) => nix::unistd::fchownat(
                Some(dir),
                name,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(io::Error::from),
            None => Ok(()),
        }
    }
}

/// The normal components of `path`; `/` and `.` are dropped, `..` is refused.
fn components(path: &Path) -> io::Result<Vec<&OsStr>> {
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => parts.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(invalid_input("path must not contain '..'"));
            }
        }
    }
    Ok(parts)
}

fn join_parts(parts: &[&OsStr]) -> PathBuf {
    if parts.is_empty() {
        return PathBuf::from(".");
    }
    parts.iter().collect()
}

fn invalid_input(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message.to_string())
}

fn create_at(dir: BorrowedFd<'_>, name: &OsStr, kind: Kind) -> Result<(), Errno> {
    match kind {
        Kind::Dir => mkdirat(Some(dir.as_raw_fd()), name, Mode::from_bits_truncate(0o755)),
        Kind::File => {
            let flags = OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC;
            let raw = nix::fcntl::openat(
                Some(dir.as_raw_fd()),
                name,
                flags,
                Mode::from_bits_truncate(0o644),
            )?;
            // SAFETY: `raw` was just returned by openat and is owned by nobody else.
            drop(unsafe { OwnedFd::from_raw_fd(raw) });
            Ok(())
        }
    }
}

fn is_symlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map(|stat| SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
        .unwrap_or(false)
}

/// Opens `path` below the folder `dir` without ever leaving it
/// (`openat2(2)` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`), with the
/// `RESOLVE_*` bits `resolve` added: for root working in a folder another
/// user owns, `RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV` follow no link and
/// cross no mount (a FUSE mount of the user is never entered).
pub fn open_below(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: i32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    openat2_in_root(dir, path, flags, resolve)
}

/// openat2(2) with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` and `resolve`,
/// relative to `root`.
fn openat2_in_root(
    root: BorrowedFd<'_>,
    path: &Path,
    flags: i32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    openat2_with(root, path, flags, 0, resolve)
}

/// [`openat2_in_root`] with the `mode` a created file gets.
fn openat2_with(
    root: BorrowedFd<'_>,
    path: &Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| invalid_input("path contains a NUL byte"))?;
    // SAFETY: open_how is a plain C struct for which all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS | resolve;
    // RESOLVE_IN_ROOT fails with EAGAIN when a concurrent rename could have
    // moved a path out of the root; retrying is the documented answer.
    for _ in 0..32 {
        // SAFETY: `path` is a valid NUL-terminated string and `how` a valid
        // open_how whose size we pass; both outlive the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if ret >= 0 {
            // SAFETY: the kernel returned a new descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) });
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EAGAIN) {
            return Err(err);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    struct Fixture {
        _dir: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&outside).unwrap();
        Fixture {
            _dir: dir,
            root,
            outside,
        }
    }

    fn same_inode(fd: &OwnedFd, path: &Path) -> bool {
        let stat = fstat(fd.as_raw_fd()).unwrap();
        let meta = std::fs::metadata(path).unwrap();
        stat.st_dev == meta.dev() && stat.st_ino == meta.ino()
    }

    #[test]
    fn escaping_symlinks_resolve_inside_the_root() {
        let f = fixture();
        symlink("/", f.root.join("abs")).unwrap();
        symlink("../../../../..", f.root.join("up")).unwrap();
        let root = RootDir::open(&f.root).unwrap();
        assert!(same_inode(
            &root.resolve(Path::new("/abs")).unwrap(),
            &f.root
        ));
        assert!(same_inode(
            &root.resolve(Path::new("/up")).unwrap(),
            &f.root
        ));
        assert!(same_inode(&root.resolve(Path::new("/")).unwrap(), &f.root));
    }

    #[test]
    fn absolute_symlink_to_a_host_path_stays_inside() {
        let f = fixture();
        std::fs::write(f.outside.join("secret"), "host").unwrap();
        symlink(f.outside.join("secret"), f.root.join("link")).unwrap();
        let root = RootDir::open(&f.root).unwrap();
        let err = root.resolve(Path::new("/link")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(root.read_file(Path::new("/link"), 100).unwrap(), None);
    }

    #[test]
    fn dangling_dir_symlink_is_replaced_not_followed() {
        let f = fixture();
        let escape = f.outside.join("etc-escape");
        symlink(&escape, f.root.join("etc")).unwrap();
        let root = RootDir::open(&f.root).unwrap();
        root.write_file(Path::new("/etc/passwd"), b"x:x:1:1::/:/bin/sh\n", 0o644)
            .unwrap();
        assert!(!escape.exists());
        assert!(std::fs::symlink_metadata(f.root.join("etc"))
            .unwrap()
            .is_dir());
        assert_eq!(
            std::fs::read(f.root.join("etc/passwd")).unwrap(),
            b"x:x:1:1::/:/bin/sh\n"
        );
    }

    #[test]
    fn write_symlink_replaces_what_is_there_without_following_it() {
        let f = fixture();
        std::fs::create_dir(f.root.join("etc")).unwrap();
        let victim = f.outside.join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        symlink(&victim, f.root.join("etc/localtime")).unwrap();
        std::fs::write(f.root.join("etc/plain"), "image's").unwrap();
        let root = RootDir::open(&f.root).unwrap();
        let zone = Path::new("/usr/share/zoneinfo/Europe/Berlin");
        for name in ["/etc/localtime", "/etc/plain", "/new/dir/link"] {
            root.write_symlink(Path::new(name), zone).unwrap();
            let inside = f.root.join(name.trim_start_matches('/'));
            assert_eq!(std::fs::read_link(&inside).unwrap(), zone, "{name}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    }

    #[test]
    fn write_file_replaces_a_symlinked_file() {
        let f = fixture();
        std::fs::create_dir(f.root.join("etc")).unwrap();
        let victim = f.outside.join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        symlink(&victim, f.root.join("etc/passwd")).unwrap();
        symlink("../../../../shadow", f.root.join("etc/group")).unwrap();
        let root = RootDir::open(&f.root).unwrap();
        root.write_file(Path::new("/etc/passwd"), b"new", 0o644)
            .unwrap();
        root.write_file(Path::new("/etc/group"), b"new", 0o644)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        let meta = std::fs::symlink_metadata(f.root.join("etc/passwd")).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o7777, 0o644);
        assert!(!f.root.join("shadow").exists());
        assert!(std::fs::symlink_metadata(f.root.join("etc/group"))
            .unwrap()
            .is_file());
    }

    #[test]
    fn ensure_follows_symlinks_to_existing_dirs_inside_the_root() {
        let f = fixture();
        std::fs::create_dir(f.root.join("real")).unwrap();
        symlink("/real", f.root.join("data")).unwrap();
        let root = RootDir::open(&f.root).unwrap();
        let fd = root.ensure_dir(Path::new("/data/sub/deeper")).unwrap();
        assert!(same_inode(&fd, &f.root.join("real/sub/deeper")));
        let fd = root.ensure_file(Path::new("/data/file")).unwrap();
        assert!(same_inode(&fd, &f.root.join("real/file")));
        // Existing objects are returned as they are.
        root.ensure_file(Path::new("/data/file")).unwrap();
        root.ensure_dir(Path::new("/real/sub")).unwrap();
    }

    #[test]
    fn dangling_file_symlink_is_replaced_for_a_mount_point() {
        let f = fixture();
        std::fs::create_dir(f.root.join("etc")).unwrap();
        symlink(f.outside.join("hosts"), f.root.join("etc/hosts")).unwrap();
        let root = RootDir::open(&f.root).unwrap();
        root.ensure_file(Path::new("/etc/hosts")).unwrap();
        assert!(!f.outside.join("hosts").exists());
        assert!(std::fs::symlink_metadata(f.root.join("etc/hosts"))
            .unwrap()
            .is_file());
    }

    #[test]
    fn refuses_parent_dir_components() {
        let f = fixture();
        let root = RootDir::open(&f.root).unwrap();
        let err = root.ensure_dir(Path::new("/a/../b")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn ensure_dir_on_a_file_fails() {
        let f = fixture();
        std::fs::write(f.root.join("file"), "").unwrap();
        let root = RootDir::open(&f.root).unwrap();
        let err = root.ensure_dir(Path::new("/file/sub")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
    }

    #[test]
    fn read_file_refuses_fifos_and_large_files() {
        let f = fixture();
        nix::unistd::mkfifo(&f.root.join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        std::fs::write(f.root.join("big"), vec![b'x'; 100]).unwrap();
        let root = RootDir::open(&f.root).unwrap();
        assert!(root.read_file(Path::new("/fifo"), 10).is_err());
        assert!(root.read_file(Path::new("/big"), 99).is_err());
        assert_eq!(
            root.read_file(Path::new("/big"), 100)
                .unwrap()
                .unwrap()
                .len(),
            100
        );
    }
}
