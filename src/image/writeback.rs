//! Starting disk writeback early, so that the fsync before a publish finds
//! little left to write: the image and its blobs reach the disk while the pull
//! is still downloading and converting, not all at the end.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often [`Watcher`] looks at the file it follows.
const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Asks the kernel to start writing `[from, to)` of `file` to disk, without
/// waiting. Only an optimisation: write errors surface at the fsync.
pub fn start_writeback(file: &File, from: u64, to: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(from), i64::try_from(to.saturating_sub(from)))
    else {
        return;
    };
    // SAFETY: sync_file_range only reads its integer arguments; the fd is
    // valid while `file` is borrowed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Follows a file another process writes (tar2sqfs's output) and starts its
/// writeback as it grows; stops when dropped.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts following `path` (which may not exist yet).
    pub fn start(path: &Path) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let path: PathBuf = path.to_path_buf();
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("berth-writeback".to_string())
            .spawn(move || follow(&path, &flag))
            .ok();
        Watcher { stop, thread }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn follow(path: &Path, stop: &AtomicBool) {
    let mut file: Option<File> = None;
    let mut started = 0;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(WATCH_INTERVAL);
        if file.is_none() {
            file = File::open(path).ok();
        }
        let Some(f) = &file else { continue };
        let Ok(len) = f.metadata().map(|m| m.len()) else {
            continue;
        };
        if len > started {
            start_writeback(f, started, len);
            started = len;
        }
    }
}
