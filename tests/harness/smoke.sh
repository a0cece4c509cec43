#!/usr/bin/env bash
# Usage: tests/harness/smoke.sh
#
# Checks that the harness works, after
#   tests/harness/cluster.sh up; tests/harness/registry.sh up; tests/harness/images.sh push
# (run as root). Each check prints PASS or FAIL; the exit status is the
# number of failures. Checks:
#   - srun -N<nodes> hostname as root and as berthuser prints node1..nodeN
#   - srun --mpi=pmix -N2 -n4 ./mpi_hello as root and as berthuser
#   - srun --mpi=pmi2 -N2 -n2 ./mpi_hello (expected to FAIL with Debian's
#     Open MPI, which has no PMI-2 client; reported, not counted)
#   - the anonymous registry answers from the host and from a node netns
#   - the token flow of the token registry (401 + WWW-Authenticate, token,
#     200; anonymous pull of public/*, denied private/*, basic-auth pull)
set -uo pipefail
# shellcheck disable=SC2034  # read by log() in lib.sh
LOG_TAG=smoke
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_root
[[ -f $ENV_FILE ]] || die "cluster $NAME is not up (no $ENV_FILE): run tests/harness/cluster.sh up"
# shellcheck disable=SC1090
source "$ENV_FILE"

FAILURES=0
pass() { printf 'PASS  %s\n' "$1"; }
fail() {
    printf 'FAIL  %s\n' "$1"
    [[ -z ${2:-} ]] || printf '%s\n' "$2" | sed 's/^/      /'
    FAILURES=$((FAILURES + 1))
}

# expect NAME WANT GOT: pass when GOT equals WANT.
expect() {
    if [[ $3 == "$2" ]]; then
        pass "$1"
    else
        fail "$1: got '$3', want '$2'"
    fi
}

# check NAME EXPECTED_REGEX CMD...: CMD must succeed and print a line
# matching EXPECTED_REGEX.
check() {
    local name=$1 want=$2 out rc
    shift 2
    out=$(timeout 120 "$@" 2>&1)
    rc=$?
    if ((rc == 0)) && grep -qE "$want" <<<"$out"; then
        pass "$name"
    else
        fail "$name (exit $rc)" "$out"
    fi
}

AS_USER=(runuser -u "$BERTH_TEST_USER" --)

cd "$BERTH_TEST_WORKDIR" || die "no work dir $BERTH_TEST_WORKDIR"
mpicc -O2 -o mpi_hello "$REPO_DIR/tests/images/mpi_hello.c" || die "mpicc failed"
chmod 0755 mpi_hello

expected_hosts=$(tr ',' '\n' <<<"$BERTH_TEST_NODE_NAMES" | sort | paste -sd' ')
expect "srun -N$BERTH_TEST_NODES hostname (root) -> $expected_hosts" "$expected_hosts" \
    "$(timeout 60 srun -N"$BERTH_TEST_NODES" hostname 2>&1 | sort | paste -sd' ')"
expect "srun -N$BERTH_TEST_NODES hostname ($BERTH_TEST_USER) -> $expected_hosts" "$expected_hosts" \
    "$(timeout 60 "${AS_USER[@]}" srun -N"$BERTH_TEST_NODES" hostname 2>&1 | sort | paste -sd' ')"

if ((BERTH_TEST_NODES >= 2)); then
    check "srun --mpi=pmix -N2 -n4 ./mpi_hello (root)" 'allreduce sum=6 expected=6 ok' \
        srun --mpi=pmix -N2 -n4 ./mpi_hello
    check "srun --mpi=pmix -N2 -n4 ./mpi_hello ($BERTH_TEST_USER)" 'allreduce sum=6 expected=6 ok' \
        "${AS_USER[@]}" srun --mpi=pmix -N2 -n4 ./mpi_hello
    if timeout 60 srun --mpi=pmi2 -N2 -n2 ./mpi_hello >/dev/null 2>&1; then
        echo "INFO  srun --mpi=pmi2 works"
    else
        echo "INFO  srun --mpi=pmi2 does not work (expected: Debian's Open MPI has no PMI-2 client)"
    fi
fi

# ---- registries
acc='Accept: application/vnd.oci.image.manifest.v1+json'
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
token() { curl -sf "$@" | jq -r .token; }
svc=berth-test-registry

expect "anonymous registry: busybox:latest from the host (200)" 200 \
    "$(code -H "$acc" "http://$BERTH_TEST_REGISTRY/v2/busybox/manifests/latest")"
expect "anonymous registry: busybox:latest from node1's netns (200)" 200 \
    "$(nsenter --net="/var/run/netns/${BERTH_TEST_NAME}-node1" curl -s -o /dev/null -w '%{http_code}' \
        -H "$acc" "http://$BERTH_TEST_REGISTRY/v2/busybox/manifests/latest")"

hdr=$(curl -s -o /dev/null -D - -H "$acc" "http://$BERTH_TEST_TOKEN_REGISTRY/v2/public/busybox/manifests/latest" | tr -d '\r')
if grep -q '^HTTP/1.1 401' <<<"$hdr" && grep -qi "^www-authenticate: Bearer realm=\"$BERTH_TEST_TOKEN_REALM\"" <<<"$hdr"; then
    pass "token registry: 401 with WWW-Authenticate: Bearer realm=$BERTH_TEST_TOKEN_REALM"
else
    fail "token registry: no 401 + Bearer challenge" "$hdr"
fi
manifest_url=http://$BERTH_TEST_TOKEN_REGISTRY/v2
t=$(token "$BERTH_TEST_TOKEN_REALM?service=$svc&scope=repository:public/busybox:pull")
expect "token registry: anonymous token pulls public/busybox (200)" 200 \
    "$(code -H "$acc" -H "Authorization: Bearer $t" "$manifest_url/public/busybox/manifests/latest")"
t=$(token "$BERTH_TEST_TOKEN_REALM?service=$svc&scope=repository:private/busybox:pull")
expect "token registry: anonymous token denied private/busybox (401)" 401 \
    "$(code -H "$acc" -H "Authorization: Bearer $t" "$manifest_url/private/busybox/manifests/latest")"
t=$(token -u "$BERTH_TEST_TOKEN_USER:$BERTH_TEST_TOKEN_PASSWORD" \
    "$BERTH_TEST_TOKEN_REALM?service=$svc&scope=repository:private/busybox:pull,push")
expect "token registry: basic-auth token pulls private/busybox (200)" 200 \
    "$(code -H "$acc" -H "Authorization: Bearer $t" "$manifest_url/private/busybox/manifests/latest")"
expect "token server: wrong password refused (401)" 401 \
    "$(code -u "$BERTH_TEST_TOKEN_USER:wrong" "$BERTH_TEST_TOKEN_REALM?service=$svc&scope=repository:private/busybox:pull")"
check "skopeo inspect private/busybox with creds" '"Digest"' \
    skopeo inspect --tls-verify=false --creds "$BERTH_TEST_TOKEN_USER:$BERTH_TEST_TOKEN_PASSWORD" \
    "docker://$BERTH_TEST_TOKEN_REGISTRY/private/busybox:latest"

echo "$FAILURES failure(s)"
exit "$FAILURES"
