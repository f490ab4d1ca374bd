/* The files of a `data:` section: data.path resolved (a glob; relative paths against the working
 * directory, then the recipe's directory), each match mapped, llm.c headers checked, and the token
 * ids scanned against the vocabulary once, at open time.
 *
 * kind llmc: an llm.c / nanoGPT-style shard: a header of 256 little-endian int32 (magic 20240520,
 * version 1, token count), then that many uint16 tokens; or llm.c's llama-3 shard (magic 20240801,
 * version 7) of uint32 tokens; several shards by glob, read as one stream in sorted order (a window
 * never spans two shards). */
#ifndef FSDP_TRAIN_DATA_FILES_H
#define FSDP_TRAIN_DATA_FILES_H

#include <glob.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"
#include "train/data.h"

#define DATA_LLMC_MAGIC 20240520
#define DATA_LLMC_VERSION 1
#define DATA_LLMC_HEADER_BYTES 1024 /* 256 x int32 */
/* llm.c's llama-3 shards: uint32 tokens */
#define DATA_LLMC32_MAGIC 20240801
#define DATA_LLMC32_VERSION 7

typedef struct data_seg {
    char *path;
    const unsigned char *map; /* the whole file */
    size_t map_len;
    size_t hdr;       /* bytes before the first token */
    size_t n_tokens;
    int owned;        /* map is a malloc'd stream (a tokenized kind), not a mapping */
} data_seg;

typedef struct data_files {
    data_seg *seg;
    size_t n;
    int token_bytes; /* 1 (text), 2 or 4 */
} data_files;

/* Expands cfg->path (a glob), maps every
 * matching file and checks its header and size. vocab > 0 and scan: every token id must be < vocab
 * (the error names the file, the token index and its byte offset). */
int data_files_open(const data_config *cfg, int vocab, int scan, data_files *f, fsdp_err *err);
void data_files_close(data_files *f);
/* The sorted matches of cfg->path (none is an error naming the pattern). */
int data_glob(const data_config *cfg, glob_t *g, fsdp_err *err);

static inline uint32_t data_seg_token(const data_seg *s, int token_bytes, size_t i) {
    const unsigned char *p = s->map + s->hdr + i * (size_t)token_bytes;
    if (token_bytes == 1) return p[0];
    if (token_bytes == 2) return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
