/* Fuzz the Hugging Face config.json reader (decoder/hf_config.c): any text through hf_config_parse;
 * a config it accepts must be writable (hf_config_to_json) and read back as the same model. */
#include <stdlib.h>
#include <string.h>

#include "decoder/hf_config.h"
#include "tests/fuzz/fuzz.h"

static int same_model(const decoder_config *a, const decoder_config *b) {
    return a->arch == b->arch && a->dim == b->dim && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->vocab_size == b->vocab_size && a->head_dim == b->head_dim &&
           a->ffn_hidden == b->ffn_hidden && a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta &&
           a->rope_scaling == b->rope_scaling && a->max_seq_len == b->max_seq_len && a->qkv_bias == b->qkv_bias &&
           a->qk_norm == b->qk_norm && a->tie_embeddings == b->tie_embeddings &&
           (a->rope_scaling != DECODER_ROPE_LLAMA3 ||
            (a->rope_factor == b->rope_factor && a->rope_low_freq_factor == b->rope_low_freq_factor &&
             a->rope_high_freq_factor == b->rope_high_freq_factor &&
             a->rope_original_max_pos == b->rope_original_max_pos));
}

int fsdp_fuzz_hf_config(const uint8_t *data, size_t size) {
    decoder_config c, back;
    fsdp_err err;
    if (hf_config_parse((const char *)data, size, "fuzz.json", &c, &err)) return 0;
    char *text = NULL;
    if (hf_config_to_json(&c, FSDP_DT_BF16, &text, &err)) abort(); /* every accepted model is writable */
    if (hf_config_parse(text, strlen(text), "written", &back, &err) || !same_model(&c, &back)) abort();
    free(text);
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_hf_config)
