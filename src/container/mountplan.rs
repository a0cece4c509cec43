//! The mounts one container gets, in order, built from its spec (pure; the
//! holder applies them with [`crate::container::mounts`]), and the
//! fstab-like table of what was mounted that `log_level=debug` shows.
//!
//! The root holder's own steps (the injected libraries and files, the
//! system binds, a `/dev` of the container's own, the masks over parts of
//! `/sys`) are [`RootStep`]s: data
//! that [`crate::container::injection::apply`] plans and the holder makes,
//! each with [`crate::container::mounts::apply`] like every other mount.

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::container::spec::{ContainerSpec, MountKind, MountSpec, UserMount};

/// What the holder mounts, in two groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPlan {
    /// Host binds every container gets, made as root before the drop to the
    /// user; those that an `umount` entry removes are left out.
    pub system: Vec<MountSpec>,
    /// Mounts made as the user after the drop, in order: the home directory
    /// (`mount_home`), the user's `--container-mounts`, the runtime's extra
    /// binds.
    pub user: Vec<UserMount>,
}

impl MountPlan {
    /// Builds the plan for `spec` on a host whose system binds are `system`.
    ///
    /// An `umount` entry for a system bind (nothing mounted there by an
    /// earlier entry) removes that bind from `system` instead of unmounting
    /// it later: mounts made before the user namespace are locked in it.
    pub fn new(spec: &ContainerSpec, mut system: Vec<MountSpec>) -> anyhow::Result<MountPlan> {
        let mut user = Vec::with_capacity(spec.mounts.len() + spec.extra_binds.len() + 1);
        if spec.mount_home {
            user.push(UserMount::from(MountSpec::same_path(home_of(spec)?)));
        }
        for mount in &spec.mounts {
            let mounted_before = user.iter().any(|m| m.target == mount.target);
            if mount.kind == MountKind::Umount && !mounted_before {
                if let Some(index) = system.iter().position(|s| s.target == mount.target) {
                    system.remove(index);
                    continue;
                }
            }
            user.push(mount.clone());
        }
        user.extend(spec.extra_binds.iter().cloned().map(UserMount::from));
        Ok(MountPlan { system, user })
    }
}

/// Why a root holder makes a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A host directory every container gets (`/proc`, `/sys`, `/dev`, ...).
    System,
    /// A host library or file of the site's injection (GPU, MPI profiles).
    Injected,
    /// The container's own `/dev`: its tmpfs and the host entries kept in it.
    Dev,
    /// A device the injection adds to that `/dev`.
    Device,
    /// A part of the host's `/sys` masked, and what is put back in it (the
    /// InfiniBand devices the container is given).
    Sys,
}

impl Origin {
    /// The word the mount table shows.
    pub fn name(self) -> &'static str {
        match self {
            Origin::System => "system",
            Origin::Injected => "inject",
            Origin::Dev => "dev",
            Origin::Device => "device",
            Origin::Sys => "sys",
        }
    }
}

/// One step a root holder makes in the container's root before the drop to
/// the user, after the mount points exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootStep {
    /// A bind or a tmpfs.
    Mount {
        /// What to mount, and where.
        mount: UserMount,
        /// Why.
        origin: Origin,
        /// What a failure says it was doing (the mount table line when `None`).
        context: Option<String>,
    },
    /// A symbolic link in a tmpfs of the holder's: the container's own
    /// `/dev` (one on the host too) or a masked `/sys` folder.
    Symlink {
        /// The link, in the container.
        target: PathBuf,
        /// Where it points.
        link: PathBuf,
        /// Why.
        origin: Origin,
    },
}

impl RootStep {
    /// A bind of `spec` made for `origin`.
    pub fn bind(spec: MountSpec, origin: Origin) -> RootStep {
        RootStep::Mount {
            mount: UserMount::from(spec),
            origin,
            context: None,
        }
    }

    /// The same step, saying `context` when it fails.
    pub fn failing_with(self, context: String) -> RootStep {
        match self {
            RootStep::Mount { mount, origin, .. } => RootStep::Mount {
                mount,
                origin,
                context: Some(context),
            },
            other => other,
        }
    }

    /// Its line in the mount table.
    pub fn table_line(&self) -> String {
        match self {
            RootStep::Mount { mount, origin, .. } => table_line(mount, origin.name()),
            RootStep::Symlink {
                target,
                link,
                origin,
            } => format!(
                "{} {} symlink - # {}",
                link.display(),
                target.display(),
                origin.name()
            ),
        }
    }
}

/// One mount as an fstab line, `SOURCE TARGET TYPE OPTIONS # WHY` (an
/// unmount shows `-` as its source).
pub fn table_line(mount: &UserMount, why: &str) -> String {
    let (source, kind) = match mount.kind {
        MountKind::Bind => (mount.source.display().to_string(), "bind"),
        MountKind::Tmpfs => ("tmpfs".to_string(), "tmpfs"),
        MountKind::Umount => ("-".to_string(), "umount"),
    };
    let mut options = vec![if mount.read_only { "ro" } else { "rw" }.to_string()];
    let flags = &mount.flags;
    for (set, name) in [
        (flags.nosuid, "nosuid"),
        (flags.nodev, "nodev"),
        (flags.noexec, "noexec"),
    ] {
        if set {
            options.push(name.to_string());
        }
    }
    if let Some(propagation) = flags.propagation {
        let recursive = if flags.recursive_propagation { "r" } else { "" };
        options.push(format!("{recursive}{propagation:?}").to_lowercase());
    }
    options.extend(mount.tmpfs_options.iter().cloned());
    format!(
        "{source} {} {kind} {} # {why}",
        mount.target.display(),
        options.join(",")
    )
}

/// The user's home directory, checked to be something we may bind.
fn home_of(spec: &ContainerSpec) -> anyhow::Result<&Path> {
    let home = Path::new(&spec.user.home);
    if !home.is_absolute() || home.parent().is_none() {
        bail!(
            "cannot mount the home directory of user {}: '{}' is not an absolute path below /; \
             drop --container-mount-home or fix the user's home in the user database",
            spec.user.name,
            spec.user.home
        );
    }
    Ok(home)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::spec::{parse_mounts, UserIdentity};
    use crate::image::ImageConfig;

    fn spec(mounts: &str) -> ContainerSpec {
        let user = UserIdentity {
            uid: 1001,
            gid: 1001,
            groups: vec![1001],
            name: "alice".into(),
            home: "/home/alice".into(),
            shell: "/bin/sh".into(),
            group_names: Default::default(),
        };
        let mut spec = ContainerSpec::new("/i.sqfs".into(), ImageConfig::default(), user);
        spec.mounts = parse_mounts(mounts).unwrap();
        spec
    }

    fn system() -> Vec<MountSpec> {
        vec![MountSpec::same_path("/proc"), MountSpec::same_path("/tmp")]
    }

    fn targets(mounts: &[UserMount]) -> Vec<String> {
        mounts
            .iter()
            .map(|m| format!("{:?}:{}", m.kind, m.target.display()))
            .collect()
    }

    #[test]
    fn home_comes_first_then_mounts_then_extra_binds() {
        let mut spec = spec("/data:/data");
        spec.mount_home = true;
        spec.extra_binds = vec![MountSpec::same_path("/pmix")];
        let plan = MountPlan::new(&spec, system()).unwrap();
        assert_eq!(
            targets(&plan.user),
            vec!["Bind:/home/alice", "Bind:/data", "Bind:/pmix"]
        );
        assert_eq!(plan.system, system());
    }

    #[test]
    fn umount_of_a_system_bind_leaves_it_out() {
        let plan = MountPlan::new(&spec("umount:/tmp/"), system()).unwrap();
        assert_eq!(plan.system, vec![MountSpec::same_path("/proc")]);
        assert!(plan.user.is_empty());
    }

    #[test]
    fn umount_after_a_user_mount_unmounts_that() {
        let plan = MountPlan::new(&spec("tmpfs:/tmp,umount:/tmp"), system()).unwrap();
        assert_eq!(plan.system, system());
        assert_eq!(targets(&plan.user), vec!["Tmpfs:/tmp", "Umount:/tmp"]);
    }

    #[test]
    fn umount_elsewhere_is_kept_for_the_holder() {
        let plan = MountPlan::new(&spec("umount:/opt"), system()).unwrap();
        assert_eq!(targets(&plan.user), vec!["Umount:/opt"]);
    }

    #[test]
    fn the_table_shows_each_mount_as_an_fstab_line() {
        let mounts = parse_mounts("/data:/in:ro+noexec,tmpfs:/scratch").unwrap();
        assert_eq!(
            table_line(&mounts[0], "user"),
            "/data /in bind ro,noexec # user"
        );
        assert!(
            table_line(&mounts[1], "user").starts_with("tmpfs /scratch tmpfs rw"),
            "{}",
            table_line(&mounts[1], "user")
        );
        let step = RootStep::bind(MountSpec::same_path("/proc"), Origin::System);
        assert_eq!(step.table_line(), "/proc /proc bind rw # system");
        let link = RootStep::Symlink {
            target: "/dev/fd".into(),
            link: "/proc/self/fd".into(),
            origin: Origin::Dev,
        };
        assert_eq!(link.table_line(), "/proc/self/fd /dev/fd symlink - # dev");
    }

    #[test]
    fn home_must_be_below_root() {
        let mut spec = spec("");
        spec.mount_home = true;
        spec.user.home = "/".into();
        let err = MountPlan::new(&spec, system()).unwrap_err().to_string();
        assert!(err.contains("home directory of user alice"), "{err}");
    }
}
