// Shared helpers for every kernel file: number conversions without CUDA headers (NVRTC compiles
// these sources with no include path), warp/block reductions and weight-row element loads.
// Prepended to every other .cu file by src/devices/cuda/kernels.rs.

#define INF __int_as_float(0x7f800000)

// Programmatic dependent launch (compute capability >= 9.0). The host launches a kernel with
// the programmatic-serialization attribute only when its PTX contains `griddepcontrol.wait`
// (src/devices/cuda/gpu.rs), so its blocks may already run while the previous kernel on the
// stream finishes. pdl_wait() blocks until that kernel has completed and its writes are
// visible: every kernel calls it before reading anything another kernel wrote and before
// writing anything (a GEMV may load its weights, which no kernel writes, before it).
// pdl_launch() lets the next kernel's blocks start early (pdl_begin / pdl_gemv_begin below). Both are no-ops on older GPUs and in launches without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Every kernel lets its successor start before its own wait. A chain of kernels may then be
// resident at once, each waiting for its predecessor, and a kernel may start before the one two
// back has completed: so no kernel reads anything but weights (which no kernel writes) and
// writes nothing before its wait; every kernel here keeps to that (the GEMVs and norms load
// weights, the others start with the wait). It cannot starve a kernel of multiprocessors: a
// successor is launched only once every block of its predecessor has started.

// Start of a kernel that reads no data before waiting for its predecessor.
__device__ __forceinline__ void pdl_begin() {
    pdl_launch();
    pdl_wait();
}

// The wait of a GEMV, after it has issued its first weight loads.
__device__ __forceinline__ void pdl_gemv_begin() {
    pdl_launch();
    pdl_wait();
}

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

// Q8_0 quantization (llama.cpp's quantize_row_q8_0 and the CPU reference): a 32-value block
// with d = amax / 127 stores q = round-half-even(v / d) clamped to ±127, and (d as f16, d · Σq).
// q8_of: one value given 1 / d (0 for an all-zero block); q8_scales: the stored pair.
__device__ __forceinline__ int q8_of(float v, float id) {
    return max(-127, min(127, __float2int_rn(v * id)));
}

__device__ __forceinline__ float2 q8_scales(float d, int sum_q) {
    unsigned short h;
    asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(d));
    float dst = h2f(h);
    return make_float2(dst, dst * (float)sum_q);
}

// Weight dtype codes (fastllm numbering, as in src/data.rs).
#define DT_F32 0
#define DT_BF16 1
#define DT_Q8_0 3
#define DT_Q4_0 4
#define DT_F16 7
#define DT_Q4_1 8
#define DT_Q5_0 33
#define DT_Q4_K 30
#define DT_Q5_K 31
#define DT_Q6_K 32
#define DT_Q2_K 34
#define DT_Q3_K 35
#define KQ_BYTES(DT) \
    ((DT) == DT_Q4_K ? 144 : ((DT) == DT_Q5_K ? 176 : ((DT) == DT_Q2_K ? 84 : ((DT) == DT_Q3_K ? 110 : 210))))
#define IS_KQ(DT) ((DT) == DT_Q2_K || (DT) == DT_Q3_K || (DT) == DT_Q4_K || (DT) == DT_Q5_K || (DT) == DT_Q6_K)

// The 6-bit scale and min of sub-block j (0..8) of a Q4_K/Q5_K super-block from its 12 packed
// bytes q (layout in cpu/src/kquant.rs).
__device__ __forceinline__ void kq_scale_min(int j, const unsigned char* q, int& sc, int& mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Values 8l..8l+7 (l in 0..32) of one K-quant super-block blk of dtype DT, dequantized.
template <int DT>
__device__ __forceinline__ void kq_load8(const unsigned char* blk, int l, float* w) {
    if (DT == DT_Q2_K || DT == DT_Q3_K) {
        // Q2_K / Q3_K (layouts in cpu/src/kquant_low.rs): the 8 values share one group of 16 and
        // one 2-bit plane (shift 2·(i / 32)) of qs bytes 32h + o ..
        int e0 = 8 * l, h = e0 >> 7, i = e0 & 127, o = i & 31, g = e0 >> 4, sh = 2 * (i >> 5);
        if (DT == DT_Q2_K) {
            const unsigned char* qs = blk + 16 + 32 * h + o;
            int sc = blk[g];
            float s = h2f(ld_u16(blk + 80)) * (float)(sc & 15), m = h2f(ld_u16(blk + 82)) * (float)(sc >> 4);
#pragma unroll
            for (int u = 0; u < 8; u++) w[u] = __fsub_rn(__fmul_rn(s, (float)((qs[u] >> sh) & 3)), m);
        } else {
            const unsigned char* qs = blk + 32 + 32 * h + o;
            const unsigned char* sc = blk + 96;
            int lo = (sc[g & 7] >> (4 * (g >> 3))) & 15, hi = (sc[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
            float s = h2f(ld_u16(blk + 108)) * (float)((lo | (hi << 4)) - 32);
            int hb = e0 >> 5;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int q = ((qs[u] >> sh) & 3) | (((blk[o + u] >> hb) & 1) << 2);
                w[u] = s * (float)(q - 4);
            }
        }
    } else if (DT == DT_Q6_K) {
        int e0 = 8 * l, h = e0 >> 7, i = e0 & 127, g = i >> 5, o = i & 31;
        const unsigned char* ql = blk + 64 * h + ((g & 1) ? 32 : 0) + o;
        const unsigned char* qh = blk + 128 + 32 * h + o;
        int sh = g >= 2 ? 4 : 0;
        float s = h2f(ld_u16(blk + 208)) * (float)(signed char)blk[192 + (e0 >> 4)];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int q = ((ql[u] >> sh) & 15) | (((qh[u] >> (2 * g)) & 3) << 4);
            w[u] = s * (float)(q - 32);
        }
    } else {
        int j = l >> 2, o = 8 * (l & 3), sc, mn;
        kq_scale_min(j, blk + 4, sc, mn);
        float s = h2f(ld_u16(blk)) * (float)sc, m = h2f(ld_u16(blk + 2)) * (float)mn;
        const unsigned char* qs = blk + (DT == DT_Q5_K ? 48 : 16) + 32 * (j >> 1) + o;
        int sh = 4 * (j & 1);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int q = (qs[u] >> sh) & 15;
            if (DT == DT_Q5_K) q |= ((blk[16 + o + u] >> j) & 1) << 4;
            w[u] = __fsub_rn(__fmul_rn(s, (float)q), m);  // no FMA: bit-equal to the CPU's
        }
    }
}

// Element i of a packed weight row of dtype DT.
template <int DT>
__device__ __forceinline__ float load_w(const unsigned char* row, long i) {
    if (DT == DT_F32) return ((const float*)row)[i];
    if (DT == DT_F16) return h2f(((const unsigned short*)row)[i]);
    if (DT == DT_BF16) return bf2f(((const unsigned short*)row)[i]);
    if (DT == DT_Q5_0) {
        const unsigned char* blk = row + (i >> 5) * 22;
        int j = (int)(i & 31);
        unsigned int qh = (unsigned int)ld_u16(blk + 2) | ((unsigned int)ld_u16(blk + 4) << 16);
        unsigned char q = blk[6 + (j & 15)];
        int v = (j < 16 ? (q & 15) : (q >> 4)) | (int)(((qh >> j) & 1) << 4);
        return h2f(ld_u16(blk)) * (float)(v - 16);
    }
    if (IS_KQ(DT)) {
        float w[8];
        kq_load8<DT>(row + (i >> 8) * KQ_BYTES(DT), (int)((i & 255) >> 3), w);
        return w[i & 7];
    }
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

// f32 -> IEEE half / bfloat16 bits, round to nearest even (the casts of the tensor-core path and
// the f16/bf16 copies the producer ops write for it; one rounding, so both give the same bits).
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (unsigned short)(u >> 16);
}

// Four floats as f16 (bf = 0) or bf16 (bf = 1), packed for one 8-byte store.
__device__ __forceinline__ uint2 half4_of(float4 v, int bf) {
    unsigned int a = bf ? f2bf(v.x) : f2h(v.x), b = bf ? f2bf(v.y) : f2h(v.y);
    unsigned int c = bf ? f2bf(v.z) : f2h(v.z), d = bf ? f2bf(v.w) : f2h(v.w);
    return make_uint2(a | (b << 16), c | (d << 16));
}

// ---- rotary embedding of one pair (shared by rotary_f32 and the fused decode attention) ----
// The rotated pair (a, b) by the angle with cosine c and sine s: (a·c − b·s, b·c + a·s), each
// product rounded on its own (no fused multiply-add, as the CPU reference), so every kernel
// that rotates gives the same bits.
__device__ __forceinline__ float rope_first(float a, float b, float c, float s) {
    return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}
__device__ __forceinline__ float rope_second(float a, float b, float c, float s) {
    return __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// Value d of head row x (hd values) after the rotation of its first `rot` dims, the angles of
// pair i at cosv[i], sinv[i]; style 0 pairs (i, i + rot/2), style 1 pairs (2i, 2i + 1).
__device__ __forceinline__ float rope_value(const float* x, int d, int rot, int style, const float* cosv,
                                            const float* sinv) {
    if (d >= rot) return x[d];
    int half = rot / 2;
    int i = style == 0 ? (d < half ? d : d - half) : d >> 1;
    int ia = style == 0 ? i : 2 * i, ib = style == 0 ? i + half : 2 * i + 1;
    float a = x[ia], b = x[ib], c = cosv[i], s = sinv[i];
    return d == ia ? rope_first(a, b, c, s) : rope_second(a, b, c, s);
}

// Attention sinks (GPT-OSS): a logit per head that joins each softmax's denominator as a key
// without a value. att_sink: head h's sink, or -INF without sinks. att_inv: 1 / (l + e^(sink − m))
// for scores of max m and Σ e^(s − m) = l; 0 when no key was seen or the sink outweighs the keys
// beyond f32 range.
__device__ __forceinline__ float att_sink(const float* sinks, long h) { return sinks ? sinks[h] : -INF; }
__device__ __forceinline__ float att_inv(float l, float m, float sink) {
    if (m > -INF && sink > -INF) l += expf(sink - m);
    return (l > 0.0f && l < INF) ? 1.0f / l : 0.0f;
}
