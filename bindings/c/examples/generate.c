/* generate.c — load a model and stream a completion.
 *   ./generate [MODEL] "prompt"     (MODEL omitted or "-" = the default model) */
#include <stdio.h>
#include <string.h>
#include "fastllm.h"

static bool on_piece(void *user_data, int32_t token, const char *piece, size_t piece_len) {
    (void)token;
    size_t *count = (size_t *)user_data;
    fwrite(piece, 1, piece_len, stdout);
    fflush(stdout);
    (*count)++;
    return true;
}

int main(int argc, char **argv) {
    const char *model_path = (argc > 2 && strcmp(argv[1], "-") != 0) ? argv[1] : NULL;
    const char *prompt = argc > 2 ? argv[2] : (argc > 1 ? argv[1] : "The capital of France is");

    FastllmModelParams mp = fastllm_model_params_default();
    mp.threads = 2;
    FastllmModel *model = NULL;
    FastllmStatus st = fastllm_model_load(model_path, &mp, &model);
    if (st != FASTLLM_OK) {
        fprintf(stderr, "load failed: %s: %s\n", fastllm_status_string(st), fastllm_last_error());
        return 1;
    }
    FastllmSession *session = NULL;
    st = fastllm_session_new(model, 0, &session);
    if (st != FASTLLM_OK) {
        fprintf(stderr, "session: %s\n", fastllm_last_error());
        fastllm_model_free(model);
        return 1;
    }
    FastllmGenerateParams gp = fastllm_generate_params_default();
    gp.max_new_tokens = 32;
    size_t pieces = 0;
    char *text = NULL;
    printf("%s", prompt);
    st = fastllm_generate(session, prompt, &gp, on_piece, &pieces, &text);
    printf("\n");
    if (st != FASTLLM_OK) {
        fprintf(stderr, "generate failed: %s: %s\n", fastllm_status_string(st), fastllm_last_error());
    } else {
        fprintf(stderr, "[%zu pieces, %zu bytes, %zu tokens in session]\n", pieces, strlen(text),
                fastllm_session_length(session));
    }
    fastllm_string_free(text);
    fastllm_session_free(session);
    fastllm_model_free(model);
    return st == FASTLLM_OK ? 0 : 1;
}
