//! MPI in containers on the real test cluster: host MPI injection (the bind
//! approach) with its ABI checks, PMI2 and PMIx across nodes, as root and as
//! the ordinary user. Profiles live in the cluster's `inject_dir`
//! (`$BERTH_TEST_STATE_DIR/inject.d`, set on the plugstack line by
//! tests/run.sh); each test writes its own.
//!
//! The test nodes are network namespaces of one kernel. Each also has its own
//! IPC namespace (tests/harness/cluster.sh), from which UCX tells them apart
//! like real nodes: the `ucx_defaults` tests run several ranks per node with
//! UCX's defaults (shared memory within a node, TCP between nodes); the
//! older MPICH runs still set `UCX_TLS=tcp,self`.

use crate::common;

use std::path::PathBuf;

use common::{Cluster, Run, Submitter, BOTH};

/// MPI jobs of these tests run one at a time: two MPICH jobs over UCX/TCP at
/// once on the same two network-namespace nodes of one 2-core machine have
/// stalled (a rank waiting in a PMI2 fence while its peer waits on it).
static ONE_MPI_JOB_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The cluster and the MPI-job lock (held until the test ends), or return
/// when no cluster is configured.
macro_rules! cluster_or_skip {
    () => {
        match Cluster::get() {
            Some(cluster) => (
                cluster,
                ONE_MPI_JOB_AT_A_TIME
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            ),
            None => return,
        }
    };
}

/// How long one MPI srun of these tests may take (they take seconds).
const MPI_JOB_LIMIT_S: u32 = 150;

/// `srun ARGS` of an MPI job as `who`, run again once when its ranks hung
/// after the job's work was done (rank 0 printed its allreduce line, then
/// the step ran out of time): UCX's TCP transport can hang in
/// `MPI_Finalize` while flushing endpoints (openucx/ucx#8738, UCX 1.13 of
/// Debian 12), which these network-namespace nodes need. A hang before the
/// allreduce, or a second hang, is returned as it is and fails the test.
fn srun_mpi(cluster: &Cluster, who: Submitter, args: &[&str]) -> Run {
    let run = cluster.srun_within(who, MPI_JOB_LIMIT_S, args);
    let hung_in_finalize = run.code == 124 && run.stdout.contains("allreduce sum=");
    if !hung_in_finalize {
        return run;
    }
    eprintln!(
        "{who:?}: the MPI job hung after its allreduce (UCX/TCP finalize, \
         openucx/ucx#8738); running it once more\n--- stdout\n{}\n--- stderr\n{}",
        run.stdout, run.stderr
    );
    cluster.srun_within(who, MPI_JOB_LIMIT_S, args)
}

/// Writes profile `name` with `text` into the cluster's inject_dir.
fn write_profile(cluster: &Cluster, name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(cluster.var("BERTH_TEST_STATE_DIR")).join("inject.d");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.conf"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The host's MPICH library file (Debian's libmpich12).
fn host_libmpich() -> PathBuf {
    std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libmpich.so.12")
        .expect("the host needs Debian's libmpich12 (tests/harness/install-deps.sh)")
}

#[test]
fn host_mpich_is_injected_and_runs_over_pmi2_across_nodes() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    write_profile(
        &cluster,
        "test-mpich",
        "# host MPICH for tests/suite/cluster_mpi.rs\nlibrary = libmpich.so.12\nenv = BERTH_TEST_MPI_PROFILE=test-mpich\n\
         # the test nodes share one kernel: keep UCX off shared memory between them\n\
         env = UCX_TLS=tcp,self\n",
    );
    let host_file = host_libmpich();
    let host_name = host_file.file_name().unwrap().to_str().unwrap().to_string();
    let image = cluster.image("mpich:bookworm");
    for who in BOTH {
        let run = srun_mpi(
            &cluster,
            who,
            &[
                "--mpi=pmi2",
                // One rank per node: the ranks talk across nodes only
                // (UCX over TCP between ranks of one node can stall on
                // this shared 2-core test machine).
                "-N2",
                "--ntasks-per-node=1",
                &format!("--container-image={image}"),
                "--container-mpi=test-mpich",
                "sh",
                "-c",
                "echo profile=$BERTH_TEST_MPI_PROFILE; \
                     grep -c ' /usr/local/lib/berth/libmpich.so.12 ' /proc/self/mountinfo; \
                     grep -o ' /usr/lib/x86_64-linux-gnu/libmpich[^ ]* ' /proc/self/mountinfo; \
                     ldconfig -p | grep -m1 'libmpich.so.12 '; \
                     mpi_hello",
            ],
        )
        .ok();
        let out = &run.stdout;
        assert!(out.contains("profile=test-mpich"), "{who:?}: {out}");
        assert!(
            out.contains(&format!("/usr/lib/x86_64-linux-gnu/{host_name}")),
            "{who:?}: the image's copy is not covered by the host's: {out}"
        );
        assert!(
            out.contains("=> /usr/local/lib/berth/libmpich.so.12"),
            "{who:?}: the loader does not know the injected library first: {out}"
        );
        assert!(
            out.contains("allreduce sum=1 expected=1 ok"),
            "{who:?}: {out}\n{}",
            run.stderr
        );
        for node in ["node1", "node2"] {
            assert!(out.contains(&format!("on {node}")), "{who:?}: {out}");
        }
    }
}

#[test]
fn image_mpich_runs_over_pmi2_without_injection() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    let image = cluster.image("mpich:bookworm");
    for who in BOTH {
        let run = srun_mpi(
            &cluster,
            who,
            &[
                "--mpi=pmi2",
                "-N2",
                "-n2",
                &format!("--container-image={image}"),
                "sh",
                "-c",
                "test -z \"$PMI_FD\" && echo no PMI_FD; \
                     test -e /usr/local/lib/berth && echo injected; \
                     export UCX_TLS=tcp,self; mpi_hello",
            ],
        )
        .ok();
        assert!(!run.stdout.contains("no PMI_FD"), "{who:?}: {}", run.stdout);
        assert!(!run.stdout.contains("injected"), "{who:?}: {}", run.stdout);
        assert!(
            run.stdout.contains("sum=1 expected=1 ok"),
            "{who:?}: {}",
            run.stdout
        );
    }
}

#[test]
fn open_mpi_over_pmix_still_works_beside_profiles() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    let image = cluster.image("openmpi:bookworm");
    for who in BOTH {
        let run = srun_mpi(
            &cluster,
            who,
            &[
                "--mpi=pmix",
                "-N2",
                "-n2",
                &format!("--container-image={image}"),
                "--container-mpi=none",
                "mpi_hello",
            ],
        )
        .ok();
        assert!(
            run.stdout.contains("sum=1 expected=1 ok"),
            "{who:?}: {}",
            run.stdout
        );
    }
}

#[test]
fn incompatible_host_mpi_is_refused_with_the_reason() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    // A host library that claims an older minor version than the image's.
    let state = PathBuf::from(cluster.var("BERTH_TEST_STATE_DIR"));
    let old = state.join("fake-host-mpi/libmpich.so.12.0.5");
    std::fs::create_dir_all(old.parent().unwrap()).unwrap();
    std::fs::copy(host_libmpich(), &old).unwrap();
    write_profile(
        &cluster,
        "test-old",
        &format!("mpi_abi = full\nlibrary = {}\n", old.display()),
    );
    write_profile(&cluster, "test-mpich-ompi", "library = libmpich.so.12\n");
    let mpich = cluster.image("mpich:bookworm");
    let openmpi = cluster.image("openmpi:bookworm");
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={mpich}"),
                    "--container-mpi=test-old",
                    "true",
                ],
            )
            .failed();
        let all = format!("{}{}", run.stdout, run.stderr);
        assert!(all.contains("not ABI-compatible"), "{who:?}: {all}");
        assert!(all.contains("'full' policy"), "{who:?}: {all}");
        assert!(all.contains("libmpich.so.12.0.5"), "{who:?}: {all}");

        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={openmpi}"),
                    "--container-mpi=test-mpich-ompi",
                    "true",
                ],
            )
            .failed();
        let all = format!("{}{}", run.stdout, run.stderr);
        assert!(all.contains("Open MPI"), "{who:?}: {all}");
        assert!(all.contains("not MPICH-ABI compatible"), "{who:?}: {all}");

        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &format!("--container-image={mpich}"),
                    "--container-mpi=no-such-profile",
                    "true",
                ],
            )
            .failed();
        let all = format!("{}{}", run.stdout, run.stderr);
        assert!(
            all.contains("no host MPI profile 'no-such-profile'"),
            "{who:?}: {all}"
        );
        assert!(all.contains("test-mpich-ompi"), "{who:?}: {all}");
    }
}

/// `srun` arguments of a two-node, two-ranks-per-node step in `image`.
fn two_by_two<'a>(mpi: &'a str, image: &'a str, command: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![mpi, "-N2", "--ntasks-per-node=2", image];
    args.extend_from_slice(command);
    args
}

#[test]
fn ucx_defaults_mpich_ranks_share_memory_within_a_node() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("mpich:bookworm"));
    for who in BOTH {
        // No UCX_* at all: UCX's posix transport opens its peers' memory
        // through /proc/PID/fd/N (UCX_POSIX_USE_PROC_LINK=y).
        // UCX_LOG_LEVEL=info only shows the transports UCX chose. One node:
        // MPICH over UCX/TCP between these nodes has stalled at the end
        // (the Open MPI test below crosses nodes).
        let command = [
            "sh",
            "-c",
            "env | grep '^UCX_' ; UCX_LOG_LEVEL=info mpi_hello",
        ];
        let run = cluster
            .srun(
                who,
                &[
                    "--mpi=pmi2",
                    "-N1",
                    "-n4",
                    &image,
                    command[0],
                    command[1],
                    command[2],
                ],
            )
            .ok();
        let all = format!("{}\n{}", run.stdout, run.stderr);
        assert!(
            !run.stdout.lines().any(|l| l.starts_with("UCX_")),
            "{who:?}: {all}"
        );
        assert!(!all.contains("Shared memory error"), "{who:?}: {all}");
        assert!(
            all.contains("allreduce sum=6 expected=6 ok"),
            "{who:?}: {all}"
        );
        assert_shared_memory_within_tcp_between(&all, who, false);
    }
}

#[test]
fn ucx_defaults_open_mpi_ranks_share_memory_within_a_node() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("openmpi:bookworm"));
    for who in BOTH {
        // Open MPI's UCX PML (not its own shared-memory BTL), UCX defaults.
        let command = [
            "--container-mpi=none",
            "sh",
            "-c",
            "env | grep '^UCX_'; OMPI_MCA_pml=ucx OMPI_MCA_pml_ucx_tls=any \
             OMPI_MCA_pml_ucx_devices=any UCX_LOG_LEVEL=info mpi_hello",
        ];
        let run = cluster
            .srun(who, &two_by_two("--mpi=pmix", &image, &command))
            .ok();
        let all = format!("{}\n{}", run.stdout, run.stderr);
        assert!(
            !run.stdout.lines().any(|l| l.starts_with("UCX_")),
            "{who:?}: {all}"
        );
        assert!(!all.contains("PMIX ERROR"), "{who:?}: {all}");
        assert!(
            all.contains("allreduce sum=6 expected=6 ok"),
            "{who:?}: {all}"
        );
        assert_shared_memory_within_tcp_between(&all, who, true);
    }
}

/// UCX's log (`UCX_LOG_LEVEL=info`) names shared-memory transports for the
/// peers on the same node and, `across` nodes, TCP for the other node's.
fn assert_shared_memory_within_tcp_between(log: &str, who: common::Submitter, across: bool) {
    let endpoints: Vec<&str> = log.lines().filter(|l| l.contains("ep_cfg[")).collect();
    assert!(
        endpoints
            .iter()
            .any(|l| l.contains("posix/memory") || l.contains("sysv/memory")),
        "{who:?}: no shared memory within a node: {log}"
    );
    assert!(
        !across || endpoints.iter().any(|l| l.contains("tcp/")),
        "{who:?}: no TCP between nodes: {log}"
    );
}

#[test]
fn pmix_server_tmpdir_and_modules_reach_the_container() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    let image = format!("--container-image={}", cluster.image("debian:bookworm"));
    for who in BOTH {
        // The server's folder is bound in (a mount point at its host path);
        // PMIx 4 keeps its rendezvous files there, PMIx 5 (Slurm 24.11 on
        // Debian 13) talks TCP and leaves it empty.
        let script = "d=${PMIX_SERVER_TMPDIR%/}; test -n \"$d\" && test -d \"$d\" && \
                      cut -d' ' -f5 /proc/self/mountinfo | grep -qx \"$d\" && echo server-tmpdir-ok; \
                      echo \"psec=$PMIX_MCA_psec/$PMIX_SECURITY_MODE\"; \
                      echo \"gds=$PMIX_MCA_gds/$PMIX_GDS_MODULE\"; \
                      echo \"ptl=$PMIX_MCA_ptl/$PMIX_PTL_MODULE\"";
        let run = cluster
            .srun(
                who,
                &["--mpi=pmix", "-N1", "-n1", &image, "sh", "-c", script],
            )
            .ok();
        let out = &run.stdout;
        assert!(
            out.contains("server-tmpdir-ok"),
            "{who:?}: {out}\n{}",
            run.stderr
        );
        for name in ["psec", "gds"] {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{name}=")))
                .unwrap_or_else(|| panic!("{who:?}: no {name} line: {out}"));
            let (mca, server) = line[name.len() + 1..].split_once('/').unwrap();
            assert!(!server.is_empty(), "{who:?}: Slurm set no module: {out}");
            assert_eq!(mca, server, "{who:?}: {out}");
        }
        // A module the job chose itself stays.
        let run = cluster
            .srun(
                who,
                &[
                    "--mpi=pmix",
                    "-N1",
                    "-n1",
                    "--export=ALL,PMIX_MCA_gds=hash",
                    &image,
                    "sh",
                    "-c",
                    "echo gds=$PMIX_MCA_gds",
                ],
            )
            .ok();
        assert!(run.stdout.contains("gds=hash\n"), "{who:?}: {}", run.stdout);
        // Not for a PMI2 step.
        let run = cluster
            .srun(
                who,
                &[
                    "--mpi=pmi2",
                    "-N1",
                    "-n1",
                    &image,
                    "sh",
                    "-c",
                    "echo gds=[$PMIX_MCA_gds]",
                ],
            )
            .ok();
        assert!(run.stdout.contains("gds=[]"), "{who:?}: {}", run.stdout);
    }
}

#[test]
fn pytorch_images_get_rank_world_and_master_per_task() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    let show =
        "echo \"task $SLURM_PROCID: RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE \
                MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT OMP=$OMP_NUM_THREADS \
                JOB=$SLURM_JOB_ID\"";
    let pytorch = format!("--container-image={}", cluster.image("busybox:pytorch"));
    let plain = format!("--container-image={}", cluster.image("busybox:latest"));
    for who in BOTH {
        let run = cluster
            .srun(
                who,
                &["-N2", "--ntasks-per-node=2", &pytorch, "sh", "-c", show],
            )
            .ok();
        let lines: Vec<&str> = run
            .stdout
            .lines()
            .filter(|l| l.starts_with("task "))
            .collect();
        assert_eq!(lines.len(), 4, "{who:?}: {}\n{}", run.stdout, run.stderr);
        let job: u64 = lines[0]
            .rsplit("JOB=")
            .next()
            .and_then(|j| j.trim().parse().ok())
            .unwrap_or_else(|| panic!("{who:?}: no job id: {}", run.stdout));
        let port = job % 4536 + 61000;
        for line in &lines {
            let rank = line["task ".len()..].split(':').next().unwrap();
            assert!(line.contains(&format!("RANK={rank} ")), "{who:?}: {line}");
            assert!(line.contains("WORLD_SIZE=4 "), "{who:?}: {line}");
            assert!(line.contains("MASTER_ADDR=node1 "), "{who:?}: {line}");
            assert!(
                line.contains(&format!("MASTER_PORT={port} ")),
                "{who:?}: {line}"
            );
            assert!(line.contains("OMP=1 "), "{who:?}: {line}");
        }
        let mut local: Vec<&str> = lines
            .iter()
            .map(|l| {
                l.split("LOCAL_RANK=")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
            })
            .collect();
        local.sort_unstable();
        assert_eq!(local, ["0", "0", "1", "1"], "{who:?}: {lines:?}");

        // The job's own MASTER_PORT wins; an image without PYTORCH_VERSION gets nothing.
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    "-n1",
                    "--export=ALL,MASTER_PORT=12345",
                    &pytorch,
                    "sh",
                    "-c",
                    show,
                ],
            )
            .ok();
        assert!(
            run.stdout.contains("MASTER_PORT=12345 "),
            "{who:?}: {}",
            run.stdout
        );
        let run = cluster
            .srun(who, &["-N1", "-n1", &plain, "sh", "-c", show])
            .ok();
        assert!(
            run.stdout
                .contains("RANK= LOCAL_RANK= WORLD_SIZE= MASTER_ADDR= MASTER_PORT="),
            "{who:?}: {}",
            run.stdout
        );
    }
}

/// The ready profile for the node's InfiniBand userspace that the package
/// ships (packaging/inject.d/infiniband.conf, as it is): an image without
/// rdma-core gets the host's libibverbs and librdmacm in its loader cache,
/// the verbs providers at the path libibverbs loads them from, with every
/// library they need found in the container, and their configuration; as
/// root and as the user. (These nodes have no HCA, so no device opens.)
/// The host's libraries need a C library no newer than the image's: the
/// release roots skip it (CORE_GLIBC_TESTS).
#[test]
fn the_shipped_infiniband_profile_brings_the_hosts_rdma_userspace() {
    let (cluster, _one_at_a_time) = cluster_or_skip!();
    let shipped = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("packaging/inject.d/infiniband.conf"),
    )
    .unwrap();
    let profile = write_profile(&cluster, "infiniband", &shipped);
    let image = format!("--container-image={}", cluster.image("debian:bookworm"));
    let providers = "/usr/lib/x86_64-linux-gnu/libibverbs";
    // The mlx5 provider, named after rdma-core's provider ABI
    // (libmlx5-rdmav34.so in Debian 12, rdmav65 in sid).
    let mlx5 = std::fs::read_dir(providers)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libmlx5-rdmav") && n.ends_with(".so"))
        .expect("the host has rdma-core's mlx5 provider (ibverbs-providers)");
    let report = format!(
        "ldconfig -p | grep -o 'libibverbs.so.1 (.*' | head -1; \
         ldconfig -p | grep -o 'librdmacm.so.1 (.*' | head -1; \
         ldd {providers}/{mlx5} | grep -o 'libibverbs.so.1 => [^ ]*'; \
         ldd {providers}/{mlx5} /usr/local/lib/berth/librdmacm.so.1 | grep -c 'not found'; \
         cat /etc/libibverbs.d/mlx5.driver 2>/dev/null; true"
    );
    for who in BOTH {
        let bare = cluster
            .srun(who, &["-N1", &image, "sh", "-c", &report])
            .ok();
        assert!(
            !bare.stdout.contains("libibverbs.so.1"),
            "{who:?}: the test image already has rdma-core: {}",
            bare.stdout
        );
        let run = cluster
            .srun(
                who,
                &[
                    "-N1",
                    &image,
                    "--container-mpi=infiniband",
                    "sh",
                    "-c",
                    &report,
                ],
            )
            .ok();
        assert_eq!(
            run.stdout.lines().collect::<Vec<_>>(),
            [
                "libibverbs.so.1 (libc6,x86-64) => /usr/local/lib/berth/libibverbs.so.1",
                "librdmacm.so.1 (libc6,x86-64) => /usr/local/lib/berth/librdmacm.so.1",
                "libibverbs.so.1 => /usr/local/lib/berth/libibverbs.so.1",
                "0",
                "driver mlx5",
            ],
            "{who:?}\n{}",
            run.stderr
        );
    }
    std::fs::remove_file(profile).unwrap();
}
