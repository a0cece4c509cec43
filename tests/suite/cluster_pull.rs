//! The image pipeline against the real test registries and cluster: repeat
//! pulls pinned by digest (no network for anonymous images, an access check
//! for private ones), progress lines, pull-through mirrors.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{output_of, skopeo_copy, Cluster, Run, Submitter, TEST_USER};

/// The berth binary, where the ordinary test user can run it too.
fn berth() -> String {
    common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")))
        .to_string_lossy()
        .into_owned()
}

/// `berth ARGS` as root or the test user, with `env` set and the proxy
/// variables of the test process removed.
fn berth_env(as_user: bool, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = if as_user {
        let mut c = Command::new("runuser");
        c.args(["-u", TEST_USER, "--", "env"]);
        for (k, v) in env {
            c.arg(format!("{k}={v}"));
        }
        c.arg(berth());
        c
    } else {
        Command::new(berth())
    };
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"] {
        command.env_remove(var).env_remove(var.to_ascii_lowercase());
    }
    if !as_user {
        command.envs(env.iter().copied());
    }
    command.args(args);
    let out = output_of(&mut command);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A folder the test user can write too.
fn shared_tempdir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("berth-pull-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// The manifest digest `berth pull` printed (`DIGEST PATH`).
fn digest_of(run: &Run) -> String {
    run.stdout
        .split_whitespace()
        .next()
        .filter(|d| d.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("no digest in: {}", run.stdout))
        .to_string()
}

/// Registry log lines naming `repository`.
fn log_lines(log: &str, repository: &str) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let needle = format!("/v2/{repository}/");
    text.lines().filter(|l| l.contains(&needle)).count()
}

/// A public image pinned by digest is handed out of the store with no network:
/// through a proxy that does not exist, a pull by tag fails and a pull by
/// digest works, as root and as the test user (each with its own store).
#[test]
fn pinned_public_image_needs_no_network() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.var("BERTH_TEST_TOKEN_REGISTRY");
    let image = format!("{registry}/public/busybox:latest");
    for as_user in [false, true] {
        let base = shared_tempdir();
        let store = base.path().join("store");
        let store = store.to_str().unwrap();
        let pull = |reference: &str, env: &[(&str, &str)]| {
            berth_env(
                as_user,
                &[
                    "pull",
                    "--store",
                    store,
                    "--registry-retries",
                    "0",
                    "--insecure-registry",
                    &registry,
                    reference,
                ],
                env,
            )
        };
        let digest = digest_of(&pull(&image, &[]).ok());
        let pinned = format!("{registry}/public/busybox@{digest}");
        let offline = [("HTTP_PROXY", "http://127.0.0.1:9")];
        // The proof that the proxy cuts the registry off: a pull by tag fails.
        pull(&image, &offline).failed();
        let again = pull(&pinned, &offline).ok();
        assert!(again.stdout.starts_with(&digest), "{}", again.stdout);
    }
}

/// A private image in the store is handed out by digest only to whoever the
/// registry lets read its manifest: with the credentials a HEAD of the
/// manifest is made and the pull succeeds; without them it is refused, as
/// root and as the test user (each with a store of its own).
#[test]
fn pinned_private_image_checks_access() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.var("BERTH_TEST_TOKEN_REGISTRY");
    let log = cluster.var("BERTH_TEST_TOKEN_REGISTRY_LOG");
    let host = registry.split(':').next().unwrap();
    let image = format!("{registry}/private/busybox:latest");
    // The check is a GET of the manifest by digest (its bytes must hash to it).
    let heads = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"GET /v2/private/busybox/manifests/sha256:"))
            .count()
    };
    for as_user in [false, true] {
        let base = shared_tempdir();
        let store = base.path().join("store");
        let with_creds = base.path().join("with");
        let without = base.path().join("without");
        for dir in [&with_creds, &without] {
            std::fs::create_dir(dir).unwrap();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let creds_file = with_creds.join(".credentials");
        std::fs::write(
            &creds_file,
            format!("machine {host} login berth password berthpass\n"),
        )
        .unwrap();
        std::fs::set_permissions(&creds_file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let pull = |reference: &str, config: &Path| {
            berth_env(
                as_user,
                &[
                    "pull",
                    "--store",
                    store.to_str().unwrap(),
                    "--insecure-registry",
                    &registry,
                    reference,
                ],
                &[
                    ("ENROOT_CONFIG_PATH", config.to_str().unwrap()),
                    ("HOME", config.to_str().unwrap()),
                ],
            )
        };
        let digest = digest_of(&pull(&image, &with_creds).ok());
        let pinned = format!("{registry}/private/busybox@{digest}");
        let before = heads();
        let allowed = pull(&pinned, &with_creds).ok();
        assert!(allowed.stdout.starts_with(&digest), "{}", allowed.stdout);
        assert!(
            heads() > before,
            "no GET of the manifest by digest in {log}"
        );
        let refused = pull(&pinned, &without).failed();
        assert!(
            refused.stderr.contains("denied") || refused.stderr.contains("credentials"),
            "{}",
            refused.stderr
        );
        assert!(!refused.stdout.contains(".sqfs"), "{}", refused.stdout);
    }
}

/// A site that reaches a registry only through its mirror (here: the
/// "upstream" is a port where nothing listens, its mirror the token
/// registry): a private image pulled by tag with credentials is checked
/// through the mirror when asked for by digest, under its own repository
/// and under another repository name of the same registry; without
/// credentials it is refused. As root and as the test user.
#[test]
fn cached_private_image_is_checked_through_the_mirror() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.var("BERTH_TEST_TOKEN_REGISTRY");
    let host = registry.split(':').next().unwrap();
    let upstream = format!("{host}:1");
    for as_user in [false, true] {
        let base = shared_tempdir();
        let store = base.path().join("store");
        let with_creds = base.path().join("with");
        let without = base.path().join("without");
        for dir in [&with_creds, &without] {
            std::fs::create_dir(dir).unwrap();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let creds_file = with_creds.join(".credentials");
        std::fs::write(
            &creds_file,
            format!("machine {host} login berth password berthpass\n"),
        )
        .unwrap();
        std::fs::set_permissions(&creds_file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mirror = format!("{upstream}={registry}");
        let pull = |reference: &str, config: &Path| {
            berth_env(
                as_user,
                &[
                    "pull",
                    "--store",
                    store.to_str().unwrap(),
                    "--insecure-registry",
                    &registry,
                    "--insecure-registry",
                    &upstream,
                    "--mirror",
                    &mirror,
                    reference,
                ],
                &[
                    ("ENROOT_CONFIG_PATH", config.to_str().unwrap()),
                    ("HOME", config.to_str().unwrap()),
                ],
            )
        };
        let digest =
            digest_of(&pull(&format!("{upstream}/private/busybox:latest"), &with_creds).ok());
        for name in ["private/busybox", "renamed/busybox"] {
            let pinned = format!("{upstream}/{name}@{digest}");
            let allowed = pull(&pinned, &with_creds).ok();
            assert!(
                allowed.stdout.starts_with(&digest),
                "{pinned}: {}",
                allowed.stdout
            );
            let refused = pull(&pinned, &without)
                .failed_with("refused", &format!("{pinned} without credentials"));
            assert!(!refused.stdout.contains(".sqfs"), "{}", refused.stdout);
        }
    }
}

/// Without a terminal, `berth pull` prints plain lines: one per layer and a
/// summary; `--progress none` prints none.
#[test]
fn progress_lines_without_a_tty() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let image = format!("{registry}/debian:bookworm");
    let base = shared_tempdir();
    let store = base.path().join("store");
    let store = store.to_str().unwrap();
    let args = ["pull", "--store", store, "--insecure-registry", &registry];
    let run = berth_env(false, &[&args[..], &[&image]].concat(), &[]).ok();
    let layers = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("berth: layer sha256:") && l.contains(" fetched in "))
        .count();
    assert_eq!(layers, 3, "one line per layer expected:\n{}", run.stderr);
    assert!(
        run.stderr
            .lines()
            .any(|l| l.starts_with("berth: pulled 3 layers (") && l.contains(" squashfs (")),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains('\x1b'), "escape codes without a tty");
    let quiet = berth_env(
        false,
        &[&args[..], &["--progress", "none", &image]].concat(),
        &[],
    )
    .ok();
    assert!(quiet.stderr.is_empty(), "{}", quiet.stderr);
}

/// srun with an image pinned by digest: the first step on a node pulls (and
/// tells the user in one line), later steps, as root or as the test user, take
/// it from the node store without a single registry request.
#[test]
fn srun_pinned_image_pulls_once() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let log = cluster.var("BERTH_TEST_REGISTRY_LOG");
    // A repository of its own, so no other test's requests are counted, and
    // an image no node has seen: busybox with a config of its own (umoci
    // rewrites config and manifest, the layer is shared).
    let repository = "berth-pinned/busybox";
    let unique = format!(
        "BERTH_PINNED={}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let digest = common::push_with_env(
        &format!("{registry}/busybox:latest"),
        &unique,
        &format!("{registry}/{repository}:latest"),
        None,
    );
    let image = format!("--container-image={registry}/{repository}@{digest}");
    let first = cluster
        .srun(Submitter::User, &["-N1", "-w", "node1", &image, "true"])
        .ok();
    assert!(
        first.stderr.contains("berth: node1: ") && first.stderr.contains(" squashfs ("),
        "no pull line in srun's output:\n{}",
        first.stderr
    );
    let before = log_lines(&log, repository);
    for who in [Submitter::Root, Submitter::User] {
        let again = cluster
            .srun(who, &["-N1", "-w", "node1", &image, "true"])
            .ok();
        assert!(!again.stderr.contains(" pulled "), "{}", again.stderr);
    }
    assert_eq!(
        log_lines(&log, repository),
        before,
        "a pinned image in the node store was asked from the registry"
    );
}

/// `mirrors=docker.io=REGISTRY` (config file) and `--mirror`: an image named
/// `docker.io/...` is fetched from the mirror, which serves the same path.
#[test]
fn mirror_serves_docker_io_names() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let log = cluster.var("BERTH_TEST_REGISTRY_LOG");
    let repository = "library/berth-mirrored";
    skopeo_copy(
        &format!("{registry}/busybox:latest"),
        &format!("{registry}/{repository}:latest"),
    );
    let base = shared_tempdir();
    // Root reads a config file only in root's own folders.
    let conf_dir = tempfile::tempdir().unwrap();
    let conf = conf_dir.path().join("berth.conf");
    std::fs::write(
        &conf,
        format!("mirrors=docker.io={registry}\ninsecure_registries={registry}\n"),
    )
    .unwrap();
    let store = base.path().join("store");
    let before = log_lines(&log, repository);
    let run = berth_env(
        false,
        &[
            "pull",
            "--store",
            store.to_str().unwrap(),
            "docker.io/berth-mirrored:latest",
        ],
        &[("BERTH_CONFIG", conf.to_str().unwrap())],
    )
    .ok();
    assert!(run.stdout.starts_with("sha256:"), "{}", run.stdout);
    assert!(
        log_lines(&log, repository) > before,
        "the mirror saw no request"
    );
    // The same from the command line, into a fresh store.
    let store2 = base.path().join("store2");
    berth_env(
        false,
        &[
            "pull",
            "--store",
            store2.to_str().unwrap(),
            "--insecure-registry",
            &registry,
            "--mirror",
            &format!("docker.io={registry}"),
            "berth-mirrored",
        ],
        &[],
    )
    .ok();
    berth_env(false, &["pull", "--mirror", "docker.io", "busybox"], &[])
        .failed_with("REGISTRY=MIRROR", "");
}
