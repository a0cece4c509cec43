//! Integration tests of site settings on the real test cluster: the site's
//! TaskProlog and TaskEpilog (tests/harness/cluster.sh writes them into
//! slurm.conf; they act only when a job sets `BERTH_TEST_PROLOG_DIR`), and
//! `sbatch --export`, as root and as the ordinary user.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::{Cluster, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

fn uid_of(who: Submitter) -> String {
    match who {
        Submitter::Root => "0".into(),
        Submitter::User => common::tool("id", &["-u", common::TEST_USER])
            .trim()
            .to_string(),
    }
}

/// The files the harness's TaskProlog (`prolog`) or TaskEpilog (`epilog`)
/// wrote into `dir`, by task rank: `key=value` words.
fn script_records(dir: &Path, which: &str) -> HashMap<String, HashMap<String, String>> {
    let mut records = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&format!("{which}.")) else {
            continue;
        };
        let rank = rest.rsplit('.').next().unwrap().to_string();
        let text = std::fs::read_to_string(dir.join(&name)).unwrap();
        let words = text
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        records.insert(rank, words);
    }
    records
}

/// Each task prints what it got from the TaskProlog and its mount namespace.
const TASK_REPORT: &str = "echo task=$SLURM_PROCID var=${BERTH_PROLOG_VAR:-none} \
     unset=${BERTH_PROLOG_UNSET_ME-gone} context=${SLURM_SCRIPT_CONTEXT:-none} \
     mntns=$(readlink /proc/self/ns/mnt) os=$(grep ^ID= /etc/os-release)";

/// The words a task's TASK_REPORT line printed, by rank.
fn task_reports(stdout: &str) -> HashMap<String, HashMap<String, String>> {
    stdout
        .lines()
        .filter(|l| l.starts_with("task="))
        .map(|l| {
            let words: HashMap<String, String> = l
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (words["task"].clone(), words)
        })
        .collect()
}

/// Whether the cluster's Slurm runs the TaskProlog itself for container
/// tasks: from 23.11 on (`spank_prepend_task_argv`), berth's tasks enter the
/// container by exec, after Slurm's task setup.
fn slurm_runs_task_prolog_on_host(cluster: &Cluster) -> bool {
    cluster.slurm_release() >= (23, 11)
}

/// A site TaskProlog gives container tasks what it gives bare ones: its
/// `export` and `unset` lines reach the task, its `print` line the task's
/// output, and it runs on the host (its file is written there, from the
/// node's own mount namespace, as the user), on both nodes; the TaskEpilog
/// runs on the host too. With --container-remap-root the task is root in the
/// container, the prolog still the user on the host.
#[test]
fn task_prolog_runs_on_the_host_for_container_tasks_as_for_bare_ones() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        for (what, extra) in [
            ("bare", vec![]),
            ("container", vec![image.as_str()]),
            ("remap-root", vec![image.as_str(), "--container-remap-root"]),
        ] {
            let dir = cluster.shared_dir("prolog");
            let mut args = vec!["-N2", "-n3"];
            args.extend(extra.iter().copied());
            args.extend(["sh", "-c", TASK_REPORT]);
            let run = cluster
                .slurm_env(
                    who,
                    "srun",
                    &args,
                    &[
                        ("BERTH_TEST_PROLOG_DIR", dir.to_str().unwrap()),
                        ("BERTH_PROLOG_UNSET_ME", "still-here"),
                    ],
                )
                .ok();
            let ctx = format!("{who:?} {what}: {}\n{}", run.stdout, run.stderr);
            let tasks = task_reports(&run.stdout);
            let prologs = script_records(&dir, "prolog");
            let epilogs = script_records(&dir, "epilog");
            assert_eq!(tasks.len(), 3, "{ctx}");
            for rank in ["0", "1", "2"] {
                let task = &tasks[rank];
                assert!(
                    run.stdout
                        .contains(&format!("site prolog says hello to task {rank}\n")),
                    "print line of task {rank}: {ctx}"
                );
                assert!(!run.stdout.contains("this line is ignored"), "{ctx}");
                assert_eq!(task["var"], format!("site-{rank}"), "{ctx}");
                assert_eq!(task["unset"], "gone", "{ctx}");
                assert_eq!(task["context"], "prolog_task", "{ctx}");
                let prolog = prologs
                    .get(rank)
                    .unwrap_or_else(|| panic!("no prolog file for task {rank}: {ctx}"));
                assert_eq!(prolog["uid"], uid_of(who), "{ctx}");
                assert_eq!(prolog["context"], "prolog_task", "{ctx}");
                // The epilog runs in slurmstepd's (the node's) namespace.
                let epilog = epilogs
                    .get(rank)
                    .unwrap_or_else(|| panic!("no epilog file for task {rank}: {ctx}"));
                assert_eq!(epilog["uid"], uid_of(who), "{ctx}");
                assert_eq!(
                    prolog["mntns"], epilog["mntns"],
                    "prolog on the host: {ctx}"
                );
                if what == "bare" {
                    assert_eq!(task["mntns"], prolog["mntns"], "{ctx}");
                    assert_ne!(task["os"], "ID=berth-busybox", "{ctx}");
                } else {
                    assert_ne!(task["mntns"], prolog["mntns"], "{ctx}");
                    assert_eq!(task["os"], "ID=berth-busybox", "{ctx}");
                }
            }
            if what == "remap-root" {
                let id = cluster
                    .slurm_env(
                        who,
                        "srun",
                        &["-N1", &image, "--container-remap-root", "id", "-u"],
                        &[("BERTH_TEST_PROLOG_DIR", dir.to_str().unwrap())],
                    )
                    .ok();
                assert!(id.stdout.lines().any(|l| l == "0"), "{ctx}\n{}", id.stdout);
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// A TaskProlog that fails ends the task with the script's exit status and
/// message, before the command runs, in a container as bare; the node stays
/// in service.
#[test]
fn failing_task_prolog_fails_the_task_not_the_node() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        for extra in [vec![], vec![image.as_str()]] {
            let dir = cluster.shared_dir("fail");
            let marker = dir.join("command-ran");
            let touch = format!("touch {}", marker.display());
            let mut args = vec!["-N1"];
            args.extend(extra.iter().copied());
            args.extend(["sh", "-c", touch.as_str()]);
            let run = cluster.slurm_env(
                who,
                "srun",
                &args,
                &[
                    ("BERTH_TEST_PROLOG_DIR", dir.to_str().unwrap()),
                    ("BERTH_TEST_PROLOG_FAIL", "no-gpu-left"),
                ],
            );
            let ctx = format!("{who:?} {extra:?}: {}\n{}", run.stdout, run.stderr);
            assert_eq!(run.code, 3, "exit status of the prolog: {ctx}");
            assert!(run.stderr.contains("exit code 3"), "{ctx}");
            // Where berth runs the TaskProlog (22.05) it reports the
            // script's output; where Slurm runs it on the host (23.11+, the
            // task enters the container by exec) the container task fails
            // exactly like the bare one.
            if !extra.is_empty() && !slurm_runs_task_prolog_on_host(&cluster) {
                assert!(
                    run.stderr.contains(
                        "failed with exit status 3: site prolog refuses this task: no-gpu-left"
                    ),
                    "the prolog's message: {ctx}"
                );
            }
            assert!(!marker.exists(), "the command ran: {ctx}");
            cluster.assert_nodes_healthy();
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// The batch step of `sbatch --container-image` runs the TaskProlog on the
/// host too, and the script gets its variables inside the image.
#[test]
fn task_prolog_reaches_the_batch_script_in_the_container() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        let dir = cluster.shared_dir("batch");
        let out = dir.join("job.out");
        let run = cluster.slurm_env(
            who,
            "sbatch",
            &[
                "--wait",
                "-N1",
                &format!("--output={}", out.display()),
                &image,
                "--wrap",
                TASK_REPORT,
            ],
            &[("BERTH_TEST_PROLOG_DIR", dir.to_str().unwrap())],
        );
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let ctx = format!("{who:?}: {}{}\n{text}", run.stdout, run.stderr);
        assert_eq!(run.code, 0, "{ctx}");
        let task = &task_reports(&text)["0"];
        assert_eq!(task["var"], "site-0", "{ctx}");
        assert_eq!(task["os"], "ID=berth-busybox", "{ctx}");
        let prolog = &script_records(&dir, "prolog")["0"];
        assert_eq!(prolog["uid"], uid_of(who), "{ctx}");
        assert_ne!(prolog["mntns"], task["mntns"], "{ctx}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// `sbatch --export=LIST` and `--export=NONE` drop the variables Slurm 22.05
/// passes SPANK options in; the batch script must still run in the image
/// with every option (here a mount and a flag), never silently on the host.
/// `--export=ALL` is the control.
#[test]
fn sbatch_export_keeps_the_batch_script_in_the_container() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        for export in [
            "--export=FOO",
            "--export=NONE",
            "--export=FOO,BAR",
            "--export=ALL",
        ] {
            let dir = cluster.shared_dir("export");
            std::fs::write(dir.join("marker"), "").unwrap();
            let out = dir.join("job.out");
            let mounts = format!("--container-mounts={}:/mnt/probe:ro", dir.display());
            let run = cluster.slurm_env(
                who,
                "sbatch",
                &[
                    "--wait",
                    "-N1",
                    export,
                    &format!("--output={}", out.display()),
                    &image,
                    &mounts,
                    "--container-remap-root",
                    "--wrap",
                    "grep ^ID= /etc/os-release; echo FOO=$FOO; echo uid=$(id -u); ls /mnt/probe",
                ],
                &[("FOO", "bar")],
            );
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            let ctx = format!("{who:?} {export}: {}{}\n{text}", run.stdout, run.stderr);
            assert_eq!(run.code, 0, "{ctx}");
            assert!(
                text.contains("ID=berth-busybox\n"),
                "ran on the host: {ctx}"
            );
            assert!(text.contains("uid=0\n"), "--container-remap-root: {ctx}");
            assert!(text.contains("marker\n"), "--container-mounts: {ctx}");
            let foo = if export == "--export=NONE" {
                "FOO=\n"
            } else {
                "FOO=bar\n"
            };
            assert!(text.contains(foo), "{ctx}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// `srun --export=NONE` keeps its `--container-*` options (srun sends them
/// with the launch, not in the environment).
#[test]
fn srun_export_none_runs_in_the_container() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        let run = cluster
            .slurm_env(
                who,
                "srun",
                &[
                    "-N1",
                    "--export=NONE",
                    &image,
                    "--container-remap-root",
                    "sh",
                    "-c",
                    "grep ^ID= /etc/os-release; echo FOO=$FOO; echo uid=$(id -u)",
                ],
                &[("FOO", "bar")],
            )
            .ok();
        assert!(
            run.stdout.contains("ID=berth-busybox\n"),
            "{who:?}: {}",
            run.stdout
        );
        assert!(run.stdout.contains("uid=0\n"), "{who:?}: {}", run.stdout);
        assert!(run.stdout.contains("FOO=\n"), "{who:?}: {}", run.stdout);
    }
}
