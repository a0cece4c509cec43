//! The job shapes of production clusters, in containers on the real test
//! cluster: a job array on one image, heterogeneous steps with an image per
//! component, `srun --pty`, a requeued job, overlapping steps, and the flags
//! of the Azure NCCL job (`--exclusive`, `--cpu-bind=mask_cpu:...`,
//! `--mem=0`, `--cpus-per-task`).

use crate::common;

use std::time::Duration;

use common::{skopeo_copy, wait_for, Cluster, Submitter, BOTH};

/// A repository of this test run holding a copy of test image `source`.
fn fresh_copy(cluster: &Cluster, label: &str, source: &str) -> (String, String) {
    let repository = format!("shapes-{label}-{}", std::process::id());
    let image = cluster.image(&format!("{repository}:v1"));
    skopeo_copy(&cluster.image(source), &image);
    (repository, image)
}

/// A file name in the work dir (every node has it) for this test run.
fn work_file(cluster: &Cluster, name: &str) -> String {
    format!(
        "{}/shapes-{name}-{}",
        cluster.var("BERTH_TEST_WORKDIR"),
        std::process::id()
    )
}

/// `squeue` has no job `job` any more.
fn job_gone(cluster: &Cluster, job: &str) -> bool {
    let run = cluster.slurm(Submitter::Root, "squeue", &["-h", "-j", job]);
    run.stdout.trim().is_empty()
}

/// What each image prints for this, to tell them apart.
const WHICH: &str = "cat /etc/debian_version 2>/dev/null || echo busybox-image";

/// A job array of 20 tasks on one image: every task runs in it, and the
/// nodes fetch each blob once (not once per task).
#[test]
fn a_job_array_runs_every_task_in_one_image() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let (repository, image) = fresh_copy(&cluster, "array", "busybox:latest");
    let out = work_file(&cluster, "array");
    let submitted = cluster
        .slurm(
            Submitter::User,
            "sbatch",
            &[
                "--parsable",
                "--wait",
                "--array=0-19",
                "-N1",
                &format!("--container-image={image}"),
                &format!("--output={out}-%a"),
                "--wrap",
                &format!("echo task $SLURM_ARRAY_TASK_ID; {WHICH}"),
            ],
        )
        .ok();
    let job = submitted.stdout.trim().to_string();
    for task in 0..20 {
        let path = format!("{out}-{task}");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.contains(&format!("task {task}").as_str()) && lines.contains(&"busybox-image"),
            "array job {job} task {task} ({path}): {text}"
        );
    }
    let nodes: usize = cluster.var("BERTH_TEST_DEFAULT_NODES").parse().unwrap_or(2);
    // busybox: one layer and the config, per node at most (none when the
    // nodes hold busybox's blobs already).
    let gets = cluster.registry_blob_gets(&repository);
    assert!(
        gets <= 2 * nodes,
        "{gets} blob GETs for 20 array tasks on {nodes} nodes"
    );
}

/// `#SBATCH hetjob`: each component's step runs in its own image. One
/// `srun A : B` line with different images is refused (Slurm gives a SPANK
/// plugin one set of options per srun, so the last component's options
/// would silently apply to all).
#[test]
fn heterogeneous_components_run_each_in_their_image() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let busybox = format!("--container-image={}", cluster.image("busybox:latest"));
    let debian = format!("--container-image={}", cluster.image("debian:bookworm"));
    let debian_version = "12";
    // One srun line with two images: refused before anything is allocated,
    // with the way that works.
    for who in BOTH {
        let run = cluster
            .srun(who, &["-N1", &busybox, "true", ":", "-N1", &debian, "true"])
            .failed();
        assert!(
            run.stderr.contains("heterogeneous job") && run.stderr.contains("--het-group"),
            "{who:?}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("allocated"), "{who:?}: {}", run.stderr);
    }
    let out = work_file(&cluster, "hetjob");
    let script = work_file(&cluster, "hetjob.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n#SBATCH -N1 -n1 --output={out}\n#SBATCH hetjob\n#SBATCH -N1 -n1\n\
             srun --het-group=0 {busybox} sh -c '{WHICH}'\n\
             srun --het-group=1 {debian} sh -c '{WHICH}'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    cluster
        .slurm(Submitter::User, "sbatch", &["--wait", &script])
        .ok();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&script);
    let busybox_at = text.lines().position(|l| l == "busybox-image");
    let debian_at = text.lines().position(|l| l.starts_with(debian_version));
    assert!(
        busybox_at.is_some() && debian_at.is_some() && busybox_at < debian_at,
        "hetjob: {text}"
    );
}

/// `srun --pty` gives the container's shell a terminal (srun itself runs
/// under `script`, which gives it one).
#[test]
fn srun_pty_gives_the_container_a_terminal() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("busybox:latest");
    for user in ["root", common::TEST_USER] {
        let line = format!(
            "srun -N1 --pty --container-image={image} sh -c 'test -t 0 && test -t 1 && echo TTY-IN-CONTAINER; {WHICH}'"
        );
        let out = common::output_of(&mut cluster.command_as(
            user,
            "script",
            &["-qec", &line, "/dev/null"],
        ));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && text.contains("TTY-IN-CONTAINER")
                && text.contains("busybox-image"),
            "{user}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `scontrol requeue` of a running containerized batch job: the first run's
/// container goes away, the second run works, the nodes stay up.
#[test]
fn a_requeued_job_runs_again_in_its_image() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("busybox:latest");
    let out = work_file(&cluster, "requeue");
    // The script runs in the container: it reports through its output
    // file, which slurmstepd writes on the host.
    let script = format!(
        "echo run ${{SLURM_RESTART_COUNT:-0}}; {WHICH}; \
         if [ \"${{SLURM_RESTART_COUNT:-0}}\" = 0 ]; then sleep 300; fi"
    );
    let submitted = cluster
        .slurm(
            Submitter::User,
            "sbatch",
            &[
                "--parsable",
                "--requeue",
                "-N1",
                &format!("--container-image={image}"),
                "--open-mode=append",
                &format!("--output={out}"),
                "--wrap",
                &script,
            ],
        )
        .ok();
    let job = submitted.stdout.trim().to_string();
    assert!(
        wait_for(Duration::from_secs(200), || std::fs::read_to_string(&out)
            .is_ok_and(|t| t.contains("run 0\nbusybox-image\n"))),
        "job {job} never started"
    );
    cluster
        .slurm(Submitter::Root, "scontrol", &["requeue", &job])
        .ok();
    // A requeued job waits before it is eligible again; release it now.
    let ended = wait_for(Duration::from_secs(240), || {
        let _ = cluster.slurm(Submitter::Root, "scontrol", &["release", &job]);
        job_gone(&cluster, &job)
    });
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    assert!(ended, "requeued job {job} did not end: {text}");
    assert!(
        text.contains("run 0\nbusybox-image\n") && text.contains("run 1\nbusybox-image\n"),
        "job {job}: {text}"
    );
    cluster.assert_nodes_healthy();
}

/// Two `--overlap` steps of one allocation in containers on one node at
/// once, and the Azure job's flags on a step.
#[test]
fn overlapping_steps_and_the_azure_jobs_flags() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    // In the node's /tmp, which its containers share.
    let flag_of =
        |who: Submitter| format!("/tmp/berth-shapes-overlap-{who:?}-{}", std::process::id());
    // --cpu-bind needs a task plugin that binds (not task/none).
    let conf = std::fs::read_to_string(cluster.var("SLURM_CONF")).unwrap_or_default();
    let binds = conf
        .lines()
        .any(|l| l.starts_with("TaskPlugin") && (l.contains("affinity") || l.contains("cgroup")));
    let cpu_bind = if binds {
        "--cpu-bind=mask_cpu:0x1,0x2"
    } else {
        ""
    };
    for who in BOTH {
        let flag = flag_of(who);
        let script = format!(
            "srun --overlap -n1 {image} sh -c 'while [ ! -e {flag} ]; do sleep 0.2; done; echo first-done' &\n\
             srun --overlap -n1 {image} sh -c 'echo second-ran; touch {flag}'\n\
             wait\n\
             rm -f {flag}\n\
             srun -n2 --exclusive {cpu_bind} --mem=0 --cpus-per-task=1 {image} \
             sh -c 'echo azure-task $SLURM_PROCID'\n"
        );
        let run = cluster
            .slurm(who, "salloc", &["-N1", "-n2", "sh", "-c", &script])
            .ok();
        for expected in ["second-ran", "first-done", "azure-task 0", "azure-task 1"] {
            assert!(
                run.stdout.lines().any(|l| l == expected),
                "{who:?}: no {expected}: {}\n{}",
                run.stdout,
                run.stderr
            );
        }
    }
    cluster.assert_nodes_healthy();
}
