// Embedding: y[i, :] = weight[ids[i], :] decoded to f32. Ids are validated on the host first
// (or, for ids already on the GPU, by the caller); an id outside 0..vocab is clamped so it can
// never read outside the weight. One block per token.

template <int DT>
__device__ void embedding_t(const int* ids, const unsigned char* w, float* y, int d, long row_bytes, int vocab) {
    pdl_begin();
    int id = ids[blockIdx.x];
    id = id < 0 ? 0 : (id >= vocab ? vocab - 1 : id);
    const unsigned char* row = w + (long)id * row_bytes;
    float* yr = y + (long)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = load_w<DT>(row, i);
}

#define EMB(name, DT) \
    extern "C" __global__ void embedding_##name(const int* ids, const unsigned char* w, float* y, int d, long rb, \
                                                int vocab) { \
        embedding_t<DT>(ids, w, y, d, rb, vocab); \
    }
EMB(f32, DT_F32)
EMB(f16, DT_F16)
EMB(bf16, DT_BF16)
EMB(q8_0, DT_Q8_0)
EMB(q4_0, DT_Q4_0)
EMB(q4_1, DT_Q4_1)
EMB(q5_0, DT_Q5_0)
EMB(q4_k, DT_Q4_K)
EMB(q5_k, DT_Q5_K)
EMB(q6_k, DT_Q6_K)
EMB(q2_k, DT_Q2_K)
EMB(q3_k, DT_Q3_K)
