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
