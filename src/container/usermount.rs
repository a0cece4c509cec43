//! The `--container-mounts` grammar of pyxis, as data: `SRC[:DST[:FLAGS]]`
//! entries separated by `,`, flags joined with `+`.
//!
//! `SRC` is an absolute host path (file, folder or character device), the word
//! `tmpfs` (a fresh tmpfs; FLAGS may carry tmpfs options such as `size=64M`),
//! or the word `umount` (remove the mount at `DST` inside the container, one
//! the image or the site set). Pure parsing only; [`crate::container::mounts`]
//! applies the result.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a [`UserMount`] mounts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MountKind {
    /// A recursive bind of the host path `source`.
    #[default]
    Bind,
    /// A new, empty tmpfs.
    Tmpfs,
    /// Unmount whatever is mounted at `target` (recursively, lazily).
    Umount,
}

/// Mount propagation of a mount (see mount_namespaces(7)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Propagation {
    /// No events in or out.
    Private,
    /// Events from the peer group come in, none go out.
    Slave,
    /// Events go both ways with the peer group.
    Shared,
    /// Private, and the mount cannot be bind-mounted.
    Unbindable,
}

/// Mount flags of a [`UserMount`] beyond read-only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountFlags {
    /// Propagation to set on the mount after it is attached.
    #[serde(default)]
    pub propagation: Option<Propagation>,
    /// Whether `propagation` applies to every mount below too (`rprivate`, ...).
    #[serde(default)]
    pub recursive_propagation: bool,
    /// Ignore set-user-id and set-group-id bits (`nosuid`).
    #[serde(default)]
    pub nosuid: bool,
    /// No device files (`nodev`).
    #[serde(default)]
    pub nodev: bool,
    /// No program execution (`noexec`).
    #[serde(default)]
    pub noexec: bool,
}

/// One `--container-mounts` entry.
///
/// Serialized flat, so the JSON of a plain bind (`source`, `target`,
/// `read_only`) is the same as that of a [`MountSpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMount {
    /// Bind, tmpfs, or unmount.
    #[serde(default)]
    pub kind: MountKind,
    /// Absolute host path for a bind; `tmpfs` or `umount` otherwise.
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub target: PathBuf,
    /// Read-only inside the container (`ro`).
    #[serde(default)]
    pub read_only: bool,
    /// The other flags.
    #[serde(default)]
    pub flags: MountFlags,
    /// tmpfs options (`size=64M`, `mode=1777`, ...), for [`MountKind::Tmpfs`].
    #[serde(default)]
    pub tmpfs_options: Vec<String>,
}

impl From<MountSpec> for UserMount {
    fn from(bind: MountSpec) -> UserMount {
        UserMount {
            kind: MountKind::Bind,
            source: bind.source,
            target: bind.target,
            read_only: bind.read_only,
            flags: MountFlags::default(),
            tmpfs_options: Vec::new(),
        }
    }
}

/// tmpfs options accepted in FLAGS (see tmpfs(5)).
const TMPFS_OPTIONS: &[&str] = &[
    "size",
    "nr_blocks",
    "nr_inodes",
    "mode",
    "uid",
    "gid",
    "huge",
    "mpol",
];

/// Why a `--container-mounts` entry was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSpecProblem {
    /// More than three `:`-separated fields.
    TooManyFields,
    /// The source is empty or not an absolute path, `tmpfs` or `umount`.
    SourceNotAbsolute,
    /// The destination is empty or not an absolute path.
    TargetNotAbsolute,
    /// The destination contains a `..` component.
    TargetHasParentDir,
    /// `umount` without a destination.
    UmountNeedsTarget,
    /// A flag that is not known (or a tmpfs option on a bind).
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
            MountSpecProblem::SourceNotAbsolute => "the source must be an absolute path, a \
                 path relative to the working directory starting with '.' (./data), 'tmpfs' or \
                 'umount'"
                .to_string(),
            MountSpecProblem::TargetNotAbsolute => {
                "the destination must be an absolute path".to_string()
            }
            MountSpecProblem::TargetHasParentDir => {
                "the destination must not contain '..'".to_string()
            }
            MountSpecProblem::UmountNeedsTarget => {
                "'umount' needs the path to unmount as destination (umount:/path)".to_string()
            }
            MountSpecProblem::UnknownFlag(flag) => format!(
                "unknown flag '{flag}' (supported: ro, rw, private, rprivate, slave, rslave, \
                 shared, rshared, unbindable, runbindable, nosuid, nodev, noexec; for tmpfs \
                 also {})",
                TMPFS_OPTIONS.join("=, ") + "="
            ),
        };
        write!(
            f,
            "invalid container mount '{}': {why}; expected SRC[:DST[:FLAGS]] with FLAGS joined \
             by '+', several mounts separated by ','",
            self.entry
        )
    }
}

impl std::error::Error for MountSpecError {}

/// Makes the bind sources written relative (`./data`, `..`) absolute by
/// joining them to `cwd`, the job's (or the CLI's) working directory. Call it
/// on every [`parse_mounts`] result before the mounts are made.
pub fn resolve_relative_sources(mounts: &mut [UserMount], cwd: &Path) {
    for mount in mounts
        .iter_mut()
        .filter(|m| m.kind == MountKind::Bind && !m.source.is_absolute())
    {
        mount.source = cwd.join(&mount.source);
    }
}

/// Parses pyxis's `--container-mounts` value: `SRC[:DST[:FLAGS]][,...]`.
///
/// `DST` defaults to `SRC`. `FLAGS` are joined with `+`; of `ro` and `rw` the
/// last wins, as does the last propagation flag. Empty entries are skipped.
pub fn parse_mounts(value: &str) -> Result<Vec<UserMount>, MountSpecError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(parse_mount_entry)
        .collect()
}

fn parse_mount_entry(entry: &str) -> Result<UserMount, MountSpecError> {
    let error = |problem| MountSpecError {
        entry: entry.to_string(),
        problem,
    };
    let fields: Vec<&str> = entry.split(':').collect();
    if fields.len() > 3 {
        return Err(error(MountSpecProblem::TooManyFields));
    }
    let source = Path::new(fields[0]);
    let kind = match fields[0] {
        "tmpfs" => MountKind::Tmpfs,
        "umount" => MountKind::Umount,
        // `./data`, `../data`, `.`: relative to the job's working directory
        // (as with pyxis), made absolute by [`resolve_relative_sources`].
        _ if source.is_absolute() || fields[0].starts_with('.') => MountKind::Bind,
        _ => return Err(error(MountSpecProblem::SourceNotAbsolute)),
    };
    let target = match (fields.get(1), kind) {
        (Some(dst), _) => Path::new(*dst),
        (None, MountKind::Umount) => return Err(error(MountSpecProblem::UmountNeedsTarget)),
        (None, _) => source,
    };
    if !target.is_absolute() {
        return Err(error(MountSpecProblem::TargetNotAbsolute));
    }
    if target.components().any(|c| c == Component::ParentDir) {
        return Err(error(MountSpecProblem::TargetHasParentDir));
    }
    let mut mount = UserMount {
        kind,
        source: source.to_path_buf(),
        target: target.to_path_buf(),
        read_only: false,
        flags: MountFlags::default(),
        tmpfs_options: Vec::new(),
    };
    let flags = fields.get(2).copied().unwrap_or("");
    for flag in flags.split('+').filter(|flag| !flag.is_empty()) {
        if !apply_flag(&mut mount, flag) {
            return Err(error(MountSpecProblem::UnknownFlag(flag.to_string())));
        }
    }
    Ok(mount)
}

/// Applies one FLAGS word to `mount`; false when it is not valid there.
/// (Also the options of enroot's `mounts.d` lines that mean the same.)
pub(crate) fn apply_flag(mount: &mut UserMount, flag: &str) -> bool {
    let mut propagate = |propagation, recursive| {
        mount.flags.propagation = Some(propagation);
        mount.flags.recursive_propagation = recursive;
    };
    match flag {
        "ro" => mount.read_only = true,
        "rw" => mount.read_only = false,
        "private" => propagate(Propagation::Private, false),
        "rprivate" => propagate(Propagation::Private, true),
        "slave" => propagate(Propagation::Slave, false),
        "rslave" => propagate(Propagation::Slave, true),
        "shared" => propagate(Propagation::Shared, false),
        "rshared" => propagate(Propagation::Shared, true),
        "unbindable" => propagate(Propagation::Unbindable, false),
        "runbindable" => propagate(Propagation::Unbindable, true),
        "nosuid" => mount.flags.nosuid = true,
        "nodev" => mount.flags.nodev = true,
        "noexec" => mount.flags.noexec = true,
        option if mount.kind == MountKind::Tmpfs && is_tmpfs_option(option) => {
            mount.tmpfs_options.push(option.to_string())
        }
        _ => return false,
    }
    true
}

fn is_tmpfs_option(option: &str) -> bool {
    option
        .split_once('=')
        .is_some_and(|(key, value)| TMPFS_OPTIONS.contains(&key) && !value.is_empty())
}

/// One plain bind mount: a host path made visible at a path inside the
/// container (the runtime's own binds; the user's are [`UserMount`]s).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(source: &str, target: &str, read_only: bool) -> UserMount {
        UserMount {
            read_only,
            ..UserMount::from(MountSpec {
                source: source.into(),
                target: target.into(),
                read_only: false,
            })
        }
    }

    #[test]
    fn parses_source_only_and_defaults_target() {
        assert_eq!(
            parse_mounts("/scratch").unwrap(),
            vec![bind("/scratch", "/scratch", false)]
        );
    }

    #[test]
    fn parses_several_entries_with_flags() {
        assert_eq!(
            parse_mounts("/a:/b,/c:/d:ro, /e:/f:rw,").unwrap(),
            vec![
                bind("/a", "/b", false),
                bind("/c", "/d", true),
                bind("/e", "/f", false),
            ]
        );
    }

    #[test]
    fn paths_may_contain_spaces() {
        assert_eq!(
            parse_mounts("/my data:/in side:ro").unwrap(),
            vec![bind("/my data", "/in side", true)]
        );
    }

    #[test]
    fn joined_flags_last_wins() {
        assert_eq!(
            parse_mounts("/a:/b:rw+ro").unwrap(),
            vec![bind("/a", "/b", true)]
        );
        let mount = &parse_mounts("/a:/b:shared+rslave").unwrap()[0];
        assert_eq!(mount.flags.propagation, Some(Propagation::Slave));
        assert!(mount.flags.recursive_propagation);
    }

    #[test]
    fn parses_every_flag() {
        let mount = &parse_mounts("/a:/b:ro+nosuid+nodev+noexec+rprivate").unwrap()[0];
        assert!(mount.read_only);
        assert_eq!(
            mount.flags,
            MountFlags {
                propagation: Some(Propagation::Private),
                recursive_propagation: true,
                nosuid: true,
                nodev: true,
                noexec: true,
            }
        );
        for (flag, propagation, recursive) in [
            ("private", Propagation::Private, false),
            ("slave", Propagation::Slave, false),
            ("shared", Propagation::Shared, false),
            ("rshared", Propagation::Shared, true),
            ("unbindable", Propagation::Unbindable, false),
            ("runbindable", Propagation::Unbindable, true),
        ] {
            let mount = &parse_mounts(&format!("/a:/b:{flag}")).unwrap()[0];
            assert_eq!(mount.flags.propagation, Some(propagation), "{flag}");
            assert_eq!(mount.flags.recursive_propagation, recursive, "{flag}");
        }
    }

    #[test]
    fn parses_tmpfs_with_options() {
        let mount = &parse_mounts("tmpfs:/scratch:size=64M+mode=1777+noexec").unwrap()[0];
        assert_eq!(mount.kind, MountKind::Tmpfs);
        assert_eq!(mount.target, Path::new("/scratch"));
        assert_eq!(mount.tmpfs_options, vec!["size=64M", "mode=1777"]);
        assert!(mount.flags.noexec);
    }

    #[test]
    fn tmpfs_options_are_refused_on_binds() {
        let err = parse_mounts("/a:/b:size=64M").unwrap_err();
        assert_eq!(
            err.problem,
            MountSpecProblem::UnknownFlag("size=64M".to_string())
        );
        let err = parse_mounts("tmpfs:/b:colour=red").unwrap_err();
        assert_eq!(
            err.problem,
            MountSpecProblem::UnknownFlag("colour=red".to_string())
        );
    }

    #[test]
    fn parses_umount_and_requires_its_target() {
        let mount = &parse_mounts("umount:/etc/hosts").unwrap()[0];
        assert_eq!(mount.kind, MountKind::Umount);
        assert_eq!(mount.target, Path::new("/etc/hosts"));
        let err = parse_mounts("umount").unwrap_err();
        assert_eq!(err.problem, MountSpecProblem::UmountNeedsTarget);
    }

    #[test]
    fn empty_value_is_no_mounts() {
        assert_eq!(parse_mounts("").unwrap(), vec![]);
        assert_eq!(parse_mounts(" , ").unwrap(), vec![]);
    }

    #[test]
    fn dot_sources_are_taken_from_the_working_directory() {
        let mut mounts = parse_mounts("./data:/data,.:/here,../up:/up:ro,/abs:/abs").unwrap();
        resolve_relative_sources(&mut mounts, Path::new("/job/dir"));
        let sources: Vec<_> = mounts.iter().map(|m| m.source.clone()).collect();
        assert_eq!(
            sources,
            ["/job/dir/./data", "/job/dir/.", "/job/dir/../up", "/abs"]
                .map(PathBuf::from)
                .to_vec()
        );
        // Short form: the destination would be relative too.
        let err = parse_mounts("./data").unwrap_err();
        assert_eq!(err.problem, MountSpecProblem::TargetNotAbsolute);
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
        let err = parse_mounts("/a:/b:rprivat").unwrap_err();
        assert_eq!(
            err.problem,
            MountSpecProblem::UnknownFlag("rprivat".to_string())
        );
        assert!(err.to_string().contains("unknown flag 'rprivat'"));
    }

    #[test]
    fn rejects_too_many_fields() {
        let err = parse_mounts("/a:/b:ro:x").unwrap_err();
        assert_eq!(err.problem, MountSpecProblem::TooManyFields);
    }

    #[test]
    fn plain_bind_json_matches_mount_spec() {
        let old = r#"{"source":"/a","target":"/b","read_only":true}"#;
        let mount: UserMount = serde_json::from_str(old).unwrap();
        assert_eq!(mount, bind("/a", "/b", true));
    }
}
