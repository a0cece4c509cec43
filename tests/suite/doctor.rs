//! `berth doctor` on this machine: the test cluster's plugstack line passes,
//! a broken one fails with a fix for each problem.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::{output_of, Cluster};

fn doctor(args: &[&str]) -> (i32, String) {
    let out = output_of(
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("doctor")
            .args(args),
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn the_test_cluster_passes() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let plugstack =
        std::path::Path::new(&cluster.var("SLURM_CONF")).with_file_name("plugstack.conf");
    let (code, out) = doctor(&[
        "--plugstack",
        plugstack.to_str().unwrap(),
        "--min-free",
        "1M",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    for line in [
        "kernel",
        "user namespaces",
        "squashfs",
        "tar2sqfs",
        "Slurm version",
        "pull user",
        "scontrol",
        "sbcast",
        "munge",
        "unmunge",
    ] {
        assert!(
            out.contains(&format!("ok   {line}")),
            "no ok for {line}:\n{out}"
        );
    }
    assert!(
        out.contains(&format!("ok   registry {}", cluster.registry())),
        "{out}"
    );
}

#[test]
fn a_broken_node_is_told_what_to_fix() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o777)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let plugstack = dir.path().join("plugstack.conf");
    std::fs::write(
        &plugstack,
        format!(
            "required /usr/lib/slurm/spank_berth.so store_path={} helper_path=/nonexistent/berth \
             insecure_registries=127.0.0.1:{port} pull_user=no-such-berth-user\n",
            store.display()
        ),
    )
    .unwrap();
    let (code, out) = doctor(&["--plugstack", plugstack.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL helper_path: /nonexistent/berth"),
        "{out}"
    );
    assert!(out.contains("fix: chmod go-w"), "{out}");
    assert!(
        out.contains(&format!("FAIL registry 127.0.0.1:{port}")),
        "{out}"
    );
    assert!(
        out.contains("FAIL pull user: the pull user `no-such-berth-user`")
            && out.contains("fix: useradd --system"),
        "{out}"
    );
    assert!(out.contains("4 problem(s) to fix"), "{out}");
}

/// `berth doctor` compares the Slurm release the plugin was built for with
/// the installed slurmd and with the test cluster's running slurmds: on the
/// release it was built for it says so and counts them; on another release
/// (tests/release.sh runs this, built on the machine's 22.05, in the roots of
/// 24.11 and 26.05) it fails, for the installed binary and for each running
/// slurmd, and says what to do.
#[test]
fn slurm_release_of_the_plugin_is_checked_against_slurmd() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    // Unset only without the `spank` feature, where there is no plugin.
    let Some(built) = option_env!("BERTH_BUILT_FOR_SLURM") else {
        eprintln!("skipped: berth is built without the SPANK plugin");
        return;
    };
    let built: u64 = built.parse().unwrap();
    let built = format!("{}.{:02}", built >> 16, (built >> 8) & 0xff);
    let installed = output_of(Command::new("slurmd").arg("-V"));
    let installed = String::from_utf8_lossy(&installed.stdout)
        .split_whitespace()
        .last()
        .unwrap()
        .to_string();
    let plugstack =
        std::path::Path::new(&cluster.var("SLURM_CONF")).with_file_name("plugstack.conf");
    let (_, out) = doctor(&[
        "--plugstack",
        plugstack.to_str().unwrap(),
        "--min-free",
        "1M",
    ]);
    if installed.starts_with(&format!("{built}.")) {
        let line = out
            .lines()
            .find(|l| l.starts_with("ok   Slurm version: plugin built for"))
            .unwrap_or_else(|| panic!("no ok for the Slurm version:\n{out}"));
        let running: usize = line
            .rsplit_once(" (")
            .and_then(|(_, n)| n.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count of running slurmds: {line}"));
        assert!(running >= 1, "the cluster's slurmds are not seen: {line}");
        assert!(!out.contains("FAIL Slurm version"), "{out}");
    } else {
        assert!(
            out.contains(&format!(
                "FAIL Slurm version: plugin built for Slurm {built}."
            )) && out.contains(&format!("but the installed slurmd is {installed}")),
            "{out}"
        );
        assert!(
            out.contains("fix: rebuild berth against this Slurm's headers"),
            "{out}"
        );
        assert!(
            out.contains("FAIL Slurm version: running slurmd (pid "),
            "the cluster's running slurmds are not checked:\n{out}"
        );
    }
}
