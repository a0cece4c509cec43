#!/usr/bin/env bash
# Usage: BERTH_TEST_ENV=/run/NAME/env bench/registry.sh [RUNS] [DELAY_MS]   (as root)
#
# Start cost of containerized steps when the registry is far away, over TLS
# with token authentication, against bare srun, in one run, as the ordinary
# test user, RUNS (default 7) of each, interleaved (issue 17's realistic
# registry). Needs a running test cluster with its registries (tests/dev.sh
# SLOT up; BERTH_TEST_ENV names its env file).
#
# In front of the cluster's registries it starts bench/wan-relay.py: TLS
# relays that deliver every chunk DELAY_MS (default 25) later in each
# direction, so 2 x DELAY_MS per round trip, and the same relays at 0 ms (TLS
# only). The private image sits behind a token registry whose token realm is
# reached through a relay of the same delay, as Docker Hub's or nvcr.io's
# is. berth trusts the relays' CA through `ca_bundle=` on the plugstack line
# (restored at exit). Warm starts only: every image is in every node's store
# before timing, which is what every step after a job's first sees.
#
# Prints medians and the added milliseconds over bare srun for: a public
# image by tag and by digest, a private image by tag and by digest, at 0 and
# at 2 x DELAY_MS round trips; 64 tasks on a node; and a 20-step sbatch
# script with `--container-image` by tag (one resolution for the job) against
# the same script bare. Goals (issue 17) are printed beside each figure.
# For each image case also the registry connections one start opens (the
# relays log each): from this host (srun, at submission) and from the node.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${1:-7}
DELAY=${2:-25}
[[ $(id -u) -eq 0 ]] || { echo "bench/registry.sh must run as root" >&2; exit 1; }
[[ -n ${BERTH_TEST_ENV:-} && -r $BERTH_TEST_ENV ]] ||
    { echo "bench/registry.sh: set BERTH_TEST_ENV to a running cluster's env file (tests/dev.sh SLOT up)" >&2; exit 2; }
unset SLURM_CONF SLURM_JOB_ID SLURM_JOBID
source "$BERTH_TEST_ENV"
cd "$BERTH_TEST_WORKDIR"

IP=$BERTH_TEST_BRIDGE_IP
REG_PORT=${BERTH_TEST_REGISTRY##*:}
TOKEN_RUN_DIR=/run/$BERTH_TEST_NAME/registry
TOKEN_STORAGE=$BERTH_TEST_STATE_DIR/registry/token
TOKEN_SERVER=${BERTH_TEST_TOKEN_REALM#http://}
TOKEN_SERVER=${TOKEN_SERVER%%/*}
[[ -r $TOKEN_RUN_DIR/ca.pem ]] || { echo "bench/registry.sh: no token CA in $TOKEN_RUN_DIR: are the registries up?" >&2; exit 2; }
# Ports: the instance's registry port + 10 .. + 17.
P_PUB0=$((REG_PORT + 10)) P_PUBD=$((REG_PORT + 11))
P_TREG0=$((REG_PORT + 12)) P_TREGD=$((REG_PORT + 17))
P_PRIV0=$((REG_PORT + 13)) P_PRIVD=$((REG_PORT + 14))
P_REALM0=$((REG_PORT + 15)) P_REALMD=$((REG_PORT + 16))

WORK=/run/$BERTH_TEST_NAME/bench-wan
rm -rf "$WORK"
mkdir -p "$WORK"
chmod 0755 "$WORK"
PLUGSTACK=$BERTH_TEST_PLUGSTACK_DIR/berth.conf
[[ -f $PLUGSTACK ]] || PLUGSTACK=$(find "$BERTH_TEST_PLUGSTACK_DIR" -name '*.conf' | head -1)
cp "$PLUGSTACK" "$WORK/plugstack.orig"
pids=()
CREDS=$(mktemp -d /var/tmp/berth-bench-creds.XXXXXX)
cleanup() {
    cp "$WORK/plugstack.orig" "$PLUGSTACK"
    ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$WORK" "$CREDS" "${BENCH_STEP_ERR:-}" "${script:-}"
}
trap cleanup EXIT

# A CA and a server certificate for the bridge address.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout "$WORK/ca.key" -out "$WORK/ca.pem" \
    -subj "/CN=berth bench WAN CA" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$WORK/server.key" -out "$WORK/server.csr" \
    -subj "/CN=$IP" 2>/dev/null
printf 'basicConstraints=CA:FALSE\nsubjectAltName=IP:%s\nextendedKeyUsage=serverAuth\n' "$IP" >"$WORK/server.ext"
openssl x509 -req -days 2 -in "$WORK/server.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
    -CAcreateserial -extfile "$WORK/server.ext" -out "$WORK/server.pem" 2>/dev/null
chmod 0644 "$WORK/ca.pem"

# Two token registries on the token registry's storage, each with its realm
# behind a relay of its own delay.
token_registry() {
    local port=$1 realm_port=$2
    cat >"$WORK/token-$port.yml" <<EOF
version: 0.1
log: {level: error}
storage:
  filesystem: {rootdirectory: $TOKEN_STORAGE}
  maintenance: {uploadpurging: {enabled: false}}
http: {addr: "$IP:$port", secret: $(openssl rand -hex 16)}
auth:
  token:
    realm: https://$IP:$realm_port/token
    service: berth-test-registry
    issuer: berth-test-token-server
    rootcertbundle: $TOKEN_RUN_DIR/ca.pem
EOF
    setsid docker-registry serve "$WORK/token-$port.yml" </dev/null >>"$WORK/registry-$port.log" 2>&1 &
    pids+=($!)
}
token_registry "$P_TREG0" "$P_REALM0"
token_registry "$P_TREGD" "$P_REALMD"
setsid python3 "$REPO/bench/wan-relay.py" --cert "$WORK/server.pem" --key "$WORK/server.key" \
    --route "$IP:$P_PUB0=$BERTH_TEST_REGISTRY/0" --route "$IP:$P_PUBD=$BERTH_TEST_REGISTRY/$DELAY" \
    --route "$IP:$P_PRIV0=$IP:$P_TREG0/0" --route "$IP:$P_PRIVD=$IP:$P_TREGD/$DELAY" \
    --route "$IP:$P_REALM0=$TOKEN_SERVER/0" --route "$IP:$P_REALMD=$TOKEN_SERVER/$DELAY" \
    </dev/null >>"$WORK/relay.log" 2>&1 &
pids+=($!)
for port in "$P_PUB0" "$P_PUBD" "$P_PRIV0" "$P_PRIVD"; do
    for ((i = 0; i < 100; i++)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$WORK/ca.pem" --max-time 2 "https://$IP:$port/v2/" || true)
        [[ $code == 200 || $code == 401 ]] && break
        sleep 0.1
    done
    [[ $code == 200 || $code == 401 ]] || { echo "bench/registry.sh: relay on $port does not answer (log: $WORK/relay.log)" >&2; cat "$WORK/relay.log" >&2; exit 1; }
done

# The plugstack line, with the relays' CA trusted.
sed -i "s|\$| ca_bundle=$WORK/ca.pem|" "$PLUGSTACK"

USER_NAME=${BERTH_TEST_USER:-berthuser}
digest_of() {
    skopeo inspect --tls-verify=false --creds "$BERTH_TEST_TOKEN_USER:$BERTH_TEST_TOKEN_PASSWORD" \
        --format '{{.Digest}}' "docker://$1"
}
# The images: busybox with one variable more in its config for each case
# (public bench/near and bench/far, private bench/private-near and
# bench/private-far behind the token registry; debian for the batch job),
# so each has a digest of its own whose first pull (the warm-up below) goes
# through its relay's name. A stored image is handed out with no request
# only under a name it was downloaded from anonymously, and a private
# image's access is checked at its stored origins: the same bytes under two
# names would time the other name's registry.
for name in near far batch private-near private-far; do
    base=busybox:latest dest=docker://$BERTH_TEST_REGISTRY/bench/$name:latest creds=()
    [[ $name == batch ]] && base=debian:bookworm
    if [[ $name == private-* ]]; then
        dest=docker://$BERTH_TEST_TOKEN_REGISTRY/bench/$name:latest
        creds=(--dest-creds "$BERTH_TEST_TOKEN_USER:$BERTH_TEST_TOKEN_PASSWORD")
    fi
    rm -rf "$WORK/layout-$name"
    skopeo copy --quiet --src-tls-verify=false "docker://$BERTH_TEST_REGISTRY/$base" "oci:$WORK/layout-$name:img"
    umoci config --image "$WORK/layout-$name:img" --config.env "BERTH_BENCH_IMAGE=$name"
    skopeo copy --quiet --dest-tls-verify=false "${creds[@]}" "oci:$WORK/layout-$name:img" "$dest"
done
NEAR_DIGEST=$(digest_of "$BERTH_TEST_REGISTRY/bench/near:latest")
FAR_DIGEST=$(digest_of "$BERTH_TEST_REGISTRY/bench/far:latest")
PRIV_NEAR_DIGEST=$(digest_of "$BERTH_TEST_TOKEN_REGISTRY/bench/private-near:latest")
PRIV_FAR_DIGEST=$(digest_of "$BERTH_TEST_TOKEN_REGISTRY/bench/private-far:latest")
chown "$USER_NAME" "$CREDS"
chmod 0700 "$CREDS"
printf 'machine %s login %s password %s\n' "$IP" "$BERTH_TEST_TOKEN_USER" "$BERTH_TEST_TOKEN_PASSWORD" >"$CREDS/.credentials"
chown "$USER_NAME" "$CREDS/.credentials"
chmod 0600 "$CREDS/.credentials"
as_user() { runuser -u "$USER_NAME" -- env "ENROOT_CONFIG_PATH=$CREDS" "$@"; }

declare -A image
image[pub-tag-0]=$IP:$P_PUB0/bench/near:latest
image[pub-tag-d]=$IP:$P_PUBD/bench/far:latest
image[pub-dig-0]=$IP:$P_PUB0/bench/near@$NEAR_DIGEST
image[pub-dig-d]=$IP:$P_PUBD/bench/far@$FAR_DIGEST
image[priv-tag-0]=$IP:$P_PRIV0/bench/private-near:latest
image[priv-tag-d]=$IP:$P_PRIVD/bench/private-far:latest
image[priv-dig-0]=$IP:$P_PRIV0/bench/private-near@$PRIV_NEAR_DIGEST
image[priv-dig-d]=$IP:$P_PRIVD/bench/private-far@$PRIV_FAR_DIGEST
cases=(pub-tag-0 pub-tag-d pub-dig-0 pub-dig-d priv-tag-0 priv-tag-d priv-dig-0 priv-dig-d)
NODES_ALL=${BERTH_TEST_DEFAULT_NODES:-2}
for c in "${cases[@]}"; do   # warm every node's store, and check every case runs
    as_user srun -N"$NODES_ALL" "--container-image=${image[$c]}" true >/dev/null ||
        { echo "bench/registry.sh: the warm-up step of $c (${image[$c]}) failed" >&2; exit 1; }
done

source "$REPO/bench/lib.sh"
BENCH_STEP_ERR=$(mktemp /tmp/berth-bench-step.XXXXXX)
chmod 666 "$BENCH_STEP_ERR"
BATCH_OUT=$BERTH_TEST_WORKDIR/bench-registry-batch.out
BENCH_STEP_LOG=$BATCH_OUT
ms() { bench_ms "$@"; }

# A 20-step batch script: the job resolves its image once, at submission,
# and its steps inherit the digest. The batch script runs in the image
# (debian:bookworm, same glibc as this machine) with the host's Slurm client
# bound in, so its `srun`s can start the steps.
BATCH_IMAGE=$IP:$P_PUBD/bench/batch:latest
as_user srun -N"$NODES_ALL" "--container-image=$BATCH_IMAGE" true >/dev/null ||
    { echo "bench/registry.sh: the warm-up step of $BATCH_IMAGE failed" >&2; exit 1; }
SLURM_LIB=/usr/lib/x86_64-linux-gnu/slurm-wlm MUNGE_LIB=/usr/lib/x86_64-linux-gnu/libmunge.so.2
CONF_DIR=$(dirname "$SLURM_CONF")
PREFIX_DIR=$BERTH_TEST_STATE_DIR/prefix
BATCH_MOUNTS=/usr/bin/srun:/usr/bin/srun:ro,$SLURM_LIB:$SLURM_LIB:ro,$MUNGE_LIB:$MUNGE_LIB:ro,/run/munge:/run/munge,$CONF_DIR:$CONF_DIR:ro,$PREFIX_DIR:$PREFIX_DIR:ro,$WORK:$WORK:ro
script=$(mktemp /tmp/berth-bench-20.XXXXXX)
chmod 755 "$script"
# The script times its own steps: `sbatch --wait` polls the job's state
# seconds apart, so its wall time says more about the polling than the job.
printf '#!/bin/sh\ns=$(date +%%s%%N)\nfor i in $(seq 20); do srun -n1 true || exit 1; done\necho "steps_ms $(( ($(date +%%s%%N) - s) / 1000000 ))"\n' >"$script"
# batch_steps_ms SBATCH_ARG...: runs the script, prints its 20 steps' ms.
batch_steps_ms() {
    ms as_user sbatch --wait -N1 -o "$BATCH_OUT" "$@" "$script" >/dev/null || return 1
    awk '$1 == "steps_ms" {print $2}' "$BATCH_OUT"
}

# new_connects FROM: connections to the relays since line FROM of their log,
# as "SUBMIT NODES" (from this host, where srun runs, and from the nodes).
new_connects() {
    tail -n +"$(($1 + 1))" "$WORK/relay.log" |
        awk -v ip="$IP" '$1 == "connect" {if ($3 == ip) h++; else n++} END {print h + 0, n + 0}'
}
declare -A t conn_submit conn_nodes
for ((i = 0; i < RUNS; i++)); do
    t[bare]+="$(ms as_user srun -n1 true) "
    for c in "${cases[@]}"; do
        from=$(wc -l <"$WORK/relay.log")
        t[$c]+="$(ms as_user srun -n1 "--container-image=${image[$c]}" true) "
        read -r s n < <(new_connects "$from")
        conn_submit[$c]+="$s " conn_nodes[$c]+="$n "
    done
    t[bare64]+="$(ms as_user srun -N1 -n64 --overcommit true) "
    t[c64]+="$(ms as_user srun -N1 -n64 --overcommit "--container-image=${image[pub-tag-d]}" true) "
    t[batch-bare]+="$(batch_steps_ms) "
    from=$(wc -l <"$WORK/relay.log")
    t[batch-c]+="$(batch_steps_ms "--container-image=$BATCH_IMAGE" "--container-mounts=$BATCH_MOUNTS") "
    read -r s n < <(new_connects "$from")
    conn_submit[batch]+="$s " conn_nodes[batch]+="$n "
done
rm -f "$script" "$BENCH_STEP_ERR" "$BATCH_OUT"

med() { tr ' ' '\n' <<<"${t[$1]}" | grep . | median; }
bare=$(med bare)
rtt=$((2 * DELAY))
echo "registry: TLS relays (bench/wan-relay.py) at 0 and ${rtt} ms round trips; token auth for the private image; ${RUNS} runs each, interleaved, as $USER_NAME"
printf '%-44s median %6s ms  (runs: %s)\n' "bare srun -n1 true" "$bare" "${t[bare]}"
describe() {
    case $1 in
    pub-tag-*) echo "public image by tag" ;; pub-dig-*) echo "public image by digest" ;;
    priv-tag-*) echo "private image by tag" ;; priv-dig-*) echo "private image by digest" ;;
    esac
}
for c in "${cases[@]}"; do
    m=$(med "$c")
    r=0
    [[ $c == *-d ]] && r=$rtt
    case $c in
    *-dig-*) goal="goal <= 10 ms at any latency" ;;
    *) goal="goal <= 10 ms + one round trip (${r} ms)" ;;
    esac
    printf '%-44s median %6s ms  +%5s ms over bare  [%s]  (runs: %s)\n' \
        "$(describe "$c") at ${r} ms RTT" "$m" "$(awk -v a="$m" -v b="$bare" 'BEGIN {print a - b}')" "$goal" "${t[$c]}"
    printf '%-44s registry connections per start: %s from srun, %s from the node\n' "" \
        "$(tr ' ' '\n' <<<"${conn_submit[$c]}" | grep . | median)" "$(tr ' ' '\n' <<<"${conn_nodes[$c]}" | grep . | median)"
done
b64=$(med bare64) c64=$(med c64) one=$(med pub-tag-d)
printf '%-44s median %6s ms\n' "bare srun -N1 -n64 true" "$b64"
printf '%-44s median %6s ms  +%5s ms; %.2fx the single-task figure [goal <= 2x]\n' \
    "64 tasks, public by tag at ${rtt} ms" "$c64" "$((c64 - b64))" \
    "$(awk -v c="$c64" -v b="$b64" -v o="$one" -v s="$bare" 'BEGIN {print ((o - s) > 0 ? (c - b) / (o - s) : 0)}')"
bb=$(med batch-bare) bc=$(med batch-c)
printf '%-44s median %6s ms\n' "20 bare steps in an sbatch job" "$bb"
printf '%-44s median %6s ms  +%5s ms in all, %s ms per step\n' \
    "the same in sbatch --container-image by tag at ${rtt} ms" "$bc" "$((bc - bb))" "$(((bc - bb) / 20))"
printf '%-44s registry connections per job: %s from sbatch, %s from the node\n' "" \
    "$(tr ' ' '\n' <<<"${conn_submit[batch]}" | grep . | median)" "$(tr ' ' '\n' <<<"${conn_nodes[batch]}" | grep . | median)"
