# shellcheck shell=bash disable=SC2034
# Usage: source "$(dirname "$0")/lib.sh"   (from the other harness scripts)
#
# Names, addresses, ports and small helpers shared by cluster.sh,
# registry.sh and images.sh. Everything a test cluster creates is derived
# from BERTH_TEST_NAME so that two harness instances never share anything
# except the host's munged.
#
# Environment (all optional):
#   BERTH_TEST_NAME               instance name (default berthtest)
#   BERTH_TEST_NODES              number of slurmd nodes (default 2, at most 50)
#   BERTH_TEST_DEFAULT_NODES      how many of them form the default partition
#                                 (default all; all are in partition `wide`)
#   BERTH_TEST_SUBNET             first three octets of the /24 (default 10.77.0)
#   BERTH_TEST_SLOT               0..3 (default 0): which /26 of that /24 this
#                                 instance uses, so that up to four instances
#                                 run side by side inside 10.77.0.0/24
#                                 (bridge .1/.65/.129/.193, nodes from +11)
#   BERTH_TEST_SLURMCTLD_PORT     default 16817
#   BERTH_TEST_SLURMD_PORT        default 16818
#   BERTH_TEST_REGISTRY_PORT      anonymous registry, default 15000
#   BERTH_TEST_TOKEN_REGISTRY_PORT registry with bearer-token auth, default 15001
#   BERTH_TEST_TOKEN_SERVER_PORT  token server, default 15002
#   BERTH_TEST_FAULT_PROXY_PORT   fault-injecting proxy in front of the
#                                 anonymous registry (fault-proxy.py),
#                                 default: the registry's port + 3
#   BERTH_PLUGSTACK_DIR           directory plugstack.conf includes
#                                 (default /run/$NAME/etc/plugstack.conf.d)
#   BERTH_TEST_CACHE_DIR          image and debootstrap cache
#                                 (default /var/lib/$NAME/cache; may be shared
#                                 between instances)

NAME=${BERTH_TEST_NAME:-berthtest}
if [[ ! $NAME =~ ^[a-z][a-z0-9_-]{0,30}$ ]]; then
    echo "BERTH_TEST_NAME must match ^[a-z][a-z0-9_-]{0,30}\$ (got '$NAME')" >&2
    exit 2
fi
NODES=${BERTH_TEST_NODES:-2}
if [[ ! $NODES =~ ^[1-9][0-9]?$ ]] || ((NODES > 50)); then
    echo "BERTH_TEST_NODES must be 1..50 (got '$NODES')" >&2
    exit 2
fi

# Nodes in the default partition `debug` (the first ones); all nodes are in
# the partition `wide`. Tests written for two nodes keep landing on node1 and
# node2 when the cluster has more (the fan-out tests use `-p wide -N4`).
DEFAULT_NODES=${BERTH_TEST_DEFAULT_NODES:-$NODES}
if [[ ! $DEFAULT_NODES =~ ^[1-9][0-9]?$ ]] || ((DEFAULT_NODES > NODES)); then
    echo "BERTH_TEST_DEFAULT_NODES must be 1..BERTH_TEST_NODES (got '$DEFAULT_NODES')" >&2
    exit 2
fi

SUBNET=${BERTH_TEST_SUBNET:-10.77.0}
SLOT=${BERTH_TEST_SLOT:-0}
[[ $SLOT =~ ^[0-3]$ ]] || { echo "BERTH_TEST_SLOT must be 0..3 (got '$SLOT')" >&2; exit 2; }
NET_BASE=$((SLOT * 64))
NET_PREFIX_LEN=26
BRIDGE_IP=$SUBNET.$((NET_BASE + 1))
SLURMCTLD_PORT=${BERTH_TEST_SLURMCTLD_PORT:-16817}
SLURMD_PORT=${BERTH_TEST_SLURMD_PORT:-16818}
REGISTRY_PORT=${BERTH_TEST_REGISTRY_PORT:-15000}
TOKEN_REGISTRY_PORT=${BERTH_TEST_TOKEN_REGISTRY_PORT:-15001}
TOKEN_SERVER_PORT=${BERTH_TEST_TOKEN_SERVER_PORT:-15002}
FAULT_PROXY_PORT=${BERTH_TEST_FAULT_PROXY_PORT:-$((REGISTRY_PORT + 3))}
REGISTRY_ADDR=$BRIDGE_IP:$REGISTRY_PORT
TOKEN_REGISTRY_ADDR=$BRIDGE_IP:$TOKEN_REGISTRY_PORT
TOKEN_SERVER_URL=http://$BRIDGE_IP:$TOKEN_SERVER_PORT
FAULT_PROXY_ADDR=$BRIDGE_IP:$FAULT_PROXY_PORT

# Interface names are limited to 15 characters: use the first letters of
# the name plus a short hash of the whole name.
IFTAG=$(printf '%s' "${NAME//[^a-z0-9]/}" | cut -c1-4)$(printf '%s' "$NAME" | sha1sum | cut -c1-4)
BRIDGE=${IFTAG}-br

STATE_DIR=/var/lib/$NAME          # survives `down` partly (cache, logs, work)
RUN_DIR=/run/$NAME                # removed by `down`
ETC_DIR=$RUN_DIR/etc
ENV_FILE=$RUN_DIR/env
LOG_DIR=$STATE_DIR/log
PID_DIR=$STATE_DIR/pid
NODES_DIR=$STATE_DIR/nodes
CTLD_STATE_DIR=$STATE_DIR/slurmctld
WORK_DIR=$STATE_DIR/work
CACHE_DIR=${BERTH_TEST_CACHE_DIR:-$STATE_DIR/cache}
REGISTRY_DIR=$STATE_DIR/registry
PLUGSTACK_DIR=${BERTH_PLUGSTACK_DIR:-$ETC_DIR/plugstack.conf.d}
SLURM_CONF_FILE=$ETC_DIR/slurm.conf
# BERTH_TEST_SITE=gpu: the cluster runs like a GPU site (cluster.sh); plain
# (the default): proctrack/linuxproc, task/none, no GPUs.
SITE=${BERTH_TEST_SITE:-plain}
GPU_DIR=$STATE_DIR/gpu            # dev/: each node's fake GPUs; driver/: fake driver root

HARNESS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$HARNESS_DIR/../.." && pwd)

log() { printf '[%s] %s\n' "${LOG_TAG:-harness}" "$*"; }
warn() { printf '[%s] WARNING: %s\n' "${LOG_TAG:-harness}" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG:-harness}" "$*" >&2; exit 1; }

# BERTH_TEST_SLURM_PREFIX: a Slurm installed under one prefix (built from
# source; tests/compat.sh) instead of the system's. Its sbin and bin go first
# on PATH, for this script and every program it starts (the daemons, srun and
# sbatch of the tests), and cluster.sh writes PluginDir=PREFIX/lib/slurm.
# Unset: the Slurm on PATH, as always.
SLURM_PREFIX=${BERTH_TEST_SLURM_PREFIX:-}
if [[ -n $SLURM_PREFIX ]]; then
    [[ -x $SLURM_PREFIX/sbin/slurmd && -x $SLURM_PREFIX/bin/srun && -d $SLURM_PREFIX/lib/slurm ]] ||
        die "BERTH_TEST_SLURM_PREFIX=$SLURM_PREFIX holds no Slurm (sbin/slurmd, bin/srun, lib/slurm)"
    case :$PATH: in
    *":$SLURM_PREFIX/sbin:$SLURM_PREFIX/bin:"*) ;;
    *) export PATH=$SLURM_PREFIX/sbin:$SLURM_PREFIX/bin:$PATH ;;
    esac
fi
# BERTH_TEST_CRED_TYPE: the cluster's CredType, cred/munge (the default) or
# cred/none, for a Slurm built without --enable-multiple-slurmd (munge's replay
# check then refuses, on every node but the first, a launch credential that
# the node before it decoded with the same munged; tests/compat.sh).
CRED_TYPE=${BERTH_TEST_CRED_TYPE:-cred/munge}
[[ $CRED_TYPE == cred/munge || $CRED_TYPE == cred/none ]] ||
    die "BERTH_TEST_CRED_TYPE must be cred/munge or cred/none (got '$CRED_TYPE')"

# usage: print the comment block at the top of the running script.
usage() {
    awk 'NR == 1 {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$0"
}

# The plugstack line of the test clusters (tests/run.sh, tests/dev.sh): berth
# installed under PREFIX ($1), one store per node (%n) under STATE ($2), as on
# a real cluster with node-local NVMe, the harness registries, fan-out on.
test_plugstack_line() {
    local prefix=$1 state=$2
    printf '%s' "required $prefix/lib/slurm/spank_berth.so helper_path=$prefix/bin/berth" \
        " store_path=$state/nodes/%n/berth-store runtime_path=/run/$NAME/berth" \
        " insecure_registries=$REGISTRY_ADDR,$TOKEN_REGISTRY_ADDR,$FAULT_PROXY_ADDR" \
        " inject_dir=$state/inject.d fanout=sbcast fanout_dir=/tmp/berth-fanout" \
        " fanout_wait=60 fanout_intent_wait=5"
}

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

node_name() { printf 'node%d' "$1"; }
node_ip() { printf '%s.%d' "$SUBNET" "$((NET_BASE + 10 + $1))"; }
node_netns() { printf '%s-node%d' "$NAME" "$1"; }
veth_host() { printf '%s-h%d' "$IFTAG" "$1"; }
veth_node() { printf '%s-n%d' "$IFTAG" "$1"; }

# pid_alive PIDFILE [COMM]: true when the pid file names a running process
# (and, if COMM is given, that process's command name matches the regular
# expression ^(COMM)$).
pid_alive() {
    local file=$1 comm=${2:-} pid
    [[ -s $file ]] || return 1
    pid=$(head -n1 "$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -d /proc/$pid ]] || return 1
    if [[ -n $comm ]]; then
        [[ $(cat "/proc/$pid/comm" 2>/dev/null) =~ ^($comm)$ ]] || return 1
    fi
}

# stop_pidfiles COMM PIDFILE...: TERM every process named in the pid files
# whose command name matches COMM (see pid_alive), wait up to 10s for all of them, KILL what is
# left; remove the pid files.
stop_pidfiles() {
    local comm=$1 file pid i alive
    shift
    local pids=()
    for file in "$@"; do
        if pid_alive "$file" "$comm"; then
            pid=$(head -n1 "$file")
            log "stopping $(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for ((i = 0; i < 100; i++)); do
        alive=0
        for pid in "${pids[@]}"; do
            [[ -d /proc/$pid ]] && alive=1
        done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        if [[ -d /proc/$pid ]]; then
            warn "$comm (pid $pid) ignored SIGTERM, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    rm -f "$@"
}

stop_pidfile() { stop_pidfiles "$2" "$1"; }

# The bridge is shared by the cluster and the registries: whoever comes
# first creates it, whoever goes last removes it.
ensure_bridge() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        if [[ $'\n'$(ip -4 -o addr show | awk '{print $4}') == *$'\n'"$BRIDGE_IP/"* ]]; then
            die "$BRIDGE_IP is already used by another interface (another instance? set BERTH_TEST_SLOT)"
        fi
        log "creating bridge $BRIDGE ($BRIDGE_IP/$NET_PREFIX_LEN)"
        ip link add "$BRIDGE" type bridge
        ip addr add "$BRIDGE_IP/$NET_PREFIX_LEN" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
}

cluster_running() {
    local i
    for ((i = 1; i <= 99; i++)); do
        [[ -e /var/run/netns/$(node_netns "$i") ]] && return 0
    done
    pid_alive "$PID_DIR/slurmctld.pid" slurmctld
}

registry_running() {
    local f
    for f in "$PID_DIR"/registry-*.pid "$PID_DIR"/token-server.pid "$PID_DIR"/fault-proxy.pid; do
        [[ -e $f ]] || continue
        pid_alive "$f" && return 0
    done
    return 1
}

# Called at the end of both `down`s: drop the bridge and /run/$NAME once
# neither the cluster nor a registry of this instance is left.
remove_shared_if_unused() {
    if cluster_running || registry_running; then
        return
    fi
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        log "removing bridge $BRIDGE"
        ip link del "$BRIDGE"
    fi
    rm -rf --one-file-system "$RUN_DIR" || warn "could not remove all of $RUN_DIR"
}

write_env_file() {
    mkdir -p "$RUN_DIR"
    print_env >"$ENV_FILE.tmp"
    mv "$ENV_FILE.tmp" "$ENV_FILE"
}

print_env() {
    local i names=""
    for ((i = 1; i <= NODES; i++)); do
        names+=${names:+,}$(node_name "$i")
    done
    cat <<EOF
export BERTH_TEST_NAME=$NAME
export BERTH_TEST_NODES=$NODES
export BERTH_TEST_DEFAULT_NODES=$DEFAULT_NODES
export SLURM_CONF=$SLURM_CONF_FILE
export BERTH_TEST_STATE_DIR=$STATE_DIR
export BERTH_TEST_WORKDIR=$WORK_DIR
export BERTH_TEST_LOG_DIR=$LOG_DIR
export BERTH_TEST_CACHE_DIR=$CACHE_DIR
export BERTH_TEST_PLUGSTACK_DIR=$PLUGSTACK_DIR
export BERTH_TEST_BRIDGE_IP=$BRIDGE_IP
export BERTH_TEST_SLOT=$SLOT
export BERTH_TEST_NODE_NAMES=$names
export BERTH_TEST_REGISTRY=$REGISTRY_ADDR
export BERTH_TEST_TOKEN_REGISTRY=$TOKEN_REGISTRY_ADDR
export BERTH_TEST_TOKEN_REALM=$TOKEN_SERVER_URL/token
export BERTH_TEST_REGISTRY_LOG=$STATE_DIR/registry.log
export BERTH_TEST_TOKEN_REGISTRY_LOG=$STATE_DIR/registry-token.log
export BERTH_TEST_FAULT_PROXY=$FAULT_PROXY_ADDR
export BERTH_TEST_FAULT_PROXY_LOG=$STATE_DIR/fault-proxy.log
export BERTH_TEST_SITE=$SITE
export BERTH_TEST_GPU_DIR=$GPU_DIR
export BERTH_TEST_TOKEN_USER=berth
export BERTH_TEST_TOKEN_PASSWORD=berthpass
export BERTH_TEST_USER=berthuser
export BERTH_TEST_DOCKER_HOST=unix://$RUN_DIR/docker.sock
export BERTH_TEST_PODMAN_DIR=$STATE_DIR/podman
export BERTH_TEST_OTHER_USERS="berthuser2 berthuser3 berthuser4"
EOF
}
