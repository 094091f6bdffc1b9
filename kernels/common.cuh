// Shared helpers for every kernel file: number conversions without CUDA headers (NVRTC compiles
// these sources with no include path), warp/block reductions and weight-row element loads.
// Prepended to every other .cu file by src/devices/cuda/kernels.rs.

#define INF __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float bf2f(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

__device__ __forceinline__ unsigned short ld_u16(const unsigned char* p) {
    return (unsigned short)p[0] | ((unsigned short)p[1] << 8);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float red[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float r = lane < nw ? red[lane] : 0.0f;
    return warp_sum(r);
}

// Max over the block; every thread gets the result.
__device__ float block_max(float v) {
    __shared__ float red[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float r = lane < nw ? red[lane] : -INF;
    return warp_max(r);
}

// Weight dtype codes (fastllm numbering, as in src/data.rs).
#define DT_F32 0
#define DT_BF16 1
#define DT_Q8_0 3
#define DT_Q4_0 4
#define DT_F16 7
#define DT_Q4_1 8

// Element i of a packed weight row of dtype DT.
template <int DT>
__device__ __forceinline__ float load_w(const unsigned char* row, long i) {
    if (DT == DT_F32) return ((const float*)row)[i];
    if (DT == DT_F16) return h2f(((const unsigned short*)row)[i]);
    if (DT == DT_BF16) return bf2f(((const unsigned short*)row)[i]);
    long b = i >> 5;
    int j = (int)(i & 31);
    if (DT == DT_Q8_0) {
        const unsigned char* blk = row + b * 34;
        return h2f(ld_u16(blk)) * (float)(signed char)blk[2 + j];
    }
    if (DT == DT_Q4_0) {
        const unsigned char* blk = row + b * 18;
        unsigned char q = blk[2 + (j & 15)];
        int v = j < 16 ? (q & 15) : (q >> 4);
        return h2f(ld_u16(blk)) * (float)(v - 8);
    }
    // Q4_1
    const unsigned char* blk = row + b * 20;
    unsigned char q = blk[4 + (j & 15)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    return h2f(ld_u16(blk)) * (float)v + h2f(ld_u16(blk + 2));
}
