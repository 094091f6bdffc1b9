// Block-weight products for a few activation rows on tensor cores: y[m, n] = x[m, k] · W[n, k]ᵀ
// (+ bias, + y), W in Q8_0 / Q4_0 / Q4_1, x in f16 (the cast or the producer's copy of the
// tensor-core path), f32 accumulation (mma.sync m16n8k16). Each weight block is read once from
// device memory for all 8 · NT activation rows of a launch slice and dequantized to f16 in
// registers (the value dequant_f16 gives), so a step of up to 64 rows reads its weights once,
// like a one-row GEMV.
//
// Grid (row tiles, k splits, row slices): a block of W warps takes MMA_ROWS(W) weight rows
// of one weight (MMA_WROWS tiles of 16 per warp; each weight of a launch starts a new block and
// has its own split count, see seg_tile; blocks past it exit), the k range of its split and
// 8 · NT activation rows. Chunk by chunk (MMA_KC values) the block copies the weight rows'
// blocks and the activation rows into shared memory with 16-byte cp.async (two stages: the
// next chunk arrives while one is used), so device memory is read in whole, coalesced pieces.
// Each thread's share of a copy is fixed for the block (the weight rows' addresses in a table
// in shared memory, filled once; its activation pieces' addresses in registers), so a chunk's
// copies cost a few instructions per piece. Rows past the weight's end / m are not copied:
// only their own outputs would read them, and those are not written. With one split the block writes
// y itself; with several it writes its partial sums to `part` [splits, m, ntot] and
// `mma_reduce_f32` adds them in split order (deterministic). Needs k % MMA_KC == 0 and weights
// at 16-byte aligned addresses.
//
// Fragments (natural k order): lane (g, t) takes, of weight rows g and g + 8 of a 32-value block,
// values 2t, 2t+1, 2t+8, 2t+9 (first 16-step) and 16 + the same (second): a 4-bit block's quant
// bytes 2t, 2t+1, 2t+8, 2t+9 hold both (low and high nibbles), so two 16-bit loads per row give a
// lane all it needs. Activation fragments come from shared memory by ldmatrix, four 8 × 8 tiles
// (the two steps' two halves) of one 8-row activation tile per instruction.

#define MMA_WROWS 1
// weight rows of a block of W warps
#define MMA_ROWS(W) ((W) * MMA_WROWS * 16)
#define MMA_KC 256
// halves per staged activation row: MMA_KC + 8 (row stride ≡ 4 words mod 32: the eight 16-byte
// rows of an ldmatrix tile hit distinct banks)
#define MMA_XS (MMA_KC + 8)

__device__ __forceinline__ void mma16816(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned int prmt(unsigned int a, unsigned int b, unsigned int s) {
    unsigned int r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}

__device__ __forceinline__ unsigned int hsub2u(unsigned int a, unsigned int b) {
    unsigned int r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ unsigned int hmul2u(unsigned int a, unsigned int b) {
    unsigned int r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ unsigned int hfma2u(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Bytes per staged weight row of one chunk (MMA_KC / 32 blocks), padded where the rows of a
// quad group would share banks (Q4_1: 160 -> 176 bytes).
template <int DT>
__device__ __forceinline__ constexpr int mma_wrow() {
    return DT == DT_Q4_0 ? 8 * 18 : (DT == DT_Q4_1 ? 8 * 20 + 16 : 8 * 34);
}

// A 32-bit word at a 2-byte aligned shared-memory address.
__device__ __forceinline__ unsigned int sm_w2(const unsigned char* p) {
    const unsigned short* h = (const unsigned short*)p;
    return (unsigned int)h[0] | ((unsigned int)h[1] << 16);
}

// What lane t of a quad group takes of one weight block: the quant words (q[0]; Q8_0 also
// q[1]) and the scale (Q4_1: scale | min << 16).
struct WQuad {
    unsigned int q[2];
    unsigned int d;
};

// Two 16-bit pieces at 2-byte aligned shared-memory addresses as one word (a low, b high).
__device__ __forceinline__ unsigned int sm_pair(const unsigned char* a, const unsigned char* b) {
    return (unsigned int)*(const unsigned short*)a | ((unsigned int)*(const unsigned short*)b << 16);
}

// Lane t's share of the staged block at blk: 4-bit weights, quant bytes 2t, 2t+1, 2t+8, 2t+9;
// Q8_0, values 2t, 2t+1, 2t+8, 2t+9 (q[0]) and 16 + the same (q[1]).
template <int DT>
__device__ __forceinline__ void wquad_load(const unsigned char* blk, int t, WQuad& w) {
    if (DT == DT_Q4_0) {
        w.d = *(const unsigned short*)blk;
        w.q[0] = sm_pair(blk + 2 + 2 * t, blk + 10 + 2 * t);
        w.q[1] = 0;
    } else if (DT == DT_Q4_1) {
        w.d = *(const unsigned int*)blk;
        w.q[0] = sm_pair(blk + 4 + 2 * t, blk + 12 + 2 * t);
        w.q[1] = 0;
    } else {
        w.d = *(const unsigned short*)blk;
        w.q[0] = sm_pair(blk + 2 + 2 * t, blk + 10 + 2 * t);
        w.q[1] = sm_pair(blk + 18 + 2 * t, blk + 26 + 2 * t);
    }
}

// The four f16 pairs of lane t's share of a block: a[0] / a[1] = the first step's values
// (2t, 2t+1) / (2t+8, 2t+9), a[2] / a[3] = the second step's.
template <int DT>
__device__ __forceinline__ void wquad_deq(const WQuad& w, unsigned int* a) {
    if (DT == DT_Q8_0) {
        // signed bytes + 128 as the mantissa of 1024 + u, minus 1152: the exact integer
        unsigned int x0 = w.q[0] ^ 0x80808080u, x1 = w.q[1] ^ 0x80808080u;
        const unsigned int off = 0x64806480u;  // 1152, 1152
        unsigned int d2 = w.d | (w.d << 16);
        a[0] = hmul2u(hsub2u(prmt(x0, 0x64646464u, 0x4140), off), d2);
        a[1] = hmul2u(hsub2u(prmt(x0, 0x64646464u, 0x4342), off), d2);
        a[2] = hmul2u(hsub2u(prmt(x1, 0x64646464u, 0x4140), off), d2);
        a[3] = hmul2u(hsub2u(prmt(x1, 0x64646464u, 0x4342), off), d2);
        return;
    }
    // low nibbles: the first step's values, high nibbles: the second's; each byte becomes the
    // mantissa of 1024 + q
    unsigned int lo = w.q[0] & 0x0F0F0F0Fu, hi = (w.q[0] >> 4) & 0x0F0F0F0Fu;
    unsigned int v[4] = {
        prmt(lo, 0x64646464u, 0x4140),
        prmt(lo, 0x64646464u, 0x4342),
        prmt(hi, 0x64646464u, 0x4140),
        prmt(hi, 0x64646464u, 0x4342),
    };
    if (DT == DT_Q4_0) {
        unsigned int d2 = (w.d & 0xffffu) | (w.d << 16);
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = hmul2u(hsub2u(v[i], 0x64086408u), d2);  // (q - 8) · d
    } else {
        unsigned int d2 = (w.d & 0xffffu) | (w.d << 16), m2 = (w.d >> 16) | (w.d & 0xffff0000u);
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = hfma2u(hsub2u(v[i], 0x64006400u), d2, m2);  // q · d + m
    }
}

// Four 8 × 8 f16 tiles from shared memory: lanes 8q..8q+7 give the row addresses of tile q,
// lane (g, t) receives row g, columns 2t, 2t+1 of each.
__device__ __forceinline__ void ldsm_x4(unsigned int addr, unsigned int* d) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(addr));
}

// Bytes of one weight row's chunk (MMA_KC / 32 blocks) in device memory.
template <int DT>
__device__ __forceinline__ constexpr int mma_wchunk() {
    return 8 * (DT == DT_Q4_0 ? 18 : (DT == DT_Q4_1 ? 20 : 34));
}

// What one thread of a block of W warps copies of every chunk's activations, fixed for the
// whole k range: piece xp (16 bytes) of the slice's activation rows xr, xr + MMA_XSTEP(W), …;
// x is row xr's address in chunk 0. Rows past m are not copied (their outputs are not
// written, so their staged values do not matter).
#define MMA_XSTEP(W) (32 * (W) / (MMA_KC / 8))
struct MmaCopy {
    const unsigned char* x;  // activation row xr, values 8·xp..
    unsigned int xs;         // shared-memory offset of row xr, piece xp in a stage's activations
    int xlive;               // how many of rows xr, xr + MMA_XSTEP(W), … of the slice are below m
};

// The thread's activation copy plan (see MmaCopy) for the slice of 8·NT rows from t0, staged
// rows XS halves apart.
template <int NT, int W, int XS = MMA_XS>
__device__ __forceinline__ MmaCopy mma_copy_plan(const unsigned short* x, int m, int k, int t0) {
    MmaCopy cp;
    int xr = threadIdx.x / (MMA_KC / 8), xp = threadIdx.x % (MMA_KC / 8);
    int left = min(m - t0, 8 * NT) - xr;
    cp.xlive = left > 0 ? (left + MMA_XSTEP(W) - 1) / MMA_XSTEP(W) : 0;
    cp.x = (const unsigned char*)(x + (long)(t0 + (left > 0 ? xr : 0)) * k + 8 * xp);
    cp.xs = (unsigned int)((xr * XS + 8 * xp) * 2);
    return cp;
}

// Fills rows[r] with the address of launch row row0 + r (its first chunk), null from rend on
// (the end of the block's weight), for the MMA_ROWS(W) rows of a block of W warps; the caller
// synchronizes before the table is read.
template <int W>
__device__ __forceinline__ void mma_row_table(const LinSegs& sg, int rend, long row_bytes, int row0,
                                              const unsigned char** rows) {
    for (int r = threadIdx.x; r < MMA_ROWS(W); r += 32 * W) {
        int jg = row0 + r;
        SEG_PICK(jg < rend ? jg : row0)
        (void)bias;
        (void)y;
        (void)n;
        rows[r] = jg < rend ? w + (long)j * row_bytes : nullptr;
    }
}

__device__ __forceinline__ void cp_async16(unsigned int dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}

// Starts copying chunk c (MMA_KC values) of the block's weight rows (addresses in the row
// table rows) into the stage at shared address st with 16-byte cp.async, consecutive threads
// taking consecutive pieces (a warp reads whole runs of each row's chunk); rows past the weight are
// not copied. Joins the caller's commit group.
template <int DT, int W>
__device__ __forceinline__ void mma_stage_w(const unsigned char* const* rows, long c, unsigned int st) {
    constexpr int PER_ROW = mma_wchunk<DT>() / 16, PIECES = MMA_ROWS(W) * PER_ROW, THREADS = 32 * W;
    int r0 = threadIdx.x / PER_ROW, p0 = threadIdx.x % PER_ROW;
    long off = c * mma_wchunk<DT>();
#pragma unroll
    for (int q = 0; q < (PIECES + THREADS - 1) / THREADS; q++) {
        // piece threadIdx.x + q·THREADS: row r, piece p of the row
        int r = r0 + q * THREADS / PER_ROW, p = p0 + q * THREADS % PER_ROW;
        if (p >= PER_ROW) {
            p -= PER_ROW;
            r++;
        }
        if (PIECES % THREADS != 0 && r >= MMA_ROWS(W)) break;
        const unsigned char* row = rows[r];
        if (row) cp_async16(st + r * mma_wrow<DT>() + 16 * p, row + off + 16 * p);
    }
}

// Starts copying chunk c of the slice's activation rows into the activations of a stage at
// shared address xst (rows XS halves apart), as the thread's plan cp says; joins the caller's
// commit group.
template <int NT, int W, int XS = MMA_XS>
__device__ __forceinline__ void mma_stage_x(const MmaCopy& cp, long k, long c, unsigned int xst) {
    constexpr int XSTEP = MMA_XSTEP(W);
    const unsigned char* src = cp.x + c * (MMA_KC * 2);
    unsigned int dst = xst + cp.xs;
    long step = (long)XSTEP * k * 2;
#pragma unroll
    for (int s = 0; s < (8 * NT + XSTEP - 1) / XSTEP; s++) {
        if (s < cp.xlive) cp_async16(dst + s * XSTEP * XS * 2, src);
        src += step;
    }
}

// Writes a warp's sums acc of one 16-row weight tile (launch rows from jt, those below rend) and
// the 8·NT activation rows from t0 (those below m): into the outputs (+ bias, + y with the
// segments' acc, f16 with out_half), or with several k splits into the split's partial sums.
// acc[u][e]: weight row g + 8 (e >> 1), activation row 8u + 2t + (e & 1).
template <int NT>
__device__ __forceinline__ void mma_store_tile(const float (*acc)[4], const LinSegs& sg, int jt, int rend, int t0, int m,
                                               int ntot, int splits, float* part, int out_half) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int jg = jt + 8 * (e >> 1) + g;
        if (jg >= rend) continue;
#pragma unroll
        for (int u = 0; u < NT; u++) {
            int r = t0 + 8 * u + 2 * t + (e & 1);
            if (r >= m) continue;
            float v = acc[u][e];
            if (splits > 1) {
                part[((long)blockIdx.y * m + r) * ntot + jg] = v;
                continue;
            }
            SEG_PICK(jg)
            long o = (long)r * n + j;
            if (out_half) {
                ((unsigned short*)y)[o] = f2h(v + (bias ? bias[j] : 0.0f));
            } else {
                y[o] = (sg.acc ? y[o] : 0.0f) + v + (bias ? bias[j] : 0.0f);
            }
        }
    }
}

// The block's rows [tl.row0, tl.rend) of one weight (seg_tile, MMA_ROWS(W) rows a block) and the
// chunks [c_lo, c_hi) of k of its split (that weight's own split count); false for a block past
// its weight's splits.
template <int W>
__device__ __forceinline__ bool mma_block_range(const LinSegs& sg, int k, SegTile& tl, long& c_lo, long& c_hi) {
    tl = seg_tile(sg, MMA_ROWS(W), blockIdx.x);
    if ((int)blockIdx.y >= tl.splits) return false;
    long nchunks = k / MMA_KC;
    c_lo = nchunks * blockIdx.y / tl.splits;
    c_hi = nchunks * (blockIdx.y + 1) / tl.splits;
    return true;
}

// One block of the product (see the file comment): its weight rows' products with activation
// rows [t0, t0 + 8·NT) over chunks [c_lo, c_hi) of k, with W warps (MMA_ROWS(W) weight rows).
template <int DT, int NT, int W>
__device__ void linear_mma_t(const unsigned short* x, const LinSegs& sg, int m, int ntot, int k, long row_bytes,
                             int splits, float* part, int out_half) {
    extern __shared__ uint4 mma_smem[];
    // each of the two stages: the weight rows' chunk, then the activation rows' chunk
    constexpr int WBYTES = MMA_ROWS(W) * mma_wrow<DT>(), STAGE = WBYTES + 8 * NT * MMA_XS * 2;
    unsigned char* smem = (unsigned char*)mma_smem;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int t0 = blockIdx.z * 8 * NT;
    SegTile tl;
    long c_lo, c_hi;
    if (!mma_block_range<W>(sg, k, tl, c_lo, c_hi)) return;
    splits = tl.splits;
    int row0 = tl.row0, rend = tl.rend;
    MmaCopy cp = mma_copy_plan<NT, W>(x, m, k, t0);
    unsigned int sbase = (unsigned int)__cvta_generic_to_shared(smem);
    // the weight rows' addresses, after the two stages
    const unsigned char** rows = (const unsigned char**)(smem + 2 * STAGE);
    mma_row_table<W>(sg, rend, row_bytes, row0, rows);
    __syncthreads();
    float acc[MMA_WROWS][NT][4];
#pragma unroll
    for (int i = 0; i < MMA_WROWS; i++)
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][u][e] = 0.0f;
    // the first weight chunk before waiting for the kernel that wrote the activations (no
    // kernel writes weights); two stages: chunk c + 1 arrives while chunk c is used
    if (c_lo < c_hi) mma_stage_w<DT, W>(rows, c_lo, sbase);
    pdl_gemv_begin();
    if (c_lo < c_hi) {
        mma_stage_x<NT, W>(cp, k, c_lo, sbase + WBYTES);
        asm volatile("cp.async.commit_group;");
    }
    for (long c = c_lo; c < c_hi; c++) {
        const unsigned char* st = smem + ((c - c_lo) & 1) * STAGE;
        // this lane's ldmatrix row: activation row (lane & 7) of a tile, values 8 (lane >> 3)..
        unsigned int xs_lane = (unsigned int)__cvta_generic_to_shared(st + WBYTES) +
                               (unsigned int)(((lane & 7) * MMA_XS + 8 * (lane >> 3)) * 2);
        if (c + 1 < c_hi) {
            unsigned int nx = sbase + ((c + 1 - c_lo) & 1) * STAGE;
            mma_stage_w<DT, W>(rows, c + 1, nx);
            mma_stage_x<NT, W>(cp, k, c + 1, nx + WBYTES);
            asm volatile("cp.async.commit_group;");
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
#pragma unroll
        for (int bb = 0; bb < MMA_KC / 32; bb++) {
            constexpr int BS = DT == DT_Q4_0 ? 18 : (DT == DT_Q4_1 ? 20 : 34);
            unsigned int af[MMA_WROWS][2][4];
#pragma unroll
            for (int i = 0; i < MMA_WROWS; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    // weight row 16 (warp · MMA_WROWS + i) + 8 h + g of the block
                    int r = (warp * MMA_WROWS + i) * 16 + 8 * h + g;
                    WQuad wq;
                    wquad_load<DT>(st + r * mma_wrow<DT>() + bb * BS, t, wq);
                    wquad_deq<DT>(wq, af[i][h]);
                }
            // A fragments of tile i, step s: rows g / g+8, pairs (2t, 2t+1) / (2t+8, 2t+9)
            unsigned int a[MMA_WROWS][2][4];
#pragma unroll
            for (int i = 0; i < MMA_WROWS; i++)
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    a[i][s][0] = af[i][0][2 * s];
                    a[i][s][1] = af[i][1][2 * s];
                    a[i][s][2] = af[i][0][2 * s + 1];
                    a[i][s][3] = af[i][1][2 * s + 1];
                }
#pragma unroll
            for (int u = 0; u < NT; u++) {
                // tiles q = 0..3: values 8q..8q+7 of the block for activation rows 8u..8u+7
                unsigned int b[4];
                ldsm_x4(xs_lane + (unsigned int)((8 * u * MMA_XS + bb * 32) * 2), b);
#pragma unroll
                for (int i = 0; i < MMA_WROWS; i++) {
                    mma16816(acc[i][u], a[i][0], b[0], b[1]);
                    mma16816(acc[i][u], a[i][1], b[2], b[3]);
                }
            }
        }
        // every warp is done with this stage before it is refilled
        __syncthreads();
    }
    int base = row0 + warp * MMA_WROWS * 16;
#pragma unroll
    for (int i = 0; i < MMA_WROWS; i++) mma_store_tile<NT>(acc[i], sg, base + 16 * i, rend, t0, m, ntot, splits, part, out_half);
}

// W = 8 (128 weight rows, two blocks per multiprocessor) for every NT; suffix `w`: W = 16 (256
// rows, one block: half the activation copies per weight row) for Q8_0 with NT = 8.
#define LINMMA1(name, DT, NT, W, TAG) \
    extern "C" __global__ void __launch_bounds__(32 * W, 16 / W) linear_mma##NT##TAG##_##name( \
        const unsigned short* x, LinSegs sg, int m, int ntot, int k, long rb, int splits, float* part, int oh) { \
        linear_mma_t<DT, NT, W>(x, sg, m, ntot, k, rb, splits, part, oh); \
    }
#define LINMMA(name, DT) \
    LINMMA1(name, DT, 1, 8, ) \
    LINMMA1(name, DT, 2, 8, ) \
    LINMMA1(name, DT, 4, 8, ) \
    LINMMA1(name, DT, 8, 8, )
LINMMA(q8_0, DT_Q8_0)
LINMMA(q4_0, DT_Q4_0)
LINMMA(q4_1, DT_Q4_1)
LINMMA1(q8_0, DT_Q8_0, 8, 16, w)

// y (+)= Σ_s part[s] + bias over the segments, each segment's splits added in order (a segment
// of one split was written by the product itself); out_half: f16 outputs.
extern "C" __global__ void mma_reduce_f32(const float* part, LinSegs sg, int m, int ntot, int splits, int out_half) {
    pdl_begin();
    long total = (long)m * ntot;
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (long)gridDim.x * blockDim.x) {
        int r = (int)(id / ntot), jg = (int)(id % ntot);
        SEG_PICK(jg)
        int ns = si == 0 ? sg.splits[0] : (si == 1 ? sg.splits[1] : sg.splits[2]);
        if (ns < 2) continue;
        float v = 0.0f;
        for (int s = 0; s < ns; s++) v += part[(long)s * total + id];
        long o = (long)r * n + j;
        if (out_half) {
            ((unsigned short*)y)[o] = f2h(v + (bias ? bias[j] : 0.0f));
        } else {
            y[o] = (sg.acc ? y[o] : 0.0f) + v + (bias ? bias[j] : 0.0f);
        }
    }
}
