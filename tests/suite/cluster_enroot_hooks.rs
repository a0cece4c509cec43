//! enroot's site hooks (issue 14, point 4): the executable `hooks.d/*.sh`
//! of the folder `enroot_config_path` names run before the tasks start, as
//! the job's user, with enroot's interface (`ENROOT_ROOTFS`,
//! `ENROOT_ENVIRON`, `ENROOT_MOUNTS`, the job's environment and
//! `enroot.conf`'s settings); what they append reaches the tasks; a failing
//! hook fails the step with its name and standard error in srun's output
//! and drains no node; a hanging one is killed at `enroot_hook_timeout`;
//! nothing is left behind, not even a daemon a hook started in a session of
//! its own. On the real test cluster, as root and as the
//! ordinary test user.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Cluster, PlugstackKeys, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// One test at a time: each changes the plugstack line.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Removes a folder when dropped, also after a failed assertion.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `path` (root's) with `mode`.
fn write(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A fresh site folder of root's in the cluster's state folder, with
/// `enroot.conf` and the hooks `(name, text)`, all executable.
fn site_folder(cluster: &Cluster, what: &str, hooks: &[(&str, &str)]) -> Removed {
    let dir = Path::new(&cluster.var("BERTH_TEST_STATE_DIR"))
        .join(format!("enroot-hooks-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write(
        &dir.join("enroot.conf"),
        "ENROOT_SQUASH_OPTIONS -comp lzo\n",
        0o644,
    );
    std::fs::create_dir_all(dir.join("hooks.d")).unwrap();
    for (name, text) in hooks {
        write(&dir.join("hooks.d").join(name), text, 0o755);
    }
    Removed(dir)
}

fn uid_of(who: Submitter) -> u32 {
    match who {
        Submitter::Root => 0,
        Submitter::User => common::tool("id", &["-u", common::TEST_USER])
            .trim()
            .parse()
            .unwrap(),
    }
}

/// The site's hook: records who runs it and what it sees into
/// `$HOOK_OUT/seen.UID`, writes a file into the container's root, and
/// appends a variable and a bind of `$HOOK_DATA` at `/hook-data`.
const SITE_HOOK: &str = r#"#!/bin/sh
set -eu
out="$HOOK_OUT/seen.$(id -u)"
{
    echo "uid=$(id -u) gid=$(id -g)"
    test -x "$ENROOT_ROOTFS/bin/busybox" && echo rootfs=image
    echo "setting=$ENROOT_SQUASH_OPTIONS job=$HOOK_JOBVAR"
    test -n "$ENROOT_PID" && echo pid=set
} > "$out"
echo "written by the hook" > "$ENROOT_ROOTFS/hook-was-here"
echo "HOOK_VAR=from-the-hook" >> "$ENROOT_ENVIRON"
echo "$HOOK_DATA /hook-data none x-create=dir,bind,rw,nosuid" >> "$ENROOT_MOUNTS"
"#;

/// What the task prints of what the hook gave it.
const TASK: &str = "echo var=$HOOK_VAR; cat /hook-data/marker; cat /hook-was-here; \
                    echo from-task > /hook-data/from-task.$(id -u)";

/// Runs `args` in busybox as `who` with the hooks' variables; srun is
/// killed after `limit_s`.
fn run(cluster: &Cluster, who: Submitter, out: &Path, args: &[&str]) -> common::Run {
    let image = format!("--container-image={}", cluster.image("busybox:latest"));
    let mut all = vec!["-N1", image.as_str()];
    all.extend_from_slice(args);
    let out = out.to_str().unwrap();
    cluster.slurm_env(
        who,
        "srun",
        &all,
        &[
            ("HOOK_OUT", out),
            ("HOOK_DATA", out),
            ("HOOK_JOBVAR", "from-the-job"),
        ],
    )
}

/// No berth mount, loop device or helper of this cluster is left.
fn assert_nothing_left(what: &str) {
    let mut left = Vec::new();
    let clean = common::wait_for(Duration::from_secs(20), || {
        left = common::berth_leftovers();
        left.is_empty()
    });
    assert!(clean, "{what}: left behind:\n{}", left.join("\n"));
}

/// The last line of the nodes' slurmd logs that contains `needle`.
fn log_line(cluster: &Cluster, needle: &str) -> Option<String> {
    let logs: String = ["node1", "node2"]
        .iter()
        .filter_map(|n| {
            std::fs::read_to_string(format!(
                "{}/slurmd-{n}.log",
                cluster.var("BERTH_TEST_LOG_DIR")
            ))
            .ok()
        })
        .collect();
    logs.lines()
        .rev()
        .find(|l| l.contains(needle))
        .map(str::to_string)
}

#[test]
fn a_site_hook_runs_as_the_user_and_its_variable_and_mount_reach_the_task() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    // enroot's bundled 98-nvidia.sh would fail the step: berth leaves it out.
    let site = site_folder(
        &cluster,
        "applied",
        &[
            ("20-site.sh", SITE_HOOK),
            ("98-nvidia.sh", "#!/bin/sh\necho must not run >&2\nexit 1\n"),
            ("30-not-executable.sh", "#!/bin/sh\nexit 1\n"),
        ],
    );
    std::fs::set_permissions(
        site.0.join("hooks.d/30-not-executable.sh"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let _line = PlugstackKeys::add(
        &cluster,
        &format!("enroot_config_path={}", site.0.display()),
    );
    for who in BOTH {
        let out = cluster.shared_dir("hooks-applied");
        let _out_gone = Removed(out.clone());
        std::fs::write(out.join("marker"), "marker from the host\n").unwrap();
        let result = run(&cluster, who, &out, &["sh", "-c", TASK]).ok();
        assert_eq!(
            result.stdout.lines().collect::<Vec<_>>(),
            [
                "var=from-the-hook",
                "marker from the host",
                "written by the hook"
            ],
            "{who:?}: what the hook appended and wrote\n{}",
            result.stderr
        );
        let uid = uid_of(who);
        let seen_file = out.join(format!("seen.{uid}"));
        let seen = std::fs::read_to_string(&seen_file)
            .unwrap_or_else(|e| panic!("{who:?}: the hook wrote no {seen_file:?}: {e}"));
        let gid = std::fs::metadata(&seen_file).unwrap().gid();
        assert_eq!(
            seen,
            format!(
                "uid={uid} gid={gid}\nrootfs=image\nsetting=-comp lzo job=from-the-job\npid=set\n"
            ),
            "{who:?}: the hook runs as the job's user, sees the root, the settings and the job"
        );
        assert_eq!(
            std::fs::metadata(&seen_file).unwrap().uid(),
            uid,
            "{who:?}: the hook's file must be the job user's"
        );
        // The hook's mount is read-write, made with the user's permissions.
        let from_task = out.join(format!("from-task.{uid}"));
        assert_eq!(std::fs::read_to_string(&from_task).unwrap(), "from-task\n");
        assert_eq!(std::fs::metadata(&from_task).unwrap().uid(), uid);
        assert_nothing_left(&format!("{who:?}"));
    }
    let line = log_line(&cluster, &site.0.display().to_string())
        .unwrap_or_else(|| panic!("no log line naming {}", site.0.display()));
    assert!(
        line.contains("enroot's hooks not run, berth does their work: 98-nvidia.sh"),
        "{line}"
    );
    assert!(
        line.contains("30-not-executable.sh is not run: not executable"),
        "{line}"
    );
}

#[test]
fn a_failing_hook_fails_the_step_with_its_name_and_stderr_and_drains_nothing() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let site = site_folder(
        &cluster,
        "fails",
        &[(
            "40-broken.sh",
            "#!/bin/sh\necho 'first line of the hook' >&2\n\
             echo \"license server unreachable for uid $(id -u)\" >&2\nexit 3\n",
        )],
    );
    let _line = PlugstackKeys::add(
        &cluster,
        &format!("enroot_config_path={}", site.0.display()),
    );
    for who in BOTH {
        let out = cluster.shared_dir("hooks-fails");
        let _out_gone = Removed(out.clone());
        let result = run(&cluster, who, &out, &["echo", "task-ran"]).failed();
        assert!(
            !result.stdout.contains("task-ran"),
            "{who:?}: the task must not run\n{}",
            result.stdout
        );
        let expected = format!("license server unreachable for uid {}", uid_of(who));
        assert!(
            result.stderr.contains("site hook 40-broken.sh failed")
                && result.stderr.contains(&expected)
                && result.stderr.contains("first line of the hook"),
            "{who:?}: srun must name the hook and show its stderr\n{}",
            result.stderr
        );
        cluster.assert_nodes_healthy();
        assert_nothing_left(&format!("{who:?}"));
    }
}

#[test]
fn a_hanging_hook_is_killed_at_the_time_limit() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    // The sleeps (one in the background) carry a number no one else uses.
    let site = site_folder(
        &cluster,
        "hangs",
        &[(
            "60-hangs.sh",
            "#!/bin/sh\nsleep 7391 &\necho 'waiting for ever' >&2\nsleep 7391\n",
        )],
    );
    let _line = PlugstackKeys::add(
        &cluster,
        &format!(
            "enroot_config_path={} enroot_hook_timeout=3",
            site.0.display()
        ),
    );
    for who in BOTH {
        let out = cluster.shared_dir("hooks-hangs");
        let _out_gone = Removed(out.clone());
        let started = Instant::now();
        let result = run(&cluster, who, &out, &["echo", "task-ran"]).failed();
        let took = started.elapsed();
        assert!(
            result
                .stderr
                .contains("site hook 60-hangs.sh did not finish within 3 s and was killed")
                && result.stderr.contains("waiting for ever"),
            "{who:?}\n{}",
            result.stderr
        );
        assert!(took < Duration::from_secs(60), "{who:?}: took {took:?}");
        let sleeping = processes_left("sleep 7391");
        assert!(
            sleeping.is_empty(),
            "{who:?}: the hook's processes are left:\n{sleeping}"
        );
        cluster.assert_nodes_healthy();
        assert_nothing_left(&format!("{who:?}"));
    }
}

/// The lines of `ps` whose command contains `needle`, once none is left
/// (or after 10 s).
fn processes_left(needle: &str) -> String {
    let mut found = String::new();
    common::wait_for(Duration::from_secs(10), || {
        found = common::tool("ps", &["-eo", "pid,user,args"])
            .lines()
            .filter(|l| l.contains(needle))
            .collect::<Vec<_>>()
            .join("\n");
        found.is_empty()
    });
    found
}

#[test]
fn a_daemon_a_hook_leaves_in_its_own_session_is_killed() {
    let cluster = cluster_or_skip!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let site = site_folder(
        &cluster,
        "daemon",
        &[(
            "70-daemon.sh",
            "#!/bin/sh\nsetsid sleep 7392 </dev/null >/dev/null 2>&1 &\nexit 0\n",
        )],
    );
    let _line = PlugstackKeys::add(
        &cluster,
        &format!("enroot_config_path={}", site.0.display()),
    );
    for who in BOTH {
        let out = cluster.shared_dir("hooks-daemon");
        let _out_gone = Removed(out.clone());
        let result = run(&cluster, who, &out, &["echo", "task-ran"]).ok();
        assert_eq!(result.stdout.trim(), "task-ran", "{who:?}");
        let left = processes_left("sleep 7392");
        assert!(
            left.is_empty(),
            "{who:?}: the hook's daemon is left:\n{left}"
        );
        assert_nothing_left(&format!("{who:?}"));
    }
}
