//! Which steps run a named container right now, and how to join one.
//!
//! berth keeps no process in a container: the step's slurmstepd holds the
//! namespace descriptors. So a step running a named container publishes a
//! record, `<runtime>/named/<node>/<label>.d/<JOB>.<STEP>.json`, naming its
//! slurmstepd (pid and start time) and, for each namespace, the descriptor
//! number and the namespace's inode. A later step joins by opening
//! `/proc/PID/fd/FD` (root only) after checking that the process is still
//! the same one and each descriptor still names the same namespace; a record
//! that fails the check is stale and removed. The record goes when the step
//! lets go of the container.
//!
//! Decisions about one name are made under `<runtime>/named/<node>/<label>.lock`
//! (an exclusive `flock`), so two steps never mount the same root twice.

use std::fs::{self, File};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::roots::NamedKey;
use super::trust;
use crate::container::spec::{ContainerSpec, Namespace};
use crate::container::Container;
use crate::fsutil::{write_synced, FileLock};

/// One namespace of a running container, as its step holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceHandle {
    /// `user`, `mnt`, `uts`, `ipc` or `net`.
    pub kind: String,
    /// The descriptor number in the holding process.
    pub fd: i32,
    /// The namespace's inode (as in `/proc/PID/ns/KIND`).
    pub inode: u64,
}

/// A step that runs a named container on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningStep {
    /// The process holding the namespaces (the step's slurmstepd).
    pub pid: i32,
    /// Its start time (field 22 of `/proc/PID/stat`), against pid reuse.
    pub start_time: u64,
    /// Its job.
    pub job: u32,
    /// Its step.
    pub step: u32,
    /// Its namespaces, user and mount first.
    pub namespaces: Vec<NamespaceHandle>,
    /// What the container was built from (workdir, environment, user).
    pub spec: ContainerSpec,
}

impl RunningStep {
    /// Describes the container held by this process: its descriptors and
    /// their namespace inodes.
    pub fn of_container(
        container: &Container,
        spec: &ContainerSpec,
        job: u32,
        step: u32,
    ) -> Result<RunningStep> {
        let pid = std::process::id() as i32;
        let namespaces = container
            .namespace_fds()
            .into_iter()
            .map(|(kind, fd)| {
                let inode = nix::sys::stat::fstat(fd)
                    .with_context(|| format!("cannot stat the {kind} namespace descriptor"))?
                    .st_ino;
                Ok(NamespaceHandle {
                    kind: kind.to_string(),
                    fd,
                    inode,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RunningStep {
            pid,
            start_time: start_time(pid).context("cannot read this process's start time")?,
            job,
            step,
            namespaces,
            spec: spec.clone(),
        })
    }

    /// Whether the holding process and every descriptor are still the ones recorded.
    pub fn is_alive(&self) -> bool {
        start_time(self.pid).ok() == Some(self.start_time)
            && self.namespaces.iter().all(|ns| {
                fs::read_link(self.fd_path(ns)).is_ok_and(|link| {
                    link.as_os_str() == format!("{}:[{}]", ns.kind, ns.inode).as_str()
                })
            })
    }

    fn fd_path(&self, ns: &NamespaceHandle) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{}", self.pid, ns.fd))
    }

    /// Opens the namespaces (as root) and returns the container to join,
    /// described by `spec` (the record's, perhaps with another workdir).
    pub fn open_with(&self, spec: &ContainerSpec) -> Result<Container> {
        let mut opened: Vec<(String, OwnedFd)> = Vec::new();
        for ns in &self.namespaces {
            let path = self.fd_path(ns);
            let file = File::open(&path).with_context(|| {
                format!("cannot open the running container's {} namespace", ns.kind)
            })?;
            let inode = file.metadata().map(|m| m.ino()).unwrap_or_default();
            if inode != ns.inode {
                bail!(
                    "step {}.{} let go of the container while this step joined it; run the step again",
                    self.job,
                    self.step
                );
            }
            opened.push((ns.kind.clone(), file.into()));
        }
        let mut user = None;
        let mut mount = None;
        let mut others = Vec::new();
        for (kind, fd) in opened {
            match kind.as_str() {
                "user" => user = Some(fd),
                "mnt" => mount = Some(fd),
                other => {
                    let kind = Namespace::parse_list(other)
                        .ok()
                        .and_then(|list| list.first().copied())
                        .with_context(|| format!("unknown namespace kind '{other}' in a record"))?;
                    others.push((kind, fd));
                }
            }
        }
        let (Some(user), Some(mount)) = (user, mount) else {
            bail!(
                "the record of step {}.{} lacks its user or mount namespace",
                self.job,
                self.step
            );
        };
        Ok(Container::from_namespaces(user, mount, others, spec))
    }
}

/// Field 22 (start time, in clock ticks since boot) of `/proc/PID/stat`.
fn start_time(pid: i32) -> Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("no process {pid}"))?;
    // The command name (field 2) may contain spaces: count after its ')'.
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .context("unreadable /proc/PID/stat")?;
    after
        .split_whitespace()
        .nth(19)
        .and_then(|field| field.parse().ok())
        .context("unreadable start time in /proc/PID/stat")
}

/// The records of running named containers under a runtime folder. Every
/// folder and record is checked before it is believed ([`trust`]).
#[derive(Debug, Clone)]
pub struct Registry {
    runtime: PathBuf,
    dir: PathBuf,
}

/// A published record, removed when dropped.
#[derive(Debug)]
pub struct Publication {
    path: PathBuf,
}

impl Drop for Publication {
    fn drop(&mut self) {
        let _ = crate::privilege::with_root(|| fs::remove_file(&self.path));
    }
}

impl Registry {
    /// The records of node `node` kept below `runtime_dir`
    /// (`<runtime_dir>/named/<node>`: nodes may share a runtime folder).
    pub fn new(runtime_dir: &Path, node: &str) -> Registry {
        Registry {
            runtime: runtime_dir.to_path_buf(),
            dir: runtime_dir
                .join("named")
                .join(trust::node_folder_name(node)),
        }
    }

    fn ensure_dir(&self) -> Result<()> {
        self.check_dirs()?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        self.check_dirs().map(|_| ())
    }

    /// Checks the runtime folder, the folders above it and `named/<node>`
    /// below it; `Ok(false)` when the node's folder does not exist (yet).
    fn check_dirs(&self) -> Result<bool> {
        trust::check_ancestors(&self.runtime)?;
        let named = self.runtime.join("named");
        for dir in [&self.runtime, &named, &self.dir] {
            if !trust::check_dir(dir)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn steps_dir(&self, key: &NamedKey) -> PathBuf {
        self.dir.join(format!("{}.d", key.label()))
    }

    /// Takes the decision lock of `key`, waiting for another step's decision.
    pub fn lock(&self, key: &NamedKey) -> Result<FileLock> {
        self.ensure_dir()?;
        FileLock::exclusive(&self.dir.join(format!("{}.lock", key.label())), || {})
    }

    /// The steps that run `key` now; stale records are removed.
    pub fn running(&self, key: &NamedKey) -> Result<Vec<RunningStep>> {
        let dir = self.steps_dir(key);
        if !self.check_dirs()? || !trust::check_dir(&dir)? {
            return Ok(Vec::new());
        }
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
        };
        let mut alive = Vec::new();
        for entry in entries {
            let path = entry
                .with_context(|| format!("cannot list {}", dir.display()))?
                .path();
            let Some(bytes) = trust::read_record(&path)? else {
                continue;
            };
            let record = serde_json::from_slice::<RunningStep>(&bytes).ok();
            match record {
                Some(record) if record.is_alive() => alive.push(record),
                _ => {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        alive.sort_by_key(|r| (r.job, r.step));
        Ok(alive)
    }

    /// Publishes `record` for `key` until the returned value is dropped.
    pub fn publish(&self, key: &NamedKey, record: &RunningStep) -> Result<Publication> {
        let dir = self.steps_dir(key);
        self.ensure_dir()?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        trust::check_dir(&dir)?;
        let path = dir.join(format!("{}.{}.json", record.job, record.step));
        let bytes = serde_json::to_vec(record).context("cannot encode a running-step record")?;
        write_synced(&path, &bytes)?;
        Ok(Publication { path })
    }

    /// Removes the records and locks of job-scoped containers of `job`.
    pub fn remove_job(&self, job: u32) -> Result<()> {
        if !self.check_dirs()? {
            return Ok(());
        }
        let marker = format!(".job-{job}.");
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", self.dir.display())),
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().contains(&marker) {
                let path = entry.path();
                let _ = if path.is_dir() {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::spec::UserIdentity;
    use crate::named::roots::Scope;

    fn record(pid: i32, start_time: u64) -> RunningStep {
        let user = UserIdentity::lookup(0, 0).unwrap();
        RunningStep {
            pid,
            start_time,
            job: 3,
            step: 1,
            namespaces: vec![NamespaceHandle {
                kind: "user".into(),
                fd: 0,
                inode: 1,
            }],
            spec: ContainerSpec::new("/i.sqfs".into(), Default::default(), user),
        }
    }

    /// Records are believed only in folders of root (the caller) that no one
    /// else can write, and only as regular files of the same owner.
    #[test]
    fn records_in_folders_others_control_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let runtime = tempfile::tempdir().unwrap();
        let registry = Registry::new(runtime.path(), "n1");
        let key = NamedKey {
            uid: 0,
            scope: Scope::Job(3),
            name: "n".into(),
        };
        drop(registry.lock(&key).unwrap());
        let me = std::process::id() as i32;
        let published = registry
            .publish(&key, &record(me, start_time(me).unwrap()))
            .unwrap();
        let refused = |what: &str| {
            let e = registry.running(&key).expect_err(what);
            let text = format!("{e:#}");
            assert!(text.contains("remove it"), "{what}: {text}");
        };
        // A folder on the way that others can write.
        let node_dir = runtime.path().join("named/n1");
        fs::set_permissions(&node_dir, fs::Permissions::from_mode(0o777)).unwrap();
        refused("a world-writable records folder");
        fs::set_permissions(&node_dir, fs::Permissions::from_mode(0o700)).unwrap();
        let runtime_mode = fs::metadata(runtime.path()).unwrap().mode();
        fs::set_permissions(runtime.path(), fs::Permissions::from_mode(0o770)).unwrap();
        refused("a group-writable runtime folder");
        fs::set_permissions(runtime.path(), fs::Permissions::from_mode(runtime_mode)).unwrap();
        // A record that is a symlink to a file elsewhere.
        let steps = node_dir.join(format!("{}.d", key.label()));
        let planted = runtime.path().join("planted.json");
        fs::copy(&published.path, &planted).unwrap();
        std::os::unix::fs::symlink(&planted, steps.join("9.9.json")).unwrap();
        refused("a symlinked record");
        fs::remove_file(steps.join("9.9.json")).unwrap();
        // A record others can write.
        fs::set_permissions(&published.path, fs::Permissions::from_mode(0o666)).unwrap();
        refused("a world-writable record");
        fs::set_permissions(&published.path, fs::Permissions::from_mode(0o644)).unwrap();
        if nix::unistd::geteuid().is_root() {
            // A record, and a records folder, of another user.
            std::os::unix::fs::chown(&published.path, Some(4242), None).unwrap();
            refused("another user's record");
            std::os::unix::fs::chown(&published.path, Some(0), None).unwrap();
            std::os::unix::fs::chown(&steps, Some(4242), None).unwrap();
            refused("another user's records folder");
            std::os::unix::fs::chown(&steps, Some(0), None).unwrap();
        }
        // With everything root's again, the (stale) record is read and dropped.
        assert!(registry.running(&key).unwrap().is_empty());
    }

    #[test]
    fn start_time_of_self_is_stable() {
        let pid = std::process::id() as i32;
        assert_eq!(start_time(pid).unwrap(), start_time(pid).unwrap());
        assert!(start_time(-5).is_err());
    }

    #[test]
    fn stale_records_are_dropped() {
        let runtime = tempfile::tempdir().unwrap();
        let registry = Registry::new(runtime.path(), "n1");
        let key = NamedKey {
            uid: 0,
            scope: Scope::Job(3),
            name: "n".into(),
        };
        let _lock = registry.lock(&key).unwrap();
        // fd 0 of this process is no namespace: not alive.
        let me = std::process::id() as i32;
        let published = registry
            .publish(&key, &record(me, start_time(me).unwrap()))
            .unwrap();
        assert!(registry.running(&key).unwrap().is_empty());
        assert!(!published.path.exists(), "stale record removed");
        drop(published);

        // A real namespace descriptor of this process is alive.
        let ns = File::open("/proc/self/ns/user").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&ns);
        let mut alive = record(me, start_time(me).unwrap());
        alive.namespaces[0].fd = fd;
        alive.namespaces[0].inode = ns.metadata().unwrap().ino();
        let published = registry.publish(&key, &alive).unwrap();
        assert_eq!(registry.running(&key).unwrap(), vec![alive.clone()]);
        // Another start time: pid reuse, not alive.
        alive.start_time += 1;
        assert!(!alive.is_alive());
        drop(published);
        assert!(registry.running(&key).unwrap().is_empty());
        registry.remove_job(3).unwrap();
        assert_eq!(
            fs::read_dir(runtime.path().join("named/n1"))
                .unwrap()
                .count(),
            0
        );
    }
}
