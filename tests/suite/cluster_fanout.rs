//! Fan-out (`fanout=sbcast`) on the real cluster's `wide` partition (four
//! nodes; tests/run.sh turns it on with `fanout_dir=/tmp/berth-fanout`,
//! `fanout_wait=60`, `fanout_intent_wait=5`): one registry pull per step, a
//! tampered or forged fan-out file ends in the node's own pull, a first
//! node that had the image lets the others pull at once, and the job's
//! fan-out files are gone after the job.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{output_of, tool, wait_for, Cluster, Submitter, BOTH, TEST_USER};

const NODES: [&str; 4] = ["node1", "node2", "node3", "node4"];

/// Pushes an image no node has seen into a repository of its own: busybox
/// with `BERTH_FANOUT=<unique>` in its config. Returns the reference and
/// the unique value.
fn unique_image(cluster: &Cluster, name: &str) -> (String, String, String) {
    let registry = cluster.registry();
    let unique = format!(
        "{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let repository = format!("berth-fanout/{name}");
    let image = format!("{registry}/{repository}:{}", std::process::id());
    common::push_with_env(
        &format!("{registry}/busybox:latest"),
        &format!("BERTH_FANOUT={unique}"),
        &image,
        None,
    );
    (image, repository, unique)
}

/// GETs per blob of `repository` in the registry log.
fn blob_gets(cluster: &Cluster, repository: &str) -> BTreeMap<String, usize> {
    let log = std::fs::read_to_string(cluster.var("BERTH_TEST_REGISTRY_LOG")).unwrap_or_default();
    let needle = format!("\"GET /v2/{repository}/blobs/");
    let mut counts = BTreeMap::new();
    for line in log.lines() {
        let Some(at) = line.find(&needle) else {
            continue;
        };
        let rest = &line[at + needle.len()..];
        let blob = rest
            .split([' ', '?'])
            .next()
            .unwrap_or_default()
            .to_string();
        *counts.entry(blob).or_insert(0) += 1;
    }
    counts
}

/// A node's fan-out folder as job `job` sees it, where `sbcast` writes: the
/// node's `/tmp` (`STATE/nodes/NODE/tmp`), or on the GPU site the job's
/// private `/tmp` of `job_container/tmpfs`, which the fan-out helper enters
/// ([`job_tmp`]).
fn fanout_dir(cluster: &Cluster, node: &str, job: &str) -> PathBuf {
    let node_dir = PathBuf::from(cluster.var("BERTH_TEST_STATE_DIR"))
        .join("nodes")
        .join(node);
    let tmp = if cluster.var("BERTH_TEST_SITE") == "gpu" {
        job_tmp(&node_dir.join("job-containers"), job)
    } else {
        node_dir.join("tmp")
    };
    tmp.join("berth-fanout")
}

/// The folder Slurm binds on the job's `/tmp`, under the node's `BasePath`:
/// `BasePath/JOB/.JOB` on 22.05 (whose multiple-slurmd build adds the node
/// name to `BasePath`), its `_tmp` from 23.02 on. A path that does not exist
/// when the job has no namespace (yet, or any more).
fn job_tmp(base: &std::path::Path, job: &str) -> PathBuf {
    let node_base = std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join(job).is_dir())
        .unwrap_or_else(|| base.to_path_buf());
    let bound = node_base.join(format!("{job}/.{job}"));
    if bound.join("_tmp").is_dir() || !bound.is_dir() {
        bound.join("_tmp")
    } else {
        bound
    }
}

/// The task lines `NODE VALUE` of a four-node step, checked: every node ran
/// the image with this unique value.
fn assert_every_node_ran(output: &str, unique: &str) {
    for node in NODES {
        assert!(
            output
                .lines()
                .any(|l| l.trim() == format!("{node} {unique}")),
            "{node} did not run the image:\n{output}"
        );
    }
}

/// The job's fan-out folders are gone on every node once it ended (epilog).
fn assert_job_files_removed(cluster: &Cluster, job: &str) {
    let gone = wait_for(Duration::from_secs(20), || {
        NODES.iter().all(|n| {
            !fanout_dir(cluster, n, job)
                .join(format!("job-{job}"))
                .exists()
        })
    });
    assert!(gone, "fan-out files of job {job} left behind");
}

const TASK: &str =
    "echo $(hostname) $BERTH_FANOUT; [ $SLURM_NODEID = 0 ] && echo job=$SLURM_JOB_ID; true";

/// A new image on four nodes, as the test user and as root: the registry
/// serves each blob once, the three other nodes get the squashfs from the
/// first, all run it.
#[test]
fn four_nodes_one_registry_pull() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    for who in BOTH {
        one_pull_for(&cluster, who);
    }
}

fn one_pull_for(cluster: &Cluster, who: Submitter) {
    let name = format!("once-{}", format!("{who:?}").to_lowercase());
    let (image, repository, unique) = unique_image(cluster, &name);
    let run = cluster
        .srun(
            who,
            &[
                "-p",
                "wide",
                "-N4",
                &format!("--container-image={image}"),
                "sh",
                "-c",
                TASK,
            ],
        )
        .ok();
    assert_every_node_ran(&run.stdout, &unique);
    let gets = blob_gets(cluster, &repository);
    assert!(!gets.is_empty(), "no blob requests logged for {repository}");
    for (blob, count) in &gets {
        assert_eq!(
            *count, 1,
            "blob {blob} fetched {count} times: {gets:?}\n{}",
            run.stderr
        );
    }
    for node in &NODES[1..] {
        assert!(
            received(&run.stderr, node, &image),
            "{node} did not receive the image:\n{}",
            run.stderr
        );
    }
    let job = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("job="))
        .expect("job id")
        .to_string();
    assert_job_files_removed(cluster, &job);
}

/// A fan-out squashfs the user swapped (node3) and a statement signed by
/// the user instead of root (node4): those nodes say so and pull from the
/// registry; the step still runs everywhere.
#[test]
fn tampered_fanout_files_fall_back_to_the_registry() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let (image, repository, unique) = unique_image(&cluster, "tampered");
    // An allocation first, so the job's folders can be prepared before the step.
    let allocated = cluster
        .slurm(
            Submitter::User,
            "salloc",
            &["--no-shell", "-p", "wide", "-N4"],
        )
        .ok();
    let job = allocated
        .stderr
        .split_whitespace()
        .skip_while(|w| *w != "allocation")
        .nth(1)
        .unwrap_or_else(|| panic!("no job id from salloc: {}", allocated.stderr))
        .to_string();
    let uid = tool("id", &["-u", TEST_USER]);
    let gid = tool("id", &["-g", TEST_USER]);
    let owned = |path: &std::path::Path| {
        tool("chown", &[&format!("{uid}:{gid}"), path.to_str().unwrap()]);
    };
    // What the user could do on those nodes before the first node sends
    // (on the GPU site in the job's /tmp, which the allocation made:
    // PrologFlags=Contain).
    for node in ["node3", "node4"] {
        assert!(
            wait_for(Duration::from_secs(10), || fanout_dir(&cluster, node, &job)
                .parent()
                .unwrap()
                .is_dir()),
            "the job's /tmp is missing on {node}"
        );
        let parent = fanout_dir(&cluster, node, &job);
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = parent.join(format!("job-{job}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        owned(&dir);
    }
    let swapped = fanout_dir(&cluster, "node3", &job).join(format!("job-{job}/0.sqfs"));
    std::fs::write(&swapped, b"hsqs not the image").unwrap();
    owned(&swapped);
    let forged_credential = {
        let out = output_of(
            Command::new("runuser")
                .args(["-u", TEST_USER, "--", "munge", "-s"])
                .arg("berth-fanout-1 node4 forged"),
        );
        assert!(out.status.success(), "munge as the user failed");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let forged = fanout_dir(&cluster, "node4", &job).join(format!("job-{job}/0.statement"));
    std::fs::write(
        &forged,
        serde_json::json!({"statement": "{}", "credentials": {"3": forged_credential}}).to_string(),
    )
    .unwrap();
    owned(&forged);
    let run = cluster.srun(
        Submitter::User,
        &[
            "--jobid",
            &job,
            "-N4",
            &format!("--container-image={image}"),
            "sh",
            "-c",
            TASK,
        ],
    );
    cluster.slurm(Submitter::Root, "scancel", &[&job]).ok();
    let run = run.ok();
    let text = format!("{}\n{}", run.stdout, run.stderr);
    assert_every_node_ran(&text, &unique);
    assert!(
        text.contains("node3: fan-out: ")
            && text.contains("bytes, node1 announced")
            && text.contains(&format!("pulling {image}@sha256:")),
        "node3 did not refuse the swapped squashfs:\n{text}"
    );
    assert!(
        text.contains("node4: fan-out: the statement's credential was made by uid"),
        "node4 did not refuse the forged statement:\n{text}"
    );
    assert!(
        received(&text, "node2", &image),
        "node2 did not receive the image:\n{text}"
    );
    // node1 pulled, node3 and node4 pulled again: three of every blob
    // this image does not share with busybox (its config), and no more.
    let gets = blob_gets(&cluster, &repository);
    assert_eq!(gets.values().max(), Some(&3), "{gets:?}\n{text}");
    assert_job_files_removed(&cluster, &job);
}

/// Whether srun's output says that `node` received `image` (pinned to its
/// digest at submission) from the step's first node.
fn received(output: &str, node: &str, image: &str) -> bool {
    let prefix = format!("berth: {node}: {image}@sha256:");
    output
        .lines()
        .any(|l| l.starts_with(&prefix) && l.contains(": received from the step's first node"))
}

/// The first node has the image, the others do not: it sends no intent,
/// and they pull themselves after `fanout_intent_wait` (5 s), far below
/// `fanout_wait` (60 s).
#[test]
fn first_node_with_the_image_lets_others_pull_at_once() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let (image, _, unique) = unique_image(&cluster, "cached");
    let option = format!("--container-image={image}");
    cluster
        .srun(
            Submitter::User,
            &["-p", "wide", "-w", "node1", "-N1", &option, "true"],
        )
        .ok();
    let started = Instant::now();
    let run = cluster
        .srun(
            Submitter::User,
            &[
                "-p",
                "wide",
                "-N4",
                "-w",
                "node[1-4]",
                &option,
                "sh",
                "-c",
                TASK,
            ],
        )
        .ok();
    assert_every_node_ran(&run.stdout, &unique);
    assert!(
        run.stderr.contains("did not say within 5 s"),
        "{}",
        run.stderr
    );
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the step waited {:?}",
        started.elapsed()
    );
}
