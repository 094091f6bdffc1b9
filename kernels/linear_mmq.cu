// Block-weight products for a few activation rows on int8 tensor cores: y[m, n] = x[m, k] · W[n, k]ᵀ
// (+ bias, + y), W in Q8_0 / Q4_0 / Q4_1, x as Q8_0 rows (int8 values, then per 32-value block the
// pair (d, d·Σq): the buffer of quantize_q8_f32 and of the producers' quantize_output = 1).
// One mma.sync m16n8k32 (s8 × s8 → s32) takes one 32-value block of 16 weight rows and 8
// activation rows; its integer sums are scaled per block in f32:
//   Q8_0, Q4_0: y += dw · (dx · Σ qw·qx)          (Q4_0: qw = nibble − 8)
//   Q4_1:       y += dw · (dx · Σ qw·qx) + mw · dx·Σqx
// Each integer sum c becomes a float without a conversion instruction: the mma adds the
// constant 0x4B400000 to it, and the bits of c + 0x4B400000 are the float
// 1.5·2^23 + c exactly (|c| < 2^22 for every dtype), and
// fma(dx, 1.5·2^23 + c, −1.5·2^23·dx) is dx · c rounded once (dx, an f16 value, times 1.5·2^23
// is exact in f32).
// so each weight block is read once from device memory for all 8 · NT activation rows of a
// launch slice (up to 128 rows), with no f16 copy of anything.
//
// Grid (row tiles, k splits, row slices): a block of MMQ_WARPS warps takes MMQ_WARPS · WR · 16
// weight rows (WR tiles of 16 per warp; the kernels have WR = 1), the k range of its split and
// 8 · NT activation rows.
// Chunk by chunk (MMQ_KC values) the block copies the weight rows' blocks, the int8 activation
// rows and their scales into shared memory with cp.async, MMQ_STAGES chunks in flight; every
// warp reads the staged activations, so more warps per block share one copy. With one
// split the block writes y itself; with several it writes its partial sums to `part`
// [splits, m, ntot] and mma_reduce_f32 adds them in split order (deterministic). Needs
// k % MMQ_KC == 0, weights at 8-byte aligned addresses and the activation buffers at 16-byte
// aligned ones.
//
// Fragments: lane (g = lane / 4, t = lane % 4) holds, of weight rows g and g + 8, the bytes
// 4t..4t+3 (A k 4t..4t+3) and 16+4t..16+4t+3 (A k 16+4t..) of the block's 32 values; a 4-bit
// block's quant byte i holds values i (low nibble) and i + 16 (high nibble), so one 32-bit word
// gives both. Activation row 8u + g gives bytes 4t.. and 16+4t.. of the same block (B).

#define MMQ_WARPS 8
#define MMQ_KC 128
#define MMQ_STAGES 3
// bytes per staged int8 activation row (row stride ≡ 4 words mod 32: a quad group's eight rows
// hit distinct banks)
#define MMQ_XROW (MMQ_KC + 16)
// bytes per staged row of activation scales: MMQ_KC / 32 float pairs, padded (the rows 2t and
// 2t + 1 that a quad group reads fall in distinct banks)
#define MMQ_SROW 48

template <int DT>
__device__ __forceinline__ constexpr int mmq_bs() {
    return DT == DT_Q4_0 ? 18 : (DT == DT_Q4_1 ? 20 : 34);
}

// Bytes per staged weight row of one chunk (MMQ_KC / 32 blocks; Q8_0 padded to 36 words).
template <int DT>
__device__ __forceinline__ constexpr int mmq_wrow() {
    return DT == DT_Q8_0 ? 144 : 4 * mmq_bs<DT>();
}

// d = a·b + c0 in every element (c0 a constant register: no accumulator to reset).
__device__ __forceinline__ void mma_s8(int* d, const unsigned int* a, unsigned int b0, unsigned int b1, int c0) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0));
}

// The 8-byte pieces of one chunk of weight rows [row0, row0 + ROWS) that this thread copies
// (the same ones in every chunk): where each starts in chunk 0 and where it goes in a stage
// (-1: none; bit 30 set: a row past ntot, which copies nothing: its stage bytes become zeros).
template <int DT, int ROWS>
struct MmqWPieces {
    static constexpr int BYTES = 4 * mmq_bs<DT>(), PER_ROW = BYTES / 8;
    static constexpr int N = (ROWS * PER_ROW + 32 * MMQ_WARPS - 1) / (32 * MMQ_WARPS);
    const unsigned char* src[N];
    int dst[N];

    __device__ __forceinline__ MmqWPieces(const LinSegs& sg, int ntot, long row_bytes, int row0) {
#pragma unroll
        for (int q = 0; q < N; q++) {
            int i = threadIdx.x + q * 32 * MMQ_WARPS;
            int r = i / PER_ROW, p = i % PER_ROW;
            int jg = row0 + r;
            bool live = jg < ntot;
            SEG_PICK(live ? jg : 0)
            (void)bias;
            (void)y;
            (void)n;
            src[q] = w + (long)j * row_bytes + 8 * p;
            dst[q] = i < ROWS * PER_ROW ? (r * mmq_wrow<DT>() + 8 * p) | (live ? 0 : 1 << 30) : -1;
        }
    }

    // Starts copying chunk c into the stage at ws with cp.async; joins the caller's commit group.
    __device__ __forceinline__ void stage(long c, unsigned char* ws) const {
        unsigned int base = (unsigned int)__cvta_generic_to_shared(ws);
#pragma unroll
        for (int q = 0; q < N; q++) {
            if (dst[q] < 0) continue;
            int d = dst[q] & ~(1 << 30), size = (dst[q] >> 30) ? 0 : 8;
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(base + d), "l"(src[q] + c * BYTES),
                         "r"(size));
        }
    }
};

// Starts copying activation rows [t0, t0 + ROWS) (zeros past m), chunk c: their int8 values into
// xs (MMQ_XROW bytes per row) and their block scales into sx (MMQ_SROW bytes per row), with
// 16-byte cp.async; joins the caller's commit group.
template <int ROWS>
__device__ __forceinline__ void mmq_stage_x(const signed char* xq, const float2* xd, int m, int k, int t0,
                                            long c, unsigned char* xs, unsigned char* sx) {
    constexpr int QP = MMQ_KC / 16, SP = MMQ_KC / 32 * 8 / 16;
    for (int i = threadIdx.x; i < ROWS * (QP + SP); i += blockDim.x) {
        int r = i / (QP + SP), p = i % (QP + SP);
        bool live = t0 + r < m;
        long row = live ? t0 + r : 0;
        const void* src;
        unsigned int sa;
        if (p < QP) {
            src = xq + row * k + c * MMQ_KC + 16 * p;
            sa = (unsigned int)__cvta_generic_to_shared(xs + r * MMQ_XROW + 16 * p);
        } else {
            src = xd + row * (k / 32) + c * (MMQ_KC / 32) + 2 * (p - QP);
            sa = (unsigned int)__cvta_generic_to_shared(sx + r * MMQ_SROW + 16 * (p - QP));
        }
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(src), "r"(live ? 16 : 0));
    }
}

// What lane (g, t) takes of one staged weight block of rows g (blk) and g + 8 (blk8): the A
// fragment and the two rows' scales (Q4_1: also the mins).
template <int DT>
__device__ __forceinline__ void mmq_wfrag(const unsigned char* blk, const unsigned char* blk8, int t,
                                          unsigned int* a, float* dw, float* mw) {
    if (DT == DT_Q4_1) {
        unsigned int w0 = *(const unsigned int*)(blk + 4 + 4 * t), w1 = *(const unsigned int*)(blk8 + 4 + 4 * t);
        a[0] = w0 & 0x0F0F0F0Fu;
        a[1] = w1 & 0x0F0F0F0Fu;
        a[2] = (w0 >> 4) & 0x0F0F0F0Fu;
        a[3] = (w1 >> 4) & 0x0F0F0F0Fu;
        dw[0] = h2f(*(const unsigned short*)blk);
        dw[1] = h2f(*(const unsigned short*)blk8);
        mw[0] = h2f(*(const unsigned short*)(blk + 2));
        mw[1] = h2f(*(const unsigned short*)(blk8 + 2));
        return;
    }
    if (DT == DT_Q4_0) {
        unsigned int w0 = sm_w2(blk + 2 + 4 * t), w1 = sm_w2(blk8 + 2 + 4 * t);
        // nibble q → the byte q − 8: (q + 0x78) has no carry out of its byte, xor 0x80
        // subtracts 128 modulo 256
        a[0] = ((w0 & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u;
        a[1] = ((w1 & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u;
        a[2] = (((w0 >> 4) & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u;
        a[3] = (((w1 >> 4) & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u;
    } else {
        a[0] = sm_w2(blk + 2 + 4 * t);
        a[1] = sm_w2(blk8 + 2 + 4 * t);
        a[2] = sm_w2(blk + 18 + 4 * t);
        a[3] = sm_w2(blk8 + 18 + 4 * t);
    }
    dw[0] = h2f(*(const unsigned short*)blk);
    dw[1] = h2f(*(const unsigned short*)blk8);
    mw[0] = 0.0f;
    mw[1] = 0.0f;
}

// The activation side of one block for lane (g, t): of rows 2t and 2t + 1, the scales dx, the
// terms −1.5·2^23·dx and dx·Σqx (see the file comment).
struct MmqX {
    float d[2], k[2], s[2];
};

// Adds one block's integer sums (rows g, g + 8 × activation rows 2t, 2t + 1; c: each plus
// 0x4B400000) to acc, scaled (see the file comment).
template <int DT>
__device__ __forceinline__ void mmq_scale(float* acc, const int* c, const float* dw, const float* mw,
                                          const MmqX& x) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float cf = __int_as_float(c[e]);
        float v = fmaf(x.d[e & 1], cf, x.k[e & 1]);
        if (DT == DT_Q4_1) {
            acc[e] = fmaf(dw[e >> 1], v, fmaf(mw[e >> 1], x.s[e & 1], acc[e]));
        } else {
            acc[e] = fmaf(dw[e >> 1], v, acc[e]);
        }
    }
}

// Writes (or, with splits, stores as partial sums) the block's results.
template <int WR, int NT>
__device__ __forceinline__ void mmq_store(const float (*acc)[NT][4], const LinSegs& sg, int m, int ntot, int base,
                                          int t0, int splits, float* part) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // c[e]: weight row g + 8 (e >> 1), activation row 2t + (e & 1) of the 8-row tile
#pragma unroll
    for (int i = 0; i < WR; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int jg = base + 16 * i + 8 * (e >> 1) + g;
            if (jg >= ntot) continue;
#pragma unroll
            for (int u = 0; u < NT; u++) {
                int r = t0 + 8 * u + 2 * t + (e & 1);
                if (r >= m) continue;
                float v = acc[i][u][e];
                if (splits > 1) {
                    part[((long)blockIdx.y * m + r) * ntot + jg] = v;
                    continue;
                }
                SEG_PICK(jg)
                (void)w;
                long o = (long)r * n + j;
                y[o] = (sg.acc ? y[o] : 0.0f) + v + (bias ? bias[j] : 0.0f);
            }
        }
}

// One block of the product (see the file comment): its weight rows' products with activation
// rows [t0, t0 + 8·NT) over chunks [c_lo, c_hi) of k.
template <int DT, int WR, int NT>
__device__ void linear_mmq_t(const signed char* xq, const float2* xd, const LinSegs& sg, int m, int ntot, int k,
                             long row_bytes, int splits, float* part) {
    extern __shared__ uint4 mmq_smem[];
    constexpr int ROWS = MMQ_WARPS * WR * 16, WB = ROWS * mmq_wrow<DT>(), XB = 8 * NT * MMQ_XROW;
    constexpr int STAGE = WB + XB + 8 * NT * MMQ_SROW, BS = mmq_bs<DT>();
    unsigned char* smem = (unsigned char*)mmq_smem;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int t0 = blockIdx.z * 8 * NT;
    long nchunks = k / MMQ_KC;
    long c_lo = nchunks * blockIdx.y / splits, c_hi = nchunks * (blockIdx.y + 1) / splits;
    int row0 = blockIdx.x * ROWS;
    float acc[WR][NT][4];
#pragma unroll
    for (int i = 0; i < WR; i++)
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][u][e] = 0.0f;
    // the first weight chunk before waiting for the kernel that wrote the activations (no
    // kernel writes weights); then MMQ_STAGES - 1 chunks in flight, one commit group each
    const MmqWPieces<DT, ROWS> wp(sg, ntot, row_bytes, row0);
    if (c_lo < c_hi) wp.stage(c_lo, smem);
    pdl_gemv_begin();
#pragma unroll
    for (int s = 0; s < MMQ_STAGES - 1; s++) {
        unsigned char* st = smem + s * STAGE;
        if (c_lo + s < c_hi) {
            if (s > 0) wp.stage(c_lo + s, st);
            mmq_stage_x<8 * NT>(xq, xd, m, k, t0, c_lo + s, st + WB, st + WB + XB);
        }
        asm volatile("cp.async.commit_group;");
    }
    for (long c = c_lo; c < c_hi; c++) {
        // chunk c has arrived, and every warp is done with the stage chunk c - 1 used
        asm volatile("cp.async.wait_group %0;" ::"n"(MMQ_STAGES - 2) : "memory");
        __syncthreads();
        long cn = c + MMQ_STAGES - 1;
        if (cn < c_hi) {
            unsigned char* nx = smem + ((cn - c_lo) % MMQ_STAGES) * STAGE;
            wp.stage(cn, nx);
            mmq_stage_x<8 * NT>(xq, xd, m, k, t0, cn, nx + WB, nx + WB + XB);
        }
        asm volatile("cp.async.commit_group;");
        const unsigned char* st = smem + ((c - c_lo) % MMQ_STAGES) * STAGE;
        const unsigned char* xs = st + WB;
        const unsigned char* sx = st + WB + XB;
#pragma unroll
        for (int bb = 0; bb < MMQ_KC / 32; bb++) {
            unsigned int a[WR][4];
            float dw[WR][2], mw[WR][2];
#pragma unroll
            for (int i = 0; i < WR; i++) {
                const unsigned char* blk = st + ((warp * WR + i) * 16 + g) * mmq_wrow<DT>() + bb * BS;
                mmq_wfrag<DT>(blk, blk + 8 * mmq_wrow<DT>(), t, a[i], dw[i], mw[i]);
            }
#pragma unroll
            for (int u = 0; u < NT; u++) {
                const unsigned char* xr = xs + (8 * u + g) * MMQ_XROW + 32 * bb + 4 * t;
                unsigned int b0 = *(const unsigned int*)xr, b1 = *(const unsigned int*)(xr + 16);
                MmqX xv;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float2 sc = *(const float2*)(sx + (8 * u + 2 * t + h) * MMQ_SROW + 8 * bb);
                    xv.d[h] = sc.x;
                    xv.k[h] = -12582912.0f * sc.x;
                    xv.s[h] = sc.y;
                }
#pragma unroll
                for (int i = 0; i < WR; i++) {
                    int c4[4];
                    mma_s8(c4, a[i], b0, b1, 0x4B400000);
                    mmq_scale<DT>(acc[i][u], c4, dw[i], mw[i], xv);
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    mmq_store<WR, NT>(acc, sg, m, ntot, row0 + warp * WR * 16, t0, splits, part);
}

#define LINMMQ1(name, DT, WR, NT) \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_WARPS, 2) linear_mmq##WR##x##NT##_##name( \
        const signed char* xq, const float2* xd, LinSegs sg, int m, int ntot, int k, long rb, int splits, \
        float* part) { \
        linear_mmq_t<DT, WR, NT>(xq, xd, sg, m, ntot, k, rb, splits, part); \
    }
#define LINMMQ(name, DT) \
    LINMMQ1(name, DT, 1, 1) \
    LINMMQ1(name, DT, 1, 2) \
    LINMMQ1(name, DT, 1, 4) \
    LINMMQ1(name, DT, 1, 8) \
    LINMMQ1(name, DT, 1, 16)
LINMMQ(q8_0, DT_Q8_0)
LINMMQ(q4_0, DT_Q4_0)
LINMMQ(q4_1, DT_Q4_1)
