//! GPUs through Slurm on the GPU-site variant of the test cluster
//! (`BERTH_TEST_SITE=gpu`, tests/harness/cluster.sh): proctrack/cgroup,
//! task/cgroup with ConstrainDevices=yes, two fake GPUs per node as GRES.
//! Opening a fake GPU the devices cgroup allows gives ENXIO ("No such device
//! or address"), one it denies EPERM ("Operation not permitted"): the tests
//! tell who decides. On the plain cluster they say so and pass.

mod common;

use std::collections::BTreeSet;

use common::{Cluster, Submitter, BOTH};

const ALLOWED: &str = "No_such_device_or_address";
const DENIED: &str = "Operation_not_permitted";

/// The GPU-site cluster, or `None` (with a printed reason).
fn gpu_cluster() -> Option<Cluster> {
    let cluster = Cluster::get()?;
    if cluster.var("BERTH_TEST_SITE") != "gpu" {
        eprintln!("skipped: the test cluster is not the GPU site (BERTH_TEST_SITE=gpu)");
        return None;
    }
    Some(cluster)
}

macro_rules! gpu_cluster_or_skip {
    () => {
        match gpu_cluster() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// Prints one line per task: the GPUs Slurm gave, the `nvidiaN` in `/dev`,
/// and the error of opening each of the node's two GPUs at `DIR/nvidiaN`
/// (`openN=Error_text`), as `key=value` words.
fn probe(dir: &str) -> String {
    format!(
        "r=\"host=$(hostname) task=$SLURM_PROCID step_gpus=${{SLURM_STEP_GPUS:-none}} \
         dev=$(ls /dev | grep '^nvidia[0-9]' | tr '\\n' ,)\"; \
         for n in 0 1; do \
         r=\"$r open$n=$( (exec 3<{dir}/nvidia$n) 2>&1 | sed 's/.*: //' | tr ' ' _)\"; done; \
         echo \"$r\""
    )
}

/// The `key=value` words of each task's probe line.
fn probes(stdout: &str) -> Vec<std::collections::HashMap<String, String>> {
    stdout
        .lines()
        .filter(|l| l.starts_with("host="))
        .map(|line| {
            line.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn indices(list: &str) -> BTreeSet<u32> {
    list.split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

/// `--gres=gpu:1` and `--gpus-per-node=2`: the container's `/dev` has exactly
/// the step's GPUs, the cgroup lets it open them and no other, also a GPU
/// bound in by hand (`--container-mounts` of the node's device folder); a
/// step without GPUs sees none and may open none. Bare steps the same.
#[test]
fn containers_get_exactly_the_steps_gpus_and_the_cgroup_denies_the_rest() {
    let cluster = gpu_cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let gpu_dev = format!("{}/dev", cluster.var("BERTH_TEST_GPU_DIR"));
    let by_hand = format!("--container-mounts={gpu_dev}:/mnt/gpus:ro");
    for who in BOTH {
        for (shape, expect_per_node) in [
            (vec!["-N1", "--gres=gpu:1"], 1),
            (vec!["-N2", "--gpus-per-node=2"], 2),
            (vec!["-N1"], 0),
        ] {
            for container in [true, false] {
                let dir = if container {
                    "/mnt/gpus"
                } else {
                    gpu_dev.as_str()
                };
                let script = probe(dir);
                let mut args = shape.clone();
                if container {
                    args.extend([image.as_str(), by_hand.as_str()]);
                }
                args.extend(["sh", "-c", script.as_str()]);
                let run = cluster.srun(who, &args).ok();
                let ctx = format!("{who:?} {shape:?} container={container}: {}", run.stdout);
                let tasks = probes(&run.stdout);
                assert_eq!(tasks.len(), if shape[0] == "-N2" { 2 } else { 1 }, "{ctx}");
                for task in tasks {
                    let given = indices(&task["step_gpus"]);
                    assert_eq!(given.len(), expect_per_node, "{ctx}");
                    if container {
                        let seen: BTreeSet<u32> = task["dev"]
                            .split(',')
                            .filter_map(|d| d.strip_prefix("nvidia")?.parse().ok())
                            .collect();
                        assert_eq!(seen, given, "/dev of the container: {ctx}");
                    }
                    for n in [0u32, 1] {
                        let want = if given.contains(&n) { ALLOWED } else { DENIED };
                        assert_eq!(task[&format!("open{n}")], want, "GPU {n}: {ctx}");
                    }
                }
            }
        }
    }
}

/// The step's GPU in the container comes with the driver: `nvidia-smi` from
/// the (fake) driver root runs inside and lists the step's device.
#[test]
fn the_driver_comes_with_the_steps_gpu() {
    let cluster = gpu_cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let run = cluster
        .srun(
            Submitter::User,
            &["-N1", "--gres=gpu:1", &image, "sh", "-c", "nvidia-smi"],
        )
        .ok();
    assert!(run.stdout.contains("fake-nvidia-smi"), "{}", run.stdout);
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with("nvidia") && l[6..].parse::<u32>().is_ok())
            .count(),
        1,
        "{}",
        run.stdout
    );
}

/// The batch step of `sbatch --gres=gpu:1 --container-image` gets its GPU
/// (`SLURM_JOB_GPUS`) and only it.
#[test]
fn the_batch_step_gets_the_jobs_gpu() {
    let cluster = gpu_cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let out = format!("{work}/gpu-batch-{}.out", std::process::id());
    let _ = std::fs::remove_file(&out);
    let run = cluster.slurm(
        Submitter::User,
        "sbatch",
        &[
            "--wait",
            "-N1",
            "--gres=gpu:1",
            &format!("--output={out}"),
            &image,
            "--wrap",
            "echo job_gpus=$SLURM_JOB_GPUS dev=$(ls /dev | grep '^nvidia[0-9]' | tr '\\n' ,)",
        ],
    );
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(run.code, 0, "{}{}\n{text}", run.stdout, run.stderr);
    let line = text
        .lines()
        .find(|l| l.starts_with("job_gpus="))
        .unwrap_or_default();
    let (gpus, dev) = line.split_once(' ').unwrap_or_default();
    let gpu = gpus.trim_start_matches("job_gpus=");
    assert_eq!(indices(gpu).len(), 1, "{text}");
    assert_eq!(dev, format!("dev=nvidia{gpu},"), "{text}");
    let _ = std::fs::remove_file(&out);
}

/// `berth doctor` finds the GPU site's isolation in order, and warns once
/// ConstrainDevices is off (a copy of the configuration with `no`).
#[test]
fn doctor_checks_gpu_isolation() {
    let cluster = gpu_cluster_or_skip!();
    let doctor = |slurm_conf: &std::path::Path| {
        let out = common::output_of(
            std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
                .arg("doctor")
                .env("SLURM_CONF", slurm_conf),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let conf = std::path::PathBuf::from(cluster.var("SLURM_CONF"));
    let out = doctor(&conf);
    assert!(
        out.contains("ok   GPU isolation: task/cgroup with ConstrainDevices=yes"),
        "{out}"
    );
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(&conf, copy.path().join("slurm.conf")).unwrap();
    let cgroup = std::fs::read_to_string(conf.with_file_name("cgroup.conf")).unwrap();
    std::fs::write(
        copy.path().join("cgroup.conf"),
        cgroup.replace("ConstrainDevices=yes", "ConstrainDevices=no"),
    )
    .unwrap();
    let out = doctor(&copy.path().join("slurm.conf"));
    assert!(
        out.contains("WARN GPU isolation: ConstrainDevices is not yes"),
        "{out}"
    );
}
