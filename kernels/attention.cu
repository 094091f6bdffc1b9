// Attention, f32: one block of ATT_THREADS threads per (query, head). Keys are processed in
// chunks of ATT_CHUNK: a warp per key computes the scores into shared memory, then an online
// softmax rescales the running output (each thread owns output dims tid, tid + ATT_THREADS, ...).
// Query i sits at position p = skv - sq + i; causal: keys j <= p; window w: p - j < w.
// Scores: q·k * scale, then softcap·tanh(s / softcap), then + slope[h]·(j - p). A query that
// sees no key writes zeros. q [sq, nh, hd], k [skv, nkv, hd] (row stride ks), v [skv, nkv, hdv]
// (row stride vs), out [sq, nh, hdv]. hdv <= ATT_THREADS * ATT_DPT.

#define ATT_THREADS 128
#define ATT_CHUNK 256
#define ATT_DPT 4

extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, const float* slopes,
                                         float* out, int sq, int skv, int nh, int nkv, int hd, int hdv,
                                         long ks, long vs, float scale, float softcap, int causal, int window) {
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
            const float* kr = k + (c0 + jj) * ks + (long)kh * hd;
            float s = 0.0f;
            for (int d = lane; d < hd; d += 32) s += qs[d] * kr[d];
            s = warp_sum(s);
            if (lane == 0) {
                s *= scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                s += slope * (float)(c0 + jj - p);
                sc[jj] = s;
            }
        }
        __syncthreads();
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
#pragma unroll
        for (int t = 0; t < ATT_DPT; t++) {
            int d = tid + t * ATT_THREADS;
            if (d < hdv) {
                float a = acc[t] * corr;
                const float* vp = v + c0 * vs + (long)kh * hdv + d;
                for (int jj = 0; jj < cn; jj++) a += sc[jj] * vp[jj * vs];
                acc[t] = a;
            }
        }
        __syncthreads();
    }
    float* orow = out + ((long)i * nh + h) * hdv;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int t = 0; t < ATT_DPT; t++) {
        int d = tid + t * ATT_THREADS;
        if (d < hdv) orow[d] = acc[t] * inv;
    }
}

// PagedAttention, f32: keys/values live in a pool of slots [slots, nkv, hd] addressed through
// per-sequence block tables. Block (row, head); the row's sequence s is found in q_starts
// (nseq + 1 entries); its position is pos = kv_lens[s] - (q_end - q_start) + (row - q_start);
// it sees keys lo..=pos (lo = pos + 1 - window with a window). Key j of sequence s lives in slot
// tables[s * maxb + j / bs] * bs + j % bs. Scores as in attention_f32.
extern "C" __global__ void paged_attention_f32(const float* q, const float* kc, const float* vc,
                                               const int* q_starts, const int* kv_lens, const int* tables,
                                               const float* slopes, float* out, int nseq, int maxb, int bs,
                                               int nh, int nkv, int hd, float scale, float softcap, int window) {
    __shared__ float sc[ATT_CHUNK];
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
    long rs = (long)nkv * hd;
    __syncthreads();
    for (long c0 = start; c0 < end; c0 += ATT_CHUNK) {
        int cn = (int)min((long)ATT_CHUNK, end - c0);
        for (int jj = wid; jj < cn; jj += nw) {
            long j = c0 + jj;
            long slot = (long)tb[j / bs] * bs + j % bs;
            const float* kr = kc + slot * rs + (long)kh * hd;
            float sv = 0.0f;
            for (int d = lane; d < hd; d += 32) sv += qs[d] * kr[d];
            sv = warp_sum(sv);
            if (lane == 0) {
                sv *= scale;
                if (softcap > 0.0f) sv = softcap * tanhf(sv / softcap);
                sv += slope * (float)(j - pos);
                sc[jj] = sv;
            }
        }
        __syncthreads();
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
#pragma unroll
        for (int t = 0; t < ATT_DPT; t++) {
            int d = tid + t * ATT_THREADS;
            if (d < hd) {
                float a = acc[t] * corr;
                for (int jj = 0; jj < cn; jj++) {
                    long j = c0 + jj;
                    long slot = (long)tb[j / bs] * bs + j % bs;
                    a += sc[jj] * vc[slot * rs + (long)kh * hd + d];
                }
                acc[t] = a;
            }
        }
        __syncthreads();
    }
    float* orow = out + ((long)row * nh + h) * hd;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int t = 0; t < ATT_DPT; t++) {
        int d = tid + t * ATT_THREADS;
        if (d < hd) orow[d] = acc[t] * inv;
    }
}

// PagedCacheWrite: cache[slots[i]] = input[i] (rows of `row` floats).
extern "C" __global__ void paged_cache_write_f32(const float* x, const int* slots, float* cache, long n, long row) {
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

extern "C" __global__ void attn_softmax_f32(float* s, const float* slopes, int qc, int i0, int sq, int skv, long ld,
                                            int kend, float softcap, int causal, int window) {
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
        float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
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
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (long j = start + threadIdx.x; j < end; j += blockDim.x) row[j] *= inv;
}
