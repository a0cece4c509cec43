//! What a container is made of, as plain data: the image, the mounts, the user.
//!
//! Everything here is pure (apart from [`UserIdentity::lookup`], which reads the
//! host's user database) and travels to the holder process as JSON.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use nix::unistd::{Gid, Group, Uid, User};
use serde::{Deserialize, Serialize};

use crate::image::ImageConfig;

/// Everything the holder needs to build one container's namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// The image, flattened into one squashfs file.
    pub squashfs: PathBuf,
    /// The image's runtime settings (environment, working directory, ...).
    pub image_config: ImageConfig,
    /// The user's bind mounts (`--container-mounts`), made with the user's own
    /// permissions.
    pub mounts: Vec<MountSpec>,
    /// The working directory asked for (`--container-workdir`); overrides the image's.
    pub workdir: Option<String>,
    /// Who the container's processes run as.
    pub user: UserIdentity,
    /// Bind mounts the runtime adds (PMIx directories, ...), made like `mounts`.
    pub extra_binds: Vec<MountSpec>,
    /// A hostname for the container; `None` keeps the host's (no UTS namespace).
    pub hostname: Option<String>,
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

/// One bind mount: a host path made visible at a path inside the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    /// Absolute host path.
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub target: PathBuf,
    /// Make the mount read-only inside the container.
    pub read_only: bool,
}

impl MountSpec {
    /// A read-write bind of `source` at the same path inside the container.
    pub fn same_path(source: impl Into<PathBuf>) -> Self {
        let source = source.into();
        MountSpec {
            target: source.clone(),
            source,
            read_only: false,
        }
    }
}

/// Why a `--container-mounts` entry was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSpecProblem {
    /// More than three `:`-separated fields.
    TooManyFields,
    /// The source is empty or not an absolute path.
    SourceNotAbsolute,
    /// The destination is empty or not an absolute path.
    TargetNotAbsolute,
    /// The destination contains a `..` component.
    TargetHasParentDir,
    /// A flag other than `ro` or `rw`.
    UnknownFlag(String),
}

/// A rejected `--container-mounts` entry, with a message fit for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpecError {
    /// The entry as the user wrote it.
    pub entry: String,
    /// What is wrong with it.
    pub problem: MountSpecProblem,
}

impl fmt::Display for MountSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match &self.problem {
            MountSpecProblem::TooManyFields => "too many ':' fields".to_string(),
            MountSpecProblem::SourceNotAbsolute => {
                "the source must be an absolute path".to_string()
            }
            MountSpecProblem::TargetNotAbsolute => {
                "the destination must be an absolute path".to_string()
            }
            MountSpecProblem::TargetHasParentDir => {
                "the destination must not contain '..'".to_string()
            }
            MountSpecProblem::UnknownFlag(flag) => {
                format!("unknown flag '{flag}' (supported: ro, rw)")
            }
        };
        write!(
            f,
            "invalid container mount '{}': {why}; expected SRC[:DST[:FLAGS]] with absolute \
             paths and FLAGS 'ro' or 'rw', several mounts separated by ','",
            self.entry
        )
    }
}

impl std::error::Error for MountSpecError {}

/// Parses pyxis's `--container-mounts` value: `SRC[:DST[:FLAGS]][,...]`.
///
/// `DST` defaults to `SRC`; `FLAGS` is `ro` or `rw` (several may be joined with
/// `+`, the last wins). Empty entries are skipped. Paths must be absolute.
pub fn parse_mounts(value: &str) -> Result<Vec<MountSpec>, MountSpecError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(parse_mount_entry)
        .collect()
}

fn parse_mount_entry(entry: &str) -> Result<MountSpec, MountSpecError> {
    let error = |problem| MountSpecError {
        entry: entry.to_string(),
        problem,
    };
    let fields: Vec<&str> = entry.split(':').collect();
    if fields.len() > 3 {
        return Err(error(MountSpecProblem::TooManyFields));
    }
    let source = Path::new(fields[0]);
    if !source.is_absolute() {
        return Err(error(MountSpecProblem::SourceNotAbsolute));
    }
    let target = match fields.get(1) {
        Some(dst) => Path::new(*dst),
        None => source,
    };
    if !target.is_absolute() {
        return Err(error(MountSpecProblem::TargetNotAbsolute));
    }
    if target.components().any(|c| c == Component::ParentDir) {
        return Err(error(MountSpecProblem::TargetHasParentDir));
    }
    let mut read_only = false;
    if let Some(flags) = fields.get(2) {
        for flag in flags.split('+').filter(|flag| !flag.is_empty()) {
            match flag {
                "ro" => read_only = true,
                "rw" => read_only = false,
                other => return Err(error(MountSpecProblem::UnknownFlag(other.to_string()))),
            }
        }
    }
    Ok(MountSpec {
        source: source.to_path_buf(),
        target: target.to_path_buf(),
        read_only,
    })
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

    fn mount(source: &str, target: &str, read_only: bool) -> MountSpec {
        MountSpec {
            source: source.into(),
            target: target.into(),
            read_only,
        }
    }

    #[test]
    fn parses_source_only_and_defaults_target() {
        assert_eq!(
            parse_mounts("/scratch").unwrap(),
            vec![mount("/scratch", "/scratch", false)]
        );
    }

    #[test]
    fn parses_several_entries_with_flags() {
        assert_eq!(
            parse_mounts("/a:/b,/c:/d:ro, /e:/f:rw,").unwrap(),
            vec![
                mount("/a", "/b", false),
                mount("/c", "/d", true),
                mount("/e", "/f", false),
            ]
        );
    }

    #[test]
    fn joined_flags_last_wins() {
        assert_eq!(
            parse_mounts("/a:/b:rw+ro").unwrap(),
            vec![mount("/a", "/b", true)]
        );
    }

    #[test]
    fn empty_value_is_no_mounts() {
        assert_eq!(parse_mounts("").unwrap(), vec![]);
        assert_eq!(parse_mounts(" , ").unwrap(), vec![]);
    }

    #[test]
    fn rejects_relative_source() {
        let err = parse_mounts("/ok,data:/data").unwrap_err();
        assert_eq!(err.entry, "data:/data");
        assert_eq!(err.problem, MountSpecProblem::SourceNotAbsolute);
        let text = err.to_string();
        assert!(text.contains("'data:/data'"), "{text}");
        assert!(text.contains("SRC[:DST[:FLAGS]]"), "{text}");
    }

    #[test]
    fn rejects_relative_or_empty_target() {
        let err = parse_mounts("/data:data").unwrap_err();
        assert_eq!(err.problem, MountSpecProblem::TargetNotAbsolute);
        let err = parse_mounts("/data::ro").unwrap_err();
        assert_eq!(err.problem, MountSpecProblem::TargetNotAbsolute);
    }

    #[test]
    fn rejects_parent_dir_in_target() {
        let err = parse_mounts("/data:/x/../etc").unwrap_err();
        assert_eq!(err.problem, MountSpecProblem::TargetHasParentDir);
    }

    #[test]
    fn rejects_unknown_flag_and_names_it() {
        let err = parse_mounts("/a:/b:rprivate").unwrap_err();
        assert_eq!(
            err.problem,
            MountSpecProblem::UnknownFlag("rprivate".to_string())
        );
        assert!(err.to_string().contains("unknown flag 'rprivate'"));
    }

    #[test]
    fn rejects_too_many_fields() {
        let err = parse_mounts("/a:/b:ro:x").unwrap_err();
        assert_eq!(err.problem, MountSpecProblem::TooManyFields);
    }

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
