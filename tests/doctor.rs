//! `berth doctor` on this machine: the test cluster's plugstack line passes,
//! a broken one fails with a fix for each problem.

mod common;

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
