// Peer-to-peer all-reduce between the GPUs of a tensor-parallel group that can address each
// other's memory (src/devices/cuda/p2p.rs sets the group up).
//
// Every rank owns one buffer of 2 parities x world slots and a flag array. A reduction is one
// kernel launched with the same grid on every rank; block b of every rank handles the same
// elements. Block b pushes its part of this rank's partial sum into slot `rank` of every peer's
// buffer (remote stores), then tells each peer "block b of rank r pushed its part of epoch e"
// (a release store of p2p_seq(e, k) into the peer's flags; the fused norm announces its rows one
// by one, k = 1, 2, ...), waits until every peer said the same to it (acquire loads of its own
// flags), and sums the slots in rank order, reading its own partial where it is. Every rank adds
// the same values in the same order, so all ranks get the same bits.
//
// The epoch numbers the group's reductions; every rank's host counts them the same way
// (P2pGroup in src/devices/cuda/p2p.rs). A reduction's epoch is state[0] + ek: state[0] is a
// base the host writes into the stream before a recorded step is replayed (no kernel writes
// it, so kernels read it before their wait), ek the offset the launch passes. No kernel keeps
// books at its end. A reduction uses the buffers of parity epoch & 1, so a rank that runs
// ahead into the next reduction writes the other parity; it cannot run two ahead, since the
// next reduction waits for this one's flags.
// A wait that exceeds the group's timeout sets the host-visible error word and stops waiting
// (then and in every later reduction); the host turns it into an error after the step. Waits
// spin on device memory only: the host-mapped word is written once, never polled.

#define P2P_MAX_RANKS 8
#define P2P_MAX_BLOCKS 1024
// Values of one low-latency slot: each is pushed as 8 bytes, the value's bits and the epoch.
#define P2P_LL_ELEMS 16384
// Most blocks of a low-latency norm (one scratch word each, after the low-latency slots).
#define P2P_LL_BLOCKS 1024
// Values of one half low-latency slot: f16 / bf16 values pushed two to 8 bytes with the epoch.
#define P2P_LLH_ELEMS 262144

struct P2pCtx {
    unsigned long long bufs[P2P_MAX_RANKS];   // every rank's buffer, as this rank addresses it
    unsigned long long flags[P2P_MAX_RANKS];  // every rank's flags [P2P_MAX_RANKS][P2P_MAX_BLOCKS]
    unsigned long long slot_bytes;            // bytes of one slot
    unsigned long long timeout_ns;
    unsigned long long err;                   // host-mapped word: nonzero once a wait timed out
    unsigned long long state;                 // this rank's [epoch base, unused, broken]
    int world, rank;
    unsigned long long ll[P2P_MAX_RANKS];     // every rank's low-latency slots (see below)
};

__device__ __forceinline__ void p2p_store_release(unsigned* p, unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    __threadfence_system();
    *(volatile unsigned*)p = v;
#endif
}

__device__ __forceinline__ unsigned p2p_load_acquire(const unsigned* p) {
    unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(const volatile unsigned*)p;
    __threadfence_system();
#endif
    return v;
}

__device__ __forceinline__ unsigned long long p2p_clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The epoch of the reduction launched with offset ek (the base is never written by a kernel,
// so this may run before pdl_wait).
__device__ __forceinline__ unsigned p2p_epoch(const P2pCtx* c, int ek) {
    return ((volatile unsigned*)c->state)[0] + (unsigned)ek;
}

// Slot `src` of parity `e & 1` in rank `owner`'s buffer.
__device__ __forceinline__ char* p2p_slot(const P2pCtx* c, int owner, int src, unsigned e) {
    return (char*)c->bufs[owner] + ((unsigned long long)((e & 1) * c->world + src)) * c->slot_bytes;
}

// A block's flag words count its announcements: the value for announcement k (1, 2, ...) of
// epoch e (16 bits each; waits compare differences, so wrapping is harmless).
__device__ __forceinline__ unsigned p2p_seq(unsigned e, unsigned k) {
    return (e << 16) + k;
}

// Announces to every peer that this block's pushes so far arrived (`seq`, see p2p_seq). Called
// by every thread of the block: the barrier orders the block's pushes before the release store.
__device__ void p2p_signal(const P2pCtx* c, unsigned seq) {
    __syncthreads();
    int t = threadIdx.x;
    if (t < c->world && t != c->rank) {
        unsigned* theirs = (unsigned*)c->flags[t] + c->rank * P2P_MAX_BLOCKS + blockIdx.x;
        p2p_store_release(theirs, seq);
    }
}

// Waits until every peer's block announced `seq` (or later) to this block. Called by every
// thread of the block. A wait past the timeout marks the group broken on this rank (state[2],
// which later waits check instead of waiting) and sets the host's error word to 1 + the rank
// that did not come.
__device__ void p2p_wait(const P2pCtx* c, unsigned seq) {
    int t = threadIdx.x;
    if (t < c->world && t != c->rank) {
        const unsigned* mine = (const unsigned*)c->flags[c->rank] + t * P2P_MAX_BLOCKS + blockIdx.x;
        volatile unsigned* broken = (volatile unsigned*)c->state + 2;
        unsigned long long t0 = p2p_clock_ns();
        unsigned n = 0;
        while (*broken == 0 && (int)(p2p_load_acquire(mine) - seq) < 0) {
            if ((++n & 255) == 0 && p2p_clock_ns() - t0 > c->timeout_ns) {
                *broken = 1;
                atomicCAS((unsigned*)c->err, 0u, (unsigned)(t + 1));
                __threadfence_system();
            }
        }
    }
    __syncthreads();
}

// Announces this block's pushes to every peer and waits until every peer's block announced its
// own (see the file's comment).
__device__ void p2p_barrier(const P2pCtx* c, unsigned e) {
    p2p_signal(c, p2p_seq(e, 1));
    p2p_wait(c, p2p_seq(e, 1));
}

// Elements [lo, hi) of block blockIdx.x when n elements are split over the grid.
__device__ __forceinline__ void p2p_range(long n, long* lo, long* hi) {
    long per = (n + gridDim.x - 1) / gridDim.x;
    *lo = min(n, (long)blockIdx.x * per);
    *hi = min(n, *lo + per);
}

__device__ __forceinline__ float p2p_get(const void* p, long i, int dt) {
    if (dt == 0) return ((const float*)p)[i];
    unsigned short h = ((const unsigned short*)p)[i];
    return dt == 1 ? h2f(h) : bf2f(h);
}

__device__ __forceinline__ float p2p_get_cg(const void* p, long i, int dt) {
    if (dt == 0) return __ldcg((const float*)p + i);
    unsigned short h = __ldcg((const unsigned short*)p + i);
    return dt == 1 ? h2f(h) : bf2f(h);
}

// A sum rounded to dtype dt (0 f32, 1 f16, 2 bf16) and back: the value a reduction in that
// dtype leaves.
__device__ __forceinline__ float p2p_round(float v, int dt) {
    if (dt == 1) return h2f(f2h(v));
    if (dt == 2) return bf2f(f2bf(v));
    return v;
}

// Copies `bytes` bytes from src to dst with the block's threads (16-byte moves where both ends
// allow).
__device__ void p2p_copy(char* dst, const char* src, long bytes) {
    if ((((unsigned long long)src | (unsigned long long)dst | bytes) & 15) == 0) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (long i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
    } else {
        for (long i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    }
}

// Pushes `bytes` bytes at byte offset `off` of this rank's partial `src` into slot `rank` of
// every peer.
__device__ void p2p_push(const P2pCtx* c, unsigned e, const char* src, long off, long bytes) {
    for (int p = 0; p < c->world; p++) {
        if (p != c->rank) p2p_copy(p2p_slot(c, p, c->rank, e) + off, src + off, bytes);
    }
}

// The rank-ordered sum of element i over the ranks (this rank's own partial at `mine`),
// rounded to dt.
__device__ __forceinline__ float p2p_sum(const P2pCtx* c, unsigned e, const void* mine, long i, int dt) {
    float s = 0.0f;
    for (int p = 0; p < c->world; p++) {
        float v = p == c->rank ? p2p_get(mine, i, dt) : p2p_get_cg(p2p_slot(c, c->rank, p, e), i, dt);
        s = p == 0 ? v : s + v;
    }
    return p2p_round(s, dt);
}

// n elements of dtype dt at x summed over the ranks: in place (add = 0), or added into the f32
// rows at out (add = 1; out[i] += sum, as AddTo would add an all-reduced x). n elements of dt
// fit one slot.
extern "C" __global__ void p2p_allreduce(const P2pCtx* c, void* x, float* out, long n, int dt, int add,
                                         int ek) {
    unsigned e = p2p_epoch(c, ek);
    pdl_wait();
    long lo, hi;
    p2p_range(n, &lo, &hi);
    int es = dt == 0 ? 4 : 2;
    if (hi > lo) p2p_push(c, e, (const char*)x, lo * es, (hi - lo) * es);
    p2p_barrier(c, e);
    for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float s = p2p_sum(c, e, x, i, dt);
        if (add) {
            out[i] += 1.0f * s;
        } else if (dt == 0) {
            ((float*)x)[i] = s;
        } else {
            ((unsigned short*)x)[i] = dt == 1 ? f2h(s) : f2bf(s);
        }
    }
}

// Values 4i..4i+3 of dtype bdt at p (as load4_of), read past this SM's L1: peers wrote them.
__device__ __forceinline__ float4 load4_cg(const void* p, long i, int bdt) {
    if (bdt == 0) return __ldcg((const float4*)p + i);
    return float4_of_half4(__ldcg((const uint2*)p + i), bdt);
}

// Values 4i4..4i4+3 of the partial rows summed over the ranks in rank order and rounded to
// bdt (the arithmetic of p2p_sum): this rank's own `mine`, peer p's as `peer(p)` gives them.
template <class Peer>
__device__ __forceinline__ float4 p2p_rank_sum4(const P2pCtx* c, float4 mine, int bdt, Peer peer) {
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int p = 0; p < c->world; p++) {
        float4 v = p == c->rank ? mine : peer(p);
        s = p == 0 ? v : make_float4(s.x + v.x, s.y + v.y, s.z + v.z, s.w + v.w);
    }
    return make_float4(p2p_round(s.x, bdt), p2p_round(s.y, bdt), p2p_round(s.z, bdt), p2p_round(s.w, bdt));
}

// ---- low latency: the epoch travels with every value ----
// For a few rows (decode), each value is pushed as (its f32 bits, epoch) in one 8-byte half of a
// 16-byte store, and the reader spins on those words until both halves carry this epoch: no
// flags, fences or barrier, one trip over the link. The epoch and parity rules are those above
// (a stale word carries an older epoch).

__device__ __forceinline__ unsigned long long* p2p_ll_slot(const P2pCtx* c, int owner, int src, unsigned e) {
    return (unsigned long long*)c->ll[owner] + ((unsigned long long)((e & 1) * c->world + src)) * P2P_LL_ELEMS;
}

__device__ __forceinline__ void p2p_ll_store(unsigned long long* p, float a, float b, unsigned e) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(__float_as_uint(a)), "r"(e),
                 "r"(__float_as_uint(b)), "r"(e)
                 : "memory");
}

// Spins on the 16-byte word p until both its epoch halves carry e and leaves its value halves in
// *va, *vb; false once the group broke (or this wait timed out: it marks the group broken and
// names rank src() in the host's error word).
template <class Src>
__device__ __forceinline__ bool p2p_ll_word(const P2pCtx* c, const void* p, unsigned e, Src src, unsigned* va,
                                            unsigned* vb) {
    unsigned a, ea, b, eb;
    volatile unsigned* broken = (volatile unsigned*)c->state + 2;
    unsigned long long t0 = 0;
    unsigned n = 0;
    while (true) {
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(a), "=r"(ea), "=r"(b), "=r"(eb)
                     : "l"(p)
                     : "memory");
        if (ea == e && eb == e) break;
        if ((++n & 255) == 0) {
            if (*broken) return false;
            if (t0 == 0) {
                t0 = p2p_clock_ns();
            } else if (p2p_clock_ns() - t0 > c->timeout_ns) {
                *broken = 1;
                atomicCAS((unsigned*)c->err, 0u, (unsigned)(src() + 1));
                __threadfence_system();
            }
        }
    }
    *va = a;
    *vb = b;
    return true;
}

// Values 2j, 2j+1 of slot p once they carry epoch e (or the group broke: zeros).
__device__ __forceinline__ float2 p2p_ll_load(const P2pCtx* c, const unsigned long long* p, unsigned e) {
    unsigned a, b;
    auto src = [&] { return (int)((p - (const unsigned long long*)c->ll[c->rank]) / P2P_LL_ELEMS) % c->world; };
    if (!p2p_ll_word(c, p, e, src, &a, &b)) return make_float2(0.0f, 0.0f);
    return make_float2(__uint_as_float(a), __uint_as_float(b));
}

// Values 4j..4j+3 of slot p (two 16-byte words, both loads in flight) once all four carry
// epoch e; a word that does not yet is waited for as p2p_ll_load does.
__device__ __forceinline__ float4 p2p_ll_load4(const P2pCtx* c, const unsigned long long* p, unsigned e) {
    unsigned a, ea, b, eb, x, ex, y, ey;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%8];\n\t"
                 "ld.volatile.global.v4.u32 {%4, %5, %6, %7}, [%9];"
                 : "=r"(a), "=r"(ea), "=r"(b), "=r"(eb), "=r"(x), "=r"(ex), "=r"(y), "=r"(ey)
                 : "l"(p), "l"(p + 2)
                 : "memory");
    if (ea == e && eb == e && ex == e && ey == e)
        return make_float4(__uint_as_float(a), __uint_as_float(b), __uint_as_float(x), __uint_as_float(y));
    float2 lo = p2p_ll_load(c, p, e), hi = p2p_ll_load(c, p + 2, e);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// ---- half low latency: f16 / bf16 partials, two values and the epoch in 8 bytes ----
// Rows of half partials too many for the low-latency slots (batched decode) travel as 16-byte
// words (bits of values 4i..4i+1, epoch, bits of 4i+2..4i+3, epoch), one store a float4 of values:
// the link carries twice the partial's bytes, and the reader needs no flag, fence or barrier.
// The half slots follow the low-latency slots and their scratch words.

__device__ __forceinline__ uint4* p2p_llh_slot(const P2pCtx* c, int owner, int src, unsigned e) {
    unsigned long long* after = (unsigned long long*)c->ll[owner] + 2ull * c->world * P2P_LL_ELEMS + P2P_LL_BLOCKS;
    return (uint4*)after + ((unsigned long long)((e & 1) * c->world + src)) * (P2P_LLH_ELEMS / 4);
}

// The 4 half values of word p (bits, dtype bdt) once both halves carry epoch e (or the group
// broke, or the wait timed out naming rank src: zeros).
__device__ __forceinline__ float4 p2p_llh_load4(const P2pCtx* c, const uint4* p, unsigned e, int bdt, int src) {
    unsigned a, b;
    if (!p2p_ll_word(c, p, e, [&] { return src; }, &a, &b)) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return float4_of_half4(make_uint2(a, b), bdt);
}

// The residual of the low-latency norms: this rank's partial rows (dtype bdt) summed over the
// ranks, the peers' values read as they arrive from the low-latency slots (HALF 0) or the half
// slots (HALF 1).
template <int HALF>
struct LlResid {
    static constexpr bool on = true;
    const P2pCtx* c;
    const void* r;
    int bdt;
    unsigned e;
    __device__ __forceinline__ float4 operator()(long i4) const {
        return p2p_rank_sum4(c, load4_of(r, i4, bdt), bdt, [&](int p) {
            return HALF ? p2p_llh_load4(c, p2p_llh_slot(c, c->rank, p, e) + i4, e, bdt, p)
                        : p2p_ll_load4(c, p2p_ll_slot(c, c->rank, p, e) + i4 * 4, e);
        });
    }
};

// ---- low-latency norms: rows split over blocks ----
// A row is split over `parts` blocks (block b: row b / parts, float4s [i0, i1) of it, where
// i0 = (b % parts) * per and per is a multiple of 8 float4s, so Q8_0 blocks stay whole). The
// blocks of a row exchange their partial sums of squares through this rank's scratch words
// after its low-latency slots: one (f32 bits, epoch) word per block, read in part order, so
// every rank gets the same bits. A split row sums its squares in another order than
// rmsnorm_v4_t; one part keeps its arithmetic (with its threads).

__device__ __forceinline__ unsigned long long* p2p_scratch(const P2pCtx* c) {
    return (unsigned long long*)c->ll[c->rank] + 2ull * c->world * P2P_LL_ELEMS;
}

// The sum, in part order, of the partial sums of squares the `parts` blocks of row `row` stored
// (spinning until each carries epoch e); `s` is this block's own. Every thread gets the result.
__device__ float p2p_row_sumsq(const P2pCtx* c, unsigned e, long row, int parts, float s) {
    __shared__ float total;
    unsigned long long* sc = p2p_scratch(c) + row * parts;
    if (threadIdx.x == 0) {
        unsigned long long word = ((unsigned long long)e << 32) | __float_as_uint(s);
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(sc + blockIdx.x % parts), "l"(word) : "memory");
    }
    if (threadIdx.x < 32) {
        volatile unsigned* broken = (volatile unsigned*)c->state + 2;
        float a = 0.0f;
        for (int p = threadIdx.x; p < parts; p += 32) {
            unsigned long long word;
            do {
                asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(word) : "l"(sc + p) : "memory");
            } while ((unsigned)(word >> 32) != e && *broken == 0);
            a += __uint_as_float((unsigned)word);
        }
        a = warp_sum(a);
        if (threadIdx.x == 0) total = a;
    }
    __syncthreads();
    return total;
}

// This block's float4 range [*i0, *i1) of its row (see above).
__device__ __forceinline__ long p2p_part(int d, int parts, int* i0, int* i1) {
    int n4 = d >> 2, per = (((n4 + parts - 1) / parts) + 7) & ~7;
    *i0 = (blockIdx.x % parts) * per;
    *i1 = min(n4, *i0 + per);
    return blockIdx.x / parts;
}

// The norm weights of the float4s [i0, i1) this thread takes (loaded before waiting: no kernel
// writes them).
__device__ __forceinline__ void p2p_part_weights(const float* w, int i0, int i1, float4 g[RMS_V4]) {
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = i0 + threadIdx.x + t * blockDim.x;
        g[t] = i < i1 ? ((const float4*)w)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// x += res over this block's float4s [i0, i1) of `row`, then their part of y = RMSNorm(x) (and
// the copies of rmsnorm_v4_t) with the row's sum of squares.
template <int COPY, class Resid>
__device__ void p2p_norm_part(long row, int i0, int i1, int parts, const float4 g[RMS_V4], float* x, float* y,
                              int d, float eps, signed char* qs, float2* ds, uint2* hs, int bf,
                              const P2pCtx* c, unsigned e, Resid res) {
    int n4 = d >> 2;
    float4* xr = (float4*)(x + row * d);
    float4 v[RMS_V4];
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = i0 + threadIdx.x + t * blockDim.x;
        v[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < i1) {
            // the residual row first: its load need not wait for the peers' values
            float4 h = xr[i];
            float4 a = res(row * n4 + i);
            v[t] = make_float4(h.x + 1.0f * a.x, h.y + 1.0f * a.y, h.z + 1.0f * a.z, h.w + 1.0f * a.w);
            xr[i] = v[t];
        }
        s += sq4(v[t]);
    }
    s = block_sum(s);
    if (parts > 1) s = p2p_row_sumsq(c, e, row, parts, s);
    rms_store_v4<COPY>(row, i0, i1, v, g, rsqrtf(s / (float)d + eps), y, d, qs, ds, hs, bf);
}

// Row `row`'s float4s of this thread (as rmsnorm_v4_t takes them): x into h and, where mine is
// given, this rank's partial r (dtype bdt) into it.
__device__ __forceinline__ void p2p_row_load(long row, const float* x, const void* r, int bdt, int n4,
                                             float4 h[RMS_V4], float4* mine) {
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = threadIdx.x + t * blockDim.x;
        h[t] = i < n4 ? ((const float4*)x)[row * n4 + i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (mine) mine[t] = i < n4 ? load4_of(r, row * n4 + i, bdt) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Row `row` of the slot kernel: x += the rank-ordered sum of the partial rows (this rank's
// float4 t, at flat index i4, from own(t, i4), the peers' from this rank's slots), then its part
// of y = RMSNorm(x) (and the copies of rmsnorm_v4_t) with the weights weights(g) fills in; h
// holds the row of x.
template <int COPY, class Own, class Weights>
__device__ void p2p_slot_row(long row, const float4 h[RMS_V4], Own own, Weights weights, float* x, float* y,
                             int d, float eps, signed char* qs, float2* ds, uint2* hs, int bf, const P2pCtx* c,
                             unsigned e, int bdt) {
    int n4 = d >> 2;
    float4* xr = (float4*)(x + row * d);
    float4 v[RMS_V4];
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = threadIdx.x + t * blockDim.x;
        v[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n4) {
            long i4 = row * n4 + i;
            float4 a = p2p_rank_sum4(c, own(t, i4), bdt,
                                     [&](int p) { return load4_cg(p2p_slot(c, c->rank, p, e), i4, bdt); });
            v[t] = make_float4(h[t].x + 1.0f * a.x, h[t].y + 1.0f * a.y, h[t].z + 1.0f * a.z, h[t].w + 1.0f * a.w);
            xr[i] = v[t];
        }
        s += sq4(v[t]);
    }
    s = block_sum(s);
    float4 g[RMS_V4];
    weights(g);
    rms_store_v4<COPY>(row, 0, n4, v, g, rsqrtf(s / (float)d + eps), y, d, qs, ds, hs, bf);
}

// x += the all-reduced partial rows r, then y = RMSNorm(x) (and the copies of rmsnorm_v4_t),
// over `rows` rows of d, the grid looping over rows: the all-reduce, the residual add and the
// next norm in one launch, with the bits of p2p_allreduce (add = 1) followed by RMSNorm.
// Pipelined by rows: a block pushes its next row to the peers before it waits for the peers'
// copy of its current row and normalizes it, and announces each row once it has arrived
// (p2p_seq counts them), so the transfers overlap the norms. A row's x loads before the wait
// for the peers' copy. With ROWS 0 (at most a row per block) the norm weights load before the
// wait for the product and a row's own partial with its x; with ROWS 1 (blocks looping over
// rows) both load after the wait, which leaves a thread 60 registers instead of 96, so four
// 256-thread blocks fit a multiprocessor rather than two.
template <int COPY, int ROWS>
__device__ void p2p_addrmsnorm_t(float* x, const float* w, float* y, int d, float eps, const void* r,
                                 int bdt, signed char* qs, float2* ds, uint2* hs, int bf, int,
                                 const P2pCtx* c, int rows, int ek) {
    unsigned e = p2p_epoch(c, ek);
    int n4 = d >> 2;
    float4 g[RMS_V4], h[RMS_V4], mine[RMS_V4];
    if (!ROWS) p2p_part_weights(w, 0, n4, g);
    pdl_wait();
    long rb = (long)d * (bdt == 0 ? 4 : 2);
    long row = blockIdx.x;
    if (row < rows) p2p_push(c, e, (const char*)r, row * rb, rb);
    p2p_signal(c, p2p_seq(e, 1));
    pdl_launch();
    for (unsigned k = 1; row < rows; row += gridDim.x, k++) {
        long next = row + gridDim.x;
        if (next < rows) p2p_push(c, e, (const char*)r, next * rb, rb);
        p2p_row_load(row, x, r, bdt, n4, h, ROWS ? nullptr : mine);
        p2p_wait(c, p2p_seq(e, k));
        if (ROWS) {
            p2p_slot_row<COPY>(
                row, h, [&](int, long i4) { return load4_of(r, i4, bdt); },
                [&](float4* gw) { p2p_part_weights(w, 0, n4, gw); }, x, y, d, eps, qs, ds, hs, bf, c, e, bdt);
        } else {
            p2p_slot_row<COPY>(
                row, h, [&](int t, long) { return mine[t]; },
                [&](float4* gw) {
#pragma unroll
                    for (int t = 0; t < RMS_V4; t++) gw[t] = g[t];
                },
                x, y, d, eps, qs, ds, hs, bf, c, e, bdt);
        }
        if (next < rows) p2p_signal(c, p2p_seq(e, k + 1));
        __syncthreads();
    }
}

// ---- row-split norms: each rank adds and normalizes its share of the rows ----
// Rank q owns rows [q·per, (q+1)·per) of a fused norm (per = ceil(rows / world)), and block b
// takes the shares j = b, b + grid, ... of every rank's range. For share j it pushes this rank's
// partial of row q·per + j into peer q's slot (region A, j·rb), waits for the peers' partials
// of its own row, adds them in rank order and the residual (the arithmetic of p2p_slot_row),
// normalizes, stores the half copy hs and pushes it into every peer's slot (region B); then it
// copies the peers' normed rows of its shares out of its slots into hs. So each rank reads and
// writes half the residual rows and sends as many bytes as the whole-row kernels.
// x keeps this rank's rows only (the others go stale) and y is not written: the fuse pass lets
// only a chain of these norms read x and only the next tensor-core Linear read the half copy
// (see row_split_norms in src/devices/cuda/fuse.rs). With GATHER the norm also pushes its x rows
// (region C) and copies the peers' into x, which is then whole again (a chain's last norm).
// Announcement k + 1 of a block covers its partials of its share k + 1 and its normed row of
// share k, so phase B waits for the announcements phase A already sent.
template <int GATHER>
__device__ void p2p_split_norm_t(float* x, const float* w, int d, float eps, const void* r, int bdt, uint2* hs,
                                 int bf, const P2pCtx* c, int rows, int ek) {
    unsigned e = p2p_epoch(c, ek);
    int n4 = d >> 2;
    long per = (rows + c->world - 1) / c->world;
    long rb = (long)d * (bdt == 0 ? 4 : 2);
    long at_b = (per * rb + 255) & ~255l, at_c = at_b + ((per * d * 2 + 255) & ~255l);
    auto push_partials = [&](long j) {
        for (int q = 0; q < c->world; q++) {
            long row = q * per + j;
            if (q == c->rank || row >= rows) continue;
            p2p_copy(p2p_slot(c, q, c->rank, e) + j * rb, (const char*)r + row * rb, rb);
        }
    };
    pdl_wait();
    if (blockIdx.x < per) push_partials(blockIdx.x);
    p2p_signal(c, p2p_seq(e, 1));
    pdl_launch();
    unsigned k = 1;
    for (long j = blockIdx.x; j < per; j += gridDim.x, k++) {
        if (j + gridDim.x < per) push_partials(j + gridDim.x);
        long row = c->rank * per + j;
        p2p_wait(c, p2p_seq(e, k));
        if (row < rows) {
            float4* xr = (float4*)(x + row * d);
            float4 v[RMS_V4];
            p2p_row_load(row, x, r, bdt, n4, v, nullptr);
            float s = 0.0f;
#pragma unroll
            for (int t = 0; t < RMS_V4; t++) {
                int i = threadIdx.x + t * blockDim.x;
                if (i < n4) {
                    float4 a = p2p_rank_sum4(c, load4_of(r, row * n4 + i, bdt), bdt, [&](int p) {
                        return load4_cg(p2p_slot(c, c->rank, p, e) + j * rb, i, bdt);
                    });
                    float4 h = v[t];
                    v[t] = make_float4(h.x + 1.0f * a.x, h.y + 1.0f * a.y, h.z + 1.0f * a.z, h.w + 1.0f * a.w);
                    xr[i] = v[t];
                }
                s += sq4(v[t]);
            }
            s = block_sum(s);
            float inv = rsqrtf(s / (float)d + eps);
#pragma unroll
            for (int t = 0; t < RMS_V4; t++) {
                int i = threadIdx.x + t * blockDim.x;
                if (i >= n4) continue;
                float4 g = ((const float4*)w)[i];
                float4 o = make_float4(v[t].x * inv * g.x, v[t].y * inv * g.y, v[t].z * inv * g.z, v[t].w * inv * g.w);
                uint2 q = half4_of(o, bf);
                hs[row * n4 + i] = q;
                for (int p = 0; p < c->world; p++) {
                    if (p == c->rank) continue;
                    char* slot = p2p_slot(c, p, c->rank, e);
                    ((uint2*)(slot + at_b))[j * n4 + i] = q;
                    if (GATHER) ((float4*)(slot + at_c))[j * n4 + i] = v[t];
                }
            }
        }
        p2p_signal(c, p2p_seq(e, k + 1));
    }
    k = 1;
    for (long j = blockIdx.x; j < per; j += gridDim.x, k++) {
        p2p_wait(c, p2p_seq(e, k + 1));
        for (int p = 0; p < c->world; p++) {
            long row = p * per + j;
            if (p == c->rank || row >= rows) continue;
            const char* slot = p2p_slot(c, c->rank, p, e);
            const uint2* qs = (const uint2*)(slot + at_b) + j * n4;
            const float4* xs = (const float4*)(slot + at_c) + j * n4;
            for (int i = threadIdx.x; i < n4; i += blockDim.x) {
                hs[row * n4 + i] = __ldcg(qs + i);
                if (GATHER) ((float4*)x)[row * n4 + i] = __ldcg(xs + i);
            }
        }
    }
}

// The row-split norms' entry points: the slot kernels' arguments for the half copy without
// `pushed`, the rows as N; y is not written. The gather form makes the residual whole again.
extern "C" __global__ void p2p_split_addrmsnorm_v4h_f32(float* x, const float* w, float*, int d, float eps,
                                                        const void* r, int bdt, uint2* hs, int bf,
                                                        const P2pCtx* c, int rows, int ek) {
    p2p_split_norm_t<0>(x, w, d, eps, r, bdt, hs, bf, c, rows, ek);
}

extern "C" __global__ void p2p_split_gather_addrmsnorm_v4h_f32(float* x, const float* w, float*, int d,
                                                               float eps, const void* r, int bdt, uint2* hs,
                                                               int bf, const P2pCtx* c, int rows, int ek) {
    p2p_split_norm_t<1>(x, w, d, eps, r, bdt, hs, bf, c, rows, ek);
}

// p2p_addrmsnorm_t through the low-latency slots (HALF 0: rows * d <= P2P_LL_ELEMS) or the half
// slots (HALF 1: f16 / bf16 partials, rows * d <= P2P_LLH_ELEMS), rows * parts blocks: each block
// pushes its values with their epoch (unless `pushed`: the kernel that wrote r pushed them into
// the low-latency slots as it wrote them, see p2p_ll_push), adds the peers' as they arrive, and
// normalizes its part of the row.
template <int COPY, int HALF>
__device__ void p2p_ll_norm_t(float* x, const float* w, float* y, int d, float eps, const void* r, int bdt,
                              signed char* qs, float2* ds, uint2* hs, int bf, int pushed, const P2pCtx* c, int parts,
                              int ek) {
    int i0, i1;
    long row = p2p_part(d, parts, &i0, &i1);
    int n4 = d >> 2;
    float4 g[RMS_V4];
    p2p_part_weights(w, i0, i1, g);
    unsigned e = p2p_epoch(c, ek);
    pdl_launch();
    pdl_wait();
#pragma unroll
    for (int t = 0; t < RMS_V4; t++) {
        int i = i0 + threadIdx.x + t * blockDim.x;
        if ((!HALF && pushed) || i >= i1) continue;
        if (HALF) {
            uint2 v = ((const uint2*)r)[row * n4 + i];
            for (int p = 0; p < c->world; p++) {
                if (p == c->rank) continue;
                uint4* dst = p2p_llh_slot(c, p, c->rank, e) + row * n4 + i;
                asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(e),
                             "r"(v.y), "r"(e)
                             : "memory");
            }
        } else {
            float4 v = load4_of(r, row * n4 + i, bdt);
            for (int p = 0; p < c->world; p++) {
                if (p == c->rank) continue;
                unsigned long long* dst = p2p_ll_slot(c, p, c->rank, e) + (row * n4 + i) * 4;
                p2p_ll_store(dst, v.x, v.y, e);
                p2p_ll_store(dst + 2, v.z, v.w, e);
            }
        }
    }
    p2p_norm_part<COPY>(row, i0, i1, parts, g, x, y, d, eps, qs, ds, hs, bf, c, e, LlResid<HALF>{c, r, bdt, e});
}

// The fused norms' entry points: rmsnorm_v4*'s arguments, the residual r and its dtype,
// `pushed` (the low-latency kernels: r's values are already in the peers' slots; 0 for the slot
// kernels), the group's context, N (the rows for the slot kernels, the blocks per row for the
// low-latency ones) and the reduction's epoch offset.
#define P2P_NORMS(name, tmpl, K)                                                                            \
    extern "C" __global__ void name##_v4_f32(float* x, const float* w, float* y, int d, float eps,        \
                                             const void* r, int bdt, int pushed, const P2pCtx* c, int N,  \
                                             int ek) {                                                     \
        tmpl<0, K>(x, w, y, d, eps, r, bdt, 0, 0, 0, 0, pushed, c, N, ek);                                   \
    }                                                                                                       \
    extern "C" __global__ void name##_v4q_f32(float* x, const float* w, float* y, int d, float eps,       \
                                              const void* r, int bdt, signed char* qs, float2* ds,         \
                                              int pushed, const P2pCtx* c, int N, int ek) {                \
        tmpl<1, K>(x, w, y, d, eps, r, bdt, qs, ds, 0, 0, pushed, c, N, ek);                                 \
    }                                                                                                       \
    extern "C" __global__ void name##_v4h_f32(float* x, const float* w, float* y, int d, float eps,       \
                                              const void* r, int bdt, uint2* hs, int bf, int pushed,       \
                                              const P2pCtx* c, int N, int ek) {                            \
        tmpl<2, K>(x, w, y, d, eps, r, bdt, 0, 0, hs, bf, pushed, c, N, ek);                                 \
    }
P2P_NORMS(p2p_addrmsnorm, p2p_addrmsnorm_t, 0)
P2P_NORMS(p2p_addrmsnorm_rows, p2p_addrmsnorm_t, 1)
P2P_NORMS(p2p_ll_addrmsnorm, p2p_ll_norm_t, 0)
P2P_NORMS(p2p_llh_addrmsnorm, p2p_ll_norm_t, 1)

// For a kernel that writes the partial of a low-latency norm (a one-row product): value v at
// flat index i of this rank's partial, pushed into every peer's low-latency slot with the
// epoch of the next reduction (that norm's: offset ek), as the norm's own push would (one
// 8-byte word per value; the norm's reader waits for both of a pair).
__device__ __forceinline__ void p2p_ll_push(const P2pCtx* c, int ek, long i, float v) {
    unsigned e = p2p_epoch(c, ek);
    unsigned long long word = ((unsigned long long)e << 32) | __float_as_uint(v);
    for (int p = 0; p < c->world; p++) {
        if (p == c->rank) continue;
        unsigned long long* dst = p2p_ll_slot(c, p, c->rank, e) + i;
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dst), "l"(word) : "memory");
    }
}
