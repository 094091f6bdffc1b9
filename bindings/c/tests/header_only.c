/* The header on its own must compile cleanly as C11 and C++17. */
#include "fastllm.h"
int fastllm_header_only_check(void);
int fastllm_header_only_check(void) { return FASTLLM_OK; }
