// RotaryEmbedding, f32, in place: x [s, heads, hd]; one thread per (row, group of ROPE_HEADS
// heads, pair): the angle of a (row, pair) is formed once for the heads of its group (it does
// not depend on the head).
// mode 0: angle = pos · theta^(-2i/rot); 1: pos · inv_freq[i]; 2: cos/sin tables [s, rot/2].
// Angles are formed in double, as in the CPU reference. style 0 = neox pairs (i, i + rot/2),
// 1 = interleaved pairs (2i, 2i + 1).

// x2 (or null) [s, heads2, hd]: a second tensor rotated in the same launch (the keys, with x
// the queries).
#define ROPE_HEADS 8

// cos and sin of pair i's angle at position p (modes 0 and 1), formed in double.
__device__ __forceinline__ void rope_angle(long p, const float* inv_freq, int i, int rot, float theta, int mode,
                                           float& c, float& sn) {
    double f = mode == 1 ? (double)inv_freq[i] : pow((double)theta, -2.0 * i / (double)rot);
    double a = (double)p * f;
    c = (float)cos(a);
    sn = (float)sin(a);
}

extern "C" __global__ void rotary_f32(float* x, const int* pos, const float* inv_freq, const float* cosv,
                                      const float* sinv, int s, int heads, int hd, int rot, int style,
                                      float theta, int mode, float* x2, int heads2) {
    pdl_begin();
    int half = rot / 2;
    int ht = heads + (x2 ? heads2 : 0);
    int groups = (ht + ROPE_HEADS - 1) / ROPE_HEADS;
    long total = (long)s * groups * half;
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (long)gridDim.x * blockDim.x) {
        int i = (int)(id % half);
        long tg = id / half;
        int t = (int)(tg / groups), grp = (int)(tg % groups);
        float c, sn;
        if (mode == 2) {
            c = cosv[(long)t * half + i];
            sn = sinv[(long)t * half + i];
        } else {
            rope_angle(pos[t], inv_freq, i, rot, theta, mode, c, sn);
        }
        int ia = style == 0 ? i : 2 * i;
        int ib = style == 0 ? i + half : 2 * i + 1;
        // all loads of the group first, then the stores (they may not alias, but the compiler
        // cannot know that: interleaved, each load would wait for the previous store)
        float* xh[ROPE_HEADS];
        float a[ROPE_HEADS], b[ROPE_HEADS];
#pragma unroll
        for (int u = 0; u < ROPE_HEADS; u++) {
            int hh = grp * ROPE_HEADS + u;
            xh[u] = hh >= ht ? 0 : hh < heads ? x + ((long)t * heads + hh) * hd : x2 + ((long)t * heads2 + (hh - heads)) * hd;
            if (xh[u]) {
                a[u] = xh[u][ia];
                b[u] = xh[u][ib];
            }
        }
#pragma unroll
        for (int u = 0; u < ROPE_HEADS; u++)
            if (xh[u]) {
                xh[u][ia] = rope_first(a[u], b[u], c, sn);
                xh[u][ib] = rope_second(a[u], b[u], c, sn);
            }
    }
}

// The cos/sin of every (row, pair) angle of modes 0 and 1, formed by rotary_f32's rope_angle
// (so the same bits), into tables [s, rot/2] that every layer of a step then reads (mode 2)
// instead of evaluating pow/cos/sin in double again.
extern "C" __global__ void rotary_tables_f32(const int* pos, const float* inv_freq, int s, int rot, float theta,
                                             int mode, float* cosv, float* sinv) {
    pdl_begin();
    int half = rot / 2;
    long total = (long)s * half;
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (long)gridDim.x * blockDim.x) {
        int i = (int)(id % half);
        rope_angle(pos[id / half], inv_freq, i, rot, theta, mode, cosv[id], sinv[id]);
    }
}
