// F16-weight products for a few activation rows on tensor cores: y[m, n] = x[m, k] · W[n, k]ᵀ
// (+ bias, + y), W and x in f16, f32 accumulation (mma.sync m16n8k16). The grid, the k splits,
// the per-weight tiles and the outputs are those of linear_mma (its launch code and
// mma_store_tile); what differs is how the operands arrive. F16 weights need no dequantization,
// so each lane loads its share of a weight row straight from device memory into registers
// (16-byte loads, AHEAD 32-value spans ahead of the one in use), and only the activation
// rows are staged in shared memory, chunk by chunk (MMA_KC values, two stages, cp.async).
//
// Fragments (a permuted k order, the same for both operands, so the sums are those of the
// product): of each 32-value span, lane (g, t) loads values 8t..8t+7 of weight rows g and g + 8
// and of activation row g (16 bytes each). Word 2s of those 16 bytes is what the natural order
// would give the lane for k values (2t, 2t+1) of 16-step s, word 2s + 1 for (2t+8, 2t+9); the
// span's two steps thus cover its 32 values once. Staged activation rows are HMMA_XS halves
// apart (≡ 64 bytes mod 128), so the 16-byte shared-memory reads of each group of 8 lanes (two
// rows, four pieces) hit distinct banks. Needs k % MMA_KC == 0 and 16-byte aligned rows.

#define HMMA_XS (MMA_KC + 32)

// 16 bytes of weights at p, streamed past L1 (read once per launch); L2 fetches the whole 256-byte
// piece, which the warp's next three spans of the row read.
__device__ __forceinline__ uint4 hmma_ldw(const unsigned char* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// 16 bytes of shared memory at shared address a.
__device__ __forceinline__ uint4 hmma_lds(unsigned int a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}

// One span's two 16-steps for weight rows g, g + 8 (wa, wb) and the NT activation tiles of the
// stage whose lane address is xs (row g of tile 0, values 8t.. of the span).
template <int NT>
__device__ __forceinline__ void hmma_span(float (*acc)[4], uint4 wa, uint4 wb, unsigned int xs) {
    unsigned int a0[4] = {wa.x, wb.x, wa.y, wb.y}, a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
    for (int u = 0; u < NT; u++) {
        uint4 b = hmma_lds(xs + (unsigned int)(8 * u * HMMA_XS * 2));
        mma16816(acc[u], a0, b.x, b.y);
        mma16816(acc[u], a1, b.z, b.w);
    }
}

// One block of W warps: weight rows [row0, row0 + 16 W) of one weight (a 16-row tile per warp)
// against activation rows [t0, t0 + 8·NT) over the chunks of its k split, the weights of AHEAD
// spans (a divisor of MMA_KC / 32) in flight.
template <int NT, int W, int AHEAD>
__device__ void linear_hmma_t(const unsigned short* x, const LinSegs& sg, int m, int ntot, int k, long row_bytes,
                              int splits, float* part, int out_half) {
    extern __shared__ uint4 mma_smem[];
    constexpr int STAGE = 8 * NT * HMMA_XS * 2, SPANS = MMA_KC / 32;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int t0 = blockIdx.z * 8 * NT;
    SegTile tl;
    long c_lo, c_hi;
    if (!mma_block_range<W>(sg, k, tl, c_lo, c_hi)) return;
    splits = tl.splits;
    // this lane's weight rows (rows past the weight read its first row: their outputs are not written)
    int jt = tl.row0 + 16 * warp, ja = jt + g, jb = ja + 8;
    const unsigned char *wa, *wb;
    {
        SEG_PICK(ja < tl.rend ? ja : tl.row0)
        (void)bias;
        (void)y;
        (void)n;
        wa = w + (long)j * row_bytes + 16 * t;
    }
    {
        SEG_PICK(jb < tl.rend ? jb : tl.row0)
        (void)bias;
        (void)y;
        (void)n;
        wb = w + (long)j * row_bytes + 16 * t;
    }
    // span q of k: values 32q.. (64 bytes a row)
    long q_lo = c_lo * SPANS, q_hi = c_hi * SPANS;
    uint4 ra[AHEAD], rb[AHEAD];
#pragma unroll
    for (int i = 0; i < AHEAD; i++) {
        if (q_lo + i < q_hi) {
            ra[i] = hmma_ldw(wa + (q_lo + i) * 64);
            rb[i] = hmma_ldw(wb + (q_lo + i) * 64);
        }
    }
    MmaCopy cp = mma_copy_plan<NT, W, HMMA_XS>(x, m, k, t0);
    unsigned int sbase = (unsigned int)__cvta_generic_to_shared(mma_smem);
    pdl_gemv_begin();
    if (c_lo < c_hi) {
        mma_stage_x<NT, W, HMMA_XS>(cp, k, c_lo, sbase);
        asm volatile("cp.async.commit_group;");
    }
    float acc[NT][4];
#pragma unroll
    for (int u = 0; u < NT; u++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[u][e] = 0.0f;
    for (long c = c_lo; c < c_hi; c++) {
        unsigned int st = sbase + ((c - c_lo) & 1) * STAGE;
        if (c + 1 < c_hi) {
            mma_stage_x<NT, W, HMMA_XS>(cp, k, c + 1, sbase + ((c + 1 - c_lo) & 1) * STAGE);
            asm volatile("cp.async.commit_group;");
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        unsigned int xs = st + (unsigned int)((g * HMMA_XS + 8 * t) * 2);
        long q0 = (c - c_lo) * SPANS + q_lo;
#pragma unroll
        for (int i = 0; i < SPANS; i++) {
            // SPANS is a multiple of AHEAD: slot i % AHEAD holds span q0 + i
            constexpr int R = AHEAD;
            uint4 ca = ra[i % R], cb = rb[i % R];
            long qn = q0 + i + R;
            if (qn < q_hi) {
                ra[i % R] = hmma_ldw(wa + qn * 64);
                rb[i % R] = hmma_ldw(wb + qn * 64);
            }
            hmma_span<NT>(acc, ca, cb, xs + (unsigned int)(i * 64));
        }
        // every warp is done with this stage before it is refilled
        __syncthreads();
    }
    mma_store_tile<NT>(acc, sg, jt, tl.rend, t0, m, ntot, splits, part, out_half);
}

// W = 8 (128 weight rows per block, as linear_mma's narrow blocks); MINB blocks per
// multiprocessor (one activation tile fits in 80 registers: three blocks), AHEAD spans of
// weights in flight per warp.
#define LINHMMA(NT, MINB, AHEAD)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256, MINB) linear_mma##NT##_f16(                                      \
        const unsigned short* x, LinSegs sg, int m, int ntot, int k, long rb, int splits, float* part, int oh) {       \
        linear_hmma_t<NT, 8, AHEAD>(x, sg, m, ntot, k, rb, splits, part, oh);                                          \
    }
LINHMMA(1, 3, 4)
LINHMMA(2, 2, 4)
LINHMMA(4, 2, 4)
LINHMMA(8, 2, 4)
