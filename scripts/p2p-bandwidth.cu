// What the link between GPU 0 and GPU 1 carries (the ceiling of the tensor-parallel all-reduces,
// src/devices/cuda/p2p.rs): 16 and 8 MiB moved by SM stores into the peer's memory (grids of 132
// to 1056 blocks, one or four 16-byte loads of a thread in flight before its stores), by each
// block pushing a contiguous chunk, by SM loads from the peer's memory, and by the copy engine;
// each with one GPU moving data and with both at once (as both ranks of a reduction do), against
// a local copy. Microseconds of GPU 0, best of 20, and GB/s.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 scripts/p2p-bandwidth.cu -o /tmp/p2pbw && /tmp/p2pbw
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                     \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

// d[i] = s[i] for n 16-byte words, the grid striding over them, U loads of a thread in flight.
template <int U>
__global__ void copy_strided(const uint4* __restrict__ s, uint4* __restrict__ d, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = s[i + u * stride];
#pragma unroll
        for (int u = 0; u < U; u++) d[i + u * stride] = v[u];
    }
    for (; i < n; i += stride) d[i] = s[i];
}

// d[i] = s[i], block b copying the b-th contiguous chunk (as a block that owns rows pushes them).
__global__ void copy_chunked(const uint4* __restrict__ s, uint4* __restrict__ d, long n) {
    long per = (n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = lo + per < n ? lo + per : n;
    for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) d[i] = s[i];
}

struct Gpus {
    void *src[2], *dst[2];
    cudaStream_t st[2];
    cudaEvent_t a[2], b[2];
};

// Best microseconds of GPU 0 over 20 rounds of f(g) on GPU 0 (and GPU 1 when `both`), printed
// with the bandwidth of `bytes`.
template <class F>
void timed(Gpus& t, const char* name, bool both, long bytes, F f) {
    float best = 1e9f;
    for (int rep = 0; rep < 20; rep++) {
        for (int g = 0; g < 2; g++) {
            CK(cudaSetDevice(g));
            CK(cudaDeviceSynchronize());
        }
        for (int g = 0; g < (both ? 2 : 1); g++) {
            CK(cudaSetDevice(g));
            CK(cudaEventRecord(t.a[g], t.st[g]));
            f(g);
            CK(cudaEventRecord(t.b[g], t.st[g]));
        }
        CK(cudaSetDevice(0));
        CK(cudaEventSynchronize(t.b[0]));
        float ms;
        CK(cudaEventElapsedTime(&ms, t.a[0], t.b[0]));
        if (ms < best) best = ms;
        if (both) {
            CK(cudaSetDevice(1));
            CK(cudaEventSynchronize(t.b[1]));
        }
    }
    printf("%-28s %s %4.1f MiB: %7.1f us %6.1f GB/s\n", name, both ? "both" : "one ", bytes / 1048576.0, best * 1e3,
           bytes / (best * 1e-3) / 1e9);
}

int main() {
    int n_dev = 0;
    CK(cudaGetDeviceCount(&n_dev));
    if (n_dev < 2) {
        printf("needs 2 GPUs, found %d\n", n_dev);
        return 1;
    }
    const long max_bytes = 16l << 20;
    Gpus t;
    for (int g = 0; g < 2; g++) {
        CK(cudaSetDevice(g));
        CK(cudaDeviceEnablePeerAccess(1 - g, 0));
        CK(cudaMalloc(&t.src[g], max_bytes));
        CK(cudaMalloc(&t.dst[g], max_bytes));
        CK(cudaMemset(t.src[g], g + 1, max_bytes));
        CK(cudaStreamCreateWithFlags(&t.st[g], cudaStreamNonBlocking));
        CK(cudaEventCreate(&t.a[g]));
        CK(cudaEventCreate(&t.b[g]));
    }
    for (long bytes : {16l << 20, 8l << 20}) {
        long n = bytes / 16;
        for (bool both : {false, true}) {
            for (int grid : {132, 264, 528, 1056}) {
                char name[64];
                snprintf(name, sizeof name, "push, 4 loads, %d x 256", grid);
                timed(t, name, both, bytes, [&](int g) {
                    copy_strided<4><<<grid, 256, 0, t.st[g]>>>((uint4*)t.src[g], (uint4*)t.dst[1 - g], n);
                });
            }
            for (int grid : {132, 528}) {
                char name[64];
                snprintf(name, sizeof name, "push, 1 load, %d x 256", grid);
                timed(t, name, both, bytes, [&](int g) {
                    copy_strided<1><<<grid, 256, 0, t.st[g]>>>((uint4*)t.src[g], (uint4*)t.dst[1 - g], n);
                });
                snprintf(name, sizeof name, "push chunks, %d x 256", grid);
                timed(t, name, both, bytes, [&](int g) {
                    copy_chunked<<<grid, 256, 0, t.st[g]>>>((uint4*)t.src[g], (uint4*)t.dst[1 - g], n);
                });
                snprintf(name, sizeof name, "pull, 4 loads, %d x 256", grid);
                timed(t, name, both, bytes, [&](int g) {
                    copy_strided<4><<<grid, 256, 0, t.st[g]>>>((uint4*)t.dst[1 - g], (uint4*)t.src[g], n);
                });
            }
            timed(t, "copy engine", both, bytes, [&](int g) {
                CK(cudaMemcpyPeerAsync(t.dst[1 - g], 1 - g, t.src[g], g, bytes, t.st[g]));
            });
            timed(t, "local copy, 528 x 256", both, bytes, [&](int g) {
                copy_strided<4><<<528, 256, 0, t.st[g]>>>((uint4*)t.src[g], (uint4*)t.dst[g], n);
            });
        }
    }
    return 0;
}
