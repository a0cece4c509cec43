//! The Debian package (packaging/deb.sh): its contents, and an upgrade under
//! a running containerized job on the real cluster.
//!
//! The package is installed with dpkg into a private root (`dpkg --root`), and
//! the cluster's plugstack drop-in is pointed at that root's plugin and helper
//! for the duration of the test (restored afterwards, also on failure). The
//! test runs alone in its binary, so no other test sees the switch.
//!
//! It runs on every release of CI: on 22.05 here and, in the core suite of
//! each release root (tests/release.sh builds that release's packages), on
//! 24.11 and 26.05, where it checks that the package depends on the Slurm
//! release the cluster runs and installs the plugin where that release's
//! Debian plugins lie.

use crate::common;

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

/// `major.minor` of the Slurm the cluster runs (`slurmd -V`: `slurm 24.11.5`).
fn running_slurm_release() -> (u32, u32) {
    let output = output_of(Command::new("slurmd").arg("-V"));
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.split_whitespace().nth(1).unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => panic!("cannot read the release from `slurmd -V`: {text:?}"),
    }
}

/// The folder of Debian's Slurm plugins on this system: where
/// slurm-wlm-basic-plugins put its `.so` files.
fn debian_plugin_dir() -> PathBuf {
    let output = output_of(Command::new("dpkg-query").args(["-L", "slurm-wlm-basic-plugins"]));
    let list = String::from_utf8_lossy(&output.stdout);
    let so = list
        .lines()
        .find(|l| l.ends_with(".so"))
        .unwrap_or_else(|| panic!("slurm-wlm-basic-plugins lists no plugin:\n{list}"));
    Path::new(so).parent().unwrap().to_path_buf()
}

/// The package's Depends line names the Slurm release the cluster runs.
fn assert_depends_on_the_running_release(deb: &Path) {
    let (major, minor) = running_slurm_release();
    let output = output_of(Command::new("dpkg-deb").arg("-f").arg(deb).arg("Depends"));
    assert!(
        output.status.success(),
        "dpkg-deb -f {} failed:\n{}",
        deb.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let depends = String::from_utf8_lossy(&output.stdout);
    let want = format!(
        "slurm-wlm-basic-plugins (>= {major}.{minor:02}), slurm-wlm-basic-plugins (<< {major}.{:02})",
        minor + 1
    );
    assert!(
        depends.contains(&want),
        "{} does not depend on the Slurm it runs on ({major}.{minor:02}): Depends: {depends}\n\
         (build it with SLURM_INCLUDE_DIR naming that release's headers)",
        deb.display()
    );
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

    assert_depends_on_the_running_release(&first);
    assert_depends_on_the_running_release(&second);

    let root = scratch.path().join("root");
    dpkg_root(&root);
    // A system with AppArmor 4, which parses the CLI's profile.
    let apparmor = root.join("etc/apparmor.d");
    std::fs::create_dir_all(apparmor.join("abi")).unwrap();
    std::fs::write(apparmor.join("abi/4.0"), "").unwrap();
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
    let plugin_dir = debian_plugin_dir();
    assert_eq!(
        plugin.parent(),
        Some(root.join(plugin_dir.strip_prefix("/").unwrap()).as_path()),
        "the plugin is not in the folder of this release's Slurm plugins ({})",
        plugin_dir.display()
    );
    assert!(root.join("usr/share/doc/berth/USAGE.md").is_file());
    // The ready InfiniBand profile, for the site to copy to inject_dir.
    assert!(root
        .join("usr/share/berth/inject.d/infiniband.conf")
        .is_file());
    // The postinst made the pull user, a system user without a login shell.
    let users = pull_user_lines(&root);
    assert_eq!(users.len(), 1, "{users:?}");
    assert!(
        users[0].ends_with(":/nonexistent:/usr/sbin/nologin"),
        "{users:?}"
    );
    // The postinst put the CLI's AppArmor profile in place; it allows user
    // namespaces to the binary the package installs.
    let profile = std::fs::read_to_string(apparmor.join("berth"))
        .expect("postinst did not put /etc/apparmor.d/berth in place");
    assert!(
        profile.contains("profile berth /usr/bin/berth ") && profile.contains("  userns,"),
        "{profile}"
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
    let restore = DropIn {
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
    // Removed, the package takes its AppArmor profile along. First the
    // cluster goes back to its own plugin and every node finishes the last
    // job's epilog, which loads the plugin the drop-in names: removing the
    // packaged one under a running epilog fails it and drains the node.
    drop(restore);
    let settled = common::wait_for(Duration::from_secs(60), || {
        cluster
            .node_states()
            .iter()
            .all(|(_, state)| state == "idle")
    });
    assert!(settled, "nodes not idle: {:?}", cluster.node_states());
    dpkg(&root, &["-r", "berth"]);
    assert!(
        !apparmor.join("berth").exists(),
        "postrm left /etc/apparmor.d/berth"
    );
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

/// `(major, minor)` of the Slurm headers in `include` (slurm/slurm_version.h).
fn header_release(include: &Path) -> (u32, u32) {
    let header = include.join("slurm/slurm_version.h");
    let text = std::fs::read_to_string(&header)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", header.display()));
    let number = text
        .lines()
        .find_map(|l| l.strip_prefix("#define SLURM_VERSION_NUMBER 0x"))
        .and_then(|hex| u32::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no SLURM_VERSION_NUMBER in {}", header.display()));
    (number >> 16 & 0xff, number >> 8 & 0xff)
}

/// `rpm -qp ARGS RPM`; panics with rpm's output on failure.
fn rpm_query(rpm: &Path, args: &[&str]) -> String {
    let output = output_of(Command::new("rpm").arg("-qp").args(args).arg(rpm));
    assert!(
        output.status.success(),
        "rpm -qp {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn rpm_requires_the_slurm_release_it_was_built_for() {
    if output_of(Command::new("sh").args(["-c", "command -v rpmbuild"]))
        .status
        .code()
        != Some(0)
    {
        eprintln!(
            "skipped: no rpmbuild here (apt-get install rpm; tests/harness/install-deps.sh \
             installs it on the test machine)"
        );
        return;
    }
    let include = PathBuf::from(
        std::env::var("SLURM_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".to_string()),
    );
    let scratch = tempfile::Builder::new()
        .prefix("berth-rpm-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // tests/run.sh builds the package before the tests (BERTH_TEST_RPM); by
    // hand, the test builds it.
    let rpm = match std::env::var("BERTH_TEST_RPM") {
        Ok(path) => PathBuf::from(path),
        Err(_) => {
            let output = output_of(
                Command::new(repo().join("packaging/rpm.sh"))
                    .arg(scratch.path())
                    .env("BERTH_RPM_NODEPS", "1"),
            );
            assert!(
                output.status.success(),
                "packaging/rpm.sh failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        }
    };
    let (major, minor) = header_release(&include);

    // The Release tag names the Slurm major, as sites expect.
    let release = rpm_query(&rpm, &["--qf", "%{RELEASE}"]);
    assert!(
        release.starts_with(&format!("1.slurm{major}{minor:02}")),
        "Release {release:?} does not name Slurm {major}.{minor:02}"
    );
    // Requires exactly that Slurm major.
    let requires = rpm_query(&rpm, &["-R"]);
    let slurm: Vec<&str> = requires
        .lines()
        .filter(|l| l.starts_with("slurm"))
        .collect();
    let lower = format!(" >= {major}.{minor:02}");
    let upper = format!(" < {major}.{:02}", minor + 1);
    assert!(
        slurm.iter().any(|l| l.ends_with(&lower)) && slurm.iter().any(|l| l.ends_with(&upper)),
        "{} does not require slurm{lower} and slurm{upper}:\n{requires}",
        rpm.display()
    );
    assert!(requires.lines().any(|l| l == "shadow-utils"), "{requires}");
    // The plugin in Slurm's plugin folder, the drop-in a kept config file.
    let files = rpm_query(&rpm, &["--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]"]);
    let flags_of = |path: &str| {
        files
            .lines()
            .find_map(|l| l.split_once(' ').filter(|(_, p)| *p == path))
            .map(|(f, _)| f.to_string())
            .unwrap_or_else(|| panic!("{} has no {path}:\n{files}", rpm.display()))
    };
    flags_of("/usr/lib64/slurm/spank_berth.so");
    flags_of("/usr/bin/berth");
    let drop_in = flags_of("/etc/slurm/plugstack.conf.d/berth.conf");
    assert!(
        drop_in.contains('c') && drop_in.contains('n'),
        "the drop-in is not %config(noreplace): flags {drop_in:?}"
    );
    // %pre makes the pull user, a system user without a login shell.
    let scripts = rpm_query(&rpm, &["--scripts"]);
    let pre = scripts
        .split("preinstall scriptlet")
        .nth(1)
        .unwrap_or_else(|| panic!("no %pre:\n{scripts}"));
    assert!(
        pre.contains("useradd -r") && pre.contains("-s /sbin/nologin") && pre.contains(" berth"),
        "%pre does not create the system user berth:\n{scripts}"
    );
}

#[test]
fn smd_flavour_depends_on_schedmds_packages() {
    // What is built already (tests/run.sh and tests/release.sh build before
    // the tests), packaged without cargo.
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join("target"));
    if !target.join("release/libberth.so").is_file() {
        eprintln!(
            "skipped: no release build in {} (make build)",
            target.display()
        );
        return;
    }
    let scratch = tempfile::Builder::new()
        .prefix("berth-smd-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let output = output_of(
        Command::new(repo().join("packaging/deb.sh"))
            .arg(scratch.path())
            .env("BERTH_DEB_FLAVOUR", "smd")
            .env("BERTH_DEB_PREBUILT", "1")
            .env("TARGET_DIR", &target),
    );
    assert!(
        output.status.success(),
        "BERTH_DEB_FLAVOUR=smd packaging/deb.sh failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let deb = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let include = PathBuf::from(
        std::env::var("SLURM_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".to_string()),
    );
    let (major, minor) = header_release(&include);
    let depends = output_of(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Depends"));
    let depends = String::from_utf8_lossy(&depends.stdout);
    let want = format!(
        "slurm-smd (>= {major}.{minor:02}), slurm-smd (<< {major}.{:02})",
        minor + 1
    );
    assert!(
        depends.contains(&want) && !depends.contains("slurm-wlm"),
        "Depends: {depends} (want {want})"
    );
    // SchedMD's packages keep the plugins in /usr/lib/<multiarch>/slurm.
    let contents = output_of(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let contents = String::from_utf8_lossy(&contents.stdout);
    let plugin = contents
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .find(|p| p.ends_with("/spank_berth.so"))
        .unwrap_or_else(|| panic!("no plugin in {}:\n{contents}", deb.display()));
    let dir = Path::new(plugin).parent().unwrap();
    assert!(
        dir.starts_with("./usr/lib") && dir.file_name().unwrap() == "slurm",
        "the plugin is in {}, not /usr/lib/<multiarch>/slurm",
        dir.display()
    );
}
