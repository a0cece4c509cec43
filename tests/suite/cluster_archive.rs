//! Images from archives and local engines (issue 16): a docker or OCI
//! archive given as `--container-image=/path/x.tar`, `dockerd://IMAGE` (the
//! harness's own Docker daemon, its socket open to group berthgrp) and
//! `podman://IMAGE` (podman storage of root and of the test user). Each is
//! converted into the node store by the pull user, with its image config;
//! a hostile archive is refused by name and leaves nothing. As root and as
//! the ordinary test user.

use crate::common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Cluster, Run, Submitter, BOTH, TEST_USER};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// The image each engine of the harness holds (tests/harness/engines.sh).
const ENGINE_IMAGE: &str = "berthtest/busybox:latest";

/// Held by each test that imports into the first node's store: the hostile
/// archive test checks that the store's `tmp/` is left empty, which another
/// test's import running at the same moment would break.
static NODE_STORE_IMPORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This binary's imports into the node store, one test at a time.
fn imports_alone() -> std::sync::MutexGuard<'static, ()> {
    NODE_STORE_IMPORTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The entries of `node`'s store folder `sub` (none when it is missing).
fn store_entries(cluster: &Cluster, node: &str, sub: &str) -> Vec<String> {
    let dir = Path::new(&cluster.var("BERTH_TEST_STATE_DIR"))
        .join("nodes")
        .join(node)
        .join("berth-store")
        .join(sub);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A file of the work folder for `who`, readable by them.
fn work_file(cluster: &Cluster, who: Submitter, name: &str) -> PathBuf {
    Path::new(&cluster.var("BERTH_TEST_WORKDIR"))
        .join(format!("archive-{who:?}-{}-{name}", std::process::id()))
}

fn give_to(who: Submitter, path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    if who == Submitter::User {
        common::tool("chown", &[TEST_USER, path.to_str().unwrap()]);
    }
}

/// `srun -N1 -w NODE --container-image=IMAGE sh -c SCRIPT` as `who`, with `env`.
fn run_image(
    cluster: &Cluster,
    who: Submitter,
    node: &str,
    image: &str,
    script: &str,
    env: &[(&str, &str)],
) -> Run {
    let image = format!("--container-image={image}");
    let args = ["-N1", "-w", node, &image, "sh", "-c", script];
    cluster.slurm_env(who, "srun", &args, env)
}

#[test]
fn docker_and_oci_archives_run_with_their_image_config() {
    let cluster = cluster_or_skip!();
    let _alone = imports_alone();
    let node = cluster.first_node();
    for who in BOTH {
        // An image no node has seen, with a variable of its own in its config.
        let mark = format!("archive-{who:?}-{}", std::process::id());
        let target = cluster.image(&format!("archive-src:{}", mark.to_lowercase()));
        common::push_with_env(
            &cluster.image("busybox:latest"),
            &format!("BERTH_ARCHIVE_MARK={mark}"),
            &target,
            None,
        );
        for format in ["docker-archive", "oci-archive"] {
            let file = work_file(&cluster, who, &format!("{format}.tar"));
            let _ = std::fs::remove_file(&file);
            common::tool(
                "skopeo",
                &[
                    "copy",
                    "-q",
                    "--src-tls-verify=false",
                    &format!("docker://{target}"),
                    &format!("{format}:{}", file.display()),
                ],
            );
            give_to(who, &file);
            let run = run_image(
                &cluster,
                who,
                &node,
                file.to_str().unwrap(),
                "echo \"$BERTH_ARCHIVE_MARK\"; test -x /bin/busybox && echo has-busybox",
                &[],
            )
            .ok();
            assert_eq!(
                run.stdout.lines().collect::<Vec<_>>(),
                [mark.as_str(), "has-busybox"],
                "{who:?} {format}: the archive's image and its Env\n{}",
                run.stderr
            );
            let _ = std::fs::remove_file(&file);
        }
    }
}

/// One archive file: `(name, bytes)` regular files and `(name, target)` symlinks,
/// names written raw into the header (so `..` and `/` go in as given).
fn hostile_tar(files: &[(&str, Vec<u8>)], links: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut put = |name: &str, body: &[u8], link: Option<&str>| {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(link) = link {
            h.set_entry_type(tar::EntryType::Symlink);
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, body).unwrap();
    };
    for (name, body) in files {
        put(name, body, None);
    }
    for (name, target) in links {
        put(name, &[], Some(target));
    }
    b.into_inner().unwrap()
}

#[test]
fn a_hostile_archive_is_refused_by_name_and_leaves_nothing() {
    let cluster = cluster_or_skip!();
    let _alone = imports_alone();
    let node = cluster.first_node();
    let escape = format!("/tmp/berth-archive-escape-{}", std::process::id());
    let config = br#"{"config":{"Env":["A=1"]}}"#.to_vec();
    let manifest = br#"[{"Config":"c.json","Layers":["l/layer.tar"]}]"#.to_vec();
    let up = format!("../../../../../../..{escape}");
    // A layer whose own entry climbs out: the layer conversion skips it.
    let bad_layer = hostile_tar(&[(up.as_str(), b"x".to_vec())], &[]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "traversal",
            hostile_tar(
                &[
                    (up.as_str(), b"x".to_vec()),
                    ("manifest.json", manifest.clone()),
                ],
                &[],
            ),
            up.as_str(),
        ),
        (
            "link-escape",
            hostile_tar(
                &[
                    ("manifest.json", manifest.clone()),
                    ("c.json", config.clone()),
                ],
                &[("l/layer.tar", "../../../../etc/shadow")],
            ),
            "l/layer.tar",
        ),
        (
            "oversized-manifest",
            hostile_tar(&[("manifest.json", vec![b' '; (4 << 20) + 1])], &[]),
            "manifest.json",
        ),
        (
            "layer-traversal",
            hostile_tar(
                &[
                    ("manifest.json", manifest.clone()),
                    ("c.json", config.clone()),
                    ("l/layer.tar", bad_layer),
                ],
                &[],
            ),
            "l/layer.tar",
        ),
    ];
    for who in BOTH {
        for (what, bytes, named) in &cases {
            let images_before = store_entries(&cluster, &node, "images");
            let file = work_file(&cluster, who, &format!("{what}.tar"));
            std::fs::File::create(&file)
                .and_then(|mut f| f.write_all(bytes))
                .unwrap();
            give_to(who, &file);
            let run = run_image(&cluster, who, &node, file.to_str().unwrap(), "true", &[]);
            assert!(
                !Path::new(&escape).exists(),
                "{who:?} {what}: {escape} was written"
            );
            assert_eq!(
                store_entries(&cluster, &node, "tmp"),
                Vec::<String>::new(),
                "{who:?} {what}: the import left files in tmp/"
            );
            let _ = std::fs::remove_file(&file);
            if *what == "layer-traversal" {
                // Inside a layer, an unsafe path is skipped (as for registry
                // layers): the image holds nothing and the step cannot start.
                run.failed();
                continue;
            }
            let run = run.failed();
            assert!(
                run.stderr.contains(file.to_str().unwrap()) && run.stderr.contains(named),
                "{who:?} {what}: the refusal must name the file and '{named}'\n{}",
                run.stderr
            );
            assert_eq!(
                store_entries(&cluster, &node, "images"),
                images_before,
                "{who:?} {what}: a refused archive became an image"
            );
        }
    }
    // This cluster's (the machine may run other instances).
    let state = cluster.var("BERTH_TEST_STATE_DIR");
    let left: Vec<String> = common::berth_leftovers()
        .into_iter()
        .filter(|l| l.contains(&format!("{state}/")))
        .collect();
    assert!(left.is_empty(), "leftovers: {left:?}");
}

/// An engine's image (`images.0`) runs for `who`; a missing one
/// (`images.1`) fails, naming the image and the engine's `save`.
fn runs_and_names_a_missing_image(
    cluster: &Cluster,
    who: Submitter,
    node: &str,
    images: (&str, &str),
    save: &str,
    env: &[(&str, &str)],
) {
    let (present, missing) = images;
    let run = run_image(
        cluster,
        who,
        node,
        present,
        "test -x /bin/busybox && echo ok",
        env,
    )
    .ok();
    assert_eq!(run.stdout.trim(), "ok", "{who:?}\n{}", run.stderr);
    let run = run_image(cluster, who, node, missing, "true", env).failed();
    let name = missing.split_once("://").map_or(missing, |(_, name)| name);
    assert!(
        run.stderr.contains(save) && run.stderr.contains(name),
        "{who:?}: a missing image is refused by name\n{}",
        run.stderr
    );
}

#[test]
fn dockerd_images_are_saved_with_the_users_own_rights_to_the_socket() {
    let cluster = cluster_or_skip!();
    let _alone = imports_alone();
    let node = cluster.first_node();
    let host = cluster.var("BERTH_TEST_DOCKER_HOST");
    let env = [("DOCKER_HOST", host.as_str())];
    let image = format!("dockerd://{ENGINE_IMAGE}");
    for who in BOTH {
        runs_and_names_a_missing_image(
            &cluster,
            who,
            &node,
            (&image, "dockerd://berthtest/missing:1"),
            "docker save",
            &env,
        );
    }
    // berthuser2 is not in the socket's group: the daemon is not theirs to ask.
    let mut other = cluster.command_as(
        "berthuser2",
        "srun",
        &[
            "-N1",
            "-w",
            &node,
            &format!("--container-image={image}"),
            "true",
        ],
    );
    other.env("DOCKER_HOST", &host);
    let out = common::output_of(&mut other);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "berthuser2 used the daemon\n{stderr}"
    );
    assert!(
        stderr.contains("docker save") && stderr.contains("permission denied"),
        "berthuser2: refused by the socket's permissions, said so\n{stderr}"
    );
}

#[test]
fn podman_images_come_from_the_users_own_storage() {
    let cluster = cluster_or_skip!();
    let _alone = imports_alone();
    let node = cluster.first_node();
    let dir = cluster.var("BERTH_TEST_PODMAN_DIR");
    // `podman load` names it docker.io/berthtest/busybox; users write it short.
    let image = format!("podman://{ENGINE_IMAGE}");
    for (who, owner) in [(Submitter::Root, "root"), (Submitter::User, TEST_USER)] {
        // The owner's podman settings (storage, tmp and XDG folders), as a
        // job passes them.
        let settings = std::fs::read_to_string(format!("{dir}/{owner}/podman.env")).unwrap();
        let env: Vec<(&str, &str)> = settings.lines().filter_map(|l| l.split_once('=')).collect();
        runs_and_names_a_missing_image(
            &cluster,
            who,
            &node,
            (&image, "podman://localhost/missing:1"),
            "podman save",
            &env,
        );
    }
}

#[test]
fn the_cli_pulls_archives_and_engine_images_as_its_caller() {
    let cluster = cluster_or_skip!();
    let berth = common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    let host = cluster.var("BERTH_TEST_DOCKER_HOST");
    let store = work_file(&cluster, Submitter::User, "cli-store");
    let _ = std::fs::remove_dir_all(&store);
    std::fs::create_dir(&store).unwrap();
    common::tool("chown", &[TEST_USER, store.to_str().unwrap()]);
    let archive = work_file(&cluster, Submitter::User, "cli.tar");
    let _ = std::fs::remove_file(&archive);
    common::tool(
        "skopeo",
        &[
            "copy",
            "-q",
            "--src-tls-verify=false",
            &format!("docker://{}", cluster.image("busybox:latest")),
            &format!("oci-archive:{}", archive.display()),
        ],
    );
    give_to(Submitter::User, &archive);
    let store_arg = format!("--store={}", store.display());
    // The rootless CLI converts into the caller's own store, under a key no
    // registry manifest has; a local engine's image is saved by the caller.
    for image in [
        archive.to_str().unwrap().to_string(),
        format!("dockerd://{ENGINE_IMAGE}"),
    ] {
        let mut pull = Command::new("runuser");
        pull.args(["-u", TEST_USER, "--"])
            .arg(&berth)
            .args(["pull", "--json", "--progress=none", &store_arg, &image])
            .env("DOCKER_HOST", &host)
            .current_dir("/");
        let out = common::output_of(&mut pull);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "berth pull {image}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stored: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let squashfs = stored["squashfs"].as_str().unwrap();
        assert!(
            squashfs.starts_with(store.to_str().unwrap()),
            "{image}: {stdout}"
        );
        assert!(
            stored["config"]["env"].as_array().is_some_and(|env| env
                .iter()
                .any(|e| e.as_str().is_some_and(|e| e.starts_with("PATH=")))),
            "{image}: the image config is kept: {stdout}"
        );
    }
    let _ = std::fs::remove_file(&archive);
    let _ = std::fs::remove_dir_all(&store);
}
