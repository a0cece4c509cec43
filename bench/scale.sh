#!/usr/bin/env bash
# Usage: bench/scale.sh [RUNS]   (as root)
#
# One new image on N nodes at once (`srun -N N`, N = BERTH_TEST_NODES, at
# least 4, default 4), in three modes, RUNS (default 3) of each, interleaved:
#   node-local  every node pulls into its own store (fanout=none)
#   fan-out     the first node pulls, sbcast carries the squashfs to the others
#               (fanout=sbcast)
#   shared      one store folder for all nodes (store_shared=1); skipped with
#               a message when the installed plugin does not know the key
# Before each run every node store (and the shared one) is emptied, so the
# image is new each time. Prints per mode: registry GETs per blob and in all,
# bytes the registry served for blobs (from its access log), and the time
# from srun's start to the first task on every node (each task prints its
# start time), medians over the runs. Then the sbcast tree alone: the
# stored squashfs broadcast RUNS times with plain `sbcast` from the job's
# first node to its N nodes, the time each node's copy was complete (the
# tree time per node) and the MB/s per node; and fan-out's send line from
# node1's log (hash and sign, sbcast).
#
# BERTH_SCALE_MODES picks modes (default "node-local fan-out shared"); the
# sbcast passes broadcast the squashfs the last mode stored.
# BERTH_SCALE_TREE_WIDTH: the second pass's TreeWidth (default 4).
#
# Image: BERTH_SCALE_IMAGE: a name in the test registry (default
# mpich:bookworm, ~71 MB in 2 layers, pushed by tests/harness/images.sh
# unless the registry already has it), or small300k / small1m, bench/pull.sh's
# small-file images (built once into its cache folder, pushed with skopeo).
# Every task runs the host's static busybox, bound in, so images without a
# shell run.
# Starts its own registry and cluster (BERTH_TEST_NAME, default berthscale;
# BERTH_TEST_SLOT, default 2; ports from the BERTH_TEST_*_PORT variables as in
# tests/harness) and tears them down.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
RUNS=${1:-3}
[[ $(id -u) -eq 0 ]] || { echo "bench/scale.sh must run as root" >&2; exit 1; }
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID

export BERTH_TEST_NAME=${BERTH_TEST_NAME:-berthscale} BERTH_TEST_SLOT=${BERTH_TEST_SLOT:-2}
export BERTH_TEST_NODES=${BERTH_TEST_NODES:-4}
((BERTH_TEST_NODES >= 4)) || { echo "BERTH_TEST_NODES must be at least 4" >&2; exit 1; }
export BERTH_TEST_CACHE_DIR=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}
NAME_IMAGE=${BERTH_SCALE_IMAGE:-mpich:bookworm}
tests/harness/install-deps.sh >/dev/null
source tests/harness/rust-env.sh
STATE=/var/lib/$BERTH_TEST_NAME
PREFIX=$STATE/prefix
make install PREFIX="$PREFIX" >/dev/null
trap '"$REPO"/tests/harness/cluster.sh down >/dev/null 2>&1; "$REPO"/tests/harness/registry.sh down >/dev/null 2>&1' EXIT
tests/harness/registry.sh up >/dev/null
source tests/harness/lib.sh >/dev/null
BASE="required $PREFIX/lib/slurm/spank_berth.so helper_path=$PREFIX/bin/berth runtime_path=/run/$BERTH_TEST_NAME/berth insecure_registries=$REGISTRY_ADDR"
LOCAL_STORE="store_path=$STATE/nodes/%n/berth-store"
SHARED=$STATE/shared-store
export BERTH_PLUGSTACK_LINE="$BASE $LOCAL_STORE"
tests/harness/cluster.sh up >/dev/null
source bench/lib.sh
case $NAME_IMAGE in
small300k | small1m)
    # bench/pull.sh's small-file image (built once, in its cache folder).
    files=300000
    [[ $NAME_IMAGE == small1m ]] && files=1000000
    SMALL_LAYOUT=$BERTH_TEST_CACHE_DIR/bench-pull-$NAME_IMAGE
    bench_small_layout "$SMALL_LAYOUT" "$files"
    NAME_IMAGE=bench/$NAME_IMAGE:img
    ;;
esac
# An image pushed beforehand to this registry is used as it is.
if ! curl -sf -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$REGISTRY_ADDR/v2/${NAME_IMAGE%%:*}/manifests/${NAME_IMAGE#*:}"; then
    if [[ -n ${SMALL_LAYOUT:-} ]]; then
        skopeo copy --quiet --dest-tls-verify=false "oci:$SMALL_LAYOUT/layout:img" "docker://$REGISTRY_ADDR/$NAME_IMAGE"
    else
        tests/harness/images.sh push "${NAME_IMAGE%%:*}" >/dev/null
    fi
fi
source "/run/$BERTH_TEST_NAME/env"
cd "$BERTH_TEST_WORKDIR"
IMAGE=$BERTH_TEST_REGISTRY/$NAME_IMAGE
REPO_PATH=${NAME_IMAGE%%:*}
DROPIN=$BERTH_TEST_PLUGSTACK_DIR/berth.conf
N=$BERTH_TEST_NODES
TASK_BIND=--container-mounts=/usr/bin/busybox:/usr/local/bin/busybox:ro

line_for() {
    case $1 in
    node-local) echo "$BASE $LOCAL_STORE" ;;
    fan-out) echo "$BASE $LOCAL_STORE fanout=sbcast fanout_min_nodes=4 fanout_dir=/tmp/berth-fanout" ;;
    shared) echo "$BASE store_path=$SHARED store_shared=1" ;;
    esac
}

read -ra modes <<<"${BERTH_SCALE_MODES:-node-local fan-out shared}"
for mode in "${modes[@]}"; do
    [[ $mode == node-local || $mode == fan-out || $mode == shared ]] ||
        { echo "bench/scale.sh: unknown mode '$mode' in BERTH_SCALE_MODES (node-local, fan-out, shared)" >&2; exit 2; }
done
echo "$(line_for shared)" >"$DROPIN"
if [[ " ${modes[*]} " == *" shared "* ]] && ! probe=$(runuser -u berthuser -- srun -N1 true 2>&1); then
    echo "shared mode skipped: this berth does not take store_shared=1 ($(grep -o 'unknown argument[^(]*' <<<"$probe" | head -1))" >&2
    read -ra modes <<<"${modes[*]/shared/}"
fi

empty_stores() {
    local i
    for ((i = 1; i <= N; i++)); do
        rm -rf "$STATE/nodes/node$i/berth-store" "$STATE/nodes/node$i/tmp/berth-fanout"
    done
    rm -rf "$SHARED"
}

declare -A first total gets bytes
for ((run = 1; run <= RUNS; run++)); do
    for mode in "${modes[@]}"; do
        line_for "$mode" >"$DROPIN"
        empty_stores
        before=$(wc -l <"$BERTH_TEST_REGISTRY_LOG")
        out=$STATE/scale-$mode-$run.out
        t0=$(cut -d' ' -f1 /proc/uptime)
        # The host's static busybox, bound in: images without a shell run.
        runuser -u berthuser -- srun -p wide -N"$N" "--container-image=$IMAGE" "$TASK_BIND" \
            /usr/local/bin/busybox sh -c 'b=/usr/local/bin/busybox; echo "start $($b hostname) $($b cat /proc/uptime)"' \
            >"$out" 2>"$out.err" ||
            { echo "$mode run $run failed:" >&2; cat "$out.err" >&2; exit 1; }
        t1=$(cut -d' ' -f1 /proc/uptime)
        sleep 1 # the registry's log lines land
        tail -n +"$((before + 1))" "$BERTH_TEST_REGISTRY_LOG" | grep "\"GET /v2/$REPO_PATH/blobs/" >"$out.reg" || true
        per_blob=$(awk '{print $7}' "$out.reg" | sort | uniq -c | awk '{print $1}' | sort -n | uniq -c |
            awk '{printf "%s%d blob(s) x%d", (NR > 1 ? ", " : ""), $1, $2}')
        gets[$mode]+="$(wc -l <"$out.reg") "
        bytes[$mode]+="$(awk '$9 == 200 {s += $10} END {print s + 0}' "$out.reg") "
        times=$(awk -v t0="$t0" '$1 == "start" {printf "%s=%.2f ", $2, $3 - t0}' "$out")
        last=$(awk -v t0="$t0" '$1 == "start" && $3 - t0 > m {m = $3 - t0} END {printf "%.2f", m}' "$out")
        first[$mode]+="$last "
        total[$mode]+="$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') "
        echo "run $run $mode: blob GETs: $per_blob; first task per node (s after srun start): $times" >&2
        grep -o "node[0-9]*: [^ ]*: received from the step's first node in [0-9.]* s" "$out.err" |
            awk '{printf "%s%s %s s", (NR > 1 ? ", " : "  fan-out receivers (from their wait to the imported image): "), $1, $(NF - 1)} END {if (NR) print ""}' >&2 || true
    done
done

# The sbcast tree alone: the squashfs the last mode stored, broadcast with
# plain `sbcast` by a batch script on the job's first node (as fan-out's
# send is) to the job's N nodes; each node's copy's modification time (its
# last block written) against the broadcast's start gives the tree time per
# node. RUNS times; fan-out's send is this broadcast, then the receivers
# import the file into their stores.
SQFS=$( (find "$STATE/nodes/node1/berth-store" "$SHARED" -name image.sqfs 2>/dev/null || true) | head -1)
[[ -n $SQFS ]] || { echo "no stored squashfs left to broadcast" >&2; exit 1; }
SBCAST_SRC=/var/tmp/berth-scale-sbcast.$$
install -m 0644 "$SQFS" "$SBCAST_SRC"
Q=$(stat -c %s "$SBCAST_SRC")
SBCAST_JOB=/var/tmp/berth-scale-sbcast-job.$$
cat >"$SBCAST_JOB" <<'EOS'
#!/bin/sh
t0=$(date +%s.%N)
sbcast -f "$1" /tmp/berth-scale-sbcast || exit 1
t1=$(date +%s.%N)
echo "sbcast $(hostname) $t0 $t1"
srun -N"$SLURM_NNODES" --ntasks-per-node=1 \
    sh -c 'echo "arrived $(hostname) $(stat -c "%.9Y %s" /tmp/berth-scale-sbcast)"'
EOS
chmod 0755 "$SBCAST_JOB"
trap 'rm -f "$SBCAST_SRC" "$SBCAST_JOB"; "$REPO"/tests/harness/cluster.sh down >/dev/null 2>&1; "$REPO"/tests/harness/registry.sh down >/dev/null 2>&1' EXIT
line_for node-local >"$DROPIN"
# sent_bytes I: the bytes node I has sent (received by its veth's host side).
sent_bytes() { cat "/sys/class/net/$(veth_host "$1")/statistics/rx_bytes"; }
# sbcast_pass WIDTH: RUNS broadcasts with slurm.conf's TreeWidth=WIDTH
# (slurmctld reconfigured; sbcast and slurmd read it); appends one summary
# line to SBCAST_SUMMARY.
SBCAST_SUMMARY=
sbcast_pass() {
    local width=$1 run out t0 t1 arrivals totals=() medians=() lasts=() st sm sl i
    local -a before first_sent other_sent
    sed -i '/^TreeWidth=/d' "$SLURM_CONF"
    echo "TreeWidth=$width" >>"$SLURM_CONF"
    scontrol reconfigure
    sleep 2
    for ((run = 1; run <= RUNS; run++)); do
        out=$BERTH_TEST_WORKDIR/scale-sbcast-$width-$run.out
        for ((i = 1; i <= N; i++)); do before[i]=$(sent_bytes "$i"); done
        runuser -u berthuser -- sbatch --wait -p wide -N"$N" -o "$out" "$SBCAST_JOB" "$SBCAST_SRC" >/dev/null 2>"$out.err" ||
            { echo "sbcast run $run failed:" >&2; cat "$out.err" "$out" >&2; exit 1; }
        read -r t0 t1 < <(awk '$1 == "sbcast" {print $3, $4}' "$out")
        arrivals=$(awk -v t0="$t0" -v q="$Q" '$1 == "arrived" && $4 == q {printf "%s %.2f\n", $2, $3 - t0}' "$out" | sort -V)
        (($(wc -l <<<"$arrivals") == N)) || { echo "sbcast run $run: not every node has the whole file:" >&2; cat "$out" >&2; exit 1; }
        # What each node sent (its veth's host side received): the first
        # node's link carries the file once per child in the tree, relaying
        # nodes once per child of theirs.
        first_sent+=("$(awk -v a="${before[1]}" -v b="$(sent_bytes 1)" -v q="$Q" 'BEGIN {printf "%.1f", (b - a) / q}')")
        other_sent+=("$(for ((i = 2; i <= N; i++)); do
            awk -v a="${before[i]}" -v b="$(sent_bytes "$i")" -v q="$Q" 'BEGIN {printf "%.1f\n", (b - a) / q}'
        done | sort -g | tail -1)")
        totals+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')")
        medians+=("$(awk '{print $2}' <<<"$arrivals" | median)")
        lasts+=("$(awk '{print $2}' <<<"$arrivals" | sort -n | tail -1)")
        echo "run $run sbcast alone, TreeWidth=$width: ${totals[-1]} s; each node's copy complete (s after the start): $(awk '{printf "%s=%s ", $1, $2}' <<<"$arrivals"); node1 sent ${first_sent[-1]} x the file, another node at most ${other_sent[-1]} x" >&2
    done
    st=$(printf '%s\n' "${totals[@]}" | median) sm=$(printf '%s\n' "${medians[@]}" | median) sl=$(printf '%s\n' "${lasts[@]}" | median)
    SBCAST_SUMMARY+=$(awk -v w="$width" -v q="$Q" -v n="$N" -v t="$st" -v m="$sm" -v l="$sl" \
        -v f="$(printf '%s\n' "${first_sent[@]}" | median)" -v o="$(printf '%s\n' "${other_sent[@]}" | median)" 'BEGIN {
        printf "  TreeWidth=%-3s whole sbcast %6.2f s; a node'"'"'s copy complete after %6.2f s (median node), %6.2f s (last); %6.1f MB/s per node, %6.1f MB/s written over all nodes; node1 sent %.1f x the file, another node at most %.1f x\n",
            w, t, m, l, q / 1e6 / m, n * q / 1e6 / t, f, o }')$'\n'
}
# The cluster's TreeWidth (Slurm's default 50: one level up to 50 nodes),
# then BERTH_SCALE_TREE_WIDTH (default 4: two levels at 16 nodes).
CLUSTER_WIDTH=$(scontrol show config | awk '$1 == "TreeWidth" {print $3}')
for width in "$CLUSTER_WIDTH" ${BERTH_SCALE_TREE_WIDTH-4}; do
    sbcast_pass "$width"
done
SEND_LINES=$(grep -h 'fan-out: sent' "$BERTH_TEST_LOG_DIR/slurmd-node1.log" 2>/dev/null | tail -n "$RUNS" |
    grep -o 'sent .*' || true)

echo
echo "$N nodes, image $IMAGE, medians of $RUNS runs (stores emptied before each run)"
printf '%-11s %14s %16s %26s %14s\n' mode "blob GETs" "blob MB served" "first task on every node" "srun total"
for mode in "${modes[@]}"; do
    g=$(tr ' ' '\n' <<<"${gets[$mode]}" | grep . | median)
    b=$(tr ' ' '\n' <<<"${bytes[$mode]}" | grep . | median)
    f=$(tr ' ' '\n' <<<"${first[$mode]}" | grep . | median)
    t=$(tr ' ' '\n' <<<"${total[$mode]}" | grep . | median)
    printf '%-11s %14s %16.1f %24s s %12s s\n' "$mode" "$g" "$(awk -v b="$b" 'BEGIN {print b / 1e6}')" "$f" "$t"
done
echo
printf 'sbcast alone of the %.1f MB squashfs from the first node to %d nodes, medians of %d runs:\n' "$(awk -v q="$Q" 'BEGIN {print q / 1e6}')" "$N" "$RUNS"
printf '%s' "$SBCAST_SUMMARY"
if [[ -n $SEND_LINES ]]; then
    echo "fan-out's send on node1 (its log), per run:"
    sed 's/^/  /' <<<"$SEND_LINES"
fi
