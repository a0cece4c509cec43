#!/usr/bin/env bash
# Usage (on the device machine, as root, from the repository root, with
# .devcarry/ from device/prepare.sh carried along): bash device/run-gpu.sh
#
# berth's real-GPU proof, in one command:
#  1. builds device/cuda_probe.cu and device/nccl_allreduce.cu with the
#     machine's nvcc and the NCCL it has;
#  2. makes a plain image (busybox, the C/C++ runtime libraries, NCCL and
#     the two programs; no CUDA driver) as a squashfs with the carried
#     tar2sqfs;
#  3. berth run --gpus=1 / --gpus=all / no --gpus: what CUDA and
#     nvidia-smi see inside;
#  4. the NCCL all-reduce, one process per GPU, bare and in one berth
#     container with both GPUs, twice each, interleaved; prints both tables
#     and the busbw ratio berth/bare at the two largest sizes.
# Multicast stays off (device README): NCCL_NVLS_ENABLE=0 and friends are
# exported here and berth passes them into the container.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
REPO=$(pwd) C=$(pwd)/.devcarry W=/tmp/berth-gpu OUT=${OUT:-/tmp/berth-gpu-out}
rm -rf "$W"; mkdir -p "$W/root" "$OUT"
exec > >(tee "$OUT/log") 2>&1
step() { echo; echo "=== $*"; }
lib=$(find / -xdev -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)
[[ -n $lib ]] || { echo "no libnccl.so.2 on this machine"; exit 1; }
NLIB=$(dirname "$lib")
header=$(find / -xdev -name nccl.h -not -path '/proc/*' 2>/dev/null | head -1)
inc=(); [[ -n $header ]] && inc=(-I"$(dirname "$header")")
NINC=${header%/*}
step "NCCL: $lib (headers: $NINC)"
export PATH=/usr/local/cuda/bin:$PATH
nvcc -O2 -o "$W/cuda_probe" "$REPO/device/cuda_probe.cu" || exit 1
nvcc -O2 -o "$W/nccl_allreduce" "$REPO/device/nccl_allreduce.cu" "${inc[@]}" -Xlinker "$lib" || exit 1

step "plain image"
R=$W/root
mkdir -p "$R"/{bin,etc,lib64,lib/x86_64-linux-gnu,usr/local/bin,proc,sys,dev,tmp,run}
cp "$C/busybox" "$R/bin/busybox"
for t in sh ls cat grep head echo wc; do ln -s busybox "$R/bin/$t"; done
cp "$W/cuda_probe" "$W/nccl_allreduce" "$R/usr/local/bin/"
cp -L "$lib" "$R/lib/x86_64-linux-gnu/libnccl.so.2"
for bin in "$W/cuda_probe" "$W/nccl_allreduce"; do
    LD_LIBRARY_PATH=$NLIB ldd "$bin" | awk '/=> \// {print $3}' | grep -v -e libcuda -e libnvidia -e libnccl |
        xargs -I{} cp -L {} "$R/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
# What any distribution image has and the driver's libraries link against.
for l in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libgcc_s.so.1 libstdc++.so.6; do
    [[ -e /lib/x86_64-linux-gnu/$l ]] && cp -L "/lib/x86_64-linux-gnu/$l" "$R/lib/x86_64-linux-gnu/"
done
printf '/lib/x86_64-linux-gnu\n' >"$R/etc/ld.so.conf"
: >"$R/etc/passwd"; : >"$R/etc/group"
ldconfig -r "$R"
(cd "$R" && tar -cf - .) | LD_LIBRARY_PATH=$C/lib "$C/tar2sqfs" -q -f "$W/image.sqfs" || exit 1
ls -la "$W/image.sqfs"
printf 'store_path=%s\nruntime_path=%s\ngpu_driver_root=/usr/local/nvidia\n' "$W/store" "$W/run" >"$W/berth.conf"
export BERTH_CONFIG=$W/berth.conf
berth() { "$C/berth" run "$@"; }

step "berth run --gpus=1 (one GPU: the first)"
berth --gpus=1 "$W/image.sqfs" -- sh -c 'ls /dev | grep nvidia | tr "\n" " "; echo; ls /usr/local/lib/berth | tr "\n" " "; echo; cuda_probe; nvidia-smi -L'
step "berth run --gpus=all"
berth --gpus=all "$W/image.sqfs" -- sh -c 'cuda_probe; nvidia-smi -L'
step "berth run without --gpus (no driver in a plain image)"
berth "$W/image.sqfs" -- sh -c 'ls /dev | grep -c nvidia; cuda_probe'
step "bare, for reference"
"$W/cuda_probe"

step "NCCL all-reduce, 2 processes, one per GPU"
bare() {
    rm -f "$W/id.$1"
    LD_LIBRARY_PATH=$NLIB "$W/nccl_allreduce" 1 2 "$W/id.$1" >/dev/null &
    LD_LIBRARY_PATH=$NLIB "$W/nccl_allreduce" 0 2 "$W/id.$1"; wait
}
inside() {
    berth --gpus=all "$W/image.sqfs" -- sh -c \
        "rm -f /tmp/berth-gpu-id.$1; nccl_allreduce 1 2 /tmp/berth-gpu-id.$1 >/dev/null & nccl_allreduce 0 2 /tmp/berth-gpu-id.$1; wait"
}
for i in 1 2; do
    echo "--- bare $i"; bare "b$i" | tee "$OUT/bare.$i"
    echo "--- berth $i"; inside "c$i" | tee "$OUT/berth.$i"
done
step "busbw ratio berth/bare (mean of 2 runs each)"
for size in $(awk '$1 ~ /^[0-9]+$/ {print $1}' "$OUT/bare.1" | tail -2); do
    b=$(awk -v s="$size" '$1 == s {t += $4; n++} END {print t / n}' "$OUT"/bare.*)
    c=$(awk -v s="$size" '$1 == s {t += $4; n++} END {print t / n}' "$OUT"/berth.*)
    awk -v s="$size" -v b="$b" -v c="$c" 'BEGIN {printf "%12d bytes: bare %.1f GB/s, berth %.1f GB/s, ratio %.3f\n", s, b, c, c / b}'
done
