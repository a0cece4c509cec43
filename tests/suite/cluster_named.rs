//! Named containers (`--container-name`) and `--container-save` on the real
//! test cluster, as root and as the ordinary test user (see tests/suite/common).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use common::{Cluster, PlugstackKeys, Submitter, BOTH};

macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => cluster,
            None => return,
        }
    };
}

/// The global-scope test rewrites the plugstack line; the other tests here
/// must not run meanwhile (their containers would become global).
static SCOPE: Mutex<()> = Mutex::new(());

fn scope_lock() -> std::sync::MutexGuard<'static, ()> {
    SCOPE.lock().unwrap_or_else(|p| p.into_inner())
}

fn uid_of(who: Submitter) -> u32 {
    match who {
        Submitter::Root => 0,
        Submitter::User => {
            let out = std::process::Command::new("id")
                .args(["-u", common::TEST_USER])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        }
    }
}

/// The installed `berth` of the cluster.
fn berth(cluster: &Cluster) -> PathBuf {
    Path::new(&cluster.var("BERTH_TEST_STATE_DIR")).join("prefix/bin/berth")
}

/// Runs `script` (sh) in a one-node allocation as `who`; `srun` steps in it
/// share the node (`S` is `srun --overlap -n1`). Returns the run, the job id
/// and the node.
fn in_allocation(cluster: &Cluster, who: Submitter, script: &str) -> (common::Run, u32, String) {
    let full = format!(
        "S='srun --overlap -n1'\necho JOB=$SLURM_JOB_ID NODE=$SLURM_JOB_NODELIST\n{script}"
    );
    let run = cluster.slurm(who, "salloc", &["-N1", "sh", "-c", &full]);
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("JOB="))
        .unwrap_or_else(|| panic!("no JOB= line\n{}\n{}", run.stdout, run.stderr))
        .to_string();
    let mut fields = line.split_whitespace();
    let job = fields.next().unwrap()["JOB=".len()..].parse().unwrap();
    let node = fields.next().unwrap()["NODE=".len()..].to_string();
    (run, job, node)
}

/// Mount table lines, in every mount namespace of the host, that mention `needle`.
fn mounts_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) {
            found.extend(
                text.lines()
                    .filter(|l| l.contains(needle))
                    .map(|l| format!("pid {pid}: {l}")),
            );
        }
    }
    found
}

/// The image's own `/tmp` (1777) instead of the node's: the one place of the
/// test image's root file system the ordinary user may write to.
const IMAGE_TMP: &str = "--container-mounts=umount:/tmp";

fn assert_has(text: &str, needle: &str, context: &str) {
    assert!(text.contains(needle), "{context}: no '{needle}' in\n{text}");
}

#[test]
fn named_container_keeps_its_root_between_steps_and_goes_with_the_job() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        // Only root may delete the image's files (a whiteout in the kept root).
        let remove = match who {
            Submitter::Root => "rm /etc/os-release",
            Submitter::User => "true",
        };
        let script = format!(
            r#"
img={image}
M={IMAGE_TMP}
$S --container-image=$img --container-name=keep $M sh -c 'echo one > /tmp/kept-file && {remove}' && echo step1-ok
$S --container-name=keep $M sh -c 'cat /tmp/kept-file; test -e /etc/os-release || echo os-release-gone'
$S --container-image=$img $M sh -c 'test -e /tmp/kept-file && echo LEAK || echo unnamed-fresh'
$S --container-name=keep:no_exec $M cat /tmp/kept-file | sed 's/^/no_exec:/'
$S --container-name=keep:create true 2>&1 | sed 's/^/create:/'
$S --container-name=keep:exec true 2>&1 | sed 's/^/exec:/'
$S --container-name=nothere true 2>&1 | sed 's/^/missing:/'
$S --container-name=fresh:create --container-image=$img $M sh -c 'test -e /tmp/kept-file && echo LEAK || echo created-fresh'
"#
        );
        let (run, job, node) = in_allocation(&cluster, who, &script);
        let out = format!("{}\n{}", run.stdout, run.stderr);
        let ctx = format!("{who:?}");
        assert_has(&out, "step1-ok", &ctx);
        assert!(run.stdout.lines().any(|l| l == "one"), "{ctx}: {out}");
        if who == Submitter::Root {
            assert_has(&out, "os-release-gone", &ctx);
        }
        assert_has(&out, "unnamed-fresh", &ctx);
        assert_has(&out, "no_exec:one", &ctx);
        assert_has(&out, "already exists", &ctx);
        assert_has(&out, "no step on this node runs container 'keep'", &ctx);
        assert_has(&out, "--container-image is not given", &ctx);
        assert_has(&out, "created-fresh", &ctx);
        assert!(!out.contains("LEAK"), "{ctx}: {out}");

        // Scope job: the epilog removes the containers; no mount is left.
        let job_dir = cluster
            .node_store(&node)
            .join("containers")
            .join(uid_of(who).to_string())
            .join(format!("job-{job}"));
        assert!(
            common::wait_for(Duration::from_secs(30), || !job_dir.exists()),
            "{ctx}: {} still exists after the job",
            job_dir.display()
        );
        let left = mounts_mentioning(&format!("/job-{job}/"));
        assert!(left.is_empty(), "{ctx}: mounts left: {left:#?}");
    }
}

#[test]
fn exec_joins_the_running_step_and_no_exec_waits_for_it() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        // Step 1 keeps running with a tmpfs only its mount namespace has.
        let script = format!(
            r#"
stop=/tmp/berth-named-stop-$SLURM_JOB_ID
rm -f $stop
$S --container-image={image} --container-name=live --container-mounts=tmpfs:/scratch sh -c "echo inside > /scratch/marker.new && mv /scratch/marker.new /scratch/marker; while [ ! -e $stop ]; do sleep 0.1; done" &
bg=$!
out=none
for i in $(seq 1 100); do
    out=$($S --container-name=live:exec cat /scratch/marker 2>/dev/null) && break
    sleep 0.2
done
echo "exec:$out"
$S --container-name=live cat /scratch/marker | sed 's/^/auto:/'
$S --container-name=live --container-mounts=/etc:/joined-etc sh -c 'test -e /joined-etc && echo MOUNTED; true' 2>&1 | sed 's/^/mounts:/'
$S --container-name=live:no_exec sh -c 'test -e /scratch/marker && echo LEAK || echo waited-own-namespaces' 2>&1 &
waiting=$!
sleep 1
$S touch $stop
wait $bg && echo step1-done
wait $waiting
rm -f $stop
$S --container-name=live:no_exec sh -c 'test -e /scratch/marker && echo LEAK || echo own-namespaces'
$S --container-name=live:exec true 2>&1 | sed 's/^/exec-after:/'
"#
        );
        let (run, _, _) = in_allocation(&cluster, who, &script);
        let out = format!("{}\n{}", run.stdout, run.stderr);
        let ctx = format!("{who:?}");
        assert_has(&out, "exec:inside", &ctx);
        assert_has(&out, "auto:inside", &ctx);
        // Joining keeps the running container's mounts, and says so.
        assert_has(
            &out,
            "warning: ignoring --container-mounts=/etc:/joined-etc: container 'live' is already \
             running",
            &ctx,
        );
        assert!(!out.contains("MOUNTED"), "{ctx}: {out}");
        // no_exec while the container runs waits for that step to end, then
        // starts on the kept root in namespaces of its own.
        assert_has(&out, "no_exec: waiting (up to 60 s) for step", &ctx);
        assert_has(&out, "waited-own-namespaces", &ctx);
        assert_has(&out, "step1-done", &ctx);
        assert_has(&out, "own-namespaces", &ctx);
        assert_has(&out, "no step on this node runs container 'live'", &ctx);
        assert!(!out.contains("LEAK"), "{ctx}: {out}");
    }
}

#[test]
fn global_containers_persist_across_jobs_and_stay_private() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("busybox:latest");
    let node = cluster.first_node();
    let store = cluster.node_store(&node);
    let name = format!("g{}", std::process::id());
    let berth = berth(&cluster);
    let store_arg = format!("--store={}", store.display());
    let _global = PlugstackKeys::add(&cluster, "container_scope=global");
    let srun = |who: Submitter, args: &[&str]| {
        let mut all = vec!["-N1", "-w", &node];
        all.extend_from_slice(args);
        cluster.srun(who, &all)
    };
    let named = format!("--container-name={name}");
    let with_image = format!("--container-image={image}");
    for who in BOTH {
        let mark = format!("echo {who:?} > /tmp/owner");
        srun(who, &[&with_image, &named, IMAGE_TMP, "sh", "-c", &mark]).ok();
    }
    // Second jobs: each user finds their own container, not the other's.
    for who in BOTH {
        let run = srun(who, &[&named, IMAGE_TMP, "cat", "/tmp/owner"]).ok();
        assert_eq!(run.stdout.trim(), format!("{who:?}"), "{who:?}");
    }
    let root_dir = store.join("containers/0/global").join(&name);
    assert!(root_dir.join("upper/tmp/owner").is_file());
    // The user cannot look into root's containers folder.
    let peek = std::process::Command::new("runuser")
        .args(["-u", common::TEST_USER, "--", "ls"])
        .arg(store.join("containers/0"))
        .output()
        .unwrap();
    assert!(
        !peek.status.success(),
        "berthuser can list root's containers"
    );

    // berth containers list / rm (root, the admin).
    let list = std::process::Command::new(&berth)
        .args(["containers", "list", &store_arg])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{text}");
    assert!(
        text.lines()
            .filter(|l| l.contains(&name) && l.contains("global"))
            .count()
            == 2,
        "{text}"
    );
    for user in ["root", common::TEST_USER] {
        let rm = std::process::Command::new(&berth)
            .args(["containers", "rm", &store_arg, "--user", user, &name])
            .output()
            .unwrap();
        assert!(
            rm.status.success(),
            "{}",
            String::from_utf8_lossy(&rm.stderr)
        );
    }
    assert!(!root_dir.exists());
    let run = srun(Submitter::User, &[&named, "true"]).failed();
    assert_has(&run.stderr, "no container named", "after rm");
    let by_user = std::process::Command::new("runuser")
        .args(["-u", common::TEST_USER, "--"])
        .arg(&berth)
        .args(["containers", "list", &store_arg])
        .output()
        .unwrap();
    assert!(!by_user.status.success());
    assert_has(
        &String::from_utf8_lossy(&by_user.stderr),
        "srun --container-list",
        "berth containers as a user",
    );
}

/// Users list and remove their own named containers through srun
/// (`--container-list`, `--container-remove`): root does it in slurmstepd
/// for the uid Slurm authenticated, so another user's container of the same
/// name stays, and one a running step uses is refused.
#[test]
fn users_list_and_remove_their_own_named_containers_through_srun() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("busybox:latest");
    let node = cluster.first_node();
    let store = cluster.node_store(&node);
    let name = format!("m{}", std::process::id());
    let root_only = format!("{name}-root");
    let _global = PlugstackKeys::add(&cluster, "container_scope=global");
    let srun = |who: Submitter, args: &[&str]| {
        let mut all = vec!["-N1", "-w", &node];
        all.extend_from_slice(args);
        cluster.srun(who, &all)
    };
    let with_image = format!("--container-image={image}");
    for (who, container) in [
        (Submitter::Root, name.as_str()),
        (Submitter::Root, root_only.as_str()),
        (Submitter::User, name.as_str()),
    ] {
        let named = format!("--container-name={container}");
        srun(who, &[&with_image, &named, "true"]).ok();
    }
    let user_dir = store
        .join("containers")
        .join(uid_of(Submitter::User).to_string())
        .join("global")
        .join(&name);
    let root_dir = store.join("containers/0/global").join(&name);
    assert!(user_dir.is_dir() && root_dir.is_dir());

    // The user's list shows their own container, not root's.
    let list = srun(Submitter::User, &["--container-list", "true"]).ok();
    let mine: Vec<&str> = list
        .stderr
        .lines()
        .filter(|l| l.contains("berth:") && l.contains(&name))
        .collect();
    assert_eq!(mine.len(), 1, "user's list:\n{}", list.stderr);
    assert!(
        mine[0].contains("global") && mine[0].contains("busybox"),
        "{}",
        mine[0]
    );
    assert!(
        !list.stderr.contains(&root_only),
        "root's container listed to the user:\n{}",
        list.stderr
    );

    // Not while a step runs it: the step fails and says which step.
    let script = format!(
        "S='srun --overlap -n1'; $S --container-name={name} sleep 8 & sleep 3; \
         $S --container-remove={name} true; echo remove_rc=$?; wait"
    );
    let run = cluster.slurm(
        Submitter::User,
        "salloc",
        &["-N1", "-w", &node, "sh", "-c", &script],
    );
    assert_has(&run.stdout, "remove_rc=1", "removing a container in use");
    assert_has(&run.stderr, "in use by step", "removing a container in use");
    assert!(user_dir.is_dir(), "a container in use was removed");

    // Removed: the user's only; root's of the same name stays.
    let rm = srun(
        Submitter::User,
        &[&format!("--container-remove={name}"), "true"],
    )
    .ok();
    assert_has(
        &rm.stderr,
        &format!("removed named container '{name}'"),
        "user rm",
    );
    assert!(!user_dir.exists(), "the user's container is still there");
    assert!(
        root_dir.is_dir(),
        "the user's --container-remove removed root's container"
    );
    let run = srun(
        Submitter::User,
        &[&format!("--container-name={name}"), "true"],
    )
    .failed();
    assert_has(&run.stderr, "no container named", "after the user's rm");
    // Again: nothing to remove, and no failure.
    let again = srun(
        Submitter::User,
        &[&format!("--container-remove={name}"), "true"],
    )
    .ok();
    assert_has(&again.stderr, "nothing to remove", "second rm");

    // Bad uses, refused before anything runs.
    let remove = format!("--container-remove={name}");
    for (args, expected) in [
        (
            &[with_image.as_str(), &remove, "true"][..],
            "cannot be combined with --container-image",
        ),
        (
            &["--container-remove=a,,b", "true"][..],
            "empty container name",
        ),
    ] {
        srun(Submitter::User, args).failed_with(expected, &format!("{args:?}"));
    }
    let run = cluster.slurm(
        Submitter::User,
        "sbatch",
        &["-N1", "--container-list", "--wrap", "true"],
    );
    assert_ne!(run.code, 0, "sbatch --container-list was accepted");
    assert_has(&run.stderr, "give them to srun", "sbatch --container-list");

    // Root removes its own the same way.
    let names = format!("--container-remove={name},{root_only}");
    srun(Submitter::Root, &[&names, "true"]).ok();
    assert!(!root_dir.exists());
    let list = srun(Submitter::Root, &["--container-list", "true"]).ok();
    assert!(!list.stderr.contains(&name), "{}", list.stderr);
}

/// With the default scope (`job`), `--container-remove` removes the
/// container of the job it runs in.
#[test]
fn remove_in_job_scope_removes_this_jobs_container() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        let script = format!(
            "$S --container-image={image} --container-name=j {IMAGE_TMP} sh -c 'echo kept > /tmp/k'\n\
             $S --container-list true\n\
             $S --container-remove=j true; echo remove_rc=$?\n\
             $S --container-name=j {IMAGE_TMP} cat /tmp/k; echo reuse_rc=$?"
        );
        let (run, job, _) = in_allocation(&cluster, who, &script);
        assert_has(&run.stderr, &format!("job {job}"), "listed in job scope");
        assert_has(&run.stdout, "remove_rc=0", "rm in job scope");
        assert_has(
            &run.stderr,
            "removed named container 'j'",
            "rm in job scope",
        );
        assert_has(
            &run.stdout,
            "reuse_rc=1",
            "the removed container was found again",
        );
        assert_has(&run.stderr, "no container named", "after rm in job scope");
    }
}

#[test]
fn save_writes_an_image_the_user_owns_and_can_run() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    let work = cluster.var("BERTH_TEST_WORKDIR");
    for who in BOTH {
        let remove = match who {
            Submitter::Root => "rm /etc/os-release",
            Submitter::User => "true",
        };
        let saved = format!("{work}/saved-{who:?}-{}.sqfs", std::process::id());
        let _ = std::fs::remove_file(&saved);
        cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={image}"),
                    &format!("--container-save={saved}"),
                    IMAGE_TMP,
                    "sh",
                    "-c",
                    &format!("echo saved > /tmp/saved-file && {remove}"),
                ],
            )
            .ok();
        let meta = std::fs::metadata(&saved).unwrap_or_else(|e| panic!("{who:?}: {saved}: {e}"));
        assert_eq!(
            std::os::unix::fs::MetadataExt::uid(&meta),
            uid_of(who),
            "{who:?}: owner of the saved file"
        );
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={saved}"),
                    IMAGE_TMP,
                    "sh",
                    "-c",
                    "cat /tmp/saved-file; test -e /etc/os-release && echo os-release-there \
                     || echo whiteout-kept; test -x /bin/busybox && echo image-kept",
                ],
            )
            .ok();
        assert_has(&run.stdout, "saved", &format!("{who:?}"));
        let whiteout = match who {
            Submitter::Root => "whiteout-kept",
            Submitter::User => "os-release-there",
        };
        assert_has(&run.stdout, whiteout, &format!("{who:?}"));
        assert_has(&run.stdout, "image-kept", &format!("{who:?}"));
        let _ = std::fs::remove_file(&saved);
    }
}

#[test]
fn save_relative_multi_node_and_bad_paths() {
    let cluster = cluster_or_skip!();
    let image = cluster.image("busybox:latest");
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let with_image = format!("--container-image={image}");
    // Relative to the job's working directory; two nodes write the same path.
    let relative = format!("rel-{}.sqfs", std::process::id());
    cluster
        .srun(
            Submitter::User,
            &[
                "-N2",
                &with_image,
                &format!("--container-save={relative}"),
                IMAGE_TMP,
                "sh",
                "-c",
                "echo $SLURMD_NODENAME > /tmp/node",
            ],
        )
        .ok();
    let saved = format!("{work}/{relative}");
    let run = cluster
        .srun(
            Submitter::User,
            &[
                "-N1",
                &format!("--container-image={saved}"),
                IMAGE_TMP,
                "cat",
                "/tmp/node",
            ],
        )
        .ok();
    assert!(!run.stdout.trim().is_empty(), "{}", run.stderr);
    let _ = std::fs::remove_file(&saved);

    // Bad targets, each refused with what to do; a folder for a file before
    // anything is allocated.
    let refusals = [
        (
            Submitter::User,
            "/root/not-yours.sqfs",
            "you cannot write to folder /root",
        ),
        (
            Submitter::Root,
            "/nonexistent-berth/x.sqfs",
            "/nonexistent-berth does not exist",
        ),
        (Submitter::User, "/tmp/", "ends with '/'"),
    ]
    .map(|(who, target, expected)| {
        let save = format!("--container-save={target}");
        cluster
            .srun(who, &["-N1", &with_image, &save, "true"])
            .failed_with(expected, &save)
    });
    let run = &refusals[2];
    assert!(
        !run.stderr.contains("Granted job allocation"),
        "{}",
        run.stderr
    );
}

#[test]
fn named_container_saves_its_kept_root() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("busybox:latest");
    let work = cluster.var("BERTH_TEST_WORKDIR");
    let saved = format!("{work}/named-saved-{}.sqfs", std::process::id());
    let script = format!(
        r#"
$S --container-image={image} --container-name=tosave {IMAGE_TMP} sh -c 'echo first > /tmp/first'
$S --container-name=tosave --container-save={saved} {IMAGE_TMP} sh -c 'echo second > /tmp/second' && echo saved-ok
"#
    );
    let (run, _, _) = in_allocation(&cluster, Submitter::User, &script);
    assert_has(&run.stdout, "saved-ok", &run.stderr);
    let run = cluster
        .srun(
            Submitter::User,
            &[
                "-N1",
                &format!("--container-image={saved}"),
                IMAGE_TMP,
                "cat",
                "/tmp/first",
                "/tmp/second",
            ],
        )
        .ok();
    assert_eq!(run.stdout, "first\nsecond\n");
    let _ = std::fs::remove_file(&saved);
}

/// The ids `who`'s files have inside a container without remap-root: the
/// image's root-owned files show as the user's own (pyxis + enroot do so too).
fn ids_inside(who: Submitter) -> String {
    let id = |flag: &str| {
        let out = std::process::Command::new("id")
            .args([flag, common::TEST_USER])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    match who {
        Submitter::Root => "0:0".to_string(),
        Submitter::User => format!("{}:{}", id("-u"), id("-g")),
    }
}

/// `uid/gid` of `path` (inside the image) as stored in squashfs file `image`.
fn owner_in_squashfs(image: &str, path: &str) -> String {
    let listing = common::tool("unsquashfs", &["-lln", image, path]);
    let line = listing
        .lines()
        .find(|l| l.ends_with(&format!("squashfs-root{path}")))
        .unwrap_or_else(|| panic!("{path} not in {image}:\n{listing}"));
    line.split_whitespace().nth(1).unwrap().to_string()
}

#[test]
fn kept_and_saved_changes_of_image_files_keep_their_owners() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("debian:bookworm");
    let work = cluster.var("BERTH_TEST_WORKDIR");
    for who in BOTH {
        let ids = ids_inside(who);
        let ctx = format!("{who:?}");
        let named_saved = format!("{work}/owned-named-{who:?}-{}.sqfs", std::process::id());
        let remapped_saved = format!("{work}/owned-remap-{who:?}-{}.sqfs", std::process::id());
        // Writes in the image's own folders (root's on disk), kept by the
        // named container from one step to the next, then saved.
        let script = format!(
            r#"
$S --container-image={image} --container-name=owned sh -c 'echo kept > /etc/kept-file && mkdir /opt/kept-dir && rm /etc/issue' && echo step1-ok
$S --container-name=owned --container-save={named_saved} sh -c 'cat /etc/kept-file; stat -c "%u:%g %n" /etc/kept-file /opt/kept-dir /etc; test -e /etc/issue || echo whiteout-kept; echo more >> /etc/kept-file && echo step2-writes'
"#
        );
        let (run, _, _) = in_allocation(&cluster, who, &script);
        let out = format!("{}\n{}", run.stdout, run.stderr);
        assert_has(&out, "step1-ok", &ctx);
        assert!(run.stdout.lines().any(|l| l == "kept"), "{ctx}: {out}");
        for path in ["/etc/kept-file", "/opt/kept-dir", "/etc"] {
            assert_has(&out, &format!("{ids} {path}\n"), &ctx);
        }
        assert_has(&out, "whiteout-kept", &ctx);
        assert_has(&out, "step2-writes", &ctx);

        // With remap-root, what "root" writes is the user's on the host and
        // root's again in the saved image.
        cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={image}"),
                    "--container-remap-root",
                    &format!("--container-save={remapped_saved}"),
                    "sh",
                    "-c",
                    "mkdir -p /var/lib/berth && echo saved > /var/lib/berth/saved-file && \
                     chown root:root /var/lib/berth/saved-file",
                ],
            )
            .ok();

        // Saved: a normal image, owned by root inside, whoever saved it.
        for (saved, path) in [
            (&named_saved, "/etc/kept-file"),
            (&named_saved, "/opt/kept-dir"),
            (&named_saved, "/etc"),
            (&named_saved, "/etc/passwd"),
            (&remapped_saved, "/var/lib/berth/saved-file"),
            (&remapped_saved, "/var/lib/berth"),
            (&remapped_saved, "/var/lib"),
        ] {
            assert_eq!(
                owner_in_squashfs(saved, path),
                "0/0",
                "{ctx}: {saved} {path}"
            );
        }
        // Other owners stay theirs (Debian's /etc/shadow is root:shadow, 0/42).
        assert_eq!(
            owner_in_squashfs(&named_saved, "/etc/shadow"),
            "0/42",
            "{ctx}"
        );
        // Run again: the saved files are the user's inside, like the image's.
        for (saved, path) in [
            (&named_saved, "/etc/kept-file"),
            (&remapped_saved, "/var/lib/berth/saved-file"),
        ] {
            let run = cluster
                .srun(
                    who,
                    &[
                        "-N1",
                        &format!("--container-image={saved}"),
                        "sh",
                        "-c",
                        &format!("cat {path}; stat -c %u:%g {path}; echo again >> {path} && echo rewritten"),
                    ],
                )
                .ok();
            assert!(
                run.stdout.starts_with("kept\nmore\n") || run.stdout.starts_with("saved\n"),
                "{ctx}: {}",
                run.stdout
            );
            assert_has(&run.stdout, &format!("{ids}\nrewritten"), &ctx);
        }
        let _ = std::fs::remove_file(&named_saved);
        let _ = std::fs::remove_file(&remapped_saved);
    }
}

#[test]
fn joining_with_a_namespace_the_running_container_lacks_is_refused() {
    let cluster = cluster_or_skip!();
    let _scope = scope_lock();
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        // Step 1 runs 'nsjoin' with a UTS namespace of its own, no IPC or
        // network namespace.
        let script = format!(
            r#"
stop=/tmp/berth-named-ns-stop-$SLURM_JOB_ID
rm -f $stop
$S --container-image={image} --container-name=nsjoin --container-unshare=uts sh -c "while [ ! -e $stop ]; do sleep 0.1; done" &
bg=$!
for i in $(seq 1 100); do
    $S --container-name=nsjoin:exec true 2>/dev/null && break
    sleep 0.2
done
$S --container-name=nsjoin --container-unshare=ipc sh -c 'echo RAN-ipc' 2>&1 | sed 's/^/ipc:/'
$S --container-name=nsjoin --container-unshare=net,uts sh -c 'echo RAN-net' 2>&1 | sed 's/^/net:/'
$S --container-name=nsjoin --container-unshare=uts sh -c 'echo RAN-uts'
$S touch $stop
wait $bg && echo step1-done
rm -f $stop
"#
        );
        let (run, _, _) = in_allocation(&cluster, who, &script);
        let out = format!("{}\n{}", run.stdout, run.stderr);
        let ctx = format!("{who:?}");
        assert!(
            !out.contains("RAN-ipc"),
            "{ctx}: ran in the node's IPC namespace: {out}"
        );
        assert!(
            !out.contains("RAN-net"),
            "{ctx}: ran in the node's network: {out}"
        );
        assert_has(
            &out,
            "--container-unshare=ipc: container 'nsjoin' is already running",
            &ctx,
        );
        assert_has(&out, "without its own ipc namespace", &ctx);
        assert_has(&out, "without its own net namespace", &ctx);
        assert_has(&out, "RAN-uts", &ctx);
        assert_has(&out, "step1-done", &ctx);
    }
}
