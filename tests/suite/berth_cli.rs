//! The `berth` CLI against the test registry: pull, then run as root (kernel
//! squashfs) and as an ordinary user (squashfuse in a user namespace).

use crate::common;

use std::process::Command;

use common::{output_of, Cluster, Run, TEST_USER};

/// The berth binary, where the ordinary test user can run it too.
fn berth() -> String {
    common::world_readable_copy(std::path::Path::new(env!("CARGO_BIN_EXE_berth")))
        .to_string_lossy()
        .into_owned()
}

fn run_berth(as_user: bool, args: &[&str]) -> Run {
    let mut command = if as_user {
        let mut c = Command::new("runuser");
        c.args(["-u", TEST_USER, "--", &berth()]);
        c
    } else {
        Command::new(berth())
    };
    command.args(args);
    let out = common::output_of(&mut command);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn pull_then_run_as_root_and_as_user() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let image = format!("{registry}/busybox:latest");
    let base = tempfile::Builder::new()
        .prefix("berth-cli-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        base.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let host_dir = base.path().join("data");
    std::fs::create_dir(&host_dir).unwrap();
    std::fs::write(host_dir.join("f"), "bound\n").unwrap();
    std::fs::set_permissions(
        &host_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mount = format!("{}:/mnt/data:ro", host_dir.display());

    for as_user in [false, true] {
        let store = base
            .path()
            .join(if as_user { "user-store" } else { "root-store" });
        let store = store.to_str().unwrap();
        let pulled = run_berth(
            as_user,
            &[
                "pull",
                "--store",
                store,
                "--insecure-registry",
                &registry,
                &image,
            ],
        )
        .ok();
        assert!(pulled.stdout.contains("sha256:"), "{}", pulled.stdout);
        let run = run_berth(
            as_user,
            &[
                "run",
                "--store",
                store,
                "--insecure-registry",
                &registry,
                "--mount",
                &mount,
                &image,
                "--",
                "sh",
                "-c",
                "grep ^ID= /etc/os-release; id -un; cat /mnt/data/f; touch /mnt/data/g || echo ro",
            ],
        )
        .ok();
        assert!(run.stdout.contains("ID=berth-busybox"), "{}", run.stdout);
        assert!(
            run.stdout
                .contains(if as_user { TEST_USER } else { "root" }),
            "{}",
            run.stdout
        );
        assert!(run.stdout.contains("bound"), "{}", run.stdout);
        assert!(run.stdout.contains("ro"), "{}", run.stdout);
        // Exit codes pass through.
        let run = run_berth(
            as_user,
            &[
                "run",
                "--store",
                store,
                "--insecure-registry",
                &registry,
                &image,
                "--",
                "sh",
                "-c",
                "exit 7",
            ],
        );
        assert_eq!(run.code, 7, "{}", run.stderr);
    }
}

#[test]
fn errors_name_the_image() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = base.path().to_str().unwrap();
    let missing = format!("{registry}/no-such-image:1");
    run_berth(
        false,
        &[
            "pull",
            "--store",
            store,
            "--insecure-registry",
            &registry,
            &missing,
        ],
    )
    .failed_with("no-such-image", "");
    run_berth(false, &["pull", "--store", store, "BAD REF"])
        .failed_with("invalid image reference", "");
    run_berth(
        false,
        &[
            "run",
            "--store",
            store,
            "/nonexistent/image.sqfs",
            "--",
            "true",
        ],
    )
    .failed_with("/nonexistent/image.sqfs", "");
}

/// Docker schema 2, OCI manifest and OCI index forms of one image all pull.
#[test]
fn manifest_kinds_pull() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = base.path().to_str().unwrap();
    for tag in ["latest", "v2s2", "index"] {
        let image = format!("{registry}/busybox:{tag}");
        let run = run_berth(
            false,
            &[
                "run",
                "--store",
                store,
                "--insecure-registry",
                &registry,
                &image,
                "--",
                "cat",
                "/etc/os-release",
            ],
        )
        .ok();
        assert!(
            run.stdout.contains("ID=berth-busybox"),
            "{tag}: {}",
            run.stdout
        );
    }
}

/// The bearer-token registry: anonymous tokens for public images, the
/// enroot credentials file for private ones, a clear refusal without it.
#[test]
fn bearer_token_registry() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.var("BERTH_TEST_TOKEN_REGISTRY");
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = base.path().join("store");
    let store = store.to_str().unwrap();
    let config = base.path().join("enroot");
    std::fs::create_dir(&config).unwrap();
    let host = registry.split(':').next().unwrap();

    let public = format!("{registry}/public/busybox:latest");
    run_berth(
        false,
        &[
            "pull",
            "--store",
            store,
            "--insecure-registry",
            &registry,
            &public,
        ],
    )
    .ok();

    let private = format!("{registry}/private/busybox:latest");
    let denied = output_of(
        Command::new(berth())
            .args([
                "pull",
                "--store",
                store,
                "--insecure-registry",
                &registry,
                &private,
            ])
            .env("ENROOT_CONFIG_PATH", &config),
    );
    assert!(!denied.status.success());
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("denied") || stderr.contains("credentials"),
        "{stderr}"
    );

    std::fs::write(
        config.join(".credentials"),
        format!("machine {host} login berth password berthpass\n"),
    )
    .unwrap();
    let allowed = output_of(
        Command::new(berth())
            .args([
                "pull",
                "--store",
                store,
                "--insecure-registry",
                &registry,
                &private,
            ])
            .env("ENROOT_CONFIG_PATH", &config),
    );
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&allowed.stderr).contains("berthpass"),
        "password in output"
    );
}

/// Plain HTTP only for registries the admin lists as insecure.
#[test]
fn plain_http_needs_the_insecure_list() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = base.path().to_str().unwrap();
    let image = format!("{registry}/busybox:latest");
    run_berth(false, &["pull", "--store", store, &image]).failed_with(&registry, "");
}
