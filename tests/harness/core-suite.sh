# shellcheck shell=bash
# Usage: source tests/harness/core-suite.sh
#
# The core suite: the cluster tests whose outcome depends on Slurm's
# behaviour, which tests/run.sh runs with BERTH_TEST_SUITE=core on the Slurm
# of each release root (tests/release.sh). One list, read by both.
#
# Each name is a module of the one test binary (a file of tests/suite).
#
#   CORE_TESTS          one module after another (two test threads), every test
#   CORE_FILTERED       MODULE=FILTER: only the tests of MODULE matching FILTER
#   CORE_LAST           cluster_leftovers, alone, after every other test
# shellcheck disable=SC2034  # read by the scripts that source this file
CORE_TESTS=(cluster cluster_entry cluster_named cluster_join cluster_mpi cluster_pin cluster_private cluster_fanout cluster_site)
# shellcheck disable=SC2034
CORE_FILTERED=(
    "cluster_faults=killed_helper_or_task_leaves_nothing_behind"
    "cluster_faults=scancel_at_each_stage"
    "cluster_faults=a_setting_slurmstepd_refuses_fails_the_job"
    "doctor=slurm_release_of_the_plugin"
)
# shellcheck disable=SC2034
CORE_LAST=cluster_leftovers
# Run alone, before CORE_LAST, where tests/release.sh built the release's
# Debian packages (BERTH_TEST_DEBS): the package test switches the drop-in.
# shellcheck disable=SC2034
CORE_PACKAGE=package
# On the GPU site (BERTH_TEST_SITE=gpu; tests/release.sh with
# BERTH_RELEASE_SITE=gpu): the step's GPUs and the cgroup's EPERM, private
# /tmp and /dev/shm.
# They skip themselves on the plain cluster.
# shellcheck disable=SC2034
CORE_GPU_TESTS=(cluster_gpu)
# Tests that bind this machine's own programs into the bookworm test images
# (srun in a batch container, the host's MPICH, the host's rdma-core): they need the C library of
# the machine running the cluster to be no newer than the images' (2.36),
# which a release root's is not.
# shellcheck disable=SC2034
CORE_GLIBC_TESTS=(srun_in_a_containerized_batch_script_inherits_or_overrides
    the_shipped_infiniband_profile_brings_the_hosts_rdma_userspace
    host_mpich_is_injected_and_runs_over_pmi2_across_nodes)
# Tests that run `srun --mpi=pmix`: skipped where the Slurm has no mpi/pmix
# plugin (Debian's 26.05). A new test with --mpi=pmix in a core file
# belongs here.
# shellcheck disable=SC2034
CORE_PMIX_TESTS=(pmix_mpi_allreduce_across_nodes open_mpi_over_pmix_still_works_beside_profiles
    ucx_defaults_open_mpi_ranks_share_memory_within_a_node pmix_server_tmpdir_and_modules_reach_the_container)

# core_binaries TARGET_DIR: builds the one test binary (tests/suite, whose
# modules are the core tests and the rest; against this machine's Slurm:
# they drive srun and sbatch, they do not load the plugin) and prints
# "suite PATH".
core_binaries() {
    cargo test --release --locked --no-run --message-format=json --target-dir "$1" --test suite |
        jq -r 'select(.reason == "compiler-artifact" and .executable != null and .target.kind == ["test"])
            | "\(.target.name) \(.executable)"'
}
