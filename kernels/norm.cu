// Row-wise f32 kernels, one block per row: RMSNorm, LayerNorm, Softmax.
// Sums are accumulated in f32 per thread, then reduced as a tree over the block.

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* y, int d, float eps) {
    pdl_begin();
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += xr[i] * xr[i];
    s = block_sum(s);
    float inv = rsqrtf(s / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// RMSNorm for rows of d % 4 == 0 floats (16-byte aligned), d <= 4 * RMS_V4 * blockDim.x: each
// thread keeps its RMS_V4 float4s in registers, so x is read once with every load in flight at
// once (the loop above reads each row twice, a few elements per thread at a time, which leaves
// one block slow on a decode row of 4096).
#define RMS_V4 4

// Q8_0 quantization of 4 values held by each of 8 consecutive lanes (one 32-value block), the
// arithmetic of quantize_q8_f32 (q8_of, q8_scales), so the rows are bit-identical to quantizing
// the output afterwards: the 4 int8 packed in *q4 and the block's scale pair in *dsb.
__device__ __forceinline__ void quant8x4(float4 o, unsigned int* q4, float2* dsb) {
    float amax = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
    for (int m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int a = q8_of(o.x, id), b = q8_of(o.y, id), c = q8_of(o.z, id), e = q8_of(o.w, id);
    int s = a + b + c + e;
    for (int m = 1; m < 8; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    *q4 = (unsigned int)(a & 255) | ((unsigned int)(b & 255) << 8) | ((unsigned int)(c & 255) << 16) |
          ((unsigned int)(e & 255) << 24);
    *dsb = q8_scales(d, s);
}

// COPY 1: also write the output as Q8_0 rows (qs: d int8 per row, ds: d / 32 scale pairs per
// row) for the next Linear with quantized activations; then d % 32 == 0 and blockDim % 32 == 0,
// so the 8 lanes holding a 32-value block are consecutive in one warp. COPY 2: also write it as
// f16 (bf = 0) or bf16 (bf = 1) rows at hs (d per row) for the next tensor-core Linear.
//
// ADD: first add the residual r (bdt 0: f32 rows, 1: f16, 2: bf16, 4 values at a time) into x
// and store the sum back, then normalize the sum: addto_f32's x + 1·r, so the result is the bits
// of AddTo followed by RMSNorm.
// Four f16 (bdt 1) or bf16 (bdt 2) values packed in u, as floats.
__device__ __forceinline__ float4 float4_of_half4(uint2 u, int bdt) {
    unsigned short h[4] = {(unsigned short)(u.x & 0xffff), (unsigned short)(u.x >> 16),
                           (unsigned short)(u.y & 0xffff), (unsigned short)(u.y >> 16)};
    if (bdt == 1) return make_float4(h2f(h[0]), h2f(h[1]), h2f(h[2]), h2f(h[3]));
    return make_float4(bf2f(h[0]), bf2f(h[1]), bf2f(h[2]), bf2f(h[3]));
}

__device__ __forceinline__ float4 load4_of(const void* r, long i, int bdt) {
    if (bdt == 0) return ((const float4*)r)[i];
    return float4_of_half4(((const uint2*)r)[i], bdt);
}

// The residual rmsnorm_v4_t adds: none, or r's rows (bdt as load4_of takes).
struct NoResid {
    static constexpr bool on = false;
    __device__ __forceinline__ float4 operator()(long) const { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
};

struct LocalResid {
    static constexpr bool on = true;
    const void* r;
    int bdt;
    __device__ __forceinline__ float4 operator()(long i4) const { return load4_of(r, i4, bdt); }
};

// Float4 i of row `row`'s normalized output (stored where `in`, else only the shuffles): v * inv *
// g into y and its copies (COPY as rmsnorm_v4_t). Every lane of the warp calls it (quant8x4).
template <int COPY>
__device__ __forceinline__ void rms_store(long row, int i, bool in, float4 v, float4 g, float inv, float* y, int d,
                                          signed char* qs, float2* ds, uint2* hs, int bf) {
    int n4 = d >> 2;
    float4 o = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
    unsigned int q4 = 0;
    float2 sc;
    if (COPY == 1) quant8x4(o, &q4, &sc);
    if (in) {
        ((float4*)(y + row * d))[i] = o;
        if (COPY == 1) {
            ((unsigned int*)(qs + row * d))[i] = q4;
            if ((i & 7) == 0) ds[row * (d >> 5) + (i >> 3)] = sc;
        }
        if (COPY == 2) hs[row * n4 + i] = half4_of(o, bf);
    }
}

// Float4s i0 + threadIdx.x + t * blockDim.x (t < RMS_V4, those below i1 stored) of row `row`'s
// normalized output, v[t] scaled by inv and g[t] (rms_store each).
template <int COPY>
__device__ __forceinline__ void rms_store_v4(long row, int i0, int i1, const float4 v[RMS_V4], const float4 g[RMS_V4],
                                             float inv, float* y, int d, signed char* qs, float2* ds, uint2* hs,
                                             int bf) {
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = i0 + threadIdx.x + t * blockDim.x;
        rms_store<COPY>(row, i, i < i1, v[t], g[t], inv, y, d, qs, ds, hs, bf);
    }
}

// The sum of the squares of v's four values (in order).
__device__ __forceinline__ float sq4(float4 v) {
    return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
}

// Row `row` of x normalized into y (and its copies); with a residual (Resid::on), res(i) (the
// i-th 4 values of the row's residual, counted from the tensor's start) is added into x first.
template <int COPY, class Resid>
__device__ __forceinline__ void rmsnorm_v4_t(long row, float* x, const float* w, float* y, int d, float eps,
                                             signed char* qs, float2* ds, uint2* hs, int bf, Resid res) {
    int n4 = d >> 2;
    float4* xr = (float4*)(x + row * d);
    const float4* w4 = (const float4*)w;
    // the norm weight (no kernel writes it) is loaded before waiting for the kernel that wrote x
    float4 g[RMS_V4];
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = threadIdx.x + t * blockDim.x;
        g[t] = i < n4 ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    pdl_begin();
    float4 v[RMS_V4];
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = threadIdx.x + t * blockDim.x;
        v[t] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (Resid::on && i < n4) {
            float4 a = res(row * n4 + i);
            v[t] = make_float4(v[t].x + 1.0f * a.x, v[t].y + 1.0f * a.y, v[t].z + 1.0f * a.z,
                               v[t].w + 1.0f * a.w);
            xr[i] = v[t];
        }
        s += sq4(v[t]);
    }
    s = block_sum(s);
    rms_store_v4<COPY>(row, 0, n4, v, g, rsqrtf(s / (float)d + eps), y, d, qs, ds, hs, bf);
}

extern "C" __global__ void rmsnorm_v4_f32(float* x, const float* w, float* y, int d, float eps) {
    rmsnorm_v4_t<0>(blockIdx.x, x, w, y, d, eps, 0, 0, 0, 0, NoResid{});
}

extern "C" __global__ void rmsnorm_v4q_f32(float* x, const float* w, float* y, int d, float eps,
                                           signed char* qs, float2* ds) {
    rmsnorm_v4_t<1>(blockIdx.x, x, w, y, d, eps, qs, ds, 0, 0, NoResid{});
}

extern "C" __global__ void rmsnorm_v4h_f32(float* x, const float* w, float* y, int d, float eps,
                                           uint2* hs, int bf) {
    rmsnorm_v4_t<2>(blockIdx.x, x, w, y, d, eps, 0, 0, hs, bf, NoResid{});
}

// x += r, then y = RMSNorm(x) (and the copies above): the residual add fused into the next norm.
extern "C" __global__ void addrmsnorm_v4_f32(float* x, const float* w, float* y, int d, float eps,
                                             const void* r, int bdt) {
    rmsnorm_v4_t<0>(blockIdx.x, x, w, y, d, eps, 0, 0, 0, 0, LocalResid{r, bdt});
}

extern "C" __global__ void addrmsnorm_v4q_f32(float* x, const float* w, float* y, int d, float eps,
                                              const void* r, int bdt, signed char* qs, float2* ds) {
    rmsnorm_v4_t<1>(blockIdx.x, x, w, y, d, eps, qs, ds, 0, 0, LocalResid{r, bdt});
}

extern "C" __global__ void addrmsnorm_v4h_f32(float* x, const float* w, float* y, int d, float eps,
                                              const void* r, int bdt, uint2* hs, int bf) {
    rmsnorm_v4_t<2>(blockIdx.x, x, w, y, d, eps, 0, 0, hs, bf, LocalResid{r, bdt});
}

extern "C" __global__ void layernorm_f32(const float* x, const float* g, const float* b, float* y, int d, float eps) {
    pdl_begin();
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += xr[i];
    float mean = block_sum(s) / (float)d;
    float v = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float t = xr[i] - mean;
        v += t * t;
    }
    float inv = rsqrtf(block_sum(v) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = (xr[i] - mean) * inv * g[i] + b[i];
}

extern "C" __global__ void softmax_f32(const float* x, float* y, int d) {
    pdl_begin();
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float m = -INF;
    for (int i = threadIdx.x; i < d; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = block_max(m);
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += expf(xr[i] - m);
    float inv = 1.0f / block_sum(s);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
}

