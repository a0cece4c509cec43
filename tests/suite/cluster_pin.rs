//! Tag -> digest once, at submission, on the real cluster: a tag re-pushed
//! between submission and step start does not change what the nodes run,
//! and `srun -v` shows the digest (from srun and from every node).

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{output_of, skopeo_copy, Cluster, Submitter, BOTH};

/// The digest a tag names now (`skopeo inspect`).
fn tag_digest(image: &str) -> String {
    let mut c = Command::new("skopeo");
    c.args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"])
        .arg(format!("docker://{image}"));
    let out = output_of(&mut c);
    assert!(out.status.success(), "skopeo inspect {image}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository of this test run whose tag `v1` points at `source` (a test
/// image; digest returned); a re-push later points it at debian.
fn fresh_tag(cluster: &Cluster, label: &str, source: &str) -> (String, String) {
    let image = cluster.image(&format!("pin-{label}-{}:v1", std::process::id()));
    skopeo_copy(&cluster.image(source), &image);
    let digest = tag_digest(&image);
    (image, digest)
}

/// What each image prints for `cat /etc/debian_version || echo busybox`.
const WHICH: &str = "cat /etc/debian_version 2>/dev/null || echo busybox-image";

/// Nodes of the default partition (where a plain srun lands).
fn nodes(cluster: &Cluster) -> usize {
    cluster
        .var("BERTH_TEST_DEFAULT_NODES")
        .parse()
        .unwrap_or_else(|_| cluster.var("BERTH_TEST_NODE_NAMES").split(',').count())
}

/// Asserts every setup line of the nodes (`srun -v`) names `digest` and
/// none names `other`; returns how many nodes reported.
fn assert_nodes_ran(stderr: &str, digest: &str, other: &str) -> usize {
    let setup: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("berth: node") && l.contains(" lookup "))
        .collect();
    for line in &setup {
        assert!(line.contains(digest), "{line}\n--- all:\n{stderr}");
    }
    assert!(
        !stderr.contains(other),
        "the re-pushed digest appears:\n{stderr}"
    );
    setup.len()
}

/// srun, as root and as the user (root's srun resolves without the user's
/// credentials path): the tag is resolved before the job waits for its
/// start time; a re-push meanwhile changes nothing; `srun -v` names the
/// digest.
#[test]
fn srun_runs_the_digest_of_submission() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    for who in BOTH {
        srun_runs_the_digest_of_submission_as(&cluster, who);
    }
}

fn srun_runs_the_digest_of_submission_as(cluster: &Cluster, who: Submitter) {
    let label = format!("srun-{who:?}").to_lowercase();
    let job_name = format!("berth-pin-{label}");
    let (image, first) = fresh_tag(cluster, &label, "busybox:latest");
    let n = nodes(cluster).to_string();
    let option = format!("--container-image={image}");
    let run = std::thread::scope(|s| {
        let job = s.spawn(|| {
            cluster.srun(
                who,
                &[
                    "-v",
                    "-N",
                    &n,
                    "--begin=now+4",
                    "-J",
                    &job_name,
                    &option,
                    "sh",
                    "-c",
                    WHICH,
                ],
            )
        });
        assert!(
            common::wait_for(Duration::from_secs(20), || cluster.job_exists(&job_name)),
            "the job was not submitted"
        );
        skopeo_copy(&cluster.image("debian:bookworm"), &image);
        job.join().unwrap()
    })
    .ok();
    let second = tag_digest(&image);
    assert_ne!(first, second, "the re-push changed the tag");
    assert!(
        run.stderr
            .contains(&format!("srun: berth: {image} resolved to {first}")),
        "{}",
        run.stderr
    );
    let outputs: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(outputs.len(), nodes(cluster), "{who:?}: {}", run.stdout);
    assert!(
        outputs.iter().all(|l| *l == "busybox-image"),
        "{}",
        run.stdout
    );
    assert_eq!(
        assert_nodes_ran(&run.stderr, &first, &second),
        nodes(cluster)
    );
    // A later job asks again and runs the new digest.
    let again = cluster.srun(who, &["-N1", &option, "sh", "-c", WHICH]).ok();
    assert_ne!(
        again.stdout.trim(),
        "busybox-image",
        "{who:?}: {}",
        again.stdout
    );
}

/// sbatch, as root and as the user: the digest resolved at sbatch time is
/// what the batch step runs (a held job: re-pushed, then released).
#[test]
fn sbatch_runs_the_digest_of_submission() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    for who in BOTH {
        sbatch_runs_the_digest_of_submission_as(&cluster, who);
    }
}

fn sbatch_runs_the_digest_of_submission_as(cluster: &Cluster, who: Submitter) {
    let label = format!("sbatch-{who:?}").to_lowercase();
    let (image, first) = fresh_tag(cluster, &label, "busybox:latest");
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let out = format!("{work}/pin-{label}-{}.out", std::process::id());
    let _ = std::fs::remove_file(&out);
    let submitted = cluster
        .slurm(
            who,
            "sbatch",
            &[
                "--parsable",
                "--hold",
                "-N1",
                &format!("--container-image={image}"),
                "-o",
                &out,
                "--wrap",
                WHICH,
            ],
        )
        .ok();
    let job = submitted.stdout.trim().to_string();
    skopeo_copy(&cluster.image("debian:bookworm"), &image);
    assert_ne!(first, tag_digest(&image));
    cluster
        .slurm(Submitter::Root, "scontrol", &["release", &job])
        .ok();
    let done = common::wait_for(Duration::from_secs(120), || {
        let q = cluster.slurm(Submitter::Root, "squeue", &["-h", "-j", &job]);
        q.stdout.trim().is_empty()
    });
    assert!(done, "job {job} did not end");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(text.trim(), "busybox-image", "{who:?}: {text}");
}

/// salloc: the steps of an allocation run the digest resolved when it was
/// requested (re-pushed while it waits for its start time), and `srun -v`
/// inside says so; a step naming its own image resolves that one itself.
#[test]
fn allocation_steps_run_the_digest_of_submission() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let (image, first) = fresh_tag(&cluster, "salloc", "busybox:latest");
    let (own_image, own_digest) = fresh_tag(&cluster, "salloc-own", "busybox:v2s2");
    let n = nodes(&cluster);
    let script =
        format!("srun -v -N{n} sh -c '{WHICH}' && srun -v -N1 --container-image={own_image} true");
    let run = std::thread::scope(|s| {
        let job = s.spawn(|| {
            cluster.slurm(
                Submitter::User,
                "salloc",
                &[
                    &format!("-N{n}"),
                    "--begin=now+4",
                    "-J",
                    "berth-pin-salloc",
                    &format!("--container-image={image}"),
                    "sh",
                    "-c",
                    &script,
                ],
            )
        });
        assert!(
            common::wait_for(Duration::from_secs(20), || cluster
                .job_exists("berth-pin-salloc")),
            "the allocation was not requested"
        );
        skopeo_copy(&cluster.image("debian:bookworm"), &image);
        job.join().unwrap()
    })
    .ok();
    let second = tag_digest(&image);
    assert_ne!(first, second);
    let outputs: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(outputs.len(), n, "{}", run.stdout);
    assert!(
        outputs.iter().all(|l| *l == "busybox-image"),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains(&format!(
            "srun: berth: {image} resolved to {first} (pinned when the job was submitted)"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(&format!(
            "srun: berth: {own_image} resolved to {own_digest}"
        )),
        "{}",
        run.stderr
    );
    let setup_first = run
        .stderr
        .lines()
        .filter(|l| l.contains(" lookup ") && l.contains(&first))
        .count();
    assert_eq!(setup_first, n, "{}", run.stderr);
    assert!(!run.stderr.contains(&second), "{}", run.stderr);
}

/// Default output stays quiet: no digest line, no timings without `-v`; an
/// image the registry does not have fails before anything is allocated.
#[test]
fn quiet_by_default_and_missing_images_fail_at_submission() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let busybox = cluster.image("busybox:latest");
    let run = cluster
        .srun(
            Submitter::User,
            &[
                "-N1",
                &format!("--container-image={busybox}"),
                "sh",
                "-c",
                "echo $SLURM_JOB_ID $SLURMD_NODENAME",
            ],
        )
        .ok();
    assert!(!run.stderr.contains("resolved to"), "{}", run.stderr);
    assert!(!run.stderr.contains(" lookup "), "{}", run.stderr);
    // slurmd's log has one line per step with the digest and where the
    // setup time went, and the first task's join.
    let (job, node) = run.stdout.trim().split_once(' ').expect("job id and node");
    let log_path = format!("{}/slurmd-{node}.log", cluster.var("BERTH_TEST_LOG_DIR"));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let digest = tag_digest(&busybox);
    let setup: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("berth: job {job} step 0: container for image")))
        .collect();
    assert_eq!(setup.len(), 1, "{log_path}:\n{}", setup.join("\n"));
    for part in [digest.as_str(), "(lookup ", ", mount ", " ms) in "] {
        assert!(setup[0].contains(part), "no '{part}' in {}", setup[0]);
    }
    // The helper's pull, or slurmstepd's own lookup of a stored public image.
    assert!(
        setup[0].contains(" ms, pull ") || setup[0].contains(" ms in the node store, mount "),
        "{}",
        setup[0]
    );
    // 22.05 joins in task_init; 23.11+ prepares the exec step there.
    assert!(
        log.contains(&format!(
            "berth: job {job} step 0: first task joined the container in "
        )) || log.contains(&format!(
            "berth: job {job} step 0: first task prepared to enter the container in "
        )),
        "{log_path} has no join line for job {job}"
    );
    let missing = cluster.image(&format!("no-such-image-{}:v1", std::process::id()));
    let run = cluster
        .srun(
            Submitter::User,
            &[
                "-N1",
                "-J",
                "berth-pin-missing",
                &format!("--container-image={missing}"),
                "true",
            ],
        )
        .failed();
    assert!(
        run.stderr.contains("not found in registry")
            && run.stderr.contains("checked when the job was submitted"),
        "{}",
        run.stderr
    );
    assert!(
        !cluster.job_exists("berth-pin-missing"),
        "nothing allocated"
    );
}
