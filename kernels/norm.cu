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
// once (the loop above reads each row twice, a few elements per thread at a time: a decode row
// of 4096 took ~15 us on one block).
#define RMS_V4 4

extern "C" __global__ void rmsnorm_v4_f32(const float* x, const float* w, float* y, int d, float eps) {
    int n4 = d >> 2;
    const float4* xr = (const float4*)(x + (long)blockIdx.x * d);
    float4* yr = (float4*)(y + (long)blockIdx.x * d);
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
        s += v[t].x * v[t].x + v[t].y * v[t].y + v[t].z * v[t].z + v[t].w * v[t].w;
    }
    s = block_sum(s);
    float inv = rsqrtf(s / (float)d + eps);
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = threadIdx.x + t * blockDim.x;
        if (i < n4)
            yr[i] = make_float4(v[t].x * inv * g[t].x, v[t].y * inv * g[t].y, v[t].z * inv * g[t].z,
                                v[t].w * inv * g[t].w);
    }
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
