//! Small file system helpers (the store and the named containers use them): locks, temp entries, syncing.
//!
//! Locks are `flock(2)` on open files, so they die with the process that held
//! them: no lock file is ever "stale". Temp entries are locked by their writer
//! for as long as it lives; [`sweep_temp`] removes those nobody holds.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};

/// An exclusive `flock` held until dropped.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

fn flock(file: &File, nonblocking: bool) -> io::Result<bool> {
    flock_op(file, libc::LOCK_EX, nonblocking)
}

/// `flock(file, op)`, retried on `EINTR`; `Ok(false)` when `nonblocking` and
/// another holder has a conflicting lock.
fn flock_op(file: &File, op: libc::c_int, nonblocking: bool) -> io::Result<bool> {
    let op = op | if nonblocking { libc::LOCK_NB } else { 0 };
    loop {
        // SAFETY: flock on a file descriptor we own, with constant flags; it
        // does not touch memory.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if nonblocking => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Takes a shared `flock` on `file`, waiting for an exclusive holder to go.
pub fn lock_shared(file: &File) -> io::Result<()> {
    flock_op(file, libc::LOCK_SH, false).map(|_| ())
}

/// Tries an exclusive `flock` on `file` without waiting; `Ok(false)` when
/// someone else holds a lock on it.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    flock_op(file, libc::LOCK_EX, true)
}

impl FileLock {
    /// Takes the lock on `path` (created if needed), waiting for other holders;
    /// `on_wait` is called once if the lock is busy.
    pub fn exclusive(path: &Path, on_wait: impl FnOnce()) -> Result<FileLock> {
        let file = open_lock_file(path)?;
        if !flock(&file, true).with_context(|| format!("cannot lock {}", path.display()))? {
            on_wait();
            flock(&file, false).with_context(|| format!("cannot lock {}", path.display()))?;
        }
        Ok(FileLock { _file: file })
    }

    /// Takes the lock on `path` (created if needed) if nobody else holds it;
    /// `None` when it is busy.
    pub fn try_exclusive(path: &Path) -> Result<Option<FileLock>> {
        let file = open_lock_file(path)?;
        let got =
            try_lock_exclusive(&file).with_context(|| format!("cannot lock {}", path.display()))?;
        Ok(got.then_some(FileLock { _file: file }))
    }

    /// Takes a shared lock on `path` (created if needed), waiting for an
    /// exclusive holder to let go.
    pub fn shared(path: &Path) -> Result<FileLock> {
        let file = open_lock_file(path)?;
        lock_shared(&file).with_context(|| format!("cannot lock {}", path.display()))?;
        Ok(FileLock { _file: file })
    }
}

/// Opens (creating) a lock file read-only: `flock` needs no write access,
/// so root (gc, rmi) and the pull user can lock files the other made. Never
/// through a symlink, never blocking, and only a regular file: the lock
/// folders belong to the pull user, and root takes locks too.
fn open_lock_file(path: &Path) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("cannot open lock file {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot inspect lock file {}", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!(
            "the lock file {} is not a regular file: remove it",
            path.display()
        );
    }
    Ok(file)
}

/// A file or directory under the store's `tmp/`, locked by this process and
/// removed on drop unless [`TempEntry::keep`] was called.
#[derive(Debug)]
pub struct TempEntry {
    path: PathBuf,
    lock: Option<File>,
    dir: bool,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl TempEntry {
    /// Creates a new, locked temp file in `tmp_dir` named after `label`.
    pub fn file(tmp_dir: &Path, label: &str) -> Result<(TempEntry, File)> {
        loop {
            let path = unique(tmp_dir, label);
            let file = OpenOptions::new()
                .create_new(true)
                .read(true)
                .write(true)
                .mode(0o644)
                .open(&path)
                .with_context(|| format!("cannot create temp file {}", path.display()))?;
            flock(&file, false).with_context(|| format!("cannot lock {}", path.display()))?;
            // A sweeper may have taken the lock first and unlinked the file: retry.
            if file.metadata()?.nlink() == 0 {
                continue;
            }
            let lock = file.try_clone()?;
            return Ok((
                TempEntry {
                    path,
                    lock: Some(lock),
                    dir: false,
                },
                file,
            ));
        }
    }

    /// Creates a new, locked temp directory in `tmp_dir` named after `label`.
    pub fn dir(tmp_dir: &Path, label: &str, mode: u32) -> Result<TempEntry> {
        loop {
            let path = unique(tmp_dir, label);
            fs::DirBuilder::new()
                .mode(mode)
                .create(&path)
                .with_context(|| format!("cannot create temp directory {}", path.display()))?;
            let dir = File::open(&path)
                .with_context(|| format!("cannot open temp directory {}", path.display()))?;
            flock(&dir, false).with_context(|| format!("cannot lock {}", path.display()))?;
            if dir.metadata()?.nlink() == 0 {
                continue;
            }
            return Ok(TempEntry {
                path,
                lock: Some(dir),
                dir: true,
            });
        }
    }

    /// The entry's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Forgets the entry: it was renamed away and must not be removed.
    pub fn keep(mut self) {
        self.lock = None;
        self.path = PathBuf::new();
    }
}

impl Drop for TempEntry {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let _ = if self.dir {
            fs::remove_dir_all(&self.path)
        } else {
            fs::remove_file(&self.path)
        };
    }
}

fn unique(dir: &Path, label: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{label}.{}.{n}", std::process::id()))
}

/// Removes entries of `tmp_dir` whose writer is gone (nobody holds their lock).
/// Returns the entries removed, with their sizes in bytes.
pub fn sweep_temp(tmp_dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
    sweep_temp_if(tmp_dir, &|_| true)
}

/// Like [`sweep_temp`], only for entries `wanted` accepts.
pub fn sweep_temp_if(
    tmp_dir: &Path,
    wanted: &dyn Fn(&Path) -> bool,
) -> Result<Vec<(PathBuf, u64)>> {
    let mut removed = Vec::new();
    let entries = match fs::read_dir(tmp_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", tmp_dir.display())),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !wanted(&path) {
            continue;
        }
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if !flock(&file, true).unwrap_or(false) {
            continue; // a live writer holds it
        }
        let is_dir = file.metadata().map(|m| m.is_dir()).unwrap_or(false);
        let size = tree_size(&path);
        let result = if is_dir {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        if result.is_ok() {
            removed.push((path, size));
        }
    }
    Ok(removed)
}

/// The bytes in the files under `path` (a file or a directory; symlinks are
/// not followed). Entries that vanish or cannot be read count as 0.
pub fn tree_size(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| tree_size(&e.path())).sum())
        .unwrap_or(0)
}

/// fsyncs a directory, so a rename into it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync directory {}", dir.display()))
}

/// Writes `bytes` to `path` (mode 0644) and fsyncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_removes_only_abandoned_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let (live, _file) = TempEntry::file(tmp.path(), "blob").unwrap();
        let live_dir = TempEntry::dir(tmp.path(), "image", 0o755).unwrap();
        fs::write(live_dir.path().join("x"), "x").unwrap();
        let dead = tmp.path().join("blob.1.1");
        fs::write(&dead, "partial").unwrap();
        let dead_dir = tmp.path().join("image.1.2");
        fs::create_dir(&dead_dir).unwrap();
        fs::write(dead_dir.join("image.sqfs"), "partial").unwrap();

        assert_eq!(sweep_temp(tmp.path()).unwrap().len(), 2);
        assert!(live.path().exists() && live_dir.path().join("x").exists());
        assert!(!dead.exists() && !dead_dir.exists());

        let (p, d) = (live.path().to_path_buf(), live_dir.path().to_path_buf());
        drop(live);
        drop(live_dir);
        assert!(!p.exists() && !d.exists(), "dropped entries are removed");
    }

    #[test]
    fn lock_waits_and_reports() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.lock");
        let held = FileLock::exclusive(&path, || panic!("not busy")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        let t = std::thread::spawn(move || {
            let _l = FileLock::exclusive(&p, || tx.send(()).unwrap()).unwrap();
        });
        rx.recv().unwrap(); // the second locker saw it busy
        drop(held);
        t.join().unwrap();
    }
}
