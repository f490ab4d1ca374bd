/* libFuzzer harnesses of the checkpoint parsers, of the recipe text path, of the model section and of
 * the Hugging Face config.json reader and of the tokenizer. Each harness is a
 * plain function so that `make test` can replay the committed corpus through it with gcc; `make
 * fuzz` builds the same files with clang's -fsanitize=fuzzer, where FSDP_LIBFUZZER defines the
 * entry point. */
#ifndef FSDP_TESTS_FUZZ_H
#define FSDP_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
int fsdp_fuzz_pickle(const uint8_t *data, size_t size);
int fsdp_fuzz_zip(const uint8_t *data, size_t size);
int fsdp_fuzz_safetensors(const uint8_t *data, size_t size);
int fsdp_fuzz_dcp_meta(const uint8_t *data, size_t size);
int fsdp_fuzz_recipe(const uint8_t *data, size_t size);
int fsdp_fuzz_pt(const uint8_t *data, size_t size);
int fsdp_fuzz_model(const uint8_t *data, size_t size);
int fsdp_fuzz_hf_config(const uint8_t *data, size_t size);
int fsdp_fuzz_llmc(const uint8_t *data, size_t size);
int fsdp_fuzz_tokenizer(const uint8_t *data, size_t size);
#ifdef __cplusplus
}
#endif

#ifdef FSDP_LIBFUZZER
#define FSDP_FUZZ_ENTRY(fn)                                                    \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);              \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fn(data, size); }
#else
#define FSDP_FUZZ_ENTRY(fn)
#endif

#endif
