#!/usr/bin/env bash
# Usage (on the device machine, as root, from the repository root, with the
# folder device/prepare.sh fills carried along):
#   BERTH_CARRY=$PWD/.devcarry bash device/run-slurm.sh
#
# A real GPU under a real Slurm, from a bare machine, in one command:
#  1. probes the machine (cgroup v2 layout, toolchain, GPUs);
#  2. Slurm: unpacks a prebuilt prefix (CARRY/slurm-prefix.tar.xz) or builds
#     the carried source (CARRY/slurm-src.tar.xz) into /opt/slurm and leaves
#     the stripped prefix in $OUT/slurm-prefix.tar.xz for the next call;
#  3. builds the CUDA probe and the NCCL test with the machine's nvcc and
#     NCCL and packs a plain image (no driver) as a squashfs (as run-gpu.sh);
#  4. installs berth as an admin would (CLI, spank_berth.so, plugstack line,
#     the pull user `berth`) and starts slurmctld + slurmd: auth/none and
#     cred/none (one node, no network, no munge), gres/gpu with the GPU's
#     device file, cgroup/v2 with ConstrainDevices; falls back to
#     CgroupPlugin=disabled if slurmd cannot start that way;
#  5. srun --gpus=1 with and without --container-image: what the task sees,
#     a step without GPUs, a GPU bound in by hand, the time from srun to the
#     task, the NCCL all-reduce (one GPU) bare beside berth, interleaved.
# Every step that can hang has a timeout; the log goes to $OUT as it grows.
# Multicast stays off (device README).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
C=${BERTH_CARRY:-$(pwd)/.devcarry}
W=/tmp/berth-slurm P=/opt/slurm OUT=${OUT:-/tmp/berth-slurm-out}
BUDGET=${BUDGET:-560}
rm -rf "$W"
mkdir -p "$OUT" "$W/root"
exec > >(tee "$OUT/log") 2>&1
T0=$SECONDS
step() { echo; echo "=== [$((SECONDS - T0))s] $*"; }
left() { echo $((BUDGET - (SECONDS - T0))); }
finish() {
    step "logs"
    for f in slurmctld slurmd; do
        [[ -f /var/log/slurm/$f.log ]] && tail -c 4000000 "/var/log/slurm/$f.log" >"$OUT/$f.log"
        [[ -f /var/log/slurm/$f.out ]] && tail -5 "/var/log/slurm/$f.out"
    done
    # berth's own account of each container's setup (slurmd's log).
    grep -h "berth: job" /var/log/slurm/slurmd.log 2>/dev/null | grep -E "ready|created|kept root" |
        sed 's/^\[[^]]*\] //' >>"$W/summary"
    [[ -f $W/summary ]] && { step "summary"; cat "$W/summary"; cp "$W/summary" "$OUT/summary.txt"; }
    kill "${CTLD_PID:-}" "${SLURMD_PID:-}" 2>/dev/null
    echo "done at $((SECONDS - T0))s"
}
need() {
    (($(left) > $1)) && return 0
    echo "out of time (${1}s needed) before: $2"
    finish
    exit 0
}
note() { echo "$*" | tee -a "$W/summary"; }

step "machine"
uname -r; nproc; hostname; grep -m1 PRETTY /etc/os-release
echo "self: $(cat /proc/self/cgroup)  pid 1: $(cat /proc/1/cgroup)"
mount | grep cgroup
echo "root controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
ls /sys/fs/cgroup | grep -v '\.' | tr '\n' ' '; echo
for t in gcc make pkg-config useradd runuser nvcc strip xz; do printf '%s=%s ' "$t" "$(command -v $t)"; done; echo
gcc --version | head -1
ls /usr/include/linux/bpf.h /usr/include/dbus-1.0 2>&1
ldconfig -p | grep -E 'libdbus-1.so.3|libsystemd.so.0'
ls -l /dev/nvidia*
nvidia-smi -L

if [[ -f $C/slurm-prefix.tar.xz ]]; then
    step "Slurm: the carried prefix"
    tar -C / -xJf "$C/slurm-prefix.tar.xz" || exit 1
else
    step "Slurm: build from the carried source"
    B=/tmp/slurm-build
    rm -rf "$B"; mkdir -p "$B"
    tar -C "$B" -xJf "$C/slurm-src.tar.xz" --strip-components=1 || exit 1
    if ! pkg-config --exists dbus-1 2>/dev/null; then
        D=$C/dbus
        export dbus_CFLAGS="-I$D/include/dbus-1.0 -I$D/lib/dbus-1.0/include" dbus_LIBS="-L$D/lib -ldbus-1"
        echo "dbus-1 from the carry: $dbus_CFLAGS"
    fi
    bpf=()
    [[ -f /usr/include/linux/bpf.h ]] || bpf=(--with-bpf="$C/bpf")
    (cd "$B" && timeout "$(left)" ./configure --prefix=$P --sysconfdir=$P/etc --without-munge \
        --disable-debug "${bpf[@]}" >"$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
    grep -E 'bpf|dbus|cgroupv2' "$B/config.log" | grep -E '^(configure:.*result|x_ac|ac_cv)' | head
    step "make -j$(nproc)"
    (cd "$B" && timeout "$(left)" make -j"$(nproc)" -s >>"$OUT/build.log" 2>&1 &&
        timeout "$(left)" make -j"$(nproc)" -s install >>"$OUT/build.log" 2>&1) ||
        { tail -40 "$OUT/build.log"; finish; exit 1; }
    rm -rf $P/share $P/include
    find $P \( -name '*.la' -o -name '*.a' \) -delete
    strip --strip-unneeded $P/bin/* $P/sbin/* $P/lib/*.so* $P/lib/slurm/*.so 2>/dev/null
    # In parts: the device tool brings back files of up to 16 MiB.
    tar -C / -cf - opt/slurm | xz -T0 -6 | split -b 15m -d - "$OUT/slurm-prefix.tar.xz."
    ls -la "$OUT"/slurm-prefix.tar.xz.*
fi
$P/sbin/slurmd -V
ls $P/lib/slurm | grep -E '^(cgroup|proctrack|task|gres|auth|cred)_' | tr '\n' ' '; echo
# Libraries cgroup_v2.so needs that this machine lacks (libdbus and its own).
mkdir -p $P/lib/extra
for l in "$C"/dbus/rt/*; do
    [[ -e $l ]] || continue
    ldconfig -p | grep -q " ${l##*/} " || cp -L "$l" $P/lib/extra/
done
echo $P/lib/extra >/etc/ld.so.conf.d/zz-berth-slurm.conf
ldconfig
ldd $P/lib/slurm/cgroup_v2.so 2>&1 | grep -E 'not found|dbus'

need 120 "image"
step "CUDA programs and the plain image"
lib=$(find / -xdev -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)
[[ -n $lib ]] || { echo "no libnccl.so.2 on this machine"; finish; exit 1; }
NLIB=$(dirname "$lib")
header=$(find / -xdev -name nccl.h -not -path '/proc/*' 2>/dev/null | head -1)
inc=(); [[ -n $header ]] && inc=(-I"$(dirname "$header")")
export PATH=/usr/local/cuda/bin:$PATH
nvcc -O2 -o "$W/cuda_probe" "$HERE/cuda_probe.cu" || exit 1
nvcc -O2 -o "$W/nccl_allreduce" "$HERE/nccl_allreduce.cu" "${inc[@]}" -Xlinker "$lib" || exit 1
R=$W/root
mkdir -p "$R"/{bin,etc,lib64,lib/x86_64-linux-gnu,usr/local/bin,proc,sys,dev,tmp,run}
cp "$C/busybox" "$R/bin/busybox"
for t in sh ls cat grep head echo wc dd cut id tr env sleep; do ln -s busybox "$R/bin/$t"; done
cp "$W/cuda_probe" "$W/nccl_allreduce" "$R/usr/local/bin/"
cp -L "$lib" "$R/lib/x86_64-linux-gnu/libnccl.so.2"
for bin in "$W/cuda_probe" "$W/nccl_allreduce"; do
    LD_LIBRARY_PATH=$NLIB ldd "$bin" | awk '/=> \// {print $3}' | grep -v -e libcuda -e libnvidia -e libnccl |
        xargs -I{} cp -L {} "$R/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
for l in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libgcc_s.so.1 libstdc++.so.6; do
    [[ -e /lib/x86_64-linux-gnu/$l ]] && cp -L "/lib/x86_64-linux-gnu/$l" "$R/lib/x86_64-linux-gnu/"
done
printf '/lib/x86_64-linux-gnu\n' >"$R/etc/ld.so.conf"
: >"$R/etc/passwd"; : >"$R/etc/group"
ldconfig -r "$R"
IMG=$W/image.sqsh
(cd "$R" && tar -cf - .) | LD_LIBRARY_PATH=$C/lib "$C/tar2sqfs" -q -f "$IMG" || exit 1
chmod 0644 "$IMG"
ls -la "$IMG"

step "berth, installed as an admin would (docs/INSTALL.md)"
id berth >/dev/null 2>&1 || useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment 'berth image puller' berth
id berthuser >/dev/null 2>&1 || useradd -m -s /bin/bash berthuser
install -m 0755 "$C/berth" /usr/local/bin/berth
install -d /usr/local/lib/slurm /var/lib/berth /run/berth
install -m 0755 "$C/spank_berth.so" /usr/local/lib/slurm/spank_berth.so
mkdir -p $P/etc /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
echo "required /usr/local/lib/slurm/spank_berth.so helper_path=/usr/local/bin/berth" \
    "store_path=/var/lib/berth runtime_path=/run/berth gpu_driver_root=/usr/local/nvidia" >$P/etc/plugstack.conf
cat $P/etc/plugstack.conf
H=$(hostname -s)
# write_conf MODE: v2 (cgroup/v2, ConstrainDevices), v2-nodevices, or none
# (CgroupPlugin=disabled, proctrack/linuxproc, task/none).
write_conf() {
    local proctrack=proctrack/cgroup task=task/cgroup
    [[ $1 == none ]] && proctrack=proctrack/linuxproc task=task/none
    cat >$P/etc/slurm.conf <<EOF
ClusterName=device
SlurmctldHost=$H(127.0.0.1)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
DebugFlags=Cgroup,Gres
ProctrackType=$proctrack
TaskPlugin=$task
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$H NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=4096 Gres=gpu:1 State=UNKNOWN
PartitionName=gpu Nodes=$H Default=YES MaxTime=INFINITE State=UP
EOF
    echo "Name=gpu File=/dev/nvidia0" >$P/etc/gres.conf
    if [[ $1 == v2* ]]; then
        local devices=yes
        [[ $1 == v2-nodevices ]] && devices=no
        printf '%s\n' CgroupPlugin=cgroup/v2 IgnoreSystemd=yes EnableControllers=yes \
            ConstrainDevices=$devices ConstrainCores=no ConstrainRAMSpace=no >$P/etc/cgroup.conf
    else
        echo CgroupPlugin=disabled >$P/etc/cgroup.conf
    fi
}
start_slurm() {
    $P/sbin/slurmctld -D -i >>/var/log/slurm/slurmctld.out 2>&1 &
    CTLD_PID=$!
    $P/sbin/slurmd -D >>/var/log/slurm/slurmd.out 2>&1 &
    SLURMD_PID=$!
    local i st
    for i in $(seq 60); do
        st=$(timeout 5 $P/bin/sinfo -h -N -o %T 2>/dev/null)
        [[ $st == idle* ]] && { echo "node $st after $((i / 2)) s"; return 0; }
        kill -0 "$SLURMD_PID" 2>/dev/null || { echo "slurmd exited"; break; }
        sleep 0.5
    done
    echo "node state: '$st'"
    tail -25 /var/log/slurm/slurmd.log /var/log/slurm/slurmd.out 2>/dev/null
    return 1
}
stop_slurm() {
    kill "$SLURMD_PID" "$CTLD_PID" 2>/dev/null
    wait "$SLURMD_PID" "$CTLD_PID" 2>/dev/null
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/*
}

need 100 "Slurm start"
# Modes, best first: cgroup/v2 with ConstrainDevices; cgroup/v2 without it;
# no cgroup plugin at all. A mode counts once the node is idle and a step runs.
MODE=
for m in v2 v2-nodevices none; do
    step "Slurm, mode $m"
    write_conf $m
    cat $P/etc/cgroup.conf
    if start_slurm; then
        timeout 30 $P/bin/srun true && { MODE=$m; break; }
        echo "srun true failed in mode $m"
        grep -h -i -E 'error|fatal' /var/log/slurm/slurmd.log | tail -15
    fi
    stop_slurm
done
[[ -n $MODE ]] || { echo "Slurm did not start in any mode"; finish; exit 1; }
note "mode: $MODE ($(grep -h CgroupPlugin $P/etc/cgroup.conf), $(grep -h -e ProctrackType -e TaskPlugin $P/etc/slurm.conf | tr '\n' ' '))"
grep -h -i -E 'cgroup|bpf|gres' /var/log/slurm/slurmd.log | grep -v -i debug2 | head -30
find /sys/fs/cgroup -maxdepth 4 -type d -path '*system.slice*' 2>/dev/null | head

S() { timeout 90 $P/bin/srun "$@"; }
run() {
    echo; echo "\$ srun $*"
    S "$@"
    echo "(rc=$?)"
}
SEE='echo "SLURM_STEP_GPUS=${SLURM_STEP_GPUS-unset} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}";
ls /dev | grep nvidia | tr "\n" " "; echo; cat /proc/self/cgroup; cuda_probe; nvidia-smi -L;
dd if=/dev/nvidia0 of=/dev/null count=0 2>&1; echo "open /dev/nvidia0: rc=$?"'
need 60 "visibility"
step "what a step sees"
run --gpus=1 env PATH="$W:$PATH" sh -c "$SEE"
run --gpus=1 --container-image="$IMG" sh -c "$SEE"
run env PATH="$W:$PATH" sh -c "$SEE"
run --container-image="$IMG" sh -c "$SEE"
step "a GPU bound in by hand (no --gpus)"
run --container-image="$IMG" --container-mounts=/dev/nvidia0:/dev/nvidia0 \
    sh -c 'dd if=/dev/nvidia0 of=/dev/null count=0; echo "open: rc=$?"; cuda_probe'
step "as berthuser"
echo "\$ runuser -u berthuser -- srun --gpus=1 --container-image=$IMG sh -c 'id -u; cuda_probe; nvidia-smi -L'"
runuser -u berthuser -- timeout 90 $P/bin/srun --gpus=1 --container-image="$IMG" sh -c 'id -u; cuda_probe; nvidia-smi -L'
echo "(rc=$?)"
echo "\$ runuser -u berthuser -- srun --container-image=$IMG --container-mounts=/dev/nvidia0:/dev/nvidia0 sh -c 'dd ...'"
runuser -u berthuser -- timeout 90 $P/bin/srun --container-image="$IMG" --container-mounts=/dev/nvidia0:/dev/nvidia0 \
    sh -c 'id -u; dd if=/dev/nvidia0 of=/dev/null count=0; echo "open: rc=$?"'
echo "(rc=$?)"

step "sbatch --gres=gpu:1 --container-image: the batch step"
printf '#!/bin/sh\necho "batch: SLURM_JOB_GPUS=${SLURM_JOB_GPUS-unset}"; cuda_probe; nvidia-smi -L\n' >"$W/batch.sh"
echo "\$ sbatch --wait --gres=gpu:1 --container-image=$IMG -o $W/batch.out $W/batch.sh"
timeout 90 $P/bin/sbatch --wait --gres=gpu:1 --container-image="$IMG" -o "$W/batch.out" "$W/batch.sh"
echo "(rc=$?)"
cat "$W/batch.out"

step "other ways to ask for the GPU, in berth"
for opt in --gres=gpu:1 "-n1 --gpus-per-task=1" --gpus-per-node=1; do
    # shellcheck disable=SC2086 # $opt is one or two options
    run $opt --container-image="$IMG" sh -c 'echo "SLURM_STEP_GPUS=${SLURM_STEP_GPUS-unset}"; cuda_probe; nvidia-smi -L'
done

need 60 "latency"
step "time from srun to the task (uptime read before srun and first thing in the task)"
lat() {
    local t0 t1 w0=$EPOCHREALTIME
    t0=$(cut -d' ' -f1 /proc/uptime)
    t1=$(S "$@" cut -d' ' -f1 /proc/uptime | head -1)
    awk -v a="$t0" -v b="$t1" -v w0="$w0" -v w1="$EPOCHREALTIME" \
        'BEGIN {printf "to the task %.2f s, srun total %.2f s\n", b - a, w1 - w0}'
}
for i in 1 2 3; do
    note "latency bare  $i: $(lat --gpus=1)"
    note "latency berth $i: $(lat --gpus=1 --container-image="$IMG")"
done

step "a named container: later steps of one job join the first one's"
cat >"$W/named.sh" <<EOF
#!/bin/bash
for i in 1 2 3; do
    t0=\$(cut -d' ' -f1 /proc/uptime)
    t1=\$($P/bin/srun --container-image=$IMG --container-name=lat cut -d' ' -f1 /proc/uptime)
    awk -v i=\$i -v a=\$t0 -v b=\$t1 'BEGIN {printf "latency named step %d: to the task %.2f s\\n", i, b - a}'
done
EOF
echo "\$ salloc --gpus=1 bash $W/named.sh"
timeout 120 $P/bin/salloc --gpus=1 bash "$W/named.sh" | tee -a "$W/summary"

need 60 "NCCL"
step "NCCL all-reduce, one GPU, through srun: bare and in berth, interleaved"
for i in 1 2; do
    echo "--- bare $i"
    S --gpus=1 env LD_LIBRARY_PATH="$NLIB" "$W/nccl_allreduce" 0 1 "$W/id.b$i" | tee "$W/bare.$i"
    echo "--- berth $i"
    S --gpus=1 --container-image="$IMG" nccl_allreduce 0 1 "/tmp/berth-slurm-id.c$i" | tee "$W/berth.$i"
done
note "NCCL algbw GB/s (one rank, out of place: the GPU's copy rate), bare 1 / berth 1 / bare 2 / berth 2:"
for size in $(awk '$1 ~ /^[0-9]+$/ {print $1}' "$W/bare.1"); do
    row=$size
    for f in bare.1 berth.1 bare.2 berth.2; do
        row="$row $(awk -v s="$size" '$1 == s {print $3 "(" $5 ")"}' "$W/$f")"
    done
    note "$row"
done

need 20 "doctor"
step "berth doctor on the node"
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$C/lib" "$C/tar2sqfs" >/usr/local/bin/tar2sqfs
chmod 0755 /usr/local/bin/tar2sqfs
SLURM_CONF=$P/etc/slurm.conf PATH=$P/bin:$P/sbin:$PATH timeout 30 /usr/local/bin/berth doctor 2>&1 | head -40

if [[ $MODE == v2 ]] && (($(left) > 40)); then
    step "the same steps with ConstrainDevices=no (the protection removed): the open must succeed"
    stop_slurm
    write_conf v2-nodevices
    if start_slurm; then
        run env PATH="$W:$PATH" sh -c 'dd if=/dev/nvidia0 of=/dev/null count=0; echo "open: rc=$?"; cuda_probe'
        run --container-image="$IMG" --container-mounts=/dev/nvidia0:/dev/nvidia0 \
            sh -c 'dd if=/dev/nvidia0 of=/dev/null count=0; echo "open: rc=$?"'
    fi
fi
finish
