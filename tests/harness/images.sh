#!/usr/bin/env bash
# Usage: tests/harness/images.sh build [busybox|debian|openmpi|mpich ...]
#        tests/harness/images.sh push  [busybox|debian|openmpi|mpich ...]
#        tests/harness/images.sh list
#
# Builds berth's test images without Docker (umoci: new, unpack, edit the
# rootfs, repack; one repack per layer) into one OCI layout,
#   /var/lib/$NAME/cache/images/oci   tags: busybox-latest debian-base
#                                           debian-bookworm openmpi-bookworm
#                                           mpich-bookworm
# and pushes them with skopeo to the registries of tests/harness/registry.sh:
#   http://10.77.0.1:15000  busybox:latest (OCI), busybox:v2s2 (Docker schema 2),
#                           busybox:index (OCI index -> busybox:latest),
#                           debian:bookworm, openmpi:bookworm,
#                           mpich:bookworm (MPICH, mpi_hello and mpi_bw)
#   http://10.77.0.1:15001  public/busybox:latest, private/busybox:latest
#
# An image is rebuilt only when it is missing or its inputs changed (this
# script, tests/images/mpi_hello.c, package versions, the Debian mirror).
# debootstrap output and downloaded .debs are cached as well
# (/var/lib/$NAME/cache/{debootstrap,apt-archives}; BERTH_TEST_CACHE_DIR
# moves the whole cache, e.g. to share it between instances). Needs root.
# BERTH_DEBIAN_MIRROR overrides the mirror read from /etc/apt/sources*.
set -Eeuo pipefail
# shellcheck disable=SC2034  # read by log() in lib.sh
LOG_TAG=images
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SUITE=bookworm
IMG_DIR=$CACHE_DIR/images
LAYOUT=$IMG_DIR/oci
STAMP_DIR=$IMG_DIR/stamps
BUNDLE_DIR=$IMG_DIR/bundles
DEBOOTSTRAP_CACHE=$CACHE_DIR/debootstrap
APT_ARCHIVES=$CACHE_DIR/apt-archives
MPI_SRC=$REPO_DIR/tests/images/mpi_hello.c
MPI_BW_SRC=$REPO_DIR/tests/images/mpi_bw.c
SCRIPT_SUM=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ALL_IMAGES=(busybox debian openmpi mpich)
DEBOOTSTRAP_ROOT=""
declare -A ENSURED=()

trap 'warn "failed (line $LINENO): $BASH_COMMAND"' ERR

# ---------------------------------------------------------------- helpers

# timed LABEL CMD...: run CMD and report how long it took (a failure of
# CMD ends the script through set -e).
timed() {
    local label=$1 t0=$EPOCHREALTIME
    shift
    "$@"
    log "$(printf '%-34s %6.1fs' "$label" "$(bc_sub "$EPOCHREALTIME" "$t0")")"
}

# logged LOGFILE CMD...: run CMD with its output in LOGFILE; on failure show
# the end of the log and stop.
logged() {
    local logfile=$1
    shift
    if ! "$@" >"$logfile" 2>&1; then
        tail -n 20 "$logfile" >&2
        die "$1 failed; full log in $logfile"
    fi
}
bc_sub() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", a - b}'; }

# The Debian mirror this machine's apt uses for $SUITE (one-line or deb822
# sources), unless BERTH_DEBIAN_MIRROR says otherwise.
debian_mirror() {
    if [[ -n ${BERTH_DEBIAN_MIRROR:-} ]]; then
        printf '%s\n' "$BERTH_DEBIAN_MIRROR"
        return
    fi
    local f url
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $f ]] || continue
        # deb [options] URL SUITE COMPONENTS...
        url=$(awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit }
            }' "$f")
        if [[ -n $url ]]; then
            printf '%s\n' "$url"
            return
        fi
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        # Stanzas separated by blank lines; want Types: deb, Suites: $SUITE.
        url=$(awk -v suite="$SUITE" '
            BEGIN { RS = "" }
            {
                n = split($0, lines, "\n"); uri = ""; deb = 0; has = 0
                for (j = 1; j <= n; j++) {
                    m = split(lines[j], w, /[ \t]+/)
                    if (w[1] == "Types:")  for (k = 2; k <= m; k++) if (w[k] == "deb") deb = 1
                    if (w[1] == "URIs:")   uri = w[2]
                    if (w[1] == "Suites:") for (k = 2; k <= m; k++) if (w[k] == suite) has = 1
                }
                if (deb && has && uri != "") { print uri; exit }
            }' "$f")
        if [[ -n $url ]]; then
            printf '%s\n' "$url"
            return
        fi
    done
    printf '%s\n' http://deb.debian.org/debian
}

pkg_version() { dpkg-query -W -f='${Version}' "$1"; }

# inputs_hash IMAGE: hash of everything that goes into IMAGE.
inputs_hash() {
    {
        echo "script $SCRIPT_SUM"
        case $1 in
            busybox) echo "busybox-static $(pkg_version busybox-static)" ;;
            debian-base | debian) echo "debootstrap $(debootstrap_key)" ;;
            openmpi)
                echo "debootstrap $(debootstrap_key)"
                echo "mpi_hello $(sha256sum "$MPI_SRC" | cut -d' ' -f1)"
                echo "host libopenmpi-dev $(pkg_version libopenmpi-dev)"
                ;;
            mpich)
                echo "debootstrap $(debootstrap_key)"
                echo "mpi sources $(cat "$MPI_SRC" "$MPI_BW_SRC" | sha256sum | cut -d' ' -f1)"
                echo "host libmpich-dev $(pkg_version libmpich-dev)"
                ;;
        esac
    } | sha256sum | cut -c1-16
}

layout_tag() {
    case $1 in
        busybox) echo busybox-latest ;;
        debian-base) echo debian-base ;;
        debian) echo debian-bookworm ;;
        openmpi) echo openmpi-bookworm ;;
        mpich) echo mpich-bookworm ;;
        *) die "unknown image '$1' (known: ${ALL_IMAGES[*]})" ;;
    esac
}

# (grep reads a variable: with pipefail, `umoci ls | grep -q` can fail when
# grep exits before umoci has written everything)
has_tag() {
    local tags
    [[ -d $LAYOUT ]] || return 1
    tags=$(umoci ls --layout "$LAYOUT")
    grep -qx "$1" <<<"$tags"
}

up_to_date() {
    local tag
    tag=$(layout_tag "$1")
    has_tag "$tag" && [[ $(cat "$STAMP_DIR/$1" 2>/dev/null) == "$(inputs_hash "$1")" ]]
}

mark_built() { inputs_hash "$1" >"$STAMP_DIR/$1"; }

# new_bundle TAG FROM BUNDLE: start TAG from image tag FROM ("" = empty
# image) and unpack it into BUNDLE for editing.
new_bundle() {
    local tag=$1 from=$2 bundle=$3
    rm -rf "$bundle"
    if has_tag "$tag"; then
        umoci rm --image "$LAYOUT:$tag"
    fi
    if [[ -z $from ]]; then
        umoci new --image "$LAYOUT:$tag"
        umoci unpack --image "$LAYOUT:$tag" "$bundle" >/dev/null
    else
        umoci unpack --image "$LAYOUT:$from" "$bundle" >/dev/null
    fi
}

# repack BUNDLE TAG COMMENT: one new layer from the bundle's changes.
repack() {
    umoci repack --image "$LAYOUT:$2" --history.created_by "berth images.sh: $3" "$1"
}

# top_layer TAG: path of the blob of TAG's last layer.
top_layer() {
    local manifest digest
    manifest=$(jq -r --arg t "$1" \
        '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t) | .digest' \
        "$LAYOUT/index.json")
    digest=$(jq -r '.layers[-1].digest' "$LAYOUT/blobs/sha256/${manifest#sha256:}")
    printf '%s\n' "$LAYOUT/blobs/sha256/${digest#sha256:}"
}

# image_summary TAG: layer count and sizes, for the log.
image_summary() {
    local manifest
    manifest=$(jq -r --arg t "$1" \
        '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t) | .digest' \
        "$LAYOUT/index.json")
    jq -r --arg t "$1" --arg m "$manifest" '
        "\($t): manifest \($m[0:19]) layers " +
        ([.layers[].size / 1048576 | . * 10 | floor / 10 | tostring + "MiB"] | join(" + "))' \
        "$LAYOUT/blobs/sha256/${manifest#sha256:}"
}

# ---------------------------------------------------------------- debootstrap

debootstrap_key() {
    printf '%s %s minbase amd64 v1' "$(debian_mirror)" "$SUITE" | sha256sum | cut -c1-12
}

# Sets DEBOOTSTRAP_ROOT to a cached `debootstrap --variant=minbase` root.
ensure_debootstrap() {
    local dir mirror
    dir=$DEBOOTSTRAP_CACHE/$SUITE-minbase-$(debootstrap_key)
    DEBOOTSTRAP_ROOT=$dir/rootfs
    if [[ -f $dir/done ]]; then
        log "debootstrap $SUITE: cached ($dir)"
        return
    fi
    mirror=$(debian_mirror)
    log "debootstrap --variant=minbase $SUITE from $mirror"
    rm -rf "$dir"
    mkdir -p "$dir"
    # Private mount namespace: debootstrap's /proc and /sys mounts in the
    # target cannot outlive it, even if it is interrupted.
    timed "debootstrap $SUITE" logged "$dir/debootstrap.log" \
        unshare --mount --propagation private -- \
        debootstrap --variant=minbase --arch=amd64 "$SUITE" "$dir/rootfs.tmp" "$mirror"
    mv "$dir/rootfs.tmp" "$dir/rootfs"
    touch "$dir/done"
}

# ---------------------------------------------------------------- images

build_busybox() {
    local tag=busybox-latest b=$BUNDLE_DIR/busybox r applet
    new_bundle "$tag" "" "$b"
    r=$b/rootfs
    install -d -m 0755 "$r"/{bin,sbin,usr/bin,usr/sbin,etc,root,proc,sys,dev,var,srv/work}
    install -d -m 1777 "$r/tmp"
    install -m 0755 /bin/busybox "$r/bin/busybox"
    while read -r applet; do
        [[ $applet == bin/busybox ]] && continue
        mkdir -p "$r/$(dirname "$applet")"
        ln -sfn /bin/busybox "$r/$applet"
    done < <(/bin/busybox --list-full)
    cat >"$r/etc/os-release" <<'EOF'
NAME="berth busybox"
ID=berth-busybox
PRETTY_NAME="berth busybox test image"
VERSION_ID=1
EOF
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
    printf 'root:x:0:\n' >"$r/etc/group"
    repack "$b" "$tag" "static busybox, applet links, /etc files"
    umoci config --image "$LAYOUT:$tag" \
        --config.env "PATH=$IMAGE_PATH" \
        --config.env BERTH_TEST_ENV=from-image \
        --config.workingdir /srv/work \
        --config.cmd /bin/sh \
        --history.created_by "berth images.sh: config"
    rm -rf "$b"
}

# Layer 1 of debian:bookworm and openmpi:bookworm (shared blob).
build_debian_base() {
    local tag=debian-base b=$BUNDLE_DIR/debian-base r
    ensure_debootstrap
    new_bundle "$tag" "" "$b"
    r=$b/rootfs
    timed "copy debootstrap root" cp -a "$DEBOOTSTRAP_ROOT/." "$r/"
    # debootstrap leaves the .debs and package lists behind (80 MB) and
    # copies the build machine's resolver and name: drop them, keeping
    # /etc/resolv.conf as an empty file (a mount point).
    find "$r/var/cache/apt/archives" -name '*.deb' -delete
    rm -f "$r"/var/cache/apt/*.bin
    rm -rf "$r"/var/lib/apt/lists/*
    mkdir -p "$r/var/lib/apt/lists/partial"
    : >"$r/etc/resolv.conf"
    printf 'berth-debian\n' >"$r/etc/hostname"
    # Files later layers remove (whiteouts) or replace (opaque directories).
    printf 'created in layer 1, deleted in layer 2\n' >"$r/etc/berth-whiteout-file"
    mkdir -p "$r/opt/berth-whiteout-dir/sub"
    printf 'layer 1\n' >"$r/opt/berth-whiteout-dir/a"
    printf 'layer 1\n' >"$r/opt/berth-whiteout-dir/sub/b"
    mkdir -p "$r/opt/berth-opaque" "$r/opt/berth-opaque-explicit"
    printf 'layer 1, gone in layer 2\n' >"$r/opt/berth-opaque/old-1"
    printf 'layer 1, gone in layer 2\n' >"$r/opt/berth-opaque/old-2"
    printf 'layer 1, hidden by the opaque marker of layer 3\n' >"$r/opt/berth-opaque-explicit/old-1"
    timed "repack debian layer 1" repack "$b" "$tag" "debootstrap --variant=minbase $SUITE"
    umoci config --image "$LAYOUT:$tag" \
        --config.env "PATH=$IMAGE_PATH" \
        --config.cmd /bin/bash \
        --history.created_by "berth images.sh: config"
    rm -rf "$b"
}

build_debian() {
    local tag=debian-bookworm b=$BUNDLE_DIR/debian r layer3
    new_bundle "$tag" debian-base "$b"
    r=$b/rootfs
    rm "$r/etc/berth-whiteout-file"
    rm -r "$r/opt/berth-whiteout-dir"
    # Replace the folder and its contents: the pattern that would call for an
    # opaque whiteout.
    rm -r "$r/opt/berth-opaque"
    mkdir "$r/opt/berth-opaque"
    printf 'layer 2\n' >"$r/opt/berth-opaque/new-1"
    printf 'created in layer 2\n' >"$r/etc/berth-layer2"
    timed "repack debian layer 2" repack "$b" "$tag" "whiteouts: delete and replace"
    log "layer 2 whiteout entries:"
    tar -tzf "$(top_layer "$tag")" | grep -F '.wh.' | sed 's/^/    /' || log "    (none)"

    # umoci writes per-file whiteouts only (no .wh..wh..opq); add a layer 3
    # tar by hand with an explicit opaque marker so both forms are tested.
    layer3=$BUNDLE_DIR/layer3
    rm -rf "$layer3"
    mkdir -p "$layer3/opt/berth-opaque-explicit"
    : >"$layer3/opt/berth-opaque-explicit/.wh..wh..opq"
    printf 'layer 3\n' >"$layer3/opt/berth-opaque-explicit/new-1"
    tar -C "$layer3" --numeric-owner --owner=0 --group=0 --sort=name \
        -cf "$layer3.tar" opt
    umoci raw add-layer --image "$LAYOUT:$tag" \
        --history.created_by "berth images.sh: explicit opaque whiteout" "$layer3.tar"
    log "layer 3 entries:"
    tar -tzf "$(top_layer "$tag")" | sed 's/^/    /'
    rm -rf "$b" "$layer3" "$layer3.tar"
}

build_openmpi() {
    build_mpi openmpi openmpi-bin mpicc.openmpi
}

# MPICH (the MPICH ABI family) for host MPI injection and PMI2 tests, with
# mpi_hello and the bandwidth benchmark mpi_bw built on the host.
build_mpich() {
    build_mpi mpich "mpich libmpich12" mpicc.mpich
}

# build_mpi NAME PACKAGES MPICC: debian-base plus PACKAGES, with the MPI
# test programs compiled by the host's MPICC.
build_mpi() {
    local name=$1 packages=$2 mpicc=$3
    local tag=$name-bookworm b=$BUNDLE_DIR/$name r
    new_bundle "$tag" debian-base "$b"
    r=$b/rootfs
    mkdir -p "$APT_ARCHIVES/partial"
    # apt inside the image's root, in a private mount namespace so that the
    # /proc, /dev, resolver and .deb cache mounts vanish with it.
    # shellcheck disable=SC2016  # $1.. belong to the inner bash
    timed "apt-get install $packages" logged "$IMG_DIR/$name-apt.log" \
        unshare --mount --propagation private -- /bin/bash -euc '
        r=$1 archives=$2 packages=$3
        mount -t proc proc "$r/proc"
        mount --bind /dev "$r/dev"
        mount --bind /etc/resolv.conf "$r/etc/resolv.conf"
        mount --bind "$archives" "$r/var/cache/apt/archives"
        printf "#!/bin/sh\nexit 101\n" >"$r/usr/sbin/policy-rc.d"
        chmod 0755 "$r/usr/sbin/policy-rc.d"
        chroot "$r" apt-get -q -o Acquire::Languages=none update
        chroot "$r" env DEBIAN_FRONTEND=noninteractive \
            apt-get -q -y install --no-install-recommends $packages
        rm -f "$r/usr/sbin/policy-rc.d"
    ' bash "$r" "$APT_ARCHIVES" "$packages"
    rm -rf "$r"/var/lib/apt/lists/*
    rm -f "$r"/var/cache/apt/*.bin
    mkdir -p "$r/var/lib/apt/lists/partial"
    timed "$mpicc mpi_hello" "$mpicc" -O2 -o "$r/usr/local/bin/mpi_hello" "$MPI_SRC"
    if [[ $name == mpich ]]; then
        timed "$mpicc mpi_bw" "$mpicc" -O2 -o "$r/usr/local/bin/mpi_bw" "$MPI_BW_SRC"
    fi
    log "$name rootfs: $(du -sh --apparent-size "$r" | cut -f1)"
    timed "repack $name layer 2" repack "$b" "$tag" "$packages, MPI test programs"
    rm -rf "$b"
}

# ensure IMAGE: build IMAGE (and what it needs) unless cached.
ensure() {
    local image=$1 tag
    tag=$(layout_tag "$image")
    [[ -z ${ENSURED[$image]:-} ]] || return 0
    ENSURED[$image]=1
    case $image in debian | openmpi | mpich) ensure debian-base ;; esac
    if up_to_date "$image"; then
        log "$tag: cached"
        return
    fi
    log "$tag: building"
    timed "build $tag" "build_${image//-/_}"
    mark_built "$image"
    log "$(image_summary "$tag")"
}

cmd_build() {
    need_root
    local t0=$EPOCHREALTIME image images=("$@")
    ((${#images[@]})) || images=("${ALL_IMAGES[@]}")
    mkdir -p "$IMG_DIR" "$STAMP_DIR" "$BUNDLE_DIR"
    exec 9>"$IMG_DIR/.lock"
    flock 9
    if [[ ! -f $LAYOUT/index.json ]]; then
        rm -rf "$LAYOUT" "${STAMP_DIR:?}"/*
        umoci init --layout "$LAYOUT"
    fi
    for image in "${images[@]}"; do
        ensure "$image"
    done
    umoci gc --layout "$LAYOUT"
    log "build done in $(bc_sub "$EPOCHREALTIME" "$t0")s; layout $LAYOUT ($(du -sh "$LAYOUT" | cut -f1))"
}

# ---------------------------------------------------------------- push

skopeo_push() {
    local src=$1 dest=$2
    shift 2
    skopeo copy --quiet --dest-tls-verify=false "$@" "oci:$LAYOUT:$src" "docker://$dest"
    log "pushed $dest"
}

# An OCI index with one linux/amd64 entry pointing at busybox:latest.
push_busybox_index() {
    local headers size digest index
    headers=$(curl -sfI -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
        "http://$REGISTRY_ADDR/v2/busybox/manifests/latest" | tr -d '\r')
    size=$(awk -F': ' 'tolower($1) == "content-length" {print $2}' <<<"$headers")
    digest=$(awk -F': ' 'tolower($1) == "docker-content-digest" {print $2}' <<<"$headers")
    [[ -n $size && -n $digest ]] || die "cannot read busybox:latest's digest from $REGISTRY_ADDR"
    index=$(jq -cn --arg d "$digest" --argjson s "$size" '{
        schemaVersion: 2,
        mediaType: "application/vnd.oci.image.index.v1+json",
        manifests: [{
            mediaType: "application/vnd.oci.image.manifest.v1+json",
            digest: $d, size: $s,
            platform: {architecture: "amd64", os: "linux"}
        }]}')
    curl -sf -X PUT -H 'Content-Type: application/vnd.oci.image.index.v1+json' \
        --data-binary "$index" "http://$REGISTRY_ADDR/v2/busybox/manifests/index" >/dev/null
    log "pushed $REGISTRY_ADDR/busybox:index (OCI index -> $digest)"
}

cmd_push() {
    local t0=$EPOCHREALTIME image tag images=("$@")
    local creds=berth:berthpass
    ((${#images[@]})) || images=("${ALL_IMAGES[@]}")
    curl -sf -o /dev/null "http://$REGISTRY_ADDR/v2/" ||
        die "no registry on $REGISTRY_ADDR: run tests/harness/registry.sh up"
    cmd_build "$@"
    for image in "${images[@]}"; do
        tag=$(layout_tag "$image")
        case $image in
            busybox)
                skopeo_push "$tag" "$REGISTRY_ADDR/busybox:latest"
                skopeo_push "$tag" "$REGISTRY_ADDR/busybox:v2s2" --format v2s2
                push_busybox_index
                skopeo_push "$tag" "$TOKEN_REGISTRY_ADDR/public/busybox:latest" --dest-creds "$creds"
                skopeo_push "$tag" "$TOKEN_REGISTRY_ADDR/private/busybox:latest" --dest-creds "$creds"
                ;;
            debian) skopeo_push "$tag" "$REGISTRY_ADDR/debian:bookworm" ;;
            openmpi) skopeo_push "$tag" "$REGISTRY_ADDR/openmpi:bookworm" ;;
            mpich) skopeo_push "$tag" "$REGISTRY_ADDR/mpich:bookworm" ;;
        esac
    done
    log "push done in $(bc_sub "$EPOCHREALTIME" "$t0")s"
}

cmd_list() {
    local tag
    [[ -f $LAYOUT/index.json ]] || die "no images built yet ($LAYOUT)"
    for tag in $(umoci ls --layout "$LAYOUT"); do
        image_summary "$tag"
    done
}

verb=${1:-}
shift || true
case $verb in
    build) cmd_build "$@" ;;
    push) cmd_push "$@" ;;
    list) cmd_list ;;
    *)
        usage
        exit 2
        ;;
esac
