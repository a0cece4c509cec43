//! Joining and queueing on the containers of other steps, on the real test
//! cluster, as root and as the ordinary test user: an unnamed step's
//! container joined as `--container-name=JOB.STEP` (pyxis's name for it),
//! and many `NAME:no_exec` steps at once on a few named containers (pyxis's
//! own suite, `concurrency.bats`, does the same).

use crate::common;

use common::{Cluster, Submitter, BOTH};

/// Runs `script` (sh) in a one-node allocation as `who`; `srun` steps in it
/// share the node (`S` is `srun --overlap -n1`).
fn in_allocation(cluster: &Cluster, who: Submitter, script: &str) -> common::Run {
    let full = format!("S='srun --overlap -n1'\n{script}");
    cluster.slurm(who, "salloc", &["-N1", "sh", "-c", &full])
}

fn assert_has(text: &str, needle: &str, context: &str) {
    assert!(text.contains(needle), "{context}: no '{needle}' in\n{text}");
}

#[test]
fn another_step_joins_an_unnamed_container_as_job_dot_step() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        // The first step runs unnamed with a tmpfs only its mount namespace
        // has; the later steps find it by the name JOB.STEP while it runs,
        // and no more once it has ended.
        let script = format!(
            r#"
stop=/tmp/berth-unnamed-stop-$SLURM_JOB_ID
rm -f $stop
$S --container-image={image} --container-mounts=tmpfs:/scratch sh -c "echo unnamed-inside > /scratch/marker; while [ ! -e $stop ]; do sleep 0.1; done" &
bg=$!
# Its step id, once Slurm lists it (not always 0: a later srun may win the race).
id=
for i in $(seq 1 100); do
    id=$(squeue -h -s -j $SLURM_JOB_ID -o %i | grep -E '^[0-9]+\.[0-9]+$' | head -1)
    [ -n "$id" ] && break
    sleep 0.1
done
out=none
for i in $(seq 1 100); do
    out=$($S --container-name=$id cat /scratch/marker 2>/dev/null) && break
    sleep 0.2
done
echo "join:$out"
$S --container-name=$id:exec sh -c 'echo "exec:$(cat /scratch/marker)"'
$S touch $stop
wait $bg && echo step0-done
rm -f $stop
$S --container-name=$id:exec true 2>&1 | sed 's/^/after:/'
"#
        );
        let run = in_allocation(&cluster, who, &script);
        let out = format!("{}\n{}", run.stdout, run.stderr);
        let ctx = format!("{who:?}");
        assert_has(&out, "join:unnamed-inside", &ctx);
        assert_has(&out, "exec:unnamed-inside", &ctx);
        assert_has(&out, "step0-done", &ctx);
        // The record goes with the step.
        assert_has(&out, "no step on this node runs container", &ctx);
    }
}

#[test]
fn concurrent_no_exec_steps_take_turns_on_each_kept_root() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        // Three named containers, then 15 staggered no_exec steps on them at
        // once: each waits for the step running its container, none fails,
        // and every step's change stays in its container's root. The image's
        // own /tmp (umount:/tmp) is writable by the ordinary user too.
        let script = format!(
            r#"
for c in 0 1 2; do
    $S --container-image={image} --container-name=turns-$c --container-mounts=umount:/tmp true || echo CREATE-FAILED
done
pids=
for i in $(seq 1 15); do
    $S --container-name=turns-$((i % 3)):no_exec --container-mounts=umount:/tmp sh -c "echo $i >> /tmp/turns; sleep 0.5" &
    pids="$pids $!"
    sleep 0.1
done
failed=0
for p in $pids; do wait $p || failed=$((failed + 1)); done
echo "failed=$failed"
for c in 0 1 2; do
    $S --container-name=turns-$c --container-mounts=umount:/tmp sh -c "echo turns-$c=\$(wc -l < /tmp/turns)"
done
"#
        );
        let run = in_allocation(&cluster, who, &script);
        let out = format!("{}\n{}", run.stdout, run.stderr);
        let ctx = format!("{who:?}");
        assert!(!out.contains("CREATE-FAILED"), "{ctx}: {out}");
        assert_has(&out, "failed=0", &ctx);
        for c in 0..3 {
            assert_has(&out, &format!("turns-{c}=5"), &ctx);
        }
    }
}
