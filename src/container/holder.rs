//! The holder: a short-lived helper process (`berth __holder`) that builds a
//! container's namespaces in named stages and hands them to its caller.
//!
//! Privileged mode (the holder is root, the container runs as `spec.user`):
//!
//! 1. private mount namespace; the image on a read-only, self-clearing loop
//!    device, mounted as squashfs, then idmapped so that its root-owned files
//!    are the user's ([`crate::container::idmap`]; when the kernel refuses,
//!    they stay root's, with a warning); a tmpfs-backed overlay on top as the
//!    root;
//! 2. `/etc/passwd`, `/etc/group` and every mount point, written safely inside
//!    the root (see [`crate::container::safepath`]);
//! 3. host `/proc`, `/sys` (with the injection's masks over parts of it),
//!    `/dev` (or one of the container's own), `/tmp`, `/etc/hosts`,
//!    `/etc/resolv.conf`;
//! 4. drop to the user, then a new user and mount namespace, whose maps the
//!    caller writes (`NeedMaps` / `MapsWritten`);
//! 5. the user's own mounts (home, `--container-mounts`, runtime binds; the
//!    kernel checks the user's permissions), then pivot_root, then the root
//!    made read-only unless the container is writable (the overlay stays, so
//!    `/etc/passwd` and mount points could be written before); `Ready`, wait
//!    for `Release`, exit. With `spec.entrypoint`, the image ENTRYPOINT runs
//!    first, in the finished container (see [`crate::container::entrypoint`]).
//!
//! Unprivileged mode (the holder is the user): user and mount namespace first
//! (self maps), then `squashfuse` and `fuse-overlayfs` instead of the loop
//! device and the kernel overlay, then stages 2 and 3 as above, then stage 5
//! in one more mount namespace (the daemons stay behind, outside the
//! container's root).
//!
//! Everything the holder mounts lives only in its own namespaces: when the last
//! process and descriptor of the container's namespaces are gone, the kernel
//! drops every mount, and the loop device clears itself.

use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use nix::sched::{unshare, CloneFlags};
use nix::sys::stat::{fstat, umask, Mode as FileMode, SFlag};

use crate::container::channel::{Channel, FromHolder, ToHolder};
use crate::container::entrypoint;
use crate::container::etcfiles::{group_content, passwd_content};
use crate::container::fuse::{self, FuseMount};
use crate::container::idmap::{self, IdSwap, MappingNamespace};
use crate::container::injection;
use crate::container::ipcns;
use crate::container::loopdev::LoopDevice;
use crate::container::mountplan::{self, MountPlan, Origin, RootStep};
use crate::container::mounts::{self, StagingPaths};
use crate::container::netns;
use crate::container::safepath::RootDir;
use crate::container::sitehooks;
use crate::container::spec::{ContainerSpec, HostZone, Mode, Namespace, UserIdentity, UserMount};

/// The first argument that makes the `berth` binary run [`holder_main`].
pub const HOLDER_ARG: &str = "__holder";

/// The descriptor on which the holder finds its channel to the caller.
pub const HOLDER_FD: RawFd = 3;

/// Where a privileged holder assembles the root file system. It mounts a tmpfs
/// there inside its private mount namespace, so the host never sees what is
/// below; only the empty directory stays on the host.
pub(crate) const STAGING_DIR: &str = "/run/berth";

/// The largest `/etc/passwd` or `/etc/group` of an image we read.
const ETC_FILE_LIMIT: u64 = 16 << 20;

/// Entry point of the holder process (`berth __holder`, channel on fd 3).
///
/// Never returns: exits 0 when the caller took the container, 1 when setup
/// failed (the caller got the reason as a `Failed` message), 2 when started
/// by hand.
pub fn holder_main() -> ! {
    let is_socket = fstat(HOLDER_FD)
        .map(|stat| SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFSOCK)
        .unwrap_or(false);
    if !is_socket {
        eprintln!(
            "berth: '{HOLDER_ARG}' is internal: berth starts it itself, with a socket on fd {HOLDER_FD}"
        );
        std::process::exit(2);
    }
    // What the holder starts (the image ENTRYPOINT, FUSE daemons) must not
    // inherit the channel: it would keep the caller from seeing the holder
    // die, and hand the user a line to a root process.
    // SAFETY: fcntl on a descriptor number with constant flags.
    if unsafe { libc::fcntl(HOLDER_FD, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        eprintln!(
            "berth: cannot set close-on-exec on fd {HOLDER_FD}: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(2);
    }
    // SAFETY: fd 3 is the socket our caller handed over; nothing else in this
    // process owns it.
    let stream = unsafe { UnixStream::from_raw_fd(HOLDER_FD) };
    let code = match Channel::new(stream).and_then(|mut channel| serve(&mut channel)) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    std::process::exit(code)
}

/// Runs the stages for one `Start` message; reports a failure to the caller.
fn serve(channel: &mut Channel) -> anyhow::Result<()> {
    umask(FileMode::from_bits_truncate(0o022));
    let ToHolder::Start { spec, mode } = channel.recv()? else {
        bail!("holder protocol error: the first message must be Start");
    };
    let result = match mode {
        Mode::Privileged => build_privileged(channel, &spec),
        Mode::Unprivileged => build_unprivileged(channel, &spec),
    };
    if let Err(err) = &result {
        let _ = channel.send(&FromHolder::Failed {
            error: format!("{err:#}"),
        });
    }
    result
}

fn build_privileged(channel: &mut Channel, spec: &ContainerSpec) -> anyhow::Result<()> {
    let plan = MountPlan::new(spec, mounts::system_binds())?;
    if let Some(namespace) = &spec.job_namespace {
        crate::container::jobns::enter(namespace)?;
    }
    let image = mount_image_with_loop_device(spec).context("mounting the image")?;
    // With the image mapped, what the holder creates in the root (the /etc
    // files, mount points) is the user's too, like the image's own files.
    let owner = image.mapped.then_some((spec.user.uid, spec.user.gid));
    // ldconfig (library injection) runs as the user, never as root.
    let runner = crate::container::injection::ldconfig::runner_for(&spec.user);
    let table = prepare_root(&image.root, spec, &plan, owner, Some(&runner))
        .context("preparing the root file system")?;
    let mut plan = plan;
    let mut warnings = image.warnings;
    let hook_env = match &spec.site_hooks {
        Some(hooks) => run_site_hooks(hooks, &image.root, spec, owner, &mut plan, &mut warnings)?,
        None => Vec::new(),
    };
    lock_user_mounts(&image.root, spec, &plan)?;
    let user = &spec.user;
    // CAP_SYS_ADMIN stays until the user namespace exists: nodes that
    // restrict unprivileged user namespaces let the holder create it.
    crate::privilege::become_user_for_a_user_namespace(user.uid, user.gid, &user.all_gids())
        .with_context(|| {
            format!(
                "switching to user {} (uid {}, gid {}, groups {:?})",
                user.name,
                user.uid,
                user.gid,
                user.all_gids()
            )
        })?;
    enter_user_namespace(channel, spec).context("creating the user namespace")?;
    finish(
        channel,
        spec,
        &plan,
        &image.root,
        Locked::Yes,
        Vec::new(),
        ForTasks {
            warnings,
            hook_env,
            mount_table: table,
        },
    )
}

/// Privileged stage 2b: the site's enroot hooks, as the user, on the
/// prepared root; their mounts join the user's (mount points made now),
/// their notes the warnings; returns their variables.
fn run_site_hooks(
    hooks: &crate::container::spec::SiteHooks,
    root_path: &Path,
    spec: &ContainerSpec,
    owner: Option<(u32, u32)>,
    plan: &mut MountPlan,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Vec<String>> {
    let work = Path::new(STAGING_DIR).join("hooks");
    let appended = sitehooks::run_all(hooks, root_path, &spec.user, &work)?;
    let mut root = open_root(root_path).context("mounting what the site hooks appended")?;
    if let Some((uid, gid)) = owner {
        root = root.owning_new_entries(uid, gid);
    }
    for mount in &appended.mounts {
        mounts::create_user_mount_point(&root, mount, &spec.user)
            .context("mounting what the site hooks appended")?;
    }
    plan.user.extend(appended.mounts);
    warnings.extend(appended.notes);
    Ok(appended.env)
}

/// Whether the user's mounts and the read-only root were made before the
/// container's user namespace (so the kernel locks them), or are still to
/// be made in it (the unprivileged mode, where the user owns everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Locked {
    /// Made by root in the private mount namespace: locked.
    Yes,
    /// To be made by [`finish`], inside the user namespace.
    No,
}

/// Privileged stage 4a, still root in the private mount namespace: the
/// user's mounts (with the user's permissions on their sources) and, unless
/// the container is writable, the root made read-only. The user namespace
/// created next inherits them locked: neither `mount -o remount,rw` nor
/// `umount` undoes them, not even with `--container-remap-root` or for a
/// process of the user that joins the namespaces from outside.
fn lock_user_mounts(
    root_path: &Path,
    spec: &ContainerSpec,
    plan: &MountPlan,
) -> anyhow::Result<()> {
    let root = open_root(root_path).context("mounting your directories")?;
    for mount in &plan.user {
        mounts::apply_as_user(&root, mount, &spec.user).context("mounting your directories")?;
    }
    if !spec.writable {
        let top = std::fs::File::open(root_path)
            .with_context(|| format!("cannot open the container root {}", root_path.display()))?;
        use std::os::fd::AsFd;
        mounts::make_mount_read_only(top.as_fd())
            .context("cannot make the container's root file system read-only")?;
    }
    Ok(())
}

fn build_unprivileged(channel: &mut Channel, spec: &ContainerSpec) -> anyhow::Result<()> {
    if let Some(dir) = &spec.upper_dir {
        bail!(
            "a root kept on disk ({}) needs the privileged mode: run as root",
            dir.display()
        );
    }
    let plan = MountPlan::new(spec, mounts::system_binds())?;
    enter_user_namespace(channel, spec).context("creating the user namespace")?;
    let (root, daemons) = mount_image_with_fuse(spec).context("mounting the image")?;
    let mount_table =
        prepare_root(&root, spec, &plan, None, None).context("preparing the root file system")?;
    // The daemons must keep the host's root: one whose root or working
    // directory is its own mount deadlocks on the first path lookup. So they
    // stay in this mount namespace, and pivot_root happens in a new one.
    unshare(CloneFlags::CLONE_NEWNS)
        .context("cannot create the container's mount namespace (unshare CLONE_NEWNS)")?;
    let report = ForTasks {
        mount_table,
        ..ForTasks::default()
    };
    finish(channel, spec, &plan, &root, Locked::No, daemons, report)
}

/// Enters a new mount namespace whose mounts are all private and returns
/// the staging folder [`STAGING_DIR`] (created if missing) to mount into.
pub(crate) fn enter_private_staging() -> anyhow::Result<&'static Path> {
    unshare(CloneFlags::CLONE_NEWNS)
        .context("cannot create a private mount namespace (unshare CLONE_NEWNS)")?;
    mounts::make_all_private()?;
    let staging = Path::new(STAGING_DIR);
    std::fs::create_dir_all(staging)
        .with_context(|| format!("cannot create {}", staging.display()))?;
    Ok(staging)
}

/// The container's root as stage 1 left it.
struct MountedImage {
    /// The overlay, the root to be.
    root: PathBuf,
    /// Whether the image layer is idmapped (its files show as the user's).
    mapped: bool,
    /// For the user: why the image could not be mapped.
    warnings: Vec<String>,
}

/// Stage 1, privileged: a private mount namespace; the image on a loop
/// device, mounted as squashfs and idmapped (see
/// [`crate::container::idmap`]); a tmpfs-backed overlay on top.
fn mount_image_with_loop_device(spec: &ContainerSpec) -> anyhow::Result<MountedImage> {
    let staging = enter_private_staging()?;
    let paths = prepare_staging(staging)?;
    {
        let device = match (&spec.image_reader, spec.sealed_image) {
            // A store image (the pull user's folders): only once root sealed it.
            (Some(pull_user), sealed) => {
                LoopDevice::attach_store_image(&spec.squashfs, pull_user, sealed)?
            }
            (None, Some(sealed)) => {
                LoopDevice::attach_store_image(&spec.squashfs, &spec.user, Some(sealed))?
            }
            (None, None) => LoopDevice::attach_read_only(&spec.squashfs, &spec.user)?,
        };
        mounts::mount_squashfs(device.path(), &spec.squashfs, &paths.image)?;
        // Dropping `device` closes it: the mount keeps it busy, autoclear
        // frees it with the last unmount.
    }
    let mut warnings = Vec::new();
    let swap = IdSwap {
        uid: spec.user.uid,
        gid: spec.user.gid,
    };
    let mut mapped = false;
    if !swap.is_identity() {
        match map_image(&paths, swap) {
            Ok(()) => mapped = true,
            Err(err) => warnings.push(unmapped_warning(spec, &format!("{err:#}"))),
        }
    }
    let (upper, work) = match &spec.upper_dir {
        Some(dir) => (dir.join("upper"), dir.join("work")),
        None => (paths.upper.clone(), paths.work.clone()),
    };
    let mut lower = if mapped { &paths.lower } else { &paths.image };
    give_upper_root_attributes(lower, &upper, mapped)?;
    if let Err(err) = mounts::mount_overlay(lower, &upper, &work, &paths.root) {
        if !mapped {
            return Err(err);
        }
        // An older kernel maps squashfs but cannot stack an overlay on it.
        warnings.push(unmapped_warning(spec, &format!("{err:#}")));
        mapped = false;
        lower = &paths.image;
        give_upper_root_attributes(lower, &upper, mapped)?;
        mounts::mount_overlay(lower, &upper, &work, &paths.root)?;
    }
    if let (true, Some(dir)) = (mapped, &spec.upper_dir) {
        swap.record(dir)?;
    }
    Ok(MountedImage {
        root: paths.root,
        mapped,
        warnings,
    })
}

/// Mounts `paths.image` again on `paths.lower`, idmapped by `swap`.
fn map_image(paths: &StagingPaths, swap: IdSwap) -> anyhow::Result<()> {
    let namespace = MappingNamespace::swapping(swap)
        .context("cannot create a user namespace for the id mapping")?;
    mounts::bind_idmapped(&paths.image, &paths.lower, namespace.fd()).with_context(|| {
        format!(
            "cannot make an idmapped mount of {} on {}",
            paths.image.display(),
            paths.lower.display()
        )
    })
}

/// The warning when the image stays owned by root: the container still
/// runs, as without idmapped mounts.
fn unmapped_warning(spec: &ContainerSpec, why: &str) -> String {
    format!(
        "the files of image {} stay owned by root (they show as nobody in the container, so \
         you cannot change files of the image): {why}; this needs {}",
        spec.squashfs.display(),
        idmap::KERNEL_REQUIREMENT
    )
}

/// Gives a fresh upper folder the owner and mode of the image's root, and
/// also one kept from before images were mapped (owned by root while the
/// mapped image's root is the user's), so that `/` is the user's to write.
fn give_upper_root_attributes(lower: &Path, upper: &Path, mapped: bool) -> anyhow::Result<()> {
    let fresh = is_empty_dir(upper)?;
    let kept_from_unmapped = mapped
        && std::fs::metadata(upper)
            .with_context(|| format!("cannot stat {}", upper.display()))?
            .uid()
            == 0;
    if fresh || kept_from_unmapped {
        copy_root_attributes(lower, upper)?;
    }
    Ok(())
}

/// Stage 1, unprivileged (inside our user namespace): squashfuse for the
/// image, fuse-overlayfs on top. Returns the overlay's path and the daemons,
/// the overlay first (it reads the image, so it is stopped first).
fn mount_image_with_fuse(spec: &ContainerSpec) -> anyhow::Result<(PathBuf, Vec<FuseMount>)> {
    mounts::make_all_private()?;
    let staging = unprivileged_staging_dir(spec.user.uid)?;
    let paths = prepare_staging(&staging)?;
    let image = fuse::mount_squashfuse(&spec.squashfs, &paths.lower)?;
    // Files show as the user's, in the ids the namespace gives the user.
    let user = spec.user_inside();
    let overlay = fuse::mount_fuse_overlayfs(&paths, user.uid, user.gid)?;
    Ok((paths.root, vec![overlay, image]))
}

/// Stages 2 and 3, still with the holder's first credentials: `/etc/passwd`,
/// `/etc/group`, a mount point for every bind, and the host's directories.
/// With `owner` (uid, gid), what is created in the root gets that owner.
/// `runner`: whom a root holder runs `ldconfig` as (`None`: ourselves, the
/// unprivileged holder). Returns the mount table (fstab-like lines) of what
/// it mounted.
fn prepare_root(
    root_path: &Path,
    spec: &ContainerSpec,
    plan: &MountPlan,
    owner: Option<(u32, u32)>,
    runner: Option<&UserIdentity>,
) -> anyhow::Result<Vec<String>> {
    let mut root = open_root(root_path)?;
    if let Some((uid, gid)) = owner {
        root = root.owning_new_entries(uid, gid);
    }
    let user = spec.user_inside();
    write_etc_file(&root, "/etc/passwd", &user, passwd_content)?;
    write_etc_file(&root, "/etc/group", &user, group_content)?;
    if let Some(zone) = &spec.host_zone {
        put_host_zone(&root, zone)?;
    }
    if spec.remap_root {
        apt_stays_root(&root)?;
    }
    for bind in &plan.system {
        mounts::create_mount_point(&root, &UserMount::from(bind.clone()))?;
    }
    for mount in &plan.user {
        mounts::create_user_mount_point(&root, mount, &spec.user)?;
    }
    let mut table = Vec::new();
    // Before any host file system enters the root: see injection::apply.
    for step in injection::apply::plan_files(&root, &spec.injection)? {
        mounts::make_root_step(&root, &step)?;
        table.push(step.table_line());
    }
    injection::apply::register_libraries(&root, &spec.injection, runner)?;
    // Each bind below must not reach its target through an earlier one
    // (an image's `/etc -> /tmp/X` and a user's `/tmp/X -> /dev`).
    let one_mount = root
        .on_one_mount()
        .context("cannot open the container root")?;
    for bind in &plan.system {
        if bind.target == Path::new("/dev") && spec.injection.needs_own_dev() {
            for step in injection::apply::plan_dev(&bind.source, &spec.injection)? {
                mounts::make_root_step(&root, &step)?;
                table.push(step.table_line());
            }
            continue;
        }
        let step = RootStep::bind(bind.clone(), Origin::System);
        mounts::make_root_step(&one_mount, &step)?;
        table.push(step.table_line());
        if bind.target == Path::new("/sys") {
            // The masks go over the host's /sys, so through its bind.
            for step in injection::apply::plan_sys(&spec.injection) {
                mounts::make_root_step(&root, &step)?;
                table.push(step.table_line());
            }
        }
    }
    Ok(table)
}

/// Creates the user and mount namespaces (and those `spec` asks for: UTS,
/// network, IPC), has the caller write the maps, and sets the hostname.
fn enter_user_namespace(channel: &mut Channel, spec: &ContainerSpec) -> anyhow::Result<()> {
    let mut flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS;
    if spec.has_own_uts() {
        flags |= CloneFlags::CLONE_NEWUTS;
    }
    for kind in &spec.unshare {
        flags |= match kind {
            Namespace::Net => CloneFlags::CLONE_NEWNET,
            Namespace::Ipc => CloneFlags::CLONE_NEWIPC,
            Namespace::Uts => CloneFlags::CLONE_NEWUTS,
        };
    }
    unshare(flags).with_context(|| {
        format!(
            "cannot create the container's namespaces (unshare {flags:?}): are user namespaces \
             enabled (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)?"
        )
    })?;
    channel.send(&FromHolder::NeedMaps {
        pid: std::process::id() as i32,
    })?;
    expect(channel, ToHolder::MapsWritten)?;
    if spec.unshare.contains(&Namespace::Net) {
        netns::bring_loopback_up()
            .context("cannot set the loopback interface of the new network namespace up")?;
    }
    if let Some(hostname) = &spec.hostname {
        nix::unistd::sethostname(hostname)
            .with_context(|| format!("cannot set the container hostname to '{hostname}'"))?;
    }
    Ok(())
}

/// What the building stages hand to the tasks through `Ready`.
#[derive(Default)]
struct ForTasks {
    /// For the user: what did not go as asked.
    warnings: Vec<String>,
    /// Variables the site's hooks appended, for every task.
    hook_env: Vec<String>,
    /// The mount table (fstab-like lines) of what was mounted as root, for
    /// `log_level=debug`; [`finish`] adds the user's mounts.
    mount_table: Vec<String>,
}

/// Stage 5: the user's binds (with the user's own permissions), pivot_root,
/// `Ready`; waits for `Release` while the FUSE daemons (if any) are still ours
/// to stop on failure.
fn finish(
    channel: &mut Channel,
    spec: &ContainerSpec,
    plan: &MountPlan,
    root_path: &Path,
    locked: Locked,
    daemons: Vec<FuseMount>,
    told: ForTasks,
) -> anyhow::Result<()> {
    // The recursive bind keeps the locks of the mounts below (and of the
    // root's read-only flag), while pivot_root needs a top it may move.
    mounts::bind_onto_itself(root_path).context("entering the root file system")?;
    // A descriptor opened before unshare (or the bind) names other mounts:
    // open the root again, on the bind of this namespace.
    let root = open_root(root_path).context("mounting your directories")?;
    for mount in &plan.user {
        match locked {
            Locked::Yes => mounts::set_user_propagation(&root, mount),
            Locked::No => mounts::apply(&root, mount),
        }
        .context("mounting your directories")?;
    }
    drop(root);
    mounts::pivot_into(root_path).context("entering the root file system")?;
    if spec.unshare.contains(&Namespace::Ipc) {
        ipcns::mount_own_ipc_files()?;
    }
    if !spec.writable && locked == Locked::No {
        mounts::make_root_read_only()?;
    }
    let workdir = spec.effective_workdir();
    if !Path::new(workdir).is_dir() {
        bail!(
            "cannot enter the working directory {workdir}: No such file or directory in the \
             container; choose another with --container-workdir"
        );
    }
    let entrypoint = match &spec.entrypoint {
        Some(run) => Some(
            entrypoint::run_at_start(run, spec.remap_root)
                .context("running the image ENTRYPOINT")?,
        ),
        None => None,
    };
    let mut mount_table = told.mount_table;
    mount_table.extend(plan.user.iter().map(|m| mountplan::table_line(m, "user")));
    channel.send(&FromHolder::Ready {
        pid: std::process::id() as i32,
        fuse_pids: daemons.iter().map(FuseMount::pid).collect(),
        entrypoint,
        warnings: told.warnings,
        hook_env: told.hook_env,
        mount_table,
    })?;
    expect(channel, ToHolder::Release)?;
    for daemon in daemons {
        daemon.keep();
    }
    Ok(())
}

/// Mounts a tmpfs on `base` (in our private namespace) and creates the
/// overlay's directories on it.
fn prepare_staging(base: &Path) -> anyhow::Result<StagingPaths> {
    mounts::mount_tmpfs(base)?;
    let paths = StagingPaths::under(base);
    for dir in [
        &paths.image,
        &paths.lower,
        &paths.upper,
        &paths.work,
        &paths.root,
    ] {
        std::fs::create_dir(dir)
            .with_context(|| format!("cannot create staging directory {}", dir.display()))?;
    }
    Ok(paths)
}

/// Whether `dir` has no entries (a fresh upper directory).
fn is_empty_dir(dir: &Path) -> anyhow::Result<bool> {
    let mut entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the overlay's upper folder {}", dir.display()))?;
    Ok(entries.next().is_none())
}

/// Gives the overlay's upper directory the owner and mode of the image's root
/// directory: the overlay's `/` shows the upper directory's.
fn copy_root_attributes(lower: &Path, upper: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(lower)
        .with_context(|| format!("cannot stat the image root {}", lower.display()))?;
    std::os::unix::fs::chown(upper, Some(meta.uid()), Some(meta.gid()))
        .with_context(|| format!("cannot chown {}", upper.display()))?;
    std::fs::set_permissions(upper, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
        .with_context(|| format!("cannot chmod {}", upper.display()))
}

fn open_root(path: &Path) -> anyhow::Result<RootDir> {
    RootDir::open(path)
        .with_context(|| format!("cannot open the container root {}", path.display()))
}

/// Where [`apt_stays_root`] writes its setting.
const APT_SANDBOX_FILE: &str = "/etc/apt/apt.conf.d/99berth-remap-root";

/// With `--container-remap-root`, apt cannot switch to its `_apt` user (the
/// namespace maps only the user, as root): in an image with apt, tell it to
/// stay root, as enroot's standard `10-aptfix` hook does for pyxis.
fn apt_stays_root(root: &RootDir) -> anyhow::Result<()> {
    let debian = root
        .read_file(Path::new("/etc/debian_version"), 4096)
        .context("cannot read /etc/debian_version of the image")?
        .is_some();
    if debian && root.resolve(Path::new("/etc/apt")).is_ok() {
        root.write_file(
            Path::new(APT_SANDBOX_FILE),
            b"APT::Sandbox::User \"root\";\n",
            0o644,
        )
        .with_context(|| format!("cannot write {APT_SANDBOX_FILE} in the container"))?;
    }
    Ok(())
}

fn write_etc_file(
    root: &RootDir,
    path: &str,
    user: &UserIdentity,
    build: fn(&str, &UserIdentity) -> String,
) -> anyhow::Result<()> {
    let path = Path::new(path);
    let image = root
        .read_file(path, ETC_FILE_LIMIT)
        .with_context(|| format!("cannot read {} of the image", path.display()))?
        .unwrap_or_default();
    let content = build(&String::from_utf8_lossy(&image), user);
    root.write_file(path, content.as_bytes(), 0o644)
        .with_context(|| format!("cannot write {} in the container", path.display()))
}

/// The node's time zone in the root: `/etc/localtime` made a link to the
/// node's zone file (replacing the image's link or file), and that file
/// written where the image has none.
fn put_host_zone(root: &RootDir, zone: &HostZone) -> anyhow::Result<()> {
    let localtime = Path::new("/etc/localtime");
    root.write_symlink(localtime, &zone.zone_file)
        .context("cannot link /etc/localtime in the container to the node's time zone")?;
    match root.resolve(&zone.zone_file) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => root
            .write_file(&zone.zone_file, &zone.contents, 0o644)
            .with_context(|| {
                format!(
                    "cannot write the node's zone file {} in the container",
                    zone.zone_file.display()
                )
            }),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot look at {} in the container",
                zone.zone_file.display()
            )
        }),
    }
}

/// Where an unprivileged holder mounts its staging tmpfs: `/run/berth` when it
/// exists (in our own namespaces we may mount over it without write access),
/// else `/var/tmp/berth-<uid>`, created private to the user.
fn unprivileged_staging_dir(uid: u32) -> anyhow::Result<PathBuf> {
    let shared = Path::new(STAGING_DIR);
    if shared.is_dir() {
        return Ok(shared.to_path_buf());
    }
    let own = PathBuf::from(format!("/var/tmp/berth-{uid}"));
    match std::fs::create_dir(&own) {
        Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(err)
                .with_context(|| format!("cannot create staging directory {}", own.display()));
        }
        _ => {}
    }
    let meta = std::fs::symlink_metadata(&own)
        .with_context(|| format!("cannot stat staging directory {}", own.display()))?;
    if !meta.is_dir() || meta.uid() != uid {
        bail!(
            "staging directory {} is not a directory owned by uid {uid}: remove it and try again",
            own.display()
        );
    }
    Ok(own)
}

fn expect(channel: &mut Channel, wanted: ToHolder) -> anyhow::Result<()> {
    let got: ToHolder = channel.recv()?;
    if got != wanted {
        bail!("holder protocol error: expected {wanted:?}, got {got:?}");
    }
    Ok(())
}
