/* The architecture table (decoder/decoder_arch.h). */
#include "decoder/decoder_arch.h"

#include <stdio.h>
#include <string.h>

static const decoder_arch_info ARCHS[DECODER_ARCH_COUNT] = {
    {DECODER_ARCH_LLAMA3, "llama3", "llama", "LlamaForCausalLM", 0, 0, 1e-5, 10000.0, DECODER_ROPE_LLAMA3, 0.0, 1e-6,
     10000.0, 0, 0, 0, -1, DECODER_MOE_NAMES_NONE, 0, 0, 0, 0.0, -1},
    {DECODER_ARCH_QWEN2, "qwen2", "qwen2", "Qwen2ForCausalLM", 1, 0, 1e-6, 1000000.0, DECODER_ROPE_NONE, 0.02, 1e-6,
     10000.0, 0, 0, 0, -1, DECODER_MOE_NAMES_NONE, 0, 0, 0, 0.0, -1},
    {DECODER_ARCH_QWEN3, "qwen3", "qwen3", "Qwen3ForCausalLM", 0, 1, 1e-6, 1000000.0, DECODER_ROPE_NONE, 0.02, 1e-6,
     10000.0, 128, 0, 0, -1, DECODER_MOE_NAMES_NONE, 0, 0, 0, 0.0, -1},
    {DECODER_ARCH_QWEN3_MOE, "qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", 0, 1, 1e-6, 1000000.0,
     DECODER_ROPE_NONE, 0.02, 1e-6, 10000.0, 128, 1, 0, -1, DECODER_MOE_NAMES_MLP, 0, 128, 8, 0.001, -1},
    {DECODER_ARCH_OLMOE, "olmoe", "olmoe", "OlmoeForCausalLM", 0, 1, 1e-5, 10000.0, DECODER_ROPE_NONE, 0.02, 1e-5,
     10000.0, 0, 1, 1, -1, DECODER_MOE_NAMES_MLP, 1, 64, 8, 0.01, 1},
    {DECODER_ARCH_MIXTRAL, "mixtral", "mixtral", "MixtralForCausalLM", 0, 0, 1e-5, 1000000.0, DECODER_ROPE_NONE, 0.02,
     1e-5, 1000000.0, 0, 1, 0, 1, DECODER_MOE_NAMES_MIXTRAL, 1, 8, 2, 0.001, -1},
};

const decoder_arch_info *decoder_arch_get(decoder_arch arch) {
    return (int)arch >= 0 && arch < DECODER_ARCH_COUNT ? &ARCHS[arch] : NULL;
}

const decoder_arch_info *decoder_arch_by_name(const char *name) {
    if (!name) return NULL;
    if (!strcmp(name, "llama")) return &ARCHS[DECODER_ARCH_LLAMA3];
    for (int i = 0; i < DECODER_ARCH_COUNT; i++)
        if (!strcmp(ARCHS[i].name, name)) return &ARCHS[i];
    return NULL;
}

const decoder_arch_info *decoder_arch_by_model_type(const char *model_type) {
    for (int i = 0; model_type && i < DECODER_ARCH_COUNT; i++)
        if (!strcmp(ARCHS[i].model_type, model_type)) return &ARCHS[i];
    return NULL;
}

const decoder_arch_info *decoder_arch_by_class(const char *hf_class) {
    for (int i = 0; hf_class && i < DECODER_ARCH_COUNT; i++)
        if (!strcmp(ARCHS[i].hf_class, hf_class)) return &ARCHS[i];
    return NULL;
}

void decoder_arch_list(int model_types, char *buf, size_t cap) {
    size_t len = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < DECODER_ARCH_COUNT && len < cap; i++) {
        int k = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", model_types ? ARCHS[i].model_type : ARCHS[i].name);
        if (k < 0) break;
        len += (size_t)k;
    }
}
