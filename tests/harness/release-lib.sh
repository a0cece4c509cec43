# shellcheck shell=bash
# Usage: source tests/harness/release-lib.sh   (after rust-env.sh; needs log())
#
# What tests/release.sh (Debian release roots) and tests/compat.sh (Slurm
# releases built from source) share: building berth against another Slurm's
# headers, and the addresses and ports of a root's cluster.

# build_berth_with_headers DIR HEADERS LABEL: berth (plugin and CLI) built
# into the target folder DIR against the Slurm headers in HEADERS (a folder
# holding spank.h), LABEL naming that Slurm in the log. Only Slurm's headers
# come from HEADERS: the C library's are this machine's, which compiles and
# links. DIR is seeded once with this machine's compiled dependencies
# ($target/release), so only berth itself is compiled.
build_berth_with_headers() {
    local dir=$1 headers=$2 label=$3
    [[ -f $headers/spank.h ]] || { echo "no spank.h in $headers" >&2; return 1; }
    mkdir -p "$dir/include"
    ln -sfn "$headers" "$dir/include/slurm"
    if [[ ! -d $dir/release/deps && -d $target/release/deps ]]; then
        log "seeding $dir with this machine's compiled dependencies"
        mkdir -p "$dir/release"
        cp -a "$target/release/deps" "$target/release/build" "$target/release/.fingerprint" "$dir/release/"
    fi
    log "building berth against Slurm $label"
    SLURM_INCLUDE_DIR=$dir/include cargo build --release --locked --target-dir "$dir"
}

# release_cluster_env INDEX NAME: the environment (NAME=VALUE words, for env)
# of the core suite's cluster number INDEX (10..250): instance NAME, subnet
# 10.77.INDEX, ports offset by 100 * INDEX, so that clusters of different
# indices run side by side.
release_cluster_env() {
    local index=$1 name=$2
    printf '%s\n' "BERTH_TEST_NAME=$name" "BERTH_TEST_SUBNET=10.77.$index" BERTH_TEST_SLOT=0 \
        "BERTH_TEST_SLURMCTLD_PORT=$((16817 + 100 * index))" "BERTH_TEST_SLURMD_PORT=$((16818 + 100 * index))" \
        "BERTH_TEST_REGISTRY_PORT=$((15000 + 100 * index))" "BERTH_TEST_TOKEN_REGISTRY_PORT=$((15001 + 100 * index))" \
        "BERTH_TEST_TOKEN_SERVER_PORT=$((15002 + 100 * index))"
}
