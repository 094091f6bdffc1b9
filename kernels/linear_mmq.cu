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
// so each weight block is read once from device memory for all activation rows of a launch
// slice (up to 128 rows), with no f16 copy of anything.
//
// Grid (row tiles, k splits, row slices): a block of WM · WN · WK warps takes WM · WR · 16
// weight rows of one weight (each weight of a launch starts a new block and has its own split
// count, see seg_tile; blocks past it exit), the k range of its split and WN · NU · 8
// activation rows. Warp (wm, wn, wk) holds WR 16-row weight tiles × NU 8-row activation tiles
// in registers, so each weight fragment feeds NU mma's and each activation fragment WR; with
// WK > 1 the warps of one (wm, wn) take every WK-th 32-value block of a chunk and add their
// sums in shared memory at the end, in warp order (WK = 1: every block in k order, the same
// arithmetic for every tile shape).
// Chunk by chunk (MMQ_KC values) the block copies the weight rows' blocks, the int8 activation
// rows and their scales into shared memory with cp.async, MMQ_STAGES chunks in flight; the
// warps of a block share one copy. With one split the block writes y itself; with several it
// writes its partial sums to `part` [splits, m, ntot] and mma_reduce_f32 adds them in split
// order (deterministic). Needs k % MMQ_KC == 0, weights at 8-byte aligned addresses and the
// activation buffers at 16-byte aligned ones.
//
// Fragments: lane (g = lane / 4, t = lane % 4) holds, of weight rows g and g + 8, the bytes
// 4t..4t+3 (A k 4t..4t+3) and 16+4t..16+4t+3 (A k 16+4t..) of the block's 32 values; a 4-bit
// block's quant byte i holds values i (low nibble) and i + 16 (high nibble), so one 32-bit word
// gives both. Activation row 8u + g gives bytes 4t.. and 16+4t.. of the same block (B): one
// ldmatrix.x4 loads them for two blocks. The activation scales are staged block-major, so the
// (d, d·Σq) pairs of rows 2t and 2t + 1 are one 16-byte load.

#define MMQ_KC 128
#define MMQ_STAGES 3
// 32-value blocks per chunk
#define MMQ_NB (MMQ_KC / 32)
// bytes per staged int8 activation row (row stride ≡ 4 words mod 32: the eight rows of an
// ldmatrix tile hit distinct banks)
#define MMQ_XROW (MMQ_KC + 16)

template <int DT>
__device__ __forceinline__ constexpr int mmq_bs() {
    return DT == DT_Q4_0 ? 18 : (DT == DT_Q4_1 ? 20 : 34);
}

// Bytes per staged weight row of one chunk (MMQ_NB blocks; Q8_0 padded to 36 words).
template <int DT>
__device__ __forceinline__ constexpr int mmq_wrow() {
    return DT == DT_Q8_0 ? 144 : MMQ_NB * mmq_bs<DT>();
}

// d = a·b + c0 in every element (c0 a constant register: no accumulator to reset).
__device__ __forceinline__ void mma_s8(int* d, const unsigned int* a, unsigned int b0, unsigned int b1, int c0) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0));
}

// Four 8 × 16-byte tiles from shared memory (this lane's row address: lanes 8j..8j+7 name the
// rows of tile j); lane (g, t) gets the word 4t..4t+3 of row g of each.
__device__ __forceinline__ void mmq_ldsm4(unsigned int* b, const unsigned char* p) {
    unsigned int a = (unsigned int)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(a));
}

// The 8-byte pieces of one chunk of weight rows [row0, row0 + ROWS) that this thread (of
// THREADS) copies (the same ones in every chunk): where each starts in chunk 0 and where it
// goes in a stage (-1: none; bit 30 set: a row past ntot, which copies nothing: its stage bytes
// become zeros).
template <int DT, int ROWS, int THREADS>
struct MmqWPieces {
    static constexpr int BYTES = MMQ_NB * mmq_bs<DT>(), PER_ROW = BYTES / 8;
    static constexpr int N = (ROWS * PER_ROW + THREADS - 1) / THREADS;
    const unsigned char* src[N];
    int dst[N];

    __device__ __forceinline__ MmqWPieces(const LinSegs& sg, int ntot, long row_bytes, int row0) {
#pragma unroll
        for (int q = 0; q < N; q++) {
            int i = threadIdx.x + q * THREADS;
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
// xs (MMQ_XROW bytes per row, 16-byte cp.async) and their block scales into sx, block-major
// (the (d, d·Σq) pair of row r, block b at byte 8 · (b · ROWS + r)); joins the caller's commit
// group.
template <int ROWS, int THREADS>
__device__ __forceinline__ void mmq_stage_x(const signed char* xq, const float2* xd, int m, int k, int t0,
                                            long c, unsigned char* xs, unsigned char* sx) {
    constexpr int QP = MMQ_KC / 16;
#pragma unroll
    for (int i0 = 0; i0 < ROWS * QP; i0 += THREADS) {
        int i = i0 + threadIdx.x;
        if (ROWS * QP % THREADS != 0 && i >= ROWS * QP) break;
        int r = i / QP, p = i % QP;
        bool live = t0 + r < m;
        long row = live ? t0 + r : 0;
        unsigned int sa = (unsigned int)__cvta_generic_to_shared(xs + r * MMQ_XROW + 16 * p);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa),
                     "l"(xq + row * k + c * MMQ_KC + 16 * p), "r"(live ? 16 : 0));
    }
#pragma unroll
    for (int i0 = 0; i0 < ROWS * MMQ_NB; i0 += THREADS) {
        int i = i0 + threadIdx.x;
        if (ROWS * MMQ_NB % THREADS != 0 && i >= ROWS * MMQ_NB) break;
        int b = i / ROWS, r = i % ROWS;
        bool live = t0 + r < m;
        long row = live ? t0 + r : 0;
        unsigned int sa = (unsigned int)__cvta_generic_to_shared(sx + 8 * i);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(sa),
                     "l"(xd + row * (k / 32) + c * MMQ_NB + b), "r"(live ? 8 : 0));
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
// terms −1.5·2^23·dx and dx·Σqx (see the file comment), from the staged pairs (d, d·Σq) of both.
struct MmqX {
    float d[2], k[2], s[2];

    __device__ __forceinline__ explicit MmqX(float4 sc) {
        d[0] = sc.x;
        d[1] = sc.z;
        k[0] = -12582912.0f * sc.x;
        k[1] = -12582912.0f * sc.z;
        s[0] = sc.y;
        s[1] = sc.w;
    }
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

// Writes (or, with splits, stores as partial sums) one warp's results: weight rows from base
// (below rend, the end of their weight's rows), activation rows from t0.
template <int WR, int NU>
__device__ __forceinline__ void mmq_store(const float (*acc)[NU][4], const LinSegs& sg, int m, int ntot, int rend,
                                          int base, int t0, int splits, float* part) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // c[e]: weight row g + 8 (e >> 1), activation row 2t + (e & 1) of the 8-row tile
#pragma unroll
    for (int i = 0; i < WR; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int jg = base + 16 * i + 8 * (e >> 1) + g;
            if (jg >= rend) continue;
#pragma unroll
            for (int u = 0; u < NU; u++) {
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

// One warp's products of two staged blocks (bb and bb + WK of the chunk at st) for its WR
// weight tiles from tile wt0 and NU activation tiles from tile ut0.
template <int DT, int WR, int NU, int XR, int WK, int WB, int XB>
__device__ __forceinline__ void mmq_blocks(float (*acc)[NU][4], const unsigned char* st, int bb, int wt0, int ut0) {
    constexpr int BS = mmq_bs<DT>(), WROW = mmq_wrow<DT>();
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const unsigned char* xs = st + WB;
    const unsigned char* sx = st + WB + XB;
    unsigned int a[2][WR][4];
    float dw[2][WR][2], mw[2][WR][2];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < WR; i++) {
            const unsigned char* blk = st + ((wt0 + i) * 16 + g) * WROW + (bb + h * WK) * BS;
            mmq_wfrag<DT>(blk, blk + 8 * WROW, t, a[h][i], dw[h][i], mw[h][i]);
        }
    // ldmatrix rows: lanes 0-7 / 8-15 the two halves of block bb, 16-31 those of bb + WK
    const unsigned char* xl = xs + (8 * ut0 + (lane & 7)) * MMQ_XROW + 32 * (bb + (lane >> 4) * WK) + 16 * ((lane >> 3) & 1);
#pragma unroll
    for (int u = 0; u < NU; u++) {
        unsigned int b[4];
        mmq_ldsm4(b, xl + 8 * u * MMQ_XROW);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            MmqX xv(*(const float4*)(sx + 8 * ((bb + h * WK) * XR + 8 * (ut0 + u) + 2 * t)));
#pragma unroll
            for (int i = 0; i < WR; i++) {
                int c4[4];
                mma_s8(c4, a[h][i], b[2 * h], b[2 * h + 1], 0x4B400000);
                mmq_scale<DT>(acc[i][u], c4, dw[h][i], mw[h][i], xv);
            }
        }
    }
}

// With WK > 1: the warps wk > 0 of each (wm, wn) leave their sums in shared memory (the
// stages, no longer read) and the warp wk = 0 adds them in order; false for the warps that
// leave.
template <int WR, int NU, int WM, int WN, int WK>
__device__ __forceinline__ bool mmq_join(float (*acc)[NU][4], unsigned char* smem, int grp, int wk) {
    if (WK == 1) return true;
    constexpr int A = WR * NU * 4;
    int lane = threadIdx.x & 31;
    float* red = (float*)smem;
    __syncthreads();
    if (wk > 0) {
#pragma unroll
        for (int i = 0; i < WR; i++)
#pragma unroll
            for (int u = 0; u < NU; u++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    red[(((grp * (WK - 1) + wk - 1) * A) + (i * NU + u) * 4 + e) * 32 + lane] = acc[i][u][e];
    }
    __syncthreads();
    if (wk > 0) return false;
    for (int w = 1; w < WK; w++)
#pragma unroll
        for (int i = 0; i < WR; i++)
#pragma unroll
            for (int u = 0; u < NU; u++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[i][u][e] += red[(((grp * (WK - 1) + w - 1) * A) + (i * NU + u) * 4 + e) * 32 + lane];
    return true;
}

// One block of the product (see the file comment): its weight rows' products with activation
// rows [t0, t0 + 8·WN·NU) over chunks [c_lo, c_hi) of k.
template <int DT, int WR, int NU, int WM, int WN, int WK>
__device__ void linear_mmq_t(const signed char* xq, const float2* xd, const LinSegs& sg, int m, int ntot, int k,
                             long row_bytes, int splits, float* part) {
    extern __shared__ uint4 mmq_smem[];
    constexpr int THREADS = 32 * WM * WN * WK, ROWS = WM * WR * 16, XR = WN * NU * 8;
    constexpr int WB = ROWS * mmq_wrow<DT>(), XB = XR * MMQ_XROW;
    constexpr int STAGE = WB + XB + MMQ_NB * XR * 8;
    static_assert(MMQ_NB % (2 * WK) == 0, "each warp takes blocks in pairs");
    static_assert(WK == 1 || WM * WN * (WK - 1) * WR * NU * 4 * 32 * 4 <= MMQ_STAGES * STAGE, "join fits");
    unsigned char* smem = (unsigned char*)mmq_smem;
    int warp = threadIdx.x >> 5, wk = warp % WK, wn = (warp / WK) % WN, wm = warp / (WK * WN);
    int t0 = blockIdx.z * XR;
    // the block's rows [row0, rend) of one weight and that weight's own k split (seg_tile)
    const SegTile tl = seg_tile(sg, ROWS, blockIdx.x);
    if ((int)blockIdx.y >= tl.splits) return;
    splits = tl.splits;
    long nchunks = k / MMQ_KC;
    long c_lo = nchunks * blockIdx.y / splits, c_hi = nchunks * (blockIdx.y + 1) / splits;
    int row0 = tl.row0;
    float acc[WR][NU][4];
#pragma unroll
    for (int i = 0; i < WR; i++)
#pragma unroll
        for (int u = 0; u < NU; u++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][u][e] = 0.0f;
    // the first weight chunk before waiting for the kernel that wrote the activations (no
    // kernel writes weights); then MMQ_STAGES - 1 chunks in flight, one commit group each
    const MmqWPieces<DT, ROWS, THREADS> wp(sg, tl.rend, row_bytes, row0);
    if (c_lo < c_hi) wp.stage(c_lo, smem);
    pdl_gemv_begin();
#pragma unroll
    for (int s = 0; s < MMQ_STAGES - 1; s++) {
        unsigned char* st = smem + s * STAGE;
        if (c_lo + s < c_hi) {
            if (s > 0) wp.stage(c_lo + s, st);
            mmq_stage_x<XR, THREADS>(xq, xd, m, k, t0, c_lo + s, st + WB, st + WB + XB);
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
            mmq_stage_x<XR, THREADS>(xq, xd, m, k, t0, cn, nx + WB, nx + WB + XB);
        }
        asm volatile("cp.async.commit_group;");
        const unsigned char* st = smem + ((c - c_lo) % MMQ_STAGES) * STAGE;
#pragma unroll
        for (int p = 0; p < MMQ_NB / (2 * WK); p++)
            mmq_blocks<DT, WR, NU, XR, WK, WB, XB>(acc, st, 2 * WK * p + wk, wm * WR, wn * NU);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (!mmq_join<WR, NU, WM, WN, WK>(acc, smem, wm * WN + wn, wk)) return;
    mmq_store<WR, NU>(acc, sg, m, ntot, tl.rend, row0 + wm * WR * 16, t0 + wn * NU * 8, splits, part);
}

// linear_mmq_w{WR}u{NU}m{WM}n{WN}k{WK}_{dtype}: the tile shapes that MmqPlan names.
#define LINMMQ1(name, DT, WR, NU, WM, WN, WK) \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN * WK, 16 / (WM * WN * WK)) \
        linear_mmq_w##WR##u##NU##m##WM##n##WN##k##WK##_##name(const signed char* xq, const float2* xd, LinSegs sg, \
                                                              int m, int ntot, int k, long rb, int splits, \
                                                              float* part) { \
        linear_mmq_t<DT, WR, NU, WM, WN, WK>(xq, xd, sg, m, ntot, k, rb, splits, part); \
    }
// The tile shapes of MmqPlan's SHAPES (WN · NU 8-row activation tiles per slice).
#define LINMMQ(name, DT) \
    LINMMQ1(name, DT, 2, 1, 4, 1, 2) \
    LINMMQ1(name, DT, 1, 1, 8, 1, 1) \
    LINMMQ1(name, DT, 2, 2, 4, 1, 2) \
    LINMMQ1(name, DT, 1, 2, 8, 1, 1) \
    LINMMQ1(name, DT, 1, 4, 8, 1, 1) \
    LINMMQ1(name, DT, 2, 4, 4, 2, 1) \
    LINMMQ1(name, DT, 1, 16, 8, 1, 1)
LINMMQ(q8_0, DT_Q8_0)
LINMMQ(q4_0, DT_Q4_0)
LINMMQ(q4_1, DT_Q4_1)
