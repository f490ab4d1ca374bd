/* Documents as users have them: a text file is one document; a JSONL file (.jsonl, .ndjson) one document per
 * line, its string field `field`. A line that is not a JSON object, or lacks the field, or holds another
 * type there, is an error naming the file and the line. Bytes that are not UTF-8 are replaced by U+FFFD as
 * Python's `open(..., errors="replace")` reads them (each maximal ill-formed subpart), and counted; blank
 * lines are skipped. */
#ifndef FSDP_TOKENIZER_TOK_DOCS_H
#define FSDP_TOKENIZER_TOK_DOCS_H

#include <stddef.h>
#include <stdio.h>

#include "fsdp/error.h"

/* A document's text: the field's value (or the whole file), and the scratch of its repair. */
typedef struct tok_text {
    char *p, *fix;
    size_t n, cap, fix_cap;
} tok_text;

typedef struct tok_docs {
    char path[4096];
    char field[256];
    int jsonl;
    FILE *f;
    size_t line;      /* the line of the last document (JSONL) */
    char *buf;        /* the line read (the whole file for text) */
    size_t cap;
    tok_text text;
    size_t invalid;   /* ill-formed UTF-8 subparts replaced (tok_docs_next) */
    int done;
} tok_docs;

/* Whether a path is read as JSONL (by its name: .jsonl, .ndjson). */
int tok_docs_is_jsonl(const char *path);
/* Opens path (JSONL by its name, see above; field: the JSONL field, "text" when NULL). */
int tok_docs_open(tok_docs *d, const char *path, const char *field, fsdp_err *err);
/* The same, JSONL or not as told. */
int tok_docs_open_as(tok_docs *d, const char *path, const char *field, int jsonl, fsdp_err *err);
/* The next document: 1 with *doc / *len (valid until the next call), 0 at the end, an error code. */
int tok_docs_next(tok_docs *d, const char **doc, size_t *len, fsdp_err *err);
void tok_docs_close(tok_docs *d);

/* The same in two steps, for readers that parse on other threads: the raw document (a JSONL line without
 * its blanks, d->line its number; a whole text file), valid until the next call; then its text (thread
 * safe, into out: repaired, the field's value for JSONL), *invalid counting the replaced subparts; path and
 * line name it in errors. */
int tok_docs_next_raw(tok_docs *d, const char **raw, size_t *len, fsdp_err *err);
int tok_doc_text(const char *path, size_t line, const char *field, int jsonl, const char *raw, size_t n, tok_text *out,
                 size_t *invalid, fsdp_err *err);
void tok_text_free(tok_text *t);

/* The whole of a regular file (malloc'd, NUL-terminated beyond *n). */
int tok_read_file(const char *path, char **buf, size_t *n, fsdp_err *err);

#endif
