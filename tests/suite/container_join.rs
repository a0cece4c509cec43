//! The Slurm path through the library, in-process: `spawn_holder` called from
//! a multi-threaded process whose effective ids were dropped to the user
//! (slurmstepd in `slurm_spank_user_init`), then a task that becomes the user
//! and calls `Container::join` before exec (`slurm_spank_task_init`).
//!
//! One test only: it changes the effective ids of the whole test process.
//! Needs root, a user `berthuser`, busybox and mksquashfs; the helper is the
//! `berth` binary (`berth __holder`), which cargo builds for this test.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use berth::container::{spawn_holder, ContainerSpec, Mode, Namespace, UserIdentity};
use berth::image::ImageConfig;
use nix::unistd::{Gid, Uid};

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var("PATH")
        .ok()?
        .split(':')
        .map(|dir| Path::new(dir).join(tool))
        .find(|path| path.is_file())
}

fn berth_helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_berth"))
}

fn skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    if nix::unistd::User::from_name("berthuser")
        .ok()
        .flatten()
        .is_none()
    {
        return Some("needs a user 'berthuser' (useradd -m berthuser)".into());
    }
    for tool in ["busybox", "mksquashfs"] {
        if which(tool).is_none() {
            return Some(format!("needs '{tool}' on PATH"));
        }
    }
    None
}

fn build_image(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for sub in ["bin", "etc", "opt/app"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy(which("busybox").unwrap(), root.join("bin/busybox")).unwrap();
    for applet in ["sh", "id", "pwd", "cat", "hostname", "readlink"] {
        symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/os-release"), "ID=berthjoin\n").unwrap();
    let image = dir.join("image.sqfs");
    let status = Command::new("mksquashfs")
        .arg(&root)
        .arg(&image)
        .args(["-quiet", "-noappend", "-all-root", "-no-progress"])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();
    image
}

#[test]
fn slurm_like_spawn_and_join() {
    if let Some(reason) = skip_reason() {
        // tests/run.sh provides everything: there a skip is a failure.
        assert!(
            std::env::var_os("BERTH_REQUIRE_CLUSTER").is_none(),
            "cannot run: {reason}"
        );
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    let entry = nix::unistd::User::from_name("berthuser").unwrap().unwrap();
    let user = UserIdentity::lookup(entry.uid.as_raw(), entry.gid.as_raw()).unwrap();
    let mut spec = ContainerSpec::new(
        image,
        ImageConfig {
            env: vec!["PATH=/bin".into(), "IMAGE_VAR=1".into()],
            working_dir: Some("/opt/app".into()),
            ..ImageConfig::default()
        },
        user.clone(),
    );
    spec.hostname = Some("joined".into());
    spec.unshare = vec![Namespace::Net, Namespace::Ipc];

    // Make sure we are multi-threaded, like slurmstepd.
    let _thread = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(5)));

    // slurm_spank_user_init: real uid 0, effective ids of the user.
    let gids: Vec<Gid> = user.all_gids().into_iter().map(Gid::from_raw).collect();
    nix::unistd::setgroups(&gids).unwrap();
    nix::unistd::setegid(Gid::from_raw(user.gid)).unwrap();
    nix::unistd::seteuid(Uid::from_raw(user.uid)).unwrap();
    let container = spawn_holder(&berth_helper(), &spec, Mode::Privileged);
    assert_eq!(nix::unistd::geteuid().as_raw(), user.uid, "euid restored");
    nix::unistd::seteuid(Uid::from_raw(0)).unwrap();
    nix::unistd::setegid(Gid::from_raw(0)).unwrap();
    nix::unistd::setgroups(&[]).unwrap();
    let container = std::sync::Arc::new(container.unwrap());

    // slurm_spank_task_init: the task is the user, joins, Slurm execs.
    let env = container.env([("SLURM_PROCID".to_string(), "0".to_string())]);
    let (uid, gid, groups) = (user.uid, user.gid, gids.clone());
    let mut task = Command::new("/bin/sh");
    task.args([
        "-c",
        "id -u; id -G; pwd; hostname; cat /etc/os-release; echo $SLURM_PROCID $IMAGE_VAR; \
         readlink /proc/self/ns/net; readlink /proc/self/ns/ipc",
    ])
    .env_clear()
    .envs(env);
    let joiner = std::sync::Arc::clone(&container);
    // SAFETY: test code; the child is a fork of this process and only
    // changes its own ids and namespaces before exec.
    unsafe {
        task.pre_exec(move || {
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setresgid(Gid::from_raw(gid), Gid::from_raw(gid), Gid::from_raw(gid))?;
            nix::unistd::setresuid(Uid::from_raw(uid), Uid::from_raw(uid), Uid::from_raw(uid))?;
            joiner
                .join()
                .map_err(|err| std::io::Error::other(format!("{err:#}")))
        });
    }
    let output = task.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!(
        "stdout:\n{stdout}stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success());
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(user.uid.to_string().as_str()));
    let mut inside_groups: Vec<u32> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    inside_groups.sort_unstable();
    let mut expected = user.all_gids();
    expected.sort_unstable();
    assert_eq!(inside_groups, expected, "every group of the user is mapped");
    assert_eq!(lines.next(), Some("/opt/app"));
    assert_eq!(lines.next(), Some("joined"));
    assert_eq!(lines.next(), Some("ID=berthjoin"));
    assert_eq!(lines.next(), Some("0 1"));
    for kind in ["net", "ipc"] {
        let host = std::fs::read_link(format!("/proc/self/ns/{kind}")).unwrap();
        let inside = lines.next().unwrap();
        assert!(inside.starts_with(&format!("{kind}:[")), "{inside}");
        assert_ne!(
            Path::new(inside),
            host,
            "the task joined the container's {kind} namespace"
        );
    }
    drop(task);
    std::sync::Arc::into_inner(container).unwrap().shutdown();
}
