// Paged decode attention (flash-decoding over block tables): one query row per sequence, keys
// and values in a pool of slots [slots, nkv, hd] (f16, f32 or q8_0: see q8kv in attention.cu) addressed through per-sequence
// block tables. Every index array is read on the device, so a recorded step (CUDA graph) replays
// with new lengths and tables.
//
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
// The launch and grid of paged_decode_impl (its results within rounding), the keys taken PS_SUB
// at a time in passes that request every key (value) row of the pass before using any:
// 1. the sub-chunk's slots go to shared memory (their table entries were requested during the
//    previous sub-chunk's values); eight lanes take a key (hd / 8 dims each, the block's queries
//    in registers), a warp four keys a round, the block PS_NW * 4, and R rounds' rows are
//    requested at once; each score (scaled, soft-capped, ALiBi) goes to shared memory;
// 2. a warp per head turns the sub-chunk's scores into exp(score - running max) and carries the
//    running max and sum (and the accumulators' correction for a new max);
// 3. warp w takes keys w, w + PS_NW, ... of the sub-chunk, every value row requested at once, a
//    lane hd / 32 dims, into its accumulators in shared memory.
// The warps share the running max, so their accumulators add up at the end without rescaling.
// The host takes this form for an f16 cache of head size 64 or 128 (at most 512 query values a
// block) unless the launch has few blocks and short rows, where the 8-warp kernels are faster.
#define PS_SUB 64
#define PS_NW 4

// The slot of key c0 + j of a row (tables tb) when it lies before j1 and in the pool, else -1.
__device__ __forceinline__ long ps_slot(const int* tb, int c0, int j, int j1, int maxb, int bs, long nslots) {
    int jj = c0 + j, bi = jj / bs;
    if (jj >= j1 || bi >= maxb) return -1;
    long blk = tb[bi], slot = blk * bs + jj % bs;
    return blk < 0 || slot >= nslots ? -1 : slot;
}

// One block's scored decode (the passes above; one function: split into functions the
// passes ran 10 % slower at long rows, with the same PTX loads).
template <int HD, int GM, int R>
__device__ void paged_decode_scored(const float* q, const float* k, const float* v, unsigned short* kc,
                                    unsigned short* vc, const int* slots, const int* kv_lens, const int* tables,
                                    const float* slopes, float* out, float* part, int maxb, int bs, long nslots,
                                    int nh, int nkv, int hd, float scale, float softcap, int window,
                                    const float* sinks, PdRope rope, PdCopy copy) {
    constexpr int NW = PS_NW, DPK = HD / 8, DPL = HD / 32, KPR = NW * 4, KW = PS_SUB / NW;
    static_assert(PS_SUB % (KPR * R) == 0, "a sub-chunk holds whole batches of rounds");
    __shared__ __align__(16) float qs[GM][HD];
    __shared__ float sc[GM][PS_SUB];
    __shared__ long sl[PS_SUB];
    __shared__ __align__(16) float wacc[NW][GM][HD];
    __shared__ float run_m[GM], run_l[GM], corr[GM];
    pdl_begin();
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, kl = lane & 7, kg = lane >> 3;
    int group = nh / nkv, nchunk = (group + PD_GMAX - 1) / PD_GMAX;
    int kvh = blockIdx.x / nchunk, g0 = (blockIdx.x % nchunk) * PD_GMAX;
    int s = blockIdx.y, z = blockIdx.z, nsplit = gridDim.z;
    int G = min(GM, group - g0);
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
    for (int i = tid; i < GM * HD; i += NW * 32) {
        int g = i / HD, d = i % HD;
        qs[g][d] = g < G ? pd_roped(q + ((long)s * nh + kvh * group + g0 + g) * hd, d, rope, s) : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < GM; g++) {
#pragma unroll
        for (int t = 0; t < DPL; t++) wacc[w][g][lane * DPL + t] = 0.0f;
    }
    if (tid < GM) {
        run_m[tid] = -INF;
        run_l[tid] = 0.0f;
    }
    const int* tb = tables + (long)s * maxb;
    const unsigned short* kbase = kc + (long)kvh * hd + kl * DPK;
    const unsigned short* vbase = vc + (long)kvh * hd + lane * DPL;
    long p = (long)L - 1;
    long pre = tid < PS_SUB ? ps_slot(tb, j0, tid, j1, maxb, bs, nslots) : -1;
    for (int c0 = j0; c0 < j1; c0 += PS_SUB) {
        int ns = min(PS_SUB, j1 - c0);
        // the step's store, the queries and the previous sub-chunk's reads come before these writes
        __syncthreads();
        if (tid < PS_SUB) sl[tid] = pre;
        __syncthreads();
        // pass 1
        float qv[GM][DPK];
#pragma unroll
        for (int g = 0; g < GM; g++) {
#pragma unroll
            for (int t = 0; t < DPK; t += 4) {
                float4 f = *(const float4*)&qs[g][kl * DPK + t];
                qv[g][t] = f.x;
                qv[g][t + 1] = f.y;
                qv[g][t + 2] = f.z;
                qv[g][t + 3] = f.w;
            }
        }
        for (int b0 = 0; b0 < ns; b0 += KPR * R) {
            uint4 kr[R][DPK / 8];
#pragma unroll
            for (int r = 0; r < R; r++) {
                int j = b0 + r * KPR + w * 4 + kg;
                long slot = j < ns ? sl[j] : -1;
#pragma unroll
                for (int t = 0; t < DPK / 8; t++)
                    kr[r][t] = slot >= 0 ? ((const uint4*)(kbase + slot * rs))[t] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float dot[GM];
#pragma unroll
                for (int g = 0; g < GM; g++) dot[g] = 0.0f;
#pragma unroll
                for (int t = 0; t < DPK / 8; t++) {
                    unsigned u[4] = {kr[r][t].x, kr[r][t].y, kr[r][t].z, kr[r][t].w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float lo2 = h2f((unsigned short)(u[e] & 0xffff)), hi2 = h2f((unsigned short)(u[e] >> 16));
#pragma unroll
                        for (int g = 0; g < GM; g++)
                            dot[g] += qv[g][t * 8 + 2 * e] * lo2 + qv[g][t * 8 + 2 * e + 1] * hi2;
                    }
                }
                // the key's eight lanes sum each head's dot; lane g of them keeps head g's
                float mine = 0.0f;
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    float a = dot[g];
                    a += __shfl_xor_sync(0xffffffffu, a, 1);
                    a += __shfl_xor_sync(0xffffffffu, a, 2);
                    a += __shfl_xor_sync(0xffffffffu, a, 4);
                    if (g == kl) mine = a;
                }
                int j = b0 + r * KPR + w * 4 + kg;
                if (kl < GM && j < ns) {
                    float a = mine * scale;
                    if (softcap > 0.0f) a = softcap * tanhf(a / softcap);
                    if (slopes && kl < G) a += slopes[kvh * group + g0 + kl] * (float)(c0 + j - p);
                    sc[kl][j] = sl[j] >= 0 && kl < G ? a : -INF;
                }
            }
        }
        __syncthreads();
        // pass 2
        for (int g = w; g < GM; g += NW) {
            float mx = -INF;
            for (int j = lane; j < ns; j += 32) mx = fmaxf(mx, sc[g][j]);
            mx = warp_max(mx);
            float mo = run_m[g], mn = fmaxf(mo, mx), sum = 0.0f;
            for (int j = lane; j < ns; j += 32) {
                float e = mn == -INF ? 0.0f : __expf(sc[g][j] - mn);
                sc[g][j] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                float c = mo == -INF ? 0.0f : __expf(mo - mn);
                run_l[g] = run_l[g] * c + sum;
                run_m[g] = mn;
                corr[g] = c;
            }
        }
        // the next sub-chunk's table entries are requested before this one's value rows
        if (tid < PS_SUB) pre = ps_slot(tb, c0 + PS_SUB, tid, j1, maxb, bs, nslots);
        __syncthreads();
        // pass 3
        float vr[KW][DPL];
#pragma unroll
        for (int u = 0; u < KW; u++) {
            int j = w + u * NW;
            long slot = j < ns ? sl[j] : -1;
            pd_row<DPL>(slot >= 0 ? vbase + slot * rs : vbase, vr[u], slot >= 0, 0);
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g >= G) continue;
            float c = corr[g], a[DPL];
#pragma unroll
            for (int t = 0; t < DPL; t++) a[t] = wacc[w][g][lane * DPL + t] * c;
#pragma unroll
            for (int u = 0; u < KW; u++) {
                int j = w + u * NW;
                float pj = j < ns ? sc[g][j] : 0.0f;
#pragma unroll
                for (int t = 0; t < DPL; t++) a[t] += pj * vr[u][t];
            }
#pragma unroll
            for (int t = 0; t < DPL; t++) wacc[w][g][lane * DPL + t] = a[t];
        }
    }
    __syncthreads();
    for (int i = tid; i < G * HD; i += NW * 32) {
        int g = i / HD, d = i % HD;
        float a = 0.0f;
#pragma unroll
        for (int x = 0; x < NW; x++) a += wacc[x][g][d];
        float mm = run_m[g], ls = run_l[g];
        pd_finish(out, part, copy, sinks, s, nh, (long)kvh * group + g0 + g, hd, d, z, nsplit, a, mm, ls);
    }
}

#define PAGED_DECODE_S(HD, GM, R)                                                                             \
    extern "C" __global__ void __launch_bounds__(PS_NW * 32) paged_decode_s##HD##_g##GM(                       \
        const float* q, const float* k, const float* v, unsigned short* kc, unsigned short* vc,              \
        const int* slots, const int* kv_lens, const int* tables, const float* slopes, float* out, float* part, \
        int maxb, int bs, long nslots, int nh, int nkv, int hd, float scale, float softcap, int window,      \
        const float* sinks, const float* rcos, const float* rsin, int rot, int rstyle, unsigned short* oh,   \
        int obf, signed char* oq, float2* od) {                                                              \
        paged_decode_scored<HD, GM, R>(q, k, v, kc, vc, slots, kv_lens, tables, slopes, out, part, maxb, bs,  \
                                       nslots, nh, nkv, hd, scale, softcap, window, sinks,                   \
                                       PdRope{rcos, rsin, rot, rstyle}, PdCopy{oh, obf, oq, od});            \
    }
// heads per block 1, 2, 4 (and 8 at head size 64): the block's queries take at most 64 registers
// a lane; two rounds of key rows requested at once (four ran slower: 168 registers a thread)
PAGED_DECODE_S(64, 1, 2)
PAGED_DECODE_S(64, 2, 2)
PAGED_DECODE_S(64, 4, 2)
PAGED_DECODE_S(64, 8, 2)
PAGED_DECODE_S(128, 1, 2)
PAGED_DECODE_S(128, 2, 2)
PAGED_DECODE_S(128, 4, 2)

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
