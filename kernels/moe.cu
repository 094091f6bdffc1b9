// Mixture of experts on the GPU, with no host round trip: routing (MoeRoute), grouping the
// (token, choice) slots by expert (MoeDispatch), the grouped expert product (MoeLinear: one
// launch over every routed expert, each expert's weight rows read once for all its rows, the
// expert offsets read on the device) and the weighted combine (MoeCombine). Routing computes in
// f64 and sums in the CPU reference's order; the combine rounds each product and sum apart (no
// FMA), so both give the CPU's values. Uses load4 (linear.cu) and kq_load8 / load_w (common.cuh).

#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_GROUPS 32

// (value, index) a comes before b: value descending, then index ascending.
__device__ __forceinline__ bool moe_before(double va, int ia, double vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// Warp-wide best (value, index) by moe_before; every lane gets it.
__device__ __forceinline__ void moe_warp_best(double& v, int& i) {
    for (int o = 16; o > 0; o >>= 1) {
        double ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (moe_before(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

// The best entry of ch[0..n) ordered after (pv, pi), among those whose group (index / gsize)
// is set in gmask (gsize = 0: no group limit); (-inf, INT_MAX) when none.
__device__ __forceinline__ void moe_next(const double* ch, int n, int gsize, unsigned gmask, double pv, int pi,
                                         double& bv, int& bi) {
    bv = -INF;
    bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += 32) {
        double v = ch[i];
        bool after = moe_before(pv, pi, v, i);
        if (after && (gsize == 0 || ((gmask >> (i / gsize)) & 1u)) && moe_before(v, i, bv, bi)) { bv = v; bi = i; }
    }
    moe_warp_best(bv, bi);
}

// One warp (32 threads) per row of logits [rows, E] → out [rows, k, 2] (expert, weight), as
// fastllm_cpu::moe::route: scores (softmax or sigmoid, f64), choice = score + bias, group limit
// (a group ranks by the sum of its best two choice values), top-k, renormalise, scale.
extern "C" __global__ void moe_route_f32(const float* logits, const float* bias, float* out, int E, int k,
                                         int sigmoid, int groups, int topk_groups, int normalize, float scale) {
    __shared__ double sc[MOE_MAX_EXPERTS], ch[MOE_MAX_EXPERTS], gs[MOE_MAX_GROUPS];
    __shared__ int chosen[MOE_MAX_EXPERTS];
    pdl_begin();
    int lane = threadIdx.x;
    const float* x = logits + (long)blockIdx.x * E;
    double m = -INF;
    for (int i = lane; i < E; i += 32) m = fmax(m, (double)x[i]);
    for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    for (int i = lane; i < E; i += 32)
        sc[i] = sigmoid ? 1.0 / (1.0 + exp(-(double)x[i])) : exp((double)x[i] - m);
    __syncwarp();
    if (!sigmoid) {
        __shared__ double total;
        if (lane == 0) {
            double s = 0.0;
            for (int i = 0; i < E; i++) s += sc[i];  // index order, as the reference
            total = s;
        }
        __syncwarp();
        double s = total;
        for (int i = lane; i < E; i += 32) sc[i] = sc[i] / s;
    }
    for (int i = lane; i < E; i += 32) ch[i] = bias ? sc[i] + (double)bias[i] : sc[i];
    __syncwarp();
    int gsize = E / groups;
    bool limited = groups > 1 && topk_groups < groups;
    unsigned gmask = 0xffffffffu;
    if (limited) {
        if (lane < groups) {
            int b1 = -1, b2 = -1;
            for (int i = lane * gsize; i < (lane + 1) * gsize; i++) {
                if (b1 < 0 || moe_before(ch[i], i, ch[b1], b1)) { b2 = b1; b1 = i; }
                else if (b2 < 0 || moe_before(ch[i], i, ch[b2], b2)) b2 = i;
            }
            double g = 0.0 + ch[b1];
            if (b2 >= 0) g += ch[b2];
            gs[lane] = g;
        }
        __syncwarp();
        gmask = 0;
        double pv = INF;
        int pi = -1;
        for (int r = 0; r < topk_groups; r++) {
            double bv;
            int bi;
            moe_next(gs, groups, 0, 0xffffffffu, pv, pi, bv, bi);
            gmask |= 1u << bi;
            pv = bv;
            pi = bi;
        }
    }
    double pv = INF;
    int pi = -1;
    for (int r = 0; r < k; r++) {
        double bv;
        int bi;
        moe_next(ch, E, limited ? gsize : 0, gmask, pv, pi, bv, bi);
        if (lane == 0) chosen[r] = bi;
        pv = bv;
        pi = bi;
    }
    __syncwarp();
    if (lane == 0) {
        double sum = 0.0;
        for (int r = 0; r < k; r++) sum += sc[chosen[r]];
        double denom = !normalize ? 1.0 : (sigmoid ? sum + 1e-20 : sum);
        float* o = out + (long)blockIdx.x * k * 2;
        for (int r = 0; r < k; r++) {
            o[2 * r] = (float)chosen[r];
            o[2 * r + 1] = (float)(sc[chosen[r]] / denom * (double)scale);
        }
    }
}

// The expert of route entry s, clamped into 0..E (the route comes from MoeRoute, or was checked
// on the host).
__device__ __forceinline__ int moe_expert(const float* route, long s, int E) {
    int e = (int)route[2 * s];
    return e < 0 ? 0 : (e >= E ? E - 1 : e);
}

// One block: out[0..=E] the offsets of each expert's entries, out[E + 1..] the slots by expert
// ascending, then slot ascending (a stable counting sort; the placement walks the slots in order
// with one warp, 32 at a time).
extern "C" __global__ void moe_dispatch_f32(const float* route, int* out, long slots, int E) {
    __shared__ int cnt[MOE_MAX_EXPERTS + 1];
    pdl_begin();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (long s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&cnt[moe_expert(route, s, E) + 1], 1);
    __syncthreads();
    if (threadIdx.x == 0)
        for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) out[e] = cnt[e];
    __syncthreads();
    if (threadIdx.x >= 32) return;
    int lane = threadIdx.x;
    int* list = out + E + 1;
    for (long base = 0; base < slots; base += 32) {
        long s = base + lane;
        bool active = s < slots;
        int e = active ? moe_expert(route, s, E) : -1;
        unsigned mask = __ballot_sync(0xffffffffu, active);
        if (active) {
            unsigned peers = __match_any_sync(mask, e);
            int rank = __popc(peers & ((1u << lane) - 1u));
            list[cnt[e] + rank] = (int)s;
            __syncwarp(mask);
            if (lane == __ffs(peers) - 1) cnt[e] += __popc(peers);
        }
        __syncwarp();
    }
}

// Where slot s sits in the dispatch list: a binary search in its expert's (ascending) entries.
__device__ __forceinline__ int moe_position(const float* route, const int* disp, long s, int E) {
    int e = moe_expert(route, s, E);
    const int* list = disp + E + 1;
    int lo = disp[e], hi = disp[e + 1];
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (list[mid] < s) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// One block per token: out[t, :] = Σ_j w(t, j) · x[pos(t·k + j), :], summed in choice order with
// separately rounded products and sums (as the CPU reference).
extern "C" __global__ void moe_combine_f32(const float* x, const float* route, const int* disp, float* out, int k,
                                           int E, long d) {
    __shared__ long pos[64];
    __shared__ float wt[64];
    pdl_begin();
    long t = blockIdx.x;
    float* o = out + t * d;
    for (int j0 = 0; j0 < k; j0 += 64) {
        int nj = min(64, k - j0);
        __syncthreads();
        if (threadIdx.x < nj) {
            long s = t * k + j0 + threadIdx.x;
            pos[threadIdx.x] = moe_position(route, disp, s, E);
            wt[threadIdx.x] = route[2 * s + 1];
        }
        __syncthreads();
        for (long c = threadIdx.x; c < d; c += blockDim.x) {
            float acc = j0 == 0 ? 0.0f : o[c];
            for (int j = 0; j < nj; j++) acc = __fadd_rn(acc, __fmul_rn(wt[j], x[pos[j] * d + c]));
            o[c] = acc;
        }
    }
}

// The n-th expert (0-based, ascending) that has at least one entry in `off`; -1 when fewer. All
// lanes of the warp call it together.
__device__ __forceinline__ int moe_nth_active(const int* off, int E, int n) {
    int lane = threadIdx.x & 31;
    for (int e0 = 0; e0 < E; e0 += 32) {
        int e = e0 + lane;
        unsigned b = __ballot_sync(0xffffffffu, e < E && off[e + 1] > off[e]);
        int c = __popc(b);
        if (n < c) {
            for (int i = 0; i < n; i++) b &= b - 1;
            return e0 + __ffs(b) - 1;
        }
        n -= c;
    }
    return -1;
}

#define MOE_ROWS 4

// acc[r] += weight row `row` (k values of dtype DT) · x row xr[r], r < nr; a warp's partial sums.
template <int DT>
__device__ __forceinline__ void moe_dot(const unsigned char* row, const float* const* xr, int nr, int k, float* acc) {
    int lane = threadIdx.x & 31;
    if (DT == DT_Q8_0 || DT == DT_Q4_0 || DT == DT_Q4_1) {
        int p = lane & 7;
        for (long b = lane >> 3; b < k / 32; b += 4) {
            float w[4];
            load4<DT>(row, b, p, w);
#pragma unroll
            for (int r = 0; r < MOE_ROWS; r++) {
                if (r < nr) {
                    float4 t = *(const float4*)(xr[r] + b * 32 + 4 * p);
                    acc[r] += w[0] * t.x + w[1] * t.y + w[2] * t.z + w[3] * t.w;
                }
            }
        }
    } else if (DT == DT_Q4_K || DT == DT_Q5_K || DT == DT_Q6_K) {
        for (long sb = 0; sb < k / 256; sb++) {
            float w[8];
            kq_load8<DT>(row + sb * KQ_BYTES(DT), lane, w);
#pragma unroll
            for (int r = 0; r < MOE_ROWS; r++) {
                if (r < nr) {
                    const float4* xv = (const float4*)(xr[r] + sb * 256 + 8 * lane);
                    float4 a = xv[0], b = xv[1];
                    acc[r] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
                              w[6] * b.z + w[7] * b.w;
                }
            }
        }
    } else if ((DT == DT_F16 || DT == DT_BF16) && (k & 7) == 0) {
        const uint4* wr = (const uint4*)row;
        for (int v = lane; v < (k >> 3); v += 32) {
            uint4 q = __ldg(wr + v);
            unsigned int u[4] = {q.x, q.y, q.z, q.w};
            float w[8];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                unsigned short lo = (unsigned short)(u[t] & 0xffff), hi = (unsigned short)(u[t] >> 16);
                w[2 * t] = DT == DT_F16 ? h2f(lo) : bf2f(lo);
                w[2 * t + 1] = DT == DT_F16 ? h2f(hi) : bf2f(hi);
            }
#pragma unroll
            for (int r = 0; r < MOE_ROWS; r++) {
                if (r < nr) {
                    const float4* xv = (const float4*)(xr[r] + 8 * v);
                    float4 a = xv[0], b = xv[1];
                    acc[r] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
                              w[6] * b.z + w[7] * b.w;
                }
            }
        }
    } else {
        for (long i = lane; i < k; i += 32) {
            float wv = load_w<DT>(row, i);
#pragma unroll
            for (int r = 0; r < MOE_ROWS; r++)
                if (r < nr) acc[r] += wv * xr[r][i];
        }
    }
}

// The grouped expert product: y[j, :] = x[row(j), :] · W[e(j)]ᵀ + b[e(j)] for every dispatch
// position j, W [E, n, k] of dtype DT, y [slots, n] in dispatch order. row(j) is the token
// list[j] / kk when `gather`, else j. Grid (ceil(n / 8), active-expert bound); block y takes
// the y-th expert that has entries (found from the offsets on the device), a warp one output
// feature, MOE_ROWS of the expert's rows per pass.
template <int DT>
__device__ void moe_linear_t(const float* x, const unsigned char* W, const float* bias, const int* disp, float* y,
                             int E, int n, int k, long rb, int kk, int gather) {
    pdl_begin();
    int e = moe_nth_active(disp, E, blockIdx.y);
    int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (e < 0 || j >= n) return;
    int lane = threadIdx.x & 31;
    const int* list = disp + E + 1;
    const unsigned char* row = W + ((long)e * n + j) * rb;
    float bj = bias ? bias[(long)e * n + j] : 0.0f;
    for (int r0 = disp[e]; r0 < disp[e + 1]; r0 += MOE_ROWS) {
        int nr = min(MOE_ROWS, disp[e + 1] - r0);
        const float* xr[MOE_ROWS];
        float acc[MOE_ROWS];
#pragma unroll
        for (int r = 0; r < MOE_ROWS; r++) {
            int pj = r < nr ? r0 + r : r0;
            long src = gather ? (long)(list[pj] / kk) : (long)pj;
            xr[r] = x + src * k;
            acc[r] = 0.0f;
        }
        moe_dot<DT>(row, xr, nr, k, acc);
#pragma unroll
        for (int r = 0; r < MOE_ROWS; r++) {
            float s = warp_sum(acc[r]);
            if (lane == 0 && r < nr) y[(long)(r0 + r) * n + j] = s + bj;
        }
    }
}

#define MOE_LIN(name, DT) \
    extern "C" __global__ void moe_linear_##name(const float* x, const unsigned char* W, const float* bias, \
                                                 const int* disp, float* y, int E, int n, int k, long rb, int kk, \
                                                 int gather) { \
        moe_linear_t<DT>(x, W, bias, disp, y, E, n, k, rb, kk, gather); \
    }
MOE_LIN(f32, DT_F32)
MOE_LIN(f16, DT_F16)
MOE_LIN(bf16, DT_BF16)
MOE_LIN(q8_0, DT_Q8_0)
MOE_LIN(q4_0, DT_Q4_0)
MOE_LIN(q4_1, DT_Q4_1)
MOE_LIN(q5_0, DT_Q5_0)
MOE_LIN(q4_k, DT_Q4_K)
MOE_LIN(q5_k, DT_Q5_K)
MOE_LIN(q6_k, DT_Q6_K)
