// Paged decode attention (flash-decoding over block tables): one query row per sequence, keys
// and values in a pool of slots [slots, nkv, hd] (f16, f32 or q8_0: see q8kv in attention.cu) addressed through per-sequence
// block tables. Every index array is read on the device, so a recorded step (CUDA graph) replays
// with new lengths and tables.
//
// The scalar kernels (paged_decode_impl; f16 caches of head size 64 or 128 take the tensor-core
// form paged_decode_tc below, except batch-invariant launches):
// Block (kv head × head chunk, sequence, split) of NW warps (4; f16 caches also 8, which the host
// takes for launches of few blocks) handles up to PD_GMAX of
// the G = nh / nkv query heads of its kv head (each key and value row is read once for them); the
// kernel's GM (1, 2, 4, 8: the host picks the smallest power of two ≥ G) sizes its registers.
// Each warp takes PD_KPW keys per iteration into its running softmax at once (one rescale per head).
// Head size hd ≤ 32·DPL: lane l owns dims l·DPL .. l·DPL + DPL − 1 (those below hd).
// Sequence s has L = kv_lens[s] keys (L = 0: a padding row, output zeros); its query sits at position L - 1 and sees keys
// lo..L-1 (lo = L - window with a window). The step's own key and value (rows s of k, v) belong at
// position L - 1 in slot slots[s] (skipped when < 0): the block whose range holds L - 1 stores
// them (rounded to the cache's type) before reading its keys (the head chunks of one kv head
// write the same values), so no block reads that slot before its own store.
// Splits: the keys lo..L-1 are cut into pieces of `chunk(L)` keys (a function of L and the launch's
// split count only, so a row's result does not depend on the other rows of the batch); blocks
// past the last piece exit. With one split the block writes the output row, else its unnormalized
// part (max, sum, acc[hd]) goes to `part` and paged_decode_combine merges them.
// Scores: q·k * scale, then softcap·tanh(s / softcap), then + slope[h]·(j - (L - 1)); with
// `sinks` ([nh] or null) head h's sink joins the softmax denominator (att_inv).
// Keys whose slot lies outside the pool (a bad table entry) are skipped.
// A block stages its key range's block-table entries in shared memory, and each warp requests the key
// and value rows of its PD_KPW keys at once: one memory latency per PD_KPW keys, not one per row.
// With the step's rotary tables (rcos, rsin: [rows, rot/2]) the query and the step's key are
// rotated as they are read (rope_value, as RotaryEmbedding rotates), which replaces that launch;
// with a copy (oh: f16 / bf16, or oq / od: Q8_0 rows) the output is also written in the form the
// o-projection reads, which replaces its cast or quantization.

#define PD_GMAX 8
#define PD_KPW 4
#define PD_MIN_CHUNK 256
// block-table entries staged in shared memory at a time
#define PD_TBS 1024

__device__ __forceinline__ float pd_ld(const float* p) { return *p; }
__device__ __forceinline__ float pd_ld(const unsigned short* p) { return h2f(*p); }
__device__ __forceinline__ void pd_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void pd_st(unsigned short* p, float v) { *p = f2h(v); }

// The lane's DPL elements of a cache row starting at p, as floats (`n` of them valid; all when
// `full`, read with vector loads).
template <int DPL>
__device__ __forceinline__ void pd_row(const float* p, float* out, bool full, int n) {
#pragma unroll
    for (int t = 0; t < DPL; t++) out[t] = full || t < n ? p[t] : 0.0f;
}
template <int DPL>
__device__ __forceinline__ void pd_row(const unsigned short* p, float* out, bool full, int n) {
    if (DPL % 4 == 0 && full) {
#pragma unroll
        for (int t = 0; t < DPL; t += 4) {
            uint2 u = *(const uint2*)(p + t);
            out[t] = h2f((unsigned short)(u.x & 0xffff));
            out[t + 1] = h2f((unsigned short)(u.x >> 16));
            out[t + 2] = h2f((unsigned short)(u.y & 0xffff));
            out[t + 3] = h2f((unsigned short)(u.y >> 16));
        }
    } else {
#pragma unroll
        for (int t = 0; t < DPL; t++) out[t] = full || t < n ? h2f(p[t]) : 0.0f;
    }
}

// The lane's DPL elements of a cache from element e (`n` of them valid; all when `full`): f32 and
// f16 through pd_row, q8_0 from one block (DPL divides 32, e a multiple of DPL).
template <int DPL>
__device__ __forceinline__ void pd_rowe(const float* p, long e, float* out, bool full, int n) {
    pd_row<DPL>(p + e, out, full, n);
}
template <int DPL>
__device__ __forceinline__ void pd_rowe(const unsigned short* p, long e, float* out, bool full, int n) {
    pd_row<DPL>(p + e, out, full, n);
}
template <int DPL>
__device__ __forceinline__ void pd_rowe(const q8kv* p, long e, float* out, bool full, int n) {
    const unsigned char* blk = q8kv_block(p, e);
    float d = h2f(*(const unsigned short*)blk);
    const signed char* qp = (const signed char*)blk + 2 + (e & 31);
#pragma unroll
    for (int t = 0; t < DPL; t++) out[t] = full || t < n ? d * (float)qp[t] : 0.0f;
}

// The rotary tables of a step (row s's angles at cos + s · rot / 2; cos null: q and k arrive
// rotated), rotation as RotaryEmbedding's (rope_value).
struct PdRope {
    const float* cos;
    const float* sin;
    int rot, style;
};

// Value d of head row x, rotated with row s's angles when the step carries tables.
__device__ __forceinline__ float pd_roped(const float* x, int d, const PdRope& r, int s) {
    if (!r.cos) return x[d];
    long o = (long)s * (r.rot >> 1);
    return rope_value(x, d, r.rot, r.style, r.cos + o, r.sin + o);
}

// The step's key k (rotated for row s by r) and value v (hd values each) at elements e of the
// caches, by the whole block: a thread per value (f32, f16), or for q8_0 a warp per block of 32
// (the key's, then the value's).
template <typename T>
__device__ __forceinline__ void pd_store_step(T* kc, T* vc, long e, const float* k, const float* v, int hd,
                                              const PdRope& r, int s) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        pd_st(kc + e + d, pd_roped(k, d, r, s));
        pd_st(vc + e + d, v[d]);
    }
}
__device__ __forceinline__ void pd_store_step(q8kv* kc, q8kv* vc, long e, const float* k, const float* v, int hd,
                                              const PdRope& r, int s) {
    int nb = (hd + 31) >> 5, lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < 2 * nb; b += blockDim.x >> 5) {
        int d = (b % nb) * 32 + lane;
        float x = d < hd ? (b < nb ? pd_roped(k, d, r, s) : v[d]) : 0.0f;
        q8kv_store_block(b < nb ? kc : vc, e + (b % nb) * 32, x);
    }
}

// Where an output row goes besides `out`: its copy for the o-projection, f16 (bf = 0) or bf16
// (bf = 1) at `h`, or Q8_0 rows at q / d (hd % 32 == 0: a warp's 32 lanes hold one block);
// null pointers: no copy.
struct PdCopy {
    unsigned short* h;
    int bf;
    signed char* q;
    float2* d;
};

// Output value `val` at flat index o, and its copy. With a Q8_0 copy every lane of the warp
// calls it (the block's scale is a warp reduction).
__device__ __forceinline__ void pd_out(float* out, long o, float val, const PdCopy& c) {
    out[o] = val;
    if (c.h) c.h[o] = c.bf ? f2bf(val) : f2h(val);
    if (c.q) da_quant_store(val, o, c.q, c.d);
}

// Dim d of head h of row s once its keys are summed (a: its unnormalized value, mm / ls: the
// softmax max and sum): the output (and its copy) when the row has one split, else split z's
// part for paged_decode_combine.
__device__ __forceinline__ void pd_finish(float* out, float* part, const PdCopy& copy, const float* sinks, int s,
                                          int nh, long h, int hd, int d, int z, int nsplit, float a, float mm,
                                          float ls) {
    if (nsplit == 1) {
        pd_out(out, ((long)s * nh + h) * hd + d, a * att_inv(ls, mm, att_sink(sinks, h)), copy);
    } else {
        float* pp = part + (((long)s * nh + h) * nsplit + z) * (hd + 2);
        pp[2 + d] = a;
        if (d == 0) {
            pp[0] = mm;
            pp[1] = ls;
        }
    }
}

// Sums each of the N values v[0..N) of every lane over the warp's 32 lanes (N a power of two,
// at most 32) with N - 1 + 5 - log2 N shuffles instead of 5 N: at each of the first log2 N steps a
// lane keeps half of its values and adds its partner's copy of that half, sending the other
// half. Lane l ends with the sum of value l >> (5 - log2 N) (pd_red_index), in v[0].
template <int N>
__device__ __forceinline__ float pd_warp_sum_scatter(float (&v)[N], int lane) {
    int n = N;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (n > 1) {
            bool hi = (lane & o) != 0;
#pragma unroll
            for (int i = 0; i < N / 2; i++) {
                if (i < n / 2) {
                    float send = hi ? v[i] : v[i + n / 2];
                    float keep = hi ? v[i + n / 2] : v[i];
                    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                }
            }
            n >>= 1;
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        }
    }
    return v[0];
}

// Which of the N values lane l holds after pd_warp_sum_scatter, and the first lane holding
// value i.
template <int N>
__device__ __forceinline__ int pd_red_index(int lane) {
    return lane >> (N >= 32 ? 0 : (N >= 16 ? 1 : (N >= 8 ? 2 : (N >= 4 ? 3 : (N >= 2 ? 4 : 5)))));
}
template <int N>
__device__ __forceinline__ int pd_red_lane(int i) {
    return i << (N >= 32 ? 0 : (N >= 16 ? 1 : (N >= 8 ? 2 : (N >= 4 ? 3 : (N >= 2 ? 4 : 5)))));
}

// Keys per split for a row of n visible keys over `nsplit` splits (multiple of 32).
__device__ __forceinline__ int pd_chunk(int n, int nsplit) {
    int c = (n + nsplit - 1) / nsplit;
    c = (c + 31) & ~31;
    return c < PD_MIN_CHUNK ? PD_MIN_CHUNK : c;
}

// Block-table entries b0 .. b0 + nb - 1 of a row (tb) into shared memory (-1 past maxb), by the
// whole block.
__device__ __forceinline__ void pd_stage_table(int* tbs, const int* tb, int b0, int nb, int maxb) {
    for (int i = threadIdx.x; i < nb; i += blockDim.x) tbs[i] = b0 + i < maxb ? tb[b0 + i] : -1;
}

// Warp-level online-softmax state for G <= GM heads: each lane owns dims lane*DPL .. lane*DPL+DPL-1.
template <typename T, int DPL, int GM, int NW>
__device__ void paged_decode_impl(const float* q, const float* k, const float* v, T* kc, T* vc,
                                  const int* slots, const int* kv_lens, const int* tables,
                                  const float* slopes, float* out, float* part, int maxb, int bs,
                                  long nslots, int nh, int nkv, int hd, float scale, float softcap,
                                  int window, const float* sinks, PdRope rope, PdCopy copy) {
    __shared__ float qs[GM][DPL * 32];
    __shared__ float wm[NW][GM], wl[NW][GM];
    __shared__ float wacc[NW][GM][DPL * 32];
    __shared__ int tbs[PD_TBS];
    pdl_begin();
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int group = nh / nkv, nchunk = (group + PD_GMAX - 1) / PD_GMAX;
    int kvh = blockIdx.x / nchunk, g0 = (blockIdx.x % nchunk) * PD_GMAX;
    int s = blockIdx.y, z = blockIdx.z, nsplit = gridDim.z;
    int G = min(GM, group - g0);  // heads of this block: kvh * group + g0 + g (the host picks GM >= G)
    bool full = hd == DPL * 32;
    int nv = hd - lane * DPL;  // valid dims of this lane (all when >= DPL)
    int L = kv_lens[s];
    int lo = window > 0 && L > window ? L - window : 0;
    int n = L > lo ? L - lo : 0;
    int chunk = pd_chunk(n, nsplit);
    int j0 = lo + z * chunk, j1 = min(L, j0 + chunk);
    if (z > 0 && j0 >= L) return;  // nothing for this split (the combine skips it)
    const int hs = att_hs(kc, hd);
    long rs = (long)nkv * hs;
    // the step's key and value: stored by the block whose range holds L - 1
    if (L > 0 && j0 <= L - 1 && L - 1 < j1) {
        int slot = slots[s];
        if (slot >= 0 && slot < nslots)
            pd_store_step(kc, vc, slot * rs + (long)kvh * hs, k + ((long)s * nkv + kvh) * hd,
                          v + ((long)s * nkv + kvh) * hd, hd, rope, s);
    }
    for (int i = tid; i < GM * DPL * 32; i += NW * 32) {
        int g = i / (DPL * 32), d = i % (DPL * 32);
        qs[g][d] = g < G && d < hd ? pd_roped(q + ((long)s * nh + kvh * group + g0 + g) * hd, d, rope, s) : 0.0f;
    }
    const int* tb = tables + (long)s * maxb;
    // the range's block-table entries go to shared memory a segment at a time, so a warp's
    // keys need no dependent table read; a segment (at most PD_TBS entries) holds a multiple of
    // NW * PD_KPW keys, so every warp takes the same keys in the same order as in one pass.
    // The first segment's entries are requested with the queries, before the first barrier.
    const int seglen = (PD_TBS - 1) * bs / (NW * PD_KPW) * (NW * PD_KPW);
    if (j0 < j1) pd_stage_table(tbs, tb, j0 / bs, (min(j1, j0 + seglen) - 1) / bs - j0 / bs + 1, maxb);
    __syncthreads();
    float m[GM], l[GM], acc[GM][DPL];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INF;
        l[g] = 0.0f;
#pragma unroll
        for (int t = 0; t < DPL; t++) acc[g][t] = 0.0f;
    }
    float qv[GM][DPL];  // the lane's dims of the block's queries (zero past G and hd)
#pragma unroll
    for (int g = 0; g < GM; g++) {
#pragma unroll
        for (int t = 0; t < DPL; t++) qv[g][t] = qs[g][lane * DPL + t];
    }
    long p = (long)L - 1;
    for (int seg0 = j0; seg0 < j1; seg0 += seglen) {
        int seg1 = min(j1, seg0 + seglen), b0 = seg0 / bs, nb = (seg1 - 1) / bs - b0 + 1;
        if (seg0 > j0) {
            __syncthreads();
            pd_stage_table(tbs, tb, b0, nb, maxb);
            __syncthreads();
        }
        for (int jb = seg0 + w * PD_KPW; jb < seg1; jb += NW * PD_KPW) {
            // every key and value row of the warp's PD_KPW keys is requested before any is used
            float kr[PD_KPW][DPL], vr[PD_KPW][DPL];
            long sl[PD_KPW];
#pragma unroll
            for (int u = 0; u < PD_KPW; u++) {
                int j = jb + u;
                long slot = -1;
                if (j < seg1) {
                    long blk = tbs[j / bs - b0];
                    slot = blk * bs + j % bs;
                    if (blk < 0 || slot >= nslots) slot = -1;
                }
                sl[u] = slot;
#pragma unroll
                for (int t = 0; t < DPL; t++) kr[u][t] = vr[u][t] = 0.0f;
                if (slot >= 0 && nv > 0) {
                    long e = slot * rs + (long)kvh * hs + lane * DPL;
                    pd_rowe<DPL>(kc, e, kr[u], full, nv);
                    pd_rowe<DPL>(vc, e, vr[u], full, nv);
                }
            }
            // the lane's parts of the PD_KPW x GM dot products, summed over the warp at once;
            // the lane holding score (u, g) finishes it, and every lane then reads all of them
            constexpr int NS = PD_KPW * GM;
            float dot[NS];
#pragma unroll
            for (int u = 0; u < PD_KPW; u++) {
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    float a = 0.0f;
#pragma unroll
                    for (int t = 0; t < DPL; t++) a += qv[g][t] * (t < nv ? kr[u][t] : 0.0f);
                    dot[u * GM + g] = a;
                }
            }
            float mine;
            {
                int i = pd_red_index<NS>(lane), u = i / GM, g = i % GM;
                float a = pd_warp_sum_scatter<NS>(dot, lane) * scale;
                if (softcap > 0.0f) a = softcap * tanhf(a / softcap);
                if (slopes && g < G) a += slopes[kvh * group + g0 + g] * (float)(jb + u - p);
                long su = sl[0];
#pragma unroll
                for (int x = 1; x < PD_KPW; x++) su = u == x ? sl[x] : su;
                mine = su >= 0 && g < G ? a : -INF;
            }
            float sc[PD_KPW][GM];
#pragma unroll
            for (int u = 0; u < PD_KPW; u++) {
#pragma unroll
                for (int g = 0; g < GM; g++) sc[u][g] = __shfl_sync(0xffffffffu, mine, pd_red_lane<NS>(u * GM + g));
            }
            // the warp's PD_KPW keys join the running softmax at once: one rescale of the sums
            // per head and iteration (a key past the range has score -INF and a zero value row)
#pragma unroll
            for (int g = 0; g < GM; g++) {
                if (g >= G) continue;
                float nm = m[g];
#pragma unroll
                for (int u = 0; u < PD_KPW; u++) nm = fmaxf(nm, sc[u][g]);
                if (nm == -INF) continue;
                float corr = __expf(m[g] - nm), e[PD_KPW];
                float ls = l[g] * corr;
#pragma unroll
                for (int u = 0; u < PD_KPW; u++) {
                    e[u] = __expf(sc[u][g] - nm);
                    ls += e[u];
                }
                l[g] = ls;
                m[g] = nm;
#pragma unroll
                for (int t = 0; t < DPL; t++) {
                    float a = acc[g][t] * corr;
#pragma unroll
                    for (int u = 0; u < PD_KPW; u++) a += e[u] * vr[u][t];
                    acc[g][t] = a;
                }
            }
        }
    }
    // merge the warps
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G) continue;
        if (lane == 0) {
            wm[w][g] = m[g];
            wl[w][g] = l[g];
        }
#pragma unroll
        for (int t = 0; t < DPL; t++) wacc[w][g][lane * DPL + t] = acc[g][t];
    }
    __syncthreads();
    for (int i = tid; i < G * hd; i += NW * 32) {
        int g = i / hd, d = i % hd;
        float mm = -INF;
        for (int x = 0; x < NW; x++) mm = fmaxf(mm, wm[x][g]);
        float ls = 0.0f, a = 0.0f;
        if (mm > -INF) {
            for (int x = 0; x < NW; x++) {
                float f = expf(wm[x][g] - mm);
                ls += wl[x][g] * f;
                a += wacc[x][g][d] * f;
            }
        }
        pd_finish(out, part, copy, sinks, s, nh, (long)kvh * group + g0 + g, hd, d, z, nsplit, a, mm, ls);
    }
}

#define PAGED_DECODE1(NAME, SUFFIX, T, DPL, GM, NW)                                                         \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME##_g##GM##SUFFIX(                             \
        const float* q, const float* k, const float* v, T* kc, T* vc, const int* slots, const int* kv_lens, \
        const int* tables, const float* slopes, float* out, float* part, int maxb, int bs, long nslots,     \
        int nh, int nkv, int hd, float scale, float softcap, int window, const float* sinks,                \
        const float* rcos, const float* rsin, int rot, int rstyle, unsigned short* oh, int obf,             \
        signed char* oq, float2* od) {                                                                      \
        paged_decode_impl<T, DPL, GM, NW>(q, k, v, kc, vc, slots, kv_lens, tables, slopes, out, part, maxb, \
                                          bs, nslots, nh, nkv, hd, scale, softcap, window, sinks,           \
                                          PdRope{rcos, rsin, rot, rstyle}, PdCopy{oh, obf, oq, od});        \
    }
// one kernel per cache type, lane width and heads per block (1, 2, 4, 8); f16 caches also with
// 8 warps (suffix _w8), except 8 lanes' values × 8 heads, whose 8-warp block would declare more
// than 48 KiB of shared memory (wide_fits in paged_decode.rs)
#define PAGED_DECODE(NAME, T, DPL)         \
    PAGED_DECODE1(NAME, , T, DPL, 1, 4)    \
    PAGED_DECODE1(NAME, , T, DPL, 2, 4)    \
    PAGED_DECODE1(NAME, , T, DPL, 4, 4)    \
    PAGED_DECODE1(NAME, , T, DPL, 8, 4)
#define PAGED_DECODE_W8_TO4(NAME, T, DPL)  \
    PAGED_DECODE1(NAME, _w8, T, DPL, 1, 8) \
    PAGED_DECODE1(NAME, _w8, T, DPL, 2, 8) \
    PAGED_DECODE1(NAME, _w8, T, DPL, 4, 8)
#define PAGED_DECODE_W8(NAME, T, DPL) \
    PAGED_DECODE_W8_TO4(NAME, T, DPL) \
    PAGED_DECODE1(NAME, _w8, T, DPL, 8, 8)

PAGED_DECODE(paged_decode_h1, unsigned short, 1)
PAGED_DECODE(paged_decode_h2, unsigned short, 2)
PAGED_DECODE(paged_decode_h4, unsigned short, 4)
PAGED_DECODE(paged_decode_h8, unsigned short, 8)
PAGED_DECODE_W8(paged_decode_h1, unsigned short, 1)
PAGED_DECODE_W8(paged_decode_h2, unsigned short, 2)
PAGED_DECODE_W8(paged_decode_h4, unsigned short, 4)
PAGED_DECODE_W8_TO4(paged_decode_h8, unsigned short, 8)
PAGED_DECODE(paged_decode_f1, float, 1)
PAGED_DECODE(paged_decode_f2, float, 2)
PAGED_DECODE(paged_decode_f4, float, 4)
PAGED_DECODE(paged_decode_f8, float, 8)
PAGED_DECODE(paged_decode_q1, q8kv, 1)
PAGED_DECODE(paged_decode_q2, q8kv, 2)
PAGED_DECODE(paged_decode_q4, q8kv, 4)
PAGED_DECODE(paged_decode_q8, q8kv, 8)

// ---- scored form (f16 caches, head size 64 or 128) ----
// The slot of key c0 + j of a row (tables tb) when it lies before j1 and in the pool, else -1.
__device__ __forceinline__ long pd_slot(const int* tb, int c0, int j, int j1, int maxb, int bs, long nslots) {
    int jj = c0 + j, bi = jj / bs;
    if (jj >= j1 || bi >= maxb) return -1;
    long blk = tb[bi], slot = blk * bs + jj % bs;
    return blk < 0 || slot >= nslots ? -1 : slot;
}

// The tensor-core form (f16 cache, head size 64 or 128; results within rounding of
// paged_decode_impl): block (kv head × head chunk, sequence, split) of PT_NW warps. Each warp
// walks its own keys, 16 at a time (sub-chunks w, w + PT_NW, ... of its split's range), with
// PT_ST sub-chunks of key and value rows in flight in its shared-memory stages (cp.async;
// chunks of 16 bytes stored at chunk ^ (row & 7), so ldmatrix reads them without bank
// conflicts), and keeps its own online softmax:
//   S = Q·Kᵀ and O += P·V by mma.sync m16n8k16 with f32 accumulators. The block's G ≤ 8 query
//   heads sit in rows 0..7 of the A operand as f16, rows 8..15 hold what f16 rounded off (q·scale
//   − its f16 value; likewise for the probabilities P), so row h + row h + 8 of each product
//   carries the f32 operand's value to about 2⁻²² of it, at no extra mma.
// At the end the warps' (max, sum, accumulators) merge through shared memory.
#define PT_NW 2
#define PT_ST 2
#define PT_KEYS 16

// 16-byte cp.async from src into shared address dst, zero-filled when !ok.
__device__ __forceinline__ void pt_cp16(unsigned int dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}

// The slot of key kb + lane of a sub-chunk (lanes below PT_KEYS; -1: past j1, or no slot in the pool).
__device__ __forceinline__ long pt_slot(const int* tb, int kb, int j1, int maxb, int bs, long nslots, int lane) {
    return lane < PT_KEYS ? pd_slot(tb, kb, lane, j1, maxb, bs, nslots) : -1;
}

// Requests the key and value rows of a sub-chunk whose slots the lanes hold (`mine`, as pt_slot)
// into a warp's stage: key rows to ks, value rows to vs ([PT_KEYS][HD] each, swizzled); returns
// the mask of keys that hold data (bit r: key r). One commit group.
template <int HD>
__device__ __forceinline__ unsigned pt_request(unsigned short* ks, unsigned short* vs, const unsigned short* kbase,
                                               const unsigned short* vbase, long mine, long rs, int lane) {
    constexpr int CPR = HD / 8;  // 16-byte chunks per row
    unsigned ok = __ballot_sync(0xffffffffu, mine >= 0) & 0xffffu;
#pragma unroll
    for (int it = 0; it < PT_KEYS * CPR / 32; it++) {
        int e = lane + 32 * it, r = e / CPR, c = e % CPR;
        long slot = __shfl_sync(0xffffffffu, mine, r);
        long off = (slot >= 0 ? slot : 0) * rs + c * 8;
        int sw = r * HD + ((c ^ (r & 7)) * 8);
        pt_cp16((unsigned int)__cvta_generic_to_shared(ks + sw), kbase + off, slot >= 0);
        pt_cp16((unsigned int)__cvta_generic_to_shared(vs + sw), vbase + off, slot >= 0);
    }
    asm volatile("cp.async.commit_group;");
    return ok;
}

template <int HD>
__device__ void paged_decode_tc(const float* q, const float* k, const float* v, unsigned short* kc, unsigned short* vc,
                                const int* slots, const int* kv_lens, const int* tables, const float* slopes,
                                float* out, float* part, int maxb, int bs, long nslots, int nh, int nkv, int hd,
                                float scale, float softcap, int window, const float* sinks, PdRope rope,
                                PdCopy copy) {
    constexpr int STAGE = 2 * PT_KEYS * HD;  // halves of one stage (keys, then values)
    extern __shared__ __align__(16) unsigned short pt_smem[];
    __shared__ float wm[PT_NW][PD_GMAX], wl[PT_NW][PD_GMAX];
    __shared__ unsigned okm[PT_NW][PT_ST];
    pdl_begin();
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, t = lane & 3;
    int group = nh / nkv, nchunk = (group + PD_GMAX - 1) / PD_GMAX;
    int kvh = blockIdx.x / nchunk, g0 = (blockIdx.x % nchunk) * PD_GMAX;
    int s = blockIdx.y, z = blockIdx.z, nsplit = gridDim.z;
    int G = min(PD_GMAX, group - g0);
    int L = kv_lens[s];
    int lo = window > 0 && L > window ? L - window : 0;
    int n = L > lo ? L - lo : 0;
    int chunk = pd_chunk(n, nsplit);
    int j0 = lo + z * chunk, j1 = min(L, j0 + chunk);
    if (z > 0 && j0 >= L) return;
    long rs = (long)nkv * hd;
    if (L > 0 && j0 <= L - 1 && L - 1 < j1) {
        int slot = slots[s];
        if (slot >= 0 && slot < nslots)
            pd_store_step(kc, vc, slot * rs + (long)kvh * hd, k + ((long)s * nkv + kvh) * hd,
                          v + ((long)s * nkv + kvh) * hd, hd, rope, s);
    }
    const int* tb = tables + (long)s * maxb;
    int nsub = j1 > j0 ? (j1 - j0 + PT_KEYS - 1) / PT_KEYS : 0;  // sub-chunks of the split
    // the first sub-chunks' table entries are requested before the queries
    long pm[PT_ST];
#pragma unroll
    for (int st = 0; st < PT_ST; st++) {
        int c = w + st * PT_NW;
        pm[st] = c < nsub ? pt_slot(tb, j0 + c * PT_KEYS, j1, maxb, bs, nslots, lane) : -1;
    }
    // the query fragments: rows gq (f16 of q·scale) and gq + 8 (what that rounded off)
    unsigned int qf[HD / 16][4];
    {
        const float* qrow = q + ((long)s * nh + kvh * group + g0 + gq) * hd;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int hi8 = 0; hi8 < 2; hi8++) {
                int d = kk * 16 + 2 * t + 8 * hi8;
                float a = 0.0f, b = 0.0f;
                if (gq < G) {
                    a = pd_roped(qrow, d, rope, s) * scale;
                    b = pd_roped(qrow, d + 1, rope, s) * scale;
                }
                unsigned int hpair = fa_pack(a, b);
                float ah = h2f((unsigned short)(hpair & 0xffff)), bh = h2f((unsigned short)(hpair >> 16));
                qf[kk][2 * hi8] = hpair;
                qf[kk][2 * hi8 + 1] = fa_pack(a - ah, b - bh);
            }
    }
    // the step's store comes before any request of its row
    __syncthreads();
    const unsigned short* kbase = kc + (long)kvh * hd;
    const unsigned short* vbase = vc + (long)kvh * hd;
    unsigned short* mys = pt_smem + w * PT_ST * STAGE;
#pragma unroll
    for (int st = 0; st < PT_ST; st++) {
        int c = w + st * PT_NW;
        unsigned ok = 0;
        if (c < nsub)
            ok = pt_request<HD>(mys + st * STAGE, mys + st * STAGE + PT_KEYS * HD, kbase, vbase, pm[st], rs, lane);
        else
            asm volatile("cp.async.commit_group;");
        if (lane == 0) okm[w][st] = ok;
    }
    float o[HD / 8][4];
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
    float m = -INF, l = 0.0f;
    const float slope = slopes && gq < G ? slopes[kvh * group + g0 + gq] : 0.0f;
    const long p = (long)L - 1;
    int st = 0;
    for (int c = w; c < nsub; c += PT_NW) {
        // the table entries of the sub-chunk that takes this stage next, requested before the math
        int cn = c + PT_ST * PT_NW;
        long nm = cn < nsub ? pt_slot(tb, j0 + cn * PT_KEYS, j1, maxb, bs, nslots, lane) : -1;
        asm volatile("cp.async.wait_group %0;" ::"n"(PT_ST - 1) : "memory");
        __syncwarp();
        const unsigned short* ks = mys + st * STAGE;
        const unsigned short* vs = ks + PT_KEYS * HD;
        unsigned ok = okm[w][st];
        int kb = j0 + c * PT_KEYS;
        float sc[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk += 2) {
                int r = nt * 8 + (lane & 7), ch = 2 * kk + (lane >> 3);
                unsigned int b[4];
                fa_ldm4<false>(ks + r * HD + ((ch ^ (r & 7)) * 8), b);
                fa_mma(sc[nt], qf[kk], b[0], b[1]);
                fa_mma(sc[nt], qf[kk + 1], b[2], b[3]);
            }
        }
        // scores of head gq, keys kb + 8 nt + 2 t + e: the two rows' sum, soft-capped, ALiBi, masked
        float x[2][2], mx = -INF;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int r = nt * 8 + 2 * t + e;
                float a = sc[nt][e] + sc[nt][2 + e];
                if (softcap > 0.0f) a = softcap * tanhf(a / softcap);
                a += slope * (float)(kb + r - p);
                x[nt][e] = (ok >> r) & 1u ? a : -INF;
                mx = fmaxf(mx, x[nt][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float mn = fmaxf(m, mx), msafe = mn == -INF ? 0.0f : mn;
        float corr = fa_exp2((m - msafe) * 1.4426950408889634f), rsum = 0.0f;
        unsigned int pa[4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            float p0 = fa_exp2((x[nt][0] - msafe) * 1.4426950408889634f);
            float p1 = fa_exp2((x[nt][1] - msafe) * 1.4426950408889634f);
            rsum += p0 + p1;
            unsigned int hpair = fa_pack(p0, p1);
            pa[2 * nt] = hpair;
            pa[2 * nt + 1] = fa_pack(p0 - h2f((unsigned short)(hpair & 0xffff)), p1 - h2f((unsigned short)(hpair >> 16)));
        }
        rsum += __shfl_xor_sync(0xffffffffu, rsum, 1);
        rsum += __shfl_xor_sync(0xffffffffu, rsum, 2);
        l = l * corr + rsum;
        m = mn;
#pragma unroll
        for (int dn = 0; dn < HD / 8; dn++) {
            o[dn][0] *= corr;
            o[dn][1] *= corr;
            o[dn][2] *= corr;
            o[dn][3] *= corr;
        }
#pragma unroll
        for (int dn = 0; dn < HD / 8; dn += 2) {
            int r = (lane & 7) + ((lane >> 3) & 1) * 8, ch = dn + (lane >> 4);
            unsigned int b[4];
            fa_ldm4<true>(vs + r * HD + ((ch ^ (r & 7)) * 8), b);
            fa_mma(o[dn], pa, b[0], b[1]);
            fa_mma(o[dn + 1], pa, b[2], b[3]);
        }
        // every lane is done with the stage before it is requested again
        __syncwarp();
        unsigned okn = 0;
        if (cn < nsub)
            okn = pt_request<HD>(mys + st * STAGE, mys + st * STAGE + PT_KEYS * HD, kbase, vbase, nm, rs, lane);
        else
            asm volatile("cp.async.commit_group;");
        if (lane == 0) okm[w][st] = okn;
        st = st + 1 == PT_ST ? 0 : st + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    // the warps' states merge: (max, sum) per head, the accumulators (both rows added) in the stages
    float* acc = (float*)pt_smem;  // [PT_NW][PD_GMAX][HD]
    if (t == 0 && gq < PD_GMAX) {
        wm[w][gq] = m;
        wl[w][gq] = l;
    }
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++) {
        float* a = acc + ((long)w * PD_GMAX + gq) * HD + dn * 8 + 2 * t;
        a[0] = o[dn][0] + o[dn][2];
        a[1] = o[dn][1] + o[dn][3];
    }
    __syncthreads();
    for (int i = tid; i < G * HD; i += PT_NW * 32) {
        int g = i / HD, d = i % HD;
        float mm = -INF;
#pragma unroll
        for (int x = 0; x < PT_NW; x++) mm = fmaxf(mm, wm[x][g]);
        float a = 0.0f, ls = 0.0f;
#pragma unroll
        for (int x = 0; x < PT_NW; x++) {
            float f = wm[x][g] == -INF ? 0.0f : __expf(wm[x][g] - mm);
            a += acc[((long)x * PD_GMAX + g) * HD + d] * f;
            ls += wl[x][g] * f;
        }
        pd_finish(out, part, copy, sinks, s, nh, (long)kvh * group + g0 + g, hd, d, z, nsplit, a, mm, ls);
    }
}

// paged_decode_t{HD}; dynamic shared memory: every warp's stages, PT_NW · PT_ST · 2 · PT_KEYS · HD
// halves (they also hold the merge's accumulators).
#define PAGED_DECODE_T(HD)                                                                                    \
    extern "C" __global__ void __launch_bounds__(PT_NW * 32) paged_decode_t##HD(                               \
        const float* q, const float* k, const float* v, unsigned short* kc, unsigned short* vc,              \
        const int* slots, const int* kv_lens, const int* tables, const float* slopes, float* out, float* part, \
        int maxb, int bs, long nslots, int nh, int nkv, int hd, float scale, float softcap, int window,      \
        const float* sinks, const float* rcos, const float* rsin, int rot, int rstyle, unsigned short* oh,   \
        int obf, signed char* oq, float2* od) {                                                              \
        paged_decode_tc<HD>(q, k, v, kc, vc, slots, kv_lens, tables, slopes, out, part, maxb, bs, nslots, nh, \
                            nkv, hd, scale, softcap, window, sinks, PdRope{rcos, rsin, rot, rstyle},          \
                            PdCopy{oh, obf, oq, od});                                                         \
    }
PAGED_DECODE_T(64)
PAGED_DECODE_T(128)

// Merges the splits of paged_decode_*: block (sequence, head), one thread per output dim.
extern "C" __global__ void paged_decode_combine(const float* part, const int* kv_lens, float* out, int nh, int hd,
                                                int nsplit, int window, const float* sinks, unsigned short* oh,
                                                int obf, signed char* oq, float2* od) {
    PdCopy copy{oh, obf, oq, od};
    pdl_begin();
    int s = blockIdx.x, h = blockIdx.y;
    int L = kv_lens[s];
    int lo = window > 0 && L > window ? L - window : 0;
    int n = L > lo ? L - lo : 0;
    int used = n > 0 ? (n + pd_chunk(n, nsplit) - 1) / pd_chunk(n, nsplit) : 1;
    const float* pp = part + ((long)s * nh + h) * nsplit * (hd + 2);
    float mm = -INF;
    for (int z = 0; z < used; z++) mm = fmaxf(mm, pp[z * (hd + 2)]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float ls = 0.0f, a = 0.0f;
        if (mm > -INF) {
            for (int z = 0; z < used; z++) {
                float f = expf(pp[z * (hd + 2)] - mm);
                ls += pp[z * (hd + 2) + 1] * f;
                a += pp[z * (hd + 2) + 2 + d] * f;
            }
        }
        pd_out(out, ((long)s * nh + h) * hd + d, a * att_inv(ls, mm, att_sink(sinks, h)), copy);
    }
}

// PagedCacheWrite into an f16 cache: cache[slots[i]] = half(input[i]) (rows of `row` values).
extern "C" __global__ void paged_cache_write_f16(const float* x, const int* slots, unsigned short* cache, long n,
                                                 long row) {
    pdl_begin();
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < n * row; id += (long)gridDim.x * blockDim.x) {
        long i = id / row, c = id % row;
        cache[(long)slots[i] * row + c] = f2h(x[id]);
    }
}
