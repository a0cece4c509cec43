#!/usr/bin/env bash
# Usage: tests/harness/engines.sh up|down
#
# Local container engines for the dockerd:// and podman:// image sources:
#   - a Docker daemon of its own (Debian's docker.io): data root
#     /var/lib/$NAME/dockerd, socket /run/$NAME/docker.sock owned by group
#     berthgrp (the way sites give users a daemon: berthuser may use it,
#     berthuser2..4 may not), --bridge=none --iptables=false (no network);
#     it holds berthtest/busybox:latest, loaded from the anonymous registry;
#   - podman storage for root and for berthuser under /var/lib/$NAME/podman,
#     with settings of their own (podman_conf below; the tests pass
#     $PODMAN_DIR/WHO/podman.env in the job's environment), each holding
#     berthtest/busybox:latest (podman names it docker.io/berthtest/busybox).
# Needs registry.sh up and images.sh push (busybox:latest). `down` stops the
# daemon and removes both stores.
set -euo pipefail
# shellcheck disable=SC2034  # read by log() in lib.sh
LOG_TAG=engines
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DOCKER_DIR=$STATE_DIR/dockerd
DOCKER_SOCK=$RUN_DIR/docker.sock
DOCKER_PID=$PID_DIR/dockerd.pid
DOCKER_LOG=$STATE_DIR/dockerd.log
PODMAN_DIR=$STATE_DIR/podman
IMAGE=berthtest/busybox:latest
TEST_USER=berthuser

# podman_conf WHO: writes the podman settings of WHO (root or berthuser)
# below $PODMAN_DIR/WHO: storage.conf (graph and run roots), containers.conf
# (podman's tmp folder: where rootless podman records its pause process),
# config/, data/, cache/ and runtime/ for the XDG_* folders (nothing in
# the user's home or /tmp); podman.env names
# them, as a job passes them (CONTAINERS_* and XDG_* reach the client).
podman_conf() {
    local who=$1 dir=$PODMAN_DIR/$1
    mkdir -p "$dir/config" "$dir/data" "$dir/cache" "$dir/tmp" "$dir/runtime"
    chmod 0700 "$dir/runtime"
    cat >"$dir/storage.conf" <<CONF
[storage]
driver = "vfs"
graphroot = "$dir/graph"
runroot = "$dir/run"
CONF
    cat >"$dir/containers.conf" <<CONF
[engine]
tmp_dir = "$dir/tmp"
CONF
    cat >"$dir/podman.env" <<CONF
CONTAINERS_STORAGE_CONF=$dir/storage.conf
CONTAINERS_CONF=$dir/containers.conf
XDG_CONFIG_HOME=$dir/config
XDG_DATA_HOME=$dir/data
XDG_CACHE_HOME=$dir/cache
XDG_RUNTIME_DIR=$dir/runtime
CONF
    [[ $who == root ]] || chown -R "$who:" "$dir"
}

# podman_as WHO ARGS...: podman as WHO with WHO's settings.
podman_as() {
    local who=$1
    shift
    local -a env
    mapfile -t env <"$PODMAN_DIR/$who/podman.env"
    if [[ $who == root ]]; then
        env "${env[@]}" podman "$@"
    else
        (cd / && runuser -u "$who" -- env "${env[@]}" podman "$@")
    fi
}

# stop_pause_processes: rootless podman leaves a pause process per user
# namespace; each records its pid in its tmp folder.
stop_pause_processes() {
    local file
    for file in "$PODMAN_DIR"/*/tmp/pause.pid; do
        [[ -f $file ]] && stop_pidfiles "podman.*" "$file"
    done
    return 0
}

up() {
    command -v dockerd >/dev/null || die "dockerd missing: run tests/harness/install-deps.sh"
    command -v podman >/dev/null || die "podman missing: run tests/harness/install-deps.sh"
    mkdir -p "$DOCKER_DIR" "$PID_DIR" "$RUN_DIR"
    local archive=$STATE_DIR/engines-busybox.tar
    rm -f "$archive"
    skopeo copy -q --src-tls-verify=false "docker://$REGISTRY_ADDR/busybox:latest" \
        "docker-archive:$archive:$IMAGE"
    chmod 0644 "$archive"
    if ! pid_alive "$DOCKER_PID" dockerd; then
        log "starting dockerd on $DOCKER_SOCK"
        # Its own (empty) config: no site's /etc/docker/daemon.json.
        echo '{}' >"$RUN_DIR/dockerd.json"
        setsid /usr/sbin/dockerd --data-root "$DOCKER_DIR/data" --exec-root "$RUN_DIR/dockerd" \
            --pidfile "$DOCKER_PID" -H "unix://$DOCKER_SOCK" --group berthgrp \
            --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
            --storage-driver=vfs --config-file "$RUN_DIR/dockerd.json" \
            >"$DOCKER_LOG" 2>&1 </dev/null &
        local i
        for ((i = 0; i < 60; i++)); do
            /usr/bin/docker -H "unix://$DOCKER_SOCK" version >/dev/null 2>&1 && break
            sleep 1
        done
        /usr/bin/docker -H "unix://$DOCKER_SOCK" version >/dev/null 2>&1 ||
            die "dockerd did not answer on $DOCKER_SOCK (see $DOCKER_LOG)"
    fi
    /usr/bin/docker -H "unix://$DOCKER_SOCK" load -q -i "$archive" >/dev/null
    log "dockerd holds $IMAGE"
    podman_conf root
    podman_conf "$TEST_USER"
    podman_as root load -q -i "$archive" >/dev/null
    podman_as "$TEST_USER" load -q -i "$archive" >/dev/null
    log "podman storage of root and $TEST_USER holds $IMAGE"
    rm -f "$archive"
}

down() {
    stop_pidfiles dockerd "$DOCKER_PID"
    stop_pause_processes
    rm -rf --one-file-system "$DOCKER_DIR" "$PODMAN_DIR" "$RUN_DIR/dockerd" "$DOCKER_SOCK" \
        "$RUN_DIR/dockerd.json" ||
        warn "could not remove all of $DOCKER_DIR $PODMAN_DIR"
}

case ${1:-} in
up) up ;;
down) down ;;
*) usage; exit 2 ;;
esac
