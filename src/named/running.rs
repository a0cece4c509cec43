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
//! Under `SlurmdParameters=contain_spank` the container is built in a clone
//! of slurmstepd, which sends its descriptors to a socket of slurmstepd
//! ([`HeldElsewhere`]); slurmstepd holds them only as a queued message.
//! Such a record names slurmstepd and that socket's descriptor, and a
//! joining step copies the socket out of slurmstepd (`pidfd_getfd`) and
//! takes its own copies of the message's descriptors (`MSG_PEEK`).
//!
//! Decisions about one name are made under `<runtime>/named/<node>/<label>.lock`
//! (an exclusive `flock`), so two steps never mount the same root twice.

use std::fs::{self, File};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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

/// Where a container's descriptors are held when not by the process that
/// built it: queued in a socket of another process (`contain_spank`:
/// slurmstepd's, sent there by the clone of it that built the container).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldElsewhere {
    /// The holding process.
    pub pid: i32,
    /// Its descriptor of the socket whose queued message carries them.
    pub channel_fd: i32,
    /// That socket's inode, against a reused descriptor number.
    pub channel_inode: u64,
}

/// The socket of a record's process whose queued message carries the
/// namespaces (see [`HeldElsewhere`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelHandle {
    /// The descriptor number in the holding process.
    pub fd: i32,
    /// The socket's inode (`socket:[INODE]`).
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
    /// Its namespaces, user and mount first. With a [`ChannelHandle`],
    /// each `fd` is the namespace's place in the channel's message.
    pub namespaces: Vec<NamespaceHandle>,
    /// `contain_spank`: the socket that holds the namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<ChannelHandle>,
    /// What the container was built from (workdir, environment, user).
    pub spec: ContainerSpec,
}

impl RunningStep {
    /// Describes the container held by this process, or by `held` when
    /// its descriptors were handed over (they lead the message, in the
    /// order of [`Container::namespace_fds`]): descriptors and inodes.
    pub fn of_container(
        container: &Container,
        spec: &ContainerSpec,
        job: u32,
        step: u32,
        held: Option<&HeldElsewhere>,
    ) -> Result<RunningStep> {
        let pid = held.map_or(std::process::id() as i32, |h| h.pid);
        let namespaces = container
            .namespace_fds()
            .into_iter()
            .enumerate()
            .map(|(place, (kind, fd))| {
                let inode = nix::sys::stat::fstat(fd)
                    .with_context(|| format!("cannot stat the {kind} namespace descriptor"))?
                    .st_ino;
                Ok(NamespaceHandle {
                    kind: kind.to_string(),
                    fd: if held.is_some() { place as i32 } else { fd },
                    inode,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RunningStep {
            pid,
            start_time: start_time(pid).context("cannot read the holding process's start time")?,
            job,
            step,
            namespaces,
            channel: held.map(|h| ChannelHandle {
                fd: h.channel_fd,
                inode: h.channel_inode,
            }),
            spec: spec.clone(),
        })
    }

    /// Whether the holding process and every descriptor (or the channel
    /// holding them) are still the ones recorded.
    pub fn is_alive(&self) -> bool {
        let names = |fd: i32, expected: String| {
            fs::read_link(format!("/proc/{}/fd/{fd}", self.pid))
                .is_ok_and(|link| link.as_os_str() == expected.as_str())
        };
        start_time(self.pid).ok() == Some(self.start_time)
            && match &self.channel {
                Some(channel) => names(channel.fd, format!("socket:[{}]", channel.inode)),
                None => self
                    .namespaces
                    .iter()
                    .all(|ns| names(ns.fd, format!("{}:[{}]", ns.kind, ns.inode))),
            }
    }

    /// This process's own copies of the namespaces, in the record's order
    /// (as root): through `/proc/PID/fd`, or copied out of the channel.
    fn open_namespaces(&self) -> Result<Vec<OwnedFd>> {
        let Some(channel) = &self.channel else {
            return self
                .namespaces
                .iter()
                .map(|ns| {
                    File::open(format!("/proc/{}/fd/{}", self.pid, ns.fd))
                        .map(OwnedFd::from)
                        .with_context(|| {
                            format!("cannot open the running container's {} namespace", ns.kind)
                        })
                })
                .collect();
        };
        let gone = || {
            anyhow::anyhow!(
                "step {}.{} let go of the container while this step joined it; run the step again",
                self.job,
                self.step
            )
        };
        let socket = crate::fdpass::copy_from_process(self.pid, channel.fd).with_context(|| {
            format!(
                "cannot copy the container's channel out of process {}",
                self.pid
            )
        })?;
        let inode = nix::sys::stat::fstat(socket.as_raw_fd()).map_or(0, |m| m.st_ino);
        if inode != channel.inode {
            return Err(gone());
        }
        let mut sent = crate::fdpass::peek(socket.as_fd()).map_err(|_| gone())?;
        let mut opened = Vec::new();
        for ns in &self.namespaces {
            let place = usize::try_from(ns.fd).ok().filter(|&p| p < sent.len());
            let Some(place) = place else {
                bail!(
                    "the record of step {}.{} names descriptor {} of {} sent",
                    self.job,
                    self.step,
                    ns.fd,
                    sent.len()
                );
            };
            // Each place is taken once: a placeholder keeps the others' places.
            let placeholder = File::open("/dev/null").context("cannot open /dev/null")?;
            opened.push(std::mem::replace(&mut sent[place], placeholder.into()));
        }
        Ok(opened)
    }

    /// Opens the namespaces (as root) and returns the container to join,
    /// described by `spec` (the record's, perhaps with another workdir).
    pub fn open_with(&self, spec: &ContainerSpec) -> Result<Container> {
        let mut opened: Vec<(String, OwnedFd)> = Vec::new();
        for (ns, fd) in self.namespaces.iter().zip(self.open_namespaces()?) {
            let file = File::from(fd);
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
            channel: None,
            spec: ContainerSpec::new("/i.sqfs".into(), Default::default(), user),
        }
    }

    /// contain_spank: a record names the socket whose queued message holds
    /// the namespaces; a joiner copies the socket out of the holding process
    /// and gets its own copies of each namespace, in the record's order; a
    /// drained channel (the step let go) is an error, not another container.
    #[test]
    fn a_record_held_through_a_channel_is_opened_through_it() {
        use std::os::fd::AsFd;
        use std::os::unix::net::UnixDatagram;
        let (tx, rx) = UnixDatagram::pair().unwrap();
        let user = File::open("/proc/self/ns/user").unwrap();
        let mnt = File::open("/proc/self/ns/mnt").unwrap();
        let inode = |f: &File| f.metadata().unwrap().ino();
        crate::fdpass::send(tx.as_fd(), &[mnt.as_raw_fd(), user.as_raw_fd()]).unwrap();
        let pid = std::process::id() as i32;
        let mut held = record(pid, start_time(pid).unwrap());
        held.namespaces = vec![
            NamespaceHandle {
                kind: "user".into(),
                fd: 1,
                inode: inode(&user),
            },
            NamespaceHandle {
                kind: "mnt".into(),
                fd: 0,
                inode: inode(&mnt),
            },
        ];
        held.channel = Some(ChannelHandle {
            fd: rx.as_raw_fd(),
            inode: nix::sys::stat::fstat(rx.as_raw_fd()).unwrap().st_ino,
        });
        drop((user, mnt));
        assert!(held.is_alive());
        let opened = held.open_namespaces().unwrap();
        let inodes: Vec<u64> = opened
            .iter()
            .map(|fd| nix::sys::stat::fstat(fd.as_raw_fd()).unwrap().st_ino)
            .collect();
        assert_eq!(inodes, [held.namespaces[0].inode, held.namespaces[1].inode]);
        // Another socket at that number: stale.
        let mut other = held.clone();
        other.channel.as_mut().unwrap().inode += 1;
        assert!(!other.is_alive());
        // The message read away (slurmstepd's exit): no container to join.
        let mut byte = [0u8];
        rx.recv(&mut byte).unwrap();
        let e = held.open_namespaces().unwrap_err().to_string();
        assert!(e.contains("let go of the container"), "{e}");
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
