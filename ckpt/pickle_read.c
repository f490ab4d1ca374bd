/* Pickle reader (protocols 2-5): a small VM that builds a tree, never executes anything. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ckpt/pickle.h"
#include "ckpt/pickle_scan.h"

#define PKL_MAX_STACK 1000000
#define PKL_MAX_MEMO 10000000
#define PKL_SLAB_MIN 64
#define PKL_SLAB_MAX 65536 /* PKL_SLAB_MIN << 10 */

/* The objects live in slabs (each object owns its items array); strings and bytes are
 * separate blocks. Freeing walks both lists once: nothing is ever searched. */
struct pkl_doc {
    pkl_obj **slabs;
    size_t n_slabs, cap_slabs;
    size_t slab_used, slab_cap; /* objects used / room in the last slab */
    void **blocks;
    size_t n_blocks, cap_blocks;
    pkl_obj *free_objs; /* reclaimed objects (pkl_parse_fold), linked through fn */
};

typedef struct {
    pkl_doc *doc;
    const unsigned char *p, *end, *start;
    const char *what;
    pkl_obj **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nm, mcap;
    pkl_obj **memo;
    size_t nmemo, memo_cap;
    /* the ints (below 2^31) and the empty tuple made so far, each one object however often it recurs
     * (they are never changed once made: only lists, dicts and objects are): a DCP .metadata repeats
     * the same offsets and sizes for every layer */
    struct int_slot {
        int64_t i;
        pkl_obj *o;
    } *ints;
    size_t n_ints, ints_cap, made_ints;
    pkl_obj *empty_tuple;
    fsdp_err *err;
    int truncated; /* failed because the input ended first */
    const pkl_fold *fold; /* pkl_parse_fold's hooks (NULL: none) */
    pkl_gets gets;        /* the memo entries fetched again (pickle_scan.h), when reclaim */
    int reclaim;          /* what a hook takes is reused (the scan succeeded) */
    const unsigned char *kept; /* pkl_fold.consume: the input from here on is still held */
} vm;

static pkl_obj MARK_OBJ = {.kind = PKL_MARK};

/* Appends p to a growable pointer array; 0, or -1 when out of memory. */
static int grow_push(void ***arr, size_t *n, size_t *cap, void *p) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        void **na = realloc(*arr, nc * sizeof *na);
        if (!na) return -1;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return 0;
}

static void *track(pkl_doc *d, void *p) {
    if (!p) return NULL;
    if (grow_push(&d->blocks, &d->n_blocks, &d->cap_blocks, p)) {
        free(p);
        return NULL;
    }
    return p;
}

/* objects in slab i: 64, 128, ... up to 65536 */
static size_t slab_size(size_t i) { return i >= 10 ? PKL_SLAB_MAX : (size_t)PKL_SLAB_MIN << i; }

static pkl_obj *doc_obj(pkl_doc *d) {
    if (d->free_objs) {
        pkl_obj *o = d->free_objs;
        d->free_objs = o->fn;
        memset(o, 0, sizeof *o);
        return o;
    }
    if (d->slab_used == d->slab_cap) {
        size_t cap = slab_size(d->n_slabs);
        pkl_obj *s = calloc(cap, sizeof *s);
        if (!s || grow_push((void ***)&d->slabs, &d->n_slabs, &d->cap_slabs, s)) {
            free(s);
            return NULL;
        }
        d->slab_used = 0;
        d->slab_cap = cap;
    }
    return &d->slabs[d->n_slabs - 1][d->slab_used++];
}

size_t pkl_doc_objects(const pkl_doc *d) {
    size_t n = 0;
    for (size_t i = 0; d && i < d->n_slabs; i++) n += i + 1 == d->n_slabs ? d->slab_used : slab_size(i);
    return n;
}

void pkl_free(pkl_doc *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_slabs; i++) {
        size_t used = i + 1 == d->n_slabs ? d->slab_used : slab_size(i);
        for (size_t k = 0; k < used; k++) free(d->slabs[i][k].items);
        free(d->slabs[i]);
    }
    free(d->slabs);
    for (size_t i = 0; i < d->n_blocks; i++) free(d->blocks[i]);
    free(d->blocks);
    free(d);
}

static int fail(vm *v, const char *fmt, const char *detail) {
    char m[512];
    snprintf(m, sizeof m, fmt, detail ? detail : "");
    return fsdp_err_set(v->err, FSDP_E_FORMAT, "%s: pickle: %s (at byte %zu)", v->what, m,
                        (size_t)(v->p - v->start));
}

static pkl_obj *new_obj(vm *v, pkl_kind k) {
    pkl_obj *o = doc_obj(v->doc);
    if (o) o->kind = k;
    return o;
}

/* o and what only it reaches onto the free list (nothing when reclaiming is off or o is shared). */
static void reclaim(vm *v, pkl_obj *o) {
    if (!v->reclaim || !o || o->pinned || o == &MARK_OBJ) return;
    if (o->kind == PKL_TUPLE || o->kind == PKL_LIST || o->kind == PKL_DICT) {
        size_t n = o->kind == PKL_DICT ? 2 * o->n : o->n;
        for (size_t k = 0; k < n; k++) reclaim(v, o->items[k]);
    }
    reclaim(v, o->args);
    reclaim(v, o->state);
    reclaim(v, o->fn);
    free(o->items);
    memset(o, 0, sizeof *o);
    o->fn = v->doc->free_objs;
    v->doc->free_objs = o;
}

#define PKL_INTS_AFTER 256      /* ints made before the table starts (small pickles never need it) */
#define PKL_INTS_MAX (1u << 20) /* distinct ints the table holds at most (then new ones are made anew) */

static size_t int_hash(int64_t i, size_t cap) { return (size_t)(((uint64_t)i * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1); }

/* doubles the table (a power of two), keeping its entries; 0, or -1 when out of memory */
static int ints_grow(vm *v) {
    size_t cap = v->ints_cap ? v->ints_cap * 2 : 1024;
    struct int_slot *t = calloc(cap, sizeof *t);
    if (!t) return -1;
    for (size_t k = 0; k < v->ints_cap; k++) {
        if (!v->ints[k].o) continue;
        size_t h = int_hash(v->ints[k].i, cap);
        while (t[h].o) h = (h + 1) & (cap - 1);
        t[h] = v->ints[k];
    }
    free(v->ints);
    v->ints = t;
    v->ints_cap = cap;
    return 0;
}

/* The int object of value i: the one made before when the table has it. */
static pkl_obj *int_obj(vm *v, int64_t i) {
    if (++v->made_ints > PKL_INTS_AFTER && i >= INT32_MIN && i <= INT32_MAX) {
        if (v->n_ints * 2 >= v->ints_cap && v->n_ints < PKL_INTS_MAX) ints_grow(v);
        if (v->ints_cap) {
            size_t h = int_hash(i, v->ints_cap);
            while (v->ints[h].o && v->ints[h].i != i) h = (h + 1) & (v->ints_cap - 1);
            if (v->ints[h].o) return v->ints[h].o;
            if (v->n_ints * 2 < v->ints_cap) {
                pkl_obj *o = new_obj(v, PKL_INT);
                if (o) o->i = i, o->pinned = 1, v->ints[h].i = i, v->ints[h].o = o, v->n_ints++;
                return o;
            }
        }
    }
    pkl_obj *o = new_obj(v, PKL_INT);
    if (o) o->i = i;
    return o;
}

static int push(vm *v, pkl_obj *o) {
    if (!o) return fsdp_err_set(v->err, FSDP_E_NOMEM, "%s: pickle: out of memory", v->what);
    if (v->sp == v->scap) {
        if (v->scap >= PKL_MAX_STACK) return fail(v, "stack deeper than the limit", NULL);
        size_t cap = v->scap ? v->scap * 2 : 64;
        pkl_obj **ns = realloc(v->stack, cap * sizeof *ns);
        if (!ns) return fsdp_err_set(v->err, FSDP_E_NOMEM, "%s: pickle: out of memory", v->what);
        v->stack = ns;
        v->scap = cap;
    }
    v->stack[v->sp++] = o;
    return 0;
}

static pkl_obj *pop(vm *v) {
    if (v->sp == 0 || (v->nm && v->sp <= v->marks[v->nm - 1]) || v->stack[v->sp - 1] == &MARK_OBJ) return NULL;
    return v->stack[--v->sp];
}

static pkl_obj *top(vm *v) {
    if (v->sp == 0 || (v->nm && v->sp <= v->marks[v->nm - 1])) return NULL;
    return v->stack[v->sp - 1];
}

static int need(vm *v, size_t n) {
    if ((size_t)(v->end - v->p) < n) {
        v->truncated = 1;
        return fail(v, "truncated input%s", NULL);
    }
    return 0;
}

static uint64_t rd_le(const unsigned char *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

/* Grows a tuple/list (per = 1) or dict (per = 2) items array to hold one more. */
static int reserve_one(vm *v, pkl_obj *c, size_t per) {
    if (c->n < c->cap) return 0;
    size_t cap = c->cap ? c->cap * 2 : 4;
    if (cap > SIZE_MAX / (per * sizeof *c->items))
        return fsdp_err_set(v->err, FSDP_E_NOMEM, "%s: pickle: out of memory", v->what);
    pkl_obj **ni = realloc(c->items, cap * per * sizeof *ni);
    if (!ni) return fsdp_err_set(v->err, FSDP_E_NOMEM, "%s: pickle: out of memory", v->what);
    c->items = ni;
    c->cap = cap;
    return 0;
}

static int add_item(vm *v, pkl_obj *c, pkl_obj *it) {
    int rc = reserve_one(v, c, 1);
    if (rc) return rc;
    c->items[c->n++] = it;
    if (it->depth + 1 > c->depth) c->depth = it->depth + 1;
    if (c->depth > PKL_MAX_DEPTH) return fail(v, "nesting deeper than the limit%s", NULL);
    return 0;
}

static int dict_set(vm *v, pkl_obj *d, pkl_obj *k, pkl_obj *val) {
    int rc = reserve_one(v, d, 2);
    if (rc) return rc;
    d->items[2 * d->n] = k;
    d->items[2 * d->n + 1] = val;
    d->n++;
    int dd = (k->depth > val->depth ? k->depth : val->depth) + 1;
    if (dd > d->depth) d->depth = dd;
    if (d->depth > PKL_MAX_DEPTH) return fail(v, "nesting deeper than the limit%s", NULL);
    return 0;
}

/* Items above the last mark, removed from the stack; *n their count. */
static int pop_mark(vm *v, pkl_obj ***items, size_t *n) {
    if (v->nm == 0) return fail(v, "no MARK for this opcode%s", NULL);
    size_t m = v->marks[--v->nm];
    *items = v->stack ? v->stack + m : NULL;
    *n = v->sp - m;
    v->sp = m;
    return 0;
}

static pkl_obj *mk_str(vm *v, pkl_kind k, const unsigned char *s, size_t n) {
    pkl_obj *o = new_obj(v, k);
    if (!o) return NULL;
    char *c = track(v->doc, malloc(n + 1));
    if (!c) return NULL;
    memcpy(c, s, n);
    c[n] = '\0';
    o->s = c;
    o->len = n;
    return o;
}

/* A global outside the allow-list (pickle_allow.c) is an error naming it. */
static int check_global(vm *v, const unsigned char *mod, size_t ml, const unsigned char *name, size_t nl) {
    if (pkl_global_allowed((const char *)mod, ml, (const char *)name, nl)) return 0;
    char g[200];
    snprintf(g, sizeof g, "%.*s.%.*s", (int)(ml > 96 ? 96 : ml), (const char *)mod, (int)(nl > 96 ? 96 : nl),
             (const char *)name);
    for (char *c = g; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c == 0x7f) *c = '?';
    return fail(v,
                "global %s is not allowed (not a tensor, storage or container PyTorch's weights_only loader "
                "accepts)",
                g);
}

static int as_dict_target(pkl_obj *o) {
    if (o->kind == PKL_DICT) return 1;
    /* OrderedDict() and defaultdict-like REDUCE results receive SETITEMS too */
    if (o->kind == PKL_REDUCE && o->fn && o->fn->kind == PKL_GLOBAL && !strcmp(o->fn->s, "collections") &&
        !strcmp(o->fn->name, "OrderedDict")) {
        o->kind = PKL_DICT;
        return 1;
    }
    return 0;
}

/* ---- the memo when reclaiming: only the entries the scan saw fetched, in a dense array ---- */

/* An entry never fetched is not kept (its object may be reclaimed); a writer's indices are still bounded
 * by the input (each entry costs input bytes), not by PKL_MAX_MEMO: torch's own 4096-rank .metadata
 * memoizes over 10M objects, of which it fetches a small part. */
static int memo_put_dense(vm *v, size_t idx, pkl_obj *o) {
    if (idx > (size_t)(v->end - v->start)) {
        char d[32];
        snprintf(d, sizeof d, "%zu", idx);
        return fail(v, "memo index %s beyond the limit (the input's size)", d);
    }
    if (idx >= v->nmemo) v->nmemo = idx + 1;
    if (!pkl_gets_has(&v->gets, idx)) return 0;
    if (!v->memo) {
        v->memo = calloc(v->gets.fetched ? v->gets.fetched : 1, sizeof *v->memo);
        if (!v->memo) return fsdp_err_set(v->err, FSDP_E_NOMEM, "%s: pickle: out of memory", v->what);
    }
    v->memo[pkl_gets_slot(&v->gets, idx)] = o;
    o->pinned = 1;
    return 0;
}

static pkl_obj *memo_get_dense(vm *v, size_t idx) {
    if (idx >= v->nmemo || !v->memo || !pkl_gets_has(&v->gets, idx)) return NULL;
    return v->memo[pkl_gets_slot(&v->gets, idx)];
}

/* ---- folding hooks (pkl_parse_fold) ---- */

static int hook_failed(vm *v, int rc) {
    if (rc >= 0) return 0;
    return v->err && v->err->code ? v->err->code : fsdp_err_set(v->err, FSDP_E_FORMAT, "%s: pickle: a fold hook failed", v->what);
}

static int fold_append(vm *v, pkl_obj *l, pkl_obj *it) {
    if (v->fold && v->fold->append && it != &MARK_OBJ) {
        int took = v->fold->append(v->fold->user, l, it, v->err);
        if (took < 0) return hook_failed(v, took);
        if (took) {
            reclaim(v, it);
            return 0;
        }
    }
    return add_item(v, l, it);
}

static int fold_set(vm *v, pkl_obj *d, pkl_obj *k, pkl_obj *val) {
    if (v->fold && v->fold->setitem && k != &MARK_OBJ && val != &MARK_OBJ) {
        int took = v->fold->setitem(v->fold->user, d, k, val, v->err);
        if (took < 0) return hook_failed(v, took);
        if (took) {
            reclaim(v, k);
            reclaim(v, val);
            return 0;
        }
    }
    return dict_set(v, d, k, val);
}

static int fold_built(vm *v, pkl_obj *o) {
    if (!v->fold || !v->fold->built || !pkl_callable(o)) return 0;
    int64_t tag = 0;
    int took = v->fold->built(v->fold->user, o, &tag, v->err);
    if (took < 0) return hook_failed(v, took);
    if (!took) return 0;
    reclaim(v, o->args);
    reclaim(v, o->state);
    o->args = o->state = NULL;
    o->kind = PKL_FOLDED;
    o->i = tag;
    o->depth = 1;
    return 0;
}

#define PKL_CONSUME_STEP ((size_t)32 << 20)

/* pkl_fold.consume: the whole pages of input the VM has passed given back (it never reads behind itself). */
static void consume(vm *v) {
    uintptr_t pg = 4096, from = ((uintptr_t)v->kept + pg - 1) & ~(pg - 1), to = (uintptr_t)v->p & ~(pg - 1);
    if (to > from) madvise((void *)from, to - from, MADV_DONTNEED);
    v->kept = v->p;
}

static int run(vm *v, const pkl_obj **root) {
    while (v->p < v->end) {
        if (v->kept && (size_t)(v->p - v->kept) >= PKL_CONSUME_STEP) consume(v);
        unsigned char op = *v->p++;
        int rc = 0;
        switch (op) {
        case 0x80: /* PROTO */
            if ((rc = need(v, 1))) return rc;
            if (v->p[0] < 2 || v->p[0] > 5) return fail(v, "unsupported protocol%s", NULL);
            v->p++;
            break;
        case 0x95: /* FRAME */
            if ((rc = need(v, 8))) return rc;
            v->p += 8;
            break;
        case '.': { /* STOP */
            pkl_obj *o = pop(v);
            if (!o) return fail(v, "STOP with an empty stack%s", NULL);
            *root = o;
            return 0;
        }
        case '(': /* MARK */
            if (v->nm == v->mcap) {
                size_t cap = v->mcap ? v->mcap * 2 : 16;
                if (cap > PKL_MAX_STACK) return fail(v, "too many MARKs%s", NULL);
                size_t *nmk = realloc(v->marks, cap * sizeof *nmk);
                if (!nmk) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
                v->marks = nmk;
                v->mcap = cap;
            }
            v->marks[v->nm++] = v->sp;
            break;
        case 'N': rc = push(v, new_obj(v, PKL_NONE)); break;
        case 0x88:
        case 0x89: {
            pkl_obj *o = new_obj(v, PKL_BOOL);
            if (o) o->i = op == 0x88;
            rc = push(v, o);
            break;
        }
        case 'J':
        case 'K':
        case 'M': {
            int n = op == 'J' ? 4 : op == 'K' ? 1 : 2;
            if ((rc = need(v, (size_t)n))) return rc;
            uint64_t x = rd_le(v->p, n);
            pkl_obj *o = int_obj(v, op == 'J' ? (int64_t)(int32_t)(uint32_t)x : (int64_t)x);
            v->p += n;
            rc = push(v, o);
            break;
        }
        case 0x8a:
        case 0x8b: { /* LONG1 / LONG4 */
            int hl = op == 0x8a ? 1 : 4;
            if ((rc = need(v, (size_t)hl))) return rc;
            uint64_t n = rd_le(v->p, hl);
            v->p += hl;
            if (n > (uint64_t)(v->end - v->p)) return fail(v, "truncated LONG%s", NULL);
            pkl_obj *o;
            if (n <= 8) {
                o = new_obj(v, PKL_INT);
                if (o) {
                    uint64_t x = rd_le(v->p, (int)n);
                    if (n > 0 && n < 8 && (v->p[n - 1] & 0x80)) x |= ~(uint64_t)0 << (8 * n); /* sign-extend */
                    o->i = (int64_t)x;
                }
            } else {
                o = mk_str(v, PKL_BIGINT, v->p, (size_t)n);
            }
            v->p += n;
            rc = push(v, o);
            break;
        }
        case 'G': { /* BINFLOAT, big-endian */
            if ((rc = need(v, 8))) return rc;
            uint64_t x = 0;
            for (int i = 0; i < 8; i++) x = (x << 8) | v->p[i];
            v->p += 8;
            pkl_obj *o = new_obj(v, PKL_FLOAT);
            if (o) memcpy(&o->f, &x, 8);
            rc = push(v, o);
            break;
        }
        case 0x8c:
        case 'X':
        case 0x8d:
        case 'C':
        case 'B':
        case 0x8e:
        case 'U':
        case 'T':
        case 0x96: { /* strings and bytes */
            int hl = (op == 0x8c || op == 'C' || op == 'U') ? 1 : (op == 'X' || op == 'B' || op == 'T') ? 4 : 8;
            if ((rc = need(v, (size_t)hl))) return rc;
            uint64_t n = rd_le(v->p, hl);
            v->p += hl;
            if (n > (uint64_t)(v->end - v->p)) return fail(v, "truncated string%s", NULL);
            pkl_kind k = (op == 0x8c || op == 'X' || op == 0x8d || op == 'U' || op == 'T') ? PKL_STR : PKL_BYTES;
            rc = push(v, mk_str(v, k, v->p, (size_t)n));
            v->p += n;
            break;
        }
        case ')':
            if (!v->empty_tuple && (v->empty_tuple = new_obj(v, PKL_TUPLE))) v->empty_tuple->pinned = 1;
            rc = push(v, v->empty_tuple);
            break;
        case ']': rc = push(v, new_obj(v, PKL_LIST)); break;
        case '}': rc = push(v, new_obj(v, PKL_DICT)); break;
        case 0x8f: rc = push(v, new_obj(v, PKL_LIST)); break; /* EMPTY_SET as a list */
        case 't':
        case 'l':
        case 0x91: { /* TUPLE, LIST, FROZENSET from mark */
            pkl_obj **items = NULL;
            size_t n = 0;
            if ((rc = pop_mark(v, &items, &n))) return rc;
            pkl_obj *o = new_obj(v, op == 't' ? PKL_TUPLE : PKL_LIST);
            if (!o) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            pkl_obj **copy = n ? malloc(n * sizeof *copy) : NULL; /* owned by o */
            if (n && !copy) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            o->items = copy;
            if (n) memcpy(copy, items, n * sizeof *copy);
            for (size_t i = 0; i < n; i++) {
                if (copy[i] == &MARK_OBJ) return fail(v, "MARK inside a tuple%s", NULL);
                if (copy[i]->depth + 1 > o->depth) o->depth = copy[i]->depth + 1;
            }
            if (o->depth > PKL_MAX_DEPTH) return fail(v, "nesting deeper than the limit%s", NULL);
            /* items array is owned by the doc: mark it as not growable */
            o->items = copy;
            o->n = o->cap = n;
            if (op != 't' && n) {
                /* lists may grow later: give them their own growable array */
                o->cap = n;
            }
            rc = push(v, o);
            break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
            size_t n = (size_t)(op - 0x84);
            if (v->sp < n || (v->nm && v->sp - n < v->marks[v->nm - 1])) return fail(v, "stack underflow in TUPLE%s", "N");
            pkl_obj *o = new_obj(v, PKL_TUPLE);
            if (!o) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            pkl_obj **copy = o->items = malloc(n * sizeof *copy); /* owned by o */
            if (!copy) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            memcpy(copy, v->stack + v->sp - n, n * sizeof *copy);
            v->sp -= n;
            for (size_t i = 0; i < n; i++)
                if (copy[i]->depth + 1 > o->depth) o->depth = copy[i]->depth + 1;
            if (o->depth > PKL_MAX_DEPTH) return fail(v, "nesting deeper than the limit%s", NULL);
            o->items = copy;
            o->n = o->cap = n;
            rc = push(v, o);
            break;
        }
        case 'a': { /* APPEND */
            pkl_obj *it = pop(v), *l = top(v);
            if (!it || !l || l->kind != PKL_LIST) return fail(v, "APPEND to a non-list%s", NULL);
            rc = fold_append(v, l, it);
            break;
        }
        case 'e':
        case 0x90: { /* APPENDS / ADDITEMS */
            pkl_obj **items = NULL;
            size_t n = 0;
            if ((rc = pop_mark(v, &items, &n))) return rc;
            pkl_obj *l = top(v);
            if (!l || l->kind != PKL_LIST) return fail(v, "APPENDS to a non-list%s", NULL);
            pkl_obj **copy = n ? malloc(n * sizeof *copy) : NULL;
            if (n && !copy) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            if (n) memcpy(copy, items, n * sizeof *copy);
            for (size_t i = 0; i < n && !rc; i++) rc = fold_append(v, l, copy[i]);
            free(copy);
            break;
        }
        case 's': { /* SETITEM */
            pkl_obj *val = pop(v), *k = pop(v), *d = top(v);
            if (!val || !k || !d || !as_dict_target(d)) return fail(v, "SETITEM on a non-dict%s", NULL);
            rc = fold_set(v, d, k, val);
            break;
        }
        case 'u':
        case 'd': { /* SETITEMS / DICT */
            pkl_obj **items = NULL;
            size_t n = 0;
            if ((rc = pop_mark(v, &items, &n))) return rc;
            if (n % 2) return fail(v, "odd number of items for a dict%s", NULL);
            pkl_obj **copy = n ? malloc(n * sizeof *copy) : NULL;
            if (n && !copy) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            if (n) memcpy(copy, items, n * sizeof *copy);
            pkl_obj *d;
            if (op == 'd') {
                d = new_obj(v, PKL_DICT);
                rc = push(v, d);
            } else {
                d = top(v);
                if (!d || !as_dict_target(d)) rc = fail(v, "SETITEMS on a non-dict%s", NULL);
            }
            for (size_t i = 0; i + 1 < n && !rc; i += 2) rc = fold_set(v, d, copy[i], copy[i + 1]);
            free(copy);
            break;
        }
        case 'c': { /* GLOBAL module\nname\n */
            const unsigned char *nl1 = memchr(v->p, '\n', (size_t)(v->end - v->p));
            if (!nl1) return fail(v, "truncated GLOBAL%s", NULL);
            const unsigned char *nl2 = memchr(nl1 + 1, '\n', (size_t)(v->end - nl1 - 1));
            if (!nl2) return fail(v, "truncated GLOBAL%s", NULL);
            v->p--; /* the error points at this opcode */
            if ((rc = check_global(v, v->p + 1, (size_t)(nl1 - v->p - 1), nl1 + 1, (size_t)(nl2 - nl1 - 1)))) return rc;
            v->p++;
            pkl_obj *o = mk_str(v, PKL_GLOBAL, v->p, (size_t)(nl1 - v->p));
            pkl_obj *nm = mk_str(v, PKL_STR, nl1 + 1, (size_t)(nl2 - nl1 - 1));
            if (!o || !nm) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            o->name = nm->s;
            v->p = nl2 + 1;
            rc = push(v, o);
            break;
        }
        case 0x93: { /* STACK_GLOBAL */
            pkl_obj *nm = pop(v), *mod = pop(v);
            if (!nm || !mod || nm->kind != PKL_STR || mod->kind != PKL_STR)
                return fail(v, "STACK_GLOBAL needs two strings%s", NULL);
            v->p--; /* the error points at this opcode */
            if ((rc = check_global(v, (const unsigned char *)mod->s, mod->len, (const unsigned char *)nm->s, nm->len)))
                return rc;
            v->p++;
            pkl_obj *o = new_obj(v, PKL_GLOBAL);
            if (!o) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            o->s = mod->s;
            o->len = mod->len;
            o->name = nm->s;
            rc = push(v, o);
            break;
        }
        case 'R':
        case 0x81: { /* REDUCE / NEWOBJ */
            pkl_obj *args = pop(v), *fn = pop(v);
            if (!args || !fn || args->kind != PKL_TUPLE)
                return fail(v, op == 'R' ? "REDUCE needs a callable and an argument tuple%s"
                                         : "NEWOBJ needs a class and an argument tuple%s",
                            NULL);
            pkl_obj *o = new_obj(v, op == 'R' ? PKL_REDUCE : PKL_OBJ);
            if (!o) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            o->fn = fn;
            o->args = args;
            o->depth = (fn->depth > args->depth ? fn->depth : args->depth) + 1;
            if (o->depth > PKL_MAX_DEPTH) return fail(v, "nesting deeper than the limit%s", NULL);
            rc = push(v, o);
            break;
        }
        case 0x92: { /* NEWOBJ_EX cls args kwargs */
            pkl_obj *kw = pop(v), *args = pop(v), *cls = pop(v);
            if (!kw || !args || !cls || args->kind != PKL_TUPLE) return fail(v, "bad NEWOBJ_EX%s", NULL);
            pkl_obj *o = new_obj(v, PKL_OBJ);
            if (!o) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            o->fn = cls;
            o->args = args;
            o->depth = args->depth + 1;
            rc = push(v, o);
            break;
        }
        case 'b': { /* BUILD */
            pkl_obj *st = pop(v), *o = top(v);
            if (!st || !o) return fail(v, "BUILD with an empty stack%s", NULL);
            /* a dict too: an OrderedDict with attributes (torch's state_dict() carries
             * `_metadata`) is REDUCE + SETITEMS (which made it a dict) + BUILD of its __dict__ */
            if (o->kind != PKL_OBJ && o->kind != PKL_REDUCE && o->kind != PKL_GLOBAL &&
                !(o->kind == PKL_DICT && o->fn))
                return fail(v, "BUILD on a value that is not an object%s", NULL);
            o->state = st;
            if (st->depth + 1 > o->depth) o->depth = st->depth + 1;
            if (o->depth > PKL_MAX_DEPTH) return fail(v, "nesting deeper than the limit%s", NULL);
            rc = fold_built(v, o);
            break;
        }
        case 'Q': { /* BINPERSID */
            pkl_obj *pid = pop(v);
            if (!pid) return fail(v, "BINPERSID with an empty stack%s", NULL);
            pkl_obj *o = new_obj(v, PKL_PERSID);
            if (!o) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
            o->args = pid;
            o->depth = pid->depth + 1;
            rc = push(v, o);
            break;
        }
        case 0x94:
        case 'q':
        case 'r': { /* MEMOIZE / BINPUT / LONG_BINPUT */
            size_t idx;
            if (op == 0x94) {
                idx = v->nmemo;
            } else {
                int n = op == 'q' ? 1 : 4;
                if ((rc = need(v, (size_t)n))) return rc;
                idx = (size_t)rd_le(v->p, n);
                v->p += n;
            }
            pkl_obj *o = top(v);
            if (!o) return fail(v, "memo store with an empty stack%s", NULL);
            if (v->reclaim) {
                rc = memo_put_dense(v, idx, o);
                break;
            }
            /* a writer numbers its memo entries from 0; each costs at least two bytes of input */
            if (idx >= PKL_MAX_MEMO || idx > (size_t)(v->end - v->start)) {
                char d[32];
                snprintf(d, sizeof d, "%zu", idx);
                return fail(v, "memo index %s beyond the limit (the input's size)", d);
            }
            if (idx >= v->memo_cap) {
                size_t cap = v->memo_cap ? v->memo_cap : 64;
                while (cap <= idx) cap *= 2;
                pkl_obj **nmemo = realloc(v->memo, cap * sizeof *nmemo);
                if (!nmemo) return fsdp_err_set(v->err, FSDP_E_NOMEM, "out of memory");
                v->memo = nmemo;
                v->memo_cap = cap;
            }
            for (size_t i = v->nmemo; i <= idx; i++) v->memo[i] = NULL;
            if (idx >= v->nmemo) v->nmemo = idx + 1;
            if (!v->reclaim) v->memo[idx] = o;
            else if (pkl_gets_has(&v->gets, idx)) v->memo[idx] = o, o->pinned = 1;
            else v->memo[idx] = NULL; /* never fetched (the scan): o may be reclaimed */
            break;
        }
        case 'h':
        case 'j': { /* BINGET / LONG_BINGET */
            int n = op == 'h' ? 1 : 4;
            if ((rc = need(v, (size_t)n))) return rc;
            size_t idx = (size_t)rd_le(v->p, n);
            v->p += n;
            pkl_obj *got = v->reclaim ? memo_get_dense(v, idx) : idx < v->nmemo ? v->memo[idx] : NULL;
            if (!got) {
                char d[32];
                snprintf(d, sizeof d, "%zu", idx);
                return fail(v, "memo reference %s out of range", d);
            }
            rc = push(v, got);
            break;
        }
        case '0': /* POP */
            if (v->sp && v->stack[v->sp - 1] != &MARK_OBJ && !(v->nm && v->sp <= v->marks[v->nm - 1])) v->sp--;
            else if (v->nm && v->marks[v->nm - 1] == v->sp) v->nm--; /* POP of a MARK */
            else return fail(v, "POP of an empty stack%s", NULL);
            break;
        case '1': { /* POP_MARK */
            pkl_obj **items = NULL;
            size_t n = 0;
            if ((rc = pop_mark(v, &items, &n))) return rc;
            break;
        }
        case '2': { /* DUP */
            pkl_obj *o = top(v);
            if (!o) return fail(v, "DUP of an empty stack%s", NULL);
            o->pinned = 1;
            rc = push(v, o);
            break;
        }
        default: {
            char d[64];
            snprintf(d, sizeof d, "0x%02x", op);
            v->p--;
            return fail(v, "unknown or unsupported opcode %s", d);
        }
        }
        if (rc) return rc;
    }
    v->truncated = 1;
    return fail(v, "truncated input: no STOP opcode%s", NULL);
}

static int parse(const void *buf, size_t len, const char *what, const pkl_fold *fold, pkl_doc **out,
                 const pkl_obj **root, size_t *used, int *truncated, fsdp_err *err);

int pkl_parse(const void *buf, size_t len, const char *what, pkl_doc **out, const pkl_obj **root, fsdp_err *err) {
    size_t used;
    return parse(buf, len, what, NULL, out, root, &used, NULL, err);
}

int pkl_parse_fold(const void *buf, size_t len, const char *what, const pkl_fold *fold, pkl_doc **out,
                   const pkl_obj **root, fsdp_err *err) {
    size_t used;
    return parse(buf, len, what, fold, out, root, &used, NULL, err);
}

int pkl_parse_prefix(const void *buf, size_t len, const char *what, pkl_doc **out, const pkl_obj **root, size_t *used,
                     int *truncated, fsdp_err *err) {
    return parse(buf, len, what, NULL, out, root, used, truncated, err);
}

static int parse(const void *buf, size_t len, const char *what, const pkl_fold *fold, pkl_doc **out,
                 const pkl_obj **root, size_t *used, int *truncated, fsdp_err *err) {
    *out = NULL;
    *used = 0;
    if (truncated) *truncated = 0;
    *root = NULL;
    pkl_doc *d = calloc(1, sizeof *d);
    if (!d) return fsdp_err_set(err, FSDP_E_NOMEM, "out of memory");
    vm v = {0};
    v.doc = d;
    v.p = v.start = buf;
    v.end = v.p + len;
    v.what = what ? what : "pickle";
    v.err = err;
    v.fold = fold;
    /* reclaiming needs to know which objects the pickle fetches again */
    v.reclaim = fold && !pkl_scan_gets(buf, len, &v.gets);
    if (fold && fold->consume) v.kept = v.start;
    int rc = run(&v, root);
    pkl_gets_free(&v.gets);
    *used = (size_t)(v.p - v.start);
    if (rc && truncated) *truncated = v.truncated;
    free(v.stack);
    free(v.marks);
    free(v.memo);
    free(v.ints);
    if (rc) {
        pkl_free(d);
        *root = NULL;
        return rc;
    }
    *out = d;
    return 0;
}

int pkl_is_global(const pkl_obj *o, const char *module, const char *name) {
    return o && o->kind == PKL_GLOBAL && !strcmp(o->s, module) && !strcmp(o->name, name);
}

const pkl_obj *pkl_dict_get(const pkl_obj *d, const char *key) {
    if (!d || d->kind != PKL_DICT) return NULL;
    for (size_t i = 0; i < d->n; i++) {
        const pkl_obj *k = d->items[2 * i];
        if (k->kind == PKL_STR && !strcmp(k->s, key)) return d->items[2 * i + 1];
    }
    return NULL;
}

const pkl_obj *pkl_state(const pkl_obj *o) { return o && (o->kind == PKL_OBJ || o->kind == PKL_REDUCE) ? o->state : NULL; }

const pkl_obj *pkl_callable(const pkl_obj *o) {
    return o && (o->kind == PKL_OBJ || o->kind == PKL_REDUCE) && o->fn && o->fn->kind == PKL_GLOBAL ? o->fn : NULL;
}

int pkl_int_tuple(const pkl_obj *o, int64_t *out, int max, int *n) {
    if (o && o->kind == PKL_REDUCE && pkl_is_global(o->fn, "torch", "Size") && o->args && o->args->n == 1)
        o = o->args->items[0];
    if (!o || (o->kind != PKL_TUPLE && o->kind != PKL_LIST) || (int)o->n > max) return -1;
    for (size_t i = 0; i < o->n; i++) {
        if (o->items[i]->kind != PKL_INT) return -1;
        out[i] = o->items[i]->i;
    }
    *n = (int)o->n;
    return 0;
}

/* pkl_repr's bounds: the text stops after REPR_MAX_CHARS characters, REPR_MAX_NODES values
 * or REPR_MAX_DEPTH levels ("..."): a memo DAG (a value shared at every level) is never
 * expanded further than that. */
#define REPR_MAX_CHARS 4096
#define REPR_MAX_NODES 4096
#define REPR_MAX_DEPTH 32

typedef struct {
    char *b;
    size_t len, cap;
    size_t nodes;
    size_t *budget; /* the caller's node budget, or NULL */
    int bad, stop;
} rbuf;

static void rput(rbuf *r, const char *s) {
    size_t n = strlen(s);
    if (r->bad) return;
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        while (cap < r->len + n + 1) cap *= 2;
        char *nb = realloc(r->b, cap);
        if (!nb) {
            r->bad = 1;
            return;
        }
        r->b = nb;
        r->cap = cap;
    }
    memcpy(r->b + r->len, s, n + 1);
    r->len += n;
}

/* A string's text, cut where the whole text would pass REPR_MAX_CHARS. */
static void rput_str(rbuf *r, const char *s, size_t n) {
    size_t room = r->len < REPR_MAX_CHARS ? REPR_MAX_CHARS - r->len : 0;
    if (n <= room) {
        rput(r, s);
        return;
    }
    char *c = malloc(room + 1);
    if (!c) {
        r->bad = 1;
        return;
    }
    memcpy(c, s, room);
    c[room] = '\0';
    rput(r, c);
    free(c);
    rput(r, "...");
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (!k || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) || (c == 0xf0 && s[1] < 0x90) ||
        (c == 0xf4 && s[1] >= 0x90))
        return 0; /* overlong, surrogate or past U+10FFFF */
    return k;
}

/* n bytes quoted as Python writes them: 'text' for a str (valid UTF-8 kept), b'..' for bytes;
 * quotes, backslashes, control bytes and (bytes, or a str's invalid UTF-8) bytes >= 0x80 are
 * escaped, so every byte is visible (a NUL does not end the text). Cut with "..." where the
 * whole text would pass REPR_MAX_CHARS. */
static void rput_quoted(rbuf *r, const unsigned char *s, size_t n, int bytes) {
    rput(r, bytes ? "b'" : "'");
    char t[8];
    for (size_t i = 0; i < n && !r->bad; i++) {
        if (r->len > REPR_MAX_CHARS) {
            rput(r, "...");
            break;
        }
        unsigned c = s[i];
        size_t k = !bytes && c >= 0x80 ? utf8_len(s + i, n - i) : 0;
        if (k) {
            memcpy(t, s + i, k);
            t[k] = '\0';
            i += k - 1;
        } else if (c == '\'' || c == '\\') {
            t[0] = '\\', t[1] = (char)c, t[2] = '\0';
        } else if (c == '\n' || c == '\r' || c == '\t') {
            t[0] = '\\', t[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't', t[2] = '\0';
        } else if (c < 0x20 || c >= 0x7f) {
            snprintf(t, sizeof t, "\\x%02x", c);
        } else {
            t[0] = (char)c, t[1] = '\0';
        }
        rput(r, t);
    }
    rput(r, "'");
}

/* The bytes of a protocol-2 pickle of bytes: _codecs.encode(text, 'latin1') with every code point
 * of the UTF-8 text < 256; 0 when o is not one. *out (malloc'd) holds *n bytes. */
static int latin1_bytes(const pkl_obj *o, unsigned char **out, size_t *n) {
    if (!o || o->kind != PKL_REDUCE || !pkl_is_global(o->fn, "_codecs", "encode") || !o->args || o->args->n != 2 ||
        o->args->items[0]->kind != PKL_STR || o->args->items[1]->kind != PKL_STR ||
        (strcmp(o->args->items[1]->s, "latin1") && strcmp(o->args->items[1]->s, "latin-1")))
        return 0;
    const unsigned char *s = (const unsigned char *)o->args->items[0]->s;
    size_t len = o->args->items[0]->len, k = 0;
    unsigned char *b = malloc(len + 1);
    if (!b) return 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < 0x80) b[k++] = s[i];
        else if ((s[i] == 0xc2 || s[i] == 0xc3) && i + 1 < len && (s[i + 1] & 0xc0) == 0x80)
            b[k++] = (unsigned char)(((s[i] & 3) << 6) | (s[i + 1] & 0x3f)), i++;
        else {
            free(b);
            return 0;
        }
    }
    *out = b;
    *n = k;
    return 1;
}

int pkl_bytes_value(const pkl_obj *o, unsigned char **out, size_t *n) {
    if (o && o->kind == PKL_BYTES) {
        unsigned char *b = malloc(o->len + 1);
        if (!b) return 0;
        memcpy(b, o->s, o->len);
        *out = b;
        *n = o->len;
        return 1;
    }
    return latin1_bytes(o, out, n);
}

static void repr(rbuf *r, const pkl_obj *o, int depth) {
    char t[64];
    if (r->stop) return;
    if (r->len > REPR_MAX_CHARS || ++r->nodes > REPR_MAX_NODES || (r->budget && *r->budget == 0)) {
        rput(r, "...");
        r->stop = 1;
        return;
    }
    if (r->budget) --*r->budget;
    if (depth > REPR_MAX_DEPTH) {
        rput(r, "...");
        return;
    }
    switch (o->kind) {
    case PKL_NONE: rput(r, "None"); break;
    case PKL_BOOL: rput(r, o->i ? "True" : "False"); break;
    case PKL_INT: snprintf(t, sizeof t, "%lld", (long long)o->i); rput(r, t); break;
    case PKL_BIGINT: rput(r, "<big int>"); break;
    case PKL_FLOAT: snprintf(t, sizeof t, "%.17g", o->f); rput(r, t); break;
    case PKL_STR: rput_quoted(r, (const unsigned char *)o->s, o->len, 0); break;
    case PKL_BYTES: rput_quoted(r, (const unsigned char *)o->s, o->len, 1); break;
    case PKL_TUPLE:
    case PKL_LIST:
        rput(r, o->kind == PKL_TUPLE ? "(" : "[");
        for (size_t i = 0; i < o->n && !r->stop; i++) {
            if (i) rput(r, ", ");
            repr(r, o->items[i], depth + 1);
        }
        if (o->kind == PKL_TUPLE && o->n == 1) rput(r, ",");
        rput(r, o->kind == PKL_TUPLE ? ")" : "]");
        break;
    case PKL_DICT:
        rput(r, "{");
        for (size_t i = 0; i < o->n && !r->stop; i++) {
            if (i) rput(r, ", ");
            repr(r, o->items[2 * i], depth + 1);
            rput(r, ": ");
            repr(r, o->items[2 * i + 1], depth + 1);
        }
        rput(r, "}");
        break;
    case PKL_GLOBAL:
        rput_str(r, o->s, strlen(o->s));
        rput(r, ".");
        rput_str(r, o->name, strlen(o->name));
        break;
    case PKL_REDUCE:
    case PKL_OBJ: {
        unsigned char *b;
        size_t n;
        if (latin1_bytes(o, &b, &n)) { /* bytes, as protocol 2 writes them */
            rput_quoted(r, b, n, 1);
            free(b);
            break;
        }
        if (o->fn) repr(r, o->fn, depth + 1);
        if (o->args) repr(r, o->args, depth + 1);
        if (o->state) {
            rput(r, "<state ");
            repr(r, o->state, depth + 1);
            rput(r, ">");
        }
        break;
    }
    case PKL_PERSID: rput(r, "persid"); repr(r, o->args, depth + 1); break;
    default: rput(r, "?"); break;
    }
}

char *pkl_repr(const pkl_obj *o) { return pkl_repr_budget(o, NULL); }

char *pkl_repr_budget(const pkl_obj *o, size_t *budget) {
    rbuf r = {0};
    r.budget = budget;
    repr(&r, o, 0);
    if (r.bad) {
        free(r.b);
        return NULL;
    }
    return r.b ? r.b : strdup("");
}
