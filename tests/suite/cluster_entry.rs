//! Integration tests on the real test cluster for the image ENTRYPOINT
//! (`--container-entrypoint`, `--container-entrypoint-log`), sbatch and
//! salloc with `--container-*` options, and plugstack arguments, as root and
//! as an ordinary user (see tests/suite/common).
//!
//! Needs the images of `tests/harness/images.sh push` and
//! `tests/harness/entrypoint-images.sh` (tests/run.sh runs both).

use crate::common;

use std::path::Path;

use common::{Cluster, Run, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// Prints what the entrypoint of `busybox:entrypoint` changes, then exits 7.
const SHOW_ENV: &str = "echo ran=$BERTH_ENTRYPOINT_RAN env=$BERTH_TEST_ENV \
                        removed=${BERTH_REMOVE_ME-unset} rank=$SLURM_PROCID; exit 7";

/// What the entrypoint of `busybox:entrypoint` prints.
const ENTRYPOINT_SAYS: &str = "entrypoint says hello as uid";

fn entrypoint_image(cluster: &Cluster) -> String {
    cluster.image("busybox:entrypoint")
}

/// `srun -n2 --container-image=busybox:entrypoint EXTRA... sh -c SHOW_ENV`,
/// with `BERTH_REMOVE_ME=1` and `env` in the environment.
fn srun_show_env(cluster: &Cluster, who: Submitter, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let image = format!("--container-image={}", entrypoint_image(cluster));
    let mut args = vec!["-N1", "-n2", image.as_str()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["sh", "-c", SHOW_ENV]);
    let mut env = env.to_vec();
    env.push(("BERTH_REMOVE_ME", "1"));
    cluster.slurm_env(who, "srun", &args, &env)
}

/// Asserts that both tasks ran the command (exit 7 passed through srun) with
/// the entrypoint's environment (`ran`) or without it.
fn assert_ran(run: &Run, ran: bool, context: &str) {
    assert_eq!(
        run.code, 7,
        "{context}: the command's exit code must come through\n--- stdout\n{}\n--- stderr\n{}",
        run.stdout, run.stderr
    );
    // The entrypoint sees none of the job's variables but those named in
    // --container-env (as with pyxis): its `unset BERTH_REMOVE_ME` leaves
    // the job's value alone.
    let expected = if ran {
        "ran=yes env=changed-by-entrypoint removed=1"
    } else {
        "ran= env=from-image removed=1"
    };
    for rank in 0..2 {
        let line = format!("{expected} rank={rank}");
        assert!(
            run.stdout.lines().any(|l| l == line),
            "{context}: expected '{line}'\n--- stdout\n{}\n--- stderr\n{}",
            run.stdout,
            run.stderr
        );
    }
}

fn uid_of(who: Submitter) -> String {
    match who {
        Submitter::Root => "0".to_string(),
        Submitter::User => {
            let out = std::process::Command::new("id")
                .args(["-u", common::TEST_USER])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }
    }
}

#[test]
fn entrypoint_runs_only_when_asked_and_keeps_the_exit_code() {
    let cluster = cluster_or_skip!();
    for who in BOTH {
        let run = srun_show_env(&cluster, who, &[], &[]);
        assert_ran(&run, false, &format!("{who:?}, default"));
        let run = srun_show_env(&cluster, who, &["--container-entrypoint"], &[]);
        assert_ran(&run, true, &format!("{who:?}, --container-entrypoint"));
        assert!(
            !run.stdout.contains(ENTRYPOINT_SAYS) && !run.stderr.contains(ENTRYPOINT_SAYS),
            "{who:?}: the entrypoint's output must be hidden without --container-entrypoint-log\n{}\n{}",
            run.stdout,
            run.stderr
        );
        let run = srun_show_env(&cluster, who, &["--no-container-entrypoint"], &[]);
        assert_ran(&run, false, &format!("{who:?}, --no-container-entrypoint"));
    }
}

/// The ENTRYPOINT runs with no_new_privs, and neither its background job
/// nor a daemon it double-forked is still running when the tasks start
/// (`busybox:entrypoint-daemon`), as root and as the user.
#[test]
fn entrypoint_has_no_new_privs_and_leaves_nothing_running() {
    let cluster = cluster_or_skip!();
    let image = format!(
        "--container-image={}",
        cluster.image("busybox:entrypoint-daemon")
    );
    // Counts the entrypoint's sleeps among all processes of the node.
    let count = "for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c; echo; done 2>/dev/null \
                 | grep -c '^sleep 471[12] ' | sed s/^/left=/";
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &image,
                    "--container-entrypoint",
                    "--container-entrypoint-log",
                    "sh",
                    "-c",
                    count,
                ],
            )
            .ok();
        let all = format!("{}{}", run.stdout, run.stderr);
        assert!(
            all.lines()
                .any(|l| l.contains("NoNewPrivs:") && l.trim_end().ends_with('1')),
            "{who:?}: the entrypoint ran without no_new_privs:\n{all}"
        );
        assert!(
            run.stdout.lines().any(|l| l == "left=0"),
            "{who:?}: what the entrypoint started is still running:\n{all}"
        );
    }
}

#[test]
fn entrypoint_log_is_shown_when_asked() {
    let cluster = cluster_or_skip!();
    for who in BOTH {
        let run = srun_show_env(
            &cluster,
            who,
            &["--container-entrypoint", "--container-entrypoint-log"],
            &[],
        );
        assert_ran(&run, true, &format!("{who:?}, with the log"));
        let hello = format!("{ENTRYPOINT_SAYS} {}", uid_of(who));
        assert!(
            run.stderr.contains(&hello),
            "{who:?}: expected '{hello}' (the entrypoint runs as the user):\n{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("entrypoint writes to stderr"),
            "{who:?}: {}",
            run.stderr
        );
        // Once per container (one node here), not once per task.
        assert_eq!(
            run.stderr.matches(ENTRYPOINT_SAYS).count(),
            1,
            "{}",
            run.stderr
        );
    }
}

/// The ENTRYPOINT sees a job variable only when `--container-env` names it
/// (pyxis's `entrypoint.bats` checks the same with docker:dind's DOCKER_HOST).
#[test]
fn entrypoint_sees_only_the_job_variables_container_env_names() {
    let cluster = cluster_or_skip!();
    let image = format!(
        "--container-image={}",
        cluster.image("busybox:entrypoint-env")
    );
    for who in BOTH {
        let run = |extra: &[&str]| {
            let mut args = vec![
                "-N1",
                image.as_str(),
                "--container-entrypoint",
                "--container-entrypoint-log",
            ];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["sh", "-c", "echo task sees BERTH_JOB_VAR=$BERTH_JOB_VAR"]);
            cluster
                .slurm_env(who, "srun", &args, &[("BERTH_JOB_VAR", "from-job")])
                .ok()
        };
        let plain = run(&[]);
        assert!(
            plain.stderr.contains("entrypoint sees BERTH_JOB_VAR=unset"),
            "{who:?}: {}",
            plain.stderr
        );
        assert!(
            plain.stdout.contains("task sees BERTH_JOB_VAR=from-job"),
            "{who:?}: {}",
            plain.stdout
        );
        let named = run(&["--container-env=BERTH_JOB_VAR"]);
        assert!(
            named
                .stderr
                .contains("entrypoint sees BERTH_JOB_VAR=from-job"),
            "{who:?}: {}",
            named.stderr
        );
    }
}

#[test]
fn entrypoint_options_come_from_the_environment() {
    let cluster = cluster_or_skip!();
    let who = Submitter::User;
    let run = srun_show_env(&cluster, who, &[], &[("PYXIS_CONTAINER_ENTRYPOINT", "1")]);
    assert_ran(&run, true, "PYXIS_CONTAINER_ENTRYPOINT=1");
    let run = srun_show_env(
        &cluster,
        who,
        &[],
        &[
            ("PYXIS_CONTAINER_ENTRYPOINT", "yes"),
            ("BERTH_CONTAINER_ENTRYPOINT", "n"),
        ],
    );
    assert_ran(&run, false, "BERTH_CONTAINER_ENTRYPOINT=n wins over PYXIS_");
    let run = srun_show_env(
        &cluster,
        who,
        &["--no-container-entrypoint"],
        &[("BERTH_CONTAINER_ENTRYPOINT", "true")],
    );
    assert_ran(&run, false, "the command line wins over the environment");
    let run = srun_show_env(
        &cluster,
        who,
        &[],
        &[
            ("BERTH_CONTAINER_ENTRYPOINT", "1"),
            ("PYXIS_CONTAINER_ENTRYPOINT_LOG", "y"),
        ],
    );
    assert_ran(&run, true, "PYXIS_CONTAINER_ENTRYPOINT_LOG=y");
    assert!(run.stderr.contains(ENTRYPOINT_SAYS), "{}", run.stderr);
    let run = srun_show_env(
        &cluster,
        who,
        &[],
        &[("BERTH_CONTAINER_ENTRYPOINT", "sometimes")],
    );
    assert!(
        run.code != 0 && run.stderr.contains("BERTH_CONTAINER_ENTRYPOINT=sometimes"),
        "a bad boolean must be named:\n{}",
        run.stderr
    );
}

#[test]
fn failing_entrypoint_is_reported_with_its_output() {
    let cluster = cluster_or_skip!();
    let image = format!(
        "--container-image={}",
        cluster.image("busybox:entrypoint-fails")
    );
    for who in BOTH {
        let run = cluster
            .srun(who, &["-N1", &image, "--container-entrypoint", "true"])
            .failed();
        for expected in [
            "failed with exit code 3",
            "entrypoint failing on purpose",
            "--no-container-entrypoint",
        ] {
            assert!(
                run.stderr.contains(expected),
                "{who:?}: expected '{expected}':\n{}",
                run.stderr
            );
        }
        cluster
            .srun(who, &["-N1", &image, "--no-container-entrypoint", "true"])
            .ok();
    }
}

/// Submits `script` (written to the shared work folder) with `sbatch --wait
/// ARGS` as `who` and returns the run and the job's output.
fn sbatch(
    cluster: &Cluster,
    who: Submitter,
    name: &str,
    script: &str,
    args: &[&str],
) -> (Run, String) {
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let tag = format!("{name}-{who:?}-{}", std::process::id());
    let script_path = format!("{work}/{tag}.sh");
    let out = format!("{work}/{tag}.out");
    std::fs::write(&script_path, script).unwrap();
    let _ = std::fs::remove_file(&out);
    let output = format!("--output={out}");
    let mut all = vec!["--wait", "-N1", output.as_str()];
    all.extend_from_slice(args);
    all.push(&script_path);
    let run = cluster.slurm(who, "sbatch", &all);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&script_path);
    let _ = std::fs::remove_file(&out);
    (run, text)
}

#[test]
fn sbatch_script_runs_in_the_container() {
    let cluster = cluster_or_skip!();
    // `#` starts a comment in an #SBATCH line unless escaped or quoted.
    let enroot_form = format!("{}\\#busybox", cluster.registry());
    let script = format!(
        "#!/bin/sh\n#SBATCH --container-image={enroot_form}\n\
         grep ^ID= /etc/os-release\npwd\necho script=$0\n\
         if echo x >>\"$0\"; then echo script-writable; else echo script-read-only; fi\n\
         test -r \"$0\" && echo script-readable\nid -u\n"
    );
    for who in BOTH {
        let (run, text) = sbatch(&cluster, who, "entry-sbatch", &script, &[]);
        let run = run.ok();
        for expected in [
            "ID=berth-busybox",
            "/srv/work",
            "script-read-only",
            "script-readable",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "{who:?}: expected '{expected}' in the job output:\n{text}\n{}",
                run.stderr
            );
        }
        assert!(text.contains("script=/"), "{text}");
        assert!(
            text.lines().any(|l| l == uid_of(who)),
            "{who:?}: runs as the user:\n{text}"
        );
    }
}

#[test]
fn sbatch_command_line_options_apply_to_the_script() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", entrypoint_image(&cluster));
    let script = "#!/bin/sh\ngrep ^ID= /etc/os-release\necho ran=$BERTH_ENTRYPOINT_RAN\n";
    for who in BOTH {
        let (run, text) = sbatch(
            &cluster,
            who,
            "entry-sbatch-cli",
            script,
            &[&image, "--container-entrypoint"],
        );
        run.ok();
        assert!(text.contains("ID=berth-busybox"), "{who:?}: {text}");
        assert!(
            text.contains("ran=yes"),
            "{who:?}: the entrypoint ran: {text}"
        );
    }
}

/// The batch script runs in a Debian image that has the host's Slurm client
/// bound in; its steps inherit the image (and the mounts), or use their own.
#[test]
fn srun_in_a_containerized_batch_script_inherits_or_overrides() {
    let cluster = cluster_or_skip!();
    let prefix = format!("{}/prefix", cluster.var("BERTH_TEST_STATE_DIR"));
    let slurm_conf = cluster.var("SLURM_CONF");
    let conf_dir = Path::new(&slurm_conf)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let slurm_lib = "/usr/lib/x86_64-linux-gnu/slurm-wlm";
    let munge_lib = "/usr/lib/x86_64-linux-gnu/libmunge.so.2";
    if !Path::new(slurm_lib).is_dir() || !Path::new(munge_lib).exists() {
        panic!("this test binds the host's Slurm client from {slurm_lib} and {munge_lib}");
    }
    let mounts = [
        "/usr/bin/srun:/usr/bin/srun:ro".to_string(),
        format!("{slurm_lib}:{slurm_lib}:ro"),
        format!("{munge_lib}:{munge_lib}:ro"),
        "/run/munge:/run/munge".to_string(),
        format!("{conf_dir}:{conf_dir}:ro"),
        format!("{prefix}:{prefix}:ro"),
    ]
    .join(",");
    let busybox = cluster.image("busybox:latest");
    let script = format!(
        "#!/bin/sh\n#SBATCH --container-image={}\n#SBATCH --container-mounts={mounts}\n\
         echo batch $(awk '$2 == \"/\" {{print $3}}' /proc/self/mounts) $(grep ^ID= /etc/os-release)\n\
         srun -n1 sh -c 'echo inherited $(awk \"\\$2 == \\\"/\\\" {{print \\$3}}\" /proc/self/mounts) $(grep ^ID= /etc/os-release)'\n\
         srun -n1 --container-image={busybox} sh -c 'echo own $(grep ^ID= /etc/os-release)'\n",
        cluster.image("debian:bookworm")
    );
    for who in BOTH {
        let (run, text) = sbatch(&cluster, who, "entry-inherit", &script, &[]);
        run.ok();
        for expected in [
            "batch overlay ID=debian",
            "inherited overlay ID=debian",
            "own ID=berth-busybox",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "{who:?}: expected '{expected}':\n{text}"
            );
        }
    }
}

#[test]
fn salloc_steps_inherit_the_image() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        let run = cluster
            .slurm(
                who,
                "salloc",
                &[
                    "-N1",
                    &image,
                    "sh",
                    "-c",
                    "echo shell $(grep ^ID= /etc/os-release); \
                     srun -n1 sh -c 'echo step $(grep ^ID= /etc/os-release)'",
                ],
            )
            .ok();
        // The salloc shell stays on the submit host; the steps are in the image.
        assert!(
            run.stdout.lines().any(|l| l == "step ID=berth-busybox"),
            "{who:?}: {}",
            run.stdout
        );
        assert!(
            run.stdout
                .lines()
                .any(|l| l.starts_with("shell ") && !l.contains("berth-busybox")),
            "{who:?}: {}",
            run.stdout
        );
    }
}

/// Runs a Slurm client as the test user with a copy of the cluster's
/// slurm.conf whose plugstack holds only the berth plugin with `arguments`
/// (client side only: slurmd keeps its own plugstack).
fn client_with_plugstack_arguments(
    cluster: &Cluster,
    arguments: &str,
    program: &str,
    args: &[&str],
) -> Run {
    client_with_conf(cluster, arguments, &[], program, args)
}

/// Like [`client_with_plugstack_arguments`], with `files` (name, text)
/// written beside the copy of slurm.conf; a `slurm.conf` entry among them
/// is added to the copy's end.
fn client_with_conf(
    cluster: &Cluster,
    arguments: &str,
    files: &[(&str, &str)],
    program: &str,
    args: &[&str],
) -> Run {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let plugin = format!(
        "{}/prefix/lib/slurm/spank_berth.so",
        cluster.var("BERTH_TEST_STATE_DIR")
    );
    let plugstack = dir.path().join("plugstack.conf");
    std::fs::write(&plugstack, format!("required {plugin} {arguments}\n")).unwrap();
    let conf = std::fs::read_to_string(cluster.var("SLURM_CONF")).unwrap();
    let mut conf: String = conf
        .lines()
        .filter(|l| {
            !l.trim_start()
                .to_ascii_lowercase()
                .starts_with("plugstackconfig")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    conf.push_str(&format!("PlugStackConfig={}\n", plugstack.display()));
    let mut written = vec![dir.path().to_path_buf(), plugstack.clone()];
    for (name, text) in files {
        if *name == "slurm.conf" {
            conf.push_str(text);
        } else {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            written.push(path);
        }
    }
    let slurm_conf = dir.path().join("slurm.conf");
    std::fs::write(&slurm_conf, conf).unwrap();
    written.push(slurm_conf.clone());
    for path in &written {
        let mode = if path.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    }
    cluster.slurm_env(
        Submitter::User,
        program,
        args,
        &[("SLURM_CONF", slurm_conf.to_str().unwrap())],
    )
}

#[test]
fn sbatch_support_off_leaves_the_options_to_srun() {
    let cluster = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let cases: [(&str, &[&str]); 2] = [
        ("sbatch", &["-N1", &image, "--wrap", "true"]),
        ("salloc", &["-N1", &image, "true"]),
    ];
    for (program, args) in cases {
        let run =
            client_with_plugstack_arguments(&cluster, "sbatch_support=0", program, args).failed();
        assert!(
            run.stderr.contains("unrecognized option") && run.stderr.contains("--container-image"),
            "{program}: {}",
            run.stderr
        );
    }
    let run = client_with_plugstack_arguments(
        &cluster,
        "sbatch_support=0",
        "srun",
        &["-N1", &image, "grep", "^ID=", "/etc/os-release"],
    )
    .ok();
    assert!(run.stdout.contains("ID=berth-busybox"), "{}", run.stdout);
}

#[test]
fn log_level_argument_is_checked() {
    let cluster = cluster_or_skip!();
    let run = client_with_plugstack_arguments(&cluster, "log_level=loud", "srun", &["-N1", "true"])
        .failed();
    assert!(
        run.stderr
            .contains("log_level=loud: expected one of error, info, verbose, debug"),
        "{}",
        run.stderr
    );
    client_with_plugstack_arguments(
        &cluster,
        "log_level=debug execute_entrypoint=yes",
        "srun",
        &["-N1", "true"],
    )
    .ok();
}

/// Slurm 25.11's `namespace/linux` with `CLONE_NEWUSER` puts every job in a
/// user namespace of its own, from which a task cannot enter the
/// container's: srun refuses a container step before anything is allocated,
/// naming both settings. (Earlier releases do not know `NamespaceType`;
/// Slurm wants `PrologFlags=Contain` with it.)
#[test]
fn namespace_linux_with_user_namespaces_is_refused_at_submission() {
    let cluster = cluster_or_skip!();
    if cluster.slurm_release() < (25, 11) {
        eprintln!(
            "skipped: Slurm {:?} has no namespace/linux",
            cluster.slurm_release()
        );
        return;
    }
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let yaml = "defaults:\n  auto_basepath: true\n  base_path: /var/tmp/berth-ns\n  \
                clone_ns_flags:\n    - CLONE_NEWPID\n    - CLONE_NEWUSER\n";
    let files = [
        (
            "slurm.conf",
            "NamespaceType=namespace/linux\nPrologFlags=Contain\n",
        ),
        ("namespace.yaml", yaml),
    ];
    let run = client_with_conf(&cluster, "", &files, "srun", &["-N1", &image, "true"]).failed();
    assert!(
        run.stderr.contains("NamespaceType=namespace/linux")
            && run.stderr.contains("CLONE_NEWUSER")
            && run.stderr.contains("cannot enter"),
        "{}",
        run.stderr
    );
    // Without CLONE_NEWUSER the check lets the step through to Slurm.
    let files = [
        (
            "slurm.conf",
            "NamespaceType=namespace/linux\nPrologFlags=Contain\n",
        ),
        (
            "namespace.yaml",
            "defaults:\n  clone_ns_flags:\n    - CLONE_NEWPID\n",
        ),
    ];
    let run = client_with_conf(&cluster, "", &files, "srun", &["-N1", &image, "true"]);
    assert!(
        !run.stderr.contains("cannot enter the container's"),
        "refused without CLONE_NEWUSER: {}",
        run.stderr
    );
}
