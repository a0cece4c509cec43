#!/usr/bin/env bash
# Usage: tests/harness/entrypoint-images.sh
#
# Pushes two config-only variants of busybox:latest (see images.sh) to the
# anonymous registry, for the --container-entrypoint tests:
#   busybox:entrypoint        ENTRYPOINT prints to stdout and stderr, exports
#                             BERTH_ENTRYPOINT_RAN=yes and
#                             BERTH_TEST_ENV=changed-by-entrypoint, unsets
#                             BERTH_REMOVE_ME, then runs its arguments
#                             (exec "$@")
#   busybox:entrypoint-fails  ENTRYPOINT prints an error and exits 3
#   busybox:entrypoint-env    ENTRYPOINT prints the BERTH_JOB_VAR it sees,
#                             then runs its arguments
#   busybox:entrypoint-daemon ENTRYPOINT prints its NoNewPrivs line, leaves
#                             a background job (sleep 4711) and a daemon
#                             (setsid sleep 4712, double fork) running,
#                             then runs its arguments
#   busybox:pytorch           busybox's own ENTRYPOINT, PYTORCH_VERSION=2.3.0
#                             added to its Env (a PyTorch image to berth, for
#                             the PyTorch variables of tests/suite/cluster_mpi.rs)
# Same layers as busybox:latest, only the image config differs: nothing is
# built, nothing cached, and images.sh's cache stays valid. Needs
# `images.sh push busybox` first. Idempotent; takes well under a second.
set -Eeuo pipefail
# shellcheck disable=SC2034  # read by log() in lib.sh
LOG_TAG=entrypoint-images
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REG=http://$REGISTRY_ADDR
MANIFEST_TYPE=application/vnd.oci.image.manifest.v1+json
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# push_variant TAG ENTRYPOINT_JSON: busybox:latest with another ENTRYPOINT.
push_variant() {
    push_config_variant "$1" "ENTRYPOINT $2" --argjson ep "$2" '.config.Entrypoint = $ep'
}

# push_config_variant TAG WHAT JQ_ARGS... FILTER: busybox:latest with its
# image config changed by the jq FILTER (WHAT is for the log).
push_config_variant() {
    local tag=$1 what=$2 manifest config_digest digest size location sep
    shift 2
    manifest=$(curl -sf -H "Accept: $MANIFEST_TYPE" "$REG/v2/busybox/manifests/latest") ||
        die "no busybox:latest on $REGISTRY_ADDR: run tests/harness/images.sh push busybox"
    config_digest=$(jq -r .config.digest <<<"$manifest")
    curl -sf "$REG/v2/busybox/blobs/$config_digest" |
        jq -c "$@" | tr -d '\n' >"$WORK/config"
    digest=sha256:$(sha256sum "$WORK/config" | cut -d' ' -f1)
    size=$(stat -c %s "$WORK/config")
    location=$(curl -sf -D - -o /dev/null -X POST "$REG/v2/busybox/blobs/uploads/" |
        awk -F': ' 'tolower($1) == "location" {print $2}' | tr -d '\r')
    [[ -n $location ]] || die "the registry gave no upload location"
    [[ $location == http* ]] || location=$REG$location
    sep='?'
    [[ $location == *\?* ]] && sep='&'
    curl -sf -o /dev/null -X PUT -H 'Content-Type: application/octet-stream' \
        --data-binary "@$WORK/config" "$location${sep}digest=$digest"
    jq -c --arg d "$digest" --argjson s "$size" '.config.digest = $d | .config.size = $s' \
        <<<"$manifest" | tr -d '\n' >"$WORK/manifest"
    curl -sf -o /dev/null -X PUT -H "Content-Type: $MANIFEST_TYPE" \
        --data-binary "@$WORK/manifest" "$REG/v2/busybox/manifests/$tag"
    log "pushed $REGISTRY_ADDR/busybox:$tag ($what)"
}

# shellcheck disable=SC2016  # $@ and $(id -u) are for the image's shell
push_variant entrypoint '["/bin/sh", "-c", "echo \"entrypoint says hello as uid $(id -u)\"; echo entrypoint writes to stderr >&2; export BERTH_ENTRYPOINT_RAN=yes BERTH_TEST_ENV=changed-by-entrypoint; unset BERTH_REMOVE_ME; exec \"$@\"", "berth-entrypoint"]'
push_variant entrypoint-fails '["/bin/sh", "-c", "echo entrypoint failing on purpose >&2; exit 3", "berth-entrypoint"]'
# shellcheck disable=SC2016
push_variant entrypoint-env '["/bin/sh", "-c", "echo \"entrypoint sees BERTH_JOB_VAR=${BERTH_JOB_VAR-unset}\"; exec \"$@\"", "berth-entrypoint"]'
push_variant entrypoint-daemon '["/bin/sh", "-c", "grep NoNewPrivs /proc/self/status; sleep 4711 & (setsid sleep 4712 </dev/null >/dev/null 2>&1 &); exec \"$@\"", "berth-entrypoint"]'
push_config_variant pytorch 'Env + PYTORCH_VERSION=2.3.0' '.config.Env = ((.config.Env // []) + ["PYTORCH_VERSION=2.3.0"])'
