/* api_test.c — exercises the C ABI, including every error path a caller can hit: NULL
 * arguments, bad paths, too-small buffers, invalid ids, bad struct sizes, cancellation from the
 * callback, context overflow, and many threads sharing one model. Built with
 * -fsanitize=address,undefined. Usage: api_test MODEL.flm        Prints "N passed, N failed". */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fastllm.h"

static int passed = 0, failed = 0;
#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            passed++;                                                                 \
        } else {                                                                      \
            failed++;                                                                 \
            fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, fastllm_last_error());                                     \
        }                                                                             \
    } while (0)

static FastllmModel *model;

static bool count_cb(void *ud, int32_t tok, const char *piece, size_t n) {
    (void)tok;
    (void)piece;
    (void)n;
    ++*(int *)ud;
    return true;
}

static bool cancel_after_two(void *ud, int32_t tok, const char *piece, size_t n) {
    (void)tok;
    (void)piece;
    (void)n;
    return ++*(int *)ud < 2;
}

static void test_status_and_version(void) {
    CHECK(strlen(fastllm_version()) > 0);
    CHECK(strcmp(fastllm_status_string(FASTLLM_OK), "ok") == 0);
    CHECK(strcmp(fastllm_status_string(-5), "unknown status") == 0);
    CHECK(strcmp(fastllm_status_string(1000), "unknown status") == 0);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", FASTLLM_VERSION_MAJOR, FASTLLM_VERSION_MINOR, FASTLLM_VERSION_PATCH);
    CHECK(strcmp(v, fastllm_version()) == 0);
}

static void test_load_errors(void) {
    FastllmModel *m = (FastllmModel *)0x1;
    CHECK(fastllm_model_load("/nonexistent/model.flm", NULL, &m) == FASTLLM_ERR_IO);
    CHECK(m == (FastllmModel *)0x1); /* untouched on failure */
    CHECK(strstr(fastllm_last_error(), "/nonexistent/model.flm") != NULL);
    CHECK(fastllm_model_load("x", NULL, NULL) == FASTLLM_ERR_NULL_ARGUMENT);
    FastllmModelParams p = fastllm_model_params_default();
    p.struct_size = 3;
    CHECK(fastllm_model_load("x", &p, &m) == FASTLLM_ERR_INVALID_ARGUMENT);
    p = fastllm_model_params_default();
    p.precision = 7;
    CHECK(fastllm_model_load("x", &p, &m) == FASTLLM_ERR_INVALID_ARGUMENT);
    /* run-time switches out of range name their field */
    p = fastllm_model_params_default();
    p.cuda_graphs = 5;
    CHECK(fastllm_model_load("x", &p, &m) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fastllm_last_error(), "cuda_graphs") != NULL);
    p = fastllm_model_params_default();
    p.fused_ops = -2;
    CHECK(fastllm_model_load("x", &p, &m) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fastllm_last_error(), "fused_ops") != NULL);
    p = fastllm_model_params_default();
    p.batch_invariant = 3;
    CHECK(fastllm_model_load("x", &p, &m) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fastllm_last_error(), "batch_invariant") != NULL);
    p = fastllm_model_params_default();
    p.gpu_memory_cap_mb = -3;
    CHECK(fastllm_model_load("x", &p, &m) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fastllm_last_error(), "gpu_memory_cap_mb") != NULL);
    p = fastllm_model_params_default();
    p.simd = 3;
    CHECK(fastllm_model_load("x", &p, &m) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fastllm_last_error(), "simd") != NULL);
    /* a file that is not a model */
    FILE *f = fopen("/tmp/fastllm_api_test_garbage.flm", "wb");
    fputs("this is not a model file at all, just text", f);
    fclose(f);
    FastllmStatus st = fastllm_model_load("/tmp/fastllm_api_test_garbage.flm", NULL, &m);
    CHECK(st == FASTLLM_ERR_FORMAT || st == FASTLLM_ERR_UNSUPPORTED);
    fastllm_model_free(NULL);
    fastllm_session_free(NULL);
    fastllm_data_free(NULL);
    fastllm_string_free(NULL);
}

static void test_model_queries(void) {
    CHECK(fastllm_model_vocab_size(model) > 0);
    CHECK(fastllm_model_vocab_size(NULL) == -1);
    CHECK(fastllm_model_context_length(model) > 0);
    size_t len = 0;
    CHECK(fastllm_model_meta(model, "architecture", NULL, 0, &len) == FASTLLM_ERR_BUFFER_TOO_SMALL);
    CHECK(len > 0);
    char *buf = malloc(len + 1);
    CHECK(fastllm_model_meta(model, "architecture", buf, len, &len) == FASTLLM_ERR_BUFFER_TOO_SMALL);
    CHECK(fastllm_model_meta(model, "architecture", buf, len + 1, &len) == FASTLLM_OK);
    CHECK(strlen(buf) == len);
    free(buf);
    CHECK(fastllm_model_meta(model, "no-such-key", NULL, 0, &len) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(fastllm_model_meta(NULL, "architecture", NULL, 0, &len) == FASTLLM_ERR_NULL_ARGUMENT);
    CHECK(fastllm_model_meta(model, NULL, NULL, 0, &len) == FASTLLM_ERR_NULL_ARGUMENT);
}

static void test_tokenize(void) {
    const char *text = "Hello world, hello!";
    size_t n = 0;
    CHECK(fastllm_tokenize(model, text, strlen(text), false, true, NULL, 0, &n) == FASTLLM_ERR_BUFFER_TOO_SMALL);
    CHECK(n > 0);
    int32_t *ids = malloc(n * sizeof *ids);
    size_t need = n;
    if (n > 1) CHECK(fastllm_tokenize(model, text, strlen(text), false, true, ids, n - 1, &n) == FASTLLM_ERR_BUFFER_TOO_SMALL);
    CHECK(n == need);
    CHECK(fastllm_tokenize(model, text, strlen(text), false, true, ids, n, &n) == FASTLLM_OK);
    char out[256];
    size_t len = 0;
    CHECK(fastllm_detokenize(model, ids, n, out, sizeof out, &len) == FASTLLM_OK);
    CHECK(strcmp(out, text) == 0);
    CHECK(fastllm_detokenize(model, ids, n, out, 3, &len) == FASTLLM_ERR_BUFFER_TOO_SMALL);
    CHECK(len == strlen(text));
    int32_t bad[2] = {-1, 5};
    CHECK(fastllm_detokenize(model, bad, 2, out, sizeof out, &len) == FASTLLM_ERR_INVALID_ARGUMENT);
    bad[0] = 1 << 30;
    CHECK(fastllm_detokenize(model, bad, 2, out, sizeof out, &len) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(fastllm_tokenize(model, "\xff\xfe", 2, false, true, ids, need, &n) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(fastllm_tokenize(model, NULL, 5, false, true, ids, need, &n) == FASTLLM_ERR_NULL_ARGUMENT);
    CHECK(fastllm_tokenize(model, NULL, 0, false, true, ids, need, &n) == FASTLLM_OK && n == 0);
    CHECK(fastllm_tokenize(NULL, text, 3, false, true, ids, need, &n) == FASTLLM_ERR_NULL_ARGUMENT);
    CHECK(fastllm_tokenize(model, text, 3, false, true, ids, need, NULL) == FASTLLM_ERR_NULL_ARGUMENT);
    free(ids);
}

static void test_session(void) {
    FastllmSession *s = NULL;
    CHECK(fastllm_session_new(NULL, 0, &s) == FASTLLM_ERR_NULL_ARGUMENT);
    CHECK(fastllm_session_new(model, 16, NULL) == FASTLLM_ERR_NULL_ARGUMENT);
    CHECK(fastllm_session_new(model, 16, &s) == FASTLLM_OK);
    const float *logits = NULL;
    size_t nv = 0;
    CHECK(fastllm_session_logits(s, &logits, &nv) == FASTLLM_ERR_INVALID_ARGUMENT); /* nothing evaluated */
    int32_t ids[3] = {1, 2, 3};
    CHECK(fastllm_session_eval(s, ids, 3) == FASTLLM_OK);
    CHECK(fastllm_session_length(s) == 3);
    CHECK(fastllm_session_logits(s, &logits, &nv) == FASTLLM_OK);
    CHECK(nv == (size_t)fastllm_model_vocab_size(model));
    int32_t bad = -3;
    CHECK(fastllm_session_eval(s, &bad, 1) == FASTLLM_ERR_INVALID_ARGUMENT);
    bad = fastllm_model_vocab_size(model);
    CHECK(fastllm_session_eval(s, &bad, 1) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(fastllm_session_length(s) == 3); /* unchanged */
    CHECK(fastllm_session_eval(s, NULL, 1) == FASTLLM_ERR_NULL_ARGUMENT);
    CHECK(fastllm_session_eval(s, ids, 0) == FASTLLM_ERR_INVALID_ARGUMENT);
    int32_t tok = -1;
    CHECK(fastllm_session_sample(s, NULL, &tok) == FASTLLM_OK && tok >= 0);
    FastllmSampling sp = fastllm_sampling_default();
    sp.top_p = 0.0f;
    CHECK(fastllm_session_sample(s, &sp, &tok) == FASTLLM_ERR_INVALID_ARGUMENT);
    sp = fastllm_sampling_default();
    sp.struct_size = 1;
    CHECK(fastllm_session_sample(s, &sp, &tok) == FASTLLM_ERR_INVALID_ARGUMENT);
    /* same seed, same tokens */
    sp = fastllm_sampling_default();
    sp.temperature = 1.0f;
    sp.seed = 42;
    int32_t a = 0, b = 0;
    CHECK(fastllm_session_sample(s, &sp, &a) == FASTLLM_OK);
    CHECK(fastllm_session_reset(s) == FASTLLM_OK);
    CHECK(fastllm_session_eval(s, ids, 3) == FASTLLM_OK);
    FastllmSession *s2 = NULL;
    CHECK(fastllm_session_new(model, 16, &s2) == FASTLLM_OK);
    CHECK(fastllm_session_eval(s2, ids, 3) == FASTLLM_OK);
    CHECK(fastllm_session_sample(s2, &sp, &b) == FASTLLM_OK);
    CHECK(a == b);
    /* context overflow */
    int32_t many[20];
    for (int i = 0; i < 20; i++) many[i] = 1 + i % 5;
    CHECK(fastllm_session_eval(s2, many, 20) == FASTLLM_ERR_CONTEXT_FULL);
    CHECK(fastllm_session_length(s2) == 3);
    fastllm_session_free(s2);
    CHECK(fastllm_session_reset(NULL) == FASTLLM_ERR_NULL_ARGUMENT);
    fastllm_session_free(s);
}

static void test_generate(void) {
    FastllmSession *s = NULL;
    CHECK(fastllm_session_new(model, 0, &s) == FASTLLM_OK);
    FastllmGenerateParams gp = fastllm_generate_params_default();
    gp.max_new_tokens = 6;
    int calls = 0;
    char *text = NULL;
    CHECK(fastllm_generate(s, "Hello", &gp, count_cb, &calls, &text) == FASTLLM_OK);
    CHECK(text != NULL);
    CHECK(calls >= 1);
    fastllm_string_free(text);
    /* cancel from the callback */
    text = NULL;
    calls = 0;
    gp.max_new_tokens = 20;
    CHECK(fastllm_generate(s, " again", &gp, cancel_after_two, &calls, &text) == FASTLLM_ERR_CANCELLED);
    CHECK(text == NULL);
    CHECK(calls == 2);
    /* NULL callback and NULL out_text are fine */
    CHECK(fastllm_generate(s, " more", &gp, NULL, NULL, NULL) == FASTLLM_OK);
    CHECK(fastllm_generate(s, NULL, &gp, NULL, NULL, NULL) == FASTLLM_ERR_NULL_ARGUMENT);
    CHECK(fastllm_generate(NULL, "x", &gp, NULL, NULL, NULL) == FASTLLM_ERR_NULL_ARGUMENT);
    gp.n_stop = 2;
    gp.stop = NULL;
    CHECK(fastllm_generate(s, "x", &gp, NULL, NULL, NULL) == FASTLLM_ERR_NULL_ARGUMENT);
    gp = fastllm_generate_params_default();
    gp.struct_size = 8;
    CHECK(fastllm_generate(s, "x", &gp, NULL, NULL, NULL) == FASTLLM_ERR_INVALID_ARGUMENT);
    /* chat mode, two turns */
    fastllm_session_reset(s);
    gp = fastllm_generate_params_default();
    gp.chat = true;
    gp.system = "Be brief.";
    gp.max_new_tokens = 4;
    CHECK(fastllm_generate(s, "Hi", &gp, NULL, NULL, NULL) == FASTLLM_OK);
    size_t after_first = fastllm_session_length(s);
    CHECK(fastllm_generate(s, "And again?", &gp, NULL, NULL, NULL) == FASTLLM_OK);
    CHECK(fastllm_session_length(s) > after_first);
    CHECK(fastllm_session_add_message(s, "wizard", "x") == FASTLLM_ERR_INVALID_ARGUMENT);
    fastllm_session_free(s);
}

static void test_ops(void) {
    int64_t dims[1] = {4};
    float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
    FastllmData *x = NULL, *y = NULL;
    CHECK(fastllm_data_new(FASTLLM_DTYPE_F32, dims, 1, a, sizeof a, &x) == FASTLLM_OK);
    CHECK(fastllm_data_new(FASTLLM_DTYPE_F32, dims, 1, b, sizeof b, &y) == FASTLLM_OK);
    CHECK(fastllm_data_new(FASTLLM_DTYPE_F32, dims, 1, b, 3, &y) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(fastllm_data_new(99, dims, 1, NULL, 0, &y) == FASTLLM_ERR_INVALID_ARGUMENT);
    int64_t neg[1] = {-4};
    CHECK(fastllm_data_new(FASTLLM_DTYPE_F32, neg, 1, NULL, 0, &y) == FASTLLM_ERR_INVALID_ARGUMENT);
    const char *names[2] = {"input0", "input1"};
    FastllmData *datas[2] = {x, y};
    const char *fnames[1] = {"alpha"};
    float alpha[1] = {0.5f};
    CHECK(fastllm_op_run("AddTo", names, datas, 2, fnames, alpha, 1, NULL, NULL, 0) == FASTLLM_OK);
    float r[4];
    size_t nb = 0;
    CHECK(fastllm_data_read(x, r, 3, &nb) == FASTLLM_ERR_BUFFER_TOO_SMALL && nb == 16);
    CHECK(fastllm_data_read(x, r, sizeof r, &nb) == FASTLLM_OK);
    CHECK(r[0] == 6.0f && r[3] == 24.0f);
    int64_t shape[4];
    size_t nd = 0;
    CHECK(fastllm_data_shape(x, shape, 4, &nd) == FASTLLM_OK && nd == 1 && shape[0] == 4);
    CHECK(fastllm_op_run("NoSuchOp", names, datas, 2, NULL, NULL, 0, NULL, NULL, 0) == FASTLLM_ERR_INVALID_ARGUMENT);
    FastllmData *same[2] = {x, x};
    CHECK(fastllm_op_run("AddTo", names, same, 2, NULL, NULL, 0, NULL, NULL, 0) == FASTLLM_ERR_INVALID_ARGUMENT);
    CHECK(fastllm_op_run("AddTo", names, datas, 1, NULL, NULL, 0, NULL, NULL, 0) != FASTLLM_OK);
    CHECK(fastllm_op_run(NULL, names, datas, 2, NULL, NULL, 0, NULL, NULL, 0) == FASTLLM_ERR_NULL_ARGUMENT);
    size_t len = 0;
    CHECK(fastllm_profiler_report(NULL, 0, &len) == FASTLLM_ERR_BUFFER_TOO_SMALL && len > 0);
    fastllm_data_free(x);
    fastllm_data_free(y);
}

static void *worker(void *arg) {
    long id = (long)arg;
    int *ok = malloc(sizeof *ok);
    *ok = 1;
    char text[64];
    snprintf(text, sizeof text, "thread %ld says hello", id);
    for (int i = 0; i < 20; i++) {
        int32_t ids[64];
        size_t n = 0;
        if (fastllm_tokenize(model, text, strlen(text), false, true, ids, 64, &n) != FASTLLM_OK) *ok = 0;
        char back[128];
        size_t len = 0;
        if (fastllm_detokenize(model, ids, n, back, sizeof back, &len) != FASTLLM_OK || strcmp(back, text) != 0) *ok = 0;
    }
    FastllmSession *s = NULL;
    if (fastllm_session_new(model, 64, &s) != FASTLLM_OK) *ok = 0;
    int32_t ids[4] = {1, 2, 3, (int32_t)(id % 7) + 1};
    if (fastllm_session_eval(s, ids, 4) != FASTLLM_OK) *ok = 0;
    for (int i = 0; i < 4; i++) {
        int32_t t;
        if (fastllm_session_sample(s, NULL, &t) != FASTLLM_OK || fastllm_session_eval(s, &t, 1) != FASTLLM_OK) *ok = 0;
    }
    fastllm_session_free(s);
    return ok;
}

/* The first version of FastllmModelParams (it ended at `precision`). */
typedef struct {
    uint32_t struct_size;
    const char *device;
    uint32_t threads;
    bool low_memory;
    uint32_t precision;
} ModelParamsV1;

/* A caller built against the first version still loads; the switches load on the CPU. */
static void test_params_versions(const char *path) {
    ModelParamsV1 v1 = {sizeof(ModelParamsV1), NULL, 1, false, 0};
    FastllmModel *m = NULL;
    CHECK(fastllm_model_load(path, (const FastllmModelParams *)&v1, &m) == FASTLLM_OK);
    fastllm_model_free(m);
    FastllmModelParams p = fastllm_model_params_default();
    p.threads = 1;
    p.cuda_graphs = 0;
    p.fused_ops = 0;
    p.gpu_memory_cap_mb = 0;
    p.cache_dir = "/tmp/fastllm_api_test_cache";
    p.peer_all_reduce = 0;
    m = NULL;
    CHECK(fastllm_model_load(path, &p, &m) == FASTLLM_OK);
    fastllm_model_free(m);
    /* the fourth version ended at `batch_invariant` */
    FastllmModelParams v4 = fastllm_model_params_default();
    v4.threads = 1;
    v4.struct_size = (uint32_t)offsetof(FastllmModelParams, peer_all_reduce);
    m = NULL;
    CHECK(fastllm_model_load(path, &v4, &m) == FASTLLM_OK);
    fastllm_model_free(m);
    /* a switch out of range is refused */
    p.peer_all_reduce = 2;
    m = NULL;
    CHECK(fastllm_model_load(path, &p, &m) != FASTLLM_OK);
}

static void test_threads(void) {
    pthread_t th[8];
    for (long i = 0; i < 8; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK(*(int *)r == 1);
        free(r);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: api_test MODEL.flm\n");
        return 2;
    }
    test_status_and_version();
    test_load_errors();
    test_params_versions(argv[1]);
    FastllmModelParams p = fastllm_model_params_default();
    p.threads = 2;
    if (fastllm_model_load(argv[1], &p, &model) != FASTLLM_OK) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], fastllm_last_error());
        return 1;
    }
    test_model_queries();
    test_tokenize();
    test_session();
    test_generate();
    test_ops();
    test_threads();
    /* sessions outlive the model */
    FastllmSession *s = NULL;
    CHECK(fastllm_session_new(model, 8, &s) == FASTLLM_OK);
    fastllm_model_free(model);
    int32_t ids[2] = {1, 2};
    CHECK(fastllm_session_eval(s, ids, 2) == FASTLLM_OK);
    fastllm_session_free(s);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
