// NCCL all-reduce bandwidth, one process per GPU (berth's device proof).
// Usage: nccl_allreduce RANK NRANKS IDFILE
// Rank 0 writes the NCCL unique id to IDFILE; the others wait for it. Each
// rank uses GPU `RANK % visible GPUs`. For sizes 1 MiB .. 4 GiB (float sum),
// 5 warm-up and 20 timed iterations; rank 0 prints size, time, algbw and
// busbw (GB/s, busbw = algbw * 2(n-1)/n as nccl-tests defines it) and checks
// the sum. With one rank an in-place all-reduce is no work at all, so one
// rank reduces out of place (a device-to-device copy: algbw is then the
// GPU's copy rate; busbw stays 0 by that definition).
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>
#include <nccl.h>

#define CK(x) do { auto e = (x); if (e != 0) { std::fprintf(stderr, "%s failed: %d at line %d\n", #x, (int)e, __LINE__); std::exit(1); } } while (0)

__global__ void fill(float *p, size_t n, float v) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

int main(int argc, char **argv) {
    if (argc != 4) { std::fprintf(stderr, "usage: nccl_allreduce RANK NRANKS IDFILE\n"); return 2; }
    int rank = atoi(argv[1]), nranks = atoi(argv[2]);
    const char *idfile = argv[3];
    ncclUniqueId id;
    if (rank == 0) {
        CK(ncclGetUniqueId(&id));
        char tmp[4096];
        std::snprintf(tmp, sizeof tmp, "%s.tmp", idfile);
        FILE *f = std::fopen(tmp, "wb");
        std::fwrite(&id, sizeof id, 1, f);
        std::fclose(f);
        std::rename(tmp, idfile);
    } else {
        FILE *f = nullptr;
        while (!(f = std::fopen(idfile, "rb"))) usleep(10000);
        if (std::fread(&id, sizeof id, 1, f) != 1) { std::fprintf(stderr, "short id file\n"); return 1; }
        std::fclose(f);
    }
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    CK(cudaSetDevice(rank % ndev));
    ncclComm_t comm;
    CK(ncclCommInitRank(&comm, nranks, id, rank));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    size_t max = (size_t)4 << 30;
    float *buf, *out;
    CK(cudaMalloc(&buf, max));
    out = buf;
    if (nranks == 1) CK(cudaMalloc(&out, max));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    if (rank == 0) std::printf("%12s %10s %10s %10s %s\n", "bytes", "time_us", "algbw", "busbw", "check");
    for (size_t bytes = (size_t)1 << 20; bytes <= max; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        fill<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(buf, n, 1.0f);
        CK(ncclAllReduce(buf, out, n, ncclFloat, ncclSum, comm, s));
        float first = 0;
        CK(cudaMemcpyAsync(&first, out, sizeof first, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        for (int i = 0; i < 5; i++) CK(ncclAllReduce(buf, out, n, ncclFloat, ncclSum, comm, s));
        const int iters = 20;
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < iters; i++) CK(ncclAllReduce(buf, out, n, ncclFloat, ncclSum, comm, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        double us = ms * 1e3 / iters, algbw = bytes / us / 1e3;
        double busbw = algbw * 2.0 * (nranks - 1) / nranks;
        if (rank == 0)
            std::printf("%12zu %10.1f %10.2f %10.2f %s\n", bytes, us, algbw, busbw,
                        first == (float)nranks ? "ok" : "WRONG");
    }
    ncclCommDestroy(comm);
    return 0;
}
