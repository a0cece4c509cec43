#!/usr/bin/env bash
# Usage: tests/pyxis-suite.sh SLOT [--user USER] [--pyxis DIR] [--timeout SECONDS] [FILE.bats ...]
#
# Runs pyxis's own test suite (NVIDIA/pyxis, tests/*.bats and
# tests/sbatch/*.bats) against berth on the developer cluster of SLOT
# (`tests/dev.sh SLOT up` first), offline, and prints a pass/fail table per
# bats file. Not part of CI: a full run takes about 20 minutes.
#
#   --pyxis DIR     a pyxis checkout; default: `git archive` of the mirror
#                   $PYXIS_MIRROR (/work/.mirror/NVIDIA+pyxis/repo) at
#                   $PYXIS_REF (HEAD), extracted below the cluster's work
#                   folder. Nothing of pyxis is copied into this project.
#   --user USER     who submits (root, the default, or berthuser)
#   --timeout S     limit per bats file (default 900)
#   FILE.bats       only these files (names as in pyxis's tests/, e.g.
#                   name.bats or sbatch/sbatch.bats)
#
# What it sets up for the suite (and takes down again):
# - stand-in images, pushed to the cluster's anonymous registry under the
#   Docker Hub and nvcr.io names the suite uses (library/ubuntu:24.04,
#   nvidia/cuda:..., ...): the Debian base image of tests/harness/images.sh
#   plus one small layer each (an os-release naming the release, the
#   environment and entrypoint of the original where the suite checks them);
# - plugstack mirrors `docker.io=REGISTRY,nvcr.io=REGISTRY`, so `ubuntu:24.04`
#   is pulled from that registry (the line is restored at the end);
# - a local Debian package repository (APT_PACKAGES and their dependencies
#   missing from the base, fetched once into $BERTH_TEST_CACHE_DIR/pyxis-apt
#   with the host's apt, then served on the bridge over HTTP), which every
#   stand-in's /etc/apt/sources.list names, so the suite's
#   `apt-get update && apt-get install file` runs offline;
# - an `enroot` stand-in on PATH for the few enroot verbs the suite calls
#   (import, list, remove; export and exec answer "not mapped");
# - one `salloc -N1 --exclusive` per bats file, run from the pyxis checkout.
#
# Output: the table on stdout; TAP output per file in
# $BERTH_TEST_WORKDIR/pyxis-suite/results-USER/FILE.tap.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
slot=${1:?usage: tests/pyxis-suite.sh SLOT [--user USER] [--pyxis DIR] [FILE.bats ...]}
shift
[[ $slot =~ ^[1-9]$ ]] || { echo "SLOT must be 1..9 (a tests/dev.sh cluster)" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "tests/pyxis-suite.sh must run as root" >&2; exit 1; }

user=root pyxis= limit=900 files=()
while (($#)); do
    case $1 in
    --user) user=${2:?--user USER}; shift 2 ;;
    --pyxis) pyxis=${2:?--pyxis DIR}; shift 2 ;;
    --timeout) limit=${2:?--timeout SECONDS}; shift 2 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
    esac
done

env_file=/run/berthdev$slot/env
[[ -f $env_file ]] || { echo "no cluster in slot $slot: run tests/dev.sh $slot up first" >&2; exit 1; }
# shellcheck disable=SC1090
source "$env_file"
command -v bats >/dev/null || { echo "bats is missing: apt-get install -y bats" >&2; exit 1; }

REG=$BERTH_TEST_REGISTRY
PREFIX=$BERTH_TEST_STATE_DIR/prefix
BASE=$BERTH_TEST_WORKDIR/pyxis-suite
RESULTS=$BASE/results-$user
mkdir -p "$BASE" "$RESULTS"
chmod 0755 "$BASE"

log() { printf '[pyxis-suite] %s\n' "$*" >&2; }

# --- pyxis's tests ---------------------------------------------------------
if [[ -z $pyxis ]]; then
    mirror=${PYXIS_MIRROR:-/work/.mirror/NVIDIA+pyxis/repo}
    ref=${PYXIS_REF:-HEAD}
    pyxis=$BASE/pyxis
    rm -rf "$pyxis"
    mkdir -p "$pyxis"
    git --git-dir="$mirror" archive "$ref" tests | tar -x -C "$pyxis"
    log "pyxis tests from $mirror ($ref: $(git --git-dir="$mirror" describe --tags "$ref" 2>/dev/null || echo "$ref"))"
fi
[[ -f $pyxis/tests/common.bash ]] || { echo "$pyxis has no tests/suite/common.bash" >&2; exit 1; }
chown -R "$user:" "$pyxis"
if ((${#files[@]} == 0)); then
    mapfile -t files < <(cd "$pyxis/tests" && ls -- *.bats sbatch/*.bats)
fi

# --- stand-in images -------------------------------------------------------
LAYOUT=$BERTH_TEST_CACHE_DIR/images/oci
WORK=$(mktemp -d)
conf=$BERTH_TEST_PLUGSTACK_DIR/berth.conf
cp "$conf" "$WORK/berth.conf.saved"
cleanup() {
    [[ -n ${apt_server:-} ]] && kill "$apt_server" 2>/dev/null
    cp "$WORK/berth.conf.saved" "$conf"
    rm -rf "$WORK"
}
trap cleanup EXIT

# standin NAME:TAG PRETTY_NAME [ENV=VALUE ...] [--entrypoint JSON] [--workdir DIR]:
# the Debian base plus a layer with an os-release for PRETTY_NAME (and a
# redhat-release for CentOS), pushed as REG/NAME:TAG.
standin() {
    local ref=$1 pretty=$2 dir tag args=()
    shift 2
    dir=$WORK/layer-${ref//[\/:]/-}
    tag=pyxis-${ref//[\/:]/-}
    mkdir -p "$dir/etc/apt" "$dir/usr/local/bin"
    printf 'deb [trusted=yes] %s ./\n' "$APT_URL" >"$dir/etc/apt/sources.list"
    printf 'NAME="%s"\nPRETTY_NAME="%s (berth stand-in: Debian %s)"\nID=berth-standin\n' \
        "${pretty%% *}" "$pretty" "$(cat "$WORK/debian_version")" >"$dir/etc/os-release"
    [[ $pretty == CentOS* ]] && printf '%s\n' "$pretty" >"$dir/etc/redhat-release"
    while (($#)); do
        case $1 in
        --entrypoint) args+=(--config.entrypoint "$2"); shift 2 ;;
        --workdir) args+=(--config.workingdir "$2"); mkdir -p "$dir$2"; shift 2 ;;
        --file) install -D -m 0755 /dev/stdin "$dir$2" <<<"$3"; shift 3 ;;
        *) args+=(--config.env "$1"); shift ;;
        esac
    done
    tar -C "$dir" --numeric-owner --owner=0 --group=0 --sort=name -cf "$dir.tar" .
    umoci raw add-layer --image "$WORK/oci:base" --tag "$tag" \
        --history.created_by "berth pyxis-suite.sh: stand-in for $ref" "$dir.tar"
    if ((${#args[@]})); then
        umoci config --image "$WORK/oci:$tag" "${args[@]}"
    fi
    skopeo copy -q --dest-tls-verify=false "oci:$WORK/oci:$tag" "docker://$REG/$ref"
}

# --- the local package repository -----------------------------------------
# What the suite installs with apt that a stand-in can hold (emacs-nox,
# openssh-server and Open MPI are left out: large, and their tests need more).
APT_PACKAGES=(file make install-info)
APT_CACHE=$BERTH_TEST_CACHE_DIR/pyxis-apt
APT_PORT=$((15004 + 100 * slot))
APT_URL=http://$BERTH_TEST_BRIDGE_IP:$APT_PORT
serve_apt_repo() {
    if [[ ! -f $APT_CACHE/Packages ]]; then
        log "fetching ${APT_PACKAGES[*]} and their dependencies (once) into $APT_CACHE"
        local root=$BERTH_TEST_CACHE_DIR/debootstrap deps
        rm -rf "$APT_CACHE.tmp"
        mkdir -p "$APT_CACHE.tmp"
        # The packages and what they need beyond the base image's (a minbase root).
        deps=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances "${APT_PACKAGES[@]}" | grep -v '^ \|<' | sort -u)
        local base
        base=$(ls -d "$root"/*-minbase-*/rootfs 2>/dev/null | head -1)
        [[ -n $base ]] || { echo "no debootstrap root under $root: tests/dev.sh $slot up makes it" >&2; exit 1; }
        local want=()
        for p in $deps; do
            dpkg-query --admindir="$base/var/lib/dpkg" -W -f '${Status}' "$p" 2>/dev/null |
                grep -q 'install ok installed' || want+=("$p")
        done
        (cd "$APT_CACHE.tmp" && apt-get download -q "${want[@]}" >/dev/null 2>&1) ||
            { echo "apt-get download ${want[*]} failed (the host needs its Debian mirror once)" >&2; exit 1; }
        (cd "$APT_CACHE.tmp" && dpkg-scanpackages -m . /dev/null 2>/dev/null >Packages)
        rm -rf "$APT_CACHE"
        mv "$APT_CACHE.tmp" "$APT_CACHE"
    fi
    python3 -m http.server --bind "$BERTH_TEST_BRIDGE_IP" --directory "$APT_CACHE" "$APT_PORT" \
        >"$WORK/apt-server.log" 2>&1 &
    apt_server=$!
    local i
    for i in $(seq 50); do
        curl -fsS -o /dev/null "$APT_URL/Packages" 2>/dev/null && break
        sleep 0.1
    done
    log "package repository $APT_URL: $(ls "$APT_CACHE"/*.deb | wc -l) packages"
}

build_standins() {
    [[ -f $LAYOUT/index.json ]] || { echo "no image layout at $LAYOUT: tests/dev.sh $slot up builds it" >&2; exit 1; }
    skopeo copy -q "oci:$LAYOUT:debian-base" "oci:$WORK/oci:base"
    umoci unpack --image "$WORK/oci:base" "$WORK/peek" >/dev/null 2>&1 || true
    cat "$WORK/peek/rootfs/etc/debian_version" >"$WORK/debian_version" 2>/dev/null || echo 12 >"$WORK/debian_version"
    rm -rf "$WORK/peek"
    local t
    for t in 14.04 16.04 18.04 20.04 22.04 24.04; do
        standin "library/ubuntu:$t" "Ubuntu $t LTS"
    done
    standin library/ubuntu:12.04 "Ubuntu precise (12.04.5 LTS)"
    standin library/ubuntu:26.04 "Ubuntu 26.04 (Resolute Raccoon)"
    skopeo copy -q --src-tls-verify=false --dest-tls-verify=false \
        "docker://$REG/library/ubuntu:18.04" "docker://$REG/library/ubuntu:latest"
    standin library/centos:5 "CentOS release 5.11 (Final)"
    standin library/centos:6 "CentOS release 6.10 (Final)"
    standin library/centos:7 "CentOS Linux release 7.9.2009 (Core)"
    standin library/centos:8 "CentOS Linux release 8.4.2105"
    # nvidia/cuda: the variables the suite checks, and for the runtime
    # images an entrypoint that prints the banner, as the originals do.
    local cuda_ep='/opt/nvidia/nvidia_entrypoint.sh'
    local cuda_script='#!/bin/sh
printf "\n==========\n== CUDA ==\n==========\n\n"
exec "$@"'
    local v os
    for v in 10.2-base:18.04 11.8.0-base-ubuntu20.04:20.04 11.8.0-base-ubuntu22.04:22.04 \
        12.5.1-runtime-ubuntu24.04:24.04 12.9.1-base-ubuntu24.04:24.04 \
        12.9.1-runtime-ubuntu24.04:24.04; do
        os=${v##*:} v=${v%:*}
        local extra=()
        [[ $v == *runtime* ]] && extra=(--file "$cuda_ep" "$cuda_script" --entrypoint "$cuda_ep")
        standin "nvidia/cuda:$v" "Ubuntu $os LTS" "CUDA_VERSION=${v%%-*}" \
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64" \
            NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility "${extra[@]}"
    done
    standin nvidia/pytorch:20.02-py3 "Ubuntu 18.04 LTS" PYTORCH_VERSION=1.5.0a0+3bbb36e --workdir /workspace
    standin nvidia/pytorch:22.04-py3 "Ubuntu 20.04 LTS" PYTORCH_VERSION=1.12.0a0+bd13bc6 --workdir /workspace
    standin pytorch/pytorch:1.8.1-cuda11.1-cudnn8-runtime "Ubuntu 18.04 LTS" PYTORCH_VERSION=1.8.1 --workdir /workspace
    # docker:dind-rootless: its entrypoint sets DOCKER_HOST (2376 with TLS).
    local dind='#!/bin/sh
if [ -z "$DOCKER_HOST" ]; then
    if [ -n "$DOCKER_TLS_VERIFY" ]; then export DOCKER_HOST=tcp://docker:2376; else export DOCKER_HOST=tcp://docker:2375; fi
fi
exec "$@"'
    standin library/docker:26.1.0-dind-rootless "Alpine Linux v3.19" \
        --file /usr/local/bin/dockerd-entrypoint.sh "$dind" \
        --entrypoint /usr/local/bin/dockerd-entrypoint.sh
    # Programs only the image has, for Slurm's PATH resolution in the image.
    standin library/redis:5.0.8 "Debian GNU/Linux 10 (buster)" \
        --file /usr/local/bin/redis-server '#!/bin/sh
echo "Redis server v=5.0.8 (berth stand-in)"'
    standin library/rabbitmq:3.8.3 "Ubuntu 18.04 LTS" \
        --file /usr/local/bin/rabbitmqctl '#!/bin/sh
echo "3.8.3 (berth stand-in)"'
    log "stand-in images pushed to $REG"
}

# --- the enroot stand-in ---------------------------------------------------
write_enroot_shim() {
    mkdir -p "$BASE/bin"
    cat >"$BASE/bin/enroot" <<EOF
#!/bin/bash
# enroot stand-in for pyxis's test suite (written by berth's tests/pyxis-suite.sh):
# maps the enroot verbs the suite calls onto berth. Named containers are
# enroot's pyxis_NAME (scope global) or pyxis_JOB_NAME (scope job).
BERTH=$PREFIX/bin/berth
REG=$REG
EOF
    cat >>"$BASE/bin/enroot" <<'EOF'
# Named containers are listed and removed as any user does it: a step on
# this node with --container-list / --container-remove (root does the work
# in slurmstepd, for the uid Slurm authenticated).
on_this_node() {
    srun --overlap -N1 -n1 -w "${SLURMD_NODENAME:?enroot stand-in: not in a Slurm step}" "$@" true 2>&1
}
list() {
    # Lines: "berth: NODE: NAME global ..." or "berth: NODE: NAME job JOB ...".
    on_this_node --container-list |
        awk '$1 == "berth:" && $4 == "global" { print "pyxis_" $3 }
             $1 == "berth:" && $4 == "job" { print "pyxis_" $5 "_" $3 }' | sort -u
}
case $1 in
list) list ;;
remove)
    shift
    [[ $1 == -f ]] && shift
    status=0
    for name in "$@"; do
        name=${name#pyxis_}
        if [[ $name =~ ^([0-9]+)_(.+)$ ]]; then
            [[ ${BASH_REMATCH[1]} == "${SLURM_JOB_ID:-}" ]] ||
                { echo "enroot stand-in: pyxis_$name is another job's (removed with it)" >&2; status=1; continue; }
            name=${BASH_REMATCH[2]}
        fi
        out=$(on_this_node --container-remove="$name") || { echo "$out" >&2; status=1; continue; }
        [[ $out == *"removed named container"* ]] || { echo "enroot stand-in: no container pyxis_$name" >&2; status=1; }
    done
    exit $status ;;
import)
    shift
    [[ $1 == -o ]] || { echo "enroot stand-in: import needs -o FILE" >&2; exit 1; }
    out=$2 image=${3#docker://}
    store=${TMPDIR:-/tmp}/pyxis-suite-store-$(id -u)
    line=$("$BERTH" pull --store "$store" --insecure-registry "$REG" --mirror "docker.io=$REG" \
        --mirror "nvcr.io=$REG" --progress none "$image") || exit 1
    cp -- "${line#* }" "$out" ;;
*)
    echo "enroot stand-in: 'enroot $1' is not mapped onto berth" >&2
    exit 1 ;;
esac
EOF
    chmod 0755 "$BASE/bin/enroot"
}

# Root removes the user's named containers on every node before each file,
# so that no file sees those of an earlier file or run (a file that fails
# half-way leaves its containers, and pyxis's teardown removes them on one
# node only).
remove_user_containers() {
    [[ $user == root ]] && return 0
    local uid s scope a b
    uid=$(id -u "$user")
    for s in "$BERTH_TEST_STATE_DIR"/nodes/*/berth-store; do
        [[ -d $s ]] || continue
        # Lines: USER global NAME ... or USER job JOBID NAME ...
        while read -r _ scope a b _; do
            if [[ $scope == job ]]; then
                "$PREFIX/bin/berth" containers rm --store "$s" --user "$uid" --job "$a" "$b" || true
            else
                "$PREFIX/bin/berth" containers rm --store "$s" --user "$uid" "$a" || true
            fi
        done < <("$PREFIX/bin/berth" containers list --store "$s" --user "$uid" 2>/dev/null |
            awk '$2 == "global" || $2 == "job"')
    done
}

# --- run -------------------------------------------------------------------
serve_apt_repo
build_standins
write_enroot_shim
line=$(cat "$WORK/berth.conf.saved")
printf '%s mirrors=docker.io=%s,nvcr.io=%s\n' "$line" "$REG" "$REG" >"$conf"

cd "$pyxis"
total_cases=0 total_pass=0 total_fail=0 total_skip=0
rows=()
for f in "${files[@]}"; do
    tap=$RESULTS/${f//\//_}.tap
    log "running $f as $user"
    remove_user_containers >&2
    start=$SECONDS
    runuser -u "$user" -- env PATH="$BASE/bin:$PATH" SLURM_CONF="$SLURM_CONF" \
        timeout -k 10 "$limit" salloc -Q -N1 --exclusive -p debug -t 30 \
        bats --tap "tests/$f" >"$tap" 2>&1 || true
    cases=$(grep -cE '^(not )?ok ' "$tap" || true)
    fail=$(grep -cE '^not ok ' "$tap" || true)
    skip=$(grep -cE '^ok .*# skip' "$tap" || true)
    planned=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$tap" | head -1)
    pass=$((cases - fail - skip))
    note=
    [[ -n $planned && $planned -ne $cases ]] && note=" (planned $planned: timed out?)"
    rows+=("$(printf '| %-22s | %5d | %4d | %4d | %4d | %4ds |%s' "$f" "$cases" "$pass" "$fail" "$skip" $((SECONDS - start)) "$note")")
    total_cases=$((total_cases + cases)) total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail)) total_skip=$((total_skip + skip))
done

printf '\npyxis test suite against berth (user %s)\n\n' "$user"
printf '| %-22s | %5s | %4s | %4s | %4s | %5s |\n' file cases pass fail skip time
printf '|%s|\n' "------------------------|-------|------|------|------|-------"
printf '%s\n' "${rows[@]}"
printf '| %-22s | %5d | %4d | %4d | %4d |       |\n' total "$total_cases" "$total_pass" "$total_fail" "$total_skip"
printf '\nfailures:\n'
for f in "${files[@]}"; do
    grep -E '^not ok ' "$RESULTS/${f//\//_}.tap" | sed "s|^|  $f: |" || true
done
printf '\nTAP output: %s\n' "$RESULTS"
