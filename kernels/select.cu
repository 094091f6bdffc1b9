// Selection, f32, one block per row: ArgMax (lowest index on ties) and TopK (k rounds, each
// taking the largest element ordered after the previous pick by (value desc, index asc)).

__device__ __forceinline__ bool better(float v, long i, float bv, long bi) {
    return v > bv || (v == bv && i < bi);
}

// Block-wide best (value, index); every thread gets the result.
__device__ void block_best(float& v, long& i) {
    __shared__ float rv[32];
    __shared__ long ri[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        long oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) { rv[w] = v; ri[w] = i; }
    __syncthreads();
    v = lane < nw ? rv[lane] : -INF;
    i = lane < nw ? ri[lane] : 0x7fffffffffffffffL;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        long oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

// Folds value v at index j into this thread's best (bv, bi) when it is ordered after (pv, pi).
__device__ __forceinline__ void take_after(float v, long j, float pv, long pi, float& bv, long& bi) {
    bool after = v < pv || (v == pv && j > pi);
    if (after && better(v, j, bv, bi)) { bv = v; bi = j; }
}

// This thread's best (value desc, index asc) of the n values at xr ordered after (pv, pi) in
// that order, every value when pv = INF and pi = -1 (a vocabulary row is ~128k values). A
// 16-byte aligned row is read as float4s, eight loads per thread in flight, the last n % 4
// values one by one; any other row as floats, four loads in flight. The order is total, so the
// result does not depend on which thread sees which value.
__device__ void thread_best_after(const float* xr, long n, float pv, long pi, float& bv, long& bi) {
    bv = -INF;
    bi = 0x7fffffffffffffffL;
    long step = blockDim.x, tail = 0;
    if ((((unsigned long)xr) & 15) == 0) {
        const float4* x4 = (const float4*)xr;
        long n4 = n >> 2;
        for (long q0 = threadIdx.x; q0 < n4; q0 += 8 * step) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                v[u] = q0 + u * step < n4 ? x4[q0 + u * step] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                long j = 4 * (q0 + u * step);
                if (q0 + u * step < n4) {
                    take_after(v[u].x, j, pv, pi, bv, bi);
                    take_after(v[u].y, j + 1, pv, pi, bv, bi);
                    take_after(v[u].z, j + 2, pv, pi, bv, bi);
                    take_after(v[u].w, j + 3, pv, pi, bv, bi);
                }
            }
        }
        tail = 4 * n4;
    }
    for (long j0 = tail + threadIdx.x; j0 < n; j0 += 4 * step) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = j0 + u * step < n ? xr[j0 + u * step] : -INF;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            long j = j0 + u * step;
            if (j < n) take_after(v[u], j, pv, pi, bv, bi);
        }
    }
}

extern "C" __global__ void argmax_f32(const float* x, int* out, long n) {
    pdl_begin();
    float bv;
    long bi;
    thread_best_after(x + (long)blockIdx.x * n, n, INF, -1, bv, bi);
    block_best(bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == 0x7fffffffffffffffL ? 0 : (int)bi;
}

extern "C" __global__ void topk_f32(const float* x, float* out, long n, int k) {
    pdl_begin();
    const float* xr = x + (long)blockIdx.x * n;
    float* orow = out + (long)blockIdx.x * k * 2;
    float pv = INF;
    long pi = -1;
    for (int r = 0; r < k; r++) {
        float bv;
        long bi;
        thread_best_after(xr, n, pv, pi, bv, bi);
        block_best(bv, bi);
        if (threadIdx.x == 0) {
            orow[2 * r] = (float)bi;
            orow[2 * r + 1] = bv;
        }
        pv = bv;
        pi = bi;
    }
}
