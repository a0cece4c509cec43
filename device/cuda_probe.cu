// Prints the GPUs the CUDA runtime sees (count, name, PCI bus id): run in a
// berth container to show it sees exactly the GPUs it was given.
#include <cstdio>
#include <cuda_runtime.h>

int main() {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        std::printf("cuda error: %s\n", cudaGetErrorString(err));
        return 1;
    }
    std::printf("cuda devices: %d\n", n);
    for (int i = 0; i < n; i++) {
        cudaDeviceProp p;
        cudaGetDeviceProperties(&p, i);
        char bus[32];
        cudaDeviceGetPCIBusId(bus, sizeof bus, i);
        std::printf("device %d: %s %s\n", i, p.name, bus);
    }
    return 0;
}
