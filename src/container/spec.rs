//! What a container is made of, as plain data: the image, the mounts, the user.
//!
//! Everything here is pure (apart from [`UserIdentity::lookup`], which reads the
//! host's user database) and travels to the holder process as JSON.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::PathBuf;

use anyhow::Context;
use nix::unistd::{Gid, Group, Uid, User};
use serde::{Deserialize, Serialize};

use crate::container::entrypoint::EntrypointRun;
use crate::image::ImageConfig;

pub use crate::container::usermount::{
    parse_mounts, resolve_relative_sources, MountFlags, MountKind, MountSpec, MountSpecError,
    MountSpecProblem, Propagation, UserMount,
};

/// Everything the holder needs to build one container's namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// The image, flattened into one squashfs file.
    pub squashfs: PathBuf,
    /// The image's runtime settings (environment, working directory, ...).
    pub image_config: ImageConfig,
    /// The user's mounts (`--container-mounts`), made in order, after the
    /// drop to the user, so the kernel checks the user's own permissions.
    pub mounts: Vec<UserMount>,
    /// The working directory asked for (`--container-workdir`); overrides the image's.
    pub workdir: Option<String>,
    /// Who the container's processes run as.
    pub user: UserIdentity,
    /// Bind mounts the runtime adds (PMIx directories, ...), made like `mounts`.
    pub extra_binds: Vec<MountSpec>,
    /// A hostname for the container; `None` keeps the host's (no UTS namespace
    /// unless `unshare` asks for one).
    pub hostname: Option<String>,
    /// Root file system writable (`--container-writable`, the default: an
    /// overlay with a tmpfs upper layer) or read-only (`--container-readonly`).
    #[serde(default = "default_writable")]
    pub writable: bool,
    /// Bind the user's home directory at the same path
    /// (`--container-mount-home`).
    #[serde(default)]
    pub mount_home: bool,
    /// Namespaces of these kinds are new for the container instead of the
    /// host's (`--container-unshare`).
    #[serde(default)]
    pub unshare: Vec<Namespace>,
    /// The user appears as uid 0 and gid 0 inside (`--container-remap-root`),
    /// without any privilege on the host.
    #[serde(default)]
    pub remap_root: bool,
    /// The image ENTRYPOINT to run once when the container is created
    /// (`--container-entrypoint` of the Slurm plugin); `None` runs nothing.
    #[serde(default)]
    pub entrypoint: Option<EntrypointRun>,
    /// A folder on the node's disk holding the overlay's `upper/` and `work/`
    /// (named containers and roots to save keep their changes there); `None`:
    /// a tmpfs that vanishes with the container. Privileged mode only.
    #[serde(default)]
    pub upper_dir: Option<PathBuf>,
    /// Who opens `squashfs` for the loop mount: the pull user for an image
    /// of the node store (which ordinary users cannot read); `None`: the
    /// container's user (a squashfs file the user gave).
    #[serde(default)]
    pub image_reader: Option<UserIdentity>,
    /// The store image file root sealed when it took the step's hold (see
    /// [`crate::seal`]): the loop mount takes only that file,
    /// root's and read-only. A store image (`image_reader` set) without it
    /// is refused.
    #[serde(default)]
    pub sealed_image: Option<crate::seal::SealedFile>,
    /// Host libraries, GPUs and devices added to the container
    /// (`--container-mpi`, the step's GPUs; decided by `crate::inject`).
    #[serde(default)]
    pub injection: crate::container::injection::Injection,
    /// The job's mount namespace of Slurm's `job_container/tmpfs` (its nsfs
    /// file, see [`crate::container::jobns`]): the holder builds the
    /// container from it, so that the job's private `/tmp` and `/dev/shm`
    /// are the container's. Privileged mode only.
    #[serde(default)]
    pub job_namespace: Option<PathBuf>,
    /// The site's enroot hooks to run as the user on the built root, before
    /// the user's mounts are locked (privileged mode only).
    #[serde(default)]
    pub site_hooks: Option<SiteHooks>,
    /// The node's time zone, put in the root as enroot's `10-localtime.sh`
    /// does, where the site's `hooks.d` has that hook.
    #[serde(default)]
    pub host_zone: Option<HostZone>,
}

/// The node's `/etc/localtime`, a link to a zone file: the container's
/// `/etc/localtime` becomes the same link, and the zone file is written at
/// its path where the image lacks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostZone {
    /// The zone file the node's link leads to (`/usr/share/zoneinfo/Europe/Berlin`).
    pub zone_file: PathBuf,
    /// Its contents.
    pub contents: Vec<u8>,
}

/// The site's enroot hooks to run (by [`crate::container::sitehooks`]),
/// with what environment and limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteHooks {
    /// The scripts, in the order enroot runs them (by name); each is
    /// executed itself (its `#!` line names the interpreter), as enroot does.
    pub scripts: Vec<PathBuf>,
    /// The hooks' environment (`NAME=VALUE`): the job's, and enroot's
    /// settings; `ENROOT_*` paths of this run are added.
    pub env: Vec<String>,
    /// Seconds each hook may run.
    pub timeout_s: u64,
}

fn default_writable() -> bool {
    true
}

/// A namespace kind `--container-unshare` may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Namespace {
    /// Network: only a loopback interface inside.
    Net,
    /// System V IPC and POSIX message queues.
    Ipc,
    /// Hostname and domain name.
    Uts,
}

impl Namespace {
    /// The name used in `--container-unshare` and in `/proc/PID/ns/`.
    pub fn name(self) -> &'static str {
        match self {
            Namespace::Net => "net",
            Namespace::Ipc => "ipc",
            Namespace::Uts => "uts",
        }
    }

    /// Parses a `--container-unshare` value: kinds separated by `,`, each
    /// once in the result (sorted). Empty items are skipped.
    pub fn parse_list(value: &str) -> Result<Vec<Namespace>, String> {
        let mut kinds = Vec::new();
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let kind = [Namespace::Net, Namespace::Ipc, Namespace::Uts]
                .into_iter()
                .find(|kind| kind.name() == item)
                .ok_or_else(|| {
                    format!("unknown namespace '{item}' in '{value}' (supported: net, ipc, uts)")
                })?;
            kinds.push(kind);
        }
        kinds.sort();
        kinds.dedup();
        Ok(kinds)
    }
}

impl ContainerSpec {
    /// A spec with no mounts, no workdir override and the host's hostname.
    pub fn new(squashfs: PathBuf, image_config: ImageConfig, user: UserIdentity) -> Self {
        ContainerSpec {
            squashfs,
            image_config,
            mounts: Vec::new(),
            workdir: None,
            user,
            extra_binds: Vec::new(),
            hostname: None,
            writable: true,
            mount_home: false,
            unshare: Vec::new(),
            remap_root: false,
            entrypoint: None,
            upper_dir: None,
            image_reader: None,
            sealed_image: None,
            injection: Default::default(),
            job_namespace: None,
            site_hooks: None,
            host_zone: None,
        }
    }

    /// Whether the container gets its own UTS namespace: for a hostname of
    /// its own, or when `unshare` asks for one.
    pub fn has_own_uts(&self) -> bool {
        self.hostname.is_some() || self.unshare.contains(&Namespace::Uts)
    }

    /// The user as the container's processes see it: with `remap_root`,
    /// root (see [`UserIdentity::remapped_to_root`]), else `user` as is.
    pub fn user_inside(&self) -> UserIdentity {
        if self.remap_root {
            self.user.remapped_to_root()
        } else {
            self.user.clone()
        }
    }

    /// The directory tasks start in: the requested workdir, else the image's
    /// `WorkingDir`, else `/`.
    pub fn effective_workdir(&self) -> &str {
        self.workdir
            .as_deref()
            .or(self.image_config.working_dir.as_deref())
            .filter(|dir| !dir.is_empty())
            .unwrap_or("/")
    }
}

/// How the holder gets its privileges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// The caller is root (slurmstepd, or `berth` run by root): the image is
    /// loop-mounted with the kernel squashfs driver and the user namespace maps
    /// the user's uid and every group of the user.
    Privileged,
    /// The caller is the user: the image is mounted with `squashfuse` and
    /// `fuse-overlayfs` inside a user namespace that maps only the caller's own
    /// uid and gid.
    Unprivileged,
}

impl Mode {
    /// [`Mode::Privileged`] when the real or effective uid is 0, else
    /// [`Mode::Unprivileged`].
    pub fn for_current_process() -> Mode {
        if Uid::current().is_root() || Uid::effective().is_root() {
            Mode::Privileged
        } else {
            Mode::Unprivileged
        }
    }
}

/// The user a container's processes run as, as the host knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserIdentity {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Every group of the user, the primary group included.
    pub groups: Vec<u32>,
    /// Login name.
    pub name: String,
    /// Home directory.
    pub home: String,
    /// Login shell.
    pub shell: String,
    /// Names of the groups in `gid` and `groups` that the host can name.
    #[serde(default)]
    pub group_names: BTreeMap<u32, String>,
}

impl UserIdentity {
    /// Looks up `uid` in the host's user database (getpwuid_r, getgrouplist,
    /// getgrgid_r), with `gid` as the primary group.
    ///
    /// A uid the database does not know gets its number as name, `/` as home and
    /// `/bin/sh` as shell, and only `gid` as group.
    pub fn lookup(uid: u32, gid: u32) -> anyhow::Result<UserIdentity> {
        let user = User::from_uid(Uid::from_raw(uid))
            .with_context(|| format!("cannot look up uid {uid} in the user database"))?;
        let Some(user) = user else {
            let mut identity = UserIdentity {
                uid,
                gid,
                groups: vec![gid],
                name: uid.to_string(),
                home: "/".to_string(),
                shell: "/bin/sh".to_string(),
                group_names: BTreeMap::new(),
            };
            identity.add_group_names();
            return Ok(identity);
        };
        let name = CString::new(user.name.as_bytes())
            .with_context(|| format!("user name of uid {uid} contains a NUL byte"))?;
        let mut groups: Vec<u32> = nix::unistd::getgrouplist(&name, Gid::from_raw(gid))
            .with_context(|| format!("cannot list the groups of user '{}'", user.name))?
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        if !groups.contains(&gid) {
            groups.insert(0, gid);
        }
        dedup_keep_order(&mut groups);
        let mut identity = UserIdentity {
            uid,
            gid,
            groups,
            name: user.name,
            home: user.dir.to_string_lossy().into_owned(),
            shell: user.shell.to_string_lossy().into_owned(),
            group_names: BTreeMap::new(),
        };
        identity.add_group_names();
        Ok(identity)
    }

    /// The identity of the calling process's real uid and gid.
    pub fn current() -> anyhow::Result<UserIdentity> {
        UserIdentity::lookup(Uid::current().as_raw(), Gid::current().as_raw())
    }

    /// The primary group followed by every other group, each once.
    pub fn all_gids(&self) -> Vec<u32> {
        let mut gids = vec![self.gid];
        gids.extend(&self.groups);
        dedup_keep_order(&mut gids);
        gids
    }

    /// The identity seen inside a container with `--container-remap-root`:
    /// uid 0 and primary gid 0, named `root`, home `/root`; the
    /// supplementary groups keep their ids and names.
    pub fn remapped_to_root(&self) -> UserIdentity {
        let mut groups: Vec<u32> = self
            .groups
            .iter()
            .map(|&gid| if gid == self.gid { 0 } else { gid })
            .collect();
        dedup_keep_order(&mut groups);
        let mut group_names = self.group_names.clone();
        group_names.remove(&self.gid);
        group_names.insert(0, "root".to_string());
        UserIdentity {
            uid: 0,
            gid: 0,
            groups,
            name: "root".to_string(),
            home: "/root".to_string(),
            shell: self.shell.clone(),
            group_names,
        }
    }

    fn add_group_names(&mut self) {
        for gid in self.all_gids() {
            if let Ok(Some(group)) = Group::from_gid(Gid::from_raw(gid)) {
                self.group_names.insert(gid, group.name);
            }
        }
    }
}

fn dedup_keep_order(ids: &mut Vec<u32>) {
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(*id));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> UserIdentity {
        UserIdentity {
            uid: 1001,
            gid: 1002,
            groups: vec![1002, 1001],
            name: "alice".into(),
            home: "/home/alice".into(),
            shell: "/bin/bash".into(),
            group_names: BTreeMap::new(),
        }
    }

    #[test]
    fn workdir_precedence() {
        let mut spec = ContainerSpec::new("/img.sqfs".into(), ImageConfig::default(), identity());
        assert_eq!(spec.effective_workdir(), "/");
        spec.image_config.working_dir = Some("/image".into());
        assert_eq!(spec.effective_workdir(), "/image");
        spec.workdir = Some("/asked".into());
        assert_eq!(spec.effective_workdir(), "/asked");
    }

    #[test]
    fn spec_round_trips_through_json() {
        let mut spec = ContainerSpec::new("/img.sqfs".into(), ImageConfig::default(), identity());
        spec.mounts = parse_mounts("/a:/b:ro").unwrap();
        spec.user.group_names.insert(1002, "alice".into());
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<ContainerSpec>(&json).unwrap(), spec);
    }

    #[test]
    fn spec_json_without_new_fields_gets_defaults() {
        let spec = ContainerSpec::new("/img.sqfs".into(), ImageConfig::default(), identity());
        let mut json = serde_json::to_value(&spec).unwrap();
        let object = json.as_object_mut().unwrap();
        for field in [
            "writable",
            "mount_home",
            "unshare",
            "remap_root",
            "upper_dir",
        ] {
            assert!(object.remove(field).is_some(), "{field}");
        }
        let parsed: ContainerSpec = serde_json::from_value(json).unwrap();
        assert_eq!(parsed, spec);
        assert!(parsed.writable);
    }

    #[test]
    fn parses_unshare_lists() {
        assert_eq!(
            Namespace::parse_list("uts, net,ipc,net,").unwrap(),
            vec![Namespace::Net, Namespace::Ipc, Namespace::Uts]
        );
        assert_eq!(Namespace::parse_list("").unwrap(), vec![]);
        let err = Namespace::parse_list("net,pid").unwrap_err();
        assert!(err.contains("'pid'"), "{err}");
    }

    #[test]
    fn own_uts_for_hostname_or_unshare() {
        let mut spec = ContainerSpec::new("/img.sqfs".into(), ImageConfig::default(), identity());
        assert!(!spec.has_own_uts());
        spec.unshare = vec![Namespace::Uts];
        assert!(spec.has_own_uts());
        spec.unshare.clear();
        spec.hostname = Some("x".into());
        assert!(spec.has_own_uts());
    }

    #[test]
    fn remapped_user_is_root_with_its_other_groups() {
        let mut user = identity();
        user.group_names.insert(1002, "alice".into());
        user.group_names.insert(1001, "staff".into());
        let root = user.remapped_to_root();
        assert_eq!((root.uid, root.gid, root.name.as_str()), (0, 0, "root"));
        assert_eq!(root.home, "/root");
        assert_eq!(root.all_gids(), vec![0, 1001]);
        assert_eq!(root.group_names.get(&0).map(String::as_str), Some("root"));
        assert_eq!(
            root.group_names.get(&1001).map(String::as_str),
            Some("staff")
        );
        assert!(!root.group_names.contains_key(&1002));
    }

    #[test]
    fn all_gids_puts_primary_first_once() {
        let mut user = identity();
        user.groups = vec![1001, 1002, 1001];
        assert_eq!(user.all_gids(), vec![1002, 1001]);
    }

    #[test]
    fn lookup_root() {
        let root = UserIdentity::lookup(0, 0).unwrap();
        assert_eq!(root.name, "root");
        assert_eq!(root.all_gids()[0], 0);
        assert_eq!(root.group_names.get(&0).map(String::as_str), Some("root"));
    }
}
