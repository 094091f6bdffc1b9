// Linear y[m, n] = x[m, k] · W[n, k]ᵀ + b, f32 activations, any weight dtype, dequantized in
// registers. One warp per output feature j and up to LIN_ROWS activation rows, so each weight
// byte is read once per LIN_ROWS rows (decode: m = 1, the weight stream is the whole cost).
// Block: 256 threads = 8 features; grid (ceil(n / 8), ceil(m / LIN_ROWS)).

#define LIN_ROWS 4

template <int DT>
__device__ __forceinline__ void dot_block(const unsigned char* row, long b, const float* x, long k, int nr, float* acc) {
    // block b (32 elements) of the weight row against rows x[r * k + b*32 ..]
    float w[32];
    if (DT == DT_Q8_0) {
        const unsigned char* blk = row + b * 34;
        float d = h2f(ld_u16(blk));
#pragma unroll
        for (int j = 0; j < 32; j++) w[j] = d * (float)(signed char)blk[2 + j];
    } else if (DT == DT_Q4_0) {
        const unsigned char* blk = row + b * 18;
        float d = h2f(ld_u16(blk));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            unsigned char q = blk[2 + j];
            w[j] = d * (float)((int)(q & 15) - 8);
            w[j + 16] = d * (float)((int)(q >> 4) - 8);
        }
    } else {
        const unsigned char* blk = row + b * 20;
        float d = h2f(ld_u16(blk)), mn = h2f(ld_u16(blk + 2));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            unsigned char q = blk[4 + j];
            w[j] = d * (float)(q & 15) + mn;
            w[j + 16] = d * (float)(q >> 4) + mn;
        }
    }
#pragma unroll
    for (int r = 0; r < LIN_ROWS; r++) {
        if (r < nr) {
            const float4* xv = (const float4*)(x + r * k + b * 32);
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float4 t = xv[j];
                s += w[4 * j] * t.x + w[4 * j + 1] * t.y + w[4 * j + 2] * t.z + w[4 * j + 3] * t.w;
            }
            acc[r] += s;
        }
    }
}

template <int DT>
__device__ void linear_t(const float* x, const unsigned char* w, const float* bias, float* y,
                         int m, int n, int k, long row_bytes) {
    int lane = threadIdx.x & 31;
    int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int r0 = blockIdx.y * LIN_ROWS;
    if (j >= n) return;
    int nr = min(LIN_ROWS, m - r0);
    const float* xr = x + (long)r0 * k;
    const unsigned char* row = w + (long)j * row_bytes;
    float acc[LIN_ROWS];
#pragma unroll
    for (int r = 0; r < LIN_ROWS; r++) acc[r] = 0.0f;
    if (DT == DT_Q8_0 || DT == DT_Q4_0 || DT == DT_Q4_1) {
        long nb = k / 32;
        for (long b = lane; b < nb; b += 32) dot_block<DT>(row, b, xr, k, nr, acc);
    } else {
        for (long i = lane; i < k; i += 32) {
            float wv = load_w<DT>(row, i);
#pragma unroll
            for (int r = 0; r < LIN_ROWS; r++)
                if (r < nr) acc[r] += wv * xr[r * (long)k + i];
        }
    }
#pragma unroll
    for (int r = 0; r < LIN_ROWS; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < nr) y[(long)(r0 + r) * n + j] = s + (bias ? bias[j] : 0.0f);
    }
}

#define LIN(name, DT) \
    extern "C" __global__ void linear_##name(const float* x, const unsigned char* w, const float* bias, float* y, \
                                             int m, int n, int k, long rb) { \
        linear_t<DT>(x, w, bias, y, m, n, k, rb); \
    }
LIN(f32, DT_F32)
LIN(f16, DT_F16)
LIN(bf16, DT_BF16)
LIN(q8_0, DT_Q8_0)
LIN(q4_0, DT_Q4_0)
LIN(q4_1, DT_Q4_1)

// y[r, j] += b[j] (bias after a cuBLAS product)
extern "C" __global__ void addbias_f32(float* y, const float* b, long rows, long n) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < rows * n; i += (long)gridDim.x * blockDim.x)
        y[i] += b[i % n];
}
