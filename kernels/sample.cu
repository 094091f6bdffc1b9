// Token sampling on the GPU, one block per row (blockDim a multiple of 32, at most 1024):
// sample_f32 (temperature, top-k, top-p, min-p, a host-drawn random word per row) and
// penalties_f32 (repetition / presence / frequency penalties in place). Bit-identical with
// fastllm_cpu::sample (cpu/src/sample.rs holds the definition): float arithmetic uses the
// explicitly rounded __f*_rn intrinsics (no contraction into fused multiply-adds), weights are
// 64-bit integers whose sums do not depend on the order of additions, and the element order is
// the 64-bit key (f32 total-order key << 32 | ~index).
//
// The selections (top-k cutoff, nucleus cutoff, the pick) are one histogram pass over 2048
// coarse buckets of the scaled logit (a monotone function of the key, so the chosen bucket is a
// run of the key order), then radix passes over the 64-bit key (8 bits each) inside that
// bucket until a bin holds a single element. Those passes skip, with one subtraction and two
// compares, every element whose logit lies outside a slightly widened window around the
// bucket, so only the bucket's elements are weighed again. The nucleus and pick thresholds
// come from the total of the bucket histogram itself (no separate sum pass).

#define SMP_WSCALE 1099511627776.0f  // 2^40
#define SMP_BUCKETS 2048
#define SMP_BSCALE 73.14285714f  // SMP_BUCKETS / 28

__device__ __forceinline__ unsigned int smp_fkey(float v) {
    unsigned int u = __float_as_uint(v);
    return (u >> 31) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float smp_unkey(unsigned int k) {
    return (k >> 31) ? __uint_as_float(k & 0x7fffffffu) : __uint_as_float(~k);
}

__device__ __forceinline__ unsigned long long smp_key(float v, long i) {
    return ((unsigned long long)smp_fkey(v) << 32) | (unsigned long long)(~(unsigned int)i);
}

// e^x for x <= 0 (see exp_det in cpu/src/sample.rs: same operations, same rounding).
__device__ __forceinline__ float smp_exp(float x) {
    float n = floorf(__fadd_rn(__fmul_rn(x, __uint_as_float(0x3fb8aa3bu)), 0.5f));
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, __uint_as_float(0x3f318000u))),
                        __fmul_rn(n, __uint_as_float(0xb95e8083u)));
    float p = __uint_as_float(0x3ab60b61u);
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3c088889u));
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3d2aaaabu));
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3e2aaaabu));
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    return __fmul_rn(p, __int_as_float(((int)n + 127) << 23));
}

// (x, w, q) of d = logit - row maximum, with it = 1 / temperature (see weight() in
// cpu/src/sample.rs).
__device__ __forceinline__ void smp_weight(float d, float it, float& x, float& w,
                                           unsigned long long& q) {
    x = d == 0.0f ? 0.0f : __fmul_rn(d, it);
    if (!(x >= -28.0f)) {
        w = 0.0f;
        q = 0;
        return;
    }
    w = smp_exp(x);
    q = __float2ull_rz(__fmul_rn(w, SMP_WSCALE));
}

// Coarse buckets of the scaled logit x in [-28, 0]: bucket 0 holds the largest logits. A
// non-increasing function of the logit, so each bucket is a contiguous run of the key order.
__device__ __forceinline__ int smp_bucket(float x) {
    int b = (int)floorf(__fmul_rn(-x, SMP_BSCALE));
    return b > SMP_BUCKETS - 1 ? SMP_BUCKETS - 1 : b;
}

struct SmpShared {
    unsigned long long hist[SMP_BUCKETS];
    unsigned int cnt[256];
    unsigned long long sum;
    unsigned long long sel_above;
    unsigned long long sel_thr;
    unsigned long long sel_key;
    unsigned int maxkey;
    unsigned int minidx;
    int bad;
    int sel_d;
    int sel_single;
};

__device__ __forceinline__ unsigned long long smp_warp_sum(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ unsigned long long smp_mul_shr32_ceil(unsigned long long a,
                                                                 unsigned long long b) {
    unsigned long long lo = a * b, hi = __umul64hi(a, b);
    unsigned long long lo2 = lo + 0xffffffffull;
    if (lo2 < lo) hi++;
    return (hi << 32) | (lo2 >> 32);
}

// Sum of q over elements with q > 0, key >= kmin and w >= minp; every thread gets it.
__device__ unsigned long long smp_sum(const float* xr, long n, float m, float it,
                                      unsigned long long kmin, float minp, SmpShared& sh) {
    if (threadIdx.x == 0) sh.sum = 0;
    __syncthreads();
    unsigned long long s = 0;
    for (long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (smp_key(v, i) < kmin) continue;
        float x, w;
        unsigned long long q;
        smp_weight(__fsub_rn(v, m), it, x, w, q);
        if (q != 0 && w >= minp) s += q;
    }
    s = smp_warp_sum(s);
    if ((threadIdx.x & 31) == 0 && s != 0) atomicAdd(&sh.sum, s);
    __syncthreads();
    unsigned long long r = sh.sum;
    __syncthreads();
    return r;
}

// How a select gets its threshold: given, or from the total of its first histogram (the pick:
// floor(R * total / 2^64); the nucleus: ceil(total * pq / 2^32) - 1).
#define SMP_THR_GIVEN 0
#define SMP_THR_PICK 1
#define SMP_THR_NUCLEUS 2

// Warp 0 walks sh.hist[0..nbins) (nbins a multiple of 32) from bin 0 on, starting at `above`:
// the first bin at which the running sum exceeds the threshold goes to sh.sel_d (-1: none), the
// sum before it to sh.sel_above, and (with `counts`) whether it holds one element to
// sh.sel_single. With a threshold mode other than SMP_THR_GIVEN, the threshold is made from the
// histogram's total and left in sh.sel_thr. The caller synchronizes before and after.
__device__ void smp_find(SmpShared& sh, int nbins, bool counts, unsigned long long above,
                         int mode, unsigned long long thr, unsigned long long arg) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x, per = nbins / 32;
    unsigned long long s = 0;
    for (int j = 0; j < per; j++) s += sh.hist[lane * per + j];
    unsigned long long incl = s;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (mode != SMP_THR_GIVEN) {
        unsigned long long total = __shfl_sync(0xffffffffu, incl, 31);
        if (mode == SMP_THR_PICK) {
            thr = __umul64hi(arg, total);
        } else {
            unsigned long long p = smp_mul_shr32_ceil(total, arg);
            thr = p == 0 ? 0 : p - 1;
        }
    }
    if (lane == 0) sh.sel_thr = thr;
    unsigned int hit = __ballot_sync(0xffffffffu, above + incl > thr);
    if (hit == 0) {
        if (lane == 0) sh.sel_d = -1;
        return;
    }
    int l = __ffs(hit) - 1;
    if (lane == l) {
        unsigned long long a = above + incl - s;
        int d = lane * per;
        for (int j = 0; j < per; j++, d++) {
            if (a + sh.hist[d] > thr) break;
            a += sh.hist[d];
        }
        sh.sel_d = d;
        sh.sel_above = a;
        sh.sel_single = counts && sh.cnt[d] == 1u;
    }
}

// Among elements with q > 0, key >= kmin and w >= minp, in descending key order: the key of the
// first at which the running weight (1 each when `count`, else q) exceeds the threshold (see
// smp_find for `mode`, `thr`, `arg`). False when the total is at most the threshold.
__device__ bool smp_select(const float* xr, long n, float m, float t, float it,
                           unsigned long long kmin, float minp, bool count, int mode,
                           unsigned long long thr, unsigned long long arg,
                           unsigned long long& kc, SmpShared& sh) {
    for (int j = threadIdx.x; j < SMP_BUCKETS; j += blockDim.x) sh.hist[j] = 0;
    __syncthreads();
    for (long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (smp_key(v, i) < kmin) continue;
        float x, w;
        unsigned long long q;
        smp_weight(__fsub_rn(v, m), it, x, w, q);
        if (q == 0 || !(w >= minp)) continue;
        atomicAdd(&sh.hist[smp_bucket(x)], count ? 1ull : q);
    }
    __syncthreads();
    smp_find(sh, SMP_BUCKETS, false, 0, mode, thr, arg);
    __syncthreads();
    const int bucket = sh.sel_d;
    unsigned long long above = sh.sel_above;
    thr = sh.sel_thr;
    __syncthreads();
    if (bucket < 0) return false;
    // logits of the bucket lie in (m - (b+1) t / c, m - b t / c]; widened by 0.1 % (far more
    // than the rounding of x and of the bucket), the window only skips elements early, the
    // exact bucket test decides
    const float dlo = (float)(-(double)(bucket + 1) * (double)t / (double)SMP_BSCALE * 1.001 - 1e-30);
    const float dhi = (float)(-(double)bucket * (double)t / (double)SMP_BSCALE * 0.999 + 1e-30);
    unsigned long long prefix = 0;
    int shift = 64;  // bits of the key fixed so far: those at and above `shift`
    int single = 0;
    while (!single && shift > 0) {
        shift -= 8;
        unsigned long long hmask = shift == 56 ? 0ull : (~0ull << (shift + 8));
        for (int j = threadIdx.x; j < 256; j += blockDim.x) {
            sh.hist[j] = 0;
            sh.cnt[j] = 0;
        }
        __syncthreads();
        for (long i = threadIdx.x; i < n; i += blockDim.x) {
            float v = xr[i];
            float d = __fsub_rn(v, m);
            if (!(d >= dlo && d <= dhi)) continue;
            unsigned long long k = smp_key(v, i);
            if (k < kmin || (k & hmask) != prefix) continue;
            float x, w;
            unsigned long long q;
            smp_weight(d, it, x, w, q);
            if (q == 0 || !(w >= minp) || smp_bucket(x) != bucket) continue;
            // bins in descending key order: bin 0 holds the largest digit
            int b = 255 - (int)((k >> shift) & 255ull);
            atomicAdd(&sh.hist[b], count ? 1ull : q);
            atomicAdd(&sh.cnt[b], 1u);
        }
        __syncthreads();
        smp_find(sh, 256, true, above, SMP_THR_GIVEN, thr, 0);
        __syncthreads();
        int b = sh.sel_d;
        single = sh.sel_single;
        above = sh.sel_above;
        __syncthreads();
        if (b < 0) return false;  // cannot happen: the bucket's total exceeds thr
        prefix |= (unsigned long long)(255 - b) << shift;
    }
    if (shift == 0) {
        kc = prefix;
        return true;
    }
    // the only element under this prefix (in this bucket): find its whole key
    unsigned long long pmask = ~0ull << shift;
    for (long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        float d = __fsub_rn(v, m);
        if (!(d >= dlo && d <= dhi)) continue;
        unsigned long long k = smp_key(v, i);
        if (k < kmin || (k & pmask) != prefix) continue;
        float x, w;
        unsigned long long q;
        smp_weight(d, it, x, w, q);
        if (q != 0 && w >= minp && smp_bucket(x) == bucket) sh.sel_key = k;
    }
    __syncthreads();
    kc = sh.sel_key;
    __syncthreads();
    return true;
}

// x [rows, n] logits; params [rows, 4] = (temperature, top_k, top_p, min_p); rnd [rows, 2] =
// the random word (low, high 32 bits); out [rows] = token id, or -1 for a row with NaN/+Inf,
// only -Inf, or a bad temperature.
extern "C" __global__ void __launch_bounds__(1024)
    sample_f32(const float* x, const float* params, const int* rnd, int* out, long n) {
    pdl_begin();
    __shared__ SmpShared sh;
    const long row = blockIdx.x;
    const float* xr = x + row * n;
    const float t = params[4 * row], topk = params[4 * row + 1];
    const float top_p = params[4 * row + 2], min_p = params[4 * row + 3];
    const unsigned long long R = (unsigned long long)(unsigned int)rnd[2 * row] |
                                 ((unsigned long long)(unsigned int)rnd[2 * row + 1] << 32);
    if (threadIdx.x == 0) {
        sh.maxkey = 0;
        sh.bad = 0;
        sh.minidx = 0xffffffffu;
    }
    __syncthreads();
    unsigned int mk = 0;
    int bad = 0;
    for (long i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (v != v || v == INF) bad = 1;
        unsigned int k = smp_fkey(v);
        mk = k > mk ? k : mk;
    }
    for (int o = 16; o > 0; o >>= 1) {
        unsigned int om = __shfl_xor_sync(0xffffffffu, mk, o);
        mk = om > mk ? om : mk;
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&sh.maxkey, mk);
        if (bad) atomicOr(&sh.bad, 1);
    }
    __syncthreads();
    mk = sh.maxkey;
    const float m = smp_unkey(mk);
    if (sh.bad || n == 0 || m == -INF || !(t >= 0.0f && t < INF)) {
        if (threadIdx.x == 0) out[row] = -1;
        return;
    }
    if (t == 0.0f) {
        unsigned int best = 0xffffffffu;
        for (long i = threadIdx.x; i < n; i += blockDim.x)
            if (smp_fkey(xr[i]) == mk && (unsigned int)i < best) best = (unsigned int)i;
        atomicMin(&sh.minidx, best);
        __syncthreads();
        if (threadIdx.x == 0) out[row] = (int)sh.minidx;
        return;
    }
    const float it = __fdiv_rn(1.0f, t);
    unsigned long long kk = 0, kc = 0;
    if (topk >= 1.0f) {
        unsigned long long k = (unsigned long long)topk;
        if (smp_select(xr, n, m, t, it, 0, 0.0f, true, SMP_THR_GIVEN, k - 1, 0, kc, sh)) kk = kc;
    }
    unsigned long long kp = kk;
    if (top_p < 1.0f) {
        unsigned long long pq = (unsigned long long)((double)top_p * 4294967296.0);
        bool found;
        if (min_p <= 0.0f) {
            // the nucleus mass is over the same elements as the select's histogram
            found = smp_select(xr, n, m, t, it, kk, min_p, false, SMP_THR_NUCLEUS, 0, pq, kc, sh);
        } else {
            unsigned long long p = smp_mul_shr32_ceil(smp_sum(xr, n, m, it, kk, 0.0f, sh), pq);
            found = smp_select(xr, n, m, t, it, kk, min_p, false, SMP_THR_GIVEN,
                               p == 0 ? 0 : p - 1, 0, kc, sh);
        }
        if (found) kp = kc;
    }
    bool ok = smp_select(xr, n, m, t, it, kp, min_p, false, SMP_THR_PICK, 0, R, kc, sh);
    if (threadIdx.x == 0) out[row] = ok ? (int)(~(unsigned int)(kc & 0xffffffffull)) : -1;
}

// In place on x [rows, n]: for each of the m (token, count) slots of a row (tokens outside
// 0..n are padding; a token at most once per row), the repetition penalty then
// x -= presence + frequency * count; params [rows, 3] = (repetition, presence, frequency).
extern "C" __global__ void penalties_f32(float* x, const int* toks, const int* counts,
                                         const float* params, long n, int m) {
    pdl_begin();
    const long row = blockIdx.x;
    const float rp = params[3 * row], pres = params[3 * row + 1], freq = params[3 * row + 2];
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        int tk = toks[row * m + j];
        if (tk < 0 || (long)tk >= n) continue;
        int c = counts[row * m + j];
        if (c < 0) c = 0;
        float* p = x + row * n + tk;
        float v = *p;
        if (rp != 1.0f) v = v > 0.0f ? __fdiv_rn(v, rp) : __fmul_rn(v, rp);
        *p = __fsub_rn(v, __fadd_rn(pres, __fmul_rn(freq, (float)c)));
    }
}
