// Elementwise f32 kernels: activations, gated activations, soft-capping, Add/AddTo/Mul/MulTo.
// Grid-stride loops over n elements.

#define GRID_LOOP(i, n) for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

__device__ __forceinline__ float silu1(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu1(float x, int approx) {
    if (approx) {
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

extern "C" __global__ void silu_f32(const float* x, float* y, long n) {
    pdl_begin();
    GRID_LOOP(i, n) y[i] = silu1(x[i]);
}

extern "C" __global__ void gelu_f32(const float* x, float* y, long n, int approx) {
    pdl_begin();
    GRID_LOOP(i, n) y[i] = gelu1(x[i], approx);
}

extern "C" __global__ void softcap_f32(const float* x, float* y, long n, float cap) {
    pdl_begin();
    GRID_LOOP(i, n) y[i] = cap * tanhf(x[i] / cap);
}

// x [rows, 2d] -> y [rows, d]: silu(x[..d]) * x[d..]
extern "C" __global__ void swiglu_f32(const float* x, float* y, long rows, long d) {
    pdl_begin();
    GRID_LOOP(i, rows * d) {
        long r = i / d, c = i % d;
        const float* xr = x + r * 2 * d;
        y[i] = silu1(xr[c]) * xr[d + c];
    }
}

extern "C" __global__ void gelugated_f32(const float* x, float* y, long rows, long d, int approx) {
    pdl_begin();
    GRID_LOOP(i, rows * d) {
        long r = i / d, c = i % d;
        const float* xr = x + r * 2 * d;
        y[i] = gelu1(xr[c], approx) * xr[d + c];
    }
}

extern "C" __global__ void add_f32(const float* a, const float* b, float* y, long n, float alpha) {
    pdl_begin();
    GRID_LOOP(i, n) y[i] = a[i] + alpha * b[i];
}

// a[i] += alpha * b[i % bn] (bn == n: same shape; bn == d: broadcast over rows)
extern "C" __global__ void addto_f32(float* a, const float* b, long n, long bn, float alpha) {
    pdl_begin();
    GRID_LOOP(i, n) a[i] += alpha * b[i % bn];
}

// a[i] += alpha * r[i % bn] with r f16 (bf = 0) or bf16 (bf = 1) rows: a half residual branch
// (a row-parallel product all-reduced in half) added into the f32 residual
extern "C" __global__ void addto_f32_h(float* a, const unsigned short* b, long n, long bn, float alpha,
                                       int bf) {
    pdl_begin();
    GRID_LOOP(i, n) a[i] += alpha * (bf ? bf2f(b[i % bn]) : h2f(b[i % bn]));
}

extern "C" __global__ void mul_f32(const float* x, float* y, long n, float v) {
    pdl_begin();
    GRID_LOOP(i, n) y[i] = x[i] * v;
}

extern "C" __global__ void multo_f32(float* a, const float* b, long n, long bn) {
    pdl_begin();
    GRID_LOOP(i, n) a[i] *= b[i % bn];
}

// y = silu(g) * u (the gated MLP's activation and product in one pass)
extern "C" __global__ void silu_mul_f32(const float* g, const float* u, float* y, long n) {
    pdl_begin();
    GRID_LOOP(i, n) y[i] = silu1(g[i]) * u[i];
}

// silu_mul_f32 that also writes y as f16 (bf = 0) or bf16 (bf = 1) at h, for the next tensor-core
// Linear; four values per thread (n % 4 == 0, 16-byte aligned g, u, y).
extern "C" __global__ void silu_mul_h_f32(const float4* g, const float4* u, float4* y, long n4, uint2* h, int bf) {
    pdl_begin();
    GRID_LOOP(i, n4) {
        float4 a = g[i], b = u[i];
        float4 v = make_float4(silu1(a.x) * b.x, silu1(a.y) * b.y, silu1(a.z) * b.z, silu1(a.w) * b.w);
        y[i] = v;
        h[i] = half4_of(v, bf);
    }
}

// y = silu(g)·u on f16 (bf = 0) or bf16 (bf = 1) rows, computed in f32 and rounded once: the
// gated MLP of prefill when the gate/up projections wrote half outputs. Eight values per
// thread by 16-byte accesses for i < n8 · 8 (the caller passes n8 = 0 when the pointers are
// not 16-byte aligned), one at a time for the rest.
__device__ __forceinline__ float half_at(unsigned short v, int bf) { return bf ? bf2f(v) : h2f(v); }

extern "C" __global__ void silu_mul_hh(const unsigned short* g, const unsigned short* u, unsigned short* y, long n,
                                       long n8, int bf) {
    pdl_begin();
    GRID_LOOP(i, n8) {
        uint4 a = ((const uint4*)g)[i], b = ((const uint4*)u)[i];
        const unsigned short* ah = (const unsigned short*)&a;
        const unsigned short* bh = (const unsigned short*)&b;
        uint4 r;
        unsigned short* rh = (unsigned short*)&r;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = silu1(half_at(ah[j], bf)) * half_at(bh[j], bf);
            rh[j] = bf ? f2bf(v) : f2h(v);
        }
        ((uint4*)y)[i] = r;
    }
    GRID_LOOP(i, n - n8 * 8) {
        long j = n8 * 8 + i;
        float v = silu1(half_at(g[j], bf)) * half_at(u[j], bf);
        y[j] = bf ? f2bf(v) : f2h(v);
    }
}

// silu_mul_f32 that also writes y as Q8_0 blocks (qs: n int8, ds: n / 32 scale pairs) for the
// next Linear with quantized activations, with the arithmetic of quantize_q8_f32. n % 32 == 0
// and blockDim % 32 == 0, so every warp takes whole 32-value blocks in each step.
extern "C" __global__ void silu_mul_q8_f32(const float* g, const float* u, float* y, long n, signed char* qs,
                                           float2* ds) {
    pdl_begin();
    int lane = threadIdx.x & 31;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float v = silu1(g[i]) * u[i];
        y[i] = v;
        float amax = fabsf(v);
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float d = amax / 127.0f;
        int q = q8_of(v, d != 0.0f ? 1.0f / d : 0.0f);
        qs[i] = (signed char)q;
        int s = q;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) ds[i >> 5] = q8_scales(d, s);
    }
}

// GPT-OSS's clamped SwiGLU: y = (clamp(u, -limit, limit) + 1) · g'·σ(alpha·g'), g' = min(g, limit)
extern "C" __global__ void clamped_swiglu_f32(const float* g, const float* u, float* y, long n, float alpha,
                                              float limit) {
    pdl_begin();
    GRID_LOOP(i, n) {
        float x = fminf(g[i], limit);
        float up = fminf(fmaxf(u[i], -limit), limit);
        y[i] = (up + 1.0f) * x / (1.0f + expf(-alpha * x));
    }
}
