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

// This thread's best (value desc, index asc) of the n values at xr ordered after (pv, pi) in
// that order, every value when pv = INF and pi = -1; four independent loads per thread in
// flight (a vocabulary row is ~128k values).
__device__ void thread_best_after(const float* xr, long n, float pv, long pi, float& bv, long& bi) {
    bv = -INF;
    bi = 0x7fffffffffffffffL;
    long step = blockDim.x;
    for (long j0 = threadIdx.x; j0 < n; j0 += 4 * step) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = j0 + u * step < n ? xr[j0 + u * step] : -INF;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            long j = j0 + u * step;
            bool after = v[u] < pv || (v[u] == pv && j > pi);
            if (j < n && after && better(v[u], j, bv, bi)) { bv = v[u]; bi = j; }
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
