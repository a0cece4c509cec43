//! A lease file: one puller of an image in a store shared by many nodes.
//!
//! `flock`/`fcntl` locks on NFS go through lockd or NFSv4 state, and a dead
//! client's lock lingers until the server gives up on it; Lustre offers them
//! only with the `flock` mount option. So the nodes of a shared store agree
//! on a plain file instead:
//!
//! - **take**: write `{host, pid, started, token}` to a temp file beside the
//!   lease, then `link(2)` it to the lease name. `link` fails when the name
//!   exists, atomically on every NFS version (`O_EXCL` is not on NFSv2); a
//!   lost reply is caught by the temp file's link count (2 means it worked).
//! - **hold**: a thread refreshes the lease's mtime every
//!   [`LeaseTimeouts::heartbeat`] and checks that the lease still carries
//!   this holder's token; when it does not (taken over), the lease is
//!   [`Lease::lost`].
//! - **wait and take over**: a waiter opens the lease again and again
//!   (opening revalidates NFS's cached attributes) and notes when its
//!   `(token, mtime)` last changed, on its own monotonic clock, so clock
//!   skew between nodes does not matter. No change for
//!   [`LeaseTimeouts::stale_after`]: the holder is dead or stopped; the
//!   waiter renames the lease aside (only one renamer wins), checks that it
//!   moved the stale one (else links it back), and takes the lease itself.
//!
//! The lease only decides who downloads; correctness does not rest on it.
//! Images are published by renaming a complete folder into place, never
//! over an existing one, and blobs by `link`, never over an existing one, so
//! a puller that lost its lease (a stopped process that resumes) can finish
//! without touching what another node published.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::stop_signal::StopSignal;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// How long leases live without a heartbeat, and how often holders beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimeouts {
    /// A lease whose mtime and token did not change for this long is stale.
    pub stale_after: Duration,
    /// How often a holder refreshes its lease.
    pub heartbeat: Duration,
    /// How soon a new waiter looks again at the lease (and for the finished
    /// image); the pause doubles up to `max_poll` while the holder is the same.
    pub poll: Duration,
    /// The longest pause between two looks: what a waiting node costs the
    /// file server (about three metadata operations per look).
    pub max_poll: Duration,
}

impl LeaseTimeouts {
    /// Timeouts for a lease that goes stale after `stale_after`: a heartbeat
    /// six times per period (at least every 5 s, at most every 100 ms); waiters
    /// look after at most 500 ms at first, backing off to
    /// [`MAX_POLL`] (500 waiting nodes: about 250 looks per second in all).
    pub fn with_stale_after(stale_after: Duration) -> LeaseTimeouts {
        let heartbeat = (stale_after / 6).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let poll = (heartbeat / 2).min(Duration::from_millis(500));
        LeaseTimeouts {
            stale_after,
            heartbeat,
            poll,
            max_poll: (stale_after / 4).clamp(poll, MAX_POLL),
        }
    }
}

/// The longest pause of a waiter between two looks at a lease.
pub const MAX_POLL: Duration = Duration::from_secs(2);

/// The pause after `pause` for a waiter that saw the same holder again:
/// doubled, at most `max`, with up to a fifth taken off at random (`seed`)
/// so that the waiters of one job do not look in step.
fn back_off(pause: Duration, max: Duration, seed: u64) -> Duration {
    let doubled = (pause * 2).min(max);
    let fifth = doubled.as_micros() as u64 / 5;
    let off = if fifth == 0 { 0 } else { seed % fifth };
    doubled - Duration::from_micros(off)
}

/// A cheap varying number for [`back_off`]'s jitter (no cryptographic use).
fn jitter_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    u64::from(nanos) ^ (u64::from(std::process::id()) << 20)
}

/// Who holds a lease: the lease file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Host name of the holder.
    pub host: String,
    /// Its process id (on that host).
    pub pid: u32,
    /// When it took the lease (seconds since the epoch, its clock).
    pub started: u64,
    /// Unique per taking: tells a lease from its successor.
    pub token: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pid {})", self.host, self.pid)
    }
}

/// A lease this process holds; released (the file removed, if still ours)
/// when dropped.
#[derive(Debug)]
pub struct Lease {
    path: PathBuf,
    token: String,
    lost: Arc<AtomicBool>,
    stop: StopSignal,
    beat: Option<JoinHandle<()>>,
}

impl Lease {
    /// Whether another process took the lease over (this one was presumed
    /// dead): its work is no longer needed.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(beat) = self.beat.take() {
            let _ = beat.join();
        }
        if read_holder(&self.path).is_some_and(|h| h.token == self.token) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// What a waiter saw of a lease it does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    holder: Option<Holder>,
    mtime: (i64, i64),
    inode: u64,
}

/// Reads the holder recorded in the lease at `path`.
fn read_holder(path: &Path) -> Option<Holder> {
    let mut text = String::new();
    File::open(path).ok()?.read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Opens the lease (revalidating cached attributes) and notes what it holds.
fn look(path: &Path) -> Result<Option<Seen>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot open lease {}", path.display())),
    };
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat lease {}", path.display()))?;
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    Ok(Some(Seen {
        holder: serde_json::from_str(&text).ok(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        inode: meta.ino(),
    }))
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown-host".to_string())
}

fn new_token() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{}-{}-{}-{}",
        host_name(),
        std::process::id(),
        now.as_nanos(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Tries once to take the lease at `path`; `Ok(None)` when someone holds it.
fn try_take(path: &Path, timeouts: LeaseTimeouts) -> Result<Option<Lease>> {
    let holder = Holder {
        host: host_name(),
        pid: std::process::id(),
        started: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        token: new_token(),
    };
    let dir = path.parent().context("a lease path has a folder")?;
    let name = path
        .file_name()
        .context("a lease path has a file name")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}", holder.token));
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        file.write_all(&serde_json::to_vec(&holder)?)
            .and_then(|_| file.sync_all())
            .with_context(|| format!("cannot write {}", tmp.display()))?;
    }
    let linked = match fs::hard_link(&tmp, path) {
        Ok(()) => true,
        // NFS: the reply may be lost though the link was made.
        Err(_) => fs::metadata(&tmp).is_ok_and(|m| m.nlink() == 2),
    };
    let _ = fs::remove_file(&tmp);
    if !linked {
        return Ok(None);
    }
    let lost = Arc::new(AtomicBool::new(false));
    let stop = StopSignal::new();
    let beat = {
        let (path, token, lost, stop) = (
            path.to_path_buf(),
            holder.token.clone(),
            Arc::clone(&lost),
            stop.clone(),
        );
        std::thread::Builder::new()
            .name("berth-lease".into())
            .spawn(move || heartbeat(&path, &token, timeouts.heartbeat, &lost, &stop))
            .context("cannot start the lease heartbeat thread")?
    };
    Ok(Some(Lease {
        path: path.to_path_buf(),
        token: holder.token,
        lost,
        stop,
        beat: Some(beat),
    }))
}

/// The holder's heartbeat: refreshes the lease's mtime while it is ours;
/// marks it lost and stops when it is not.
fn heartbeat(path: &Path, token: &str, every: Duration, lost: &AtomicBool, stop: &StopSignal) {
    while !stop.wait(every) {
        let ours = read_holder(path).is_some_and(|h| h.token == token);
        let touched = ours
            && OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_modified(SystemTime::now()))
                .is_ok();
        if !touched {
            lost.store(true, Ordering::SeqCst);
            return;
        }
    }
}

/// Moves the stale lease `seen` aside so that it can be taken. Only one
/// waiter's rename succeeds; a waiter that moved a fresh lease (taken since
/// it looked) links it back. Returns whether this call removed the stale
/// lease (true for exactly one waiter per stale lease).
fn break_stale(path: &Path, seen: &Seen) -> Result<bool> {
    let aside = path.with_extension(format!("stale.{}", new_token()));
    match fs::rename(path, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot move the stale lease {}", path.display()))
        }
    }
    let moved = look(&aside)?;
    let stale = moved.as_ref().is_some_and(|m| m.inode == seen.inode);
    if !stale {
        // Not the stale one: give it back (if nobody took the name meanwhile,
        // else its holder sees the loss at its next heartbeat).
        let _ = fs::hard_link(&aside, path);
    }
    let _ = fs::remove_file(&aside);
    Ok(stale)
}

/// What [`acquire_or_wait`] ended with.
#[derive(Debug)]
pub enum Outcome {
    /// This process holds the lease: do the work.
    Acquired(Lease),
    /// `done` said the work is done (by another holder).
    Done,
}

/// Takes the lease at `path`, or waits while a live holder has it until
/// `done()` is true (the holder published). A holder silent for
/// `stale_after` is taken over. Fails after `wait_limit` of waiting on live
/// holders, naming the last one. `on_wait` is called once, with the holder,
/// when this process starts waiting; `on_takeover` with each silent holder
/// whose lease this process removed (one waiter per stale lease).
pub fn acquire_or_wait(
    path: &Path,
    timeouts: LeaseTimeouts,
    wait_limit: Duration,
    mut done: impl FnMut() -> Result<bool>,
    mut on_wait: impl FnMut(Option<&Holder>),
    mut on_takeover: impl FnMut(Option<&Holder>),
) -> Result<Outcome> {
    let started = Instant::now();
    let mut last: Option<(Seen, Instant)> = None;
    let mut waiting = false;
    let mut pause = timeouts.poll;
    loop {
        if done()? {
            return Ok(Outcome::Done);
        }
        // Look before trying to take: a waiting node then costs the file
        // server one open per poll, not a create, a link and an unlink.
        let seen = match look(path)? {
            Some(seen) => seen,
            None => match try_take(path, timeouts)? {
                Some(lease) => {
                    // The work may have been finished just before the lease was free.
                    if done()? {
                        return Ok(Outcome::Done);
                    }
                    return Ok(Outcome::Acquired(lease));
                }
                None => continue, // taken meanwhile: look at the new holder
            },
        };
        if !waiting {
            waiting = true;
            on_wait(seen.holder.as_ref());
        }
        match &last {
            Some((before, since)) if *before == seen => {
                if since.elapsed() >= timeouts.stale_after {
                    if break_stale(path, &seen)? {
                        on_takeover(seen.holder.as_ref());
                    }
                    last = None;
                    continue;
                }
            }
            _ => {
                // A new holder may finish or die soon: look again soon, then
                // back off (a heartbeat of the same holder changes nothing).
                let same_holder = last.as_ref().is_some_and(|(before, _)| {
                    before.inode == seen.inode && before.holder == seen.holder
                });
                if !same_holder {
                    pause = timeouts.poll;
                }
                last = Some((seen, Instant::now()));
            }
        }
        if started.elapsed() >= wait_limit {
            let who = last
                .as_ref()
                .and_then(|(s, _)| s.holder.as_ref())
                .map_or_else(|| "another node".to_string(), ToString::to_string);
            bail!(
                "gave up after {:.0} s waiting for {who}, which is still pulling into the \
                 shared store (its lease {} is alive): check that node, or raise \
                 store_wait_timeout",
                started.elapsed().as_secs_f64(),
                path.display()
            );
        }
        std::thread::sleep(pause);
        pause = back_off(pause, timeouts.max_poll, jitter_seed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fast() -> LeaseTimeouts {
        LeaseTimeouts {
            stale_after: Duration::from_millis(600),
            heartbeat: Duration::from_millis(100),
            poll: Duration::from_millis(20),
            max_poll: Duration::from_millis(80),
        }
    }

    #[test]
    fn waiters_back_off_to_the_limit_with_jitter() {
        let default = LeaseTimeouts::with_stale_after(Duration::from_secs(60));
        assert_eq!(default.poll, Duration::from_millis(500));
        assert_eq!(default.max_poll, MAX_POLL);
        let mut pause = default.poll;
        let mut pauses = Vec::new();
        for seed in 0..8u64 {
            pause = back_off(pause, default.max_poll, seed * 7_919_000);
            pauses.push(pause);
        }
        assert!(
            pauses.iter().all(|p| *p <= MAX_POLL && *p >= MAX_POLL / 10),
            "{pauses:?}"
        );
        assert!(
            pauses[4..].iter().all(|p| *p >= MAX_POLL * 4 / 5),
            "{pauses:?}"
        );
        // Short leases keep short pauses: staleness is still seen in time.
        let short = LeaseTimeouts::with_stale_after(Duration::from_secs(2));
        assert!(short.max_poll <= Duration::from_millis(500), "{short:?}");
        assert_eq!(back_off(Duration::ZERO, Duration::ZERO, 3), Duration::ZERO);
    }

    #[test]
    fn one_holder_at_a_time_and_release_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lease");
        let first = try_take(&path, fast()).unwrap().expect("free");
        assert!(try_take(&path, fast()).unwrap().is_none(), "held");
        assert_eq!(read_holder(&path).unwrap().pid, std::process::id());
        drop(first);
        assert!(!path.exists(), "released");
        assert!(try_take(&path, fast()).unwrap().is_some());
        let leftovers: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert!(leftovers.is_empty(), "no temp files left: {leftovers:?}");
    }

    #[test]
    fn a_live_holder_is_waited_for_until_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lease");
        let held = try_take(&path, fast()).unwrap().unwrap();
        let published = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&published);
        let worker = std::thread::spawn(move || {
            // Longer than stale_after: the heartbeat keeps the lease alive.
            std::thread::sleep(Duration::from_millis(1500));
            flag.store(true, Ordering::SeqCst);
            assert!(!held.lost());
            drop(held);
        });
        let mut waited = 0;
        let out = acquire_or_wait(
            &path,
            fast(),
            Duration::from_secs(30),
            || Ok(published.load(Ordering::SeqCst)),
            |_| waited += 1,
            |h| panic!("took over a live holder {h:?}"),
        )
        .unwrap();
        worker.join().unwrap();
        assert!(matches!(out, Outcome::Done), "{out:?}");
        assert_eq!(waited, 1);
    }

    #[test]
    fn a_silent_holder_is_taken_over_and_learns_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lease");
        // A dead holder: a lease file nobody refreshes.
        let dead = Holder {
            host: "node9".into(),
            pid: 1,
            started: 0,
            token: "dead".into(),
        };
        fs::write(&path, serde_json::to_vec(&dead).unwrap()).unwrap();
        let mut taken = Vec::new();
        let started = Instant::now();
        let out = acquire_or_wait(
            &path,
            fast(),
            Duration::from_secs(30),
            || Ok(false),
            |_| {},
            |h| taken.push(h.cloned()),
        )
        .unwrap();
        assert!(started.elapsed() >= fast().stale_after);
        let Outcome::Acquired(lease) = out else {
            panic!("{out:?}")
        };
        assert_eq!(taken, vec![Some(dead)]);
        // A holder whose lease was taken over sees it at its next heartbeat.
        let second = try_take(&dir.path().join("y.lease"), fast())
            .unwrap()
            .unwrap();
        fs::remove_file(dir.path().join("y.lease")).unwrap();
        let mut lost = false;
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(20));
            if second.lost() {
                lost = true;
                break;
            }
        }
        assert!(lost, "the heartbeat notices a lease that is not its own");
        drop(second);
        drop(lease);
    }

    #[test]
    fn waiting_on_a_live_holder_has_a_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lease");
        let _held = try_take(&path, fast()).unwrap().unwrap();
        let e = acquire_or_wait(
            &path,
            fast(),
            Duration::from_millis(800),
            || Ok(false),
            |_| {},
            |h| panic!("took over a live holder {h:?}"),
        )
        .unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("gave up") && text.contains("store_wait_timeout"),
            "{text}"
        );
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
    }
}
