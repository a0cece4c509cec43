//! End-to-end tests of the container runtime: build a small busybox image,
//! run commands in it through `examples/container_run.rs` (which uses
//! `berth __holder` as the helper, as the plugin does), and check what the user sees inside
//! and that nothing is left on the host afterwards.
//!
//! They need root, an ordinary user `berthuser`, busybox (static),
//! `mksquashfs`, `findmnt`, `losetup`, and for the unprivileged test
//! `squashfuse` and `fuse-overlayfs`; each test says why when it skips.

use crate::common;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use berth::container::UserIdentity;

const TEST_USER: &str = "berthuser";

/// Why the test cannot run here, if it cannot.
fn missing_prerequisite(tools: &[&str]) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    if nix::unistd::User::from_name(TEST_USER)
        .ok()
        .flatten()
        .is_none()
    {
        return Some(format!(
            "needs a user '{TEST_USER}' (useradd -m {TEST_USER})"
        ));
    }
    for tool in ["busybox", "mksquashfs", "findmnt", "losetup"]
        .iter()
        .chain(tools)
    {
        if which(tool).is_none() {
            return Some(format!("needs '{tool}' on PATH"));
        }
    }
    if !example("container_run").exists() {
        return Some("needs the examples built (cargo build --examples)".into());
    }
    None
}

macro_rules! skip_unless_ready {
    ($($tool:expr),*) => {
        if let Some(reason) = missing_prerequisite(&[$($tool),*]) {
            // tests/run.sh provides everything: there a skip is a failure.
            assert!(std::env::var_os("BERTH_REQUIRE_CLUSTER").is_none(), "cannot run: {reason}");
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(tool))
        .find(|path| path.is_file())
}

/// `target/<profile>/examples/<name>`, next to this test's `deps` directory.
fn built_example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

/// The example, copied with the `berth` binary (its helper) beside it to a
/// folder the ordinary test user can read (the checkout may be private); the
/// built path when not built.
fn example(name: &str) -> PathBuf {
    let built = built_example(name);
    if !built.exists() {
        return built;
    }
    common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    common::world_readable_copy(&built)
}

fn test_user() -> UserIdentity {
    let entry = nix::unistd::User::from_name(TEST_USER).unwrap().unwrap();
    UserIdentity::lookup(entry.uid.as_raw(), entry.gid.as_raw()).unwrap()
}

/// A world-readable scratch directory (the unprivileged test runs as the user).
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A busybox root file system in `dir/rootfs`; returns its path.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for sub in ["bin", "etc", "proc", "sys", "dev", "tmp", "srv/work"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy(which("busybox").unwrap(), root.join("bin/busybox")).unwrap();
    let applets = [
        "sh", "id", "whoami", "cat", "ls", "pwd", "echo", "touch", "hostname", "env", "sleep",
        "grep", "readlink", "stat", "test", "rm", "chown", "ip",
    ];
    for applet in applets {
        symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(
        root.join("etc/os-release"),
        "NAME=\"berth test image\"\nID=berthtest\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    root
}

fn make_squashfs(rootfs: &Path, out: &Path) {
    let status = Command::new("mksquashfs")
        .arg(rootfs)
        .arg(out)
        .args(["-quiet", "-noappend", "-all-root", "-no-progress"])
        .status()
        .unwrap();
    assert!(status.success(), "mksquashfs failed");
    std::fs::set_permissions(out, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// A data directory with one file, to bind into the container.
fn data_dir(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("file"), "hello from the host\n").unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    data
}

fn image_config(dir: &Path) -> PathBuf {
    let path = dir.join("config.json");
    let config = serde_json::json!({
        "env": ["PATH=/bin", "FROM_IMAGE=yes"],
        "working_dir": "/srv/work",
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn run(command: &mut Command) -> Output {
    let output = common::output_of(command);
    eprintln!(
        "--- {command:?}\n--- stdout:\n{}--- stderr:\n{}--- {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        output.status
    );
    output
}

/// The shell script run inside, printing what the checks look at.
const PROBE: &str =
    "id; whoami; cat /etc/os-release; echo PWD=$(pwd); echo FROM_IMAGE=$FROM_IMAGE; \
                     echo PATH=$PATH; cat /data/file; touch /data/new 2>/dev/null; echo TOUCH=$?";

fn check_probe(stdout: &str, user: &UserIdentity, all_groups: bool) {
    let id_prefix = format!("uid={}({}) gid={}(", user.uid, user.name, user.gid);
    assert!(
        stdout.contains(&id_prefix),
        "id output lacks {id_prefix}:\n{stdout}"
    );
    let id_line = stdout.lines().next().unwrap();
    if all_groups {
        for gid in user.all_gids() {
            let name = &user.group_names[&gid];
            assert!(
                id_line.contains(&format!("{gid}({name})")),
                "group {gid} missing: {id_line}"
            );
        }
    }
    assert!(stdout.lines().any(|l| l == user.name), "whoami: {stdout}");
    assert!(
        stdout.contains("ID=berthtest"),
        "os-release of the image: {stdout}"
    );
    assert!(
        stdout.contains("PWD=/srv/work"),
        "image WorkingDir: {stdout}"
    );
    assert!(stdout.contains("FROM_IMAGE=yes"), "image Env: {stdout}");
    assert!(stdout.contains("PATH=/bin\n"), "image PATH wins: {stdout}");
    assert!(
        stdout.contains("hello from the host"),
        "bind mount: {stdout}"
    );
    assert!(
        stdout.contains("TOUCH=1"),
        "the ro bind must refuse writes: {stdout}"
    );
}

/// Host mounts under the holder's staging directory (there must be none).
fn staging_mounts() -> Vec<String> {
    let output = Command::new("findmnt")
        .args(["-rn", "-o", "TARGET"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|target| target.starts_with("/run/berth") || target.contains("berth-test-"))
        .map(str::to_string)
        .collect()
}

/// Loop devices backed by `image` (there must be none once the container is gone).
fn loop_devices_of(image: &Path) -> Vec<String> {
    let output = Command::new("losetup").arg("-a").output().unwrap();
    let name = image.to_string_lossy().into_owned();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(&name))
        .map(str::to_string)
        .collect()
}

/// Polls `condition` for a few seconds (autoclear and reaping are asynchronous).
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push(format!(
                    "{}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    found
}

#[test]
fn privileged_container_runs_as_the_user_and_leaves_nothing_behind() {
    skip_unless_ready!();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let data = data_dir(dir.path());
    let config = image_config(dir.path());
    let output = run(Command::new(example("container_run"))
        .args(["--privileged", "--user", TEST_USER, "--config"])
        .arg(&config)
        .arg("--mounts")
        .arg(format!("{}:/data:ro", data.display()))
        .arg(&image)
        .args(["--", "sh", "-c", PROBE]));
    assert!(output.status.success());
    check_probe(&String::from_utf8_lossy(&output.stdout), &test_user(), true);
    assert!(!data.join("new").exists());
    assert_eq!(staging_mounts(), Vec::<String>::new());
    eventually("the loop device to clear itself", || {
        loop_devices_of(&image).is_empty()
    });
}

#[test]
fn unprivileged_container_runs_as_its_caller() {
    skip_unless_ready!("squashfuse", "fuse-overlayfs", "runuser");
    let fuse = std::fs::metadata("/dev/fuse").map(|m| m.permissions().mode() & 0o777);
    if fuse.map_or(true, |mode| mode != 0o666) {
        eprintln!("note: making /dev/fuse mode 0666 so that users may mount FUSE file systems");
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let data = data_dir(dir.path());
    let config = image_config(dir.path());
    let output = run(Command::new("runuser")
        .args(["-u", TEST_USER, "--"])
        .arg(example("container_run"))
        .args(["--unprivileged", "--hostname", "inside", "--config"])
        .arg(&config)
        .arg("--mounts")
        .arg(format!("{}:/data:ro", data.display()))
        .arg("image.sqfs") // relative: helpers must still find it
        .current_dir(dir.path())
        .args([
            "--",
            "sh",
            "-c",
            &format!("{PROBE}; hostname; echo w > /written && cat /written"),
        ]));
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Only the user's own uid and gid are mapped: other groups show as nobody.
    check_probe(&stdout, &test_user(), false);
    assert!(stdout.contains("\ninside\n"), "hostname: {stdout}");
    assert!(stdout.ends_with("w\n"), "the root is writable: {stdout}");
    eventually("the FUSE daemons to exit", || {
        processes_mentioning(&image.to_string_lossy()).is_empty()
    });
    assert_eq!(staging_mounts(), Vec::<String>::new());
}

#[test]
fn hostile_image_symlinks_do_not_write_on_the_host() {
    skip_unless_ready!();
    let dir = scratch();
    let tag = dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let escape = |what: &str| PathBuf::from(format!("/tmp/{tag}-{what}-escape"));

    // Image 1: /etc itself points at a host path.
    let rootfs = busybox_rootfs(dir.path());
    std::fs::remove_dir_all(rootfs.join("etc")).unwrap();
    symlink(escape("etc"), rootfs.join("etc")).unwrap();
    let image1 = dir.path().join("etc-link.sqfs");
    make_squashfs(&rootfs, &image1);

    // Image 2: the files we write or mount on point out of the image.
    std::fs::remove_file(rootfs.join("etc")).unwrap();
    std::fs::create_dir(rootfs.join("etc")).unwrap();
    symlink(escape("passwd"), rootfs.join("etc/passwd")).unwrap();
    symlink(
        format!("../../../../../..{}", escape("group").display()),
        rootfs.join("etc/group"),
    )
    .unwrap();
    symlink(escape("hosts"), rootfs.join("etc/hosts")).unwrap();
    symlink("/", rootfs.join("tmp-root")).unwrap();
    let image2 = dir.path().join("file-links.sqfs");
    make_squashfs(&rootfs, &image2);

    // In image 2 the mount target goes through an in-image absolute symlink.
    for (image, target) in [(&image1, "/data"), (&image2, "/tmp-root/data")] {
        let output = run(Command::new(example("container_run"))
            .args(["--privileged", "--user", TEST_USER])
            .arg("--mounts")
            .arg(format!(
                "{}:{target}",
                data_dir_for(dir.path(), image).display()
            ))
            .arg(image)
            .args(["--", "sh", "-c", "cat /etc/passwd; ls /data"]));
        assert!(output.status.success());
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains(&format!("{TEST_USER}:x:")), "{stdout}");
        assert!(
            stdout.contains("file"),
            "bind through an in-image symlink: {stdout}"
        );
        for what in ["etc", "passwd", "group", "hosts"] {
            assert!(
                !escape(what).exists(),
                "{} was created on the host",
                escape(what).display()
            );
        }
    }
}

/// Root's own binds (`/etc/hosts`, `/etc/resolv.conf`) never reach their
/// target through a host folder bound in before: an image whose `/etc` is
/// `/tmp/X`, with a user's link `/tmp/X -> /tmp/FOLDER` (or `/dev`) on the
/// host, must not make root create files in that host folder (it made
/// `/dev/hosts`), for the user's container and for root's.
#[test]
fn root_binds_never_go_through_a_users_link_in_tmp() {
    skip_unless_ready!();
    let dir = scratch();
    let tag = dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let redirect = PathBuf::from(format!("/tmp/{tag}-redirect"));
    let rootfs = busybox_rootfs(dir.path());
    std::fs::remove_dir_all(rootfs.join("etc")).unwrap();
    symlink(&redirect, rootfs.join("etc")).unwrap();
    // The link resolves in the image (a dangling one would be replaced).
    std::fs::create_dir_all(rootfs.join(redirect.strip_prefix("/").unwrap())).unwrap();
    let image = dir.path().join("etc-to-tmp.sqfs");
    make_squashfs(&rootfs, &image);
    // The link must lead to a host folder that is bound into the container
    // too (inside the root, `/tmp` and `/dev` are the host's).
    let victim = PathBuf::from(format!("/tmp/{tag}-victim"));
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
    symlink(&victim, &redirect).unwrap();
    let uid = nix::unistd::User::from_name(TEST_USER)
        .unwrap()
        .expect("the test user")
        .uid;
    nix::unistd::fchownat(
        None,
        &redirect,
        Some(uid),
        None,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let mut outputs = Vec::new();
    for user in [TEST_USER, "root"] {
        let output = run(Command::new(example("container_run"))
            .args(["--privileged", "--user", user])
            .arg(&image)
            .args(["--", "true"]));
        outputs.push(format!(
            "{user}: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let _ = std::fs::remove_file(&redirect);
    let created: Vec<_> = std::fs::read_dir(&victim)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let _ = std::fs::remove_dir_all(&victim);
    assert!(
        created.is_empty(),
        "root created {created:?} in {} through the link:\n{}",
        victim.display(),
        outputs.join("\n")
    );
}

fn data_dir_for(dir: &Path, image: &Path) -> PathBuf {
    let data = dir.join(format!(
        "data-{}",
        image.file_stem().unwrap().to_string_lossy()
    ));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("file"), "x").unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    data
}

#[test]
fn errors_name_the_failing_path() {
    skip_unless_ready!();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);

    let output = run(Command::new(example("container_run"))
        .args([
            "--privileged",
            "--user",
            TEST_USER,
            "--mounts",
            "/nonexistent-berth-src:/x",
        ])
        .arg(&image)
        .args(["--", "true"]));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent-berth-src"), "{stderr}");

    let output = run(Command::new(example("container_run"))
        .args([
            "--privileged",
            "--user",
            TEST_USER,
            "--workdir",
            "/no/such/dir",
        ])
        .arg(&image)
        .args(["--", "true"]));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/no/such/dir"), "{stderr}");

    let output = run(Command::new(example("container_run"))
        .args(["--privileged", "--user", TEST_USER])
        .arg(&image)
        .args(["--", "no-such-command"]));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("'no-such-command' not found"), "{stderr}");

    let output = run(Command::new(example("container_run"))
        .args(["--privileged", "--user", TEST_USER])
        .arg(dir.path().join("missing.sqfs"))
        .args(["--", "true"]));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("missing.sqfs"), "{stderr}");

    assert_eq!(staging_mounts(), Vec::<String>::new());
    eventually("no loop device left", || loop_devices_of(&image).is_empty());
}

#[test]
fn exit_status_and_sigterm_reach_the_caller() {
    skip_unless_ready!();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);

    let output = run(Command::new(example("container_run"))
        .args(["--user", TEST_USER])
        .arg(&image)
        .args(["--", "sh", "-c", "exit 3"]));
    assert_eq!(output.status.code(), Some(3));

    let script = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done";
    let mut child = Command::new(example("container_run"))
        .args(["--user", TEST_USER])
        .arg(&image)
        .args(["--", "sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "got-term\n");
    assert_eq!(
        status.code(),
        Some(7),
        "the command's status, after the forwarded SIGTERM"
    );
    eventually("no loop device left", || loop_devices_of(&image).is_empty());
}

/// Runs `script` in a container of `image` as the test user: privileged (the
/// test is root) or unprivileged (through runuser), with `options` for
/// `container_run`. Returns the output and its stdout.
fn run_in(image: &Path, privileged: bool, options: &[&str], script: &str) -> (Output, String) {
    let mut command = if privileged {
        let mut command = Command::new(example("container_run"));
        command.args(["--privileged", "--user", TEST_USER]);
        command
    } else {
        let mut command = Command::new("runuser");
        command
            .args(["-u", TEST_USER, "--"])
            .arg(example("container_run"))
            .arg("--unprivileged");
        command
    };
    let output = run(command
        .args(options)
        .arg(image)
        .args(["--", "sh", "-c", script]));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output, stdout)
}

/// Gives users FUSE (the unprivileged mode mounts the image with it).
fn allow_user_fuse() {
    let fuse = std::fs::metadata("/dev/fuse").map(|m| m.permissions().mode() & 0o777);
    if fuse.map_or(true, |mode| mode != 0o666) {
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666)).unwrap();
    }
}

/// The `/proc/self/mountinfo` line of the mount at `target`, as the script
/// prints it with `grep`.
fn mountinfo_line<'a>(stdout: &'a str, target: &str) -> &'a str {
    let needle = format!(" {target} ");
    stdout
        .lines()
        .find(|line| line.contains(&needle) && line.contains(" - "))
        .unwrap_or_else(|| panic!("no mount at {target} in:\n{stdout}"))
}

/// The mount script shared by the privileged and unprivileged mount tests.
const MOUNTS_PROBE: &str = "cat /single/file.txt; echo x > /mnt/null && echo NULL=ok; \
     touch /scratch/t && echo SCRATCH=ok; /data/busybox true; echo EXEC=$?; \
     test -e /etc/hosts || echo NO_HOSTS; test -d /new/deep/dir && echo DEEP=ok; \
     test -d /nest/in/side && echo NESTED=ok; \
     grep -E ' /(data|scratch|shared|gone) ' /proc/self/mountinfo || true; echo END";

fn check_mounts_probe(stdout: &str) {
    assert!(
        stdout.contains("hello from the host"),
        "file bind: {stdout}"
    );
    assert!(stdout.contains("NULL=ok"), "char device bind: {stdout}");
    assert!(stdout.contains("SCRATCH=ok"), "tmpfs: {stdout}");
    assert!(!stdout.contains("EXEC=0"), "noexec: {stdout}");
    assert!(
        stdout.contains("NO_HOSTS"),
        "umount of /etc/hosts: {stdout}"
    );
    assert!(stdout.contains("DEEP=ok"), "missing DST created: {stdout}");
    assert!(
        stdout.contains("NESTED=ok"),
        "DST created in a tmpfs: {stdout}"
    );
    let data = mountinfo_line(stdout, "/data");
    for option in ["ro", "nosuid", "nodev", "noexec"] {
        assert!(
            data.split(' ')
                .nth(5)
                .unwrap()
                .split(',')
                .any(|o| o == option),
            "/data lacks {option}: {data}"
        );
    }
    assert!(!data.contains("shared:"), "/data is private: {data}");
    let scratch = mountinfo_line(stdout, "/scratch");
    assert!(scratch.contains(" tmpfs "), "{scratch}");
    assert!(scratch.contains("size=1024k"), "{scratch}");
    assert!(scratch.contains("mode=770"), "{scratch}");
    assert!(
        mountinfo_line(stdout, "/shared").contains("shared:"),
        "/shared is shared: {stdout}"
    );
    assert!(!stdout.contains(" /gone "), "/gone unmounted: {stdout}");
    assert!(stdout.ends_with("END\n"), "{stdout}");
}

fn mounts_option(dir: &Path, data: &Path) -> String {
    std::fs::copy(which("busybox").unwrap(), data.join("busybox")).unwrap();
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    [
        format!("{}:/data:ro+nosuid+nodev+noexec+rprivate", data.display()),
        format!("{}/file:/single/file.txt:ro", data.display()),
        "/dev/null:/mnt/null".to_string(),
        "tmpfs:/scratch:size=1M+mode=0770".to_string(),
        "umount:/etc/hosts".to_string(),
        format!("{}:/new/deep/dir", shared.display()),
        format!("{}:/shared:rshared", shared.display()),
        "tmpfs:/gone,umount:/gone".to_string(),
        format!("tmpfs:/nest,{}:/nest/in/side", shared.display()),
    ]
    .join(",")
}

#[test]
fn mounts_with_flags_tmpfs_devices_and_umount() {
    skip_unless_ready!();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let data = data_dir(dir.path());
    let mounts = mounts_option(dir.path(), &data);
    let (output, stdout) = run_in(&image, true, &["--mounts", &mounts], MOUNTS_PROBE);
    assert!(output.status.success());
    check_mounts_probe(&stdout);
    assert_eq!(staging_mounts(), Vec::<String>::new());
}

#[test]
fn unprivileged_mounts_with_flags_tmpfs_devices_and_umount() {
    skip_unless_ready!("squashfuse", "fuse-overlayfs", "runuser");
    allow_user_fuse();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let data = data_dir(dir.path());
    let mounts = mounts_option(dir.path(), &data);
    let (output, stdout) = run_in(&image, false, &["--mounts", &mounts], MOUNTS_PROBE);
    assert!(output.status.success());
    check_mounts_probe(&stdout);
}

#[test]
fn mount_errors_name_the_entry_and_the_kernel_checks_the_user() {
    skip_unless_ready!();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);

    let (output, _) = run_in(&image, true, &["--mounts", "/tmp:/x:ro+bogus"], "true");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("'/tmp:/x:ro+bogus'"), "{stderr}");
    assert!(stderr.contains("unknown flag 'bogus'"), "{stderr}");

    // Root may read it, the user may not: the bind must fail.
    let secret = dir.path().join("secret");
    std::fs::create_dir_all(secret.join("inner")).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let source = secret.join("inner");
    let (output, _) = run_in(
        &image,
        true,
        &["--mounts", &format!("{}:/x", source.display())],
        "true",
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&source.display().to_string()), "{stderr}");

    let (output, _) = run_in(&image, true, &["--mounts", "umount:/opt"], "true");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("umount:/opt"), "{stderr}");
    assert_eq!(staging_mounts(), Vec::<String>::new());
}

/// Writes to `/` and to a bound `/tmp`, printing the shell's status and error.
const WRITE_PROBE: &str =
    "touch /srv/work/written 2>&1; echo ROOT=$?; touch /tmp/berth-probe-$$ && \
     echo TMP=0 && rm /tmp/berth-probe-$$";

#[test]
fn readonly_root_refuses_writes_and_writable_root_takes_them() {
    skip_unless_ready!("squashfuse", "fuse-overlayfs", "runuser");
    allow_user_fuse();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    let rootfs = busybox_rootfs(dir.path());
    // Writable for the user, so that only the mount can refuse.
    std::fs::set_permissions(
        rootfs.join("srv/work"),
        std::fs::Permissions::from_mode(0o1777),
    )
    .unwrap();
    make_squashfs(&rootfs, &image);
    for privileged in [true, false] {
        let (output, stdout) = run_in(&image, privileged, &["--readonly"], WRITE_PROBE);
        assert!(output.status.success());
        assert!(stdout.contains("Read-only file system"), "EROFS: {stdout}");
        assert!(stdout.contains("ROOT=1"), "{stdout}");
        assert!(stdout.contains("TMP=0"), "binds stay writable: {stdout}");

        let (output, stdout) = run_in(&image, privileged, &[], WRITE_PROBE);
        assert!(output.status.success());
        assert!(stdout.contains("ROOT=0"), "writable by default: {stdout}");
    }
}

#[test]
fn mount_home_binds_the_users_home_at_its_path() {
    skip_unless_ready!("squashfuse", "fuse-overlayfs", "runuser");
    allow_user_fuse();
    let user = test_user();
    let home = Path::new(&user.home);
    if !home.is_dir() {
        std::fs::create_dir_all(home).unwrap();
        std::os::unix::fs::chown(home, Some(user.uid), Some(user.gid)).unwrap();
    }
    let marker = home.join(".berth-test-home-marker");
    std::fs::write(&marker, "home sweet home\n").unwrap();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let script = format!(
        "cat {}; touch {}/.berth-written && echo W=0",
        marker.display(),
        home.display()
    );
    for privileged in [true, false] {
        let (output, stdout) = run_in(&image, privileged, &["--mount-home"], &script);
        assert!(output.status.success());
        assert!(stdout.contains("home sweet home"), "{stdout}");
        assert!(stdout.contains("W=0"), "home is writable: {stdout}");
        assert!(home.join(".berth-written").exists());
        std::fs::remove_file(home.join(".berth-written")).unwrap();

        let (_, stdout) = run_in(
            &image,
            privileged,
            &[],
            &format!("test -e {} || echo ABSENT", marker.display()),
        );
        assert!(
            stdout.contains("ABSENT"),
            "no home without the option: {stdout}"
        );
    }
    std::fs::remove_file(&marker).unwrap();
}

/// The host's namespace link of `kind` (`net:[4026531840]`).
fn host_namespace(kind: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{kind}"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn unshared_namespaces_are_new_and_hostname_stays() {
    skip_unless_ready!("squashfuse", "fuse-overlayfs", "runuser");
    allow_user_fuse();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let host_name = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let script = "cat /proc/net/dev; ip -o link show lo; readlink /proc/self/ns/net; readlink /proc/self/ns/ipc; \
         readlink /proc/self/ns/uts; hostname";
    for privileged in [true, false] {
        let (output, stdout) = run_in(&image, privileged, &["--unshare", "net,ipc,uts"], script);
        assert!(output.status.success());
        let interfaces: Vec<&str> = stdout
            .lines()
            .filter_map(|line| line.split_once(':'))
            .filter(|(name, rest)| {
                !name.contains('|') && !rest.starts_with('[') && !rest.contains('<')
            })
            .map(|(name, _)| name.trim())
            .collect();
        assert_eq!(
            interfaces,
            vec!["lo"],
            "only lo with net unshared: {stdout}"
        );
        assert!(stdout.contains("<LOOPBACK,UP"), "lo is up: {stdout}");
        for kind in ["net", "ipc", "uts"] {
            let host = host_namespace(kind);
            let inside = stdout
                .lines()
                .find(|line| line.starts_with(&format!("{kind}:[")))
                .unwrap_or_else(|| panic!("no {kind} namespace in {stdout}"));
            assert_ne!(inside, host, "{kind} namespace is new");
        }
        assert!(
            stdout.ends_with(&format!("{host_name}\n")),
            "hostname stays: {stdout}"
        );

        let (_, stdout) = run_in(&image, privileged, &[], "readlink /proc/self/ns/ipc");
        assert_eq!(stdout.trim(), host_namespace("ipc"), "host ipc by default");
    }
}

#[test]
fn remap_root_shows_root_inside_and_the_user_outside() {
    skip_unless_ready!("squashfuse", "fuse-overlayfs", "runuser");
    allow_user_fuse();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let data = data_dir(dir.path());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let user = test_user();
    std::os::unix::fs::chown(&out, Some(user.uid), Some(user.gid)).unwrap();
    let mounts = format!("{}:/out", out.display());
    // chown to ids the namespace does not map: only the seccomp filter of
    // remap-root makes it "succeed" (without effect).
    let script = "id; whoami; grep ^root: /etc/passwd; touch /out/made; \
         chown 4242:4242 /out/made && echo CHOWN=0; echo END";
    for privileged in [true, false] {
        let (output, stdout) = run_in(
            &image,
            privileged,
            &["--remap-root", "--mounts", &mounts],
            script,
        );
        assert!(output.status.success());
        assert!(stdout.starts_with("uid=0(root) gid=0(root)"), "{stdout}");
        assert!(stdout.contains("\nroot\n"), "whoami: {stdout}");
        assert!(stdout.contains("root:x:0:0:"), "/etc/passwd: {stdout}");
        assert!(stdout.ends_with("CHOWN=0\nEND\n"), "{stdout}");
        let made = std::fs::metadata(out.join("made")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (made.uid(), made.gid()),
            (user.uid, user.gid),
            "the user's on the host"
        );
        std::fs::remove_file(out.join("made")).unwrap();

        let (_, stdout) = run_in(&image, privileged, &[], "chown 4242 /tmp || echo REFUSED");
        assert!(
            stdout.contains("REFUSED"),
            "no filter without remap-root: {stdout}"
        );
    }
    drop(data);
}

#[test]
fn entrypoint_runs_before_the_command_or_the_image_cmd() {
    skip_unless_ready!();
    let dir = scratch();
    let image = dir.path().join("image.sqfs");
    make_squashfs(&busybox_rootfs(dir.path()), &image);
    let config = dir.path().join("config.json");
    let json = serde_json::json!({
        "env": ["PATH=/bin"],
        "entrypoint": ["/bin/echo", "from-entrypoint"],
        "cmd": ["from-cmd"],
    });
    std::fs::write(&config, json.to_string()).unwrap();
    let run_with = |command: &[&str]| {
        let output = run(Command::new(example("container_run"))
            .args([
                "--privileged",
                "--user",
                TEST_USER,
                "--entrypoint",
                "--config",
            ])
            .arg(&config)
            .arg(&image)
            .arg("--")
            .args(command));
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert_eq!(run_with(&["given"]), "from-entrypoint given\n");
    assert_eq!(run_with(&[]), "from-entrypoint from-cmd\n");
}
