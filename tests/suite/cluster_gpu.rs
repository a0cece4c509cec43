//! GPUs through Slurm on the GPU-site variant of the test cluster
//! (`BERTH_TEST_SITE=gpu`, tests/harness/cluster.sh): proctrack/cgroup,
//! task/cgroup with ConstrainDevices=yes, two fake GPUs per node as GRES.
//! Opening a fake GPU the devices cgroup allows gives ENXIO ("No such device
//! or address"), one it denies EPERM ("Operation not permitted"): the tests
//! tell who decides. On the plain cluster they say so and pass.

use crate::common;

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

/// With `job_container/tmpfs` (the GPU site), a container's `/tmp` and
/// `/dev/shm` are its job's private ones: a bare step of the same job reads
/// what the container wrote there, another job's container on the same node
/// sees none of it, nor the node's own `/tmp`.
#[test]
fn containers_get_the_jobs_private_tmp_and_shm() {
    let cluster = gpu_cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let node = cluster.var("BERTH_TEST_NODE_NAMES");
    let node = node.split(',').next().unwrap().to_string();
    let node_tmp = std::path::Path::new(&cluster.var("BERTH_TEST_STATE_DIR"))
        .join("nodes")
        .join(&node)
        .join("tmp");
    for who in BOTH {
        let tag = format!("{who:?}-{}", std::process::id());
        let dir = cluster.shared_dir("jobtmp");
        let on_node = node_tmp.join(format!("node-file-{tag}"));
        std::fs::write(&on_node, "node").unwrap();
        let report = format!("--container-mounts={}:/report", dir.display());
        // Job A: a container step writes into /tmp and /dev/shm, says so,
        // waits for the go; then a bare step reads both back.
        let script = dir.join("job-a.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n\
                 srun {image} {report} sh -c 'echo a >/tmp/a-{tag}; echo a >/dev/shm/a-{tag}; \
                 touch /report/ready; i=0; while [ ! -e /report/go ] && [ $i -lt 90 ]; do \
                 sleep 1; i=$((i+1)); done'\n\
                 srun sh -c 'echo bare-tmp=$(cat /tmp/a-{tag}) bare-shm=$(cat /dev/shm/a-{tag})'\n"
            ),
        )
        .unwrap();
        let out = dir.join("job-a.out");
        let mut job_a = cluster
            .command_as(
                match who {
                    Submitter::Root => "root",
                    Submitter::User => common::TEST_USER,
                },
                "sbatch",
                &[
                    "--wait",
                    "-N1",
                    "-w",
                    &node,
                    "--oversubscribe",
                    &format!("--output={}", out.display()),
                    script.to_str().unwrap(),
                ],
            )
            .spawn()
            .unwrap();
        let ready = common::wait_for(std::time::Duration::from_secs(120), || {
            dir.join("ready").exists()
        });
        let probe = format!(
            "for f in /tmp/node-file-{tag} /tmp/a-{tag} /dev/shm/a-{tag}; do \
             if [ -e $f ]; then echo seen=$f; fi; done; echo checked"
        );
        let job_b = ready.then(|| {
            cluster.srun(
                who,
                &[
                    "-N1",
                    "-w",
                    &node,
                    "--oversubscribe",
                    &image,
                    "sh",
                    "-c",
                    &probe,
                ],
            )
        });
        std::fs::write(dir.join("go"), "").unwrap();
        let status = job_a.wait().unwrap();
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        assert!(
            ready,
            "{who:?}: job A's container step never started:\n{text}"
        );
        assert!(status.success(), "{who:?}: job A failed:\n{text}");
        let job_b = job_b.unwrap().ok();
        assert!(job_b.stdout.contains("checked"), "{}", job_b.stderr);
        assert!(
            !job_b.stdout.contains("seen="),
            "{who:?}: another job's container sees the node's or job A's files:\n{}",
            job_b.stdout
        );
        assert!(
            text.contains("bare-tmp=a bare-shm=a"),
            "{who:?}: the job's bare step does not see what its container wrote in /tmp \
             and /dev/shm:\n{text}"
        );
        let _ = std::fs::remove_file(&on_node);
    }
    cluster.assert_nodes_healthy();
}

/// `--gpus=1` and `--gpus-per-task`: each task in the container gets what
/// Slurm binds for it bare (which of the step's GPUs it may open, the
/// node's others denied, `CUDA_VISIBLE_DEVICES`), and the container's `/dev`
/// holds exactly the step's GPUs.
#[test]
fn tasks_in_a_container_get_what_slurm_binds_for_them_bare() {
    let cluster = gpu_cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let gpu_dev = format!("{}/dev", cluster.var("BERTH_TEST_GPU_DIR"));
    let by_hand = format!("--container-mounts={gpu_dev}:/mnt/gpus:ro");
    let with_cvd = |dir: &str| {
        format!(
            "{}; echo \"cvd=${{CUDA_VISIBLE_DEVICES:-none}} task=$SLURM_PROCID\"",
            probe(dir)
        )
    };
    for who in BOTH {
        for shape in [
            vec!["-N1", "--gpus=1"],
            vec!["-N1", "-n2", "--gpus-per-task=1"],
        ] {
            let mut seen = Vec::new();
            for container in [false, true] {
                let script = if container {
                    with_cvd("/mnt/gpus")
                } else {
                    with_cvd(&gpu_dev)
                };
                let mut args = shape.clone();
                if container {
                    args.extend([image.as_str(), by_hand.as_str()]);
                }
                args.extend(["sh", "-c", script.as_str()]);
                let run = cluster.srun(who, &args).ok();
                let ctx = format!("{who:?} {shape:?} container={container}: {}", run.stdout);
                let mut tasks = std::collections::BTreeMap::new();
                // One container per step and node: its /dev holds the GPUs
                // of all its tasks (those some task may open); each task
                // opens only its own (task/cgroup; a task's SLURM_STEP_GPUS
                // counts from its own first GPU).
                let step_gpus: BTreeSet<u32> = probes(&run.stdout)
                    .iter()
                    .flat_map(|t| {
                        [0u32, 1]
                            .into_iter()
                            .filter(|n| t[&format!("open{n}")] == ALLOWED)
                    })
                    .collect();
                for task in probes(&run.stdout) {
                    let rank = task["task"].clone();
                    let cvd = run
                        .stdout
                        .lines()
                        .find(|l| l.ends_with(&format!(" task={rank}")) && l.starts_with("cvd="))
                        .unwrap_or_default()
                        .to_string();
                    if container {
                        let dev: BTreeSet<u32> = task["dev"]
                            .split(',')
                            .filter_map(|d| d.strip_prefix("nvidia")?.parse().ok())
                            .collect();
                        assert_eq!(dev, step_gpus, "/dev: {ctx}");
                    }
                    // Which of the node's GPUs Slurm picks depends on the
                    // jobs beside this one (the tests run two at a time):
                    // compare by the step's GPUs in order, the others denied.
                    for n in (0u32..2).filter(|n| !step_gpus.contains(n)) {
                        assert_eq!(task[&format!("open{n}")], DENIED, "GPU {n}: {ctx}");
                    }
                    let opens: Vec<&str> = step_gpus
                        .iter()
                        .map(|n| task[&format!("open{n}")].as_str())
                        .collect();
                    tasks.insert(rank, format!("{} {cvd}", opens.join(" ")));
                }
                let expected_tasks = if shape.contains(&"-n2") { 2 } else { 1 };
                assert_eq!(tasks.len(), expected_tasks, "{ctx}");
                seen.push(tasks);
            }
            assert_eq!(
                seen[1], seen[0],
                "{who:?} {shape:?}: tasks in the container (right) differ from bare (left)"
            );
            eprintln!("{who:?} {shape:?}: {:?}", seen[0]);
        }
    }
}
