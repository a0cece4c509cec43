//! Issue 18, second pass, on the real cluster: a cached private image is
//! handed out only after its own registry lets the user read it (never a
//! registry the requester names), and what a user leaves in their fan-out
//! folder (a FUSE mount of a stopped daemon) never drains a node. A cached
//! image asked for through another registry that holds it runs once that
//! registry served all of it.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{output_of, wait_for, Cluster, Run, TEST_USER};

const NODE: &str = "node1";

/// A name no earlier run used.
fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

/// A folder under /var/tmp every user can enter, removed at the end.
fn shared_base() -> tempfile::TempDir {
    let base = tempfile::Builder::new()
        .prefix("berth-origin-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    base
}

/// `srun ARGS` as `user` with `env` (passed to the job).
fn srun_as(cluster: &Cluster, user: &str, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut command = Command::new("runuser");
    command.args(["-u", user, "--", "env"]);
    for (k, v) in env {
        command.arg(format!("{k}={v}"));
    }
    command
        .args(["timeout", "300", "srun"])
        .args(args)
        .current_dir(cluster.var("BERTH_TEST_WORKDIR"))
        .env("SLURM_CONF", cluster.var("SLURM_CONF"))
        .env_remove("SLURM_JOB_ID")
        .env_remove("SLURM_JOBID");
    let out = output_of(&mut command);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A folder of `user` (mode 0700) with an enroot credentials file
/// holding `text`.
fn credentials_dir(base: &Path, user: &str, text: &str) -> PathBuf {
    let dir = base.join(user);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(".credentials");
    std::fs::write(&file, text).unwrap();
    let uid = nix::unistd::User::from_name(user)
        .unwrap()
        .expect("test user")
        .uid
        .as_raw();
    for path in [&file, &dir] {
        std::os::unix::fs::chown(path, Some(uid), None).unwrap();
    }
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// Copies `source` (read with `creds`) to `target` byte for byte, so the
/// copy has the same manifest digest.
fn copy_exactly(source: &str, target: &str, creds: &str) {
    let copied = output_of(Command::new("skopeo").args([
        "copy",
        "-q",
        "--preserve-digests",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        "--src-creds",
        creds,
        &format!("docker://{source}"),
        &format!("docker://{target}"),
    ]));
    assert!(
        copied.status.success(),
        "skopeo copy {source} {target}: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
}

/// Sets a fault-proxy rule (tests/harness/fault-proxy.py).
fn fault_rule(cluster: &Cluster, rule: serde_json::Value) {
    ureq::post(&format!(
        "http://{}/_fault/rules",
        cluster.var("BERTH_TEST_FAULT_PROXY")
    ))
    .send_json(rule)
    .expect("fault proxy rule");
}

/// A private image cached on node1 (pulled there by the test user with
/// their credentials) asked for by digest under the name of another
/// registry that answers 200 to every manifest request (the fault proxy,
/// which the cluster trusts over plain HTTP): refused for users without
/// access to the image's own registry, as an ordinary user and as root;
/// nothing runs. The image's own name keeps working for its owner.
#[test]
fn a_cached_private_image_is_not_handed_out_by_another_registry() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let token_registry = cluster.var("BERTH_TEST_TOKEN_REGISTRY");
    let repository = format!("private/{}", unique("origin"));
    let image = format!("{token_registry}/{repository}:1");
    let creds = format!(
        "{}:{}",
        cluster.var("BERTH_TEST_TOKEN_USER"),
        cluster.var("BERTH_TEST_TOKEN_PASSWORD")
    );
    let digest = common::push_with_env(
        &format!("{}/busybox:latest", cluster.registry()),
        &format!("BERTH_ORIGIN={}", unique("v")),
        &image,
        Some(&creds),
    );
    let base = shared_base();
    let entry = format!(
        "machine {} login {} password {}\n",
        cluster.var("BERTH_TEST_BRIDGE_IP"),
        cluster.var("BERTH_TEST_TOKEN_USER"),
        cluster.var("BERTH_TEST_TOKEN_PASSWORD")
    );
    let own = credentials_dir(base.path(), TEST_USER, &entry);
    let own = own.to_str().unwrap();
    let with_own = [("ENROOT_CONFIG_PATH", own), ("HOME", own)];
    let task = ["sh", "-c", "echo ran=$BERTH_ORIGIN"];
    let cached = srun_as(
        &cluster,
        TEST_USER,
        &with_own,
        &[
            &["-N1", "-w", NODE, &format!("--container-image={image}")],
            &task[..],
        ]
        .concat(),
    )
    .ok();
    assert!(cached.stdout.contains("ran="), "{}", cached.stdout);

    // The "evil" registry: 200 to every manifest request of its repository.
    let evil_repository = format!("evil/{}", unique("x"));
    fault_rule(
        &cluster,
        serde_json::json!({
            "repository": evil_repository,
            "what": "manifests",
            "fault": "status",
            "status": 200,
        }),
    );
    let evil = format!(
        "{}/{evil_repository}@{digest}",
        cluster.var("BERTH_TEST_FAULT_PROXY")
    );
    let stranger = &cluster
        .var("BERTH_TEST_OTHER_USERS")
        .split_whitespace()
        .next()
        .expect("another test user")
        .to_string();
    let empty = base.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let empty = empty.to_str().unwrap();
    let without = [("ENROOT_CONFIG_PATH", empty), ("HOME", empty)];
    for user in [stranger.as_str(), "root"] {
        let run = srun_as(
            &cluster,
            user,
            &without,
            &[
                &["-N1", "-w", NODE, &format!("--container-image={evil}")],
                &task[..],
            ]
            .concat(),
        )
        .failed();
        assert!(
            !run.stdout.contains("ran="),
            "{user} got the cached private image through {evil}:\n{}\n{}",
            run.stdout,
            run.stderr
        );
        assert!(
            run.stderr.contains(&token_registry) && run.stderr.contains("refused"),
            "{user}: the refusal names the image's own registry:\n{}",
            run.stderr
        );
    }
    // A registry that serves the true manifest (anyone who saw it once may
    // have its bytes) but not the private blobs proves nothing either: the
    // same content under a repository of the anonymous registry, its blob
    // requests answered 404 through the fault proxy.
    let copy_repository = format!("evil/{}", unique("manifest-only"));
    copy_exactly(
        &format!("{token_registry}/{repository}@{digest}"),
        &format!("{}/{copy_repository}:1", cluster.registry()),
        &creds,
    );
    fault_rule(
        &cluster,
        serde_json::json!({
            "repository": copy_repository,
            "what": "blobs",
            "fault": "status",
            "status": 404,
        }),
    );
    let manifest_only = format!(
        "{}/{copy_repository}@{digest}",
        cluster.var("BERTH_TEST_FAULT_PROXY")
    );
    let run = srun_as(
        &cluster,
        stranger,
        &without,
        &[
            &[
                "-N1",
                "-w",
                NODE,
                &format!("--container-image={manifest_only}"),
            ],
            &task[..],
        ]
        .concat(),
    )
    .failed();
    assert!(
        !run.stdout.contains("ran=") && run.stderr.contains(&token_registry),
        "the true manifest without the blobs handed out the cached private image:\n{}\n{}",
        run.stdout,
        run.stderr
    );

    // Its owner, by its own name and digest: still runs.
    let pinned = format!("{token_registry}/{repository}@{digest}");
    let owner = srun_as(
        &cluster,
        TEST_USER,
        &with_own,
        &[
            &["-N1", "-w", NODE, &format!("--container-image={pinned}")],
            &task[..],
        ]
        .concat(),
    )
    .ok();
    assert!(owner.stdout.contains("ran="), "{}", owner.stdout);
}

/// A node's `/tmp` (the fan-out folder lives there).
fn node_tmp(cluster: &Cluster, node: &str) -> PathBuf {
    PathBuf::from(cluster.var("BERTH_TEST_STATE_DIR"))
        .join("nodes")
        .join(node)
        .join("tmp")
}

/// A four-node job (fan-out makes the job's fan-out folders) whose user
/// leaves a FUSE mount (squashfuse, its daemon then stopped with SIGSTOP)
/// and a symlink to a root-only file in the job's fan-out folder on each
/// node: after the job the nodes are idle, not
/// drained, the mounts are detached and the folder is gone, and the link's
/// target is untouched.
#[test]
fn a_fuse_mount_in_the_fanout_folder_does_not_drain_the_node() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let base = shared_base();
    let sqfs = base.path().join("small.sqfs");
    let tree = base.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("f"), b"x").unwrap();
    let made = output_of(
        Command::new("mksquashfs")
            .arg(&tree)
            .arg(&sqfs)
            .args(["-quiet", "-noappend"]),
    );
    assert!(made.status.success(), "mksquashfs failed");
    std::fs::set_permissions(&sqfs, std::fs::Permissions::from_mode(0o644)).unwrap();
    let secret = base.path().join("root-only");
    std::fs::write(&secret, b"root's").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A two-node container step makes the job's fan-out folders (the
    // user's), then a plain step leaves a mount and a link in each.
    let image = format!(
        "{}/berth-origin/fuse:{}",
        cluster.registry(),
        std::process::id()
    );
    common::push_with_env(
        &cluster.image("busybox:latest"),
        &format!("BERTH_FUSE={}", unique("v")),
        &image,
        None,
    );
    let script = format!(
        "set -e\n\
         srun -N4 --container-image={image} true\n\
         [ \"$(stat -c %u /tmp/berth-fanout)\" = 0 ] && echo fanout-dir-is-roots\n\
         srun -N4 sh -c 'd=/tmp/berth-fanout/job-$SLURM_JOB_ID; m=$d/m-$(hostname); \
         mkdir -p $m $d/deep/er; ln -s {secret} $d/deep/link; squashfuse {sqfs} $m; \
         ls $m >/dev/null; pid=$(pgrep -n -u $(id -u) -f \"squashfuse {sqfs} $m\"); \
         kill -STOP $pid; echo fuse-pid=$pid; echo mounted-on-$(hostname)'\n\
         echo job=$SLURM_JOB_ID\n",
        secret = secret.display(),
        sqfs = sqfs.display(),
    );
    let run = srun_like_batch(&cluster, &script);
    let job = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("job="))
        .unwrap_or_else(|| panic!("no job id:\n{}\n{}", run.stdout, run.stderr))
        .to_string();
    assert!(
        run.stdout.contains("fanout-dir-is-roots"),
        "berth did not make the fan-out folder:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    assert_eq!(
        run.stdout.matches("mounted-on-").count(),
        4,
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    let folders: Vec<PathBuf> = ["node1", "node2", "node3", "node4"]
        .iter()
        .map(|n| node_tmp(&cluster, n).join(format!("berth-fanout/job-{job}")))
        .collect();
    let gone = wait_for(Duration::from_secs(60), || {
        folders
            .iter()
            .all(|f| std::fs::symlink_metadata(f).is_err())
    });
    let states = cluster.node_states();
    // Whatever happened, end the daemons this test started (by their pids).
    for pid in run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("fuse-pid="))
    {
        let pid = nix::unistd::Pid::from_raw(pid.trim().parse().unwrap_or(0));
        if pid.as_raw() > 0 {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        }
    }
    assert!(gone, "fan-out folders of job {job} left: {folders:?}");
    for (node, state) in &states {
        assert!(
            !state.contains("drain") && !state.contains("down"),
            "node {node} is {state} after the job's epilog: {states:?}"
        );
    }
    assert_eq!(std::fs::read(&secret).unwrap(), b"root's");
}

/// Runs `script` as the test user in a four-node `sbatch --wait` job and
/// returns its output (the job's output file).
fn srun_like_batch(cluster: &Cluster, script: &str) -> Run {
    let base = shared_base();
    let script_path = base.path().join("job.sh");
    std::fs::write(&script_path, format!("#!/bin/sh\n{script}")).unwrap();
    std::fs::set_permissions(&script_path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out_path = base.path().join("job.out");
    let mut command = Command::new("runuser");
    command
        .args([
            "-u", TEST_USER, "--", "timeout", "300", "sbatch", "--wait", "-p", "wide", "-N4",
        ])
        .arg(format!("--output={}", out_path.display()))
        .arg(&script_path)
        .current_dir(base.path())
        .env("SLURM_CONF", cluster.var("SLURM_CONF"))
        .env_remove("SLURM_JOB_ID")
        .env_remove("SLURM_JOBID");
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = output_of(&mut command);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout),
    }
}

/// An image cached from one registry, asked for by digest under another
/// registry that holds the same image, while the first one is down (a
/// registry that moved, a mirror named directly): it runs, as the user and
/// as root, once the named registry served every blob; that registry is then
/// recorded as an origin, so the next start asks no registry at all.
#[test]
fn a_cached_image_runs_through_another_registry_that_holds_it() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let registry = cluster.registry();
    let proxy = cluster.var("BERTH_TEST_FAULT_PROXY");
    let log = cluster.var("BERTH_TEST_REGISTRY_LOG");
    let task = ["sh", "-c", "echo ran=$BERTH_MOVED"];
    for user in [TEST_USER, "root"] {
        let repository = format!("moved/{}", unique("image"));
        let digest = common::push_with_env(
            &format!("{registry}/busybox:latest"),
            &format!("BERTH_MOVED={}", unique("v")),
            &format!("{registry}/{repository}:1"),
            None,
        );
        let run = |image: &str| {
            srun_as(
                &cluster,
                user,
                &[],
                &[
                    &["-N1", "-w", NODE, &format!("--container-image={image}")],
                    &task[..],
                ]
                .concat(),
            )
        };
        // Cached through the fault proxy: its only recorded origin.
        let first = run(&format!("{proxy}/{repository}@{digest}")).ok();
        assert!(first.stdout.contains("ran="), "{user}: {}", first.stdout);
        // That origin goes down.
        fault_rule(
            &cluster,
            serde_json::json!({"repository": repository, "what": "any", "fault": "status", "status": 503}),
        );
        let direct = format!("{registry}/{repository}@{digest}");
        let moved = run(&direct);
        assert!(
            moved.code == 0 && moved.stdout.contains("ran="),
            "{user}: the image held by {registry} did not run while its first origin is down:\n{}\n{}",
            moved.stdout,
            moved.stderr
        );
        let requests = |log: &str| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .matches(&format!(" /v2/{repository}/"))
                .count()
        };
        let before = requests(&log);
        let again = run(&direct).ok();
        assert!(again.stdout.contains("ran="), "{user}: {}", again.stdout);
        assert_eq!(
            requests(&log),
            before,
            "{user}: the second start through {registry} asked the registry again"
        );
    }
}
