#!/usr/bin/env bash
# Usage: bench/writable.sh [N]   (as root, beside a running test cluster)
#
# What idmapped, writable images cost (issue 16 bug 1): on the ~3 GB
# synthetic image of bench/pull.sh, medians of N runs (default 3) of each
# way, interleaved, in this same run, every one a one-task `srun` on the
# first node of the cluster:
#
#   host:      a plain folder on the host holding the image's files (unpacked
#              once, owned by the user), a bare step of the user;
#   root:      root's container: squashfs and a tmpfs overlay, no id
#              mapping (what every container was before images were mapped);
#   user ro:   the user's `--container-readonly` container (mapped image,
#              read-only root);
#   user rw:   the user's writable container (the default: mapped image,
#              overlay; the image's files are the user's).
#
# Measured, each time including the step's start (the first row alone):
# `true`; creating and then removing many new files in /usr; removing a
# folder of the image (/usr/share/doc: whiteouts in an overlay); appending a
# byte to two 60 MB image files (copy-up); reading the image's ~33k small
# files (/usr/share/doc, the Python modules; about 190 MB) with a cold page
# cache (MB/s; the bench fails when it cannot drop caches); `find` over the
# whole tree with a cold cache. The read-only container cannot write: "-".
#
# The image (bench/make-image.py) is built once and cached under
# $BERTH_TEST_CACHE_DIR/bench-pull (its squashfs as bench-pull/big.sqfs, as
# bench/userfile.sh makes it). Cluster: BERTH_TEST_NAME (default berthdev3:
# its /run/NAME/env). Not part of the test suite (it takes minutes).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${1:-3}
NEW_FILES=${BERTH_BENCH_NEW_FILES:-10000}
[[ $(id -u) -eq 0 ]] || { echo "bench/writable.sh must run as root" >&2; exit 1; }
NAME=${BERTH_TEST_NAME:-berthdev3}
# shellcheck disable=SC1090
source "/run/$NAME/env"
BERTH=${BERTH:-$BERTH_TEST_STATE_DIR/prefix/bin/berth}
USER_NAME=${BERTH_TEST_USER:-berthuser}
NODE=${BERTH_TEST_NODE_NAMES%%,*}
CACHE=${BERTH_TEST_CACHE_DIR:-/var/cache/berth-test}/bench-pull
WORK=/var/tmp/berth-bench-writable.$$
mkdir -p "$WORK" "$CACHE"
chmod 0755 "$WORK"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
cd "$BERTH_TEST_WORKDIR"

if [[ ! -d $CACHE/layout ]]; then
    echo "building the ~3 GB synthetic image in $CACHE/layout (once; a few minutes)" >&2
    python3 "$REPO/bench/make-image.py" "$CACHE/layout" >&2
fi
IMAGE=$BERTH_TEST_REGISTRY/bench/writable:big
skopeo copy --quiet --dest-tls-verify=false "oci:$CACHE/layout:big" "docker://$IMAGE"
if [[ ! -f $CACHE/big.sqfs ]]; then
    echo "making its squashfs (once): pull into a scratch store" >&2
    "$BERTH" pull --store "$WORK/scratch" --progress none \
        --insecure-registry "$BERTH_TEST_REGISTRY" "$IMAGE" >/dev/null
    cp "$WORK"/scratch/images/*/image.sqfs "$CACHE/big.sqfs.tmp"
    mv "$CACHE/big.sqfs.tmp" "$CACHE/big.sqfs"
    rm -rf "$WORK/scratch"
fi
HOST=$WORK/host
unsquashfs -q -n -d "$HOST" "$CACHE/big.sqfs" >/dev/null
chown -R "$USER_NAME:" "$HOST"
echo "host folder: $(du -sh "$HOST" | cut -f1) in $(find "$HOST" | wc -l) entries, owned by $USER_NAME" >&2

BB=/usr/local/bin/busybox
BIND=--container-mounts=/usr/bin/busybox:$BB:ro
srun_as() {
    local who=$1
    shift
    runuser -u "$who" -- srun -N1 -n1 -w "$NODE" "$@"
}
# run_WAY SCRIPT: a shell script whose paths start with $R (the root: "" or
# $HOST) and that calls busybox as $B.
run_host() { srun_as "$USER_NAME" /usr/bin/busybox sh -c "R=$HOST B=/usr/bin/busybox; $1"; }
run_root() { srun_as root "--container-image=$IMAGE" "$BIND" "$BB" sh -c "R= B=$BB; $1"; }
run_ro() { srun_as "$USER_NAME" "--container-image=$IMAGE" "$BIND" --container-readonly "$BB" sh -c "R= B=$BB; $1"; }
run_rw() { srun_as "$USER_NAME" "--container-image=$IMAGE" "$BIND" "$BB" sh -c "R= B=$BB; $1"; }
WAYS=(host root ro rw)
srun_as "$USER_NAME" test -w "$HOST/usr" || { echo "$USER_NAME cannot write $HOST/usr on $NODE" >&2; ls -ld "$HOST" "$HOST/usr" >&2; exit 1; }
echo "pulling $IMAGE on $NODE (once)" >&2
run_root true >/dev/null
run_rw true >/dev/null

drop_caches() {
    sync
    if ! echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
        echo "bench/writable.sh: cannot drop the page cache; cold numbers would be warm" >&2
        exit 1
    fi
}
# ms WAY SCRIPT: wall ms of a step that must succeed (its stdout to $WORK/out).
ms() {
    local t0 t1
    t0=$(date +%s%N)
    if ! "run_$1" "$2" >"$WORK/out" 2>"$WORK/err"; then
        echo "bench/writable.sh: a measured step failed ($1): $2" >&2
        cat "$WORK/err" >&2
        exit 1
    fi
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
}
# Put back what a host run removed or changed (not timed; containers start fresh).
restore_host() {
    rm -rf "$HOST/usr/share/doc" "$HOST/usr/lib/python3/site-packages/native" "$HOST/usr/bench-new"
    unsquashfs -q -n -f -d "$HOST" "$CACHE/big.sqfs" /usr/share/doc \
        /usr/lib/python3/site-packages/native >/dev/null
    chown -R "$USER_NAME:" "$HOST" # unsquashfs gives the parent folders back to root
}

TRUE=true
CREATE="\$B mkdir \$R/usr/bench-new && cd \$R/usr/bench-new && \$B seq 1 $NEW_FILES | \$B xargs \$B touch \
    && cd / && \$B rm -rf \$R/usr/bench-new"
REMOVE="\$B rm -rf \$R/usr/share/doc && ! \$B test -e \$R/usr/share/doc"
COPYUP="for f in \$R/usr/lib/python3/site-packages/native/ext[01].so; do echo x >>\$f || exit 1; done"
# The many small files (docs, Python modules: what a file-system layer slows
# most), not the large blobs: a full 3 GB cold read takes minutes per run on
# a busy machine.
FILES="\$B find \$R/usr/share/doc \$R/usr/lib/python3/site-packages -type f -name '*.*' ! -path '*/native/*'"
READ="$FILES -print0 | \$B xargs -0 \$B cat | \$B wc -c"
FIND="\$B find \$R/ -xdev | \$B wc -l"
ROWS=(true create remove copyup read find)
declare -A SCRIPT=([true]=$TRUE [create]=$CREATE [remove]=$REMOVE [copyup]=$COPYUP [read]=$READ [find]=$FIND)
declare -A COLD=([read]=1 [find]=1)
declare -A T BYTES
for ((i = 0; i < N; i++)); do
    for row in "${ROWS[@]}"; do
        for way in "${WAYS[@]}"; do
            [[ $way == ro && $row =~ ^(create|remove|copyup)$ ]] && continue
            [[ -n ${COLD[$row]:-} ]] && drop_caches
            T[$row,$way]+="$(ms "$way" "${SCRIPT[$row]}") "
            [[ $row == read ]] && BYTES[$way]=$(tr -d ' \n' <"$WORK/out")
            [[ $way == host && $row =~ ^(remove|copyup)$ ]] && restore_host
        done
    done
done
# Every way read the same files (the container's /etc/hosts and the like aside).
for way in root ro rw; do
    d=$((BYTES[$way] - BYTES[host]))
    ((d < 0)) && d=$((-d))
    ((d < 1048576)) || { echo "$way read ${BYTES[$way]} bytes, host ${BYTES[host]}" >&2; exit 1; }
done

median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mbs() { awk -v b="${BYTES[host]}" -v t="$1" 'BEGIN {printf "%.0f", b / 1048576 / (t / 1000)}'; }
declare -A LABEL=([true]="start (true)" [create]="create+remove $NEW_FILES files in /usr"
    [remove]="rm -rf /usr/share/doc (image files)" [copyup]="append to 2 x 60 MB image files"
    [read]="read the small files, cold" [find]="find over the tree, cold")
echo "image: $(du -sh "$HOST" | cut -f1) ($((BYTES[host] >> 20)) MiB read in small files); node $NODE; medians of $N (ms, each with the step's start)"
printf '%-38s %8s %8s %8s %8s %8s\n' "" host root "user ro" "user rw" "rw/root"
for row in "${ROWS[@]}"; do
    line=()
    for way in "${WAYS[@]}"; do
        if [[ -n ${T[$row,$way]:-} ]]; then line+=("$(echo "${T[$row,$way]}" | median)"); else line+=(-); fi
    done
    printf '%-38s %8s %8s %8s %8s %8s\n' "${LABEL[$row]}" "${line[@]}" \
        "$(awk -v a="${line[3]}" -v b="${line[1]}" 'BEGIN {printf "%.2f", a / b}')"
done
line=()
for way in "${WAYS[@]}"; do line+=("$(mbs "$(echo "${T[read,$way]}" | median)")"); done
printf '%-38s %8s %8s %8s %8s\n' "read the small files, cold (MB/s)" "${line[@]}"
for row in "${ROWS[@]}"; do
    printf 'runs %-7s' "$row"
    for way in "${WAYS[@]}"; do printf ' %s: %s|' "$way" "${T[$row,$way]:-}"; done
    echo
done
