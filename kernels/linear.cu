// Linear y[m, n] = x[m, k] · W[n, k]ᵀ + b, f32 activations, any weight dtype, dequantized in
// registers. One warp per output feature j and up to LIN_ROWS activation rows, so each weight
// byte is read once per LIN_ROWS rows (decode: m = 1, the weight stream is the whole cost).
// Block: 256 threads = 8 features; grid (ceil(n / 8), ceil(m / LIN_ROWS)). The `gemv*_` kernels
// are the one-row instances (R = 1). Every GEMV issues its first weight loads before
// pdl_gemv_begin() (common.cuh): weights are never written by a kernel.

#define LIN_ROWS 4

// Up to three weights of the same dtype and k sharing one input (e.g. the q, k and v
// projections): rows 0..n[0] of the launch are weight 0's, the next n[1] weight 1's, then
// weight 2's, each with its own bias (or null) and output [m, n[i]]. One launch streams them all.
// acc != 0: the products are added to the outputs (y += x·Wᵀ + b, a residual connection).
// The batched block products (linear_mma, linear_mmq) also read tiles and splits: weight i's
// rows take tiles[i] blocks of the grid's x (each weight starts a new block, see seg_tile) and
// are split along k into splits[i] parts, the split its product alone would have (so a
// multi-weight launch sums exactly as the separate launches do); the GEMV kernels ignore them.
struct LinSegs {
    const unsigned char* w[3];
    const float* b[3];
    float* y[3];
    int n[3];
    int acc;
    int tiles[3];
    int splits[3];
    const P2pCtx* p2p;  // one-row kernels: also push each output to the group's peers (p2p_ll_push)
    int p2p_ek;         // the epoch offset of the reduction those pushes are for
};

// A block of a batched block product: its weight rows [row0, rend) of the launch (rend: the end
// of its weight's rows) and its weight's k splits.
struct SegTile {
    int row0, rend, splits;
};

// The block bx (grid x) of a batched product with `rows` weight rows per block.
__device__ __forceinline__ SegTile seg_tile(const LinSegs& sg, int rows, int bx) {
    int base = 0;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (bx < sg.tiles[i]) return SegTile{base + bx * rows, base + sg.n[i], sg.splits[i]};
        bx -= sg.tiles[i];
        base += sg.n[i];
    }
    return SegTile{base + bx * rows, base + sg.n[2], sg.splits[2]};
}

// The segment of launch row JG: its weight w, bias, output y, row count n and row j within it.
#define SEG_PICK(JG)                                                          \
    int j = (JG), si = 0;                                                     \
    if (j >= sg.n[0]) {                                                       \
        j -= sg.n[0];                                                         \
        si = 1;                                                               \
        if (j >= sg.n[1]) {                                                   \
            j -= sg.n[1];                                                     \
            si = 2;                                                           \
        }                                                                     \
    }                                                                         \
    const unsigned char* w = si == 0 ? sg.w[0] : (si == 1 ? sg.w[1] : sg.w[2]); \
    const float* bias = si == 0 ? sg.b[0] : (si == 1 ? sg.b[1] : sg.b[2]);    \
    float* y = si == 0 ? sg.y[0] : (si == 1 ? sg.y[1] : sg.y[2]);             \
    int n = si == 0 ? sg.n[0] : (si == 1 ? sg.n[1] : sg.n[2]);

// Four consecutive weights 4p..4p+3 of block b (p in 0..8), dequantized. Eight lanes share a
// block, so a warp reads 4 neighbouring blocks and 512 contiguous bytes of x per step.
template <int DT>
__device__ __forceinline__ void load4(const unsigned char* row, long b, int p, float* w) {
    if (DT == DT_Q4_1) {
        const unsigned char* blk = row + b * 20;
        unsigned int dm = *(const unsigned int*)blk;
        float d = h2f((unsigned short)(dm & 0xffff)), mn = h2f((unsigned short)(dm >> 16));
        unsigned int q = *(const unsigned int*)(blk + 4 + 4 * (p & 3));
        int sh = p < 4 ? 0 : 4;
#pragma unroll
        for (int u = 0; u < 4; u++) w[u] = d * (float)((q >> (8 * u + sh)) & 15) + mn;
    } else if (DT == DT_Q4_0) {
        const unsigned short* hs = (const unsigned short*)(row + b * 18);
        float d = h2f(hs[0]);
        int t = p & 3;
        unsigned int q = (unsigned int)hs[1 + 2 * t] | ((unsigned int)hs[2 + 2 * t] << 16);
        int sh = p < 4 ? 0 : 4;
#pragma unroll
        for (int u = 0; u < 4; u++) w[u] = d * (float)((int)((q >> (8 * u + sh)) & 15) - 8);
    } else {
        const unsigned short* hs = (const unsigned short*)(row + b * 34);
        float d = h2f(hs[0]);
        unsigned int q = (unsigned int)hs[1 + 2 * p] | ((unsigned int)hs[2 + 2 * p] << 16);
#pragma unroll
        for (int u = 0; u < 4; u++) w[u] = d * (float)(signed char)((q >> (8 * u)) & 0xff);
    }
}

// acc[r] += 8 f16/bf16 weights (one 16-byte load, elements 8v..8v+7) · x row r.
template <int DT, int R>
__device__ __forceinline__ void dot8(uint4 q, const float* xr, int k, int v, int nr, float* acc) {
    unsigned int u[4] = {q.x, q.y, q.z, q.w};
    float w[8];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        if (DT == DT_F16) {
            w[2 * t] = h2f((unsigned short)(u[t] & 0xffff));
            w[2 * t + 1] = h2f((unsigned short)(u[t] >> 16));
        } else {
            w[2 * t] = bf2f((unsigned short)(u[t] & 0xffff));
            w[2 * t + 1] = bf2f((unsigned short)(u[t] >> 16));
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r < nr) {
            const float4* xv = (const float4*)(xr + r * (long)k) + 2 * v;
            float4 a = xv[0], b = xv[1];
            acc[r] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w +
                      w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
        }
    }
}

// The f16/bf16 row dot products of one warp over nv uint4s of weights at wr: lane l takes
// uint4s l, l + 32, ... in groups of U loads, a group in flight at once, the first issued before
// waiting for the kernel that wrote x (pdl_wait), so the weight stream starts while it
// finishes; the row's last group is predicated, so no load waits alone. The sums run in the
// order of the one-load loop (uint4 by uint4 per lane).
template <int DT, int R, int U>
__device__ __forceinline__ void gemv_half_groups(const uint4* wr, int nv, const float* xr, int k, int nr,
                                                 float* acc, int lane) {
    uint4 q[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        int i = lane + 32 * u;
        q[u] = i < nv ? __ldg(wr + i) : make_uint4(0, 0, 0, 0);
    }
    pdl_gemv_begin();
    for (int vb = 0;;) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = vb + lane + 32 * u;
            if (i < nv) dot8<DT, R>(q[u], xr, k, i, nr, acc);
        }
        vb += 32 * U;
        if (vb >= nv) break;
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = vb + lane + 32 * u;
            q[u] = i < nv ? __ldg(wr + i) : make_uint4(0, 0, 0, 0);
        }
    }
}

// R: activation rows per block (LIN_ROWS, or 1 for the decode GEMV `gemv*_`, which then
// needs fewer registers, so more blocks are resident and n = 4096 fits in one wave).
// MULTI = false: one weight (segment 0 only), without the per-warp segment selection (the
// selection costs the plain f16 GEMV bandwidth).
template <int DT, bool MULTI, int R>
__device__ void linear_t(const float* x, const LinSegs& sg, int m, int ntot, int k, long row_bytes) {
    int lane = threadIdx.x & 31;
    int jg = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int r0 = blockIdx.y * R;
    if (jg >= ntot) return;
    int j = jg;
    const unsigned char* w = sg.w[0];
    const float* bias = sg.b[0];
    float* y = sg.y[0];
    int n = sg.n[0];
    if (MULTI && j >= sg.n[0]) {
        j -= sg.n[0];
        if (j < sg.n[1]) {
            w = sg.w[1];
            bias = sg.b[1];
            y = sg.y[1];
            n = sg.n[1];
        } else {
            j -= sg.n[1];
            w = sg.w[2];
            bias = sg.b[2];
            y = sg.y[2];
            n = sg.n[2];
        }
    }
    int nr = min(R, m - r0);
    const float* xr = x + (long)r0 * k;
    const unsigned char* row = w + (long)j * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    if (DT == DT_Q8_0 || DT == DT_Q4_0 || DT == DT_Q4_1) {
        pdl_gemv_begin();
        long nb = k / 32;
        int p = lane & 7;
        for (long b = lane >> 3; b < nb; b += 4) {
            float w[4];
            load4<DT>(row, b, p, w);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nr) {
                    float4 t = *(const float4*)(xr + r * (long)k + b * 32 + 4 * p);
                    acc[r] += w[0] * t.x + w[1] * t.y + w[2] * t.z + w[3] * t.w;
                }
            }
        }
    } else if (IS_KQ(DT)) {
        // one super-block (256 values) per warp step, 8 consecutive values per lane
        pdl_gemv_begin();
        long nsb = k / 256;
        for (long sb = 0; sb < nsb; sb++) {
            float w[8];
            kq_load8<DT>(row + sb * KQ_BYTES(DT), lane, w);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < nr) {
                    const float4* xv = (const float4*)(xr + r * (long)k + sb * 256 + 8 * lane);
                    float4 a = xv[0], b = xv[1];
                    acc[r] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w +
                              w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
                }
            }
        }
    } else if ((DT == DT_F16 || DT == DT_BF16) && (k & 7) == 0 &&
               ((((unsigned long)row) | ((unsigned long)xr)) & 15) == 0) {
        // 16-byte loads: each lane takes 8 consecutive weights, a warp 512 contiguous bytes of
        // the row per load, four loads per lane in flight
        gemv_half_groups<DT, R, 4>((const uint4*)row, k >> 3, xr, k, nr, acc, lane);
    } else {
        pdl_gemv_begin();
        for (long i = lane; i < k; i += 32) {
            float wv = load_w<DT>(row, i);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < nr) acc[r] += wv * xr[r * (long)k + i];
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < nr) {
            float* yo = y + (long)(r0 + r) * n + j;
            float val = (sg.acc ? *yo : 0.0f) + s + (bias ? bias[j] : 0.0f);
            *yo = val;
            if (sg.p2p) p2p_ll_push(sg.p2p, sg.p2p_ek, (long)(r0 + r) * n + j, val);
        }
    }
}

// The one-row (decode) kernels promise at least GEMV_MIN_BLOCKS resident blocks per SM, which
// caps their registers (4: 64 per thread).
#define GEMV_MIN_BLOCKS 4

#define LIN(name, DT) \
    extern "C" __global__ void linear_##name(const float* x, LinSegs sg, int m, int ntot, int k, long rb) { \
        linear_t<DT, true, LIN_ROWS>(x, sg, m, ntot, k, rb); \
    } \
    extern "C" __global__ void linear1_##name(const float* x, LinSegs sg, int m, int ntot, int k, long rb) { \
        linear_t<DT, false, LIN_ROWS>(x, sg, m, ntot, k, rb); \
    } \
    extern "C" __global__ void __launch_bounds__(256, GEMV_MIN_BLOCKS) \
        gemv_##name(const float* x, LinSegs sg, int m, int ntot, int k, long rb) { \
        linear_t<DT, true, 1>(x, sg, 1, ntot, k, rb); \
    } \
    extern "C" __global__ void __launch_bounds__(256, GEMV_MIN_BLOCKS) \
        gemv1_##name(const float* x, LinSegs sg, int m, int ntot, int k, long rb) { \
        linear_t<DT, false, 1>(x, sg, 1, ntot, k, rb); \
    }
LIN(f32, DT_F32)
LIN(f16, DT_F16)
LIN(bf16, DT_BF16)
LIN(q8_0, DT_Q8_0)
LIN(q4_0, DT_Q4_0)
LIN(q4_1, DT_Q4_1)
LIN(q5_0, DT_Q5_0)
LIN(q4_k, DT_Q4_K)
LIN(q5_k, DT_Q5_K)
LIN(q6_k, DT_Q6_K)
LIN(q2_k, DT_Q2_K)
LIN(q3_k, DT_Q3_K)

// y[r, j] += b[j] (bias after a cuBLAS product)
extern "C" __global__ void addbias_f32(float* y, const float* b, long rows, long n) {
    pdl_begin();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < rows * n; i += (long)gridDim.x * blockDim.x)
        y[i] += b[i % n];
}

// ---- quant_act = 1: activations quantized to Q8_0 blocks, integer block dots ----
// quantize_q8_f32: one warp per 32-value block (lane = element), like llama.cpp's
// quantize_row_q8_0 and the CPU reference: d = amax / 127 (stored as f16), q = round-half-even
// (x / d) clamped to ±127; ds[block] = (d as stored, d · Σq). qs: 32 int8 per block.

extern "C" __global__ void quantize_q8_f32(const float* x, signed char* qs, float2* ds, long nblocks) {
    pdl_begin();
    long b = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (b >= nblocks) return;
    float v = x[b * 32 + lane];
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 127.0f;
    int q = q8_of(v, d != 0.0f ? 1.0f / d : 0.0f);
    qs[b * 32 + lane] = (signed char)q;
    int s = q;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) ds[b] = q8_scales(d, s);
}

// Integer dot of weight block b against activation block (qs 32 int8, ds).
template <int DT>
__device__ __forceinline__ float qdot_block(const unsigned char* row, long b, const signed char* xq, float2 xd) {
    int isum = 0;
    if (DT == DT_Q8_0) {
        const unsigned char* blk = row + b * 34;
        for (int j = 0; j < 32; j++) isum += (int)(signed char)blk[2 + j] * (int)xq[j];
        return h2f(ld_u16(blk)) * xd.x * (float)isum;
    } else if (DT == DT_Q4_0) {
        const unsigned char* blk = row + b * 18;
        for (int j = 0; j < 16; j++) {
            unsigned char q = blk[2 + j];
            isum += ((int)(q & 15) - 8) * (int)xq[j] + ((int)(q >> 4) - 8) * (int)xq[j + 16];
        }
        return h2f(ld_u16(blk)) * xd.x * (float)isum;
    } else {
        const unsigned char* blk = row + b * 20;
        for (int j = 0; j < 16; j++) {
            unsigned char q = blk[4 + j];
            isum += (int)(q & 15) * (int)xq[j] + (int)(q >> 4) * (int)xq[j + 16];
        }
        return h2f(ld_u16(blk)) * xd.x * (float)isum + h2f(ld_u16(blk + 2)) * xd.y;
    }
}

// Same grid as linear_*: a warp per output feature, LIN_ROWS rows per block row.
template <int DT>
__device__ void linear_q8act_t(const signed char* xq, const float2* xd, const LinSegs& sg, int m, int ntot, int k,
                               long row_bytes) {
    int lane = threadIdx.x & 31;
    int jg = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int r0 = blockIdx.y * LIN_ROWS;
    if (jg >= ntot) return;
    SEG_PICK(jg)
    pdl_gemv_begin();
    int nr = min(LIN_ROWS, m - r0);
    long nb = k / 32;
    const unsigned char* row = w + (long)j * row_bytes;
    float acc[LIN_ROWS];
#pragma unroll
    for (int r = 0; r < LIN_ROWS; r++) acc[r] = 0.0f;
    for (long b = lane; b < nb; b += 32) {
#pragma unroll
        for (int r = 0; r < LIN_ROWS; r++) {
            if (r < nr) {
                long xb = (long)(r0 + r) * nb + b;
                acc[r] += qdot_block<DT>(row, b, xq + xb * 32, xd[xb]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < LIN_ROWS; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0 && r < nr) {
            float* yo = y + (long)(r0 + r) * n + j;
            float val = (sg.acc ? *yo : 0.0f) + s + (bias ? bias[j] : 0.0f);
            *yo = val;
            if (sg.p2p) p2p_ll_push(sg.p2p, sg.p2p_ek, (long)(r0 + r) * n + j, val);
        }
    }
}

#define LINQ(name, DT) \
    extern "C" __global__ void linear_q8act_##name(const signed char* xq, const float2* xd, LinSegs sg, int m, \
                                                   int ntot, int k, long rb) { \
        linear_q8act_t<DT>(xq, xd, sg, m, ntot, k, rb); \
    }
LINQ(q8_0, DT_Q8_0)
LINQ(q4_0, DT_Q4_0)
LINQ(q4_1, DT_Q4_1)

// ---- quant_act = 1 block-weight GEMV with 16-byte loads ("superblocks" of 8 blocks per lane) ----
// For k % 256 == 0 (and 16-byte aligned weight rows): 8 consecutive blocks of a row are
// 144 (Q4_0), 160 (Q4_1) or 272 (Q8_0) bytes, a multiple of 16, so a lane loads them with
// 9 / 10 / 17 independent 16-byte loads and dequantizes from registers. `lpr` lanes (4, 8, 16
// or 32, at most the superblocks per row) share a weight row, so short rows (k = 4096: 16
// superblocks) still keep every lane busy; a warp covers 32 / lpr rows, a 256-thread block
// 8 · 32 / lpr rows. Grid (ceil(n / rows per block), ceil(m / LIN_ROWS)).

template <int DT>
__device__ __forceinline__ constexpr int blk_bytes() {
    return DT == DT_Q4_0 ? 18 : (DT == DT_Q4_1 ? 20 : 34);
}

// The 32-bit word at even byte offset o of a register array (constant o after unrolling).
__device__ __forceinline__ unsigned int wat(const unsigned int* wd, int o) {
    int i = o >> 2;
    return (o & 3) ? __funnelshift_r(wd[i], wd[i + 1], 16) : wd[i];
}

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Loads superblock s (8 blocks) of `row` into wd (16-byte loads).
template <int DT>
__device__ __forceinline__ void load_sb(const unsigned char* row, long s, unsigned int* wd) {
    constexpr int NV = blk_bytes<DT>() * 8 / 16;
    const uint4* p = (const uint4*)(row + s * (long)(blk_bytes<DT>() * 8));
#pragma unroll
    for (int v = 0; v < NV; v++) {
        uint4 q = __ldg(p + v);
        wd[4 * v] = q.x;
        wd[4 * v + 1] = q.y;
        wd[4 * v + 2] = q.z;
        wd[4 * v + 3] = q.w;
    }
    wd[4 * NV] = 0;
}

// Integer block dots with dp4a against Q8_0 activations (quant_act = 1). `sx` (m = 1 only):
// the activation row was staged in shared memory by the caller, superblock s at
// sx[s * 17] (16 chunks of 16 bytes + 16 bytes of padding, so lanes 272 bytes apart hit
// distinct banks) and its scales at sxd[s * 9 + b].
// With `smx` (m = 1), the block stages the activation row into shared memory itself, after each
// lane has issued the loads of its first weight superblock (so the two latencies overlap).
// The dot of one weight block (at even byte offset o of the register words wd, dtype DT) with
// one Q8_0 activation block (32 int8 at xv, scales dx): integer dp4a sums, then the scales.
// Q4_0: Σ (q - 8)·x = Σ q·x - 8 Σ x, and dx.y = dx.x · Σ x.
template <int DT>
__device__ __forceinline__ float q8_block_dot(const unsigned int* wd, int o, const uint4* xv, float2 dx) {
    unsigned int hd = wat(wd, o);
    float d = h2f((unsigned short)(hd & 0xffff));
    uint4 a = xv[0], c = xv[1];
    unsigned int xw[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    int isum = 0;
    if (DT == DT_Q8_0) {
#pragma unroll
        for (int t = 0; t < 8; t++) isum = dp4a((int)wat(wd, o + 2 + 4 * t), (int)xw[t], isum);
        return d * dx.x * (float)isum;
    }
    const int qo = DT == DT_Q4_0 ? 2 : 4;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        unsigned int q = wat(wd, o + qo + 4 * t);
        isum = dp4a((int)(q & 0x0F0F0F0Fu), (int)xw[t], isum);
        isum = dp4a((int)((q >> 4) & 0x0F0F0F0Fu), (int)xw[4 + t], isum);
    }
    if (DT == DT_Q4_0) return d * (dx.x * (float)isum - 8.0f * dx.y);
    return d * dx.x * (float)isum + h2f((unsigned short)(hd >> 16)) * dx.y;
}

// acc[r] += superblock s of a weight row (in registers, wd) · activation row r0 + r (from the
// staged copy sx/sxd when given, else from global memory).
template <int DT, int R>
__device__ __forceinline__ void sb_dot(const unsigned int* wd, long s, const signed char* xq, const float2* xd,
                                       const uint4* sx, const float2* sxd, int r0, int nr, long nb, float* acc) {
    constexpr int BS = blk_bytes<DT>();
#pragma unroll
    for (int b = 0; b < 8; b++) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nr) {
                long xb = (long)(r0 + r) * nb + s * 8 + b;
                const uint4* xv = sx ? sx + s * 17 + 2 * b : (const uint4*)(xq + xb * 32);
                float2 dx = sx ? sxd[s * 9 + b] : xd[xb];
                acc[r] += q8_block_dot<DT>(wd, b * BS, xv, dx);
            }
        }
    }
}

// NSB: superblocks a lane loads before dotting them (1: more would need more registers, which
// costs more in resident blocks than it gains for long rows).
template <int DT, int R, int NSB>
__device__ void linear_q8act_sb_t(const signed char* xq, const float2* xd, const LinSegs& sg, int m, int ntot, int k,
                                  long row_bytes, int lpr, uint4* smx) {
    constexpr int BS = blk_bytes<DT>();
    constexpr int NV = BS * 8 / 16;
    int lane = threadIdx.x & 31, sub = lane & (lpr - 1);
    int rpw = 32 / lpr;
    int jg = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * rpw + lane / lpr;
    int r0 = blockIdx.y * R;
    bool live = jg < ntot;
    SEG_PICK(live ? jg : 0)
    int nr = min(R, m - r0);
    long nb = k >> 5;
    const unsigned char* row = w + (long)j * row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    long nsb = k >> 8;
    unsigned int wd[NSB][4 * NV + 1];
    // the first superblocks in flight, then wait for the kernel that wrote the activations
    if (live) {
#pragma unroll
        for (int u = 0; u < NSB; u++)
            if (sub + u * lpr < nsb) load_sb<DT>(row, sub + u * lpr, wd[u]);
    }
    pdl_gemv_begin();
    const uint4* sx = 0;
    const float2* sxd = 0;
    if (smx) {
        for (long i = threadIdx.x; i < nsb * 16; i += blockDim.x) smx[(i >> 4) * 17 + (i & 15)] = ((const uint4*)xq)[i];
        float2* sd = (float2*)(smx + nsb * 17);
        for (long i = threadIdx.x; i < nsb * 8; i += blockDim.x) sd[(i >> 3) * 9 + (i & 7)] = xd[i];
        __syncthreads();
        sx = smx;
        sxd = sd;
    }
    for (long s = sub; live && s < nsb; s += NSB * lpr) {
        if (s != sub) {
#pragma unroll
            for (int u = 0; u < NSB; u++)
                if (s + u * lpr < nsb) load_sb<DT>(row, s + u * lpr, wd[u]);
        }
#pragma unroll
        for (int u = 0; u < NSB; u++)
            if (s + u * lpr < nsb) sb_dot<DT, R>(wd[u], s + u * lpr, xq, xd, sx, sxd, r0, nr, nb, acc);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = acc[r];
        for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (live && sub == 0 && r < nr) {
            float* yo = y + (long)(r0 + r) * n + j;
            *yo = (sg.acc ? *yo : 0.0f) + v + (bias ? bias[j] : 0.0f);
        }
    }
}

// One-row GEMV with half superblocks: a lane takes 4 blocks (half a superblock: 5 / 5 / 9
// 16-byte loads for Q4_0 / Q4_1 / Q8_0) instead of 8, so its registers and its arithmetic per
// memory round trip halve and twice as many lanes share a row (k = 4096: a warp per row).
// Half h of superblock s is item hs = 2s + h; with an even number of lanes per row a lane's h
// never changes, and the second half's window is shifted in registers (constant indices), so
// both halves run the same code.
template <int DT>
__device__ __forceinline__ constexpr int nvh() {
    return (4 * blk_bytes<DT>() + 15) / 16;
}

template <int DT>
__device__ __forceinline__ void load_hsb(const unsigned char* row, long hs, unsigned int* wd) {
    constexpr int NV = blk_bytes<DT>() * 8 / 16, NVH = nvh<DT>(), H1 = NV - NVH;
    // words the second half's first block sits after its window start
    constexpr int SH = (4 * blk_bytes<DT>() - H1 * 16) / 4;
    long s = hs >> 1;
    int h = (int)(hs & 1);
    const uint4* p = (const uint4*)(row + s * (long)(blk_bytes<DT>() * 8)) + (h ? H1 : 0);
#pragma unroll
    for (int v = 0; v < NVH; v++) {
        uint4 q = __ldg(p + v);
        wd[4 * v] = q.x;
        wd[4 * v + 1] = q.y;
        wd[4 * v + 2] = q.z;
        wd[4 * v + 3] = q.w;
    }
    wd[4 * NVH] = 0;
    if (SH) {
#pragma unroll
        for (int i = 0; i + SH <= 4 * NVH; i++) wd[i] = h ? wd[i + SH] : wd[i];
    }
}

template <int DT>
__device__ __forceinline__ void hsb_dot(const unsigned int* wd, long hs, const uint4* sx, const float2* sxd,
                                        float& acc) {
    long s = hs >> 1;
    int b0 = (int)(hs & 1) * 4;
#pragma unroll
    for (int bb = 0; bb < 4; bb++)
        acc += q8_block_dot<DT>(wd, bb * blk_bytes<DT>(), sx + s * 17 + 2 * (b0 + bb), sxd[s * 9 + b0 + bb]);
}

template <int DT>
__device__ void linear_q8act_sbh_t(const signed char* xq, const float2* xd, const LinSegs& sg, int ntot, int k,
                                   long row_bytes, int lpr, uint4* smx) {
    constexpr int NVH = nvh<DT>();
    int lane = threadIdx.x & 31, sub = lane & (lpr - 1);
    int rpw = 32 / lpr;
    int jg = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * rpw + lane / lpr;
    bool live = jg < ntot;
    SEG_PICK(live ? jg : 0)
    const unsigned char* row = w + (long)j * row_bytes;
    long nsb = k >> 8, nhs = nsb * 2;
    unsigned int wd[4 * NVH + 1];
    if (live && sub < nhs) load_hsb<DT>(row, sub, wd);
    pdl_gemv_begin();
    for (long i = threadIdx.x; i < nsb * 16; i += blockDim.x) smx[(i >> 4) * 17 + (i & 15)] = ((const uint4*)xq)[i];
    float2* sd = (float2*)(smx + nsb * 17);
    for (long i = threadIdx.x; i < nsb * 8; i += blockDim.x) sd[(i >> 3) * 9 + (i & 7)] = xd[i];
    __syncthreads();
    float acc = 0.0f;
    for (long hs = sub; live && hs < nhs; hs += lpr) {
        if (hs != sub) load_hsb<DT>(row, hs, wd);
        hsb_dot<DT>(wd, hs, smx, sd, acc);
    }
    for (int o = lpr >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (live && sub == 0) y[j] = (sg.acc ? y[j] : 0.0f) + acc + (bias ? bias[j] : 0.0f);
}

#define SBH_MIN_BLOCKS 4

#define LINSBH(name, DT) \
    extern "C" __global__ void __launch_bounds__(256, SBH_MIN_BLOCKS) \
        linear_q8act_sbh_##name(const signed char* xq, const float2* xd, LinSegs sg, int m, int ntot, int k, long rb, \
                                int lpr) { \
        extern __shared__ uint4 smx[]; \
        linear_q8act_sbh_t<DT>(xq, xd, sg, ntot, k, rb, lpr, smx); \
    }
LINSBH(q8_0, DT_Q8_0)
LINSBH(q4_0, DT_Q4_0)
LINSBH(q4_1, DT_Q4_1)

// ---- one-row GEMV of Q4_K / Q6_K weights with Q8_0 activations (`linear_q8act_kq_*`) ----
//
// A warp per output row (8 rows per 256-thread block). Four lanes share a 256-value
// super-block, each dotting 64 of its values (two 32-value activation blocks) with dp4a; the
// warp's eight lane groups take neighbouring super-blocks, so a step reads contiguous bytes of
// the row, and each loop trip issues the loads of two steps before dotting them.
// Q4_K (lane part t: sub-blocks 2t, 2t + 1 = low / high nibbles of qs bytes 32t..32t+32):
//   Σ (d·sc·q − dmin·mn)·x = d·sc·dx·Σ q·xq − dmin·mn·(dx·Σ xq), dx·Σ xq being the stored pair's y.
// Q6_K (lane part t: half h = t / 2, groups g = t % 2 and g + 2 of that half): the 6-bit values
//   minus 32 as int8, a scale per 16 values.

// Byte i (0..12) of the three words of a Q4_K super-block's packed scales.
__device__ __forceinline__ int kq_sbyte(uint4 hd, int i) {
    unsigned int w = i < 4 ? hd.y : (i < 8 ? hd.z : hd.w);
    return (int)((w >> (8 * (i & 3))) & 0xff);
}

// Scale and min of sub-block j (0..8) of a Q4_K super-block whose first 16 bytes are hd.
__device__ __forceinline__ void kq4_scale_min(uint4 hd, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = kq_sbyte(hd, j) & 63;
        mn = kq_sbyte(hd, j + 4) & 63;
    } else {
        sc = (kq_sbyte(hd, j + 4) & 15) | ((kq_sbyte(hd, j - 4) >> 6) << 4);
        mn = (kq_sbyte(hd, j + 4) >> 4) | ((kq_sbyte(hd, j) >> 6) << 4);
    }
}

// The weight words one lane part needs from a super-block: Q4_K: the 16-byte header and 32 qs
// bytes; Q6_K: 32 ql bytes and 32 qh bytes (2-byte aligned).
template <int DT>
struct KqPart {
    uint4 hd;
    unsigned int a[8], b[8];
};

// 32 bytes at a 2-byte aligned address p as eight words: three aligned 16-byte loads from p
// rounded down to 16 (all inside the Q6_K super-block: the windows read end at least 16 bytes
// before its end), the words picked and shifted by p's offset.
__device__ __forceinline__ void ld32_a2(const unsigned char* p, unsigned int* out) {
    unsigned long a = (unsigned long)p;
    const uint4* b = (const uint4*)(a & ~15ul);
    int off = (int)(a & 15), wi = off >> 2, sh = 8 * (off & 3);
    uint4 v0 = __ldg(b), v1 = __ldg(b + 1), v2 = __ldg(b + 2);
    unsigned int w[12] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w, v2.x, v2.y, v2.z, v2.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        unsigned int lo = wi == 0 ? w[i] : (wi == 1 ? w[i + 1] : (wi == 2 ? w[i + 2] : w[i + 3]));
        unsigned int hi = wi == 0 ? w[i + 1] : (wi == 1 ? w[i + 2] : (wi == 2 ? w[i + 3] : w[i + 4]));
        out[i] = __funnelshift_r(lo, hi, sh);
    }
}

// Each byte (0..63) minus 32, as int8: the bytes are offset by 128 first, so no borrow crosses
// a byte.
__device__ __forceinline__ unsigned int sub32x4(unsigned int q) {
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

template <int DT>
__device__ __forceinline__ void kq_part_load(const unsigned char* blk, int t, KqPart<DT>& p) {
    if (DT == DT_Q4_K) {
        const uint4* v = (const uint4*)blk;
        p.hd = __ldg(v);
        uint4 q0 = __ldg(v + 1 + 2 * t), q1 = __ldg(v + 2 + 2 * t);
        p.a[0] = q0.x, p.a[1] = q0.y, p.a[2] = q0.z, p.a[3] = q0.w;
        p.a[4] = q1.x, p.a[5] = q1.y, p.a[6] = q1.z, p.a[7] = q1.w;
    } else {
        const unsigned char* ql = blk + 64 * (t >> 1) + 32 * (t & 1);
        const unsigned char* qh = blk + 128 + 32 * (t >> 1);
        ld32_a2(ql, p.a);
        ld32_a2(qh, p.b);
    }
}

// One lane part of super-block sb (weights in p, the block at blk) · the Q8_0 activation row.
template <int DT>
__device__ __forceinline__ float kq_part_dot(const KqPart<DT>& p, const unsigned char* blk, long sb, int t,
                                             const signed char* xq, const float2* xd) {
    if (DT == DT_Q4_K) {
        long xb = sb * 8 + 2 * t;
        const uint4* xv = (const uint4*)(xq + xb * 32);
        uint4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
        unsigned int xl[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        unsigned int xh[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        int sl = 0, sh = 0;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            sl = dp4a((int)(p.a[u] & 0x0F0F0F0Fu), (int)xl[u], sl);
            sh = dp4a((int)((p.a[u] >> 4) & 0x0F0F0F0Fu), (int)xh[u], sh);
        }
        int sc0, mn0, sc1, mn1;
        kq4_scale_min(p.hd, 2 * t, sc0, mn0);
        kq4_scale_min(p.hd, 2 * t + 1, sc1, mn1);
        float2 d0 = xd[xb], d1 = xd[xb + 1];
        float d = h2f((unsigned short)(p.hd.x & 0xffff)), dmin = h2f((unsigned short)(p.hd.x >> 16));
        return d * ((float)(sc0 * sl) * d0.x + (float)(sc1 * sh) * d1.x) -
               dmin * ((float)mn0 * d0.y + (float)mn1 * d1.y);
    } else {
        int h = t >> 1, g = t & 1;
        long xa = sb * 8 + 4 * h + g, xc = xa + 2;
        const uint4* va = (const uint4*)(xq + xa * 32);
        const uint4* vc = (const uint4*)(xq + xc * 32);
        uint4 a0 = va[0], a1 = va[1], c0 = vc[0], c1 = vc[1];
        unsigned int xa_w[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        unsigned int xc_w[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
        int sa[2] = {0, 0}, scs[2] = {0, 0};
#pragma unroll
        for (int u = 0; u < 8; u++) {
            unsigned int lo = (p.a[u] & 0x0F0F0F0Fu) | (((p.b[u] >> (2 * g)) & 0x03030303u) << 4);
            unsigned int hi = ((p.a[u] >> 4) & 0x0F0F0F0Fu) | (((p.b[u] >> (2 * g + 4)) & 0x03030303u) << 4);
            sa[u >> 2] = dp4a((int)sub32x4(lo), (int)xa_w[u], sa[u >> 2]);
            scs[u >> 2] = dp4a((int)sub32x4(hi), (int)xc_w[u], scs[u >> 2]);
        }
        const signed char* sc = (const signed char*)blk + 192 + 8 * h;
        int ia = sa[0] * sc[2 * g] + sa[1] * sc[2 * g + 1];
        int ic = scs[0] * sc[2 * g + 4] + scs[1] * sc[2 * g + 5];
        float d = h2f(__ldg((const unsigned short*)(blk + 208)));
        return d * ((float)ia * xd[xa].x + (float)ic * xd[xc].x);
    }
}

template <int DT>
__device__ void linear_q8act_kq_t(const signed char* xq, const float2* xd, const LinSegs& sg, int ntot, int k,
                                  long row_bytes) {
    int lane = threadIdx.x & 31, t = lane & 3;
    int jg = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (jg >= ntot) return;
    SEG_PICK(jg)
    const unsigned char* row = w + (long)j * row_bytes;
    long nsb = k >> 8;
    constexpr int BS = KQ_BYTES(DT);
    long sb = lane >> 2;
    KqPart<DT> p0, p1;
    if (sb < nsb) kq_part_load<DT>(row + sb * BS, t, p0);
    pdl_gemv_begin();
    float acc = 0.0f;
    for (; sb < nsb; sb += 16) {
        bool two = sb + 8 < nsb;
        if (two) kq_part_load<DT>(row + (sb + 8) * BS, t, p1);
        acc += kq_part_dot<DT>(p0, row + sb * BS, sb, t, xq, xd);
        if (sb + 16 < nsb) kq_part_load<DT>(row + (sb + 16) * BS, t, p0);
        if (two) acc += kq_part_dot<DT>(p1, row + (sb + 8) * BS, sb + 8, t, xq, xd);
    }
    float s = warp_sum(acc);
    if (lane == 0) y[j] = (sg.acc ? y[j] : 0.0f) + s + (bias ? bias[j] : 0.0f);
}

// Two resident blocks per SM: up to 128 registers, room for two steps' weights per lane.
#define LINKQ(name, DT) \
    extern "C" __global__ void __launch_bounds__(256, 2) \
        linear_q8act_kq_##name(const signed char* xq, const float2* xd, LinSegs sg, int m, int ntot, int k, long rb) { \
        linear_q8act_kq_t<DT>(xq, xd, sg, ntot, k, rb); \
    }
LINKQ(q4_k, DT_Q4_K)
LINKQ(q6_k, DT_Q6_K)

// ---- one-row GEMV streaming the weights through shared memory (compute capability >= 9.0) ----
//
// `linear_q8act_bulk{LPR}x{NI}_*`: each warp owns a ring of `slots` weight slots in shared
// memory; lane 0 fills a slot with bulk copies (`cp.async.bulk`, completion counted by an
// mbarrier per slot) of the RPW = 32 / LPR rows the warp dots next. The first `slots` row groups
// are requested before the kernel waits for its predecessor, so the small GEMVs are in flight
// (or already in shared memory) when the activations become ready, and the big ones keep
// slots · RPW rows per warp outstanding without holding them in registers. A row is dotted by
// LPR lanes, lane `sub` taking half superblocks sub, sub + LPR, ... (at most NI of them); the
// partial sums meet in a fixed shuffle tree, so a row's result does not depend on the launch
// (segments, grid). NI = 1: a lane's activations (4 Q8_0 blocks) live in registers; NI > 1:
// the block stages the activation row in shared memory as `sbh` does. Warps stride over row
// groups (warp gw takes groups gw, gw + warps in grid, ...); the host sizes the grid to the
// blocks that fit on the GPU at once.

// A shared-memory address as the 32-bit value the shared-state-space instructions take.
__device__ __forceinline__ unsigned int smem_u32(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(unsigned int bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

// Arms the barrier's current phase for `bytes` of bulk copies (lane 0's single arrival).
__device__ __forceinline__ void mbar_expect(unsigned int bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned int bar, unsigned int parity) {
    unsigned int done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

__device__ __forceinline__ void bulk_g2s(unsigned int dst, const void* src, unsigned int bytes, unsigned int bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// The weight row `row` of the launch (segment table sg), or null past the end.
__device__ __forceinline__ const unsigned char* seg_row(const LinSegs& sg, int row, int ntot, long row_bytes) {
    if (row >= ntot) return 0;
    int si = row >= sg.n[0] ? (row >= sg.n[0] + sg.n[1] ? 2 : 1) : 0;
    int j = row - (si > 0 ? sg.n[0] : 0) - (si > 1 ? sg.n[1] : 0);
    return (si == 0 ? sg.w[0] : (si == 1 ? sg.w[1] : sg.w[2])) + (long)j * row_bytes;
}

// Lane 0: the rows of group g into slot `slot` (RPW rows of row_bytes each).
template <int RPW>
__device__ __forceinline__ void bulk_issue(const LinSegs& sg, int g, int ntot, long row_bytes, unsigned char* slot,
                                           unsigned int bar) {
    int nrow = min(RPW, ntot - g * RPW);
    mbar_expect(bar, (unsigned int)(nrow * row_bytes));
    for (int r = 0; r < nrow; r++)
        bulk_g2s(smem_u32(slot + r * row_bytes), seg_row(sg, g * RPW + r, ntot, row_bytes), (unsigned int)row_bytes,
                 bar);
}
#endif

// Half superblock (4 blocks, HB bytes at 8-byte aligned shared address p) into register words.
template <int DT>
__device__ __forceinline__ void lds_hsb(const unsigned char* p, unsigned int* wd) {
    constexpr int NW = blk_bytes<DT>();  // 4 blocks of BS bytes = BS words
    if (NW % 4 == 0) {
#pragma unroll
        for (int v = 0; v < NW / 4; v++) {
            uint4 t = ((const uint4*)p)[v];
            wd[4 * v] = t.x;
            wd[4 * v + 1] = t.y;
            wd[4 * v + 2] = t.z;
            wd[4 * v + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int v = 0; v < NW / 2; v++) {
            uint2 t = ((const uint2*)p)[v];
            wd[2 * v] = t.x;
            wd[2 * v + 1] = t.y;
        }
    }
    wd[NW] = 0;
}

template <int DT, int LPR, int NI>
__device__ void linear_q8act_bulk_t(const signed char* xq, const float2* xd, const LinSegs& sg, int ntot, int k,
                                    long row_bytes, int slots, unsigned char* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int RPW = 32 / LPR;
    constexpr int BS = blk_bytes<DT>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int sub = lane & (LPR - 1), rw = lane / LPR;
    const long nsb = k >> 8;
    const int nhs = (int)(2 * nsb);
    const long act_bytes = NI > 1 ? ((nsb * (272 + 72) + 15) & ~15L) : 0;
    const long slot_bytes = RPW * row_bytes;
    unsigned char* ring = smem + act_bytes + (long)warp * slots * slot_bytes;
    unsigned long long* bars = (unsigned long long*)(smem + act_bytes + (long)nw * slots * slot_bytes) + warp * slots;
    const int groups = (ntot + RPW - 1) / RPW;
    const int gw = blockIdx.x * nw + warp, nwg = gridDim.x * nw;
    if (lane == 0) {
        for (int s = 0; s < slots; s++) mbar_init(smem_u32(bars + s));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int s = 0; s < slots && gw + s * nwg < groups; s++)
            bulk_issue<RPW>(sg, gw + s * nwg, ntot, row_bytes, ring + s * slot_bytes, smem_u32(bars + s));
    }
    __syncwarp();
    pdl_gemv_begin();
    // this lane's activations: registers (NI = 1) or the block's staged row (NI > 1)
    uint4 xa[4][2];
    float2 xs[4];
    const uint4* sx = (const uint4*)smem;
    const float2* sxd = (const float2*)(sx + nsb * 17);
    if (NI == 1) {
        int hs = sub < nhs ? sub : 0;
        long b0 = (long)(hs >> 1) * 8 + (hs & 1) * 4;
#pragma unroll
        for (int bb = 0; bb < 4; bb++) {
            const uint4* xv = (const uint4*)(xq + (b0 + bb) * 32);
            xa[bb][0] = xv[0];
            xa[bb][1] = xv[1];
            xs[bb] = xd[b0 + bb];
        }
    } else {
        uint4* smx = (uint4*)smem;
        for (long i = threadIdx.x; i < nsb * 16; i += blockDim.x) smx[(i >> 4) * 17 + (i & 15)] = ((const uint4*)xq)[i];
        float2* sd = (float2*)(smx + nsb * 17);
        for (long i = threadIdx.x; i < nsb * 8; i += blockDim.x) sd[(i >> 3) * 9 + (i & 7)] = xd[i];
        __syncthreads();
    }
    for (int it = 0, g = gw; g < groups; it++, g += nwg) {
        int s = it % slots;
        mbar_wait(smem_u32(bars + s), (unsigned int)((it / slots) & 1));
        int row = g * RPW + rw;
        const unsigned char* wrow = ring + s * slot_bytes + rw * row_bytes;
        float acc = 0.0f;
        if (row < ntot) {
#pragma unroll
            for (int t = 0; t < NI; t++) {
                int hs = sub + t * LPR;
                if (hs < nhs) {
                    unsigned int wd[BS + 1];
                    lds_hsb<DT>(wrow + (long)hs * (4 * BS), wd);
                    if (NI == 1) {
#pragma unroll
                        for (int bb = 0; bb < 4; bb++) acc += q8_block_dot<DT>(wd, bb * BS, xa[bb], xs[bb]);
                    } else {
                        long sb = hs >> 1;
                        int b0 = (hs & 1) * 4;
#pragma unroll
                        for (int bb = 0; bb < 4; bb++)
                            acc += q8_block_dot<DT>(wd, bb * BS, sx + sb * 17 + 2 * (b0 + bb), sxd[sb * 9 + b0 + bb]);
                    }
                }
            }
        }
#pragma unroll
        for (int o = LPR >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (row < ntot && sub == 0) {
            SEG_PICK(row)
            y[j] = (sg.acc ? y[j] : 0.0f) + acc + (bias ? bias[j] : 0.0f);
        }
        __syncwarp();
        int gn = g + slots * nwg;
        if (lane == 0 && gn < groups) bulk_issue<RPW>(sg, gn, ntot, row_bytes, ring + s * slot_bytes, smem_u32(bars + s));
    }
#endif
}

#define LINBULK1(name, DT, LPR, NI) \
    extern "C" __global__ void __launch_bounds__(256, 1) \
        linear_q8act_bulk##LPR##x##NI##_##name(const signed char* xq, const float2* xd, LinSegs sg, int m, int ntot, \
                                               int k, long rb, int slots) { \
        extern __shared__ uint4 smb[]; \
        linear_q8act_bulk_t<DT, LPR, NI>(xq, xd, sg, ntot, k, rb, slots, (unsigned char*)smb); \
    }
#define LINBULK(name, DT) \
    LINBULK1(name, DT, 32, 1) \
    LINBULK1(name, DT, 32, 2) \
    LINBULK1(name, DT, 32, 3) \
    LINBULK1(name, DT, 32, 4) \
    LINBULK1(name, DT, 16, 1) \
    LINBULK1(name, DT, 16, 2) \
    LINBULK1(name, DT, 8, 1) \
    LINBULK1(name, DT, 8, 2)
LINBULK(q8_0, DT_Q8_0)
LINBULK(q4_0, DT_Q4_0)
LINBULK(q4_1, DT_Q4_1)

// Resident blocks per SM promised by the one-row kernels (`sbx`): 4-bit weights keep a
// 9-10 register-word superblock per lane, 8-bit ones 17, so they get different caps.
#define SBX4_MIN_BLOCKS 2
#define SBX8_MIN_BLOCKS 2

#define LINSB(name, DT, MINB) \
    extern "C" __global__ void linear_q8act_sb_##name(const signed char* xq, const float2* xd, LinSegs sg, int m, \
                                                      int ntot, int k, long rb, int lpr) { \
        linear_q8act_sb_t<DT, LIN_ROWS, 1>(xq, xd, sg, m, ntot, k, rb, lpr, 0); \
    } \
    extern "C" __global__ void __launch_bounds__(256, MINB) \
        linear_q8act_sbx_##name(const signed char* xq, const float2* xd, LinSegs sg, int m, int ntot, int k, long rb, \
                                int lpr) { \
        extern __shared__ uint4 smx[]; \
        linear_q8act_sb_t<DT, 1, 1>(xq, xd, sg, 1, ntot, k, rb, lpr, smx); \
    }
LINSB(q8_0, DT_Q8_0, SBX8_MIN_BLOCKS)
LINSB(q4_0, DT_Q4_0, SBX4_MIN_BLOCKS)
LINSB(q4_1, DT_Q4_1, SBX4_MIN_BLOCKS)

// ---- tensor-core (cuBLAS) path helpers ----

// y[i] = x[i] as f16 (bf = 0) or bf16 (bf = 1), round to nearest.
extern "C" __global__ void cast_f32_half(const float* x, unsigned short* y, long n, int bf) {
    pdl_begin();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = bf ? f2bf(x[i]) : f2h(x[i]);
}

// Weight rows [r0, r0 + nr) of a block weight (k % 32 == 0) dequantized to f16, row-major
// [nr, k]: one thread per 4 consecutive weights (load4 above).
template <int DT>
__device__ void dequant_f16_t(const unsigned char* w, unsigned short* out, long r0, long nr, int k, long row_bytes) {
    pdl_begin();
    long groups = (long)k / 4;
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < nr * groups; id += (long)gridDim.x * blockDim.x) {
        long r = id / groups, g = id % groups;
        float v[4];
        load4<DT>(w + (r0 + r) * row_bytes, g >> 3, (int)(g & 7), v);
        unsigned int lo = (unsigned int)f2h(v[0]) | ((unsigned int)f2h(v[1]) << 16);
        unsigned int hi = (unsigned int)f2h(v[2]) | ((unsigned int)f2h(v[3]) << 16);
        *(uint2*)(out + r * (long)k + g * 4) = make_uint2(lo, hi);
    }
}

#define DEQ(name, DT) \
    extern "C" __global__ void dequant_f16_##name(const unsigned char* w, unsigned short* out, long r0, long nr, \
                                                  int k, long rb) { \
        dequant_f16_t<DT>(w, out, r0, nr, k, rb); \
    }
DEQ(q8_0, DT_Q8_0)
DEQ(q4_0, DT_Q4_0)
DEQ(q4_1, DT_Q4_1)

// Weight rows [r0, r0 + nr) of a K-quant weight (k % 256 == 0) dequantized to f16, row-major
// [nr, k]: one thread per 8 consecutive weights (kq_load8, common.cuh).
template <int DT>
__device__ void dequant_f16_kq_t(const unsigned char* w, unsigned short* out, long r0, long nr, int k,
                                 long row_bytes) {
    pdl_begin();
    long groups = (long)k / 8;
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < nr * groups; id += (long)gridDim.x * blockDim.x) {
        long r = id / groups, g = id % groups;
        float v[8];
        kq_load8<DT>(w + (r0 + r) * row_bytes + (g >> 5) * KQ_BYTES(DT), (int)(g & 31), v);
        unsigned int p[4];
#pragma unroll
        for (int u = 0; u < 4; u++) p[u] = (unsigned int)f2h(v[2 * u]) | ((unsigned int)f2h(v[2 * u + 1]) << 16);
        *(uint4*)(out + r * (long)k + g * 8) = make_uint4(p[0], p[1], p[2], p[3]);
    }
}

#define DEQK(name, DT) \
    extern "C" __global__ void dequant_f16_##name(const unsigned char* w, unsigned short* out, long r0, long nr, \
                                                  int k, long rb) { \
        dequant_f16_kq_t<DT>(w, out, r0, nr, k, rb); \
    }

// Weight rows [r0, r0 + nr) of a weight of any dtype, dequantized element by element (load_w).
template <int DT>
__device__ void dequant_f16_el_t(const unsigned char* w, unsigned short* out, long r0, long nr, int k,
                                 long row_bytes) {
    pdl_begin();
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < nr * k; id += (long)gridDim.x * blockDim.x) {
        long r = id / k, i = id % k;
        out[r * (long)k + i] = f2h(load_w<DT>(w + (r0 + r) * row_bytes, i));
    }
}

extern "C" __global__ void dequant_f16_q5_0(const unsigned char* w, unsigned short* out, long r0, long nr, int k,
                                            long rb) {
    dequant_f16_el_t<DT_Q5_0>(w, out, r0, nr, k, rb);
}

DEQK(q4_k, DT_Q4_K)
DEQK(q5_k, DT_Q5_K)
DEQK(q6_k, DT_Q6_K)
DEQK(q2_k, DT_Q2_K)
DEQK(q3_k, DT_Q3_K)
