// cuBLAS on the products of a 64-sequence llama-3-8b decode step (f16 weights, 64 f16 rows,
// f32 or f16 outputs), one GPU at TP=1 and one rank's shard at TP=2: microseconds per product
// of cublasGemmEx's default choice and of the fastest algorithm cublasLt's heuristic offers
// (each timed as 100 calls in a CUDA graph, over enough weight copies that none stays in L2),
// and the weight bytes per second of the faster; then q, k and v as three products against one
// product over the three weights concatenated.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 scripts/cublas-decode-shapes.cu -lcublasLt -lcublas -o /tmp/shapes && /tmp/shapes
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                              \
    do {                                                                   \
        int e_ = (int)(x);                                                 \
        if (e_ != 0) {                                                     \
            printf("error %d at %s:%d\n", e_, __FILE__, __LINE__);         \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

const int M = 64;
const size_t POOL = 512ull << 20;  // bytes of weight copies a timing cycles through

// Microseconds per call of call(copy), 100 calls captured in a graph, best of 5 replays.
static float timed(cudaStream_t s, const std::function<void(int)>& call, int copies) {
    for (int i = 0; i < 10; i++) call(i % copies);
    CK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 100; i++) call(i % copies);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    CK(cudaGraphLaunch(ge, s));
    float best = 1e9f;
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(a, s);
        CK(cudaGraphLaunch(ge, s));
        cudaEventRecord(b, s);
        CK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        best = std::min(best, ms * 10.0f);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return best;
}

struct Ctx {
    cudaStream_t s;
    cublasHandle_t h;
    cublasLtHandle_t lt;
    void* ws;
    size_t ws_bytes;
    char* w;  // POOL bytes of weights
    void* x;  // M rows of f16 input
    void* y;  // M rows of outputs
};

// y = x · Wᵀ for W of n rows of k values (copy c), cublasGemmEx's default algorithm.
static void gemm(Ctx& t, const void* w, int n, int k, bool half_out, void* y) {
    float one = 1, zero = 0;
    CK(cublasGemmEx(t.h, CUBLAS_OP_T, CUBLAS_OP_N, n, M, k, &one, w, CUDA_R_16F, k, t.x, CUDA_R_16F, k, &zero, y,
                    half_out ? CUDA_R_16F : CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The fastest of cublasLt's heuristic algorithms for the shape: its time, and how many it offered.
static float lt_best(Ctx& t, int n, int k, bool half_out, int copies, int* offered) {
    cudaDataType ct = half_out ? CUDA_R_16F : CUDA_R_32F;
    cublasLtMatmulDesc_t d;
    CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &N, sizeof N);
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, k, n, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, k, M, k);
    cublasLtMatrixLayoutCreate(&lc, ct, n, M, n);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &t.ws_bytes,
                                         sizeof t.ws_bytes);
    cublasLtMatmulHeuristicResult_t res[32];
    CK(cublasLtMatmulAlgoGetHeuristic(t.lt, d, la, lb, lc, lc, pref, 32, res, offered));
    size_t wb = (size_t)n * k * 2;
    float best = 1e9f, one = 1, zero = 0;
    for (int i = 0; i < *offered; i++) {
        auto call = [&](int c) {
            cublasLtMatmul(t.lt, d, &one, t.w + c * wb, la, t.x, lb, &zero, t.y, lc, t.y, lc, &res[i].algo, t.ws,
                           t.ws_bytes, t.s);
        };
        best = std::min(best, timed(t.s, call, copies));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
    return best;
}

int main() {
    Ctx t;
    t.ws_bytes = 64 << 20;
    CK(cudaStreamCreate(&t.s));
    CK(cublasCreate(&t.h));
    CK(cublasSetStream(t.h, t.s));
    CK(cublasLtCreate(&t.lt));
    CK(cudaMalloc(&t.ws, t.ws_bytes));
    CK(cublasSetWorkspace(t.h, t.ws, t.ws_bytes));
    CK(cudaMalloc(&t.w, POOL));
    CK(cudaMemset(t.w, 0, POOL));
    CK(cudaMalloc(&t.x, M * 14336 * 2));
    CK(cudaMemset(t.x, 0, M * 14336 * 2));
    CK(cudaMalloc(&t.y, M * 14336 * 4));
    struct Shape {
        const char* name;
        int n, k;
        bool half_out;
    } shapes[] = {
        {"TP=1 q, o", 4096, 4096, false}, {"TP=1 k, v", 1024, 4096, false},  {"TP=1 gate, up", 14336, 4096, false},
        {"TP=1 down", 4096, 14336, true}, {"TP=2 q", 2048, 4096, false},      {"TP=2 k, v", 512, 4096, false},
        {"TP=2 o", 4096, 2048, true},     {"TP=2 gate, up", 7168, 4096, false}, {"TP=2 down", 4096, 7168, true},
    };
    printf("%-14s %12s %9s %9s %6s\n", "product", "n x k", "default", "Lt best", "TB/s");
    for (auto& sh : shapes) {
        size_t wb = (size_t)sh.n * sh.k * 2;
        int copies = (int)std::min<size_t>(64, std::max<size_t>(2, POOL / wb)), offered = 0;
        float td = timed(t.s, [&](int c) { gemm(t, t.w + c * wb, sh.n, sh.k, sh.half_out, t.y); }, copies);
        float tb = lt_best(t, sh.n, sh.k, sh.half_out, copies, &offered);
        printf("%-14s %6d x %5d %8.2f %8.2f %6.2f  (%d offered)\n", sh.name, sh.n, sh.k, td, tb,
               wb / std::min(td, tb) / 1e6, offered);
    }
    const int K = 4096;
    for (int tp = 1; tp <= 2; tp++) {
        int qd = 4096 / tp, kd = 1024 / tp, all = qd + 2 * kd;
        size_t wb = (size_t)all * K * 2;
        int copies = (int)std::min<size_t>(64, POOL / wb);
        char* yq = (char*)t.y;
        char *yk = yq + M * qd * 4, *yv = yk + M * kd * 4;
        auto three = [&](int c) {
            char* w = t.w + c * wb;
            gemm(t, w, qd, K, false, yq);
            gemm(t, w + (size_t)qd * K * 2, kd, K, false, yk);
            gemm(t, w + (size_t)(qd + kd) * K * 2, kd, K, false, yv);
        };
        float t3 = timed(t.s, three, copies);
        float t1 = timed(t.s, [&](int c) { gemm(t, t.w + c * wb, all, K, false, t.y); }, copies);
        printf("TP=%d q, k, v: three products %.2f us, one over the concatenated weights %.2f us\n", tp, t3, t1);
    }
    return 0;
}
