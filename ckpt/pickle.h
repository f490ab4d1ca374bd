/* Pickle codec for the subset PyTorch's checkpoints use: a reader for protocols 2-5 that
 * builds an object tree without executing anything, and a writer for DCP `.metadata` and
 * torch.save `data.pkl`. */
#ifndef FSDP_CKPT_PICKLE_H
#define FSDP_CKPT_PICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/error.h"

typedef enum pkl_kind {
    PKL_NONE = 0,
    PKL_BOOL,
    PKL_INT,    /* fits in int64 */
    PKL_BIGINT, /* LONG1/LONG4 beyond int64: raw little-endian bytes in s/len */
    PKL_FLOAT,
    PKL_STR,
    PKL_BYTES,
    PKL_TUPLE,
    PKL_LIST,
    PKL_DICT,   /* items[2k] = key, items[2k+1] = value */
    PKL_GLOBAL, /* module s, name name */
    PKL_REDUCE, /* fn(args) [+ state from BUILD] */
    PKL_OBJ,    /* NEWOBJ cls(*args) [+ state from BUILD] */
    PKL_PERSID, /* persistent id: args holds the pid object */
    PKL_MARK,   /* internal */
    PKL_FOLDED  /* an object a pkl_fold hook took: its value is the hook's, i its tag, fn its class */
} pkl_kind;

typedef struct pkl_obj pkl_obj;
struct pkl_obj {
    pkl_kind kind;
    int64_t i;       /* int, bool */
    double f;        /* float */
    const char *s;   /* str / bytes (NUL-terminated copy) / global module / bigint bytes */
    size_t len;
    const char *name;     /* global name */
    pkl_obj **items;      /* tuple / list / dict pairs */
    size_t n;             /* tuple/list: items; dict: pairs */
    size_t cap;
    pkl_obj *fn, *args, *state; /* reduce / newobj / build */
    int depth;            /* nesting depth (bounded) */
    int pinned;           /* reachable more than once (memo fetched, DUP, shared ints): never reclaimed */
};

typedef struct pkl_doc pkl_doc;

#define PKL_MAX_DEPTH 256

/* Parses a whole pickle (up to STOP). `what` names the input in errors. */
int pkl_parse(const void *buf, size_t len, const char *what, pkl_doc **out, const pkl_obj **root, fsdp_err *err);
/* The same for the pickle at the start of buf (bytes after its STOP are left alone): *used is
 * its length; on failure *truncated (may be NULL) is 1 when buf ended before its STOP (more
 * bytes might complete it), 0 for any other error. */
int pkl_parse_prefix(const void *buf, size_t len, const char *what, pkl_doc **out, const pkl_obj **root, size_t *used,
                     int *truncated, fsdp_err *err);
void pkl_free(pkl_doc *doc);
/* Objects the document's slabs hold (in use or reclaimed for reuse): what its tree cost at its largest. */
size_t pkl_doc_objects(const pkl_doc *doc);

/* Folding while parsing: a caller that keeps only a compact form of some objects gives hooks the reader
 * calls as it builds them, and what a hook takes is reclaimed at once (its nodes reused for the objects
 * that follow, unless the pickle fetches them again from its memo), so a pickle of millions of small
 * objects (the `.metadata` of a checkpoint saved by thousands of ranks) never stands as a whole tree.
 * Each hook returns 1 when it took the value, 0 to leave it to the tree, < 0 on an error it set in err
 * (the parse then fails with it). Any hook may be NULL. */
typedef struct pkl_fold {
    void *user;
    /* BUILD completed o (an OBJ or REDUCE whose callable is a global): when taken, o becomes PKL_FOLDED with
     * i = *tag (fn kept) and its arguments and state are reclaimed */
    int (*built)(void *user, const pkl_obj *o, int64_t *tag, fsdp_err *err);
    /* item is being appended to list l (APPEND / APPENDS): when taken it is not added to l's items */
    int (*append)(void *user, pkl_obj *l, const pkl_obj *item, fsdp_err *err);
    /* (k, v) is being set in dict d (SETITEM / SETITEMS): when taken it is not added to d's items */
    int (*setitem)(void *user, pkl_obj *d, const pkl_obj *k, const pkl_obj *v, fsdp_err *err);
    /* 1: buf is the caller's scratch copy, which the reader may give back to the system page by page once
     * it has read past (madvise MADV_DONTNEED: anonymous memory then reads as zeros): the caller frees it
     * after the parse and reads nothing more from it */
    int consume;
} pkl_fold;
/* pkl_parse with folding hooks (fold may be NULL: pkl_parse). */
int pkl_parse_fold(const void *buf, size_t len, const char *what, const pkl_fold *fold, pkl_doc **out,
                   const pkl_obj **root, fsdp_err *err);

int pkl_is_global(const pkl_obj *o, const char *module, const char *name);
/* Whether module.name (lengths given: the names may hold any byte) is a global the reader
 * accepts (ckpt/pickle_allow.c: what PyTorch's weights_only loader allows, and DCP's
 * .metadata classes); pkl_parse refuses every other one where the pickle names it. */
int pkl_global_allowed(const char *module, size_t module_len, const char *name, size_t name_len);
/* A dict value by string key (NULL when absent or not a dict). */
const pkl_obj *pkl_dict_get(const pkl_obj *dict, const char *key);
/* The state dict of an object built with NEWOBJ/REDUCE + BUILD (NULL otherwise). */
const pkl_obj *pkl_state(const pkl_obj *o);
/* The class / callable of an OBJ / REDUCE when it is a global. */
const pkl_obj *pkl_callable(const pkl_obj *o);
/* Reads a torch.Size (REDUCE(torch.Size, ((d0, d1, ...),))) or a tuple of ints. */
int pkl_int_tuple(const pkl_obj *o, int64_t *out, int max, int *n);
/* The bytes a value holds when it is bytes: BINBYTES (protocol 3+) or _codecs.encode(text,
 * 'latin1') (how protocol 2 pickles bytes); 1 with *out (malloc'd) and *n set, else 0. */
int pkl_bytes_value(const pkl_obj *o, unsigned char **out, size_t *n);
/* Renders a value as Python-like text ("5", "0.001", "(0.9, 0.95)", "'tiny'", "{...}") into
 * a malloc'd string; long, deep or shared (memo DAG) trees are abbreviated with "...": at most
 * about 4 KiB of text from at most 4096 values, whatever the tree expands to. */
char *pkl_repr(const pkl_obj *o);
/* The same, visiting at most *budget values (each visit decrements it; at 0 the text ends
 * with "..."), for callers that bound the work of many reprs together. */
char *pkl_repr_budget(const pkl_obj *o, size_t *budget);

/* ---- writer ---------------------------------------------------------------------------- */

typedef struct pkl_w {
    unsigned char *buf;
    size_t len, cap;
    int oom;
    /* pkl_w_memo_on: each distinct string and global is written once and fetched again (BINGET), as
     * Python's pickler does for an object it meets twice: a DCP .metadata names its tensors, files, field
     * names and classes once per chunk */
    struct pkl_w_memo *memo;
} pkl_w;

void pkl_w_init(pkl_w *w);
/* Memoizes pkl_w_str and pkl_w_global from here on (0, or -1 when out of memory: w then stays without). */
int pkl_w_memo_on(pkl_w *w);
void pkl_w_free(pkl_w *w);
void pkl_w_proto(pkl_w *w, int proto);
void pkl_w_stop(pkl_w *w);
void pkl_w_mark(pkl_w *w);
void pkl_w_none(pkl_w *w);
void pkl_w_bool(pkl_w *w, int v);
void pkl_w_int(pkl_w *w, int64_t v);   /* BININT1 / BININT2 / BININT / LONG1 */
void pkl_w_float(pkl_w *w, double v);  /* BINFLOAT */
void pkl_w_str(pkl_w *w, const char *s);
void pkl_w_global(pkl_w *w, const char *module, const char *name); /* GLOBAL */
void pkl_w_empty_tuple(pkl_w *w);
void pkl_w_tuple(pkl_w *w);    /* TUPLE from the last mark */
void pkl_w_tuple_n(pkl_w *w, int n); /* TUPLE1..3 */
void pkl_w_empty_list(pkl_w *w);
void pkl_w_appends(pkl_w *w);
void pkl_w_empty_dict(pkl_w *w);
void pkl_w_setitems(pkl_w *w);
void pkl_w_reduce(pkl_w *w);
void pkl_w_newobj(pkl_w *w);
void pkl_w_build(pkl_w *w);
void pkl_w_binpersid(pkl_w *w);
/* bytes as protocol 2 writes them: _codecs.encode(<the bytes as latin-1 text>, 'latin1') */
void pkl_w_bytes(pkl_w *w, const void *b, size_t n);
/* A whole protocol-2 pickle (PROTO ... STOP) of a parsed value that PyTorch's torch.load
 * reads back as the same value (an OrderedDict stays one, BUILD states are kept; every global in
 * it passed the allow-list when it was parsed). -1 when the value holds a persistent id (a
 * storage) or more than budget nodes (a memo DAG is written expanded). */
int pkl_w_obj(pkl_w *w, const pkl_obj *o, size_t budget);
/* The same value without PROTO and STOP, inside a pickle being written. */
int pkl_w_value(pkl_w *w, const pkl_obj *o, size_t budget);
/* torch.Size((d...)) */
void pkl_w_size(pkl_w *w, const int64_t *d, int n);
/* A tuple of ints (d...) */
void pkl_w_int_tuple(pkl_w *w, const int64_t *d, int n);

#endif
