// Row-wise f32 kernels, one block per row: RMSNorm, LayerNorm, Softmax.
// Sums are accumulated in f32 per thread, then reduced as a tree over the block.

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* y, int d, float eps) {
    const float* xr = x + (long)blockIdx.x * d;
    float* yr = y + (long)blockIdx.x * d;
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += xr[i] * xr[i];
    s = block_sum(s);
    float inv = rsqrtf(s / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

extern "C" __global__ void layernorm_f32(const float* x, const float* g, const float* b, float* y, int d, float eps) {
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
