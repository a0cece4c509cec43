//! A store on a file system shared by all nodes (`store_shared=1`: NFS,
//! Lustre, GPFS): the cluster fetches and converts each image once.
//!
//! What changes against a node-local store:
//!
//! - **one puller per image**: the pull of an image not yet published takes
//!   the lease `leases/<manifest-hex>.lease` ([`super::lease`]) instead of the
//!   node-local `flock`; the other nodes wait for the image to appear, then
//!   mount it. A holder that stops heart-beating is taken over after
//!   `store_lease_timeout`; waiting on a live holder ends with an error after
//!   `store_wait_timeout`.
//! - **publish without replacing**: an image folder is renamed into place
//!   only where none is (a folder that is there stays: another node may have
//!   it mounted, and removing a file another NFS client has open makes its
//!   reads fail with ESTALE); blobs are linked into place, never over one.
//!   An outdated image (older converter) is moved to `retired/`, not removed.
//! - **node-local state stays per node**: temp files live in `tmp/<host>/`
//!   (their `flock`s only need to work within the node: Lustre's
//!   `localflock` is enough); named containers and save scratch space live
//!   under `nodes/<node>/` (see [`crate::config::Config::node_state_path`]).
//! - **`gc` needs an age**: holds are `flock`s of the node that runs the
//!   container, so another node's `gc` cannot see them. On a shared store
//!   `berth gc` removes only what was last used longer ago than `--min-age`,
//!   which the admin sets above the longest job (`MaxTime`): every step
//!   start marks its image used.
//!
//! The store root carries the file [`MARKER`], so `berth images`, `gc` and
//! `pull` given the folder know it is shared.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use super::lease::{acquire_or_wait, LeaseTimeouts, Outcome};
use super::progress::Progress;
use super::Store;
use crate::registry::Digest;

/// What the pull helper says on stderr when it removes a silent puller's
/// lease (`berth: HOST took over the pull of DIGEST from WHO, silent for N
/// s`; exactly one node says it, and that node or another then pulls); the
/// plugin shows such lines to the user.
pub const TAKEOVER_NOTE: &str = "took over the pull of";

/// File in the root of a shared store.
pub const MARKER: &str = "shared-store";

/// Default of `store_lease_timeout`: a puller silent this long is presumed dead.
pub const DEFAULT_LEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of `store_wait_timeout`: the longest wait for a live puller.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1800);

/// How the nodes of a shared store wait for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedSettings {
    /// A puller whose lease was not refreshed for this long is taken over.
    pub lease_timeout: Duration,
    /// Waiting for a live puller fails after this long.
    pub wait_timeout: Duration,
}

impl Default for SharedSettings {
    fn default() -> Self {
        SharedSettings {
            lease_timeout: DEFAULT_LEASE_TIMEOUT,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }
}

/// This machine's host name: the key of its temp folder in a shared store.
pub(super) fn host_key() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .ok()
        .filter(|h| !h.is_empty() && !h.contains('/') && h != "." && h != "..")
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Writes the marker of a shared store into `root` (once).
pub(super) fn mark(root: &Path) -> Result<()> {
    let marker = root.join(MARKER);
    if marker.exists() {
        return Ok(());
    }
    let text = "This berth image store is shared by several nodes (store_shared=1).\n\
                Pulls coordinate through leases/; gc needs --min-age.\n";
    match fs::write(&marker, text) {
        Ok(()) => Ok(()),
        Err(_) if marker.exists() => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot write {}", marker.display())),
    }
}

/// Whether the store at `root` is marked shared.
pub(super) fn is_marked(root: &Path) -> bool {
    root.join(MARKER).is_file()
}

/// Takes the pull lease of image `digest` or waits until another node has
/// published it (`published()` true): `Ok(None)` then.
pub(super) fn lease_image(
    store: &Store,
    digest: &Digest,
    settings: SharedSettings,
    progress: &Progress,
    mut published: impl FnMut() -> Result<bool>,
) -> Result<Option<super::lease::Lease>> {
    let path = store.leases_dir().join(format!("{}.lease", digest.hex()));
    let timeouts = LeaseTimeouts::with_stale_after(settings.lease_timeout);
    let outcome = acquire_or_wait(
        &path,
        timeouts,
        settings.wait_timeout,
        &mut published,
        |holder| {
            let who = holder.map_or_else(|| "another node".to_string(), ToString::to_string);
            progress.say(format!("waiting for {who}, which is pulling {digest}"));
        },
        |holder| {
            let who = holder.map_or_else(|| "another node".to_string(), ToString::to_string);
            eprintln!(
                "berth: {} {TAKEOVER_NOTE} {digest} from {who}, silent for {} s",
                host_key(),
                settings.lease_timeout.as_secs()
            );
        },
    )?;
    Ok(match outcome {
        Outcome::Acquired(lease) => Some(lease),
        Outcome::Done => None,
    })
}

/// Links `from` to `to` unless `to` exists (then `to` stays as it is, and
/// `from` is left for its owner to remove).
pub(super) fn link_no_replace(from: &Path, to: &Path) -> Result<()> {
    match fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => {
            Err(e).with_context(|| format!("cannot link {} to {}", from.display(), to.display()))
        }
    }
}

/// Renames the complete folder `staging` to `dest` unless an image is
/// there; an outdated or broken folder at `dest` (`current` false) is moved
/// to `retired/` first. Returns whether `staging` was moved.
pub(super) fn publish_no_replace(
    store: &Store,
    staging: &Path,
    dest: &Path,
    current: bool,
) -> Result<bool> {
    if dest.exists() {
        if current {
            return Ok(false);
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let retired = store
            .retired_dir()
            .join(format!("{name}.{stamp}.{}", host_key()));
        fs::create_dir_all(store.retired_dir())
            .with_context(|| format!("cannot create {}", store.retired_dir().display()))?;
        match fs::rename(dest, &retired) {
            // gc --min-age counts a retired image's age from its retirement:
            // nodes may still run it.
            Ok(()) => {
                let _ = fs::File::open(&retired).and_then(|d| d.set_modified(SystemTime::now()));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot move the outdated {} aside", dest.display()))
            }
        }
    }
    match fs::rename(staging, dest) {
        Ok(()) => Ok(true),
        // Another node published first: its image is complete too.
        Err(e)
            if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST))
                || e.kind() == ErrorKind::AlreadyExists =>
        {
            Ok(false)
        }
        Err(e) => Err(e)
            .with_context(|| format!("cannot move {} to {}", staging.display(), dest.display())),
    }
}

/// Whether `path` was last modified longer ago than `age`.
pub(super) fn older_than(path: &Path, age: Duration) -> bool {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|elapsed| elapsed >= age)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_never_replaces_an_image() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_shared(dir.path(), SharedSettings::default()).unwrap();
        let dest = dir.path().join("images/abc");
        let first = dir.path().join("stage1");
        fs::create_dir(&first).unwrap();
        fs::write(first.join("image.sqfs"), "first").unwrap();
        assert!(publish_no_replace(&store, &first, &dest, false).unwrap());
        let second = dir.path().join("stage2");
        fs::create_dir(&second).unwrap();
        fs::write(second.join("image.sqfs"), "second").unwrap();
        assert!(!publish_no_replace(&store, &second, &dest, true).unwrap());
        assert_eq!(
            fs::read_to_string(dest.join("image.sqfs")).unwrap(),
            "first"
        );
        // Outdated: moved to retired/, never removed.
        assert!(publish_no_replace(&store, &second, &dest, false).unwrap());
        assert_eq!(
            fs::read_to_string(dest.join("image.sqfs")).unwrap(),
            "second"
        );
        let retired: Vec<_> = fs::read_dir(store.retired_dir()).unwrap().collect();
        assert_eq!(retired.len(), 1);
    }

    #[test]
    fn blobs_are_linked_never_over_one() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, dest) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("blob"),
        );
        fs::write(&a, "a").unwrap();
        fs::write(&b, "b").unwrap();
        link_no_replace(&a, &dest).unwrap();
        link_no_replace(&b, &dest).unwrap();
        assert_eq!(fs::read_to_string(&dest).unwrap(), "a");
    }

    #[test]
    fn a_shared_store_is_marked_and_keeps_temp_files_per_host() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_shared(dir.path(), SharedSettings::default()).unwrap();
        assert!(is_marked(dir.path()));
        assert!(store.tmp_dir().ends_with(format!("tmp/{}", host_key())));
        assert!(store.tmp_dir().is_dir());
        let again = Store::open(dir.path()).unwrap();
        assert!(
            again.is_shared(),
            "the marker makes any opener see it shared"
        );
    }
}
