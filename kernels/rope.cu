// RotaryEmbedding, f32, in place: x [s, heads, hd]; one thread per (row, head, pair).
// mode 0: angle = pos · theta^(-2i/rot); 1: pos · inv_freq[i]; 2: cos/sin tables [s, rot/2].
// Angles are formed in double, as in the CPU reference. style 0 = neox pairs (i, i + rot/2),
// 1 = interleaved pairs (2i, 2i + 1).

// x2 (or null) [s, heads2, hd]: a second tensor rotated in the same launch (the keys, with x
// the queries of a decode step).
extern "C" __global__ void rotary_f32(float* x, const int* pos, const float* inv_freq, const float* cosv,
                                      const float* sinv, int s, int heads, int hd, int rot, int style,
                                      float theta, int mode, float* x2, int heads2) {
    pdl_begin();
    int half = rot / 2;
    int ht = heads + (x2 ? heads2 : 0);
    long total = (long)s * ht * half;
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < total; id += (long)gridDim.x * blockDim.x) {
        int i = (int)(id % half);
        long tk = id / half;
        int t = (int)(tk / ht), hh = (int)(tk % ht);
        float c, sn;
        if (mode == 2) {
            c = cosv[(long)t * half + i];
            sn = sinv[(long)t * half + i];
        } else {
            double f = mode == 1 ? (double)inv_freq[i] : pow((double)theta, -2.0 * i / (double)rot);
            double a = (double)pos[t] * f;
            c = (float)cos(a);
            sn = (float)sin(a);
        }
        float* xh = hh < heads ? x + ((long)t * heads + hh) * hd : x2 + ((long)t * heads2 + (hh - heads)) * hd;
        int ia = style == 0 ? i : 2 * i;
        int ib = style == 0 ? i + half : 2 * i + 1;
        float a = xh[ia], b = xh[ib];
        xh[ia] = a * c - b * sn;
        xh[ib] = b * c + a * sn;
    }
}
