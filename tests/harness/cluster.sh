#!/usr/bin/env bash
# Usage: tests/harness/cluster.sh up|down|status|env
#
# A real multi-node Slurm 22.05 cluster on one machine (run as root):
#   slurmctld on the host, listening on the bridge address (10.77.0.1 by
#   default; see BERTH_TEST_SUBNET and BERTH_TEST_SLOT in lib.sh),
#   N slurmd nodes (BERTH_TEST_NODES, default 2), each in its own network
#   namespace, UTS namespace (hostname nodeN) and mount namespace (own /tmp
#   and /dev/shm), joined to the bridge by a veth pair.
#
#   up      start (or restart after a partial start) and wait for idle nodes;
#           writes /run/$NAME/env  (source it: SLURM_CONF, work dir, registry)
#   down    stop daemons started here, remove netns/veths/bridge/run dir;
#           keeps /var/lib/$NAME/{cache,log,work}. Safe after a failed up.
#   status  sinfo and the daemons' pids
#   env     print the environment (eval "$(tests/harness/cluster.sh env)")
#
# Environment: see tests/harness/lib.sh (BERTH_TEST_NAME, BERTH_TEST_NODES,
# ports, BERTH_PLUGSTACK_DIR, BERTH_TEST_SLURM_PREFIX: a Slurm installed under
# one prefix, whose programs and PluginDir the cluster then uses,
# BERTH_TEST_CRED_TYPE). BERTH_PLUGSTACK_LINE, when set, is written to
# $BERTH_PLUGSTACK_DIR/berth.conf by `up`.
set -euo pipefail
# shellcheck disable=SC2034  # read by log() in lib.sh
LOG_TAG=cluster
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CTLD_HOSTNAME=${NAME}-ctl
CTLD_PID=$PID_DIR/slurmctld.pid
WAIT_IDLE_S=${BERTH_TEST_WAIT_IDLE_S:-90}
# Shared by all harness instances: set when one of them started munged.
MUNGED_MARK=/run/berth-harness-munged.pid

# ---------------------------------------------------------------- munge

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
    if munge_works; then
        return
    fi
    log "starting munged"
    mkdir -p /run/munge
    chown munge:munge /run/munge
    chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge
    [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing: run tests/harness/install-deps.sh"
    runuser -u munge -- munged --force
    local i
    for ((i = 0; i < 50; i++)); do
        munge_works && break
        sleep 0.1
    done
    munge_works || die "munged does not answer (see /var/log/munge/munged.log)"
    # Remember that a harness started it, so that the last `down` (of any
    # instance) stops it again.
    cp /run/munge/munged.pid "$MUNGED_MARK"
}

# Stop munged only if a harness started it and no Slurm daemon is left.
maybe_stop_munge() {
    [[ -e $MUNGED_MARK ]] || return 0
    # (-r: live processes only; a killed `up` can leave zombies behind)
    if pgrep -r R,S,D -x slurmctld >/dev/null || pgrep -r R,S,D -x slurmd >/dev/null; then
        log "leaving munged running (other Slurm daemons use it)"
        return
    fi
    stop_pidfile "$MUNGED_MARK" munged
}

# ---------------------------------------------------------------- config

# The site TaskProlog and TaskEpilog: BERTH_TEST_TASK_PROLOG is `harness`
# (the default: the harness's own scripts below), `none` (no TaskProlog and
# no TaskEpilog) or the path of a TaskProlog of your own (no TaskEpilog).
TASK_PROLOG_MODE=${BERTH_TEST_TASK_PROLOG:-harness}

# Like a site's scripts, but they act only when a test asks through the job's
# environment (BERTH_TEST_PROLOG_DIR, a host folder every node sees): the
# prolog writes what it saw to DIR/prolog.JOB.STEP.TASK, prints
# `export BERTH_PROLOG_VAR=...`, `unset BERTH_PROLOG_UNSET_ME` and a `print`
# line, or fails with exit 3 when BERTH_TEST_PROLOG_FAIL is set; the epilog
# writes DIR/epilog.JOB.STEP.TASK. Both record their mount namespace, so a
# test can tell the host's from a container's.
write_task_scripts() {
    cat >"$ETC_DIR/task-prolog.sh" <<'EOF'
#!/bin/sh
# TaskProlog of the berth test cluster (tests/harness/cluster.sh).
[ -n "${BERTH_TEST_PROLOG_DIR:-}" ] || exit 0
if [ -n "${BERTH_TEST_PROLOG_FAIL:-}" ]; then
    echo "site prolog refuses this task: $BERTH_TEST_PROLOG_FAIL"
    exit 3
fi
printf 'uid=%s mntns=%s context=%s node=%s\n' "$(id -u)" "$(readlink /proc/$$/ns/mnt)" \
    "${SLURM_SCRIPT_CONTEXT:-}" "$(hostname)" \
    >"$BERTH_TEST_PROLOG_DIR/prolog.$SLURM_JOB_ID.$SLURM_STEP_ID.$SLURM_PROCID"
echo "export BERTH_PROLOG_VAR=site-$SLURM_PROCID"
echo "unset BERTH_PROLOG_UNSET_ME"
echo "print site prolog says hello to task $SLURM_PROCID"
echo "this line is ignored"
EOF
    cat >"$ETC_DIR/task-epilog.sh" <<'EOF'
#!/bin/sh
# TaskEpilog of the berth test cluster (tests/harness/cluster.sh).
[ -n "${BERTH_TEST_PROLOG_DIR:-}" ] || exit 0
printf 'uid=%s mntns=%s\n' "$(id -u)" "$(readlink /proc/$$/ns/mnt)" \
    >"$BERTH_TEST_PROLOG_DIR/epilog.$SLURM_JOB_ID.$SLURM_STEP_ID.$SLURM_PROCID"
EOF
    chmod 0755 "$ETC_DIR/task-prolog.sh" "$ETC_DIR/task-epilog.sh"
}

# ---------------------------------------------------------------- GPU site

# BERTH_TEST_SITE=gpu: proctrack/cgroup, task/cgroup, cgroup.conf with
# CgroupPlugin=cgroup/v1 (this machine's hierarchy is hybrid) and
# ConstrainDevices=yes, and two fake GPUs per node as GRES: character devices
# of NVIDIA's major 195 made in NODES_DIR/nodeN/gpu-dev, bound in each node's
# mount namespace at GPU_DIR/dev (gres.conf `File=`, berth's gpu_dev_root),
# plus a fake driver root (GPU_DIR/driver: libcuda.so.1, libnvidia-ml.so.1,
# nvidia-smi). Opening an allowed fake GPU gives ENXIO, a denied one EPERM.
# Memory constraints stay off: they would move processes out of the
# machine's own memory cgroup. Jobs get a private /tmp and /dev/shm from
# job_container/tmpfs (job_container.conf: one BasePath per node,
# NODES_DIR/nodeN/job-containers, since all nodes share this machine's disk).
#
# Per release: 25.11 renamed JobContainerType to NamespaceType (the old name
# still works, with a warning; the plugin is namespace/tmpfs, which still
# reads job_container.conf). From 24.05 on, BERTH_TEST_CONTAIN_SPANK=yes adds
# SlurmdParameters=contain_spank (default `no`): slurmstepd then runs the
# user_init, task_post_fork and task_exit callbacks in a clone of itself
# inside the job's namespace, where berth refuses to make containers (its
# namespace handles would die with the clone; docs/INSTALL.md).
site_lines() {
    if [[ $SITE == gpu ]]; then
        printf 'ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\nGresTypes=gpu\n'
        if slurm_at_least 25 11; then
            printf 'NamespaceType=namespace/tmpfs\nPrologFlags=Contain\n'
        else
            printf 'JobContainerType=job_container/tmpfs\nPrologFlags=Contain\n'
        fi
    else
        printf 'ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n'
    fi
}

# plugin_dir_line: a newline and PluginDir=PREFIX/lib/slurm for a Slurm under
# BERTH_TEST_SLURM_PREFIX; nothing (not even a line) otherwise.
plugin_dir_line() {
    [[ -z $SLURM_PREFIX ]] || printf '\nPluginDir=%s/lib/slurm' "$SLURM_PREFIX"
}

# slurm_at_least MAJOR MINOR: whether the installed slurmd is that release
# or a later one.
slurm_at_least() {
    local v major minor
    v=$(slurmd -V 2>/dev/null | awk '{print $2}')
    major=${v%%.*}
    minor=${v#*.}
    minor=${minor%%.*}
    [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] || return 1
    ((10#$major > $1 || (10#$major == $1 && 10#$minor >= $2)))
}

# The SlurmdParameters line: nodes declare CPUs=4 whatever the hardware has
# (config_overrides); contain_spank on the GPU site where the release has it.
slurmd_parameters() {
    local params=config_overrides
    if [[ $SITE == gpu && ${BERTH_TEST_CONTAIN_SPANK:-no} == yes ]] && slurm_at_least 24 5; then
        params+=,contain_spank
    fi
    printf 'SlurmdParameters=%s\n' "$params"
}

write_gpu_config() {
    cat >"$ETC_DIR/cgroup.conf" <<EOF
# Generated by tests/harness/cluster.sh (BERTH_TEST_SITE=gpu).
CgroupPlugin=cgroup/v1
ConstrainDevices=yes
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainSwapSpace=no
EOF
    printf 'Name=gpu File=%s/dev/nvidia[0-1]\n' "$GPU_DIR" >"$ETC_DIR/gres.conf"
    local i node
    {
        printf '# Generated by tests/harness/cluster.sh (BERTH_TEST_SITE=gpu).\n'
        for ((i = 1; i <= NODES; i++)); do
            node=$(node_name "$i")
            printf 'NodeName=%s AutoBasePath=true BasePath=%s/%s/job-containers\n' \
                "$node" "$NODES_DIR" "$node"
        done
    } >"$ETC_DIR/job_container.conf"
}

# make_fake_gpus NODE: the node's own device nodes.
make_fake_gpus() {
    local dir=$NODES_DIR/$1/gpu-dev
    mkdir -p "$dir" "$GPU_DIR/dev"
    mknod -m 666 "$dir/nvidia0" c 195 0
    mknod -m 666 "$dir/nvidia1" c 195 1
    mknod -m 666 "$dir/nvidiactl" c 195 255
    mknod -m 666 "$dir/nvidia-uvm" c 510 0
}

# The fake driver root, built once (real ELF libraries, a script for nvidia-smi).
build_fake_driver() {
    local root=$GPU_DIR/driver src=$GPU_DIR/src
    [[ -e $root/usr/lib64/libcuda.so.1 ]] && return
    mkdir -p "$root/usr/lib64" "$root/usr/bin" "$src"
    echo 'int cuDriverGetVersion(int *v) { *v = 12040; return 0; }' >"$src/cuda.c"
    echo 'int nvmlInit_v2(void) { return 0; }' >"$src/nvml.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$root/usr/lib64/libcuda.so.550.54.14" "$src/cuda.c"
    ln -sf libcuda.so.550.54.14 "$root/usr/lib64/libcuda.so.1"
    cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$root/usr/lib64/libnvidia-ml.so.550.54.14" "$src/nvml.c"
    ln -sf libnvidia-ml.so.550.54.14 "$root/usr/lib64/libnvidia-ml.so.1"
    printf '#!/bin/sh\necho fake-nvidia-smi; ls /dev | grep nvidia\n' >"$root/usr/bin/nvidia-smi"
    chmod 0755 "$root/usr/bin/nvidia-smi"
}

# The cgroups Slurm's cgroup/v1 plugin made for our jobs (slurm_nodeN/uid_U/
# job_J in each controller), removed once the daemons are gone (empty
# folders only). Only this instance's job ids (FirstJobId): the slurm_nodeN
# and uid_U folders are shared with every other GPU-site instance running
# beside it (the release roots' clusters run at once), whose steps would
# fail ("unable to add pids") if their folders vanished under them.
remove_node_cgroups() {
    local i c job first=$(((${SUBNET##*.} * 4 + SLOT) * 50000 + 1))
    for ((i = 1; i <= NODES; i++)); do
        for c in /sys/fs/cgroup/*/slurm_"$(node_name "$i")"/uid_*/job_*; do
            [[ -d $c ]] || continue
            job=${c##*/job_}
            [[ $job =~ ^[0-9]+$ ]] && ((job >= first && job < first + 50000)) || continue
            find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        done
    done
}

# The TaskProlog/TaskEpilog lines of slurm.conf.
task_script_lines() {
    case $TASK_PROLOG_MODE in
    none) ;;
    harness)
        write_task_scripts
        printf 'TaskProlog=%s\nTaskEpilog=%s\n' "$ETC_DIR/task-prolog.sh" "$ETC_DIR/task-epilog.sh"
        ;;
    /*) printf 'TaskProlog=%s\n' "$TASK_PROLOG_MODE" ;;
    *) die "BERTH_TEST_TASK_PROLOG must be harness, none or an absolute path (got '$TASK_PROLOG_MODE')" ;;
    esac
}

write_config() {
    mkdir -p "$ETC_DIR" "$PLUGSTACK_DIR"
    local i nodelist=""
    for ((i = 1; i <= NODES; i++)); do
        nodelist+=${nodelist:+,}$(node_name "$i")
    done

    {
        cat <<EOF
# Generated by tests/harness/cluster.sh for test cluster "$NAME". Do not edit.
ClusterName=$NAME
SlurmctldHost=$CTLD_HOSTNAME($BRIDGE_IP)
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
CommunicationParameters=NoCtldInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=$CRED_TYPE

StateSaveLocation=$CTLD_STATE_DIR
SlurmctldPidFile=$CTLD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdSpoolDir=$NODES_DIR/%n/spool
SlurmdPidFile=$PID_DIR/slurmd-%n.pid
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$ETC_DIR/plugstack.conf$(plugin_dir_line)

$(site_lines)
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
$(slurmd_parameters)

ReturnToService=2
SlurmctldTimeout=120
SlurmdTimeout=300
MessageTimeout=10
BatchStartTimeout=60
KillWait=5
UnkillableStepTimeout=120
InactiveLimit=0
MailProg=/bin/true
MinJobAge=60
# Job ids of this instance's own (from its subnet and slot): a test that
# looks for a job's mounts or files by its id never finds those of another
# cluster running beside it (tests/run.sh runs the release roots' at once).
FirstJobId=$(((${SUBNET##*.} * 4 + SLOT) * 50000 + 1))
$(task_script_lines)

EOF
        for ((i = 1; i <= NODES; i++)); do
            printf 'NodeName=%s NodeAddr=%s NodeHostname=%s CPUs=4%s State=UNKNOWN\n' \
                "$(node_name "$i")" "$(node_ip "$i")" "$(node_name "$i")" \
                "$([[ $SITE == gpu ]] && echo ' Gres=gpu:2')"
        done
        # OverSubscribe=YES: jobs that ask (--oversubscribe) may share CPUs,
        # for tests that run more jobs on one node than it has CPUs.
        local default_list="" j
        for ((j = 1; j <= DEFAULT_NODES; j++)); do
            default_list+=${default_list:+,}$(node_name "$j")
        done
        printf 'PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n' "$default_list"
        printf 'PartitionName=wide Nodes=%s MaxTime=INFINITE State=UP OverSubscribe=YES\n' "$nodelist"
    } >"$SLURM_CONF_FILE"

    # Bind-mounted over /etc/hosts inside the controller's and the nodes'
    # mount namespaces: names resolve without touching the host's file.
    # This machine's own name too, at the bridge address, where the nodes and
    # the controller reach srun and sbatch: slurmctld 24.11 and later look
    # up the submitting host by name (its alloc_node) when they tell srun
    # that its job ended or is killed, and retry an unknown name for 10 s,
    # past MessageTimeout, so that the srun, salloc or scancel waiting on
    # that RPC fails with "Socket timed out on send/recv operation".
    local me
    me=$(hostname)
    {
        printf '127.0.0.1\tlocalhost\n'
        printf '%s\t%s\n' "$BRIDGE_IP" "$CTLD_HOSTNAME"
        [[ $me == localhost || $me == "$CTLD_HOSTNAME" || $me =~ ^node[0-9]+$ ]] ||
            printf '%s\t%s\n' "$BRIDGE_IP" "$me"
        for ((i = 1; i <= NODES; i++)); do
            printf '%s\t%s\n' "$(node_ip "$i")" "$(node_name "$i")"
        done
    } >"$ETC_DIR/hosts"

    printf 'include %s/*.conf\n' "$PLUGSTACK_DIR" >"$ETC_DIR/plugstack.conf"
    if [[ $SITE == gpu ]]; then
        write_gpu_config
        build_fake_driver
    else
        rm -f "$ETC_DIR/cgroup.conf" "$ETC_DIR/gres.conf" "$ETC_DIR/job_container.conf"
    fi
    if [[ -n ${BERTH_PLUGSTACK_LINE:-} ]]; then
        local line=$BERTH_PLUGSTACK_LINE
        [[ $SITE != gpu ]] || line+=" gpu_dev_root=$GPU_DIR/dev gpu_driver_root=$GPU_DIR/driver"
        printf '%s\n' "$line" >"$PLUGSTACK_DIR/berth.conf"
        log "wrote $PLUGSTACK_DIR/berth.conf: $line"
    fi
}

# ---------------------------------------------------------------- network

make_node_netns() {
    local i=$1 ns vh vn
    ns=$(node_netns "$i")
    vh=$(veth_host "$i")
    vn=$(veth_node "$i")
    ip netns add "$ns"
    ip link add "$vh" type veth peer name "$vn"
    ip link set "$vh" master "$BRIDGE"
    ip link set "$vh" up
    ip link set "$vn" netns "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$vn" name eth0
    ip -n "$ns" addr add "$(node_ip "$i")/$NET_PREFIX_LEN" dev eth0
    ip -n "$ns" link set eth0 up
}

# ---------------------------------------------------------------- daemons

start_slurmctld() {
    log "starting slurmctld on $BRIDGE_IP:$SLURMCTLD_PORT"
    # Own UTS and mount namespaces: the controller's host name matches
    # SlurmctldHost whatever this machine is called, and resolves (through
    # our hosts file) to the bridge address, the only one it listens on
    # (CommunicationParameters=NoCtldInAddrAny).
    # shellcheck disable=SC2016  # $1.. belong to the inner sh
    SLURM_CONF=$SLURM_CONF_FILE unshare --uts --mount --propagation private -- /bin/sh -c '
            set -e
            hostname "$1"
            mount --bind "$2" /etc/hosts
            exec slurmctld -f "$3"
        ' sh "$CTLD_HOSTNAME" "$ETC_DIR/hosts" "$SLURM_CONF_FILE"
}

start_slurmd() {
    local i=$1 node ns tmp
    node=$(node_name "$i")
    ns=$(node_netns "$i")
    tmp=$NODES_DIR/$node/tmp
    mkdir -p "$tmp" "$NODES_DIR/$node/spool"
    chmod 1777 "$tmp"
    local gpu_dev=""
    if [[ $SITE == gpu ]]; then
        make_fake_gpus "$node"
        gpu_dev=$NODES_DIR/$node/gpu-dev
    fi
    log "starting slurmd $node ($(node_ip "$i"), netns $ns)"
    # nsenter --net (not `ip netns exec`, which remounts /sys and hides the
    # cgroup mounts); own hostname (Open MPI tells nodes apart by it); own
    # /tmp (Slurm's PMIx plugin uses fixed names under /tmp), /dev/shm and
    # /etc/hosts (cluster names only); own IPC namespace (System V objects
    # and message queues of its own, like a real node: UCX then tells the
    # nodes apart and keeps shared memory within one node).
    # On the GPU site the node runs on CPU 0 only, its mount namespace made
    # there too: Linux 6.18 hands out mount namespace ids in per-CPU batches,
    # so a namespace made later on another CPU can get a lower id, and the
    # kernel then refuses (EINVAL) job_container/tmpfs's bind of the job's
    # namespace file into the node's ("ns base mount failed: Invalid
    # argument", about one job in two on this 2-CPU machine). One CPU keeps
    # the ids in creation order.
    local pin=()
    [[ $SITE != gpu ]] || pin=(taskset -c 0)
    # shellcheck disable=SC2016  # $1.. belong to the inner sh
    SLURM_CONF=$SLURM_CONF_FILE "${pin[@]}" nsenter --net="/var/run/netns/$ns" -- \
        unshare --uts --ipc --mount --propagation private -- /bin/sh -c '
            set -e
            hostname "$1"
            mount --bind "$2" /tmp
            mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
            [ ! -d /dev/mqueue ] || mount -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue
            mount --bind "$3" /etc/hosts
            [ -z "$5" ] || mount --bind "$5" "$6"
            exec slurmd -f "$4" -N "$1"
        ' sh "$node" "$tmp" "$ETC_DIR/hosts" "$SLURM_CONF_FILE" "$gpu_dev" "$GPU_DIR/dev"
}

wait_for_pidfile() {
    local file=$1 comm=$2 what=$3 i
    for ((i = 0; i < 100; i++)); do
        pid_alive "$file" "$comm" && return 0
        sleep 0.1
    done
    die "$what did not start; see $LOG_DIR"
}

wait_idle() {
    local deadline=$((SECONDS + WAIT_IDLE_S)) states idle
    while :; do
        states=$(SLURM_CONF=$SLURM_CONF_FILE sinfo -h -N -o '%N %t' 2>/dev/null || true)
        idle=$(awk '$2 == "idle" && !seen[$1]++ {n++} END {print n + 0}' <<<"$states")
        if ((idle == NODES)); then
            log "all $NODES nodes idle"
            return
        fi
        if ! pid_alive "$CTLD_PID" slurmctld; then
            tail -n 5 "$LOG_DIR/slurmctld.log" >&2 || true
            die "slurmctld died; see $LOG_DIR/slurmctld.log"
        fi
        if ((SECONDS >= deadline)); then
            printf '%s\n' "$states" >&2
            die "nodes not idle after ${WAIT_IDLE_S}s; logs in $LOG_DIR"
        fi
        sleep 0.5
    done
}

fully_up() {
    local i extra
    pid_alive "$CTLD_PID" slurmctld || return 1
    for ((i = 1; i <= NODES; i++)); do
        [[ -e /var/run/netns/$(node_netns "$i") ]] || return 1
        pid_alive "$PID_DIR/slurmd-$(node_name "$i").pid" slurmd || return 1
    done
    extra=$(ip netns list | awk '{print $1}' | grep -c "^${NAME}-node$((NODES + 1))\$" || true)
    ((extra == 0)) || return 1
    [[ -f $SLURM_CONF_FILE ]]
}

# ---------------------------------------------------------------- verbs

cmd_up() {
    need_root
    local t0=$SECONDS
    if fully_up; then
        log "cluster $NAME already up"
        write_config
        SLURM_CONF=$SLURM_CONF_FILE scontrol reconfigure || true
        wait_idle
        write_env_file
        log "env file: $ENV_FILE"
        return
    fi
    if cluster_running; then
        log "cluster $NAME partly up: cleaning up first"
        cmd_down
    fi

    command -v slurmctld >/dev/null || die "slurmctld missing: run tests/harness/install-deps.sh"
    mkdir -p "$STATE_DIR" "$LOG_DIR" "$PID_DIR" "$NODES_DIR" "$CACHE_DIR"
    chmod 0755 "$STATE_DIR"
    install -d -m 1777 "$WORK_DIR"
    rm -rf --one-file-system "$CTLD_STATE_DIR" "${NODES_DIR:?}"/* ||
        die "cannot empty $NODES_DIR (something still mounted there?)"
    mkdir -p "$CTLD_STATE_DIR"
    rm -f "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd-*.log

    ensure_munge
    ensure_bridge
    write_config

    start_slurmctld
    wait_for_pidfile "$CTLD_PID" slurmctld slurmctld
    local i
    for ((i = 1; i <= NODES; i++)); do
        make_node_netns "$i"
        start_slurmd "$i"
    done
    for ((i = 1; i <= NODES; i++)); do
        wait_for_pidfile "$PID_DIR/slurmd-$(node_name "$i").pid" slurmd "slurmd $(node_name "$i")"
    done
    wait_idle
    write_env_file
    log "cluster $NAME up in $((SECONDS - t0))s; env file: $ENV_FILE"
    cat "$ENV_FILE"
}

cmd_down() {
    need_root
    local t0=$SECONDS f ns pid
    # The daemons shut down in parallel (each takes a second or two).
    stop_pidfiles 'slurmd|slurmctld' "$PID_DIR"/slurmd-*.pid "$CTLD_PID"
    # Anything still running inside our node namespaces (slurmstepd, tasks
    # of jobs that were running) was started by our slurmds: end it.
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${NAME}-node[0-9]+\$" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            log "killing leftover pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo '?')) in $ns"
            kill -KILL "$pid" 2>/dev/null || true
        done
        ip netns del "$ns"
        log "removed netns $ns"
    done
    # srun/salloc/sbatch clients of this cluster left on the host (their
    # environment names our SLURM_CONF) would wait forever for it; they
    # ignore SIGTERM once their controller is gone.
    for pid in $(pgrep -r R,S,D -x srun; pgrep -r R,S,D -x salloc; pgrep -r R,S,D -x sbatch); do
        if grep -qxF "SLURM_CONF=$SLURM_CONF_FILE" < <(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null); then
            log "killing client pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo '?'))"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    # Host ends of the veth pairs normally vanish with the namespaces.
    for f in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${IFTAG}-h[0-9]+\$" || true); do
        ip link del "$f" 2>/dev/null || true
    done
    # --one-file-system: never descend into something left mounted there.
    rm -rf --one-file-system "$ETC_DIR" "$ENV_FILE" "$CTLD_STATE_DIR" "${NODES_DIR:?}" ||
        warn "could not remove everything under $NODES_DIR (something still mounted?)"
    remove_node_cgroups
    maybe_stop_munge
    remove_shared_if_unused
    log "cluster $NAME down in $((SECONDS - t0))s (kept $CACHE_DIR, $LOG_DIR, $WORK_DIR)"
}

cmd_status() {
    if [[ ! -f $SLURM_CONF_FILE ]]; then
        echo "cluster $NAME: not configured ($SLURM_CONF_FILE missing)"
        return 1
    fi
    local f
    echo "cluster $NAME (SLURM_CONF=$SLURM_CONF_FILE)"
    for f in "$CTLD_PID" "$PID_DIR"/slurmd-*.pid; do
        [[ -e $f ]] || continue
        if pid_alive "$f"; then
            printf '  %-24s pid %s\n' "$(basename "$f" .pid)" "$(head -n1 "$f")"
        else
            printf '  %-24s not running\n' "$(basename "$f" .pid)"
        fi
    done
    SLURM_CONF=$SLURM_CONF_FILE sinfo -N -o '%N %10T %c %O %o'
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) print_env ;;
    *)
        usage
        exit 2
        ;;
esac
