/* Training data: the recipe's `data:` section.
 *   kind: text         a UTF-8 file read as bytes (vocabulary 256); with `tokenizer:`, each file is a document
 *                      through that tokenizer.json, packed (train/data_text.h)
 *   kind: jsonl        JSON lines, each line's `field` (default "text") a document through the model's
 *                      tokenizer (`tokenizer:`, default the model's from_hf directory), packed
 *   kind: tokens       a flat binary of uint16 or uint32 token ids (nanoGPT's train.bin), mmapped
 *   kind: llmc         llm.c .bin shards (256 x int32 header: magic 20240520, version 1, token count;
 *                      then uint16 tokens), several by glob (train/data_files.h)
 *   kind: safetensors  fixed `input_ids` / `labels` tensors [B, T] (every step the same batch)
 *   kind: synthetic    seeded random tokens (benchmarks; only when asked: `kind` is required)
 * path may be a glob (text, tokens, llmc: the matches in sorted order are one stream; a window never
 * spans two files); a relative path was resolved when the recipe was loaded (pipeline/recipe_paths.c).
 * Every token id is checked against the vocabulary at open time.
 * batch_size is the global batch; each rank takes its contiguous slice of it. Sample b of
 * batch `pos` starts at a window chosen by a counter-based hash of (seed, pos, b), so the
 * stream is the same for every world size and a resumed run continues it from `pos`. */
#ifndef FSDP_TRAIN_DATA_H
#define FSDP_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "fsdp/value.h"

typedef enum data_kind { DATA_TEXT = 0, DATA_TOKENS, DATA_SAFETENSORS, DATA_SYNTHETIC, DATA_LLMC, DATA_JSONL } data_kind;

typedef struct data_source data_source;

typedef struct data_config {
    data_kind kind;
    char path[4096];
    int64_t batch_size;  /* global */
    int64_t seq_len;
    int token_bytes;     /* tokens: 2 (uint16) or 4 (uint32) */
    uint64_t seed;
    int sequential;      /* order: sequential: sample b of batch pos is the (pos*batch_size + b)-th block of
                          * seq_len + 1 consecutive tokens (llm.c, torch_baseline.py --tokens), wrapping
                          * around at the end; default random windows */
    /* tokenized kinds (jsonl; text with a tokenizer) */
    char tokenizer[4096]; /* a tokenizer.json or a directory holding one; "model": the model's from_hf */
    char field[256];      /* the JSONL field of the text ("text") */
    char eos[256];        /* the token between documents (default: tokenizer_config.json's eos_token) */
    int template_;        /* 1: each document wrapped in the tokenizer's template (BOS / EOS) as add_special_tokens */
} data_config;

/* Whether the data is documents through a tokenizer (kind jsonl, or text with a tokenizer). */
int data_tokenized(const data_config *cfg);
/* A tokenized kind's default tokenizer from the recipe's model section: its from_hf directory (when data
 * names none, or names "model"). An error when a tokenized kind is left without one. */
int data_config_model(data_config *cfg, const fsdp_value *model, fsdp_err *err);

/* Parses and checks a `data:` map (errors point at the key; a missing section or `kind` is an error).
 * default_seed is runtime.seed. */
int data_config_from_value(const fsdp_value *section, uint64_t default_seed, data_config *cfg, fsdp_err *err);
/* The files of cfg exist, are readable and have valid headers (text, tokens, llmc; no token scan):
 * the static check of `validate`. 0 for the other kinds. */
int data_check_files(const data_config *cfg, fsdp_err *err);
/* data_check_files of a tokenized kind with its tokenizer's ids checked against the model's vocab_size too
 * (vocab 0: not checked); 0 for the other kinds. */
int data_check_vocab(const data_config *cfg, int vocab, fsdp_err *err);
/* The same with the keys `section` leaves out taken from `base` (eval_data over data:). */
int data_config_over(const fsdp_value *section, const data_config *base, data_config *cfg, fsdp_err *err);
/* Opens the source for this rank; the global batch must divide evenly by world. */
int data_open(const data_config *cfg, int vocab_size, int world, int rank, data_source **out, fsdp_err *err);
void data_close(data_source *d);
int64_t data_local_batch(const data_source *d);
/* Fills this rank's [local_batch, seq_len] inputs and labels for global batch `pos`. */
int data_batch(data_source *d, uint64_t pos, int32_t *inputs, int32_t *labels, fsdp_err *err);

#endif
