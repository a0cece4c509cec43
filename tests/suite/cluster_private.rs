//! Private images and the unprivileged pull, on the real cluster and token
//! registry: each user's own credentials decide (read with the user's own
//! permissions), a private image cached on a node is refused to users the
//! registry refuses, credentials never show in a process's command line or
//! environment or in a log, the puller runs as the pull user, the store's
//! content belongs to it, users cannot touch each other's container tasks,
//! and the decompression-bomb limit is configurable.

use crate::common;

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::private::{push_private, push_unique, shared_base, unique, CredentialDir};
use common::{output_of, tool, wait_for, Cluster, Run, Submitter};

/// The node every test here runs on, so that "cached on this node" holds.
const NODE: &str = "node1";

/// One test at a time: the sampling test checks the user of every
/// credentials helper on the cluster, and the others run helpers as other
/// users.
static SERIAL: Mutex<()> = Mutex::new(());

/// The cluster, and this file's turn on it.
fn cluster_alone() -> Option<(Cluster, std::sync::MutexGuard<'static, ()>)> {
    let turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    Some((Cluster::get()?, turn))
}

fn uid_of(user: &str) -> u32 {
    common::uid_of_user(user)
}

/// The pull user (`pull_user`, default berth).
fn pull_uid() -> u32 {
    uid_of("berth")
}

/// The other test users.
fn other_users(cluster: &Cluster) -> Vec<String> {
    cluster
        .var("BERTH_TEST_OTHER_USERS")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// `srun -N1 -w node1 ARGS` as `user` with `env` (passed to the job).
fn srun_as(cluster: &Cluster, user: &str, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut command = Command::new("runuser");
    command.args(["-u", user, "--", "env"]);
    for (k, v) in env {
        command.arg(format!("{k}={v}"));
    }
    command
        .args(["timeout", "300", "srun", "-N1", "-w", NODE])
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

/// A shared base folder in which the test user has an enroot credentials
/// file with the token registry's password; the base, the password and the
/// user's folder.
fn own_enroot_credentials(cluster: &Cluster) -> (tempfile::TempDir, String, CredentialDir) {
    let base = shared_base();
    let password = cluster.var("BERTH_TEST_TOKEN_PASSWORD");
    let own = CredentialDir::new(
        base.path(),
        common::TEST_USER,
        ".credentials",
        &enroot_entry(cluster, &password),
    );
    (base, password, own)
}

fn enroot_entry(cluster: &Cluster, password: &str) -> String {
    // A machine without a port: it matches the registry and its token service.
    format!(
        "machine {} login {} password {password}\n",
        cluster.var("BERTH_TEST_BRIDGE_IP"),
        cluster.var("BERTH_TEST_TOKEN_USER")
    )
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Asserts that `run` is the clear refusal of a private image cached on the node.
fn assert_refused_as_private(run: Run, who: &str) {
    let run = run.failed();
    assert!(
        refused_on_the_node(&run.stderr),
        "{who}: not the private-image refusal:\n{}",
        run.stderr
    );
    assert!(
        !run.stdout.contains("uid="),
        "{who} ran the image: {}",
        run.stdout
    );
}

fn refused_on_the_node(stderr: &str) -> bool {
    stderr.contains("refused your credentials")
        && stderr.contains("cached on this node but private")
        && stderr.contains("add credentials")
}

/// A reference by tag is resolved at submission with the user's own
/// credentials (issue 6's pinning), so the refusal may come from srun before
/// any node is asked; either way it is clear and nothing runs.
fn assert_refused_by_tag(run: Run, who: &str) {
    let run = run.failed();
    let at_submission = run.stderr.contains("access denied to image")
        && run
            .stderr
            .contains("checked when the job was submitted, with your own registry credentials");
    assert!(
        at_submission || refused_on_the_node(&run.stderr),
        "{who}: not a clear refusal:\n{}",
        run.stderr
    );
    assert!(
        !run.stdout.contains("uid="),
        "{who} ran the image: {}",
        run.stdout
    );
}

/// Each user's own credentials decide, on the node where the image is
/// cached: enroot's file (through ENROOT_CONFIG_PATH) and docker's
/// config.json (through DOCKER_CONFIG) work; no credentials, wrong ones, and
/// another user's file (unreadable to this user, readable to root) are
/// refused with the clear message, by tag and by digest; a public image
/// works for everyone.
#[test]
fn private_images_follow_each_users_credentials() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let others = other_users(&cluster);
    let (two, three, four) = (&others[0], &others[1], &others[2]);
    let repository = format!("private/{}", unique("creds"));
    let (image, digest) = push_private(&cluster, "busybox:latest", &repository);
    let (base, password, own) = own_enroot_credentials(&cluster);
    let wrong = CredentialDir::new(
        base.path(),
        three,
        ".credentials",
        &enroot_entry(&cluster, "wrong-password"),
    );
    let auth = base64(format!("{}:{password}", cluster.var("BERTH_TEST_TOKEN_USER")).as_bytes());
    let docker = CredentialDir::new(
        base.path(),
        four,
        "config.json",
        &format!(
            r#"{{"auths": {{"{}": {{"auth": "{auth}"}}}}}}"#,
            cluster.var("BERTH_TEST_TOKEN_REGISTRY")
        ),
    );
    let option = format!("--container-image={image}");
    let pinned = format!(
        "--container-image={}@{digest}",
        image.trim_end_matches(":1")
    );

    let first = srun_as(
        &cluster,
        common::TEST_USER,
        &[("ENROOT_CONFIG_PATH", own.path())],
        &[&option, "id", "-u"],
    )
    .ok();
    assert_eq!(first.stdout.trim(), uid_of(common::TEST_USER).to_string());
    let with_docker = srun_as(
        &cluster,
        four,
        &[("DOCKER_CONFIG", docker.path())],
        &[&option, "id", "-u"],
    )
    .ok();
    assert_eq!(with_docker.stdout.trim(), uid_of(four).to_string());

    assert_refused_by_tag(
        srun_as(&cluster, two, &[], &[&option, "id", "-u"]),
        "no credentials, by tag",
    );
    assert_refused_as_private(
        srun_as(&cluster, two, &[], &[&pinned, "id", "-u"]),
        "no credentials, by digest",
    );
    assert_refused_by_tag(
        srun_as(
            &cluster,
            three,
            &[("ENROOT_CONFIG_PATH", wrong.path())],
            &[&option, "id", "-u"],
        ),
        "wrong credentials, by tag",
    );
    assert_refused_as_private(
        srun_as(
            &cluster,
            three,
            &[("ENROOT_CONFIG_PATH", wrong.path())],
            &[&pinned, "id", "-u"],
        ),
        "wrong credentials, by digest",
    );
    let borrowed = srun_as(
        &cluster,
        two,
        &[("ENROOT_CONFIG_PATH", own.path())],
        &[&pinned, "id", "-u"],
    );
    assert!(
        borrowed.stderr.contains("Permission denied"),
        "another user's credentials file was read for {two}:\n{}",
        borrowed.stderr
    );
    assert_refused_as_private(borrowed, "another user's credentials file");

    // The owner still gets it by digest (a HEAD with their credentials).
    srun_as(
        &cluster,
        common::TEST_USER,
        &[("ENROOT_CONFIG_PATH", own.path())],
        &[&pinned, "true"],
    )
    .ok();
    let public = format!(
        "--container-image={}/public/busybox:latest",
        cluster.var("BERTH_TEST_TOKEN_REGISTRY")
    );
    for user in [two.as_str(), three.as_str()] {
        srun_as(&cluster, user, &[], &[&public, "true"]).ok();
    }
}

/// Requests for `repository`'s manifests in the token registry's log.
fn manifest_requests(cluster: &Cluster, repository: &str) -> usize {
    let log = std::fs::read_to_string(cluster.var("BERTH_TEST_TOKEN_REGISTRY_LOG")).unwrap();
    let needle = format!("/v2/{repository}/manifests/");
    log.lines().filter(|l| l.contains(&needle)).count()
}

/// An allocation of every default node as the test user (with their
/// credentials in `credentials`), running `steps` steps of `image` with
/// `srun -v`; its stderr (the nodes' setup lines).
fn allocation_of_steps(cluster: &Cluster, credentials: &str, image: &str, steps: usize) -> String {
    let n = cluster.var("BERTH_TEST_DEFAULT_NODES");
    let script = vec![format!("srun -v -N{n} true"); steps].join(" && ");
    cluster
        .slurm_env(
            Submitter::User,
            "salloc",
            &[
                &format!("-N{n}"),
                &format!("--container-image={image}"),
                "sh",
                "-c",
                &script,
            ],
            &[("ENROOT_CONFIG_PATH", credentials)],
        )
        .ok()
        .stderr
}

/// A private image's access is asked of its registry once per node per
/// job: the job's later steps on a node that checked it start it with no
/// helper and no registry request (a root-only grant, gone at the job's
/// end), and the next job asks again. A public image pinned by digest
/// never needs the helper once a node has it.
#[test]
fn a_private_image_is_checked_once_per_node_per_job() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let n: usize = cluster.var("BERTH_TEST_DEFAULT_NODES").parse().unwrap();
    let repository = format!("private/{}", unique("grant"));
    let (image, digest) = push_private(&cluster, "busybox:latest", &repository);
    let (_base, _password, own) = own_enroot_credentials(&cluster);
    let pinned = format!("{}@{digest}", image.trim_end_matches(":1"));
    let from_store = |stderr: &str| {
        stderr
            .lines()
            .filter(|l| l.contains(&digest) && l.contains("in the node store"))
            .count()
    };

    // The first job pulls on every node.
    let pulled = allocation_of_steps(&cluster, own.path(), &pinned, 1);
    assert_eq!(from_store(&pulled), 0, "{pulled}");
    // A job of three steps: the first asks the registry on each node, the
    // other two start from the store.
    let before = manifest_requests(&cluster, &repository);
    let three = allocation_of_steps(&cluster, own.path(), &pinned, 3);
    let for_three = manifest_requests(&cluster, &repository) - before;
    assert_eq!(from_store(&three), 2 * n, "{three}");
    // The next job of one step asks again, as much as the job of three did.
    let before = manifest_requests(&cluster, &repository);
    let next = allocation_of_steps(&cluster, own.path(), &pinned, 1);
    let for_one = manifest_requests(&cluster, &repository) - before;
    assert_eq!(from_store(&next), 0, "the grant outlived its job:\n{next}");
    assert!(
        for_one >= n,
        "each node asks the registry: {for_one} requests"
    );
    assert_eq!(
        for_three, for_one,
        "a job of three steps asked the registry {for_three} times, one step {for_one}"
    );

    // A public image by digest: from the store on every node, every step.
    let busybox = cluster.image("busybox:latest");
    let public_digest = tool(
        "skopeo",
        &[
            "inspect",
            "--tls-verify=false",
            "--format",
            "{{.Digest}}",
            &format!("docker://{busybox}"),
        ],
    );
    let public = format!("{}@{}", busybox, public_digest.trim());
    allocation_of_steps(&cluster, own.path(), &public, 1);
    let again = allocation_of_steps(&cluster, own.path(), &public, 1);
    assert_eq!(
        again
            .lines()
            .filter(|l| l.contains("/busybox") && l.contains("in the node store"))
            .count(),
        n,
        "{again}"
    );
}

/// Token requests from the submit host (srun's resolution of a tag, not
/// the nodes') for `repository`, in the token server's log.
fn submission_token_requests(cluster: &Cluster, repository: &str) -> usize {
    let log = std::fs::read_to_string(
        Path::new(&cluster.var("BERTH_TEST_STATE_DIR")).join("token-server.log"),
    )
    .unwrap();
    let host = format!(" {} ", cluster.var("BERTH_TEST_BRIDGE_IP"));
    let scope = repository.replace('/', "%2F");
    log.lines()
        .filter(|l| l.contains(&host) && l.contains("GET /token") && l.contains(&scope))
        .count()
}

/// A user's sruns by tag reuse the bearer token their first one got from
/// the token service, kept in a file of theirs (mode 0600) until it
/// expires; a token that is not theirs alone is not used.
#[test]
fn submissions_reuse_the_users_registry_token() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let repository = format!("private/{}", unique("token"));
    let (image, _digest) = push_private(&cluster, "busybox:latest", &repository);
    let (_base, _password, own) = own_enroot_credentials(&cluster);
    let option = format!("--container-image={image}");
    let before = submission_token_requests(&cluster, &repository);
    for _ in 0..3 {
        srun_as(
            &cluster,
            common::TEST_USER,
            &[("ENROOT_CONFIG_PATH", own.path())],
            &[&option, "true"],
        )
        .ok();
    }
    assert_eq!(
        submission_token_requests(&cluster, &repository) - before,
        1,
        "three sruns by tag asked the token service more than once"
    );
    let home = nix::unistd::User::from_name(common::TEST_USER)
        .unwrap()
        .unwrap()
        .dir;
    let file = home.join(".cache/berth/registry-tokens.json");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.uid(), uid_of(common::TEST_USER));
    assert_eq!(meta.mode() & 0o777, 0o600, "{}", file.display());
    // Made readable to others, the file is not believed: a new token.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    srun_as(
        &cluster,
        common::TEST_USER,
        &[("ENROOT_CONFIG_PATH", own.path())],
        &[&option, "true"],
    )
    .ok();
    assert_eq!(submission_token_requests(&cluster, &repository) - before, 2);
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600, "replaced by a private file");
}

/// enroot's `password $(cmd)` form: the command runs as the job's user (it
/// reads a key only that user can read and records who ran it), once per
/// step, and the private image is pulled with its output.
#[test]
fn a_password_command_in_the_credentials_file_runs_as_the_user() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let repository = format!("private/{}", unique("cmd"));
    let (image, _digest) = push_private(&cluster, "busybox:latest", &repository);
    let base = shared_base();
    let user = common::TEST_USER;
    let dir = base.path().join(user);
    let password = cluster.var("BERTH_TEST_TOKEN_PASSWORD");
    let entry = format!(
        "machine {} login {} password $(id -u >> {dir}/ran-as; cat {dir}/key)\n",
        cluster.var("BERTH_TEST_BRIDGE_IP"),
        cluster.var("BERTH_TEST_TOKEN_USER"),
        dir = dir.display()
    );
    let own = CredentialDir::new(base.path(), user, ".credentials", &entry);
    let key = dir.join("key");
    std::fs::write(&key, format!("{password}\n")).unwrap();
    std::os::unix::fs::chown(&key, Some(uid_of(user)), None).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();

    let run = srun_as(
        &cluster,
        user,
        &[("ENROOT_CONFIG_PATH", own.path())],
        &[&format!("--container-image={image}"), "id", "-u"],
    )
    .ok();
    assert_eq!(run.stdout.trim(), uid_of(user).to_string());
    let ran_as = std::fs::read_to_string(dir.join("ran-as")).unwrap();
    assert!(
        !ran_as.is_empty() && ran_as.lines().all(|l| l == uid_of(user).to_string()),
        "the password command ran as {ran_as:?}, not only as {user}"
    );
    assert!(
        !run.stderr.contains(&password) && !run.stdout.contains(&password),
        "the password showed in srun's output"
    );
}

/// The inodes of the cluster's node network namespaces.
fn node_namespaces(cluster: &Cluster) -> HashSet<u64> {
    let name = cluster.var("BERTH_TEST_NAME");
    cluster
        .var("BERTH_TEST_NODE_NAMES")
        .split(',')
        .map(|node| {
            std::fs::metadata(format!("/var/run/netns/{name}-{node}"))
                .unwrap()
                .ino()
        })
        .collect()
}

/// Whether `pid` lives in one of the test cluster's node network namespaces
/// (slurmd, slurmstepd, the helpers and tasks all do).
fn in_cluster(pid: &str, namespaces: &HashSet<u64>) -> bool {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .ok()
        .and_then(|l| {
            l.to_string_lossy()
                .strip_prefix("net:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .is_some_and(|inode: u64| namespaces.contains(&inode))
}

/// What the process sampler saw.
#[derive(Default)]
struct Sightings {
    /// Processes whose command line or environment held the password.
    leaks: Vec<String>,
    /// (uid, command line) of every puller seen.
    pullers: Vec<(u32, String)>,
    /// (uid, command line) of every credentials helper seen.
    helpers: Vec<(u32, String)>,
    rounds: usize,
}

/// Reads every cluster process's command line and environment until `stop`.
fn sample(namespaces: &HashSet<u64>, secret: &[u8], stop: &AtomicBool, seen: &Mutex<Sightings>) {
    let has = |hay: &[u8]| hay.windows(secret.len()).any(|w| w == secret);
    while !stop.load(Ordering::Relaxed) {
        let mut round = Sightings::default();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let pid = entry.file_name().to_string_lossy().into_owned();
            if !pid.bytes().all(|b| b.is_ascii_digit()) || !in_cluster(&pid, namespaces) {
                continue;
            }
            // The owner first: a process gone in between is skipped, not
            // counted with a made-up uid.
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if has(&cmdline) || has(&environ) {
                round.leaks.push(format!("pid {pid}: {text}"));
            }
            let uid = meta.uid();
            if text.contains(" __pull") {
                round.pullers.push((uid, text));
            } else if text.contains(" __credentials ") {
                round.helpers.push((uid, text));
            }
        }
        let mut seen = seen.lock().unwrap();
        seen.leaks.extend(round.leaks);
        seen.pullers.extend(round.pullers);
        seen.helpers.extend(round.helpers);
        seen.rounds += 1;
    }
}

/// While a private image is pulled through srun, no process of the cluster
/// has the password in its command line or environment; the puller runs as
/// the pull user (its settings and the password on its stdin); the password is in no
/// log, in no srun output and not in the container's environment.
#[test]
fn credentials_never_show_and_the_puller_is_the_pull_user() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let repository = format!("private/{}", unique("sampled"));
    // debian: big enough that the pull lasts a while.
    let (image, _) = push_private(&cluster, "debian:bookworm", &repository);
    let (_base, password, own) = own_enroot_credentials(&cluster);
    let namespaces = node_namespaces(&cluster);
    let stop = AtomicBool::new(false);
    let seen = Mutex::new(Sightings::default());
    let run = std::thread::scope(|s| {
        s.spawn(|| sample(&namespaces, password.as_bytes(), &stop, &seen));
        let run = srun_as(
            &cluster,
            common::TEST_USER,
            &[("ENROOT_CONFIG_PATH", own.path())],
            &[&format!("--container-image={image}"), "env"],
        );
        stop.store(true, Ordering::Relaxed);
        run
    });
    let run = run.ok();
    let seen = seen.into_inner().unwrap();
    assert!(
        seen.leaks.is_empty(),
        "the password showed in: {:#?}",
        seen.leaks
    );
    assert!(
        !seen.pullers.is_empty(),
        "no puller seen in {} rounds of sampling",
        seen.rounds
    );
    for (uid, cmdline) in &seen.pullers {
        assert_eq!(*uid, pull_uid(), "the puller ran as uid {uid}: {cmdline}");
        // Everything else comes in the request on its stdin.
        assert!(cmdline.trim_end().ends_with(" __pull"), "{cmdline}");
    }
    for (uid, cmdline) in &seen.helpers {
        assert_eq!(
            *uid,
            uid_of(common::TEST_USER),
            "the credentials helper ran as {uid}: {cmdline}"
        );
    }
    assert!(
        run.stdout.contains("BERTH_PRIVATE="),
        "not the private image's env: {}",
        run.stdout
    );
    for (what, text) in [
        ("srun stdout (the container's env)", &run.stdout),
        ("srun stderr", &run.stderr),
    ] {
        assert!(!text.contains(&password), "the password is in {what}");
    }
    let logs = cluster.var("BERTH_TEST_LOG_DIR");
    for entry in std::fs::read_dir(&logs).unwrap().flatten() {
        let text = std::fs::read(entry.path()).unwrap_or_default();
        assert!(
            !text
                .windows(password.len())
                .any(|w| w == password.as_bytes()),
            "the password is in {}",
            entry.path().display()
        );
    }
}

/// The store on the node: its root (and named containers) root's, the
/// content areas the pull user's (but a mounted `image.sqfs`, sealed root's
/// and read-only), nothing writable by an ordinary user; a
/// pull by root's CLI into it also runs as the pull user.
#[test]
fn store_content_belongs_to_the_pull_user() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    // A new image, pulled through srun.
    let registry = cluster.registry();
    let repository = format!("berth-owned/{}", unique("img"));
    let (image, digest) = push_unique(&cluster, "busybox:latest", &registry, &repository, None);
    let option = format!("--container-image={image}");
    srun_as(&cluster, common::TEST_USER, &[], &[&option, "true"]).ok();
    let store =
        Path::new(&cluster.var("BERTH_TEST_STATE_DIR")).join(format!("nodes/{NODE}/berth-store"));
    let meta = std::fs::metadata(&store).unwrap();
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777),
        (0, 0o711),
        "{}",
        store.display()
    );
    for area in ["blobs", "blobs/sha256", "images", "tmp", "locks"] {
        let m = std::fs::metadata(store.join(area)).unwrap();
        assert_eq!(m.uid(), pull_uid(), "{area} is not the pull user's");
        assert_eq!(m.mode() & 0o777, 0o700, "{area} is open to others");
    }
    let image = store
        .join("images")
        .join(digest.trim_start_matches("sha256:"));
    let sqfs = image.join("image.sqfs");
    for path in [&image, &image.join("meta.json")] {
        assert_eq!(
            std::fs::metadata(path).unwrap().uid(),
            pull_uid(),
            "{}",
            path.display()
        );
    }
    // The image file itself was sealed when the step took it: root's and
    // read-only, so not even the pull user can change the mounted bytes
    // (tests/suite/security_store.rs).
    let sealed = std::fs::metadata(&sqfs).unwrap();
    assert_eq!(
        (sealed.uid(), sealed.gid(), sealed.mode() & 0o7777),
        (0, 0, 0o444),
        "{}",
        sqfs.display()
    );
    for target in [
        store.join("written"),
        store.join("images/written"),
        store.join("blobs/sha256/written"),
        store.join("locks/written"),
        store.join("tmp/written"),
        image.join("written"),
    ] {
        let out = output_of(
            Command::new("runuser")
                .args(["-u", common::TEST_USER, "--", "touch"])
                .arg(&target),
        );
        assert!(
            !out.status.success() && !target.exists(),
            "the user wrote {}",
            target.display()
        );
    }
    let out = output_of(
        Command::new("runuser")
            .args(["-u", common::TEST_USER, "--", "sh", "-c"])
            .arg(format!("echo x >> {}", sqfs.display())),
    );
    assert!(
        !out.status.success(),
        "the user wrote into {}",
        sqfs.display()
    );

    // Root's CLI pull into this store runs as the pull user: what it adds is the pull user's.
    let repository = format!("berth-root-cli/{}", unique("img"));
    let (image, _) = push_unique(&cluster, "busybox:latest", &registry, &repository, None);
    let berth = common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    let pulled = tool(
        berth.to_str().unwrap(),
        &[
            "pull",
            "--store",
            store.to_str().unwrap(),
            "--insecure-registry",
            &registry,
            "--progress",
            "none",
            &image,
        ],
    );
    let squashfs = pulled.split_whitespace().nth(1).expect("DIGEST PATH");
    assert_eq!(
        std::fs::metadata(squashfs).unwrap().uid(),
        pull_uid(),
        "{squashfs}"
    );
}

/// Nothing in the node store can be read by users, not even by the user
/// who pulled the image: no listing, no `meta.json`, no blob, no squashfs;
/// a store path given as `--container-image` is refused (as the user and
/// as root, also through a symlink); and a store left open by an older
/// berth (0755) is closed again by the next step.
#[test]
fn the_node_store_is_unreadable_by_users() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let others = other_users(&cluster);
    let repository = format!("private/{}", unique("unreadable"));
    let (image, digest) = push_private(&cluster, "busybox:latest", &repository);
    let (_base, _password, own) = own_enroot_credentials(&cluster);
    let store =
        Path::new(&cluster.var("BERTH_TEST_STATE_DIR")).join(format!("nodes/{NODE}/berth-store"));
    // An older berth's modes: the next step must close them.
    if store.is_dir() {
        for dir in [store.clone(), store.join("images"), store.join("blobs")] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let option = format!("--container-image={image}");
    let ran = srun_as(
        &cluster,
        common::TEST_USER,
        &[("ENROOT_CONFIG_PATH", own.path())],
        &[&option, "true"],
    );
    ran.ok();
    assert_eq!(
        std::fs::metadata(&store).unwrap().mode() & 0o777,
        0o711,
        "the store root was not tightened"
    );
    let hex = digest.trim_start_matches("sha256:");
    let folder = store.join("images").join(hex);
    let sqfs = folder.join("image.sqfs");
    let blob = std::fs::read_dir(store.join("blobs/sha256"))
        .unwrap()
        .next()
        .expect("a blob in the store")
        .unwrap()
        .path();
    for user in [common::TEST_USER, others[0].as_str()] {
        for (what, script) in [
            ("list the store", format!("ls {}", store.display())),
            ("list images/", format!("ls {}/images", store.display())),
            (
                "list blobs/",
                format!("ls {}/blobs/sha256", store.display()),
            ),
            (
                "read meta.json",
                format!("cat {}/meta.json", folder.display()),
            ),
            ("read the squashfs", format!("head -c4 {}", sqfs.display())),
            ("read a blob", format!("head -c4 {}", blob.display())),
        ] {
            let out = output_of(
                Command::new("runuser")
                    .args(["-u", user, "--", "sh", "-c"])
                    .arg(&script),
            );
            assert!(
                !out.status.success() && out.stdout.is_empty(),
                "{user} could {what}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
    // The CLI: root lists the store, a user is told it is not theirs.
    let berth = common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    let listed = tool(
        berth.to_str().unwrap(),
        &["images", "--store", store.to_str().unwrap()],
    );
    assert!(listed.contains(&hex[..12]), "{listed}");
    let out = output_of(
        Command::new("runuser")
            .args(["-u", common::TEST_USER, "--"])
            .arg(&berth)
            .args(["images", "--store", store.to_str().unwrap()]),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("is not yours") && out.stdout.is_empty(),
        "{stderr}"
    );
    let by_path = format!("--container-image={}", sqfs.display());
    for user in [common::TEST_USER, others[0].as_str()] {
        srun_as(&cluster, user, &[], &[&by_path, "true"])
            .failed_with("inside the node's image store", user);
    }
    // Root too, and through a link outside the store.
    let link = Path::new(&cluster.var("BERTH_TEST_WORKDIR")).join(unique("store-link"));
    std::os::unix::fs::symlink(&sqfs, &link).unwrap();
    let by_link = format!("--container-image={}", link.display());
    let refused = cluster
        .srun(Submitter::Root, &["-N1", "-w", NODE, &by_link, "true"])
        .failed();
    let _ = std::fs::remove_file(&link);
    assert!(
        refused.stderr.contains("inside the node's image store"),
        "{}",
        refused.stderr
    );
    // The image itself still runs for its user, from the closed store.
    let again = srun_as(
        &cluster,
        common::TEST_USER,
        &[("ENROOT_CONFIG_PATH", own.path())],
        &[&option, "id", "-u"],
    )
    .ok();
    assert_eq!(again.stdout.trim(), uid_of(common::TEST_USER).to_string());
}

/// A squashfs file given by path is mounted only if the job's user could
/// open it: a world-readable file inside another user's private folder is
/// refused (root opens it with the user's rights), the owner runs it, and
/// once the folder is opened up everyone does.
#[test]
fn a_squashfs_in_another_users_private_folder_is_refused() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let Some(owner) = other_users(&cluster).into_iter().next() else {
        eprintln!("skipped: no second test user");
        return;
    };
    // The squashfs of a stored image, copied into the owner's private folder.
    let busybox = cluster.image("busybox:latest");
    srun_as(
        &cluster,
        common::TEST_USER,
        &[],
        &[&format!("--container-image={busybox}"), "true"],
    )
    .ok();
    let store =
        Path::new(&cluster.var("BERTH_TEST_STATE_DIR")).join(format!("nodes/{NODE}/berth-store"));
    // busybox's own (other stored images may carry a configuration whose
    // PATH has no `true`).
    let stored = std::fs::read_dir(store.join("images"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|dir| {
            std::fs::read(dir.join("meta.json"))
                .ok()
                .and_then(|m| serde_json::from_slice::<serde_json::Value>(&m).ok())
                .is_some_and(|meta| meta["repository"] == "busybox")
                && dir.join("image.sqfs").is_file()
        })
        .map(|dir| dir.join("image.sqfs"))
        .expect("busybox's squashfs in the node store");
    let base = shared_base();
    let private = base.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let sqfs = private.join("image.sqfs");
    std::fs::copy(&stored, &sqfs).unwrap();
    let uid = uid_of(&owner);
    std::os::unix::fs::chown(&private, Some(uid), None).unwrap();
    std::os::unix::fs::chown(&sqfs, Some(uid), None).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&sqfs, std::fs::Permissions::from_mode(0o644)).unwrap();
    let option = format!("--container-image={}", sqfs.display());
    let run = srun_as(&cluster, common::TEST_USER, &[], &[&option, "true"]).failed();
    assert!(
        run.stderr.contains(&sqfs.display().to_string())
            && (run.stderr.contains("Permission denied") || run.stderr.contains("not readable by")),
        "{}",
        run.stderr
    );
    srun_as(&cluster, &owner, &[], &[&option, "true"]).ok();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
    srun_as(&cluster, common::TEST_USER, &[], &[&option, "true"]).ok();
    cluster.assert_nodes_healthy();
}

/// A containerized `sleep` of the test user on NODE, started by srun in the
/// background: its pid on the node, cancelled (and srun reaped) on drop.
struct BackgroundSleep {
    pid: String,
    job: String,
    slurm_conf: String,
    srun: std::process::Child,
}

impl BackgroundSleep {
    /// Starts `srun -N1 -w NODE --job-name=JOB ARGS sleep SECONDS` as the
    /// test user (SECONDS tells this sleep from others) and waits up to 60 s
    /// for the sleep to run.
    fn start(cluster: &Cluster, job: &str, args: &[&str], seconds: &str) -> BackgroundSleep {
        let srun = Command::new("runuser")
            .args(["-u", common::TEST_USER, "--", "timeout", "300", "srun"])
            .args(["-N1", "-w", NODE])
            .arg(format!("--job-name={job}"))
            .args(args)
            .args(["sleep", seconds])
            .current_dir(cluster.var("BERTH_TEST_WORKDIR"))
            .env("SLURM_CONF", cluster.var("SLURM_CONF"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut sleep = BackgroundSleep {
            pid: String::new(),
            job: job.to_string(),
            slurm_conf: cluster.var("SLURM_CONF"),
            srun,
        };
        let user = uid_of(common::TEST_USER);
        // This cluster's sleep only: another cluster may run this test too.
        let namespaces = node_namespaces(cluster);
        let find = || {
            std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
                let pid = e.file_name().to_string_lossy().into_owned();
                if !in_cluster(&pid, &namespaces) {
                    return None;
                }
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let uid = e.metadata().ok()?.uid();
                let words: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                let sleeping = words.len() >= 2
                    && words[0].ends_with(b"sleep")
                    && words[1] == seconds.as_bytes();
                (sleeping && uid == user).then_some(pid)
            })
        };
        let mut found = None;
        assert!(
            wait_for(Duration::from_secs(60), || {
                found = find();
                found.is_some()
            }),
            "the containerized sleep never started"
        );
        sleep.pid = found.unwrap();
        sleep
    }
}

impl Drop for BackgroundSleep {
    fn drop(&mut self) {
        let _ = Command::new("scancel")
            .args(["--name", &self.job])
            .env("SLURM_CONF", &self.slurm_conf)
            .status();
        let _ = self.srun.wait();
    }
}

/// Another user can neither signal, trace, nor look into a user's
/// containerized task, and the task lives on.
#[test]
fn other_users_cannot_touch_container_tasks() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let intruder = other_users(&cluster)[0].clone();
    let job = unique("berth-untouchable");
    let option = format!("--container-image={}", cluster.image("busybox:latest"));
    let sleep = BackgroundSleep::start(&cluster, &job, &[&option], "313");
    let pid = sleep.pid.clone();
    let as_intruder = |script: &str| {
        let out =
            output_of(Command::new("runuser").args(["-u", &intruder, "--", "sh", "-c", script]));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let kill = as_intruder(&format!("kill -9 {pid} && echo KILLED"));
    let stop = as_intruder(&format!("kill -STOP {pid} && echo STOPPED"));
    let environ = as_intruder(&format!("cat /proc/{pid}/environ && echo READ"));
    let root = as_intruder(&format!("ls /proc/{pid}/root/ && echo LISTED"));
    let ptrace = as_intruder(&format!(
        "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
         r = l.ptrace(16, {pid}, 0, 0); print(\"ptrace\", r, ctypes.get_errno())'"
    ));
    let alive = Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .contains("(stopped)");
    drop(sleep);
    assert!(
        kill.contains("Operation not permitted") && !kill.contains("KILLED"),
        "kill: {kill}"
    );
    assert!(!stop.contains("STOPPED"), "kill -STOP: {stop}");
    assert!(
        environ.contains("Permission denied") && !environ.contains("READ"),
        "environ: {environ}"
    );
    assert!(
        root.contains("Permission denied") && !root.contains("LISTED"),
        "root: {root}"
    );
    assert!(
        ptrace.contains("ptrace -1 1"),
        "ptrace attach (EPERM expected): {ptrace}"
    );
    assert!(alive, "the task did not survive the other user's attempts");
}

/// The container's user namespace denies `setgroups`: a process of the
/// user that joins it (`setns`, which needs nothing but being the user)
/// cannot drop a supplementary group to get past a "group may not
/// read" mode, with and without remap-root; the groups still count inside.
#[test]
fn the_user_namespace_denies_setgroups() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let gid = tool("getent", &["group", "berthgrp"])
        .split(':')
        .nth(2)
        .expect("berthgrp's gid")
        .to_string();
    let dir = tempfile::Builder::new()
        .prefix("berth-groups-")
        .tempdir_in(cluster.var("BERTH_TEST_WORKDIR"))
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("group-only");
    std::fs::write(&file, "for berthgrp\n").unwrap();
    std::os::unix::fs::chown(&file, Some(0), Some(gid.parse().unwrap())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let mounts = format!("--container-mounts={}:/group-only:ro", file.display());
    for remap in [false, true] {
        let job = unique("berth-setgroups");
        let mut args = vec![image.as_str(), mounts.as_str()];
        if remap {
            args.push("--container-remap-root");
        }
        // Inside: the group is there and lets the task read the file.
        let mut inside = args.clone();
        inside.extend(["sh", "-c", "id -G; cat /group-only"]);
        let ran = srun_as(&cluster, common::TEST_USER, &[], &inside).ok();
        assert!(
            ran.stdout.split_whitespace().any(|g| g == gid) && ran.stdout.contains("for berthgrp"),
            "remap {remap}: {}",
            ran.stdout
        );
        let sleep = BackgroundSleep::start(&cluster, &job, &args, "317");
        let pid = sleep.pid.clone();
        let join = |command: &str| {
            let out = output_of(
                Command::new("runuser")
                    .args(["-u", common::TEST_USER, "--"])
                    .args([
                        "nsenter",
                        "-t",
                        &pid,
                        "--user",
                        "--preserve-credentials",
                        "--",
                        "sh",
                        "-c",
                        command,
                    ]),
            );
            (
                out.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        };
        let (joined, groups) = join("id -G");
        // setns and setgroups in one process: an exec after setns would
        // lose the namespace's capabilities for a uid other than 0 inside.
        let out = output_of(
            Command::new("runuser")
                .args(["-u", common::TEST_USER, "--"])
                .args([
                    "python3",
                    "-c",
                    &format!(
                        "import ctypes, os\n\
                 libc = ctypes.CDLL(None, use_errno=True)\n\
                 fd = os.open('/proc/{pid}/ns/user', os.O_RDONLY)\n\
                 assert libc.setns(fd, 0x10000000) == 0, ctypes.get_errno()\n\
                 r = libc.setgroups(0, None)\n\
                 print('setgroups', r, ctypes.get_errno(), os.getgroups())\n\
                 print('DROPPED' if r == 0 else 'kept')\n"
                    ),
                ]),
        );
        let dropped =
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("DROPPED");
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        drop(sleep);
        assert!(
            joined && groups.split_whitespace().any(|g| g == gid),
            "remap {remap}: {groups}"
        );
        assert!(
            !dropped && output.contains("setgroups -1 1 ") && output.contains("kept"),
            "remap {remap}: a joined process dropped its groups: {output}"
        );
    }
}

/// A `--container-mounts` source in a folder the user cannot search gives
/// the same error whether or not it exists: root no longer looks at it
/// before the holder drops to the user.
#[test]
fn mount_errors_do_not_reveal_what_the_user_cannot_see() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("berth-root-only-")
        .tempdir_in(cluster.var("BERTH_TEST_WORKDIR"))
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.path().join("there"), "secret").unwrap();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let error_for = |name: &str| {
        let mounts = format!("--container-mounts={}:/x", dir.path().join(name).display());
        let run = srun_as(&cluster, common::TEST_USER, &[], &[&image, &mounts, "true"]).failed();
        let lines: Vec<String> = run
            .stderr
            .lines()
            .filter(|l| l.contains(name))
            .map(|l| l.replace(name, "NAME"))
            .map(|l| {
                l.split_once("error: ")
                    .map_or(l.clone(), |(_, e)| e.to_string())
            })
            .collect();
        assert!(
            !lines.is_empty(),
            "{name}: no error names the source:\n{}",
            run.stderr
        );
        lines
    };
    let existing = error_for("there");
    let missing = error_for("not-there");
    assert_eq!(
        existing, missing,
        "the errors tell an existing file from a missing one"
    );
}

/// `--container-name` with a FIFO as image (opened as root before) wedged
/// slurmstepd: now the path is opened as the user, non-blocking, and must
/// be a regular file; the step fails at once and the node stays up.
#[test]
fn a_fifo_as_image_fails_fast() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("berth-fifo-")
        .tempdir_in(cluster.var("BERTH_TEST_WORKDIR"))
        .unwrap();
    std::os::unix::fs::chown(dir.path(), Some(uid_of(common::TEST_USER)), None).unwrap();
    let fifo = dir.path().join("fifo");
    let made = output_of(
        Command::new("runuser")
            .args(["-u", common::TEST_USER, "--", "mkfifo"])
            .arg(&fifo),
    );
    assert!(made.status.success());
    let image = format!("--container-image={}", fifo.display());
    for named in [true, false] {
        let name = format!("--container-name={}", unique("fifo"));
        let mut args = vec![image.as_str(), "true"];
        if named {
            args.insert(0, &name);
        }
        let started = std::time::Instant::now();
        let run = srun_as(&cluster, common::TEST_USER, &[], &args).failed();
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "named {named}: took {:?}",
            started.elapsed()
        );
        assert!(
            run.stderr.contains("not a regular file"),
            "named {named}: {}",
            run.stderr
        );
    }
    cluster.assert_nodes_healthy();
}

/// `--max-image-size` and `max_image_size` in the config file stop an image
/// that expands beyond them, with an error naming the setting.
#[test]
fn bomb_limit_is_configurable() {
    let Some((cluster, _turn)) = cluster_alone() else {
        return;
    };
    let base = shared_base();
    let berth = common::world_readable_copy(Path::new(env!("CARGO_BIN_EXE_berth")));
    let registry = cluster.registry();
    let image = format!("{registry}/debian:bookworm");
    let pull = |store: &str, extra: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(&berth);
        c.args([
            "pull",
            "--progress",
            "none",
            "--insecure-registry",
            &registry,
            "--store",
        ])
        .arg(base.path().join(store))
        .args(extra)
        .arg(&image)
        .envs(env.iter().copied());
        let out = output_of(&mut c);
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let flag = pull("a", &["--max-image-size", "1M"], &[]).failed();
    assert!(
        flag.stderr.contains("decompression bomb") && flag.stderr.contains("max-image-size"),
        "{}",
        flag.stderr
    );
    let conf = base.path().join("berth.conf");
    std::fs::write(&conf, "max_image_size=2M\n").unwrap();

    pull("b", &[], &[("BERTH_CONFIG", conf.to_str().unwrap())]).failed_with("2.0 MiB", "");
    assert!(
        std::fs::read_dir(base.path().join("b/images"))
            .unwrap()
            .next()
            .is_none(),
        "a refused image was published"
    );
    // The same image fits the default limit.
    pull("c", &[], &[]).ok();
}
