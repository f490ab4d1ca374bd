/* A model's own tokenizer, read from its Hugging Face tokenizer.json: the BPE models of the decoder family
 * (byte-level BPE with the `Split` regex pre-tokenizers of Llama 3 / Qwen2 / Qwen3 / OLMoE / GPT-NeoX, and
 * SentencePiece-style BPE with byte fallback, `Metaspace`, `Prepend` and `Replace` of Mistral / Mixtral /
 * Llama 2), their normalizers, added and special tokens, the post-processor's template and the decoders.
 *
 * Encoding gives the ids Hugging Face `tokenizers` gives (`Tokenizer.encode(text, add_special_tokens)`):
 * added tokens are matched in the raw text first, then the rest is normalized, pre-tokenized and merged.
 * Text that is not valid UTF-8 is read as Python's `bytes.decode("utf-8", errors="replace")` reads it
 * (each maximal invalid subpart becomes U+FFFD) and counted. Anything in a tokenizer.json this code cannot
 * honour (a model, normalizer, pre-tokenizer, post-processor or decoder it does not implement, BPE dropout,
 * truncation) is an error naming the component; nothing is approximated.
 *
 * A loaded tokenizer is read-only and shared by threads; each thread encodes with its own tok_state. */
#ifndef FSDP_TOKENIZER_TOK_H
#define FSDP_TOKENIZER_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

typedef struct tok_tokenizer tok_tokenizer;
typedef struct tok_state tok_state;

/* A growing array of token ids. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

int tok_ids_push(tok_ids *a, int32_t id);
int tok_ids_append(tok_ids *a, const int32_t *ids, size_t n);
void tok_ids_free(tok_ids *a);

/* Loads PATH: a tokenizer.json, or a directory holding one. Errors name the file and the JSON key. */
int tok_load(const char *path, tok_tokenizer **out, fsdp_err *err);
/* Loads a tokenizer.json held in memory; name is used in errors. */
int tok_load_json(const char *json, size_t len, const char *name, tok_tokenizer **out, fsdp_err *err);
void tok_free(tok_tokenizer *t);

/* One more than the largest id (the model's vocabulary and the added tokens). */
int32_t tok_vocab_size(const tok_tokenizer *t);
/* The id of a token (an added token or a model token), -1 when there is none. */
int32_t tok_token_id(const tok_tokenizer *t, const char *token);
/* The ids the post-processor puts before and after a single sequence (add_special_tokens), e.g. Llama 3's
 * <|begin_of_text|>, Mistral's <s>, OLMo's <|endoftext|> after. */
const tok_ids *tok_template_prefix(const tok_tokenizer *t);
const tok_ids *tok_template_suffix(const tok_tokenizer *t);
/* Whether the id is a special added token. */
int tok_is_special(const tok_tokenizer *t, int32_t id);

/* The id of the token between packed documents: name when given, else the eos_token of the
 * tokenizer_config.json beside path (the tokenizer's file or directory). */
int tok_eos_id(const tok_tokenizer *t, const char *path, const char *name, int32_t *eos, fsdp_err *err);

/* A thread's workspace (match data, the word cache); NULL when out of memory. */
tok_state *tok_state_new(const tok_tokenizer *t);
void tok_state_free(tok_state *s);
/* The invalid UTF-8 subparts replaced by U+FFFD in the texts this state encoded. */
size_t tok_state_invalid_utf8(const tok_state *s);
/* The characters this state left out because the vocabulary has no token for them and the model neither
 * falls back to bytes nor has an unk_token (tokenizers leaves them out the same way). */
size_t tok_state_dropped(const tok_state *s);

/* Appends the ids of text[0..len) to out. add_special: the post-processor's template around them. */
int tok_encode(tok_state *s, const char *text, size_t len, int add_special, tok_ids *out, fsdp_err *err);

/* The text of ids (malloc'd, NUL-terminated, its length in *len), as `Tokenizer.decode(ids,
 * skip_special_tokens)` gives it. An id the tokenizer does not have is an error. */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text, size_t *len,
               fsdp_err *err);

#endif
