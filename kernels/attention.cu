// Attention, f32 arithmetic over f32, f16 or q8_0 keys and values (the *_f16kv and *_q8kv
// instances of the kernels below read an f16 or q8_0 KV cache in place): one block of ATT_THREADS threads per (query,
// head). Keys are processed in chunks of ATT_CHUNK: a warp per key computes the scores into
// shared memory, then an online softmax rescales the running output (each thread owns output
// dims tid, tid + ATT_THREADS, ...).
// Query i sits at position p = skv - sq + i; causal: keys j <= p; window w: p - j < w.
// Scores: q·k * scale, then softcap·tanh(s / softcap), then + slope[h]·(j - p). A query that
// sees no key writes zeros. q [sq, nh, hd], k [skv, nkv, hd] (row stride ks), v [skv, nkv, hdv]
// (row stride vs), out [sq, nh, hdv]. hdv <= ATT_THREADS * ATT_DPT. With `sinks` ([nh] or null)
// head h's sink joins the softmax denominator (att_inv) in every attention kernel here.

#define ATT_THREADS 128
#define ATT_CHUNK 256
#define ATT_DPT 4

// One chunk's step of the online softmax of attention_f32 and paged_attention_impl: the `cn`
// scores in `sc` (shared) become e^(s − m') in place, with m' the running max `m` raised to the
// chunk's max; their sum joins the running denominator `l`. Returns e^(m − m'), the factor that
// rescales what was accumulated before. Every thread of the block calls it.
__device__ __forceinline__ float att_chunk_softmax(float* sc, int cn, float& m, float& l) {
    int tid = threadIdx.x;
    float cm = -INF;
    for (int jj = tid; jj < cn; jj += ATT_THREADS) cm = fmaxf(cm, sc[jj]);
    cm = block_max(cm);
    float nm = fmaxf(m, cm);
    float corr = expf(m - nm);
    __syncthreads();
    float ps = 0.0f;
    for (int jj = tid; jj < cn; jj += ATT_THREADS) {
        float e = expf(sc[jj] - nm);
        sc[jj] = e;
        ps += e;
    }
    ps = block_sum(ps);
    l = l * corr + ps;
    m = nm;
    return corr;
}

// K/V element loads and stores: f32, or IEEE half bits (an f16 cache, f32 arithmetic).
__device__ __forceinline__ float att_ld(const float* p, long i) { return p[i]; }
__device__ __forceinline__ float att_ld(const unsigned short* p, long i) { return h2f(p[i]); }
__device__ __forceinline__ void att_st(float* p, long i, float x) { p[i] = x; }
__device__ __forceinline__ void att_st(unsigned short* p, long i, float x) { p[i] = f2h(x); }

// A q8_0 KV cache (the *_q8kv kernels): head rows of GGUF Q8_0 blocks (an f16 scale, then 32
// int8), each row padded with zeros to whole blocks, as the CPU stores it. Kernels address it by
// the element index e of that padded layout: value e is int8 e % 32 of block e / 32, whose
// 34 bytes start at byte 34 · (e / 32). q8kv is its byte type (distinct, for the overloads).
struct q8kv {
    signed char b;
};

__device__ __forceinline__ const unsigned char* q8kv_block(const q8kv* p, long e) {
    return (const unsigned char*)p + (e >> 5) * 34;
}

__device__ __forceinline__ float att_ld(const q8kv* p, long i) {
    const unsigned char* blk = q8kv_block(p, i);
    return h2f(*(const unsigned short*)blk) * (float)((const signed char*)blk)[2 + (i & 31)];
}

// Stored values per head row of hd values: hd, or hd rounded up to whole blocks for q8_0.
__device__ __forceinline__ int att_hs(const float*, int hd) { return hd; }
__device__ __forceinline__ int att_hs(const unsigned short*, int hd) { return hd; }
__device__ __forceinline__ int att_hs(const q8kv*, int hd) { return (hd + 31) & ~31; }

// Stores the Q8_0 block at element e0 (a multiple of 32) of a q8_0 cache from the warp's 32
// values (lane l gives value l; 0 past a row's end) with the CPU's arithmetic: d = amax / 127,
// q = round(v / d) (halves away from zero), d stored as f16. Every lane of the warp calls it.
__device__ __forceinline__ void q8kv_store_block(q8kv* p, long e0, float val) {
    float d = warp_max(fabsf(val)) / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned char* blk = (unsigned char*)q8kv_block(p, e0);
    int q = max(-128, min(127, (int)roundf(val * id)));
    blk[2 + (threadIdx.x & 31)] = (unsigned char)(signed char)q;
    if ((threadIdx.x & 31) == 0) *(unsigned short*)blk = f2h(d);
}

// k and v of element type T (float, or unsigned short: f16 bits); attention_f32 and
// attention_f16kv below.
template <typename T>
__device__ void attention_impl(const float* q, const T* k, const T* v, const float* slopes, const float* sinks,
                               float* out, int sq, int skv, int nh, int nkv, int hd, int hdv, long ks, long vs,
                               float scale, float softcap, int causal, int window) {
    pdl_begin();
    __shared__ float sc[ATT_CHUNK];
    __shared__ float qs[1024];
    int i = blockIdx.x, h = blockIdx.y;
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = ATT_THREADS / 32;
    int group = nh / nkv;
    if (group < 1) group = 1;
    int kh = h / group;
    long p = (long)skv - sq + i;
    long end = causal ? min((long)skv, p + 1) : (long)skv;
    if (end < 0) end = 0;
    long start = 0;
    if (window > 0) {
        start = p - window + 1;
        if (start < 0) start = 0;
        if (start > end) start = end;
    }
    const float* qr = q + ((long)i * nh + h) * hd;
    for (int d = tid; d < hd; d += ATT_THREADS) qs[d] = qr[d];
    float slope = slopes ? slopes[h] : 0.0f;
    float acc[ATT_DPT];
#pragma unroll
    for (int t = 0; t < ATT_DPT; t++) acc[t] = 0.0f;
    float m = -INF, l = 0.0f;
    __syncthreads();
    for (long c0 = start; c0 < end; c0 += ATT_CHUNK) {
        int cn = (int)min((long)ATT_CHUNK, end - c0);
        for (int jj = wid; jj < cn; jj += nw) {
            long kr = (c0 + jj) * ks + (long)kh * att_hs(k, hd);
            float s = 0.0f;
            for (int d = lane; d < hd; d += 32) s += qs[d] * att_ld(k, kr + d);
            s = warp_sum(s);
            if (lane == 0) {
                s *= scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                s += slope * (float)(c0 + jj - p);
                sc[jj] = s;
            }
        }
        __syncthreads();
        float corr = att_chunk_softmax(sc, cn, m, l);
#pragma unroll
        for (int t = 0; t < ATT_DPT; t++) {
            int d = tid + t * ATT_THREADS;
            if (d < hdv) {
                float a = acc[t] * corr;
                long vp = c0 * vs + (long)kh * att_hs(v, hdv) + d;
                for (int jj = 0; jj < cn; jj++) a += sc[jj] * att_ld(v, vp + jj * vs);
                acc[t] = a;
            }
        }
        __syncthreads();
    }
    float* orow = out + ((long)i * nh + h) * hdv;
    float inv = att_inv(l, m, att_sink(sinks, h));
#pragma unroll
    for (int t = 0; t < ATT_DPT; t++) {
        int d = tid + t * ATT_THREADS;
        if (d < hdv) orow[d] = acc[t] * inv;
    }
}

#define ATTENTION(NAME, T)                                                                                    \
    extern "C" __global__ void NAME(const float* q, const T* k, const T* v, const float* slopes,               \
                                    const float* sinks, float* out, int sq, int skv, int nh, int nkv, int hd,  \
                                    int hdv, long ks, long vs, float scale, float softcap, int causal,          \
                                    int window) {                                                               \
        attention_impl<T>(q, k, v, slopes, sinks, out, sq, skv, nh, nkv, hd, hdv, ks, vs, scale, softcap,      \
                          causal, window);                                                                      \
    }
ATTENTION(attention_f32, float)
ATTENTION(attention_f16kv, unsigned short)
ATTENTION(attention_q8kv, q8kv)

// PagedAttention: keys/values live in a pool of slots [slots, nkv, hd] (f32, f16 or q8_0) addressed through
// per-sequence block tables. Block (row, head); the row's sequence s is found in q_starts
// (nseq + 1 entries); its position is pos = kv_lens[s] - (q_end - q_start) + (row - q_start);
// it sees keys lo..=pos (lo = pos + 1 - window with a window). Key j of sequence s lives in slot
// tables[s * maxb + j / bs] * bs + j % bs. Scores as in attention_f32.
template <typename T>
__device__ void paged_attention_impl(const float* q, const T* kc, const T* vc, const int* q_starts,
                                     const int* kv_lens, const int* tables, const float* slopes,
                                     const float* sinks, float* out, int nseq, int maxb, int bs, int nh, int nkv, int hd, float scale,
                                     float softcap, int window) {
    pdl_begin();
    __shared__ float sc[ATT_CHUNK];
    __shared__ int sl[ATT_CHUNK];  // the chunk's slots, looked up once for scores and values
    __shared__ float qs[1024];
    int row = blockIdx.x, h = blockIdx.y;
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = ATT_THREADS / 32;
    int s = 0;
    while (s + 1 < nseq && q_starts[s + 1] <= row) s++;
    int nq = q_starts[s + 1] - q_starts[s];
    long pos = (long)kv_lens[s] - nq + (row - q_starts[s]);
    long start = window > 0 ? pos + 1 - window : 0;
    if (start < 0) start = 0;
    long end = pos + 1;
    int group = nh / nkv;
    if (group < 1) group = 1;
    int kh = h / group;
    const int* tb = tables + (long)s * maxb;
    const float* qr = q + ((long)row * nh + h) * hd;
    for (int d = tid; d < hd; d += ATT_THREADS) qs[d] = qr[d];
    float slope = slopes ? slopes[h] : 0.0f;
    float acc[ATT_DPT];
#pragma unroll
    for (int t = 0; t < ATT_DPT; t++) acc[t] = 0.0f;
    float m = -INF, l = 0.0f;
    const int hs = att_hs(kc, hd);
    long rs = (long)nkv * hs;
    __syncthreads();
    for (long c0 = start; c0 < end; c0 += ATT_CHUNK) {
        int cn = (int)min((long)ATT_CHUNK, end - c0);
        for (int jj = wid; jj < cn; jj += nw) {
            int j = (int)(c0 + jj);  // keys are counted in int (kv_lens)
            int slot = tb[j / bs] * bs + j % bs;
            long kr = (long)slot * rs + (long)kh * hs;
            float sv = 0.0f;
            for (int d = lane; d < hd; d += 32) sv += qs[d] * att_ld(kc, kr + d);
            sv = warp_sum(sv);
            if (lane == 0) {
                sv *= scale;
                if (softcap > 0.0f) sv = softcap * tanhf(sv / softcap);
                sv += slope * (float)(j - pos);
                sc[jj] = sv;
                sl[jj] = slot;
            }
        }
        __syncthreads();
        float corr = att_chunk_softmax(sc, cn, m, l);
#pragma unroll
        for (int t = 0; t < ATT_DPT; t++) {
            int d = tid + t * ATT_THREADS;
            if (d < hd) {
                float a = acc[t] * corr;
                const long vd = (long)kh * hs + d;
                for (int jj = 0; jj < cn; jj++) a += sc[jj] * att_ld(vc, (long)sl[jj] * rs + vd);
                acc[t] = a;
            }
        }
        __syncthreads();
    }
    float* orow = out + ((long)row * nh + h) * hd;
    float inv = att_inv(l, m, att_sink(sinks, h));
#pragma unroll
    for (int t = 0; t < ATT_DPT; t++) {
        int d = tid + t * ATT_THREADS;
        if (d < hd) orow[d] = acc[t] * inv;
    }
}

#define PAGED_ATTENTION(NAME, T)                                                                              \
    extern "C" __global__ void NAME(const float* q, const T* kc, const T* vc, const int* q_starts,              \
                                    const int* kv_lens, const int* tables, const float* slopes,                 \
                                    const float* sinks, float* out, int nseq, int maxb, int bs, int nh, int nkv, \
                                    int hd, float scale, float softcap, int window) {                           \
        paged_attention_impl<T>(q, kc, vc, q_starts, kv_lens, tables, slopes, sinks, out, nseq, maxb, bs, nh,   \
                                nkv, hd, scale, softcap, window);                                               \
    }
PAGED_ATTENTION(paged_attention_f32, float)
PAGED_ATTENTION(paged_attention_f16, unsigned short)
PAGED_ATTENTION(paged_attention_q8, q8kv)

// PagedCacheWrite into a q8_0 cache: the nkv head rows of input row i (hd values each) as Q8_0
// head rows (padded to whole blocks) of slot slots[i]; a warp per block.
extern "C" __global__ void paged_cache_write_q8(const float* x, const int* slots, q8kv* cache, long n, int nkv, int hd) {
    pdl_begin();
    int nb = (hd + 31) >> 5, lane = threadIdx.x & 31;
    long nwarps = ((long)gridDim.x * blockDim.x) >> 5;
    for (long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < n * nkv * nb; w += nwarps) {
        long hr = w / nb;  // head row i · nkv + h of the input
        int b = (int)(w % nb), d = b * 32 + lane;
        long i = hr / nkv, h = hr % nkv;
        long e = (((long)slots[i] * nkv + h) * nb + b) * 32;
        q8kv_store_block(cache, e, d < hd ? x[hr * hd + d] : 0.0f);
    }
}

// PagedCacheWrite: cache[slots[i]] = input[i] (rows of `row` floats).
extern "C" __global__ void paged_cache_write_f32(const float* x, const int* slots, float* cache, long n, long row) {
    pdl_begin();
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < n * row; id += (long)gridDim.x * blockDim.x) {
        long i = id / row, c = id % row;
        cache[(long)slots[i] * row + c] = x[id];
    }
}

// Prefill attention through cuBLAS (tensor cores): the GEMM q·kᵀ·scale has written the scores
// of queries i0..i0+qc of head h into s[(h·qc + r)·ld + j], keys j < kend. This turns each row
// into probabilities in place: soft-capping, ALiBi, causal mask and sliding window as in
// attention_f32; masked keys (j < kend) get 0; a row that sees no key is all 0 (the output row
// is then 0, as in attention_f32). Block (r, h).
#define SM_VPT 16

extern "C" __global__ void attn_softmax_f32(float* s, const float* slopes, const float* sinks, int qc, int i0,
                                            int sq, int skv, long ld, int kend, float softcap, int causal,
                                            int window) {
    pdl_begin();
    int r = blockIdx.x, h = blockIdx.y;
    float* row = s + ((long)h * qc + r) * ld;
    long p = (long)skv - sq + i0 + r;
    long end = causal ? min((long)skv, p + 1) : (long)skv;
    if (end < 0) end = 0;
    if (end > kend) end = kend;
    long start = 0;
    if (window > 0) {
        start = p - window + 1;
        if (start < 0) start = 0;
        if (start > end) start = end;
    }
    float slope = slopes ? slopes[h] : 0.0f;
    if (kend <= SM_VPT * (long)blockDim.x) {
        // One read and one write of the row: the values stay in registers.
        float v[SM_VPT];
        float mx = -INF;
#pragma unroll
        for (int t = 0; t < SM_VPT; t++) {
            long j = threadIdx.x + (long)t * blockDim.x;
            float x = -INF;
            if (j >= start && j < end) {
                x = row[j];
                if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
                x += slope * (float)(j - p);
                mx = fmaxf(mx, x);
            }
            v[t] = x;
        }
        mx = block_max(mx);
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < SM_VPT; t++) {
            long j = threadIdx.x + (long)t * blockDim.x;
            float e = (j >= start && j < end) ? expf(v[t] - mx) : 0.0f;
            v[t] = e;
            sum += e;
        }
        sum = block_sum(sum);
        float inv = att_inv(sum, mx, att_sink(sinks, h));
#pragma unroll
        for (int t = 0; t < SM_VPT; t++) {
            long j = threadIdx.x + (long)t * blockDim.x;
            if (j < kend) row[j] = v[t] * inv;
        }
        return;
    }
    float mx = -INF;
    for (long j = threadIdx.x; j < kend; j += blockDim.x) {
        if (j >= start && j < end) {
            float v = row[j];
            if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
            v += slope * (float)(j - p);
            row[j] = v;
            mx = fmaxf(mx, v);
        }
    }
    mx = block_max(mx);
    float sum = 0.0f;
    for (long j = threadIdx.x; j < kend; j += blockDim.x) {
        float e = 0.0f;
        if (j >= start && j < end) {
            e = expf(row[j] - mx);
            sum += e;
        }
        row[j] = e;
    }
    sum = block_sum(sum);
    float inv = att_inv(sum, mx, att_sink(sinks, h));
    for (long j = start + threadIdx.x; j < end; j += blockDim.x) row[j] *= inv;
}

// ---- decode attention, split-K ("flash-decoding") ----
// For few queries over many keys. Block (split s, KV head kh · head chunk c, query row i): the
// query heads h0..h0+G of one GQA group chunk (G <= gchunk <= DA_GMAX; the host takes 1 for
// short key ranges, where more, smaller blocks finish sooner) share every K/V row the block
// loads. The row's visible keys [lo, hi) are cut into `nsplit` equal ranges, one per block;
// each block runs an online softmax over its range in chunks of DA_CHUNK keys: scores (a warp
// per key, 4 keys in flight, all G heads per load), then per head (a warp each) the chunk's
// max / exp / sum, then the weighted V sum (a thread per value dim in each group of DA_VT
// threads, the groups taking every nkq-th run of 4 keys, summed at the end; V loaded once for
// all G heads). The launch has `nsplit` ranges (≤ DA_MAX_SPLITS) for the longest row the cache
// can hold. With `counters` (launches of no more blocks than multiprocessors) a row uses only
// as many as its keys need at DA_SPLIT_MIN keys each (decided on the device, as the length is
// only known there; the blocks beyond stop at once): with one, its block writes the normalised
// output; with more, each block writes its unnormalised partial output and (max, sum) to
// `part` and the last one to finish (an atomic count per row and head chunk in `counters`, all
// zero between launches) merges them in split order, so the result does not depend on which
// is last. Without `counters` (big grids, where the combine's spread over many blocks is
// faster than one block merging up to 64 ranges) every range is used and, with nsplit > 1,
// attn_decode_combine_f32 merges them in a second launch.
// Fused step (DecodeAttention with the step's raw keys, one query row): knew / vnew [nkv, hd /
// hdv] go to cache row p as below, and with rcos / rsin (the step's [rot/2] tables) the queries
// and that key are rotated first (rope_value, style `rstyle`), which replaces a RotaryEmbedding
// launch and a cache write before this one.
// Positions: with `positions` (device, [sq]) query i sits at positions[i] and sees keys
// max(0, p - window + 1) ..= p, below `kcap` (a KV cache read while it grows: the length is
// not known on the host, so CUDA graphs can replay this launch every step); without it, as in
// attention_f32: p = skv - sq + i, causal or not, window, skv keys. Scores as attention_f32.
// hd <= DA_DPL * 32, hdv <= DA_VPT * DA_VT.

// The decode output also as Q8_0 rows (oq, od; or null) for the o-projection (quantize_output =
// 1): value `val` at flat index o, the 32 lanes of the warp holding one 32-value block (hdv % 32
// == 0, so the warp is uniform), with the arithmetic of quantize_q8_f32.
__device__ __forceinline__ void da_quant_store(float val, long o, signed char* oq, float2* od) {
    float amax = warp_max(fabsf(val));
    float dd = amax / 127.0f;
    int q = q8_of(val, dd != 0.0f ? 1.0f / dd : 0.0f);
    oq[o] = (signed char)q;
    int sum = q;
    for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if ((threadIdx.x & 31) == 0) od[o >> 5] = q8_scales(dd, sum);
}

// Threads per block: DA_VT · nkq (the host picks nkq ≤ DA_KQ_MAX, `DECODE_KEY_GROUPS`): nkq key
// groups of DA_VT threads share the weighted-V pass (one value dim per thread and step) and
// are summed once at the end; scores use every warp.
#define DA_VT 128
#define DA_KQ_MAX 4
#define DA_CHUNK 64
#define DA_GMAX 4
#define DA_DPL 8
#define DA_VPT 2
#define DA_SPLIT_MIN 64
#define DA_MAX_SPLITS 64

// Merging split ranges (the in-kernel merge of attn_decode_f32 and attn_decode_combine_f32):
// pr holds `n` ≤ DA_MAX_SPLITS (two per lane) partials of one head, each hdv unnormalised
// output values then (max, sum). One warp: w[s] = e^(m_s − M) with M = max_s m_s, and the
// returned 1 / (Σ_s w_s l_s + e^(sink − M)) (att_inv; 0 when no range saw a key); every (max, sum) is loaded once, all
// at the start. Loads bypass L1: the partials may have been written by other blocks of this
// launch.
__device__ __forceinline__ float da_merge_weights(const float* pr, int n, int hdv, float* w, float sink) {
    int lane = threadIdx.x & 31;
    float m[2], l[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int t = lane + 32 * u;
        m[u] = t < n ? __ldcg(pr + (long)t * (hdv + 2) + hdv) : -INF;
        l[u] = t < n ? __ldcg(pr + (long)t * (hdv + 2) + hdv + 1) : 0.0f;
    }
    float mx = warp_max(fmaxf(m[0], m[1]));
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int t = lane + 32 * u;
        if (t < n) {
            float wt = (m[u] == -INF) ? 0.0f : expf(m[u] - mx);
            w[t] = wt;
            sum += wt * l[u];
        }
    }
    sum = warp_sum(sum);
    return att_inv(sum, mx, sink);
}

// Output dim d of the merged head: Σ_s w_s o_s[d] (in range order), unnormalised.
__device__ __forceinline__ float da_merge_value(const float* pr, int n, int hdv, const float* w, int d) {
    float o = 0.0f;
    for (int t = 0; t < n; t++) o += w[t] * __ldcg(pr + (long)t * (hdv + 2) + d);
    return o;
}

// The query heads of this block (grid row blockIdx.y): KV head kh, and G <= gchunk heads of its
// GQA group from h0 (gchunk clamped to 1..DA_GMAX).
struct DaHeads {
    int kh, G, h0, gchunk;
};

__device__ __forceinline__ DaHeads da_heads(int nh, int nkv, int gchunk) {
    int group = nh / nkv;
    if (group < 1) group = 1;
    if (gchunk < 1 || gchunk > DA_GMAX) gchunk = DA_GMAX;
    int hc = (group + gchunk - 1) / gchunk;
    int c = blockIdx.y % hc;
    DaHeads r;
    r.kh = blockIdx.y / hc;
    r.G = min(gchunk, group - c * gchunk);
    r.h0 = r.kh * group + c * gchunk;
    r.gchunk = gchunk;
    return r;
}

// The keys of query row i and this block's share of them: query position p, the keys [a, b)
// of split s among the `eff` splits the row uses (eff = 0: this block has none and stops).
// With `positions` (device, [sq]) query i sits at positions[i] and sees keys
// max(0, p - window + 1) ..= p, below `kcap`; without it p = skv - sq + i, causal or not. The
// launch has `nsplit` splits for the longest row the cache can hold; with `adaptive` (the
// in-kernel merge) a row uses only as many as its keys need at DA_SPLIT_MIN keys each.
struct DaRange {
    long p, a, b;
    int eff;
};

__device__ __forceinline__ DaRange da_range(const int* positions, int i, int sq, int skv, int kcap, int causal,
                                            int window, int nsplit, bool adaptive, int s) {
    long p, lo = 0, hi;
    if (positions) {
        p = positions[i];
        hi = min(p + 1, (long)kcap);
    } else {
        p = (long)skv - sq + i;
        hi = causal ? min((long)skv, p + 1) : (long)skv;
    }
    if (window > 0) lo = p - window + 1;
    if (hi < 0) hi = 0;
    if (lo < 0) lo = 0;
    if (lo > hi) lo = hi;
    int eff = adaptive ? (int)min((long)nsplit, max(1L, (hi - lo + DA_SPLIT_MIN - 1) / DA_SPLIT_MIN)) : nsplit;
    DaRange r;
    r.p = p;
    r.eff = s < eff ? eff : 0;
    int per = ((int)(hi - lo) + eff - 1) / eff;  // keys < 2^31 (kcap and skv are ints)
    r.a = lo + (long)s * per;
    r.b = min(hi, r.a + per);
    return r;
}

// The end of a split decode block that wrote its partial to `part` (all threads of the block
// call it): the last block of the row's head chunk to finish (counted in `counters`, left zero
// for the next launch) merges the `eff` partials of its G heads in split order and writes the
// normalised output (and its Q8 copy).
__device__ __forceinline__ void da_merge_last(const float* part, float* out, signed char* oq, float2* od,
                                              int* counters, int i, int nh, int h0, int G, int hdv, int eff,
                                              long pstride, const float* sinks) {
    __shared__ int last;
    __shared__ float wsp[DA_GMAX][DA_MAX_SPLITS];
    __shared__ float linv[DA_GMAX];
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nt = blockDim.x;
    __threadfence();
    __syncthreads();
    int* counter = counters + (long)i * gridDim.y + blockIdx.y;
    if (tid == 0) last = atomicAdd(counter, 1) == eff - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid == 0) *counter = 0;  // ready for the next launch
    // per head: M = max_s m_s, w_s = e^(m_s - M), 1 / Σ_s w_s l_s (0 when no split saw a key)
    if (wid < G) {
        float inv = da_merge_weights(part + ((long)i * nh + h0 + wid) * pstride, eff, hdv, wsp[wid],
                                     att_sink(sinks, h0 + wid));
        if (lane == 0) linv[wid] = inv;
    }
    __syncthreads();
    // out = Σ_s w_s o_s · (1 / L); a warp holds 32 consecutive dims of one head (hdv % 32 == 0
    // where the Q8 copy is asked for)
    for (int e = tid; e < G * hdv; e += nt) {
        int g = e / hdv, d = e % hdv;
        float o = da_merge_value(part + ((long)i * nh + h0 + g) * pstride, eff, hdv, wsp[g], d);
        long oi = ((long)i * nh + h0 + g) * hdv + d;
        out[oi] = o * linv[g];
        if (oq) da_quant_store(o * linv[g], oi, oq, od);
    }
}

// The step's own key (rotated with the tables rcos / rsin) and value, kn [hd] and vn [hdv], stored
// at elements ke / ve of the caches by the whole block: a thread per value (f32, f16), or for
// q8_0 a warp per block of 32 values (the key's blocks, then the value's).
template <typename T>
__device__ __forceinline__ void da_store_step(T* k, T* v, long ke, long ve, const float* kn, const float* vn, int hd,
                                              int hdv, const float* rcos, const float* rsin, int rot, int rstyle) {
    for (int e = threadIdx.x; e < hd + hdv; e += blockDim.x) {
        if (e < hd)
            att_st(k, ke + e, rcos ? rope_value(kn, e, rot, rstyle, rcos, rsin) : kn[e]);
        else
            att_st(v, ve + (e - hd), vn[e - hd]);
    }
}

__device__ __forceinline__ void da_store_step(q8kv* k, q8kv* v, long ke, long ve, const float* kn, const float* vn,
                                              int hd, int hdv, const float* rcos, const float* rsin, int rot,
                                              int rstyle) {
    int nbk = (hd + 31) >> 5, nbv = (hdv + 31) >> 5, lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < nbk + nbv; b += blockDim.x >> 5) {
        bool isk = b < nbk;
        int e = (isk ? b : b - nbk) * 32 + lane;
        float x = 0.0f;
        if (isk && e < hd)
            x = rcos ? rope_value(kn, e, rot, rstyle, rcos, rsin) : kn[e];
        else if (!isk && e < hdv)
            x = vn[e];
        q8kv_store_block(isk ? k : v, (isk ? ke : ve) + (e - lane), x);
    }
}

// k and v of element type T (float; unsigned short: f16 bits; q8kv: Q8_0 blocks; the step's own
// key and value are stored rounded to the cache's type and read back so): attn_decode_f32,
// attn_decode_f16kv and attn_decode_q8kv below.
template <typename T>
__device__ void attn_decode_impl(const float* q, const T* k, const T* v, const float* slopes, const int* positions,
                                 float* out, float* part, int sq, int skv, int kcap, int nh, int nkv, int hd, int hdv,
                                 long ks, long vs, float scale, float softcap, int causal, int window, int nsplit,
                                 int gchunk, signed char* oq, float2* od, const float* knew, const float* vnew,
                                 const float* rcos, const float* rsin, int rot, int rstyle, int* counters,
                                 const float* sinks) {
    // counters: null = every split writes its partial for attn_decode_combine_f32
    pdl_begin();
    __shared__ float qs[DA_GMAX][DA_DPL * 32];
    __shared__ float sc[DA_GMAX][DA_CHUNK];
    __shared__ float ms[DA_GMAX], ls[DA_GMAX], cr[DA_GMAX];
    int s = blockIdx.x, i = blockIdx.z;
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int nt = blockDim.x, nkq = nt / DA_VT;
    int kq = tid / DA_VT, dl = tid % DA_VT;
    DaHeads hs = da_heads(nh, nkv, gchunk);
    const int kh = hs.kh, G = hs.G, h0 = hs.h0;
    gchunk = hs.gchunk;
    DaRange r = da_range(positions, i, sq, skv, kcap, causal, window, nsplit, counters != nullptr, s);
    if (r.eff == 0) return;
    const long p = r.p, a = r.a, b = r.b;
    const int eff = r.eff;
    // the step's own key and value (knew, vnew; one query row): every block whose range holds
    // position p writes them (the key rotated) to cache row p before reading it, all the same
    // bits, so a block reads back its own write or an identical one
    const int khs = att_hs(k, hd), vhs = att_hs(v, hdv);
    if (knew && a <= p && p < b)
        da_store_step((T*)k, (T*)v, p * ks + (long)kh * khs, p * vs + (long)kh * vhs, knew + (long)kh * hd,
                      vnew + (long)kh * hdv, hd, hdv, rcos, rsin, rot, rstyle);
    for (int e = tid; e < DA_GMAX * DA_DPL * 32; e += nt) {
        int g = e / (DA_DPL * 32), d = e % (DA_DPL * 32);
        const float* qh = q + ((long)i * nh + h0 + g) * hd;
        qs[g][d] = (g < G && d < hd) ? (rcos ? rope_value(qh, d, rot, rstyle, rcos, rsin) : qh[d]) : 0.0f;
    }
    if (tid < DA_GMAX) {
        ms[tid] = -INF;
        ls[tid] = 0.0f;
    }
    float acc[DA_GMAX][DA_VPT];
#pragma unroll
    for (int g = 0; g < DA_GMAX; g++)
#pragma unroll
        for (int t = 0; t < DA_VPT; t++) acc[g][t] = 0.0f;
    __syncthreads();
    for (long c0 = a; c0 < b; c0 += DA_CHUNK) {
        int cn = (int)min((long)DA_CHUNK, b - c0);
        // scores: a warp per key, 4 keys per step
        for (int j0 = wid * 4; j0 < cn; j0 += 4 * (nt / 32)) {
            float kr[4][DA_DPL];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int t = 0; t < DA_DPL; t++) {
                    int d = lane + 32 * t;
                    kr[u][t] = (j0 + u < cn && d < hd) ? att_ld(k, (c0 + j0 + u) * ks + (long)kh * khs + d) : 0.0f;
                }
#pragma unroll
            for (int g = 0; g < DA_GMAX; g++) {
                if (g < G) {
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        float sv = 0.0f;
#pragma unroll
                        for (int t = 0; t < DA_DPL; t++) sv += qs[g][lane + 32 * t] * kr[u][t];
                        sv = warp_sum(sv);
                        if (lane == 0 && j0 + u < cn) {
                            long j = c0 + j0 + u;
                            sv *= scale;
                            if (softcap > 0.0f) sv = softcap * tanhf(sv / softcap);
                            if (slopes) sv += slopes[h0 + g] * (float)(j - p);
                            sc[g][j0 + u] = sv;
                        }
                    }
                }
            }
        }
        __syncthreads();
        // softmax update: a warp per head
        for (int g = wid; g < G; g += nt / 32) {
            float cm = -INF;
            for (int jj = lane; jj < cn; jj += 32) cm = fmaxf(cm, sc[g][jj]);
            cm = warp_max(cm);
            float om = ms[g];
            float nm = fmaxf(om, cm);
            float corr = (om == -INF) ? 0.0f : expf(om - nm);
            float ps = 0.0f;
            for (int jj = lane; jj < cn; jj += 32) {
                float e = nm == -INF ? 0.0f : expf(sc[g][jj] - nm);
                sc[g][jj] = e;
                ps += e;
            }
            ps = warp_sum(ps);
            __syncwarp();
            if (lane == 0) {
                ls[g] = ls[g] * corr + ps;
                ms[g] = nm;
                cr[g] = corr;
            }
        }
        __syncthreads();
        // weighted V sum: key group kq takes keys 4·kq + 4·nkq·m (4 at a time) and the tail
        // keys ≡ kq (mod nkq)
#pragma unroll
        for (int t = 0; t < DA_VPT; t++) {
            int d = dl + t * DA_VT;
            if (d < hdv) {
                float a2[DA_GMAX];
#pragma unroll
                for (int g = 0; g < DA_GMAX; g++) a2[g] = g < G ? acc[g][t] * cr[g] : 0.0f;
                const long vp = c0 * vs + (long)kh * vhs + d;
                int jj = 4 * kq;
                for (; jj + 4 <= cn; jj += 4 * nkq) {
                    float v0 = att_ld(v, vp + jj * vs), v1 = att_ld(v, vp + (jj + 1) * vs);
                    float v2 = att_ld(v, vp + (jj + 2) * vs), v3 = att_ld(v, vp + (jj + 3) * vs);
#pragma unroll
                    for (int g = 0; g < DA_GMAX; g++)
                        if (g < G) a2[g] += sc[g][jj] * v0 + sc[g][jj + 1] * v1 + sc[g][jj + 2] * v2 + sc[g][jj + 3] * v3;
                }
                for (jj = (cn & ~3) + kq; jj < cn; jj += nkq) {
                    float v0 = att_ld(v, vp + jj * vs);
#pragma unroll
                    for (int g = 0; g < DA_GMAX; g++)
                        if (g < G) a2[g] += sc[g][jj] * v0;
                }
#pragma unroll
                for (int g = 0; g < DA_GMAX; g++) acc[g][t] = a2[g];
            }
        }
        __syncthreads();
    }
    if (nkq > 1) {
        // the key groups' partial sums meet (in a fixed order) in the first group's threads
        __shared__ float red[DA_KQ_MAX - 1][DA_GMAX][DA_VPT * DA_VT];
        if (kq > 0) {
#pragma unroll
            for (int g = 0; g < DA_GMAX; g++)
#pragma unroll
                for (int t = 0; t < DA_VPT; t++) red[kq - 1][g][dl + t * DA_VT] = acc[g][t];
        }
        __syncthreads();
        if (kq == 0) {
#pragma unroll
            for (int g = 0; g < DA_GMAX; g++)
#pragma unroll
                for (int t = 0; t < DA_VPT; t++)
                    for (int r = 0; r < nkq - 1; r++) acc[g][t] += red[r][g][dl + t * DA_VT];
        }
    }
    if (eff == 1) {
        // the whole range in this block: the normalised output
        if (kq > 0) return;
#pragma unroll
        for (int g = 0; g < DA_GMAX; g++) {
            if (g < G) {
                float inv = att_inv(ls[g], ms[g], att_sink(sinks, h0 + g));
#pragma unroll
                for (int t = 0; t < DA_VPT; t++) {
                    int d = dl + t * DA_VT;
                    if (d < hdv) {
                        long o = ((long)i * nh + h0 + g) * hdv + d;
                        float val = acc[g][t] * inv;
                        out[o] = val;
                        if (oq) da_quant_store(val, o, oq, od);
                    }
                }
            }
        }
        return;
    }
    // several splits: this block's unnormalised output and (max, sum) go to `part`; the last
    // block of the row's head chunk to finish (counted in `counters`) merges them in split order
    const long pstride = (long)nsplit * (hdv + 2);
    if (!counters && kq > 0) return;
    if (kq == 0) {
#pragma unroll
        for (int g = 0; g < DA_GMAX; g++) {
            if (g < G) {
                float* pp = part + ((long)i * nh + h0 + g) * pstride + (long)s * (hdv + 2);
#pragma unroll
                for (int t = 0; t < DA_VPT; t++) {
                    int d = dl + t * DA_VT;
                    if (d < hdv) pp[d] = acc[g][t];
                }
                if (tid == 0) {
                    pp[hdv] = ms[g];
                    pp[hdv + 1] = ls[g];
                }
            }
        }
    }
    if (!counters) return;  // merged by attn_decode_combine_f32
    da_merge_last(part, out, oq, od, counters, i, nh, h0, G, hdv, eff, pstride, sinks);
}

// The decode kernels' shared signature, over K/V elements T.
#define DECODE_ARGS(T)                                                                                          \
    const float *q, const T *k, const T *v, const float *slopes, const int *positions, float *out, float *part,  \
        int sq, int skv, int kcap, int nh, int nkv, int hd, int hdv, long ks, long vs, float scale, float softcap, \
        int causal, int window, int nsplit, int gchunk, signed char *oq, float2 *od, const float *knew,           \
        const float *vnew, const float *rcos, const float *rsin, int rot, int rstyle, int *counters,             \
        const float *sinks
#define DECODE_GENERIC(NAME, T)                                                                                 \
    extern "C" __global__ void NAME(DECODE_ARGS(T)) {                                                          \
        attn_decode_impl<T>(q, k, v, slopes, positions, out, part, sq, skv, kcap, nh, nkv, hd, hdv, ks, vs, scale, \
                            softcap, causal, window, nsplit, gchunk, oq, od, knew, vnew, rcos, rsin, rot, rstyle,  \
                            counters, sinks);                                                                   \
    }
DECODE_GENERIC(attn_decode_f32, float)
DECODE_GENERIC(attn_decode_f16kv, unsigned short)
DECODE_GENERIC(attn_decode_q8kv, q8kv)

// ---- decode attention for head size 64 / 128: warps with their own keys ----
// The same launch and results as attn_decode_f32 (grid, arguments, splits, partials, merges)
// for hd == hdv == HD, with fewer barriers: each warp takes its own runs of DW_KPW keys of the
// block's range (keys a + DW_KPW·w + DW_KPW·nw·m) and keeps an online softmax for the G heads
// in registers, a lane holding HD / 32 consecutive dims of q, K, V and the output. The DW_KPW
// K and V rows of a step are loaded together (no wait between scores and values), the step's
// own key and value are used from registers (and stored to cache row p for later steps), and
// the warps meet once at the end: a thread per output value merges the warps' (max, sum,
// output) in warp order. No block-wide barrier inside the key loop.
#define DW_KPW 4
#define DW_WMAX 16
// Launch bounds: at most DW_MAXT threads, DW_MINB blocks per multiprocessor.
#define DW_MAXT 512
#define DW_MINB 1

template <int HD>
__device__ __forceinline__ void dw_load(const float* src, float (&x)[HD / 32]) {
    if (HD / 32 == 4) {
        float4 t = *(const float4*)src;
        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    } else {
        float2 t = *(const float2*)src;
        x[0] = t.x, x[1] = t.y;
    }
}

// HD / 32 f16 values (one 8- or 4-byte load) as floats.
template <int HD>
__device__ __forceinline__ void dw_load(const unsigned short* src, float (&x)[HD / 32]) {
    if (HD / 32 == 4) {
        uint2 t = *(const uint2*)src;
        x[0] = h2f(t.x & 0xffff), x[1] = h2f(t.x >> 16), x[2] = h2f(t.y & 0xffff), x[3] = h2f(t.y >> 16);
    } else {
        unsigned int t = *(const unsigned int*)src;
        x[0] = h2f(t & 0xffff), x[1] = h2f(t >> 16);
    }
}

// HD / 32 values from element e of a cache (f32, f16 or q8_0: one scale and HD / 32 int8 of
// one block, e % 32 being even) as floats.
template <int HD>
__device__ __forceinline__ void dw_ld(const float* p, long e, float (&x)[HD / 32]) {
    dw_load<HD>(p + e, x);
}
template <int HD>
__device__ __forceinline__ void dw_ld(const unsigned short* p, long e, float (&x)[HD / 32]) {
    dw_load<HD>(p + e, x);
}
template <int HD>
__device__ __forceinline__ void dw_ld(const q8kv* p, long e, float (&x)[HD / 32]) {
    const unsigned char* blk = q8kv_block(p, e);
    float d = h2f(*(const unsigned short*)blk);
    const unsigned short* qp = (const unsigned short*)(blk + 2 + (e & 31));
#pragma unroll
    for (int t = 0; t < HD / 32; t += 2) {
        unsigned short u = qp[t / 2];
        x[t] = d * (float)(signed char)(u & 0xff);
        x[t + 1] = d * (float)(signed char)(u >> 8);
    }
}

// The step's own key kn and value vn (KV head rows of HD values at elements e of the caches):
// the warp's lane stores its HD / 32 values from d0 (f32, f16; kn rotated by the caller), or
// for q8_0 the warp stores the rows block by block (kp: the raw key, rotated here). The lanes'
// later loads of the row see these stores.
template <int HD, typename T>
__device__ __forceinline__ void dw_store_vals(T* k, T* v, long e, const float (&kn)[HD / 32],
                                              const float (&vn)[HD / 32]) {
#pragma unroll
    for (int t = 0; t < HD / 32; t++) att_st(k, e + t, kn[t]), att_st(v, e + t, vn[t]);
}
template <int HD>
__device__ __forceinline__ void dw_store_step(float* k, float* v, long e, int d0, const float (&kn)[HD / 32],
                                              const float (&vn)[HD / 32], const float*, const float*,
                                              const float*, const float*, int, int) {
    dw_store_vals<HD>(k, v, e + d0, kn, vn);
}
template <int HD>
__device__ __forceinline__ void dw_store_step(unsigned short* k, unsigned short* v, long e, int d0,
                                              const float (&kn)[HD / 32], const float (&vn)[HD / 32], const float*,
                                              const float*, const float*, const float*, int, int) {
    dw_store_vals<HD>(k, v, e + d0, kn, vn);
}
template <int HD>
__device__ __forceinline__ void dw_store_step(q8kv* k, q8kv* v, long e, int, const float (&)[HD / 32],
                                              const float (&)[HD / 32], const float* kp, const float* vp,
                                              const float* rcos, const float* rsin, int rot, int rstyle) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int b = 0; b < HD / 32; b++) {
        int d = 32 * b + lane;
        q8kv_store_block(k, e + 32 * b, rcos ? rope_value(kp, d, rot, rstyle, rcos, rsin) : kp[d]);
        q8kv_store_block(v, e + 32 * b, vp[d]);
    }
    __syncwarp();
}

// K and V row j of KV head kh, the lane's HD / 32 dims from d0 (zeros for j < 0).
template <int HD, typename T>
__device__ __forceinline__ void dw_row(const T* k, const T* v, long j, long ks, int kh, int d0,
                                       float (&kr)[HD / 32], float (&vr)[HD / 32]) {
    if (j >= 0) {
        dw_ld<HD>(k, j * ks + (long)kh * HD + d0, kr);
        dw_ld<HD>(v, j * ks + (long)kh * HD + d0, vr);
    } else {
#pragma unroll
        for (int t = 0; t < HD / 32; t++) kr[t] = 0.0f, vr[t] = 0.0f;
    }
}

// One run of DW_KPW keys j0.. (rows loaded by dw_row; keys at or past b get no weight) into a
// warp's online softmax of the G heads: scores (scale, soft-capping, ALiBi slope per head), new max, rescaled sum and
// output.
template <int HD>
__device__ __forceinline__ void dw_keys(const float (&qr)[DA_GMAX][HD / 32], const float (&kr)[DW_KPW][HD / 32],
                                        const float (&vr)[DW_KPW][HD / 32], long j0, long b, long p, int G, float scale,
                                        float softcap, const float (&slope)[DA_GMAX], float (&m)[DA_GMAX],
                                        float (&l)[DA_GMAX], float (&o)[DA_GMAX][HD / 32]) {
    constexpr int VPL = HD / 32;
#pragma unroll
    for (int g = 0; g < DA_GMAX; g++) {
        if (g < G) {
            float sv[DW_KPW];
#pragma unroll
            for (int u = 0; u < DW_KPW; u++) {
                float x = 0.0f;
#pragma unroll
                for (int t = 0; t < VPL; t++) x += qr[g][t] * kr[u][t];
                sv[u] = x;
            }
#pragma unroll
            for (int u = 0; u < DW_KPW; u++) sv[u] = warp_sum(sv[u]);
            float cm = -INF;
#pragma unroll
            for (int u = 0; u < DW_KPW; u++) {
                long j = j0 + u;
                float x = sv[u] * scale;
                if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
                x += slope[g] * (float)(j - p);
                sv[u] = j < b ? x : -INF;
                cm = fmaxf(cm, sv[u]);
            }
            float nm = fmaxf(m[g], cm);
            float corr = (m[g] == -INF) ? 0.0f : expf(m[g] - nm);
            float ps = 0.0f;
#pragma unroll
            for (int u = 0; u < DW_KPW; u++) {
                sv[u] = sv[u] == -INF ? 0.0f : expf(sv[u] - nm);
                ps += sv[u];
            }
            l[g] = l[g] * corr + ps;
            m[g] = nm;
#pragma unroll
            for (int t = 0; t < VPL; t++) {
                float x = o[g][t] * corr;
#pragma unroll
                for (int u = 0; u < DW_KPW; u++) x += sv[u] * vr[u][t];
                o[g][t] = x;
            }
        }
    }
}

template <int HD, typename T>
__device__ __forceinline__ void attn_decode_warps(const float* q, const T* k, const T* v,
                                                  const float* slopes, const int* positions, float* out,
                                                  float* part, int sq, int skv, int kcap, int nh, int nkv, float scale,
                                                  float softcap, int causal, int window, int nsplit, int gchunk,
                                                  signed char* oq, float2* od, const float* knew, const float* vnew,
                                                  const float* rcos, const float* rsin, int rot, int rstyle,
                                                  int* counters, const float* sinks) {
    constexpr int VPL = HD / 32;
    // per warp and head: max, sum (static) and the HD output values (dynamic, nw · gchunk · HD
    // floats, sized by the host)
    extern __shared__ float wo[];
    __shared__ float wm[DW_WMAX][DA_GMAX], wl[DW_WMAX][DA_GMAX];
    int s = blockIdx.x, i = blockIdx.z;
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int nt = blockDim.x, nw = nt / 32;
    DaHeads hs = da_heads(nh, nkv, gchunk);
    const int kh = hs.kh, G = hs.G, h0 = hs.h0;
    gchunk = hs.gchunk;
    const long ks = (long)nkv * HD;  // K and V rows
    const int d0 = lane * VPL;
    // the queries (rotated when the step's tables are given) while the position loads
    float qr[DA_GMAX][VPL];
#pragma unroll
    for (int g = 0; g < DA_GMAX; g++) {
        const float* qh = q + ((long)i * nh + h0 + g) * HD;
        if (g >= G) {
#pragma unroll
            for (int t = 0; t < VPL; t++) qr[g][t] = 0.0f;
        } else if (rcos) {
#pragma unroll
            for (int t = 0; t < VPL; t++) qr[g][t] = rope_value(qh, d0 + t, rot, rstyle, rcos, rsin);
        } else {
            dw_load<HD>(qh + d0, qr[g]);
        }
    }
    DaRange r = da_range(positions, i, sq, skv, kcap, causal, window, nsplit, counters != nullptr, s);
    if (r.eff == 0) return;
    const long p = r.p, a = r.a, b = r.b;
    const int eff = r.eff;
    // the step's own key (rotated) and value: the warp whose keys hold position p stores them
    // to cache row p, each lane its own dims, before its loads of that row (which then see the
    // lane's own write); every block whose range holds p does so, all the same bits, and no
    // other thread of the launch reads that row
    if (knew && a <= p && p < b && wid == (int)((p - a) / DW_KPW) % nw) {
        const float* kp = knew + (long)kh * HD;
        float kn[VPL], vn[VPL];
#pragma unroll
        for (int t = 0; t < VPL; t++) kn[t] = rcos ? rope_value(kp, d0 + t, rot, rstyle, rcos, rsin) : kp[d0 + t];
        dw_load<HD>(vnew + (long)kh * HD + d0, vn);
        dw_store_step<HD>((T*)k, (T*)v, p * ks + (long)kh * HD, d0, kn, vn, kp, vnew + (long)kh * HD, rcos, rsin,
                          rot, rstyle);
    }
    float m[DA_GMAX], l[DA_GMAX], o[DA_GMAX][VPL];
#pragma unroll
    for (int g = 0; g < DA_GMAX; g++) {
        m[g] = -INF;
        l[g] = 0.0f;
#pragma unroll
        for (int t = 0; t < VPL; t++) o[g][t] = 0.0f;
    }
    float slope[DA_GMAX];
#pragma unroll
    for (int g = 0; g < DA_GMAX; g++) slope[g] = slopes && g < G ? slopes[h0 + g] : 0.0f;
    for (long j0 = a + (long)wid * DW_KPW; j0 < b; j0 += (long)DW_KPW * nw) {
        float kr[DW_KPW][VPL], vr[DW_KPW][VPL];
#pragma unroll
        for (int u = 0; u < DW_KPW; u++) dw_row<HD, T>(k, v, j0 + u < b ? j0 + u : -1, ks, kh, d0, kr[u], vr[u]);
        dw_keys<HD>(qr, kr, vr, j0, b, p, G, scale, softcap, slope, m, l, o);
    }
    // the warps that saw keys meet: per head, M = max_w m_w and
    // out = Σ_w e^(m_w − M) o_w / Σ_w e^(m_w − M) l_w (in warp order)
    const int nact = (int)min((long)nw, (b - a + DW_KPW - 1) / DW_KPW);
    if (wid < nact) {
#pragma unroll
        for (int g = 0; g < DA_GMAX; g++) {
            if (g < G) {
                if (lane == 0) wm[wid][g] = m[g], wl[wid][g] = l[g];
                float* wp = wo + ((long)wid * gchunk + g) * HD + d0;
#pragma unroll
                for (int t = 0; t < VPL; t++) wp[t] = o[g][t];
            }
        }
    }
    __syncthreads();
    const long pstride = (long)nsplit * (HD + 2);
    for (int e = tid; e < G * HD; e += nt) {
        int g = e / HD, d = e % HD;
        float mx = -INF;
        for (int w = 0; w < nact; w++) mx = fmaxf(mx, wm[w][g]);
        float acc = 0.0f, sum = 0.0f;
        for (int w = 0; w < nact; w++) {
            float wt = wm[w][g] == -INF ? 0.0f : expf(wm[w][g] - mx);
            acc += wt * wo[((long)w * gchunk + g) * HD + d];
            sum += wt * wl[w][g];
        }
        long oi = ((long)i * nh + h0 + g) * HD + d;
        if (eff == 1) {
            float val = acc * att_inv(sum, mx, att_sink(sinks, h0 + g));
            out[oi] = val;
            if (oq) da_quant_store(val, oi, oq, od);
        } else {
            float* pp = part + ((long)i * nh + h0 + g) * pstride + (long)s * (HD + 2);
            pp[d] = acc;
            if (d == 0) pp[HD] = mx, pp[HD + 1] = sum;
        }
    }
    if (eff == 1 || !counters) return;  // one split, or merged by attn_decode_combine_f32
    da_merge_last(part, out, oq, od, counters, i, nh, h0, G, HD, eff, pstride, sinks);
}

#define DECODE_WARPS(HD, T, SUFFIX) \
    extern "C" __global__ void __launch_bounds__(DW_MAXT, DW_MINB) attn_decode_w##HD##_##SUFFIX(DECODE_ARGS(T)) { \
        pdl_begin(); \
        attn_decode_warps<HD, T>(q, k, v, slopes, positions, out, part, sq, skv, kcap, nh, nkv, scale, softcap, \
                                 causal, window, nsplit, gchunk, oq, od, knew, vnew, rcos, rsin, rot, rstyle, \
                                 counters, sinks); \
    }
DECODE_WARPS(64, float, f32)
DECODE_WARPS(128, float, f32)
DECODE_WARPS(64, unsigned short, f16kv)
DECODE_WARPS(128, unsigned short, f16kv)
DECODE_WARPS(64, q8kv, q8kv)
DECODE_WARPS(128, q8kv, q8kv)

// Merges the nsplit partial results of attn_decode_f32: block (h, i), a thread per value dim.
// out = Σ_s e^(m_s - M) o_s / (Σ_s e^(m_s - M) l_s + e^(sink - M)) (0 when no split saw a key).
extern "C" __global__ void attn_decode_combine_f32(const float* part, float* out, int nh, int hdv, int nsplit,
                                                    signed char* oq, float2* od, const float* sinks) {
    pdl_begin();
    __shared__ float wsh[DA_MAX_SPLITS];
    __shared__ float inv;
    int h = blockIdx.x, i = blockIdx.y;
    const float* pr = part + ((long)i * nh + h) * nsplit * (long)(hdv + 2);
    if (threadIdx.x < 32) {
        float v = da_merge_weights(pr, nsplit, hdv, wsh, att_sink(sinks, h));
        if (threadIdx.x == 0) inv = v;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hdv; d += blockDim.x) {
        float o = da_merge_value(pr, nsplit, hdv, wsh, d);
        long oi = ((long)i * nh + h) * hdv + d;
        out[oi] = o * inv;
        if (oq) da_quant_store(o * inv, oi, oq, od);
    }
}

// KvAppend of an f16 cache: the n f32 values of x as f16 at dst (the rows after the cache's
// last).
extern "C" __global__ void kv_append_f16kv(const float* x, unsigned short* dst, long n) {
    pdl_begin();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = f2h(x[i]);
}

// KvAppend of a q8_0 cache: `rows` f32 head rows of hd values at x as Q8_0 head rows (padded to
// whole blocks) at dst (the rows after the cache's last); a warp per block.
extern "C" __global__ void kv_append_q8kv(const float* x, q8kv* dst, long rows, int hd) {
    pdl_begin();
    int nb = (hd + 31) >> 5, lane = threadIdx.x & 31;
    long nwarps = ((long)gridDim.x * blockDim.x) >> 5;
    for (long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < rows * nb; w += nwarps) {
        long r = w / nb;
        int d = (int)(w % nb) * 32 + lane;
        q8kv_store_block(dst, w * 32, d < hd ? x[r * hd + d] : 0.0f);
    }
}

// The cuBLAS prefill over a q8_0 cache: its first `rows` head rows as f32 (hd and hdv values
// per row, the layout of an f32 cache).
extern "C" __global__ void kv_float_q8kv(const q8kv* k, const q8kv* v, float* kf, float* vf, long rows, int hd,
                                         int hdv) {
    pdl_begin();
    int khs = att_hs(k, hd), vhs = att_hs(v, hdv);
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < rows * hd || i < rows * hdv;
         i += (long)gridDim.x * blockDim.x) {
        if (i < rows * hd) kf[i] = att_ld(k, (i / hd) * khs + i % hd);
        if (i < rows * hdv) vf[i] = att_ld(v, (i / hdv) * vhs + i % hdv);
    }
}

// The cuBLAS prefill over an f16 cache: its rows [0, n) as f32 (the layout of an f32 cache).
extern "C" __global__ void kv_float_f16kv(const unsigned short* k, const unsigned short* v, float* kf, float* vf,
                                          long nk, long nv) {
    pdl_begin();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < nk || i < nv; i += (long)gridDim.x * blockDim.x) {
        if (i < nk) kf[i] = h2f(k[i]);
        if (i < nv) vf[i] = h2f(v[i]);
    }
}

// ---- Flash attention for prefill (`fast` precision): causal, GQA, no ALiBi / soft-cap / window ----
// q [sq, nh, HD] f32, kh / vh [skv, nkv, HD] f16 (an f16 cache, or f32 rows converted by kv_half_f32),
// out [sq, nh, HD] f32; query i sits at position skv - sq + i and sees keys 0 ..= that position.
// A block of 4 warps takes 64 queries of one head; each warp keeps its 16 query rows as f16
// tensor-core fragments (scaled by scale · log2 e) and walks the keys in tiles of 64 staged in
// shared memory: S = Q·Kᵀ and O += P·V with mma.sync m16n8k16 (f32 accumulate), an online
// softmax in between (exp2), the probabilities reused from the S accumulators as the A operand.
// Scores never reach memory. The tiles arrive by cp.async and overlap the math: V of a tile
// loads while S is formed, K of the next tile while P·V runs. Only tiles that cross the
// diagonal or the ends are masked.

#define FA_BQ 64
// keys per tile (a multiple of 16) and the blocks per SM the kernel promises (register cap)
#define FA_BK 64
#define FLASH_MIN_BLOCKS 1

// two floats as packed f16 (lo in the low half), one cvt for both; the same bits as two f2h
__device__ __forceinline__ unsigned int fa_pack(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x by the SFU alone (ex2.approx.ftz: results below 2^-126 flush to 0, 2^-inf = 0); exp2f
// adds a rescaling test around it for subnormal results, which probabilities do not need
__device__ __forceinline__ float fa_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// k and v rows [0, n) (rows of `row` floats) as f16, four values per thread.
extern "C" __global__ void kv_half_f32(const float4* k, const float4* v, uint2* kh, uint2* vh, long n4) {
    pdl_begin();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        kh[i] = half4_of(k[i], 0);
        vh[i] = half4_of(v[i], 0);
    }
}

// c[0..3] += A (16×16, row-major f16 pairs) · B (16×8, column pairs), the PTX fragment layouts
// of mma.m16n8k16: lane = 4 g + t; A regs: (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8);
// B regs: (k 2t, n g), (k 2t + 8, n g); C: (g, 2t..2t+1), (g + 8, 2t..2t+1).
__device__ __forceinline__ void fa_mma(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 f16 matrices from shared memory (ldmatrix .x4): lane l gives the address of row l % 8
// of matrix l / 8; register i gets matrix i's (row lane / 4, columns 2 (lane % 4) ..+1), or
// with TRANS its (rows 2 (lane % 4) ..+1, column lane / 4) — the B fragment of a row-major tile.
template <bool TRANS>
__device__ __forceinline__ void fa_ldm4(const unsigned short* p, unsigned int* r) {
    unsigned int a = (unsigned int)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}

// Rows k0 .. k0 + FA_BK of one KV head (from element `off` of the cache; rows `stride` values
// apart, skv of them) into the shared tile: an f16 cache by 16-byte cp.async, rows past the end
// zeroed; one commit group.
template <int HD, int NT>
__device__ __forceinline__ void fa_stage(unsigned short (*tile)[HD + 8], const unsigned short* base, long off,
                                         long stride, int k0, int skv) {
    static_assert((FA_BK * HD / 8) % NT == 0, "tile chunks must split evenly over the threads");
    const unsigned short* src = base + off;
#pragma unroll
    for (int it = 0; it < FA_BK * HD / 8 / NT; it++) {
        int e = threadIdx.x + it * NT;
        int r = e / (HD / 8), c8 = (e % (HD / 8)) * 8;
        long j = k0 + r;
        if (j < skv) {
            unsigned int sa = (unsigned int)__cvta_generic_to_shared(&tile[r][c8]);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(src + j * stride + c8));
        } else {
            *(uint4*)&tile[r][c8] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    asm volatile("cp.async.commit_group;");
}

// The same from a q8_0 cache: each thread dequantizes 8 values of one block in registers (scale
// times int8, rounded to f16) and stores them to the tile (plain loads; the commit group is empty).
template <int HD, int NT>
__device__ __forceinline__ void fa_stage(unsigned short (*tile)[HD + 8], const q8kv* base, long off, long stride,
                                         int k0, int skv) {
    static_assert((FA_BK * HD / 8) % NT == 0, "tile chunks must split evenly over the threads");
#pragma unroll
    for (int it = 0; it < FA_BK * HD / 8 / NT; it++) {
        int e = threadIdx.x + it * NT;
        int r = e / (HD / 8), c8 = (e % (HD / 8)) * 8;
        long j = k0 + r;
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (j < skv) {
            long x = off + j * stride + c8;
            const unsigned char* blk = q8kv_block(base, x);
            float d = h2f(*(const unsigned short*)blk);
            const unsigned short* qp = (const unsigned short*)(blk + 2 + (x & 31));
            unsigned int h[4];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                unsigned short u = qp[t];
                h[t] = fa_pack(d * (float)(signed char)(u & 0xff), d * (float)(signed char)(u >> 8));
            }
            w = make_uint4(h[0], h[1], h[2], h[3]);
        }
        *(uint4*)&tile[r][c8] = w;
    }
    asm volatile("cp.async.commit_group;");
}

__device__ __forceinline__ void fa_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// HPB query heads of one GQA group per block (4 warps each), sharing every K/V tile it stages.
// hs (or null): the output also as f16 (bf = 0) or bf16 (bf = 1) rows, for the next Linear.
template <int HD, int HPB, typename T>
__device__ void flash_attn_t(const float* q, const T* kh, const T* vh, float* out, int sq, int skv, int nh, int nkv,
                             float scale, unsigned int* hs, int bf) {
    __shared__ __align__(16) unsigned short Ks[FA_BK][HD + 8];
    __shared__ __align__(16) unsigned short Vs[FA_BK][HD + 8];
    // the last query tiles have the most keys: start them first
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // grid (head groups, query tiles): the dispatch order walks all heads of one query tile
    // before the next, so the longest tiles (the last queries) go first across every head
    int qt = gridDim.y - 1 - blockIdx.y, h = blockIdx.x * HPB + (warp >> 2);
    int group = nh / nkv, kvh = blockIdx.x * HPB / group;
    int q0 = qt * FA_BQ + (warp & 3) * 16;
    long kstride = (long)nkv * HD, qstride = (long)nh * HD;
    const long hoff = (long)kvh * HD;  // the KV head's first element in a row
    int off = skv - sq;
    const float sl2 = scale * 1.4426950408889634f;
    unsigned int qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int row = q0 + g + ((r & 1) ? 8 : 0);
            int col = kk * 16 + 2 * t + ((r & 2) ? 8 : 0);
            float a = 0.0f, b = 0.0f;
            if (row < sq) {
                const float* qp = q + row * qstride + (long)h * HD + col;
                a = qp[0] * sl2;
                b = qp[1] * sl2;
            }
            qf[kk][r] = fa_pack(a, b);
        }
    float o[HD / 8][4];
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
    float m[2] = {-INF, -INF}, l[2] = {0.0f, 0.0f};
    int last = min(sq - 1, qt * FA_BQ + FA_BQ - 1);
    int kend = min(skv, off + last + 1);
    if (kend > 0) fa_stage<HD, 128 * HPB>(Ks, kh, hoff, kstride, 0, skv);
    for (int k0 = 0; k0 < kend; k0 += FA_BK) {
        fa_wait_all();
        __syncthreads();  // K tile here; every warp is past the last tile's P·V (V is free)
        fa_stage<HD, 128 * HPB>(Vs, vh, hoff, kstride, k0, skv);
        // this warp's queries all before the tile: nothing to add (warp-uniform)
        bool active = q0 < sq && off + q0 + 15 >= k0;
        float s[FA_BK / 8][4];
        if (active) {
            // K fragments by ldmatrix: matrices (keys 8nt.., dims 16kk), (.., 16kk + 8),
            // (.., 16kk + 16), (.., 16kk + 24) = b0, b1 of k-steps kk and kk + 1
#pragma unroll
            for (int nt = 0; nt < FA_BK / 8; nt++) {
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk += 2) {
                    unsigned int b[4];
                    fa_ldm4<false>(&Ks[nt * 8 + (lane & 7)][kk * 16 + (lane >> 3) * 8], b);
                    fa_mma(s[nt], qf[kk], b[0], b[1]);
                    fa_mma(s[nt], qf[kk + 1], b[2], b[3]);
                }
            }
            // masks only where the tile crosses the diagonal, the last key or the last query:
            // key k0 + 8 nt + 2 t + e of row i is kept while 8 nt + e <= lim
            bool edge = k0 + FA_BK - 1 > off + q0 || k0 + FA_BK > skv || q0 + 16 > sq;
            if (edge) {
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    int i = q0 + g + 8 * hh;
                    int lim = (i < sq ? min(off + i, skv - 1) : -1) - (k0 + 2 * t);
#pragma unroll
                    for (int nt = 0; nt < FA_BK / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            if (nt * 8 + e > lim) s[nt][2 * hh + e] = -INF;
                }
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                float mx = -INF;
#pragma unroll
                for (int nt = 0; nt < FA_BK / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * hh], s[nt][2 * hh + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float mnew = fmaxf(m[hh], mx);
                // a row with every key so far masked keeps m = -INF: subtract 0 instead, so
                // exp2(-INF) = 0 without a test per element
                float msafe = mnew == -INF ? 0.0f : mnew;
                float corr = fa_exp2(m[hh] - msafe);
                float rs = 0.0f;
#pragma unroll
                for (int nt = 0; nt < FA_BK / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float p = fa_exp2(s[nt][2 * hh + e] - msafe);
                        s[nt][2 * hh + e] = p;
                        rs += p;
                    }
                rs += __shfl_xor_sync(0xffffffffu, rs, 1);
                rs += __shfl_xor_sync(0xffffffffu, rs, 2);
                l[hh] = l[hh] * corr + rs;
                m[hh] = mnew;
#pragma unroll
                for (int dn = 0; dn < HD / 8; dn++) {
                    o[dn][2 * hh] *= corr;
                    o[dn][2 * hh + 1] *= corr;
                }
            }
        }
        fa_wait_all();
        __syncthreads();  // V tile here; every warp is past this tile's S (K is free)
        if (k0 + FA_BK < kend) fa_stage<HD, 128 * HPB>(Ks, kh, hoff, kstride, k0 + FA_BK, skv);
        if (!active) continue;
#pragma unroll
        for (int kk = 0; kk < FA_BK / 16; kk++) {
            unsigned int a[4] = {fa_pack(s[2 * kk][0], s[2 * kk][1]), fa_pack(s[2 * kk][2], s[2 * kk][3]),
                                 fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                 fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            // V fragments by transposing ldmatrix: matrices (keys 16kk.., dims 8dn), (keys 16kk + 8..,
            // 8dn), (16kk.., 8dn + 8), (16kk + 8.., 8dn + 8) = b0, b1 of dim tiles dn and dn + 1
#pragma unroll
            for (int dn = 0; dn < HD / 8; dn += 2) {
                unsigned int b[4];
                fa_ldm4<true>(&Vs[kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][dn * 8 + (lane >> 4) * 8], b);
                fa_mma(o[dn], a, b[0], b[1]);
                fa_mma(o[dn + 1], a, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        int i = q0 + g + 8 * hh;
        if (i < sq) {
            float inv = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
            float* op = out + i * qstride + (long)h * HD;
#pragma unroll
            for (int dn = 0; dn < HD / 8; dn++) {
                int col = dn * 8 + 2 * t;
                float a = o[dn][2 * hh] * inv, b = o[dn][2 * hh + 1] * inv;
                *(float2*)&op[col] = make_float2(a, b);
                if (hs)
                    hs[(i * qstride + (long)h * HD + col) >> 1] =
                        bf ? ((unsigned int)f2bf(a) | ((unsigned int)f2bf(b) << 16)) : fa_pack(a, b);
            }
        }
    }
}

// flash_attn{64,128}x1_f32 over f16 keys and values, flash_attn{64,128}x1_q8kv over a q8_0 cache.
#define FLASH(HD, HPB, MINB, T, SUFFIX) \
    extern "C" __global__ void __launch_bounds__(128 * HPB, MINB) flash_attn##HD##x##HPB##_##SUFFIX( \
        const float* q, const T* kh, const T* vh, float* out, int sq, int skv, int nh, int nkv, float scale, \
        unsigned int* hs, int bf) { \
        pdl_begin(); \
        flash_attn_t<HD, HPB, T>(q, kh, vh, out, sq, skv, nh, nkv, scale, hs, bf); \
    }
FLASH(64, 1, FLASH_MIN_BLOCKS, unsigned short, f32)
FLASH(128, 1, FLASH_MIN_BLOCKS, unsigned short, f32)
FLASH(64, 1, FLASH_MIN_BLOCKS, q8kv, q8kv)
FLASH(128, 1, FLASH_MIN_BLOCKS, q8kv, q8kv)
