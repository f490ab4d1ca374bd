/* Fuzz the tokenizer (tokenizer/tok.h): the first byte picks what the rest is. 0-2: a text encoded by the
 * llama3-, neox- or spm_legacy-style test tokenizers (tests/data/tokenizers/, run from the project root):
 * every id is in the vocabulary and decodes; the llama3 style (byte-level, no normalizer) gives the text
 * back exactly, as read (invalid UTF-8 repaired). 3: a tokenizer.json of its own, loaded (and, when it
 * loads, used on a short text): refused or working, never a crash. */
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tok.h"
#include "tokenizer/tok_utf8.h"

static const char *const STYLES[3] = {"tests/data/tokenizers/llama3", "tests/data/tokenizers/neox",
                                      "tests/data/tokenizers/spm_legacy"};

static void use(tok_tokenizer *t, const char *text, size_t n, int lossless) {
    tok_state *st = tok_state_new(t);
    if (!st) abort();
    tok_ids ids = {0};
    fsdp_err err;
    if (tok_encode(st, text, n, 1, &ids, &err)) abort(); /* any bytes encode */
    for (size_t k = 0; k < ids.n; k++)
        if (ids.v[k] < 0 || ids.v[k] >= tok_vocab_size(t)) abort();
    const tok_ids *pre = tok_template_prefix(t);
    char *back = NULL;
    size_t bn = 0;
    if (tok_decode(t, ids.n > pre->n ? ids.v + pre->n : NULL, ids.n - pre->n, 0, &back, &bn, &err)) abort();
    if (lossless) {
        char *fixed = malloc(3 * n + 1);
        size_t replaced, fn = tok_utf8_repair(text, n, fixed, &replaced);
        if (fn != bn || memcmp(fixed, back, fn)) abort(); /* byte-level BPE loses nothing */
        free(fixed);
    }
    free(back);
    tok_ids_free(&ids);
    tok_state_free(st);
}

int fsdp_fuzz_tokenizer(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    fsdp_err err;
    tok_tokenizer *t = NULL;
    if (data[0] % 4 == 3) {
        if (tok_load_json(rest, n, "fuzz.json", &t, &err)) return 0;
        use(t, "Hello, world! 12345 <s> caf\xc3\xa9 \xff", 27, 0);
        tok_free(t);
    } else {
        /* the three styles are loaded once per process (a harness's own cache: loading is most of a run) */
        static tok_tokenizer *loaded[3];
        int k = data[0] % 4;
        if (!loaded[k] && tok_load(STYLES[k], &loaded[k], &err)) abort();
        use(loaded[k], rest, n, k == 0);
    }
    return 0;
}
FSDP_FUZZ_ENTRY(fsdp_fuzz_tokenizer)
