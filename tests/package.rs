//! The Debian package (packaging/deb.sh): its contents, and an upgrade under
//! a running containerized job on the real cluster.
//!
//! The package is installed with dpkg into a private root (`dpkg --root`), and
//! the cluster's plugstack drop-in is pointed at that root's plugin and helper
//! for the duration of the test (restored afterwards, also on failure). The
//! test runs alone in its binary, so no other test sees the switch.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{output_of, Cluster, Submitter};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Builds a package with version `version` into `out`; returns its path.
fn build_package(version: &str, out: &Path) -> PathBuf {
    let output = output_of(
        Command::new(repo().join("packaging/deb.sh"))
            .arg(out)
            .env("BERTH_DEB_VERSION", version),
    );
    assert!(
        output.status.success(),
        "packaging/deb.sh failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// `dpkg --root=ROOT ARGS`; panics with dpkg's output on failure.
fn dpkg(root: &Path, args: &[&str]) -> String {
    let output = output_of(
        Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .arg("--force-depends")
            // The postinst runs on the host with DPKG_ROOT (no shell in the root).
            .arg("--force-script-chrootless")
            .args(args),
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "dpkg {args:?} failed:\n{text}");
    text
}

/// An empty dpkg database under `root`.
fn dpkg_root(root: &Path) {
    for dir in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    // A user database of its own, for the postinst's pull user.
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
}

/// The `berth` lines of the root's user database.
fn pull_user_lines(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("etc/passwd"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("berth:"))
        .map(str::to_string)
        .collect()
}

/// Restores the cluster's drop-in when dropped.
struct DropIn {
    path: PathBuf,
    original: String,
}

impl Drop for DropIn {
    fn drop(&mut self) {
        std::fs::write(&self.path, &self.original).unwrap();
    }
}

fn plugin_in(root: &Path) -> PathBuf {
    let found = Command::new("find")
        .arg(root.join("usr/lib"))
        .args(["-name", "spank_berth.so"])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&found.stdout).trim())
}

#[test]
fn package_installs_and_upgrades_under_a_running_job() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let scratch = tempfile::Builder::new()
        .prefix("berth-package-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        scratch.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // tests/run.sh builds the two packages before the tests (BERTH_TEST_DEBS);
    // by hand, the test builds them.
    let (first, second) = match std::env::var("BERTH_TEST_DEBS") {
        Ok(list) => {
            let (a, b) = list
                .split_once(':')
                .expect("BERTH_TEST_DEBS=FIRST.deb:SECOND.deb");
            (PathBuf::from(a), PathBuf::from(b))
        }
        Err(_) => (
            build_package("0.1.0~test1", &scratch.path().join("v1")),
            build_package("0.1.0~test2", &scratch.path().join("v2")),
        ),
    };

    let root = scratch.path().join("root");
    dpkg_root(&root);
    dpkg(&root, &["-i", first.to_str().unwrap()]);
    let status = dpkg(&root, &["-s", "berth"]);
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert!(
        status.contains("/etc/slurm/plugstack.conf.d/berth.conf"),
        "drop-in is not a conffile:\n{status}"
    );
    let plugin = plugin_in(&root);
    let helper = root.join("usr/bin/berth");
    assert!(
        plugin.is_file() && helper.is_file(),
        "{plugin:?} {helper:?}"
    );
    assert!(root.join("usr/share/doc/berth/USAGE.md").is_file());
    // The postinst made the pull user, a system user without a login shell.
    let users = pull_user_lines(&root);
    assert_eq!(users.len(), 1, "{users:?}");
    assert!(
        users[0].ends_with(":/nonexistent:/usr/sbin/nologin"),
        "{users:?}"
    );
    let shipped =
        std::fs::read_to_string(root.join("etc/slurm/plugstack.conf.d/berth.conf")).unwrap();
    assert!(shipped.contains("helper_path=/usr/bin/berth"), "{shipped}");

    // Point the cluster at the packaged plugin and helper, same arguments.
    let drop_in_path = PathBuf::from(cluster.var("BERTH_TEST_PLUGSTACK_DIR")).join("berth.conf");
    let original = std::fs::read_to_string(&drop_in_path).unwrap();
    let line = original
        .lines()
        .find(|l| l.contains("spank_berth.so"))
        .expect("cluster drop-in has a berth line");
    let words: Vec<String> = line
        .split_whitespace()
        .enumerate()
        .map(|(i, w)| match i {
            1 => plugin.display().to_string(),
            _ if w.starts_with("helper_path=") => format!("helper_path={}", helper.display()),
            _ => w.to_string(),
        })
        .collect();
    let _restore = DropIn {
        path: drop_in_path.clone(),
        original: original.clone(),
    };
    std::fs::write(&drop_in_path, words.join(" ") + "\n").unwrap();

    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    // The tasks say they run through a folder bound from the host.
    let marks = scratch.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let mounts = format!("--container-mounts={}:/marks", marks.display());
    let job_name = format!("berth-upgrade-{}", std::process::id());
    let running = {
        std::thread::spawn({
            let image = image.clone();
            let job_name = job_name.clone();
            let mounts = mounts.clone();
            move || {
                let cluster = Cluster::get().unwrap();
                cluster.srun(
                    Submitter::User,
                    &[
                        "-N2",
                        "-J",
                        &job_name,
                        &image,
                        &mounts,
                        "sh",
                        "-c",
                        "touch /marks/started-$SLURM_PROCID; sleep 6; \
                         grep ^ID= /etc/os-release; echo survived",
                    ],
                )
            }
        })
    };
    // Wait until the tasks run inside their containers, then upgrade.
    let started = common::wait_for(Duration::from_secs(60), || {
        std::fs::read_dir(&marks).unwrap().count() == 2
    });
    if !started {
        let run = running.join().unwrap();
        panic!(
            "the job did not start (exit {})\n--- stdout\n{}\n--- stderr\n{}",
            run.code, run.stdout, run.stderr
        );
    }
    let before = std::fs::metadata(&plugin).unwrap().ino();
    dpkg(&root, &["-i", second.to_str().unwrap()]);
    let after = std::fs::metadata(&plugin).unwrap().ino();
    assert_ne!(before, after, "dpkg replaced the plugin in place");
    assert_eq!(
        pull_user_lines(&root).len(),
        1,
        "the upgrade made a second pull user"
    );
    let upgraded = dpkg(&root, &["-s", "berth"]);
    let version = output_of(
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(&second)
            .arg("Version"),
    );
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    assert!(
        upgraded.contains(&format!("Version: {version}")),
        "not upgraded to {version}:\n{upgraded}"
    );

    let run = running.join().unwrap().ok();
    assert_eq!(run.stdout.matches("survived").count(), 2, "{}", run.stdout);
    assert_eq!(run.stdout.matches("ID=berth-busybox").count(), 2);
    // New steps load the new files.
    let again = cluster
        .srun(Submitter::User, &["-N2", &image, "echo", "new"])
        .ok();
    assert_eq!(again.stdout.matches("new").count(), 2, "{}", again.stdout);
    cluster.assert_nodes_healthy();
    for entry in std::fs::read_dir("/tmp").unwrap().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("berth-upgrade-started-")
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
