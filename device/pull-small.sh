#!/usr/bin/env bash
# Usage (on the device machine, as root, with the folder of
# device/prepare-pull.sh carried):
#   [N=3] [FILES="300000 1000000"] [FLOORS="4 all 1"] [BUDGET=540] \
#       bash .devcarry/device/pull-small.sh
#
# bench/pull.sh's small-file measurement (bench_small) on a bare machine
# without skopeo, jq or a test registry. For each image of FILES files
# (bench/make-small-image.py: 1 to 4 KB files over 30 gzip layers, built
# here and pushed by a few lines of Python to docker-registry on
# 127.0.0.1:$PORT), N interleaved runs, each step from a cold page cache
# (dropped, then the registry's blobs read back, as in bench/pull.sh):
#   1. `berth pull` as root into a fresh node store (root 0711, images/
#      0700 of the pull user `berth`, created here if missing): wall time,
#      peak RSS of berth and its children (bench/peak-rss.py's sum, every
#      50 ms), user and sys CPU seconds (wait4 of the pull: `berth __pull`,
#      which berth waits for, is counted);
#   2. the floor: every layer downloaded (curl, else busybox wget) and
#      gunzipped to /dev/null, P layers at a time for each P in FLOORS
#      ("all": every layer at once; berth downloads 4 at a time,
#      PARALLEL_DOWNLOADS in src/store/pull.rs).
# Prints medians, berth / floor (goal <= 1.2 against 4 at a time), the peak
# RSS (goal <= 256 MiB), nproc, and the file systems of the store and the
# registry. The registry's storage is in /dev/shm (standing for a remote
# registry's memory) where that has room, else in WORK; the store and the
# layouts are in WORK (default: the first of /var/tmp, /tmp, /root that is
# no tmpfs). Everything goes to $OUT/log, the table to $OUT/summary, the
# last pull's stderr per image to $OUT/pull-FILES.err. No run starts once
# BUDGET seconds would be passed (judged by the last run's length).
# NO_DROP=1 keeps the page cache (to try the script on a shared machine:
# then nothing is cold); DD_MIB=0 skips the disk's write test.
# Carried (device/prepare-pull.sh): berth, docker-registry (lib/ for any
# library besides libc), busybox, bench/{make-small-image,make-image,peak-rss}.py.
# Status: run locally at tiny scale only (NO_DROP=1 DD_MIB=0 FILES=3000 N=1).
# Its one device call (nvidia-h200, 2026-12-04) got nothing back: the
# machine stopped answering. Next time, first a short call (FILES=300000
# N=1 DD_MIB=0, timeout 300), then one image per call.
set -uo pipefail
C=${BERTH_CARRY:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
N=${N:-3} FILES=${FILES:-300000 1000000} FLOORS=${FLOORS:-4 all 1}
BUDGET=${BUDGET:-540} PORT=${PORT:-15090} DD_MIB=${DD_MIB:-1024}
REG=127.0.0.1:$PORT
OUT=${OUT:-/tmp/berth-pull-small-out}
START=$SECONDS
mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
step() { echo; echo "=== $(date +%T) +$((SECONDS - START)) s: $*"; }
die() { echo "pull-small.sh: $*"; exit 1; }
now() { date +%s%N; }
secs() { awk -v ns="$1" 'BEGIN {printf "%.2f", ns / 1e9}'; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
[[ $(id -u) -eq 0 ]] || die "run as root"

step "machine"
echo "nproc: $(nproc)"
uname -r
grep -m1 'model name' /proc/cpuinfo
free -m | head -2
for t in curl gzip useradd python3; do printf '%s=%s ' "$t" "$(command -v $t)"; done
echo
python3 --version
if [[ -z ${WORK:-} ]]; then
    for d in /var/tmp /tmp /root; do
        if [[ -d $d && $(stat -f -c %T "$d") != tmpfs ]]; then WORK=$d/berth-pull-small; break; fi
    done
fi
[[ -n ${WORK:-} ]] || die "no folder off tmpfs for the store"
W=$WORK
rm -rf "$W"
mkdir -p "$W"
if (($(df -k --output=avail /dev/shm | tail -1) > 8 << 20)); then
    REGDIR=/dev/shm/berth-pull-small-registry
else
    REGDIR=$W/registry
fi
rm -rf "$REGDIR"
REGPID=
trap '[[ -n $REGPID ]] && kill $REGPID 2>/dev/null; rm -rf "$REGDIR" "$W"' EXIT
echo "store and layouts: $W ($(stat -f -c %T "$W")); registry storage: $REGDIR ($(stat -f -c %T "$(dirname "$REGDIR")"))"
df -hT "$W" /dev/shm
awk -v t="$(df --output=target "$W" | tail -1)" '$2 == t || $2 == "/dev/shm"' /proc/mounts
command -v lsblk >/dev/null && lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>/dev/null | head -12
if ((DD_MIB > 0)); then
    echo "disk: writing $DD_MIB MiB with fdatasync:"
    dd if=/dev/zero of="$W/dd" bs=1M count="$DD_MIB" conv=fdatasync 2>&1 | tail -1
    rm -f "$W/dd"
fi

H=$W/helpers.py
cat >"$H" <<'EOF'
import http.client, importlib.util, json, os, subprocess, sys, threading, time
import urllib.parse, urllib.request


def push(layout, reg, name, tag, listfile):
    """Pushes LAYOUT's TAG as NAME:TAG (monolithic blob uploads), writes
    its layers' digests and sizes to LISTFILE."""
    index = json.load(open(f"{layout}/index.json"))
    mdesc = next(m for m in index["manifests"]
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    blob = lambda d: f"{layout}/blobs/sha256/{d.split(':')[1]}"
    mbytes = open(blob(mdesc["digest"]), "rb").read()
    manifest = json.loads(mbytes)
    conn = http.client.HTTPConnection(reg, blocksize=1 << 20)

    def req(method, path, body=None, headers={}):
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r, r.read()

    for d in [manifest["config"]] + manifest["layers"]:
        r, _ = req("HEAD", f"/v2/{name}/blobs/{d['digest']}")
        if r.status == 200:
            continue
        r, data = req("POST", f"/v2/{name}/blobs/uploads/")
        assert r.status == 202, (r.status, data[:300])
        u = urllib.parse.urlsplit(r.getheader("Location"))
        path = f"{u.path}?{u.query + '&' if u.query else ''}digest={d['digest']}"
        with open(blob(d["digest"]), "rb") as f:
            r, data = req("PUT", path, f, {"Content-Length": str(d["size"]),
                                           "Content-Type": "application/octet-stream"})
        assert r.status == 201, (r.status, data[:300])
    r, data = req("PUT", f"/v2/{name}/manifests/{tag}", mbytes, {"Content-Type": manifest["mediaType"]})
    assert r.status == 201, (r.status, data[:300])
    with open(listfile, "w") as f:
        for l in manifest["layers"]:
            print(l["digest"], l["size"], file=f)


def wait(url):
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except Exception:
            time.sleep(0.1)
    sys.exit(f"no answer from {url}")


def measure(peak_rss_py, log, *cmd):
    """Runs CMD (output to LOG); prints its wall seconds, the peak RSS of it
    and its descendants (KiB, peak-rss.py's sampling), its user and sys CPU
    seconds and ru_maxrss (KiB) from wait4."""
    spec = importlib.util.spec_from_file_location("peak_rss", peak_rss_py)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    done = {}
    with open(log, "wb") as out:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=out)

    def waiter():
        _, status, ru = os.wait4(p.pid, 0)
        done.update(t=time.monotonic(), status=status, ru=ru)

    th = threading.Thread(target=waiter)
    th.start()
    peak = 0
    while "t" not in done:
        peak = max(peak, m.tree_rss(p.pid))
        time.sleep(0.05)
    th.join()
    ru = done["ru"]
    print(f"{done['t'] - t0:.2f} {peak} {ru.ru_utime:.2f} {ru.ru_stime:.2f} {ru.ru_maxrss}")
    sys.exit(os.waitstatus_to_exitcode(done["status"]))


{"push": push, "wait": wait, "measure": measure}[sys.argv[1]](*sys.argv[2:])
EOF

step "pull user, registry"
if ! id berth >/dev/null 2>&1; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin berth ||
        die "cannot create the pull user berth"
fi
id berth
cat >"$W/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $REGDIR
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: $REG
EOF
LD_LIBRARY_PATH=$C/lib "$C/docker-registry" serve "$W/registry.yml" >"$W/registry.log" 2>&1 &
REGPID=$!
python3 "$H" wait "http://$REG/v2/" || { cat "$W/registry.log"; die "the registry did not start"; }
if command -v curl >/dev/null && [[ -z ${FORCE_WGET:-} ]]; then
    FETCH=curl
    get_blob() { curl -sf "$1"; }
else
    FETCH="busybox wget"
    get_blob() { "$C/busybox" wget -q -O - "$1"; }
fi
echo "floor downloads with: $FETCH"

drop_caches() {
    ((${NO_DROP:-0})) && return
    sync
    echo 3 >/proc/sys/vm/drop_caches || die "cannot drop the page cache"
}
warm_registry() {
    local l
    for l in "${LAYERS[@]}"; do
        l=${l#sha256:}
        cat "$REGDIR/docker/registry/v2/blobs/sha256/${l:0:2}/$l/data"
    done >/dev/null
}
cold() { drop_caches; warm_registry; }
node_store() {
    rm -rf "$1"
    install -d -m 0711 "$1"
    install -d -m 0700 -o berth -g berth "$1/images"
}
# floor P: every layer downloaded and gunzipped to /dev/null, P at a time.
floor() {
    local par=$1 t0 t1 l
    [[ $par == all ]] && par=${#LAYERS[@]}
    t0=$(now)
    for l in "${LAYERS[@]}"; do
        while (($(jobs -rp | wc -l) >= par)); do wait -n; done
        get_blob "http://$REG/v2/$NAME/blobs/$l" | gzip -dc >/dev/null &
    done
    wait
    t1=$(now)
    secs $((t1 - t0))
}
mib() { awk -v b="$1" 'BEGIN {printf "%.0f", b / 1048576}'; }

SUMMARY=$OUT/summary
{
    printf '| files | MiB compressed | berth pull median (runs) |'
    for p in $FLOORS; do printf ' floor-%s median (runs) | berth / floor-%s |' "$p" "$p"; done
    printf ' peak RSS median (runs), MiB | CPU user+sys median (user, sys per run), s |\n'
} >"$SUMMARY"
last=0
for files in $FILES; do
    NAME=bench/small$files
    if ((SECONDS - START + 60 > BUDGET)); then
        echo "budget: not starting the image of $files files"
        break
    fi
    step "image of $files files: bench/make-small-image.py"
    t0=$(now)
    python3 "$C/bench/make-small-image.py" "$files" "$W/layout" >"$W/stats.json" || die "make-small-image.py failed"
    echo "built in $(secs $(($(now) - t0))) s: $(cat "$W/stats.json")"
    t0=$(now)
    python3 "$H" push "$W/layout" "$REG" "$NAME" img "$W/layers" || die "the push failed"
    echo "pushed in $(secs $(($(now) - t0))) s"
    mapfile -t LAYERS < <(cut -d' ' -f1 "$W/layers")
    rm -rf "$W/layout"
    got=$(get_blob "http://$REG/v2/$NAME/blobs/${LAYERS[0]}" | sha256sum | cut -d' ' -f1)
    [[ sha256:$got == "${LAYERS[0]}" ]] || die "the floor's download ($FETCH) of ${LAYERS[0]} gave sha256:$got"
    COMPRESSED=$(awk '{s += $2} END {print s}' "$W/layers")
    echo "${#LAYERS[@]} layers, $(mib "$COMPRESSED") MiB compressed; registry storage $(du -sh "$REGDIR" | cut -f1)"
    bt=() brss=() bcpu=() butil=()
    unset ft
    declare -A ft=()
    for p in $FLOORS; do ft[$p]=; done
    for ((i = 1; i <= N; i++)); do
        if ((i > 1 && SECONDS - START + last > BUDGET)); then
            echo "budget: stopping after $((i - 1)) runs"
            break
        fi
        r0=$SECONDS
        node_store "$W/store"
        cold
        res=$(python3 "$H" measure "$C/bench/peak-rss.py" "$W/pull.err" \
            "$C/berth" pull --store "$W/store" --insecure-registry "$REG" "$REG/$NAME:img") ||
            { cat "$W/pull.err"; die "berth pull failed"; }
        read -r t rss ut st mx <<<"$res"
        bt+=("$t") brss+=("$rss")
        bcpu+=("$(awk -v u="$ut" -v s="$st" 'BEGIN {printf "%.2f", u + s}')") butil+=("$ut/$st")
        line="run $i: berth ${t} s (peak ${rss} KiB, largest process ${mx} KiB, CPU user ${ut} s sys ${st} s)"
        for p in $FLOORS; do
            cold
            f=$(floor "$p")
            ft[$p]+="$f "
            line+=", floor-$p ${f} s"
        done
        echo "$line"
        last=$((SECONDS - r0))
    done
    cp "$W/pull.err" "$OUT/pull-$files.err"
    grep -v -i -e 'download' -e 'fetched' "$W/pull.err" | tail -5 | sed 's/^/  /'
    ls -l "$W"/store/images/*/image.sqfs 2>/dev/null | sed 's/^/  /'
    du -sh "$W/store" | sed 's/^/  store: /'
    mb=$(printf '%s\n' "${bt[@]}" | median)
    mrss=$(printf '%s\n' "${brss[@]}" | median)
    mcpu=$(printf '%s\n' "${bcpu[@]}" | median)
    echo
    echo "image of $files files ($(mib "$COMPRESSED") MiB compressed, ${#LAYERS[@]} layers), ${#bt[@]} runs, nproc $(nproc):"
    echo "  berth pull (cold):          median ${mb} s   (${bt[*]})"
    row="| $files | $(mib "$COMPRESSED") | $mb (${bt[*]}) |"
    for p in $FLOORS; do
        read -ra fs <<<"${ft[$p]}"
        mf=$(printf '%s\n' "${fs[@]}" | median)
        ratio=$(awk -v a="$mb" -v b="$mf" 'BEGIN {printf "%.2f", a / b}')
        goal=
        [[ $p == 4 ]] && goal="   (goal <= 1.2)"
        printf '  %-27s median' "floor, $p at a time:"
        echo " ${mf} s   (${fs[*]}); berth / floor-$p: ${ratio}${goal}"
        row+=" $mf (${fs[*]}) | $ratio |"
    done
    awk -v k="$mrss" 'BEGIN {printf "  peak RSS of berth pull and children: median %.0f MiB   (goal <= 256 MiB)\n", k / 1024}'
    echo "  CPU of the pull, user+sys: median ${mcpu} s   (user/sys: ${butil[*]})"
    row+=" $(awk -v k="$mrss" 'BEGIN {printf "%.0f", k / 1024}') ($(printf '%s\n' "${brss[@]}" | awk '{printf "%s%.0f", (NR > 1 ? ", " : ""), $1 / 1024}')) | $mcpu (${butil[*]}) |"
    echo "$row" >>"$SUMMARY"
    rm -rf "$W/store"
done
step "done"
echo "nproc $(nproc); store on $W ($(stat -f -c %T "$W")); registry on $REGDIR; floor with $FETCH"
cat "$SUMMARY"
