/* Documents encoded a batch at a time on worker threads, in order: what `fsdp-run tokenize`, the tokenized
 * `data:` kinds and `fsdp-run data prepare` share. The caller adds raw documents (tok_docs_next_raw), encodes
 * the batch (each document's text taken from its JSONL field and encoded on one of the workers), then reads
 * ids[i] in document order. The first failing document (in order) names the error, with its file and line. */
#ifndef FSDP_TOKENIZER_TOK_BATCH_H
#define FSDP_TOKENIZER_TOK_BATCH_H

#include <stddef.h>

#include "fsdp/error.h"
#include "tok.h"
#include "tok_docs.h"

typedef struct tok_workers {
    int n;
    tok_state **st;
    tok_text *text;
    size_t *invalid; /* per worker: ill-formed UTF-8 subparts replaced */
} tok_workers;

int tok_workers_new(const tok_tokenizer *t, int threads, tok_workers *w, fsdp_err *err);
/* Totals over the workers: replaced subparts, characters left out without a token. */
size_t tok_workers_invalid(const tok_workers *w);
size_t tok_workers_dropped(const tok_workers *w);
void tok_workers_free(tok_workers *w);

typedef struct tok_batch {
    size_t n, cap;
    char **raw;
    size_t *len, *line;
    const char **path; /* not owned: the caller's file names outlive the batch */
    int *jsonl;
    tok_ids *ids;
} tok_batch;

/* Adds a copy of a raw document (a JSONL line or a whole text) of path (line: its line, for errors). */
int tok_batch_add(tok_batch *b, const char *path, int jsonl, size_t line, const char *raw, size_t len, fsdp_err *err);
/* Encodes every document of the batch (field: the JSONL field) into ids[i]. */
int tok_batch_encode(tok_batch *b, tok_workers *w, const char *field, int add_special, fsdp_err *err);
/* Every document of the files (in order) added to b a batch at a time: flush(user, b, err) runs whenever b
 * holds `batch` documents and once after the last, and b is emptied after each. jsonl: 1 or 0 reads every file
 * as JSONL or as one text, -1 tells each by its name. *docs and *bytes (NULL: not counted) grow by the documents
 * read and their raw bytes. The files' names must outlive the batch. */
typedef int (*tok_batch_flush)(void *user, tok_batch *b, fsdp_err *err);
int tok_batch_files(tok_batch *b, const char *const *paths, size_t n, const char *field, int jsonl, size_t batch,
                    tok_batch_flush flush, void *user, size_t *docs, size_t *bytes, fsdp_err *err);
/* Empties the batch, keeping its memory. */
void tok_batch_clear(tok_batch *b);
void tok_batch_free(tok_batch *b);

#endif
