/* The tokenizer's parts as tokenizer.json declares them, and a thread's workspace (tokenizer/ only). */
#ifndef FSDP_TOKENIZER_TOK_IMPL_H
#define FSDP_TOKENIZER_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tok.h"
#include "tok_map.h"

/* A piece of the text on its way through the pipeline: bytes [off, off + len) of the workspace's arena; an
 * added token's id once matched (-1 before the model); origin: it starts at the text's first byte (what
 * Metaspace's prepend_scheme "first" asks). */
typedef struct tok_piece {
    size_t off, len;
    int32_t id;
    int origin;
} tok_piece;

typedef struct tok_pieces {
    tok_piece *v;
    size_t n, cap;
} tok_pieces;

typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

/* Segments of s[0..n) by matches of re: (start, end, is_match) covering s, as Pattern::find_matches. */
typedef struct tok_seg {
    size_t a, b;
    int match;
} tok_seg;
typedef struct tok_segs {
    tok_seg *v;
    size_t n, cap;
} tok_segs;
/* SplitDelimiterBehavior */
enum { TOK_SPLIT_ISOLATED, TOK_SPLIT_REMOVED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT, TOK_SPLIT_CONTIGUOUS };
/* Metaspace's prepend_scheme */
enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

enum { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_STRIP,
       TOK_NORM_SEQUENCE };
typedef struct tok_norm {
    int kind;
    char *str; /* Prepend's prepend, Replace's content */
    size_t str_n;
    int re;    /* Replace's pattern */
    int left, right; /* Strip */
    struct tok_norm *sub;
    size_t n_sub;
} tok_norm;

enum { TOK_PRE_BYTELEVEL, TOK_PRE_SPLIT, TOK_PRE_METASPACE, TOK_PRE_DIGITS, TOK_PRE_SEQUENCE };
typedef struct tok_pretok {
    int kind;
    int re;       /* Split's pattern; ByteLevel's GPT-2 regex (use_regex); Metaspace's replacement (split) */
    int behavior; /* Split */
    int invert;
    int add_prefix_space, use_regex; /* ByteLevel */
    char repl[8];                    /* Metaspace's replacement as UTF-8 */
    size_t repl_n;
    int prepend_scheme, split;
    int individual; /* Digits */
    struct tok_pretok *sub;
    size_t n_sub;
} tok_pretok;

enum { TOK_DEC_BYTELEVEL, TOK_DEC_METASPACE, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE, TOK_DEC_STRIP,
       TOK_DEC_SEQUENCE };
typedef struct tok_dec {
    int kind;
    int re; /* Replace's pattern */
    char *content; /* Replace's content */
    size_t content_n;
    uint32_t cp;   /* Strip's content, Metaspace's replacement */
    int start, stop;
    int prepend_scheme;
    struct tok_dec *sub;
    size_t n_sub;
} tok_dec;

typedef struct tok_added {
    char *content, *norm; /* norm: the content normalized (normalized tokens are matched in normalized text) */
    size_t n, norm_n;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} tok_added;

/* The added tokens' byte trie, matched leftmost-longest. */
typedef struct tok_trie {
    tok_umap edge;        /* node << 8 | byte -> child */
    int32_t *tok;         /* node -> added token index, -1 */
    size_t n_nodes, cap;
    uint8_t first[256];   /* a token starts with this byte */
} tok_trie;

typedef struct tok_bpe {
    tok_smap vocab;   /* token -> id */
    tok_umap merges;  /* a << 32 | b -> rank << 32 | new id */
    int32_t unk;      /* -1: none */
    int fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_tok[256]; /* <0xXX> */
} tok_bpe;

struct tok_tokenizer {
    char name[512];
    pcre2_code **re;
    size_t n_re;
    tok_norm *norm;
    tok_pretok *pre;
    tok_dec *dec;
    tok_bpe bpe;
    tok_added *added;
    size_t n_added;
    tok_trie trie_raw, trie_norm;
    tok_ids prefix, suffix;
    int32_t vocab_size;
    /* id -> its string (the added token's content over the model's) and whether it is special */
    size_t *id_off;
    uint32_t *id_len;
    char *id_pool;
    uint8_t *id_special;
    char bl_utf8[256][2]; /* ByteLevel: byte -> its character's UTF-8 */
    uint8_t bl_len[256];
};

struct tok_state {
    const tok_tokenizer *t;
    tok_buf arena;
    tok_pieces a, b;
    tok_segs segs;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    tok_smap cache; /* word -> index into cache_at */
    size_t *cache_at; /* entry -> offset in cache_ids; entry count = cache.n */
    uint32_t *cache_len;
    size_t cache_cap;
    tok_ids cache_ids;
    /* BPE scratch */
    struct tok_sym *sym;
    size_t sym_cap;
    struct tok_merge *heap;
    size_t heap_cap;
    tok_ids word;
    size_t invalid;
    size_t dropped; /* characters without a token (no byte fallback, no unk_token): left out, as tokenizers does */
};

/* arena and piece lists */
int tok_buf_add(tok_buf *b, const char *s, size_t n);
int tok_pieces_push(tok_pieces *p, size_t off, size_t len, int32_t id, int origin);

/* A regex match of re in s[0..n) from start: 1 with [*ms, *me), 0 when none, -1 on a matching error. */
int tok_re_find(tok_state *st, const pcre2_code *re, const char *s, size_t n, size_t start, size_t *ms, size_t *me);
/* Compiles a tokenizer.json pattern (Oniguruma syntax, as tokenizers runs it) for PCRE2; literal: a String
 * pattern. NULL with the reason in err. */
pcre2_code *tok_re_compile(const char *pat, size_t n, int literal, fsdp_err *err);

int tok_re_segments(tok_state *st, const pcre2_code *re, const char *s, size_t n, tok_segs *out);
/* Appends a segment; -1 when out of memory. */
int tok_segs_push(tok_segs *o, size_t a, size_t b, int match);

/* The stages: each maps the pieces of `in` without an id to pieces appended to `out` (pieces with an id
 * pass through). */
int tok_added_split(tok_state *st, const tok_trie *trie, tok_pieces *in, tok_pieces *out);
int tok_normalize_piece(tok_state *st, const tok_norm *nm, size_t off, size_t len, size_t *noff, size_t *nlen);
/* Normalizes s[0..n) into a malloc'd string (the added tokens' normalized forms at load), in st's arena. */
int tok_normalize_string(tok_state *st, const tok_norm *nm, const char *s, size_t n, char **out, size_t *on);
/* "NAME: where: what" as FSDP_E_INVALID: the loaders' errors. */
int tok_bad(const tok_tokenizer *t, fsdp_err *err, const char *where, const char *what);
int tok_pretokenize(tok_state *st, const tok_pretok *p, tok_pieces **in, tok_pieces **out);
int tok_bpe_word(tok_state *st, const char *w, size_t n, tok_ids *out);

int tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t tok);
void tok_trie_free(tok_trie *t);

void tok_norm_free(tok_norm *n);
void tok_pretok_free(tok_pretok *p);
void tok_dec_free(tok_dec *d);

/* the loaders of the parts (tok_load*.c); j is a Jansson json_t * */
struct json_t;
int tok_load_normalizer(tok_tokenizer *t, struct json_t *j, const char *where, tok_norm **out, fsdp_err *err);
int tok_load_pretokenizer(tok_tokenizer *t, struct json_t *j, const char *where, tok_pretok **out, fsdp_err *err);
int tok_load_decoder(tok_tokenizer *t, struct json_t *j, const char *where, tok_dec **out, fsdp_err *err);
int tok_load_post(tok_tokenizer *t, struct json_t *j, const char *where, fsdp_err *err);
int tok_load_bpe(tok_tokenizer *t, struct json_t *j, fsdp_err *err);
int tok_load_added(tok_tokenizer *t, struct json_t *j, fsdp_err *err);
/* Adds a pattern to t's regex table: its index, -1 with err set. */
int tok_add_regex(tok_tokenizer *t, const char *pat, size_t n, int literal, const char *where, fsdp_err *err);

#endif
