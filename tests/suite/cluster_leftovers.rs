//! After steps end (normally, with an error, or cancelled), nothing berth made
//! is left on the nodes: no mount, no loop device, no helper process.
//! tests/run.sh runs this binary alone, after the others, so that no other
//! container is alive while it looks.

use crate::common;

use std::time::Duration;

use common::{berth_leftovers, wait_for, Cluster, Submitter};

#[test]
fn nothing_is_left_after_steps_end() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("busybox:latest");
    let image_opt = format!("--container-image={image}");
    // A normal step, a failing command, a step whose setup fails.
    cluster
        .srun(Submitter::User, &["-N2", &image_opt, "true"])
        .ok();
    cluster
        .srun(Submitter::User, &["-N2", &image_opt, "false"])
        .failed();
    cluster
        .srun(
            Submitter::User,
            &[&image_opt, "--container-workdir=/does/not/exist", "true"],
        )
        .failed();
    // A cancelled step: a long sleep, cancelled once it runs.
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let out = format!("{work}/leftover-{}.out", std::process::id());
    let submitted = cluster
        .slurm(
            Submitter::User,
            "sbatch",
            &[
                "--parsable",
                "-N2",
                &format!("--output={out}"),
                "--wrap",
                &format!("srun -N2 {image_opt} sh -c 'echo task-started; exec sleep 300'"),
            ],
        )
        .ok();
    let job = submitted.stdout.trim().to_string();
    assert!(
        wait_for(Duration::from_secs(60), || cluster
            .slurm(
                Submitter::Root,
                "squeue",
                &["-h", "-s", "-j", &job, "-o", "%i"]
            )
            .stdout
            .lines()
            .any(|l| l.trim().ends_with(".0"))),
        "step of job {job} never started"
    );
    // Both tasks run in their containers, so each node holds its image (a
    // step listed by squeue may still be setting its container up).
    assert!(
        wait_for(Duration::from_secs(60), || std::fs::read_to_string(&out)
            .unwrap_or_default()
            .matches("task-started")
            .count()
            == 2),
        "the tasks of job {job} never started"
    );
    // While the step runs, the detector sees its container (so it can fail).
    assert!(
        wait_for(Duration::from_secs(30), || !berth_leftovers().is_empty()),
        "no container of job {job} visible while its step runs"
    );
    // The running step holds its image: `berth rmi` on that node refuses it.
    let state = cluster.var("BERTH_TEST_STATE_DIR");
    let berth = format!("{state}/prefix/bin/berth");
    let node_store = format!("{state}/nodes/node1/berth-store");
    let rmi = std::process::Command::new(&berth)
        .args(["rmi", "--store", &node_store, &image])
        .output()
        .unwrap();
    assert!(
        !rmi.status.success(),
        "rmi removed an image a running step uses"
    );
    assert!(
        String::from_utf8_lossy(&rmi.stderr).contains("in use")
            || String::from_utf8_lossy(&rmi.stdout).contains("in use"),
        "{}",
        String::from_utf8_lossy(&rmi.stderr)
    );
    cluster.slurm(Submitter::Root, "scancel", &[&job]).ok();
    assert!(
        wait_for(Duration::from_secs(60), || cluster
            .slurm(Submitter::Root, "squeue", &["-h", "-j", &job])
            .stdout
            .trim()
            .is_empty()),
        "job {job} did not end after scancel"
    );
    let clean = wait_for(Duration::from_secs(30), || berth_leftovers().is_empty());
    assert!(clean, "left behind:\n{}", berth_leftovers().join("\n"));
    cluster.assert_nodes_healthy();
    // Once the step is gone, the image can be removed (and is pulled again next time).
    let rmi = std::process::Command::new(&berth)
        .args(["rmi", "--store", &node_store, &image])
        .output()
        .unwrap();
    assert!(
        rmi.status.success(),
        "{}",
        String::from_utf8_lossy(&rmi.stderr)
    );
    cluster
        .srun(Submitter::User, &["-w", "node1", &image_opt, "true"])
        .ok();
}
