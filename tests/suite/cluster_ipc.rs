//! `--container-unshare=ipc` on the real test cluster, as root and as the
//! ordinary user: the container's POSIX shared memory (`/dev/shm`) and
//! message queue mount (`/dev/mqueue`, where the node has one) are its own,
//! not the node's.

use crate::common;

use common::{Cluster, BOTH};

#[test]
fn unshare_ipc_gives_the_container_its_own_dev_shm() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("busybox:latest");
    for who in BOTH {
        // One node: plain steps see the node's /dev/shm, container steps
        // their own (or the node's, without --container-unshare=ipc).
        let script = format!(
            r#"
S='srun --overlap -n1'
node=/dev/shm/berth-ipc-node-$SLURM_JOB_ID
inside=/dev/shm/berth-ipc-inside-$SLURM_JOB_ID
$S sh -c "echo node > $node"
$S --container-image={image} --container-unshare=ipc sh -c "
    test -e $node && echo SEES-NODE-SHM || echo own-shm
    echo inside > $inside && echo wrote-inside
    grep ' /dev/shm ' /proc/self/mountinfo | grep -q ' - tmpfs ' && echo shm-is-tmpfs
    ls -ld /dev/shm | cut -c1-10
    if test -d /dev/mqueue; then stat -c mqueue=%d /dev/mqueue; fi"
$S sh -c "test -e $inside && echo NODE-SEES-INSIDE || echo node-untouched
    if test -d /dev/mqueue; then stat -c node-mqueue=%d /dev/mqueue; fi"
$S --container-image={image} sh -c "test -e $node && echo shared-without-unshare"
$S rm -f $node $inside
"#
        );
        let run = cluster.slurm(who, "salloc", &["-N1", "sh", "-c", &script]);
        let out = format!("{}\n{}", run.stdout, run.stderr);
        for wanted in [
            "own-shm",
            "wrote-inside",
            "shm-is-tmpfs",
            "drwxrwxrwt",
            "node-untouched",
            "shared-without-unshare",
        ] {
            assert!(out.contains(wanted), "{who:?}: no '{wanted}': {out}");
        }
        assert!(!out.contains("SEES-NODE-SHM"), "{who:?}: {out}");
        assert!(!out.contains("NODE-SEES-INSIDE"), "{who:?}: {out}");
        let value = |prefix: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .map(str::to_string)
        };
        if let (Some(inside), Some(node)) = (value("mqueue="), value("node-mqueue=")) {
            assert_ne!(inside, node, "{who:?}: the node's mqueue mount: {out}");
        }
    }
}
